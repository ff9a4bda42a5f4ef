// hash::TableSweep: finds, a chunk of buckets at a time between other
// writes to a live table, the keys of a set, so that the owner thread is
// never held for a whole-table scan (a backup about to be filled deletes
// what it held of the shards: HashService's emptying).
//
// What it promises: every key the filter accepts that is in the table for
// the whole sweep is returned at least once. A key written during the
// sweep may or may not be. A fuzzy scan of a cuckoo table can miss a pair
// that a move carries from a bucket not scanned yet into one scanned
// already: the table's change hook must pass every change to OnChange,
// which notes those keys, returned once the scan is done. A growth
// renumbers the buckets: the scan starts over (keys may then be returned
// again).
//
// Thread contract: the table's owner thread only (the table's change hook
// runs there).

#ifndef REMEM_HASH_SWEEP_H_
#define REMEM_HASH_SWEEP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "hash/table.h"

namespace remem::hash {

class TableSweep {
 public:
  using Filter = std::function<bool(std::string_view key)>;

  // Sweeps `table`, which must outlive this, for the keys `wanted` accepts.
  TableSweep(const Table* table, Filter wanted);

  // To be called with every change the table's change hook reports.
  void OnChange(std::string_view key, uint64_t from, uint64_t to);

  // Scans up to `max_buckets` buckets (at least one), appending the keys
  // found to `keys`; once every bucket is scanned, appends the keys moved
  // behind the scan and returns true (the sweep is over; further calls
  // return true and find nothing).
  bool Step(uint64_t max_buckets, std::vector<std::string>* keys);

  // Times the scan started over because the table grew.
  uint64_t restarts() const { return restarts_; }
  // Keys returned because a move had carried them behind the scan.
  uint64_t moved_keys() const { return moved_keys_; }

 private:
  const Table* table_;
  Filter wanted_;
  uint64_t generation_;  // the table's growths() the scan is of
  uint64_t cursor_ = 0;  // the next bucket to scan
  bool done_ = false;
  uint64_t restarts_ = 0;
  uint64_t moved_keys_ = 0;
  std::unordered_set<std::string> moved_;
};

}  // namespace remem::hash

#endif  // REMEM_HASH_SWEEP_H_
