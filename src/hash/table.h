// hash::Table: the server side of the hash key-value store: one partition,
// written by the thread that owns it, read concurrently by anyone (clients
// one-sided, see reader.h).
//
// Scheme: bucketized cuckoo hashing with two choices and 7-slot buckets.
// Every pair lives in an extent from the SlabAllocator; a slot points to it
// with the extent's incarnation and size class. Publishing a bucket is a
// seqlock write (version odd, slots, checksum, version even) with word-sized
// atomic stores, so a concurrent copy is either the old bucket, the new one,
// or fails its checksum.
//
// A cuckoo move copies the entry into its other bucket before erasing it
// from the first, so a key is always in at least one bucket. A reader that
// finds a key in neither re-reads its first bucket; if that bucket's version
// changed meanwhile the reader retries (reader.h explains why that closes the
// window). Replacing a value writes a new extent, repoints the slot, then
// frees the old extent (its incarnation changes, so stale readers retry).
//
// Versions: every successful write takes the next value of a per-table
// counter, so a version is never reused, even across delete and re-insert
// (compare-and-put cannot be fooled by ABA).
//
// Thread contract: all mutating calls and Get on the owning thread only.

#ifndef REMEM_HASH_TABLE_H_
#define REMEM_HASH_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hash/layout.h"
#include "hash/slab.h"
#include "remem/status.h"

namespace remem::hash {

// Where a table lives, as a client needs to know it.
struct Geometry {
  uint16_t region = 0;          // region of buckets and extents
  uint64_t buckets_offset = 0;  // region offset of bucket 0
  uint64_t num_buckets = 0;     // a power of two
  uint64_t seed = 0;            // key hash seed
};

struct Limits {
  uint32_t max_key = 64 << 10;
  uint32_t max_value = 16 << 20;
};

class Table {
 public:
  // `bucket_mem` holds num_buckets * 128 bytes at region offset
  // `geometry.buckets_offset` (formatted here, before any reader may look);
  // `slab` provides the extents. num_buckets must be a power of two >= 2.
  Table(uint8_t* bucket_mem, Geometry geometry, SlabAllocator* slab,
        Limits limits = {});

  // Insert or replace; returns the new version. InvalidArgument for an
  // empty or oversized key/value, OutOfMemory when no extent or no bucket
  // slot can be had (then no pair is added or changed, though cuckoo moves
  // made while looking for a slot may remain; every key stays readable).
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  // Replace only if the current version is `expected`; Conflict otherwise,
  // NotFound if the key is absent.
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected);
  // Insert only if absent; AlreadyExists otherwise.
  Result<uint64_t> PutIfAbsent(std::string_view key, std::string_view value);
  // NotFound if absent.
  Status Delete(std::string_view key);

  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  // Server-side lookup (the RPC read path).
  Result<Value> Get(std::string_view key) const;

  const Geometry& geometry() const { return geo_; }
  uint64_t size() const { return size_; }
  uint64_t moves() const { return moves_; }
  double occupancy() const {
    return double(size_) / double(geo_.num_buckets * kSlotsPerBucket);
  }

 private:
  struct Found {
    uint64_t bucket;
    int slot;
    Slot s;
    uint64_t version;
  };
  enum class Mode { kUpsert, kIfAbsent, kIfVersion };
  Result<uint64_t> Write(std::string_view key, std::string_view value,
                         Mode mode, uint64_t expected);
  Bucket* At(uint64_t i) const;
  void Publish(uint64_t i, const Bucket& next);
  std::optional<Found> Find(std::string_view key, const KeyHash& kh) const;
  Result<SlabAllocator::Extent> WriteExtent(std::string_view key,
                                            std::string_view value,
                                            uint64_t version);
  // Frees a slot in b1 or b2, moving entries along a cuckoo path if needed.
  bool MakeRoom(uint64_t b1, uint64_t b2, uint64_t* bucket, int* slot);
  Status CheckSizes(std::string_view key, std::string_view value) const;

  uint8_t* mem_;
  Geometry geo_;
  SlabAllocator* slab_;
  Limits limits_;
  uint64_t mask_;
  uint64_t next_version_ = 1;
  uint64_t size_ = 0;
  uint64_t moves_ = 0;
};

}  // namespace remem::hash

#endif  // REMEM_HASH_TABLE_H_
