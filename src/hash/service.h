// hash::HashService: the hash key-value store as a server::Service. One
// partition per server thread, each with its own region (a root, bucket
// arrays and slab extents, read one-sided by clients), table and, with
// persistence, durable log (DurableTable). A key's partition is
// xxh3(key, partition seed) % partitions; the seed is kept in the data
// directory so keys land where they were before a restart.
//
// Methods (hash/wire.h): Info is answered on the receiving thread; Get,
// Put, Delete route to the key's partition; MultiGet, MultiPut and MultiOp run
// on the receiving thread and fan out to the partitions of their keys. Writes
// are logged (the RESULT: key, value, new version) and answered once their
// records are written (group commit at the end of the pass).
//
// Server-side operations (Op, OpBatch: atomics, vector operations, user
// functions; src/ops/) are the engine KV-Direct calls a reservation
// station. Each operation is queued on its key's partition (an OpBatch fans
// out like MultiOp) and the owner runs the queue at the end of the pass
// (OnPass, before the group commit): operations grouped by key in arrival
// order, buckets prefetched ahead, each key read once, each operation
// applied to the value the previous one left (ops::Apply), and the key
// written and logged once with the final value. A key with k writing
// operations consumes k versions: operation i reports version base + i, and
// the stored value carries the last (the intermediate values were never
// visible, so each operation linearizes at the write, in order).
//
// Replication (a cluster whose configuration has replicas; docs/
// ARCHITECTURE.md, "Replication"): every write of a shard this server owns
// is also noted as a record (key, value or deletion, version) in its
// partition's batch; at the end of the pass the batch goes to the
// replicator (cluster/replicator.h), one batch in flight per partition, so
// a key's records reach the backups in order. A write is answered once it
// is durable and every backup holds it; a get of a key with a record not
// yet replicated (an operation: of a partition with any) is answered once
// it is, so nobody sees a value that a failover could lose. As a backup, the
// service applies a primary's records (kReplicate) with their versions.
// Re-replication (kShardFill): a primary copies whole shards to a backup
// being filled through the same stream, so the copy and the writes reach it
// in order.
//
// Thread contract: as server::Service (service.h).

#ifndef REMEM_HASH_SERVICE_H_
#define REMEM_HASH_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cluster/ownership.h"
#include "durability/store.h"
#include "hash/codec.h"
#include "hash/durable.h"
#include "hash/slab.h"
#include "hash/sweep.h"
#include "hash/table.h"
#include "hash/wire.h"
#include "ops/functions.h"
#include "server/service.h"
#include "util/move_function.h"

namespace remem::fabric {
class LocalRegion;
}  // namespace remem::fabric

namespace remem::hash {

// A request of server-side operations in flight (service.cc).
struct OpRequest;

// Buckets a re-replication copy scans per batch at most (2 MiB of them),
// however few of their pairs are of the copy's shards, and the new
// backup's drop goes through per pass: the partition's thread serves
// nothing else meanwhile.
inline constexpr uint64_t kFillScanBuckets = 4096;

struct HashServiceOptions {
  // Bytes of --memory for the hash store, split into one partition per
  // thread; 0 = half of --memory.
  uint64_t memory = 0;
  uint64_t max_key_bytes = 64 << 10;
  uint64_t max_value_bytes = 16 << 20;
  uint64_t initial_buckets = 256;  // per partition, a power of two
  // Tests: every bucket write pauses this long half done. 0 = off.
  uint64_t fault_pause_mid_write_us = 0;
  // Testing: a backup holds each replication batch it admitted that
  // deletes a pair this long before applying it (the partition thread goes
  // on meanwhile). 0 = off.
  uint64_t fault_replica_delete_delay_ms = 0;
  // Testing: a partition starts deleting the pairs of shards it has no role
  // for any more (Partition::Discard) this long after the last one was
  // added. 0 = off.
  uint64_t fault_discard_delay_ms = 0;
  // Testing: the bytes of pairs a ShardSync reply holds (kShardSyncBytes;
  // small values make every sync of several changes take several replies).
  uint64_t shard_sync_bytes = kShardSyncBytes;
  // Testing: the buckets a re-replication copy scans per batch at most, and
  // a drop or a discard per pass (kFillScanBuckets; small values make
  // every copy take many batches, and every drop many passes).
  uint64_t fill_scan_buckets = kFillScanBuckets;
  // Shared libraries of user-defined update functions (--ops-library).
  std::vector<std::string> ops_libraries;
};

class HashService final : public server::Service {
 public:
  explicit HashService(HashServiceOptions options = {}) : options_(options) {}
  ~HashService() override;

