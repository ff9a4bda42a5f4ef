// space::SpaceTable: the namespaces of raw remote memory one server keeps
// (RStore's reserve / alloc / map, section III), over the memory of the
// namespace service's regions, cut into chunks of one size.
//
//   - A namespace has a name, an id never reused by this incarnation, a
//     reservation (chunks set aside for it, not yet in a segment) and its
//     segments: allocations at addresses of its own flat 64-bit space,
//     each backed by whole chunks anywhere in the regions. Addresses are
//     never reused in a namespace, so a stale address finds nothing.
//   - Alloc takes chunks from the reservation first, then from the free
//     pool, and zeroes them. Free returns a segment's chunks to its
//     namespace's reservation; Release and Delete give them back to the
//     pool.
//   - Map names a range inside one live segment for a connection and
//     returns where it lies (extents of region, offset, length): the
//     client then reads and writes it one-sided. Memory is handed to
//     anything else only once nothing maps it: chunks of a segment freed
//     (or of a namespace deleted) while mapped are held until the last map
//     of it is dropped (Unmap, or its connection closing), as the BRIEF's
//     rule for memory readers may still be traversing.
//
// Thread contract: single-threaded (the service runs it on partition 0's
// owner thread); Stats counters are read from any thread.

#ifndef REMEM_SPACE_SPACE_H_
#define REMEM_SPACE_SPACE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "remem/status.h"
#include "space/codec.h"
#include "space/wire.h"

namespace remem::space {

// Memory the table hands out: `length` bytes at `base` (this process),
// exported as region `id`.
struct SpaceRegion {
  uint32_t id = 0;
  uint8_t* base = nullptr;
  uint64_t length = 0;
};

// Most maps one connection may hold at once.
inline constexpr uint32_t kMaxMapsPerConnection = 65536;

class SpaceTable {
 public:
  // `chunk_bytes`: a power of two of at least 4 KiB. Regions' tails shorter
  // than a chunk are not used.
  SpaceTable(const std::vector<SpaceRegion>& regions, uint64_t chunk_bytes);

  Result<NamespaceEntry> Create(std::string_view name);
  Result<NamespaceEntry> Open(std::string_view name) const;
  // Frees every segment (held while mapped) and releases the reservation.
  Status Delete(std::string_view name);
  std::vector<NamespaceEntry> List() const;
  Result<NamespaceEntry> Info(uint64_t ns) const;
  // Sets aside `bytes` (rounded up to chunks) for the namespace; all or
  // nothing (OutOfMemory).
  Result<NamespaceEntry> Reserve(uint64_t ns, uint64_t bytes);
  // Gives back up to `bytes` (rounded up to chunks) of the reservation;
  // UINT64_MAX: all of it.
  Result<NamespaceEntry> Release(uint64_t ns, uint64_t bytes);
  Result<SpaceSegmentWire> Alloc(uint64_t ns, uint64_t bytes);
  // `address` must be where a live segment starts.
  Status Free(uint64_t ns, uint64_t address);
  Result<std::vector<SpaceSegmentWire>> Segments(uint64_t ns) const;
  // [address, address + length) must lie inside one live segment.
  Result<MapReply> Map(uint64_t ns, uint64_t address, uint64_t length,
                       uint64_t connection);
  Status Unmap(uint64_t map_id, uint64_t connection);
  // Drops every map `connection` holds.
  void DropConnection(uint64_t connection);

  uint64_t chunk_bytes() const { return chunk_; }
  uint64_t total_bytes() const { return total_chunks_ * chunk_; }

  struct Counters {
    std::atomic<uint64_t> free_bytes{0};       // in the pool
    std::atomic<uint64_t> reserved_bytes{0};   // reserved, not allocated
    std::atomic<uint64_t> allocated_bytes{0};  // in live segments
    std::atomic<uint64_t> held_bytes{0};       // freed, held until unmapped
    std::atomic<uint64_t> namespaces{0};
    std::atomic<uint64_t> segments{0};
    std::atomic<uint64_t> maps{0};
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Segment {
    uint64_t ns = 0;  // 0 once the namespace is deleted
    uint64_t address = 0;
    uint64_t length = 0;
    std::vector<uint32_t> chunks;
    uint32_t maps = 0;
    bool freed = false;
  };
  struct Namespace {
    std::string name;
    uint64_t id = 0;
    std::set<uint32_t> reserved;
    std::map<uint64_t, uint64_t> segments;  // address -> segment uid
    uint64_t next_address = 0;
    uint64_t allocated_bytes = 0;
  };
  struct MapEntry {
    uint64_t connection = 0;
    uint64_t segment = 0;  // uid
  };

  Result<Namespace*> Find(uint64_t ns);
  Result<const Namespace*> Find(uint64_t ns) const;
  NamespaceEntry Entry(const Namespace& n, bool with_name) const;
  // Takes `n` chunks (lowest first, so runs stay contiguous) from `from`.
  static std::vector<uint32_t> Take(std::set<uint32_t>* from, uint64_t n);
  uint8_t* ChunkAddress(uint32_t chunk, uint32_t* region,
                        uint64_t* offset) const;
  // A freed segment whose last map went: its chunks go to its namespace's
  // reservation, or to the pool if the namespace is gone.
  void Reclaim(uint64_t uid);
  void FreeSegment(Namespace* n, uint64_t uid);
  void Publish();

  struct RegionSpan {
    uint32_t id;
    uint8_t* base;
    uint32_t first_chunk;
    uint32_t chunks;
  };
  std::vector<RegionSpan> spans_;
  uint64_t chunk_;
  uint64_t total_chunks_ = 0;
  std::set<uint32_t> pool_;
  std::map<std::string, uint64_t, std::less<>> by_name_;
  std::unordered_map<uint64_t, Namespace> namespaces_;
  std::unordered_map<uint64_t, Segment> segments_;
  std::unordered_map<uint64_t, MapEntry> maps_;
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> maps_of_;
  uint64_t next_ns_ = 1;
  uint64_t next_segment_ = 1;
  uint64_t next_map_ = 1;
  uint64_t reserved_chunks_ = 0;
  uint64_t allocated_chunks_ = 0;
  uint64_t held_chunks_ = 0;
  uint64_t held_segments_ = 0;
  Counters counters_;
};

}  // namespace remem::space

#endif  // REMEM_SPACE_SPACE_H_
