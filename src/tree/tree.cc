#include "tree/tree.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <limits>

#include "hash/layout.h"
#include "hash/slab.h"
#include "util/size.h"

namespace remem::tree {

namespace {

void StoreWord(uint8_t* at, uint64_t w) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(at))
      .store(w, std::memory_order_release);
}

}  // namespace

Result<std::unique_ptr<BLinkTree>> BLinkTree::Create(uint8_t* base,
                                                     uint64_t bytes) {
  if (bytes < kNodesOffset + 2 * kNodePageBytes) {
    return Status::InvalidArgument("the tree region is too small");
  }
  std::unique_ptr<BLinkTree> t(new BLinkTree(base, bytes));
  REMEM_RETURN_IF_ERROR(t->ReserveNodes(1));
  NodeContent leaf;
  leaf.self = t->TakeNode();
  t->Publish(leaf.self, leaf);
  t->root_ = leaf.self;
  t->height_ = 1;
  t->PublishRoot();
  return t;
}

Status BLinkTree::ReserveNodes(size_t n) {
  if (free_nodes_.size() >= n) return Status::OK();  // every split's case
  while (free_nodes_.size() < n) {
    auto page = slab_.Carve(kNodePageBytes);
    if (!page.ok()) return Status::OutOfMemory("the tree region is full");
    // The node slots wholly inside the page. A page need not start on a
    // node boundary: extents of a class over a page take their class's
    // size of the arena, a multiple of 64 bytes, not of kNodeBytes.
    const uint64_t begin = *page - kNodesOffset;
    const uint64_t first = (begin + kNodeBytes - 1) / kNodeBytes;
    const uint64_t last = (begin + kNodePageBytes) / kNodeBytes;  // exclusive
    if (last > std::numeric_limits<uint32_t>::max()) {
      return Status::OutOfMemory("the tree has as many nodes as it can name");
    }
    // Reversed: nodes are taken in index order. Index 0 is kNoNode.
    for (uint64_t i = last; i-- > first;) {
      if (i != kNoNode) free_nodes_.push_back(uint32_t(i));
    }
    if (last > node_limit_) node_limit_ = uint32_t(last);
  }
  // Readers learn the new limit (they prefault up to it) whenever pages
  // were added; the root is unchanged.
  if (root_ != kNoNode) PublishRoot();
  return Status::OK();
}

uint32_t BLinkTree::TakeNode() {
  const uint32_t index = free_nodes_.back();
  free_nodes_.pop_back();
  ++num_nodes_;
  return index;
}

Status BLinkTree::WriteExtent(std::string_view key, std::string_view value,
                              uint64_t version, std::string* ref_bytes) {
  auto ext = slab_.Store(key, value, version, &extent_image_);
  if (!ext.ok()) {
    if (ext.status().code() == StatusCode::kOutOfMemory) {
      // One that no emptying could make room for is not "full".
      const uint64_t bytes =
          sizeof(hash::ExtentHeader) + key.size() + value.size();
      if (!slab_.CouldEverHold(bytes)) {
        return Status::OutOfMemory(
            "a value of " + FormatSize(value.size()) +
            " does not fit in the ordered store, which holds " +
            FormatSize(slab_.capacity() - slab_.withheld()) +
            " in all (remem-server's --tree-memory)");
      }
      return Status::OutOfMemory("the tree region is full");
    }
    return ext.status();
  }
  // Keep the image's storage for values up to 1 MiB only (not 16 MiB for
  // good after one large value).
  if (extent_image_.capacity() > (1u << 20)) {
    extent_image_.clear();
    extent_image_.shrink_to_fit();
  }
  ValueRef ref{};
  ref.offset = ext->offset;
  ref.incarnation = ext->incarnation;
  ref.size_class = uint8_t(ext->size_class);
  ref.value_len = uint32_t(value.size());
  ref_bytes->assign(reinterpret_cast<const char*>(&ref), sizeof(ref));
  return Status::OK();
}

void BLinkTree::FreeExtent(std::string_view ref_bytes) {
  ValueRef ref;
  std::memcpy(&ref, ref_bytes.data(), sizeof(ref));
  slab_.Free(ref.offset, ref.size_class);
}

