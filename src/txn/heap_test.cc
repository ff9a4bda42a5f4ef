#include "txn/heap.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "txn/codec.h"

namespace remem::txn {
namespace {

constexpr uint64_t kOwner = 7, kOther = 8;

class ObjectHeapTest : public ::testing::Test {
 protected:
  ObjectHeapTest()
      : memory_(2 * kPageBytes, 0xAA),
        heap_({{3, memory_.data(), 2 * kPageBytes}}) {}

  TxnObjectIdWire Create(const std::string& data, uint64_t owner = kOwner) {
    auto id = heap_.Reserve(uint32_t(data.size()), owner);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    auto v = heap_.Commit({{*id, 0, TxnOp::kCreate, data}}, owner);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return *id;
  }
  // The object as a one-sided reader would verify it from the memory.
  bool Verifies(const TxnObjectIdWire& id, std::string* data,
                uint64_t* version) {
    ObjectHeader h;
    std::memcpy(&h, memory_.data() + id.address, sizeof(h));
    if (HeaderCheck(h, id.capacity) != h.header_check ||
        h.incarnation != id.incarnation || h.version == 0 ||
        h.version % 2 != 0 || h.size > id.capacity) {
      return false;
    }
    const uint8_t* p = memory_.data() + id.address + sizeof(h);
    if (DataChecksum(h, p, h.size) != h.checksum) return false;
    data->assign(reinterpret_cast<const char*>(p), h.size);
    *version = h.version;
    return true;
  }

  std::vector<uint8_t> memory_;
  ObjectHeap heap_;
};

TEST_F(ObjectHeapTest, CreateWriteAndReadVerifyInMemory) {
  auto id = Create("hello");
  EXPECT_EQ(id.capacity, CapacityOf(0));
  std::string data;
  uint64_t version = 0;
  ASSERT_TRUE(Verifies(id, &data, &version));
  EXPECT_EQ(data, "hello");
  EXPECT_EQ(version, 2u);
  auto v = heap_.Commit({{id, 2, TxnOp::kWrite, "world!"}}, kOther);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::vector<uint64_t>{4});
  ASSERT_TRUE(Verifies(id, &data, &version));
  EXPECT_EQ(data, "world!");
  auto read = heap_.Read(id);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->first, 4u);
  EXPECT_EQ(read->second, "world!");
  EXPECT_EQ(heap_.counters().objects.load(), 1u);
  EXPECT_EQ(heap_.counters().commits.load(), 2u);
}

