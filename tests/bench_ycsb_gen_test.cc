// The YCSB generators of remem-bench (tools/bench_ycsb_gen): skew of the
// zipfian choosers, coverage, recency of "latest", keys and self-checking
// values. Fixed seeds: the same draws on every run.

#include "bench_ycsb_gen.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <set>
#include <vector>

namespace remem::bench::ycsb {
namespace {

TEST(YcsbGen, Fnv1a64OverTheEightBytesOfALong) {
  EXPECT_EQ(Fnv1a64(0x0102030405060708ull), 0x0c6d4496e17859d5ull);
}

TEST(YcsbGen, ScrambledZetaMatchesEulerMaclaurin) {
  // zeta(10^10) = exact sum to 10^6 + the integral of the tail + the
  // first Euler-Maclaurin corrections.
  const double theta = 0.99, m = 1e6, n = 1e10;
  double z = Zeta(uint64_t(m), theta);
  z += (std::pow(n, 1 - theta) - std::pow(m, 1 - theta)) / (1 - theta);
  z += (std::pow(n, -theta) - std::pow(m, -theta)) / 2;
  z += -theta * (std::pow(n, -theta - 1) - std::pow(m, -theta - 1)) / 12;
  EXPECT_NEAR(z, kScrambledZeta, 1e-8);
}

TEST(YcsbGen, ZipfianTopItemsHaveTheirShare) {
  const uint64_t n = 1000;
  Zipfian z(n, 0.99);
  Rng rng(42);
  std::vector<uint64_t> hits(n);
  const int draws = 400000;
  for (int i = 0; i < draws; ++i) {
    uint64_t v = z.Next(rng);
    ASSERT_LT(v, n);
    ++hits[v];
  }
  const double zeta = Zeta(n, 0.99);
  // P(item i) = 1 / ((i+1)^theta * zeta): item 0 gets ~13%.
  EXPECT_NEAR(double(hits[0]) / draws, 1 / zeta, 0.1 / zeta);
  EXPECT_NEAR(double(hits[1]) / draws, 1 / (std::pow(2, 0.99) * zeta),
              0.1 / zeta);
  EXPECT_GT(hits[0], hits[10] * 5);
}

TEST(YcsbGen, ScrambledZipfianIsSkewedButCoversTheRange) {
  const uint64_t records = 1000;
  std::atomic<uint64_t> count{records};
  auto c = MakeChooser(Distribution::kZipfian, records, &count);
  Rng rng(7);
  std::vector<uint64_t> hits(records);
  const int draws = 400000;
  for (int i = 0; i < draws; ++i) {
    uint64_t v = c->Next(rng);
    ASSERT_LT(v, records);
    ++hits[v];
  }
  uint64_t covered = 0, top = 0;
  for (uint64_t h : hits) covered += h > 0, top = std::max(top, h);
  EXPECT_GT(covered, records * 95 / 100);
  // The hottest key holds item 0 of 10^10: 1/26.47 = 3.8%, plus whatever
  // else hashes onto it.
  EXPECT_GT(double(top) / draws, 0.03);
  EXPECT_LT(double(top) / draws, 0.10);
  // Hashing spreads the hot keys: the hottest is not record 0.
  EXPECT_NE(std::max_element(hits.begin(), hits.end()) - hits.begin(), 0);
}

TEST(YcsbGen, UniformCoversTheRangeEvenly) {
  std::atomic<uint64_t> count{100};
  auto c = MakeChooser(Distribution::kUniform, 100, &count);
  Rng rng(3);
  std::vector<int> hits(100);
  for (int i = 0; i < 100000; ++i) ++hits[c->Next(rng)];
  for (int h : hits) {
    EXPECT_GT(h, 800);
    EXPECT_LT(h, 1200);
  }
}

TEST(YcsbGen, LatestFavoursTheNewestKeysAndFollowsInserts) {
  std::atomic<uint64_t> count{10000};
  auto c = MakeChooser(Distribution::kLatest, 10000, &count);
  Rng rng(11);
  int newest = 0, recent = 0;
  const int draws = 100000;
  for (int i = 0; i < draws; ++i) {
    uint64_t v = c->Next(rng);
    ASSERT_LT(v, 10000u);
    newest += v == 9999;
    recent += v >= 9000;
  }
  EXPECT_GT(double(newest) / draws, 0.08);  // 1/zeta(10^4) = 10%
  EXPECT_GT(double(recent) / draws, 0.6);
  count = 10100;  // 100 inserts later
  int at_new_top = 0;
  for (int i = 0; i < draws; ++i) {
    uint64_t v = c->Next(rng);
    ASSERT_LT(v, 10100u);
    at_new_top += v == 10099;
  }
  EXPECT_GT(double(at_new_top) / draws, 0.08);
}

TEST(YcsbGen, KeysAreFixedSizeAndNeverCollide) {
  std::string k;
  std::set<std::string> seen;
  ASSERT_EQ(KeyCapacity(8), 65536u);
  for (uint64_t i = 0; i < 65536; ++i) {
    KeyName(i, 8, &k);
    ASSERT_EQ(k.size(), 8u);
    ASSERT_TRUE(seen.insert(k).second) << k;
  }
  seen.clear();
  for (uint64_t i = 0; i < 200000; ++i) {
    KeyName(i, 16, &k);
    ASSERT_EQ(k.size(), 16u);
    ASSERT_EQ(k.substr(0, 4), "user");
    ASSERT_TRUE(seen.insert(k).second) << k;
  }
  KeyName(12345, 23, &k);  // Pilaf's ~23 B keys
  EXPECT_EQ(k.size(), 23u);
  std::string again;
  KeyName(12345, 23, &again);
  EXPECT_EQ(k, again);
}

// The names are the workloads' (a run's keys, and so its scans, are those
// of every earlier run): KeyName writes the bytes that its first
// definition (one hex digit a step, before 2026-12-07) wrote, here for
// the smallest keys, keys with an odd digit count, the default size, and
// keys longer than the 16 digits of a 64-bit number.
TEST(YcsbGen, KeyNamesKeepTheirDefinition) {
  struct Case {
    uint64_t n;
    size_t size;
    const char* name;
  };
  const Case cases[] = {
      {0, 8, "user0000"},
      {1, 8, "userd48b"},
      {12345, 8, "usercd73"},
      {KeyCapacity(8) - 1, 8, "userfe57"},
      {1, 9, "useree266"},
      {12345, 9, "userce1dd"},
      {KeyCapacity(9) - 1, 9, "userdacc6"},
      {0, 16, "user000000000000"},
      {1, 16, "user4daba64fae49"},
      {12345, 16, "user58ae2244811a"},
      {KeyCapacity(16) - 1, 16, "userace37c1810ed"},
      {1, 23, "user000aa1edc3cf3949b52"},
      {12345, 23, "user00073763b95a692bd1c"},
      {UINT64_MAX, 23, "user0001717568ec80b7042"},
      {12345, 32, "user00000000000073763b95a692bd1c"},
      {UINT64_MAX, 32, "user0000000000001717568ec80b7042"},
  };
  // Reused, as the workloads reuse theirs: longer than any name here.
  std::string k = "a string longer than any key below, kept to be reused";
  for (const Case& c : cases) {
    KeyName(c.n, c.size, &k);
    EXPECT_EQ(k, c.name) << "size " << c.size << " n " << c.n;
  }
}

TEST(YcsbGen, ValuesCheckThemselves) {
  std::string v;
  for (size_t size : {0, 5, 8, 9, 32, 4096}) {
    MakeValue("user00001234abcd", 7, size, &v);
    ASSERT_EQ(v.size(), size);
    EXPECT_TRUE(CheckValue("user00001234abcd", v, size)) << size;
    // Every byte is checked (the filler is compared a word at a time, the
    // last word short) and printable.
    for (size_t i = 0; i < size; ++i) {
      EXPECT_TRUE(std::isprint(static_cast<unsigned char>(v[i]))) << i;
      std::string bad = v;
      bad[i] ^= 1;
      EXPECT_FALSE(CheckValue("user00001234abcd", bad, size))
          << size << " " << i;
    }
    EXPECT_FALSE(CheckValue("user00001234abcd", v + "x", size));
  }
  MakeValue("keyA", 1, 32, &v);
  EXPECT_FALSE(CheckValue("keyB", v, 32));  // another key's value
  std::string w;
  MakeValue("keyA", 2, 32, &w);
  EXPECT_NE(v, w);  // the generation changes the bytes
  EXPECT_TRUE(CheckValue("keyA", w, 32));
}

TEST(YcsbGen, Workloads) {
  for (const char* n : {"A", "B", "C", "D", "E", "F", "a"}) {
    auto w = WorkloadByName(n);
    ASSERT_TRUE(w.ok()) << n;
    EXPECT_DOUBLE_EQ(w->read + w->update + w->insert + w->rmw + w->scan, 1.0);
    EXPECT_EQ(w->ordered(), w->name == 'E') << n;
  }
  EXPECT_EQ(WorkloadByName("D")->distribution, Distribution::kLatest);
  EXPECT_DOUBLE_EQ(WorkloadByName("F")->rmw, 0.5);
  // YCSB's workloade: 95% scans of at most 100 keys from a zipfian start,
  // 5% inserts.
  auto e = WorkloadByName("E");
  ASSERT_TRUE(e.ok());
  EXPECT_DOUBLE_EQ(e->scan, 0.95);
  EXPECT_DOUBLE_EQ(e->insert, 0.05);
  EXPECT_EQ(e->max_scan, 100u);
  EXPECT_EQ(e->distribution, Distribution::kZipfian);
  EXPECT_FALSE(WorkloadByName("G").ok());
  EXPECT_FALSE(WorkloadByName("").ok());
}

}  // namespace
}  // namespace remem::bench::ycsb
