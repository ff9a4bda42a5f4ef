#include "bench_curve.h"

#include <algorithm>
#include <charconv>

namespace remem::bench {

Result<std::vector<int>> ParseCountList(std::string_view text, int lo, int hi,
                                        std::string_view what) {
  std::vector<int> out;
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(what) + ": " + std::string(why) +
                                   " in '" + std::string(text) + "'");
  };
  size_t at = 0;
  while (true) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, end - at);
    int v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size()) {
      return bad("'" + std::string(item) + "' is not a number");
    }
    if (v < lo || v > hi) {
      return bad(std::to_string(v) + " is not in [" + std::to_string(lo) +
                 ", " + std::to_string(hi) + "]");
    }
    if (std::find(out.begin(), out.end(), v) != out.end()) {
      return bad(std::to_string(v) + " is given twice");
    }
    out.push_back(v);
    if (end == text.size()) break;
    at = end + 1;
  }
  return out;
}

std::vector<CurvePoint> ExpandPoints(const std::vector<int>& depths,
                                     const std::vector<int>& batches) {
  std::vector<CurvePoint> out;
  out.reserve(depths.size() * batches.size());
  for (int d : depths) {
    for (int b : batches) out.push_back(CurvePoint{d, b});
  }
  return out;
}

std::optional<size_t> BestSample(const std::vector<CurveSample>& samples,
                                 const std::string& system) {
  std::optional<size_t> best;
  for (size_t i = 0; i < samples.size(); ++i) {
    const CurveSample& s = samples[i];
    if (!s.ok || s.system != system) continue;
    if (!best) {
      best = i;
      continue;
    }
    const CurveSample& b = samples[*best];
    if (s.ops_per_s > b.ops_per_s ||
        (s.ops_per_s == b.ops_per_s &&
         s.point.in_flight() < b.point.in_flight())) {
      best = i;
    }
  }
  return best;
}

std::optional<size_t> SampleAt(const std::vector<CurveSample>& samples,
                               const std::string& system, CurvePoint point) {
  for (size_t i = 0; i < samples.size(); ++i) {
    const CurveSample& s = samples[i];
    if (s.ok && s.system == system && s.point == point) return i;
  }
  return std::nullopt;
}

std::optional<double> BestRatio(const std::vector<CurveSample>& samples,
                                const std::string& a, const std::string& b) {
  auto ia = BestSample(samples, a), ib = BestSample(samples, b);
  if (!ia || !ib || samples[*ib].ops_per_s <= 0) return std::nullopt;
  return samples[*ia].ops_per_s / samples[*ib].ops_per_s;
}

}  // namespace remem::bench
