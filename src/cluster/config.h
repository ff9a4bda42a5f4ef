// The cluster configuration: which server holds which shard, at which
// epoch. The configuration manager writes it to ZooKeeper (member.h);
// servers install it and hand it to clients (core method kClusterConfig);
// the cluster client routes by it (include/remem/cluster.h). One encoding
// serves all three; docs/PROTOCOL.md section 9 describes it.
//
// Keys map to a fixed number of shards by hash (ShardOf); each shard is
// owned by one member. The epoch only grows: a newer configuration has a
// larger one, and every request carries the epoch its sender used.
//
// Thread contract: plain values and pure functions.

#ifndef REMEM_CLUSTER_CONFIG_H_
#define REMEM_CLUSTER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::cluster {

inline constexpr uint32_t kDefaultShards = 1024;
inline constexpr uint32_t kMaxShards = 65536;
inline constexpr uint32_t kMaxMembers = 4096;
inline constexpr uint32_t kMaxNameBytes = 255;
inline constexpr uint32_t kMaxAddressBytes = 1024;

// The shard of `key` among `num_shards` (xxh3-64 with a fixed seed, so
// every client and server agrees; independent of the hash store's own
// partition and bucket hashes).
uint32_t ShardOf(std::string_view key, uint32_t num_shards);

struct Member {
  std::string address;    // host:port clients connect to
  uint64_t capacity = 0;  // bytes of memory the server exports
};

// next[s] of a shard that is not moving.
inline constexpr uint16_t kNoMember = 0xFFFF;

struct Config {
  std::string name;    // the cluster's name (last component of its path)
  uint32_t epoch = 0;  // > 0 in an installed configuration
  std::vector<Member> members;
  // owner[s]: index into members of shard s's owner.
  std::vector<uint16_t> owner;
  // next[s]: index into members of the server shard s is moving to, or
  // kNoMember. The owner keeps serving it until a configuration names the
  // new owner (member.h describes a move). Empty = no shard moving.
  std::vector<uint16_t> next;

  uint32_t num_shards() const { return uint32_t(owner.size()); }
  // Index of the member at `address`, or -1.
  int IndexOf(std::string_view address) const;
  // The member that owns `key`'s shard.
  const Member& OwnerOf(std::string_view key) const {
    return members[owner[ShardOf(key, num_shards())]];
  }
  // Shards owned by members[index].
  uint32_t ShardsOf(int index) const;
  // Where shard s is moving, or kNoMember.
  uint16_t NextOf(uint32_t s) const {
    return next.empty() ? kNoMember : next[s];
  }
  // Shards moving now.
  uint32_t moving() const;
};

// A first configuration: `members` sorted by address, shards split into
// contiguous ranges as even as possible.
Config InitialConfig(std::string name, uint32_t epoch,
                     std::vector<Member> members, uint32_t num_shards);

// The next step towards a balanced cluster from `current` (with no shard
// moving), or nullopt if it is balanced: a configuration one epoch newer
// whose `next` moves at most `max_moves` shards (or, with nothing to move,
// only changes the member list). Shards go to the members
// of `live` that are not in `drained`, as evenly as possible (members
// sorted by address; the first ones take one more when shards do not
// divide evenly); shards leave drained members and members above their
// share. A member that is not live keeps its shards (without replicas its
// data is nowhere else). Members new in `live` are appended (indexes of the
// current members stay); members that own nothing and are not live, or are
// drained, are dropped.
std::optional<Config> NextBalanceStep(const Config& current,
                                      const std::vector<Member>& live,
                                      const std::vector<std::string>& drained,
                                      uint32_t max_moves);
// The configuration that completes `moving` (one epoch newer): every
// moving shard owned by its `next`, and nothing moving.
Config CompleteMoves(const Config& moving);
// The configuration that abandons the moves of `moving` (one epoch
// newer): every shard stays with its owner.
Config AbandonMoves(const Config& moving);

std::string EncodeConfig(const Config& config);
// Validates everything: magic, version, bounds, every owner index.
Result<Config> DecodeConfig(std::string_view bytes);

// A member's registration in ZooKeeper: "remem-member
// 1\n<address>\n<capacity>\n".
std::string EncodeMemberRecord(const Member& member);
Result<Member> DecodeMemberRecord(std::string_view bytes);

// Parses `--cluster ZK_HOSTS/PATH` ("127.0.0.1:2181/remem/prod"): the
// ZooKeeper hosts, the cluster's path (absolute, at least one component
// of [A-Za-z0-9_.-]) and its name (the last component).
struct ZkTarget {
  std::string hosts;
  std::string path;
  std::string name;
};
Result<ZkTarget> ParseZkTarget(std::string_view spec);

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_CONFIG_H_
