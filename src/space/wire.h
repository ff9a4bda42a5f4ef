// Wire messages of the namespace service (RStore's namespaces of raw remote
// memory): the payloads of its methods (RpcHeader::service =
// kSpaceService). The header, framing and handshake are in proto/wire.h;
// docs/PROTOCOL.md ("Namespaces") describes these in prose. Change both
// together.
//
// This is the control path only. The data path is one-sided: a client reads
// and writes the extents a map returned with the session's one-sided
// operations on the service's regions (PROTOCOL.md section 8 over tcp).
//
// Thread contract: plain data, no state.

#ifndef REMEM_SPACE_WIRE_H_
#define REMEM_SPACE_WIRE_H_

#include <cstddef>
#include <cstdint>

#include "proto/wire.h"

namespace remem::space {

inline constexpr proto::ServiceId kSpaceService = 3;

enum class SpaceMethod : uint8_t {
  kCreate = 0,    // SpaceRequest + name; SpaceNamespaceWire
  kOpen = 1,      // SpaceRequest + name; SpaceNamespaceWire
  kDelete = 2,    // SpaceRequest + name; empty reply
  kList = 3,      // SpaceRequest; SpaceListReply + items (SpaceNamespaceWire
                  // + name, padded to 8)
  kInfo = 4,      // SpaceRequest (ns); SpaceNamespaceWire
  kReserve = 5,   // SpaceRequest (ns, length); SpaceNamespaceWire
  kRelease = 6,   // SpaceRequest (ns, length); SpaceNamespaceWire
  kAlloc = 7,     // SpaceRequest (ns, length); SpaceSegmentWire
  kFree = 8,      // SpaceRequest (ns, address); empty reply
  kSegments = 9,  // SpaceRequest (ns); SpaceListReply + SpaceSegmentWire items
  kMap = 10,      // SpaceRequest (ns, address, length); SpaceMapReply +
                  // SpaceExtentWire items
  kUnmap = 11,    // SpaceRequest (map_id); empty reply
  kCount
};

// The method byte of a call to kSpaceService.
constexpr uint8_t MethodId(SpaceMethod m) { return static_cast<uint8_t>(m); }

// Longest namespace name, in bytes (printable ASCII, no spaces).
inline constexpr uint32_t kMaxNameBytes = 255;
// Most namespaces one server keeps.
inline constexpr uint32_t kMaxNamespaces = 4096;

// Every request: the fields a method does not use are 0.
struct SpaceRequest {
  uint32_t magic;     // proto::kWireMagic
  uint16_t version;   // proto::kWireVersion
  uint16_t name_len;  // kCreate, kOpen, kDelete: the name follows
  uint64_t ns;        // the namespace's id (from kCreate / kOpen)
  uint64_t address;   // kFree, kMap: an address in the namespace
  uint64_t length;    // kReserve, kRelease, kAlloc, kMap: bytes
  uint64_t map_id;    // kUnmap
};
static_assert(sizeof(SpaceRequest) == 40);

// A namespace as the server holds it.
struct SpaceNamespaceWire {
  uint64_t ns;               // id, never reused by this server incarnation
  uint64_t reserved_bytes;   // reserved and not allocated
  uint64_t allocated_bytes;  // in live segments (whole chunks)
  uint32_t segments;         // live segments
  uint32_t chunk_bytes;      // the server's allocation unit
  uint32_t name_len;         // kList only: the name follows
  uint32_t reserved;
};
static_assert(sizeof(SpaceNamespaceWire) == 40);

struct SpaceListReply {
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(SpaceListReply) == 8);

// An allocated segment: [address, address + length) in its namespace.
struct SpaceSegmentWire {
  uint64_t address;
  uint64_t length;  // as asked (the chunks behind it may hold more)
};
static_assert(sizeof(SpaceSegmentWire) == 16);

struct SpaceMapReply {
  uint64_t map_id;   // names the mapping in kUnmap
  uint64_t address;  // as asked
  uint64_t length;   // as asked
  uint32_t extents;  // SpaceExtentWire items follow, in address order
  uint32_t reserved;
};
static_assert(sizeof(SpaceMapReply) == 32);

// One run of the mapping in server memory: `length` bytes at `offset` of
// region `region` (a region of this service, exported kReadWrite).
struct SpaceExtentWire {
  uint32_t region;
  uint32_t reserved;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(SpaceExtentWire) == 24);

}  // namespace remem::space

#endif  // REMEM_SPACE_WIRE_H_
