// hash::SlabAllocator: extents for key-value pairs, carved from one arena
// of a registered region. Size classes are multiples of 64 bytes growing by
// ~1.25x (64 B .. just over 16 MiB + 64 KiB, enough for the largest pair);
// each class takes whole pages (64 KiB, or one extent if larger) from the
// arena and keeps a free list. Freed extents are reused by pairs of the same
// class only: pages are not merged or moved between classes (KV-Direct's
// lazy merging is not implemented).
//
// Extents are type-stable: a page never changes class, so an extent header
// is always at the same place, and Free() bumps the header's incarnation.
// A reader holding a stale slot then sees the incarnation differ and
// retries; that is what makes immediate reuse safe for one-sided readers
// (BRIEF.md: "type-stable with incarnation checks").
//
// Thread contract: not thread-safe; owned by the partition's thread.

#ifndef REMEM_HASH_SLAB_H_
#define REMEM_HASH_SLAB_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::hash {

class SlabAllocator {
 public:
  struct Extent {
    uint64_t offset;  // from the arena's start
    uint16_t size_class;
    uint32_t incarnation;  // current; stamped in the header by the caller
  };

  // The arena is [base, base + length); `region_offset` is where base lies
  // in its region (offsets handed out are region offsets).
  SlabAllocator(uint8_t* base, uint64_t length, uint64_t region_offset,
                uint64_t page_size = 64 << 10);

  static int NumClasses();
  static uint64_t ClassSize(int size_class);
  // Smallest class holding `bytes`, or -1 if larger than the largest.
  static int ClassFor(uint64_t bytes);

  // OutOfMemory when the arena has no room for another page of the class
  // and its free list is empty.
  Result<Extent> Allocate(uint64_t bytes);
  // Whether an empty arena would have room for an extent of `bytes`: if
  // not, Allocate's OutOfMemory is not a full store, and no amount of
  // freeing makes room.
  bool CouldEverHold(uint64_t bytes) const;
  // Allocates an extent for the pair `key` = `value` at `version` and
  // stores it whole (ExtentHeader with its checksum, key, value) with
  // release word stores, so it is complete before anything names it.
  // `image` is scratch for its bytes (kept by a caller that writes often).
  // OutOfMemory as Allocate.
  Result<Extent> Store(std::string_view key, std::string_view value,
                       uint64_t version, std::vector<uint8_t>* image);
  // Returns an extent; bumps the incarnation in its header.
  void Free(uint64_t offset, uint16_t size_class);
  // Carves `bytes` (rounded up to whole pages) of contiguous arena for good,
  // e.g. a bucket array; returns its region offset. OutOfMemory if the arena
  // has no such room left.
  Result<uint64_t> Carve(uint64_t bytes);
  // Gives back what the last Carve took (`bytes`: its CarveSize), before
  // anything else was carved or allocated and before anyone read it (a
  // bucket array that was never published). Ignored otherwise.
  void Uncarve(uint64_t region_offset, uint64_t bytes);
  // What Carve(bytes) takes from the arena.
  uint64_t CarveSize(uint64_t bytes) const {
    return (bytes + page_size_ - 1) / page_size_ * page_size_;
  }
  // Recovery (nothing allocated yet, no reader has seen the arena): forgets
  // every carve and free list, so the arena is empty again.
  void Reset();
  // Keeps `bytes` of the arena that Allocate and Carve never hand out (the
  // headroom a recovered table keeps for its next recovery, table.h).
  void Withhold(uint64_t bytes) { withheld_ = bytes; }
  uint64_t withheld() const { return withheld_; }

  uint8_t* At(uint64_t region_offset) const {
    return base_ + (region_offset - region_offset_);
  }
  uint64_t bytes_in_use() const { return in_use_; }
  uint64_t bytes_carved() const { return next_; }
  uint64_t bytes_left() const { return length_ - next_; }
  uint64_t capacity() const { return length_; }

 private:
  uint8_t* base_;
  uint64_t length_;
  uint64_t region_offset_;
  uint64_t page_size_;
  uint64_t next_ = 0;  // bump pointer over the arena
  uint64_t in_use_ = 0;
  uint64_t withheld_ = 0;
  std::vector<std::vector<uint64_t>> free_;  // per class: region offsets
};

}  // namespace remem::hash

#endif  // REMEM_HASH_SLAB_H_
