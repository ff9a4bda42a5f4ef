// The ordered store's node layout and B-link tree (src/tree), in one
// process: encoding and verification of nodes (a torn copy is refused),
// the tree against a model (splits, scans in both directions, pages,
// prefixes, conditional writes, bad input), and a reader thread searching
// and scanning with its own verified copies and a cache of upper levels
// while a writer inserts from an empty tree.

#include "tree/tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "hash/layout.h"
#include "hash/slab.h"
#include "testing/keys.h"
#include "testing/scale.h"
#include "testing/values.h"
#include "tree/durable.h"
#include "tree/node.h"
#include "tree/search.h"

namespace remem::tree {
namespace {

std::string Key(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "key%08llu",
                static_cast<unsigned long long>(i));
  return buf;
}

struct Memory {
  explicit Memory(uint64_t bytes)
      : bytes(bytes),
        base(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))) {
    std::memset(base, 0, bytes);
  }
  ~Memory() { std::free(base); }
  uint64_t bytes;
  uint8_t* base;
};

// Reads the tree as a client does: a private copy of each node, verified,
// retried when torn. A copy has no byte order (BRIEF.md): every other copy
// goes from the last word to the first, so a copy can end with the new
// version after it took old words, which only the checksum exposes. Words
// are read atomically (no C++ data race for ThreadSanitizer). Every other
// leaf a lookup fetches keeps its entries' long keys for the lookup to
// resolve (as the client on shared memory), the others resolve them all.
class CopySource : public NodeSource {
 public:
  explicit CopySource(const uint8_t* base) : base_(base) {}
  Result<uint32_t> Root() override {
    TreeRoot r;
    for (int i = 0; i < 1000; ++i) {
      Copy(&r, base_, sizeof(r));
      if (ParseRoot(r).ok()) return r.root;
      ++torn;
      std::this_thread::yield();  // let the writer finish (few cores)
    }
    return Status::Busy("root");
  }
  Status Fetch(uint32_t index, uint8_t* scratch, NodeView* view) override {
    return FetchNode(index, scratch, view, false);
  }
  Status FetchForLookup(uint32_t index, uint8_t* scratch,
                        NodeView* view) override {
    return FetchNode(index, scratch, view, true);
  }
  // Reading ahead as a source over the network does (NodeSource::Prefetch)
  // when `n` > 0: the node is copied when the scan asks for it, and the
  // copy used by the next Fetch of it, however much later (the stalest a
  // copy read ahead can be: the read may complete at once).
  void set_read_ahead(size_t n) { read_ahead_ = n; }
  size_t read_ahead() const override { return read_ahead_; }
  bool ReadAhead(uint32_t index) const override {
    return ahead_.count(index) > 0;
  }
  void Prefetch(uint32_t index) override {
    if (read_ahead_ == 0 || index == kNoNode) return;
    if (auto it = ahead_.find(index); it != ahead_.end()) {
      ++it->second.takers;
      return;
    }
    if (ahead_.size() >= read_ahead_) return;
    Ahead& a = ahead_[index];
    a.copy.resize(kNodeBytes);
    Copy(a.copy.data(), base_ + NodeOffset(index), kNodeBytes);
    ++read_ahead_copies;
  }
  void DropReadAhead() override {
    read_ahead_unused += ahead_.size();
    ahead_.clear();
  }
  Status FetchNode(uint32_t index, uint8_t* scratch, NodeView* view,
                   bool lazy) {
    if (auto it = ahead_.find(index); it != ahead_.end()) {
      std::memcpy(scratch, it->second.copy.data(), kNodeBytes);
      if (--it->second.takers == 0) ahead_.erase(it);
      if (view->Parse(scratch, index).ok() &&
          (view->long_keys() == 0 || view->ResolveKeys(read_key_).ok())) {
        ++read_ahead_used;
        return Status::OK();
      }
      ++torn;  // torn, or a long key freed since: copied again below
    } else {
      ++fresh_fetches;
    }
    for (int i = 0; i < 1000; ++i) {
      // As the client on shared memory: the header's line, then the bytes
      // in use its copy of the header names (rounded up to words), over
      // junk, since nothing after them is the node's.
      std::memset(scratch, 0xA5 ^ i, kNodeBytes);
      const uint8_t* node = base_ + NodeOffset(index);
      Copy(scratch, node, 64);
      NodeHeader h;
      std::memcpy(&h, scratch, sizeof(h));
      const size_t end = (NodeBytesInUse(h.used) + 7) / 8 * 8;
      if (end > 64) Copy(scratch + 64, node + 64, end - 64);
      if (view->Parse(scratch, index).ok()) {
        if (view->long_keys() == 0) return Status::OK();
        // Long keys from their key extents, verified; one freed since
        // the copy means the node changed: copy it again. A lookup's
        // leaves alternate between lazy and whole.
        const bool lazy_leaf = lazy && view->leaf() && (lazy_ = !lazy_);
        Status st = lazy_leaf ? view->ResolveFences(&read_key_)
                              : view->ResolveKeys(read_key_);
        if (st.ok()) return st;
      }
      ++torn;
      std::this_thread::yield();  // let the writer finish (few cores)
    }
    return Status::Busy("node");
  }
  Status ReadExtent(std::string_view key, uint64_t version, const ValueRef& ref,
                    std::string* value) override {
    std::vector<uint8_t> copy(ExtentReadBytes(key.size(), ref));
    Copy(copy.data(), base_ + ref.offset, copy.size());
    Status st = VerifyExtent(copy.data(), key, version, ref, value);
    if (!st.ok()) ++stale_extents;
    return st;
  }
  uint64_t torn = 0;
  uint64_t read_ahead_copies = 0, read_ahead_used = 0, read_ahead_unused = 0;
  uint64_t fresh_fetches = 0;  // node copies not read ahead
  uint64_t stale_extents = 0;
  uint64_t stale_keys = 0;
  uint64_t key_reads = 0;

 private:
  const NodeView::KeyReader read_key_ = [this](const KeyRef& r, char* dst) {
    ++key_reads;
    std::vector<uint8_t> copy(KeyExtentReadBytes(r));
    Copy(copy.data(), base_ + r.offset, copy.size());
    Status k = VerifyKeyExtent(copy.data(), r, dst);
    if (!k.ok()) ++stale_keys;
    return k;
  };
  bool lazy_ = false;
  void Copy(void* dst, const uint8_t* src, size_t n) {
    if (++copies_ % 2 == 0) return hash::LoadWords(dst, src, n);
    auto* d = static_cast<uint8_t*>(dst);
    auto* w = const_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(src));
    for (size_t i = n / 8; i-- > 0;) {
      const uint64_t v =
          std::atomic_ref<uint64_t>(w[i]).load(std::memory_order_acquire);
      std::memcpy(d + 8 * i, &v, 8);
    }
  }
  const uint8_t* base_;
  uint64_t copies_ = 0;
  size_t read_ahead_ = 0;
  struct Ahead {
    std::vector<uint8_t> copy;
    int takers = 1;  // Fetches it serves yet: one per Prefetch of it
  };
  std::map<uint32_t, Ahead> ahead_;  // read ahead, by node
};

NodeContent SampleLeaf(uint32_t self, int n, char fill) {
  NodeContent c;
  c.self = self;
  c.low.bytes = "a";
  c.has_high = true;
  c.high.bytes = "z";
  c.right = 7;
  for (int i = 0; i < n; ++i) {
    NodeEntry e;
    char key[16];
    std::snprintf(key, sizeof(key), "b%02d", i);  // in key order
    e.key.bytes = key;
    e.value = std::string(20, fill);
    e.version = uint64_t(i + 1);
    c.entries.push_back(e);
  }
  return c;
}

TEST(TreeNode, EncodesAndParses) {
  NodeContent c = SampleLeaf(3, 10, 'x');
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 4, img.data());
  NodeView v;
  ASSERT_TRUE(v.Parse(img.data(), 3).ok());
  EXPECT_EQ(v.count(), 10u);
  EXPECT_EQ(v.low(), "a");
  EXPECT_EQ(v.high(), "z");
  EXPECT_EQ(v.right(), 7u);
  EXPECT_EQ(v.value(2), std::string(20, 'x'));
  EXPECT_EQ(v.entry_version(2), 3u);
  EXPECT_EQ(v.LowerBound("b01"), 1u);
  NodeContent d = Decode(v);
  EXPECT_EQ(d.entries.size(), 10u);
  EXPECT_EQ(d.high.bytes, "z");
  // Another index, an odd version, a flipped byte: refused.
  EXPECT_FALSE(v.Parse(img.data(), 4).ok());
  std::vector<uint8_t> odd(kNodeBytes);
  EncodeNode(c, 5, odd.data());
  EXPECT_FALSE(v.Parse(odd.data(), 3).ok());
  // (The last byte in use: what follows is not the node's, below.)
  NodeHeader h;
  std::memcpy(&h, img.data(), sizeof(h));
  const size_t last = sizeof(NodeHeader) + h.used - 1;
  ASSERT_GT(last, 300u);
  for (size_t at : {size_t{9}, size_t{60}, size_t{300}, last}) {
    std::vector<uint8_t> bad = img;
    bad[at] ^= 1;
    EXPECT_FALSE(v.Parse(bad.data(), 3).ok()) << at;
  }
}

TEST(TreeNode, TheChecksumCoversTheBytesInUse) {
  // A reader copies the header and the bytes in use, no more (layout
  // version 4): what lies after them is not the node's, and a change
  // within them is refused.
  NodeContent c = SampleLeaf(3, 10, 'x');
  std::vector<uint8_t> img(kNodeBytes);
  EncodeNode(c, 4, img.data());
  NodeHeader h;
  std::memcpy(&h, img.data(), sizeof(h));
  const size_t end = sizeof(NodeHeader) + h.used;
  ASSERT_LT(end, kNodeBytes);
  std::vector<uint8_t> tail = img;
  for (size_t i = end; i < kNodeBytes; ++i) tail[i] = uint8_t(i * 7 + 1);
  NodeView v;
  ASSERT_TRUE(v.Parse(tail.data(), 3).ok());
  const NodeContent d = Decode(v);
  EXPECT_EQ(d.low.bytes, c.low.bytes);
  EXPECT_EQ(d.high.bytes, c.high.bytes);
  EXPECT_EQ(d.right, c.right);
  ASSERT_EQ(d.entries.size(), c.entries.size());
  for (size_t i = 0; i < c.entries.size(); ++i) {
    EXPECT_EQ(d.entries[i].key.bytes, c.entries[i].key.bytes);
    EXPECT_EQ(d.entries[i].value, c.entries[i].value);
    EXPECT_EQ(d.entries[i].version, c.entries[i].version);
  }
  for (size_t at : {size_t{8}, size_t{20}, sizeof(NodeHeader), end - 1}) {
    std::vector<uint8_t> changed = img;
    changed[at] ^= 0x10;
    EXPECT_EQ(v.Parse(changed.data(), 3).code(), StatusCode::kCorruption)
        << "byte " << at;
  }
}

