// client::PathSelector: chooses, per server connection and per kind of
// read, between the one-sided path (the client reads server memory itself)
// and the RPC path (the server does the lookup), from measured latencies.
//
// This is Cell's locality selector (ATC'16, section 3.4) with one change.
// Cell compares queueing delays, l_s - RTT against m * (l_r - RTT), because
// on RDMA both paths pay similar round trips. Under UCX, a one-sided read
// over tcp is itself a round trip served by the server's progress thread,
// so remem compares the measured latency of the *whole operation* on each
// path (all one-sided reads and retries included) and joins the shorter
// queue. What Cell's refinements do is kept:
//   - a moving average over the last `window` samples of each path;
//   - outlier rejection: a sample s with |s - mean| >= k * stddev is
//     discarded; if a window discards more samples than it keeps, the
//     path's history is dropped (conditions changed);
//   - exploration: with probability `explore` the path estimated worse is
//     taken, so a change in conditions is noticed; remem adds a floor of
//     `explore_interval` between two explorations. At millions of gets a
//     second, 1% is tens of thousands of RPCs a second, which keep a
//     polling server spinning (its whole core, measured on shared memory)
//     and tell no more than a thousand would. An exploration may also be a
//     burst of `explore_burst` operations in a row (1 by default, Cell's):
//     a path whose speed depends on state its own operations keep warm
//     (the ordered store's cached nodes) measures slower when taken once
//     between operations of the other. And explorations take at most
//     `explore_time_share` of the time: the next waits at least the
//     explored path's estimated cost of a burst divided by that share.
//     Cell's 1% of operations assumes paths of like cost: with the server's
//     core saturated by another load an RPC took 4 ms against a one-sided
//     get's 1 us, and 1% of gets (in bursts of 32) spent nearly all the
//     time in RPCs (auto: 764 gets/s where one-sided did 948,000);
//   - a path not sampled for `idle_reset` loses its history.
// Warm-up: the first `warmup` samples of a path are discarded (the first
// gets pay for page faults on a fresh mapping and lazy transport setup, and
// one such sample in a short history would hide the faster path for
// thousands of operations at 1% exploration), and until both paths have
// `min_samples` samples the selector alternates between them. Forced modes
// (kOneSided, kRpc) always answer that path (the RPC path forced is
// Pilaf-VO, the control).
//
// Thread contract: not thread-safe; one per store and kind of read, used on
// the thread of its Session.

#ifndef REMEM_CLIENT_PATH_SELECTOR_H_
#define REMEM_CLIENT_PATH_SELECTOR_H_

#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"

namespace remem::client {

// The path one operation takes (the mode that chooses it is the public
// remem::ReadPath: auto, or one of these forced).
enum class Path { kOneSided = 0, kRpc = 1 };

struct PathSelectorOptions {
  remem::ReadPath mode = remem::ReadPath::kAuto;
  size_t window = 100;     // samples in each moving average (Cell: 100)
  size_t min_samples = 8;  // before outlier rejection and comparison
  size_t warmup = 2;       // first samples of each path discarded
  double outlier_k = 3.0;  // Cell: K = 3
  double explore = 0.01;   // Cell: p = 1%
  std::chrono::nanoseconds explore_interval = std::chrono::milliseconds(1);
  size_t explore_burst = 1;  // operations in a row on the explored path
  // Of the time, at most (see above); 1 or more: no bound.
  double explore_time_share = 0.02;
  std::chrono::nanoseconds idle_reset = std::chrono::seconds(3);  // Cell: 3 s
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

class PathSelector {
 public:
  using Clock = std::chrono::steady_clock;

  explicit PathSelector(PathSelectorOptions options = {});

  // The path for the next operation.
  Path Choose(Clock::time_point now = Clock::now());
  // Reports how long an operation on `path` took, end to end.
  void Record(Path path, double latency_us,
              Clock::time_point now = Clock::now());

  // Current moving average of `path` in microseconds (0 if no history).
  double Estimate(Path path) const;
  size_t Samples(Path path) const;

  struct Counters {
    uint64_t chosen[2] = {0, 0};
    uint64_t explored = 0;
    uint64_t outliers = 0;
    uint64_t resets = 0;
    uint64_t warmup_discarded = 0;
  };
  const Counters& counters() const { return counters_; }
  // Whether the last Choose picked a path to explore it (an exploration
  // or an operation of its burst).
  bool exploring() const { return exploring_; }
  remem::ReadPath mode() const { return options_.mode; }

 private:
  struct History {
    std::vector<double> ring;
    size_t next = 0;
    size_t count = 0;
    double sum = 0;
    double sum_sq = 0;
    size_t kept_in_period = 0;
    size_t discarded_in_period = 0;
    size_t warmup_left = 0;
    Clock::time_point last;
    bool ever = false;
    void Clear();
    double Mean() const { return count ? sum / count : 0; }
    double StdDev() const;
  };
  double Uniform();
  // May an exploration of the path not `chosen` start at `now`?
  bool ExploreAllowed(Path chosen, Clock::time_point now) const;

