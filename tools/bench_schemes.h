// remem-hash-schemes: a deterministic, in-process simulation of four hash
// table schemes as a one-sided reader sees them. Each scheme places 16 B
// keys into buckets laid out in the study's common geometry (remem's
// layout-2 table: 16 B header per bucket, inline pairs or 16 B extent
// pointers in slots) and counts, per
// lookup, the contiguous remote reads, round trips and bytes a client would
// need; per insert, the entries the server moves. No memory is read
// remotely: only the reader's costs are counted. docs/HASH_SCHEMES.md has
// the results and the geometry of each scheme.
//
// Thread contract: plain data and single-threaded objects.

#ifndef REMEM_TOOLS_BENCH_SCHEMES_H_
#define REMEM_TOOLS_BENCH_SCHEMES_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace remem::schemes {

using Key = std::array<uint8_t, 16>;

inline constexpr uint32_t kKeyBytes = 16;
inline constexpr uint32_t kValueBytes = 32;
inline constexpr uint32_t kPayloadBytes = kKeyBytes + kValueBytes;
inline constexpr uint32_t kHeaderBytes = 16;  // version + checksum
inline constexpr uint32_t kNextBytes = 8;     // chain pointer in a bucket
// 8 B version + 4 B lengths/tag + key + value, rounded up to 8 B.
inline constexpr uint32_t kInlineSlotBytes =
    (8 + 4 + kKeyBytes + kValueBytes + 7) / 8 * 8;
inline constexpr uint32_t kPointerSlotBytes = 16;
// remem's extent: 32 B header + key + value in the 128 B size class.
inline constexpr uint32_t kExtentBytes = 128;

enum class SchemeKind {
  kCuckoo2,    // remem: bucketized 2-choice cuckoo, alternate from the tag
  kCuckoo3,    // Pilaf: 3-way cuckoo, one entry per bucket
  kHopscotch,  // FaRM: chained associative hopscotch
  kChained,    // KV-Direct: chained buckets
};
enum class PairKind { kInline, kOutOfLine };

const char* SchemeName(SchemeKind s);
const char* PairName(PairKind p);

struct SchemeConfig {
  SchemeKind scheme = SchemeKind::kCuckoo2;
  PairKind pairs = PairKind::kInline;
  uint32_t bucket_bytes = 256;  // ignored by kCuckoo3 (one entry per bucket)
  // If nonzero, the bucket holds this many slots and bucket_bytes follows.
  uint32_t slots_per_bucket = 0;
  uint64_t target_slots = 1 << 20;  // bucket count ~ target / slots
  uint64_t seed = 1;
  uint32_t neighbourhood = 2;   // kHopscotch: buckets read in one read
  uint32_t max_probe = 64;      // kHopscotch: linear probe limit (buckets)
  uint32_t overflow_slots = 2;  // kHopscotch: slots per overflow block
  // Cuckoo path search bound (table.cc searches 2048 on a live insert,
  // 65,536 in recovery).
  uint32_t max_bfs_nodes = 4096;
};

// What the table looks like, derived from a SchemeConfig.
struct Geometry {
  uint32_t slot_bytes = 0;
  uint32_t slots_per_bucket = 0;
  uint32_t bucket_bytes = 0;
  uint64_t num_buckets = 0;  // home buckets
  uint64_t primary_slots = 0;
  uint32_t first_read_bytes = 0;   // a reader's first read
  uint32_t chain_block_bytes = 0;  // 0: no chains
};

// Geometry for `c`, or slots_per_bucket == 0 if a bucket holds no slot.
Geometry GeometryFor(const SchemeConfig& c);

struct Cost {
  uint32_t reads = 0;        // contiguous remote reads
  uint32_t round_trips = 0;  // dependent steps (parallel reads count once)
  uint64_t bytes = 0;
};

struct LookupResult {
  bool found = false;
  Cost sequential;  // a reader that reads one candidate at a time
  Cost parallel;    // one that reads every candidate bucket at once
};

class Scheme {
 public:
  virtual ~Scheme() = default;
  // Inserts keys[id] (not present yet); false if the table has no room.
  virtual bool Insert(uint32_t id) = 0;
  virtual LookupResult Lookup(const Key& key) const = 0;

  const Geometry& geometry() const { return geo_; }
  uint64_t size() const { return size_; }
  uint64_t moves() const { return moves_; }
  // Inserts that did not fit where a first read finds them (overflow block
  // or chained bucket); 0 for the cuckoo schemes.
  uint64_t spilled() const { return spilled_; }
  // Bucket array, overflow blocks or chained buckets, and extents.
  virtual uint64_t TableBytes() const = 0;
  uint64_t ExtentBytes() const;
  double Occupancy() const { return double(size_) / geo_.primary_slots; }

 protected:
  Scheme(const SchemeConfig& c, const std::vector<Key>* keys);
  bool Inline() const { return config_.pairs == PairKind::kInline; }
  uint64_t Hash(const Key& k, uint32_t i) const;
  uint16_t Tag(const Key& k) const;
  // Charges the reader for slot `id` (0 = empty) while looking for `key`;
  // true if it is the key. An out-of-line slot whose tag matches costs one
  // extent read.
  bool Check(uint32_t id, const Key& key, uint16_t tag, LookupResult* r) const;

  SchemeConfig config_;
  Geometry geo_;
  const std::vector<Key>* keys_;
  uint64_t size_ = 0;
  uint64_t moves_ = 0;
  uint64_t spilled_ = 0;
};

std::unique_ptr<Scheme> MakeScheme(const SchemeConfig& c,
                                   const std::vector<Key>* keys);

// `n` random keys from `seed` (stream `stream` keeps misses apart).
std::vector<Key> RandomKeys(uint64_t n, uint64_t seed, uint64_t stream);

struct Point {
  double occupancy = 0;  // target; measured at the first insert reaching it
  bool reached = false;
  double hit_reads = 0, hit_round_trips = 0, hit_bytes = 0;
  double hit_par_reads = 0, hit_par_round_trips = 0, hit_par_bytes = 0;
  double miss_reads = 0, miss_round_trips = 0, miss_bytes = 0;
  double miss_par_reads = 0, miss_par_round_trips = 0, miss_par_bytes = 0;
  double utilization = 0;       // payload / (table + extents)
  double moves_per_insert = 0;  // from empty to this point
  double interval_moves = 0;    // since the previous point
  double spilled = 0;           // fraction of keys in chains / overflow
  uint64_t hits_missing = 0;    // inserted keys not found (must be 0)
  uint64_t misses_found = 0;    // absent keys found (must be 0)
};

struct RunResult {
  SchemeConfig config;
  Geometry geometry;
  std::vector<Point> points;
  double max_load = 0;     // occupancy at the first failed insert
  bool failed = false;     // false: filled to 100% of primary slots
  double first_spill = 0;  // occupancy at the first chained insert
  bool spilled = false;
};

struct RunOptions {
  std::vector<double> occupancies = {0.5, 0.75, 0.9};
  uint64_t samples = 100000;  // hits and misses per point
};

RunResult Simulate(const SchemeConfig& c, const RunOptions& o);

std::string ToMarkdown(const std::vector<RunResult>& runs);
std::string ToJson(const std::vector<RunResult>& runs);

}  // namespace remem::schemes

#endif  // REMEM_TOOLS_BENCH_SCHEMES_H_
