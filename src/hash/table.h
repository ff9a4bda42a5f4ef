// hash::Table: the server side of the hash key-value store: one partition,
// written by the thread that owns it, read concurrently by anyone (clients
// one-sided, see reader.h).
//
// Scheme: bucketized cuckoo hashing with two choices and 512-byte buckets
// (layout.h): a 64-byte header line, then a 448-byte entry area of
// variable-size entries: small pairs inline (six 16 B key / 32 B value
// pairs per bucket), larger ones as 40-byte references to slab extents.
// docs/ARCHITECTURE.md gives the measurements behind the choice.
// Publishing a bucket is a seqlock write (version odd, header index and
// checksum, entries, version even) with word-sized atomic stores, of an
// image sealed at the new version (SealBucket), so a concurrent copy of a
// header or of an entry is of the old publish, of the new one, or fails
// its checksum.
//
// A cuckoo move copies the entry into its other bucket before erasing it
// from the first, so a key is always in at least one bucket. A reader that
// finds a key in neither re-reads its first bucket; if that bucket's version
// changed meanwhile the reader retries (reader.h explains why that closes the
// window). Replacing a value rewrites its entry in place, in one bucket
// publish: inline if the new pair fits there, else as an extent reference
// (never larger than an inline entry, so it always fits); a replaced
// extent is freed after the publish (its incarnation changes, so stale
// readers retry).
//
// Growth: when no cuckoo path frees room, or a new pair would fill the
// entry area beyond kMaxFillPercent (see Recovery below), the table
// doubles (or, in the rare layout where some entry finds no room in twice
// the buckets, quadruples or grows 8x; the array tried is given back). The
// owner
// thread builds the new bucket array beside the old one (readers keep using
// the old, which does not change meanwhile), publishes it in the root
// (generation + 1), then marks every old bucket moved (kMovedVersion);
// only then does it take the next write. A reader reaching a moved bucket
// re-reads the root. Old arrays are not reused (a slow reader may still be
// reading them); they cost at most as much memory as the live array.
//
// Recovery (Restore, after Reserve) must place every pair the live table
// held, in the same memory, but in another order than the live writes came
// (a snapshot's bucket order, then the log). A live table packed by its
// own history to the last byte could not be rebuilt in any other order, so
// live writes keep the entry area at most kMaxFillPercent full (beyond it a
// new pair makes the table grow, or gets OutOfMemory); recovery ignores
// that limit, searches further for a cuckoo path, grows only if Reserve did
// not say how large the live table was, stores a small pair as an extent
// when its buckets have no room, and last turns inline entries into
// extents. Reserve on an empty table
// starts the arena over, so a recovered table has carved only the arrays
// it uses; EndRestore withholds what the skipped arrays would have taken,
// so a restarted server holds no more than one that never restarted, and
// its next recovery keeps that headroom.
//
// Versions: every successful write takes the next value of a per-table
// counter, so a version is never reused, even across delete and re-insert
// (compare-and-put cannot be fooled by ABA).
//
// Thread contract: all calls on the owning thread only.

#ifndef REMEM_HASH_TABLE_H_
#define REMEM_HASH_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hash/layout.h"
#include "hash/slab.h"
#include "remem/status.h"

namespace remem::hash {

struct TableOptions {
  uint64_t initial_buckets = 256;  // a power of two >= 2
  uint64_t seed = 0;
  bool grow = true;  // false: a full table answers OutOfMemory (tests)
  Limits limits;
};

class Table {
 public:
  // `region_base` is the partition region's memory; the Root is written at
  // offset 0 (its first 64 bytes), and `slab` (an arena of the same region)
  // provides bucket arrays and extents. Formats everything before return.
  static Result<std::unique_ptr<Table>> Create(uint8_t* region_base,
                                               uint16_t region,
                                               SlabAllocator* slab,
                                               const TableOptions& options);

  // Insert or replace; returns the new version. InvalidArgument for an
  // empty or oversized key/value, OutOfMemory when the region has no room
  // for the pair or for a larger table (then no pair is added or changed,
  // though cuckoo moves may remain; every key stays readable).
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