Status BLinkTree::WriteKey(std::string_view key, KeyRef* ref) {
  auto ext = slab_.Store(key, std::string_view(), 0, &extent_image_);
  if (!ext.ok()) {
    if (ext.status().code() == StatusCode::kOutOfMemory) {
      return Status::OutOfMemory("the tree region is full");
    }
    return ext.status();
  }
  *ref = KeyRef{};
  ref->offset = ext->offset;
  ref->incarnation = ext->incarnation;
  ref->size_class = uint8_t(ext->size_class);
  ref->key_len = uint32_t(key.size());
  return Status::OK();
}

void BLinkTree::FreeKey(const KeyRef& ref) {
  slab_.Free(ref.offset, ref.size_class);
}

Status BLinkTree::ResolveOwn(NodeView* v) const {
  if (v->long_keys() == 0) return Status::OK();
  return v->ResolveKeys([this](const KeyRef& r, char* dst) {
    std::memcpy(dst, slab_.At(r.offset) + sizeof(hash::ExtentHeader),
                r.key_len);
    return Status::OK();
  });
}

void BLinkTree::View(uint32_t index, NodeView* v) const {
  // The owner's own memory: it verified when it was written.
  (void)v->Parse(NodeAt(index), index, /*checksum=*/false);
  (void)ResolveOwn(v);
}

Status BLinkTree::OwnSource::Fetch(uint32_t index, uint8_t* /*scratch*/,
                                   NodeView* view) {
  if (index == kNoNode || index >= t_->node_limit_) {
    return Status::Corruption("node index out of range");
  }
  REMEM_RETURN_IF_ERROR(view->Parse(t_->NodeAt(index), index,
                                    /*checksum=*/false));
  return t_->ResolveOwn(view);
}

Status BLinkTree::OwnSource::ReadExtent(std::string_view /*key*/,
                                        uint64_t /*version*/,
                                        const ValueRef& ref,
                                        std::string* value) {
  // The owner's own memory: the extent is the leaf's while the owner reads.
  const uint8_t* e = t_->slab_.At(ref.offset);
  hash::ExtentHeader h;
  std::memcpy(&h, e, sizeof(h));
  value->assign(reinterpret_cast<const char*>(e) + sizeof(h) + h.key_len,
                h.value_len);
  return Status::OK();
}

void BLinkTree::Publish(uint32_t index, const NodeContent& c) {
  uint8_t* node = NodeAt(index);
  // Key extents: counted for the places the new image names them before
  // it is written; the old image's places are given up after, and an
  // extent no place names any more is freed (a reader holding an older
  // copy finds its incarnation changed).
  ForEachKeyRef(c, [this](const KeyRef& r) { ++key_uses_[r.offset]; });
  old_refs_.clear();
  if (!key_uses_.empty()) {
    NodeView ov;
    if (ov.Parse(node, index, /*checksum=*/false).ok()) {
      ov.LongKeyRefs(&old_refs_);
    }
  }
  uint64_t old;
  std::memcpy(&old, node + 8, 8);
  const uint64_t version = (old | 1) + 1;
  uint8_t image[kNodeBytes];
  EncodeNode(c, version, image, version_);
  StoreWord(node + 8, old | 1);  // odd: being written
  constexpr size_t kHalf = kNodeBytes / 2;
  hash::StoreWords(node + 16, image + 16, kHalf - 16);
  if (mid_write_) mid_write_();
  hash::StoreWords(node + kHalf, image + kHalf, kNodeBytes - kHalf);
  uint64_t sum;
  std::memcpy(&sum, image, 8);
  StoreWord(node, sum);
  StoreWord(node + 8, version);
  for (const KeyRef& r : old_refs_) {
    auto it = key_uses_.find(r.offset);
    if (it != key_uses_.end() && --it->second == 0) {
      key_uses_.erase(it);
      FreeKey(r);
    }
  }
}

void BLinkTree::PublishRoot() {
  TreeRoot r{};
  root_version_ += 2;
  r.version = root_version_;
  r.magic = kTreeRootMagic;
  r.layout_version = kTreeLayoutVersion;
  r.height = height_;
  r.root = root_;
  r.node_limit = node_limit_;
  r.checksum = TreeRootChecksum(r);
  StoreWord(base_ + 8, root_version_ - 1);
  hash::StoreWords(base_ + 16, reinterpret_cast<const uint8_t*>(&r) + 16,
                   sizeof(r) - 16);
  StoreWord(base_, r.checksum);
  StoreWord(base_ + 8, r.version);
}

