#include "tree/search.h"

#include <algorithm>
#include <cstring>

namespace remem::tree {

namespace {

constexpr int kMaxSteps = 4096;
constexpr int kMaxRestarts = 8;
// Reads of a leaf whose out-of-line value changed before its extent was
// read (or, for a lookup, whose long key compared lazily was freed), before
// giving up (Busy).
constexpr int kMaxValueAttempts = 16;

// The value of entry i (head `e`) of a verified leaf: its bytes, or its
// extent's (Corruption: the pair changed since the leaf was copied).
Status CopyValue(NodeSource* src, const NodeView& leaf, size_t i,
                 const LeafEntryHead& e, std::string* value) {
  if ((e.flags & kValueOutOfLine) == 0) {
    value->assign(leaf.stored(i, e));
    return Status::OK();
  }
  return src->ReadExtent(leaf.key(i), e.version, leaf.value_ref(i), value);
}

// Is the target below the node's range (the wrong node: a stale parent)?
bool TargetBelow(const NodeView& v, const Target& t) {
  if (t.mode == Target::kAt) return t.key < v.low();
  return !t.unbounded && t.key <= v.low();
}
// Is the target beyond the node's range (move right)?
bool TargetBeyond(const NodeView& v, const Target& t) {
  if (!v.has_high()) return false;
  if (t.mode == Target::kAt) return t.key >= v.high();
  return t.unbounded || t.key > v.high();
}
// The entry of an internal node whose child holds the target; count() if
// none (a malformed node).
size_t ChildIndex(const NodeView& v, const Target& t) {
  if (v.count() == 0) return 0;
  if (t.mode == Target::kBelow) {
    if (t.unbounded) return v.count() - 1;
    const size_t i = v.LowerBound(t.key);  // first key >= target
    return i == 0 ? v.count() : i - 1;
  }
  const size_t i = v.LowerBound(t.key);
  if (i < v.count() && v.key(i) == t.key) return i;
  return i == 0 ? v.count() : i - 1;
}

// Asks `src` to read ahead the leaf that is child i of `parent` (a verified
// internal node of level 1) and those of `run` (not null) after it. Nothing
// when the source does not read ahead or the run is that leaf alone.
void ReadAheadRun(NodeSource* src, const NodeView& parent, size_t i,
                  const LeafRun* run) {
  if (run->count < 2 || src->read_ahead() == 0) return;
  const size_t n = std::min(run->count, src->read_ahead());
  // A leaf read ahead already is not asked for again: its copy serves one
  // fetch (a second would serve a restart the stale copy caused).
  auto ask = [src](uint32_t leaf) {
    if (!src->ReadAhead(leaf)) src->Prefetch(leaf);
  };
  ask(parent.child(i));
  for (size_t k = 1; k < n; ++k) {
    size_t j;
    if (!run->descending) {
      j = i + k;
      // Child j holds keys from key(j) on.
      if (j >= parent.count()) break;
      if (!run->bound.empty() && parent.key(j) >= run->bound) break;
    } else {
      if (k > i) break;
      j = i - k;
      // Child j holds keys below key(j + 1).
      if (parent.key(j + 1) <= run->bound) break;
    }
    ask(parent.child(j));
  }
}

}  // namespace

void NodeCache::Put(uint32_t index, const NodeView& view) {
  if (index == kNoNode) return;
  const bool have = Route(index) != nullptr;  // a copy replaced
  if (have) key_bytes_ -= nodes_[index]->view.key_bytes();
  if ((size_ >= max_ && !have) ||
      key_bytes_ + view.key_bytes() > kMaxCachedKeyBytes) {
    evictions += size_;
    DropAll();
  }
  if (index >= nodes_.size()) {
    nodes_.resize(size_t{index} + 1);
    routes_.resize(size_t{index} + 1);
  }
  std::unique_ptr<Entry>& slot = nodes_[index];
  if (!slot) {
    slot = NewEntry();
    ++size_;
  }
  if (slot->route != nullptr) ++generation_;  // freed below
  routes_[index] = nullptr;
  slot->route.reset();
  std::memcpy(slot->image, view.image(), kNodeBytes);
  // It verified as `view`: only the structure is parsed again, and its
  // long keys are copied from `view` (resolved there). A node without a
  // route (a leaf, a dead node, or one the server would never publish) is
  // not kept: searches read it fresh.
  if (!slot->view.Parse(slot->image, index, /*checksum=*/false).ok() ||
      !slot->view.AdoptKeys(view) ||
      (slot->route = RouteNode::Make(slot->view)) == nullptr) {
    Recycle(std::move(slot));  // its bytes were not counted
    --size_;
    return;
  }
  key_bytes_ += slot->view.key_bytes();
  routes_[index] = slot->route.get();
}

void NodeCache::Reserve(size_t n) {
  n = std::min(n, kMaxSpare);
  // make_unique value-initializes: the image's pages are written here.
  while (spare_.size() < n) spare_.push_back(std::make_unique<Entry>());
}

std::unique_ptr<NodeCache::Entry> NodeCache::NewEntry() {
  if (spare_.empty()) return std::make_unique<Entry>();
  std::unique_ptr<Entry> e = std::move(spare_.back());
  spare_.pop_back();
  return e;
}

void NodeCache::Recycle(std::unique_ptr<Entry> e) {
  if (e == nullptr || spare_.size() >= kMaxSpare) return;
  e->route.reset();  // its view is parsed again before a route is made
  spare_.push_back(std::move(e));
}

void NodeCache::DropAll() {
  for (std::unique_ptr<Entry>& e : nodes_) {
    if (spare_.size() >= kMaxSpare) break;
    Recycle(std::move(e));
  }
  nodes_.clear();
  routes_.clear();
  size_ = 0;
  key_bytes_ = 0;
  ++generation_;
}

uint32_t CachedLeaf(NodeCache* cache, const Target& t) {
  const uint32_t root = cache->root();
  const RouteNode* r = root == kNoNode ? nullptr : cache->Route(root);
  for (int step = 0; r != nullptr && step < kMaxSteps; ++step) {
    size_t i = 0;
    if (r->Locate(t, &i) != RouteNode::Place::kIn || i >= r->count()) break;
    if (r->level() == 1) return r->child(i);
    r = cache->ChildRoute(r, i);
  }
  return kNoNode;
}

Status WarmCache(NodeSource* src, NodeCache* cache, uint8_t* scratch) {
  auto root = src->Root();
  if (!root.ok()) return root.status();
  cache->set_root(*root);
  std::vector<uint32_t> level = {*root}, next;
  int expected_level = -1;  // the root's, then one less per step down
  while (!level.empty() && expected_level != 0) {
    next.clear();
    for (uint32_t index : level) {
      if (cache->size() >= cache->capacity()) return Status::OK();
      NodeView v;
      REMEM_RETURN_IF_ERROR(src->Fetch(index, scratch, &v));
      if (expected_level < 0) expected_level = v.level();
      // Leaves are not cached, nor a dead node, nor a node of another
      // level than its parent's less one (which also bounds the walk to the
      // root's height, whatever a copy says): searches read such a node.
      if (v.leaf() || v.dead() || v.level() != expected_level) continue;
      cache->Put(index, v);
      if (v.level() == 1) continue;  // its children are leaves
      for (size_t i = 0; i < v.count(); ++i) next.push_back(v.child(i));
    }
    level.swap(next);
    --expected_level;
  }
  return Status::OK();
}

Status FindLeaf(NodeSource* src, NodeCache* cache, const Target& t,
                uint8_t* scratch, NodeView* leaf, SearchStats* stats,
                bool for_lookup, const LeafRun* run) {
  for (int restart = 0; restart < kMaxRestarts; ++restart) {
    if (restart > 0) ++stats->restarts;
    uint32_t cur = cache != nullptr ? cache->root() : kNoNode;
    if (cur == kNoNode) {
      auto root = src->Root();
      if (!root.ok()) return root.status();
      cur = *root;
      if (cache != nullptr) cache->set_root(cur);
    }
    uint32_t parent = kNoNode;
    int expected_level = -1;
    bool again = false, keep_cache = false;
    // The route of `cur` when its parent's route knew it (ChildRoute).
    const RouteNode* known = nullptr;
    for (int step = 0; step < kMaxSteps && !again; ++step) {
      // Only internal nodes are cached: a leaf's index is not looked up
      // (the cache's tables are as long as the tree has nodes; a leaf's
      // slot is a cache miss of its own). A cached copy of an internal
      // node whose index was reused for this leaf stays, stale as any
      // other: a search through it meets its checks.
      NodeCache* const here = expected_level == 0 ? nullptr : cache;
      // A cached node (internal and live), searched by its route; a copy
      // that does not hold the target may be stale: it is read fresh.
      const RouteNode* r = known != nullptr
                               ? known
                               : (here != nullptr ? here->Route(cur) : nullptr);
      known = nullptr;
      if (r != nullptr) {
        ++cache->hits;
        if (expected_level >= 0 && r->level() != expected_level) {
          again = true;
          break;
        }
        size_t i = 0;
        if (r->Locate(t, &i) != RouteNode::Place::kIn) {
          cache->Evict(cur);
          continue;
        }
        if (i >= r->count()) {
          again = true;
          break;
        }
        parent = cur;
        expected_level = r->level() - 1;
        cur = r->child(i);
        if (expected_level > 0) {
          known = cache->ChildRoute(r, i);
        } else if (run != nullptr) {  // a scan's (a lookup's path stays bare)
          ReadAheadRun(src, r->view(), i, run);
        }
        continue;
      }
      // A fresh copy, parsed into *leaf.
      if (cache != nullptr) ++cache->misses;
      REMEM_RETURN_IF_ERROR(for_lookup ? src->FetchForLookup(cur, scratch, leaf)
                                       : src->Fetch(cur, scratch, leaf));
      ++stats->nodes_read;
      const NodeView& v = *leaf;
      if (v.dead()) {
        // Merged away: whatever named it (a parent's copy, a left
        // sibling's right pointer, the root) is stale. Only that copy is
        // dropped: the rest of the cache still routes.
        if (cache != nullptr) {
          cache->Evict(cur);
          if (parent != kNoNode) cache->Evict(parent);
          if (cache->root() == cur) cache->set_root(kNoNode);
        }
        keep_cache = true;
        again = true;
        break;
      }
      if (expected_level >= 0 && v.level() != expected_level) {
        again = true;  // not the node a parent named: start again
        break;
      }
      if (TargetBeyond(v, t)) {
        if (v.right() == kNoNode) {
          again = true;
          break;
        }
        if (cache != nullptr) {
          // The parent's copy did not show this split (or the root grew).
          if (parent != kNoNode) cache->Evict(parent);
          if (cache->root() == cur) cache->set_root(kNoNode);
        }
        ++stats->moves_right;
        cur = v.right();
        expected_level = v.level();
        continue;
      }
      if (TargetBelow(v, t)) {
        // Keys moved left since the copy that named this node (a leaf's
        // first entries shifted to its left sibling), or its index was
        // reused: only the parent's copy is dropped, as for a dead node.
        if (cache != nullptr && parent != kNoNode) {
          cache->Evict(parent);
          keep_cache = true;
        }
        again = true;
        break;
      }
      if (v.leaf()) {
        stats->max_stamp = std::max(stats->max_stamp, v.stamp());
        return Status::OK();
      }
      const size_t i = ChildIndex(v, t);
      if (i >= v.count()) {
        again = true;
        break;
      }
      if (cache != nullptr) cache->Put(cur, v);
      // Before the leaf's read overwrites `v` (in scratch).
      if (run != nullptr && v.level() == 1) ReadAheadRun(src, v, i, run);
      parent = cur;
      expected_level = v.level() - 1;
      cur = v.child(i);
    }
    // Start again from a fresh root, without the cache's copies (but for a
    // dead node, whose stale namers were evicted).
    if (cache != nullptr && !keep_cache) cache->Clear();
  }
  return Status::Busy("tree search did not settle");
}

Status Lookup(NodeSource* src, NodeCache* cache, std::string_view key,
              std::string* value, uint64_t* version, SearchStats* stats) {
  uint8_t scratch[kNodeBytes];
  NodeView leaf;
  Target t;
  t.key = key;
  for (int attempt = 0; attempt < kMaxValueAttempts; ++attempt) {
    REMEM_RETURN_IF_ERROR(
        FindLeaf(src, cache, t, scratch, &leaf, stats, /*for_lookup=*/true));
    size_t i = 0;
    if (!leaf.lazy()) {
      i = leaf.LowerBound(key);
    } else {
      // The keys it compares, resolved as it goes (a long key's extent
      // freed since the leaf was copied: read the leaf again).
      Status st = leaf.LowerBound(key, &i);
      if (st.ok() && i < leaf.count()) st = leaf.ResolveEntry(i);
      if (st.code() == StatusCode::kCorruption) {
        ++stats->stale_values;
        continue;
      }
      REMEM_RETURN_IF_ERROR(st);
    }
    if (i >= leaf.count() || leaf.key(i) != key) {
      return Status::NotFound("key not found");
    }
    const LeafEntryHead e = leaf.leaf_head(i);
    Status st = CopyValue(src, leaf, i, e, value);
    if (st.code() == StatusCode::kCorruption) {
      ++stats->stale_values;  // rewritten meanwhile: read the leaf again
      continue;
    }
    if (st.ok()) *version = e.version;
    return st;
  }
  return Status::Busy("a tree value changed under every read");
}

namespace {

// ScanRange with the items counted in *n: page->items[0, n) are the page,
// the rest are storage kept for their capacity.
Status ScanInto(NodeSource* src, NodeCache* cache, std::string_view start,
                std::string_view end, uint32_t limit, bool descending,
                ScanPage* page, size_t* n, SearchStats* stats) {
  if (!end.empty() && start == end) return Status::OK();
  uint8_t scratch[kNodeBytes];
  NodeView leaf;
  size_t bytes = 0;
  int stale = 0;
  // Over a source that reads ahead: the leaves the items still wanted will
  // take (by the entries per leaf scans saw; a leaf of 1 KiB holds 16 small
  // pairs), one more for the part of the first that lies before the cursor.
  const bool reads_ahead = src->read_ahead() > 0;
  LeafRun run;
  run.descending = descending;
  run.bound = descending ? start : end;
  auto plan = [&]() -> const LeafRun* {
    if (!reads_ahead) return nullptr;
    const double per = cache != nullptr && cache->leaf_entries() >= 1
                           ? cache->leaf_entries()
                           : 16;
    run.count = size_t(double(limit - *n) / per + 0.999) + 1;
    return &run;
  };
  auto note = [&] {
    if (reads_ahead && cache != nullptr) cache->NoteLeaf(leaf.count());
  };
  // Adds entry i of `leaf` as item *n. OK: added (*full set when the page
  // is complete); Corruption: its value changed since the leaf was copied
  // (not added: read the leaf again); another error: give up.
  auto add = [&](size_t i, bool* full) -> Status {
    if (*n == page->items.size()) ResizePage(page, *n + 1);
    ScanItem& it = page->items[*n];
    const LeafEntryHead e = leaf.leaf_head(i);
    Status st = CopyValue(src, leaf, i, e, &it.value);
    if (st.code() == StatusCode::kCorruption) {
      ++stats->stale_values;
      if (++stale >= kMaxValueAttempts) {
        return Status::Busy("tree values changed under every read");
      }
      return st;
    }
    REMEM_RETURN_IF_ERROR(st);
    it.key.assign(leaf.key(i));
    it.version = e.version;
    bytes += it.key.size() + it.value.size();
    *full = ++*n == limit || bytes >= kScanPageBytes;
    return Status::OK();
  };
  if (!descending) {
    std::string cursor(start);
    Target t;
    bool find = true;
    for (;;) {
      if (find) {
        t.key = cursor;
        REMEM_RETURN_IF_ERROR(FindLeaf(src, cache, t, scratch, &leaf, stats,
                                       /*for_lookup=*/false, plan()));
        find = false;
      }
      note();
      const size_t first = leaf.LowerBound(cursor);
      // The next leaf loads while this one's items are copied out, if the
      // scan will need it (the page is not filled here, and the range goes
      // on past this leaf).
      if (!reads_ahead && leaf.has_high() &&
          limit - *n > leaf.count() - first &&
          (end.empty() || leaf.high() < end)) {
        src->Prefetch(leaf.right());
      }
      for (size_t i = first; i < leaf.count(); ++i) {
        if (!end.empty() && leaf.key(i) >= end) return Status::OK();
        bool full = false;
        Status st = add(i, &full);
        if (st.code() == StatusCode::kCorruption) {
          cursor.assign(leaf.key(i));  // this key's leaf again
          find = true;
          break;
        }
        REMEM_RETURN_IF_ERROR(st);
        if (full) {
          page->more = true;
          page->resume = page->items[*n - 1].key;
          page->resume.push_back('\0');
          return Status::OK();
        }
      }
      if (find) continue;
      if (!leaf.has_high()) return Status::OK();
      if (!end.empty() && leaf.high() >= end) return Status::OK();
      cursor.assign(leaf.high());
      const uint32_t next = leaf.right();
      // Past the leaves read ahead, with more than this one still to read:
      // the next run, from its parent.
      if (reads_ahead && next != kNoNode && !src->ReadAhead(next) &&
          plan()->count > 2) {
        find = true;
        continue;
      }
      Status st = next == kNoNode ? Status::Corruption("no right sibling")
                                  : src->Fetch(next, scratch, &leaf);
      if (st.code() == StatusCode::kBusy) return st;
      ++stats->nodes_read;
      if (st.ok()) stats->max_stamp = std::max(stats->max_stamp, leaf.stamp());
      // Not the leaf that follows (or merged away): find it from the root.
      find = !st.ok() || !leaf.leaf() || leaf.dead() || leaf.low() != cursor;
    }
  }
  std::string cursor(end);
  bool unbounded = end.empty();
  for (;;) {
    if (!unbounded && cursor <= start) return Status::OK();
    Target t;
    t.mode = Target::kBelow;
    t.key = cursor;
    t.unbounded = unbounded;
    REMEM_RETURN_IF_ERROR(FindLeaf(src, cache, t, scratch, &leaf, stats,
                                   /*for_lookup=*/false, plan()));
    note();
    size_t i = unbounded ? leaf.count() : leaf.LowerBound(cursor);
    bool again = false;
    while (i > 0 && !again) {
      --i;
      if (leaf.key(i) < start) return Status::OK();
      bool full = false;
      Status st = add(i, &full);
      if (st.code() == StatusCode::kCorruption) {
        // This key's leaf again: the keys below key + a zero byte.
        cursor.assign(leaf.key(i));
        cursor.push_back('\0');
        unbounded = false;
        again = true;
        break;
      }
      REMEM_RETURN_IF_ERROR(st);
      if (full) {
        page->more = true;
        page->resume = page->items[*n - 1].key;
        return Status::OK();
      }
    }
    if (again) continue;
    if (leaf.low().empty() || leaf.low() <= start) return Status::OK();
    cursor.assign(leaf.low());
    unbounded = false;
  }
}

}  // namespace

Status ScanRange(NodeSource* src, NodeCache* cache, std::string_view start,
                 std::string_view end, uint32_t limit, bool descending,
                 ScanPage* page, SearchStats* stats) {
  page->more = false;
  page->resume.clear();
  size_t n = 0;
  Status st;
  if (limit == 0) {
    st = Status::InvalidArgument("scan limit must be >= 1");
  } else if (!end.empty() && start > end) {
    st = Status::InvalidArgument("scan range is reversed (start > end)");
  } else {
    src->DropReadAhead();  // another scan's copies are too old for this one
    st = ScanInto(src, cache, start, end, limit, descending, page, &n, stats);
    src->DropReadAhead();
  }
  if (!st.ok()) {
    ClearPage(page);
    return st;
  }
  ResizePage(page, n);
  return st;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty() && uint8_t(end.back()) == 0xff) end.pop_back();
  if (!end.empty()) end.back() = char(uint8_t(end.back()) + 1);
  return end;
}

}  // namespace remem::tree
