#include "client/path_selector.h"

#include <algorithm>
#include <cmath>

namespace remem::client {

PathSelector::PathSelector(PathSelectorOptions options)
    : options_(options), rng_(options.seed | 1) {
  if (options_.window == 0) options_.window = 1;
  for (History& h : hist_) {
    h.ring.assign(options_.window, 0.0);
    h.warmup_left = options_.warmup;
  }
}

void PathSelector::History::Clear() {
  next = count = 0;
  sum = sum_sq = 0;
  kept_in_period = discarded_in_period = 0;
  ever = false;
}

double PathSelector::History::StdDev() const {
  if (count < 2) return 0;
  double mean = Mean();
  double var = sum_sq / count - mean * mean;
  return var > 0 ? std::sqrt(var) : 0;
}

double PathSelector::Uniform() {
  // xorshift64*: cheap, and deterministic for a given seed.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return static_cast<double>((rng_ * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

Path PathSelector::Choose(Clock::time_point now) {
  Path pick;
  exploring_ = false;
  if (options_.mode == remem::ReadPath::kOneSided) {
    pick = Path::kOneSided;
  } else if (options_.mode == remem::ReadPath::kRpc) {
    pick = Path::kRpc;
  } else {
    for (History& h : hist_) {
      if (h.ever && now - h.last > options_.idle_reset) {
        h.Clear();
        ++counters_.resets;
      }
    }
    History& os = hist_[int(Path::kOneSided)];
    History& rpc = hist_[int(Path::kRpc)];
    if (os.count < options_.min_samples || rpc.count < options_.min_samples) {
      // Build a minimal history of both: the one with fewer samples.
      pick = os.count <= rpc.count ? Path::kOneSided : Path::kRpc;
    } else if (burst_left_ > 0) {
      --burst_left_;
      pick = burst_path_;
      exploring_ = true;
    } else {
      pick = os.Mean() <= rpc.Mean() ? Path::kOneSided : Path::kRpc;
      if (Uniform() < options_.explore && ExploreAllowed(pick, now)) {
        pick = pick == Path::kOneSided ? Path::kRpc : Path::kOneSided;
        ++counters_.explored;
        last_explored_ = now;
        explored_ever_ = true;
        burst_path_ = pick;
        exploring_ = true;
        burst_left_ =
            options_.explore_burst > 0 ? options_.explore_burst - 1 : 0;
      }
    }
  }
  ++counters_.chosen[int(pick)];
  return pick;
}

bool PathSelector::ExploreAllowed(Path chosen, Clock::time_point now) const {
  if (!explored_ever_) return true;
  const Path other = chosen == Path::kOneSided ? Path::kRpc : Path::kOneSided;
  auto gap =
      std::chrono::duration_cast<Clock::duration>(options_.explore_interval);
  if (options_.explore_time_share > 0 && options_.explore_time_share < 1) {
    // The burst's estimated cost, spread so that explorations take at most
    // the share of the time (and never more than a minute apart).
    const double burst_us =
        Estimate(other) * double(std::max<size_t>(options_.explore_burst, 1)) /
        options_.explore_time_share;
    gap = std::max(gap, std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double, std::micro>(
                                std::min(burst_us, 60e6))));
  }
  return now - last_explored_ >= gap;
}

void PathSelector::Record(Path path, double latency_us, Clock::time_point now) {
  History& h = hist_[int(path)];
  h.last = now;
  h.ever = true;
  if (h.warmup_left > 0) {
    --h.warmup_left;
    ++counters_.warmup_discarded;
    return;
  }
  if (h.count >= options_.min_samples) {
    double sd = h.StdDev();
    if (sd > 0 && std::fabs(latency_us - h.Mean()) >= options_.outlier_k * sd) {
      ++counters_.outliers;
      ++h.discarded_in_period;
      if (h.discarded_in_period > h.kept_in_period &&
          h.discarded_in_period + h.kept_in_period >= options_.window) {
        // More discarded than kept over a whole window: the old history no
        // longer describes this path. Start again from this sample.
        h.Clear();
        ++counters_.resets;
      } else {
        return;
      }
    }
  }
  if (h.count == h.ring.size()) {
    double old = h.ring[h.next];
    h.sum -= old;
    h.sum_sq -= old * old;
  } else {
    ++h.count;
  }
  h.ring[h.next] = latency_us;
  h.next = (h.next + 1) % h.ring.size();
  h.sum += latency_us;
  h.sum_sq += latency_us * latency_us;
  if (h.next == 0) {
    // Once per lap, recompute the sums so rounding does not accumulate.
    h.sum = h.sum_sq = 0;
    for (double v : h.ring) {
      h.sum += v;
      h.sum_sq += v * v;
    }
  }
  h.ever = true;
  h.last = now;
  if (++h.kept_in_period + h.discarded_in_period >= options_.window) {
    h.kept_in_period = h.discarded_in_period = 0;
  }
}

double PathSelector::Estimate(Path path) const {
  return hist_[int(path)].Mean();
}

size_t PathSelector::Samples(Path path) const { return hist_[int(path)].count; }

Path PathTiming::Choose(PathSelector* selector, bool* timed,
                        Clock::time_point* start) {
  if (selector->mode() != remem::ReadPath::kAuto) {
    *timed = false;
    return selector->Choose(last_now_);
  }
  const Path p = selector->Choose(last_now_);
  *timed = p != last_path_ || selector->exploring() || Sample(*selector, p);
  last_path_ = p;
  if (*timed) {
    *start = Clock::now();
    last_now_ = *start;
  }
  return p;
}

bool PathTiming::Sample(const PathSelector& selector, Path path) {
  return selector.Samples(path) < 32 || (++counter_ & 7) == 0;
}

void PathTiming::Record(PathSelector* selector, Path path,
                        Clock::time_point start, double ops) {
  const Clock::time_point end = Clock::now();
  last_now_ = end;
  selector->Record(
      path,
      std::chrono::duration<double, std::micro>(end - start).count() / ops,
      end);
}

bool DepthSplit::TakeRpc(size_t in_flight, double onesided_us) {
  if (in_flight_ >= in_flight / 2) return false;
  if (measured_ >= kWarmup + kProbes &&
      (client_us() >= onesided_us ||
       latency_us_ > kSlack * static_cast<double>(in_flight) * onesided_us)) {
    // Not worth it now; one in kProbeEvery still goes, to notice a change.
    return ++declined_ % kProbeEvery == 0;
  }
  return true;
}

void DepthSplit::Average(double* avg, size_t n, double sample) {
  if (n < kWarmup) return;
  n -= kWarmup;
  // A sample is taken as at most kClip times the average, so one stall
  // (the client's thread preempted) moves it little, while a lasting change
  // still carries it, by up to a fifth a sample.
  if (n > 0) sample = std::min(sample, kClip * *avg);
  const double w = n < 16 ? 1.0 / static_cast<double>(n + 1) : 1.0 / 16;
  *avg += w * (sample - *avg);
}

void DepthSplit::SendTook(double us) { Average(&send_us_, sends_++, us); }

void DepthSplit::Answered(double latency_us, double us) {
  Dropped();
  Average(&latency_us_, measured_, latency_us);
  Average(&take_us_, measured_++, us);
}

}  // namespace remem::client
