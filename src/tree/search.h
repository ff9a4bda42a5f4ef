// tree::Search: the B-link tree's searches and scans, written once over a
// NodeSource, so the client (one-sided reads of verified copies, with a
// cache of upper levels) and the server (its own memory, for the RPC path)
// run the same code.
//
// A search descends from the root to the leaf that holds a key, moving
// right along siblings whenever the key lies at or beyond a node's high
// fence (a split, or a leaf's last entries shifted to its right sibling,
// that the reader's copy of the parent did not show yet). Cached internal
// nodes may be stale: a cached node whose fences do not hold the key is
// evicted and read again; a cached parent that led to a child the key lies
// beyond is evicted (the move right still finds the key). Leaves are
// always read fresh. A node merged away is dead (layout.h): a search that
// reaches one evicts the copy that named it and starts again from the
// root; so does one that reaches a node whose low fence lies above the key
// (a leaf whose first entries shifted to its left sibling since the copy
// that named it, or an index reused since), and a node index reused since
// a copy named it is otherwise detected by its level, as any stale copy
// is.
//
// A value stored out of line is read from its extent after the leaf; if
// the extent no longer holds it, the leaf is read again (from the root).
//
// Scans read leaf after leaf: ascending along right pointers (the next
// leaf's low fence must be the previous one's high fence, else the leaf is
// found again from the root), descending by searching again for the leaf
// just below the last low fence. Each leaf copy is one consistent state of
// that leaf (it verified), and the leaf owned its range at that moment, so a
// scan returns every key present for the whole scan, in order, and nothing
// that was never present.
//
// Over a source where each read is a round trip (the network), a scan reads
// its leaves together: once the parent of its first leaf is known (cached),
// the leaves it will need after that one, as its children name them, are
// read ahead (NodeSource::Prefetch), and the walk along right pointers takes
// their copies. The order of the copies does not matter: each is still one
// state of its leaf during the scan (copies are read after the scan starts
// and forgotten when it ends), and the fences must still follow one another.
// When the walk reaches a leaf that was not read ahead and more are needed,
// it finds that leaf from the (cached) parent again, with the next run.
//
// Thread contract: as the NodeSource and NodeCache given (one thread).

#ifndef REMEM_TREE_SEARCH_H_
#define REMEM_TREE_SEARCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"
#include "remem/tree.h"
#include "tree/layout.h"
#include "tree/node.h"
#include "tree/route.h"

