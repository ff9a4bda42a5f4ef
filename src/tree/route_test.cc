// tree::RouteNode against plain string comparisons: for random internal
// nodes whose keys share prefixes, contain zero bytes and tie on the 8
// bytes a route compares, every probe is placed below, beyond or in the
// node, at the same child, as the fences and a plain search of the keys
// say. And the node cache keeps a route beside each internal copy.

#include "tree/route.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "testing/keys.h"
#include "tree/search.h"

namespace remem::tree {
namespace {

struct Expected {
  RouteNode::Place place;
  size_t entry;  // for kIn
};

// What search.cc decides from the view: the fences, then the child.
Expected Reference(const std::vector<std::string>& keys, const std::string& low,
                   const std::string* high, const Target& t) {
  const std::string k(t.key);
  const size_t n = keys.size();
  const bool below = t.mode == Target::kBelow;
  if (below && t.unbounded) {
    if (high != nullptr) return {RouteNode::Place::kBeyond, 0};
    return {RouteNode::Place::kIn, n == 0 ? 0 : n - 1};
  }
  if (!below) {
    if (k < low) return {RouteNode::Place::kBelow, 0};
    if (high != nullptr && k >= *high) return {RouteNode::Place::kBeyond, 0};
    // The last key <= k.
    const size_t i =
        size_t(std::upper_bound(keys.begin(), keys.end(), k) - keys.begin());
    return {RouteNode::Place::kIn, i == 0 ? n : i - 1};
  }
  if (k <= low) return {RouteNode::Place::kBelow, 0};
  if (high != nullptr && k > *high) return {RouteNode::Place::kBeyond, 0};
  // The last key < k.
  const size_t i =
      size_t(std::lower_bound(keys.begin(), keys.end(), k) - keys.begin());
  return {RouteNode::Place::kIn, i == 0 ? n : i - 1};
}

// Whether the route places `k` as Reference does, in the three modes (kAt,
// kBelow, kBelow unbounded).
::testing::AssertionResult PlacedAsReference(
    const RouteNode& r, const std::vector<std::string>& keys,
    const std::string& low, const std::string* high, const std::string& k) {
  for (int mode = 0; mode < 3; ++mode) {
    Target t;
    t.mode = mode > 0 ? Target::kBelow : Target::kAt;
    t.unbounded = mode == 2;
    t.key = k;
    const Expected want = Reference(keys, low, high, t);
    size_t got = size_t(-1);
    const RouteNode::Place place = r.Locate(t, &got);
    if (place != want.place ||
        (place == RouteNode::Place::kIn && got != want.entry)) {
      return ::testing::AssertionFailure()
             << "mode " << mode << ": placed " << int(place) << " at " << got
             << ", want " << int(want.place) << " at " << want.entry;
    }
  }
  return ::testing::AssertionSuccess();
}

// An internal node `self` at `level`, fences `low` and `high` (null: none),
// whose entries keys[i] name children[i], encoded at version 2.
NodeContent Internal(uint32_t self, uint8_t level, const std::string& low,
                     const char* high, const std::vector<std::string>& keys,
                     const std::vector<uint32_t>& children) {
  NodeContent c;
  c.self = self;
  c.level = level;
  c.low.bytes = low;
  c.has_high = high != nullptr;
  if (high != nullptr) c.high.bytes = high;
  for (size_t i = 0; i < keys.size(); ++i) {
    NodeEntry e;
    e.key.bytes = keys[i];
    e.child = children[i];
    c.entries.push_back(e);
  }
  return c;
}

std::vector<uint8_t> Image(const NodeContent& c, uint64_t version = 2) {
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, version, img.data());
  return img;
}

TEST(TreeRoute, PlacesEveryProbeAsThePlainComparisons) {
  std::mt19937_64 rng(11);
  auto random_key = [&](const std::string& prefix, size_t max_extra) {
    return testing::EdgeByteKey(rng, prefix, max_extra);
  };
  // Keys over kMaxInlineKey bytes are stored out of line: a KeyRef naming
  // a (pretend) key extent, resolved from this map as a reader would.
  std::map<uint64_t, std::string> extents;
  auto node_key = [&](const std::string& bytes) {
    NodeKey k;
    k.bytes = bytes;
    if (bytes.size() > kMaxInlineKey) {
      k.ref.offset = 4096 + 64 * extents.size();
      k.ref.key_len = uint32_t(bytes.size());
      extents[k.ref.offset] = bytes;
    }
    return k;
  };
  int routes = 0, long_nodes = 0, empty_nodes = 0;
  for (int round = 0; round < 900; ++round) {
    extents.clear();
    // Keys sharing 0 to 30 bytes (or up to 100: prefixes past the routes'
    // cap of kMaxInlineKey, keys out of line), then up to 12 more (ties on
    // the 8 bytes after the prefix are frequent) or up to 40.
    const size_t prefix_max = round % 4 == 0 ? 0 : (round % 4 == 3 ? 100 : 30);
    const std::string prefix = random_key("", prefix_max);
    std::set<std::string> keys;
    const size_t n = round % 9 == 0 ? 0 : 1 + rng() % 30;
    while (keys.size() < n) {
      std::string k = random_key(prefix, round % 2 == 0 ? 12 : 40);
      if (!k.empty()) keys.insert(k);
    }
    const std::vector<std::string> sorted(keys.begin(), keys.end());
    // The low fence: the first key, or empty (the leftmost node); for a
    // node with no entries, the prefix and a tail.
    std::string low;
    if (sorted.empty()) {
      low = round % 5 == 0 ? std::string() : random_key(prefix, 10);
    } else if (round % 5 != 0) {
      low = sorted.front();
    }
    // The high fence: none (the rightmost node), a key just above the last
    // (sharing much of it), or one well above.
    const std::string& top = sorted.empty() ? low : sorted.back();
    std::string high;
    bool has_high = true;
    switch (round % 3) {
      case 0:
        has_high = false;
        break;
      case 1:
        high = top + std::string(1, '\0');
        break;
      default:
        high = top;
        while (!high.empty() && uint8_t(high.back()) == 0xff) high.pop_back();
        if (high.empty()) {
          has_high = false;
        } else {
          high.back() = char(uint8_t(high.back()) + 1);
        }
    }
    NodeContent c;
    c.self = 5;
    c.level = 1 + round % 3;
    c.low = node_key(low);
    c.has_high = has_high;
    if (has_high) c.high = node_key(high);
    for (size_t i = 0; i < sorted.size(); ++i) {
      NodeEntry e;
      e.key = node_key(sorted[i]);
      e.child = uint32_t(100 + i);
      c.entries.push_back(e);
    }
    if (!c.Fits()) continue;
    std::vector<uint8_t> img(kNodeBytes);
    EncodeNode(c, 2, img.data());
    NodeView read;
    ASSERT_TRUE(read.Parse(img.data(), 5).ok());
    ASSERT_TRUE(read.ResolveKeys([&](const KeyRef& r, char* dst) {
                      const std::string& k = extents.at(r.offset);
                      std::memcpy(dst, k.data(), k.size());
                      return Status::OK();
                    })
                    .ok());
    // Through the cache, as a search's routes are made (the long keys
    // adopted from the view that resolved them).
    NodeCache cache;
    cache.Put(5, read);
    const RouteNode* r = cache.Route(5);
    ASSERT_NE(r, nullptr) << "round " << round;
    ++routes;
    if (read.long_keys() > 0) ++long_nodes;
    if (sorted.empty()) ++empty_nodes;
    EXPECT_EQ(r->level(), c.level);
    EXPECT_EQ(r->count(), sorted.size());
    for (size_t i = 0; i < sorted.size(); ++i) {
      ASSERT_EQ(r->child(i), 100 + i);
    }
    const std::string* high_ptr = has_high ? &high : nullptr;
    auto some_key = [&] {
      return sorted.empty() ? low : sorted[rng() % sorted.size()];
    };
    for (int probe = 0; probe < 120; ++probe) {
      std::string k;
      switch (probe % 6) {
        case 0:  // a stored key or a fence
          k = probe % 3 == 0               ? low
              : probe % 3 == 1 && has_high ? high
                                           : some_key();
          break;
        case 1:  // a stored key, cut or extended by zero bytes or 0xff
          k = some_key();
          k = rng() % 2
                  ? k.substr(0, rng() % (k.size() + 1))
                  : k + std::string(1 + rng() % 9, rng() % 2 ? '\0' : '\xff');
          break;
        case 2:  // the prefix, cut, and a tail
          k = random_key(prefix.substr(0, rng() % (prefix.size() + 1)), 40);
          break;
        case 3:  // beside the prefix
          k = prefix.empty() ? random_key("", 4) : prefix;
          if (!k.empty()) {
            k.back() = char(uint8_t(k.back()) + (rng() % 2 ? 1 : -1));
          }
          break;
        case 4:  // a stored key with one byte changed
          k = some_key();
          if (!k.empty()) {
            const size_t j = rng() % k.size();
            k[j] = char(uint8_t(k[j]) + (rng() % 2 ? 1 : -1));
          }
          break;
        default:  // anything
          k = random_key("", 120);
      }
      ASSERT_TRUE(PlacedAsReference(*r, sorted, low, high_ptr, k))
          << "round " << round << " probe " << probe;
    }
  }
  EXPECT_GT(routes, 700);
  EXPECT_GT(long_nodes, 100);
  EXPECT_GT(empty_nodes, 50);
}

TEST(TreeRoute, KeysThatTieOnTheComparedWordAreComparedWhole) {
  // Fences "p/" and "p0": the common prefix is "p"; every key continues
  // with the same 8 bytes ("/aaaaaaa") and differs after them, or by a
  // zero byte (which the word's padding cannot tell from an end).
  const std::vector<std::string> keys = {
      "p/",         "p/aaaaaaa",  std::string("p/aaaaaaa\0", 10),
      "p/aaaaaaab", "p/aaaaaaac", "p/aaaaaaacz"};
  const NodeContent c =
      Internal(5, 1, keys.front(), "p0", keys, {100, 101, 102, 103, 104, 105});
  const std::vector<uint8_t> img = Image(c);
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 5).ok());
  RouteNode::Ptr r = RouteNode::Make(v);
  ASSERT_NE(r, nullptr);
  std::vector<std::string> probes = keys;
  for (const std::string& k : keys) {
    probes.push_back(k + std::string(1, '\0'));
    probes.push_back(k + "a");
    probes.push_back(k.substr(0, k.size() - 1));
  }
  for (const std::string& k : probes) {
    ASSERT_TRUE(PlacedAsReference(*r, keys, c.low.bytes, &c.high.bytes, k))
        << k;
  }
}

