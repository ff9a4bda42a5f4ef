// The cluster configuration: which server holds which shard, at which
// epoch. The configuration manager writes it to ZooKeeper (member.h);
// servers install it and hand it to clients (core method kClusterConfig);
// the cluster client routes by it (include/remem/cluster.h). One encoding
// serves all three; docs/PROTOCOL.md section 9 describes it.
//
// The ordered store (tree/, issue #14) is sharded apart: by key range, so
// that a scan walks its ranges in order. A cluster formed with split keys
// (remem-server --tree-splits) has one ordered shard per range, each owned
// by one member. The split keys are fixed when the cluster forms; a range
// moves whole from member to member as shards do (range_next: a member
// that joins takes ranges, a drained one gives its ranges away). In a
// replicated cluster a range rides a hash shard (CarrierOf): it has that
// shard's owner and backups (FollowCarriers).
//
// Keys map to a fixed number of shards by hash (ShardOf); each shard is
// owned by one member (its primary) and, in a replicated cluster
// (`replicas` f > 0, issue #13), copied on up to f other members (its
// backups). The epoch only grows: a newer configuration has a larger one,
// and every request carries the epoch its sender used.
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
inline constexpr uint32_t kMaxReplicas = 4;
inline constexpr uint32_t kMaxDomainBytes = 64;
// Ordered shards (the ordered store's key ranges, --tree-splits).
inline constexpr uint32_t kMaxRanges = 4096;
inline constexpr uint32_t kMaxSplitBytes = 1024;
// All split keys together (the configuration must fit in a ZooKeeper node,
// 1 MiB, beside the shard tables).
inline constexpr uint32_t kMaxSplitsTotalBytes = 64 << 10;

// A failure domain's name (remem-server --failure-domain): 1 to
// kMaxDomainBytes of [A-Za-z0-9_.-] (or empty: none declared).
bool ValidDomain(std::string_view domain);

// The shard of `key` among `num_shards` (xxh3-64 with a fixed seed, so
// every client and server agrees; independent of the hash store's own
// partition and bucket hashes).
uint32_t ShardOf(std::string_view key, uint32_t num_shards);