// LowerBound agrees with std::lower_bound over the node's keys for any
// probe: keys that share long prefixes, differ in length, hold zero bytes;
// probes that are stored keys, cut or extended ones, and anything else.
TEST(TreeNode, LowerBoundAgreesWithAPlainSearch) {
  std::mt19937_64 rng(7);
  auto random_key = [&](const std::string& prefix, size_t max_extra) {
    return testing::EdgeByteKey(rng, prefix, max_extra);
  };
  for (int round = 0; round < 400; ++round) {
    // Keys with a shared prefix of 0 to 20 bytes, then up to 14 more.
    const std::string prefix = random_key("", round % 3 == 0 ? 0 : 20);
    std::set<std::string> keys;
    const size_t n = 1 + rng() % 15;
    while (keys.size() < n) {
      std::string k = random_key(prefix, 14);
      if (!k.empty() && k.size() <= kMaxKey) keys.insert(k);
    }
    NodeContent c;
    c.self = 3;
    c.level = round % 2;  // leaves and internal nodes
    for (const std::string& k : keys) {
      NodeEntry e;
      e.key.bytes = k;
      e.value = c.level == 0 ? "v" : "";
      e.child = 9;
      c.entries.push_back(e);
    }
    ASSERT_TRUE(c.Fits());
    std::vector<uint8_t> img(kNodeBytes);
    EncodeNode(c, 2, img.data());
    NodeView v;
    ASSERT_TRUE(v.Parse(img.data(), 3).ok());
    const std::vector<std::string> sorted(keys.begin(), keys.end());
    for (int probe = 0; probe < 60; ++probe) {
      std::string k;
      switch (probe % 4) {
        case 0:  // a stored key
          k = sorted[rng() % sorted.size()];
          break;
        case 1:  // a stored key, cut or extended
          k = sorted[rng() % sorted.size()];
          k = rng() % 2 ? k.substr(0, rng() % (k.size() + 1))
                        : k + std::string(1 + rng() % 9, '\0');
          break;
        case 2:  // near the prefix
          k = random_key(prefix.substr(0, rng() % (prefix.size() + 1)), 10);
          break;
        default:  // anything
          k = random_key("", 24);
      }
      const size_t want = size_t(
          std::lower_bound(sorted.begin(), sorted.end(), k) - sorted.begin());
      ASSERT_EQ(v.LowerBound(k), want)
          << "round " << round << " probe " << probe;
    }
  }
}

// The bytes a node's checksum covers: its header and its bytes in use.
std::vector<uint8_t> InUse(const std::vector<uint8_t>& image) {
  NodeHeader h;
  std::memcpy(&h, image.data(), sizeof(h));
  const size_t end = NodeBytesInUse(h.used);
  return std::vector<uint8_t>(image.begin(), image.begin() + end);
}

TEST(TreeNode, ATornCopyIsRefused) {
  // Two publishes of one node; a copy that took some words from each, in
  // any order, never verifies, unless what it holds in use is one of them
  // whole. Pairs of one size, and of two (a publish that appended an
  // entry: the shorter one's bytes in use are a prefix of the longer's
  // but for the header), mixed word by word and header against body (the
  // client on shared memory copies the header's line first).
  const std::vector<std::pair<NodeContent, NodeContent>> pairs = {
      {SampleLeaf(3, 12, 'a'), SampleLeaf(3, 12, 'b')},
      {SampleLeaf(3, 12, 'a'), SampleLeaf(3, 13, 'a')},
      {SampleLeaf(3, 13, 'a'), SampleLeaf(3, 9, 'b')},
  };
  NodeView v;
  std::mt19937_64 rng(5);
  int refused = 0;
  for (const auto& [a, b] : pairs) {
    std::vector<uint8_t> ia(kNodeBytes), ib(kNodeBytes);
    EncodeNode(a, 6, ia.data());
    EncodeNode(b, 8, ib.data());
    // Each publish alone verifies: only the mixing may fail.
    ASSERT_TRUE(v.Parse(ia.data(), 3).ok());
    ASSERT_TRUE(v.Parse(ib.data(), 3).ok());
    const std::vector<uint8_t> ua = InUse(ia), ub = InUse(ib);
    for (int trial = 0; trial < 2000; ++trial) {
      std::vector<uint8_t> mix = ia;
      if (trial % 4 == 0) {
        // The header's line from one, the rest from the other.
        const bool header_b = trial % 8 == 0;
        mix = header_b ? ia : ib;
        std::memcpy(mix.data(), (header_b ? ib : ia).data(), 64);
      } else {
        for (size_t w = 0; w < kNodeBytes / 8; ++w) {
          if (rng() % 2) std::memcpy(&mix[w * 8], &ib[w * 8], 8);
        }
      }
      if (v.Parse(mix.data(), 3).ok()) {
        const std::vector<uint8_t> um = InUse(mix);
        EXPECT_TRUE(um == ua || um == ub) << "trial " << trial;
      } else {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 5000);
  // Garbage never parses, and never reads outside its bytes in use (the
  // image ends there: ASan checks the bounds).
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> junk(kNodeBytes);
    for (auto& byte : junk) byte = uint8_t(rng());
    NodeHeader h;
    std::memcpy(&h, junk.data(), sizeof(h));
    h.magic = kNodeMagic;
    h.version = 2;
    // Mostly within the node, so that the structure is parsed; a tenth
    // beyond it (refused before the checksum is computed over it).
    h.used = uint16_t(trial % 10 == 0 ? kNodeArea + 1 + rng() % 100
                                      : rng() % (kNodeArea + 1));
    std::memcpy(junk.data(), &h, sizeof(h));
    const uint64_t sum =
        NodeChecksum(junk.data(), uint16_t(NodeBytesInUse(h.used) - sizeof(h)));
    std::memcpy(junk.data(), &sum, 8);
    const std::vector<uint8_t> exact = InUse(junk);
    const Status st = v.Parse(exact.data(), kNoNode);
    if (h.used > kNodeArea) {
      EXPECT_EQ(st.code(), StatusCode::kCorruption);
    }
  }
}

class TreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = BLinkTree::Create(mem_.base, mem_.bytes);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tree_ = std::move(*t);
  }
  // Every key of [start, end) in the model, in order (or reversed).
  std::vector<std::string> ModelRange(const std::string& start,
                                      const std::string& end, bool desc) {
    std::vector<std::string> out;
    for (auto it = model_.lower_bound(start);
         it != model_.end() && (end.empty() || it->first < end); ++it) {
      out.push_back(it->first);
    }
    if (desc) std::reverse(out.begin(), out.end());
    return out;
  }
  // Pages through [start, end) with `limit`, one-sided (own source) or
  // from the owner.
  std::vector<std::string> PageThrough(NodeSource* src, NodeCache* cache,
                                       const std::string& start,
                                       const std::string& end, uint32_t limit,
                                       bool desc) {
    std::vector<std::string> out;
    std::string s = start, e = end;
    for (int pages = 0; pages < 100000; ++pages) {
      ScanPage page;
      SearchStats stats;
      Status st = ScanRange(src, cache, s, e, limit, desc, &page, &stats);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) break;
      EXPECT_LE(page.items.size(), limit);
      for (auto& it : page.items) {
        EXPECT_EQ(it.value, model_[it.key]) << it.key;
        out.push_back(it.key);
      }
      if (!page.more) break;
      (desc ? e : s) = page.resume;
    }
    return out;
  }
  Memory mem_{40 << 20};  // room for a value of kMaxValue
  std::unique_ptr<BLinkTree> tree_;
  std::map<std::string, std::string> model_;
};

TEST_F(TreeTest, AgreesWithAModelThroughSplitsScansAndDeletes) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 6000; ++i) {
    const std::string k = Key(rng() % 4000);
    if (rng() % 5 == 0) {
      Status st = tree_->Delete(k);
      EXPECT_EQ(st.ok(), model_.erase(k) == 1);
    } else {
      // Inline values, and a quarter out of line.
      const size_t len = rng() % 4 == 0 ? kMaxInlineValue + 1 + rng() % 4000
                                        : rng() % (kMaxInlineValue + 1);
      std::string v(len, char('a' + i % 26));
      ASSERT_TRUE(tree_->Put(k, v).ok());
      model_[k] = v;
    }
  }
  EXPECT_EQ(tree_->size(), model_.size());
  EXPECT_GE(tree_->height(), 3) << "the test must cover internal splits";
  EXPECT_GT(tree_->splits(), 100u);
  for (auto& [k, v] : model_) {
    std::string got;
    uint64_t version = 0;
    ASSERT_TRUE(tree_->Get(k, &got, &version).ok()) << k;
    EXPECT_EQ(got, v);
  }
  std::string got;
  uint64_t version;
  EXPECT_EQ(tree_->Get("nokey", &got, &version).code(), StatusCode::kNotFound);

  CopySource copies(mem_.base);
  NodeCache cache;
  for (bool desc : {false, true}) {
    for (uint32_t limit : {1u, 7u, 100u, 100000u}) {
      EXPECT_EQ(PageThrough(&copies, &cache, "", "", limit, desc),
                ModelRange("", "", desc))
          << limit << " " << desc;
    }
    for (int r = 0; r < 50; ++r) {
      std::string a = Key(rng() % 4200), b = Key(rng() % 4200);
      if (b < a) std::swap(a, b);
      EXPECT_EQ(PageThrough(&copies, &cache, a, b, 13, desc),
                ModelRange(a, b, desc));
      EXPECT_EQ(PageThrough(&copies, nullptr, a, b, 5, desc),
                ModelRange(a, b, desc));
    }
  }
  // A prefix: "key0000123" covers key00001230 .. key00001239.
  const std::string prefix = "key0000123";
  EXPECT_EQ(PageThrough(&copies, &cache, prefix, PrefixEnd(prefix), 3, false),
            ModelRange(prefix, PrefixEnd(prefix), false));
  EXPECT_EQ(copies.torn, 0u);
  EXPECT_GT(cache.hits, 0u);
}

// Every write is stamped into the leaves that show it (layout.h,
// "Stamps"): a lookup or a scan after a put, a delete (merges too) or a
// restore at a higher version reports, as its leaves' highest stamp, at
// least that write's version, and never more than the tree's last one. A
// one-sided reader of a replicated range compares it with the serving
// mark's replicated half.
TEST_F(TreeTest, LeavesAreStampedWithTheVersionsOfTheWritesTheyShow) {
  CopySource copies(mem_.base);
  std::mt19937_64 rng(5);
  uint64_t checked = 0;
  // Random writes, then most keys deleted in order (merges).
  for (int i = 0; i < 5500; ++i) {
    const std::string k = i < 4000 ? Key(rng() % 1500) : Key(i - 4000);
    uint64_t wrote = 0;
    if (i >= 4000 || rng() % 3 == 0) {
      if (!tree_->Delete(k).ok()) continue;
      wrote = tree_->last_version();
    } else if (rng() % 50 == 0) {
      wrote = tree_->last_version() + 1000;
      ASSERT_TRUE(tree_->Restore(k, "restored", wrote).ok());
    } else {
      auto v = tree_->Put(k, "v" + std::to_string(i));
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      wrote = *v;
    }
    std::string value;
    uint64_t version = 0;
    SearchStats stats;
    const Status st = Lookup(&copies, nullptr, k, &value, &version, &stats);
    ASSERT_TRUE(st.ok() || st.code() == StatusCode::kNotFound) << st.ToString();
    EXPECT_GE(stats.max_stamp, wrote) << k;
    EXPECT_LE(stats.max_stamp, tree_->last_version()) << k;
    ++checked;
  }
  EXPECT_GT(tree_->merges(), 0u) << "the test must cover merges";
  EXPECT_GT(checked, 3500u);
  // The whole tree: its newest write is in it.
  ScanPage page;
  SearchStats stats;
  ASSERT_TRUE(
      ScanRange(&copies, nullptr, "", "", 100000, false, &page, &stats).ok());
  EXPECT_EQ(stats.max_stamp, tree_->last_version());
}

