#include "client/path_selector.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace remem::client {
namespace {

using Clock = PathSelector::Clock;

// Drives the selector for `ops` operations where each path costs what
// `latency(path, i)` says; returns how many went one-sided.
uint64_t Drive(PathSelector& sel, int ops,
               const std::function<double(Path, int)>& latency,
               Clock::time_point* now) {
  uint64_t onesided = 0;
  for (int i = 0; i < ops; ++i) {
    Path p = sel.Choose(*now);
    double l = latency(p, i);
    *now += std::chrono::nanoseconds(static_cast<int64_t>(l * 1000));
    sel.Record(p, l, *now);
    onesided += p == Path::kOneSided;
  }
  return onesided;
}

TEST(PathSelector, ForcedModesNeverExplore) {
  for (auto mode : {remem::ReadPath::kOneSided, remem::ReadPath::kRpc}) {
    PathSelector sel({.mode = mode});
    Clock::time_point now{};
    auto want =
        mode == remem::ReadPath::kOneSided ? Path::kOneSided : Path::kRpc;
    for (int i = 0; i < 10000; ++i) {
      ASSERT_EQ(sel.Choose(now), want);
      sel.Record(want, i % 7 == 0 ? 1000.0 : 1.0, now);
    }
    EXPECT_EQ(sel.counters().explored, 0u);
  }
}

TEST(PathSelector, SharedMemoryReadsDirectlyTcpAsksTheServer) {
  // Shared memory: one-sided 0.2 us vs RPC 1.1 us. Cell's 1% exploration,
  // without remem's floors between explorations (the next tests').
  PathSelector shm({.explore_interval = std::chrono::nanoseconds(0),
                    .explore_time_share = 1});
  Clock::time_point now{};
  uint64_t os = Drive(
      shm, 100000, [](Path p, int) { return p == Path::kOneSided ? 0.2 : 1.1; },
      &now);
  EXPECT_GT(os, 98000u);
  // About 1% exploration of the worse path.
  EXPECT_GT(shm.counters().explored, 500u);
  EXPECT_LT(shm.counters().explored, 2000u);
  // tcp: a one-sided get is a round trip per read (2 reads: 24 us) vs 14 us.
  PathSelector tcp;
  os = Drive(
      tcp, 100000,
      [](Path p, int) { return p == Path::kOneSided ? 24.0 : 14.0; }, &now);
  EXPECT_LT(os, 2000u);
}

TEST(PathSelector, ExplorationsAreAnIntervalApart) {
  // 100,000 one-sided gets of 0.2 us: about 20 ms. 1% would be 1,000 RPCs;
  // with explorations at least 1 ms apart there are at most 21 or so.
  PathSelector sel;
  Clock::time_point now{};
  const Clock::time_point begin = now;
  uint64_t os = Drive(
      sel, 100000, [](Path p, int) { return p == Path::kOneSided ? 0.2 : 1.1; },
      &now);
  const auto elapsed_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - begin);
  EXPECT_GT(os, 99900u);
  EXPECT_GE(sel.counters().explored, 5u);
  EXPECT_LE(sel.counters().explored, uint64_t(elapsed_ms.count()) + 1);
  // At a slower rate (14 us per RPC, 1.4 ms between 1% explorations) the
  // floor rarely binds: exploration stays near 1%.
  PathSelector tcp;
  Drive(
      tcp, 100000,
      [](Path p, int) { return p == Path::kOneSided ? 24.0 : 14.0; }, &now);
  EXPECT_GT(tcp.counters().explored, 400u);
  EXPECT_LT(tcp.counters().explored, 1200u);
}

TEST(PathSelector, ExplorationsComeInBurstsWhenAsked) {
  // One-sided 1 us, RPC 3 us: after the first samples every RPC is an
  // exploration, and each exploration is 4 RPCs in a row.
  PathSelector sel(
      {.explore_interval = std::chrono::milliseconds(2), .explore_burst = 4});
  Clock::time_point now{};
  std::vector<Path> picks;
  for (int i = 0; i < 100000; ++i) {
    const Path p = sel.Choose(now);
    const double l = p == Path::kOneSided ? 1.0 : 3.0;
    now += std::chrono::nanoseconds(static_cast<int64_t>(l * 1000));
    sel.Record(p, l, now);
    picks.push_back(p);
  }
  // Runs of RPC choices after the first 100 operations (the history's
  // start alternates between the paths).
  std::vector<int> runs;
  for (size_t i = 100; i < picks.size(); ++i) {
    if (picks[i] != Path::kRpc) continue;
    if (picks[i - 1] == Path::kRpc && !runs.empty()) {
      ++runs.back();
    } else {
      runs.push_back(1);
    }
  }
  ASSERT_GE(runs.size(), 10u);
  for (size_t r = 0; r + 1 < runs.size(); ++r) EXPECT_EQ(runs[r], 4) << r;
  EXPECT_GT(sel.counters().chosen[int(Path::kOneSided)], 99000u);
}

