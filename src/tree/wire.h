// Wire messages of the ordered store service (a B-link tree): the payloads
// of its methods (RpcHeader::service = kTreeService). The header, framing
// and handshake are in proto/wire.h; docs/PROTOCOL.md ("Ordered store")
// describes these in prose. Change both together.
//
// Thread contract: plain data, no state.

#ifndef REMEM_TREE_WIRE_H_
#define REMEM_TREE_WIRE_H_

#include <cstddef>
#include <cstdint>

#include "proto/wire.h"

namespace remem::tree {

inline constexpr proto::ServiceId kTreeService = 2;

enum class TreeMethod : uint8_t {
  kInfo = 0,      // empty request; TreeInfoReply
  kGet = 1,       // TreeKeyRequest + key; TreeGetReply + value
  kPut = 2,       // TreePutRequest + key + value; TreePutReply
  kDelete = 3,    // TreeKeyRequest + key; empty reply
  kScan = 4,      // TreeScanRequest + start + end; TreeScanReply + resume +
                  // items (TreeScanItem + key + value)
  kMultiGet = 5,  // TreeMultiRequest + items (TreeKeyRequest + key);
                  // TreeMultiReply + items (TreeMultiItem + value or error)
  kMultiPut = 6,  // TreeMultiRequest + items (TreeMultiPutItem + key +
                  // value); TreeMultiReply + items (TreeMultiItem: the new
                  // version, or the error message)
  // Moving an ordered range between cluster members (the configuration
  // manager's calls, cluster/member.h; not for clients):
  kRangeExport = 7,  // TreeRangeRequest + resume key; TreeRangePairs
  kRangeSync = 8,    // TreeRangeRequest (no resume); TreeRangePairs
  kRangeImport = 9,  // a TreeRangePairs (as exported); empty reply
  kRangeDrop = 10,   // TreeRangeRequest (no resume); empty reply
  // Replication (a range's primary to its backups, cluster/replicator.h;
  // not for clients): a TreeRangePairs of the primary's writes, applied by
  // each backup to the ranges it backs up; empty reply once held.
  kReplicate = 11,
  // Re-replication (the manager's calls): at the primary of a range whose
  // carrier shard has a backup being filled, starts (first call at an
  // epoch) or reports the copy of the range into the replication stream
  // (TreeRangeRequest, no resume; TreeRangeFillReply). The backup is first
  // emptied of the range with kRangeDrop and kRangeForFill.
  kRangeFill = 12,
  kCount
};

// The method byte of a call to kTreeService.
constexpr uint8_t MethodId(TreeMethod m) { return static_cast<uint8_t>(m); }

struct TreeInfoReply {
  uint32_t magic;           // proto::kWireMagic
  uint16_t version;         // proto::kWireVersion
  uint16_t layout_version;  // tree::kTreeLayoutVersion
  uint32_t region;          // the tree's region (TreeRoot at offset 0)
  uint32_t node_bytes;      // tree::kNodeBytes
  uint32_t max_key;
  uint32_t max_value;
  uint32_t max_scan;  // the largest scan limit served in one page
  uint32_t reserved;
};
static_assert(sizeof(TreeInfoReply) == 32);

struct TreeKeyRequest {
  uint32_t key_len;
  uint32_t reserved;
};
static_assert(sizeof(TreeKeyRequest) == 8);

enum class PutMode : uint8_t { kUpsert = 0, kIfAbsent = 1, kIfVersion = 2 };

struct TreePutRequest {
  uint32_t key_len;
  uint32_t value_len;
  uint8_t mode;  // PutMode
  uint8_t reserved[7];
  uint64_t expected_version;  // kIfVersion
};
static_assert(sizeof(TreePutRequest) == 24);

struct TreeGetReply {
  uint64_t version;
  uint32_t value_len;
  uint32_t reserved;
};
static_assert(sizeof(TreeGetReply) == 16);

struct TreePutReply {
  uint64_t version;
};
static_assert(sizeof(TreePutReply) == 8);

// kRangeFill's reply: done once every pair of the range was sent and is
// held by the backups being filled; copied: pairs sent so far.
struct TreeRangeFillReply {
  uint32_t done;
  uint32_t reserved;
  uint64_t copied;
};
static_assert(sizeof(TreeRangeFillReply) == 16);

enum TreeScanFlags : uint8_t { kScanDescending = 1 };

// Keys in [start, end) (end_len 0: unbounded), at most `limit`; a page
// ends early once its keys and values hold tree::kScanPageBytes (1 MiB),
// with at least one item.
struct TreeScanRequest {
  uint32_t start_len;
  uint32_t end_len;
  uint32_t limit;  // 1 .. TreeInfoReply::max_scan
  uint8_t flags;   // TreeScanFlags
  uint8_t reserved[3];
};
static_assert(sizeof(TreeScanRequest) == 16);

enum TreeScanReplyFlags : uint8_t { kScanMore = 1 };

struct TreeScanReply {
  uint32_t count;  // items that follow the resume key
  uint32_t resume_len;
  uint8_t flags;  // TreeScanReplyFlags
  uint8_t reserved[7];
};
static_assert(sizeof(TreeScanReply) == 16);

struct TreeScanItem {
  uint32_t key_len;    // up to max_key (32 bits since layout version 3)
  uint32_t value_len;  // up to max_value (32 bits since layout version 2)
  uint64_t version;
};
static_assert(sizeof(TreeScanItem) == 16);

// A batch of gets in one request: at most kMaxMultiGetKeys keys. The reply
// has one item per key, in order; once the values in it pass
// kMultiGetReplyBytes, the rest are answered Busy (no value, not read), to
// be asked again: the owner thread builds a reply serving no one else (a
// reply of 16 MiB held it for up to 146 ms: docs/BENCHMARKS.md, "The ordered
// store's multi-get replies of 1 MiB"), and a batch of 16 MiB values
// would not fit a message. The first key is always answered.
inline constexpr uint32_t kMaxMultiGetKeys = 4096;
inline constexpr size_t kMultiGetReplyBytes = size_t{1} << 20;

struct TreeMultiRequest {
  uint32_t count;  // items that follow, 1 .. kMaxMultiGetKeys
  uint32_t reserved;
};
static_assert(sizeof(TreeMultiRequest) == 8);

struct TreeMultiReply {
  uint32_t count;  // items that follow: the request's count
  uint32_t reserved;
};
static_assert(sizeof(TreeMultiReply) == 8);

struct TreeMultiItem {
  int32_t status;      // StatusCode: 0 OK (a value follows), else an error
  uint32_t value_len;  // bytes that follow: the value, or the error message
  uint64_t version;    // OK only
};
static_assert(sizeof(TreeMultiItem) == 16);

// A batch of puts (insert or replace) in one request: at most
// kMaxMultiGetKeys pairs and kMultiPutBytes of keys and values (a client
// splits larger batches). The server applies
// them in order and answers each with its own status: OK and the new
// version (value_len 0), or the pair's error (InvalidArgument,
// OutOfMemory...) and its message. One whose log cannot be written
// refuses the whole request before changing anything; the reply goes once
// every pair it applied is durable (or is the log's error, for all).
inline constexpr size_t kMultiPutBytes = size_t{32} << 20;

struct TreeMultiPutItem {
  uint32_t key_len;
  uint32_t value_len;
};
static_assert(sizeof(TreeMultiPutItem) == 8);

// Range moves. Export: a page of range `range`'s pairs from the resume
// key on (kRangeFirst: from the range's first key; the keys written from
// then on are noted for Sync). Sync: the keys of the range written since
// they were last sent (with kRangeFreeze, the range takes no write from
// then on, and the reply pages until kRangeMore is clear). Drop: at the
// new owner, deletes what an earlier copy left of the range; with
// kRangeRelease, at the old owner once the new one holds everything: it
// stops serving the range and deletes its copy.
// With kRangeForFill, at a member about to be filled with the range as a
// backup of its carrier shard (replicated clusters): deletes what it held
// of the range before.
enum TreeRangeFlags : uint8_t {
  kRangeFirst = 1,
  kRangeFreeze = 2,
  kRangeRelease = 4,
  kRangeForFill = 8,
};

struct TreeRangeRequest {
  uint32_t range;
  uint32_t resume_len;  // Export only
  uint8_t flags;        // TreeRangeFlags
  uint8_t reserved[7];
};
static_assert(sizeof(TreeRangeRequest) == 16);

enum TreeRangePairsFlags : uint8_t { kRangeMore = 1 };

// TreeRangePairs + resume key + `count` items (TreeRangeItem + key +
// value). max_version: the highest version the sender has issued (the
// receiver's later versions must exceed it, since a client may hold one
// for compare-and-put). sender: in a Replicate, the primary's incarnation
// (its stream: a backup keeps the last batch of each, TreeService::
// Resync_st); 0 otherwise.
struct TreeRangePairs {
  uint32_t count;
  uint32_t resume_len;
  uint64_t max_version;
  uint8_t flags;  // TreeRangePairsFlags
  uint8_t reserved[7];
  uint64_t sender;
};
static_assert(sizeof(TreeRangePairs) == 32);

// kRangeItemFill: in a replication batch, a pair of a range's copy to a
// backup being filled (kept only by such a backup; a ready one has it).
enum TreeRangeItemFlags : uint8_t { kRangeItemDeleted = 1, kRangeItemFill = 2 };

struct TreeRangeItem {
  uint32_t key_len;
  uint32_t value_len;  // 0 for a deletion
  uint64_t version;    // the pair's, or the deletion's
  uint8_t flags;       // TreeRangeItemFlags
  uint8_t reserved[7];
};
static_assert(sizeof(TreeRangeItem) == 24);

}  // namespace remem::tree

#endif  // REMEM_TREE_WIRE_H_
