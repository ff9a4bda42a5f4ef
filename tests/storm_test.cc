// Connection storms (issue #10, item 2): hundreds of clients opening a
// session at the same moment against one server, each in its own thread
// (storm_client processes, 50 threads each), each then opening the hash
// store and doing a put and a get. Every client must be served or refused
// with a clear reason, and once they are gone the server's
// connections_current must come back to its base: no session lost, none
// leaked. Also: clients killed in the middle of their handshakes and right
// after them, the --max-connections limit, silent connections that hold
// handshake slots until --handshake-timeout-ms, and the test's own gates
// (a slow storm process must still be started and released).
//
// ctest runs this binary once per transport (REMEM_TEST_TRANSPORT=shm|tcp).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "proto/codec.h"
#include "test_util.h"
#include "testing/scale.h"
#include "util/socket.h"

namespace remem {
namespace {

using testing::ConnectHashOrDie;
using testing::ConnectOrDie;
using testing::StartServer;
using testing::StatOf;
using testing::TestTransport;
using testing::WaitForStatOf;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kProcesses = 6;
constexpr int kThreads = 50;

// One thread's outcome, as storm_client reports it.
struct Outcome {
  bool ok = false;
  double connect_ms = 0;             // ok: Session::Connect
  std::string stage, code, message;  // errors
};

std::vector<Outcome> ParseOutcomes(const std::string& out) {
  std::vector<Outcome> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RESULT ", 0) != 0) continue;
    std::istringstream f(line.substr(7));
    Outcome o;
    std::string kind;
    f >> kind;
    if (kind == "ok") {
      o.ok = true;
      f >> o.connect_ms;
    } else {
      f >> o.stage >> o.code;
      std::getline(f, o.message);
    }
    v.push_back(o);
  }
  return v;
}

// A barrier the storm processes wait at, made of a FIFO this process holds
// open for writing from its construction: closing it releases every reader
// at once. A storm process opens its read end before it prints READY, so
// that the gate may be opened the moment READY is read, however late the
// process then gets to its read (storm_client.cc).
class Gate {
 public:
  explicit Gate(const std::string& path) : path_(path) {
    ::unlink(path.c_str());
    EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
    // Read-write, so that opening never blocks; close-on-exec, so that the
    // storm processes are not writers themselves.
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0);
  }
  ~Gate() {
    Open();
    ::unlink(path_.c_str());
  }
  void Open() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

struct Storm {
  std::vector<std::unique_ptr<Subprocess>> processes;
  std::vector<std::vector<Outcome>> outcomes;  // per process
  double seconds = 0;                          // start to last DONE
  int ok = 0;
  std::map<std::string, int> errors;  // "stage code message" -> count
};

class StormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/storm-" + std::to_string(getpid());
    ASSERT_EQ(std::system(("mkdir -p " + dir_).c_str()), 0);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void StartServerWith(const std::vector<std::string>& extra) {
    server_ = StartServer(extra, "256M");
    ASSERT_NE(server_.process, nullptr);
    observer_ = ConnectOrDie(server_.address);
    ASSERT_NE(observer_, nullptr);
    base_ = Stat("connections_current");
    ASSERT_EQ(base_, 1u);
  }

  uint64_t Stat(const char* name) { return StatOf(observer_.get(), name); }
  // Waits (bounded) until `name` equals `want`; returns the last value.
  uint64_t WaitForStat(const char* name, uint64_t want,
                       milliseconds bound = milliseconds(30000)) {
    return WaitForStatOf(observer_.get(), name, want, bound);
  }