namespace remem::tree {

// Where nodes come from.
class NodeSource {
 public:
  virtual ~NodeSource() = default;
  // The root node's index (read fresh).
  virtual Result<uint32_t> Root() = 0;
  // Node `index`, verified and parsed into *view: from a copy in `scratch`
  // (kNodeBytes), or from memory that does not change while it is used.
  // Busy if no copy verified within the source's retries.
  virtual Status Fetch(uint32_t index, uint8_t* scratch, NodeView* view) = 0;
  // As Fetch, for a point lookup: a leaf's entries' long keys may be left
  // for the view to resolve as the lookup compares them
  // (NodeView::ResolveFences). By default, as Fetch.
  virtual Status FetchForLookup(uint32_t index, uint8_t* scratch,
                                NodeView* view) {
    return Fetch(index, scratch, view);
  }
  // The out-of-line value of the pair `key` at `version` that a leaf named
  // by `ref`, into *value. Corruption if the extent no longer holds it (the
  // pair was rewritten or deleted since the leaf was copied: read the leaf
  // again).
  virtual Status ReadExtent(std::string_view key, uint64_t version,
                            const ValueRef& ref, std::string* value) = 0;
  // A hint that node `index` will be fetched soon (a scan's next leaves): a
  // source over mapped memory may start loading it into the CPU's cache; a
  // source that reads ahead (read_ahead() > 0) starts reading a copy (one
  // for a node asked for again), which the next Fetches of that node take,
  // one per Prefetch of it, verified as any copy, until DropReadAhead.
  // Trusts nothing it reads; by default, does nothing.
  virtual void Prefetch(uint32_t /*index*/) {}
  // How many nodes this source reads ahead at most (copies Prefetch started
  // and no Fetch took yet): 0 where a read is a copy out of mapped memory,
  // more where each read is a round trip and several may be in flight (over
  // the network), so that a scan's leaves are read together.
  virtual size_t read_ahead() const { return 0; }
  // True if a copy of node `index` was read ahead and no Fetch took it yet.
  virtual bool ReadAhead(uint32_t /*index*/) const { return false; }
  // Forgets the copies read ahead (those still in flight land in storage
  // the source keeps for them). ScanRange calls it when a scan starts and
  // ends: a copy serves only the scan that asked for it, since it shows its
  // node as it was when it was read, which for a later scan is before it
  // began.
  virtual void DropReadAhead() {}
};

// A page ends before its limit once its keys and values reach this many
// bytes (a page of large values would otherwise be up to the scan limit
// times the largest value); it always holds at least one item.
inline constexpr size_t kScanPageBytes = 1 << 20;

// A client's copies of internal nodes, each searched by its route
// (tree/route.h: what a descent reads, in a few cache lines; the parsed
// copy beside it holds the whole keys a tie compares), and the root's
// index. Bounded: cleared when full, by nodes or by the
// bytes of their long keys (kMaxCachedKeyBytes: a node of long keys holds up
// to a few MiB of them). Nodes are found by their index in tables as long
// as the highest cached index (node indices are below the tree's node
// limit, with holes where extent pages lie between node pages: at most 16
// bytes per node-sized slot of the region carved so far), one load per hit
// (a hash map's lookup was 17% of a one-sided get's time).
class NodeCache {
 public:
  explicit NodeCache(size_t max_nodes = 16384) : max_(max_nodes) {}
  // The cached node `index`'s route, or null (not cached).
  const RouteNode* Route(uint32_t index) const {
    return index < routes_.size() ? routes_[index] : nullptr;
  }
  // The route of child i of `parent` (a cached route), or null: as
  // Route(parent->child(i)), from the parent's own memory once known.
  const RouteNode* ChildRoute(const RouteNode* parent, size_t i) const {
    const RouteNode* r = parent->kid(i, generation_);
    if (r == nullptr) {
      r = Route(parent->child(i));
      if (r != nullptr) parent->set_kid(i, generation_, r);
    }
    return r;
  }
  // Copies a verified node (`view`'s image) in.
  void Put(uint32_t index, const NodeView& view);
  void Evict(uint32_t index) {
    if (index < nodes_.size() && nodes_[index]) {
      key_bytes_ -= nodes_[index]->view.key_bytes();
      Recycle(std::move(nodes_[index]));
      routes_[index] = nullptr;
      --size_;
      ++generation_;  // a route freed: routes' kids forget it
    }
  }
  void Clear() {
    DropAll();
    root_ = kNoNode;
  }
  // Makes room for `n` more nodes ahead of time: the memory the next n
  // copies go to is allocated and written now (at most kMaxSpare). A copy
  // cached into memory the process never touched pays a page fault per
  // page, tens of microseconds on a VM; the read-path selector times
  // explorations of the one-sided path, whose searches fill the cache with
  // what the RPC path never read, after this (TreeStore's ExploreWarm).
  void Reserve(size_t n);
  static constexpr size_t kMaxSpare = 256;
  // Entries' memory kept for copies to come (Reserve, and nodes evicted).
  size_t spare() const { return spare_.size(); }
  // What scans have seen of leaves: the entries per leaf, on average (0
  // before any), from which a scan over a source that reads ahead estimates
  // how many leaves its items will take.
  double leaf_entries() const { return leaf_entries_; }
  void NoteLeaf(size_t entries) {
    leaf_entries_ = leaf_entries_ == 0
                        ? double(entries)
                        : 0.9 * leaf_entries_ + 0.1 * double(entries);
  }
  static constexpr size_t kMaxCachedKeyBytes = size_t{64} << 20;
  uint32_t root() const { return root_; }
  void set_root(uint32_t r) { root_ = r; }
  size_t size() const { return size_; }
  size_t capacity() const { return max_; }

  uint64_t hits = 0, misses = 0, evictions = 0;

