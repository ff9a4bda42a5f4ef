#include "bench_ycsb_gen.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace remem::bench::ycsb {

uint64_t Fnv1a64(uint64_t v) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int i = 0; i < 8; ++i) {
    h ^= v & 0xff;
    h *= 0x100000001B3ull;
    v >>= 8;
  }
  return h;
}

namespace {

double ZetaRange(uint64_t from, uint64_t to, double theta, double sum) {
  for (uint64_t i = from; i < to; ++i)
    sum += 1.0 / std::pow(double(i + 1), theta);
  return sum;
}

}  // namespace

double Zeta(uint64_t n, double theta) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, double>, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache.try_emplace({n, theta}, 0.0);
  if (fresh) it->second = ZetaRange(0, n, theta, 0.0);
  return it->second;
}

Zipfian::Zipfian(uint64_t n, double theta)
    : Zipfian(n, theta, Zeta(n, theta)) {}

Zipfian::Zipfian(uint64_t n, double theta, double zetan)
    : n_(n), theta_(theta), zetan_(zetan) {
  zeta2_ = ZetaRange(0, 2, theta, 0.0);
  alpha_ = 1.0 / (1.0 - theta_);
  Derive();
}

void Zipfian::Derive() {
  eta_ = (1.0 - std::pow(2.0 / double(n_), 1.0 - theta_)) /
         (1.0 - zeta2_ / zetan_);
}

uint64_t Zipfian::Next(Rng& rng) {
  const double u = rng.Uniform();
  const double uz = u * zetan_;
  if (uz < 1.0) return 0;
  if (uz < 1.0 + std::pow(0.5, theta_)) return n_ > 1 ? 1 : 0;
  auto v = uint64_t(double(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_));
  return v < n_ ? v : n_ - 1;
}

uint64_t Zipfian::Next(Rng& rng, uint64_t n) {
  if (n > n_) {
    // Inserts only ever grow n by a little: extend the sum.
    zetan_ = ZetaRange(n_, n, theta_, zetan_);
    n_ = n;
    Derive();
  }
  return Next(rng);
}

std::string_view DistributionName(Distribution d) {
  switch (d) {
    case Distribution::kUniform:
      return "uniform";
    case Distribution::kZipfian:
      return "zipfian";
    case Distribution::kLatest:
      return "latest";
  }
  return "?";
}

Result<Distribution> ParseDistribution(std::string_view name) {
  if (name == "uniform") return Distribution::kUniform;
  if (name == "zipfian") return Distribution::kZipfian;
  if (name == "latest") return Distribution::kLatest;
  return Status::InvalidArgument(
      "distribution must be uniform, zipfian or "
      "latest, not '" +
      std::string(name) + "'");
}

namespace {

class UniformChooser : public KeyChooser {
 public:
  explicit UniformChooser(const std::atomic<uint64_t>* count) : count_(count) {}
  uint64_t Next(Rng& rng) override {
    return rng.Next() % count_->load(std::memory_order_relaxed);
  }

 private:
  const std::atomic<uint64_t>* count_;
};

class ScrambledZipfianChooser : public KeyChooser {
 public:
  explicit ScrambledZipfianChooser(uint64_t records)
      : records_(records), zipf_(kScrambledItems, 0.99, kScrambledZeta) {}
  uint64_t Next(Rng& rng) override {
    return Fnv1a64(zipf_.Next(rng)) % records_;
  }

 private:
  uint64_t records_;
  Zipfian zipf_;
};

class LatestChooser : public KeyChooser {
 public:
  explicit LatestChooser(const std::atomic<uint64_t>* count)
      : count_(count), zipf_(count->load(), 0.99) {}
  uint64_t Next(Rng& rng) override {
    const uint64_t n = count_->load(std::memory_order_relaxed);
    return n - 1 - zipf_.Next(rng, n);
  }

 private:
  const std::atomic<uint64_t>* count_;
  Zipfian zipf_;
};

}  // namespace

std::unique_ptr<KeyChooser> MakeChooser(Distribution d, uint64_t records,
                                        const std::atomic<uint64_t>* count) {
  switch (d) {
    case Distribution::kUniform:
      return std::make_unique<UniformChooser>(count);
    case Distribution::kZipfian:
      return std::make_unique<ScrambledZipfianChooser>(records);
    case Distribution::kLatest:
      return std::make_unique<LatestChooser>(count);
  }
  return nullptr;
}

namespace {

int KeyBits(size_t key_size) {
  const size_t digits = key_size - 4;
  return int(digits >= 16 ? 64 : digits * 4);
}

}  // namespace

uint64_t KeyCapacity(size_t key_size) {
  const int bits = KeyBits(key_size);
  return bits == 64 ? UINT64_MAX : (uint64_t{1} << bits);
}

void KeyName(uint64_t n, size_t key_size, std::string* out) {
  // Multiplying by an odd constant and xor-shifting are both invertible
  // modulo 2^bits, so this mixes the bits without ever colliding.
  const int bits = KeyBits(key_size);
  const uint64_t mask = bits == 64 ? UINT64_MAX : (uint64_t{1} << bits) - 1;
  uint64_t x = n & mask;
  x = (x * 0x9E3779B97F4A7C15ull) & mask;
  x ^= x >> (bits / 2);
  x = (x * 0xBF58476D1CE4E5B9ull) & mask;
  x ^= x >> (bits / 2 + 1);
  // Two digits a step from the right, from a table of the 256 byte values
  // (the key is made once per operation: digit by digit it was a twentieth
  // of a batched get's client time); digits past x's are '0'.
  static constexpr auto kPairs = [] {
    std::array<char, 512> t{};
    constexpr char kHex[] = "0123456789abcdef";
    for (int b = 0; b < 256; ++b) {
      t[size_t(2 * b)] = kHex[b >> 4];
      t[size_t(2 * b + 1)] = kHex[b & 15];
    }
    return t;
  }();
  out->resize(key_size);
  char* p = out->data();
  std::memcpy(p, "user", 4);
  size_t i = key_size;
  for (; i >= 6; i -= 2, x >>= 8) {
    std::memcpy(p + i - 2, &kPairs[size_t(x & 0xff) * 2], 2);
  }
  if (i == 5) p[4] = kPairs[size_t(x & 15) * 2 + 1];
}

namespace {

// Eight bytes at a time (a scan's check hashes 50 keys: byte-wise FNV-1a's
// sixteen dependent multiplies per key were a tenth of the client's time).
uint64_t HashKey(std::string_view key, uint32_t generation) {
  uint64_t h =
      0xCBF29CE484222325ull ^ (uint64_t{generation} << 32) ^ key.size();
  size_t i = 0;
  for (; i + 8 <= key.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, key.data() + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  if (i < key.size()) {
    uint64_t w = 0;
    std::memcpy(&w, key.data() + i, key.size() - i);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return h;
}

// Eight filler bytes from one draw: each byte's low six bits plus '0'
// (48 + 63 fits a byte, so no byte carries into the next).
uint64_t FillerWord(Rng* rng) {
  return (rng->Next() & 0x3F3F3F3F3F3F3F3Full) + 0x3030303030303030ull;
}

// The filler after the 8-byte generation: printable, from a seeded stream.
void Fill(std::string_view key, uint32_t generation, char* out, size_t n) {
  Rng rng(HashKey(key, generation));
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = FillerWord(&rng);
    std::memcpy(out + i, &w, std::min<size_t>(8, n - i));
  }
}

}  // namespace

namespace {

// Hex digits of generation at the head of a value: 8, or 4 for values of
// 8..15 bytes (so some filler remains to check), none below 8 bytes.
size_t HeadLength(size_t size) { return size >= 16 ? 8 : size >= 8 ? 4 : 0; }

}  // namespace

void MakeValue(std::string_view key, uint32_t generation, size_t size,
               std::string* out) {
  out->resize(size);
  const size_t head = HeadLength(size);
  if (head < 8) generation &= head == 4 ? 0xFFFF : 0;
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < head; ++i) {
    (*out)[i] = kHex[(generation >> (4 * (head - 1 - i))) & 15];
  }
  Fill(key, generation, out->data() + head, size - head);
}

bool CheckValue(std::string_view key, std::string_view value, size_t size) {
  if (value.size() != size) return false;
  uint32_t generation = 0;
  const size_t head = HeadLength(size);
  for (size_t i = 0; i < head; ++i) {
    const char c = value[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return false;
    generation = (generation << 4) | uint32_t(d);
  }
  // Regenerate the filler a word at a time and compare.
  Rng rng(HashKey(key, generation));
  for (size_t at = head; at < size; at += 8) {
    const uint64_t w = FillerWord(&rng);
    if (size - at >= 8) {
      uint64_t got;
      std::memcpy(&got, value.data() + at, 8);
      if (got != w) return false;
    } else if (std::memcmp(&w, value.data() + at, size - at) != 0) {
      return false;
    }
  }
  return true;
}

Result<Workload> WorkloadByName(std::string_view name) {
  if (name.size() != 1) {
    return Status::InvalidArgument(
        "workload must be one of A B C D E F, not '" + std::string(name) + "'");
  }
  Workload w;
  w.name = char(std::toupper(static_cast<unsigned char>(name[0])));
  switch (w.name) {
    case 'A':
      w.read = 0.5, w.update = 0.5;
      return w;
    case 'B':
      w.read = 0.95, w.update = 0.05;
      return w;
    case 'C':
      return w;
    case 'D':
      w.read = 0.95, w.insert = 0.05;
      w.distribution = Distribution::kLatest;
      return w;
    case 'E':
      // YCSB's workloade: scans of 1..100 keys (uniform) from a zipfian
      // start, and inserts of new keys.
      w.read = 0, w.scan = 0.95, w.insert = 0.05;
      return w;
    case 'F':
      w.read = 0.5, w.rmw = 0.5;
      return w;
  }
  return Status::InvalidArgument("workload must be one of A B C D E F, not '" +
                                 std::string(name) + "'");
}

}  // namespace remem::bench::ycsb