// One page reused for scans of varying lengths (YCSB-E's 1 to 100) keeps
// its items' storage: a shorter page's leftover items wait in `spare`, and
// a longer page takes them back instead of allocating two strings an item.
TEST_F(TreeTest, APageReusedForScansOfAnyLengthKeepsItsItemsStorage) {
  for (int i = 0; i < 300; ++i) {
    const std::string k = Key(uint64_t(i));
    const std::string v = "value-of-" + k + "-long-enough-for-the-heap";
    ASSERT_TRUE(tree_->Put(k, v).ok());
    model_[k] = v;
  }
  CopySource copies(mem_.base);
  NodeCache cache;
  ScanPage page;
  SearchStats stats;
  std::set<const char*> storage;  // the values' buffers after the first scan
  for (uint32_t limit : {100u, 10u, 1u, 100u, 60u, 37u, 100u}) {
    ASSERT_TRUE(
        ScanRange(&copies, &cache, "", "", limit, false, &page, &stats).ok());
    ASSERT_EQ(page.items.size(), limit);
    EXPECT_TRUE(page.more);
    auto m = model_.begin();
    for (const ScanItem& it : page.items) {
      EXPECT_EQ(it.key, m->first);
      EXPECT_EQ(it.value, m->second);
      ++m;
    }
    EXPECT_EQ(page.items.size() + page.spare.size(), 100u) << limit;
    for (const auto* v : {&page.items, &page.spare}) {
      for (const ScanItem& it : *v) {
        if (limit == 100 && storage.size() < 100) {
          storage.insert(it.value.data());
        } else {
          EXPECT_EQ(storage.count(it.value.data()), 1u)
              << "a value was allocated anew, scanning " << limit;
        }
      }
    }
  }
  ASSERT_EQ(storage.size(), 100u);
  // An error's page is empty and keeps the storage too.
  EXPECT_EQ(
      ScanRange(&copies, &cache, "b", "a", 5, false, &page, &stats).code(),
      StatusCode::kInvalidArgument);
  EXPECT_TRUE(page.items.empty());
  EXPECT_FALSE(page.more);
  EXPECT_EQ(page.spare.size(), 100u);
}

// Over a source that reads ahead, a scan from a warmed cache reads the
// leaves it takes in runs planned from their parents, across parents and
// in either direction: a leaf is fetched on its own only as the last one an
// ascending page expects to need (one round trip either way, and no leaf
// read for nothing). A bounded scan reads nothing past its end, and the
// pages agree with the model.
TEST_F(TreeTest, ScansReadTheirLeavesAheadFromTheirParents) {
  for (int i = 0; i < 6000; ++i) {
    const std::string k = Key(uint64_t(i) * 7919 % 6000);
    ASSERT_TRUE(tree_->Put(k, "v" + k).ok());
    model_[k] = "v" + k;
  }
  ASSERT_GE(tree_->height(), 3) << "the test needs scans across parents";
  CopySource copies(mem_.base);
  copies.set_read_ahead(16);
  std::vector<uint8_t> scratch(kNodeBytes);
  NodeCache cache;
  ASSERT_TRUE(WarmCache(&copies, &cache, scratch.data()).ok());
  const uint64_t warm_fetches = copies.fresh_fetches;
  // The whole tree in pages of 100 (60 pages), up and down.
  auto up = PageThrough(&copies, &cache, "", "", 100, /*desc=*/false);
  EXPECT_EQ(up, ModelRange("", "", false));
  EXPECT_LE(copies.fresh_fetches, warm_fetches + 60);
  const uint64_t after_up = copies.fresh_fetches;
  auto down = PageThrough(&copies, &cache, "", "", 100, /*desc=*/true);
  EXPECT_EQ(down, ModelRange("", "", true));
  EXPECT_EQ(copies.fresh_fetches, after_up);
  // Nearly every leaf, each way, came from a read ahead.
  uint64_t leaves = 0;
  {
    CopySource walk(mem_.base);
    NodeView v;
    auto root = walk.Root();
    ASSERT_TRUE(root.ok());
    uint32_t index = *root;
    ASSERT_TRUE(walk.Fetch(index, scratch.data(), &v).ok());
    while (!v.leaf()) {
      index = v.child(0);
      ASSERT_TRUE(walk.Fetch(index, scratch.data(), &v).ok());
    }
    for (;;) {
      ++leaves;
      if (v.right() == kNoNode) break;
      ASSERT_TRUE(walk.Fetch(v.right(), scratch.data(), &v).ok());
    }
  }
  EXPECT_GT(copies.read_ahead_used, 2 * leaves * 9 / 10) << leaves;
  // A bounded range with a limit it does not reach: its leaves exactly.
  const uint64_t unused = copies.read_ahead_unused;
  for (bool desc : {false, true}) {
    auto got = PageThrough(&copies, &cache, Key(1000), Key(1400), 5000, desc);
    EXPECT_EQ(got, ModelRange(Key(1000), Key(1400), desc)) << desc;
    EXPECT_EQ(copies.read_ahead_unused, unused) << desc;
  }
  // Short scans read ahead about as many leaves as they take: the entries
  // per leaf are learnt.
  const uint64_t used_before = copies.read_ahead_used;
  const uint64_t unused_before = copies.read_ahead_unused;
  const uint64_t fresh_before = copies.fresh_fetches;
  for (int i = 0; i < 200; ++i) {
    ScanPage page;
    SearchStats stats;
    ASSERT_TRUE(ScanRange(&copies, &cache, Key(uint64_t(i) * 29), "", 40,
                          i % 2 == 1, &page, &stats)
                    .ok());
    ASSERT_EQ(page.items.size(), 40u);
  }
  const uint64_t used = copies.read_ahead_used - used_before;
  const uint64_t wasted = copies.read_ahead_unused - unused_before;
  EXPECT_GE(used, 200u * 2);
  EXPECT_LT(wasted, used / 2) << used;
  EXPECT_LE(copies.fresh_fetches - fresh_before, 100u);  // ascending ones
  // A page's copies serve only that page: keys written after a page whose
  // leaves were read ahead past its end are in the next page.
  ScanPage page;
  SearchStats stats;
  const uint64_t unused_now = copies.read_ahead_unused;
  ASSERT_TRUE(
      ScanRange(&copies, &cache, Key(3000), "", 30, false, &page, &stats).ok());
  ASSERT_TRUE(page.more);
  ASSERT_GT(copies.read_ahead_unused, unused_now) << "no leaf read for later";
  for (int i = 3030; i < 3300; ++i) {
    const std::string k = Key(uint64_t(i)) + "+";
    ASSERT_TRUE(tree_->Put(k, "v" + k).ok());
    model_[k] = "v" + k;
  }
  auto rest = PageThrough(&copies, &cache, page.resume, Key(3300), 1000, false);
  EXPECT_EQ(rest, ModelRange(page.resume, Key(3300), false));
}

// A batch of lookups over a source that reads ahead (as a one-sided
// MultiGet over the network): the leaf a warmed cache routes each key to,
// read from nothing (CachedLeaf), is the leaf its lookup takes; once
// splits made the cache stale, a wrong hint costs a read, never a wrong
// answer.
TEST_F(TreeTest, CachedRoutesNameTheLeavesLookupsRead) {
  for (int i = 0; i < 4000; ++i) {
    const std::string k = Key(uint64_t(i) * 7);
    ASSERT_TRUE(tree_->Put(k, "v" + k).ok());
    model_[k] = "v" + k;
  }
  CopySource copies(mem_.base);
  copies.set_read_ahead(16);
  std::vector<uint8_t> scratch(kNodeBytes);
  NodeCache cache;
  ASSERT_TRUE(WarmCache(&copies, &cache, scratch.data()).ok());
  const uint64_t warm_fetches = copies.fresh_fetches;
  auto lookups = [&](int round) {
    for (int w = 0; w < 200; w += 16) {
      const int last = std::min(200, w + 16);
      copies.DropReadAhead();
      for (int i = w; i < last; ++i) {
        copies.Prefetch(
            CachedLeaf(&cache, {Target::kAt, Key(uint64_t(i) * 7 * 19)}));
      }
      for (int i = w; i < last; ++i) {
        const std::string k = Key(uint64_t(i) * 7 * 19);
        std::string v;
        uint64_t version = 0;
        SearchStats stats;
        Status st = Lookup(&copies, &cache, k, &v, &version, &stats);
        if (model_.count(k) > 0) {
          ASSERT_TRUE(st.ok()) << k << " " << st.ToString();
          EXPECT_EQ(v, model_[k]) << round;
        } else {
          EXPECT_EQ(st.code(), StatusCode::kNotFound) << k;
        }
      }
    }
    copies.DropReadAhead();
  };
  lookups(0);
  EXPECT_EQ(copies.fresh_fetches, warm_fetches);
  EXPECT_EQ(copies.read_ahead_used, 200u);  // keys sharing a leaf too
  EXPECT_LT(copies.read_ahead_copies, 200u);
  NodeCache cold;
  EXPECT_EQ(CachedLeaf(&cold, {Target::kAt, Key(7)}), kNoNode);
  // Splits behind the cache's back: every answer still the model's.
  for (int i = 0; i < 4000; ++i) {
    const std::string k = Key(uint64_t(i) * 7 + 3);
    ASSERT_TRUE(tree_->Put(k, "w" + k).ok());
    model_[k] = "w" + k;
  }
  lookups(1);
}

// A warmed cache holds every internal node (or as many as fit, top levels
// first), so a search then reads only its leaf; searches through it agree
// with the model, also after splits that make its copies stale.
TEST_F(TreeTest, AWarmedCacheHoldsTheInternalNodesAndSearchesReadOnlyLeaves) {
  for (int i = 0; i < 4000; ++i) {
    const std::string k = Key(uint64_t(i) * 7);
    ASSERT_TRUE(tree_->Put(k, "v" + k).ok());
    model_[k] = "v" + k;
  }
  ASSERT_GE(tree_->height(), 3) << "the test needs two internal levels";
  CopySource copies(mem_.base);
  std::vector<uint8_t> scratch(kNodeBytes);
  NodeCache cache;
  ASSERT_TRUE(WarmCache(&copies, &cache, scratch.data()).ok());
  EXPECT_GT(cache.size(), 1u);
  EXPECT_LT(cache.size(), tree_->num_nodes());  // no leaves
  for (int i = 0; i < 200; ++i) {
    const std::string k = Key(uint64_t(i) * 7 * 19);
    NodeView leaf;
    SearchStats stats;
    ASSERT_TRUE(FindLeaf(&copies, &cache, {Target::kAt, k}, scratch.data(),
                         &leaf, &stats)
                    .ok());
    EXPECT_EQ(stats.nodes_read, 1u) << k;
    EXPECT_TRUE(leaf.leaf());
  }
  // A cache too small for every internal node keeps the top levels.
  NodeCache small(2);
  ASSERT_TRUE(WarmCache(&copies, &small, scratch.data()).ok());
  EXPECT_EQ(small.size(), 2u);
  EXPECT_NE(small.Route(small.root()), nullptr);
  // Splits after the warm-up make copies stale; searches stay right.
  for (int i = 0; i < 4000; ++i) {
    const std::string k = Key(uint64_t(i) * 7 + 3);
    ASSERT_TRUE(tree_->Put(k, "w" + k).ok());
    model_[k] = "w" + k;
  }
  for (const auto& [k, v] : model_) {
    std::string got;
    uint64_t version = 0;
    SearchStats stats;
    Status st = Lookup(&copies, &cache, k, &got, &version, &stats);
    ASSERT_TRUE(st.ok()) << k << ": " << st.ToString();
    EXPECT_EQ(got, v);
  }
  EXPECT_EQ(copies.torn, 0u);
}