  // --- durability (src/durability): recovery and snapshots.
  // The version the last successful write (Put*, Delete) consumed: after a
  // Delete, the version its log record carries.
  uint64_t last_version() const { return next_version_ - 1; }
  // Recovery: stores `key` = `value` with exactly `version`, unless the
  // stored pair's version is already >= `version` (replay is idempotent).
  // No mode checks; keeps the version counter above every restored version.
  Status Restore(std::string_view key, std::string_view value,
                 uint64_t version);
  // A pair copied from another server (a shard moving here): stores `key`
  // = `value` with exactly `version`, unless the stored pair's version is
  // already >= `version`, as a live write (same room rules as Put); keeps
  // the version counter above it.
  Result<uint64_t> Import(std::string_view key, std::string_view value,
                          uint64_t version);
  // Recovery: removes `key` if its stored version is older than `version`
  // (the version the delete consumed).
  void RestoreDelete(std::string_view key, uint64_t version);
  // Recovery: while the table is empty, replaces its bucket array with one
  // of at least `buckets` (a power of two), so a bulk load does not grow
  // step by step. No-op once pairs are stored or if already that large.
  // Before EndRestore, with nothing but bucket arrays carved, the arena
  // starts over: no reader may have seen the table.
  Status Reserve(uint64_t buckets);
  // Recovery is over: withholds (SlabAllocator::Withhold) the memory the
  // bucket arrays this table skipped would have taken, had it grown here
  // write by write. A restarted server then holds what one that never
  // restarted holds, and its next recovery has that headroom (see
  // "Recovery" above).
  void EndRestore();
  // Starts loading the buckets `key` may live in into the CPU cache: a
  // batch (recovery, a multi-get or multi-put) calls it a few items ahead,
  // so the cache misses of its lookups and writes overlap. A hint only.
  void Prefetch(std::string_view key) const;
  // Tests: true if the per-bucket fill record matches every live bucket.
  bool FillRecordMatches() const;
  // Recovery: the next write's version will be above `version`.
  void RaiseVersion(uint64_t version) {
    if (next_version_ <= version) next_version_ = version + 1;
  }
  // Calls fn(key, value, version) for every pair in buckets [start,
  // start + count) of the live array; returns the next bucket to scan
  // (num_buckets() when done). Read-only: a snapshot scans chunk by chunk
  // between writes. A growth renumbers buckets (growths() changes); a
  // cuckoo move may carry a pair across the scan cursor (SetMoveHook).
  using PairFn = std::function<void(std::string_view key,
                                    std::string_view value, uint64_t version)>;
  uint64_t ScanBuckets(uint64_t start, uint64_t count, const PairFn& fn) const;
  uint64_t num_buckets() const { return geo_.num_buckets; }
  // Runs after a cuckoo move published `key` in bucket `to` (it was in
  // `from`). Empty by default.
  void SetMoveHook(
      std::function<void(uint64_t from, uint64_t to, std::string_view key)>
          hook) {
    move_hook_ = std::move(hook);
  }

  // Runs after every change of a key's pair (a write, a delete: `from` and
  // `to` are kNotMoved) and after every cuckoo move of it (from bucket
  // `from` to bucket `to`), with the key: a moving shard's keys written or
  // moved during its copy are sent again, and a re-replication's scan
  // notes the keys moved behind its cursor. Empty by default.
  static constexpr uint64_t kNotMoved = ~uint64_t{0};
  using ChangeFn =
      std::function<void(std::string_view key, uint64_t from, uint64_t to)>;
  void SetChangeHook(ChangeFn hook) { change_hook_ = std::move(hook); }

  // The bucket holding `key` now, or nullopt (tests and diagnostics).
  std::optional<uint64_t> BucketOf(std::string_view key) const;

  const Geometry& geometry() const { return geo_; }
  const Limits& limits() const { return options_.limits; }
  uint64_t size() const { return size_; }
  uint64_t inline_pairs() const { return inline_; }
  uint64_t moves() const { return moves_; }
  uint64_t growths() const { return geo_.generation; }
  // Bytes of bucket entry areas in use / bytes of entry areas.
  double area_fill() const {
    return double(area_used_) / double(geo_.num_buckets * kEntryAreaBytes);
  }

  // Test hook: runs between the two halves of every bucket publish (after
  // the odd version and half the words are stored), to hold a write open
  // while readers look. Empty by default.
  void SetMidWriteHook(std::function<void()> hook) {
    mid_write_ = std::move(hook);
  }
  // Test hook: asked before a rehash places each entry into an array of
  // `buckets`; false makes that entry find no room there (the growth then
  // tries a larger array). Empty by default.
  void SetRehashHook(std::function<bool(uint64_t buckets)> hook) {
    rehash_hook_ = std::move(hook);
  }