TEST(TreeRoute, KeysOutsideTheFencesPrefixGetNoRoute) {
  // A node the server never publishes: an entry below its fences' common
  // prefix "ab". The view's own search serves it.
  NodeContent c = Internal(5, 1, "ab", "abz", {"a", "abc"}, {9, 9});
  std::vector<uint8_t> img = Image(c);
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 5).ok());
  EXPECT_EQ(RouteNode::Make(v), nullptr);
  // A leaf has none either.
  c.level = 0;
  for (NodeEntry& e : c.entries) e.value = "v";
  img = Image(c);
  ASSERT_TRUE(v.Parse(img.data(), 5).ok());
  EXPECT_EQ(RouteNode::Make(v), nullptr);
}

TEST(TreeRoute, TheCacheKeepsARouteBesideEachInternalCopy) {
  NodeContent c = Internal(7, 1, "k10", "k20", {"k10", "k15"}, {21, 22});
  std::vector<uint8_t> img = Image(c);
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 7).ok());
  NodeCache cache;
  EXPECT_EQ(cache.Route(7), nullptr);
  cache.Put(7, v);
  const RouteNode* r = cache.Route(7);
  ASSERT_NE(r, nullptr);
  Target t;
  t.key = "k17";
  size_t i = 0;
  ASSERT_EQ(r->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(r->child(i), 22u);
  // A newer copy replaces the route too.
  c.entries[1].child = 23;
  img = Image(c, 4);
  ASSERT_TRUE(v.Parse(img.data(), 7).ok());
  cache.Put(7, v);
  r = cache.Route(7);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(r->child(i), 23u);
  cache.Evict(7);
  EXPECT_EQ(cache.Route(7), nullptr);
  cache.Put(7, v);
  cache.Clear();
  EXPECT_EQ(cache.Route(7), nullptr);
}