TEST_F(TreeTest, ConditionalWritesAndBadInput) {
  auto v1 = tree_->Put("acct", "100", PutMode::kIfAbsent);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(tree_->Put("acct", "200", PutMode::kIfAbsent).status().code(),
            StatusCode::kAlreadyExists);
  auto v2 = tree_->Put("acct", "150", PutMode::kIfVersion, *v1);
  ASSERT_TRUE(v2.ok());
  EXPECT_GT(*v2, *v1);
  EXPECT_EQ(tree_->Put("acct", "9", PutMode::kIfVersion, *v1).status().code(),
            StatusCode::kConflict);
  EXPECT_EQ(tree_->Put("none", "9", PutMode::kIfVersion, 1).status().code(),
            StatusCode::kNotFound);
  // Keys at and past the limits.
  EXPECT_TRUE(tree_->Put(std::string(kMaxKey, 'k'), "v").ok());
  EXPECT_EQ(tree_->Put(std::string(kMaxKey + 1, 'k'), "v").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_->Put("", "v").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(tree_->Put("big", std::string(kMaxValue, 'v')).ok());
  EXPECT_EQ(tree_->Put("big", std::string(kMaxValue + 1, 'v')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_->Delete("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_->Delete("none").code(), StatusCode::kNotFound);
  ScanPage page;
  EXPECT_EQ(tree_->Scan("a", "z", 0, false, &page).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(tree_->Scan("z", "a", 10, false, &page).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(tree_->Scan("b", "b", 10, false, &page).ok());
  EXPECT_TRUE(page.items.empty());
  EXPECT_FALSE(page.more);
  std::string got;
  uint64_t version;
  ASSERT_TRUE(tree_->Get("acct", &got, &version).ok());
  EXPECT_EQ(got, "150");
  EXPECT_EQ(version, *v2);
}

// Keys inserted in order fill their leaves: the rightmost node splits its
// new last entry off alone instead of in halves (an even split would leave
// every left half half empty for good: 8 of 16 pairs a leaf).
TEST_F(TreeTest, KeysInsertedInOrderFillTheirLeaves) {
  constexpr uint64_t kKeys = 20000;
  for (uint64_t i = 0; i < kKeys; ++i) {
    const std::string k = Key(i);
    ASSERT_TRUE(tree_->Put(k, std::string(32, 'v')).ok());
    model_[k] = std::string(32, 'v');
  }
  // 16-byte entry heads, 11-byte keys, 32-byte values: 16 to a leaf.
  const uint64_t per_leaf = kNodeArea / (16 + 11 + 32);
  EXPECT_LT(tree_->num_nodes(), kKeys / per_leaf * 11 / 10);
  CopySource copies(mem_.base);
  NodeCache cache;
  for (bool desc : {false, true}) {
    EXPECT_EQ(PageThrough(&copies, &cache, "", "", 100, desc),
              ModelRange("", "", desc));
  }
  // Keys later inserted between them split those full leaves evenly.
  for (uint64_t i = 0; i < kKeys; i += 3) {
    const std::string k = Key(i) + "m";
    ASSERT_TRUE(tree_->Put(k, "m").ok());
    model_[k] = "m";
  }
  for (bool desc : {false, true}) {
    EXPECT_EQ(PageThrough(&copies, &cache, "", "", 100, desc),
              ModelRange("", "", desc));
  }
}

// Keys inserted in random order: a full leaf gives entries to a sibling
// that has room (Shift) instead of splitting, so the leaves end fuller
// than splits alone leave them (1,924 nodes for these keys without shifts,
// 1.54 times the 1,250 leaves they fill in order; 1,626 with them), and
// shifts go both ways. A cache warmed on the way (parents whose separators
// shifts moved since) still finds every key, and scans either way return
// each key once.
TEST_F(TreeTest, KeysInsertedInRandomOrderShiftIntoTheirSiblings) {
  constexpr uint64_t kKeys = 20000;
  std::vector<uint64_t> order(kKeys);
  for (uint64_t i = 0; i < kKeys; ++i) order[i] = i;
  std::mt19937_64 rng(17);
  std::shuffle(order.begin(), order.end(), rng);
  CopySource copies(mem_.base);
  NodeCache cache;
  for (uint64_t n = 0; n < kKeys; ++n) {
    const std::string k = Key(order[n]);
    ASSERT_TRUE(tree_->Put(k, std::string(32, 'v')).ok());
    model_[k] = std::string(32, 'v');
    if (n == kKeys / 2) {
      EXPECT_EQ(PageThrough(&copies, &cache, "", "", 100, false),
                ModelRange("", "", false));
    }
  }
  EXPECT_GT(tree_->shifts(), kKeys / 100);
  EXPECT_GT(tree_->left_shifts(), kKeys / 200);
  EXPECT_LT(tree_->left_shifts(), tree_->shifts());
  const uint64_t per_leaf = kNodeArea / (16 + 11 + 32);
  EXPECT_LT(tree_->num_nodes(), kKeys / per_leaf * 29 / 20)
      << tree_->shifts() << " shifts, " << tree_->splits() << " splits";
  for (auto& [k, v] : model_) {
    std::string got;
    uint64_t version = 0;
    SearchStats stats;
    ASSERT_TRUE(Lookup(&copies, &cache, k, &got, &version, &stats).ok()) << k;
    EXPECT_EQ(got, v);
  }
  for (bool desc : {false, true}) {
    EXPECT_EQ(PageThrough(&copies, &cache, "", "", 100, desc),
              ModelRange("", "", desc));
    EXPECT_EQ(PageThrough(&copies, nullptr, "", "", 7, desc),
              ModelRange("", "", desc));
  }
  EXPECT_EQ(copies.torn, 0u);
}

// Deletes merge underfull nodes (leaves and internal ones): the tree
// shrinks, a cache warmed before still finds every key (stale parents
// name dead or reused nodes), and splits reuse the freed indices before
// they carve new pages.
TEST_F(TreeTest, DeletesMergeNodesAndSplitsReuseThem) {
  std::mt19937_64 rng(5);
  std::vector<std::string> keys;
  for (int i = 0; i < 20000; ++i) {
    const std::string k = Key(uint64_t(i));
    ASSERT_TRUE(tree_->Put(k, "v" + k).ok());
    model_[k] = "v" + k;
    keys.push_back(k);
  }
  ASSERT_GE(tree_->height(), 3);
  const uint32_t peak = tree_->num_nodes();
  CopySource copies(mem_.base);
  std::vector<uint8_t> scratch(kNodeBytes);
  NodeCache cache;
  ASSERT_TRUE(WarmCache(&copies, &cache, scratch.data()).ok());
  // Delete 95%, in random order.
  std::shuffle(keys.begin(), keys.end(), rng);
  for (size_t i = 0; i < keys.size() * 95 / 100; ++i) {
    ASSERT_TRUE(tree_->Delete(keys[i]).ok());
    model_.erase(keys[i]);
  }
  EXPECT_GT(tree_->merges(), 100u);
  EXPECT_LT(tree_->num_nodes(), peak / 4) << "peak " << peak;
  // Through the stale cache and from the owner: every key, and no other.
  for (uint64_t i = 0; i < 20000; ++i) {
    const std::string k = Key(i);
    std::string got;
    uint64_t version = 0;
    SearchStats stats;
    Status st = Lookup(&copies, &cache, k, &got, &version, &stats);
    if (model_.count(k)) {
      ASSERT_TRUE(st.ok()) << k << ": " << st.ToString();
      EXPECT_EQ(got, model_[k]);
    } else {
      EXPECT_EQ(st.code(), StatusCode::kNotFound) << k;
    }
    EXPECT_EQ(tree_->Get(k, &got, &version).code(), st.code()) << k;
  }
  for (bool desc : {false, true}) {
    EXPECT_EQ(PageThrough(&copies, &cache, "", "", 53, desc),
              ModelRange("", "", desc));
  }
  // Refilling reuses the freed nodes: no new pages until they run out.
  const uint64_t left = tree_->bytes_left();
  const uint32_t live = tree_->num_nodes();
  for (int i = 0; i < 20000 && tree_->num_nodes() < peak - 64; ++i) {
    const std::string k = Key(uint64_t(i)) + "r";
    ASSERT_TRUE(tree_->Put(k, "r").ok());
    model_[k] = "r";
  }
  EXPECT_GT(tree_->num_nodes(), live + 100);
  EXPECT_EQ(tree_->bytes_left(), left);
  for (bool desc : {false, true}) {
    EXPECT_EQ(PageThrough(&copies, &cache, "", "", 101, desc),
              ModelRange("", "", desc));
  }
  EXPECT_EQ(copies.torn, 0u);
}

// Deleting nearly everything shrinks the height back: a root left with
// one child gives way to it, and the old root is dead. Readers holding the
// old root (a stale cache, a TreeRoot read before) still find every key;
// the tree grows again from there.
TEST_F(TreeTest, TheHeightShrinksAsKeysGo) {
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(tree_->Put(Key(uint64_t(i)), "v").ok());
  }
  ASSERT_GE(tree_->height(), 3);
  CopySource copies(mem_.base);
  std::vector<uint8_t> scratch(kNodeBytes);
  NodeCache cache;
  ASSERT_TRUE(WarmCache(&copies, &cache, scratch.data()).ok());
  const uint32_t old_root = cache.root();
  std::mt19937_64 rng(31);
  std::vector<int> order(20000);
  for (int i = 0; i < 20000; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  // Keep three keys.
  for (size_t i = 3; i < order.size(); ++i) {
    ASSERT_TRUE(tree_->Delete(Key(uint64_t(order[i]))).ok());
  }
  for (size_t i = 0; i < 3; ++i) model_[Key(uint64_t(order[i]))] = "v";
  EXPECT_EQ(tree_->height(), 1);
  EXPECT_EQ(tree_->num_nodes(), 1u);
  // The cached old root is stale: it names a dead node, or is one.
  for (const auto& [k, v] : model_) {
    std::string got;
    uint64_t version;
    SearchStats stats;
    ASSERT_TRUE(Lookup(&copies, &cache, k, &got, &version, &stats).ok()) << k;
  }
  EXPECT_NE(cache.root(), old_root);
  EXPECT_EQ(PageThrough(&copies, &cache, "", "", 2, true),
            ModelRange("", "", true));
  // And it grows again, reusing the freed nodes.
  for (int i = 0; i < 5000; ++i) {
    const std::string k = Key(uint64_t(i)) + "+";
    ASSERT_TRUE(tree_->Put(k, "w").ok());
    model_[k] = "w";
  }
  EXPECT_GE(tree_->height(), 2);
  EXPECT_EQ(PageThrough(&copies, &cache, "", "", 97, false),
            ModelRange("", "", false));
  EXPECT_EQ(copies.torn, 0u);
}

// The largest entries (64-byte keys with the largest inline values) mixed
// with small ones, in random order: every split's halves fit beside their
// fences (layout.h, kSplitRoom). With two fences counted instead of three,
// a build of 512-byte nodes failed a put with Internal here.
TEST(TreeFull, SplitsOfTheLargestEntriesAlwaysFit) {
  Memory mem(32 << 20);
  // Orders tried: volume (REMEM_TEST_SCALE under the sanitizers).
  const unsigned kSeeds = unsigned(testing::Scaled(40, 10));
  for (unsigned seed = 1; seed <= kSeeds; ++seed) {
    std::memset(mem.base, 0, mem.bytes);
    auto t = BLinkTree::Create(mem.base, mem.bytes);
    ASSERT_TRUE(t.ok());
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 2000; ++i) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%08llu",
                    static_cast<unsigned long long>(rng() % 100000));
      std::string k = buf, v;
      if (rng() % 2 == 0) {
        k.resize(kMaxInlineKey, 'x');
        v.assign(kMaxInlineValue, 'v');
      } else {
        k.resize(16, '.');
      }
      auto put = (*t)->Put(k, v);
      ASSERT_TRUE(put.ok())
          << seed << "/" << i << ": " << put.status().ToString();
    }
  }
}

// A queue (insert at one end, delete at the other) in a region of a few
// pages runs indefinitely: merged nodes are reused (without merges it
// would need thousands of nodes).
TEST(TreeFull, AQueueInASmallRegionNeverFillsIt) {
  Memory mem(kNodesOffset + 4 * kNodePageBytes);  // 255 nodes
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  // Volume (REMEM_TEST_SCALE under the sanitizers): the window goes round
  // the region's nodes dozens of times at either count.
  constexpr uint64_t kWindow = 500;
  const uint64_t kTotal = uint64_t(testing::Scaled(100000, 30000));
  uint32_t most = 0;
  for (uint64_t i = 0; i < kTotal; ++i) {
    auto v = (*t)->Put(Key(i), std::string(32, 'q'));
    ASSERT_TRUE(v.ok()) << i << ": " << v.status().ToString();
    if (i >= kWindow) {
      ASSERT_TRUE((*t)->Delete(Key(i - kWindow)).ok());
    }
    most = std::max(most, (*t)->num_nodes());
  }
  EXPECT_EQ((*t)->size(), kWindow);
  EXPECT_GT((*t)->merges(), kTotal / 100);
  EXPECT_LT(most, 200u);
  ScanPage page;
  ASSERT_TRUE((*t)->Scan("", "", 1000, false, &page).ok());
  ASSERT_EQ(page.items.size(), kWindow);
  EXPECT_EQ(page.items.front().key, Key(kTotal - kWindow));
  EXPECT_EQ(page.items.back().key, Key(kTotal - 1));
}

// Values over kMaxInlineValue live in extents: read the same by the owner
// and through verified copies, freed and reused when rewritten or deleted,
// refused (and the leaf read again) when a reader's leaf copy is older
// than the extent; pages of large values end by bytes.
TEST_F(TreeTest, LargeValuesLiveOutOfLineAndTheirExtentsAreReused) {
  CopySource copies(mem_.base);
  NodeCache cache;
  auto both_read = [&](const std::string& k, const std::string& want) {
    std::string got;
    uint64_t version = 0, version2 = 0;
    ASSERT_TRUE(tree_->Get(k, &got, &version).ok()) << k;
    EXPECT_EQ(got, want) << k;
    SearchStats stats;
    got.clear();
    ASSERT_TRUE(Lookup(&copies, &cache, k, &got, &version2, &stats).ok());
    EXPECT_EQ(got, want) << k;
    EXPECT_EQ(version, version2);
  };
  const std::vector<size_t> sizes = {kMaxInlineValue, kMaxInlineValue + 1, 1000,
                                     70000, kMaxValue};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string k = Key(i);
    model_[k] = std::string(sizes[i], char('A' + i));
    ASSERT_TRUE(tree_->Put(k, model_[k]).ok());
  }
  for (const auto& [k, v] : model_) both_read(k, v);
  EXPECT_GT(tree_->extent_bytes(), kMaxValue);

  // A reader's leaf copy taken before a rewrite names a freed extent.
  const std::string k1 = Key(2);
  NodeView old_leaf;
  std::vector<uint8_t> image(kNodeBytes);
  SearchStats stats;
  Target t;
  t.key = k1;
  ASSERT_TRUE(
      FindLeaf(&copies, nullptr, t, image.data(), &old_leaf, &stats).ok());
  const size_t at = old_leaf.LowerBound(k1);
  ASSERT_TRUE(old_leaf.out_of_line(at));
  const ValueRef old_ref = old_leaf.value_ref(at);
  model_[k1] = std::string(1000, 'z');  // same size class: reuses it
  ASSERT_TRUE(tree_->Put(k1, model_[k1]).ok());
  std::string got;
  EXPECT_EQ(
      copies.ReadExtent(k1, old_leaf.entry_version(at), old_ref, &got).code(),
      StatusCode::kCorruption);
  both_read(k1, model_[k1]);

  // Rewrites of a large value reuse one extent; small again frees it.
  const uint64_t before = tree_->extent_bytes();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(tree_->Put(k1, std::string(1000, char('a' + i % 26))).ok());
  }
  EXPECT_EQ(tree_->extent_bytes(), before);
  model_[k1] = "small now";
  ASSERT_TRUE(tree_->Put(k1, model_[k1]).ok());
  EXPECT_LT(tree_->extent_bytes(), before);
  both_read(k1, model_[k1]);

  // Pages end by bytes: 40 values of 100 KB, pages of about 1 MiB.
  for (int i = 0; i < 40; ++i) {
    const std::string k = "p" + Key(uint64_t(i));
    model_[k] = std::string(100000, char('a' + i % 26));
    ASSERT_TRUE(tree_->Put(k, model_[k]).ok());
  }
  for (bool desc : {false, true}) {
    ScanPage page;
    ASSERT_TRUE(tree_->Scan("p", "q", 100, desc, &page).ok());
    EXPECT_TRUE(page.more);
    EXPECT_EQ(page.items.size(), kScanPageBytes / 100000 + 1);
    const auto all = PageThrough(&copies, &cache, "p", "q", 100, desc);
    EXPECT_EQ(all, ModelRange("p", "q", desc));
  }

  // Deleting every pair frees every extent.
  for (const auto& [k, v] : model_) ASSERT_TRUE(tree_->Delete(k).ok());
  model_.clear();
  EXPECT_EQ(tree_->extent_bytes(), 0u);
  EXPECT_EQ(tree_->size(), 0u);
}

// Keys over kMaxInlineKey bytes live in key extents (layout.h, "Long
// keys"): keys of every length up to kMaxKey, many sharing prefixes longer
// than a node can hold inline (so fences and separators are long too),
// agree with a model through splits, merges, gets and scans on both read
// paths; key extents are shared by the fences made from a key and freed
// once no node names them.
TEST_F(TreeTest, LongKeysAgreeWithAModelAndTheirExtentsAreFreed) {
  std::mt19937_64 rng(17);
  const std::string shared70(70, 's'), shared300(300, 't');
  auto random_key = [&]() {
    std::string k;
    switch (rng() % 5) {
      case 0:
        k = Key(rng() % 500);  // short
        break;
      case 1:
        k = shared70 + Key(rng() % 500);  // a 64+ byte shared prefix
        break;
      case 2:
        k = shared300 + Key(rng() % 500);
        break;
      case 3:
        k = Key(rng() % 500) + std::string(40 + rng() % 200, 'x');
        break;
      default:
        // Up to the limit; rare, they are large.
        // Up to the limit (rare: they are large), sharing all but their
        // last bytes.
        k = rng() % 40 == 0
                ? std::string(kMaxKey - rng() % 3, 'z')
                : shared70 + Key(rng() % 50) + std::string(rng() % 2000, 'y');
    }
    return k;
  };
  CopySource copies(mem_.base);
  NodeCache cache;
  for (int i = 0; i < 5000; ++i) {
    const std::string k = random_key();
    if (rng() % 4 == 0) {
      Status st = tree_->Delete(k);
      EXPECT_EQ(st.ok(), model_.erase(k) == 1);
    } else {
      const size_t len =
          rng() % 6 == 0 ? kMaxInlineValue + 1 + rng() % 2000 : rng() % 40;
      std::string v(len, char('a' + i % 26));
      auto put = tree_->Put(k, v);
      ASSERT_TRUE(put.ok()) << put.status().ToString();
      model_[k] = v;
    }
    if (i % 500 == 0) {
      // Gets through stale cached copies, one-sided.
      for (auto& [mk, mv] : model_) {
        std::string got;
        uint64_t version;
        SearchStats stats;
        ASSERT_TRUE(Lookup(&copies, &cache, mk, &got, &version, &stats).ok())
            << mk.size();
        EXPECT_EQ(got, mv);
      }
    }
  }
  EXPECT_EQ(tree_->size(), model_.size());
  EXPECT_GE(tree_->height(), 2);
  // Long keys in key extents: one per long key stored, and more held by
  // fences and separators made from long keys deleted since (the test
  // must cover long fences and separators).
  size_t stored_long = 0;
  for (auto& [k, v] : model_) stored_long += k.size() > kMaxInlineKey;
  EXPECT_GT(tree_->long_keys(), stored_long);
  for (auto& [k, v] : model_) {
    std::string got;
    uint64_t version = 0;
    ASSERT_TRUE(tree_->Get(k, &got, &version).ok()) << k.size();
    EXPECT_EQ(got, v);
  }
  std::string got;
  uint64_t version;
  SearchStats stats;
  EXPECT_EQ(Lookup(&copies, &cache, shared70 + "absent", &got, &version, &stats)
                .code(),
            StatusCode::kNotFound);
  EXPECT_EQ(
      Lookup(&copies, &cache, std::string(kMaxKey, 'a'), &got, &version, &stats)
          .code(),
      StatusCode::kNotFound);
  for (bool desc : {false, true}) {
    for (uint32_t limit : {1u, 9u, 100000u}) {
      EXPECT_EQ(PageThrough(&copies, &cache, "", "", limit, desc),
                ModelRange("", "", desc));
    }
    // Ranges whose bounds are long keys, and a long prefix.
    EXPECT_EQ(PageThrough(&copies, &cache, shared70, shared300, 7, desc),
              ModelRange(shared70, shared300, desc));
    EXPECT_EQ(
        PageThrough(&copies, nullptr, shared300, PrefixEnd(shared300), 5, desc),
        ModelRange(shared300, PrefixEnd(shared300), desc));
  }
  EXPECT_EQ(copies.torn, 0u);
  EXPECT_EQ(copies.stale_keys, 0u);
  // Every pair gone: no key extent left (nor a value's), and merges took
  // the tree back to a few nodes.
  for (auto& [k, v] : model_) ASSERT_TRUE(tree_->Delete(k).ok()) << k.size();
  model_.clear();
  EXPECT_EQ(tree_->size(), 0u);
  EXPECT_EQ(PageThrough(&copies, &cache, "", "", 10, false),
            std::vector<std::string>());
  // The nodes that remain may still name long keys (a fence or separator
  // is a key that once split them; dead nodes name none): at most two
  // fences a node and a separator for every node but the root.
  EXPECT_LE(tree_->long_keys(), 3u * tree_->num_nodes());
  const size_t left = tree_->long_keys();
  // Refilling with short keys and emptying again reuses the extents'
  // memory: nothing leaks into the arena.
  const uint64_t arena_left = tree_->bytes_left();
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(tree_->Put(shared300 + Key(i), "v").ok());
    }
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(tree_->Delete(shared300 + Key(i)).ok());
    }
  }
  EXPECT_LE(tree_->long_keys(), 3u * tree_->num_nodes() + left);
  EXPECT_EQ(tree_->bytes_left(), arena_left) << "extents were not reused";
}