TEST_F(ObjectHeapTest, AStaleReadAbortsTheWholeCommit) {
  auto a = Create("a0");
  auto b = Create("b0");
  ASSERT_TRUE(heap_.Commit({{b, 2, TxnOp::kWrite, "b1"}}, kOther).ok());
  // a's write rides on a read of b at version 2, now 4: nothing applied.
  auto v = heap_.Commit(
      {{a, 2, TxnOp::kWrite, "a1"}, {b, 2, TxnOp::kCheck, {}}}, kOwner);
  EXPECT_EQ(v.status().code(), StatusCode::kConflict) << v.status().ToString();
  EXPECT_EQ(heap_.Read(a)->second, "a0");
  EXPECT_EQ(heap_.Read(a)->first, 2u);
  EXPECT_EQ(heap_.counters().conflicts.load(), 1u);
  // A write of an object at a version it no longer has, too.
  EXPECT_EQ(heap_.Commit({{b, 2, TxnOp::kWrite, "b2"}}, kOwner).status().code(),
            StatusCode::kConflict);
  // The same object twice in one commit is refused.
  EXPECT_EQ(heap_
                .Commit({{a, 2, TxnOp::kWrite, "x"}, {a, 2, TxnOp::kCheck, {}}},
                        kOwner)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  // More bytes than the capacity.
  EXPECT_EQ(heap_.Commit({{a, 2, TxnOp::kWrite, std::string(33, 'x')}}, kOwner)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ObjectHeapTest, AFreedSlotIsReusedUnderANewIncarnation) {
  auto a = Create("first");
  ASSERT_TRUE(heap_.Commit({{a, 2, TxnOp::kFree, {}}}, kOwner).ok());
  EXPECT_EQ(heap_.Read(a).status().code(), StatusCode::kNotFound);
  std::string data;
  uint64_t version;
  EXPECT_FALSE(Verifies(a, &data, &version));
  auto b = Create("second");
  EXPECT_EQ(b.address, a.address) << "the slot is reused";
  EXPECT_EQ(b.incarnation, a.incarnation + 1);
  EXPECT_EQ(heap_.Read(a).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(Verifies(a, &data, &version)) << "the old id reads the new one";
  EXPECT_EQ(
      heap_.Commit({{a, 0, TxnOp::kWrite, "blind"}}, kOwner).status().code(),
      StatusCode::kNotFound);
  EXPECT_EQ(heap_.Commit({{a, 2, TxnOp::kCheck, {}}}, kOwner).status().code(),
            StatusCode::kConflict);
  EXPECT_EQ(heap_.Read(b)->second, "second");
}

// An object read (or written blind) that another session freed, whose slot
// this transaction then allocated: the old id is gone, a Conflict (read) or
// NotFound (blind) that Run retries, not "appears twice" (InvalidArgument).
// Nothing is applied and the reservation goes back.
TEST_F(ObjectHeapTest, AGoneObjectWhoseSlotTheCommitAllocatedIsAConflict) {
  auto z = Create("z");
  auto y = Create("y");
  ASSERT_TRUE(heap_.Commit({{z, 2, TxnOp::kFree, {}}}, kOther).ok());
  for (const uint64_t read_version : {uint64_t{2}, uint64_t{0}}) {
    auto n = heap_.Reserve(1, kOwner);
    ASSERT_TRUE(n.ok());
    ASSERT_EQ(n->address, z.address) << "the freed slot is reused";
    const uint64_t reserved = heap_.counters().reserved.load();
    auto v =
        heap_.Commit({{z, read_version,
                       read_version != 0 ? TxnOp::kCheck : TxnOp::kWrite, "q"},
                      {*n, 0, TxnOp::kCreate, "new"},
                      {y, 2, TxnOp::kWrite, "y2"}},
                     kOwner);
    EXPECT_EQ(v.status().code(),
              read_version != 0 ? StatusCode::kConflict : StatusCode::kNotFound)
        << v.status().ToString();
    EXPECT_EQ(heap_.counters().reserved.load(), reserved - 1);
    EXPECT_EQ(heap_.Read(y)->second, "y");
    EXPECT_EQ(heap_.Read(*n).status().code(), StatusCode::kNotFound);
  }
  // The same id twice is still the caller's mistake.
  EXPECT_EQ(heap_
                .Commit({{y, 2, TxnOp::kWrite, "a"}, {y, 2, TxnOp::kCheck, {}}},
                        kOwner)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ObjectHeapTest, ReservationsBelongToTheirOwnerAndGoBack) {
  auto r = heap_.Reserve(100, kOwner);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->capacity, CapacityOf(2));
  EXPECT_EQ(heap_.Read(*r).status().code(), StatusCode::kNotFound)
      << "not an object before its commit";
  EXPECT_EQ(
      heap_.Commit({{*r, 0, TxnOp::kCreate, "x"}}, kOther).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(heap_.counters().reserved.load(), 1u);
  heap_.DropOwner(kOwner);
  EXPECT_EQ(heap_.counters().reserved.load(), 0u);
  EXPECT_EQ(heap_.counters().bytes_used.load(), 0u);
  EXPECT_EQ(
      heap_.Commit({{*r, 0, TxnOp::kCreate, "x"}}, kOwner).status().code(),
      StatusCode::kInvalidArgument);
  // A failed commit gives its reservations back.
  auto a = Create("a");
  auto n = heap_.Reserve(8, kOwner);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(
      heap_
          .Commit({{*n, 0, TxnOp::kCreate, "new"}, {a, 4, TxnOp::kCheck, {}}},
                  kOwner)
          .status()
          .code(),
      StatusCode::kConflict);
  EXPECT_EQ(heap_.counters().reserved.load(), 0u);
  EXPECT_EQ(heap_.Read(*n).status().code(), StatusCode::kNotFound);
}

TEST_F(ObjectHeapTest, AFullHeapSaysSoAndBadIdsAreRefused) {
  // Two pages: one for each of two classes, then nothing for a third.
  ASSERT_TRUE(heap_.Reserve(10, kOwner).ok());
  ASSERT_TRUE(heap_.Reserve(5000, kOwner).ok());
  EXPECT_EQ(heap_.Reserve(100000, kOwner).status().code(),
            StatusCode::kInvalidArgument);
  const Status full = heap_.Reserve(100, kOwner).status();
  EXPECT_EQ(full.code(), StatusCode::kOutOfMemory);
  // Which is full: this class, for want of a page without one.
  EXPECT_NE(full.message().find("no page left without a class"),
            std::string::npos)
      << full.ToString();
  TxnObjectIdWire bogus{64 * 3 + 8, 1, CapacityOf(0)};
  EXPECT_EQ(heap_.Read(bogus).status().code(), StatusCode::kInvalidArgument);
  bogus = {4 * kPageBytes, 1, CapacityOf(0)};
  EXPECT_EQ(heap_.Read(bogus).status().code(), StatusCode::kInvalidArgument);
  // An id of a slot the heap does not have (an earlier server's): none.
  bogus = {kPageBytes, 1, CapacityOf(0)};  // a page of another class
  EXPECT_EQ(heap_.Read(bogus).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(
      heap_.Commit({{bogus, 2, TxnOp::kCheck, {}}}, kOwner).status().code(),
      StatusCode::kNotFound);
}

// A heap of a server's next start (without a data directory): the same
// slots, from another first incarnation. An id of the earlier heap names
// no object of the later one, and a slot's first incarnation is not
// logged as a use of it.
TEST(ObjectHeapStart, AHeapOfANewStartNamesNoObjectOfTheLastOnesIds) {
  std::vector<uint8_t> before(kPageBytes), after(kPageBytes);
  ObjectHeap first({{1, before.data(), kPageBytes}}, 77);
  ObjectHeap second({{1, after.data(), kPageBytes}}, 4000000000u);
  EXPECT_EQ(second.first_incarnation(), 4000000000u);
  auto old_id = first.Reserve(8, kOwner);
  ASSERT_TRUE(old_id.ok());
  EXPECT_EQ(old_id->incarnation, 77u);
  ASSERT_TRUE(first.Commit({{*old_id, 0, TxnOp::kCreate, "old"}}, kOwner).ok());
  auto new_id = second.Reserve(8, kOwner);
  ASSERT_TRUE(new_id.ok());
  ASSERT_TRUE(
      second.Commit({{*new_id, 0, TxnOp::kCreate, "new"}}, kOwner).ok());
  EXPECT_EQ(new_id->address, old_id->address);
  EXPECT_NE(new_id->incarnation, old_id->incarnation);
  EXPECT_EQ(second.Read(*old_id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(
      second.Commit({{*old_id, 0, TxnOp::kWrite, "x"}}, kOwner).status().code(),
      StatusCode::kNotFound);
  EXPECT_EQ(second.Read(*new_id)->second, "new");
  std::string record;
  EXPECT_FALSE(second.SlotRecord(new_id->address + 64, &record))
      << "a slot never used";
  EXPECT_TRUE(second.SlotRecord(new_id->address, &record));
  EXPECT_EQ(ObjectHeap({{1, before.data(), kPageBytes}}, 0).first_incarnation(),
            1u)
      << "0 names nothing";
}

TEST(TxnCodec, CommitsRoundTripAndTruncationsAreRefused) {
  std::vector<CommitEntry> in = {
      {{64, 1, CapacityOf(0)}, 2, TxnOp::kWrite, "abc"},
      {{128, 3, CapacityOf(0)}, 6, TxnOp::kCheck, {}},
      {{256, 1, CapacityOf(1)}, 0, TxnOp::kCreate, std::string_view("")},
      {{512, 2, CapacityOf(0)}, 4, TxnOp::kFree, {}}};
  const std::string bytes = EncodeCommit(in);
  auto out = DecodeCommit(bytes);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].id.address, in[i].id.address);
    EXPECT_EQ((*out)[i].version, in[i].version);
    EXPECT_EQ((*out)[i].op, in[i].op);
    EXPECT_EQ((*out)[i].data, in[i].data);
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeCommit(bytes.substr(0, n)).status().code(),
              StatusCode::kProtocolError)
        << n;
  }
  EXPECT_FALSE(DecodeCommit(bytes + std::string(8, '\0')).ok());
  EXPECT_FALSE(DecodeCommit(EncodeCommit({})).ok()) << "no entries";
  std::string bad_op = bytes;
  bad_op[sizeof(TxnCommitHeader) + 24] = 9;
  EXPECT_FALSE(DecodeCommit(bad_op).ok());
  auto versions = DecodeVersions(EncodeVersions({2, 4}));
  ASSERT_TRUE(versions.ok());
  EXPECT_EQ(*versions, (std::vector<uint64_t>{2, 4}));
  EXPECT_FALSE(DecodeReadReply(EncodeReadReply(3, "odd")).ok());
  EXPECT_FALSE(DecodeInfo(EncodeInfo({kMaxObjectBytes,
                                      2 * kPageBytes,
                                      {{1, 0, 0, kPageBytes}}}))
                   .ok())
      << "regions that do not tile the heap";
}

}  // namespace
}  // namespace remem::txn
