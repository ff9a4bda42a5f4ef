#include "util/histogram.h"

#include <bit>

namespace remem {

// Values below kSub map 1:1 to the first kSub buckets; above, the top
// kSubBits+1 significant bits pick the bucket within the value's octave.
int Histogram::Index(uint64_t v) {
  if (v < kSub) return static_cast<int>(v);
  int msb = 63 - std::countl_zero(v);  // >= kSubBits
  int shift = msb - kSubBits;          // bits dropped
  int octave = shift + 1;              // 1.. for v >= kSub
  int sub = static_cast<int>((v >> shift) & (kSub - 1));
  return octave * kSub + sub;
}

uint64_t Histogram::UpperEdge(int index) {
  if (index < kSub) return static_cast<uint64_t>(index);
  int octave = index / kSub;
  int sub = index % kSub;
  int shift = octave - 1;
  uint64_t base = (uint64_t{1} << (shift + kSubBits)) |
                  (static_cast<uint64_t>(sub) << shift);
  return base + ((uint64_t{1} << shift) - 1);
}

void Histogram::Record(uint64_t v) {
  ++buckets_[Index(v)];
  ++count_;
  if (v < min_) min_ = v;
  if (v > max_) max_ = v;
  sum_ += v;
}

void Histogram::Merge(const Histogram& o) {
  for (int i = 0; i < kBuckets; ++i) buckets_[i] += o.buckets_[i];
  count_ += o.count_;
  if (o.count_ && o.min_ < min_) min_ = o.min_;
  if (o.max_ > max_) max_ = o.max_;
  sum_ += o.sum_;
}

void Histogram::Clear() { *this = Histogram(); }

double Histogram::mean() const {
  return count_ ? static_cast<double>(sum_ / count_) : 0.0;
}

uint64_t Histogram::Percentile(double p) const {
  if (count_ == 0) return 0;
  if (p <= 0) return min_;
  uint64_t rank = static_cast<uint64_t>(p / 100.0 * count_ + 0.5);
  if (rank < 1) rank = 1;
  if (rank > count_) rank = count_;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i];
    if (seen >= rank) {
      uint64_t edge = UpperEdge(i);
      return edge > max_ ? max_ : edge;
    }
  }
  return max_;
}

}  // namespace remem
