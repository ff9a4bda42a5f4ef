#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "remem/options.h"
#include "remem/status.h"
#include "util/histogram.h"
#include "util/pass_queue.h"
#include "util/size.h"
#include "util/socket.h"
#include "util/subprocess.h"

namespace remem {
namespace {

TEST(Status, CodesAndMessages) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::NotFound("key k");
  EXPECT_EQ(s.ToString(), "NotFound: key k");
  EXPECT_EQ(s.WithContext("get").ToString(), "NotFound: get: key k");
  Result<int> r = 3;
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(*r, 3);
  Result<int> e = Status::Busy("later");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kBusy);
  Result<int> bogus = Status::OK();  // a bug, reported as one
  EXPECT_EQ(bogus.status().code(), StatusCode::kInternal);
  // A move-only value moves out of a temporary Result.
  auto make = [] {
    return Result<std::unique_ptr<int>>(std::make_unique<int>(7));
  };
  std::unique_ptr<int> moved = *make();
  EXPECT_EQ(*moved, 7);
}

// A peer that closes is noticed at once, also while waiting; one that
// stays is reported there once the wait is over; data is not a close.
TEST(Socket, PeerStillThereAfterSeesACloseAndWaitsOutAnOpenPeer) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  EXPECT_TRUE(util::PeerStillThereAfter(fds[0], std::chrono::milliseconds(0)));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(util::PeerStillThereAfter(fds[0], std::chrono::milliseconds(50)));
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(50));
  ASSERT_EQ(::write(fds[1], "x", 1), 1);
  EXPECT_TRUE(util::PeerStillThereAfter(fds[0], std::chrono::milliseconds(50)));
  std::thread closer([&] { ::close(fds[1]); });
  // Closed while it waits (or before): false well before the minute.
  const auto waited = std::chrono::steady_clock::now();
  char c;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);  // the byte above, so EOF is next
  EXPECT_FALSE(util::PeerStillThereAfter(fds[0], std::chrono::minutes(1)));
  EXPECT_LT(std::chrono::steady_clock::now() - waited,
            std::chrono::seconds(30));
  closer.join();
  ::close(fds[0]);
}

TEST(Socket, ParseHostPortTakesHostPortAndBracketedV6Only) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(util::ParseHostPort("127.0.0.1:7400", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 7400);
  ASSERT_TRUE(util::ParseHostPort("[::1]:7401", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 7401);
  for (const char* bad : {"host:7400:5", "::1:7400", "127.0.0.1", ":7400",
                          "h:", "h:65536", "h:7x", "[::1]7400", "[::1"}) {
    const Status st = util::ParseHostPort(bad, &host, &port);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(bad), std::string::npos) << st.ToString();
  }
}

// A name that resolves to both loopbacks reaches a server listening on
// either: Connect tries each address in turn. Before, it tried the first
// only, and `localhost` did not reach a server on [::1] where localhost
// resolves to 127.0.0.1 first (a black-box finding). Run in a child with a
// mount namespace of its own, whose /etc/hosts names both.
TEST(Socket, ConnectTriesEveryAddressTheNameResolvesTo) {
  char hosts[] = "/tmp/remem-hosts-XXXXXX";
  const int fd = ::mkstemp(hosts);
  ASSERT_GE(fd, 0);
  const std::string text =
      "127.0.0.1 both-loopbacks\n::1 both-loopbacks\n::1 v6-only\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), ssize_t(text.size()));
  ::close(fd);
  // Exit codes: 0 reached both; 2 no IPv6 loopback here; others: failed.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount(hosts, "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
      ::_exit(3);
    }
    int step = 10;
    for (const char* listen : {"127.0.0.1:0", "[::1]:0"}) {
      auto l = util::Listen(listen, 4);
      if (!l.ok()) ::_exit(std::string(listen)[0] == '[' ? 2 : 4);
      auto bound = util::LocalAddress(l->fd());
      if (!bound.ok()) ::_exit(5);
      const std::string port = bound->substr(bound->rfind(':') + 1);
      auto c = util::Connect(
          "both-loopbacks:" + port,
          std::chrono::steady_clock::now() + std::chrono::seconds(5));
      if (!c.ok()) ::_exit(step);
      ++step;
    }
    // Nothing listens on v6-only's port: the error names the name.
    auto none = util::Connect("v6-only:1", std::chrono::steady_clock::now() +
                                               std::chrono::seconds(5));
    if (none.ok() ||
        none.status().message().find("v6-only:1") == std::string::npos) {
      ::_exit(20);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::unlink(hosts);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "no IPv6 loopback here";
  EXPECT_NE(WEXITSTATUS(status), 3) << "no mount namespace for /etc/hosts";
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: 127.0.0.1 not reached; 11: [::1] not reached; 20: bad error";
}

