// tree::RouteNode: a client's compact copy of a cached internal node, for
// descending through it. A node copy is 1 KiB and its parsed view 2 KiB
// more, and a binary search over it touches a cache line of the view and
// one of the node per key it compares (a one-sided get on 1 M pairs spent
// most of its time there, the cached level above the leaves being 4,500
// nodes: 13 MiB of copies and views). A RouteNode keeps what a descent
// needs in one block: the node's level, its children, and each key as the
// 8 bytes that follow the prefix all its keys share, as a big-endian word,
// so that comparing a key with it is one integer comparison (20 bytes per
// entry with the children's routes, a 40-byte header and the prefix: 600-900
// bytes for a node of 16-byte keys, whose binary search touches 3 or 4 of its
// lines). Only a tie (two keys that agree on those bytes too) compares whole
// keys, from the node's view, which the cache keeps beside it.
//
// Prefixes: every key a node holds lies in [low, high), and so starts with
// the longest common prefix P of its two fences (a string below P, or
// above every string starting with P, lies outside them): a target that
// does not start with P is below or beyond the node. The entries' keys
// share a prefix Q at least as long (decimal keys of one width share most
// of their digits in a node whose fences share few): a target that starts
// with P but not with Q is below or above every entry, one that starts
// with Q is ordered against them by the words after Q. A node without a
// high fence (the rightmost of its level) has P empty. Both are cut to
// kMaxInlineKey bytes (a shorter prefix is shared too).
//
// Thread contract: plain data over a NodeView that must outlive it and not
// change (the cache's copy, which owns both).

#ifndef REMEM_TREE_ROUTE_H_
#define REMEM_TREE_ROUTE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "tree/node.h"

namespace remem::tree {

// A search target (search.h): the leaf holding `key` (kAt: low <= key <
// high), or the leaf holding the keys just below `key` (kBelow: low < key
// <= high; an unbounded key is +infinity).
struct Target {
  enum Mode { kAt, kBelow };
  Mode mode = kAt;
  std::string_view key;
  bool unbounded = false;  // kBelow only
};

class RouteNode {
 public:
  struct Deleter {
    void operator()(RouteNode* r) const;
  };
  using Ptr = std::unique_ptr<RouteNode, Deleter>;

  // The route of `view`, a verified internal node with its long keys
  // resolved; null for a leaf, a dead node, or keys outside the fences'
  // common prefix (a node the server would never publish: NodeCache does
  // not keep it, and searches read it fresh).
  static Ptr Make(const NodeView& view);

  enum class Place { kBelow, kBeyond, kIn };
  // Where the target lies: below the node's range, beyond it (the copy is
  // stale), or in it; for kIn, *entry is the entry whose child holds the
  // target (count() if none: a malformed node). The same answers as a
  // fresh copy's fences and LowerBound (search.cc's TargetBelow,
  // TargetBeyond, ChildIndex): for kAt, below is under the low fence and
  // beyond at or past the high one; for kBelow, below is at or under the
  // low fence and beyond past the high one (always, unbounded, if there is
  // one). In a malformed node whose low fence is not below its high one,
  // a target may be both: this answers below where search.cc's order says
  // beyond (a search evicts the node either way).
  Place Locate(const Target& t, size_t* entry) const;

  // The route of child i's node as the cache held it at `generation`
  // (NodeCache: bumped whenever a route is freed), or null: not known yet
  // at that generation. A descent that finds it here skips the cache's
  // table (a cache miss of its own at the level above the leaves).
  const RouteNode* kid(size_t i, uint64_t generation) const {
    return kids_generation_ == generation ? kids()[i] : nullptr;
  }
  // Remembers child i's route at `generation` (forgetting the others if
  // they were of another).
  void set_kid(size_t i, uint64_t generation, const RouteNode* route) const;

  uint8_t level() const { return level_; }
  size_t count() const { return count_; }
  uint32_t child(size_t i) const { return children()[i]; }
  // The node's parsed copy (its whole keys).
  const NodeView& view() const { return *view_; }

 private:
  RouteNode() = default;
  // The 8 bytes of s from offset `at`, big-endian, zero-padded.
  static uint64_t Word(std::string_view s, size_t at);
  // Compares the target key (its word after Q: w) with entry i.
  int CompareEntry(std::string_view key, uint64_t w, size_t i) const;
  // The first entry greater than (strict) or at least key, which starts
  // with P.
  size_t Bound(std::string_view key, bool strict) const;

  // The block after the header: Q first (a search compares P, its start,
  // first: on the header's cache line when short), padded to words.
  const char* prefix() const { return reinterpret_cast<const char*>(this + 1); }
  const uint64_t* words() const {
    return reinterpret_cast<const uint64_t*>(prefix() +
                                             (entry_prefix_len_ + 7) / 8 * 8);
  }
  const uint32_t* children() const {
    return reinterpret_cast<const uint32_t*>(words() + count_);
  }
  const RouteNode** kids() const {
    return reinterpret_cast<const RouteNode**>(
        const_cast<uint32_t*>(children()) + (count_ + 1) / 2 * 2);
  }

  const NodeView* view_ = nullptr;         // whole keys, for ties
  mutable uint64_t kids_generation_ = 0;   // of kids(): 0, none known
  uint64_t low_word_ = 0, high_word_ = 0;  // the fences' words after P
  uint16_t prefix_len_ = 0;                // P: the fences' common prefix
  uint16_t entry_prefix_len_ = 0;          // Q: the entries' (>= P)
  uint16_t count_ = 0;
  uint8_t level_ = 0;
  bool has_high_ = false;
  // Then: char prefix[entry_prefix_len_] (Q, padded to words), uint64_t
  // words[count_] (each key's after Q), uint32_t children[count_] (padded
  // to words), const RouteNode* kids[count_].
};
// The arrays after the header start aligned for words.
static_assert(sizeof(RouteNode) == 40);

}  // namespace remem::tree

#endif  // REMEM_TREE_ROUTE_H_
