// Wire messages shared by remem clients and servers.
//
// Every RPC travels as one UCX active message: a fixed 32-byte RpcHeader as
// the AM header and an opcode-specific payload as the AM data. Payloads that
// carry structure begin with a fixed-layout struct declared here; variable
// parts follow it. All integers are little-endian (remem only builds on
// little-endian hosts, see the static_assert below). One-sided operations
// that remem serves itself (tcp, see MemRequest) travel on their own AM ids
// with a fixed MemRequest / MemReply header. docs/PROTOCOL.md is the
// prose description of everything in this file; change both together.
//
// Thread contract: plain data, no state.

#ifndef REMEM_PROTO_WIRE_H_
#define REMEM_PROTO_WIRE_H_

#include <bit>
#include <cstddef>
#include <cstdint>

namespace remem::proto {

static_assert(std::endian::native == std::endian::little,
              "remem's wire format is little-endian");

inline constexpr uint32_t kWireMagic = 0x4D4D4552;  // "REMM" in memory order
// 2: served memory requests (kAmMemRequest), hash multi-get/put, the hash
// partition root, hash and served-request counters in StatsReply.
inline constexpr uint16_t kWireVersion = 2;

// UCX active-message ids.
inline constexpr unsigned kAmRequest = 17;     // client -> server
inline constexpr unsigned kAmReply = 18;       // server -> client
inline constexpr unsigned kAmMemRequest = 19;  // client -> server
inline constexpr unsigned kAmMemReply = 20;    // server -> client

// Largest RPC payload either side accepts (larger ones are refused by the
// receiver before the data is fetched).
inline constexpr uint64_t kMaxRpcPayload = 64ull << 20;
// Largest shared secret accepted in Hello.
inline constexpr uint32_t kMaxSecretBytes = 4096;
// Largest packed remote key accepted in a region descriptor.
inline constexpr uint32_t kMaxRkeyBytes = 64 * 1024;
inline constexpr uint32_t kMaxRegions = 4096;

enum class Opcode : uint16_t {
  kHello = 1,        // authenticate; reply carries exported regions + rkeys
  kPing = 2,         // empty request, empty reply
  kStats = 3,        // empty request, StatsReply
  kEcho = 4,         // reply payload = request payload (tests, benchmarks)
  kRegions = 5,      // re-list the exported regions (same reply as Hello)
  kError = 6,        // replies only: answer to a request too malformed to name
                     // its opcode
  kHashInfo = 7,     // empty request; HashInfoReply (+ partitions)
  kHashGet = 8,      // HashKeyRequest + key; HashGetReply + value
  kHashPut = 9,      // HashPutRequest + key + value; HashPutReply
  kHashDelete = 10,  // HashKeyRequest + key; empty reply
  kHashMultiGet = 11,  // HashMultiRequest + items; HashMultiReply + items
  kHashMultiPut = 12,  // HashMultiRequest + items; HashMultiReply + items
  kSnapshot = 13,      // empty request; empty reply once every partition's
                       // snapshot is on disk (Unsupported without
                       // persistence)
};

inline constexpr uint16_t kMaxOpcode = 13;

// Flags in RpcHeader::flags.
inline constexpr uint16_t kFlagReply = 1u << 0;

// The AM header of every request and reply.
struct RpcHeader {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // kWireVersion
  uint16_t opcode;       // Opcode
  uint16_t flags;        // kFlag*
  uint16_t reserved;     // zero
  int32_t status;        // replies: StatusCode; requests: zero
  uint64_t request_id;   // chosen by the client, echoed in the reply
  uint64_t payload_len;  // must equal the AM data length
};
static_assert(sizeof(RpcHeader) == 32);
static_assert(offsetof(RpcHeader, request_id) == 16);

// Hello request payload: HelloRequest, then `secret_len` bytes of secret.
struct HelloRequest {
  uint32_t magic;       // kWireMagic
  uint16_t version;     // client's kWireVersion
  uint16_t reserved;    // zero
  uint32_t secret_len;  // <= kMaxSecretBytes
  uint32_t reserved2;   // zero
};
static_assert(sizeof(HelloRequest) == 16);

// Hello / Regions reply payload: HelloReply, then `num_regions` times
// (RegionDescriptor, rkey bytes padded with zeros to a multiple of 8).
struct HelloReply {
  uint32_t magic;        // kWireMagic
  uint16_t version;      // server's kWireVersion
  uint16_t reserved;     // zero
  uint64_t incarnation;  // random per server start: detects a restart
  uint64_t max_payload;  // largest RPC payload the server accepts
  uint32_t num_regions;  // <= kMaxRegions
  uint32_t server_threads;
};
static_assert(sizeof(HelloReply) == 32);

struct RegionDescriptor {
  uint32_t region_id;  // stable name of the region (pointers use it)
  uint32_t rkey_len;   // packed UCX remote key bytes that follow
  uint64_t base;       // server virtual address of byte 0
  uint64_t length;     // bytes
};
static_assert(sizeof(RegionDescriptor) == 24);

// Stats reply payload.
struct StatsReply {
  uint32_t magic;  // kWireMagic
  uint16_t version;
  uint16_t reserved;
  uint64_t uptime_ms;
  uint64_t connections_current;
  uint64_t connections_total;
  uint64_t auth_failures;
  uint64_t rpcs_served;
  uint64_t rpc_bytes_in;
  uint64_t rpc_bytes_out;
  uint64_t rpc_errors;
  uint64_t memory_registered;  // bytes exported in regions
  uint64_t regions;
  uint64_t server_threads;
  uint64_t incarnation;
  uint64_t hash_pairs;           // pairs stored in the hash store
  uint64_t hash_growths;         // table doublings, all partitions
  uint64_t hash_bytes_used;      // of the hash store's memory, carved so far
  uint64_t hash_bytes_total;     // the hash store's memory
  uint64_t mem_requests_served;  // served one-sided operations (tcp)
  // Durability (all zero without persistence).
  uint64_t fsync_policy;           // 0 = no persistence, 1 = no, 2 = everysec,
                                   // 3 = always
  uint64_t log_bytes;              // operation log on disk, all partitions
  uint64_t last_snapshot_unix_ms;  // newest snapshot of any partition; 0
  uint64_t last_snapshot_bytes;    // sum of the partitions' newest
  uint64_t snapshots;              // taken since start
  uint64_t log_write_errors;       // failed log/snapshot writes and syncs
  uint64_t log_failing;            // partitions refusing writes now
  uint64_t recovered_pairs;        // at start: from snapshots
  uint64_t recovered_log_records;  // at start: replayed from logs
  uint64_t recovery_ms;            // at start: how long recovery took
};
static_assert(sizeof(StatsReply) == 8 + 27 * 8);

// --- served one-sided operations
//
// Where UCX would emulate RMA in software (tcp), the client asks the server
// to perform each one-sided operation: a MemRequest as the AM header of a
// kAmMemRequest message (AM data: the bytes to write, else empty), answered
// by a MemReply as the AM header of a kAmMemReply message (AM data: the
// bytes read, or the error message when `status` is not OK).

enum class MemOp : uint8_t {
  kRead = 1,         // AM data of the reply: `length` bytes at `offset`
  kWrite = 2,        // AM data of the request: the `length` bytes to write
  kCompareSwap = 3,  // old = *p; if (old == operand) *p = operand2
  kFetchAdd = 4,     // old = *p; *p += operand
};
inline constexpr uint8_t kMaxMemOp = 4;

// Largest read or write in one request; the client splits larger ones.
inline constexpr uint64_t kMaxMemTransfer = 8ull << 20;

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

// --- hash store

struct HashInfoReply {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint32_t num_partitions;  // <= kMaxRegions
  uint32_t max_key;         // bytes
  uint32_t max_value;       // bytes
  uint32_t reserved2;
  uint64_t partition_seed;  // partition = xxh3(key, seed) % num_partitions
};
static_assert(sizeof(HashInfoReply) == 32);

// One per partition, after HashInfoReply.
// The bucket array may move when the table grows; the root (read one-sided,
// hash/layout.h) always names the live one. The other fields are the
// root's content when the reply was made.
struct HashPartition {
  uint32_t region;  // region holding the root, buckets and extents
  uint32_t reserved;
  uint64_t root_offset;  // region offset of the partition's Root
  uint64_t buckets_offset;
  uint64_t num_buckets;  // a power of two
  uint64_t seed;         // key hash seed of the partition's table
};
static_assert(sizeof(HashPartition) == 40);

struct HashKeyRequest {
  uint32_t key_len;
  uint32_t reserved;
};
static_assert(sizeof(HashKeyRequest) == 8);

enum class PutMode : uint8_t { kUpsert = 0, kIfAbsent = 1, kIfVersion = 2 };

struct HashPutRequest {
  uint32_t key_len;
  uint32_t value_len;
  uint8_t mode;  // PutMode
  uint8_t reserved[7];
  uint64_t expected_version;  // kIfVersion
};
static_assert(sizeof(HashPutRequest) == 24);

struct HashGetReply {
  uint64_t version;
  uint32_t value_len;
  uint32_t reserved;
};
static_assert(sizeof(HashGetReply) == 16);

struct HashPutReply {
  uint64_t version;
};
static_assert(sizeof(HashPutReply) == 8);

// Multi-get / multi-put: one message for many keys. Each item succeeds or
// fails on its own (the RPC status is OK when the batch was decoded).
inline constexpr uint32_t kMaxMultiItems = 1u << 16;

struct HashMultiRequest {
  uint32_t count;  // items that follow, 1 .. kMaxMultiItems
  uint32_t reserved;
};
static_assert(sizeof(HashMultiRequest) == 8);

// Multi-get item: HashMultiKey + key. Multi-put item (upsert):
// HashMultiPair + key + value. No padding between items.
struct HashMultiKey {
  uint32_t key_len;
};
static_assert(sizeof(HashMultiKey) == 4);
struct HashMultiPair {
  uint32_t key_len;
  uint32_t value_len;
};
static_assert(sizeof(HashMultiPair) == 8);

struct HashMultiReply {
  uint32_t count;  // = the request's
  uint32_t reserved;
};
static_assert(sizeof(HashMultiReply) == 8);

// One per item, in request order, followed by `data_len` bytes: the value
// (get, status OK), the error message (status not OK), or nothing (put).
struct HashMultiItem {
  uint16_t status;  // StatusCode
  uint16_t reserved;
  uint32_t data_len;
  uint64_t version;
};
static_assert(sizeof(HashMultiItem) == 16);

}  // namespace remem::proto

#endif  // REMEM_PROTO_WIRE_H_
