// Wire messages of the hash key-value store service: the payloads of its
// methods (RpcHeader::service = kHashService). The header, framing and
// handshake are in proto/wire.h; docs/PROTOCOL.md ("Hash store")
// describes these in prose. Change both together.
//
// Thread contract: plain data, no state.

#ifndef REMEM_HASH_WIRE_H_
#define REMEM_HASH_WIRE_H_

#include <cstddef>
#include <cstdint>

#include "proto/wire.h"

namespace remem::hash {

inline constexpr proto::ServiceId kHashService = 1;

enum class HashMethod : uint8_t {
  kInfo = 0,      // empty request; HashInfoReply (+ partitions)
  kGet = 1,       // HashKeyRequest + key; HashGetReply + value
  kPut = 2,       // HashPutRequest + key + value; HashPutReply
  kDelete = 3,    // HashKeyRequest + key; empty reply
  kMultiGet = 4,  // HashMultiRequest + items; HashMultiReply + items
  kMultiPut = 5,  // HashMultiRequest + items; HashMultiReply + items
  kMultiOp = 6,   // HashMultiRequest + HashMultiOp items (gets, puts and
                  // deletes, done in order); HashMultiReply + items
  kOp = 7,        // HashOpRequest + key + arg + expected; HashOpItem + data
  kOpBatch = 8,   // HashMultiRequest + items (HashOpRequest + key + arg +
                  // expected); HashMultiReply + items (HashOpItem + data)
  // Moving shards between the members of a cluster: the configuration
  // manager's steps (src/cluster/member.h). Each is refused with Conflict
  // unless the configuration moves the named shards away from this server
  // (export, sync, drop with kShardRelease) or to it (import, drop), or,
  // for drop with kShardForFill, has this server fill them as a backup
  // (drop with kShardForget deletes only shards this server does not
  // hold).
  kShardExport = 9,   // ShardExportRequest + u32 shards; ShardPairs
  kShardSync = 10,    // ShardListRequest + u32 shards; ShardPairs: the
                      // keys changed since they were exported (in a
                      // replicated cluster, where a drain hands shards to
                      // a backup, answered once the backups hold every
                      // write made before it)
  kShardImport = 11,  // ShardPairs; empty reply
  kShardDrop = 12,    // ShardListRequest + u32 shards; empty reply
  // Replication (src/cluster/replicator.h): a primary's records of one
  // pass of one partition, sent to the backups of their shards at the
  // primary's epoch. Refused with Conflict unless the backup has installed
  // that epoch; it keeps the records of the shards it backs up in it (the
  // others are for other backups), and kFill pairs only of shards it is
  // being filled with. Applied in memory (with their versions, as
  // kShardImport) and logged; answered once applied.
  kReplicate = 13,  // ShardPairs; empty reply
  // Re-replication (src/cluster/member.h): the manager asks a primary to
  // copy the listed shards, which it owns, to their backups being filled,
  // as kFill pairs in its replication stream. The first call at an epoch
  // starts the copy; every call answers its progress. Conflict unless this
  // server owns each shard and the shard has a backup being filled in the
  // configuration installed here, at the request's epoch.
  kShardFill = 14,  // ShardListRequest + u32 shards; ShardFillReply
  kCount
};

// The method byte of a call to kHashService.
constexpr uint8_t MethodId(HashMethod m) { return static_cast<uint8_t>(m); }

struct HashInfoReply {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint32_t num_partitions;  // <= proto::kMaxRegions
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
  uint32_t flags;  // kHashRead* (gets; zero otherwise)
};
static_assert(sizeof(HashKeyRequest) == 8);
static_assert(offsetof(HashKeyRequest, flags) == 4);

// Flags of a get (HashKeyRequest) or of a multi-get or a batch of gets
// (HashMultiRequest). kHashReadAnyReplica: a server that holds a whole
// copy of the key's shard as a backup may answer too, from that copy (a
// replicated cluster's reads from backups: a weaker mode, as
// docs/ARCHITECTURE.md, "Reads from backups", says); without it only the
// shard's primary answers. A batch with the flag holds gets only. A server
// that does not know the flag answers as the primary would (Moved from a
// backup).
inline constexpr uint32_t kHashReadAnyReplica = 1;

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
// A multi reply (HashMultiReply and its items) takes results up to this
// many bytes, 1 MiB (a scan page's size): a get whose value would take it
// past, other than the reply's first item, is answered Busy with
// kMultiReplyFull and no value instead, to be asked again (libremem does);
// those answers' messages still follow. An OpBatch reply likewise, for its
// reductions and filters (never a write's result). Small so that no batch
// holds a partition's owner thread for long: a batch of large values is
// answered as a stream of replies of about 1 MiB, each built in
// milliseconds (docs/BENCHMARKS.md, "Multi replies of 1 MiB").
inline constexpr uint64_t kMaxMultiReplyBytes = 1u << 20;
inline constexpr char kMultiReplyFull[] =
    "the multi reply is full: ask for this key again";

struct HashMultiRequest {
  uint32_t count;  // items that follow, 1 .. kMaxMultiItems
  uint32_t flags;  // kHashRead* (multi-gets and batches of gets only)
};
static_assert(sizeof(HashMultiRequest) == 8);
static_assert(offsetof(HashMultiRequest, flags) ==
              offsetof(HashKeyRequest, flags));

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

// Mixed-batch item: HashMultiOp + key + value (value_len is 0 for a get or
// a delete). Each item is done as its single-key method would do it, in
// request order for items of the same key.
enum class MultiOpKind : uint8_t { kGet = 1, kPut = 2, kDelete = 3 };
struct HashMultiOp {
  uint8_t op;  // MultiOpKind
  uint8_t reserved;
  uint16_t reserved2;
  uint32_t key_len;
  uint32_t value_len;
};
static_assert(sizeof(HashMultiOp) == 12);

struct HashMultiReply {
  uint32_t count;  // = the request's
  uint32_t reserved;
};
static_assert(sizeof(HashMultiReply) == 8);

// One per item, in request order, followed by `data_len` bytes: the value
// (get, status OK), the error message (status not OK), or nothing (put,
// delete). `version` is the value's (get) or the new one (put).
struct HashMultiItem {
  uint16_t status;  // StatusCode
  uint16_t reserved;
  uint32_t data_len;
  uint64_t version;
};
static_assert(sizeof(HashMultiItem) == 16);

// Server-side operations (remem/ops.h, src/ops/): one operation on one
// key's value. `op` is a remem::OpKind, `fn` its VecFn / Reduction /
// Predicate, `flags` of ops::kKnownFlags (kFlagCreate, kFlagIndices,
// kFlagTypedOperand, kFlagDoubleOperand). Key, argument
// and expected value follow, in that order, and fill the request (or, in a
// batch, the item) exactly.
struct HashOpRequest {
  uint8_t op;
  uint8_t flags;
  uint8_t fn;
  uint8_t reserved;
  uint32_t key_len;
  uint32_t arg_len;
  uint32_t expected_len;  // compare-and-swap only, else 0
  uint32_t function_id;   // kCall, and kVecReduce with Reduction::kUser
  uint32_t reserved2;
  int64_t initial;  // integer ops with kFlagCreate: an absent key's value
};
static_assert(sizeof(HashOpRequest) == 32);

// An operation's outcome, followed by `data_len` bytes: the op's result
// (status OK) or the error message. A single kOp reply is one HashOpItem
// with status 0 (an error is the RPC's status); a batch has one per item.
struct HashOpItem {
  uint16_t status;  // StatusCode
  uint8_t applied;  // compare-and-swap: 1 swapped, 0 not; else 1
  uint8_t reserved;
  uint32_t data_len;
  uint64_t version;  // of the value after the op
};
static_assert(sizeof(HashOpItem) == 16);

// --- moving shards (kShardExport .. kShardDrop)
inline constexpr uint32_t kMaxShardList = 65536;

// ShardListRequest::flags
inline constexpr uint8_t kShardFreeze = 1;   // sync: freeze first
inline constexpr uint8_t kShardRelease = 2;  // drop: release first
// drop: the shards are being filled here (before their copy starts).
inline constexpr uint8_t kShardForFill = 4;
// drop: copies this server no longer holds (retired); a shard it holds
// again by the time a partition deletes is kept there.
inline constexpr uint8_t kShardForget = 8;

// Followed by `count` little-endian uint32 shard numbers.
struct ShardListRequest {
  uint32_t count;  // 1 .. kMaxShardList
  uint8_t flags;
  uint8_t reserved[3];
};
static_assert(sizeof(ShardListRequest) == 8);

// One page of one partition's pairs of the listed shards (followed by
// `count` uint32 shard numbers, then `after_len` bytes of key), from bucket
// `cursor` of the table at growth `generation`; a table that grew since
// restarts at bucket 0. With a key, the page resumes inside bucket
// `cursor`: its pairs are taken in key order, from the first key above it
// (what a reply's kShardCursorInBucket asks for).
struct ShardExportRequest {
  uint32_t partition;
  uint32_t count;  // shards listed, 1 .. kMaxShardList
  uint64_t generation;
  uint64_t cursor;
  uint32_t max_bytes;  // of the reply, header included (one pair at least)
  uint32_t after_len;  // 0, or the key to resume after (1 .. 64 KiB)
};
static_assert(sizeof(ShardExportRequest) == 32);

inline constexpr uint64_t kShardCursorDone = ~uint64_t{0};
// An export reply's cursor with this bit: the page ended inside bucket
// (cursor without the bit), whose pairs did not all fit; ask again with
// that bucket and the page's last key as `after`. A bucket's pairs can
// exceed any page (several large values), so pages split buckets.
inline constexpr uint64_t kShardCursorInBucket = uint64_t{1} << 62;
// A ShardSync reply holds pairs up to about this many bytes (and at least
// one pair), so it stays within kMaxRpcPayload with the largest pair;
// cursor 0 says more changes are left.
inline constexpr uint64_t kShardSyncBytes = 32ull << 20;

// ShardPairsHeader, then `count` times (ShardPair, key, value).
struct ShardPairsHeader {
  uint64_t generation;  // export: the table's growth count
  uint64_t cursor;      // export: the next bucket, kShardCursorDone at end
  uint32_t count;
  uint32_t num_partitions;  // export: the server's partitions
  // The highest version the sender has issued in the partitions it read:
  // the importer's next versions are above it, so no version of a moved
  // key is ever issued twice (delete and re-insert included).
  uint64_t max_version;
};
static_assert(sizeof(ShardPairsHeader) == 32);

// kFill: a pair of a shard's copy to a backup being filled (kReplicate);
// only such a backup keeps it, as a kPut.
enum class ShardPairKind : uint8_t { kPut = 0, kDeleted = 1, kFill = 2 };
struct ShardPair {
  uint64_t version;  // kPut: the pair's version, kept by the new owner
  uint32_t key_len;
  uint32_t value_len;  // 0 for kDeleted
  uint8_t kind;        // ShardPairKind
  uint8_t reserved[7];
};
static_assert(sizeof(ShardPair) == 24);

// kShardFill's reply: the progress of the copy at the request's epoch.
struct ShardFillReply {
  uint32_t done;  // 1: every pair is on the filled backups
  uint32_t reserved;
  // Pairs of the shards the copy has found so far (one more until its
  // scan of the table is done), and of those, sent so far.
  uint64_t pairs_total;
  uint64_t pairs_copied;
};
static_assert(sizeof(ShardFillReply) == 24);

}  // namespace remem::hash

#endif  // REMEM_HASH_WIRE_H_
