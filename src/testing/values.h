// Self-describing values for the race tests (testing/race.h, and the
// hash store's reader processes): "key|seq|len|" then a filler derived from
// seq, padded to len. Any read can be checked on its own: a torn value
// (bytes of two writes), a phantom (a value never written for that key) or
// a truncated one fails WellFormedValue.
//
// Thread contract: pure functions; any thread.

#ifndef REMEM_TESTING_VALUES_H_
#define REMEM_TESTING_VALUES_H_

#include <algorithm>
#include <cstdint>
#include <string>

namespace remem::testing {

inline std::string SelfDescribingValue(const std::string& key, uint64_t seq,
                                       size_t len) {
  std::string v =
      key + "|" + std::to_string(seq) + "|" + std::to_string(len) + "|";
  v.resize(std::max(len, v.size()), char('a' + seq % 26));
  return v;
}

inline bool WellFormedValue(const std::string& key, const std::string& v) {
  const size_t a = v.find('|');
  if (a == std::string::npos || v.compare(0, a, key) != 0) return false;
  const size_t b = v.find('|', a + 1);
  if (b == std::string::npos) return false;
  const size_t c = v.find('|', b + 1);
  if (c == std::string::npos || b == a + 1 || c == b + 1 || c - b > 12 ||
      b - a > 21) {
    return false;
  }
  for (size_t i = a + 1; i < c; ++i) {
    if (i != b && (v[i] < '0' || v[i] > '9')) return false;
  }
  const uint64_t seq = std::stoull(v.substr(a + 1, b - a - 1));
  const size_t len = std::stoull(v.substr(b + 1, c - b - 1));
  return v == SelfDescribingValue(key, seq, len);
}

}  // namespace remem::testing

#endif  // REMEM_TESTING_VALUES_H_