TEST(PathSelector, ShiftsToClientsWhenTheServerIsOverloaded) {
  PathSelector sel;
  Clock::time_point now{};
  // Server idle: RPC 14 us beats one-sided 24 us. Then the server saturates
  // and queueing pushes RPC latency to 80 us.
  // With jitter, the first 80 us samples are rejected as outliers until a
  // window holds more rejected than kept samples and the history resets.
  auto jitter = [](int i) { return 1.0 + 0.05 * (i % 5); };
  Drive(
      sel, 20000,
      [&](Path p, int i) {
        return (p == Path::kOneSided ? 24.0 : 14.0) * jitter(i);
      },
      &now);
  ASSERT_LT(sel.Estimate(Path::kRpc), sel.Estimate(Path::kOneSided));
  const uint64_t resets = sel.counters().resets;
  uint64_t os = Drive(
      sel, 20000,
      [&](Path p, int i) {
        return (p == Path::kOneSided ? 24.0 : 80.0) * jitter(i);
      },
      &now);
  EXPECT_GT(os, 18000u) << "the selector must move reads to the client";
  EXPECT_GT(sel.Estimate(Path::kRpc), sel.Estimate(Path::kOneSided));
  EXPECT_GT(sel.counters().resets, resets);
  EXPECT_GT(sel.counters().outliers, 0u);
}

// The server's core saturated by another load (tree gets over shared
// memory with a CPU hog on the server's core: an RPC waits for the server's
// time slice, 4 ms, against a one-sided get's 1 us). Explorations in bursts
// of 32, as the ordered store's, must not take the time: at most about
// explore_time_share of it goes to RPCs, plus the histories rebuilt after
// each idle reset (3 s). Before the share, 1% of the gets explored in
// bursts 8 ms apart and RPCs took 97% of the time.
TEST(PathSelector, ExplorationsOfAVerySlowPathTakeLittleOfTheTime) {
  for (size_t burst : {size_t{1}, size_t{32}}) {
    PathSelector sel({.explore_interval = std::chrono::milliseconds(8),
                      .explore_burst = burst});
    Clock::time_point now{};
    const Clock::time_point begin = now;
    double rpc_us = 0;
    uint64_t ops = 0;
    while (now - begin < std::chrono::seconds(10)) {
      const Path p = sel.Choose(now);
      const double l = p == Path::kOneSided ? 1.0 : 4000.0;
      now += std::chrono::nanoseconds(static_cast<int64_t>(l * 1000));
      sel.Record(p, l, now);
      if (p == Path::kRpc) rpc_us += l;
      ++ops;
    }
    const double share = rpc_us / 10e6;
    EXPECT_LT(share, 0.05) << "burst " << burst;
    EXPECT_GT(sel.counters().chosen[int(Path::kOneSided)], 9'000'000u)
        << "burst " << burst;
    EXPECT_GT(sel.counters().explored, 0u) << "burst " << burst;
  }
}

TEST(PathSelector, OneOutlierDoesNotFlipTheChoice) {
  PathSelector sel;
  Clock::time_point now{};
  Drive(
      sel, 5000,
      [](Path p, int i) {
        double base = p == Path::kOneSided ? 0.2 : 1.1;
        return base * (1.0 + 0.05 * (i % 5));  // a little jitter
      },
      &now);
  const uint64_t outliers = sel.counters().outliers;
  sel.Record(Path::kOneSided, 500.0, now);  // one page fault
  EXPECT_EQ(sel.counters().outliers, outliers + 1);
  EXPECT_LT(sel.Estimate(Path::kOneSided), 1.0);
  EXPECT_EQ(sel.Choose(now), Path::kOneSided);
}

