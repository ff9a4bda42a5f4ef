// Namespaces of raw remote memory (remem/space.h) end to end: the real
// remem-server, clients in this process and in child processes
// (space_child), over the test transport (shm and tcp).

#include "remem/space.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/session_core.h"
#include "remem/session.h"
#include "space/wire.h"
#include "test_util.h"
#include "util/subprocess.h"

namespace remem {
namespace {

using testing::StartServer;
using testing::StatOf;
using testing::TestTransport;

constexpr uint64_t kChunk = 4096;
constexpr uint64_t kBlock = 1000;  // as space_child.cc

std::unique_ptr<Namespace> CreateOrDie(Session* s, const std::string& name) {
  auto ns = Namespace::Create(s, name);
  EXPECT_TRUE(ns.ok()) << ns.status().ToString();
  return ns.ok() ? std::move(*ns) : nullptr;
}

class SpaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 4 MiB of namespace memory in 4 KiB chunks: segments straddle chunks.
    server_ = StartServer(
        {"--threads", "2", "--space-memory", "4M", "--space-chunk", "4K"},
        "32M");
    ASSERT_NE(server_.process, nullptr);
  }
  std::unique_ptr<Subprocess> Child(const std::vector<std::string>& args,
                                    bool wait_ready = true) {
    SpawnOptions o;
    o.argv = {REMEM_SPACE_CHILD_BIN, server_.address,
              std::string(TransportName(TestTransport()))};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    if (wait_ready) {
      auto line = (*p)->WaitForLine("READY", std::chrono::seconds(60));
      EXPECT_TRUE(line.ok()) << (*p)->output();
    }
    return std::move(*p);
  }
  // Makes a segment of `bytes` in `ns` whose chunks are not contiguous in
  // server memory: one chunk freed ahead of the pool's next ones.
  Segment FragmentedSegment(Namespace* ns, uint64_t bytes) {
    auto a = ns->Alloc(kChunk);
    auto b = ns->Alloc(kChunk);
    EXPECT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(ns->Free(a->address).ok());
    auto s = ns->Alloc(bytes);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : Segment{};
  }
  testing::ServerProcess server_;
};

