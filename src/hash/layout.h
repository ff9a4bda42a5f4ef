// Remote-memory layout of the hash key-value store: what a client reads
// one-sided out of the server's regions. docs/PROTOCOL.md ("Hash store")
// describes the same layout in prose; change both together.
//
// Partition region: a Root at offset 0 names the live bucket array (its
// offset, its number of buckets, the key hash seed) and a generation that
// moves when the table grows. The rest of the region is an arena for bucket
// arrays and slab extents.
//
// Table: `num_buckets` (a power of two) Buckets of 512 bytes. A key hashes
// (xxh3-64 with the table's seed) to a 16-bit tag and two buckets, b1 from
// the hash and b2 = b1 ^ (mix(tag) & mask) (partial-key cuckoo hashing, as
// MemC3: a bucket's alternate is computable from the tag alone, so the
// server can move an entry without re-reading its key).
//
// Bucket: a 64-byte header (one cache line: a seqlock version, an index of
// the entries, a checksum of the header) and a 448-byte entry area. Entries
// are packed from the start of the area; a head with tag 0 (or the end of
// the area) ends the list. The index names each entry's tag, offset and
// length, so a reader copies the header and then only the entries whose
// tag matches (two or three cache lines instead of eight); a reader over a
// network copies the whole bucket in one read and checks the same way.
// Every entry ends with its own checksum, seeded with the bucket's version:
// a copy of an entry verifies only against the header of the same publish.
// An entry is
//   - inline: head, the pair's version, key and value (padded to 8 bytes),
//     checksum; small pairs live here, so a hit is one header and one entry;
//   - extent: head (with the extent's incarnation), a reference naming the
//     extent's region, size class and offset, checksum. An extent holds a
//     header, the key and the value; its header's checksum covers the rest.
// Entries take at least kMinEntryBytes, so an area holds at most
// kIndexSlots of them and the index never runs out.
// A one-sided copy happens in no specified byte order, so a reader trusts a
// header only if its checksum verifies and its version is even, an entry
// only if its checksum (seeded with that version) verifies, and an extent
// only if its checksum verifies and its incarnation equals the entry's.
// Extents are type-stable: a slab page keeps its size class forever, so a
// reused extent's header is at the same place and its bumped incarnation
// exposes the reuse.
//
// A bucket array replaced by growth keeps version kMovedVersion (odd)
// forever: a reader that reaches it fails verification, re-reads the root,
// and finds the new array.
//
// Serving mark (clusters, issues #12 and #13): a ServingMark after the
// Root says what a pair read one-sided out of a member's memory may be
// returned as. A member's memory holds pairs of shards it does not lead: a
// shard being copied in by a move (behind the owner's newer writes), a
// copy an abandoned move left, a shard whose role went elsewhere; and in a
// replicated cluster a primary applies a write to its table before its
// backups hold it, and a failover would lose such a write. So a reader in
// a cluster, after it has read a pair, reads the mark and returns the pair
// only if (JudgeServingMark in reader.h)
//   - `serving` verifies and is not 0 (0: nothing is vouched for: before
//     the first configuration, during a hand-over, not a cluster, just
//     after a promotion, Ownership::RequireResync), and the
//     reader's configuration epoch E satisfies primary_since <= E <=
//     installed: the shards this server leads are the same at E as now, so
//     the reader (which routed by E) is reading the shard's owner;
//   - in a replicated cluster, `replicated` verifies and is at least the
//     pair's version: every pair this server wrote with a version up to it
//     is held by the backups (an unreplicated member leaves it 0, and its
//     readers judge by version 0).
// Each half has one writer (serving: whoever installs a configuration or
// freezes a shard; replicated: the partition's owner thread), so each
// carries its own check. The server lease bounds the whole: a primary
// that lost its member lease stops vouching for its memory before any
// backup can be promoted (proto::ServerLease, which shared-memory readers
// check; over tcp the server refuses served reads of this region).
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

inline constexpr size_t kBucketBytes = 512;
inline constexpr size_t kBucketHeaderBytes = 64;  // one cache line
inline constexpr size_t kEntryAreaBytes = kBucketBytes - kBucketHeaderBytes;
inline constexpr size_t kIndexSlots = 12;
inline constexpr size_t kExtentAlign = 64;
inline constexpr uint64_t kMovedVersion = ~uint64_t{0};  // odd: never stable
inline constexpr uint32_t kRootMagic = 0x544F4F52;       // "ROOT"
inline constexpr uint16_t kLayoutVersion = 4;
// A partition region: the Root at offset 0, the arena (bucket arrays and
// slab extents) from this offset on.
inline constexpr uint64_t kArenaOffset = 4096;

// The ServingMark of a partition region, right after its Root.
inline constexpr uint64_t kServingMarkOffset = 64;