uint32_t BLinkTree::Descend(std::string_view key, std::vector<uint32_t>* path,
                            NodeView* leaf) const {
  uint32_t cur = root_;
  NodeView& v = *leaf;
  for (;;) {
    View(cur, &v);
    if (v.leaf()) return cur;
    path->push_back(cur);
    // The last entry whose key is <= key (the first is the low fence, and
    // the owner's descent from the root never moves right).
    size_t i = v.LowerBound(key);
    if (i == v.count() || v.key(i) != key) --i;
    cur = v.child(i);
  }
}

Status BLinkTree::Get(std::string_view key, std::string* value,
                      uint64_t* version) {
  SearchStats stats;
  return Lookup(&source_, nullptr, key, value, version, &stats);
}

Status BLinkTree::Scan(std::string_view start, std::string_view end,
                       uint32_t limit, bool descending, ScanPage* page) {
  SearchStats stats;
  return ScanRange(&source_, nullptr, start, end, limit, descending, page,
                   &stats);
}

Result<uint64_t> BLinkTree::Put(std::string_view key, std::string_view value,
                                PutMode mode, uint64_t expected) {
  return Write(key, value, mode, expected, 0);
}

Status BLinkTree::Restore(std::string_view key, std::string_view value,
                          uint64_t version) {
  return Write(key, value, PutMode::kUpsert, 0, version).status();
}

Status BLinkTree::RestoreDelete(std::string_view key, uint64_t version) {
  std::vector<uint32_t> path;
  if (key.empty() || key.size() > kMaxKey) {
    return Status::InvalidArgument("bad key in a tree record");
  }
  NodeView v;
  (void)Descend(key, &path, &v);
  const size_t i = v.LowerBound(key);
  if (i < v.count() && v.key(i) == key && v.entry_version(i) < version) {
    // The delete consumes `version` at least before the leaf shows it
    // (layout.h, "Stamps").
    RaiseVersion(version - 1);
    REMEM_RETURN_IF_ERROR(Delete(key));
  }
  RaiseVersion(version);
  return Status::OK();
}

Result<uint64_t> BLinkTree::Write(std::string_view key, std::string_view value,
                                  PutMode mode, uint64_t expected,
                                  uint64_t restore) {
  if (key.empty() || key.size() > kMaxKey) {
    return Status::InvalidArgument("tree keys are 1.." +
                                   std::to_string(kMaxKey) + " bytes");
  }
  if (value.size() > kMaxValue) {
    return Status::InvalidArgument("tree values are at most " +
                                   std::to_string(kMaxValue) + " bytes");
  }
  std::vector<uint32_t> path;
  NodeView v;
  const uint32_t leaf = Descend(key, &path, &v);
  const size_t i = v.LowerBound(key);
  const bool exists = i < v.count() && v.key(i) == key;
  if (mode == PutMode::kIfAbsent && exists) {
    return Status::AlreadyExists("key exists");
  }
  if (mode == PutMode::kIfVersion) {
    if (!exists) return Status::NotFound("key not found");
    if (v.entry_version(i) != expected) {
      return Status::Conflict("version is " +
                              std::to_string(v.entry_version(i)));
    }
  }
  if (restore != 0 && exists && v.entry_version(i) >= restore) {
    return v.entry_version(i);  // recovery: the stored pair is as new
  }
  NodeContent c = Decode(v);
  const uint64_t version = restore != 0 ? restore : version_ + 1;
  NodeEntry e;
  // A long key keeps its key extent when it is rewritten; a new one gets
  // its own (no node names it yet: freed here if the write fails).
  bool new_key_extent = false;
  if (exists) {
    e.key = c.entries[i].key;
  } else {
    e.key.bytes.assign(key);
    if (key.size() > kMaxInlineKey) {
      REMEM_RETURN_IF_ERROR(WriteKey(key, &e.key.ref));
      new_key_extent = true;
    }
  }
  e.version = version;
  e.out_of_line = value.size() > kMaxInlineValue;
  if (e.out_of_line) {
    if (Status st = WriteExtent(key, value, version, &e.value); !st.ok()) {
      if (new_key_extent) FreeKey(e.key.ref);
      return st;
    }
  } else {
    e.value.assign(value);
  }
  std::string replaced;  // the replaced value's ValueRef, if out of line
  if (exists) {
    if (c.entries[i].out_of_line) replaced = std::move(c.entries[i].value);
    c.entries[i] = std::move(e);
  } else {
    c.entries.insert(c.entries.begin() + long(i), std::move(e));
  }
  // Consumed before any node shows the write (layout.h, "Stamps"): a
  // write that fails after this leaves a gap in the versions, which is
  // harmless.
  RaiseVersion(version);
  if (c.Fits()) {
    Publish(leaf, c);
  } else if (Shift(leaf, &c, path)) {
    // A sibling took some of its entries (no node taken).
  } else {
    // A split may add a node per level and a new root.
    if (Status st = ReserveNodes(size_t{height_} + 1); !st.ok()) {
      if (c.entries[i].out_of_line) FreeExtent(c.entries[i].value);
      if (new_key_extent) FreeKey(c.entries[i].key.ref);
      return st;
    }
    REMEM_RETURN_IF_ERROR(SplitAndPublish(leaf, std::move(c), std::move(path),
                                          exists ? SIZE_MAX : i));
  }
  // No leaf names the old extent any more: a reader holding an older copy
  // finds its incarnation changed.
  if (!replaced.empty()) FreeExtent(replaced);
  if (!exists) ++size_;
  return version;
}