 private:
  struct Entry {
    uint8_t image[kNodeBytes];
    NodeView view;         // over `image`
    RouteNode::Ptr route;  // over `view`
  };
  std::unique_ptr<Entry> NewEntry();
  // Keeps `e`'s memory for the next copy (up to kMaxSpare entries).
  void Recycle(std::unique_ptr<Entry> e);
  void DropAll();  // every node out (Recycled), the root kept
  size_t max_;
  size_t size_ = 0;       // cached nodes
  size_t key_bytes_ = 0;  // their long keys' bytes
  uint32_t root_ = kNoNode;
  double leaf_entries_ = 0;
  // Bumped whenever a route is freed (RouteNode::kid): starts at 1, as a
  // route's kids start unknown at 0.
  uint64_t generation_ = 1;
  std::vector<std::unique_ptr<Entry>> nodes_;  // by node index
  std::vector<std::unique_ptr<Entry>> spare_;  // memory for copies to come
  std::vector<const RouteNode*> routes_;       // by node index: entries' routes
};

struct SearchStats {
  uint64_t nodes_read = 0;    // fetched from the source
  uint64_t moves_right = 0;   // siblings followed
  uint64_t restarts = 0;      // searches started again from the root
  uint64_t stale_values = 0;  // leaves read again: an extent had changed
  // The highest stamp (layout.h, "Stamps") of the leaves fetched: at least
  // that of every leaf an answer was taken from.
  uint64_t max_stamp = 0;
};

// The leaves a scan expects to read from the one a search finds on: when
// the source reads ahead, FindLeaf asks it (Prefetch) for that leaf and the
// ones after it in their parent, `count` in all, rightwards (ascending) or
// leftwards, none wholly past `bound` (ascending: its keys at or after it;
// descending: below it; empty: unbounded).
struct LeafRun {
  size_t count = 0;
  bool descending = false;
  std::string_view bound;
};

// Finds the leaf for `t`: on OK, *leaf is a parsed view (its bytes in
// `scratch` or the source's memory). `cache` may be null. `for_lookup`:
// nodes come from FetchForLookup (the leaf's entries' long keys may be
// unresolved). `run` (may be null): the leaves to read ahead with the one
// found, once its parent is known.
Status FindLeaf(NodeSource* src, NodeCache* cache, const Target& t,
                uint8_t* scratch, NodeView* leaf, SearchStats* stats,
                bool for_lookup = false, const LeafRun* run = nullptr);

// The leaf the cache's copies route `t` to, read from nothing (kNoNode if
// a node on the way is not cached or does not hold the target): a hint for
// reading leaves ahead (a batch of lookups), which their searches then
// check as any copy.
uint32_t CachedLeaf(NodeCache* cache, const Target& t);

// Fills `cache` with the tree's internal nodes, level by level from the
// root, until it holds them all or is full: a client that searches
// one-sided from the start then reads only leaves (a cold cache made its
// first thousands of searches several node reads each, and the read-path
// selector judged the one-sided path by them). Copies may go stale at once
// (the server splits meanwhile): searches check them as any cached copy.
Status WarmCache(NodeSource* src, NodeCache* cache, uint8_t* scratch);

// The public page (remem/tree.h), so that a client's page is filled with
// no conversion. `more` set: the limit or kScanPageBytes ended the page;
// continue from `resume` (ascending: as the new start; descending: as the
// new end). There may be nothing left.
using ScanItem = TreeStore::Item;
using ScanPage = TreeStore::Page;

// Makes page->items n long: items past n move to page->spare, and new
// ones come from there before any is made, so their strings keep their
// storage from one page to the next (a page's item count varies: a scan
// that made each item past the last page's anew allocated two strings
// for each).
inline void ResizePage(ScanPage* page, size_t n) {
  std::vector<ScanItem>& items = page->items;
  std::vector<ScanItem>& spare = page->spare;
  while (items.size() > n) {
    spare.push_back(std::move(items.back()));
    items.pop_back();
  }
  while (items.size() < n && !spare.empty()) {
    items.push_back(std::move(spare.back()));
    spare.pop_back();
  }
  if (items.size() < n) items.resize(n);
}

// Empties *page (an error's page), keeping its items' storage.
inline void ClearPage(ScanPage* page) {
  ResizePage(page, 0);
  page->more = false;
  page->resume.clear();
}

// Keys in [start, end) (end empty: unbounded), at most `limit` (>= 1) and
// about kScanPageBytes, in ascending or descending order. start <= end (when
// end is set). Reuses the storage of *page: its items' strings and vector keep
// their capacity where the new page has as many items, so a scan into a page
// kept from the last one allocates for nothing but longer items and more of
// them. On an error the page is empty.
Status ScanRange(NodeSource* src, NodeCache* cache, std::string_view start,
                 std::string_view end, uint32_t limit, bool descending,
                 ScanPage* page, SearchStats* stats);

// A point lookup: NotFound, or the value and version.
Status Lookup(NodeSource* src, NodeCache* cache, std::string_view key,
              std::string* value, uint64_t* version, SearchStats* stats);

// The smallest key greater than every key with this prefix ("" when there
// is none: unbounded).
std::string PrefixEnd(std::string_view prefix);

}  // namespace remem::tree

#endif  // REMEM_TREE_SEARCH_H_
