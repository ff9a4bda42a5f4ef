// tree::TreeService: the ordered store (a B-link tree, tree/tree.h) as a
// server::Service.
//
// One tree, owned by partition 0's thread: every request but Info routes
// there (Info is answered on the receiving thread).
// Why not one tree per partition: with keys spread by hash, every scan
// would have to visit and merge every partition (a fan-out per page), and
// with keys split by range, partitions would need split points of their
// own. A single owner keeps scans one walk along one leaf level, and
// one-sided reads (the common path on shared memory) cost the owner
// nothing. Writes are serialised on that thread.
//
// In a cluster (cluster/config.h, "ordered shards") the server's tree
// holds the key ranges the configuration gives it: a key of another range
// is refused (Moved, naming its owner), a scan must stay within one range
// (the cluster client splits scans by range), and a cluster formed without
// --tree-splits has no ordered store (Unsupported). Requests must come
// through the cluster client (they carry its configuration's epoch): one
// sent outside the cluster (epoch 0) is refused, since this tree holds
// only some of the cluster's keys and a one-sided reader could not tell.
//
// Methods (tree/wire.h): Info, Get, Put (upsert, if-absent, if-version),
// Delete, Scan (a page of at most max_scan items, with a resume key),
// MultiGet (up to kMaxMultiGetKeys gets in one request), and the range
// moves' RangeExport, RangeSync, RangeImport and RangeDrop (the
// configuration manager's, cluster/member.h: while a range moves away the
// keys written in it are noted, and Sync sends them).
//
// In a replicated cluster each range rides a carrier shard (cluster/
// config.h, CarrierOf): the writes of a pass go, as one batch, to the
// backups of their ranges' carriers (Replicate, through cluster::
// Replicator) and are answered once held there; reads and revealing
// refusals wait for the records of their key (or range) to be held; a
// backup applies the batches of the ranges it backs up; RangeFill copies
// a range into the stream for a backup being filled (RangeDrop with
// kRangeForFill empties it first).
//
// One-sided readers in a cluster check a serving mark in the tree's
// region (hash::ServingMark at kTreeServingMarkOffset, its serving half
// written from Ownership's range serving word) after each search: a range
// that moved away, or is on its way, is never read one-sided from here by
// a client whose configuration still names this server. Replicated, its
// replicated half says which writes the backups hold (versions up to it:
// raised when a batch is held to the tree's last version when it was
// sent, and at the end of a pass with no record unsent or unheld to the
// last version), and a reader trusts leaves only if their stamps are
// within it (layout.h, "Stamps").
//
// With persistence the tree is partition 0's durable state of service
// "tree" (DurableTree): writes are logged (the RESULT: key, value, new
// version) and answered once their records are written; a range's import
// logs its pairs at the versions they came with, and the old owner's
// highest version as a delete of the empty key (DurableTree reads it as
// the version only); recovery rebuilds the tree from the snapshot and the
// log before the threads start.
//
// Thread contract: as server::Service (service.h).

#ifndef REMEM_TREE_SERVICE_H_
#define REMEM_TREE_SERVICE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cluster/ownership.h"
#include "durability/store.h"
#include "server/service.h"
#include "tree/codec.h"
#include "tree/durable.h"
#include "tree/search.h"
#include "tree/tree.h"
#include "tree/wire.h"
#include "util/move_function.h"

namespace remem::fabric {
class LocalRegion;
}  // namespace remem::fabric
namespace remem::cluster {
class Replicator;
}  // namespace remem::cluster

namespace remem::tree {

struct TreeServiceOptions {
  // Bytes of --memory for the tree's region; 0 = an eighth of --memory.
  uint64_t memory = 0;
  // Tests: every node write pauses this long half done. 0 = off.
  uint64_t fault_pause_mid_write_us = 0;
};

class TreeService final : public server::Service {
 public:
  explicit TreeService(TreeServiceOptions options = {}) : options_(options) {}

  proto::ServiceId id() const override { return kTreeService; }
  std::string_view name() const override { return "tree"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(TreeMethod::kCount);
  }
  void DeclareOptions(server::OptionSet* options) override;
  Status Init(server::ServiceContext* ctx) override;
  Result<server::Route> RouteCall(uint8_t method,
                                  std::string_view payload) const override;
  void Handle(server::PartitionId p, server::Call call) override;
  void Stats(server::StatsBuilder* out) const override;
  // In a cluster (partition 0): before the first configuration is served,
  // PurgeRanges_st; then a page of a range being deleted (DeleteStep_st).
  size_t OnPass(server::PartitionId p) override;