 private:
  Table(uint8_t* base, SlabAllocator* slab, const TableOptions& options)
      : base_(base), slab_(slab), options_(options) {}
  struct Found {
    uint64_t bucket;
    size_t entry_offset;  // in the bucket's area
    size_t entry_bytes;
    bool is_inline;
    uint64_t ref;  // extent entries
    uint64_t version;
  };
  enum class Mode { kUpsert, kIfAbsent, kIfVersion, kRestore, kImport };
  Result<uint64_t> Write(std::string_view key, std::string_view value,
                         Mode mode, uint64_t expected);
  Bucket* At(uint64_t i) const;
  void Publish(uint64_t i, const Bucket& next);
  void PublishRoot();
  std::optional<Found> Find(std::string_view key, const KeyHash& kh) const;
  std::string_view KeyOf(const uint8_t* entry) const;
  Result<uint64_t> WriteExtent(std::string_view key, std::string_view value,
                               uint64_t version, uint32_t* incarnation);
  // Finds `need` free bytes in b1 or b2, moving entries along a cuckoo path
  // if needed; returns the bucket, or nullopt.
  static constexpr size_t kSearchNodes = 2048;
  static constexpr size_t kRestoreSearchNodes = 1 << 16;
  std::optional<uint64_t> MakeRoom(uint64_t b1, uint64_t b2, size_t need,
                                   size_t max_nodes = kSearchNodes,
                                   bool dedupe = false);
  // Live writes keep the entry area at most kMaxFillPercent full (see
  // "Recovery" above): would adding `add` bytes and removing `remove` stay
  // within it?
  static constexpr uint64_t kMaxFillPercent = 95;
  bool WithinFill(size_t add, size_t remove) const;
  // Recovery: a bucket for a new pair whose inline entry takes
  // `inline_bytes` (0: an extent pair). Sets `*as_extent` when the pair
  // must be stored as an extent.
  Result<uint64_t> RestoreRoom(const KeyHash& kh, size_t inline_bytes,
                               bool* as_extent);
  // Recovery: turns the largest inline entry of bucket `b` into an extent.
  // NotFound if it has none.
  Status Demote(uint64_t b);
  // Rehashes into an array twice as large, or if some entry finds no room
  // there, 4x, then kMaxGrowthFactor x. OutOfMemory if the arena has no
  // room for the array, or none of them takes every entry.
  static constexpr uint64_t kMaxGrowthFactor = 8;
  Status Grow();
  // One attempt of Grow: false (and the array's memory back in the arena)
  // if an entry found no room in `n` buckets.
  Result<bool> RehashInto(uint64_t n);
  // Publishes geo_ (already naming the new array) in the root with the next
  // generation, then marks every bucket of `old` moved.
  void SwitchTo(const Geometry& old);
  void FormatBuckets(uint64_t offset, uint64_t n);
  Status CheckSizes(std::string_view key, std::string_view value) const;

  uint8_t* base_;
  SlabAllocator* slab_;
  TableOptions options_;
  Geometry geo_;
  uint64_t mask_ = 0;
  // Per bucket of the live array: bytes of its entry area in use. This
  // thread's own record (kept by Publish, Grow and the formatting), so that
  // placing an entry does not walk the entries of every bucket it looks at.
  std::vector<uint16_t> used_;
  uint64_t root_version_ = 0;
  uint64_t next_version_ = 1;
  uint64_t size_ = 0;
  uint64_t inline_ = 0;
  uint64_t moves_ = 0;
  uint64_t area_used_ = 0;
  uint64_t array_bytes_ = 0;  // arena carved for bucket arrays
  bool restored_ = false;     // EndRestore ran
  bool reserved_ = false;     // Reserve ran: restores do not grow
  bool rehashing_ = false;    // RehashInto is filling an unpublished array
  std::function<void()> mid_write_;
  std::function<bool(uint64_t)> rehash_hook_;
  std::function<void(uint64_t, uint64_t, std::string_view)> move_hook_;
  ChangeFn change_hook_;
};

// Helpers on a bucket image (exposed for tests).
// Bytes of the entry area in use.
size_t AreaUsed(const Bucket& b);
// Appends an entry (`bytes` of it); the caller checked it fits.
void AppendEntry(Bucket* b, const uint8_t* entry, size_t bytes);
// Removes the entry at `offset` (of `bytes`), closing the gap.
void EraseEntry(Bucket* b, size_t offset, size_t bytes);
// Makes a bucket image verifiable at its version: fills the index from the
// entries, ends every entry with its checksum (seeded with b->version) and
// sets the header checksum.
void SealBucket(Bucket* b);

}  // namespace remem::hash

#endif  // REMEM_HASH_TABLE_H_
