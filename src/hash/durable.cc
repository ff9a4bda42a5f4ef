#include "hash/durable.h"

namespace remem::hash {

namespace {

class BucketScan : public durability::SnapshotScan {
 public:
  explicit BucketScan(Table* table)
      : table_(table), growths_(table->growths()) {
    table_->SetMoveHook([this](uint64_t from, uint64_t to, std::string_view k) {
      // Carried from the unscanned part into the scanned one: the scan
      // would miss it.
      if (from >= cursor_ && to < cursor_) moved_.emplace_back(k);
    });
  }
  ~BucketScan() override { table_->SetMoveHook(nullptr); }

  bool Step(durability::SnapshotSink* sink, uint64_t budget) override {
    if (table_->growths() != growths_) {
      growths_ = table_->growths();
      cursor_ = 0;
      moved_.clear();
      sink->Restart();
      return false;
    }
    for (const std::string& k : moved_) {
      auto v = table_->Get(k);
      if (v.ok()) sink->Add(k, v->value, v->version);
    }
    moved_.clear();
    cursor_ = table_->ScanBuckets(
        cursor_, budget,
        [sink](std::string_view k, std::string_view v, uint64_t version) {
          sink->Add(k, v, version);
        });
    return cursor_ >= table_->num_buckets();
  }
  uint64_t shape() const override { return table_->num_buckets(); }

 private:
  Table* table_;
  uint64_t growths_;
  uint64_t cursor_ = 0;
  std::vector<std::string> moved_;
};

}  // namespace

Status DurableTable::Reserve(uint64_t /*pairs*/, uint64_t shape) {
  if (shape == 0) return Status::OK();
  return table_->Reserve(shape);
}

std::unique_ptr<durability::SnapshotScan> DurableTable::BeginSnapshot() {
  return std::make_unique<BucketScan>(table_);
}

}  // namespace remem::hash
