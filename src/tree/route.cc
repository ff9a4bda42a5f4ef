#include "tree/route.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace remem::tree {

namespace {

int CompareKeys(std::string_view a, std::string_view b) {
  const int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

// Compares s's bytes [from, to) with p's (s starts with p's bytes up to
// `from`): as strings, so an s that ends before `to` is below.
int ComparePrefix(std::string_view s, const char* p, size_t from, size_t to) {
  if (from >= to) return 0;
  const size_t n = s.size() > from ? std::min(s.size(), to) - from : 0;
  const int c = n == 0 ? 0 : std::memcmp(s.data() + from, p + from, n);
  if (c != 0) return c;
  return s.size() < to ? -1 : 0;
}

size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

void RouteNode::Deleter::operator()(RouteNode* r) const {
  r->~RouteNode();
  ::operator delete(r);
}

// Inlined, as the two below: they are most of a descent's instructions.
[[gnu::always_inline]] inline uint64_t RouteNode::Word(std::string_view s,
                                                       size_t at) {
  uint64_t w = 0;
  if (s.size() >= at + sizeof(w)) {
    std::memcpy(&w, s.data() + at, sizeof(w));
    return __builtin_bswap64(w);
  }
  // Big-endian: the word's integer order is the bytes' order, and a
  // shorter string's zero padding sorts it first unless it ties.
  for (size_t j = 0; at + j < s.size(); ++j) {
    w |= uint64_t(uint8_t(s[at + j])) << (56 - 8 * j);
  }
  return w;
}

[[gnu::always_inline]] inline int RouteNode::CompareEntry(std::string_view key,
                                                          uint64_t w,
                                                          size_t i) const {
  const uint64_t e = words()[i];
  if (w != e) return w < e ? -1 : 1;
  return CompareKeys(key, view_->key(i));
}

[[gnu::always_inline]] inline size_t RouteNode::Bound(std::string_view key,
                                                      bool strict) const {
  // Against Q's bytes after P: below or above every entry, or a search of
  // the words after Q.
  const int q = ComparePrefix(key, prefix(), prefix_len_, entry_prefix_len_);
  if (q != 0) return q < 0 ? 0 : count_;
  const uint64_t w = Word(key, entry_prefix_len_);
  size_t lo = 0, hi = count_;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    const int c = CompareEntry(key, w, mid);
    // strict: the first entry > key (entries <= key are passed over);
    // else the first entry >= key.
    if (strict ? c >= 0 : c > 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

RouteNode::Place RouteNode::Locate(const Target& t, size_t* entry) const {
  const bool below = t.mode == Target::kBelow;
  if (below && t.unbounded) {
    if (has_high_) return Place::kBeyond;
    *entry = count_ == 0 ? 0 : count_ - 1;
    return Place::kIn;
  }
  const std::string_view key = t.key;
  // P first: a key that does not start with it is below or beyond every
  // key of the node, fences included.
  const int c = ComparePrefix(key, prefix(), 0, prefix_len_);
  if (c < 0) return Place::kBelow;
  if (c > 0) return Place::kBeyond;  // only with a high fence (P non-empty)
  const uint64_t w = Word(key, prefix_len_);
  const int vs_low = w != low_word_ ? (w < low_word_ ? -1 : 1)
                                    : CompareKeys(key, view_->low());
  int vs_high = 0;
  if (has_high_) {
    vs_high = w != high_word_ ? (w < high_word_ ? -1 : 1)
                              : CompareKeys(key, view_->high());
  }
  if (!below) {
    if (vs_low < 0) return Place::kBelow;
    if (has_high_ && vs_high >= 0) return Place::kBeyond;
    const size_t i = Bound(key, /*strict=*/true);  // first entry > key
    *entry = i == 0 ? count_ : i - 1;
    return Place::kIn;
  }
  if (vs_low <= 0) return Place::kBelow;
  if (has_high_ && vs_high > 0) return Place::kBeyond;
  const size_t i = Bound(key, /*strict=*/false);  // first entry >= key
  *entry = i == 0 ? count_ : i - 1;
  return Place::kIn;
}

void RouteNode::set_kid(size_t i, uint64_t generation,
                        const RouteNode* route) const {
  if (kids_generation_ != generation) {
    std::fill(kids(), kids() + count_, nullptr);
    kids_generation_ = generation;
  }
  kids()[i] = route;
}

RouteNode::Ptr RouteNode::Make(const NodeView& view) {
  if (view.leaf() || view.dead()) return nullptr;
  const std::string_view low = view.low(), high = view.high();
  const size_t count = view.count();
  // Any prefix of a common prefix is common too: long ones are cut, to
  // keep the block small.
  const size_t p = std::min<size_t>(
      view.has_high() ? CommonPrefix(low, high) : 0, kMaxInlineKey);
  size_t q =
      count == 0 ? p : std::min<size_t>(view.key(0).size(), kMaxInlineKey);
  for (size_t i = 0; i < count; ++i) {
    const std::string_view k = view.key(i);
    // Every key starts with P (else the node is malformed: no route).
    if (k.size() < p || (p > 0 && std::memcmp(k.data(), low.data(), p) != 0)) {
      return nullptr;
    }
    q = std::min(q, CommonPrefix(k, view.key(0)));
  }
  q = std::max(q, p);
  const size_t bytes =
      sizeof(RouteNode) + (q + 7) / 8 * 8 + count * sizeof(uint64_t) +
      (count + 1) / 2 * 2 * sizeof(uint32_t) + count * sizeof(RouteNode*);
  Ptr r(new (::operator new(bytes)) RouteNode());
  r->view_ = &view;
  r->prefix_len_ = uint16_t(p);
  r->entry_prefix_len_ = uint16_t(q);
  r->count_ = uint16_t(count);
  r->level_ = view.level();
  r->has_high_ = view.has_high();
  r->low_word_ = Word(low, p);
  r->high_word_ = r->has_high_ ? Word(high, p) : 0;
  // Written through the block's own pointers (prefix() and the rest are
  // const views of the same bytes). Q is the first key's start (P with no
  // key).
  auto* block = reinterpret_cast<char*>(r.get() + 1);
  if (q > 0) std::memcpy(block, count > 0 ? view.key(0).data() : low.data(), q);
  auto* words = const_cast<uint64_t*>(r->words());
  auto* children = const_cast<uint32_t*>(r->children());
  for (size_t i = 0; i < count; ++i) {
    words[i] = Word(view.key(i), q);
    children[i] = view.child(i);
  }
  return r;
}

}  // namespace remem::tree