  // Starts a storm process of `threads` clients and waits until it is at
  // the start gate (it has printed READY). `pause` is STORM_CLIENT_PAUSE_MS.
  std::unique_ptr<Subprocess> SpawnStorm(const std::string& tag,
                                         const Gate& start, const Gate& release,
                                         int threads = kThreads,
                                         milliseconds pause = milliseconds(0)) {
    SpawnOptions o;
    o.argv = {REMEM_STORM_CLIENT_BIN,
              server_.address,
              std::string(TransportName(TestTransport())),
              std::to_string(threads),
              start.path(),
              release.path(),
              tag};
    if (pause.count() > 0) {
      o.env.emplace_back("STORM_CLIENT_PAUSE_MS",
                         std::to_string(pause.count()));
    }
    auto p = Subprocess::Spawn(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    auto ready = (*p)->WaitForLine("READY", seconds(60));
    EXPECT_TRUE(ready.ok()) << ready.status().ToString();
    return std::move(*p);
  }

  // Runs a storm of `processes` x kThreads clients and collects what each
  // reported; the sessions are still open when it returns (release them
  // with the gate).
  Storm RunStorm(int processes, Gate& start, Gate& release,
                 const std::string& tag) {
    Storm s;
    for (int i = 0; i < processes; ++i) {
      s.processes.push_back(
          SpawnStorm(tag + "-" + std::to_string(i), start, release));
      if (s.processes.back() == nullptr) return s;
    }
    const auto t0 = Clock::now();
    start.Open();
    for (auto& p : s.processes) {
      auto done = p->WaitForLine("DONE", seconds(120));
      EXPECT_TRUE(done.ok()) << done.status().ToString() << "\n" << p->output();
      s.outcomes.push_back(ParseOutcomes(p->output()));
      EXPECT_EQ(s.outcomes.back().size(), size_t(kThreads)) << p->output();
      for (const Outcome& o : s.outcomes.back()) {
        if (o.ok) {
          ++s.ok;
        } else {
          ++s.errors[o.stage + " " + o.code + o.message];
        }
      }
    }
    s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return s;
  }

  void ReleaseAndCheck(Storm& s, Gate& release) {
    release.Open();
    for (auto& p : s.processes) {
      auto code = p->Wait(seconds(60));
      ASSERT_TRUE(code.ok()) << code.status().ToString();
      EXPECT_EQ(*code, 0) << p->output();
    }
    EXPECT_EQ(WaitForStat("connections_current", base_), base_)
        << "sessions leaked after the storm";
    // Served as before.
    auto c = ConnectHashOrDie(server_.address);
    ASSERT_TRUE(c) << "no client after the storm";
    ASSERT_TRUE(c->Put("after the storm", "calm").ok());
  }

  static std::string Describe(const Storm& s) {
    std::ostringstream out;
    std::vector<double> ms;
    for (const auto& v : s.outcomes) {
      for (const Outcome& o : v) {
        if (o.ok) ms.push_back(o.connect_ms);
      }
    }
    std::sort(ms.begin(), ms.end());
    out << s.ok << " served";
    if (!ms.empty()) {
      out << " (connect p50 " << ms[ms.size() / 2] << " ms, max " << ms.back()
          << " ms)";
    }
    for (const auto& [what, n] : s.errors) out << "; " << n << " x " << what;
    out << "; " << s.seconds << " s";
    return out.str();
  }

  std::string dir_;
  testing::ServerProcess server_;
  std::unique_ptr<Session> observer_;
  uint64_t base_ = 0;
};

// The gates themselves: a storm process that is slow to reach its read of
// a gate after READY (or DONE), as on a loaded machine, is still released
// when the gate opens right away. (storm_client once opened each FIFO only
// after printing READY: a process descheduled there found the writer
// already gone, blocked in open() forever, and the storm tests failed now
// and then after waiting 180 s for it.)
TEST_F(StormTest, GatesOpenedRightAwayReleaseASlowProcess) {
  StartServerWith({});
  Gate start(dir_ + "/start"), release(dir_ + "/release");
  auto p = SpawnStorm("slow", start, release, 1, milliseconds(500));
  ASSERT_NE(p, nullptr);
  start.Open();  // while it sleeps after READY
  auto done = p->WaitForLine("DONE", seconds(30));
  ASSERT_TRUE(done.ok()) << done.status().ToString() << "\n" << p->output();
  const std::vector<Outcome> outcomes = ParseOutcomes(p->output());
  ASSERT_EQ(outcomes.size(), 1u) << p->output();
  EXPECT_TRUE(outcomes[0].ok)
      << outcomes[0].stage << " " << outcomes[0].code << outcomes[0].message;
  release.Open();  // while it sleeps after DONE
  auto code = p->Wait(seconds(30));
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << p->output();
  EXPECT_EQ(WaitForStat("connections_current", base_), base_);
}

// Storm processes for the two big storms: 6 x 50 clients (3 x 50 under
// the sanitizers, REMEM_TEST_SCALE).
int StormProcesses() { return testing::Scaled(kProcesses, 3); }

// 6 processes x 50 threads at once: all served, all released.
TEST_F(StormTest, HundredsOfClientsAtOnceAreAllServed) {
  StartServerWith({});
  Gate start(dir_ + "/start"), release(dir_ + "/release");
  const uint64_t failures = Stat("handshake_failures");
  const int processes = StormProcesses();
  Storm s = RunStorm(processes, start, release, "all");
  std::printf("storm over %s: %d clients: %s\n",
              std::string(TransportName(TestTransport())).c_str(),
              processes * kThreads, Describe(s).c_str());
  EXPECT_EQ(s.ok, processes * kThreads) << Describe(s);
  EXPECT_EQ(Stat("connections_current"), base_ + uint64_t(s.ok));
  EXPECT_EQ(Stat("handshake_failures"), failures);
  ReleaseAndCheck(s, release);
}

// With a connection limit, the clients over it are refused with the
// reason, the ones under it served; and the server keeps accepting once
// they are gone.
TEST_F(StormTest, MaxConnectionsRefusesWithAReason) {
  constexpr int kLimit = 101;  // the observer and 100 storm clients
  StartServerWith({"--max-connections", std::to_string(kLimit)});
  Gate start(dir_ + "/start"), release(dir_ + "/release");
  const uint64_t refused = Stat("connections_refused");
  const int processes = StormProcesses();
  Storm s = RunStorm(processes, start, release, "limit");
  std::printf("storm over %s against --max-connections %d: %s\n",
              std::string(TransportName(TestTransport())).c_str(), kLimit,
              Describe(s).c_str());
  EXPECT_EQ(s.ok, kLimit - 1) << Describe(s);
  const std::string reason =
      "connect Busy the server at " + server_.address +
      " refused the session: the server has reached its limit of " +
      std::to_string(kLimit) +
      " connections (sessions and handshakes in progress together: "
      "--max-connections)";
  int busy = 0;
  for (const auto& [what, n] : s.errors) {
    EXPECT_EQ(what, reason) << n << " clients";
    if (what == reason) busy += n;
  }
  EXPECT_EQ(busy, processes * kThreads - (kLimit - 1)) << Describe(s);
  EXPECT_EQ(Stat("connections_refused"), refused + uint64_t(busy));
  ReleaseAndCheck(s, release);
}

// CLI clients killed each at a random moment of their first 30 ms (most
// while they connect), one after another; the server serves on and
// releases their sessions. Over tcp, UCX 1.13 connecting back to a client
// that died just as its kernel accepted the connection aborted the server
// (UCX finding 22 in ARCHITECTURE.md: 4 aborts in about 7,500 such kills,
// none in 20,000 once remem asked UCX for non-blocking connects). At 500
// kills (150 under the sanitizers) this catches that rarely;
// REMEM_HANDSHAKE_KILLS sets more (the long mode). Over tcp only: shared-memory
// handshakes are the other tests'.
TEST_F(StormTest, ClientsKilledAtRandomWhileTheyConnectLeaveTheServerUp) {
  if (TestTransport() != Transport::kTcp) {
    GTEST_SKIP() << "UCX's tcp connection establishment";
  }
  StartServerWith({});
  int kills = testing::Scaled(500, 150);
  if (const char* n = std::getenv("REMEM_HANDSHAKE_KILLS")) {
    kills = std::max(1, std::atoi(n));
  }
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < kills; ++i) {
    SpawnOptions o;
    o.argv = {testing::CliBinary(),
              "--server",
              server_.address,
              "--transport",
              "tcp",
              "get",
              "some-key"};
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    // The fault: a kill at a random point of the client's start and
    // handshake (not a wait for an event).
    std::this_thread::sleep_for(milliseconds(5 + rng() % 26));
    ASSERT_TRUE((*p)->Signal(SIGKILL).ok());
    (void)(*p)->Wait(seconds(30));
    if (i % 50 == 49 || i + 1 == kills) {
      ASSERT_TRUE(server_.running())
          << "the server died after " << i + 1 << " kills";
    }
  }
  EXPECT_EQ(WaitForStat("connections_current", base_), base_)
      << "sessions of the killed clients were not released";
  auto store = ConnectHashOrDie(server_.address);
  ASSERT_NE(store.store, nullptr);
  ASSERT_TRUE(store.store->Put("after", "the kills").ok());
  EXPECT_EQ(store.store->Get("after")->value, "the kills");
}

