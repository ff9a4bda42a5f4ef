#include "bench_schemes.h"

#include <gtest/gtest.h>

#include "hash/layout.h"

namespace remem::schemes {
namespace {

constexpr SchemeKind kAll[] = {SchemeKind::kCuckoo2, SchemeKind::kCuckoo3,
                               SchemeKind::kHopscotch, SchemeKind::kChained};

SchemeConfig Config(SchemeKind s, PairKind p, uint32_t bucket_bytes,
                    uint64_t slots = 1 << 14) {
  SchemeConfig c;
  c.scheme = s;
  c.pairs = p;
  c.bucket_bytes = bucket_bytes;
  c.target_slots = slots;
  c.seed = 7;
  return c;
}

// Inserts keys [size, n) until the first failure; returns the new size.
uint64_t Fill(Scheme* s, uint64_t n) {
  uint64_t id = s->size();
  while (id < n && s->Insert(uint32_t(id))) ++id;
  return id;
}

TEST(Geometry, MatchesTheStatedSlots) {
  // The study's common building blocks (docs/HASH_SCHEMES.md): a 16-byte
  // bucket header, 16-byte references, 64-byte inline 16/32 pairs. remem's
  // own buckets (layout 3: a 64-byte header with an index, entries that
  // carry their own checksum) hold fewer; the document says by how much.
  Geometry g = GeometryFor(Config(SchemeKind::kCuckoo2, PairKind::kOutOfLine,
                                  uint32_t(hash::kBucketBytes)));
  EXPECT_EQ(g.slots_per_bucket, uint32_t((hash::kBucketBytes - 16) / 16));
  EXPECT_EQ(g.slot_bytes, 16u);
  EXPECT_EQ(kInlineSlotBytes, 64u);
  const uint32_t inline_slots[] = {1, 3, 7};
  const uint32_t bytes[] = {128, 256, 512};
  for (int i = 0; i < 3; ++i) {
    g = GeometryFor(Config(SchemeKind::kCuckoo2, PairKind::kInline, bytes[i]));
    EXPECT_EQ(g.slots_per_bucket, inline_slots[i]);
    EXPECT_EQ(g.bucket_bytes, bytes[i]);
    // A power of two: remem's AltBucket works on a mask.
    EXPECT_EQ(g.num_buckets & (g.num_buckets - 1), 0u);
  }
  // Chained buckets spend 8 B on the next pointer: 256 B holds 3 inline
  // pairs, 128 B holds 6 pointers.
  EXPECT_EQ(GeometryFor(Config(SchemeKind::kChained, PairKind::kInline, 256))
                .slots_per_bucket,
            3u);
  EXPECT_EQ(GeometryFor(Config(SchemeKind::kChained, PairKind::kOutOfLine, 128))
                .slots_per_bucket,
            6u);
  g = GeometryFor(Config(SchemeKind::kCuckoo3, PairKind::kInline, 512));
  EXPECT_EQ(g.slots_per_bucket, 1u);
  EXPECT_EQ(g.bucket_bytes, kHeaderBytes + kInlineSlotBytes);
  g = GeometryFor(Config(SchemeKind::kHopscotch, PairKind::kInline, 256));
  EXPECT_EQ(g.first_read_bytes, 512u);  // both buckets, one read
  EXPECT_EQ(GeometryFor(Config(SchemeKind::kChained, PairKind::kInline, 64))
                .slots_per_bucket,
            0u);  // a 64 B bucket has no room for a 64 B pair
}

TEST(Schemes, EveryInsertedKeyIsFoundAndNoAbsentKeyIs) {
  const std::vector<Key> misses = RandomKeys(2000, 7, 1);
  for (SchemeKind sk : kAll) {
    for (PairKind pk : {PairKind::kInline, PairKind::kOutOfLine}) {
      for (uint32_t b : {128u, 512u}) {
        const SchemeConfig c = Config(sk, pk, b);
        SCOPED_TRACE(std::string(SchemeName(sk)) + " " + PairName(pk) + " " +
                     std::to_string(b));
        const Geometry g = GeometryFor(c);
        const std::vector<Key> keys = RandomKeys(g.primary_slots, 7, 0);
        auto s = MakeScheme(c, &keys);
        // To the first failure: the cuckoo moves near the end must not
        // lose a key.
        const uint64_t n = Fill(s.get(), keys.size());
        ASSERT_EQ(s->size(), n);
        ASSERT_GT(n, keys.size() / 3);
        for (uint64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(s->Lookup(keys[i]).found) << "key " << i;
        }
        for (const Key& k : misses) ASSERT_FALSE(s->Lookup(k).found);
        if (sk == SchemeKind::kCuckoo2 || sk == SchemeKind::kCuckoo3) {
          // Small buckets fill up before 100% (31-slot ones may not).
          if (g.slots_per_bucket <= 7) {
            EXPECT_LT(n, keys.size());
          }
          EXPECT_GT(s->moves(), 0u);
          EXPECT_EQ(s->spilled(), 0u);
        } else {
          EXPECT_EQ(n, keys.size());  // chains never refuse
        }
      }
    }
  }
}

TEST(Schemes, ThreeWayCuckooProbesOneToThreeLocations) {
  const SchemeConfig c = Config(SchemeKind::kCuckoo3, PairKind::kInline, 0);
  const std::vector<Key> keys = RandomKeys(GeometryFor(c).primary_slots, 7, 0);
  auto s = MakeScheme(c, &keys);
  const uint64_t n = keys.size() * 3 / 4;
  ASSERT_EQ(Fill(s.get(), n), n);
  double sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const LookupResult r = s->Lookup(keys[i]);
    ASSERT_GE(r.sequential.reads, 1u);
    ASSERT_LE(r.sequential.reads, 3u);
    EXPECT_EQ(r.sequential.reads, r.sequential.round_trips);
    EXPECT_EQ(r.sequential.bytes, r.sequential.reads * 80ull);
    EXPECT_EQ(r.parallel.round_trips, 1u);
    sum += r.sequential.reads;
  }
  // Strictly between the bounds on average: keys fill their first choice
  // first, but not all fit there at 75%.
  EXPECT_GT(sum / n, 1.05);
  EXPECT_LT(sum / n, 2.5);
  for (const Key& k : RandomKeys(1000, 7, 1)) {
    const LookupResult r = s->Lookup(k);
    EXPECT_LE(r.sequential.reads, 3u);
    EXPECT_GE(r.sequential.reads, 2u);  // three hashes rarely all collide
  }
}

TEST(Schemes, TwoChoiceHitCostsOneOrTwoBucketsPlusItsExtent) {
  for (PairKind pk : {PairKind::kInline, PairKind::kOutOfLine}) {
    const SchemeConfig c = Config(SchemeKind::kCuckoo2, pk, 256);
    const Geometry g = GeometryFor(c);
    const std::vector<Key> keys = RandomKeys(g.primary_slots, 7, 0);
    auto s = MakeScheme(c, &keys);
    const uint64_t n = keys.size() * 9 / 10;
    ASSERT_EQ(Fill(s.get(), n), n);
    const uint32_t extent = pk == PairKind::kInline ? 0 : 1;
    for (uint64_t i = 0; i < n; i += 7) {
      const LookupResult r = s->Lookup(keys[i]);
      ASSERT_TRUE(r.found);
      // Tags are 16 bits: a false match costs an extra extent read, so
      // allow it but no more than one bucket's worth.
      ASSERT_GE(r.sequential.reads, 1 + extent);
      ASSERT_LE(r.sequential.reads, 2 + extent * g.slots_per_bucket * 2);
      ASSERT_EQ(r.parallel.round_trips, 1 + (r.parallel.reads - 2));
      ASSERT_GE(r.parallel.bytes, 2ull * g.bucket_bytes);
    }
    const LookupResult miss = s->Lookup(RandomKeys(1, 7, 1)[0]);
    if (pk == PairKind::kInline) {
      // b1, b2, then b1 again to confirm, as src/hash/reader.cc does.
      EXPECT_EQ(miss.sequential.reads, 3u);
      EXPECT_EQ(miss.sequential.bytes, 3ull * g.bucket_bytes);
      EXPECT_EQ(miss.parallel.round_trips, 2u);
    }
    EXPECT_GE(miss.sequential.reads, 2u);
    EXPECT_EQ(miss.parallel.round_trips, miss.parallel.reads - 1);
  }
}

TEST(Schemes, HopscotchReadsTheNeighbourhoodOnceUntilItChains) {
  const SchemeConfig c = Config(SchemeKind::kHopscotch, PairKind::kInline, 512);
  const Geometry g = GeometryFor(c);
  const std::vector<Key> keys = RandomKeys(g.primary_slots, 7, 0);
  auto s = MakeScheme(c, &keys);
  // Half full with 14 slots per neighbourhood: nothing overflows.
  const uint64_t n = keys.size() / 2;
  ASSERT_EQ(Fill(s.get(), n), n);
  ASSERT_EQ(s->spilled(), 0u);
  for (uint64_t i = 0; i < n; ++i) {
    const LookupResult r = s->Lookup(keys[i]);
    ASSERT_EQ(r.sequential.reads, 1u);
    ASSERT_EQ(r.sequential.bytes, 1024u);
  }
  // Full: some pairs overflow, and each overflow block is one more read.
  Fill(s.get(), keys.size());
  EXPECT_GT(s->spilled(), 0u);
  uint64_t chained = 0;
  for (const Key& k : keys) chained += s->Lookup(k).sequential.reads > 1;
  EXPECT_EQ(chained, s->spilled());
}

TEST(Schemes, ChainedBucketsCostOneReadPerBucketWalked) {
  // Two home buckets of 3 slots and 60 keys: chains of ~10 buckets.
  SchemeConfig c = Config(SchemeKind::kChained, PairKind::kInline, 256, 6);
  const Geometry g = GeometryFor(c);
  ASSERT_EQ(g.num_buckets, 2u);
  const std::vector<Key> keys = RandomKeys(60, 7, 0);
  auto s = MakeScheme(c, &keys);
  ASSERT_EQ(Fill(s.get(), keys.size()), keys.size());
  EXPECT_EQ(s->spilled(), 60u - 6u);
  // Both chains' buckets: 60 keys in buckets of 3, at most 2 part-full.
  const uint64_t buckets = s->TableBytes() / 256;
  EXPECT_GE(buckets, 20u);
  EXPECT_LE(buckets, 21u);
  uint64_t miss_reads = 0;
  for (const Key& k : RandomKeys(400, 7, 1)) {
    miss_reads += s->Lookup(k).sequential.reads;
  }
  // A miss walks its whole chain; the two chains hold all the buckets.
  EXPECT_GE(miss_reads, 400u * 9);
  EXPECT_LE(miss_reads, 400u * 12);
  EXPECT_EQ(s->moves(), 0u);
}

TEST(Simulate, IsDeterministicAndReportsUtilizationFromTheGeometry) {
  RunOptions o;
  o.samples = 2000;
  const SchemeConfig c = Config(SchemeKind::kCuckoo2, PairKind::kInline, 512);
  const RunResult a = Simulate(c, o);
  const RunResult b = Simulate(c, o);
  ASSERT_EQ(a.points.size(), 3u);
  for (size_t i = 0; i < a.points.size(); ++i) {
    ASSERT_TRUE(a.points[i].reached);
    EXPECT_EQ(a.points[i].hit_reads, b.points[i].hit_reads);
    EXPECT_EQ(a.points[i].miss_bytes, b.points[i].miss_bytes);
    EXPECT_EQ(a.points[i].hits_missing, 0u);
    EXPECT_EQ(a.points[i].misses_found, 0u);
    // Inline: payload over the bucket array, 48 of every 512/7 bytes.
    const double want = a.points[i].occupancy * 7 * 48 / 512;
    EXPECT_NEAR(a.points[i].utilization, want, 0.001);
  }
  EXPECT_EQ(a.max_load, b.max_load);
  // 7 slots per bucket, two choices: well past 90% (MemC3-like).
  EXPECT_GT(a.max_load, 0.93);
  // One slot per bucket, two choices: about half (the classic bound).
  const RunResult one =
      Simulate(Config(SchemeKind::kCuckoo2, PairKind::kInline, 128), o);
  EXPECT_GT(one.max_load, 0.35);
  EXPECT_LT(one.max_load, 0.55);
  EXPECT_FALSE(one.points.back().reached);
}

}  // namespace
}  // namespace remem::schemes
