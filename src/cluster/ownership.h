// cluster::Ownership: what a cluster member's data path consults before it
// runs a request: the configuration installed last, and which shards it
// makes this server own. The ZooKeeper side (member.h) installs
// configurations; services ask Owns(key) and the dispatcher asks
// Admits(epoch).
//
// Before the first configuration is installed the server owns nothing and
// refuses data requests with Busy (try again). A configuration that does not
// name this server leaves it owning nothing (a server that joined after
// the cluster formed waits for shards to be moved to it).
//
// Moving a shard away (member.h has the whole protocol): while the
// configuration says shard s moves from this server to another, this
// server keeps serving it and its hash store notes the keys written
// meanwhile (Outgoing). The manager then freezes it here (writes answer
// Busy, reads go on) and, once the new owner holds everything, releases it
// (reads answer Busy too, and the store deletes its copy) just before it
// installs the configuration that names the new owner. Those two states
// are this server's own, kept per shard beside the configuration, and end
// when a configuration no longer moves the shard away from here. A shard
// the first configuration a process installs names as moving away starts
// frozen (the server restarted during that move, which may be past its
// freeze), or released if the move may be past its handoff (then past its
// release here too, part of the copy deleted).
//
// A member that starts with data (--data-dir) may hold pairs of shards
// that moved away while it was down (a move whose manager committed it
// without this server's release: it had died right after the handoff).
// So the first configuration is not served at once: it waits, as
// pending(), until each part of the data path that keeps pairs (the hash
// store's partitions and the ordered store, RequirePurge) has deleted what
// that configuration does not give this server (PurgeDone); until then the
// server answers Busy, as before any configuration, and no reader can find
// those pairs.
//
// In a replicated configuration a member serves only while it holds a
// lease from the configuration manager (cluster/member_lease.h): until
// lease_expires_ns() on CLOCK_MONOTONIC. Past it, Owns and Writable answer
// Busy (the manager may be failing this member over), and the
// server lease stops vouching for one-sided reads (LeaseKeeper's cap).
//
// Ordered ranges move the same way (config.h, range_next): while a range
// moves away, the ordered store notes the keys written in it
// (RangeOutgoing); FreezeRanges stops its writes and ReleaseRanges its
// reads, each per range, until a configuration no longer moves it away.
//
// One-sided readers in a cluster learn from a serving word what this
// server vouches for (hash/layout.h, "Serving mark"): the epoch it has
// installed and the epoch since which it has led the same shards, or 0
// (nothing: no configuration served yet, none naming this incarnation in
// a replicated cluster, or a shard frozen or released on its way to
// another member). SetServingListener gets the
// word each time it changes, before the change takes effect for anyone:
// inside Install (so before a member lease granted with that configuration
// is extended), Freeze and Release. The ordered store's readers have a
// word of their own (SetRangeServingListener): the installed epoch and
// the epoch since which this server has owned the same ranges, or 0 (no
// configuration served, a range frozen or released on its way out, or a
// promotion's resync under way, below).
//
// Thread contract: Install, Freeze, Release, FreezeRanges, ReleaseRanges
// and PurgeDone from any thread
// (they serialize on a mutex); RequirePurge before the first Install;
// everything else from any thread, lock-free on the data path. Installed
// configurations are kept until the Ownership is destroyed, so a pointer
// returned by current() stays valid (configurations change rarely).

#ifndef REMEM_CLUSTER_OWNERSHIP_H_
#define REMEM_CLUSTER_OWNERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/config.h"
#include "remem/status.h"

namespace remem::cluster {

// CLOCK_MONOTONIC in nanoseconds: the member lease's clock (as the server
// lease's, server/lease.h).
uint64_t LeaseClockNs();

class Ownership {
 public:
  // `self`: this server's address as it registers it (--advertise);
  // `incarnation`: this process's (a replicated configuration names the
  // incarnation each role belongs to: a restarted server holds none of its
  // predecessor's).
  explicit Ownership(std::string self, uint64_t incarnation = 0)
      : self_(std::move(self)), incarnation_(incarnation) {}
  Ownership(const Ownership&) = delete;
  Ownership& operator=(const Ownership&) = delete;

  struct Installed {
    Config config;
    std::string encoded;  // EncodeConfig(config), served to clients
    int self = -1;        // index of this server in config.members
    // Replicated: the index of this server's address when the
    // configuration names another incarnation of it (its previous one: it
    // restarted), else -1. The roles of that index are not this server's,
    // but the copies it recovered from its data directory may be the last
    // ones (every server restarted): kept until a configuration naming
    // this incarnation says (HeldByPrior).
    int prior = -1;
    std::vector<uint8_t> owns;  // per shard
    // Per shard: this server is one of its backups (replicated clusters),
    // and (fills) one being filled.
    std::vector<uint8_t> backs;
    std::vector<uint8_t> fills;
    bool replicated = false;  // config.replicas > 0
    // Per shard: owned here and moving to another member.
    std::vector<uint8_t> outgoing;
    bool any_outgoing = false;
    uint32_t owned = 0;
    // Per ordered range: owned here and moving to another member.
    std::vector<uint8_t> range_outgoing;
    bool any_range_outgoing = false;
  };

