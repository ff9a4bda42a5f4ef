// Keys for order tests: a prefix, then up to `max_extra` bytes drawn from
// the bytes that trouble comparisons (zero, which padding cannot tell from
// an end; one; two letters; 0xff, the largest).
//
// Thread contract: pure functions over the caller's generator.

#ifndef REMEM_TESTING_KEYS_H_
#define REMEM_TESTING_KEYS_H_

#include <cstddef>
#include <random>
#include <string>

namespace remem::testing {

inline std::string EdgeByteKey(std::mt19937_64& rng, const std::string& prefix,
                               size_t max_extra) {
  static const std::string kAlphabet("\0\1az\xff", 5);
  std::string k = prefix;
  const size_t extra = rng() % (max_extra + 1);
  for (size_t i = 0; i < extra; ++i) k += kAlphabet[rng() % kAlphabet.size()];
  return k;
}

}  // namespace remem::testing

#endif  // REMEM_TESTING_KEYS_H_
