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
// Growth: once the entry area is kGrowStartPercent full, the table doubles
// in steps. The owner thread carves the new bucket array beside the old
// one, which readers keep using and writes keep changing, and fills it a
// few buckets at a time: what GrowStep is asked for (the server: at each
// pass of the partition's event loop, busy or idle), and after each write
// that takes room, enough to be done before writes have taken half the
// room left when it started (grow_pacing). Every change to a key of the
// old array meanwhile (a write, a delete, a cuckoo move) is mirrored at
// once into the new array, so when the scan of the old array is done the
// new one holds exactly its pairs. Its buckets are then sealed, also in
// steps, and published in the root (generation + 1); last, every old
// bucket is marked moved (kMovedVersion), before the next write. A reader
// reaching a moved bucket re-reads the root.
//
// A growth is done at once (its steps run to their end), all before the
// write that needs it, when the old array has no room for a write before
// the growth in steps is done, or when no cuckoo path frees room (or a
// new pair would fill the entry area beyond kMaxFillPercent, see Recovery
// below) while none runs: the table doubles (or, in the rare layout where
// some entry finds no room in twice the buckets, quadruples or grows 8x;
// the array tried is given back; a growth in steps in that layout is given
// up). Old arrays are not reused (a slow reader may still be reading
// them); they cost at most as much memory as the live array.
//
// Recovery (Restore, after Reserve) must place every pair the live table
// held, in the same memory, but in another order than the live writes came
// (a snapshot's bucket order, then the log). A live table packed by its
// own history to the last byte could not be rebuilt in any other order, so
// live writes keep the entry area at most kMaxFillPercent full (beyond it a
// new pair makes the table grow, or gets OutOfMemory); recovery keeps a
// pair inline only within that limit and lets extent references pass it,
// searches further for a cuckoo path, grows only if Reserve did
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
  // false: every growth is done at once, by the write that needs it
  // (tests of a layout at that moment).
  bool grow_in_steps = true;
  // How a growth in steps is paced by writes (see "Growth" below): after
  // each write, enough steps that the growth is done by the time writes
  // have taken 1/grow_pacing of the room the old array had left when it
  // started. 0: writes take no steps, only GrowStep does (tests).
  uint32_t grow_pacing = 2;
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
  // empty or oversized key or an oversized value, OutOfMemory when the region
  // has no room for the pair or for a larger table (then no pair is added or
  // changed, though cuckoo moves may remain; every key stays readable).
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
  // Tests: true if the per-bucket fill record matches every live bucket
  // (and every bucket of a growth's new array, while one is under way).
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

  // A growth in steps is under way (see "Growth" above): the root still
  // names the old array.
  bool growing() const { return growth_.has_value(); }
  // Does up to `buckets` steps of the growth under way (a step is a bucket
  // of the new array formatted or sealed, or one of the old array scanned);
  // returns how many it did: 0 when no growth is under way.
  uint64_t GrowStep(uint64_t buckets);

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
  // OutOfMemory if no partition of this size could ever hold the pair as
  // an extent (however empty it were); OK otherwise.
  Status NeverFits(std::string_view key, std::string_view value) const;
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
  // Grows at once (a growth in steps, run to its end): into an array twice
  // as large, or if some entry finds no room there, 4x, then
  // kMaxGrowthFactor x. OutOfMemory if the arena has no room for the array,
  // or none of them takes every entry. A growth in steps under way is
  // finished first (and if that one succeeds, that is the growth).
  static constexpr uint64_t kMaxGrowthFactor = 8;
  Status Grow();
  // --- growth in steps (see "Growth" above)
  // A growth in steps starts once the entry area is this full: the 10% left
  // before kMaxFillPercent take the writes made while it runs.
  static constexpr uint64_t kGrowStartPercent = 85;
  struct Growth {
    Geometry geo;                // the new array, not published
    std::vector<uint16_t> used;  // its per-bucket fill record
    // Per new bucket: 1 if a mirror placed a key there (see PlaceInNew).
    std::vector<uint8_t> mirrored;
    uint64_t carve_bytes = 0;
    // kFormat: the new buckets [0, cursor) are formatted. kScanLarge,
    // kScanSmall: the old buckets [0, cursor) are scanned, for entries
    // larger than an extent reference first, then for the others (a cuckoo
    // hop moves one entry, so a bucket filled with small entries could not
    // make room for a large one that comes late: at half the load, in
    // about one table in 10^4 before this order). kSeal: the new buckets
    // [0, cursor) are sealed.
    enum Phase { kFormat, kScanLarge, kScanSmall, kSeal } phase = kFormat;
    uint64_t cursor = 0;
    // Pacing: steps in all (each new bucket formatted and sealed, each old
    // bucket scanned twice) and done so far; the entry area's bytes in use
    // at the start, and the room left then below kMaxFillPercent.
    uint64_t steps = 0;
    uint64_t steps_done = 0;
    uint64_t area_at_start = 0;
    uint64_t room_at_start = 0;
  };
  // After a write or delete of `key` in the old array: mirrors it and
  // takes the steps the growth under way needs to keep its pace (the bytes
  // the entry area has taken since it started, against its room), or (if
  // `may_start`: a live write) starts one.
  void AfterWrite(std::string_view key, bool may_start);
  // Starts a growth in steps if the entry area is kGrowStartPercent full
  // and the arena has room for the doubled array.
  void MaybeStartGrowth();
  // Carves an array of `n` buckets (OutOfMemory if the arena has no room)
  // and makes it the growth under way, to be filled by GrowStep.
  Status StartGrowth(uint64_t n);
  // Runs `fn` with geo_, mask_ and used_ naming the new array (and cuckoo
  // moves there reported to no hook), then restores them.
  template <typename Fn>
  bool InNewArray(Fn&& fn);
  // In the new array: puts `entry` (its key's only entry there), or
  // removes the key if `entry` is null. False if no room was found.
  // `mirror`: a change to the old array, not the scan.
  bool PlaceInNew(std::string_view key, const uint8_t* entry, size_t bytes,
                  bool mirror);
  // Copies what the old array holds for `key` into the new array.
  void Mirror(std::string_view key);
  // Gives up the growth in steps (its array back to the arena if nothing
  // was carved since); the next growth is done at once.
  void AbandonGrowth();
  // Publishes the new array (SwitchTo).
  void CompleteGrowth();
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
  bool rehashing_ = false;    // filling an unpublished array
  std::optional<Growth> growth_;
  // A growth in steps could not be made at this many buckets (no room in
  // the arena, or an entry found no room in the doubled array): not tried
  // again at this size.
  uint64_t no_growth_in_steps_at_ = 0;
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
