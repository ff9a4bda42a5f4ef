// tree::DurableTree: the B-link tree as the durability layer sees it
// (durability::Recoverable): recovery applies records to the tree, and a
// snapshot walks its leaves in key order, a chunk at a time between
// requests, on the owner thread.
//
// The walk is a scan (tree/search.h) resumed from the last key it emitted:
// splits never move a key to the left of the cursor, so every pair present
// for the whole walk is emitted (the guarantee of a scan), and the walk
// never needs to start over.
//
// Thread contract: as Recoverable: recovery before the owner thread
// starts, everything else on the owner thread.

#ifndef REMEM_TREE_DURABLE_H_
#define REMEM_TREE_DURABLE_H_

#include <memory>
#include <string>

#include "durability/recoverable.h"
#include "tree/tree.h"

namespace remem::tree {

class DurableTree : public durability::Recoverable {
 public:
  explicit DurableTree(BLinkTree* tree) : tree_(tree) {}

  Status Reserve(uint64_t /*pairs*/, uint64_t /*shape*/) override {
    return Status::OK();
  }
  // Keys in order fill their leaves (an append split keeps the left leaf
  // full), so the rebuilt tree is never larger than the live one was.
  bool AppliesInKeyOrder() const override { return true; }
  Status ApplyPut(std::string_view key, std::string_view value,
                  uint64_t version) override {
    return tree_->Restore(key, value, version);
  }
  // The empty key (no key is empty) records a version only: a range move
  // raised the tree's counter (TreeService's RangeImport).
  Status ApplyDelete(std::string_view key, uint64_t version) override {
    if (key.empty()) {
      tree_->RaiseVersion(version);
      return Status::OK();
    }
    return tree_->RestoreDelete(key, version);
  }
  void RaiseVersion(uint64_t version) override { tree_->RaiseVersion(version); }
  uint64_t last_version() const override { return tree_->last_version(); }
  std::unique_ptr<durability::SnapshotScan> BeginSnapshot() override;

 private:
  BLinkTree* tree_;
};

}  // namespace remem::tree

#endif  // REMEM_TREE_DURABLE_H_
