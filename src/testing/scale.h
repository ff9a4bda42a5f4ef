// testing::Scaled: how many times a test repeats work whose count is about
// volume, not coverage (crash-loop iterations, restarts, storm clients).
// REMEM_TEST_SCALE=N divides those counts by N (./dev sets it under the
// sanitizers, which run the same code paths several times slower); unset
// or 1: the full counts. Never below `minimum`. ScaleDivisor: that N, for
// a test that checks one item in N of a set it must build whole.
//
// Thread contract: any thread (it reads the environment).

#ifndef REMEM_TESTING_SCALE_H_
#define REMEM_TESTING_SCALE_H_

#include <algorithm>
#include <cstdlib>

namespace remem::testing {

inline int ScaleDivisor() {
  const char* v = std::getenv("REMEM_TEST_SCALE");
  return v != nullptr ? std::max(1, std::atoi(v)) : 1;
}

inline int Scaled(int count, int minimum = 1) {
  return std::max(minimum, count / ScaleDivisor());
}

// Built with AddressSanitizer or ThreadSanitizer (gcc's macros, clang's
// __has_feature): for the few tests the sanitizers' runtimes cannot take
// part in (a limit of address space, no descriptors left).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace remem::testing

#endif  // REMEM_TESTING_SCALE_H_