Status BLinkTree::Delete(std::string_view key) {
  if (key.empty() || key.size() > kMaxKey) {
    return Status::InvalidArgument("tree keys are 1.." +
                                   std::to_string(kMaxKey) + " bytes");
  }
  std::vector<uint32_t> path;
  NodeView v;
  const uint32_t leaf = Descend(key, &path, &v);
  const size_t i = v.LowerBound(key);
  if (i >= v.count() || v.key(i) != key) {
    return Status::NotFound("key not found");
  }
  NodeContent c = Decode(v);
  std::string replaced;
  if (c.entries[i].out_of_line) replaced = std::move(c.entries[i].value);
  c.entries.erase(c.entries.begin() + long(i));
  ++version_;  // before the leaf shows it (layout.h, "Stamps")
  Publish(leaf, c);
  if (!replaced.empty()) FreeExtent(replaced);
  --size_;
  Rebalance(leaf, std::move(c), std::move(path));
  return Status::OK();
}

namespace {

// Merge thresholds (bytes after the header): a node under a quarter full
// is merged with a sibling if both fit in three quarters, so a merged node
// must grow by a quarter of a node before it splits again.
constexpr size_t kUnderfull = kNodeArea / 4;
constexpr size_t kMergedAtMost = kNodeArea * 3 / 4;
// A shift is made only if the fuller of the two leaves is then at most this
// full: else each insert there would shift again (three node writes each,
// as a split) where a split makes room for many.
constexpr size_t kShiftedAtMost = kNodeArea - kNodeArea / 8;

// The fence between two leaves, whose keys end with `left` and start with
// `right` (left < right): `right` if it is short; if it is long, the
// shortest prefix of it above `left` (suffix truncation), so that long
// keys become fences and separators only where neighbouring keys share
// more than kMaxInlineKey bytes, and a read of an internal node needs no
// key extent. A prefix that would be long is not made (it would need a
// key extent of its own in the middle of a split): `right` itself then,
// sharing its extent. Short keys are not truncated: at 1 M pairs of 16 B
// keys it measured no faster either way (BENCHMARKS.md, "Long keys").
// The length of the prefix of `right` that Separator makes, or 0 if it is
// `right` itself.
size_t SeparatorPrefix(const NodeKey& left, const NodeKey& right) {
  const std::string& l = left.bytes;
  const std::string& r = right.bytes;
  if (r.size() <= kMaxInlineKey) return 0;
  const size_t n = std::min(l.size(), r.size());
  size_t p = 0;
  while (p < n && l[p] == r[p]) ++p;
  if (p + 1 >= r.size() || p + 1 > kMaxInlineKey) return 0;
  return p + 1;
}
NodeKey Separator(const NodeKey& left, const NodeKey& right) {
  const size_t prefix = SeparatorPrefix(left, right);
  if (prefix == 0) return right;
  NodeKey s;
  s.bytes = right.bytes.substr(0, prefix);
  return s;
}
// Separator(left, right).stored_size(), without making it.
size_t SeparatorBytes(const NodeKey& left, const NodeKey& right) {
  const size_t prefix = SeparatorPrefix(left, right);
  return prefix == 0 ? right.stored_size() : prefix;
}

// Bytes of `left` after taking over `right`'s entries and high fence.
size_t MergedBytes(const NodeContent& left, const NodeContent& right) {
  return left.Bytes() - left.high.stored_size() + right.Bytes() -
         right.low.stored_size();
}

}  // namespace

