// remem-bench compare's curve: which (depth, batch) points a run covers and
// which point is each system's best, so the headline compares each system
// at its best rather than all of them at one request in flight. Pure
// functions, no clients or servers (tests/bench_curve_test.cc).
//
// Thread contract: free functions.

#ifndef REMEM_TOOLS_BENCH_CURVE_H_
#define REMEM_TOOLS_BENCH_CURVE_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::bench {

// Requests in flight per client thread (depth) times keys per read request
// (batch).
struct CurvePoint {
  int depth = 1;
  int batch = 1;
  // Keys in flight per client thread: the plot's x axis.
  int in_flight() const { return depth * batch; }
  bool operator==(const CurvePoint&) const = default;
};

// --curve: depth 1, 4, 16, 64 by batch 1, 16.
inline constexpr int kCurveDepths[] = {1, 4, 16, 64};
inline constexpr int kCurveBatches[] = {1, 16};

// "1,4,16" (or "8"): distinct integers in [lo, hi], in the order given.
// `what` names the flag in errors.
Result<std::vector<int>> ParseCountList(std::string_view text, int lo, int hi,
                                        std::string_view what);

// Every depth with every batch, depth-major: (1,1) (1,16) (4,1) ...
std::vector<CurvePoint> ExpandPoints(const std::vector<int>& depths,
                                     const std::vector<int>& batches);

// One measured point of one system, for one workload and value size.
struct CurveSample {
  std::string system;
  CurvePoint point;
  double ops_per_s = 0;
  bool ok = false;  // the run succeeded (failed runs are never "best")
};

// `system`'s successful sample with the highest throughput; between equal
// throughputs, the one with fewer keys in flight (its latency is lower).
std::optional<size_t> BestSample(const std::vector<CurveSample>& samples,
                                 const std::string& system);
// `system`'s successful sample at `point`.
std::optional<size_t> SampleAt(const std::vector<CurveSample>& samples,
                               const std::string& system, CurvePoint point);
// a's best throughput over b's best (each at its own point); nullopt when
// either has no successful sample or b's best is 0.
std::optional<double> BestRatio(const std::vector<CurveSample>& samples,
                                const std::string& a, const std::string& b);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_CURVE_H_
