// Wire messages every remem client and server share: the TCP handshake that
// opens a session, the RPC header, the region list, named stats and served
// memory requests. Each data model (service) declares its own payloads in
// its folder (e.g. src/hash/wire.h); docs/PROTOCOL.md describes all of them
// in prose. Change the code and the document together.
//
// A session begins on a plain TCP connection with remem's own handshake
// (ClientHello / ServerHello): the client authenticates and sends its UCX
// worker address, the server answers with the address of the worker that
// will serve it. Both then create UCX endpoints to each other's worker, and
// every RPC travels as one UCX active message: a fixed RpcHeader as the AM
// header and a service-specific payload as the AM data. The TCP connection
// stays open for the life of the session, carrying nothing: its close tells
// either side that the other is gone. One-sided operations that remem
// serves itself (tcp) travel on their own AM ids with MemRequest/MemReply.
//
// All integers are little-endian (see the static_assert below).
//
// Thread contract: plain data, no state.

#ifndef REMEM_PROTO_WIRE_H_
#define REMEM_PROTO_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>

#include "remem/options.h"

namespace remem::proto {

static_assert(std::endian::native == std::endian::little,
              "remem's wire format is little-endian");

inline constexpr uint32_t kWireMagic = 0x4D4D4552;  // "REMM" in memory order
// 3: remem's own TCP handshake instead of UCX's connection manager;
// service + method + epoch in the RPC header; stats as named values; region
// owners and access in the region list; the server lease region.
// 4: RpcHeader back to 32 bytes (32-bit payload_len and epoch).
// 5: the hash store's layout 3 (bucket headers with an index).
// 6: ServerHello carries the number of the server's endpoint.
// 7: the ordered store's layout 2 (out-of-line values, a node arena of
//    pages, 32-bit value lengths in scan items).
// 8: the ordered store's layout 3 (long keys out of line, 32-bit key
//    lengths in scan items).
// 9: the ordered store's layout 4 (a node's checksum covers its bytes in
//    use).
// 10: sealed payloads (kFlagSealed).
// 11: the serving thread's endpoint notice (kAmEndpointNotice), which the
//     client waits for before it creates its endpoint.
// 12: the ordered store's layout 6 (a node's stamp, the tree mark's
//     replicated half).
// 13: an object header's check is seeded with its slot's capacity.
inline constexpr uint16_t kWireVersion = 13;

// UCX active-message ids.
inline constexpr unsigned kAmRequest = 17;     // client -> server
inline constexpr unsigned kAmReply = 18;       // server -> client
inline constexpr unsigned kAmMemRequest = 19;  // client -> server
inline constexpr unsigned kAmMemReply = 20;    // server -> client
// The first message on an endpoint its creator made to a peer worker
// (fabric::Endpoint::SendNotice): its header is an EndpointNotice.
inline constexpr unsigned kAmEndpointNotice = 21;  // server -> client

// Largest RPC payload either side accepts (larger ones are refused by the
// receiver before the data is fetched).
inline constexpr uint64_t kMaxRpcPayload = 64ull << 20;
static_assert(kMaxRpcPayload <= UINT32_MAX,
              "RpcHeader::payload_len is 32 bits");
// Payloads of this many bytes or more are sealed (kFlagSealed): half the
// smallest rendezvous UCX's default threshold sends (measured with UCX
// 1.13: a message of 8,232 bytes over shared memory, 32,784 over tcp; a
// UCX_RNDV_THRESH set lower leaves smaller rendezvous payloads unsealed).
inline constexpr uint64_t kSealMin = 4096;
// Largest shared secret accepted in the handshake.
inline constexpr uint32_t kMaxSecretBytes = uint32_t(remem::kMaxSecretBytes);
// Largest UCX worker address accepted in the handshake.
inline constexpr uint32_t kMaxWorkerAddressBytes = 64 * 1024;
// Largest error message in a refusing ServerHello.
inline constexpr uint32_t kMaxHandshakeMessageBytes = 4096;
// Largest packed remote key accepted in a region descriptor.
inline constexpr uint32_t kMaxRkeyBytes = 64 * 1024;
inline constexpr uint32_t kMaxRegions = 4096;

// --- the TCP handshake

// Client -> server: the first bytes on the connection. Then `secret_len`
// bytes of shared secret and `address_len` bytes of the client's UCX
// worker address.
struct ClientHello {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // the client's kWireVersion
  uint16_t flags;        // zero
  uint32_t secret_len;   // <= kMaxSecretBytes
  uint32_t address_len;  // 1 .. kMaxWorkerAddressBytes
  uint64_t reserved[2];  // zero
};
static_assert(sizeof(ClientHello) == 32);

// Client -> server, after an OK ServerHello: the one byte a client may
// send on the connection as it ends a session in order, its endpoint
// closed (nothing of it is half sent), just before it closes the
// connection. Without it the server takes the end for a client that may
// have died while sending to it over shared memory, and watches that
// thread's receive queue (fabric/worker.h, WatchForStall). Any other byte
// after the handshake ends the session as a misbehaving client's.
inline constexpr uint8_t kSessionGoodbye = 0xB7;

// Server -> client. Then `body_len` bytes: the UCX worker address of the
// server thread that serves this session (status OK), or an error message
// (any other status; the server then closes the connection). The first 12
// bytes keep this layout in every wire version, so a client of another
// version still reads the refusal.
struct ServerHello {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // the server's kWireVersion
  uint16_t reserved;     // zero
  int32_t status;        // StatusCode
  uint32_t body_len;     // <= kMaxWorkerAddressBytes (OK), else
                         // <= kMaxHandshakeMessageBytes
  uint64_t incarnation;  // random per server start: detects a restart
  uint64_t session_id;   // names the session in the server's logs
  uint32_t server_threads;
  uint32_t lease_ms;  // the server lease length (docs/PROTOCOL.md)
  // UCX's number of the server's endpoint to the client's worker (how many
  // that server worker had made to it before): the client creates its own
  // with the same number, so that UCX pairs the two (fabric/endpoint.h,
  // CreateNumbered).
  uint64_t endpoint_number;
};
static_assert(sizeof(ServerHello) == 48);

// Server -> client over UCX, after an OK ServerHello: the header of the
// first active message (kAmEndpointNotice, no data) on the endpoint the
// serving thread created to the client's worker, sent with
// UCP_AM_SEND_FLAG_REPLY (as every remem message). So it arrives once UCX's
// wireup of that endpoint has reached the client's worker, and only then
// does the client create its own endpoint, which UCX then makes from the
// one that wireup made: no endpoint of either side is ever configured
// twice (UCX 1.13 aborts a process asked to reconfigure an endpoint made
// from a worker address, as the server's was when a client's lanes
// differed; docs/PROTOCOL.md, section 1).
struct EndpointNotice {
  uint32_t magic;            // kWireMagic
  uint16_t version;          // kWireVersion
  uint16_t reserved;         // zero
  uint64_t incarnation;      // the ServerHello's
  uint64_t session_id;       // the ServerHello's
  uint64_t endpoint_number;  // the ServerHello's
};
static_assert(sizeof(EndpointNotice) == 32);

// --- RPCs

// Services. Each data model declares its id in its own folder (hash:
// src/hash/wire.h); the server refuses two services with one id. Id 0 is
// the core service below.
using ServiceId = uint8_t;
inline constexpr ServiceId kCoreService = 0;

// Methods of the core service.
enum class CoreMethod : uint8_t {
  kError = 0,     // replies only: the answer to a request too malformed to
                  // name its service and method
  kPing = 1,      // empty request, empty reply
  kEcho = 2,      // reply payload = request payload (tests, benchmarks)
  kStats = 3,     // empty request; StatsReply
  kRegions = 4,   // empty request; RegionsReply
  kSnapshot = 5,  // empty request; empty reply once every durable service's
                  // partitions are snapshotted (Unsupported without
                  // persistence)
  kClusterConfig = 6,  // empty request; the cluster configuration this
                       // server installed last (src/cluster/config.h);
                       // Unsupported outside a cluster, Busy before the
                       // first configuration
  kClusterDrain = 7,   // request: a member's address; reply, once the
                       // drain is recorded (the manager then moves its
                       // shards away): the incarnation drained (u64, 0 if
                       // none was registered); Unsupported outside a
                       // cluster, NotFound for an address not in the
                       // configuration
  kClusterLease = 8,   // request: a member's lease request
                       // (cluster/wire.h); reply: the manager's grant.
                       // Conflict from a member that is not the manager
  kCount
};

// Flags in RpcHeader::flags.
inline constexpr uint16_t kFlagReply = 1u << 0;
// The AM header is a SealedRpcHeader: the payload's checksum follows the
// RpcHeader. Every payload of kSealMin bytes or more is sealed, requests
// and replies. UCX sends a large message by rendezvous: the receiver
// fetches the payload out of the sender's memory, which a sender that gave
// the send up (a forced close, after a timeout) may have freed and reused
// by then; sealed, such a payload fails to verify instead of being taken
// for a request or a reply. (The seal travels in the header, which a
// rendezvous sends whole, so the payload is never copied to add it.)
inline constexpr uint16_t kFlagSealed = 1u << 1;

// The AM header of every request and reply.
struct RpcHeader {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // kWireVersion
  uint8_t service;       // ServiceId
  uint8_t method;        // the service's method
  uint16_t flags;        // kFlag*
  uint16_t reserved;     // zero
  int32_t status;        // replies: StatusCode; requests: zero
  uint64_t request_id;   // chosen by the client, echoed in the reply
  uint32_t payload_len;  // must equal the AM data length
  uint32_t epoch;        // configuration epoch the sender used; 0 outside a
                         // cluster
};
// 32 bytes, not more: over shared memory a reply small enough for one UCX
// FIFO element (128 bytes with UCX's own headers) is sent inline
// (am_short); 8 more bytes pushed a get's reply of a 32 B value out of it,
// which cost synchronous RPCs 10-20% (docs/ARCHITECTURE.md, "What UCX did
// that surprised us").
static_assert(sizeof(RpcHeader) == 32);
static_assert(offsetof(RpcHeader, request_id) == 16);

// The AM header of a sealed message (kFlagSealed): 40 bytes. Only payloads
// of kSealMin bytes or more are sealed, so the 32-byte header of small
// messages (above) is unchanged.
struct SealedRpcHeader {
  RpcHeader rpc;  // flags has kFlagSealed
  uint64_t seal;  // xxh3-64 of the payload
};
static_assert(sizeof(SealedRpcHeader) == 40);

// Regions reply payload: RegionsReply, then `num_regions` times
// (RegionDescriptor, rkey bytes padded with zeros to a multiple of 8).
struct RegionsReply {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // server's kWireVersion
  uint16_t reserved;     // zero
  uint64_t incarnation;  // random per server start
  uint64_t max_payload;  // largest RPC payload the server accepts
  uint32_t num_regions;  // <= kMaxRegions
  uint32_t server_threads;
};
static_assert(sizeof(RegionsReply) == 32);

// Who may do what to a region.
enum class RegionAccess : uint8_t {
  kReadWrite = 0,  // raw memory: one-sided reads, writes and atomics
  kReadOnly = 1,   // a service's structures: one-sided reads only
};

// Region 0 is the server root: the lease at offset 0 (ServerLease).
inline constexpr uint32_t kRootRegion = 0;

struct RegionDescriptor {
  uint32_t region_id;  // stable name of the region (pointers use it)
  uint32_t rkey_len;   // packed UCX remote key bytes that follow
  uint64_t base;       // server virtual address of byte 0
  uint64_t length;     // bytes
  uint8_t service;     // owner: kCoreService for the root and raw regions
  uint8_t access;      // RegionAccess
  uint16_t reserved;   // zero
  uint32_t reserved2;  // zero
};
static_assert(sizeof(RegionDescriptor) == 32);

// The server lease, at offset 0 of the root region, read one-sided by
// clients whose reads do not pass through the server (shared memory). The
// server renews it every lease/10; a reader returns what it read one-sided
// only while its own CLOCK_MONOTONIC is below `expires_ns` (same host, same
// clock). Written like every remotely read structure: version odd while
// written, checksum over the rest (docs/PROTOCOL.md, "Server root and lease").
inline constexpr uint32_t kLeaseMagic = 0x4553414C;  // "LASE"
struct ServerLease {
  uint64_t version;  // even when stable
  uint32_t magic;    // kLeaseMagic
  uint32_t reserved;
  uint64_t incarnation;  // the server's, as in ServerHello
  uint64_t expires_ns;   // CLOCK_MONOTONIC; 0: revoked (server stopping)
  uint64_t renewals;     // +1 per renewal
  uint64_t lease_ns;     // the lease length
  uint64_t checksum;     // xxh3-64 of bytes [0, 48)
  uint64_t reserved2;
};
static_assert(sizeof(ServerLease) == 64);
static_assert(offsetof(ServerLease, checksum) == 48);

// Stats reply payload: StatsReply, then `count` times (StatEntry, name,
// text), unpadded. Names are [a-z0-9_.], 1..kMaxStatName bytes, unique.
struct StatsReply {
  uint32_t magic;  // kWireMagic
  uint16_t version;
  uint16_t reserved;
  uint32_t count;  // <= kMaxStats
  uint32_t reserved2;
};
static_assert(sizeof(StatsReply) == 16);
inline constexpr uint32_t kMaxStats = 4096;
inline constexpr uint32_t kMaxStatName = 64;
inline constexpr uint32_t kMaxStatText = 256;

enum class StatKind : uint8_t { kNumber = 0, kText = 1 };
struct StatEntry {
  uint16_t name_len;
  uint8_t kind;  // StatKind
  uint8_t reserved;
  uint32_t text_len;  // kText: bytes of text after the name; else 0
  uint64_t value;     // kNumber
};
static_assert(sizeof(StatEntry) == 16);

// --- served one-sided operations
//
// Where UCX would emulate RMA in software (tcp), the client asks the server
// to perform each one-sided operation: a MemRequest as the AM header of a
// kAmMemRequest message (AM data: the bytes to write, the spans of a
// kReadMany, else empty), answered by a MemReply as the AM header of a
// kAmMemReply message (AM data: the bytes read, or the error message when
// `status` is not OK).

enum class MemOp : uint8_t {
  kRead = 1,         // AM data of the reply: `length` bytes at `offset`
  kWrite = 2,        // AM data of the request: the `length` bytes to write
  kCompareSwap = 3,  // old = *p; if (old == operand) *p = operand2
  kFetchAdd = 4,     // old = *p; *p += operand
  // Several reads in one request (region and offset 0): AM data of the
  // request: MemSpans, whose lengths add up to `length`; of the reply:
  // their bytes, one after the other.
  kReadMany = 5,
};
inline constexpr uint8_t kMaxMemOp = 5;

// Largest read or write in one request; the client splits larger ones.
inline constexpr uint64_t kMaxMemTransfer = 8ull << 20;

// One read of a kReadMany.
struct MemSpan {
  uint32_t region;    // RegionDescriptor::region_id
  uint32_t reserved;  // zero
  uint64_t offset;    // from the region's byte 0
  uint64_t length;    // bytes
};
static_assert(sizeof(MemSpan) == 24);
// Most spans in one kReadMany; the client sends more in several.
inline constexpr size_t kMaxMemSpans = 1024;

struct MemRequest {
  uint32_t magic;       // kWireMagic
  uint16_t version;     // kWireVersion
  uint8_t op;           // MemOp
  uint8_t reserved;     // zero
  uint32_t region;      // RegionDescriptor::region_id
  uint32_t reserved2;   // zero
  uint64_t request_id;  // chosen by the client, echoed in the reply
  uint64_t offset;      // from the region's byte 0
  uint64_t length;      // bytes; 8 for atomics
  uint64_t operand;     // compare value (kCompareSwap) or delta (kFetchAdd)
  uint64_t operand2;    // swap value (kCompareSwap)
};
static_assert(sizeof(MemRequest) == 56);
static_assert(offsetof(MemRequest, request_id) == 16);

struct MemReply {
  uint32_t magic;    // kWireMagic
  uint16_t version;  // kWireVersion
  uint8_t op;        // MemOp of the request
  uint8_t reserved;  // zero
  int32_t status;    // StatusCode
  uint32_t reserved2;
  uint64_t request_id;
  uint64_t value;  // atomics: the previous value
};
static_assert(sizeof(MemReply) == 32);

}  // namespace remem::proto

#endif  // REMEM_PROTO_WIRE_H_