void BLinkTree::Rebalance(uint32_t index, NodeContent c,
                          std::vector<uint32_t> path) {
  while (!path.empty() && c.Bytes() < kUnderfull) {
    const uint32_t parent = path.back();
    path.pop_back();
    NodeView pv;
    View(parent, &pv);
    // The owner's parent is exact: its entry for this node has the node's
    // low fence as key, and neighbouring entries name its siblings.
    const size_t j = pv.LowerBound(c.low.bytes);
    if (j >= pv.count() || pv.key(j) != c.low.bytes || pv.child(j) != index) {
      return;
    }
    NodeContent pc;
    if (j > 0) {
      const uint32_t left = pv.child(j - 1);
      NodeView lv;
      View(left, &lv);
      NodeContent l = Decode(lv);
      if (l.right != index || MergedBytes(l, c) > kMergedAtMost) return;
      Merge(left, std::move(l), index, std::move(c), parent, j, &pc);
    } else if (j + 1 < pv.count()) {
      const uint32_t right = pv.child(j + 1);
      NodeView rv;
      View(right, &rv);
      NodeContent r = Decode(rv);
      if (c.right != right || MergedBytes(c, r) > kMergedAtMost) return;
      Merge(index, std::move(c), right, std::move(r), parent, j + 1, &pc);
    } else {
      return;  // an only child: its parent may merge instead, later
    }
    if (parent == root_) return ShrinkRoot(std::move(pc));
    index = parent;
    c = std::move(pc);
  }
}

void BLinkTree::ShrinkRoot(NodeContent root) {
  // The root's one child holds every key (its low fence is the root's,
  // -infinity, and it has no right sibling).
  while (root.level > 0 && root.entries.size() == 1) {
    const uint32_t old = root_;
    root_ = root.entries[0].child;
    --height_;
    PublishRoot();
    // Readers that read the TreeRoot before reach the old root dead and
    // start again from the new one; a cached copy of it still routes to
    // live children or to dead ones, as any stale copy.
    Kill(old, std::move(root));
    NodeView v;
    View(root_, &v);
    root = Decode(v);
  }
}