// Two storm processes killed while their 50 handshakes are in flight, and
// two killed right after their sessions are up: the server releases everything
// they held, and the other clients of the storm are served.
TEST_F(StormTest, ClientsKilledMidHandshakeAndRightAfterAreReleased) {
  StartServerWith({});
  {
    Gate start(dir_ + "/start"), release(dir_ + "/release");
    std::vector<std::unique_ptr<Subprocess>> doomed, kept;
    for (int i = 0; i < 2; ++i) {
      doomed.push_back(
          SpawnStorm("doomed" + std::to_string(i), start, release));
      kept.push_back(SpawnStorm("kept" + std::to_string(i), start, release));
    }
    const uint64_t total = Stat("connections_total");
    start.Open();
    // Mid-handshake: killed once the storm is under way (the server has
    // admitted its first sessions), with most handshakes in flight.
    while (Stat("connections_total") == total) {
    }
    for (auto& p : doomed) ASSERT_TRUE(p->Signal(SIGKILL).ok());
    int ok = 0;
    for (auto& p : kept) {
      ASSERT_TRUE(p->WaitForLine("DONE", seconds(120)).ok()) << p->output();
      for (const Outcome& o : ParseOutcomes(p->output())) {
        EXPECT_TRUE(o.ok) << o.stage << " " << o.code << o.message;
        ok += o.ok;
      }
    }
    EXPECT_EQ(ok, 2 * kThreads);
    for (auto& p : doomed) (void)p->Wait(seconds(30));
    EXPECT_EQ(WaitForStat("connections_current", base_ + uint64_t(ok)),
              base_ + uint64_t(ok))
        << "sessions of the killed processes were not released";
    // Right after: the kept processes, with all their sessions up.
    for (auto& p : kept) ASSERT_TRUE(p->Signal(SIGKILL).ok());
    for (auto& p : kept) (void)p->Wait(seconds(30));
    EXPECT_EQ(WaitForStat("connections_current", base_), base_)
        << "sessions of killed clients leaked";
  }
  // A handshake cut off by a kill (a child that sent half a hello).
  const uint64_t failures = Stat("handshake_failures");
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(util::ParseHostPort(server_.address, &host, &port).ok());
  sockaddr_storage ss{};
  socklen_t len = 0;
  ASSERT_TRUE(util::ResolveAddress(server_.address, false, &ss, &len).ok());
  proto::ClientHelloInfo hello;
  hello.worker_address = std::string(100, 'a');
  const std::string half = proto::EncodeClientHello(hello).substr(0, 40);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only system calls from here on (the parent has threads).
    const int fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
        write(fd, half.data(), half.size()) != ssize_t(half.size())) {
      _exit(1);
    }
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(WaitForStat("handshake_failures", failures + 1), failures + 1);
  EXPECT_EQ(Stat("connections_current"), base_);
  auto fresh = ConnectHashOrDie(server_.address);
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->Put("k", "v").ok());
}

