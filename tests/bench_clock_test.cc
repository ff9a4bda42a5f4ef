// remem-bench's request clock (tools/bench_clock): over an interval, its
// readings advance as steady_clock does, however the thread is preempted.

#include "bench_clock.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "testing/clock.h"

namespace remem::bench {
namespace {

TEST(BenchClock, RequestNsAdvancesAsSteadyClockDoes) {
  // Each RequestNs reading is bracketed by two steady_clock readings, so a
  // preemption widens the bounds instead of failing the test; the 1%
  // allows for the calibration's error (20 ms measured to within 2 µs at
  // each end: 0.02%).
  const uint64_t a0 = testing::NowNs();
  const uint64_t r0 = RequestNs();
  const uint64_t b0 = testing::NowNs();
  while (testing::NowNs() - b0 < 50'000'000) {
  }
  const uint64_t a1 = testing::NowNs();
  const uint64_t r1 = RequestNs();
  const uint64_t b1 = testing::NowNs();
  ASSERT_GT(r1, r0);
  const double elapsed = double(r1 - r0);
  const double least = double(a1 - b0), most = double(b1 - a0);
  EXPECT_GE(elapsed, least * 0.99) << "least " << least << " most " << most;
  EXPECT_LE(elapsed, most * 1.01) << "least " << least << " most " << most;
}

}  // namespace
}  // namespace remem::bench