TEST_F(SpaceTest, ANamespaceIsCreatedAllocatedMappedWrittenAndRead) {
  auto s1 = testing::ConnectOrDie(server_.address);
  auto s2 = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s1 && s2);
  auto ns = CreateOrDie(s1.get(), "graph");
  ASSERT_TRUE(ns);
  ASSERT_TRUE(ns->Reserve(64 * kChunk).ok());
  const Segment seg = FragmentedSegment(ns.get(), 5 * kChunk + 123);
  EXPECT_EQ(seg.length, 5 * kChunk + 123);
  // The one-chunk segment FragmentedSegment left sits between seg's first
  // chunk and the rest: fill it, and check below that seg's writes did not
  // land in it.
  auto first = ns->Segments();
  ASSERT_TRUE(first.ok() && first->size() == 2);
  auto neighbour = ns->Map(first->front());
  ASSERT_TRUE(neighbour.ok());
  const std::vector<uint8_t> fence(kChunk, 0xC3);
  ASSERT_TRUE((*neighbour)->Write(0, fence.data(), fence.size()).ok());
  auto map = ns->Map(seg);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  // New memory is zeroed.
  std::vector<uint8_t> got(seg.length, 0xFF);
  ASSERT_TRUE((*map)->Read(0, got.data(), got.size()).ok());
  EXPECT_TRUE(
      std::all_of(got.begin(), got.end(), [](uint8_t c) { return c == 0; }));
  std::vector<uint8_t> data(seg.length);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 7 + 3);
  ASSERT_TRUE((*map)->Write(0, data.data(), data.size()).ok());

  // Another client opens it by name and reads what was written, across the
  // chunk that is elsewhere in server memory, whole and in part.
  auto other = Namespace::Open(s2.get(), "graph");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->id(), ns->id());
  auto segs = (*other)->Segments();
  ASSERT_TRUE(segs.ok());
  ASSERT_EQ(segs->size(), 2u);  // the helper's second chunk, and seg
  EXPECT_EQ(segs->back().address, seg.address);
  auto part = (*other)->Map(seg.address + kChunk - 10, 3 * kChunk);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  std::vector<uint8_t> mid(3 * kChunk);
  ASSERT_TRUE((*part)->Read(0, mid.data(), mid.size()).ok());
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + kChunk - 10));
  // Asynchronous reads and writes, across the same boundary.
  std::vector<uint8_t> patch(100, 0x5A), back(100);
  Status wst = Status::Internal("no callback"), rst = wst;
  (*part)->WriteAsync(0, patch.data(), patch.size(),
                      [&](Status st) { wst = st; });
  ASSERT_TRUE(s2->WaitAll().ok());
  (*map)->ReadAsync(kChunk - 10, back.data(), back.size(),
                    [&](Status st) { rst = st; });
  ASSERT_TRUE(s1->WaitAll().ok());
  EXPECT_TRUE(wst.ok()) << wst.ToString();
  EXPECT_TRUE(rst.ok()) << rst.ToString();
  EXPECT_EQ(back, patch);
  std::vector<uint8_t> fence_now(kChunk);
  ASSERT_TRUE((*neighbour)->Read(0, fence_now.data(), kChunk).ok());
  EXPECT_EQ(fence_now, fence);

  // Atomics on aligned words of the namespace.
  auto cas = (*map)->CompareAndSwap(8, 0, 42);
  ASSERT_TRUE(cas.ok()) << cas.status().ToString();
  EXPECT_NE(*cas, 42u);
  uint64_t word = 0;
  std::memcpy(&word, data.data() + 8, 8);
  EXPECT_EQ(*cas, word);  // the old value, and nothing swapped
  auto cas2 = (*map)->CompareAndSwap(8, word, 42);
  ASSERT_TRUE(cas2.ok());
  // `part` starts 10 bytes before a chunk: its offset 2 is aligned in the
  // namespace, its offset 0 is not.
  EXPECT_EQ((*part)->FetchAdd(0, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*part)->FetchAdd(2, 0).ok());
  auto fa2 = (*map)->FetchAdd(8, 8);
  ASSERT_TRUE(fa2.ok());
  EXPECT_EQ(*fa2, 42u);
  EXPECT_EQ((*map)->FetchAdd(8, 0).value(), 50u);

  auto info = ns->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->segments, 2u);
  EXPECT_EQ(info->allocated_bytes, 7 * kChunk);
  EXPECT_EQ(info->reserved_bytes, 64 * kChunk - 7 * kChunk);
  EXPECT_EQ(info->chunk_bytes, kChunk);
  auto list = Namespace::List(s2.get());
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "graph");
  EXPECT_EQ(StatOf(s1.get(), "space_namespaces"), 1u);
  EXPECT_EQ(StatOf(s1.get(), "space_maps"), 3u);
  EXPECT_EQ(StatOf(s1.get(), "space_bytes_total"), 4u << 20);
  part->reset();
  map->reset();
  neighbour->reset();
  other->reset();
  ASSERT_TRUE(Namespace::Delete(s1.get(), "graph").ok());
  EXPECT_EQ(ns->Info().status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(s1->WaitAll().ok());
  EXPECT_EQ(testing::WaitForStatOf(s1.get(), "space_bytes_free", 4u << 20,
                                   std::chrono::seconds(10)),
            4u << 20);
}

