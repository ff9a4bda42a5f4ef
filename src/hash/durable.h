// hash::DurableTable: the hash table as the durability layer sees it
// (durability::Recoverable): recovery applies records to the table, and a
// snapshot scans its buckets chunk by chunk between requests.
//
// A fuzzy scan of a cuckoo table can miss a pair that a move carries from
// an unscanned bucket into a scanned one; the table's move hook catches
// those and the scan emits them. A growth renumbers the buckets: the scan
// starts over.
//
// Thread contract: as Recoverable: recovery before the owner thread
// starts, everything else on the owner thread.

#ifndef REMEM_HASH_DURABLE_H_
#define REMEM_HASH_DURABLE_H_

#include <memory>
#include <string>
#include <vector>

#include "durability/recoverable.h"
#include "hash/table.h"

namespace remem::hash {

class DurableTable : public durability::Recoverable {
 public:
  explicit DurableTable(Table* table) : table_(table) {}

  // Reserves `shape` buckets (the live state's last shape: the larger of the
  // snapshot's and the log's kShape records), giving back the empty table's
  // first array (Table::Reserve); recovery calls it only with a shape.
  Status Reserve(uint64_t pairs, uint64_t shape) override;
  void Prefetch(std::string_view key) override { table_->Prefetch(key); }
  Status ApplyPut(std::string_view key, std::string_view value,
                  uint64_t version) override {
    Status st = table_->Restore(key, value, version);
    const Limits& limits = table_->limits();
    if (!st.ok() &&
        (key.size() > limits.max_key || value.size() > limits.max_value)) {
      // Written under larger limits than this start's.
      return Status::InvalidArgument(
          std::string(st.message()) +
          ": the data holds pairs larger than this server's limits take "
          "(restart with the --max-key-bytes and --max-value-bytes they "
          "were written under: the data directory is unchanged)");
    }
    return st;
  }
  Status ApplyDelete(std::string_view key, uint64_t version) override {
    table_->RestoreDelete(key, version);
    return Status::OK();
  }
  void RaiseVersion(uint64_t version) override {
    table_->RaiseVersion(version);
  }
  // Table::EndRestore: keeps the headroom of the arrays recovery skipped.
  void EndRecovery() override { table_->EndRestore(); }
  uint64_t last_version() const override { return table_->last_version(); }
  uint64_t shape() const override { return table_->num_buckets(); }
  std::unique_ptr<durability::SnapshotScan> BeginSnapshot() override;

 private:
  Table* table_;
};

}  // namespace remem::hash

#endif  // REMEM_HASH_DURABLE_H_
