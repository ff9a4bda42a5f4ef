// YCSB building blocks for remem-bench, with no I/O: the workload mixes
// (A-F), the key choosers (uniform, scrambled zipfian, latest), the key
// names and the self-checking values. Kept apart from the runner so the
// unit test (tests/bench_ycsb_gen_test.cc) needs no driver library.
//
// Thread contract: Rng, Zipfian and the choosers are single-threaded (one
// per client thread); the only shared state is the atomic key count a
// latest chooser reads. The free functions are thread-safe.

#ifndef REMEM_TOOLS_BENCH_YCSB_GEN_H_
#define REMEM_TOOLS_BENCH_YCSB_GEN_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem::bench::ycsb {

// splitmix64: tiny, fast and seedable, so every system sees the same key
// sequence for the same seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return double(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

// 64-bit FNV-1a over the 8 little-endian bytes of `v` (YCSB's fnvhash64
// hashes a long this way before scrambling).
uint64_t Fnv1a64(uint64_t v);

// zeta(n, theta) = sum_{i=1..n} 1/i^theta. Computed once per (n, theta)
// and cached (~20 ms for 10^6 items).
double Zeta(uint64_t n, double theta);

// Zipfian over [0, n) after Gray et al., "Quickly generating billion-record
// synthetic databases" (the method YCSB's ZipfianGenerator uses): item 0
// is the most popular. Next(rng, n) lets n grow (for "latest"): zeta is
// extended incrementally rather than recomputed.
class Zipfian {
 public:
  Zipfian(uint64_t n, double theta);
  // With zeta(n, theta) already known (for item spaces too large to sum).
  Zipfian(uint64_t n, double theta, double zetan);
  uint64_t Next(Rng& rng);
  uint64_t Next(Rng& rng, uint64_t n);
  uint64_t items() const { return n_; }

 private:
  void Derive();
  uint64_t n_;
  double theta_, zetan_, zeta2_, alpha_, eta_;
};

// zeta(10^10, 0.99): YCSB's scrambled zipfian draws from 10^10 items (too
// many to sum at start-up) and publishes this value. tests/ checks it
// against an Euler-Maclaurin estimate.
inline constexpr uint64_t kScrambledItems = 10'000'000'000ull;
inline constexpr double kScrambledZeta = 26.46902820178302;

enum class Distribution { kUniform, kZipfian, kLatest };
std::string_view DistributionName(Distribution d);
Result<Distribution> ParseDistribution(std::string_view name);

// Picks the record number of the next read or update.
class KeyChooser {
 public:
  virtual ~KeyChooser() = default;
  virtual uint64_t Next(Rng& rng) = 0;
};
// uniform: over [0, *count). zipfian: YCSB's scrambled zipfian (theta
// 0.99 over 10^10 items, FNV-1a hashed, mod `records`), so the hot keys are
// spread over the key space. latest: zipfian over recency, newest first,
// relative to *count (the keys that exist, loaded plus inserted).
std::unique_ptr<KeyChooser> MakeChooser(Distribution d, uint64_t records,
                                        const std::atomic<uint64_t>* count);

// Key of record `n`: "user" then a hashed form of n in hex, zero-padded to
// fill `key_size` bytes. The hash is a bijection on the digits available
// (not FNV), so distinct records never share a key even at 8-byte keys.
// Requires 8 <= key_size; n < KeyCapacity(key_size).
void KeyName(uint64_t n, size_t key_size, std::string* out);
uint64_t KeyCapacity(size_t key_size);

// A value of `size` bytes that depends only on (key, generation): the
// first 8 bytes carry the generation in hex (4 bytes and its low 16 bits
// for values under 16 bytes; none under 8), the rest are derived from the
// key and the generation. CheckValue verifies any value written that way,
// whatever its generation (so concurrent writers need no coordination).
void MakeValue(std::string_view key, uint32_t generation, size_t size,
               std::string* out);
bool CheckValue(std::string_view key, std::string_view value, size_t size);

// A YCSB core workload. Proportions add up to 1. A scan reads up to
// 1..max_scan keys (uniform, YCSB's scanlengthdistribution) in key order
// from a start key the distribution picks.
struct Workload {
  char name = 'C';
  double read = 1, update = 0, insert = 0, rmw = 0, scan = 0;
  uint32_t max_scan = 100;  // YCSB's maxscanlength
  Distribution distribution = Distribution::kZipfian;
  // Needs a store that keeps keys in order (remem's ordered store, a Redis
  // sorted set).
  bool ordered() const { return scan > 0; }
};
// A to F, as YCSB's core workloads.
Result<Workload> WorkloadByName(std::string_view name);

}  // namespace remem::bench::ycsb

#endif  // REMEM_TOOLS_BENCH_YCSB_GEN_H_
