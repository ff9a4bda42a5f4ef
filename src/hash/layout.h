// Remote-memory layout of the hash key-value store: what a client reads
// one-sided out of the server's regions. docs/PROTOCOL.md ("Hash store")
// describes the same layout in prose; change both together.
//
// Table: `num_buckets` (a power of two) Buckets of 128 bytes. A key hashes
// (xxh3-64 with the table's seed) to a 16-bit tag and two buckets, b1 from
// the hash and b2 = b1 ^ (mix(tag) & mask) (partial-key cuckoo hashing, as
// MemC3: a bucket's alternate is computable from the tag alone, so the
// server can move an entry without re-reading its key).
//
// Bucket: a seqlock version, 7 slots, and a 64-bit checksum over everything
// before it. A slot names one extent (region + offset), its size class, its
// incarnation, and the key's tag. Extent: a header, the key, the value,
// padded to its size class; the header's checksum covers the rest of the
// extent. A one-sided copy happens in no specified byte order, so a reader
// trusts a copy only if its checksum verifies, its version is even, and (for
// an extent) its incarnation equals the slot's. Extents are type-stable: a
// slab page keeps its size class forever, so a reused extent's header is at
// the same place and its bumped incarnation exposes the reuse.
//
// Thread contract: plain data.

#ifndef REMEM_HASH_LAYOUT_H_
#define REMEM_HASH_LAYOUT_H_

#include <xxhash.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace remem::hash {

inline constexpr int kSlotsPerBucket = 7;
inline constexpr size_t kBucketBytes = 128;
inline constexpr size_t kExtentAlign = 64;

struct Slot {
  uint64_t ref;          // 0: empty. Else region << 48 | byte offset.
  uint32_t incarnation;  // must equal the extent header's
  uint16_t tag;          // 16 bits of the key's hash, never 0 in a used slot
  uint16_t size_class;   // the extent's size class: how much to read
};
static_assert(sizeof(Slot) == 16);

struct Bucket {
  uint64_t version;  // even: stable; odd: the server is rewriting it
  Slot slots[kSlotsPerBucket];
  uint64_t checksum;  // xxh3-64 of bytes [0, 120)
};
static_assert(sizeof(Bucket) == kBucketBytes);
static_assert(offsetof(Bucket, checksum) == kBucketBytes - 8);

struct ExtentHeader {
  uint64_t checksum;     // xxh3-64 of the extent from byte 8 to the value's end
  uint32_t incarnation;  // bumped each time the extent is freed
  uint32_t key_len;
  uint32_t value_len;
  uint32_t reserved;
  uint64_t version;  // the pair's version (compare-and-put)
};
static_assert(sizeof(ExtentHeader) == 32);

inline uint64_t MakeRef(uint16_t region, uint64_t offset) {
  return (uint64_t{region} << 48) | offset;
}
inline uint16_t RefRegion(uint64_t ref) { return uint16_t(ref >> 48); }
inline uint64_t RefOffset(uint64_t ref) { return ref & ((1ull << 48) - 1); }

inline uint64_t Checksum(const void* p, size_t n) { return XXH3_64bits(p, n); }

inline uint64_t BucketChecksum(const Bucket& b) {
  return Checksum(&b, offsetof(Bucket, checksum));
}

// Extent checksum: header from byte 8 (incarnation, lengths, version), then
// key and value.
inline uint64_t ExtentChecksum(const uint8_t* extent, size_t key_len,
                               size_t value_len) {
  return Checksum(extent + 8, sizeof(ExtentHeader) - 8 + key_len + value_len);
}

struct KeyHash {
  uint64_t hash;
  uint16_t tag;  // never 0
};

inline KeyHash HashKey(std::string_view key, uint64_t seed) {
  uint64_t h = XXH3_64bits_withSeed(key.data(), key.size(), seed);
  uint16_t tag = uint16_t(h >> 48);
  if (tag == 0) tag = 1;
  return {h, tag};
}

inline uint64_t PrimaryBucket(const KeyHash& k, uint64_t mask) {
  return k.hash & mask;
}
// The other bucket of an entry in bucket `b` with tag `tag`; an involution:
// AltBucket(AltBucket(b)) == b.
inline uint64_t AltBucket(uint64_t b, uint16_t tag, uint64_t mask) {
  uint64_t m = (uint64_t{tag} * 0xc6a4a7935bd1e995ull) >> 17;
  m &= mask;
  if (m == 0) m = 1 & mask;  // never the same bucket when mask > 0
  return b ^ m;
}

// Copies `n` bytes (a multiple of 8, both 8-aligned) word by word with
// atomic accesses. The server publishes with StoreWords and an in-process
// reader copies with LoadWords: the same bytes a one-sided copy would see,
// without a C++ data race (so ThreadSanitizer can check the rest). Readers
// in another process copy with memcpy or UCX. Release stores keep every
// earlier store (an extent, an odd bucket version) ahead of each published
// word; on x86 they are plain moves. Correctness does not rest on this
// order (checksums do), only how often readers retry.
inline void StoreWords(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint64_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, s + 8 * i, 8);
    std::atomic_ref<uint64_t>(d[i]).store(w, std::memory_order_release);
  }
}
inline void LoadWords(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = const_cast<uint64_t*>(static_cast<const uint64_t*>(src));
  for (size_t i = 0; i < n / 8; ++i) {
    uint64_t w =
        std::atomic_ref<uint64_t>(s[i]).load(std::memory_order_acquire);
    std::memcpy(d + 8 * i, &w, 8);
  }
}

}  // namespace remem::hash

#endif  // REMEM_HASH_LAYOUT_H_