bool BLinkTree::Shift(uint32_t index, NodeContent* c,
                      const std::vector<uint32_t>& path) {
  if (c->level != 0 || path.empty()) return false;
  const uint32_t parent = path.back();
  NodeView pv;
  View(parent, &pv);
  // As in Rebalance: the parent's entry j names this leaf by its low
  // fence, and its neighbours its siblings.
  const size_t j = pv.LowerBound(c->low.bytes);
  if (j >= pv.count() || pv.key(j) != c->low.bytes || pv.child(j) != index) {
    return false;
  }
  const size_t n = c->entries.size();
  // The k entries to move that make the fuller leaf least full, if both
  // fit: `stay` and `go` are the two leaves' bytes but the new fence as k
  // grows, `fence(k)` that fence's. Sizes only: the sibling is decoded
  // once a shift is decided (a failed try costs a split little).
  auto plan = [&](size_t stay, size_t go, auto entry_bytes, auto fence,
                  size_t* best) {
    size_t best_max = SIZE_MAX;
    *best = 0;
    for (size_t k = 1; k < n; ++k) {
      stay -= entry_bytes(k);
      go += entry_bytes(k);
      const size_t f = fence(k);
      if (go + f > kNodeArea || stay + f > kNodeArea) continue;
      const size_t m = std::max(stay, go) + f;
      if (m < best_max) {
        best_max = m;
        *best = k;
      }
    }
    return *best > 0 && best_max <= kShiftedAtMost;
  };
  // Toward the right sibling: c's last k entries, the fence between
  // entries n - k - 1 and n - k.
  if (j + 1 < pv.count() && pv.child(j + 1) == c->right) {
    NodeView rv;
    View(c->right, &rv);
    size_t best = 0;
    if (plan(
            c->Bytes() - (c->has_high ? c->high.stored_size() : 0),
            size_t{rv.header().used} - rv.header().low_len,
            [&](size_t k) { return c->EntryBytes(n - k); },
            [&](size_t k) {
              return SeparatorBytes(c->entries[n - k - 1].key,
                                    c->entries[n - k].key);
            },
            &best)) {
      NodeKey sep =
          Separator(c->entries[n - best - 1].key, c->entries[n - best].key);
      NodeContent pc = Decode(pv);
      if (pc.Bytes() - pc.entries[j + 1].key.stored_size() +
              sep.stored_size() <=
          kNodeArea) {
        NodeContent r = Decode(rv);
        r.entries.insert(r.entries.begin(),
                         std::make_move_iterator(c->entries.end() - long(best)),
                         std::make_move_iterator(c->entries.end()));
        c->entries.resize(n - best);
        r.low = sep;
        c->has_high = true;
        c->high = sep;
        pc.entries[j + 1].key = std::move(sep);
        // A split's order: the right leaf first (for a moment both leaves
        // hold the moved keys, the same pairs), then this one, then the
        // parent. A reader that reached this leaf through an older parent
        // moves right; one holding the right leaf's older copy (a higher
        // low fence) finds the key below it and searches again.
        Publish(c->right, r);
        Publish(index, *c);
        Publish(parent, pc);
        ++shifts_;
        return true;
      }
    }
  }
  // Toward the left sibling: c's first k entries, the fence between
  // entries k - 1 and k.
  if (j == 0) return false;
  const uint32_t left = pv.child(j - 1);
  NodeView lv;
  View(left, &lv);
  if (lv.right() != index) return false;
  size_t best = 0;
  if (!plan(
          c->Bytes() - c->low.stored_size(),
          size_t{lv.header().used} - lv.header().high_len,
          [&](size_t k) { return c->EntryBytes(k - 1); },
          [&](size_t k) {
            return SeparatorBytes(c->entries[k - 1].key, c->entries[k].key);
          },
          &best)) {
    return false;
  }
  NodeKey sep = Separator(c->entries[best - 1].key, c->entries[best].key);
  NodeContent pc = Decode(pv);
  if (pc.Bytes() - pc.entries[j].key.stored_size() + sep.stored_size() >
      kNodeArea) {
    return false;
  }
  NodeContent l = Decode(lv);
  l.entries.insert(l.entries.end(), std::make_move_iterator(c->entries.begin()),
                   std::make_move_iterator(c->entries.begin() + long(best)));
  c->entries.erase(c->entries.begin(), c->entries.begin() + long(best));
  l.has_high = true;
  l.high = sep;
  c->low = sep;
  pc.entries[j].key = std::move(sep);
  // Keys move left here, so the order differs from a split's: the left
  // leaf first (both hold the moved keys), then the parent (which routes
  // them to it), then this leaf. A reader reaching this leaf by an older
  // parent or by the left one's older right pointer finds the key below
  // its new low fence and searches again; by then the parent that routes
  // it left is published.
  Publish(left, l);
  Publish(parent, pc);
  Publish(index, *c);
  ++shifts_;
  ++left_shifts_;
  return true;
}

void BLinkTree::Merge(uint32_t left, NodeContent l, uint32_t right,
                      NodeContent r, uint32_t parent, size_t j,
                      NodeContent* pc) {
  // 1. The left node takes over: for a moment both claim the right one's
  // range, with the same keys (nothing is written in between).
  l.entries.insert(l.entries.end(), std::make_move_iterator(r.entries.begin()),
                   std::make_move_iterator(r.entries.end()));
  l.has_high = r.has_high;
  l.high = r.high;
  l.right = r.right;
  Publish(left, l);
  // 2. The right one holds nothing any more: a reader reaching it
  // searches again.
  Kill(right, std::move(r));
  // 3. The parent drops it (it keeps the left one's entry: at least one).
  NodeView pv;
  View(parent, &pv);
  *pc = Decode(pv);
  pc->entries.erase(pc->entries.begin() + long(j));
  Publish(parent, *pc);
  ++merges_;
}

