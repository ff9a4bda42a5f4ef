#include "space/space.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "space/codec.h"

namespace remem::space {
namespace {

constexpr uint64_t kChunk = 4096;

class SpaceTableTest : public ::testing::Test {
 protected:
  // Two regions: 8 chunks and 4 chunks (plus a tail too short for one).
  SpaceTableTest()
      : a_(8 * kChunk, 0xAA),
        b_(4 * kChunk + 100, 0xBB),
        table_({{7, a_.data(), a_.size()}, {9, b_.data(), b_.size()}}, kChunk) {
  }

  uint64_t Create(const char* name) {
    auto e = table_.Create(name);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? e->ns : 0;
  }

  std::vector<uint8_t> a_, b_;
  SpaceTable table_;
};

TEST_F(SpaceTableTest, NamesAreCheckedAndUnique) {
  EXPECT_EQ(table_.total_bytes(), 12 * kChunk);
  EXPECT_EQ(table_.Create("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.Create("has space").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(table_.Create(std::string(256, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(table_.Create(std::string(255, 'x')).ok());
  const uint64_t g = Create("graph");
  EXPECT_EQ(table_.Create("graph").status().code(), StatusCode::kAlreadyExists);
  auto o = table_.Open("graph");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->ns, g);
  EXPECT_EQ(table_.Open("nope").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(table_.Delete("graph").ok());
  EXPECT_EQ(table_.Info(g).status().code(), StatusCode::kNotFound);
  // A new namespace of the same name is another one: old handles stay dead.
  const uint64_t g2 = Create("graph");
  EXPECT_NE(g2, g);
  EXPECT_EQ(table_.Alloc(g, 10).status().code(), StatusCode::kNotFound);
  auto list = table_.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "graph");
}

TEST_F(SpaceTableTest, AllocZeroesAndMapsAcrossRegions) {
  const uint64_t ns = Create("n");
  auto s1 = table_.Alloc(ns, 7 * kChunk + 1);  // 8 chunks: all of region 7
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(s1->address, 0u);
  EXPECT_EQ(s1->length, 7 * kChunk + 1);
  for (size_t i = 0; i < a_.size(); ++i) ASSERT_EQ(a_[i], 0) << i;
  auto s2 = table_.Alloc(ns, 2 * kChunk);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->address, 8 * kChunk);
  // The first mapping is one extent (contiguous chunks), at region 7.
  auto m = table_.Map(ns, 100, 7 * kChunk - 99, /*connection=*/1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->extents.size(), 1u);
  EXPECT_EQ(m->extents[0].region, 7u);
  EXPECT_EQ(m->extents[0].offset, 100u);
  EXPECT_EQ(m->extents[0].length, 7 * kChunk - 99);
  // Past the segment's length (not its chunks') is refused.
  EXPECT_EQ(table_.Map(ns, 100, 7 * kChunk - 98, 1).status().code(),
            StatusCode::kInvalidArgument);
  // Between segments there is nothing.
  EXPECT_EQ(table_.Map(ns, 7 * kChunk + 1, 1, 1).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(table_.Map(ns, 0, 0, 1).status().code(),
            StatusCode::kInvalidArgument);
  auto m2 = table_.Map(ns, s2->address, s2->length, 1);
  ASSERT_TRUE(m2.ok());
  ASSERT_EQ(m2->extents.size(), 1u);
  EXPECT_EQ(m2->extents[0].region, 9u);
  EXPECT_EQ(m2->extents[0].offset, 0u);
  // The rest: 2 chunks; 3 is too many, and nothing was taken.
  EXPECT_EQ(table_.Alloc(ns, 3 * kChunk).status().code(),
            StatusCode::kOutOfMemory);
  EXPECT_EQ(table_.counters().free_bytes.load(), 2 * kChunk);
  EXPECT_EQ(table_.Alloc(ns, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SpaceTableTest, ReservationIsTakenFirstAndReleased) {
  const uint64_t x = Create("x");
  const uint64_t y = Create("y");
  ASSERT_TRUE(table_.Reserve(x, 10 * kChunk).ok());
  EXPECT_EQ(table_.Reserve(y, 3 * kChunk).status().code(),
            StatusCode::kOutOfMemory);  // all or nothing
  EXPECT_EQ(table_.counters().free_bytes.load(), 2 * kChunk);
  auto s = table_.Alloc(x, kChunk);
  ASSERT_TRUE(s.ok());
  auto i = table_.Info(x);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->reserved_bytes, 9 * kChunk);
  EXPECT_EQ(i->allocated_bytes, kChunk);
  ASSERT_TRUE(table_.Release(x, 1).ok());  // rounds up to a chunk
  EXPECT_EQ(table_.Info(x)->reserved_bytes, 8 * kChunk);
  ASSERT_TRUE(table_.Release(x, UINT64_MAX).ok());
  EXPECT_EQ(table_.Info(x)->reserved_bytes, 0u);
  EXPECT_EQ(table_.counters().free_bytes.load(), 11 * kChunk);
  // Free returns the chunks to the namespace's reservation.
  ASSERT_TRUE(table_.Free(x, s->address).ok());
  EXPECT_EQ(table_.Info(x)->reserved_bytes, kChunk);
  EXPECT_EQ(table_.Free(x, s->address).code(), StatusCode::kNotFound);
  // Deleting gives everything back.
  ASSERT_TRUE(table_.Delete("x").ok());
  EXPECT_EQ(table_.counters().free_bytes.load(), 12 * kChunk);
}

// The rule one-sided writers rely on: memory of a freed segment goes to no
// one while a map of it exists, and is reused once the last map is gone.
TEST_F(SpaceTableTest, MappedMemoryIsHeldUntilUnmapped) {
  const uint64_t ns = Create("n");
  auto s = table_.Alloc(ns, 12 * kChunk);  // everything
  ASSERT_TRUE(s.ok());
  auto m1 = table_.Map(ns, 0, kChunk, /*connection=*/1);
  auto m2 = table_.Map(ns, kChunk, kChunk, /*connection=*/2);
  ASSERT_TRUE(m1.ok() && m2.ok());
  ASSERT_TRUE(table_.Free(ns, s->address).ok());
  EXPECT_EQ(table_.counters().held_bytes.load(), 12 * kChunk);
  EXPECT_EQ(table_.Map(ns, 0, 1, 3).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(table_.Alloc(ns, 1).status().code(), StatusCode::kOutOfMemory);
  // Another connection cannot drop this one's map.
  EXPECT_EQ(table_.Unmap(m1->map_id, 2).code(), StatusCode::kNotFound);
  ASSERT_TRUE(table_.Unmap(m1->map_id, 1).ok());
  EXPECT_EQ(table_.Alloc(ns, 1).status().code(), StatusCode::kOutOfMemory);
  table_.DropConnection(2);  // as when connection 2 closes
  EXPECT_EQ(table_.counters().held_bytes.load(), 0u);
  EXPECT_EQ(table_.counters().maps.load(), 0u);
  auto again = table_.Alloc(ns, 12 * kChunk);
  ASSERT_TRUE(again.ok());
  EXPECT_GT(again->address, s->address);  // addresses are never reused
}

TEST_F(SpaceTableTest, DeletedWhileMappedGoesToThePool) {
  const uint64_t ns = Create("n");
  auto s = table_.Alloc(ns, 4 * kChunk);
  ASSERT_TRUE(s.ok());
  auto m = table_.Map(ns, 0, 10, 5);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(table_.Delete("n").ok());
  EXPECT_EQ(table_.counters().free_bytes.load(), 8 * kChunk);
  EXPECT_EQ(table_.counters().held_bytes.load(), 4 * kChunk);
  ASSERT_TRUE(table_.Unmap(m->map_id, 5).ok());
  EXPECT_EQ(table_.counters().free_bytes.load(), 12 * kChunk);
}

TEST(SpaceCodec, RoundTripsAndRefusesMalformed) {
  Request r;
  r.ns = 3;
  r.address = 4;
  r.length = 5;
  r.map_id = 6;
  r.name = "abc";
  const std::string enc = EncodeRequest(r);
  auto d = DecodeRequest(enc);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ns, 3u);
  EXPECT_EQ(d->map_id, 6u);
  EXPECT_EQ(d->name, "abc");
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_EQ(DecodeRequest(enc.substr(0, n)).status().code(),
              StatusCode::kProtocolError)
        << n;
  }
  EXPECT_FALSE(DecodeRequest(enc + "x").ok());
  std::string bad = enc;
  bad[0] ^= 1;
  EXPECT_FALSE(DecodeRequest(bad).ok());

  MapReply m;
  m.map_id = 1;
  m.address = 0;
  m.length = 30;
  m.extents = {{1, 0, 0, 10}, {2, 0, 64, 20}};
  auto dm = DecodeMapReply(EncodeMapReply(m));
  ASSERT_TRUE(dm.ok());
  EXPECT_EQ(dm->extents.size(), 2u);
  m.length = 31;  // extents no longer cover it
  EXPECT_FALSE(DecodeMapReply(EncodeMapReply(m)).ok());

  std::vector<NamespaceEntry> list(2);
  list[0].name = "a";
  list[0].chunk_bytes = 4096;
  list[1].name = "longer-name";
  list[1].reserved_bytes = 7;
  auto dl = DecodeNamespaceList(EncodeNamespaceList(list));
  ASSERT_TRUE(dl.ok());
  ASSERT_EQ(dl->size(), 2u);
  EXPECT_EQ((*dl)[1].name, "longer-name");
  EXPECT_EQ((*dl)[1].reserved_bytes, 7u);
  const std::string enc_list = EncodeNamespaceList(list);
  for (size_t n = 0; n < enc_list.size(); ++n) {
    EXPECT_FALSE(DecodeNamespaceList(enc_list.substr(0, n)).ok()) << n;
  }
}

}  // namespace
}  // namespace remem::space