  // Installs `config` if its epoch is newer than the current one; returns
  // whether it did. `past_handoff`: for the first configuration of this
  // process, whether its moves may be past their handoff (the ZooKeeper
  // record says this epoch, or could not be read): the shards and ranges
  // it moves away from here then start released, else frozen (above).
  bool Install(Config config, bool past_handoff = true);
  // Null before the first configuration is served.
  const Installed* current() const {
    return current_.load(std::memory_order_acquire);
  }
  // The configuration installed last: current(), or the first one while
  // it waits for the purges. Null before any.
  const Installed* latest() const {
    const Installed* p = pending_.load(std::memory_order_acquire);
    return p != nullptr ? p : current();
  }
  // The first configuration while it waits for the purges, else null.
  const Installed* pending() const {
    return pending_.load(std::memory_order_acquire);
  }
  // `parts` parts of the data path will each call PurgeDone once, after
  // deleting the pairs of shards (or ranges) that pending() does not give
  // this server.
  void RequirePurge(uint32_t parts) const;
  void PurgeDone() const;
  // Promotions (replicated clusters): a member made primary of shards it
  // backed up may hold the dead primary's last records, which the other
  // backups may lack; it must not vouch for them to one-sided readers
  // before it has sent them on (hash/service.h and tree/service.h,
  // Resync_st). `parts` parts of the data path each call ResyncDone(epoch)
  // once they have done so for the configuration `epoch` they found
  // installed. From an install that gives this member a shard it did not
  // own (after the first) until every part has reported for the epoch
  // installed last, the serving word and the range serving word are 0
  // (one-sided readers ask the server, whose reads wait for those
  // records). Called before the first Install.
  void RequireResync(uint32_t parts) const;
  void ResyncDone(uint32_t epoch) const;
  // 0 before the first configuration.
  uint32_t epoch() const {
    const Installed* c = current();
    return c == nullptr ? 0 : c->config.epoch;
  }
  // OK if this server owns `key`'s shard now; else Moved naming the owner
  // (or Busy before the first configuration, or while the shard is
  // released here on its way to another server: try again).
  Status Owns(std::string_view key) const { return Check(key, false); }
  // Owns, and not frozen (Busy: the shard is being handed over).
  Status Writable(std::string_view key) const { return Check(key, true); }
  // A read from any replica (hash/wire.h, kHashReadAnyReplica): Owns, or
  // this server holds a whole copy of `key`'s shard as a backup (ready or
  // retiring, not one being filled) in the configuration installed now,
  // under its lease; else as Owns (Moved naming the owner, Busy).
  // `as_backup` (if given): set when OK came from the backup's copy.
  Status ReplicaReadable(std::string_view key, bool* as_backup = nullptr) const;
  // The ordered store's ranges (config.h, "ordered shards"): OK if this
  // server owns the range of `key`; Moved naming its owner; Busy before the
  // first configuration, while the range is released here on its way to
  // another member, or (replicated) when this member's lease has lapsed;
  // Unsupported if the cluster has no ordered store.
  Status OwnsRange(std::string_view key) const {
    return CheckRange(key, false);
  }
  // OwnsRange, and not frozen (Busy: the range is being handed over).
  Status WritableRange(std::string_view key) const {
    return CheckRange(key, true);
  }
  // OK if the configuration has an ordered store; else Busy before the
  // first configuration, Unsupported without ranges.
  Status HasOrderedStore() const;
  // A scan of [start, end) (an empty end: unbounded): OwnsRange(start),
  // and InvalidArgument if the scan goes past the end of that range (the
  // cluster client splits a scan by range, in order).
  Status OwnsScan(std::string_view start, std::string_view end) const;
  // True if `key`'s shard is owned here and moving away (its writes are
  // noted for the new owner).
  bool Outgoing(std::string_view key) const;
  // The same for `key`'s ordered range.
  bool RangeOutgoing(std::string_view key) const;
  // Range r is owned here and moving away in the current configuration.
  bool RangeMovingAway(uint32_t r) const;
  // Range r is moving to this server in the current configuration.
  bool RangeIncoming(uint32_t r) const;
  // Range r's keys here belong to no one: it is released here, or the
  // current configuration gives it to another member and is not moving
  // it here (what a release left may be deleted).
  bool RangeGone(uint32_t r) const;
  // True if shard s is owned here and moving away in the current
  // configuration.
  bool MovingAway(uint32_t shard) const;
  // The current configuration, if a primary's records sent at
  // configuration `epoch` may be kept here: only at the epoch this server
  // has installed (else Conflict: the roles may have changed; Busy before
  // any configuration). The caller keeps the records of the shards that
  // configuration has it back up (BacksUp), judged by that one snapshot.
  Result<const Installed*> AdmitsReplication(uint32_t epoch) const;
  static bool BacksUp(const Installed& c, std::string_view key) {
    return !c.backs.empty() &&
           c.backs[ShardOf(key, c.config.num_shards())] != 0;
  }
  // Whether `c` has this server fill `key`'s shard as a backup (it keeps
  // the copy of the shard its primary sends, ShardPairKind::kFill).
  static bool Fills(const Installed& c, std::string_view key) {
    return !c.fills.empty() &&
           c.fills[ShardOf(key, c.config.num_shards())] != 0;
  }
  // True if the current configuration replicates shards.
  bool replicated() const {
    const Installed* c = current();
    return c != nullptr && c->replicated;
  }
  // Whether the pairs of shard s belong here (owned or backed up) in the
  // configuration `c`.
  static bool Holds(const Installed& c, uint32_t s) {
    return c.owns[s] != 0 || (!c.backs.empty() && c.backs[s] != 0);
  }
  // Whether pairs of shard s may be kept here under `c`: it holds them
  // (Holds), or the shard is moving here (the manager copies it here).
  static bool MayKeep(const Installed& c, uint32_t s) {
    return Holds(c, s) ||
           (c.self >= 0 && c.config.NextOf(s) == uint16_t(c.self));
  }
  // The same for ordered range r: owned here, or moving here; replicated,
  // as its carrier shard (config.h, CarrierOf), backups included.
  static bool MayKeepRange(const Installed& c, uint32_t r) {
    if (r >= c.config.num_ranges()) return false;
    if (c.replicated) return MayKeep(c, c.config.CarrierOf(r));
    return c.self >= 0 && (c.config.range_owner[r] == uint16_t(c.self) ||
                           c.config.RangeNextOf(r) == uint16_t(c.self));
  }
  // Replicated: whether `c` has this server back up ordered range r (as a
  // backup of its carrier shard), and (FillsRange) one being filled.
  static bool BacksUpRange(const Installed& c, uint32_t r) {
    return !c.backs.empty() && r < c.config.num_ranges() &&
           c.backs[c.config.CarrierOf(r)] != 0;
  }
  static bool FillsRange(const Installed& c, uint32_t r) {
    return !c.fills.empty() && r < c.config.num_ranges() &&
           c.fills[c.config.CarrierOf(r)] != 0;
  }
  // Whether this server's previous incarnation held a copy of range r
  // (replicated: of its carrier shard; HeldByPrior).
  static bool RangeHeldByPrior(const Installed& c, uint32_t r) {
    return c.replicated && r < c.config.num_ranges() &&
           HeldByPrior(c, c.config.CarrierOf(r));
  }
  // Whether this server's previous incarnation (Installed::prior) held a
  // copy of shard s.
  static bool HeldByPrior(const Installed& c, uint32_t s) {
    return c.prior >= 0 && (c.config.owner[s] == uint16_t(c.prior) ||
                            c.config.IsBackup(s, c.prior));
  }
  // True if shard s is moving to this server in the current configuration
  // (the manager may copy pairs of it here).
  bool Incoming(uint32_t shard) const;
  // The manager's steps of a move, for shards moving away from here in the
  // current configuration (Conflict otherwise): Freeze stops
  // writes; Release stops reads as well.
  // (Const: a shard's hand-over state is the server's own, not part of
  // the configuration that services read.)
  Status Freeze(const std::vector<uint32_t>& shards) const;
  Status Release(const std::vector<uint32_t>& shards) const;
  // The same steps for ordered ranges moving away from here.
  Status FreezeRanges(const std::vector<uint32_t>& ranges) const;
  Status ReleaseRanges(const std::vector<uint32_t>& ranges) const;
  // The member lease (replicated configurations): extended by the lease
  // holder, never shortened; read on the data path.
  void ExtendLease(uint64_t until_ns) const {
    uint64_t cur = lease_until_ns_.load(std::memory_order_relaxed);
    while (cur < until_ns && !lease_until_ns_.compare_exchange_weak(
                                 cur, until_ns, std::memory_order_release)) {
    }
  }
  uint64_t lease_expires_ns() const {
    return lease_until_ns_.load(std::memory_order_acquire);
  }
  // Whether this member's ZooKeeper session is connected, as its member
  // last saw (any thread): named in the Busy of a lapsed lease, whose
  // likely cause it is when it is not (the manager grants leases only
  // while it is sure of its own session).
  void NoteZooKeeper(bool connected) const {
    zk_connected_.store(connected, std::memory_order_relaxed);
  }
  // OK unless the current configuration is replicated and this member's
  // lease has lapsed (Busy). Owns and Writable check it; a read
  // checks it again once it has read, so nothing it read after the lapse
  // is served.
  Status Leased() const;
  // OK if a request sent with configuration `epoch` may run here: 0 (a
  // client outside the cluster), the current epoch or an older one (the
  // key's shard is checked by Owns: a client whose configuration is older
  // but still right for its key is served, so a new configuration does not
  // turn every request in flight into a refusal). A newer epoch: Busy (this
  // server is about to install it: try again).
  Status Admits(uint32_t epoch) const;
  const std::string& self() const { return self_; }
  uint64_t incarnation() const { return incarnation_; }
  // Calls listener(word) now and with every new serving word (above), on
  // the thread that changed it, under this object's lock (the listener must
  // not call back into it). One listener; a later call replaces it.
  void SetServingListener(std::function<void(uint64_t)> listener) const;
  // The serving word in force (above).
  uint64_t serving_word() const;
  // As SetServingListener, for the ordered store's word (above).
  void SetRangeServingListener(std::function<void(uint64_t)> listener) const;
  uint64_t range_serving_word() const;
  // Calls listener(installed) after each configuration Install installs,
  // on the installing thread, under this object's lock (the listener must
  // not call back into it, but may read current()). `installed` lives as
  // long as this object (every configuration installed is kept), so the
  // listener may hand it to another thread whose use of it ends before this
  // object is destroyed. Listeners are called in the order added (one per
  // service that keeps data).
  void AddInstallListener(std::function<void(const Installed&)> listener) const;

