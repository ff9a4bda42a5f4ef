// Wire messages of the object service (FaRM's transactional objects): the
// payloads of its methods (RpcHeader::service = kTxnService), and the
// layout of an object in the server's heap, which clients read one-sided.
// docs/PROTOCOL.md ("Transactional objects") describes both in prose;
// change them together.
//
// Heap: regions of this service (exported kReadOnly: only commits change
// objects), seen as one range of heap offsets (region i holds
// [i * kRegionBytes, ...)). The heap is cut into kPageBytes pages, each
// given to one size class on first need and kept by it; a page of class c
// is an array of slots of kClassBytes[c], each an ObjectHeader and the
// object's bytes. A slot keeps its place and class forever (type-stable);
// freeing it bumps its incarnation, which a stale ObjectId then fails to
// match.
//
// Thread contract: plain data, no state.

#ifndef REMEM_TXN_WIRE_H_
#define REMEM_TXN_WIRE_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "proto/wire.h"

namespace remem::txn {

inline constexpr proto::ServiceId kTxnService = 4;

enum class TxnMethod : uint8_t {
  kInfo = 0,     // TxnRequest; TxnInfoReply + TxnRegionWire items
  kAlloc = 1,    // TxnRequest (capacity); TxnObjectIdWire (reserved)
  kRelease = 2,  // TxnRequest (id): a slot kAlloc reserved; empty reply
  kCommit = 3,   // TxnCommitHeader + entries; TxnCommitReply + versions
  kRead = 4,     // TxnRequest (id); TxnReadReply + the object's bytes
  kCount
};

constexpr uint8_t MethodId(TxnMethod m) { return static_cast<uint8_t>(m); }

inline constexpr uint64_t kPageBytes = 1 << 20;
inline constexpr uint64_t kRegionBytes = 1ull << 30;  // a multiple of pages
inline constexpr size_t kNumClasses = 11;             // 64 B .. 64 KiB
inline constexpr uint32_t ClassBytes(size_t c) { return 64u << c; }

// At the start of every slot; 8-aligned. A reader trusts a copy of it only
// if header_check verifies, and the object's bytes only if checksum
// verifies too (a one-sided copy has no byte order: Cell's and FaRM's
// version-at-both-ends checks do not hold here).
struct ObjectHeader {
  uint64_t version;       // even: committed; odd: a commit is writing it;
                          // 0: no object (free, or reserved by an Alloc)
  uint32_t incarnation;   // of the slot; + 1 when an object in it is freed
  uint32_t size;          // bytes of the object (<= the slot's capacity)
  uint64_t checksum;      // xxh3-64 of the bytes, seeded with SeedOf(header)
  uint64_t header_check;  // xxh3-64 of the 24 bytes before it, seeded
                          // with the slot's capacity
};
static_assert(sizeof(ObjectHeader) == 32);

inline constexpr uint32_t CapacityOf(size_t c) {
  return ClassBytes(c) - uint32_t(sizeof(ObjectHeader));
}
inline constexpr uint32_t kMaxObjectBytes = CapacityOf(kNumClasses - 1);
// Whether `capacity` is some class's.
inline constexpr bool IsCapacity(uint64_t capacity) {
  const uint64_t slot = capacity + sizeof(ObjectHeader);
  return slot >= ClassBytes(0) && slot <= ClassBytes(kNumClasses - 1) &&
         (slot & (slot - 1)) == 0;
}

// Whether some slot could have this address and capacity (slots start on
// 64-byte boundaries; a capacity is a class's): what the client and the
// server both check before anything else, so that an id no slot could have
// gets the same answer on every path (InvalidArgument).
inline constexpr bool IsSlotShaped(uint64_t address, uint64_t capacity) {
  return address % 64 == 0 && IsCapacity(capacity);
}

// The seed of an object's checksum: its version, incarnation and size, so
// that bytes of one version never verify under another's header.
inline uint64_t SeedOf(const ObjectHeader& h) { return XXH3_64bits(&h, 16); }
// Seeded with the slot's capacity (CapacityOf its class), which the header
// does not hold: a copy read under an id of another capacity (of the slot's
// address, but not its class) fails it, so that a reader refuses that id as
// the server does, instead of trusting bytes past the slot's end.
inline uint64_t HeaderCheck(const ObjectHeader& h, uint32_t capacity) {
  return XXH3_64bits_withSeed(&h, 24, capacity);
}
inline uint64_t DataChecksum(const ObjectHeader& h, const void* data,
                             size_t n) {
  return XXH3_64bits_withSeed(data, n, SeedOf(h));
}

struct TxnObjectIdWire {
  uint64_t address;  // heap offset of the slot
  uint32_t incarnation;
  uint32_t capacity;
};
static_assert(sizeof(TxnObjectIdWire) == 16);

// Every request but kCommit: the fields a method does not use are 0.
struct TxnRequest {
  uint32_t magic;    // proto::kWireMagic
  uint16_t version;  // proto::kWireVersion
  uint16_t reserved;
  uint32_t capacity;  // kAlloc: bytes the object must hold
  uint32_t reserved2;
  TxnObjectIdWire id;  // kRelease, kRead
};
static_assert(sizeof(TxnRequest) == 32);

struct TxnInfoReply {
  uint32_t max_object;  // kMaxObjectBytes
  uint32_t regions;     // TxnRegionWire items follow, in heap order
  uint64_t heap_bytes;  // 0: the server has no object memory
};
static_assert(sizeof(TxnInfoReply) == 16);

struct TxnRegionWire {
  uint32_t region;  // a region of this service, exported kReadOnly
  uint32_t reserved;
  uint64_t heap_offset;  // the heap offset of its first byte
  uint64_t length;
};
static_assert(sizeof(TxnRegionWire) == 24);

enum class TxnOp : uint32_t {
  kCheck = 0,   // read only: the object must still be at `version`
  kWrite = 1,   // `size` bytes follow (padded to 8); `version`: as read, or
                // 0 for a blind write (the object must exist)
  kCreate = 2,  // a slot this connection reserved: `size` bytes follow
  kFree = 3,    // `version`: as read, or 0 (the object must exist)
};

struct TxnCommitHeader {
  uint32_t magic;    // proto::kWireMagic
  uint16_t version;  // proto::kWireVersion
  uint16_t reserved;
  uint32_t entries;  // TxnCommitEntry items follow
  uint32_t reserved2;
};
static_assert(sizeof(TxnCommitHeader) == 16);

struct TxnCommitEntry {
  TxnObjectIdWire id;
  uint64_t version;
  uint32_t op;    // TxnOp
  uint32_t size;  // kWrite, kCreate: bytes that follow
};
static_assert(sizeof(TxnCommitEntry) == 32);

// The committed version of each kWrite and kCreate entry, in order.
struct TxnCommitReply {
  uint32_t count;
  uint32_t reserved;
};
static_assert(sizeof(TxnCommitReply) == 8);

struct TxnReadReply {
  uint64_t version;
  uint32_t size;  // the object's bytes follow
  uint32_t reserved;
};
static_assert(sizeof(TxnReadReply) == 16);

// Most entries in one commit.
inline constexpr uint32_t kMaxCommitEntries = 4096;

// --- on disk (txn/durable.h): not on the wire
//
// With --data-dir the service logs the state of every slot a commit (or a
// release) changes, and snapshots every slot that holds an object or has
// been used: a durability record (durability/log.h) whose key is the
// slot's heap offset (8 bytes, big-endian) and whose value is this header
// followed by the object's bytes. A commit's records are one atomic group.
inline constexpr uint32_t kSlotRecordMagic = 0x534A4254;  // "TBJS" in memory

struct TxnSlotRecord {
  uint32_t magic;     // kSlotRecordMagic
  uint32_t capacity;  // the slot's class (CapacityOf)
  uint64_t version;   // the object's (even); 0: no object (a free slot)
  uint32_t incarnation;
  uint32_t size;  // bytes of the object that follow (0 for a free slot)
};
static_assert(sizeof(TxnSlotRecord) == 24);

}  // namespace remem::txn

#endif  // REMEM_TXN_WIRE_H_