 private:
  void UpdateCounters_st();
  // In a cluster: OK for a request sent at a configuration's epoch (> 0)
  // to a cluster with an ordered store (Ownership::HasOrderedStore).
  Status InCluster(uint32_t epoch) const;
  // Replies once the records so far are durable (at once without
  // persistence).
  void AfterDurable_st(server::Responder responder, Status status,
                       std::string payload);
  // Notes `key` for the new owner if its range is moving away.
  void NoteChanged_st(std::string_view key) {
    if (cluster_ != nullptr && cluster_->RangeOutgoing(key)) {
      changed_.emplace(key);
    }
  }
  // The range moves' methods (wire.h), on the owner thread.
  void RangeExport_st(server::Call call);
  void RangeSync_st(server::Call call);
  void RangeImport_st(server::Call call);
  void RangeDrop_st(server::Call call);
  // Stores (or deletes) a range move's or a replication batch's item at
  // its version, unless the tree holds a newer one, and logs it.
  Status Apply_st(const RangeItem& it);
  // Range r's keys from `from` on are to be deleted (a release, a settle):
  // DeleteStep_st deletes a page of the first such range per pass of the
  // owner thread (OnPass), while the range stays gone (Ownership::
  // RangeGone: a move bringing it back deletes what is left itself).
  void DeleteLater_st(uint32_t r, std::string from);
  size_t DeleteStep_st();
  // A range's emptying before a copy comes in (RangeDrop without
  // kRangeRelease: a range moving here, or one this member is being filled
  // with as a backup): EmptyStep_st deletes a page of the first such range
  // per pass of the owner thread (OnPass), and the drop is answered once
  // it is over and logged. A retry at the same epoch joins it; a
  // configuration installed meanwhile ends it with Conflict (the manager
  // drops again at the new epoch if the copy is still to be made).
  size_t EmptyStep_st();
  void EndEmptying_st(uint32_t r, Status status);
  // Forgets the keys of range r noted as written.
  void ForgetChanged_st(const cluster::Config& c, uint32_t r);
  // Deletes (and logs) a page of at most `limit` keys in [*from, upper)
  // (an empty upper: unbounded); *from moves past it, and *more says if
  // keys are left. Adds the keys deleted to *deleted.
  Status DeletePage_st(std::string* from, std::string_view upper,
                       uint32_t limit, bool* more, uint64_t* deleted);
  // Once, before the first configuration is served (Ownership::
  // RequirePurge): deletes the keys of every range it gives no role here
  // (not Ownership::MayKeepRange: moved away while this server was down, a
  // release that did not finish, a copy left by an abandoned move, a tree
  // of this server's own from before it joined).
  void PurgeRanges_st();
  // After each configuration installed once the purge is done: deletes
  // what this tree holds of ranges `c` gives no role here (an abandoned
  // move's copy; a range moved away while its release was skipped).
  void SettleRanges_st(const cluster::Ownership::Installed& c);
  // Writes the range serving word into the region's mark (its serving
  // half; any thread).
  void PublishRangeMark(uint64_t word);
  // Raises the mark's replicated half to `version` (owner thread).
  void PublishReplicated_st(uint64_t version);
  void StoreReplicatedHalf(uint64_t version);

  // Replication (a replicated cluster; owner thread). Each write is logged
  // (if persistent) and noted as a record in this pass's batch, which goes
  // to the backups of its ranges' carrier shards at the end of the pass,
  // one batch in flight (so a key's records reach a backup in order).
  bool Replicating() const;
  void LogPut_st(std::string_view key, std::string_view value,
                 uint64_t version);
  void LogDelete_st(std::string_view key, uint64_t version);
  // Adds a record to the batch (replicated), and marks its key and range
  // as not held yet.
  void NoteRecord_st(std::string_view key, std::string_view value,
                     uint64_t version, bool deleted);
  // Before a write at a new epoch (after Resync_st): versions at least
  // VersionFloor(epoch)
  // (hash/layout.h), logged, so a promoted member's writes beat every
  // record an earlier primary may have left on other backups.
  void FloorVersion_st();
  // The records that must be held by the backups before a reply about
  // `key` (or, for a scan, range r) may reveal what the tree holds. Run
  // Resync_st first: a read at a new epoch waits for what a promotion
  // sends on.
  uint64_t DirtyUpTo_st(std::string_view key);
  uint64_t RangeDirtyUpTo_st(uint32_t r);
  // After each configuration installed, before a read or a write is served
  // at its epoch: for each range this member owns now and did not at the
  // last resync (a promotion), the keys of it that the primaries' last
  // batches (retained_) brought here are sent on again as the tree holds
  // them now, and marked not held, so no read returns them before the
  // other backups hold them too (with two backups or more, a primary that
  // died may have reached only this one). As HashService::Resync_st: the
  // tree is one of Ownership::RequireResync's parts, and reports each epoch
  // (ReportResync_st) once those records are held, so one-sided readers
  // are not vouched for them before.
  void Resync_st();
  void ReportResync_st();
  // Replies once the first `upto` records are held by the backups (with
  // their error if they could not be) and, if `wrote`, everything written
  // so far is durable; a read (!wrote) is answered only while this member
  // holds its lease.
  void ReplyAfter_st(server::Responder responder, Status status,
                     std::string payload, uint64_t upto, bool wrote);
  void ShipBatch_st();
  // A batch of the first `upto` records, sent when the tree's last version
  // was `sent`, is held by the backups (or could not be: `status`).
  void Replicated_st(uint64_t upto, uint64_t sent, Status status);
  // As a backup: applies a primary's batch (TreeMethod::kReplicate).
  void Replicate_st(server::Call call);
  // Re-replication, at a range's primary (TreeMethod::kRangeFill): starts
  // or reports the copy of the range to the backups being filled of its
  // carrier shard. FillStep_st appends the next pairs to the batch (OnPass,
  // no batch in flight), a page from the copy's key cursor: a key written
  // behind the cursor comes as a record, one ahead is read at its newest,
  // and splits never move a key across it.
  void RangeFill_st(server::Call call);
  void FillStep_st();