 private:
  static constexpr uint8_t kServing = 0, kFrozen = 1, kReleased = 2;
  uint8_t StateOf(uint32_t shard) const {
    return state_ == nullptr ? kServing
                             : state_[shard].load(std::memory_order_acquire);
  }
  Status SetState(const std::vector<uint32_t>& shards, uint8_t state) const;
  uint8_t RangeStateOf(uint32_t r) const {
    return range_state_ == nullptr
               ? kServing
               : range_state_[r].load(std::memory_order_acquire);
  }
  Status SetRangeState(const std::vector<uint32_t>& ranges,
                       uint8_t state) const;
  // OwnsRange (write false) or WritableRange (true).
  Status CheckRange(std::string_view key, bool write) const;
  // The serving words of the state now; under mu_.
  uint64_t ServingWord_locked() const;
  uint64_t RangeServingWord_locked() const;
  // Gives the listener the serving word if it changed; under mu_.
  void PublishServing_locked() const;
  // Leased, judged under configuration `c` (already loaded).
  Status LeasedUnder(const Installed& c) const;
  // Owns (write false) or Writable (true), with one shard lookup.
  Status Check(std::string_view key, bool write) const;

  const std::string self_;
  const uint64_t incarnation_;
  // Mutable: PurgeDone (const, as Freeze) publishes the pending one.
  mutable std::atomic<const Installed*> current_{nullptr};
  // The first configuration, until every purge is done.
  mutable std::atomic<const Installed*> pending_{nullptr};
  mutable std::atomic<uint64_t> lease_until_ns_{0};
  mutable std::atomic<bool> zk_connected_{true};
  mutable std::mutex mu_;  // Install, SetState, purges
  mutable uint32_t purges_left_ = 0;
  // RequireResync's parts; while resyncs_left_ > 0, the parts that have
  // not yet reported for resync_epoch_ (ResyncDone).
  mutable uint32_t resync_parts_ = 0;
  mutable uint32_t resyncs_left_ = 0;
  mutable uint32_t resync_epoch_ = 0;
  std::vector<std::unique_ptr<Installed>> all_;
  // Per shard (allocated with the first configuration; the shard count
  // never changes): kServing, kFrozen or kReleased.
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  // The epoch since which this server has led the shards it leads in the
  // configuration installed last (an install that skipped epochs starts
  // it again: what it led in between is unknown); under mu_.
  uint32_t primary_since_ = 0;
  // Per ordered range, as state_ (allocated with the first configuration
  // that has ranges; the split keys never change).
  std::unique_ptr<std::atomic<uint8_t>[]> range_state_;
  uint32_t num_range_states_ = 0;
  // The epoch since which this server has owned the ranges it owns, as
  // primary_since_; under mu_.
  uint32_t ranges_since_ = 0;
  mutable std::function<void(uint64_t)> range_listener_;    // under mu_
  mutable uint64_t range_published_ = 0;                    // under mu_
  mutable std::function<void(uint64_t)> serving_listener_;  // under mu_
  mutable uint64_t serving_published_ = 0;                  // under mu_
  // Under mu_.
  mutable std::vector<std::function<void(const Installed&)>> install_listeners_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_OWNERSHIP_H_