TEST_F(SpaceTest, BadInputGetsClearErrorsAndChangesNothing) {
  auto s = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s);
  EXPECT_EQ(Namespace::Create(s.get(), "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Namespace::Create(s.get(), "a b").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Namespace::Create(s.get(), std::string(256, 'n')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Namespace::Open(s.get(), "absent").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(Namespace::Delete(s.get(), "absent").code(), StatusCode::kNotFound);
  auto ns = CreateOrDie(s.get(), "n");
  ASSERT_TRUE(ns);
  EXPECT_EQ(Namespace::Create(s.get(), "n").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(ns->Alloc(0).status().code(), StatusCode::kInvalidArgument);
  // More than the server has: refused whole, nothing taken.
  auto huge = ns->Alloc((4u << 20) + 1);
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(huge.status().message().find("--space-memory"), std::string::npos)
      << huge.status().ToString();
  EXPECT_EQ(ns->Reserve(5u << 20).code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(StatOf(s.get(), "space_bytes_free"), 4u << 20);
  auto all = ns->Alloc(4u << 20);  // exactly all of it
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(ns->Alloc(1).status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(ns->Free(all->address + 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(ns->Map(all->address, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ns->Map(all->address + 10, all->length).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ns->Map(all->address + all->length, 1).status().code(),
            StatusCode::kNotFound);
  auto m = ns->Map(all->address, 64);
  ASSERT_TRUE(m.ok());
  char buf[65];
  EXPECT_EQ((*m)->Read(1, buf, 64).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->Write(UINT64_MAX, buf, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->FetchAdd(4, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*m)->FetchAdd(60, 1).status().code(),
            StatusCode::kInvalidArgument);  // runs past the mapping
  Status async_st;
  (*m)->ReadAsync(60, buf, 8, [&](Status st) { async_st = st; });
  EXPECT_EQ(s->WaitAll().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(async_st.code(), StatusCode::kInvalidArgument);
  // Malformed requests, as a hostile client sends them: refused, and the
  // server goes on.
  client::SessionCore* core = s->core();
  for (const std::string& junk :
       {std::string(), std::string(39, 'x'), std::string(40, '\0'),
        std::string(400, '\xff')}) {
    auto r = core->CallSync(space::kSpaceService,
                            space::MethodId(space::SpaceMethod::kAlloc), junk);
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError)
        << r.status().ToString();
  }
  auto r = core->CallSync(space::kSpaceService, 200, std::string(40, '\0'));
  EXPECT_FALSE(r.ok());
  auto info = ns->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->segments, 1u);
}

// The rule one-sided writers rely on: a freed segment's memory goes to no
// other segment while another client still maps it.
TEST_F(SpaceTest, FreedMemoryIsNotReusedWhileAnotherClientMapsIt) {
  auto a = testing::ConnectOrDie(server_.address);
  auto b = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(a && b);
  auto ns_a = CreateOrDie(a.get(), "shared");
  ASSERT_TRUE(ns_a);
  auto seg = ns_a->Alloc(4u << 20);  // all of the server's namespace memory
  ASSERT_TRUE(seg.ok());
  auto map_a = ns_a->Map(*seg);
  ASSERT_TRUE(map_a.ok());
  const std::vector<uint8_t> mine(4096, 0xA1);
  ASSERT_TRUE((*map_a)->Write(0, mine.data(), mine.size()).ok());

  auto ns_b = Namespace::Open(b.get(), "shared");
  ASSERT_TRUE(ns_b.ok());
  ASSERT_TRUE((*ns_b)->Free(seg->address).ok());
  // B cannot have A's memory while A maps it ...
  EXPECT_EQ((*ns_b)->Alloc(4096).status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(StatOf(b.get(), "space_bytes_held"), 4u << 20);
  // ... and A goes on using it undisturbed.
  std::vector<uint8_t> got(4096);
  ASSERT_TRUE((*map_a)->Read(0, got.data(), got.size()).ok());
  EXPECT_EQ(got, mine);
  // Once A unmaps, it is B's, zeroed.
  map_a->reset();
  ASSERT_TRUE(a->WaitAll().ok());
  auto again = (*ns_b)->Alloc(4096);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto map_b = (*ns_b)->Map(*again);
  ASSERT_TRUE(map_b.ok());
  ASSERT_TRUE((*map_b)->Read(0, got.data(), got.size()).ok());
  EXPECT_TRUE(
      std::all_of(got.begin(), got.end(), [](uint8_t c) { return c == 0; }));
}

TEST_F(SpaceTest, AClientKilledWhileMappingReleasesItsMemory) {
  auto s = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s);
  auto ns = CreateOrDie(s.get(), "held");
  ASSERT_TRUE(ns);
  auto seg = ns->Alloc(1u << 20);
  ASSERT_TRUE(seg.ok());
  auto child = Child({"held", "hold"});
  ASSERT_TRUE(child);
  EXPECT_EQ(StatOf(s.get(), "space_maps"), 1u);
  ASSERT_TRUE(ns->Free(seg->address).ok());
  EXPECT_EQ(StatOf(s.get(), "space_bytes_held"), 1u << 20);
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  ASSERT_TRUE(child->Wait(std::chrono::seconds(10)).ok());
  // The server sees the connection go (within its dead-peer detection) and
  // drops the map: the memory returns to the namespace's reservation.
  EXPECT_EQ(testing::WaitForStatOf(s.get(), "space_bytes_held", 0,
                                   std::chrono::seconds(30)),
            0u);
  EXPECT_EQ(StatOf(s.get(), "space_maps"), 0u);
  auto info = ns->Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->reserved_bytes, 1u << 20);
}

// Fetch-adds from three processes on one word: the recorded history is
// linearizable iff the old values are 0 .. n-1, each once, and an
// operation that returned before another was called saw a smaller value.
TEST_F(SpaceTest, ConcurrentFetchAddsAreLinearizable) {
  auto s = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s);
  auto ns = CreateOrDie(s.get(), "count");
  ASSERT_TRUE(ns);
  ASSERT_TRUE(ns->Alloc(64).ok());
  constexpr int kOps = 2000;
  std::vector<std::unique_ptr<Subprocess>> kids;
  for (int i = 0; i < 3; ++i) {
    kids.push_back(Child({"count", "counter", std::to_string(kOps)}));
    ASSERT_TRUE(kids.back());
  }
  struct Op {
    uint64_t call, ret, old;
  };
  std::vector<Op> ops;
  for (auto& k : kids) {
    // Read first: the history is more than a pipe holds.
    ASSERT_TRUE(k->ReadToEnd(std::chrono::seconds(120)).ok());
    auto rc = k->Wait(std::chrono::seconds(10));
    ASSERT_TRUE(rc.ok());
    ASSERT_EQ(*rc, 0) << k->output();
    std::istringstream in(k->output());
    std::string line;
    while (std::getline(in, line)) {
      Op op;
      if (std::sscanf(line.c_str(), "H %lu %lu %lu", &op.call, &op.ret,
                      &op.old) == 3) {
        ops.push_back(op);
      }
    }
  }
  ASSERT_EQ(ops.size(), size_t(3 * kOps));
  std::sort(ops.begin(), ops.end(),
            [](const Op& x, const Op& y) { return x.old < y.old; });
  for (size_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i].old, i);
  // Real time: the op that saw i+1 cannot have returned before the one
  // that saw i was called (it would have to come first).
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    ASSERT_GE(ops[i + 1].ret, ops[i].call)
        << "old " << i + 1 << " returned before old " << i << " was called";
  }
  auto map = ns->Map(0, 8);
  ASSERT_TRUE(map.ok());
  EXPECT_EQ((*map)->FetchAdd(0, 0).value(), uint64_t(3 * kOps));
}

// Writers rewrite blocks of one segment one-sided under version words
// while readers read them one-sided and another client allocates, writes
// and frees segments of a second namespace: every block a reader saw
// stable holds what its writer wrote at that version (the data path is
// not disturbed by the server handing chunks out and back), and every new
// segment the churn got read as zeros.
TEST_F(SpaceTest, OneSidedWritersAndReadersRaceWithAllocationChurn) {
  auto s = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s);
  auto ns = CreateOrDie(s.get(), "blocks");
  auto churn_ns = CreateOrDie(s.get(), "churn");
  ASSERT_TRUE(ns && churn_ns);
  constexpr uint64_t kPerWriter = 12;
  constexpr uint64_t kTotal = 2 * kPerWriter;
  const Segment seg = FragmentedSegment(ns.get(), kTotal * kBlock);
  ASSERT_EQ(seg.length, kTotal * kBlock);
  // The helper left a one-chunk segment first; the children map the first
  // segment, so free it.
  auto segs = ns->Segments();
  ASSERT_TRUE(segs.ok());
  ASSERT_TRUE(ns->Free(segs->front().address).ok());
  std::vector<std::unique_ptr<Subprocess>> kids;
  kids.push_back(Child({"blocks", "reader", std::to_string(kTotal), "3000"}));
  kids.push_back(Child({"blocks", "reader", std::to_string(kTotal), "3000"}));
  kids.push_back(Child({"blocks", "churn", "churn", "400"}, false));
  kids.push_back(
      Child({"blocks", "writer", "0", std::to_string(kPerWriter), "150"}));
  kids.push_back(
      Child({"blocks", "writer", "1", std::to_string(kPerWriter), "150"}));
  for (auto& k : kids) ASSERT_TRUE(k);
  uint64_t stable = 0;
  for (size_t i = 0; i < kids.size(); ++i) {
    ASSERT_TRUE(kids[i]->ReadToEnd(std::chrono::seconds(180)).ok());
    auto rc = kids[i]->Wait(std::chrono::seconds(10));
    ASSERT_TRUE(rc.ok());
    const std::string& out = kids[i]->output();
    EXPECT_EQ(*rc, 0) << out;
    EXPECT_EQ(out.find("BAD"), std::string::npos) << out;
    unsigned long n = 0, bad = 0;
    const size_t at = out.find("DONE stable=");
    if (i < 2 && at != std::string::npos &&
        std::sscanf(out.c_str() + at, "DONE stable=%lu bad=%lu", &n, &bad) ==
            2) {
      stable += n;
      EXPECT_EQ(bad, 0u);
    }
  }
  EXPECT_GT(stable, 100u);
  // The writers' last round is what the blocks hold.
  auto map = ns->Map(seg);
  ASSERT_TRUE(map.ok());
  for (uint64_t b = 0; b < kTotal; ++b) {
    EXPECT_EQ((*map)->FetchAdd(b * kBlock, 0).value(), 300u) << b;
    uint64_t w = 0, q = 0;
    ASSERT_TRUE((*map)->Read(b * kBlock + 8, &w, 8).ok());
    ASSERT_TRUE((*map)->Read(b * kBlock + 16, &q, 8).ok());
    EXPECT_EQ(w, b / kPerWriter + 1);
    EXPECT_EQ(q, 150u);
  }
}

TEST_F(SpaceTest, ARestartedServerHasNoNamespacesAndSaysSo) {
  auto s = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s);
  auto ns = CreateOrDie(s.get(), "volatile");
  ASSERT_TRUE(ns);
  auto seg = ns->Alloc(100);
  ASSERT_TRUE(seg.ok());
  auto map = ns->Map(*seg);
  ASSERT_TRUE(map.ok());
  const std::string address = server_.address;
  ASSERT_TRUE(server_.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(server_.process->Wait(std::chrono::seconds(10)).ok());
  char buf[8];
  // The old session fails (Unavailable) once it sees the connection gone
  // (it looks every 10 ms; the lease would end it within 1 s anyway), and
  // reads nothing from the dead server's memory after that.
  Status st;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (st.ok() && std::chrono::steady_clock::now() < until) {
    st = (*map)->Read(0, buf, 8);
  }
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  map->reset();
  ns.reset();
  s.reset();
  server_ = StartServer({"--threads", "2", "--space-memory", "4M",
                         "--space-chunk", "4K", "--listen", address},
                        "32M");
  ASSERT_NE(server_.process, nullptr);
  auto s2 = testing::ConnectOrDie(server_.address);
  ASSERT_TRUE(s2);
  auto gone = Namespace::Open(s2.get(), "volatile");
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
}

TEST(SpaceServer, AServerWithoutNamespaceMemorySaysHowToGiveItSome) {
  // 8 MiB: a sixteenth is under 1 MiB, so no namespace memory by default.
  auto server = StartServer({}, "8M");
  ASSERT_NE(server.process, nullptr);
  auto s = testing::ConnectOrDie(server.address);
  ASSERT_TRUE(s);
  auto ns = Namespace::Create(s.get(), "n");
  EXPECT_EQ(ns.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(ns.status().message().find("--space-memory"), std::string::npos);
  // Bad flags stop the server at start with exit 2.
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--space-chunk", "3000"},
        std::vector<std::string>{"--space-chunk", "128M"},
        std::vector<std::string>{"--space-memory", "64M"},
        std::vector<std::string>{"--space-memory", "1M", "--space-chunk", "4M"},
        // The default --space-memory, a sixteenth of 32M, holds no chunk
        // of 4M: refused too, not started without namespaces.
        std::vector<std::string>{"--space-chunk", "4M"}}) {
    std::vector<std::string> argv = {testing::ServerBinary(), "--listen",
                                     "127.0.0.1:0", "--memory", "32M"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto r = testing::RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << flags[0] << " " << flags[1] << ": " << r.out;
    if (flags.size() == 2 && flags[1] == "4M") {
      EXPECT_NE(r.out.find("--space-chunk 4.0 MiB"), std::string::npos)
          << r.out;
      EXPECT_NE(r.out.find("--space-memory"), std::string::npos) << r.out;
    }
  }
}

}  // namespace
}  // namespace remem
