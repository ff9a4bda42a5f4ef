// Fixed-layout parts of the cluster configuration's encoding (config.h;
// docs/PROTOCOL.md section 9). All integers little-endian.
//
// Thread contract: plain data, no state.

#ifndef REMEM_CLUSTER_WIRE_H_
#define REMEM_CLUSTER_WIRE_H_

#include <cstdint>

namespace remem::cluster {

inline constexpr uint32_t kConfigMagic = 0x47464352;  // "RCFG" in memory order
// Version 2 added the `next` table, version 3 replicas and incarnations,
// version 4 filling backups (kBackupFilling), version 5 failure domains,
// version 6 retiring copies, version 7 ordered shards, version 8 ordered
// ranges moving; versions 1 (no shard ever moving) to 7 are still read.
inline constexpr uint16_t kConfigVersion = 8;
// Set in a backup index (version 4): that backup is being filled. Member
// indexes stay below kMaxMembers (4096), so the bit is free.
inline constexpr uint16_t kBackupFilling = 0x8000;

// The configuration: ConfigHeader, `name_len` bytes of name, then
// `num_members` times (MemberEntry, `address_len` bytes of address), then
// `num_shards` little-endian uint16 owner indexes, then (version 2)
// `num_shards` little-endian uint16 indexes of the member each shard is
// moving to (0xFFFF: not moving), then (version 3) `num_shards` times
// `replicas` uint16 backup indexes (0xFFFF: none; version 4: with
// kBackupFilling set for a backup being filled) and `num_members` uint64
// incarnations, then (version 5) per member a uint8 length and that many
// bytes of its failure domain (0: none), then (version 6) `num_shards`
// uint16 indexes of each shard's retiring copy (0xFFFF: none), then
// (version 7) the ordered shards: a uint32 count of key ranges (0: the
// cluster has no ordered store), that many uint16 owner indexes, and per
// split key (one fewer than the ranges, ascending) a uint16 length and its
// bytes, then (version 8) per range the uint16 index of the member it is
// moving to (0xFFFF: not moving).
struct ConfigHeader {
  uint32_t magic;    // kConfigMagic
  uint16_t version;  // kConfigVersion
  uint16_t name_len;
  uint32_t epoch;  // > 0
  uint32_t num_shards;
  uint32_t num_members;
  uint32_t replicas;     // version 3: backups per shard (f); else zero
  uint32_t reserved[2];  // zero
};
static_assert(sizeof(ConfigHeader) == 32);

struct MemberEntry {
  uint64_t capacity;
  uint32_t address_len;
  uint32_t reserved;  // zero
};
static_assert(sizeof(MemberEntry) == 16);

// A member's lease (core method kClusterLease; cluster/member_lease.h):
// LeaseRequest + `address_len` bytes of the member's address; the reply is
// LeaseReply + `config_len` bytes of the manager's configuration
// (EncodeConfig), sent when the member's epoch is older.
inline constexpr uint32_t kLeaseRequestMagic = 0x51534c52;  // "RLSQ"
inline constexpr uint32_t kLeaseReplyMagic = 0x50534c52;    // "RLSP"

struct LeaseRequest {
  uint32_t magic;  // kLeaseRequestMagic
  uint32_t epoch;  // the configuration the member has installed (0: none)
  uint64_t incarnation;
  uint32_t address_len;  // 1..kMaxAddressBytes
  uint32_t reserved;     // zero
};
static_assert(sizeof(LeaseRequest) == 24);

struct LeaseReply {
  uint32_t magic;       // kLeaseReplyMagic
  uint32_t epoch;       // the manager's configuration
  uint32_t lease_ms;    // the lease granted, from when the member asked
  uint32_t config_len;  // 0, or the configuration's bytes that follow
};
static_assert(sizeof(LeaseReply) == 16);

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_WIRE_H_