// An internal node `self` at `level` whose entries "k<i>" name children
// `children[i]`.
std::vector<uint8_t> InternalImage(uint32_t self, uint8_t level,
                                   const std::vector<uint32_t>& children) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < children.size(); ++i) {
    keys.push_back("k" + std::to_string(i));
  }
  return Image(Internal(self, level, "", nullptr, keys, children));
}

TEST(TreeRoute, AParentKnowsItsChildrensRoutesUntilOneIsFreed) {
  NodeCache cache;
  const std::vector<uint8_t> parent = InternalImage(7, 2, {8, 9});
  const std::vector<uint8_t> child8 = InternalImage(8, 1, {20, 21});
  const std::vector<uint8_t> child9 = InternalImage(9, 1, {22});
  // A newer copy of 9, of another size: its route is another block.
  const std::vector<uint8_t> child9b = InternalImage(9, 1, {22, 23, 24});
  NodeView v;
  ASSERT_TRUE(v.Parse(parent.data(), 7).ok());
  cache.Put(7, v);
  ASSERT_TRUE(v.Parse(child8.data(), 8).ok());
  cache.Put(8, v);
  const RouteNode* p = cache.Route(7);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(cache.ChildRoute(p, 0), cache.Route(8));
  EXPECT_EQ(cache.ChildRoute(p, 1), nullptr);  // 9 is not cached
  ASSERT_TRUE(v.Parse(child9.data(), 9).ok());
  cache.Put(9, v);  // a route added: found once asked again
  EXPECT_EQ(cache.ChildRoute(p, 1), cache.Route(9));
  EXPECT_EQ(cache.ChildRoute(p, 1)->count(), 1u);
  // Both known now. A newer copy of 9 frees the route the parent knew.
  ASSERT_NE(cache.ChildRoute(p, 0), nullptr);
  ASSERT_NE(cache.ChildRoute(p, 1), nullptr);
  ASSERT_TRUE(v.Parse(child9b.data(), 9).ok());
  cache.Put(9, v);
  const RouteNode* k = cache.ChildRoute(p, 1);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k, cache.Route(9));
  EXPECT_EQ(k->count(), 3u);
  // An evicted child is forgotten, and found again once cached.
  ASSERT_NE(cache.ChildRoute(p, 0), nullptr);
  cache.Evict(8);
  EXPECT_EQ(cache.ChildRoute(p, 0), nullptr);
  ASSERT_TRUE(v.Parse(child8.data(), 8).ok());
  cache.Put(8, v);
  EXPECT_EQ(cache.ChildRoute(p, 0), cache.Route(8));
  EXPECT_EQ(cache.ChildRoute(p, 1), cache.Route(9));
}