// Long keys appended in ascending order, neighbours sharing 63 bytes: a
// leaf split keeps the left leaf full and cuts a 64-byte fence, inline,
// where the key itself takes a 24-byte KeyRef; the split must count the
// fence's own size (it once counted the key's, and a left half over the
// node's size failed the put).
TEST_F(TreeTest, AppendedLongKeysSplitWithTheirFencesCounted) {
  std::mt19937_64 rng(23);
  for (int g = 0; g < 12; ++g) {
    // 63 bytes shared within a group, then byte 63 ascending: every
    // neighbour's fence is the 64-byte prefix.
    const std::string shared = std::string(62, 'q') + char('a' + g);
    for (int b = 1; b < 251; ++b) {
      const std::string k = shared + char(b) + std::string(30, '.');
      std::string v(rng() % 120, 'v');
      auto put = tree_->Put(k, v);
      ASSERT_TRUE(put.ok()) << g << "/" << b << ": " << put.status().ToString();
      model_[k] = v;
    }
  }
  CopySource copies(mem_.base);
  NodeCache cache;
  EXPECT_EQ(PageThrough(&copies, &cache, "", "", 1000, false),
            ModelRange("", "", false));
}

// A key extent freed while a reader holds a copy of the node that named
// it: the copy is stale, and the reader's check refuses it.
TEST(TreeNode, AFreedKeyExtentIsRefused) {
  Memory mem(8 << 20);
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  BLinkTree& tree = **t;
  const std::string long_key(100, 'L');
  ASSERT_TRUE(tree.Put(long_key, "v1").ok());
  EXPECT_EQ(tree.long_keys(), 1u);
  // The reader's copy of the (root) leaf, before the delete.
  CopySource copies(mem.base);
  auto root = copies.Root();
  ASSERT_TRUE(root.ok());
  std::vector<uint8_t> image(kNodeBytes);
  std::memcpy(image.data(), mem.base + NodeOffset(*root), kNodeBytes);
  NodeView v;
  ASSERT_TRUE(v.Parse(image.data(), *root).ok());
  ASSERT_EQ(v.long_keys(), 1u);
  const KeyRef ref = v.key_ref(0);
  EXPECT_EQ(ref.key_len, 100u);
  {
    // A KeyRef naming a key short enough to be inline is malformed.
    std::vector<uint8_t> bad = image;
    KeyRef short_ref = ref;
    short_ref.key_len = kMaxInlineKey;
    std::memcpy(bad.data() + sizeof(NodeHeader) + sizeof(LeafEntryHead),
                &short_ref, sizeof(short_ref));
    NodeHeader h;
    std::memcpy(&h, bad.data(), sizeof(h));
    const uint64_t sum = NodeChecksum(bad.data(), h.used);
    std::memcpy(bad.data(), &sum, sizeof(sum));
    NodeView b;
    EXPECT_EQ(b.Parse(bad.data(), *root).code(), StatusCode::kCorruption);
  }
  std::vector<uint8_t> copy(KeyExtentReadBytes(ref));
  std::memcpy(copy.data(), mem.base + ref.offset, copy.size());
  std::string key(ref.key_len, '\0');
  ASSERT_TRUE(VerifyKeyExtent(copy.data(), ref, key.data()).ok());
  EXPECT_EQ(key, long_key);
  // Deleted: the extent is freed (its incarnation bumped) and reused.
  ASSERT_TRUE(tree.Delete(long_key).ok());
  EXPECT_EQ(tree.long_keys(), 0u);
  ASSERT_TRUE(tree.Put(std::string(100, 'M'), "v2").ok());
  std::memcpy(copy.data(), mem.base + ref.offset, copy.size());
  EXPECT_EQ(VerifyKeyExtent(copy.data(), ref, key.data()).code(),
            StatusCode::kCorruption);
  EXPECT_EQ(v.ResolveKeys([&](const KeyRef& r, char* dst) {
               std::memcpy(copy.data(), mem.base + r.offset, copy.size());
               return VerifyKeyExtent(copy.data(), r, dst);
             }).code(),
            StatusCode::kCorruption);
  // A torn key extent (a byte of its key changed) is refused too.
  std::string got;
  uint64_t version;
  SearchStats stats;
  ASSERT_TRUE(
      Lookup(&copies, nullptr, std::string(100, 'M'), &got, &version, &stats)
          .ok());
  EXPECT_EQ(got, "v2");
  std::memcpy(copy.data(), mem.base + ref.offset, copy.size());
  copy[sizeof(hash::ExtentHeader) + 5] ^= 1;
  KeyRef now = ref;
  hash::ExtentHeader h;
  std::memcpy(&h, copy.data(), sizeof(h));
  now.incarnation = h.incarnation;
  EXPECT_EQ(VerifyKeyExtent(copy.data(), now, key.data()).code(),
            StatusCode::kCorruption);
}

