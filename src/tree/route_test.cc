// tree::RouteNode against plain string comparisons: for random internal
// nodes whose keys share prefixes, contain zero bytes and tie on the 8
// bytes a route compares, every probe is placed below, beyond or in the
// node, at the same child, as the fences and a plain search of the keys
// say. And the node cache keeps a route beside each internal copy.

#include "tree/route.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tree/search.h"

namespace remem::tree {
namespace {

struct Expected {
  RouteNode::Place place;
  size_t entry;  // for kIn
};

// What search.cc decides from the view: the fences, then the child.
Expected Reference(const std::vector<std::string>& keys, const std::string& low,
                   const std::string* high, const RouteTarget& t) {
  const std::string k(t.key);
  const size_t n = keys.size();
  if (t.below && t.unbounded) {
    if (high != nullptr) return {RouteNode::Place::kBeyond, 0};
    return {RouteNode::Place::kIn, n == 0 ? 0 : n - 1};
  }
  if (!t.below) {
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

TEST(TreeRoute, PlacesEveryProbeAsThePlainComparisons) {
  std::mt19937_64 rng(11);
  // Zero bytes and 0xff: padding ties and the extremes of a byte.
  const std::string alphabet("\0\1az\xff", 5);
  auto random_key = [&](const std::string& prefix, size_t max_extra) {
    std::string k = prefix;
    const size_t extra = rng() % (max_extra + 1);
    for (size_t i = 0; i < extra; ++i) k += alphabet[rng() % alphabet.size()];
    return k;
  };
  int routes = 0;
  for (int round = 0; round < 600; ++round) {
    // Keys sharing 0 to 30 bytes, then up to 12 more (ties on the 8 bytes
    // after the fences' common prefix are frequent).
    const std::string prefix = random_key("", round % 4 == 0 ? 0 : 30);
    std::set<std::string> keys;
    const size_t n = 1 + rng() % 30;
    while (keys.size() < n) {
      std::string k = random_key(prefix, 12);
      if (!k.empty() && k.size() <= kMaxInlineKey) keys.insert(k);
    }
    const std::vector<std::string> sorted(keys.begin(), keys.end());
    // The low fence: the first key, or empty (the leftmost node).
    const std::string low = round % 5 == 0 ? std::string() : sorted.front();
    // The high fence: none (the rightmost node), a key just above the last
    // (sharing much of it), or one well above.
    std::string high;
    bool has_high = true;
    switch (round % 3) {
      case 0:
        has_high = false;
        break;
      case 1:
        high = sorted.back() + std::string(1, '\0');
        break;
      default:
        high = sorted.back();
        while (!high.empty() && uint8_t(high.back()) == 0xff) high.pop_back();
        if (high.empty()) {
          has_high = false;
        } else {
          high.back() = char(uint8_t(high.back()) + 1);
        }
    }
    if (has_high && high.size() > kMaxInlineKey) has_high = false;
    NodeContent c;
    c.self = 5;
    c.level = 1 + round % 3;
    c.low.bytes = low;
    c.has_high = has_high;
    if (has_high) c.high.bytes = high;
    for (size_t i = 0; i < sorted.size(); ++i) {
      NodeEntry e;
      e.key.bytes = sorted[i];
      e.child = uint32_t(100 + i);
      c.entries.push_back(e);
    }
    if (!c.Fits()) continue;
    std::vector<uint8_t> img(kNodeBytes);
    EncodeNode(c, 2, img.data());
    NodeView v;
    ASSERT_TRUE(v.Parse(img.data(), 5).ok());
    RouteNode::Ptr r = RouteNode::Make(v);
    ASSERT_NE(r, nullptr) << "round " << round;
    ++routes;
    EXPECT_EQ(r->level(), c.level);
    EXPECT_EQ(r->count(), sorted.size());
    for (size_t i = 0; i < sorted.size(); ++i) {
      ASSERT_EQ(r->child(i), 100 + i);
    }
    const std::string* high_ptr = has_high ? &high : nullptr;
    for (int probe = 0; probe < 120; ++probe) {
      std::string k;
      switch (probe % 5) {
        case 0:  // a stored key or a fence
          k = probe % 3 == 0               ? low
              : probe % 3 == 1 && has_high ? high
                                           : sorted[rng() % sorted.size()];
          break;
        case 1:  // a stored key, cut or extended by zero bytes
          k = sorted[rng() % sorted.size()];
          k = rng() % 2 ? k.substr(0, rng() % (k.size() + 1))
                        : k + std::string(1 + rng() % 9, '\0');
          break;
        case 2:  // the prefix, cut, and a tail
          k = random_key(prefix.substr(0, rng() % (prefix.size() + 1)), 12);
          break;
        case 3:  // beside the prefix
          k = prefix.empty() ? random_key("", 4) : prefix;
          if (!k.empty())
            k.back() = char(uint8_t(k.back()) + (rng() % 2 ? 1 : -1));
          break;
        default:  // anything
          k = random_key("", 40);
      }
      for (int mode = 0; mode < 3; ++mode) {
        RouteTarget t;
        t.below = mode > 0;
        t.unbounded = mode == 2;
        t.key = k;
        const Expected want = Reference(sorted, low, high_ptr, t);
        size_t got = size_t(-1);
        const RouteNode::Place place = r->Locate(t, &got);
        ASSERT_EQ(int(place), int(want.place))
            << "round " << round << " probe " << probe << " mode " << mode;
        if (place == RouteNode::Place::kIn) {
          ASSERT_EQ(got, want.entry)
              << "round " << round << " probe " << probe << " mode " << mode;
        }
      }
    }
  }
  EXPECT_GT(routes, 400);
}

TEST(TreeRoute, KeysThatTieOnTheComparedWordAreComparedWhole) {
  // Fences "p/" and "p0": the common prefix is "p"; every key continues
  // with the same 8 bytes ("/aaaaaaa") and differs after them, or by a
  // zero byte (which the word's padding cannot tell from an end).
  const std::vector<std::string> keys = {
      "p/",         "p/aaaaaaa",  std::string("p/aaaaaaa\0", 10),
      "p/aaaaaaab", "p/aaaaaaac", "p/aaaaaaacz"};
  NodeContent c;
  c.self = 5;
  c.level = 1;
  c.low.bytes = keys.front();
  c.has_high = true;
  c.high.bytes = "p0";
  for (size_t i = 0; i < keys.size(); ++i) {
    NodeEntry e;
    e.key.bytes = keys[i];
    e.child = uint32_t(100 + i);
    c.entries.push_back(e);
  }
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 2, img.data());
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
    for (int mode = 0; mode < 2; ++mode) {
      RouteTarget t;
      t.below = mode == 1;
      t.key = k;
      const Expected want = Reference(keys, c.low.bytes, &c.high.bytes, t);
      size_t got = size_t(-1);
      const RouteNode::Place place = r->Locate(t, &got);
      ASSERT_EQ(int(place), int(want.place)) << k << " mode " << mode;
      if (place == RouteNode::Place::kIn) {
        ASSERT_EQ(got, want.entry) << k << " mode " << mode;
      }
    }
  }
}

TEST(TreeRoute, KeysOutsideTheFencesPrefixGetNoRoute) {
  // A node the server never publishes: an entry below its fences' common
  // prefix "ab". The view's own search serves it.
  NodeContent c;
  c.self = 5;
  c.level = 1;
  c.low.bytes = "ab";
  c.has_high = true;
  c.high.bytes = "abz";
  for (const char* k : {"a", "abc"}) {
    NodeEntry e;
    e.key.bytes = k;
    e.child = 9;
    c.entries.push_back(e);
  }
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 2, img.data());
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 5).ok());
  EXPECT_EQ(RouteNode::Make(v), nullptr);
  // A leaf has none either.
  c.level = 0;
  for (NodeEntry& e : c.entries) e.value = "v";
  EncodeNode(c, 2, img.data());
  ASSERT_TRUE(v.Parse(img.data(), 5).ok());
  EXPECT_EQ(RouteNode::Make(v), nullptr);
}