struct Member {
  std::string address;    // host:port clients connect to
  uint64_t capacity = 0;  // bytes of memory the server exports
  // The server process's incarnation (random at each start; 0: unknown).
  // In a replicated cluster a server that restarted is a new member: it
  // never resumes the roles its previous incarnation held.
  uint64_t incarnation = 0;
  // The failure domain the server declared ("": none): a shard's copies
  // go to members of other domains where there are enough of them.
  std::string domain = {};
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
  // new owner (member.h describes a move). Empty = no shard moving. In a
  // replicated configuration it is one of the shard's ready backups (a
  // drain hands the shard over to it, no copy needed).
  std::vector<uint16_t> next;
  // Backups per shard (f; 0: no replication, every shard on one server).
  uint32_t replicas = 0;
  // backups[s * replicas + i]: index into members of shard s's i-th
  // backup, or kNoMember (the shard is short of copies). Ready ones first,
  // then filling ones, then kNoMember. Empty when replicas is 0.
  std::vector<uint16_t> backups;
  // filling[s * replicas + i] != 0: that backup is being filled (issue #13
  // re-replication: it takes the primary's writes and a copy of the shard,
  // and holds a whole copy only once a configuration clears the flag). A
  // filling backup is never promoted. Same size as backups, or empty: none
  // filling.
  std::vector<uint8_t> filling;
  bool FillingAt(size_t i) const {
    return i < filling.size() && filling[i] != 0;
  }
  // retiring[s]: index into members of a ready copy of shard s on its way
  // out (its member is drained, or the copy moves to balance the members),
  // or kNoMember. It stays a backup (it takes the primary's writes, and
  // failover may promote it) until the backup filled in its place, in one
  // of the shard's slots, is ready (CompleteFills drops it): so moving a
  // copy never leaves a shard with fewer than f + 1 whole copies.
  // Empty: none (configuration version 6).
  std::vector<uint16_t> retiring;
  uint16_t RetiringOf(uint32_t s) const {
    return retiring.empty() ? kNoMember : retiring[s];
  }
  // Ordered shards (version 7): range r holds the keys in [splits[r - 1],
  // splits[r]) (the first from the smallest key, the last unbounded), and
  // range_owner[r] is the index into members of its owner. `splits` is
  // strictly ascending, of non-empty keys of at most kMaxSplitBytes;
  // range_owner has one more entry. Both empty: the cluster has no
  // ordered store.
  std::vector<std::string> splits;
  std::vector<uint16_t> range_owner;
  // range_next[r] (version 8): index into members of the member range r is
  // moving to, or kNoMember; as `next` for shards (the owner serves the
  // range until a configuration names the new owner). Empty: none moving.
  std::vector<uint16_t> range_next;
  uint16_t RangeNextOf(uint32_t r) const {
    return range_next.empty() ? kNoMember : range_next[r];
  }
  // Ranges moving now.
  uint32_t moving_ranges() const;
  bool ordered() const { return !range_owner.empty(); }
  uint32_t num_ranges() const { return uint32_t(range_owner.size()); }
  // The range holding `key` (needs ordered()).
  uint32_t RangeOf(std::string_view key) const;
  // Range r's keys: from RangeLow(r) (empty: the smallest key) to below
  // RangeHigh(r) (empty: unbounded); views of `splits`.
  std::string_view RangeLow(uint32_t r) const {
    return r == 0 ? std::string_view() : std::string_view(splits[r - 1]);
  }
  std::string_view RangeHigh(uint32_t r) const {
    return r < splits.size() ? std::string_view(splits[r]) : std::string_view();
  }
  // Ranges owned by members[index].
  uint32_t RangesOf(int index) const;
  // In a replicated cluster (replicas > 0) range r rides shard
  // CarrierOf(r): its owner, where it moves and its backups (ready,
  // filling, retiring) are the shard's, so failover, re-replication,
  // drains and balancing place ranges with no logic of their own (the
  // data of each travels in its own service's stream). range_owner and
  // range_next are kept equal to the carriers' (FollowCarriers), so that
  // whoever reads them (the ownership, clients) needs no second rule. The
  // carriers are the shards in the middle of num_ranges equal slices of
  // the shards: the first configuration gives each member a contiguous
  // block of shards, so ranges start spread over the members.
  uint32_t CarrierOf(uint32_t r) const {
    return uint32_t((uint64_t{2} * r + 1) * num_shards() /
                    (uint64_t{2} * num_ranges())) %
           num_shards();
  }
  // Sets range_owner and range_next from the carriers (replicated and
  // ordered only; else nothing). Every configuration the manager writes
  // goes through it, and DecodeConfig refuses one that does not agree.
  void FollowCarriers();
  // Whether range_owner and range_next agree with the carriers (always,
  // unless replicated and ordered).
  bool FollowsCarriers() const;
  // Whether members[index] owns, takes, or holds a copy of (ready, filling
  // or retiring) any shard or range.
  bool HoldsAnyRole(int index) const;