// Where a table's buckets live, as a client needs to know it.
struct Geometry {
  uint16_t region = 0;          // region of the root, buckets and extents
  uint64_t root_offset = 0;     // region offset of the Root
  uint64_t generation = 0;      // of the root this was read from
  uint64_t buckets_offset = 0;  // region offset of bucket 0
  uint64_t num_buckets = 0;     // a power of two
  uint64_t seed = 0;            // key hash seed
};

struct Limits {
  uint32_t max_key = 64 << 10;
  uint32_t max_value = 16 << 20;
};

struct Root {
  uint64_t version;  // seqlock: even when stable
  uint32_t magic;    // kRootMagic
  uint16_t layout_version;
  uint16_t reserved;
  uint64_t generation;  // +1 at every growth
  uint64_t buckets_offset;
  uint64_t num_buckets;
  uint64_t seed;
  uint64_t checksum;  // xxh3-64 of bytes [0, 48)
  uint64_t reserved2;
};
static_assert(sizeof(Root) == 64);
static_assert(offsetof(Root, checksum) == 48);

struct ServingMark {
  // installed epoch | primary_since << 32 (both 32-bit epochs); 0: vouches
  // for nothing.
  uint64_t serving;
  uint64_t serving_check;  // MarkCheck(serving, kServingHalf)
  // Versions up to this, of pairs this server wrote, are on every backup.
  uint64_t replicated;
  uint64_t replicated_check;  // MarkCheck(replicated, kReplicatedHalf)
};
static_assert(sizeof(ServingMark) == 32);
static_assert(kServingMarkOffset >= sizeof(Root));
static_assert(kServingMarkOffset + sizeof(ServingMark) <= kArenaOffset);
inline constexpr uint64_t kServingHalf = 0x53455256494E4721ull;  // "SERVING!"
inline constexpr uint64_t kReplicatedHalf =
    0x5245504C49434121ull;  // "REPLICA!"
// Versions in a replicated cluster: a primary writing at configuration
// epoch e gives versions of at least VersionFloor(e)
// (HashService::FloorVersions_st). A backup keeps the newer version of a
// pair it is sent, so a backup promoted at epoch e' > e must write above
// every version issued at e or before: also above a dead primary's last
// batch, which may have reached another backup and not it. 2^40 versions
// per partition and epoch; from epoch 2^24 on the floor stays at its last
// step.
inline constexpr uint64_t VersionFloor(uint32_t epoch) {
  return uint64_t{epoch < (1u << 24) ? epoch : (1u << 24) - 1} << 40;
}

inline constexpr uint64_t ServingWord(uint32_t installed,
                                      uint32_t primary_since) {
  return uint64_t{installed} | uint64_t{primary_since} << 32;
}

// One entry of a bucket's index; tag 0: unused (the index lists the
// entries in area order, unused slots last).
struct IndexSlot {
  uint16_t tag;
  uint8_t offset_words;  // the entry's offset in the area, in 8-byte words
  uint8_t words;         // the entry's length in 8-byte words
};
static_assert(sizeof(IndexSlot) == 4);

struct Bucket {
  uint64_t version;  // even: stable; odd: the server is rewriting it
  IndexSlot index[kIndexSlots];
  uint64_t checksum;  // xxh3-64 of the header's bytes [0, 56)
  uint8_t entries[kEntryAreaBytes];
};
static_assert(sizeof(Bucket) == kBucketBytes);
static_assert(offsetof(Bucket, checksum) == kBucketHeaderBytes - 8);
static_assert(offsetof(Bucket, entries) == kBucketHeaderBytes);

enum EntryKind : uint8_t { kInline = 1, kExtent = 2 };

struct EntryHead {
  uint16_t tag;   // 16 bits of the key's hash, never 0; 0 ends the list
  uint8_t kind;   // EntryKind
  uint8_t words;  // entry length in 8-byte words, this head included
  uint32_t meta;  // inline: key_len | value_len << 16; extent: incarnation
};
static_assert(sizeof(EntryHead) == 8);

// Every entry ends with a checksum word: xxh3-64, seeded with the bucket's
// version, of the entry's bytes before it.
inline constexpr size_t kEntryChecksumBytes = 8;
// The smallest entry: 448 / 40 = 11 entries at most, within kIndexSlots.
inline constexpr size_t kMinEntryBytes = 40;
static_assert(kEntryAreaBytes / kMinEntryBytes <= kIndexSlots);
// Inline: EntryHead, uint64_t version, key and value (zero-padded to 8
// bytes, and to kMinEntryBytes in all), checksum.
inline constexpr size_t kInlineOverhead = 16;  // the key's offset
// A pair is inline when its entry takes at most this much of a bucket (so
// at least three fit); larger pairs go to extents.
inline constexpr size_t kMaxInlineEntryBytes = 120;
// Extent: EntryHead, uint64_t ref, 16 zero bytes, checksum.
inline constexpr size_t kExtentEntryBytes = kMinEntryBytes;

