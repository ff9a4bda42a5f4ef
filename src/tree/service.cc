#include "tree/service.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "cluster/ownership.h"
#include "cluster/replicator.h"
#include "durability/durability.h"
#include "fabric/memory_region.h"
#include "hash/layout.h"
#include "tree/codec.h"
#include "util/log.h"

namespace remem::tree {

using server::Call;
using server::PartitionId;
using server::Route;

void TreeService::DeclareOptions(server::OptionSet* o) {
  o->AddSize("--tree-memory", &options_.memory,
             "of --memory, bytes for the ordered store's B-link tree "
             "(default an eighth)");
  o->AddUint("--tree-fault-pause-mid-write-us",
             &options_.fault_pause_mid_write_us,
             "testing: pause every tree node write half done for this many "
             "microseconds (readers see the torn node)",
             /*testing=*/true);
}

Status TreeService::Init(server::ServiceContext* ctx) {
  uint64_t memory = options_.memory;
  if (memory != 0 && memory < (1ull << 20)) {
    return Status::InvalidArgument("--tree-memory must be at least 1 MiB");
  }
  if (memory == 0)
    memory = std::max<uint64_t>(ctx->memory_budget() / 8, 1 << 20);
  if (memory >= ctx->memory_budget()) {
    return Status::InvalidArgument("--tree-memory must be less than --memory");
  }
  memory &= ~uint64_t{kNodeBytes - 1};
  ctx->NameMemory("--tree-memory", memory, options_.memory == 0);
  auto region = ctx->AllocateRegion(memory, proto::RegionAccess::kReadOnly);
  if (!region.ok()) return region.status();
  region_ = *region;
  ctx_ = ctx;
  cluster_ = ctx->cluster();
  replicator_ = ctx->replicator();
  auto tree = BLinkTree::Create(region_->base(), memory);
  if (!tree.ok()) return tree.status();
  tree_ = std::move(*tree);
  if (options_.fault_pause_mid_write_us > 0) {
    const auto pause =
        std::chrono::microseconds(options_.fault_pause_mid_write_us);
    tree_->SetMidWriteHook([pause] { std::this_thread::sleep_for(pause); });
  }
  durable_ = std::make_unique<DurableTree>(tree_.get());
  if (durability::Durability* d = ctx->durability(); d != nullptr) {
    auto store = d->OpenPartition(name(), 0, durable_.get());
    if (store.status().code() == StatusCode::kOutOfMemory) {
      // Nothing on disk changed: a larger tree region takes it all.
      return Status::OutOfMemory(store.status().message() +
                                 " (restart with a larger --tree-memory: "
                                 "the data directory is unchanged)");
    }
    if (!store.ok()) return store.status();
    store_ = *store;
  }
  if (cluster_ != nullptr) {
    // Readers stop trusting this region's pairs before a range moves away
    // (ownership.h; the Ownership and whatever installs configurations are
    // destroyed before the services, so the listener never outlives this).
    PublishRangeMark(0);
    StoreReplicatedHalf(0);
    cluster_->SetRangeServingListener(
        [this](uint64_t word) { PublishRangeMark(word); });
    // What the tree holds of ranges no configuration gives it goes: once
    // before the first configuration is served, then after each install
    // (on partition 0's thread, after whatever it is running: an import
    // admitted under the configuration before is deleted after it).
    cluster_->RequirePurge(1);
    // Replicated, a promotion's resync (Resync_st) holds the serving word.
    if (replicator_ != nullptr) cluster_->RequireResync(1);
    cluster_->AddInstallListener(
        [this](const cluster::Ownership::Installed& c) {
          ctx_->RunOn(0, [this, &c] {
            SettleRanges_st(c);
            if (Replicating()) Resync_st();
          });
        });
  }
  TreeInfo info;
  info.region = region_->id();
  info.max_key = kMaxKey;
  info.max_value = kMaxValue;
  info.max_scan = kMaxScanLimit;
  info_ = EncodeTreeInfo(info);
  UpdateCounters_st();
  return Status::OK();
}

static_assert(kTreeServingMarkOffset >= sizeof(TreeRoot) &&
              kTreeServingMarkOffset + sizeof(hash::ServingMark) <=
                  kNodesOffset);

void TreeService::PublishRangeMark(uint64_t word) {
  // Word-sized atomic stores: a reader copying the mark sees each word
  // whole, and a copy torn between two publishes fails the check.
  auto* mark =
      reinterpret_cast<uint64_t*>(region_->base() + kTreeServingMarkOffset);
  __atomic_store_n(&mark[0], word, __ATOMIC_RELEASE);
  __atomic_store_n(&mark[1], hash::MarkCheck(word, hash::kServingHalf),
                   __ATOMIC_RELEASE);
}

void TreeService::PublishReplicated_st(uint64_t version) {
  if (version <= repl_mark_) return;
  repl_mark_ = version;
  StoreReplicatedHalf(version);
}

void TreeService::StoreReplicatedHalf(uint64_t version) {
  auto* mark =
      reinterpret_cast<uint64_t*>(region_->base() + kTreeServingMarkOffset +
                                  offsetof(hash::ServingMark, replicated));
  __atomic_store_n(&mark[0], version, __ATOMIC_RELEASE);
  __atomic_store_n(&mark[1], hash::MarkCheck(version, hash::kReplicatedHalf),
                   __ATOMIC_RELEASE);
}

void TreeService::UpdateCounters_st() {
  pairs_.Set(tree_->size());
  nodes_.Set(tree_->num_nodes());
  height_.Set(tree_->height());
  splits_.Set(tree_->splits());
  shifts_.Set(tree_->shifts());
  merges_.Set(tree_->merges());
  extent_bytes_.Set(tree_->extent_bytes());
  unassigned_bytes_.Set(tree_->bytes_unassigned());
  long_keys_.Set(tree_->long_keys());
}

void TreeService::AfterDurable_st(server::Responder responder, Status status,
                                  std::string payload) {
  if (store_ == nullptr || !status.ok()) {
    return responder.Reply(std::move(status), std::move(payload));
  }
  store_->AfterDurable([responder = std::move(responder),
                        payload = std::move(payload)](Status st) mutable {
    responder.Reply(std::move(st), std::move(payload));
  });
}

void TreeService::Stats(server::StatsBuilder* out) const {
  out->Add("tree_pairs", pairs_.Get());
  out->Add("tree_nodes", nodes_.Get());
  out->Add("tree_height", height_.Get());
  out->Add("tree_splits", splits_.Get());
  out->Add("tree_shifts", shifts_.Get());
  out->Add("tree_merges", merges_.Get());
  out->Add("tree_extent_bytes", extent_bytes_.Get());
  out->Add("tree_long_keys", long_keys_.Get());
  out->Add("tree_bytes_total", region_ != nullptr ? region_->length() : 0);
  out->Add("tree_bytes_unassigned", unassigned_bytes_.Get());
  if (cluster_ != nullptr) {
    // As a primary: batches of records sent to the backups, and records.
    out->Add("tree_repl_batches", repl_batches_.Get());
    out->Add("tree_repl_records", repl_records_.Get());
    // Pairs copied to backups being filled (re-replication).
    out->Add("tree_fill_pairs", fill_pairs_.Get());
    // Records sent on once promoted (Resync_st).
    out->Add("tree_resync_records", resync_records_.Get());
    // Pairs deleted before a copy came in (a range moving here, or a
    // backup being filled: EmptyStep_st).
    out->Add("tree_emptied_pairs", emptied_pairs_.Get());
  }
}

Result<Route> TreeService::RouteCall(uint8_t method,
                                     std::string_view payload) const {
  // Decode here so a malformed request is refused before it is queued.
  switch (static_cast<TreeMethod>(method)) {
    case TreeMethod::kInfo:
      return Route::Here();
    case TreeMethod::kGet:
    case TreeMethod::kDelete: {
      auto key = DecodeTreeKey(payload);
      if (!key.ok()) return key.status();
      break;
    }
    case TreeMethod::kPut: {
      auto put = DecodeTreePut(payload);
      if (!put.ok()) return put.status();
      break;
    }
    case TreeMethod::kScan: {
      auto scan = DecodeTreeScan(payload);
      if (!scan.ok()) return scan.status();
      break;
    }
    case TreeMethod::kMultiGet: {
      auto keys = DecodeTreeMultiGet(payload);
      if (!keys.ok()) return keys.status();
      break;
    }
    case TreeMethod::kMultiPut: {
      auto pairs = DecodeTreeMultiPut(payload);
      if (!pairs.ok()) return pairs.status();
      break;
    }
    case TreeMethod::kRangeExport:
    case TreeMethod::kRangeSync:
    case TreeMethod::kRangeDrop:
    case TreeMethod::kRangeFill: {
      auto req = DecodeTreeRange(payload);
      if (!req.ok()) return req.status();
      break;
    }
    case TreeMethod::kRangeImport:
    case TreeMethod::kReplicate: {
      auto pairs = DecodeRangePairs(payload);
      if (!pairs.ok()) return pairs.status();
      break;
    }
    case TreeMethod::kCount:
      return Status::ProtocolError("unknown tree method");
  }
  return Route::To(0);
}

Status TreeService::InCluster(uint32_t epoch) const {
  if (cluster_ == nullptr) return Status::OK();
  if (epoch == 0) {
    return Status::InvalidArgument(
        "this server is a cluster member: its ordered store holds only its "
        "ranges of the cluster's keys; use the cluster client (remem::Cluster, "
        "or remem --cluster SEEDS)");
  }
  return cluster_->HasOrderedStore();
}

void TreeService::Handle(PartitionId /*p*/, Call call) {
  BLinkTree& t = *tree_;
  // In a cluster, a key of another member's range is refused (Moved).
  auto check_key = [this](std::string_view key, bool write = false) {
    if (key.empty() || key.size() > kMaxKey) {
      return Status::InvalidArgument("tree keys are 1.." +
                                     std::to_string(kMaxKey) + " bytes");
    }
    if (cluster_ == nullptr) return Status::OK();
    return write ? cluster_->WritableRange(key) : cluster_->OwnsRange(key);
  };
  if (Status st = InCluster(call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  switch (static_cast<TreeMethod>(call.method)) {
    case TreeMethod::kInfo:
      return call.responder.Reply(Status::OK(), info_);
    case TreeMethod::kGet: {
      auto key = DecodeTreeKey(call.payload);
      if (!key.ok()) return call.responder.Reply(key.status());
      if (Status st = check_key(*key); !st.ok()) {
        return call.responder.Reply(st);
      }
      std::string value;
      uint64_t version = 0;
      Status st = t.Get(*key, &value, &version);
      const uint64_t upto = DirtyUpTo_st(*key);
      if (!st.ok()) {
        return ReplyAfter_st(std::move(call.responder), st, {}, upto, false);
      }
      return ReplyAfter_st(std::move(call.responder), Status::OK(),
                           EncodeTreeGetReply(version, value), upto, false);
    }
    case TreeMethod::kPut: {
      auto put = DecodeTreePut(call.payload);
      if (!put.ok()) return call.responder.Reply(put.status());
      if (cluster_ != nullptr) {
        if (Status st = cluster_->WritableRange(put->key); !st.ok()) {
          return call.responder.Reply(st);
        }
      }
      // The log cannot be written: refuse before changing anything.
      if (store_ != nullptr) {
        if (Status w = store_->Writable(); !w.ok()) {
          return call.responder.Reply(w);
        }
      }
      FloorVersion_st();
      auto v = t.Put(put->key, put->value, put->mode, put->expected_version);
      UpdateCounters_st();
      if (!v.ok()) {
        // A refusal (AlreadyExists, Conflict, NotFound) tells what the
        // tree holds: a read.
        return ReplyAfter_st(std::move(call.responder), v.status(), {},
                             DirtyUpTo_st(put->key), false);
      }
      NoteChanged_st(put->key);
      LogPut_st(put->key, put->value, *v);
      return ReplyAfter_st(std::move(call.responder), Status::OK(),
                           EncodeTreePutReply(*v), repl_noted_, true);
    }
    case TreeMethod::kDelete: {
      auto key = DecodeTreeKey(call.payload);
      if (!key.ok()) return call.responder.Reply(key.status());
      if (cluster_ != nullptr) {
        if (Status st = cluster_->WritableRange(*key); !st.ok()) {
          return call.responder.Reply(st);
        }
      }
      if (store_ != nullptr) {
        if (Status w = store_->Writable(); !w.ok()) {
          return call.responder.Reply(w);
        }
      }
      FloorVersion_st();
      Status st = t.Delete(*key);
      UpdateCounters_st();
      if (!st.ok()) {
        return ReplyAfter_st(std::move(call.responder), std::move(st), {},
                             DirtyUpTo_st(*key), false);
      }
      NoteChanged_st(*key);
      LogDelete_st(*key, t.last_version());
      return ReplyAfter_st(std::move(call.responder), Status::OK(), {},
                           repl_noted_, true);
    }
    case TreeMethod::kScan: {
      auto scan = DecodeTreeScan(call.payload);
      if (!scan.ok()) return call.responder.Reply(scan.status());
      if (scan->start.size() > kMaxKey + 1 || scan->end.size() > kMaxKey + 1) {
        return call.responder.Reply(
            Status::InvalidArgument("scan bounds are at most " +
                                    std::to_string(kMaxKey + 1) + " bytes"));
      }
      if (scan->limit > kMaxScanLimit) {
        return call.responder.Reply(Status::InvalidArgument(
            "scan limit is at most " + std::to_string(kMaxScanLimit)));
      }
      if (cluster_ != nullptr) {
        if (Status st = cluster_->OwnsScan(scan->start, scan->end); !st.ok()) {
          return call.responder.Reply(st);
        }
      }
      // Into the page kept from the last scan: its strings keep their
      // capacity.
      Status st = t.Scan(scan->start, scan->end, scan->limit, scan->descending,
                         &scan_page_);
      if (!st.ok()) return call.responder.Reply(st);
      // A scan stays inside one range (OwnsScan): it waits for that
      // range's records.
      const uint64_t upto =
          cluster_ != nullptr && cluster_->current() != nullptr
              ? RangeDirtyUpTo_st(
                    cluster_->current()->config.RangeOf(scan->start))
              : 0;
      return ReplyAfter_st(std::move(call.responder), Status::OK(),
                           EncodeTreeScanReply(scan_page_), upto, false);
    }
    case TreeMethod::kMultiGet: {
      auto keys = DecodeTreeMultiGet(call.payload);
      if (!keys.ok()) return call.responder.Reply(keys.status());
      TreeMultiReplyWriter reply(uint32_t(keys->size()));
      std::string& value = multi_value_;  // kept: its capacity is reused
      uint64_t upto = 0;
      for (std::string_view key : *keys) {
        upto = std::max(upto, DirtyUpTo_st(key));
        if (Status st = check_key(key); !st.ok()) {
          reply.AddError(st);
          continue;
        }
        // Full: the rest are asked again, unread (tree/wire.h).
        if (reply.bytes() >= kMultiGetReplyBytes) {
          reply.AddError(Status::Busy("the multi-get reply is full"));
          continue;
        }
        uint64_t version = 0;
        Status st = t.Get(key, &value, &version);
        if (st.ok()) {
          reply.AddValue(version, value);
        } else {
          reply.AddError(st);
        }
      }
      return ReplyAfter_st(std::move(call.responder), Status::OK(),
                           reply.Finish(), upto, false);
    }
    case TreeMethod::kMultiPut: {
      auto pairs = DecodeTreeMultiPut(call.payload);
      if (!pairs.ok()) return call.responder.Reply(pairs.status());
      if (store_ != nullptr) {
        if (Status w = store_->Writable(); !w.ok()) {
          return call.responder.Reply(w);
        }
      }
      TreeMultiReplyWriter reply(uint32_t(pairs->size()));
      FloorVersion_st();
      for (const auto& [key, value] : *pairs) {
        if (Status st = check_key(key, /*write=*/true); !st.ok()) {
          reply.AddError(st);
          continue;
        }
        auto v = t.Put(key, value);
        if (!v.ok()) {
          reply.AddError(v.status());
          continue;
        }
        NoteChanged_st(key);
        LogPut_st(key, value, *v);
        reply.AddVersion(*v);
      }
      UpdateCounters_st();
      // Once every pair applied is durable and held by the backups (one
      // wait for the batch).
      return ReplyAfter_st(std::move(call.responder), Status::OK(),
                           reply.Finish(), repl_noted_, true);
    }
    case TreeMethod::kRangeExport:
      return RangeExport_st(std::move(call));
    case TreeMethod::kRangeSync:
      return RangeSync_st(std::move(call));
    case TreeMethod::kRangeImport:
      return RangeImport_st(std::move(call));
    case TreeMethod::kRangeDrop:
      return RangeDrop_st(std::move(call));
    case TreeMethod::kReplicate:
      return Replicate_st(std::move(call));
    case TreeMethod::kRangeFill:
      return RangeFill_st(std::move(call));
    case TreeMethod::kCount:
      break;
  }
  call.responder.Reply(Status::ProtocolError("unknown tree method"));
}

namespace {

Status NotMovingAway(const cluster::Ownership& o, uint32_t r) {
  return Status::Conflict("ordered range " + std::to_string(r) +
                          " is not moving away from this server in epoch " +
                          std::to_string(o.epoch()));
}

// A range move's calls come at the epoch of the step's configuration: one
// from another epoch (a manager that lost its place, a call that outlived
// its pass) must not take the keys noted for the current copy.
Status AtEpoch(const cluster::Ownership& o, uint32_t epoch) {
  if (epoch == o.epoch()) return Status::OK();
  return Status::Conflict(
      "a range move's call at epoch " + std::to_string(epoch) +
      "; this server has installed epoch " + std::to_string(o.epoch()));
}

Status NotInCluster() {
  return Status::InvalidArgument(
      "ordered ranges move between cluster members only");
}

// Bytes of pairs in one sync reply at most (as the hash store's).
constexpr size_t kSyncReplyBytes = size_t{32} << 20;

}  // namespace

void TreeService::RangeExport_st(Call call) {
  auto req = DecodeTreeRange(call.payload);
  if (!req.ok()) return call.responder.Reply(req.status());
  // (Handle has checked InCluster.)
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  if (Status st = AtEpoch(*cluster_, call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  if (!cluster_->RangeMovingAway(req->range)) {
    return call.responder.Reply(NotMovingAway(*cluster_, req->range));
  }
  const cluster::Config& c = cluster_->current()->config;
  if ((req->flags & kRangeFirst) != 0) {
    // The export reads every key from here on; what it passes is noted
    // again when written.
    ForgetChanged_st(c, req->range);
  }
  const std::string_view start =
      req->resume.empty() ? c.RangeLow(req->range) : req->resume;
  Status st = tree_->Scan(start, c.RangeHigh(req->range), kMaxScanLimit, false,
                          &scan_page_);
  if (!st.ok()) return call.responder.Reply(st);
  RangePairsWriter w;
  for (const ScanItem& it : scan_page_.items) {
    w.Add(it.key, it.value, it.version, false);
  }
  call.responder.Reply(
      Status::OK(),
      w.Finish(scan_page_.more ? std::string_view(scan_page_.resume) : "",
               tree_->last_version(), scan_page_.more));
}

void TreeService::RangeSync_st(Call call) {
  auto req = DecodeTreeRange(call.payload);
  if (!req.ok()) return call.responder.Reply(req.status());
  // (Handle has checked InCluster.)
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  if (Status st = AtEpoch(*cluster_, call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  if (!cluster_->RangeMovingAway(req->range)) {
    return call.responder.Reply(NotMovingAway(*cluster_, req->range));
  }
  if ((req->flags & kRangeFreeze) != 0) {
    if (Status st = cluster_->FreezeRanges({req->range}); !st.ok()) {
      return call.responder.Reply(st);
    }
  }
  const cluster::Config& c = cluster_->current()->config;
  RangePairsWriter w;
  std::string value;
  bool more = false;
  for (auto it = changed_.begin(); it != changed_.end();) {
    if (c.RangeOf(*it) != req->range) {
      ++it;
      continue;
    }
    if (w.bytes() >= kSyncReplyBytes) {
      more = true;
      break;
    }
    uint64_t version = 0;
    Status st = tree_->Get(*it, &value, &version);
    if (st.ok()) {
      w.Add(*it, value, version, false);
    } else {
      // Deleted since: gone at the new owner too, whatever version it
      // holds (every version it has came from here, and is older).
      w.Add(*it, {}, tree_->last_version(), true);
    }
    it = changed_.erase(it);
  }
  std::string reply = w.Finish({}, tree_->last_version(), more);
  if ((req->flags & kRangeFreeze) != 0 && Replicating()) {
    // A hand-over to a backup (replicated): answered once the backups hold
    // every write made here, so the one taking over has each that was
    // acknowledged.
    return ReplyAfter_st(std::move(call.responder), Status::OK(),
                         std::move(reply), repl_noted_, true);
  }
  call.responder.Reply(Status::OK(), std::move(reply));
}

void TreeService::RangeImport_st(Call call) {
  auto pairs = DecodeRangePairs(call.payload);
  if (!pairs.ok()) return call.responder.Reply(pairs.status());
  // (Handle has checked InCluster.)
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  if (Status st = AtEpoch(*cluster_, call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  const cluster::Ownership::Installed* cur = cluster_->current();
  for (const RangeItem& it : pairs->items) {
    const uint32_t r = cur == nullptr ? 0 : cur->config.RangeOf(it.key);
    if (cur == nullptr || !cluster_->RangeIncoming(r)) {
      return call.responder.Reply(
          Status::Conflict("ordered range " + std::to_string(r) +
                           " is not moving to this server in epoch " +
                           std::to_string(cluster_->epoch())));
    }
  }
  BLinkTree& t = *tree_;
  // A range that would take this tree's last memory is refused whole (the
  // manager then abandons its move): this server's own ranges keep room.
  const uint64_t reserve =
      std::max<uint64_t>(2 * kNodePageBytes, region_->length() / 16);
  if (!pairs->items.empty() && t.bytes_unassigned() < reserve) {
    return call.responder.Reply(Status::OutOfMemory(
        "this server's tree cannot take the range: " +
        std::to_string(t.bytes_unassigned()) +
        " bytes of --tree-memory left, and " + std::to_string(reserve) +
        " are kept for its own ranges"));
  }
  const bool raise = pairs->max_version > t.last_version();
  if (store_ != nullptr && (raise || !pairs->items.empty())) {
    if (Status w = store_->Writable(); !w.ok()) {
      return call.responder.Reply(w);
    }
  }
  if (raise) {
    // A key moved here and written later must get a version its old owner
    // never issued (a client may hold one for compare-and-put); logged as
    // a delete of the empty key (DurableTree reads it as the version only).
    t.RaiseVersion(pairs->max_version);
    if (store_ != nullptr) store_->LogDelete({}, pairs->max_version);
  }
  Status st;
  for (const RangeItem& it : pairs->items) {
    st = Apply_st(it);
    if (!st.ok()) break;
  }
  UpdateCounters_st();
  AfterDurable_st(std::move(call.responder), std::move(st), {});
}

Status TreeService::Apply_st(const RangeItem& it) {
  if (it.deleted) {
    REMEM_RETURN_IF_ERROR(tree_->RestoreDelete(it.key, it.version));
    if (store_ != nullptr) store_->LogDelete(it.key, it.version);
  } else {
    REMEM_RETURN_IF_ERROR(tree_->Restore(it.key, it.value, it.version));
    if (store_ != nullptr) store_->LogPut(it.key, it.value, it.version);
  }
  return Status::OK();
}

void TreeService::RangeDrop_st(Call call) {
  auto req = DecodeTreeRange(call.payload);
  if (!req.ok()) return call.responder.Reply(req.status());
  const uint32_t r = req->range;
  // (Handle has checked InCluster.)
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  if (Status st = AtEpoch(*cluster_, call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  if ((req->flags & kRangeRelease) != 0) {
    // Readers are refused before the copy goes: the serving mark stops
    // vouching, and the server, asked, says Busy. The range's writes wait
    // for the next configuration, not for the deletes: they go on after
    // the reply, a page per pass of this thread (OnPass).
    if (Status st = cluster_->ReleaseRanges({r}); !st.ok()) {
      return call.responder.Reply(st);
    }
    const cluster::Config& c = cluster_->current()->config;
    ForgetChanged_st(c, r);
    call.responder.Reply(Status::OK());
    return DeleteLater_st(r, std::string(c.RangeLow(r)));
  }
  if ((req->flags & kRangeForFill) != 0) {
    const cluster::Ownership::Installed* c = cluster_->current();
    if (c == nullptr || r >= c->config.num_ranges() ||
        !cluster::Ownership::FillsRange(*c, r)) {
      return call.responder.Reply(
          Status::Conflict("ordered range " + std::to_string(r) +
                           " is not being filled here in epoch " +
                           std::to_string(cluster_->epoch())));
    }
  } else if (!cluster_->RangeIncoming(r)) {
    return call.responder.Reply(
        Status::Conflict("ordered range " + std::to_string(r) +
                         " is not moving to this server in epoch " +
                         std::to_string(cluster_->epoch())));
  }
  // A page per pass (EmptyStep_st): the range may hold millions of pairs,
  // and every request to the tree waits for this thread.
  auto it = emptying_.find(r);
  if (it != emptying_.end() && it->second.epoch != call.epoch) {
    EndEmptying_st(r, Status::Conflict("another drop of ordered range " +
                                       std::to_string(r) +
                                       " came before this one was over"));
    it = emptying_.end();
  }
  if (it == emptying_.end()) {
    const cluster::Config& c = cluster_->current()->config;
    ForgetChanged_st(c, r);
    it = emptying_.emplace(r, RangeEmptying{}).first;
    it->second.epoch = call.epoch;
    it->second.cursor = std::string(c.RangeLow(r));
  }
  it->second.waiters.push_back(std::move(call.responder));
}

size_t TreeService::EmptyStep_st() {
  auto it = emptying_.begin();
  const uint32_t r = it->first;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->config.epoch != it->second.epoch) {
    // The roles may have changed: the manager drops again at the new epoch
    // if the copy is still to be made.
    EndEmptying_st(
        r, Status::Conflict("the configuration changed during the drop"));
    return 1;
  }
  constexpr uint32_t kPage = 1024;
  RangeEmptying& e = it->second;
  bool more = false;
  const uint64_t before = e.deleted;
  Status st = DeletePage_st(&e.cursor, c->config.RangeHigh(r), kPage, &more,
                            &e.deleted);
  emptied_pairs_.Add(e.deleted - before);
  if (!st.ok() || !more) EndEmptying_st(r, std::move(st));
  return 1;
}

void TreeService::EndEmptying_st(uint32_t r, Status status) {
  auto node = emptying_.extract(r);
  RangeEmptying& e = node.mapped();
  UpdateCounters_st();
  for (server::Responder& w : e.waiters) {
    if (!status.ok() || e.deleted == 0) {
      w.Reply(status);
    } else {
      AfterDurable_st(std::move(w), status, {});
    }
  }
}

void TreeService::ForgetChanged_st(const cluster::Config& c, uint32_t r) {
  if (changed_.empty()) return;
  std::erase_if(changed_,
                [&](const std::string& k) { return c.RangeOf(k) == r; });
}

Status TreeService::DeletePage_st(std::string* from, std::string_view upper,
                                  uint32_t limit, bool* more,
                                  uint64_t* deleted) {
  *more = false;
  REMEM_RETURN_IF_ERROR(tree_->Scan(*from, upper, limit, false, &scan_page_));
  if (scan_page_.items.empty()) return Status::OK();
  if (store_ != nullptr) REMEM_RETURN_IF_ERROR(store_->Writable());
  for (const ScanItem& it : scan_page_.items) {
    REMEM_RETURN_IF_ERROR(tree_->Delete(it.key));
    ++*deleted;
    if (store_ != nullptr) store_->LogDelete(it.key, tree_->last_version());
  }
  *more = scan_page_.more;
  *from = scan_page_.resume;
  return Status::OK();
}

size_t TreeService::OnPass(PartitionId p) {
  if (p != 0 || cluster_ == nullptr) return 0;
  if (!purged_) {
    if (cluster_->pending() == nullptr) return 0;  // no configuration yet
    PurgeRanges_st();
    return 1;
  }
  FillStep_st();
  ShipBatch_st();
  // Every record noted is held: so is every version issued.
  if (!repl_batch_ && !repl_in_flight_ && Replicating()) {
    PublishReplicated_st(tree_->last_version());
  }
  size_t work = emptying_.empty() ? 0 : EmptyStep_st();
  if (!deleting_.empty()) work += DeleteStep_st();
  return work;
}

void TreeService::PurgeRanges_st() {
  const cluster::Ownership::Installed& c = *cluster_->pending();
  uint64_t deleted = 0;
  Status st;
  for (uint32_t r = 0; r < c.config.num_ranges() && st.ok(); ++r) {
    // Replicated: and what a previous incarnation held, until a
    // configuration naming this one says (the whole cluster restarted:
    // those copies may be the last ones).
    if (cluster::Ownership::MayKeepRange(c, r) ||
        cluster::Ownership::RangeHeldByPrior(c, r)) {
      continue;
    }
    std::string cursor(c.config.RangeLow(r));
    for (bool more = true; more && st.ok();) {
      st = DeletePage_st(&cursor, c.config.RangeHigh(r), kMaxScanLimit, &more,
                         &deleted);
    }
  }
  if (!st.ok()) {
    log::Warn("tree: deleting ranges epoch {} does not give this server: {}",
              c.config.epoch, st.ToString());
  } else if (deleted > 0) {
    log::Info(
        "cluster: deleted {} ordered pairs of ranges that epoch {} does not "
        "give this server",
        deleted, c.config.epoch);
  }
  UpdateCounters_st();
  purged_ = true;
  cluster_->PurgeDone();
}

void TreeService::SettleRanges_st(const cluster::Ownership::Installed& c) {
  // Before the purge, the purge judges; a configuration installed before
  // it that is not served yet is settled by it. One that does not name
  // this incarnation yet (replicated) judges nothing of what it kept.
  if (!purged_ || (c.self < 0 && c.prior >= 0)) return;
  // Keys noted for a range that no longer moves away (the move abandoned
  // or done) are no one's to send.
  if (!changed_.empty()) {
    std::erase_if(changed_, [&](const std::string& k) {
      return c.range_outgoing.empty() ||
             c.range_outgoing[c.config.RangeOf(k)] == 0;
    });
  }
  for (uint32_t r = 0; r < c.config.num_ranges(); ++r) {
    if (cluster::Ownership::MayKeepRange(c, r)) continue;
    const std::string_view low = c.config.RangeLow(r);
    if (!tree_->Scan(low, c.config.RangeHigh(r), 1, false, &scan_page_).ok() ||
        scan_page_.items.empty()) {
      continue;
    }
    DeleteLater_st(r, std::string(low));
  }
}

void TreeService::DeleteLater_st(uint32_t r, std::string from) {
  deleting_.insert_or_assign(r, std::move(from));
}

size_t TreeService::DeleteStep_st() {
  auto it = deleting_.begin();
  const uint32_t r = it->first;
  // Gone no more (a move brings it back: its first RangeDrop deletes the
  // rest): stop.
  if (!cluster_->RangeGone(r)) {
    deleting_.erase(it);
    return 1;
  }
  constexpr uint32_t kPage = 1024;
  bool more = false;
  uint64_t deleted = 0;
  Status st =
      DeletePage_st(&it->second, cluster_->current()->config.RangeHigh(r),
                    kPage, &more, &deleted);
  UpdateCounters_st();
  if (!st.ok()) {
    // Left in memory, unreachable; the next settle or purge tries again.
    log::Warn("tree: deleting range {}, which is not this server's: {}", r,
              st.ToString());
  }
  if (!st.ok() || !more) deleting_.erase(it);
  return 1;
}

// --- replication (a replicated cluster: ranges ride carrier shards,
// cluster/config.h)

bool TreeService::Replicating() const {
  return replicator_ != nullptr && cluster_ != nullptr &&
         cluster_->replicated();
}

void TreeService::FloorVersion_st() {
  if (cluster_ == nullptr) return;
  Resync_st();
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || !c->replicated || c->config.epoch <= floor_epoch_) {
    return;
  }
  floor_epoch_ = c->config.epoch;
  tree_->RaiseVersion(hash::VersionFloor(c->config.epoch) - 1);
}

void TreeService::LogPut_st(std::string_view key, std::string_view value,
                            uint64_t version) {
  if (store_ != nullptr) store_->LogPut(key, value, version);
  NoteRecord_st(key, value, version, false);
}

void TreeService::LogDelete_st(std::string_view key, uint64_t version) {
  if (store_ != nullptr) store_->LogDelete(key, version);
  NoteRecord_st(key, {}, version, true);
}

void TreeService::NoteRecord_st(std::string_view key, std::string_view value,
                                uint64_t version, bool deleted) {
  if (!Replicating()) return;
  if (!repl_batch_) repl_batch_ = std::make_unique<RangePairsWriter>();
  repl_batch_->Add(key, value, version, deleted);
  const uint32_t r = cluster_->current()->config.RangeOf(key);
  ++repl_noted_;
  repl_dirty_.insert_or_assign(std::string(key), repl_noted_);
  if (range_dirty_.size() <= r) range_dirty_.resize(r + 1, 0);
  range_dirty_[r] = repl_noted_;
  if (repl_ranges_.size() <= r) repl_ranges_.resize(r + 1, 0);
  repl_ranges_[r] = 1;
}

uint64_t TreeService::DirtyUpTo_st(std::string_view key) {
  Resync_st();
  if (repl_dirty_.empty()) return 0;
  auto it = repl_dirty_.find(std::string(key));
  return it == repl_dirty_.end() ? 0 : it->second;
}

uint64_t TreeService::RangeDirtyUpTo_st(uint32_t r) {
  Resync_st();
  return r < range_dirty_.size() ? range_dirty_[r] : 0;
}

void TreeService::Resync_st() {
  if (!Replicating()) return;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->config.epoch <= resync_epoch_) return;
  resync_epoch_ = c->config.epoch;
  resync_report_ = c->config.epoch;
  const uint32_t n = c->config.num_ranges();
  std::vector<uint8_t> owned(n, 0);
  for (uint32_t r = 0; r < n && c->self >= 0; ++r) {
    owned[r] = c->config.range_owner[r] == uint16_t(c->self) ? 1 : 0;
  }
  if (resync_owned_.size() != n) resync_owned_.assign(n, 0);
  std::unordered_set<std::string_view> sent;
  for (const auto& [sender, kept] : retained_) {
    for (uint32_t i : kept.items) {
      const std::string_view key = kept.batch->pairs.items[i].key;
      const uint32_t r = c->config.RangeOf(key);
      if (owned[r] == 0 || resync_owned_[r] != 0 || !sent.insert(key).second) {
        continue;
      }
      // As it stands here now: this member's own writes since and the dead
      // primary's records agree on it.
      std::string value;
      uint64_t version = 0;
      Status got = tree_->Get(key, &value, &version);
      if (got.ok()) {
        NoteRecord_st(key, value, version, false);
      } else if (got.code() == StatusCode::kNotFound) {
        NoteRecord_st(key, {}, tree_->last_version(), true);
      } else {
        log::Warn("tree: resync of a promoted range's key: {}", got.ToString());
        continue;
      }
      resync_upto_ = repl_noted_;
      resync_records_.Add(1);
    }
  }
  // Streams of senders no longer in the cluster are done with.
  std::erase_if(retained_, [c](const auto& kv) {
    return std::none_of(
        c->config.members.begin(), c->config.members.end(),
        [&](const cluster::Member& m) { return m.incarnation == kv.first; });
  });
  resync_owned_ = std::move(owned);
  ReportResync_st();
}

void TreeService::ReportResync_st() {
  if (resync_report_ == 0 || repl_done_ < resync_upto_) return;
  cluster_->ResyncDone(resync_report_);
  resync_report_ = 0;
}

void TreeService::ReplyAfter_st(server::Responder responder, Status status,
                                std::string payload, uint64_t upto,
                                bool wrote) {
  auto reply = [this, wrote](server::Responder responder, Status status,
                             std::string payload) {
    if (wrote) {
      return AfterDurable_st(std::move(responder), std::move(status),
                             std::move(payload));
    }
    // A read: only while this member may still vouch for what it holds.
    if (cluster_ != nullptr) {
      if (Status lease = cluster_->Leased(); !lease.ok()) {
        return responder.Reply(lease);
      }
    }
    responder.Reply(std::move(status), std::move(payload));
  };
  if (upto <= repl_done_) {
    return reply(std::move(responder), std::move(status), std::move(payload));
  }
  repl_waiters_.emplace_back(
      upto,
      [reply, responder = std::move(responder), status = std::move(status),
       payload = std::move(payload)](Status held) mutable {
        if (!held.ok()) return responder.Reply(held);
        reply(std::move(responder), std::move(status), std::move(payload));
      });
}

void TreeService::ShipBatch_st() {
  // One batch in flight: a key's records reach a backup in order.
  if (repl_in_flight_ || !repl_batch_) return;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr) return;
  std::vector<uint32_t> shards;
  for (uint32_t r = 0; r < repl_ranges_.size(); ++r) {
    if (repl_ranges_[r] != 0) shards.push_back(c->config.CarrierOf(r));
  }
  std::sort(shards.begin(), shards.end());
  shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  repl_ranges_.assign(repl_ranges_.size(), 0);
  std::unique_ptr<RangePairsWriter> batch = std::move(repl_batch_);
  repl_batches_.Add();
  repl_records_.Add(batch->count());
  repl_in_flight_ = true;
  const uint64_t upto = repl_noted_;
  // With the tree's highest version: a backup promoted later issues
  // versions above every one issued here. Every record of a version up to
  // it was noted before this send (one thread), so once the batch is held
  // the mark's replicated half may say so.
  const uint64_t sent = tree_->last_version();
  replicator_->Replicate(
      batch->Finish({}, sent, false, cluster_->incarnation()),
      std::move(shards), {kTreeService, MethodId(TreeMethod::kReplicate)},
      [this, upto, sent](Status st) {
        ctx_->RunOn(0, [this, upto, sent, st = std::move(st)]() mutable {
          Replicated_st(upto, sent, std::move(st));
        });
      });
}

void TreeService::Replicated_st(uint64_t upto, uint64_t sent, Status status) {
  repl_in_flight_ = false;
  repl_done_ = upto;
  // Also when it failed: the replicator gives a batch up only when a
  // carrier shard of it was taken from this server, whose ranges then are
  // no longer its to vouch for (the range serving word changed when that
  // configuration was installed); the backups held the others.
  PublishReplicated_st(sent);
  ReportResync_st();
  if (!status.ok()) {
    for (auto& [r, fill] : fills_) {
      if (fill.failed.ok()) fill.failed = status;
    }
  }
  std::erase_if(repl_dirty_,
                [upto](const auto& kv) { return kv.second <= upto; });
  while (!repl_waiters_.empty() && repl_waiters_.front().first <= upto) {
    auto done = std::move(repl_waiters_.front().second);
    repl_waiters_.pop_front();
    done(status);
  }
  ShipBatch_st();
}

void TreeService::Replicate_st(Call call) {
  // Decoded where it stays: the batch is kept for Resync_st.
  auto batch = std::make_shared<ReplicaBatch>();
  batch->payload = std::move(call.payload);
  auto decoded = DecodeRangePairs(batch->payload);
  if (!decoded.ok()) return call.responder.Reply(decoded.status());
  batch->pairs = std::move(*decoded);
  const RangePairs* pairs = &batch->pairs;
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  // Admitted and applied in one step on this thread: no configuration
  // installed between them.
  auto c = cluster_->AdmitsReplication(call.epoch);
  if (!c.ok()) return call.responder.Reply(c.status());
  const cluster::Ownership::Installed& at = **c;
  BLinkTree& t = *tree_;
  if (store_ != nullptr) {
    if (Status w = store_->Writable(); !w.ok()) {
      // Not held here: the primary asks again (its writes wait).
      return call.responder.Reply(w);
    }
  }
  if (pairs->max_version > t.last_version()) {
    // A key written here once promoted must get a version the primary
    // never issued (a client may hold one for compare-and-put).
    t.RaiseVersion(pairs->max_version);
    if (store_ != nullptr) store_->LogDelete({}, pairs->max_version);
  }
  Status st;
  // This stream's previous batch is held by every backup now (one batch in
  // flight): only this one's records may be missing elsewhere.
  Retained& kept = retained_[pairs->sender];
  kept.batch = batch;
  kept.items.clear();
  for (uint32_t i = 0; i < pairs->items.size(); ++i) {
    const RangeItem& it = pairs->items[i];
    const uint32_t r = at.config.RangeOf(it.key);
    // A range of the batch this member does not back up; a copy's pair
    // that a backup already whole has.
    if (!cluster::Ownership::BacksUpRange(at, r) ||
        (it.fill && !cluster::Ownership::FillsRange(at, r))) {
      continue;
    }
    st = Apply_st(it);
    if (!st.ok()) break;
    // A copy's pair is on the primary's every ready backup already.
    if (!it.fill) kept.items.push_back(i);
  }
  UpdateCounters_st();
  // Held once in memory (FaRM): the log follows at its own pace.
  call.responder.Reply(st);
}

void TreeService::RangeFill_st(Call call) {
  auto req = DecodeTreeRange(call.payload);
  if (!req.ok()) return call.responder.Reply(req.status());
  if (cluster_ == nullptr) return call.responder.Reply(NotInCluster());
  if (!Replicating()) {
    return call.responder.Reply(
        Status::Unsupported("this cluster does not replicate"));
  }
  if (Status st = AtEpoch(*cluster_, call.epoch); !st.ok()) {
    return call.responder.Reply(st);
  }
  const cluster::Ownership::Installed& c = *cluster_->current();
  const uint32_t r = req->range;
  if (r >= c.config.num_ranges() || c.self < 0 ||
      c.config.range_owner[r] != uint16_t(c.self)) {
    return call.responder.Reply(Status::Conflict(
        "ordered range " + std::to_string(r) +
        " is not this server's in epoch " + std::to_string(c.config.epoch)));
  }
  RangeFill& fill = fills_[r];
  if (fill.epoch != call.epoch) {
    // Started now: every write from here on follows in the stream.
    fill = RangeFill{};
    fill.epoch = call.epoch;
    fill.cursor = std::string(c.config.RangeLow(r));
    fill.upto = repl_noted_;
  }
  if (!fill.failed.ok()) return call.responder.Reply(fill.failed);
  call.responder.Reply(
      Status::OK(), EncodeTreeRangeFillReply(
                        {fill.scanned && repl_done_ >= fill.upto, fill.sent}));
}

// A copy's pairs per batch (as the hash store's kFillBatchBytes).
constexpr size_t kFillBatchBytes = 32u << 10;

void TreeService::FillStep_st() {
  if (fills_.empty()) return;
  const cluster::Ownership::Installed* c = cluster_->current();
  // Roles changed: the manager starts another copy.
  std::erase_if(fills_, [c](const auto& kv) {
    return c == nullptr || kv.second.epoch != c->config.epoch;
  });
  if (repl_in_flight_ || fills_.empty()) return;
  for (auto& [r, fill] : fills_) {
    if (fill.scanned || !fill.failed.ok()) continue;
    if (!repl_batch_) repl_batch_ = std::make_unique<RangePairsWriter>();
    while (!fill.scanned && repl_batch_->bytes() < kFillBatchBytes) {
      Status st = tree_->Scan(fill.cursor, c->config.RangeHigh(r), 64, false,
                              &scan_page_);
      if (!st.ok()) {
        fill.failed = st;
        break;
      }
      for (const ScanItem& it : scan_page_.items) {
        repl_batch_->AddFill(it.key, it.value, it.version);
        ++repl_noted_;
      }
      fill.sent += scan_page_.items.size();
      fill_pairs_.Add(scan_page_.items.size());
      if (!scan_page_.items.empty()) {
        if (repl_ranges_.size() <= r) repl_ranges_.resize(r + 1, 0);
        repl_ranges_[r] = 1;
      }
      fill.upto = repl_noted_;
      fill.scanned = !scan_page_.more;
      fill.cursor = scan_page_.resume;
    }
    if (repl_batch_->count() == 0) repl_batch_.reset();
    if (repl_batch_ && repl_batch_->bytes() >= kFillBatchBytes) break;
  }
}

}  // namespace remem::tree
