// Histogram: a log-linear latency histogram in the manner of HdrHistogram
// (Debian packages no C/C++ HdrHistogram). Values are unsigned integers
// (remem records nanoseconds); each power-of-two range is split into 64
// linear buckets, so a reported percentile is within 1/64 (1.6%) of the
// true value, from 1 up to 2^63.
//
// Thread contract: not thread-safe; give each thread its own and Merge().

#ifndef REMEM_UTIL_HISTOGRAM_H_
#define REMEM_UTIL_HISTOGRAM_H_

#include <array>
#include <cstdint>

namespace remem {

class Histogram {
 public:
  void Record(uint64_t value);
  void Merge(const Histogram& other);
  void Clear();

  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  double mean() const;
  // Value at percentile `p` in [0, 100]: the upper edge of the bucket that
  // holds the p-th percentile sample (0 if empty).
  uint64_t Percentile(double p) const;

 private:
  static constexpr int kSubBits = 6;  // 64 buckets per power of two
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kBuckets = (64 - kSubBits + 1) * kSub;
  static int Index(uint64_t v);
  static uint64_t UpperEdge(int index);

  std::array<uint64_t, kBuckets> buckets_{};
  uint64_t count_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
  long double sum_ = 0;
};

}  // namespace remem

#endif  // REMEM_UTIL_HISTOGRAM_H_