  uint32_t num_shards() const { return uint32_t(owner.size()); }
  // Whether members[index] holds a copy of shard s as a backup (in a slot,
  // or retiring).
  bool IsBackup(uint32_t s, int index) const;
  // The backups of shard s (kNoMember entries omitted), filling ones too,
  // then the retiring one.
  std::vector<uint16_t> BackupsOf(uint32_t s) const;
  // Whether members[index] is a backup of shard s being filled.
  bool IsFilling(uint32_t s, int index) const;
  // Shards with a backup being filled.
  uint32_t filling_shards() const;
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
// contiguous ranges as even as possible. With `replicas` f, the backups of
// a shard owned by the i-th member are the members i+1 .. i+f (mod n;
// chained, as in chain replication's placement): every member backs up
// the shards of the f members before it. With failure domains, the next
// members in that order whose domain is not the owner's nor another
// backup's come first, then the next ones in any domain. Needs f < n.
// With `splits` (nullopt: no ordered store; an empty list: one range),
// range r is owned by member r mod n, members in that address order
// (replicated: by its carrier shard's owner, FollowCarriers).
Config InitialConfig(
    std::string name, uint32_t epoch, std::vector<Member> members,
    uint32_t num_shards, uint32_t replicas = 0,
    const std::optional<std::vector<std::string>>& splits = std::nullopt);

// Parses --tree-splits: split keys separated by commas, as given (no
// escapes: a split key cannot hold a comma), put in order; "" is one
// range. InvalidArgument for an empty key between commas, a key longer
// than kMaxSplitBytes, a key given twice, more than kMaxRanges - 1 keys,
// or more than kMaxSplitsTotalBytes of them.
Result<std::vector<std::string>> ParseSplits(std::string_view list);

// The next step towards a balanced cluster from `current` (with no shard
// moving), or nullopt if it is balanced: a configuration one epoch newer
// whose `next` moves at most `max_moves` shards (or, with nothing to move,
// only changes the member list). Shards go to the members
// of `live` that are not in `drained`, as evenly as possible (members
// sorted by address; the first ones take one more when shards do not
// divide evenly); shards leave drained members and members above their
// share. A member that is not live keeps its shards (without replicas its
// data is nowhere else). Members new in `live` are appended (indexes of the
// current members stay; each live one takes the incarnation `live` names,
// by which the manager tells a move's server from one restarted at its
// address); members that own nothing (no shard, no ordered
// range) and are not live, or are drained, are dropped. Ordered ranges
// move only in a step that moves no shard: one range per step, from a
// live drained member (or, once nothing is drained, from the member owning
// the most ranges when it owns two or more than another eligible member)
// to the eligible member owning the fewest (ties to the first by
// address). `refused` lists range moves not to try again: to a member
// (by address and the incarnation `live` names) that could not hold that
// range (the range goes to the next member by that order, or stays; the
// same member restarted is tried again).
struct RefusedMove {
  uint32_t range = 0;
  std::string address;
  uint64_t incarnation = 0;
};
std::optional<Config> NextBalanceStep(
    const Config& current, const std::vector<Member>& live,
    const std::vector<std::string>& drained, uint32_t max_moves,
    const std::vector<RefusedMove>& refused = {});
// Failover in a replicated cluster (replicas > 0): the configuration one
// epoch newer that takes the cluster past the members that left. A member
// has left when `live` does not name it, or names it with another
// incarnation (it restarted: a new member). Each shard whose owner left is
// owned by its first ready backup still here; members that left are
// dropped from every shard's backups (the shard runs short of copies until
// PlanBackups gives it new ones); a restarted member keeps its index
// with its new incarnation and no role; members new in `live` are
// appended with no role. A shard whose owner left with every ready backup
// stays as it is, owner and backups (its data is nowhere else; a member
// only slow to answer that comes back is promoted then); if its owner
// restarted (every copy went down: it recovered the shard from its data
// directory), the owner keeps it under its new incarnation and its
// restarted backups are marked filling (filled again from it). Only a ready
// backup is promoted (a retiring one when no other is left), and a
// retiring copy whose member left is dropped;
// a filling backup stays filling (the manager fills it again from the
// shard's owner at the new epoch). A hand-over under way (DrainStep) is
// abandoned. nullopt if nothing changes.
std::optional<Config> Failover(const Config& current,
                               const std::vector<Member>& live);
// Re-replication in a replicated cluster: the configuration one epoch
// newer that gives every shard short of copies (fewer than `replicas`
// backups, ready or filling) new backups, marked filling, from the
// members of `live` (those with the incarnation `current` names): never
// its owner or one of its backups, first one whose failure domain none of
// them has, each time the member holding the fewest shards (owned, backed
// up or filling), ties to the lower index. A
// shard whose owner is not live gets none (its data may be nowhere).
// At most `max_shards` shards get a backup per step; members named in
// `excluded` (being drained) get none. nullopt if no shard can get one.
std::optional<Config> PlanBackups(
    const Config& current, const std::vector<Member>& live, uint32_t max_shards,
    const std::vector<std::string>& excluded = {});
// The configuration one epoch newer in which the backups of `shards` that
// were filling in `filling` are ready (they hold a whole copy), and their
// retiring copies dropped.
Config CompleteFills(const Config& filling,
                     const std::vector<uint32_t>& shards);
// Balancing a replicated cluster (a member joined or returned), once
// nothing is failing over, drained, short of copies, moving, filling or
// retiring: the next step, or nullopt if balanced. First the copies: while
// a member of `live` not in `drained` holds two or more shards (owned or
// backed up) more than another, one of its backup copies moves to the
// other (retiring here, filling there; never onto a member of a failure
// domain the shard already has unless the moved copy shared one), at
// most `max_moves` copies a step. Then the primaries: while an owner owns
// two or more shards more than one of its ready backups, that shard
// moves to it (`next`, a hand-over as in a drain), at most `max_moves` a
// step.
std::optional<Config> BalanceReplicas(const Config& current,
                                      const std::vector<Member>& live,
                                      const std::vector<std::string>& drained,
                                      uint32_t max_moves);
// Draining in a replicated cluster (remem cluster drain): the next step
// that takes the members named in `drained` out of every shard's roles,
// or nullopt when there is none to take now (a hand-over or a copy is
// under way, or nothing can move). First, every shard owned by a drained
// member moves (`next`) to one of its ready backups that is live and not
// drained: a hand-over with no copy (CompleteMoves swaps the two roles).
// When no such shard is left, each drained member's ready backup copy
// retires (one per shard and step) in favour of a backup on a member of
// `live` that is not drained, filling, chosen as PlanBackups chooses (a
// drained filling backup is simply dropped); a shard that cannot get one
// keeps its drained backup. A shard owned by a drained member whose
// backups are all drained or filling gets its new backups first, then
// moves.
std::optional<Config> DrainStep(const Config& current,
                                const std::vector<Member>& live,
                                const std::vector<std::string>& drained);

// The next configuration of a replicated cluster without the members of
// `leaving` (drained ones that stopped) that hold no role: no shard or
// range they own or take, no copy (ready, filling or retiring). The other
// members' indices are renumbered in every role. A member dropped that
// comes back joins as a new one. nullopt if there is none to drop. (Only
// drained members: a member failed over stays listed, with no role, as its
// own last configuration still names its old roles; the one naming it
// with none is what it installs when it comes back.)
std::optional<Config> DropLeftMembers(const Config& current,
                                      const std::vector<std::string>& leaving);
// The configuration that completes `moving` (one epoch newer): every
// moving shard owned by its `next`, every moving range by its
// range_next, and nothing moving. In a replicated
// configuration `next` is one of the shard's ready backups, and the old
// owner takes its place among the backups.
Config CompleteMoves(const Config& moving);
// The configuration that abandons the moves of `moving` (one epoch
// newer): every shard and range stays with its owner.
Config AbandonMoves(const Config& moving);

std::string EncodeConfig(const Config& config);
// Validates everything: magic, version, bounds, every owner index.
Result<Config> DecodeConfig(std::string_view bytes);

// A member's registration in ZooKeeper: "remem-member
// 3\n<address>\n<capacity>\n<incarnation>\n<domain>\n" (version 2 has no
// domain, version 1 no incarnation either: read as none and 0).
std::string EncodeMemberRecord(const Member& member);
Result<Member> DecodeMemberRecord(std::string_view bytes);

// A member's lease request and the manager's grant (cluster/wire.h;
// cluster/member_lease.h).
struct LeaseAsk {
  uint32_t epoch = 0;
  uint64_t incarnation = 0;
  std::string address;
};
struct LeaseGrant {
  uint32_t epoch = 0;
  uint32_t lease_ms = 0;
  std::string config;  // EncodeConfig, or empty
};
std::string EncodeLeaseAsk(const LeaseAsk& ask);
Result<LeaseAsk> DecodeLeaseAsk(std::string_view bytes);
std::string EncodeLeaseGrant(const LeaseGrant& grant);
Result<LeaseGrant> DecodeLeaseGrant(std::string_view bytes);

// Parses `--cluster ZK_HOSTS/PATH` ("127.0.0.1:2181/remem/prod"): the
// ZooKeeper hosts, the cluster's path (absolute, at least one component
// of [A-Za-z0-9_.-], none empty: no trailing slash) and its name (the
// last component). InvalidArgument otherwise.
struct ZkTarget {
  std::string hosts;
  std::string path;
  std::string name;
};
Result<ZkTarget> ParseZkTarget(std::string_view spec);

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_CONFIG_H_
