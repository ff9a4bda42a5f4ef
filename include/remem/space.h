// Copyright remem authors.
//
// remem::Namespace and remem::Mapping: namespaces of raw remote memory, as
// in RStore. A namespace is a named, flat 64-bit address space on one
// server, in which applications allocate segments of raw bytes and then
// read and write them one-sided, with no work by the server:
//
//   auto ns = remem::Namespace::Create(session.get(), "graph");  // or Open
//   (*ns)->Reserve(64 << 20);                 // optional: set memory aside
//   auto seg = (*ns)->Alloc(1 << 20);         // -> {address, length}
//   auto map = (*ns)->Map(seg->address, seg->length);
//   (*map)->Write(0, data, n);                // one-sided
//   (*map)->Read(0, buf, n);                  // one-sided
//
// Control path and data path (RStore's split): Create, Open, Delete, List,
// Reserve, Release, Alloc, Free, Segments and Map are calls to the server;
// a Mapping's Read, Write, CompareAndSwap and FetchAdd are one-sided
// operations on the server's memory (copies and CPU atomics over shared
// memory, performed by the server's connection thread over tcp, RDMA where
// the hardware exists). Any number of sessions may open one namespace and
// map one segment; they coordinate as they see fit (the atomics, or flags
// in the memory itself).
//
// What the bytes promise: nothing beyond the transport's. remem does not
// interpret or checksum a namespace's memory. A Read that runs while
// another client writes the same bytes may return part of each; a
// CompareAndSwap or FetchAdd on an 8-byte aligned word is atomic with
// every other one on that word; a Write is in the server's memory, and
// seen by every later Read, when it returns (its callback runs). New
// segments read as zeros.
//
// Lifetime: a segment's memory is never handed to anything else while a
// Mapping of it exists (in any process): Free and Delete take effect at
// once for new calls (Map then fails with NotFound), and the memory is
// reused once the last Mapping of it is destroyed or its session closes.
// So a Mapping stays safe to use after its segment is freed; what it reads
// then is what was written through such stale mappings only.
//
// Liveness: as Session::Read (session.h): a one-sided Read returns data
// only while the server's lease vouches for it, else Unavailable.
//
// Durability: none. Namespaces live as long as the server process; a
// restarted server has none (with or without --data-dir: the server never
// sees what clients write one-sided, so it cannot log it), and the
// session of a Namespace or Mapping fails with Unavailable when its
// server goes.
//
// Capacity: the server's --space-memory (default a sixteenth of
// --memory, or less if the other data models took more), handed out in chunks
// of --space-chunk (default 64 KiB): a segment takes whole chunks, and a
// Mapping's extents follow them (an operation across chunks that are not
// adjacent in server memory is done as one one-sided operation per run).
//
// One server: a namespace lives on the server of the session that
// created it; in a cluster, open a Session to the member that holds it.
// RStore's striping of a namespace over servers is not built.
//
// Errors: InvalidArgument (a bad name, 0 bytes to Alloc or Map, a range outside
// the segment or mapping, an atomic on an unaligned offset), NotFound (no such
// namespace or segment: deleted, freed, or the server restarted),
// AlreadyExists (Create of a taken name), OutOfMemory (the server's
// namespace memory is used up; nothing was allocated), Unsupported (a
// server started with no namespace memory), and the session's own errors
// (Unavailable, TimedOut).
//
// Thread contract: as the Session they are attached to (single-threaded);
// destroy Mappings and Namespaces before their Session.

#ifndef REMEM_SPACE_H_
#define REMEM_SPACE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remem/session.h"
#include "remem/status.h"

namespace remem {

namespace fabric {
class RemoteRegion;  // a server region as this process reaches it (src/fabric)
}  // namespace fabric

// [address, address + length) in a namespace.
struct Segment {
  uint64_t address = 0;
  uint64_t length = 0;
};

struct NamespaceInfo {
  std::string name;              // in List() only
  uint64_t id = 0;               // never reused while the server runs
  uint64_t reserved_bytes = 0;   // reserved and not in a segment
  uint64_t allocated_bytes = 0;  // in segments (whole chunks)
  uint32_t segments = 0;
  uint32_t chunk_bytes = 0;  // the server's allocation unit
};

class Mapping;

class Namespace {
 public:
  // Names are 1..255 bytes of printable ASCII without spaces.
  static Result<std::unique_ptr<Namespace>> Create(Session* session,
                                                   std::string_view name);
  static Result<std::unique_ptr<Namespace>> Open(Session* session,
                                                 std::string_view name);
  // Deletes the namespace: its segments are freed (their memory held
  // while mapped) and its reservation released. Open handles then get
  // NotFound.
  static Status Delete(Session* session, std::string_view name);
  // Every namespace of the server, by name.
  static Result<std::vector<NamespaceInfo>> List(Session* session);