// Connections that open and then say nothing hold handshake slots only
// until --handshake-timeout-ms, and do not keep a storm of real clients out
// (whose hellos arrive on time however busy the acceptor is).
TEST_F(StormTest, SilentConnectionsDoNotKeepClientsOut) {
  StartServerWith({"--handshake-timeout-ms", "1000"});
  const uint64_t failures = Stat("handshake_failures");
  std::vector<util::Socket> silent;
  for (int i = 0; i < 200; ++i) {
    auto s = util::Connect(server_.address, Clock::now() + seconds(10));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    silent.push_back(std::move(*s));
  }
  Gate start(dir_ + "/start"), release(dir_ + "/release");
  Storm s = RunStorm(2, start, release, "beside-silence");
  std::printf("storm over %s beside 200 silent connections: %s\n",
              std::string(TransportName(TestTransport())).c_str(),
              Describe(s).c_str());
  EXPECT_EQ(s.ok, 2 * kThreads) << Describe(s);
  // Every silent one is refused at the timeout, with the reason.
  for (util::Socket& sock : silent) {
    std::string prefix, rest;
    const auto deadline = Clock::now() + seconds(30);
    ASSERT_TRUE(util::RecvExact(sock.fd(), sizeof(proto::ServerHello), &prefix,
                                deadline)
                    .ok());
    proto::ServerHello h;
    auto body = proto::DecodeServerHelloPrefix(prefix, &h);
    ASSERT_TRUE(body.ok());
    ASSERT_TRUE(util::RecvExact(sock.fd(), *body, &rest, deadline).ok());
    auto reply = proto::DecodeServerHello(prefix + rest);
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->status.code(), StatusCode::kTimedOut);
  }
  silent.clear();
  EXPECT_EQ(WaitForStat("handshake_failures", failures + 200), failures + 200);
  ReleaseAndCheck(s, release);
}

}  // namespace
}  // namespace remem
