// testing::NowNs: the one clock of remem's tests and benchmarks.
//
// std::chrono::steady_clock is CLOCK_MONOTONIC on Linux, so times taken in
// different processes of one host compare directly (the liveness test
// compares a reader process's timestamps with its own).
//
// Thread contract: a pure function; any thread.

#ifndef REMEM_TESTING_CLOCK_H_
#define REMEM_TESTING_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace remem::testing {

// Nanoseconds of CLOCK_MONOTONIC.
inline uint64_t NowNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

}  // namespace remem::testing

#endif  // REMEM_TESTING_CLOCK_H_
