#include "tree/durable.h"

#include <algorithm>

namespace remem::tree {

namespace {

class LeafWalk : public durability::SnapshotScan {
 public:
  explicit LeafWalk(BLinkTree* tree) : tree_(tree) {}

  bool Step(durability::SnapshotSink* sink, uint64_t budget) override {
    if (done_) return true;
    const uint32_t limit =
        uint32_t(std::clamp<uint64_t>(budget, 1, kMaxScanItems));
    ScanPage page;
    Status st = tree_->Scan(cursor_, {}, limit, false, &page);
    if (!st.ok()) return false;  // cannot happen on the owner's own tree
    for (const ScanItem& it : page.items)
      sink->Add(it.key, it.value, it.version);
    if (!page.more) {
      done_ = true;
      return true;
    }
    cursor_ = std::move(page.resume);
    return false;
  }
  uint64_t shape() const override { return 0; }

 private:
  static constexpr uint64_t kMaxScanItems = 4096;
  BLinkTree* tree_;
  std::string cursor_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<durability::SnapshotScan> DurableTree::BeginSnapshot() {
  return std::make_unique<LeafWalk>(tree_);
}

}  // namespace remem::tree