  proto::ServiceId id() const override { return kHashService; }
  std::string_view name() const override { return "hash"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(HashMethod::kCount);
  }
  void DeclareOptions(server::OptionSet* options) override;
  Status Init(server::ServiceContext* ctx) override;
  Result<server::Route> RouteCall(uint8_t method,
                                  std::string_view payload) const override;
  void Handle(server::PartitionId p, server::Call call) override;
  void Stats(server::StatsBuilder* out) const override;
  size_t OnPass(server::PartitionId p) override;

  HashServiceOptions& options() { return options_; }

 private:
  // A primary's replication batch, as a backup received it (the pairs
  // view into the payload).
  struct ReplicaBatch {
    std::string payload;
    ShardPairs pairs;
  };
  struct Partition {
    fabric::LocalRegion* region = nullptr;
    std::unique_ptr<SlabAllocator> slab;
    std::unique_ptr<Table> table;
    std::unique_ptr<DurableTable> durable;
    durability::PartitionStore* store = nullptr;  // null without persistence
    // Published by the owner after each write, read by Stats.
    server::Counter pairs, growths, bytes_used;
    // Operations done, and the bucket writes they took (fewer when a pass
    // held several operations on one key).
    server::Counter ops, op_writes;
    // Operations queued for the end of the pass (owner thread only).
    std::vector<std::pair<std::shared_ptr<OpRequest>, uint32_t>> pending_ops;
    // RunOps_st's storage, kept from pass to pass so that grouping the
    // operations by key allocates nothing (owner thread only): the queue
    // being run, an open-addressed table of groups by key, and each group's
    // operations as a list (first, last, next).
    std::vector<std::pair<std::shared_ptr<OpRequest>, uint32_t>> running_ops;
    std::vector<uint32_t> op_slots, op_first, op_last, op_next;
    // Keys of shards moving away that changed (written, deleted, moved in
    // the table) since their export began: sent again (owner thread only).
    std::unordered_set<std::string> changed;
    // While released shards' pairs are deleted: those deletes are not
    // changes to send (owner thread only).
    bool purging = false;
    // In a cluster: what the first configuration does not give this server
    // has been deleted (PurgeUnowned_st).
    bool purged = false;
    // Replicated: that purge kept the copies this server's previous
    // incarnation held (Ownership::Installed::prior); the first
    // configuration naming this incarnation decides them
    // (PurgeStale_st).
    bool purge_stale = false;
    // In a cluster (owner thread only), per shard (empty: none yet): this
    // partition may hold pairs of it. Marked for each configuration
    // settled in which the shard has a role here (owner, backup of any
    // kind, moving here), and by a move's imports; cleared once its pairs
    // are deleted (SettleShards_st, the purges, a release or a forget).
    std::vector<uint8_t> held;
    // The newest configuration epoch SettleShards_st (or a purge) judged
    // this partition by.
    uint32_t settled_epoch = 0;
    // Replication (owner thread only): this pass's records (null: none),
    // records noted and records replicated (or given up) so far, whether a
    // batch is with the replicator, and who waits for which record count.
    std::unique_ptr<ShardPairsWriter> repl_batch;
    // The distinct shards of repl_batch's records (NoteShard_st), and a
    // mark per shard of the cluster.
    std::vector<uint32_t> repl_shards;
    std::vector<uint8_t> repl_shard_marked;
    uint64_t repl_noted = 0, repl_done = 0;
    bool repl_in_flight = false;
    std::deque<std::pair<uint64_t, util::MoveFunction<void(Status)>>>
        repl_waiters;
    // Keys (by hash) with records not yet replicated: the record count
    // when each was last written. A read of another key waits for nothing.
    std::unordered_map<uint64_t, uint64_t> repl_dirty;
    // The replicated half of the partition's ServingMark (layout.h): pairs
    // this partition wrote with versions up to it are on the backups.
    uint64_t repl_mark = 0;
    server::Counter repl_batches, repl_records;
    // Re-replication (owner thread only; kShardFill): the copy of shards
    // this server owns to their backups being filled, as kFill pairs
    // appended to the replication batches. The table is swept a chunk per
    // batch (FillStep_st; TableSweep, which also catches the pairs cuckoo
    // moves carry behind it and starts over when the table grows), so the
    // copy never holds the thread for long; each pair is read when it is
    // sent, so it is the newest, and every later write follows it in the
    // stream.
    struct Fill {
      uint32_t epoch = 0;        // 0: no copy
      std::vector<uint8_t> set;  // per shard
      std::unique_ptr<TableSweep> sweep;
      bool scanned = false;  // the sweep is over
      // Keys the sweep found, each read and sent in turn (a batch stops at
      // kFillBatchBytes between pairs, never inside a chunk of buckets).
      std::deque<std::string> found;
      uint64_t sent = 0;  // pairs sent by this copy
      uint64_t upto = 0;  // the record count of the last pair sent
      Status failed;      // a batch with its pairs was not replicated
      bool Sent() const { return scanned && found.empty(); }
    };
    Fill fill;
    server::Counter fill_pairs;
    // Before a copy comes in (owner thread only; kShardDrop with
    // kShardForFill, a backup about to be filled, or with no flag, shards
    // about to move here): what this partition held of the shards is
    // deleted a chunk of buckets per pass (EmptyStep_st), so a table of
    // millions of pairs never holds the thread for a whole scan. The drop
    // is answered once the sweep is over and its deletes are durable; a
    // request for the same epoch and shards (the manager's retry) waits
    // for the same one.
    struct Emptying {
      uint32_t epoch = 0;  // 0: none under way
      std::vector<uint8_t> set;
      std::unique_ptr<TableSweep> sweep;
      bool deleted = false;  // any pair, logged
      std::vector<util::MoveFunction<void(Status)>> waiters;
    };
    Emptying emptying;
    server::Counter emptied_pairs;
    // In a cluster (owner thread only): shards this server has no role for
    // any more whose pairs are deleted in the background, a chunk of
    // buckets per pass (DiscardStep_st), so that no request waits for a
    // scan of the whole table: a shard released (moved away), a copy
    // forgotten (retired), one an installed configuration gave no role here
    // (SettleShards_st, PurgeStale_st). No reader is served them meanwhile
    // (the serving mark and the configuration send readers elsewhere). A
    // shard given a role here again leaves the set: a copy of it that comes
    // here is preceded by a drop (kShardDrop), which deletes what is left.
    // Each delete is logged; none is made while the log refuses writes.
    struct Discard {
      std::vector<uint8_t> set;  // per shard (empty: none yet)
      uint32_t count = 0;        // shards marked in `set`
      // Null: nothing to delete. Started again when a shard is added (the
      // buckets already scanned may hold its pairs).
      std::unique_ptr<TableSweep> sweep;
      uint64_t deleted = 0;  // pairs deleted since the set was last empty
      // Testing (--fault-discard-delay-ms): no pair deleted before this.
      std::chrono::steady_clock::time_point not_before{};
    };
    Discard discard;
    server::Counter discard_shards, discarded_pairs;
    // As a backup (owner thread only): applies of admitted batches held by
    // --fault-replica-delete-delay-ms, due at the time given; and batches
    // refused when applied because the configuration changed since they
    // were admitted (HandleReplicate).
    std::deque<std::pair<std::chrono::steady_clock::time_point,
                         util::MoveFunction<void()>>>
        held_applies;
    server::Counter applies_held, replica_refused;
    // Gets this server answered as a backup of their key's shard
    // (kHashReadAnyReplica).
    server::Counter backup_gets;
    // The epoch whose version floor the table's counter is at (owner
    // thread; FloorVersions_st).
    uint32_t floor_epoch = 0;
    // As a backup (owner thread only), per primary's stream (its
    // incarnation and partition): the last batch applied here, and which
    // of its records are this partition's. A primary sends a batch only
    // once its previous one is held by every backup, so these are the
    // only records another backup may lack (Resync_st).
    struct Retained {
      std::shared_ptr<const ReplicaBatch> batch;
      std::vector<uint32_t> items;
    };
    std::map<std::pair<uint64_t, uint64_t>, Retained> retained;
    // Resync_st: the configuration epoch it ran for last, the shards this
    // member owned then, the records it sent on (they count towards
    // repl_noted), and the epoch to report to Ownership::ResyncDone once
    // they are held (0: none).
    uint32_t resync_epoch = 0;
    std::vector<uint8_t> resync_owned;
    uint64_t resync_upto = 0;
    uint32_t resync_report = 0;
    server::Counter resync_records;
  };
  uint32_t PartitionOf(std::string_view key) const;
  // OK, or (in a cluster) Moved for a key this server does not own now
  // (Busy before its first configuration).
  Status Owned(std::string_view key) const;
  // Owned; with kHashReadAnyReplica in `flags` (a get's), also OK on a
  // backup holding a whole copy of the key's shard
  // (Ownership::ReplicaReadable).
  // `part` (on its owner thread): a get let through as a backup's is
  // counted in its backup_gets.
  Status Readable(std::string_view key, uint32_t flags,
                  Partition* part = nullptr) const;
  // In a replicated cluster, before a write as a primary: the partition's
  // next version is at least VersionFloor(epoch installed) (hash/layout.h),
  // so a backup promoted at epoch e writes above every version issued
  // before e, stragglers of a dead primary that reached only another
  // backup included. Checked after Writable, on the owner thread.
  void FloorVersions_st(Partition& part);
  void UpdateCounters_st(Partition& part);
  void HandleSingle_st(server::PartitionId p, server::Call call);
  void HandleMulti(server::Call call);
  void HandleOps(server::PartitionId p, server::Call call);
  // Moving shards (hash/wire.h kShardExport .. kShardDrop; the steps are
  // in cluster/member.h).
  void HandleShardExport_st(server::PartitionId p, server::Call call);
  void HandleShardSync(server::Call call);
  struct ShardSyncState;
  void CollectChanges_st(std::shared_ptr<ShardSyncState> sync,
                         server::PartitionId p);
  void HandleShardImport(server::Call call);
  void HandleShardDrop(server::Call call);
  // OK, or (in a cluster) Busy for a key whose shard is being handed over.
  Status Writable(std::string_view key) const;
  // Runs partition p's queued operations (the engine above).
  size_t RunOps_st(server::PartitionId p);
  // Before the first configuration is served (cluster::Ownership::
  // RequirePurge): deletes the pairs of shards it gives this server no role
  // in (Ownership::MayKeep: owned, backed up, or moving here).
  void PurgeUnowned_st(server::PartitionId p);
  // Once a configuration names this incarnation (after PurgeUnowned_st
  // kept its previous incarnation's copies): discards (Partition::Discard)
  // the shards it does not give this server.
  void PurgeStale_st(server::PartitionId p);
  // After each configuration installed (`c`, in the order installed; one
  // older than a configuration settled already: nothing), and after a
  // move's imports (by the current one): the pairs of shards that may be
  // held here (Partition::held) but have no role here in `c` are discarded
  // (Partition::Discard: deleted in the background), garbage no reader is
  // sent to, and a shard `c` gives a role here leaves the discard: a move's
  // copy that was abandoned, a copy retired or a backup dropped whose member
  // the manager did not reach (or a manager that died before it asked), and
  // what a member failed over (paused, cut off) held when it comes back. Not
  // before the first purge, nor while a restarted member's previous copies wait
  // to be judged (PurgeStale_st decides those).
  void SettleShards_st(server::PartitionId p,
                       const cluster::Ownership::Installed& c);
  // Adds the shards marked in `shards` (one entry per shard) to `part`'s
  // discard; their pairs are deleted from the next pass on.
  void Discard_st(Partition& part, const std::vector<uint8_t>& shards);
  // The next chunk of partition p's discard (OnPass): deletes the pairs of
  // the shards still marked, logged where the log takes writes; the work done.
  size_t DiscardStep_st(server::PartitionId p);
  // Deletes the pairs of `part` whose shard `holds` does not mark (one
  // entry per shard; a scan of the whole table), logged where the log takes
  // writes; how many.
  size_t DeleteShardsNotHeld_st(Partition& part,
                                const std::vector<uint8_t>& holds);
  // Deletes `keys` from `part`, each delete logged if `logged` (the
  // partition's log takes writes); none is a change to send to a new owner.
  void DeletePairs_st(Partition& part, const std::vector<std::string>& keys,
                      bool logged);
  // Replies once partition p's records so far are durable (at once without
  // persistence) and replicated (AfterCommit_st).
  void AfterDurable_st(Partition& part, server::Responder responder,
                       Status status, std::string payload);
  // Replies with what the table holds for `key` (a get's answer; a refused
  // delete's or conditional write's NotFound, AlreadyExists, Conflict)
  // only as a linearizable read may: while this member holds its lease,
  // and once the key's records are held by the backups (else with the
  // error that stopped them).
  void ReplyAsRead_st(Partition& part, std::string_view key,
                      server::Responder responder, Status status,
                      std::string payload = {});
  // A write of `part`, for its log (if any) and its backups (if the
  // configuration replicates).
  void LogPut_st(Partition& part, std::string_view key, std::string_view value,
                 uint64_t version);
  void LogDelete_st(Partition& part, std::string_view key, uint64_t version);
  // Notes `key`'s shard among the shards of `part`'s batch (every record
  // added to repl_batch: the backups of those shards get the batch).
  void NoteShard_st(Partition& part, std::string_view key);
  // Runs done(status) once everything `part` wrote so far is durable (if
  // `wrote`: the caller wrote in this pass) and its first `replicated`
  // records are held by the backups: at once if there is nothing to wait
  // for. A write passes part.repl_noted; a get, DirtyUpTo_st of its key.
  void AfterCommit_st(Partition& part, bool wrote, uint64_t replicated,
                      util::MoveFunction<void(Status)> done);
  // The records of `part` that must be replicated before a read of `key`
  // is answered (0: none). Runs Resync_st first: a read at a new epoch
  // waits for what a promotion sends on.
  uint64_t DirtyUpTo_st(Partition& part, std::string_view key);
  // After each configuration installed, on the owner thread, before a
  // read is answered at its epoch: for each shard this member owns now and
  // did not at the last resync (a promotion), the records of it that the
  // primaries' last batches (Partition::retained) brought here are sent
  // on again, as they stand in the table now, and marked dirty, so no
  // read returns them before the other backups hold them (with two
  // backups or more, a primary that died may have reached only this one);
  // then Ownership::ResyncDone once they are held, which lets the member
  // vouch for its memory to one-sided readers again.
  void Resync_st(Partition& part);
  void ReportResync_st(Partition& part);
  // True if writes are shipped to backups now.
  bool Replicating() const;
  // Hands `part`'s batch to the replicator if none is in flight.
  void ShipBatch_st(server::PartitionId p);
  // Partition p's batch of records up to `upto` (pairs up to `version`)
  // was replicated, or given up with `status`.
  void Replicated_st(server::PartitionId p, uint64_t upto, uint64_t version,
                     Status status);
  // Writes one half of `part`'s ServingMark (`field`: its offset): the word
  // and its check.
  static void PublishMarkHalf(Partition& part, size_t field, uint64_t word,
                              uint64_t half);
  // Raises the replicated half to `version` (owner thread).
  void PublishReplicated_st(Partition& part, uint64_t version);
  void HandleReplicate(server::Call call);
  // Re-replication: starts (or reports) the copy of the listed shards to
  // their backups being filled (kShardFill), on every partition.
  void HandleShardFill(server::Call call);
  // Appends the next pairs of partition p's copy to its batch (OnPass, when
  // no batch is in flight); ends a copy whose epoch is no longer current.
  void FillStep_st(Partition& part);
  // A drop before a copy of the shards in `set` comes in (a fill, or a move
  // here) at `epoch` on `part`: joins the emptying under way for the same,
  // or starts it (one for other shards or an older epoch ends with
  // Conflict); done(status) once it is over.
  void StartEmptying_st(Partition& part, uint32_t epoch,
                        const std::vector<uint8_t>& set,
                        util::MoveFunction<void(Status)> done);
  // The next chunk of `part`'s emptying (OnPass); ends it with Conflict once
  // the configuration it was asked at is no longer current. The work done.
  size_t EmptyStep_st(Partition& part);
  void EndEmptying_st(Partition& part, Status status);
  // Stores pairs[items] in `part` with their versions (Table::Import: a
  // newer version stays) or deletes them, each logged if `logged`; the
  // first error (kShardImport and kReplicate).
  Status ApplyPairs_st(Partition& part, const ShardPairs& pairs,
                       const std::vector<uint32_t>& items, bool logged);

  HashServiceOptions options_;
  server::ServiceContext* ctx_ = nullptr;
  const cluster::Ownership* cluster_ = nullptr;  // null on a single server
  cluster::Replicator* replicator_ = nullptr;    // null on a single server
  // The highest version a primary's records carried here: every partition
  // issues versions above it (after a promotion, no version of a key is
  // issued twice).
  std::atomic<uint64_t> replicated_max_version_{0};
  uint64_t partition_seed_ = 0;
  std::vector<std::unique_ptr<Partition>> partitions_;
  std::string info_;  // encoded once
  ops::FunctionTable functions_;
};

}  // namespace remem::hash

#endif  // REMEM_HASH_SERVICE_H_