// A leaf resolved lazily (ResolveFences, then the keys a lookup compares)
// answers every lookup as one resolved whole, reading fewer keys; a key
// whose extent was freed since the copy is refused when it is resolved.
TEST(TreeNode, ALazilyResolvedLeafAnswersAsAWholeOne) {
  Memory mem(8 << 20);
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  BLinkTree& tree = **t;
  auto long_key = [](int i) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%04d", i);
    return std::string(80, 'K') + buf;
  };
  // One leaf (the root) of long keys, some with short neighbours.
  std::vector<std::string> keys;
  for (int i = 0; i < 24; i += 2) {
    keys.push_back(long_key(i));
    ASSERT_TRUE(tree.Put(keys.back(), "v" + std::to_string(i)).ok());
  }
  ASSERT_TRUE(tree.Put("a-short-one", "s").ok());
  ASSERT_EQ(tree.height(), 1u);
  const uint32_t root = *CopySource(mem.base).Root();
  std::vector<uint8_t> image(kNodeBytes);
  std::memcpy(image.data(), mem.base + NodeOffset(root), kNodeBytes);
  uint64_t reads = 0;
  const NodeView::KeyReader read = [&](const KeyRef& r, char* dst) {
    ++reads;
    std::vector<uint8_t> copy(KeyExtentReadBytes(r));
    std::memcpy(copy.data(), mem.base + r.offset, copy.size());
    return VerifyKeyExtent(copy.data(), r, dst);
  };
  NodeView whole;
  ASSERT_TRUE(whole.Parse(image.data(), root).ok());
  ASSERT_TRUE(whole.ResolveKeys(read).ok());
  ASSERT_EQ(whole.long_keys(), keys.size());
  std::vector<std::string> probes = {"", "a", "a-short-one", "b", "zzz"};
  for (int i = 0; i < 26; ++i) probes.push_back(long_key(i));
  for (const std::string& p : probes) {
    NodeView lazy;
    ASSERT_TRUE(lazy.Parse(image.data(), root).ok());
    reads = 0;
    ASSERT_TRUE(lazy.ResolveFences(&read).ok());
    size_t at = 0;
    ASSERT_TRUE(lazy.LowerBound(p, &at).ok()) << p;
    EXPECT_EQ(at, whole.LowerBound(p)) << p;
    if (at < lazy.count()) {
      ASSERT_TRUE(lazy.ResolveEntry(at).ok());
      EXPECT_EQ(lazy.key(at), whole.key(at)) << p;
    }
    // A binary search over 13 entries probes at most 4, and the match.
    EXPECT_LE(reads, 5u) << p;
    EXPECT_FALSE(lazy.AdoptKeys(lazy)) << "a lazy view is not a whole one";
  }
  // Deleted and the extent reused: a lazy copy from before resolves the
  // freed key as stale.
  NodeView stale;
  ASSERT_TRUE(stale.Parse(image.data(), root).ok());
  ASSERT_TRUE(stale.ResolveFences(&read).ok());
  ASSERT_TRUE(tree.Delete(keys[5]).ok());
  ASSERT_TRUE(tree.Put(std::string(100, 'M'), "m").ok());
  size_t at = 0;
  EXPECT_EQ(stale.LowerBound(keys[5], &at).code(), StatusCode::kCorruption);
  // Lookups through a copying source (every other leaf lazily) agree.
  CopySource copies(mem.base);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string got;
    uint64_t version;
    SearchStats stats;
    Status st = Lookup(&copies, nullptr, keys[i], &got, &version, &stats);
    if (i == 5) {
      EXPECT_EQ(st.code(), StatusCode::kNotFound);
    } else {
      ASSERT_TRUE(st.ok()) << i << ": " << st.ToString();
      EXPECT_EQ(got, "v" + std::to_string(2 * i));
    }
  }
}

// Values out of line until the region is full: OutOfMemory, and the pair
// that did not fit keeps its old value.
TEST(TreeFull, AFullRegionOfLargeValuesSaysSoAndChangesNothing) {
  Memory mem(kNodesOffset + 32 * kNodePageBytes);
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Put("first", "small").ok());
  std::vector<std::string> keys;
  Status last;
  for (int i = 0; i < 10000; ++i) {
    auto v = (*t)->Put(Key(uint64_t(i)), std::string(5000, 'v'));
    if (!v.ok()) {
      last = v.status();
      break;
    }
    keys.push_back(Key(uint64_t(i)));
  }
  EXPECT_EQ(last.code(), StatusCode::kOutOfMemory);
  EXPECT_GT(keys.size(), 100u);
  EXPECT_EQ((*t)->Put("first", std::string(5000, 'w')).status().code(),
            StatusCode::kOutOfMemory);
  std::string got;
  uint64_t version;
  ASSERT_TRUE((*t)->Get("first", &got, &version).ok());
  EXPECT_EQ(got, "small");
  for (const auto& k : keys) {
    ASSERT_TRUE((*t)->Get(k, &got, &version).ok()) << k;
    EXPECT_EQ(got, std::string(5000, 'v'));
  }
  // Freed extents make room again.
  ASSERT_TRUE((*t)->Delete(keys.back()).ok());
  EXPECT_TRUE((*t)->Put("first", std::string(5000, 'w')).ok());
}

// An extent of a class over a page takes its class's size of the arena,
// a multiple of 64 bytes but not of a node: the node pages carved after
// it are off a node boundary, and their nodes must not overlap it (a node
// published over the extent's tail corrupted the value).
TEST(TreeFull, NodePagesAfterALargeExtentDoNotOverlapIt) {
  Memory mem(8 << 20);
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  // A value that fills its size class to the last byte.
  const int cls = hash::SlabAllocator::ClassFor(70000);
  const uint64_t class_bytes = hash::SlabAllocator::ClassSize(cls);
  ASSERT_NE(class_bytes % kNodeBytes, 0u) << "the test needs an odd class";
  const std::string big_key = "big";
  const std::string big(class_bytes - sizeof(hash::ExtentHeader) - 3, 'B');
  ASSERT_TRUE((*t)->Put(big_key, big).ok());
  ASSERT_EQ(hash::SlabAllocator::ClassFor(sizeof(hash::ExtentHeader) + 3 +
                                          big.size()),
            cls);
  // Enough small pairs for several more node pages.
  for (uint64_t i = 0; i < 4000; ++i) {
    ASSERT_TRUE((*t)->Put(Key(i), std::string(32, 's')).ok());
  }
  ASSERT_GT((*t)->num_nodes(), 3 * kNodePageBytes / kNodeBytes);
  std::string got;
  uint64_t version;
  ASSERT_TRUE((*t)->Get(big_key, &got, &version).ok());
  EXPECT_TRUE(got == big);
  CopySource copies(mem.base);
  NodeCache cache;
  SearchStats stats;
  got.clear();
  ASSERT_TRUE(Lookup(&copies, &cache, big_key, &got, &version, &stats).ok());
  EXPECT_TRUE(got == big);
  EXPECT_EQ(copies.stale_extents, 0u);
  for (uint64_t i = 0; i < 4000; i += 7) {
    ASSERT_TRUE(Lookup(&copies, &cache, Key(i), &got, &version, &stats).ok());
    EXPECT_EQ(got, std::string(32, 's'));
  }
}

