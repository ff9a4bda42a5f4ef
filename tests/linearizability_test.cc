// The checker itself must accept linearizable histories and reject the
// classic violations; the store tests then trust its verdicts.

#include "testing/linearizability.h"

#include <gtest/gtest.h>

#include <random>

namespace remem::testing {
namespace {

KvOp Put(std::string v, uint64_t call, uint64_t ret, uint64_t version = 0) {
  KvOp op;
  op.kind = KvOp::kPut;
  op.value = std::move(v);
  op.call_ns = call;
  op.return_ns = ret;
  if (version) op.version = version;
  return op;
}
KvOp Get(std::optional<std::string> v, uint64_t call, uint64_t ret) {
  KvOp op;
  op.kind = KvOp::kGet;
  op.found = v.has_value();
  op.read_value = v.value_or("");
  op.call_ns = call;
  op.return_ns = ret;
  return op;
}
KvOp Del(uint64_t call, uint64_t ret) {
  KvOp op;
  op.kind = KvOp::kDelete;
  op.call_ns = call;
  op.return_ns = ret;
  return op;
}
KvOp Cap(uint64_t expected, std::string v, bool ok, uint64_t call, uint64_t ret,
         uint64_t version) {
  KvOp op;
  op.kind = KvOp::kCompareAndPut;
  op.expected_version = expected;
  op.value = std::move(v);
  op.succeeded = ok;
  op.call_ns = call;
  op.return_ns = ret;
  if (ok) op.version = version;
  return op;
}

TEST(Linearizability, SequentialHistories) {
  EXPECT_TRUE(CheckKeyHistory({Put("a", 1, 2), Get("a", 3, 4)}).linearizable);
  EXPECT_FALSE(CheckKeyHistory({Put("a", 1, 2), Get("b", 3, 4)}).linearizable);
  EXPECT_TRUE(CheckKeyHistory({Get(std::nullopt, 1, 2), Put("a", 3, 4),
                               Del(5, 6), Get(std::nullopt, 7, 8)})
                  .linearizable);
  // Stale read: after the put returned, a later get must not see absence.
  auto stale = CheckKeyHistory({Put("a", 1, 2), Get(std::nullopt, 3, 4)});
  EXPECT_FALSE(stale.linearizable);
  EXPECT_NE(stale.explanation.find("absent"), std::string::npos)
      << stale.explanation;
}

TEST(Linearizability, ConcurrentReadsMaySeeEitherSide) {
  // Get overlaps the put: both outcomes are fine.
  EXPECT_TRUE(CheckKeyHistory({Put("a", 1, 10), Get("a", 2, 3)}).linearizable);
  EXPECT_TRUE(
      CheckKeyHistory({Put("a", 1, 10), Get(std::nullopt, 2, 3)}).linearizable);
  // But two sequential gets inside the put cannot go back in time.
  EXPECT_FALSE(CheckKeyHistory(
                   {Put("a", 1, 10), Get("a", 2, 3), Get(std::nullopt, 4, 5)})
                   .linearizable);
  // A value nobody wrote is never linearizable.
  EXPECT_FALSE(
      CheckKeyHistory({Put("a", 1, 10), Get("torn", 2, 3)}).linearizable);
}

TEST(Linearizability, CompareAndPutOnVersions) {
  // v1 written, then a CAP expecting v1 swaps; a second expecting v1 fails.
  EXPECT_TRUE(CheckKeyHistory({Put("a", 1, 2, 1), Cap(1, "b", true, 3, 4, 2),
                               Cap(1, "c", false, 5, 6, 0), Get("b", 7, 8)})
                  .linearizable);
  // Two CAPs on the same expected version cannot both succeed.
  EXPECT_FALSE(CheckKeyHistory({Put("a", 1, 2, 1), Cap(1, "b", true, 3, 10, 2),
                                Cap(1, "c", true, 4, 9, 3)})
                   .linearizable);
  // A CAP that failed while the version matched is not linearizable.
  EXPECT_FALSE(CheckKeyHistory({Put("a", 1, 2, 1), Cap(1, "b", false, 3, 4, 0)})
                   .linearizable);
}

KvOp Pia(std::string v, bool ok, uint64_t call, uint64_t ret) {
  KvOp op;
  op.kind = KvOp::kPutIfAbsent;
  op.value = std::move(v);
  op.succeeded = ok;
  op.call_ns = call;
  op.return_ns = ret;
  return op;
}

TEST(Linearizability, PutIfAbsentInsertsOnlyIntoAbsence) {
  EXPECT_TRUE(CheckKeyHistory(
                  {Pia("a", true, 1, 2), Pia("b", false, 3, 4), Get("a", 5, 6)})
                  .linearizable);
  // Refused while the key was absent throughout: not linearizable.
  EXPECT_FALSE(CheckKeyHistory({Pia("a", false, 1, 2)}).linearizable);
  // Inserted over a present key: not linearizable.
  EXPECT_FALSE(
      CheckKeyHistory({Put("x", 1, 2), Pia("a", true, 3, 4)}).linearizable);
  // Two concurrent inserts cannot both succeed; after a delete one can.
  EXPECT_FALSE(CheckKeyHistory({Pia("a", true, 1, 10), Pia("b", true, 2, 9)})
                   .linearizable);
  EXPECT_TRUE(CheckKeyHistory({Pia("a", true, 1, 2), Del(3, 4),
                               Pia("b", true, 5, 6), Get("b", 7, 8)})
                  .linearizable);
  // An unknown outcome may have inserted, or not.
  KvOp lost = Pia("a", true, 1, 0);
  lost.returned = false;
  EXPECT_TRUE(CheckKeyHistory({lost, Get("a", 5, 6)}).linearizable);
  EXPECT_TRUE(CheckKeyHistory({lost, Get(std::nullopt, 5, 6)}).linearizable);
}

TEST(Linearizability, UnknownOutcomesMayOrMayNotApply) {
  KvOp lost = Put("x", 1, 0);
  lost.returned = false;
  // Seen, or never seen: both linearizable.
  EXPECT_TRUE(CheckKeyHistory({lost, Get("x", 5, 6)}).linearizable);
  EXPECT_TRUE(CheckKeyHistory({lost, Get(std::nullopt, 5, 6)}).linearizable);
  // But it cannot take effect before it was called.
  KvOp late = Put("x", 10, 0);
  late.returned = false;
  EXPECT_FALSE(CheckKeyHistory({Get("x", 1, 2), late}).linearizable);
  // Once a read has revealed its version, the register keeps it.
  KvOp v5 = Get("x", 5, 6);
  v5.version = 5;
  KvOp v9 = Get("x", 7, 8);
  v9.version = 9;
  EXPECT_FALSE(CheckKeyHistory({lost, v5, v9}).linearizable);
  EXPECT_FALSE(
      CheckKeyHistory({lost, v5, Cap(9, "y", true, 7, 8, 10)}).linearizable);
  EXPECT_TRUE(
      CheckKeyHistory({lost, v5, Cap(5, "y", true, 7, 8, 10)}).linearizable);
  // Nor be seen, unseen, then seen again.
  EXPECT_FALSE(CheckKeyHistory({lost, Get("x", 5, 6), Get(std::nullopt, 7, 8),
                                Get("x", 9, 10)})
                   .linearizable);
}

// A random history generated from a real sequential execution with
// overlapping intervals around each linearization point is accepted; the
// same history with one read result corrupted is rejected.
TEST(Linearizability, RandomHistoriesFromASequentialExecution) {
  std::mt19937_64 rng(99);
  for (int round = 0; round < 20; ++round) {
    std::vector<KvOp> ops;
    std::optional<std::string> reg;
    uint64_t t = 100;
    for (int i = 0; i < 300; ++i) {
      uint64_t point = t += 10;
      uint64_t call = point - rng() % 40, ret = point + rng() % 40;
      switch (rng() % 3) {
        case 0: {
          std::string v = "v" + std::to_string(i);
          ops.push_back(Put(v, call, ret));
          reg = v;
          break;
        }
        case 1:
          ops.push_back(Del(call, ret));
          reg.reset();
          break;
        default:
          ops.push_back(Get(reg, call, ret));
      }
      ops.back().client = int(rng() % 4);
    }
    auto ok = CheckKeyHistory(ops);
    ASSERT_TRUE(ok.linearizable) << ok.explanation;
    for (auto& op : ops) {
      if (op.kind == KvOp::kGet && op.found) {
        op.read_value = "corrupt";
        break;
      }
    }
    EXPECT_FALSE(CheckKeyHistory(ops).linearizable);
  }
}

}  // namespace
}  // namespace remem::testing

