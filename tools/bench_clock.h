// remem-bench's clock for per-request latencies: RequestNs.
//
// Where the CPU says its time-stamp counter is invariant (x86-64: CPUID
// 0x80000007, EDX bit 8), the counter scaled to nanoseconds, calibrated
// against steady_clock over 20 ms at the first call; elsewhere steady_clock
// itself. Only differences of its readings mean anything, within one
// process. Why: the YCSB drivers stamp every request twice, and on this
// project's VM a precise steady_clock read costs 27-38 ns against 11 for
// the counter; two reads were an eighth to a sixth of an asynchronous
// one-sided get's time (docs/BENCHMARKS.md, "Prefetches in one burst, and
// the benchmark's own cost").
//
// Thread contract: any thread; the first call calibrates (thread-safe).

#ifndef REMEM_TOOLS_BENCH_CLOCK_H_
#define REMEM_TOOLS_BENCH_CLOCK_H_

#include <cstdint>

#include "testing/clock.h"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace remem::bench {

struct RequestClock {
  bool tsc = false;          // the counter is used
  double ns_per_tick = 0.0;  // its scale, when it is
};
// Calibrates once; later calls return the same.
const RequestClock& GetRequestClock();

inline uint64_t RequestNs() {
#if defined(__x86_64__)
  static const RequestClock& clock = GetRequestClock();
  if (clock.tsc) return uint64_t(double(__rdtsc()) * clock.ns_per_tick);
#endif
  return testing::NowNs();
}

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_CLOCK_H_
