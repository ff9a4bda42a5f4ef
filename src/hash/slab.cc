#include "hash/slab.h"

#include <algorithm>
#include <cstring>

#include "hash/layout.h"
#include "hash/size_classes.h"
#include "util/size.h"

namespace remem::hash {

SlabAllocator::SlabAllocator(uint8_t* base, uint64_t length,
                             uint64_t region_offset, uint64_t page_size)
    : base_(base),
      length_(length),
      region_offset_(region_offset),
      page_size_(page_size),
      free_(size_t(NumSizeClasses())) {}

int SlabAllocator::NumClasses() { return NumSizeClasses(); }
uint64_t SlabAllocator::ClassSize(int c) { return SizeClassBytes(c); }
int SlabAllocator::ClassFor(uint64_t bytes) { return SizeClassFor(bytes); }

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
    if (length_ - next_ < page + withheld_) {
      return Status::OutOfMemory(
          "the store's memory is full: no free extent of " + FormatSize(size) +
          " and no room for a new page of that size class (remem-server's "
          "--hash-memory)");
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

bool SlabAllocator::CouldEverHold(uint64_t bytes) const {
  const int c = ClassFor(bytes);
  if (c < 0) return false;
  const uint64_t size = ClassSize(c);
  return std::max(size, page_size_) + withheld_ <= length_;
}

Result<SlabAllocator::Extent> SlabAllocator::Store(
    std::string_view key, std::string_view value, uint64_t version,
    std::vector<uint8_t>* image) {
  const uint64_t bytes = sizeof(ExtentHeader) + key.size() + value.size();
  auto ext = Allocate(bytes);
  if (!ext.ok()) return ext.status();
  image->assign((bytes + 7) & ~uint64_t{7}, 0);
  uint8_t* img = image->data();
  ExtentHeader h{};
  h.incarnation = ext->incarnation;
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.version = version;
  std::memcpy(img, &h, sizeof(h));
  std::memcpy(img + sizeof(h), key.data(), key.size());
  // (An empty value, a tree's key extent, may have no data pointer.)
  if (!value.empty()) {
    std::memcpy(img + sizeof(h) + key.size(), value.data(), value.size());
  }
  h.checksum = ExtentChecksum(img, key.size(), value.size());
  std::memcpy(img, &h.checksum, 8);
  // Release stores: the extent is complete before any entry points to it.
  StoreWords(At(ext->offset), img, image->size());
  return ext;
}

Result<uint64_t> SlabAllocator::Carve(uint64_t bytes) {
  const uint64_t rounded = CarveSize(bytes);
  if (length_ - next_ < rounded + withheld_) {
    return Status::OutOfMemory(
        "needs " + std::to_string(rounded) + " bytes in one piece, and " +
        std::to_string(length_ - next_ > withheld_ ? length_ - next_ - withheld_
                                                   : 0) +
        " of the partition's " + std::to_string(length_) +
        " are not yet given to bucket arrays or values' size classes "
        "(remem-server's --hash-memory)");
  }
  const uint64_t offset = region_offset_ + next_;
  next_ += rounded;
  return offset;
}

void SlabAllocator::Uncarve(uint64_t region_offset, uint64_t bytes) {
  if (region_offset - region_offset_ + bytes == next_) next_ -= bytes;
}

void SlabAllocator::Reset() {
  next_ = 0;
  in_use_ = 0;
  for (auto& list : free_) list.clear();
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
