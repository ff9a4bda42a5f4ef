// Server-side operations end to end (remem/ops.h): remem-server in its own
// process (two threads, so batches fan out over partitions), clients in
// child processes (tests/atomics_child.cc) and in this one, over the
// transport of REMEM_TEST_TRANSPORT.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "ops/vector.h"
#include "remem/hash.h"
#include "remem/ops.h"
#include "remem/session.h"
#include "test_util.h"
#include "testing/clock.h"
#include "testing/linearizability.h"
#include "testing/scale.h"
#include "util/subprocess.h"

namespace remem {
namespace {

namespace fs = std::filesystem;
using testing::KvOp;
using testing::StartServer;
using testing::TestTransport;

struct OpsClient {
  std::unique_ptr<Session> session;
  std::unique_ptr<OpsStore> store;
  OpsClient() = default;
  OpsClient(OpsClient&&) = default;
  ~OpsClient() { store.reset(); }
  OpsStore* operator->() const { return store.get(); }
};

OpsClient ConnectOps(const std::string& address,
                     ReadPath path = ReadPath::kAuto,
                     std::optional<ReadPath> reduce = {}) {
  OpsClient c;
  c.session = testing::ConnectOrDie(address, "", path);
  if (!c.session) return c;
  OpsOptions o;
  o.reduce_path = reduce;
  auto s = OpsStore::Open(c.session.get(), o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) c.store = std::move(*s);
  return c;
}

std::string I64(int64_t v) { return ops::EncodeI64(v); }

class AtomicsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer({"--threads", "2", "--max-value-bytes", "65536",
                           "--ops-library", REMEM_EXAMPLE_OPS_LIB},
                          "64M");
    ASSERT_NE(server_.process, nullptr);
  }
  testing::ServerProcess server_;
};

TEST_F(AtomicsTest, EachAtomicReturnsItsOldOrNewValueAndTheVersion) {
  auto c = ConnectOps(server_.address);
  ASSERT_TRUE(c.store);
  // INCRBY on an absent key: created at 0.
  auto a = c->FetchAdd("n", 5, /*create=*/true);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->value, 0);
  auto b = c->AddFetch("n", 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->value, 15);
  EXPECT_GT(b->version, a->version);
  // The value is an ordinary pair: a get (one-sided where possible) reads
  // it with the version the atomic reported.
  auto g = c->hash()->Get("n");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, I64(15));
  EXPECT_EQ(g->version, b->version);

  auto mn = c->Execute(Op::Min("n", 3));
  ASSERT_TRUE(mn.ok());
  EXPECT_EQ(*mn->Int(), 3);
  auto mx = c->Execute(Op::Max("n", 2));
  ASSERT_TRUE(mx.ok());
  EXPECT_EQ(*mx->Int(), 3);
  EXPECT_EQ(mx->version, mn->version);  // unchanged: no write
  auto created = c->Execute(Op::Max("m", 7, true, 9));
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(*created->Int(), 9);
  // The typed helpers (the README lists min and max among OpsStore's):
  // the value after, synchronously and asynchronously.
  auto tmin = c->Min("n", -4);
  ASSERT_TRUE(tmin.ok()) << tmin.status().ToString();
  EXPECT_EQ(tmin->value, -4);
  auto tmax = c->Max("n", 40);
  ASSERT_TRUE(tmax.ok());
  EXPECT_EQ(tmax->value, 40);
  EXPECT_GT(tmax->version, tmin->version);
  EXPECT_EQ(c->Min("absent", 1).status().code(), StatusCode::kNotFound);
  int64_t async_min = 0, async_max = 0;
  c->MinAsync("n", 12, [&](Result<IntReply> r) {
    ASSERT_TRUE(r.ok());
    async_min = r->value;
  });
  c->MaxAsync(
      "fresh", 5,
      [&](Result<IntReply> r) {
        ASSERT_TRUE(r.ok());
        async_max = r->value;
      },
      /*create=*/true, /*initial=*/2);
  ASSERT_TRUE(c.session->WaitAll().ok());
  EXPECT_EQ(async_min, 12);
  EXPECT_EQ(async_max, 5);
  ASSERT_TRUE(c->Max("n", 3).ok());
  EXPECT_EQ(c->hash()->Get("n")->value, I64(12));

  ASSERT_TRUE(c->hash()->Put("s", "abc").ok());
  auto miss = c->Execute(Op::CompareSwap("s", "xyz", "new"));
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->applied);
  EXPECT_EQ(miss->value, "abc");
  auto hit = c->Execute(Op::CompareSwap("s", "abc", "new"));
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->applied);
  EXPECT_EQ(hit->value, "abc");
  EXPECT_EQ(c->hash()->Get("s")->value, "new");
  auto app = c->Execute(Op::Append("s", "-tail"));
  ASSERT_TRUE(app.ok());
  EXPECT_EQ(*app->Int(), 8);
  EXPECT_EQ(c->hash()->Get("s")->value, "new-tail");
  auto app2 = c->Execute(Op::Append("log", "x", /*create=*/true));
  ASSERT_TRUE(app2.ok());
  EXPECT_EQ(c->hash()->Get("log")->value, "x");
}