TEST(TreeFull, AFullRegionSaysSoAndKeepsEveryKey) {
  Memory mem(kNodesOffset + 3 * kNodePageBytes);
  auto t = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(t.ok());
  std::vector<std::string> keys;
  Status last;
  for (int i = 0; i < 100000; ++i) {
    auto v = (*t)->Put(Key(uint64_t(i)), std::string(200, 'v'));
    if (!v.ok()) {
      last = v.status();
      break;
    }
    keys.push_back(Key(uint64_t(i)));
  }
  EXPECT_EQ(last.code(), StatusCode::kOutOfMemory);
  for (const auto& k : keys) {
    std::string got;
    uint64_t version;
    EXPECT_TRUE((*t)->Get(k, &got, &version).ok()) << k;
  }
}

// A tree filled to the last node in random key order, then rebuilt from
// its pairs in key order (recovery from a snapshot, which is a leaf walk)
// in a region of the same size: the rebuilt tree fits, and holds more
// pairs per node (appends fill their leaves). Before, an append to a leaf
// too full to take a high fence as well split it evenly: a rebuild left
// half-full leaves, and a full tree's snapshot did not fit its region
// again (the server could not restart with its own flags).
TEST(TreeFull, ARandomlyFilledTreeRebuildsInKeyOrderInTheSameRegion) {
  for (size_t value_bytes : {20, 0, 60}) {
    const size_t bytes = kNodesOffset + 8 * kNodePageBytes;
    Memory live(bytes);
    auto t = BLinkTree::Create(live.base, live.bytes);
    ASSERT_TRUE(t.ok());
    std::mt19937_64 rng(value_bytes);
    std::map<std::string, std::pair<std::string, uint64_t>> pairs;
    for (;;) {
      const std::string k = "r:" + std::to_string(rng());
      const std::string v(value_bytes, char('a' + pairs.size() % 26));
      auto r = (*t)->Put(k, v);
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), StatusCode::kOutOfMemory);
        break;
      }
      pairs[k] = {v, *r};
    }
    Memory again(bytes);
    auto rebuilt = BLinkTree::Create(again.base, again.bytes);
    ASSERT_TRUE(rebuilt.ok());
    for (const auto& [k, vv] : pairs) {
      Status st = (*rebuilt)->Restore(k, vv.first, vv.second);
      ASSERT_TRUE(st.ok()) << value_bytes << " B values, " << pairs.size()
                           << " pairs, at " << k << ": " << st.ToString();
    }
    EXPECT_EQ((*rebuilt)->size(), pairs.size());
    EXPECT_LT((*rebuilt)->num_nodes(), (*t)->num_nodes() * 9 / 10)
        << value_bytes << " B values";
    for (const auto& [k, vv] : pairs) {
      std::string got;
      uint64_t version = 0;
      ASSERT_TRUE((*rebuilt)->Get(k, &got, &version).ok()) << k;
      EXPECT_EQ(got, vv.first);
      EXPECT_EQ(version, vv.second);
    }
  }
}

// The durable adapter: a snapshot walk (in small chunks, with writes
// between chunks) emits every pair present throughout; recovery applies
// records by version, so replaying older records changes nothing.
TEST(TreeDurable, SnapshotWalkAndRecoveryByVersion) {
  struct Sink : durability::SnapshotSink {
    std::map<std::string, std::pair<std::string, uint64_t>> pairs;
    void Add(std::string_view k, std::string_view v, uint64_t ver) override {
      pairs[std::string(k)] = {std::string(v), ver};
    }
    void Restart() override { pairs.clear(); }
  };
  Memory mem(8 << 20), mem2(8 << 20);
  auto a = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(a.ok());
  std::map<std::string, std::pair<std::string, uint64_t>> model;
  for (uint64_t i = 0; i < 3000; ++i) {
    auto v = (*a)->Put(Key(i), "v" + std::to_string(i));
    ASSERT_TRUE(v.ok());
    model[Key(i)] = {"v" + std::to_string(i), *v};
  }
  DurableTree durable(a->get());
  auto scan = durable.BeginSnapshot();
  Sink sink;
  uint64_t extra = 3000, steps = 0;
  while (!scan->Step(&sink, 7)) {
    // Writes between chunks: new keys (may or may not be emitted) and
    // splits; the pairs present throughout must all be emitted.
    ASSERT_TRUE((*a)->Put(Key(extra++ * 7 % 5000), "late").ok());
    ++steps;
  }
  EXPECT_GT(steps, 100u);
  for (const auto& [k, v] : model) {
    auto it = sink.pairs.find(k);
    if (it == sink.pairs.end()) {
      ADD_FAILURE() << "the walk missed " << k;
      continue;
    }
    // Overwritten meanwhile ("late") or as written.
    EXPECT_TRUE(it->second == v || it->second.first == "late") << k;
  }
  // Recovery into an empty tree: the snapshot, then older records of the
  // same keys (ignored), a delete older than the pair (ignored) and one
  // newer (applied).
  auto b = BLinkTree::Create(mem2.base, mem2.bytes);
  ASSERT_TRUE(b.ok());
  DurableTree restore(b->get());
  uint64_t top = 0;
  for (const auto& [k, v] : sink.pairs) {
    ASSERT_TRUE(restore.ApplyPut(k, v.first, v.second).ok());
    top = std::max(top, v.second);
  }
  for (const auto& [k, v] : sink.pairs) {
    if (v.second > 1) {
      ASSERT_TRUE(restore.ApplyPut(k, "older", v.second - 1).ok());
    }
  }
  const auto& first = *sink.pairs.begin();
  ASSERT_TRUE(restore.ApplyDelete(first.first, first.second.second - 1).ok());
  const auto& second = *std::next(sink.pairs.begin());
  ASSERT_TRUE(restore.ApplyDelete(second.first, top + 1).ok());
  restore.RaiseVersion(top + 1);
  for (const auto& [k, v] : sink.pairs) {
    std::string got;
    uint64_t version = 0;
    Status st = (*b)->Get(k, &got, &version);
    if (k == second.first) {
      EXPECT_EQ(st.code(), StatusCode::kNotFound);
      continue;
    }
    ASSERT_TRUE(st.ok()) << k;
    EXPECT_EQ(got, v.first) << k;
    EXPECT_EQ(version, v.second) << k;
  }
  EXPECT_GE(restore.last_version(), top + 1);
  auto next = (*b)->Put("new", "x");
  ASSERT_TRUE(next.ok());
  EXPECT_GT(*next, top + 1);
}

// A reader's pass over the whole tree in pages of `limit`, one-sided
// (racing a writer): the keys into *seen in ascending order, values not
// well formed for their keys counted in *bad, keys out of order in
// *disorder. Busy when a page gave up (nothing to check then).
Status ScanWholeTree(NodeSource* src, NodeCache* cache, uint32_t limit,
                     bool desc, std::vector<std::string>* seen, uint64_t* bad,
                     uint64_t* disorder) {
  seen->clear();
  std::string s, e;
  for (;;) {
    ScanPage page;
    SearchStats stats;
    REMEM_RETURN_IF_ERROR(
        ScanRange(src, cache, s, e, limit, desc, &page, &stats));
    for (auto& it : page.items) {
      if (!testing::WellFormedValue(it.key, it.value)) ++*bad;
      seen->push_back(it.key);
    }
    if (!page.more) break;
    (desc ? e : s) = page.resume;
  }
  if (desc) std::reverse(seen->begin(), seen->end());
  for (size_t i = 1; i < seen->size(); ++i) {
    if (!((*seen)[i - 1] < (*seen)[i])) ++*disorder;
  }
  return Status::OK();
}

// The writer's pause in the races below, half way through a node write
// and between its operations: readers meet torn nodes and get the CPU on
// a machine with few cores. A sleep, not a yield: a thread that yields on
// a loaded machine waits behind every other runnable task while its
// readers spin, and with thousands of yields each race took 10-20 s and
// 11 CPU-s beside the other tests instead of 0.2 s alone (2 cores, three
// CPU hogs: 60 s for the five races). A short sleep comes back on time.
void PauseForReaders() {
  std::this_thread::sleep_for(std::chrono::microseconds(20));
}

// A writer inserts from an empty tree (splitting leaves, internal nodes and
// the root), deletes and re-inserts, while a reader searches and scans with
// its own verified copies and a cache of upper levels. Even keys below
// `stable` are inserted first and never deleted: every scan must return
// all of those in its range, in order; every value read must be one that
// was written for its key.
void RaceReadersAgainstInserts(const std::string& prefix) {
  // Keys with the given prefix (a long one makes every key, fence and
  // separator a long key, in key extents).
  auto K = [&prefix](uint64_t i) { return prefix + Key(i); };
  Memory mem(16 << 20);
  auto created = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(created.ok());
  BLinkTree& tree = **created;
  // Every 8th node write pauses half done: readers meet torn nodes often
  // (and a copy that never verifies gives up with Busy, which a client
  // answers by asking the server: counted, not a failure).
  uint64_t node_writes = 0;
  tree.SetMidWriteHook([&node_writes] {
    if (++node_writes % 8 == 0) PauseForReaders();
  });
  // Half under the sanitizers (volume: still three levels and torn nodes).
  const uint64_t kKeys = uint64_t(testing::Scaled(6000, 3000));
  std::atomic<uint64_t> stable{0};  // keys [0, stable) are present for good
  std::atomic<bool> done{false}, reading{false}, failed{false};
  std::thread writer([&] {
    // Start once the reader runs: the race must overlap.
    while (!reading.load()) std::this_thread::yield();
    std::mt19937_64 rng(3);
    for (uint64_t i = 0; i < kKeys && !failed.load(); ++i) {
      // Even keys stay; odd ones churn.
      const std::string k = K(i);
      // Let the reader run on a machine with few cores.
      if (i % 16 == 0) PauseForReaders();
      // Values from 20 to 619 bytes: inline, and out of line from 257.
      if (!tree.Put(k, testing::SelfDescribingValue(k, i, 20 + i % 600)).ok()) {
        ADD_FAILURE() << "put " << k;
        break;
      }
      if (i % 2 == 0) stable.store(i + 1, std::memory_order_release);
      if (i > 10 && rng() % 3 == 0) {
        const uint64_t j = (rng() % (i / 2)) * 2 + 1;
        (void)tree.Delete(K(j));
        (void)tree.Put(K(j), testing::SelfDescribingValue(K(j), i, 30));
      }
      if (i > 10) {
        // A stable key rewritten in place (same length: the node keeps its
        // structure, so only the checksum can expose a torn copy; out of
        // line, a new extent and the old one freed under readers).
        const uint64_t j = (rng() % (i / 2)) * 2;
        (void)tree.Put(K(j),
                       testing::SelfDescribingValue(K(j), i, 20 + j % 600));
      }
    }
    done = true;
  });
  CopySource copies(mem.base);
  NodeCache cache;
  uint64_t scans = 0, gets = 0, bad = 0, missed = 0, disorder = 0;
  uint64_t gave_up = 0;
  reading = true;
  uint64_t scans_during_writes = 0;
  while (!done.load() || scans < 20) {
    if (!done.load()) ++scans_during_writes;
    const uint64_t before = stable.load(std::memory_order_acquire);
    // Point lookups of stable keys.
    for (int g = 0; g < 20 && before > 0; ++g) {
      const uint64_t i = (gets * 7919) % before / 2 * 2;
      std::string v;
      uint64_t version;
      SearchStats stats;
      Status st = Lookup(&copies, &cache, K(i), &v, &version, &stats);
      if (st.code() == StatusCode::kBusy) {
        ++gave_up;
        continue;
      }
      if (!st.ok()) {
        ADD_FAILURE() << K(i) << " " << st.ToString();
        failed = true;
        break;
      }
      if (!testing::WellFormedValue(K(i), v)) ++bad;
      ++gets;
    }
    // A scan of the whole tree in pages, one direction or the other, every
    // other pair of them reading its leaves ahead as over the network
    // (copies taken when a page plans them, used whenever its walk reaches
    // them, splits meanwhile).
    std::vector<std::string> seen;
    copies.set_read_ahead(scans % 4 >= 2 ? 16 : 0);
    Status st = ScanWholeTree(&copies, &cache, 37, scans % 2 == 1, &seen, &bad,
                              &disorder);
    if (st.code() == StatusCode::kBusy) {
      ++gave_up;  // this scan gave up: nothing to check
      continue;
    }
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      failed = true;
      break;
    }
    for (uint64_t i = 0; i < before; i += 2) {
      if (!std::binary_search(seen.begin(), seen.end(), K(i))) ++missed;
    }
    ++scans;
  }
  writer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(disorder, 0u);
  EXPECT_GE(tree.height(), 3);
  EXPECT_GT(tree.shifts(), 0u) << "the race should cover leaves shifting";
  EXPECT_GT(scans_during_writes, 10u);
  EXPECT_GT(copies.torn, 0u) << "the race should meet torn nodes";
  EXPECT_GT(copies.read_ahead_used, 0u);
  std::printf(
      "scans=%llu gets=%llu gave up=%llu torn copies refused=%llu stale "
      "extents refused=%llu stale keys refused=%llu cache hits=%llu leaves "
      "read ahead=%llu (taken %llu) shifts=%llu splits=%llu\n",
      static_cast<unsigned long long>(scans),
      static_cast<unsigned long long>(gets),
      static_cast<unsigned long long>(gave_up),
      static_cast<unsigned long long>(copies.torn),
      static_cast<unsigned long long>(copies.stale_extents),
      static_cast<unsigned long long>(copies.stale_keys),
      static_cast<unsigned long long>(cache.hits),
      static_cast<unsigned long long>(copies.read_ahead_copies),
      static_cast<unsigned long long>(copies.read_ahead_used),
      static_cast<unsigned long long>(tree.shifts()),
      static_cast<unsigned long long>(tree.splits()));
}

