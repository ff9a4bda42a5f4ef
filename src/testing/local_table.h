// testing::LocalTable: one hash partition in plain memory, with its server
// side (hash::Table) and its one-sided reader (hash::Lookup) in one process:
// the region is a byte array, and a "one-sided read" is a word-by-word copy
// of it (LoadWords, as a remote copy would see the bytes), optionally paused
// halfway so overlaps with the writer are common (a get over tcp, or a
// reader descheduled mid-copy). testing::LocalTableKv runs the race
// workload (race.h) on it; src/hash/table_test.cc uses both.
//
// Thread contract: table() belongs to one writer thread at a time (the
// partition's owner: LocalTableKv's writers take a lock). Reader(),
// ReadGeometry() and Get() may run on any thread concurrently with it, each
// with its own Geometry.

#ifndef REMEM_TESTING_LOCAL_TABLE_H_
#define REMEM_TESTING_LOCAL_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "hash/reader.h"
#include "hash/slab.h"
#include "hash/table.h"
#include "testing/kv_store.h"

namespace remem::testing {

class LocalTable {
 public:
  // The root at offset 0, then the arena for bucket arrays and extents.
  static constexpr uint64_t kArenaStart = 4096;
  static constexpr uint16_t kRegion = 1;

  static Result<std::unique_ptr<LocalTable>> Create(uint64_t initial_buckets,
                                                    uint64_t arena_bytes,
                                                    bool grow = true,
                                                    uint64_t seed = 42);
  // The same with every table option given.
  static Result<std::unique_ptr<LocalTable>> Create(
      const hash::TableOptions& options, uint64_t arena_bytes);

  hash::Table& table() { return *table_; }
  hash::SlabAllocator& slab() { return slab_; }
  // A one-sided read of the region: InvalidArgument outside it. With
  // `slow`, copies of 64 bytes or more pause (yield) halfway, every other
  // one copying its second half first.
  hash::ReadFn Reader(bool slow = false);
  // What a client knows when it starts: the root's geometry, read and
  // verified (retried while the writer publishes it).
  Result<hash::Geometry> ReadGeometry();
  // A verified lookup, retried as a client would (re-reading the root when
  // a bucket fails: the table may have grown) until it is final; TimedOut
  // if it never is. `cached`: the caller's geometry, kept up to date (else
  // the table's, which only the writer may use). `retries` counts them.
  // `mode`: how buckets are copied; unset, lookups alternate between the
  // two modes, so that races and models cover both.
  Result<hash::LookupResult> Get(
      std::string_view key, int* retries = nullptr, bool slow = false,
      hash::Geometry* cached = nullptr,
      std::optional<hash::ReadMode> mode = std::nullopt);

 private:
  explicit LocalTable(uint64_t arena_bytes);
  uint8_t* Aligned() { return mem_.data() + offset_; }

  std::vector<uint8_t> mem_;
  size_t offset_ = 0;  // to the 64-byte aligned start
  hash::SlabAllocator slab_;
  std::unique_ptr<hash::Table> table_;
  std::atomic<uint64_t> lookups_{0};      // alternates Get's read mode
  std::atomic<uint64_t> slow_copies_{0};  // alternates a slow copy's order
};

// testing::KvStore over a LocalTable: writers call the table (one at a time,
// under a lock, as the owner thread would), readers look up with verified
// copies; reader 0 of every two copies slowly (LocalTable::Reader).
class LocalTableKv : public KvStore {
 public:
  explicit LocalTableKv(LocalTable* table) : table_(table) {}
  Result<std::unique_ptr<KvClient>> NewClient(Role role) override;
  Result<KvStoreCounters> Counters() override;

 private:
  LocalTable* table_;
  std::mutex writer_mu_;  // the owner's turn
  std::mutex readers_mu_;
  int readers_ = 0;
};

}  // namespace remem::testing

#endif  // REMEM_TESTING_LOCAL_TABLE_H_