void BLinkTree::Kill(uint32_t index, NodeContent c) {
  // Its level and right pointer stay; its fences go, so that a dead node
  // names no key extent.
  c.entries.clear();
  c.low = NodeKey{};
  c.has_high = false;
  c.high = NodeKey{};
  c.dead = true;
  Publish(index, c);
  free_nodes_.push_back(index);
  --num_nodes_;
}

Status BLinkTree::SplitAndPublish(uint32_t index, NodeContent c,
                                  std::vector<uint32_t> path, size_t inserted) {
  for (;;) {
    const size_t n = c.entries.size();
    if (n < 2) return Status::Internal("a node too big with one entry");
    size_t best = 0;
    if (inserted == n - 1) {
      // Appended after the node's last key (keys inserted in ascending
      // runs, and recovery from a snapshot, a leaf walk): the left node
      // keeps as much as fits with its new high fence (the first right
      // key, or for a leaf a prefix of it, which may take more room than a
      // long key's KeyRef), and the rest starts the right one. An even
      // split would leave each left half half empty for good, as the run
      // goes on to the right: a full tree rebuilt from its snapshot would
      // not fit its region again.
      size_t left = c.low.stored_size();
      for (size_t s = 1; s < n; ++s) {
        left += c.EntryBytes(s - 1);
        const size_t fence = c.level == 0 ? SeparatorBytes(c.entries[s - 1].key,
                                                           c.entries[s].key)
                                          : c.entries[s].key.stored_size();
        if (left + fence > kNodeArea) break;
        best = s;
      }
      if (best > 0) {  // the right one must fit too (a node of large entries)
        size_t right = (c.has_high ? c.high.stored_size() : 0) +
                       (c.level == 0 ? SeparatorBytes(c.entries[best - 1].key,
                                                      c.entries[best].key)
                                     : c.entries[best].key.stored_size());
        for (size_t i = best; i < n; ++i) right += c.EntryBytes(i);
        if (right > kNodeArea) best = 0;
      }
    }
    if (best == 0) {
      // The split point that makes the larger half smallest.
      size_t total = 0;
      for (size_t i = 0; i < n; ++i) total += c.EntryBytes(i);
      size_t best_max = SIZE_MAX, left = 0;
      for (size_t s = 1; s < n; ++s) {
        left += c.EntryBytes(s - 1);
        const size_t m = std::max(left, total - left);
        if (m < best_max) {
          best_max = m;
          best = s;
        }
      }
    }
    NodeContent right;
    right.level = c.level;
    right.entries.assign(
        std::make_move_iterator(c.entries.begin() + long(best)),
        std::make_move_iterator(c.entries.end()));
    c.entries.resize(best);
    right.low = c.level == 0
                    ? Separator(c.entries.back().key, right.entries.front().key)
                    : right.entries.front().key;
    right.has_high = c.has_high;
    right.high = std::move(c.high);
    right.right = c.right;
    c.has_high = true;
    c.high = right.low;
    // kSplitRoom makes this impossible; checked before anything is taken.
    if (!c.Fits() || !right.Fits()) {
      return Status::Internal("a split half does not fit a node");
    }
    right.self = TakeNode();
    c.right = right.self;
    // B-link order: the new right node, then the left one.
    Publish(right.self, right);
    Publish(index, c);
    ++splits_;
    if (path.empty()) {
      // The root split: a new root above both.
      NodeContent root;
      root.level = uint8_t(c.level + 1);
      root.self = TakeNode();
      NodeEntry l, r;
      l.key = c.low;
      l.child = index;
      r.key = right.low;
      r.child = right.self;
      root.entries.push_back(std::move(l));
      root.entries.push_back(std::move(r));
      Publish(root.self, root);
      root_ = root.self;
      ++height_;
      PublishRoot();
      return Status::OK();
    }
    const uint32_t parent = path.back();
    path.pop_back();
    NodeView pv;
    View(parent, &pv);
    NodeContent pc = Decode(pv);
    const size_t at = pv.LowerBound(right.low.bytes);
    NodeEntry e;
    e.key = right.low;
    e.child = right.self;
    pc.entries.insert(pc.entries.begin() + long(at), std::move(e));
    if (pc.Fits()) {
      Publish(parent, pc);
      return Status::OK();
    }
    index = parent;
    c = std::move(pc);
    inserted = at;
  }
}

}  // namespace remem::tree