  TreeServiceOptions options_;
  server::ServiceContext* ctx_ = nullptr;
  fabric::LocalRegion* region_ = nullptr;
  std::unique_ptr<BLinkTree> tree_;
  const cluster::Ownership* cluster_ = nullptr;  // null on a single server
  std::unique_ptr<DurableTree> durable_;
  durability::PartitionStore* store_ = nullptr;  // null without persistence
  std::string info_;                             // encoded once
  ScanPage scan_page_;  // the owner's, reused by every scan
  // Keys written in ranges moving away since their export began (owner
  // thread).
  std::unordered_set<std::string> changed_;
  bool purged_ = false;  // PurgeRanges_st has run (owner thread)
  // Ranges whose keys are being deleted: range -> the key to go on from
  // (owner thread).
  std::map<uint32_t, std::string> deleting_;
  // Ranges being emptied for a copy (EmptyStep_st; owner thread).
  struct RangeEmptying {
    uint32_t epoch = 0;    // the drop's
    std::string cursor;    // the next key to delete from
    uint64_t deleted = 0;  // pairs deleted so far
    std::vector<server::Responder> waiters;
  };
  std::map<uint32_t, RangeEmptying> emptying_;
  server::Counter emptied_pairs_;
  std::string multi_value_;  // the owner's, reused by every multi-get
  // Replication (owner thread; Replicating()).
  cluster::Replicator* replicator_ = nullptr;
  std::unique_ptr<RangePairsWriter> repl_batch_;  // null: nothing to send
  std::vector<uint8_t> repl_ranges_;              // per range: in repl_batch_
  uint64_t repl_noted_ = 0;                       // records noted so far
  uint64_t repl_done_ = 0;                        // of them, held or given up
  bool repl_in_flight_ = false;
  std::deque<std::pair<uint64_t, util::MoveFunction<void(Status)>>>
      repl_waiters_;
  // Keys and ranges with records not held yet: the record count when last
  // written.
  std::unordered_map<std::string, uint64_t> repl_dirty_;
  std::vector<uint64_t> range_dirty_;
  uint32_t floor_epoch_ = 0;  // FloorVersion_st's last
  server::Counter repl_batches_, repl_records_;
  // As a backup, per primary's stream (its incarnation): the last batch
  // applied here (kept whole, no copy: its items are views into its
  // payload) and which of its items are records this member applied. A
  // primary sends a batch only once its previous one is held by every
  // backup, so these are the only records another backup may lack.
  struct ReplicaBatch {
    std::string payload;
    RangePairs pairs;
  };
  struct Retained {
    std::shared_ptr<const ReplicaBatch> batch;
    std::vector<uint32_t> items;
  };
  std::map<uint64_t, Retained> retained_;
  // Resync_st: the epoch it ran for last, and the ranges owned then; the
  // epoch to report to Ownership once the first resync_upto_ records are
  // held (0: reported).
  uint32_t resync_epoch_ = 0;
  std::vector<uint8_t> resync_owned_;
  uint32_t resync_report_ = 0;
  uint64_t resync_upto_ = 0;
  uint64_t repl_mark_ = 0;  // the mark's replicated half (owner thread)
  server::Counter resync_records_;
  // Copies of ranges to backups being filled, by range (owner thread).
  struct RangeFill {
    uint32_t epoch = 0;
    std::string cursor;    // the next key to copy
    bool scanned = false;  // every pair of the range was added
    uint64_t sent = 0;     // pairs added
    uint64_t upto = 0;     // the record count of the last one
    Status failed;         // a batch with its pairs was not replicated
  };
  std::map<uint32_t, RangeFill> fills_;
  server::Counter fill_pairs_;
  // Published by the owner after each write, read by Stats.
  server::Counter pairs_, nodes_, height_, splits_, shifts_, merges_,
      extent_bytes_, long_keys_;
  // Arena no node page or extent class has taken yet: what any allocation
  // can still use (freed memory stays with its kind).
  server::Counter unassigned_bytes_;
};

}  // namespace remem::tree

#endif  // REMEM_TREE_SERVICE_H_