TEST_F(AtomicsTest, BadInputGetsClearErrorsAndChangesNothing) {
  auto c = ConnectOps(server_.address);
  ASSERT_TRUE(c.store);
  ASSERT_TRUE(c->hash()->Put("text", "hello").ok());
  auto mismatch = c->FetchAdd("text", 1);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("8-byte integer"),
            std::string::npos)
      << mismatch.status().ToString();
  EXPECT_EQ(c->hash()->Get("text")->value, "hello");

  ASSERT_TRUE(
      c->hash()->Put("big", I64(std::numeric_limits<int64_t>::max())).ok());
  const uint64_t version = c->hash()->Get("big")->version;
  auto overflow = c->AddFetch("big", 1);
  EXPECT_EQ(overflow.status().code(), StatusCode::kOutOfRange)
      << overflow.status().ToString();
  auto after = c->hash()->Get("big");
  EXPECT_EQ(after->value, I64(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(after->version, version);

  EXPECT_EQ(c->FetchAdd("absent", 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->hash()->Get("absent").status().code(), StatusCode::kNotFound);

  // A vector op on a scalar; a reduction too, on both paths.
  ASSERT_TRUE(c->hash()->Put("scalar", I64(4)).ok());
  EXPECT_EQ(c->Execute(Op::VecUpdate("scalar", VecFn::kAdd, int64_t{1}))
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      c->Execute(Op::VecReduce("scalar", Reduction::kSum)).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(c->VecReduce("scalar", Reduction::kSum).status().code(),
            StatusCode::kInvalidArgument);

  auto unknown = c->Execute(Op::Call("scalar", 5, I64(2)));
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("id 5"), std::string::npos);

  // Oversize: a vector beyond the server's 64 KiB value limit, and an
  // append that would grow a value past it.
  std::vector<int64_t> huge(65536 / 8, 1);
  EXPECT_EQ(c->VecPut("vec", huge).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->VecPut("vec", std::vector<int64_t>(8000, 1)).ok());
  auto grow = c->Execute(Op::Append("vec", std::string(4000, 'x')));
  EXPECT_EQ(grow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(grow.status().message().find("value limit"), std::string::npos);
  auto v = c->VecGet("vec");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(std::get<0>(v->data).size(), 8000u);

  // A scalar operand of the other kind: an integer on a double vector is
  // converted; a double on an integer vector is refused and changes
  // nothing (its bits were read as an int64 and added).
  ASSERT_TRUE(c->VecPut("ints", std::vector<int64_t>{1, 2, 3}).ok());
  auto half = c->Execute(Op::VecUpdate("ints", VecFn::kAdd, 1.5));
  EXPECT_EQ(half.status().code(), StatusCode::kInvalidArgument)
      << half.status().ToString();
  EXPECT_EQ(std::get<0>(c->VecGet("ints")->data),
            (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(
      c->Execute(Op::VecFilter("ints", Predicate::kGe, 0.5)).status().code(),
      StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->VecPut("doubles", std::vector<double>{1, 2}).ok());
  ASSERT_TRUE(
      c->Execute(Op::VecUpdate("doubles", VecFn::kAdd, int64_t{3})).ok());
  EXPECT_EQ(std::get<1>(c->VecGet("doubles")->data),
            (std::vector<double>{4, 5}));
  auto ge = c->VecFilter("doubles", Predicate::kGe, int64_t{5});
  ASSERT_TRUE(ge.ok()) << ge.status().ToString();
  EXPECT_EQ(std::get<1>(*ge), (std::vector<double>{5}));

  // In a batch, each bad op fails alone.
  auto rs =
      c->ExecuteBatch({Op::FetchAdd("text", 1), Op::FetchAdd("n2", 1, true),
                       Op::Call("n2", 999, ""), Op::AddFetch("n2", 1)});
  ASSERT_EQ(rs.size(), 4u);
  EXPECT_EQ(rs[0].status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(rs[1].ok());
  EXPECT_EQ(rs[2].status().code(), StatusCode::kUnsupported);
  ASSERT_TRUE(rs[3].ok());
  EXPECT_EQ(*rs[3]->Int(), 2);
}

TEST_F(AtomicsTest, UserFunctionsFromTheExampleLibrary) {
  auto c = ConnectOps(server_.address);
  ASSERT_TRUE(c.store);
  ASSERT_TRUE(c->hash()->Put("x", I64(6)).ok());
  auto mul = c->Execute(Op::Call("x", 100, I64(7)));
  ASSERT_TRUE(mul.ok()) << mul.status().ToString();
  EXPECT_EQ(*mul->Int(), 42);
  EXPECT_EQ(c->hash()->Get("x")->value, I64(42));
  // bounded_add creates at 0 and clamps at 1000.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c->Execute(Op::Call("bucket", 101, I64(400))).ok());
  }
  EXPECT_EQ(c->hash()->Get("bucket")->value, I64(1000));
  // keep_if_longer leaves the value and its version alone.
  ASSERT_TRUE(c->hash()->Put("long", "abcdef").ok());
  const uint64_t v0 = c->hash()->Get("long")->version;
  auto keep = c->Execute(Op::Call("long", 102, "ab"));
  ASSERT_TRUE(keep.ok());
  EXPECT_EQ(keep->version, v0);
  auto refused = c->Execute(Op::Call("absent", 100, I64(2)));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("int64_mul"), std::string::npos);
  // Three update functions and two reductions.
  EXPECT_EQ(testing::StatOf(c.session.get(), "hash_op_functions"), 5u);
}

// Reductions the example library registered (200 sum_of_squares, 201
// l2_norm), by id, on the server whatever the client's reduce path; what is
// not registered, or not of the right kind or element type, is refused and
// changes nothing.
TEST_F(AtomicsTest, UserReductionsFromTheExampleLibrary) {
  // A client that would reduce built-ins here: user reductions still go to
  // the server (it counts them there).
  auto c = ConnectOps(server_.address, ReadPath::kAuto, ReadPath::kOneSided);
  ASSERT_TRUE(c.store);
  ASSERT_TRUE(c->VecPut("ints", std::vector<int64_t>{1, -2, 3}).ok());
  ASSERT_TRUE(c->VecPut("i32", std::vector<int32_t>{4, 5}).ok());
  ASSERT_TRUE(c->VecPut("reals", std::vector<double>{3, 4}).ok());
  ASSERT_TRUE(c->VecPut("floats", std::vector<float>{0.5f, 1.5f}).ok());
  ASSERT_TRUE(c->VecPut("empty", std::vector<int64_t>{}).ok());
  const uint64_t version = c->hash()->Get("ints")->version;

  auto sq = c->VecReduce("ints", uint32_t{200});
  ASSERT_TRUE(sq.ok()) << sq.status().ToString();
  EXPECT_EQ(std::get<int64_t>(*sq), 14);
  EXPECT_EQ(std::get<int64_t>(*c->VecReduce("i32", uint32_t{200})), 41);
  EXPECT_EQ(std::get<int64_t>(*c->VecReduce("empty", uint32_t{200})), 0);
  EXPECT_DOUBLE_EQ(std::get<double>(*c->VecReduce("reals", uint32_t{200})),
                   25.0);
  EXPECT_DOUBLE_EQ(std::get<double>(*c->VecReduce("reals", uint32_t{201})),
                   5.0);
  EXPECT_DOUBLE_EQ(std::get<double>(*c->VecReduce("floats", uint32_t{201})),
                   std::sqrt(2.5));
  EXPECT_EQ(c->reduce_stats().local, 0u);
  EXPECT_EQ(c->reduce_stats().server, 6u);
  // Through Execute: the reply is a one-element vector, as for built-ins.
  auto raw = c->Execute(Op::VecReduce("ints", 200));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(std::get<int64_t>(*raw->AsNumber()), 14);
  EXPECT_EQ(raw->version, version);  // a reduction writes nothing

  // Not registered: Unsupported naming the id; an update function's id is
  // not a reduction (nor the other way round).
  auto unknown = c->VecReduce("ints", uint32_t{999});
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("reduction with id 999"),
            std::string::npos)
      << unknown.status().ToString();
  auto update = c->VecReduce("ints", uint32_t{100});
  EXPECT_EQ(update.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(update.status().message().find("int64_mul"), std::string::npos)
      << update.status().ToString();
  auto call = c->Execute(Op::Call("ints", 200, ""));
  EXPECT_EQ(call.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(call.status().message().find("sum_of_squares"), std::string::npos)
      << call.status().ToString();
  EXPECT_EQ(c->VecReduce("ints", uint32_t{0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->VecReduce("ints", Reduction::kUser).status().code(),
            StatusCode::kInvalidArgument);

  // Type mismatch: l2_norm takes double and float vectors only; a scalar
  // is no vector; a refusal (overflow) is InvalidArgument too.
  auto ints = c->VecReduce("ints", uint32_t{201});
  EXPECT_EQ(ints.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ints.status().message().find("does not accept int64"),
            std::string::npos)
      << ints.status().ToString();
  ASSERT_TRUE(c->hash()->Put("scalar", I64(3)).ok());
  EXPECT_EQ(c->VecReduce("scalar", uint32_t{200}).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->VecPut("huge", std::vector<int64_t>{int64_t{1} << 40}).ok());
  auto refused = c->VecReduce("huge", uint32_t{200});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("refused"), std::string::npos);
  EXPECT_EQ(c->VecReduce("absent", uint32_t{200}).status().code(),
            StatusCode::kNotFound);
  auto after = c->hash()->Get("ints");
  EXPECT_EQ(after->version, version);

  // In a batch and asynchronously, each with its own outcome.
  auto rs =
      c->ExecuteBatch({Op::VecReduce("reals", 201), Op::VecReduce("ints", 201),
                       Op::VecReduce("ints", 200)});
  ASSERT_EQ(rs.size(), 3u);
  ASSERT_TRUE(rs[0].ok());
  EXPECT_DOUBLE_EQ(std::get<double>(*rs[0]->AsNumber()), 5.0);
  EXPECT_EQ(rs[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(std::get<int64_t>(*rs[2]->AsNumber()), 14);
  std::optional<Result<Number>> a, b;
  c->VecReduceAsync("i32", uint32_t{200},
                    [&](Result<Number> r) { a = std::move(r); });
  c->VecReduceAsync("i32", uint32_t{201},
                    [&](Result<Number> r) { b = std::move(r); });
  // WaitAll reports the first error among them: l2_norm's refusal.
  EXPECT_EQ(c.session->WaitAll().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.has_value() && b.has_value());
  ASSERT_TRUE(a->ok());
  EXPECT_EQ(std::get<int64_t>(**a), 41);
  EXPECT_EQ(b->status().code(), StatusCode::kInvalidArgument);
}

// A batch whose results together pass the largest reply (64 MiB): two
// filters of a 16 MiB vector, each about 32 MiB of indices, beside a write.
// The whole reply was refused by the client, every op ended OutOfMemory
// ("nothing changed"), and yet the write had taken effect (found by a
// black-box run). Now the server answers the reads that would pass the
// limit Busy and the client asks them again; the write's result arrives.
TEST(AtomicsBigReplies, ABatchWhoseResultsPassTheReplyLimitIsAnsweredWhole) {
  auto server = StartServer({}, "256M");
  ASSERT_NE(server.process, nullptr);
  auto c = ConnectOps(server.address);
  ASSERT_NE(c.store, nullptr);
  constexpr size_t kElems = (16u << 20) / sizeof(int32_t) - 4;  // 16 MiB
  {
    auto put = c.store->hash()->Put(
        "big", EncodeVector(std::vector<int32_t>(kElems, 7)));
    ASSERT_TRUE(put.ok()) << put.status().ToString();
  }
  auto check = [&](const std::vector<Result<OpReply>>& rs, int64_t counter) {
    ASSERT_EQ(rs.size(), 3u);
    ASSERT_TRUE(rs[0].ok()) << rs[0].status().ToString();
    EXPECT_EQ(*rs[0]->Int(), counter);
    for (size_t i = 1; i < 3; ++i) {
      ASSERT_TRUE(rs[i].ok()) << rs[i].status().ToString();
      auto v = DecodeVector(rs[i]->value);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      const auto* idx = std::get_if<std::vector<int64_t>>(&*v);
      ASSERT_NE(idx, nullptr);
      EXPECT_EQ(idx->size(), kElems);
    }
  };
  const std::vector<Op> batch = {
      Op::AddFetch("counter", 1, /*create=*/true),
      Op::VecFilter("big", Predicate::kEq, int64_t{7}, /*indices=*/true),
      Op::VecFilter("big", Predicate::kEq, int64_t{7}, /*indices=*/true)};
  check(c->ExecuteBatch(batch), 1);
  // Asynchronously: one message too (queued between two polls).
  std::vector<Result<OpReply>> rs(3, Status::Internal("unanswered"));
  for (size_t i = 0; i < 3; ++i) {
    c->ExecuteAsync(batch[i],
                    [&rs, i](Result<OpReply> r) { rs[i] = std::move(r); });
  }
  ASSERT_TRUE(c.session->WaitAll().ok());
  check(rs, 2);
  // Each write applied once.
  auto n = c->AddFetch("counter", 0);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->value, 2);
}

TEST(AtomicsStart, ALibraryThatFailsToLoadStopsTheServerWithAMessage) {
  for (const std::string& lib : {std::string("/nonexistent/libops.so"),
                                 std::string(REMEM_SERVER_BIN_PATH)}) {
    SpawnOptions o;
    o.argv = {REMEM_SERVER_BIN_PATH,
              "--listen",
              "127.0.0.1:0",
              "--memory",
              "16M",
              "--no-pin",
              "--ops-library",
              lib};
    o.merge_stderr = true;
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok());
    auto rc = (*p)->Wait(std::chrono::seconds(30));
    ASSERT_TRUE(rc.ok());
    EXPECT_NE(*rc, 0);
    ASSERT_TRUE((*p)->ReadToEnd(std::chrono::seconds(5)).ok());
    EXPECT_NE((*p)->output().find("--ops-library " + lib), std::string::npos)
        << (*p)->output();
    EXPECT_EQ((*p)->output().find("listening"), std::string::npos);
  }
  // The same library twice: its ids collide.
  SpawnOptions o;
  o.argv = {REMEM_SERVER_BIN_PATH,
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "16M",
            "--no-pin",
            "--ops-library",
            REMEM_EXAMPLE_OPS_LIB,
            "--ops-library",
            REMEM_EXAMPLE_OPS_LIB};
  o.merge_stderr = true;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok());
  auto rc = (*p)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(rc.ok());
  EXPECT_NE(*rc, 0);
  ASSERT_TRUE((*p)->ReadToEnd(std::chrono::seconds(5)).ok());
  EXPECT_NE((*p)->output().find("already registered"), std::string::npos)
      << (*p)->output();
}

// One batch of 100 fetch-adds on one key from one client: done in arrival
// order (old values 0..99), versions consecutive, and the bucket written
// once (the reservation station's write coalescing).
TEST_F(AtomicsTest, ABatchOnOneKeyIsForwardedInOrderAndWrittenOnce) {
  auto c = ConnectOps(server_.address);
  ASSERT_TRUE(c.store);
  const uint64_t writes0 = testing::StatOf(c.session.get(), "hash_op_writes");
  std::vector<Op> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(Op::FetchAdd("hot", 1, true));
  auto rs = c->ExecuteBatch(batch);
  ASSERT_EQ(rs.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(rs[i].ok()) << rs[i].status().ToString();
    EXPECT_EQ(*rs[i]->Int(), i);
    if (i > 0) {
      EXPECT_EQ(rs[i]->version, rs[i - 1]->version + 1);
    }
  }
  EXPECT_EQ(testing::StatOf(c.session.get(), "hash_op_writes") - writes0, 1u);
  auto g = c->hash()->Get("hot");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, I64(100));
  EXPECT_EQ(g->version, rs[99]->version);
  // Independent keys in the same batch: each written once.
  batch.clear();
  for (int i = 0; i < 64; ++i) {
    batch.push_back(Op::AddFetch("k" + std::to_string(i % 8), 1, true));
  }
  const uint64_t writes1 = testing::StatOf(c.session.get(), "hash_op_writes");
  rs = c->ExecuteBatch(batch);
  for (auto& r : rs) ASSERT_TRUE(r.ok());
  EXPECT_EQ(testing::StatOf(c.session.get(), "hash_op_writes") - writes1, 8u);
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(c->hash()->Get("k" + std::to_string(k))->value, I64(8));
  }
}

using History = std::map<std::string, std::vector<KvOp>>;

// Creates the counters hot0 .. hot<keys-1> at 0, then starts atomics_child
// processes on them, one per mode; each has connected when this returns.
void SpawnChildren(const std::string& address,
                   const std::vector<std::string>& modes, int keys, int ops,
                   std::vector<std::unique_ptr<Subprocess>>* children) {
  {
    auto c = ConnectOps(address);
    ASSERT_TRUE(c.store);
    for (int k = 0; k < keys; ++k) {
      ASSERT_TRUE(c->hash()->Put("hot" + std::to_string(k), I64(0)).ok());
    }
  }
  int seed = 1;
  for (const std::string& mode : modes) {
    SpawnOptions o;
    o.argv = {REMEM_ATOMICS_CHILD_BIN,
              address,
              std::string(TransportName(TestTransport())),
              mode,
              std::to_string(keys),
              std::to_string(ops),
              std::to_string(seed++)};
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE((*p)->WaitForLine("READY", std::chrono::seconds(60)).ok());
    children->push_back(std::move(*p));
  }
}

// Waits for the children and adds their history lines (clients 1, 2, ...)
// to `history` and their deltas to `sum`.
void CollectHistories(std::vector<std::unique_ptr<Subprocess>>* children,
                      int ops, History* history,
                      std::map<std::string, int64_t>* sum) {
  int client = 1;
  for (auto& p : *children) {
    auto rc = p->Wait(std::chrono::seconds(120));
    ASSERT_TRUE(rc.ok());
    ASSERT_TRUE(p->ReadToEnd(std::chrono::seconds(10)).ok());
    EXPECT_EQ(*rc, 0) << p->output();
    std::istringstream in(p->output());
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      if (line.rfind("H ", 0) != 0) continue;
      char key[64];
      unsigned long long call, ret, version;
      long long old, delta;
      ASSERT_EQ(std::sscanf(line.c_str(), "H %63s %llu %llu %lld %llu %lld",
                            key, &call, &ret, &old, &version, &delta),
                6)
          << line;
      KvOp op;
      op.kind = KvOp::kReadModifyWrite;
      op.call_ns = call;
      op.return_ns = ret;
      op.found = true;
      op.read_value = std::to_string(old);
      op.value = std::to_string(old + delta);
      op.version = version;
      op.client = client;
      (*history)[key].push_back(op);
      (*sum)[key] += delta;
      ++lines;
    }
    EXPECT_EQ(lines, ops);
    ++client;
  }
}

// Every key ends at the sum of its deltas, and each key's history is
// linearizable (the keys started at 0).
void CheckSumsAndHistories(const std::string& address, const History& history,
                           const std::map<std::string, int64_t>& sum) {
  auto c = ConnectOps(address);
  ASSERT_TRUE(c.store);
  uint64_t checked = 0;
  for (const auto& [key, ops] : history) {
    auto g = c->hash()->Get(key);
    ASSERT_TRUE(g.ok());
    ASSERT_EQ(g->value.size(), 8u);
    EXPECT_EQ(ops::LoadI64(g->value.data()), sum.at(key)) << key;
    auto r = testing::CheckKeyHistory(ops, true, "0");
    EXPECT_TRUE(r.linearizable) << key << ": " << r.explanation;
    checked += ops.size();
  }
  std::printf("%s: %llu operations on %zu keys checked linearizable\n",
              std::string(TransportName(TestTransport())).c_str(),
              static_cast<unsigned long long>(checked), history.size());
}

// Child processes (sync, async and batched) and a thread here hammer three
// hot keys with fetch-adds while the thread also reads them one-sided.
// Every key ends at the sum of the acknowledged deltas, and each key's
// recorded history (fetch-adds as read-modify-writes, gets) is
// linearizable.
TEST_F(AtomicsTest, ConcurrentIncrementsSumExactlyAndAreLinearizable) {
  constexpr int kKeys = 3;
  const int kOps = testing::Scaled(400, 100);
  std::vector<std::unique_ptr<Subprocess>> children;
  SpawnChildren(server_.address, {"sync", "async", "batch", "async"}, kKeys,
                kOps, &children);
  ASSERT_FALSE(HasFatalFailure());
  History history;
  std::map<std::string, int64_t> sum;
  // This process: fetch-adds and one-sided gets, alternating.
  {
    auto c = ConnectOps(server_.address, ReadPath::kOneSided);
    ASSERT_TRUE(c.store);
    std::mt19937_64 rng(99);
    for (int i = 0; i < kOps; ++i) {
      const std::string key = "hot" + std::to_string(rng() % kKeys);
      KvOp op;
      op.call_ns = testing::NowNs();
      if (i % 2 == 0) {
        const int64_t d = 1 + int64_t(rng() % 3);
        auto r = c->FetchAdd(key, d, true);
        op.return_ns = testing::NowNs();
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        op.kind = KvOp::kReadModifyWrite;
        op.found = true;
        op.read_value = std::to_string(r->value);
        op.value = std::to_string(r->value + d);
        op.version = r->version;
        sum[key] += d;
      } else {
        auto g = c->hash()->Get(key);
        op.return_ns = testing::NowNs();
        op.kind = KvOp::kGet;
        op.found = g.ok();
        if (g.ok()) {
          ASSERT_EQ(g->value.size(), 8u);
          op.read_value = std::to_string(ops::LoadI64(g->value.data()));
          op.version = g->version;
        } else {
          ASSERT_EQ(g.status().code(), StatusCode::kNotFound);
        }
      }
      op.client = 0;
      history[key].push_back(op);
    }
  }
  CollectHistories(&children, kOps, &history, &sum);
  ASSERT_FALSE(HasFatalFailure());
  CheckSumsAndHistories(server_.address, history, sum);
}

// The typed async helpers (FetchAddAsync, AddFetchAsync) from three child
// processes, each with a window of 16 in flight, on three hot keys: every
// key ends at the exact sum of the acknowledged deltas, and each key's
// history is linearizable. Here, each of the other async helpers agrees
// with its synchronous twin.
TEST_F(AtomicsTest, TypedAsyncHelpersFromSeveralProcessesSumExactly) {
  constexpr int kKeys = 3;
  const int kOps = testing::Scaled(400, 100);
  std::vector<std::unique_ptr<Subprocess>> children;
  SpawnChildren(server_.address, {"typed", "typed", "typed"}, kKeys, kOps,
                &children);
  ASSERT_FALSE(HasFatalFailure());
  History history;
  std::map<std::string, int64_t> sum;
  {
    auto c = ConnectOps(server_.address);
    ASSERT_TRUE(c.store);
    int done = 0;
    std::optional<Result<OpReply>> cas;
    std::optional<Result<IntReply>> app;
    std::optional<Result<uint64_t>> put, upd;
    std::optional<Result<OpsStore::VectorValue>> got;
    std::optional<Result<VectorData>> filtered;
    std::optional<Result<Number>> reduced;
    c->CompareSwapAsync(
        "cas", "", "first",
        [&](Result<OpReply> r) {
          cas = std::move(r);
          ++done;
        },
        /*create=*/true);
    c->AppendAsync(
        "log", "ab",
        [&](Result<IntReply> r) {
          app = std::move(r);
          ++done;
        },
        /*create=*/true);
    c->VecPutAsync("v", std::vector<int64_t>{1, 2, 3}, [&](Result<uint64_t> r) {
      put = std::move(r);
      ++done;
    });
    ASSERT_TRUE(c.session->WaitAll().ok());
    // Issued together, done in issue order on the key.
    c->VecUpdateAsync("v", VecFn::kMul, Number(int64_t{10}),
                      [&](Result<uint64_t> r) {
                        upd = std::move(r);
                        ++done;
                      });
    c->VecFilterAsync("v", Predicate::kGe, Number(int64_t{20}),
                      [&](Result<VectorData> r) {
                        filtered = std::move(r);
                        ++done;
                      });
    c->VecReduceAsync("v", Reduction::kSum, [&](Result<Number> r) {
      reduced = std::move(r);
      ++done;
    });
    ASSERT_TRUE(c.session->WaitAll().ok());
    c->VecGetAsync("v", [&](Result<OpsStore::VectorValue> r) {
      got = std::move(r);
      ++done;
    });
    ASSERT_TRUE(c.session->WaitAll().ok());
    ASSERT_EQ(done, 7);
    ASSERT_TRUE(cas->ok()) << cas->status().ToString();
    EXPECT_TRUE((*cas)->applied);
    EXPECT_EQ(c->hash()->Get("cas")->value, "first");
    auto miss = c->CompareSwap("cas", "other", "second");
    ASSERT_TRUE(miss.ok());
    EXPECT_FALSE(miss->applied);
    EXPECT_EQ(miss->value, "first");
    ASSERT_TRUE(app->ok());
    EXPECT_EQ((*app)->value, 2);
    EXPECT_EQ(c->Append("log", "cd")->value, 4);
    ASSERT_TRUE(put->ok() && upd->ok());
    EXPECT_GT(**upd, **put);
    ASSERT_TRUE(filtered->ok());
    EXPECT_EQ(std::get<0>(**filtered), (std::vector<int64_t>{20, 30}));
    ASSERT_TRUE(reduced->ok());
    EXPECT_EQ(std::get<int64_t>(**reduced), 60);
    ASSERT_TRUE(got->ok());
    EXPECT_EQ(std::get<0>((*got)->data), (std::vector<int64_t>{10, 20, 30}));
    EXPECT_EQ((*got)->version, **upd);
    // Errors reach the typed callback as the synchronous twin returns them.
    std::optional<Result<IntReply>> bad;
    c->FetchAddAsync("cas", 1, [&](Result<IntReply> r) { bad = std::move(r); });
    EXPECT_EQ(c.session->WaitAll().code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(bad.has_value());
    EXPECT_EQ(bad->status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c->FetchAdd("cas", 1).status().code(),
              StatusCode::kInvalidArgument);
  }
  CollectHistories(&children, kOps, &history, &sum);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(history.size(), size_t{kKeys});
  CheckSumsAndHistories(server_.address, history, sum);
}

TEST_F(AtomicsTest, VectorOperationsAgreeWithALocalModelOnBothReducePaths) {
  auto server_side =
      ConnectOps(server_.address, ReadPath::kAuto, ReadPath::kRpc);
  auto client_side =
      ConnectOps(server_.address, ReadPath::kAuto, ReadPath::kOneSided);
  ASSERT_TRUE(server_side.store && client_side.store);
  OpsStore& s = *server_side.store;
  ASSERT_TRUE(s.VecPut("vi", std::vector<int64_t>{1, 2, 3, 4}).ok());
  ASSERT_TRUE(s.Execute(Op::VecUpdate("vi", VecFn::kMul, int64_t{3})).ok());
  ASSERT_TRUE(
      s.Execute(Op::VecUpdate("vi", VecFn::kAdd,
                              VectorData(std::vector<int64_t>{10, 20, 30, 40})))
          .ok());
  auto vi = s.VecGet("vi");
  ASSERT_TRUE(vi.ok());
  EXPECT_EQ(std::get<0>(vi->data), (std::vector<int64_t>{13, 26, 39, 52}));
  for (OpsStore* st : {server_side.store.get(), client_side.store.get()}) {
    EXPECT_EQ(std::get<int64_t>(*st->VecReduce("vi", Reduction::kSum)), 130);
    EXPECT_EQ(std::get<int64_t>(*st->VecReduce("vi", Reduction::kMax)), 52);
    EXPECT_EQ(std::get<int64_t>(*st->VecReduce("vi", Reduction::kCount)), 4);
  }
  // The adaptive path: both paths measured (it alternates while warming
  // up), every answer right whichever it took.
  auto adaptive = ConnectOps(server_.address, ReadPath::kAuto, ReadPath::kAuto);
  ASSERT_TRUE(adaptive.store);
  for (int i = 0; i < 40; ++i) {
    auto sum = adaptive->VecReduce("vi", Reduction::kSum);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(std::get<int64_t>(*sum), 130);
  }
  const auto rs = adaptive->reduce_stats();
  EXPECT_EQ(rs.local + rs.server, 40u);
  EXPECT_GT(rs.local, 0u);
  EXPECT_GT(rs.server, 0u);
  EXPECT_GT(rs.local_estimate_us, 0.0);
  EXPECT_GT(rs.server_estimate_us, 0.0);
  EXPECT_EQ(server_side->reduce_stats().local, 0u);
  EXPECT_EQ(client_side->reduce_stats().server, 0u);

  auto idx = s.VecFilter("vi", Predicate::kGt, int64_t{30}, true);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(std::get<0>(*idx), (std::vector<int64_t>{2, 3}));

  ASSERT_TRUE(s.VecPut("vf", std::vector<float>{0.5f, -1.5f, 2.0f}).ok());
  ASSERT_TRUE(s.Execute(Op::VecUpdate("vf", VecFn::kMax, 0.0)).ok());
  for (OpsStore* st : {server_side.store.get(), client_side.store.get()}) {
    EXPECT_DOUBLE_EQ(std::get<double>(*st->VecReduce("vf", Reduction::kSum)),
                     2.5);
  }
  auto pos = s.VecFilter("vf", Predicate::kGt, 0.25);
  ASSERT_TRUE(pos.ok());
  EXPECT_EQ(std::get<2>(*pos), (std::vector<float>{0.5f, 2.0f}));

  ASSERT_TRUE(s.VecPut("v32", std::vector<int32_t>{2147483000, 1}).ok());
  auto over = s.Execute(Op::VecUpdate("v32", VecFn::kAdd, int64_t{1000}));
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(std::get<3>(s.VecGet("v32")->data),
            (std::vector<int32_t>{2147483000, 1}));
  ASSERT_TRUE(s.VecPut("vd", std::vector<double>{}).ok());
  EXPECT_EQ(s.VecReduce("vd", Reduction::kMin).status().code(),
            StatusCode::kInvalidArgument);

  // NaN propagates through min and max, first or not, on both paths and
  // in elementwise updates.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_TRUE(s.VecPut("nan0", std::vector<double>{nan, 1, 2}).ok());
  ASSERT_TRUE(s.VecPut("nan1", std::vector<double>{1, nan, 2}).ok());
  ASSERT_TRUE(s.VecPut("nanf", std::vector<float>{1, 2, float(nan)}).ok());
  for (OpsStore* st : {server_side.store.get(), client_side.store.get()}) {
    for (const char* key : {"nan0", "nan1", "nanf"}) {
      for (Reduction r : {Reduction::kMin, Reduction::kMax}) {
        auto got = st->VecReduce(key, r);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_TRUE(std::isnan(std::get<double>(*got))) << key << int(r);
      }
    }
  }
  ASSERT_TRUE(s.Execute(Op::VecUpdate("nan1", VecFn::kMin, 1.5)).ok());
  std::vector<double> got = std::get<1>(s.VecGet("nan1")->data);
  EXPECT_EQ(got[0], 1.0);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], 1.5);
  ASSERT_TRUE(s.Execute(Op::VecUpdate("nan1", VecFn::kMax, nan)).ok());
  got = std::get<1>(s.VecGet("nan1")->data);
  ASSERT_EQ(got.size(), 3u);
  for (double x : got) EXPECT_TRUE(std::isnan(x));
}

// A writer here adds 1 to every element of vectors (one inline, one in an
// extent) over and over, while readers in other threads, each with its own
// session, read them one-sided: every vector read must have all elements
// equal (a half-applied update would show two values), and never go back.
TEST_F(AtomicsTest, VectorUpdatesNeverShowAHalfUpdatedVectorToReaders) {
  const std::vector<std::pair<std::string, size_t>> vecs = {{"small", 4},
                                                            {"large", 2048}};
  {
    auto c = ConnectOps(server_.address);
    ASSERT_TRUE(c.store);
    for (auto& [k, n] : vecs) {
      ASSERT_TRUE(c->VecPut(k, std::vector<int64_t>(n, 0)).ok());
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      auto c =
          testing::ConnectHashOrDie(server_.address, "", ReadPath::kOneSided);
      if (!c) return;
      std::vector<int64_t> last(vecs.size(), 0);
      while (!stop.load()) {
        for (size_t i = 0; i < vecs.size(); ++i) {
          auto g = c->Get(vecs[i].first);
          auto v =
              g.ok() ? DecodeVector(g->value) : Result<VectorData>(g.status());
          if (!v.ok()) {
            ++bad;
            continue;
          }
          const auto& e = std::get<0>(*v);
          bool same = e.size() == vecs[i].second;
          for (int64_t x : e) same = same && x == e[0];
          if (!same || e[0] < last[i]) ++bad;
          last[i] = e.empty() ? 0 : e[0];
          ++reads;
        }
        if (r == 1) std::this_thread::yield();
      }
    });
  }
  auto w = ConnectOps(server_.address);
  ASSERT_TRUE(w.store);
  // Volume, not coverage (REMEM_TEST_SCALE under the sanitizers).
  const int kUpdates = testing::Scaled(2000, 200);
  for (int i = 0; i < kUpdates; ++i) {
    for (auto& [k, n] : vecs) {
      if (i % 2 == 0) {
        ASSERT_TRUE(w->Execute(Op::VecUpdate(k, VecFn::kAdd, int64_t{1})).ok());
      } else {
        // Batched: two updates of one key forwarded and written once.
        auto rs = w->ExecuteBatch({Op::VecUpdate(k, VecFn::kAdd, int64_t{1}),
                                   Op::VecReduce(k, Reduction::kMin)});
        ASSERT_TRUE(rs[0].ok() && rs[1].ok());
        EXPECT_EQ(std::get<int64_t>(*rs[1]->AsNumber()), i + 1);
      }
    }
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(reads.load(), 0u);
  for (auto& [k, n] : vecs) {
    auto v = w->VecGet(k);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(std::get<0>(v->data), std::vector<int64_t>(n, kUpdates));
  }
  std::printf("%llu one-sided vector reads racing %d updates: %llu bad\n",
              static_cast<unsigned long long>(reads.load()), 2 * kUpdates,
              static_cast<unsigned long long>(bad.load()));
}

TEST_F(AtomicsTest, TheCliIncrementsAndOperatesOnVectors) {
  auto cli = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {
        testing::CliBinary(), "-s", server_.address, "--transport",
        std::string(TransportName(TestTransport()))};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(argv);
  };
  auto r = cli({"incr", "visits"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "1\n");
  r = cli({"--json", "incr", "visits", "41"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("{\"value\":42,\"version\":", 0), 0u) << r.out;
  EXPECT_EQ(cli({"put", "name", "remem"}).exit_code, 0);
  EXPECT_EQ(cli({"incr", "name"}).exit_code, 2);  // not an integer
  // Amounts are decimal int64s: past the range, or in another base, they
  // are refused (CLI11 clamped them, and read 0x10 as 16), nothing added.
  for (const char* bad : {"9223372036854775808", "-9223372036854775809",
                          "99999999999999999999", "0x10", "1.5", ""}) {
    EXPECT_EQ(cli({"incr", "visits", "--", bad}).exit_code, 2) << bad;
  }
  r = cli({"incr", "visits", "--", "-2"});
  EXPECT_EQ(r.out, "40\n");

  EXPECT_EQ(cli({"vec", "put", "v", "--type", "int32", "1,2,3"}).exit_code, 0);
  EXPECT_EQ(cli({"vec", "update", "v", "mul", "5"}).exit_code, 0);
  r = cli({"--json", "vec", "reduce", "v", "sum"});
  EXPECT_EQ(r.out, "{\"sum\":30}\n");
  r = cli({"--json", "vec", "get", "v"});
  EXPECT_NE(r.out.find("\"elements\":[5,10,15]"), std::string::npos) << r.out;
  r = cli({"vec", "filter", "v", "ge", "10", "--indices"});
  EXPECT_EQ(r.out, "1 2\n");
  EXPECT_EQ(cli({"vec", "update", "v", "add", "2147483647"}).exit_code, 6);
  EXPECT_EQ(cli({"vec", "reduce", "name", "sum"}).exit_code, 2);
  // A user reduction by id (the example library's sum_of_squares and
  // l2_norm); an unknown id exits 1 naming it, a type it does not take 2,
  // a name that is neither a built-in nor an id 2.
  r = cli({"--json", "vec", "reduce", "v", "200"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "{\"200\":350}\n");
  EXPECT_EQ(cli({"vec", "put", "d", "--type", "double", "3,4"}).exit_code, 0);
  r = cli({"vec", "reduce", "d", "201"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "5\n");
  r = cli({"vec", "reduce", "v", "999"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("id 999"), std::string::npos) << r.out;
  EXPECT_EQ(cli({"vec", "reduce", "v", "201"}).exit_code, 2);
  EXPECT_EQ(cli({"vec", "reduce", "v", "median"}).exit_code, 2);
  EXPECT_EQ(cli({"vec", "reduce", "v", "0"}).exit_code, 2);
  // An empty element is refused, not skipped.
  EXPECT_EQ(cli({"vec", "put", "w", "1,,3"}).exit_code, 2);
  EXPECT_EQ(cli({"vec", "put", "w", ","}).exit_code, 2);
  EXPECT_EQ(cli({"vec", "update", "v", "add", "1,,2"}).exit_code, 2);
  // A float vector's operand is rounded to float as its elements were:
  // eq 0.1 finds the 0.1 stored.
  EXPECT_EQ(cli({"vec", "put", "f", "--type", "float", "0.1", "0.5", "1e-50"})
                .exit_code,
            0);
  r = cli({"vec", "filter", "f", "eq", "0.1", "--indices"});
  EXPECT_EQ(r.out, "0\n");
  r = cli({"vec", "filter", "f", "le", "0.1", "--indices"});
  EXPECT_EQ(r.out, "0 2\n");
  // Elements print as the float stored: 0.1, not 0.10000000149011612.
  r = cli({"vec", "get", "f"});
  EXPECT_EQ(r.out, "0.1 0.5 0\n");
  r = cli({"--json", "vec", "filter", "f", "le", "0.5"});
  EXPECT_NE(r.out.find("[0.1,0.5,0]"), std::string::npos) << r.out;
  EXPECT_EQ(cli({"vec", "put", "g", "--type", "double", "0.1,2.5"}).exit_code,
            0);
  EXPECT_EQ(cli({"vec", "get", "g"}).out, "0.1 2.5\n");
  // A subnormal double is a number; an overflowing one is not.
  EXPECT_EQ(cli({"vec", "put", "s", "--type", "double", "4.9e-324"}).exit_code,
            0);
  r = cli({"vec", "put", "s", "--type", "double", "1e999"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("'1e999' does not fit a double"), std::string::npos)
      << r.out;
  r = cli({"vec", "put", "s", "--type", "int64", "99999999999999999999"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("does not fit an int64"), std::string::npos) << r.out;
  // JSON has no NaN or infinities: they are strings, as in protobuf's JSON.
  EXPECT_EQ(cli({"vec", "put", "n", "--type", "double", "--", "1.5", "nan",
                 "inf", "-inf"})
                .exit_code,
            0);
  r = cli({"--json", "vec", "get", "n"});
  EXPECT_NE(r.out.find("\"elements\":[1.5,\"NaN\",\"Infinity\",\"-Infinity\"]"),
            std::string::npos)
      << r.out;
  r = cli({"--json", "vec", "reduce", "n", "sum"});
  EXPECT_EQ(r.out, "{\"sum\":\"NaN\"}\n");
}

TEST(AtomicsDurability, AtomicsAreLoggedAndSurviveAKill) {
  std::string dir = (fs::temp_directory_path() / "remem-ops-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::vector<std::string> flags = {"--data-dir", dir,         "--fsync",
                                          "always",     "--threads", "2"};
  auto server = StartServer(flags);
  ASSERT_TRUE(server.process);
  {
    auto c = ConnectOps(server.address);
    ASSERT_TRUE(c.store);
    for (int i = 0; i < 50; ++i) {
      c->ExecuteAsync(Op::FetchAdd("ctr" + std::to_string(i % 5), 2, true),
                      [](Result<OpReply> r) { EXPECT_TRUE(r.ok()); });
    }
    ASSERT_TRUE(c.session->WaitAll().ok());
    ASSERT_TRUE(c->VecPut("vec", std::vector<double>{1.0, 2.0}).ok());
    ASSERT_TRUE(c->Execute(Op::VecUpdate("vec", VecFn::kMul, 4.0)).ok());
    ASSERT_TRUE(c->Execute(Op::Append("log", "ab", true)).ok());
  }
  ASSERT_TRUE(server.process->Signal(SIGKILL).ok());
  (void)server.process->Wait(std::chrono::seconds(10));
  auto again = StartServer(flags);
  ASSERT_TRUE(again.process);
  auto c = ConnectOps(again.address);
  ASSERT_TRUE(c.store);
  for (int k = 0; k < 5; ++k) {
    auto g = c->hash()->Get("ctr" + std::to_string(k));
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->value, I64(20));
  }
  EXPECT_EQ(std::get<1>(c->VecGet("vec")->data),
            (std::vector<double>{4.0, 8.0}));
  EXPECT_EQ(c->hash()->Get("log")->value, "ab");
  // Versions keep growing after recovery.
  auto before = c->hash()->Get("ctr0")->version;
  auto next = c->AddFetch("ctr0", 1);
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->version, before);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem
