#include "hash/size_classes.h"

#include <vector>

#include "hash/layout.h"

namespace remem::hash {

namespace {

// Largest pair: 64 KiB key + 16 MiB value + header, so classes reach it.
constexpr uint64_t kMaxExtent =
    sizeof(ExtentHeader) + (64u << 10) + (16u << 20);

std::vector<uint64_t> BuildClasses() {
  std::vector<uint64_t> sizes;
  uint64_t s = 64;
  while (true) {
    sizes.push_back(s);
    if (s >= kMaxExtent) break;
    uint64_t next = (s + s / 4 + 63) & ~uint64_t{63};
    s = next > s ? next : s + 64;
  }
  return sizes;
}

const std::vector<uint64_t>& Classes() {
  static const std::vector<uint64_t> c = BuildClasses();
  return c;
}

}  // namespace

int NumSizeClasses() { return int(Classes().size()); }
uint64_t SizeClassBytes(int c) { return Classes()[size_t(c)]; }

int SizeClassFor(uint64_t bytes) {
  const auto& c = Classes();
  size_t lo = 0, hi = c.size();
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c[mid] < bytes) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo == c.size() ? -1 : int(lo);
}

}  // namespace remem::hash