  PathSelectorOptions options_;
  History hist_[2];
  uint64_t rng_;
  Clock::time_point last_explored_{};
  bool explored_ever_ = false;
  size_t burst_left_ = 0;  // further operations of the current exploration
  bool exploring_ = false;
  Path burst_path_ = Path::kOneSided;
  Counters counters_;
};

// Which operations a store times for a PathSelector. Two clock reads cost
// about a tenth of a one-sided get on shared memory, so once a path has
// 32 samples only every 8th operation on it is timed; a change of path (a
// switch) and every operation of an exploration (a burst of them: the
// first is cold) always are. The selector is given the last time read
// instead of a fresh one, which is enough for its 3 s idle reset. One per
// selector of single operations (a store's batches may share its clock).
//
// Thread contract: not thread-safe; the thread of the store that owns it.
class PathTiming {
 public:
  using Clock = PathSelector::Clock;

  // The path of the next operation on `selector`, and whether to time it
  // (*timed; then *start is now). In a forced mode nothing is timed.
  Path Choose(PathSelector* selector, bool* timed, Clock::time_point* start);
  // Whether to time the next operation (or window of them) on `path`, by
  // the 32 samples / every 8th rule alone.
  bool Sample(const PathSelector& selector, Path path);
  // Records on `selector` what was timed from `start`, divided among `ops`
  // operations, and keeps the time read as the last one.
  void Record(PathSelector* selector, Path path, Clock::time_point start,
              double ops = 1);
  // The last time read (by Choose or Record).
  Clock::time_point last_now() const { return last_now_; }

 private:
  Path last_path_ = Path::kOneSided;
  uint64_t counter_ = 0;
  Clock::time_point last_now_ = Clock::now();
};

// Splits operations between the client's core and the server's when
// several are in flight on shared memory. There a one-sided operation
// runs on the client's core inside the call that starts it, and an RPC on
// the server's core while the client goes on with others, so with
// operations queued the two paths are two workers, and comparing their
// latencies (PathSelector) sends everything to one of them while the
// other core idles. A DepthSplit sends an operation by RPC while fewer
// than half of the operations in flight are its RPCs, and the rest
// one-sided: the server always has RPCs queued, and the client works
// through the others meanwhile. A server slowed by another load keeps its
// RPCs longer, so it gets fewer and the client does the rest (one free
// slot keeps the client busy, since its operations complete in the call);
// those RPCs' latency is the slow server's.
//
// RPCs that do not pay stop, but for one in kProbeEvery of the operations
// that could go by RPC, kept to measure them (a change is seen at once):
//   - when sending an RPC and taking its answer cost the client as much as
//     doing the work itself (the one-sided estimate the caller passes);
//   - when RPCs take longer to come back than kSlack times what the client
//     needs to work through the operations in flight one-sided. The
//     server is then busy with other work (measured: another process on
//     its core made an RPC 2-3 ms against 40-550 us); RPCs would hold
//     their slots that long, and take the server's time from the writes
//     in flight, which only it can do (YCSB-E at depth 16, 5% inserts:
//     54 K scans/s split against 82 K one-sided).
// Both are measured on every RPC sent after the first kWarmup (the first
// RPCs of a session pay for its lazy setup), and trusted after kProbes
// more.
//
// Thread contract: not thread-safe; one per store and kind of read, used
// on the thread of its Session.
class DepthSplit {
 public:
  static constexpr size_t kWarmup = 8;
  static constexpr size_t kProbes = 8;
  static constexpr uint64_t kProbeEvery = 256;
  static constexpr double kSlack = 8;
  static constexpr double kClip = 4;

  // Whether the next operation goes by RPC, with `in_flight` operations
  // in flight (this one included) and the client's time per one-sided
  // operation `onesided_us`. If it does, call Sent() now, SendTook() once
  // the call has returned, and Answered() or Dropped() when it ends.
  bool TakeRpc(size_t in_flight, double onesided_us);
  void Sent() { ++in_flight_; }
  // Sending an RPC took the client `us` (the call, up to its return).
  void SendTook(double us);
  // An RPC's answer was taken `latency_us` after it was sent; taking it
  // cost the client `us`.
  void Answered(double latency_us, double us);
  // An RPC ended without an answer taken (an error).
  void Dropped() {
    if (in_flight_ > 0) --in_flight_;
  }

  // The client's time per RPC (send and answer), in microseconds (0 until
  // measured).
  double client_us() const { return send_us_ + take_us_; }
  // RPCs answered, the warm-up's included.
  size_t measured() const { return measured_; }
  size_t in_flight() const { return in_flight_; }
  // The RPCs' latency, from the send to the answer taken (0 until
  // measured).
  double latency_us() const { return latency_us_; }

 private:
  // Discards the first kWarmup samples; then each, clipped at kClip times
  // the average, moves it by a sixteenth (the first ones set it).
  static void Average(double* avg, size_t n, double sample);

  double send_us_ = 0;
  double take_us_ = 0;
  double latency_us_ = 0;
  size_t sends_ = 0;
  size_t measured_ = 0;
  size_t in_flight_ = 0;
  uint64_t declined_ = 0;
};

}  // namespace remem::client

#endif  // REMEM_CLIENT_PATH_SELECTOR_H_
