#include "bench_clock.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace remem::bench {

namespace {

#if defined(__x86_64__)
// One reading of the counter and of steady_clock taken together: the
// counter read between two clock reads that are at most 2 µs apart (a
// thread preempted between them would skew the scale), the clock taken as
// their midpoint. False if no try of 100 managed it.
bool ReadTogether(uint64_t* ns, uint64_t* ticks) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t before = testing::NowNs();
    const uint64_t t = __rdtsc();
    const uint64_t after = testing::NowNs();
    if (after - before <= 2000) {
      *ns = before + (after - before) / 2;
      *ticks = t;
      return true;
    }
  }
  return false;
}
#endif

}  // namespace

const RequestClock& GetRequestClock() {
  static const RequestClock clock = [] {
    RequestClock c;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (__get_cpuid(0x80000007, &a, &b, &cx, &d) == 0 || (d & (1u << 8)) == 0) {
      return c;  // no invariant counter: steady_clock
    }
    uint64_t t0, c0, t1, c1;
    if (!ReadTogether(&t0, &c0)) return c;
    while (testing::NowNs() - t0 < 20'000'000) {
    }
    if (!ReadTogether(&t1, &c1) || c1 <= c0) return c;
    const double scale = double(t1 - t0) / double(c1 - c0);
    // A counter between 100 MHz and 20 GHz, or none.
    if (scale > 0.05 && scale < 10.0) {
      c.tsc = true;
      c.ns_per_tick = scale;
    }
#endif
    return c;
  }();
  return clock;
}

}  // namespace remem::bench