TEST(PathSelector, HistoryExpiresWhenIdle) {
  PathSelector sel;
  Clock::time_point now{};
  Drive(
      sel, 1000, [](Path p, int) { return p == Path::kOneSided ? 0.2 : 1.1; },
      &now);
  ASSERT_GT(sel.Samples(Path::kRpc), 0u);
  now += std::chrono::seconds(4);
  // Both histories are gone: the one-sided path is measured first again.
  EXPECT_EQ(sel.Choose(now), Path::kOneSided);
  EXPECT_EQ(sel.Samples(Path::kOneSided), 0u);
  EXPECT_EQ(sel.Samples(Path::kRpc), 0u);
  EXPECT_GE(sel.counters().resets, 2u);
}

TEST(PathSelector, ParseModes) {
  EXPECT_EQ(*ParseReadPath("onesided"), remem::ReadPath::kOneSided);
  EXPECT_EQ(*ParseReadPath("rpc"), remem::ReadPath::kRpc);
  EXPECT_EQ(*ParseReadPath("auto"), remem::ReadPath::kAuto);
  EXPECT_FALSE(ParseReadPath("fast").ok());
}

// Stores time every operation on a path until it has 32 samples, and
// every change of path, then every 8th; in a forced mode none (nothing to
// compare).
TEST(PathTiming, TimesEveryOperationUntilAPathHas32SamplesThenEvery8th) {
  PathSelector sel({.explore = 0});
  PathTiming timing;
  int timed_ops = 0, ops_after = 0, timed_after = 0;
  Path last = Path::kOneSided;
  for (int i = 0; i < 400; ++i) {
    bool timed = false;
    Clock::time_point start;
    const Path p = timing.Choose(&sel, &timed, &start);
    if (p != last || sel.Samples(p) < 32) {
      EXPECT_TRUE(timed) << "operation " << i;
    } else {
      ++ops_after;
      timed_after += timed;
    }
    last = p;
    if (timed) {
      ++timed_ops;
      EXPECT_EQ(timing.last_now(), start);
      // Fixed latencies (one-sided 1 us, RPC 10 us), so the choice
      // settles on one-sided whatever the machine does.
      sel.Record(p, p == Path::kOneSided ? 1.0 : 10.0, start);
    }
  }
  // Record reads the clock and keeps it.
  bool timed = false;
  Clock::time_point start;
  const Path p = timing.Choose(&sel, &timed, &start);
  const Clock::time_point before = Clock::now();
  timing.Record(&sel, p, before);
  EXPECT_GE(timing.last_now(), before);
  ASSERT_GT(ops_after, 250);
  // Every 8th of the rest, give or take the one the count started on.
  EXPECT_NEAR(timed_after, ops_after / 8, 1);
  EXPECT_LT(timed_ops, 150);

  // Every operation of an exploration's burst is timed (the first is
  // cold; sampled, it would weigh as much as the rest together).
  PathSelector explorer({.explore = 0.05,
                         .explore_interval = std::chrono::nanoseconds(0),
                         .explore_burst = 4,
                         .explore_time_share = 1});
  PathTiming explorer_timing;
  int explored = 0;
  for (int i = 0; i < 2000; ++i) {
    bool timed = false;
    Clock::time_point start;
    const Path p = explorer_timing.Choose(&explorer, &timed, &start);
    if (explorer.exploring()) {
      ++explored;
      EXPECT_TRUE(timed) << "operation " << i;
    }
    if (timed) explorer.Record(p, p == Path::kOneSided ? 1.0 : 10.0, start);
  }
  EXPECT_GT(explored, 20);

  PathSelector forced({.mode = remem::ReadPath::kOneSided});
  PathTiming none;
  for (int i = 0; i < 50; ++i) {
    bool timed = true;
    Clock::time_point start;
    EXPECT_EQ(none.Choose(&forced, &timed, &start), Path::kOneSided);
    EXPECT_FALSE(timed);
  }
}

// Operations in flight on shared memory are split between the two cores:
// an operation goes by RPC while fewer than half of those in flight are the
// split's RPCs; one alone in flight never does.
TEST(DepthSplit, SendsByRpcWhileFewerThanHalfTheOperationsInFlightAreItsRpcs) {
  DepthSplit split;
  EXPECT_FALSE(split.TakeRpc(1, 5.0));
  // Sixteen issued one after another, none answered: every second one
  // goes by RPC.
  int rpcs = 0;
  for (size_t in_flight = 1; in_flight <= 16; ++in_flight) {
    if (split.TakeRpc(in_flight, 5.0)) {
      EXPECT_EQ(in_flight % 2, 0u) << in_flight;
      split.Sent();
      ++rpcs;
    }
  }
  EXPECT_EQ(rpcs, 8);
  EXPECT_EQ(split.in_flight(), 8u);
  EXPECT_FALSE(split.TakeRpc(16, 5.0));
  // An answer frees a place; an error too.
  split.Answered(10.0, 1.0);
  EXPECT_TRUE(split.TakeRpc(16, 5.0));
  split.Sent();
  split.Dropped();
  EXPECT_EQ(split.in_flight(), 7u);
  EXPECT_TRUE(split.TakeRpc(16, 5.0));
}

