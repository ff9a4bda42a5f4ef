// tree::BLinkTree: the ordered store's B-link tree in a region of server
// memory that clients read one-sided (layout in tree/layout.h). The server
// side: every write, split and root change is made here, by the partition's
// owner thread; reads on the owner thread (the RPC path) use the same
// search code as clients (tree/search.h) on the tree's own memory.
//
// Writes: a node is rewritten whole: its version made odd, the new image
// stored, then its checksum and new even version. A split (B-link order)
// writes the new right node first, then the left node with its new high
// fence and right pointer, then the parent (and a new root last, then the
// TreeRoot): at every moment each key is reachable from every node a reader
// may hold, by moving right. A leaf that would split gives entries to a
// sibling under the same parent instead, if the fuller of the two is then
// at most seven eighths full (Shift: a B*-tree's rule, so that a tree
// filled in random order has fuller leaves): its last ones to its right
// sibling, in a split's order (the sibling, then the leaf, then the
// parent's separator), or else its first ones to its left sibling (the
// sibling, the parent, then the leaf, whose raised low fence sends a
// reader still routed there by an older parent back to search again).
// A delete that leaves a node under a quarter full merges it with a
// sibling under the same parent if both fit in three quarters of a node
// (layout.h, "Merges"): the left node takes over the right one's entries
// and range, the right one is published dead, the parent drops its entry
// and is looked at in turn. A root left with one child gives way to it
// (ShrinkRoot: the height shrinks). A dead node's index goes back to the
// free list and is reused by a later split; readers holding it are
// protected by
// fences, levels and the dead flag. A full region answers OutOfMemory and
// keeps every key.
//
// Values over kMaxInlineValue bytes live in extents of the same region
// (hash::SlabAllocator): written whole before the leaf naming them is
// published, freed (incarnation bumped) once a leaf no longer names them.
// Keys over kMaxInlineKey bytes live in key extents: a new one written
// for each insert of a key its leaf does not hold (even while a fence
// made from an earlier insert of the same key still names an extent of
// its own), shared by every fence and separator made from it (counted per
// place in a published node), and freed once the last node naming it is
// republished without it.
// Nodes take whole pages of that arena (kNodePageBytes): 64 nodes of 1 KiB,
// or 63 when an extent left the page off a node boundary.
//
// Pair versions come from one counter per tree: unique, increasing with
// every write.
//
// Thread contract: writes and the owner reads on one thread (the
// partition's owner); other threads and processes read the region
// one-sided only (the stores are word-sized atomic stores, so an
// in-process reader copying with hash::LoadWords is race-free).

#ifndef REMEM_TREE_TREE_H_
#define REMEM_TREE_TREE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "hash/slab.h"
#include "remem/status.h"
#include "tree/layout.h"
#include "tree/node.h"
#include "tree/search.h"
#include "tree/wire.h"

namespace remem::tree {

class BLinkTree {
 public:
  // Formats the `bytes` at `base` (8-aligned; the region clients read) as
  // an empty tree. InvalidArgument if too small for a few nodes.
  static Result<std::unique_ptr<BLinkTree>> Create(uint8_t* base,
                                                   uint64_t bytes);

  // Insert or replace (kUpsert), insert only (kIfAbsent: AlreadyExists),
  // replace only at version `expected` (kIfVersion: Conflict, NotFound).
  // Returns the pair's new version. InvalidArgument for a key outside
  // 1..kMaxKey bytes or a value over kMaxValue; OutOfMemory when the region
  // has no room for the key's or value's extent or a split (nothing
  // changed).
  Result<uint64_t> Put(std::string_view key, std::string_view value,
                       PutMode mode = PutMode::kUpsert, uint64_t expected = 0);
  // NotFound if absent. A delete consumes a version (last_version()).
  Status Delete(std::string_view key);

  // Recovery (durability): store `key` = `value` at exactly `version`
  // unless the stored pair is as new; remove `key` if its stored version is
  // older than `version`; make later versions exceed `version`.
  Status Restore(std::string_view key, std::string_view value,
                 uint64_t version);
  Status RestoreDelete(std::string_view key, uint64_t version);
  void RaiseVersion(uint64_t version) {
    if (version > version_) version_ = version;
  }
  // Owner-thread reads (the RPC path).
  Status Get(std::string_view key, std::string* value, uint64_t* version);
  Status Scan(std::string_view start, std::string_view end, uint32_t limit,
              bool descending, ScanPage* page);

  uint64_t size() const { return size_; }
  uint32_t num_nodes() const { return num_nodes_; }  // live nodes
  uint64_t merges() const { return merges_; }
  // Bytes of the region's arena held by extents (out-of-line values and
  // long keys).
  uint64_t extent_bytes() const { return slab_.bytes_in_use(); }
  // Key extents in use (long keys, each counted once however many fences
  // and separators share it).
  size_t long_keys() const { return key_uses_.size(); }
  // Bytes of the arena not yet carved into pages.
  uint64_t bytes_left() const { return slab_.bytes_left(); }
  // What allocations of any kind can still take: bytes_left() in whole
  // node pages (kNodePageBytes; a shorter tail is never handed out).
  uint64_t bytes_unassigned() const {
    return bytes_left() / kNodePageBytes * kNodePageBytes;
  }
  uint8_t height() const { return height_; }
  uint64_t splits() const { return splits_; }
  // Leaves that gave entries to a sibling instead of splitting (Shift),
  // and of those, to their left sibling.
  uint64_t shifts() const { return shifts_; }
  uint64_t left_shifts() const { return left_shifts_; }
  uint64_t last_version() const { return version_; }