// A pass runs what was queued before it. A pass nested in an entry's run
// runs only entries queued after the passes under way began, unless it
// takes over: then it runs what they hold too, and they skip it. Entries
// queued during a pass wait for the next one; dropped entries keep their
// places.
TEST(PassQueue, NestedPassesRunLaterEntriesOrTakeOverTheRest) {
  util::PassQueue<int> q;
  std::vector<int> ran;
  for (int i = 0; i < 200; ++i) q.Emplace(i);
  std::function<void(int&&)> run = [&](int&& v) {
    ran.push_back(v);
    if (v == 3) {
      // 4..199 are held by this pass: only a take-over could run them.
      EXPECT_FALSE(q.HasRunnable(/*take_over=*/false));
      EXPECT_TRUE(q.HasRunnable(/*take_over=*/true));
      q.Emplace(1000);
      EXPECT_TRUE(q.HasRunnable(/*take_over=*/false));
      // Not a take-over: 4..199 are the outer pass's; 1000 is later.
      EXPECT_EQ(q.RunPass(run), 1u);
    }
    if (v == 10) {
      q.Emplace(2000);
      // A take-over: 11..199 and 2000.
      EXPECT_EQ(q.RunPass(run, /*take_over=*/true), 190u);
    }
    if (v == 150) q.Emplace(3000);  // during the nested pass: waits
  };
  EXPECT_EQ(q.RunPass(run), 11u);  // 0..10; the rest was taken over
  std::vector<int> want = {0, 1, 2, 3, 1000};
  for (int i = 4; i < 200; ++i) want.push_back(i);
  want.push_back(2000);
  EXPECT_EQ(ran, want);
  EXPECT_EQ(q.size(), 1u);  // 3000
  ran.clear();
  q.Emplace(7);
  q.Emplace(8);
  q.DropIf([](const int& v) { return v == 7; }, [](int& v) { v = -1; });
  EXPECT_EQ(q.RunPass(run), 3u);
  EXPECT_EQ(ran, (std::vector<int>{3000, -1, 8}));
  EXPECT_TRUE(q.empty());
}

// AnyWaiting sees the entries no pass has run: those a pass under way
// still holds (what a nested pass cannot run) and those queued after it,
// not the ones run or being run.
TEST(PassQueue, AnyWaitingSeesHeldAndQueuedEntriesOnly) {
  util::PassQueue<int> q;
  auto has = [&q](int want) {
    return q.AnyWaiting([want](const int& v) { return v == want; });
  };
  EXPECT_FALSE(has(0));
  for (int i = 0; i < 4; ++i) q.Emplace(i);
  EXPECT_TRUE(has(0));
  std::function<void(int&&)> run = [&](int&& v) {
    if (v != 1) return;
    EXPECT_FALSE(has(0));  // run
    EXPECT_FALSE(has(1));  // being run
    EXPECT_TRUE(has(2));   // held by this pass
    q.Emplace(9);
    EXPECT_EQ(q.RunPass(run), 1u);  // 9 only: 2 and 3 are held
    EXPECT_FALSE(has(9));
    EXPECT_TRUE(has(3));
  };
  EXPECT_EQ(q.RunPass(run), 4u);
  EXPECT_FALSE(has(2));
  EXPECT_FALSE(has(3));
  EXPECT_TRUE(q.empty());
}

TEST(Size, Parse) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64K"), 65536u);
  EXPECT_EQ(*ParseSize("64KiB"), 65536u);
  EXPECT_EQ(*ParseSize("1.5G"), 1536ull << 20);
  EXPECT_EQ(*ParseSize("2gb"), 2ull << 30);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("-1").ok());
  EXPECT_FALSE(ParseSize("12Q").ok());
  EXPECT_FALSE(ParseSize("99999999T").ok());
  // Only decimal sizes: strtod's hex, exponents, signs and spaces are not.
  for (const char* odd : {"0x10", "1e3", "+5", " 5", "5 ", "1.2.3", ".", "K",
                          "inf", "nan", "16777216T"}) {
    EXPECT_FALSE(ParseSize(odd).ok()) << odd;
  }
  EXPECT_EQ(*ParseSize(".5K"), 512u);
  // A fraction of a byte is refused, not rounded.
  for (const char* part : {"1.5", "0.1K", "0.5", "1.1M"}) {
    auto n = ParseSize(part);
    ASSERT_FALSE(n.ok()) << part;
    EXPECT_NE(n.status().message().find("whole number of bytes"),
              std::string::npos);
  }
  EXPECT_EQ(*ParseSize("0.25K"), 256u);
  // Digits alone are exact past a double's 2^53.
  EXPECT_EQ(*ParseSize("9007199254740993"), 9007199254740993ull);
  EXPECT_EQ(*ParseSize("18446744073709551615"), 18446744073709551615ull);
  EXPECT_FALSE(ParseSize("18446744073709551616").ok());
  EXPECT_FALSE(ParseSize("16777216T").ok());
  EXPECT_EQ(*ParseSize("16777215T"), 16777215ull << 40);
  EXPECT_EQ(*ParseSize("18446744073709549568"), 18446744073709549568ull);
  EXPECT_EQ(FormatSize(1536), "1.5 KiB");
}