// The client's own cost of an RPC is measured after a warm-up whose
// samples (a fresh session's lazy setup) are dropped; once it is as much
// as the one-sided operation's, only one operation in kProbeEvery that
// could go by RPC does, and a cheaper one-sided estimate than that turns
// the split back on at once.
TEST(DepthSplit, StopsWhenAnRpcCostsTheClientAsMuchAsTheWorkButKeepsMeasuring) {
  DepthSplit split;
  for (size_t i = 0; i < DepthSplit::kWarmup; ++i) {
    split.SendTook(500.0);
    split.Answered(900.0, 500.0);
  }
  EXPECT_EQ(split.client_us(), 0.0);
  for (size_t i = 0; i < DepthSplit::kProbes; ++i) {
    ASSERT_TRUE(split.TakeRpc(16, 3.0)) << "probe " << i;
    split.SendTook(1.0);
    split.Answered(20.0, 3.0);
  }
  EXPECT_NEAR(split.client_us(), 4.0, 1e-9);
  // RPCs cost the client 4 us, one-sided operations 3 us.
  int rpcs = 0;
  const int tries = 10 * int(DepthSplit::kProbeEvery);
  for (int i = 0; i < tries; ++i) rpcs += split.TakeRpc(16, 3.0);
  EXPECT_EQ(rpcs, 10);
  // One-sided operations that cost 10 us make RPCs worth it again.
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(split.TakeRpc(16, 10.0));
  // The averages are of all samples until there are 16, then move a
  // sixteenth each: this is the ninth. A sample counts as at most four
  // times the average (one stall of the client's thread moves it little).
  split.SendTook(1.0);
  split.Answered(20.0, 7.0);
  EXPECT_NEAR(split.client_us(), 1.0 + 3.0 + (7.0 - 3.0) / 9, 1e-9);
  split.SendTook(1.0);
  split.Answered(20.0, 1000.0);
  EXPECT_NEAR(
      split.client_us(),
      1.0 + (3.0 + 4.0 / 9) + (4 * (3.0 + 4.0 / 9) - (3.0 + 4.0 / 9)) / 10,
      1e-9);
}

// RPCs that come back later than kSlack times what the client needs to
// work through the operations in flight one-sided (a server busy with
// another load) stop the split but for its probes; it resumes once they
// come back sooner, and a deeper queue allows a longer latency.
TEST(DepthSplit, StopsWhileRpcsComeBackMuchLaterThanTheClientsOwnQueue) {
  DepthSplit split;
  for (size_t i = 0; i < DepthSplit::kWarmup + DepthSplit::kProbes; ++i) {
    split.SendTook(0.5);
    split.Answered(2000.0, 0.5);
  }
  EXPECT_NEAR(split.latency_us(), 2000.0, 1e-9);
  // 16 in flight at 5 us one-sided: 80 us of the client's work; 2 ms is
  // past 8 times that.
  int rpcs = 0;
  for (int i = 0; i < 2 * int(DepthSplit::kProbeEvery); ++i) {
    rpcs += split.TakeRpc(16, 5.0);
  }
  EXPECT_EQ(rpcs, 2);
  // At 64 in flight of 5 us, 2 ms is within 8 times the client's 320 us.
  EXPECT_TRUE(split.TakeRpc(64, 5.0));
  // Answers that come back in 50 us bring the average down (each clipped
  // sample moves it a ninth, then a sixteenth, of the way) until it splits
  // again.
  int answers = 0;
  while (!split.TakeRpc(16, 5.0) || split.latency_us() > 640.0) {
    split.Answered(50.0, 0.5);
    ASSERT_LT(++answers, 200);
  }
  EXPECT_LE(split.latency_us(), 8 * 16 * 5.0);
}

}  // namespace
}  // namespace remem::client