  // Tests: runs in the middle of every node write (half its words stored).
  void SetMidWriteHook(std::function<void()> hook) {
    mid_write_ = std::move(hook);
  }

 private:
  class OwnSource : public NodeSource {
   public:
    explicit OwnSource(BLinkTree* t) : t_(t) {}
    Result<uint32_t> Root() override { return t_->root_; }
    Status Fetch(uint32_t index, uint8_t* scratch, NodeView* view) override;
    Status ReadExtent(std::string_view key, uint64_t version,
                      const ValueRef& ref, std::string* value) override;

   private:
    BLinkTree* t_;
  };

  BLinkTree(uint8_t* base, uint64_t bytes)
      : base_(base),
        slab_(base + kNodesOffset, bytes - kNodesOffset, kNodesOffset),
        source_(this) {}
  uint8_t* NodeAt(uint32_t index) const { return base_ + NodeOffset(index); }
  // Parses a node of this tree (owner thread: no checksum needed) and
  // resolves its long keys from the tree's own memory.
  void View(uint32_t index, NodeView* v) const;
  Status ResolveOwn(NodeView* v) const;
  // Descends to the leaf of `key`, recording the internal nodes passed;
  // the leaf's view into *leaf.
  uint32_t Descend(std::string_view key, std::vector<uint32_t>* path,
                   NodeView* leaf) const;
  void Publish(uint32_t index, const NodeContent& c);
  void PublishRoot();
  // Put with the version to store given (0: the next one).
  Result<uint64_t> Write(std::string_view key, std::string_view value,
                         PutMode mode, uint64_t expected, uint64_t restore);
  // Splits `c` (node `index`, too big) and inserts upward along `path`.
  // `inserted`: the entry just added (SIZE_MAX: none, a value grew); an
  // entry appended after a node's last key splits off alone.
  // The free node list holds at least height_ + 1 nodes (ReserveNodes).
  Status SplitAndPublish(uint32_t index, NodeContent c,
                         std::vector<uint32_t> path, size_t inserted);
  // Before a split of leaf `index` (content `c`, too big; its parent last
  // on `path`): moves c's last entries to its right sibling, or its first
  // ones to its left sibling, if that sibling has the same parent and the
  // two leaves, and the parent with the new separator, then fit; as many
  // as make the fuller leaf least full. True if it did (everything
  // published, *c the leaf's new content); false if not (nothing changed).
  bool Shift(uint32_t index, NodeContent* c, const std::vector<uint32_t>& path);
  // Carves node pages until `n` nodes are free; OutOfMemory if the arena
  // has no room.
  Status ReserveNodes(size_t n);
  uint32_t TakeNode();
  // After a delete from node `index` (content `c`, published): while a node
  // on `path` (its ancestors) is under a quarter full, merges it with a
  // sibling under the same parent if both fit in three quarters of a node.
  void Rebalance(uint32_t index, NodeContent c, std::vector<uint32_t> path);
  // Merges node `right` into node `left` (its left sibling, both children
  // of `parent` at entries j - 1 and j): left takes over right's entries
  // and range, right is published dead, the parent drops entry j. The
  // parent's new content into *pc.
  void Merge(uint32_t left, NodeContent l, uint32_t right, NodeContent r,
             uint32_t parent, size_t j, NodeContent* pc);
  // While the root (content `root`) is internal with one child: the
  // TreeRoot names the child, then the old root is published dead and
  // its index freed.
  void ShrinkRoot(NodeContent root);
  // Publishes node `index` (content `c`, no longer reachable from its
  // parent or the TreeRoot once the caller is done) dead and frees its
  // index: a reader that still reaches it searches again.
  void Kill(uint32_t index, NodeContent c);
  // Writes `value` of `key` at `version` into a new extent; its ValueRef's
  // bytes into *ref.
  Status WriteExtent(std::string_view key, std::string_view value,
                     uint64_t version, std::string* ref);
  void FreeExtent(std::string_view ref_bytes);
  // Writes a long key into a new key extent (counted from the first
  // Publish that names it; FreeKey frees one no node named).
  Status WriteKey(std::string_view key, KeyRef* ref);
  void FreeKey(const KeyRef& ref);
  uint8_t* base_;
  hash::SlabAllocator slab_;  // the arena: node pages and extents
  // Free nodes: carved and never used, or dead (merged away); the last is
  // taken next.
  std::vector<uint32_t> free_nodes_;
  std::vector<uint8_t> extent_image_;  // kept for WriteExtent
  // Key extents: region offset -> places in published nodes naming it.
  std::unordered_map<uint64_t, uint32_t> key_uses_;
  std::vector<KeyRef> old_refs_;  // kept for Publish
  uint32_t num_nodes_ = 0;        // in use
  uint32_t node_limit_ = 1;       // every node index (free ones too) is below
  uint32_t root_ = kNoNode;
  uint8_t height_ = 0;
  uint64_t root_version_ = 0;
  uint64_t version_ = 0;
  uint64_t size_ = 0;
  uint64_t splits_ = 0;
  uint64_t merges_ = 0;
  uint64_t shifts_ = 0, left_shifts_ = 0;
  OwnSource source_;
  std::function<void()> mid_write_;
};

}  // namespace remem::tree

#endif  // REMEM_TREE_TREE_H_
