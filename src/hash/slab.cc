#include "hash/slab.h"

#include <cstring>

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

SlabAllocator::SlabAllocator(uint8_t* base, uint64_t length,
                             uint64_t region_offset, uint64_t page_size)
    : base_(base),
      length_(length),
      region_offset_(region_offset),
      page_size_(page_size),
      free_(Classes().size()) {}

int SlabAllocator::NumClasses() { return int(Classes().size()); }
uint64_t SlabAllocator::ClassSize(int c) { return Classes()[size_t(c)]; }

int SlabAllocator::ClassFor(uint64_t bytes) {
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

Result<SlabAllocator::Extent> SlabAllocator::Allocate(uint64_t bytes) {
  int c = ClassFor(bytes);
  if (c < 0) {
    return Status::InvalidArgument("extent of " + std::to_string(bytes) +
                                   " bytes exceeds the largest size class");
  }
  auto& list = free_[size_t(c)];
  if (list.empty()) {
    const uint64_t size = ClassSize(c);
    const uint64_t page = size > page_size_ ? size : page_size_;
    if (length_ - next_ < page) {
      return Status::OutOfMemory("the store's memory is full");
    }
    // Pushed in reverse so extents are handed out in address order.
    for (uint64_t i = page / size; i-- > 0;) {
      list.push_back(region_offset_ + next_ + i * size);
    }
    next_ += page;
  }
  uint64_t offset = list.back();
  list.pop_back();
  in_use_ += ClassSize(c);
  ExtentHeader h;
  LoadWords(&h, At(offset), sizeof(h));
  uint32_t inc = h.incarnation == 0 ? 1 : h.incarnation;  // 0: fresh memory
  return Extent{offset, uint16_t(c), inc};
}

Result<uint64_t> SlabAllocator::Carve(uint64_t bytes) {
  const uint64_t rounded = (bytes + page_size_ - 1) / page_size_ * page_size_;
  if (length_ - next_ < rounded) {
    return Status::OutOfMemory("the store's memory is full");
  }
  const uint64_t offset = region_offset_ + next_;
  next_ += rounded;
  return offset;
}

void SlabAllocator::Free(uint64_t offset, uint16_t size_class) {
  auto* h = reinterpret_cast<ExtentHeader*>(At(offset));
  // Header word 1 holds incarnation and key_len: bump the incarnation and
  // leave the checksum stale, so the old content no longer verifies.
  ExtentHeader copy;
  LoadWords(&copy, h, sizeof(copy));
  copy.incarnation = copy.incarnation + 1 == 0 ? 1 : copy.incarnation + 1;
  StoreWords(reinterpret_cast<uint8_t*>(h) + 8,
             reinterpret_cast<uint8_t*>(&copy) + 8, 8);
  in_use_ -= ClassSize(size_class);
  free_[size_class].push_back(offset);
}

}  // namespace remem::hash