inline constexpr size_t InlineEntryBytes(size_t key_len, size_t value_len) {
  const size_t bytes =
      ((kInlineOverhead + key_len + value_len + 7) & ~size_t{7}) +
      kEntryChecksumBytes;
  return bytes < kMinEntryBytes ? kMinEntryBytes : bytes;
}
inline constexpr bool FitsInline(size_t key_len, size_t value_len) {
  return InlineEntryBytes(key_len, value_len) <= kMaxInlineEntryBytes;
}

struct ExtentHeader {
  uint64_t checksum;     // xxh3-64 of the extent from byte 8 to the value's end
  uint32_t incarnation;  // bumped each time the extent is freed
  uint32_t key_len;
  uint32_t value_len;
  uint32_t reserved;
  uint64_t version;  // the pair's version (compare-and-put)
};
static_assert(sizeof(ExtentHeader) == 32);

// An extent reference: region (16 bits), size class (8), byte offset (40).
inline uint64_t MakeRef(uint16_t region, uint8_t size_class, uint64_t offset) {
  return (uint64_t{region} << 48) | (uint64_t{size_class} << 40) | offset;
}
inline uint16_t RefRegion(uint64_t ref) { return uint16_t(ref >> 48); }
inline uint8_t RefClass(uint64_t ref) { return uint8_t(ref >> 40); }
inline uint64_t RefOffset(uint64_t ref) { return ref & ((1ull << 40) - 1); }

inline uint64_t Checksum(const void* p, size_t n) { return XXH3_64bits(p, n); }

// The checksum of a bucket's header (version and index).
inline uint64_t HeaderChecksum(const Bucket& b) {
  return Checksum(&b, offsetof(Bucket, checksum));
}
// The checksum an entry of `bytes` at `entry` must end with in a bucket of
// version `version`.
inline uint64_t EntryChecksum(const uint8_t* entry, size_t bytes,
                              uint64_t version) {
  return XXH3_64bits_withSeed(entry, bytes - kEntryChecksumBytes, version);
}
inline uint64_t StoredEntryChecksum(const uint8_t* entry, size_t bytes) {
  uint64_t c;
  std::memcpy(&c, entry + bytes - kEntryChecksumBytes, 8);
  return c;
}
// A ServingMark half's check: xxh3-64 of the word, seeded with the half's
// constant (a copy torn between two publishes does not verify).
inline uint64_t MarkCheck(uint64_t word, uint64_t half) {
  return XXH3_64bits_withSeed(&word, sizeof(word), half);
}
inline uint64_t RootChecksum(const Root& r) {
  return Checksum(&r, offsetof(Root, checksum));
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

// Walks the entries of a bucket's area. Tolerates any bytes (a reader may
// call it on data it has not verified yet): a malformed head ends the walk
// with ok() false.
class EntryCursor {
 public:
  explicit EntryCursor(const uint8_t* area) : area_(area) {}
  // Advances to the next entry; false at the end of the list (or on a
  // malformed head, see ok()).
  bool Next() {
    if (started_) pos_ += size_t{head_.words} * 8;
    started_ = true;
    if (pos_ + sizeof(EntryHead) > kEntryAreaBytes) return false;
    std::memcpy(&head_, area_ + pos_, sizeof(head_));
    if (head_.tag == 0) return false;
    const size_t bytes = size_t{head_.words} * 8;
    const bool fits =
        bytes >= kMinEntryBytes && pos_ + bytes <= kEntryAreaBytes;
    const bool sane =
        head_.kind == kExtent
            ? bytes == kExtentEntryBytes
            : head_.kind == kInline &&
                  InlineEntryBytes(key_len(), value_len()) == bytes;
    if (!fits || !sane) {
      bad_ = true;
      return false;
    }
    return true;
  }
  bool ok() const { return !bad_; }
  size_t offset() const { return pos_; }  // of the current entry in the area
  size_t bytes() const { return size_t{head_.words} * 8; }
  const EntryHead& head() const { return head_; }
  uint32_t key_len() const { return head_.meta & 0xffff; }
  uint32_t value_len() const { return head_.meta >> 16; }
  uint64_t word1() const {
    uint64_t w;
    std::memcpy(&w, area_ + pos_ + 8, 8);
    return w;
  }
  const char* inline_key() const {
    return reinterpret_cast<const char*>(area_ + pos_ + kInlineOverhead);
  }
  const char* inline_value() const { return inline_key() + key_len(); }
  // Bytes of the area in use, valid after Next() returned false with ok().
  size_t end() const { return pos_; }

 private:
  const uint8_t* area_;
  size_t pos_ = 0;
  bool started_ = false;
  bool bad_ = false;
  EntryHead head_{};
};

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