TEST(TreeRace, ReadersNeverSeeTornNodesAndScansMissNothing) {
  RaceReadersAgainstInserts("");
}

TEST(TreeRace, ReadersNeverSeeTornNodesWithLongKeys) {
  RaceReadersAgainstInserts(std::string(100, 'p'));
}

// A writer fills ranges and deletes them again but for one key in 16,
// so leaves and internal nodes merge and splits reuse their indices, while
// a reader with a cache of upper levels (stale as nodes die and come back
// elsewhere) gets and scans. Kept keys, once inserted, must be in every
// scan that starts after them, and found by every get; nothing torn.
void RaceReadersAgainstMerges(const std::string& prefix) {
  // Keys with the given prefix (a long one makes every key, fence and
  // separator a long key, in key extents).
  auto K = [&prefix](uint64_t i) { return prefix + Key(i); };
  Memory mem(16 << 20);
  auto created = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(created.ok());
  BLinkTree& tree = **created;
  uint64_t node_writes = 0;
  tree.SetMidWriteHook([&node_writes] {
    if (++node_writes % 8 == 0) PauseForReaders();
  });
  // Fewer rounds under the sanitizers (volume: every round merges).
  const uint64_t kRounds = uint64_t(testing::Scaled(8, 3)), kPerRound = 1600;
  std::atomic<uint64_t> kept_upto{0};  // kept keys below this are present
  std::atomic<bool> done{false}, reading{false}, failed{false};
  std::thread writer([&] {
    while (!reading.load()) std::this_thread::yield();
    for (uint64_t r = 0; r < kRounds && !failed.load(); ++r) {
      // Interleaved rounds: round r's keys are K(i * kRounds + r).
      for (uint64_t i = 0; i < kPerRound; ++i) {
        const std::string k = K(i * kRounds + r);
        if (i % 16 == 0) PauseForReaders();
        if (!tree.Put(k, testing::SelfDescribingValue(k, r, 20 + i % 400))
                 .ok()) {
          ADD_FAILURE() << "put " << k;
          failed = true;
          return;
        }
      }
      kept_upto.store(r + 1, std::memory_order_release);
      for (uint64_t i = 0; i < kPerRound; ++i) {
        if (i % 16 == 0) continue;  // kept
        if (i % 16 == 8) PauseForReaders();
        (void)tree.Delete(K(i * kRounds + r));
      }
    }
    done = true;
  });
  CopySource copies(mem.base);
  NodeCache cache;
  uint64_t scans = 0, gets = 0, bad = 0, missed = 0, disorder = 0;
  uint64_t gave_up = 0;
  reading = true;
  while (!done.load() || scans < 10) {
    const uint64_t rounds = kept_upto.load(std::memory_order_acquire);
    for (int g = 0; g < 50 && rounds > 0; ++g) {
      const uint64_t i = (gets * 7919 % kPerRound) / 16 * 16;
      const std::string k = K(i * kRounds + gets % rounds);
      std::string v;
      uint64_t version;
      SearchStats stats;
      Status st = Lookup(&copies, &cache, k, &v, &version, &stats);
      ++gets;
      if (st.code() == StatusCode::kBusy) {
        ++gave_up;
        continue;
      }
      if (!st.ok() || !testing::WellFormedValue(k, v)) ++bad;
    }
    // Every other scan reads its leaves ahead: a copy of a node merged
    // away or reused since its page planned it must be caught by its
    // fences.
    std::vector<std::string> seen;
    copies.set_read_ahead(scans % 2 == 1 ? 16 : 0);
    Status st = ScanWholeTree(&copies, &cache, 97, /*desc=*/false, &seen, &bad,
                              &disorder);
    if (st.code() == StatusCode::kBusy) {
      ++gave_up;
      continue;
    }
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      failed = true;
      break;
    }
    for (uint64_t r = 0; r < rounds; ++r) {
      for (uint64_t i = 0; i < kPerRound; i += 16) {
        if (!std::binary_search(seen.begin(), seen.end(), K(i * kRounds + r))) {
          ++missed;
        }
      }
    }
    ++scans;
  }
  writer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(disorder, 0u);
  EXPECT_GT(tree.merges(), 100u);
  EXPECT_GT(tree.shifts(), 0u) << "the race should cover leaves shifting";
  EXPECT_GE(scans, 10u);
  EXPECT_GT(copies.read_ahead_used, 0u);
  std::printf(
      "scans=%llu gets=%llu gave up=%llu merges=%llu shifts=%llu torn copies "
      "refused=%llu leaves read ahead=%llu (taken %llu)\n",
      static_cast<unsigned long long>(scans),
      static_cast<unsigned long long>(gets),
      static_cast<unsigned long long>(gave_up),
      static_cast<unsigned long long>(tree.merges()),
      static_cast<unsigned long long>(tree.shifts()),
      static_cast<unsigned long long>(copies.torn),
      static_cast<unsigned long long>(copies.read_ahead_copies),
      static_cast<unsigned long long>(copies.read_ahead_used));
}

TEST(TreeRace, ReadersMeetMergedAndReusedNodes) {
  RaceReadersAgainstMerges("");
}

TEST(TreeRace, ReadersMeetMergedAndReusedNodesWithLongKeys) {
  RaceReadersAgainstMerges(std::string(100, 'p'));
}

// A writer grows the tree to three levels and deletes it back to one
// pair, over and over (roots split, merge away and give way to a child),
// while a reader with a cache of upper levels gets the one key that stays
// and scans everything: it must find that key every time.
TEST(TreeRace, ReadersFollowTheHeightUpAndDown) {
  Memory mem(16 << 20);
  auto created = BLinkTree::Create(mem.base, mem.bytes);
  ASSERT_TRUE(created.ok());
  BLinkTree& tree = **created;
  uint64_t node_writes = 0;
  tree.SetMidWriteHook([&node_writes] {
    if (++node_writes % 8 == 0) PauseForReaders();
  });
  const int kCycles = testing::Scaled(4, 2);  // fewer under the sanitizers
  const std::string kept = Key(777777);
  ASSERT_TRUE(tree.Put(kept, testing::SelfDescribingValue(kept, 1, 40)).ok());
  std::atomic<bool> done{false}, reading{false};
  std::atomic<int> shrinks{0};
  std::thread writer([&] {
    while (!reading.load()) std::this_thread::yield();
    std::mt19937_64 rng(37);
    for (int cycle = 0; cycle < kCycles; ++cycle) {
      std::vector<uint64_t> keys;
      for (uint64_t i = 0; i < 2500; ++i) keys.push_back(i * 7 + cycle);
      std::shuffle(keys.begin(), keys.end(), rng);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i % 16 == 0) PauseForReaders();
        const std::string k = Key(keys[i]);
        if (!tree.Put(k, testing::SelfDescribingValue(k, i, 20 + i % 100))
                 .ok()) {
          ADD_FAILURE() << "put " << k;
          done = true;
          return;
        }
      }
      if (tree.height() < 3) ADD_FAILURE() << "the tree should grow";
      std::shuffle(keys.begin(), keys.end(), rng);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i % 16 == 0) PauseForReaders();
        (void)tree.Delete(Key(keys[i]));
      }
      if (tree.height() == 1) ++shrinks;
    }
    done = true;
  });
  CopySource copies(mem.base);
  NodeCache cache;
  uint64_t gets = 0, scans = 0, bad = 0, missed = 0, disorder = 0;
  uint64_t gave_up = 0;
  reading = true;
  while (!done.load() || scans < 10) {
    for (int g = 0; g < 20; ++g) {
      std::string v;
      uint64_t version;
      SearchStats stats;
      Status st = Lookup(&copies, &cache, kept, &v, &version, &stats);
      if (st.code() == StatusCode::kBusy) {
        ++gave_up;
        continue;
      }
      if (!st.ok() || !testing::WellFormedValue(kept, v)) ++missed;
      ++gets;
    }
    std::vector<std::string> seen;
    Status st = ScanWholeTree(&copies, &cache, 61, scans % 2 == 1, &seen, &bad,
                              &disorder);
    if (st.code() == StatusCode::kBusy) {
      ++gave_up;
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    if (!std::binary_search(seen.begin(), seen.end(), kept)) ++missed;
    ++scans;
  }
  writer.join();
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(disorder, 0u);
  EXPECT_EQ(shrinks.load(), kCycles) << "every cycle should end at height 1";
  std::printf("gets=%llu scans=%llu gave up=%llu torn copies refused=%llu\n",
              static_cast<unsigned long long>(gets),
              static_cast<unsigned long long>(scans),
              static_cast<unsigned long long>(gave_up),
              static_cast<unsigned long long>(copies.torn));
}

}  // namespace
}  // namespace remem::tree