  ~Namespace();
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  const std::string& name() const { return name_; }
  uint64_t id() const { return id_; }
  Result<NamespaceInfo> Info();

  // Sets `bytes` (rounded up to chunks) of the server's memory aside for
  // this namespace, all or nothing: later Allocs take it first, and no
  // other namespace can.
  Status Reserve(uint64_t bytes);
  // Gives up to `bytes` (rounded up to chunks; UINT64_MAX: all) of the
  // reservation back to the server.
  Status Release(uint64_t bytes);
  // A new segment of `bytes`, zeroed, from the reservation and then the
  // server's free memory. Its address is new in this namespace.
  Result<Segment> Alloc(uint64_t bytes);
  // `address` is where a segment starts. Its memory returns to this
  // namespace's reservation (once no Mapping holds it).
  Status Free(uint64_t address);
  // The live segments, by address.
  Result<std::vector<Segment>> Segments();

  // Maps [address, address + length), which must lie inside one segment.
  Result<std::unique_ptr<Mapping>> Map(uint64_t address, uint64_t length);
  Result<std::unique_ptr<Mapping>> Map(const Segment& segment) {
    return Map(segment.address, segment.length);
  }

 private:
  Namespace(Session* session, std::string name, uint64_t id)
      : session_(session), name_(std::move(name)), id_(id) {}
  static Result<std::unique_ptr<Namespace>> CreateOrOpen(Session* session,
                                                         std::string_view name,
                                                         bool create);
  Session* session_;
  std::string name_;
  uint64_t id_;
};

// A mapped range of a namespace: offsets are from its start.
class Mapping {
 public:
  using Callback = std::function<void(Status)>;
  using ValueCallback = std::function<void(Result<uint64_t>)>;

  // Tells the server the range is no longer mapped (without waiting).
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  uint64_t address() const { return address_; }  // in the namespace
  uint64_t length() const { return length_; }

  // [offset, offset + len) must lie inside the mapping.
  Status Read(uint64_t offset, void* dst, size_t len);
  // Returns when the bytes are in the server's memory.
  Status Write(uint64_t offset, const void* src, size_t len);
  // 8-byte aligned offsets (in the namespace: segments start on chunks).
  Result<uint64_t> CompareAndSwap(uint64_t offset, uint64_t expected,
                                  uint64_t desired);
  Result<uint64_t> FetchAdd(uint64_t offset, uint64_t delta);

  // Asynchronous versions, as Session's: the callback runs inside a later
  // Poll()/WaitAll() of the session; buffers stay valid until it runs.
  void ReadAsync(uint64_t offset, void* dst, size_t len, Callback done);
  void WriteAsync(uint64_t offset, const void* src, size_t len, Callback done);
  void CompareAndSwapAsync(uint64_t offset, uint64_t expected, uint64_t desired,
                           ValueCallback done);
  void FetchAddAsync(uint64_t offset, uint64_t delta, ValueCallback done);

 private:
  friend class Namespace;
  // A run of the mapping in server memory, its region resolved at Map (a
  // session's regions live as long as it does).
  struct Extent {
    const fabric::RemoteRegion* region;
    uint64_t offset;  // in the region
    uint64_t length;
    uint64_t start;  // in the mapping
  };
  Mapping(Session* session, uint64_t map_id, uint64_t address, uint64_t length,
          std::vector<Extent> extents)
      : session_(session),
        map_id_(map_id),
        address_(address),
        length_(length),
        extents_(std::move(extents)) {}
  Session* session_;
  uint64_t map_id_;
  uint64_t address_;
  uint64_t length_;
  std::vector<Extent> extents_;
};

}  // namespace remem

#endif  // REMEM_SPACE_H_