TEST(TreeRoute, AFullCacheDropsEveryRoute) {
  // Two nodes at most: the third clears the cache, routes included.
  NodeCache cache(2);
  NodeView v;
  const std::vector<uint8_t> a = InternalImage(3, 1, {10});
  const std::vector<uint8_t> b = InternalImage(4, 1, {11});
  const std::vector<uint8_t> c = InternalImage(5, 1, {12});
  ASSERT_TRUE(v.Parse(a.data(), 3).ok());
  cache.Put(3, v);
  ASSERT_TRUE(v.Parse(b.data(), 4).ok());
  cache.Put(4, v);
  ASSERT_NE(cache.Route(3), nullptr);
  ASSERT_TRUE(v.Parse(c.data(), 5).ok());
  cache.Put(5, v);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Route(3), nullptr);
  EXPECT_EQ(cache.Route(4), nullptr);
  ASSERT_NE(cache.Route(5), nullptr);
  size_t i = 0;
  Target t;
  t.key = "k0";
  ASSERT_EQ(cache.Route(5)->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(cache.Route(5)->child(i), 12u);
}

TEST(TreeRoute, CopiesGoIntoMemoryReservedAheadOrLeftByEvictedCopies) {
  NodeCache cache(4);
  cache.Reserve(3);
  EXPECT_EQ(cache.spare(), 3u);
  cache.Reserve(2);  // there is room already
  EXPECT_EQ(cache.spare(), 3u);
  NodeView v;
  const std::vector<uint8_t> a = InternalImage(3, 1, {10, 11, 12});
  const std::vector<uint8_t> b = InternalImage(4, 1, {13});
  ASSERT_TRUE(v.Parse(a.data(), 3).ok());
  cache.Put(3, v);
  EXPECT_EQ(cache.spare(), 2u);
  cache.Evict(3);
  EXPECT_EQ(cache.spare(), 3u);
  EXPECT_EQ(cache.Route(3), nullptr);
  // The memory that held node 3 (three entries) holds node 4 (one) as
  // node 4 alone.
  ASSERT_TRUE(v.Parse(b.data(), 4).ok());
  for (int i = 0; i < 3; ++i) cache.Put(4, v);  // replaced in place
  EXPECT_EQ(cache.spare(), 2u);
  ASSERT_NE(cache.Route(4), nullptr);
  EXPECT_EQ(cache.Route(4)->count(), 1u);
  Target t;
  t.key = "k0";
  size_t i = 0;
  ASSERT_EQ(cache.Route(4)->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(cache.Route(4)->child(i), 13u);
  // Cleared (and full, below): the copies' memory is kept for the next.
  cache.Clear();
  EXPECT_EQ(cache.spare(), 3u);
  EXPECT_EQ(cache.size(), 0u);
  for (uint32_t n = 5; n < 10; ++n) {
    const std::vector<uint8_t> img = InternalImage(n, 1, {n + 100});
    ASSERT_TRUE(v.Parse(img.data(), n).ok());
    cache.Put(n, v);  // the fifth finds the cache full and clears it
    ASSERT_NE(cache.Route(n), nullptr);
    t.key = "k0";
    ASSERT_EQ(cache.Route(n)->Locate(t, &i), RouteNode::Place::kIn);
    EXPECT_EQ(cache.Route(n)->child(i), n + 100);
  }
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.spare(), 3u);  // the four dropped, less node 9's
  // At most kMaxSpare are kept.
  cache.Reserve(NodeCache::kMaxSpare + 10);
  EXPECT_EQ(cache.spare(), NodeCache::kMaxSpare);
}

}  // namespace
}  // namespace remem::tree