TEST(Transport, Parse) {
  EXPECT_EQ(*ParseTransport("shm"), Transport::kShm);
  EXPECT_EQ(*ParseTransport("tcp"), Transport::kTcp);
  EXPECT_EQ(*ParseTransport("auto"), Transport::kAuto);
  EXPECT_FALSE(ParseTransport("rdma").ok());
}

TEST(Histogram, PercentilesWithinBucketPrecision) {
  Histogram h;
  std::vector<uint64_t> values;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    uint64_t v = 100 + rng() % 1000000;
    values.push_back(v);
    h.Record(v);
  }
  std::sort(values.begin(), values.end());
  for (double p : {50.0, 90.0, 99.0, 99.9}) {
    double exact = double(values[size_t(p / 100 * values.size()) - 1]);
    double got = double(h.Percentile(p));
    EXPECT_NEAR(got, exact, exact / 32) << p;
  }
  EXPECT_EQ(h.count(), 100000u);
  EXPECT_EQ(h.max(), values.back());
  Histogram other;
  other.Record(5);
  h.Merge(other);
  EXPECT_EQ(h.min(), 5u);
  EXPECT_EQ(h.Percentile(0), 5u);
  EXPECT_EQ(Histogram().Percentile(50), 0u);
}

// A child dies with the process that spawned it, not with the thread: a
// server a benchmark started from a helper thread was killed when that
// thread ended (PR_SET_PDEATHSIG follows the forking thread).
TEST(Subprocess, AChildSpawnedFromAThreadThatEndsLivesOn) {
  std::unique_ptr<Subprocess> child;
  Status spawned;
  std::thread helper([&] {
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "echo started; sleep 0.5; echo alive"};
    auto p = Subprocess::Spawn(o);
    spawned = p.status();
    if (!p.ok()) return;
    child = std::move(*p);
    // The helper ends once the child runs the program (so it has set its
    // death signal, before exec).
    spawned = child->WaitForLine("started", std::chrono::seconds(30)).status();
  });
  helper.join();
  ASSERT_TRUE(spawned.ok()) << spawned.ToString();
  // Killed with the helper thread, it would close its output first.
  auto alive = child->WaitForLine("alive", std::chrono::seconds(30));
  EXPECT_TRUE(alive.ok()) << alive.status().ToString();
  auto code = child->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

// The body of the test below, in its own process: exits 0 if StopAll
// stopped the one child and no child starts after it, else 10-13.
[[noreturn]] void StopAllThenSpawnAgain() {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "echo started; exec sleep 60"};
  auto p = Subprocess::Spawn(o);
  if (!p.ok() || !(*p)->WaitForLine("started", std::chrono::seconds(30)).ok()) {
    std::fprintf(stderr, "the child did not start\n");
    std::exit(10);
  }
  const auto start = std::chrono::steady_clock::now();
  if (Subprocess::StopAll(std::chrono::seconds(5)) != 1) {
    std::fprintf(stderr, "StopAll did not signal the one child\n");
    std::exit(11);
  }
  if (std::chrono::steady_clock::now() - start >= std::chrono::seconds(5) ||
      (*p)->running()) {
    std::fprintf(stderr, "SIGTERM did not end the child\n");
    std::exit(12);
  }
  auto after = Subprocess::Spawn(o);
  if (after.ok() || after.status().code() != StatusCode::kUnavailable) {
    std::fprintf(stderr, "a child was started after StopAll\n");
    std::exit(13);
  }
  std::exit(0);
}

// Once StopAll has run, a process starts no child: in a process of its
// own (a death test), so that the other tests of this binary still can,
// whatever their order (--gtest_shuffle, --gtest_repeat).
TEST(Subprocess, StopAllStopsEveryChildAndNoneStartsAfterIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(StopAllThenSpawnAgain(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace remem