namespace remem::testing {
namespace {

KvOp Rmw(std::optional<std::string> old, std::string next, uint64_t call,
         uint64_t ret, uint64_t version) {
  KvOp op;
  op.kind = KvOp::kReadModifyWrite;
  op.found = old.has_value();
  op.read_value = old.value_or("");
  op.value = std::move(next);
  op.call_ns = call;
  op.return_ns = ret;
  op.version = version;
  return op;
}

// Two concurrent fetch-adds of 1 on an absent counter: one must have seen
// it absent and the other 1. Both seeing it absent (a lost update) is not
// linearizable; a read must fall between them in that order.
TEST(Linearizability, ReadModifyWritesMustChainTheirValues) {
  EXPECT_TRUE(CheckKeyHistory(
                  {Rmw(std::nullopt, "1", 0, 10, 1), Rmw("1", "2", 1, 11, 2)})
                  .linearizable);
  EXPECT_TRUE(CheckKeyHistory(
                  {Rmw("1", "2", 0, 10, 2), Rmw(std::nullopt, "1", 1, 11, 1)})
                  .linearizable);
  EXPECT_FALSE(CheckKeyHistory({Rmw(std::nullopt, "1", 0, 10, 1),
                                Rmw(std::nullopt, "1", 1, 11, 2)})
                   .linearizable);
  // A get that returned before the second started cannot see its value.
  EXPECT_FALSE(CheckKeyHistory({Rmw(std::nullopt, "1", 0, 10, 1),
                                Get("2", 11, 12), Rmw("1", "2", 20, 30, 2)})
                   .linearizable);
}

}  // namespace
}  // namespace remem::testing