TEST(TreeRoute, TheCacheKeepsARouteBesideEachInternalCopy) {
  NodeContent c;
  c.self = 7;
  c.level = 1;
  c.low.bytes = "k10";
  c.has_high = true;
  c.high.bytes = "k20";
  for (const char* k : {"k10", "k15"}) {
    NodeEntry e;
    e.key.bytes = k;
    e.child = k[2] == '1' && k[3] == '0' ? 21 : 22;
    c.entries.push_back(e);
  }
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 2, img.data());
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 7).ok());
  NodeCache cache;
  EXPECT_EQ(cache.Route(7), nullptr);
  cache.Put(7, v);
  const RouteNode* r = cache.Route(7);
  ASSERT_NE(r, nullptr);
  RouteTarget t;
  t.key = "k17";
  size_t i = 0;
  ASSERT_EQ(r->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(r->child(i), 22u);
  // A newer copy replaces the route too.
  c.entries[1].child = 23;
  EncodeNode(c, 4, img.data());
  ASSERT_TRUE(v.Parse(img.data(), 7).ok());
  cache.Put(7, v);
  r = cache.Route(7);
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(r->child(i), 23u);
  cache.Evict(7);
  EXPECT_EQ(cache.Route(7), nullptr);
  EXPECT_EQ(cache.Get(7), nullptr);
  cache.Put(7, v);
  cache.Clear();
  EXPECT_EQ(cache.Route(7), nullptr);
}

// An internal node `self` at `level` whose entries "k<i>" name children
// `children[i]`.
std::vector<uint8_t> InternalImage(uint32_t self, uint8_t level,
                                   const std::vector<uint32_t>& children) {
  NodeContent c;
  c.self = self;
  c.level = level;
  for (size_t i = 0; i < children.size(); ++i) {
    NodeEntry e;
    e.key.bytes = "k" + std::to_string(i);
    e.child = children[i];
    c.entries.push_back(e);
  }
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 2, img.data());
  return img;
}

TEST(TreeRoute, AParentKnowsItsChildrensRoutesUntilOneIsFreed) {
  NodeCache cache;
  const std::vector<uint8_t> parent = InternalImage(7, 2, {8, 9});
  const std::vector<uint8_t> child8 = InternalImage(8, 1, {20, 21});
  const std::vector<uint8_t> child9 = InternalImage(9, 1, {22});
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
  cache.Put(9, v);
  EXPECT_EQ(cache.ChildRoute(p, 1), cache.Route(9));
  // Freed and replaced: the parent's memory of it is forgotten.
  cache.Evict(8);
  EXPECT_EQ(cache.ChildRoute(p, 0), nullptr);
  ASSERT_TRUE(v.Parse(child8.data(), 8).ok());
  cache.Put(8, v);
  EXPECT_EQ(cache.ChildRoute(p, 0), cache.Route(8));
  ASSERT_TRUE(v.Parse(child9.data(), 9).ok());
  cache.Put(9, v);  // a newer copy: a new route
  EXPECT_EQ(cache.ChildRoute(p, 1), cache.Route(9));
  EXPECT_EQ(cache.ChildRoute(p, 0), cache.Route(8));
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
  RouteTarget t;
  t.key = "k0";
  ASSERT_EQ(cache.Route(5)->Locate(t, &i), RouteNode::Place::kIn);
  EXPECT_EQ(cache.Route(5)->child(i), 12u);
}

}  // namespace
}  // namespace remem::tree
