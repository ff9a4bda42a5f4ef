#include "hash/service.h"

#include <xxhash.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "cluster/ownership.h"
#include "cluster/replicator.h"
#include "durability/durability.h"
#include "fabric/memory_region.h"
#include "hash/codec.h"
#include "hash/shard_export.h"
#include "util/log.h"

namespace remem::hash {

using server::Call;
using server::PartitionId;
using server::Responder;
using server::Route;

HashService::~HashService() {
  // Stores hold pointers into the partitions; the durability layer outlives
  // nothing here, but a store must not reach a destroyed table.
  for (auto& p : partitions_) {
    if (p && p->table) p->table->SetMoveHook(nullptr);
  }
}

namespace {

// A reply holds at most kMaxMultiReplyBytes: the results that would pass
// it and may be asked again (`deferrable(i)`) are answered Busy instead,
// to be asked again (libremem does), all but the first item, so every
// reply answers at least one. `Header` is the wire struct before each
// item's data.
template <typename Header, typename Item, typename Deferrable>
void CapReply(std::vector<Item>* results, Deferrable deferrable) {
  uint64_t bytes = sizeof(HashMultiReply);
  for (size_t i = 0; i < results->size(); ++i) {
    Item& it = (*results)[i];
    if (i > 0 && deferrable(i) && it.status.ok() &&
        bytes + sizeof(Header) + it.data.size() > kMaxMultiReplyBytes) {
      it.data.clear();
      it.version = 0;
      it.status = Status::Busy(kMultiReplyFull);
    }
    bytes += sizeof(Header) +
             (it.status.ok() ? it.data.size() : it.status.message().size());
  }
}

// A multi reply's gets may be deferred.
void CapMultiReply(const std::vector<MultiOp>& ops,
                   std::vector<MultiItem>* results) {
  CapReply<HashMultiItem>(
      results, [&](size_t i) { return ops[i].op == MultiOpKind::kGet; });
}

// An OpBatch's reductions and filters may; a write's result never: it took
// effect, and its result must reach the client.
void CapOpBatchReply(const std::vector<ops::OpView>& ops,
                     std::vector<OpItem>* results) {
  CapReply<HashOpItem>(results,
                       [&](size_t i) { return !ops::MayWrite(ops[i].kind); });
}

// The first error among the partitions' outcomes, or OK.
Status FirstError(const std::vector<Status>& all) {
  for (const Status& st : all) {
    if (!st.ok()) return st;
  }
  return Status::OK();
}

// Whether an item's result `r` is replaced by its partition's commit
// failing (the log or the backups). Replicated, every result read from the
// table goes with the replication of what it read: success or not
// (NotFound, Conflict, a value of the wrong shape...), all but a refusal
// made before reading (Moved, Busy). Otherwise only a write's success
// goes with its log.
bool FailsWithItsCommit(const Status& r, bool replicated, bool wrote) {
  if (replicated) {
    return r.code() != StatusCode::kMoved && r.code() != StatusCode::kBusy;
  }
  return wrote && r.ok();
}

}  // namespace

void HashService::DeclareOptions(server::OptionSet* o) {
  o->AddSize("--hash-memory", &options_.memory,
             "of --memory, bytes for the hash store (one partition per "
             "thread; default half); the rest is raw regions");
  o->AddUint("--max-key-bytes", &options_.max_key_bytes,
             "largest hash store key accepted (at most 64 KiB)");
  o->AddUint("--max-value-bytes", &options_.max_value_bytes,
             "largest hash store value accepted (at most 16 MiB)");
  o->AddUint("--hash-initial-buckets", &options_.initial_buckets,
             "buckets each hash partition starts with (a power of two; "
             "tables double as they fill)",
             /*testing=*/true);
  o->AddStrings("--ops-library", &options_.ops_libraries,
                "a shared library of user-defined update functions and "
                "reductions "
                "(remem/ops_plugin.h) to load at start; repeatable. One that "
                "cannot be loaded stops the server");
  o->AddUint("--shard-sync-bytes", &options_.shard_sync_bytes,
             "testing: bytes of pairs per reply of the changes of moving "
             "shards (at least one pair per reply)",
             /*testing=*/true);
  o->AddUint("--fill-scan-buckets", &options_.fill_scan_buckets,
             "testing: buckets a copy to a backup being filled scans per "
             "batch at most, and that a partition goes through per pass as it "
             "deletes the pairs of shards before a copy comes in, or of "
             "shards it has no role for any more (at least one)",
             /*testing=*/true);
  o->AddUint("--fault-pause-mid-write-us", &options_.fault_pause_mid_write_us,
             "testing: pause every hash bucket write half done for this many "
             "microseconds (readers see the torn bucket)",
             /*testing=*/true);
  o->AddUint("--fault-replica-delete-delay-ms",
             &options_.fault_replica_delete_delay_ms,
             "testing: as a backup, apply each replication batch that deletes "
             "a pair this long after admitting it",
             /*testing=*/true);
  o->AddUint("--fault-discard-delay-ms", &options_.fault_discard_delay_ms,
             "testing: start deleting the pairs of shards this server has no "
             "role for any more this long after the last shard was added",
             /*testing=*/true);
}

Status HashService::Init(server::ServiceContext* ctx) {
  ctx_ = ctx;
  cluster_ = ctx->cluster();
  replicator_ = ctx->replicator();
  const uint32_t n = ctx->partitions();
  uint64_t memory = options_.memory;
  if (memory == 0) memory = ctx->memory_budget() / 2;
  if (memory >= ctx->memory_budget()) {
    return Status::InvalidArgument("--hash-memory must be less than --memory");
  }
  if (memory / n < (2ull << 20)) {
    if (options_.memory == 0) {
      // Half of --memory by default: name the flag the user gave.
      return Status::InvalidArgument(
          "--memory is too small for " + std::to_string(n) + " server thread" +
          (n == 1 ? "" : "s") +
          ": the hash store takes half of it and needs at least 2 MiB per "
          "thread, so --memory must be at least " +
          std::to_string(4 * n) + " MiB");
    }
    return Status::InvalidArgument(
        "the hash store needs at least 2 MiB per server thread "
        "(--hash-memory)");
  }
  const uint64_t b = options_.initial_buckets;
  if (b < 2 || (b & (b - 1)) != 0 || b > (1ull << 30)) {
    return Status::InvalidArgument(
        "--hash-initial-buckets must be a power of two in [2, 2^30]");
  }
  Limits limits;
  if (options_.max_key_bytes < 1 || options_.max_key_bytes > limits.max_key) {
    return Status::InvalidArgument("--max-key-bytes must be in [1, " +
                                   std::to_string(limits.max_key) + "]");
  }
  if (options_.max_value_bytes > limits.max_value) {
    return Status::InvalidArgument("--max-value-bytes must be at most " +
                                   std::to_string(limits.max_value));
  }
  limits.max_key = uint32_t(options_.max_key_bytes);
  limits.max_value = uint32_t(options_.max_value_bytes);
  for (const std::string& path : options_.ops_libraries) {
    REMEM_RETURN_IF_ERROR(functions_.Load(path));
  }
  if (!options_.ops_libraries.empty()) {
    std::string listing;
    for (const std::string& f : functions_.Describe()) {
      listing += (listing.empty() ? "" : ", ") + f;
    }
    log::Info("server-side functions (id:name): {}", listing);
  }

  std::random_device rd;
  partition_seed_ = (uint64_t{rd()} << 32) | rd();
  durability::Durability* durable = ctx->durability();
  if (durable != nullptr) {
    // Keys must land in the same partitions as before a restart.
    auto meta = durable->ReadServiceMeta(name());
    if (!meta.ok()) return meta.status();
    if (meta->has_value()) {
      std::istringstream in(**meta);
      std::string word;
      if (!(in >> word >> partition_seed_) || word != "seed") {
        return Status::Corruption(
            "hash/meta in the data directory is "
            "unreadable");
      }
    } else {
      REMEM_RETURN_IF_ERROR(durable->WriteServiceMeta(
          name(), "seed " + std::to_string(partition_seed_) + "\n"));
    }
  }

  const uint64_t per = (memory / n) & ~uint64_t{kExtentAlign - 1};
  ctx->NameMemory("--hash-memory", per * n, options_.memory == 0);
  for (uint32_t i = 0; i < n; ++i) {
    auto region = ctx->AllocateRegion(per, proto::RegionAccess::kReadOnly);
    if (!region.ok()) return region.status();
    // The root first; the rest is the arena for bucket arrays (the table
    // starts small and doubles as it fills) and extents.
    auto part = std::make_unique<Partition>();
    part->region = *region;
    part->slab = std::make_unique<SlabAllocator>(
        part->region->base() + kArenaOffset, per - kArenaOffset, kArenaOffset);
    TableOptions to;
    to.seed = (uint64_t{rd()} << 32) | rd();
    to.initial_buckets = options_.initial_buckets;
    to.limits = limits;
    auto table =
        Table::Create(part->region->base(), uint16_t(part->region->id()),
                      part->slab.get(), to);
    if (!table.ok()) {
      // The only table that cannot be made in a valid partition is one
      // whose first bucket array does not fit: say which flag asked for it.
      if (table.status().code() == StatusCode::kOutOfMemory) {
        return Status::InvalidArgument(
            "--hash-initial-buckets " +
            std::to_string(options_.initial_buckets) + " (" +
            std::to_string(options_.initial_buckets * kBucketBytes) +
            " bytes of buckets) does not fit a partition of " +
            std::to_string(per) + " bytes (--hash-memory / --threads)");
      }
      return table.status();
    }
    part->table = std::move(*table);
    if (options_.fault_pause_mid_write_us > 0) {
      const auto pause =
          std::chrono::microseconds(options_.fault_pause_mid_write_us);
      // Fault injection (tests): hold every bucket write half done.
      part->table->SetMidWriteHook(
          [pause] { std::this_thread::sleep_for(pause); });
    }
    part->durable = std::make_unique<DurableTable>(part->table.get());
    if (cluster_ != nullptr) {
      // A shard moving away: its keys that change during the copy are sent
      // again (HandleShardSync).
      Partition* raw = part.get();
      part->table->SetChangeHook(
          [this, raw](std::string_view key, uint64_t from, uint64_t to) {
            // The sweeps of a copy and of an emptying catch what cuckoo
            // moves carry behind them.
            if (raw->fill.sweep) raw->fill.sweep->OnChange(key, from, to);
            if (raw->emptying.sweep) {
              raw->emptying.sweep->OnChange(key, from, to);
            }
            if (raw->discard.sweep) {
              raw->discard.sweep->OnChange(key, from, to);
            }
            if (raw->purging) return;
            if (cluster_->Outgoing(key)) raw->changed.emplace(key);
          });
    }
    partitions_.push_back(std::move(part));
  }
  if (durable != nullptr) {
    // Recover the partitions in parallel, each into its own table.
    REMEM_RETURN_IF_ERROR(ctx->ForEachPartition([&](PartitionId p) -> Status {
      auto store =
          durable->OpenPartition(name(), p, partitions_[p]->durable.get());
      if (store.status().code() == StatusCode::kOutOfMemory) {
        // Nothing on disk changed: a larger partition takes it all.
        return Status::OutOfMemory(store.status().message() +
                                   " (restart with a larger --hash-memory or "
                                   "--memory, and the same --threads: the "
                                   "data directory is unchanged)");
      }
      if (!store.ok()) return store.status();
      partitions_[p]->store = *store;
      return Status::OK();
    }));
  }
  HashInfo info;
  info.max_key = limits.max_key;
  info.max_value = limits.max_value;
  info.partition_seed = partition_seed_;
  for (auto& part : partitions_) {
    UpdateCounters_st(*part);
    // After recovery: the table may have grown.
    const Geometry& g = part->table->geometry();
    info.partitions.push_back(
        {g.region, 0, g.root_offset, g.buckets_offset, g.num_buckets, g.seed});
  }
  info_ = EncodeHashInfo(info);
  for (auto& part : partitions_) {
    PublishMarkHalf(*part, offsetof(ServingMark, serving), 0, kServingHalf);
    PublishMarkHalf(*part, offsetof(ServingMark, replicated), 0,
                    kReplicatedHalf);
  }
  if (cluster_ != nullptr) {
    // One-sided readers in a cluster check the serving word after each
    // pair (layout.h, "Serving mark"); it changes inside Ownership's
    // Install, Freeze and Release, before they return. (The server
    // destroys its Ownership, and whatever installs configurations, before
    // its services: the listener never outlives this.)
    cluster_->SetServingListener([this](uint64_t word) {
      for (auto& part : partitions_) {
        PublishMarkHalf(*part, offsetof(ServingMark, serving), word,
                        kServingHalf);
      }
    });
  }
  if (cluster_ != nullptr) {
    // Configurations are installed rarely: every partition settles what it
    // keeps after each, in the order installed (a pass over the shards; a
    // scan of its table only when a shard lost its role here).
    cluster_->AddInstallListener(
        [this](const cluster::Ownership::Installed& c) {
          for (PartitionId p = 0; p < partitions_.size(); ++p) {
            ctx_->RunOn(p, [this, p, &c] {
              SettleShards_st(p, c);
              Resync_st(*partitions_[p]);
            });
          }
        });
  }
  // Each partition deletes what the first configuration does not give this
  // server before it is served (PurgeUnowned_st).
  if (cluster_ != nullptr) cluster_->RequirePurge(uint32_t(partitions_.size()));
  // And, replicated, sends on what a promotion may hold alone (Resync_st).
  if (replicator_ != nullptr) {
    cluster_->RequireResync(uint32_t(partitions_.size()));
  }
  return Status::OK();
}

Status HashService::Owned(std::string_view key) const {
  return cluster_ == nullptr ? Status::OK() : cluster_->Owns(key);
}

Status HashService::Readable(std::string_view key, uint32_t flags,
                             Partition* part) const {
  if (cluster_ == nullptr) return Status::OK();
  if ((flags & kHashReadAnyReplica) == 0) return cluster_->Owns(key);
  bool as_backup = false;
  Status st = cluster_->ReplicaReadable(key, &as_backup);
  if (as_backup && part != nullptr) part->backup_gets.Add();
  return st;
}

void HashService::FloorVersions_st(Partition& part) {
  if (cluster_ == nullptr) return;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || !c->replicated || c->config.epoch <= part.floor_epoch) {
    return;
  }
  part.floor_epoch = c->config.epoch;
  part.table->RaiseVersion(VersionFloor(c->config.epoch) - 1);
}

Status HashService::Writable(std::string_view key) const {
  return cluster_ == nullptr ? Status::OK() : cluster_->Writable(key);
}

uint32_t HashService::PartitionOf(std::string_view key) const {
  return uint32_t(
      XXH3_64bits_withSeed(key.data(), key.size(), partition_seed_) %
      partitions_.size());
}

void HashService::UpdateCounters_st(Partition& part) {
  part.pairs.Set(part.table->size());
  part.growths.Set(part.table->growths());
  // What writes can no longer take: the memory set aside at a restart
  // (SlabAllocator::Withhold) is as used as what was carved.
  part.bytes_used.Set(
      std::min(part.slab->capacity(),
               part.slab->bytes_carved() + part.slab->withheld()));
  part.discard_shards.Set(part.discard.count);
}

void HashService::Stats(server::StatsBuilder* out) const {
  uint64_t pairs = 0, growths = 0, used = 0, total = 0;
  for (const auto& p : partitions_) {
    pairs += p->pairs.Get();
    growths += p->growths.Get();
    used += p->bytes_used.Get();
    total += p->region->length();
  }
  out->Add("hash_pairs", pairs);
  out->Add("hash_growths", growths);
  out->Add("hash_bytes_used", used);
  out->Add("hash_bytes_total", total);
  uint64_t ops = 0, op_writes = 0;
  for (const auto& p : partitions_) {
    ops += p->ops.Get();
    op_writes += p->op_writes.Get();
  }
  out->Add("hash_ops", ops);
  out->Add("hash_op_writes", op_writes);
  out->Add("hash_op_functions", functions_.size());
  if (cluster_ != nullptr) {
    uint64_t fill_pairs = 0, held = 0, refused = 0, backup_gets = 0,
             resynced = 0, emptied = 0, discard_shards = 0, discarded = 0;
    for (const auto& p : partitions_) {
      discard_shards += p->discard_shards.Get();
      discarded += p->discarded_pairs.Get();
      fill_pairs += p->fill_pairs.Get();
      emptied += p->emptied_pairs.Get();
      held += p->applies_held.Get();
      refused += p->replica_refused.Get();
      backup_gets += p->backup_gets.Get();
      resynced += p->resync_records.Get();
    }
    out->Add("hash_fill_pairs", fill_pairs);
    // Shards (summed over the partitions) whose pairs are still being
    // deleted because this server has no role for them any more, and the
    // pairs deleted so (Discard).
    out->Add("hash_discard_shards", discard_shards);
    out->Add("hash_discarded_pairs", discarded);
    // As a backup about to be filled: pairs it held of the shards before,
    // deleted first (EmptyStep_st).
    out->Add("hash_fill_dropped_pairs", emptied);
    // As a backup: batches refused when applied (the configuration changed
    // since they were admitted), and applies held (testing).
    out->Add("hash_replica_refused", refused);
    out->Add("hash_replica_applies_held", held);
    // Gets answered from this server's copies as a backup (reads from any
    // replica, remem/cluster.h ReadFrom::kAnyReplica).
    out->Add("hash_backup_gets", backup_gets);
    // Records a promotion sent on to the other backups before serving them
    // (Resync_st).
    out->Add("hash_resync_records", resynced);
  }
}

Result<Route> HashService::RouteCall(uint8_t method,
                                     std::string_view payload) const {
  switch (static_cast<HashMethod>(method)) {
    case HashMethod::kInfo:
    case HashMethod::kMultiGet:
    case HashMethod::kMultiPut:
    case HashMethod::kMultiOp:
    case HashMethod::kOpBatch:
      return Route::Here();
    case HashMethod::kOp: {
      auto op = DecodeHashOp(payload);
      if (!op.ok()) return op.status();
      if (op->key.empty()) return Status::InvalidArgument("empty key");
      REMEM_RETURN_IF_ERROR(Owned(op->key));
      return Route::To(PartitionOf(op->key));
    }
    case HashMethod::kGet:
    case HashMethod::kDelete: {
      auto key = DecodeHashKey(payload);
      if (!key.ok()) return key.status();
      if (key->empty()) return Status::InvalidArgument("empty key");
      REMEM_RETURN_IF_ERROR(static_cast<HashMethod>(method) == HashMethod::kGet
                                ? Readable(*key, HashReadFlags(payload))
                                : Owned(*key));
      return Route::To(PartitionOf(*key));
    }
    case HashMethod::kPut: {
      auto put = DecodeHashPut(payload);
      if (!put.ok()) return put.status();
      if (put->key.empty()) return Status::InvalidArgument("empty key");
      REMEM_RETURN_IF_ERROR(Owned(put->key));
      return Route::To(PartitionOf(put->key));
    }
    case HashMethod::kShardExport: {
      if (cluster_ == nullptr) {
        return Status::Unsupported("this server is not in a cluster");
      }
      auto req = DecodeShardExport(payload);
      if (!req.ok()) return req.status();
      if (req->partition >= partitions_.size()) {
        return Status::InvalidArgument("no partition " +
                                       std::to_string(req->partition));
      }
      return Route::To(req->partition);
    }
    case HashMethod::kShardSync:
    case HashMethod::kShardImport:
    case HashMethod::kShardDrop:
    case HashMethod::kReplicate:
    case HashMethod::kShardFill:
      if (cluster_ == nullptr) {
        return Status::Unsupported("this server is not in a cluster");
      }
      return Route::Here();
    case HashMethod::kCount:
      break;
  }
  return Status::ProtocolError("unknown hash method");
}

void HashService::Handle(PartitionId p, Call call) {
  switch (static_cast<HashMethod>(call.method)) {
    case HashMethod::kInfo:
      return call.responder.Reply(Status::OK(), info_);
    case HashMethod::kMultiGet:
    case HashMethod::kMultiPut:
    case HashMethod::kMultiOp:
      return HandleMulti(std::move(call));
    case HashMethod::kOp:
    case HashMethod::kOpBatch:
      return HandleOps(p, std::move(call));
    case HashMethod::kShardExport:
      return HandleShardExport_st(p, std::move(call));
    case HashMethod::kShardSync:
      return HandleShardSync(std::move(call));
    case HashMethod::kShardImport:
      return HandleShardImport(std::move(call));
    case HashMethod::kShardDrop:
      return HandleShardDrop(std::move(call));
    case HashMethod::kReplicate:
      return HandleReplicate(std::move(call));
    case HashMethod::kShardFill:
      return HandleShardFill(std::move(call));
    default:
      return HandleSingle_st(p, std::move(call));
  }
}

void HashService::ReplyAsRead_st(Partition& part, std::string_view key,
                                 Responder responder, Status status,
                                 std::string payload) {
  if (cluster_ != nullptr) {
    // Read while this member held its lease (replicated): not after the
    // manager could have promoted a backup.
    if (Status l = cluster_->Leased(); !l.ok()) return responder.Reply(l);
  }
  const uint64_t upto = DirtyUpTo_st(part, key);
  if (upto <= part.repl_done) {
    return responder.Reply(std::move(status), std::move(payload));
  }
  // What it read may not be on the backups yet (a failover would lose
  // it): answered once it is.
  AfterCommit_st(part, false, upto,
                 [responder = std::move(responder), status = std::move(status),
                  payload = std::move(payload)](Status st) mutable {
                   if (!st.ok()) return responder.Reply(std::move(st));
                   responder.Reply(std::move(status), std::move(payload));
                 });
}

void HashService::AfterDurable_st(Partition& part, Responder responder,
                                  Status status, std::string payload) {
  if (!status.ok()) return responder.Reply(std::move(status));
  // The reply waits for the log (group commit at the end of the pass) and
  // the backups.
  AfterCommit_st(part, true, part.repl_noted,
                 [responder = std::move(responder),
                  payload = std::move(payload)](Status st) mutable {
                   responder.Reply(std::move(st), std::move(payload));
                 });
}

void HashService::PublishMarkHalf(Partition& part, size_t field, uint64_t word,
                                  uint64_t half) {
  const uint64_t half_words[2] = {word, MarkCheck(word, half)};
  StoreWords(part.region->base() + kServingMarkOffset + field, half_words,
             sizeof(half_words));
}

void HashService::PublishReplicated_st(Partition& part, uint64_t version) {
  if (version <= part.repl_mark) return;
  part.repl_mark = version;
  PublishMarkHalf(part, offsetof(ServingMark, replicated), version,
                  kReplicatedHalf);
}

bool HashService::Replicating() const {
  return replicator_ != nullptr && cluster_->replicated();
}

void HashService::LogPut_st(Partition& part, std::string_view key,
                            std::string_view value, uint64_t version) {
  if (part.store) part.store->LogPut(key, value, version);
  if (!Replicating()) return;
  if (!part.repl_batch) part.repl_batch = std::make_unique<ShardPairsWriter>();
  part.repl_batch->Add(key, value, version, false);
  NoteShard_st(part, key);
  part.repl_dirty[XXH3_64bits(key.data(), key.size())] = ++part.repl_noted;
}

void HashService::LogDelete_st(Partition& part, std::string_view key,
                               uint64_t version) {
  if (part.store) part.store->LogDelete(key, version);
  if (!Replicating()) return;
  if (!part.repl_batch) part.repl_batch = std::make_unique<ShardPairsWriter>();
  part.repl_batch->Add(key, {}, version, true);
  NoteShard_st(part, key);
  part.repl_dirty[XXH3_64bits(key.data(), key.size())] = ++part.repl_noted;
}

void HashService::NoteShard_st(Partition& part, std::string_view key) {
  const uint32_t n = cluster_->current()->config.num_shards();
  if (part.repl_shard_marked.size() != n) part.repl_shard_marked.assign(n, 0);
  const uint32_t s = cluster::ShardOf(key, n);
  if (part.repl_shard_marked[s] == 0) {
    part.repl_shard_marked[s] = 1;
    part.repl_shards.push_back(s);
  }
}

uint64_t HashService::DirtyUpTo_st(Partition& part, std::string_view key) {
  if (cluster_ != nullptr && cluster_->epoch() > part.resync_epoch) {
    Resync_st(part);
  }
  if (part.repl_dirty.empty()) return 0;
  auto it = part.repl_dirty.find(XXH3_64bits(key.data(), key.size()));
  return it == part.repl_dirty.end() ? 0 : it->second;
}

void HashService::AfterCommit_st(Partition& part, bool wrote,
                                 uint64_t replicated_upto,
                                 util::MoveFunction<void(Status)> done) {
  const bool durable = wrote && part.store != nullptr;
  const bool replicated = replicated_upto <= part.repl_done;
  if (!durable && replicated) return done(Status::OK());
  if (replicated) return part.store->AfterDurable(std::move(done));
  if (!durable) {
    part.repl_waiters.emplace_back(replicated_upto, std::move(done));
    return;
  }
  // Both: the first error, once both have answered (on this thread).
  struct Join {
    int left = 2;
    Status status;
    util::MoveFunction<void(Status)> done;
    void Done(Status st) {
      if (!st.ok() && status.ok()) status = std::move(st);
      if (--left == 0) done(std::move(status));
    }
  };
  auto join = std::make_shared<Join>();
  join->done = std::move(done);
  part.store->AfterDurable([join](Status st) { join->Done(std::move(st)); });
  part.repl_waiters.emplace_back(
      replicated_upto, [join](Status st) { join->Done(std::move(st)); });
}

void HashService::ShipBatch_st(PartitionId p) {
  Partition& part = *partitions_[p];
  // One batch in flight: a key's records reach a backup in order, and a
  // backup knows every batch of this stream but the last is on all the
  // others (what Resync_st relies on).
  if (part.repl_in_flight || !part.repl_batch) return;
  std::unique_ptr<ShardPairsWriter> batch = std::move(part.repl_batch);
  part.repl_batches.Add();
  part.repl_records.Add(batch->count());
  part.repl_in_flight = true;
  const uint64_t upto = part.repl_noted;
  // Every pair this partition wrote so far has a version up to this one
  // (its versions only grow): once the batch is held, so are they.
  const uint64_t version = part.table->last_version();
  // With this partition's highest version: a backup promoted later issues
  // versions above every version its keys were given here.
  std::string bytes = batch->Finish(cluster_->incarnation(), p,
                                    uint32_t(partitions_.size()), version);
  std::vector<uint32_t> shards = std::move(part.repl_shards);
  part.repl_shards.clear();
  for (uint32_t s : shards) part.repl_shard_marked[s] = 0;
  replicator_->Replicate(
      std::move(bytes), std::move(shards),
      {kHashService, MethodId(HashMethod::kReplicate)},
      [this, p, upto, version](Status st) {
        ctx_->RunOn(p, [this, p, upto, version, st = std::move(st)]() mutable {
          Replicated_st(p, upto, version, std::move(st));
        });
      });
}

void HashService::Replicated_st(PartitionId p, uint64_t upto, uint64_t version,
                                Status status) {
  Partition& part = *partitions_[p];
  part.repl_in_flight = false;
  part.repl_done = upto;
  // Also when it failed: the shards it lost are no longer this server's to
  // vouch for (the serving word changed when that configuration was
  // installed), and it held the others.
  PublishReplicated_st(part, version);
  if (!status.ok() && part.fill.epoch != 0 && part.fill.failed.ok()) {
    part.fill.failed = status;
  }
  for (auto it = part.repl_dirty.begin(); it != part.repl_dirty.end();) {
    it = it->second <= upto ? part.repl_dirty.erase(it) : std::next(it);
  }
  ReportResync_st(part);
  while (!part.repl_waiters.empty() &&
         part.repl_waiters.front().first <= upto) {
    auto done = std::move(part.repl_waiters.front().second);
    part.repl_waiters.pop_front();
    done(status);
  }
  ShipBatch_st(p);
}

void HashService::Resync_st(Partition& part) {
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->config.epoch <= part.resync_epoch) return;
  part.resync_epoch = c->config.epoch;
  const uint32_t n = c->config.num_shards();
  if (part.resync_owned.size() != n) part.resync_owned.assign(n, 0);
  if (Replicating() && !part.retained.empty()) {
    Table& table = *part.table;
    std::unordered_set<std::string_view> sent;
    for (const auto& [stream, kept] : part.retained) {
      for (uint32_t i : kept.items) {
        const std::string_view key = kept.batch->pairs.pairs[i].key;
        const uint32_t s = cluster::ShardOf(key, n);
        if (c->owns[s] == 0 || part.resync_owned[s] != 0 ||
            !sent.insert(key).second) {
          continue;
        }
        // As it stands here now: this member's own writes since (none at
        // this epoch yet, or later in its stream) and the dead primary's
        // records agree on it.
        if (!part.repl_batch) {
          part.repl_batch = std::make_unique<ShardPairsWriter>();
        }
        auto v = table.Get(key);
        if (v.ok()) {
          part.repl_batch->Add(key, v->value, v->version, false);
        } else {
          part.repl_batch->Add(key, {}, table.last_version(), true);
        }
        NoteShard_st(part, key);
        part.repl_dirty[XXH3_64bits(key.data(), key.size())] =
            ++part.repl_noted;
        part.resync_upto = part.repl_noted;
        part.resync_records.Add(1);
      }
    }
    // Streams of senders no longer in the cluster are done with.
    for (auto it = part.retained.begin(); it != part.retained.end();) {
      const bool member =
          std::any_of(c->config.members.begin(), c->config.members.end(),
                      [&](const cluster::Member& m) {
                        return m.incarnation == it->first.first;
                      });
      it = member ? std::next(it) : part.retained.erase(it);
    }
  }
  part.resync_owned = c->owns;
  part.resync_report = c->config.epoch;
  ReportResync_st(part);
}

void HashService::ReportResync_st(Partition& part) {
  if (part.resync_report == 0 || part.repl_done < part.resync_upto) return;
  cluster_->ResyncDone(part.resync_report);
  part.resync_report = 0;
}

Status HashService::ApplyPairs_st(Partition& part, const ShardPairs& pairs,
                                  const std::vector<uint32_t>& items,
                                  bool logged) {
  Table& table = *part.table;
  for (uint32_t i : items) {
    const ShardPairView& pr = pairs.pairs[i];
    if (pr.deleted) {
      Status d = table.Delete(pr.key);
      if (d.ok() && logged) {
        part.store->LogDelete(pr.key, table.last_version());
      } else if (!d.ok() && d.code() != StatusCode::kNotFound) {
        return d;
      }
      continue;
    }
    auto v = table.Import(pr.key, pr.value, pr.version);
    if (!v.ok()) return v.status();
    if (*v == pr.version && logged) {
      part.store->LogPut(pr.key, pr.value, pr.version);
    }
  }
  return Status::OK();
}

void HashService::HandleReplicate(Call call) {
  struct Apply {
    std::shared_ptr<const ReplicaBatch> batch;
    const ShardPairs& pairs() const { return batch->pairs; }
    std::vector<Status> status;  // per partition
    Responder responder;
  };
  auto rep = std::make_shared<Apply>();
  rep->responder = std::move(call.responder);
  {
    auto batch = std::make_shared<ReplicaBatch>();
    batch->payload = std::move(call.payload);
    auto pairs = DecodeShardPairs(batch->payload);
    if (!pairs.ok()) return rep->responder.Reply(pairs.status());
    batch->pairs = std::move(*pairs);
    rep->batch = std::move(batch);
  }
  std::vector<std::vector<uint32_t>> by_owner(partitions_.size());
  // A batch may hold records of shards with other backups (the primary
  // sends each batch whole to every backup of one of its shards): those
  // are not this server's to keep.
  const uint32_t epoch = call.epoch;
  auto at = cluster_->AdmitsReplication(epoch);
  if (!at.ok()) return rep->responder.Reply(at.status());
  for (uint32_t i = 0; i < rep->pairs().pairs.size(); ++i) {
    const std::string_view key = rep->pairs().pairs[i].key;
    if (!cluster::Ownership::BacksUp(**at, key)) continue;
    // A copy for a backup being filled: a ready one has it already.
    if (rep->pairs().pairs[i].fill && !cluster::Ownership::Fills(**at, key)) {
      continue;
    }
    by_owner[PartitionOf(key)].push_back(i);
  }
  // Raised by every partition at its next pass (OnPass).
  uint64_t seen = replicated_max_version_.load(std::memory_order_relaxed);
  while (seen < rep->pairs().max_version &&
         !replicated_max_version_.compare_exchange_weak(
             seen, rep->pairs().max_version, std::memory_order_relaxed)) {
  }
  size_t owners = 0;
  for (const auto& items : by_owner) owners += items.empty() ? 0 : 1;
  if (owners == 0) return rep->responder.Reply(Status::OK());
  rep->status.resize(partitions_.size());
  auto fan = std::make_shared<server::FanIn>(
      owners, [rep] { rep->responder.Reply(FirstError(rep->status)); });
  for (uint32_t owner = 0; owner < partitions_.size(); ++owner) {
    if (by_owner[owner].empty()) continue;
    auto apply = [this, owner, rep, fan, epoch,
                  items = std::move(by_owner[owner])]() mutable {
      Partition& part = *partitions_[owner];
      // Admitted again, here on the owner thread: a configuration installed
      // since the batch was admitted may have made this server the keys'
      // primary, and a write it took meanwhile must not be undone by the
      // old primary's records (an import wins by version, and this
      // thread's versions are raised to the batch's only at its next pass;
      // a delete always wins). Refused, the sender asks again by the new
      // configuration; its writes in the batch are not acknowledged yet.
      if (auto again = cluster_->AdmitsReplication(epoch); !again.ok()) {
        part.replica_refused.Add(1);
        rep->status[owner] = again.status();
        return fan->Done();
      }
      // Logged where the log takes writes; held in memory in any case (the
      // primary waits for memory, as FaRM's backups acknowledge).
      rep->status[owner] =
          ApplyPairs_st(part, rep->pairs(), items,
                        part.store != nullptr && part.store->Writable().ok());
      // Kept until the stream's next batch: what a promotion here sends on
      // (Resync_st).
      if (rep->status[owner].ok()) {
        part.retained[{rep->pairs().generation, rep->pairs().cursor}] = {
            rep->batch, std::move(items)};
      }
      UpdateCounters_st(part);
      fan->Done();
    };
    if (options_.fault_replica_delete_delay_ms == 0 ||
        std::none_of(rep->pairs().pairs.begin(), rep->pairs().pairs.end(),
                     [](const ShardPairView& p) { return p.deleted; })) {
      ctx_->RunOn(owner, std::move(apply));
      continue;
    }
    const auto due =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(options_.fault_replica_delete_delay_ms);
    ctx_->RunOn(owner, [this, owner, due, apply = std::move(apply)]() mutable {
      Partition& part = *partitions_[owner];
      part.held_applies.emplace_back(due, std::move(apply));
      part.applies_held.Set(part.held_applies.size());
    });
  }
}

void HashService::HandleSingle_st(PartitionId p, Call call) {
  Partition& part = *partitions_[p];
  Table& table = *part.table;
  const auto method = static_cast<HashMethod>(call.method);
  if (method == HashMethod::kGet) {
    auto key = DecodeHashKey(call.payload);
    if (!key.ok()) return call.responder.Reply(key.status());
    // Checked again here, on the owner thread: a shard released since
    // RouteCall may have had its pairs deleted by this thread.
    const uint32_t read_flags = HashReadFlags(call.payload);
    if (Status o = Readable(*key, read_flags, &part); !o.ok()) {
      return call.responder.Reply(o);
    }
    auto v = table.Get(*key);
    if (!v.ok()) {
      return ReplyAsRead_st(part, *key, std::move(call.responder), v.status());
    }
    return ReplyAsRead_st(part, *key, std::move(call.responder), Status::OK(),
                          EncodeHashGetReply(v->version, v->value));
  }
  if (part.store != nullptr) {
    // The log cannot be written: refuse before changing anything.
    if (Status w = part.store->Writable(); !w.ok()) {
      return call.responder.Reply(w);
    }
  }
  if (method == HashMethod::kDelete) {
    auto key = DecodeHashKey(call.payload);
    if (!key.ok()) return call.responder.Reply(key.status());
    // Checked here, on the owner thread: a shard frozen since RouteCall
    // has had this partition's changes sent already.
    if (Status w = Writable(*key); !w.ok()) return call.responder.Reply(w);
    FloorVersions_st(part);
    Status st = table.Delete(*key);
    // NotFound tells what the table holds: answered as a get would be.
    if (!st.ok()) {
      return ReplyAsRead_st(part, *key, std::move(call.responder), st);
    }
    LogDelete_st(part, *key, table.last_version());
    UpdateCounters_st(part);
    return AfterDurable_st(part, std::move(call.responder), Status::OK(), {});
  }
  auto put = DecodeHashPut(call.payload);
  if (!put.ok()) return call.responder.Reply(put.status());
  if (Status w = Writable(put->key); !w.ok()) return call.responder.Reply(w);
  FloorVersions_st(part);
  Result<uint64_t> v =
      put->mode == PutMode::kIfAbsent ? table.PutIfAbsent(put->key, put->value)
      : put->mode == PutMode::kIfVersion
          ? table.CompareAndPut(put->key, put->value, put->expected_version)
          : table.Put(put->key, put->value);
  UpdateCounters_st(part);
  // A refused conditional write (Conflict, AlreadyExists) tells what the
  // table holds: answered as a get would be.
  if (!v.ok()) {
    return ReplyAsRead_st(part, put->key, std::move(call.responder),
                          v.status());
  }
  LogPut_st(part, put->key, put->value, *v);
  AfterDurable_st(part, std::move(call.responder), Status::OK(),
                  EncodeHashPutReply(*v));
}

void HashService::HandleMulti(Call call) {
  // The decoded items are views into the payload, which `batch` owns and
  // keeps alive until the reply is sent. Each owner thread does its own
  // items, in request order, and fills only their results; the last to
  // finish replies. A multi-get, a multi-put and a mixed batch are the same
  // here: items with an operation each.
  struct Batch {
    std::string payload;
    std::vector<MultiOp> ops;
    std::vector<MultiItem> results;
    Responder responder;
  };
  auto batch = std::make_shared<Batch>();
  batch->payload = std::move(call.payload);
  batch->responder = std::move(call.responder);
  switch (static_cast<HashMethod>(call.method)) {
    case HashMethod::kMultiGet: {
      auto keys = DecodeHashMultiGet(batch->payload);
      if (!keys.ok()) return batch->responder.Reply(keys.status());
      batch->ops.reserve(keys->size());
      for (auto k : *keys) batch->ops.push_back({MultiOpKind::kGet, k, {}});
      break;
    }
    case HashMethod::kMultiPut: {
      auto pairs = DecodeHashMultiPut(batch->payload);
      if (!pairs.ok()) return batch->responder.Reply(pairs.status());
      batch->ops.reserve(pairs->size());
      for (auto& [k, v] : *pairs) {
        batch->ops.push_back({MultiOpKind::kPut, k, v});
      }
      break;
    }
    default: {
      auto ops = DecodeHashMultiOp(batch->payload);
      if (!ops.ok()) return batch->responder.Reply(ops.status());
      batch->ops = std::move(*ops);
      break;
    }
  }
  const uint32_t read_flags = HashReadFlags(batch->payload);
  if ((read_flags & kHashReadAnyReplica) != 0) {
    for (const MultiOp& o : batch->ops) {
      if (o.op != MultiOpKind::kGet) {
        return batch->responder.Reply(Status::InvalidArgument(
            "a batch read from any replica holds gets only"));
      }
    }
  }
  if (cluster_ != nullptr) {
    // In a cluster a batch runs whole or not at all: one key elsewhere
    // refuses it before anything changed, so the client can retry it all.
    for (const MultiOp& o : batch->ops) {
      if (o.key.empty()) continue;
      if (Status st = Readable(o.key, read_flags); !st.ok()) {
        return batch->responder.Reply(std::move(st));
      }
    }
  }
  batch->results.resize(batch->ops.size());
  // Items grouped by the partition that owns them, in request order.
  std::vector<std::vector<uint32_t>> by_owner(partitions_.size());
  // Not vector<bool>: its element would be captured below as a proxy into
  // this local vector.
  std::vector<uint8_t> owner_writes(partitions_.size(), 0);
  for (uint32_t i = 0; i < batch->ops.size(); ++i) {
    const MultiOp& o = batch->ops[i];
    if (o.key.empty()) {
      batch->results[i].status = Status::InvalidArgument("empty key");
      continue;
    }
    const PartitionId p = PartitionOf(o.key);
    by_owner[p].push_back(i);
    if (o.op != MultiOpKind::kGet) owner_writes[p] = 1;
  }
  size_t owners = 0;
  for (const auto& items : by_owner) owners += items.empty() ? 0 : 1;
  auto send = [batch] {
    CapMultiReply(batch->ops, &batch->results);
    batch->responder.Reply(Status::OK(), EncodeHashMultiReply(batch->results));
  };
  if (owners == 0) return send();
  auto fan = std::make_shared<server::FanIn>(owners, std::move(send));
  for (uint32_t owner = 0; owner < by_owner.size(); ++owner) {
    if (by_owner[owner].empty()) continue;
    ctx_->RunOn(owner, [this, owner, batch, fan, read_flags,
                        writes = owner_writes[owner] != 0,
                        items = std::move(by_owner[owner])]() mutable {
      Partition& part = *partitions_[owner];
      Table& table = *part.table;
      Status writable;
      if (writes && part.store) writable = part.store->Writable();
      // Buckets are prefetched kAhead items before they are used.
      constexpr size_t kAhead = 8;
      for (size_t j = 0; j < kAhead && j < items.size(); ++j) {
        table.Prefetch(batch->ops[items[j]].key);
      }
      // The records a get here must see replicated (its key's).
      uint64_t reads_upto = 0;
      // What this partition's gets put in the reply so far. Once past
      // kMaxMultiReplyBytes, so is the whole reply at every later item
      // (CapMultiReply would answer a get there full), and so later gets
      // are answered full without reading their values: a batch of large
      // values then costs the owner thread one reply's worth of reads, not
      // the whole batch's for every reply that asks for the rest again.
      uint64_t reply_bytes = 0;
      for (size_t n = 0; n < items.size(); ++n) {
        if (n + kAhead < items.size()) {
          table.Prefetch(batch->ops[items[n + kAhead]].key);
        }
        const uint32_t i = items[n];
        const MultiOp& o = batch->ops[i];
        MultiItem& out = batch->results[i];
        if (cluster_ != nullptr) {
          // Here, on the owner thread (see HandleSingle_st):
          // a released shard refuses gets, a frozen one writes.
          out.status = o.op == MultiOpKind::kGet
                           ? Readable(o.key, read_flags, &part)
                           : Writable(o.key);
          if (!out.status.ok()) continue;
          if (o.op != MultiOpKind::kGet) FloorVersions_st(part);
        }
        if (o.op == MultiOpKind::kGet) {
          if (i > 0 && reply_bytes > kMaxMultiReplyBytes) {
            out.status = Status::Busy(kMultiReplyFull);
            continue;
          }
          reads_upto = std::max(reads_upto, DirtyUpTo_st(part, o.key));
          auto v = table.Get(o.key);
          if (v.ok()) {
            out.version = v->version;
            out.data = std::move(v->value);
            reply_bytes += sizeof(HashMultiItem) + out.data.size();
          } else {
            out.status = v.status();
          }
          continue;
        }
        // The log cannot be written: refuse writes before changing
        // anything.
        if (!writable.ok()) {
          out.status = writable;
          continue;
        }
        if (o.op == MultiOpKind::kDelete) {
          out.status = table.Delete(o.key);
          if (out.status.ok()) {
            LogDelete_st(part, o.key, table.last_version());
          }
          continue;
        }
        auto v = table.Put(o.key, o.value);
        if (!v.ok()) {
          out.status = v.status();
          continue;
        }
        out.version = *v;
        LogPut_st(part, o.key, o.value, *v);
      }
      if (writes) UpdateCounters_st(part);
      // Once this partition's records are durable and replicated; a
      // failed log write fails this partition's writes that had
      // succeeded in memory (a get's answer stands, unless it may
      // have read a write that did not reach the backups).
      AfterCommit_st(
          part, writes && writable.ok(), writes ? part.repl_noted : reads_upto,
          [batch, fan, items = std::move(items),
           reads_fail = Replicating()](Status st) {
            if (!st.ok()) {
              for (uint32_t i : items) {
                if (FailsWithItsCommit(batch->results[i].status, reads_fail,
                                       batch->ops[i].op != MultiOpKind::kGet)) {
                  batch->results[i].status = st;
                  batch->results[i].data.clear();
                }
              }
            }
            fan->Done();
          });
    });
  }
}

// --- server-side operations (the engine: see service.h)

// One Op or OpBatch request: its payload (the decoded views point into it),
// one result per operation, and the join of its partitions.
struct OpRequest {
  std::string payload;
  std::vector<ops::OpView> ops;
  std::vector<OpItem> results;
  std::vector<uint8_t> wrote;  // per op: its result depends on a write
  bool single = false;         // kOp: the reply is one HashOpItem
  Responder responder;
  std::unique_ptr<server::FanIn> fan;
};

void HashService::HandleOps(PartitionId p, Call call) {
  auto req = std::make_shared<OpRequest>();
  req->payload = std::move(call.payload);
  req->responder = std::move(call.responder);
  req->single = static_cast<HashMethod>(call.method) == HashMethod::kOp;
  if (req->single) {
    auto op = DecodeHashOp(req->payload);
    if (!op.ok()) return req->responder.Reply(op.status());
    req->ops.push_back(*op);
  } else {
    auto ops = DecodeHashOpBatch(req->payload);
    if (!ops.ok()) return req->responder.Reply(ops.status());
    req->ops = std::move(*ops);
    if (cluster_ != nullptr) {
      for (const auto& o : req->ops) {
        if (o.key.empty()) continue;
        if (Status st = cluster_->Owns(o.key); !st.ok()) {
          return req->responder.Reply(std::move(st));
        }
      }
    }
  }
  req->results.resize(req->ops.size());
  req->wrote.assign(req->ops.size(), 0);
  auto send = [req]() {
    if (req->single) {
      OpItem& it = req->results[0];
      if (!it.status.ok()) return req->responder.Reply(it.status);
      return req->responder.Reply(Status::OK(), EncodeHashOpReply(it));
    }
    CapOpBatchReply(req->ops, &req->results);
    req->responder.Reply(Status::OK(), EncodeHashOpBatchReply(req->results));
  };
  if (req->single) {
    // Routed here by RouteCall.
    req->fan = std::make_unique<server::FanIn>(1, std::move(send));
    partitions_[p]->pending_ops.emplace_back(req, 0);
    return;
  }
  std::vector<std::vector<uint32_t>> by_owner(partitions_.size());
  for (uint32_t i = 0; i < req->ops.size(); ++i) {
    if (req->ops[i].key.empty()) {
      req->results[i].status = Status::InvalidArgument("empty key");
      continue;
    }
    by_owner[PartitionOf(req->ops[i].key)].push_back(i);
  }
  size_t owners = 0;
  for (const auto& items : by_owner) owners += items.empty() ? 0 : 1;
  if (owners == 0) return send();
  req->fan = std::make_unique<server::FanIn>(owners, std::move(send));
  for (uint32_t owner = 0; owner < by_owner.size(); ++owner) {
    if (by_owner[owner].empty()) continue;
    ctx_->RunOn(owner, [this, owner, req, items = std::move(by_owner[owner])] {
      auto& pending = partitions_[owner]->pending_ops;
      for (uint32_t i : items) pending.emplace_back(req, i);
    });
  }
}

// Steps of a table's growth done at each pass (Table::GrowStep): tens of
// microseconds of the partition's thread, so an idle partition's growth
// ends within a few thousand passes of its loop (a busy one's writes pace
// it too).
constexpr uint64_t kGrowStepsPerPass = 64;

size_t HashService::OnPass(PartitionId p) {
  if (cluster_ != nullptr && !partitions_[p]->purged) PurgeUnowned_st(p);
  if (partitions_[p]->purge_stale) PurgeStale_st(p);
  size_t work = RunOps_st(p);
  Partition& part = *partitions_[p];
  if (part.table->growing()) {
    work += part.table->GrowStep(kGrowStepsPerPass);
    if (!part.table->growing()) UpdateCounters_st(part);
  }
  while (!part.held_applies.empty() &&
         part.held_applies.front().first <= std::chrono::steady_clock::now()) {
    auto apply = std::move(part.held_applies.front().second);
    part.held_applies.pop_front();
    apply();
    part.applies_held.Set(part.held_applies.size());
    ++work;
  }
  if (cluster_ != nullptr) {
    work += EmptyStep_st(part);
    work += DiscardStep_st(p);
  }
  if (replicator_ != nullptr) {
    const uint64_t seen =
        replicated_max_version_.load(std::memory_order_relaxed);
    if (seen > part.table->last_version()) part.table->RaiseVersion(seen);
    FillStep_st(part);
    ShipBatch_st(p);
    // Nothing waits for the backups: every pair here is as replicated as it
    // will be (pairs of a promotion, copies), and one-sided readers may
    // have them.
    if (!part.repl_in_flight && !part.repl_batch) {
      PublishReplicated_st(part, part.table->last_version());
    }
  }
  return work;
}

void HashService::PurgeUnowned_st(PartitionId p) {
  const cluster::Ownership::Installed* c = cluster_->pending();
  if (c == nullptr) return;  // no configuration yet
  Partition& part = *partitions_[p];
  // Replicated: the shards it backs up stay too; and a server that
  // restarted keeps the copies its previous incarnation held until the
  // manager has judged them (when every server restarted, they are the
  // only ones: the manager then gives this incarnation the same roles).
  // And the shards moving here: once a step's handoff is recorded nothing
  // is copied again, so a new owner that restarted since keeps what it
  // had imported, recovered from the log (the manager copies again a step
  // that had not reached its handoff: its first drop clears this).
  std::vector<uint8_t> holds(c->owns.size());
  for (uint32_t s = 0; s < holds.size(); ++s) {
    holds[s] = cluster::Ownership::MayKeep(*c, s) ||
                       cluster::Ownership::HeldByPrior(*c, s)
                   ? 1
                   : 0;
  }
  part.purge_stale = c->prior >= 0;
  part.held = holds;
  part.settled_epoch = c->config.epoch;
  if (const size_t n = DeleteShardsNotHeld_st(part, holds); n > 0) {
    log::Info(
        "cluster: partition {} deleted {} pairs of shards that epoch {} does "
        "not give this server (a move ended while it was down)",
        p, n, c->config.epoch);
  }
  part.purged = true;
  cluster_->PurgeDone();
}

void HashService::PurgeStale_st(PartitionId p) {
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->self < 0) return;  // not judged yet
  Partition& part = *partitions_[p];
  part.purge_stale = false;
  const uint32_t n = uint32_t(c->owns.size());
  if (part.held.size() != n) part.held.assign(n, 1);
  // Served already: deleted in the background, as any copy a configuration
  // takes away.
  std::vector<uint8_t> lost(n, 0);
  for (uint32_t s = 0; s < n; ++s) {
    if (cluster::Ownership::Holds(*c, s)) {
      part.held[s] = 1;
      continue;
    }
    lost[s] = part.held[s];
    part.held[s] = 0;
  }
  part.settled_epoch = c->config.epoch;
  Discard_st(part, lost);
}

void HashService::SettleShards_st(PartitionId p,
                                  const cluster::Ownership::Installed& c) {
  Partition& part = *partitions_[p];
  if (!part.purged || part.purge_stale || c.config.epoch < part.settled_epoch ||
      (c.self < 0 && c.prior >= 0)) {
    return;
  }
  part.settled_epoch = c.config.epoch;
  const uint32_t n = c.config.num_shards();
  if (part.held.size() != n) part.held.assign(n, 0);
  Partition::Discard& d = part.discard;
  std::vector<uint8_t> lost;  // empty: nothing to delete
  for (uint32_t s = 0; s < n; ++s) {
    if (cluster::Ownership::MayKeep(c, s)) {
      part.held[s] = 1;
      // A role here again: what is left of it is no longer garbage (a copy
      // that comes here is preceded by a drop).
      if (s < d.set.size() && d.set[s] != 0) {
        d.set[s] = 0;
        --d.count;
      }
    } else if (part.held[s] != 0) {
      part.held[s] = 0;
      if (lost.empty()) lost.assign(n, 0);
      lost[s] = 1;
    }
  }
  if (!lost.empty()) Discard_st(part, lost);
  UpdateCounters_st(part);
}

void HashService::Discard_st(Partition& part,
                             const std::vector<uint8_t>& shards) {
  Partition::Discard& d = part.discard;
  if (d.set.size() != shards.size()) {
    d.set.assign(shards.size(), 0);
    d.count = 0;
  }
  bool added = false;
  for (uint32_t s = 0; s < shards.size(); ++s) {
    if (shards[s] != 0 && d.set[s] == 0) {
      d.set[s] = 1;
      ++d.count;
      added = true;
    }
  }
  if (!added) return;
  d.not_before = std::chrono::steady_clock::now() +
                 std::chrono::milliseconds(options_.fault_discard_delay_ms);
  // From the first bucket: those scanned already may hold the new shards'
  // pairs.
  d.sweep = std::make_unique<TableSweep>(
      part.table.get(), [&d](std::string_view key) {
        return d.set[cluster::ShardOf(key, uint32_t(d.set.size()))] != 0;
      });
  UpdateCounters_st(part);
}

size_t HashService::DiscardStep_st(PartitionId p) {
  Partition& part = *partitions_[p];
  Partition::Discard& d = part.discard;
  if (!d.sweep) return 0;
  if (options_.fault_discard_delay_ms > 0 &&
      std::chrono::steady_clock::now() < d.not_before) {
    return 0;
  }
  // Not while the log refuses writes: a delete it did not record would come
  // back with a restart's replay, after the shard may have come back here
  // (the drop before that copy finds nothing to delete).
  if (part.store != nullptr && !part.store->Writable().ok()) return 0;
  std::vector<std::string> keys;
  const bool over =
      d.sweep->Step(std::max<uint64_t>(options_.fill_scan_buckets, 1), &keys);
  // The keys a move carried behind the scan were judged when moved: a
  // shard given a role here since is kept.
  const uint32_t n = uint32_t(d.set.size());
  std::erase_if(keys, [&](const std::string& k) {
    return d.set[cluster::ShardOf(k, n)] == 0;
  });
  if (!keys.empty()) {
    const uint64_t before = part.table->size();
    DeletePairs_st(part, keys, part.store != nullptr);
    d.deleted += before - part.table->size();
    part.discarded_pairs.Add(before - part.table->size());
  }
  if (over) {
    if (d.deleted > 0) {
      log::Info(
          "cluster: partition {} deleted {} pairs of shards it has no role "
          "for (moved away, a retired or dropped copy, an abandoned move's "
          "copy, or what it held before it was failed over)",
          p, d.deleted);
    }
    d.sweep.reset();
    std::fill(d.set.begin(), d.set.end(), 0);
    d.count = 0;
    d.deleted = 0;
  }
  UpdateCounters_st(part);
  return 1;
}

size_t HashService::DeleteShardsNotHeld_st(Partition& part,
                                           const std::vector<uint8_t>& holds) {
  Table& table = *part.table;
  const uint32_t num_shards = uint32_t(holds.size());
  std::vector<std::string> keys;
  table.ScanBuckets(0, table.num_buckets(),
                    [&](std::string_view k, std::string_view, uint64_t) {
                      if (holds[cluster::ShardOf(k, num_shards)] == 0) {
                        keys.emplace_back(k);
                      }
                    });
  // Logged where the log takes writes; in memory in any case (a restart
  // purges again).
  DeletePairs_st(
      part, keys,
      part.store != nullptr && !keys.empty() && part.store->Writable().ok());
  UpdateCounters_st(part);
  return keys.size();
}

void HashService::DeletePairs_st(Partition& part,
                                 const std::vector<std::string>& keys,
                                 bool logged) {
  Table& table = *part.table;
  part.purging = true;
  for (const std::string& k : keys) {
    if (table.Delete(k).ok() && logged) {
      part.store->LogDelete(k, table.last_version());
    }
  }
  part.purging = false;
}

size_t HashService::RunOps_st(PartitionId p) {
  Partition& part = *partitions_[p];
  if (part.pending_ops.empty()) return 0;
  // The queue is swapped with the kept one (empty), so both keep their
  // capacity.
  auto& pending = part.running_ops;
  pending.swap(part.pending_ops);
  Table& table = *part.table;
  const uint32_t max_value = table.limits().max_value;
  Status writable;
  if (part.store) writable = part.store->Writable();

  // Group by key, in arrival order (the groups in order of first arrival),
  // in the partition's kept storage: a table of 2^k >= 2n slots (group + 1,
  // 0 empty), probed linearly; each group a list of `pending` indices.
  auto key_at = [&](uint32_t n) -> std::string_view {
    return pending[n].first->ops[pending[n].second].key;
  };
  size_t num_slots = 16;
  while (num_slots < 2 * pending.size()) num_slots *= 2;
  part.op_slots.assign(num_slots, 0);
  part.op_first.clear();
  part.op_last.clear();
  part.op_next.assign(pending.size(), UINT32_MAX);
  for (uint32_t n = 0; n < pending.size(); ++n) {
    const std::string_view key = key_at(n);
    size_t s = XXH3_64bits(key.data(), key.size()) & (num_slots - 1);
    while (part.op_slots[s] != 0 &&
           key_at(part.op_first[part.op_slots[s] - 1]) != key) {
      s = (s + 1) & (num_slots - 1);
    }
    if (part.op_slots[s] == 0) {
      part.op_first.push_back(n);
      part.op_last.push_back(n);
      part.op_slots[s] = uint32_t(part.op_first.size());
    } else {
      const uint32_t g = part.op_slots[s] - 1;
      part.op_next[part.op_last[g]] = n;
      part.op_last[g] = n;
    }
  }
  const size_t num_groups = part.op_first.size();
  constexpr size_t kAhead = 8;
  auto key_of = [&](size_t g) { return key_at(part.op_first[g]); };
  for (size_t g = 0; g < kAhead && g < num_groups; ++g) {
    table.Prefetch(key_of(g));
  }
  uint64_t writes = 0;
  for (size_t g = 0; g < num_groups; ++g) {
    if (g + kAhead < num_groups) table.Prefetch(key_of(g + kAhead));
    const std::string_view key = key_of(g);
    // On the owner thread (see HandleSingle_st): a released shard
    // refuses every operation, a frozen one those that write.
    const Status key_writable = Writable(key);
    const Status key_owned = key_writable.ok() ? Status::OK() : Owned(key);
    if (key_writable.ok()) FloorVersions_st(part);
    auto cur = table.Get(key);
    bool present = cur.ok();
    std::string value = present ? std::move(cur->value) : std::string();
    uint64_t version = present ? cur->version : 0;
    const uint64_t base = table.last_version();
    uint64_t k = 0;  // writing operations so far
    uint64_t group_size = 0;
    for (uint32_t n = part.op_first[g]; n != UINT32_MAX; n = part.op_next[n]) {
      ++group_size;
      auto& [req, i] = pending[n];
      const ops::OpView& op = req->ops[i];
      OpItem& out = req->results[i];
      if (!writable.ok() && ops::MayWrite(op.kind)) {
        out.status = writable;  // refused before changing anything
        continue;
      }
      if (!key_owned.ok() || (!key_writable.ok() && ops::MayWrite(op.kind))) {
        out.status = key_owned.ok() ? key_writable : key_owned;
        continue;
      }
      ops::Outcome o;
      out.status = ops::Apply(op, max_value, &functions_, &present, &value, &o);
      if (!out.status.ok()) continue;
      if (o.wrote) version = base + ++k;
      out.version = version;
      out.applied = o.applied;
      out.data = std::move(o.reply);
      req->wrote[i] = k > 0;
    }
    part.ops.Add(group_size);
    if (k == 0) continue;
    // Versions base+1 .. base+k went to the operations; the stored value
    // takes the last.
    table.RaiseVersion(base + k - 1);
    auto v = table.Put(key, value);
    ++writes;
    if (!v.ok() || *v != base + k) {
      const Status st =
          v.ok() ? Status::Internal("operation version skew") : v.status();
      // Nothing of this key was stored: every result that depended on the
      // write fails.
      for (uint32_t n = part.op_first[g]; n != UINT32_MAX;
           n = part.op_next[n]) {
        auto& [req, i] = pending[n];
        if (req->wrote[i] && req->results[i].status.ok()) {
          req->results[i].status = st;
          req->results[i].data.clear();
        }
      }
      continue;
    }
    LogPut_st(part, key, value, *v);
  }
  part.op_writes.Add(writes);
  if (writes > 0) UpdateCounters_st(part);

  // Each request's part on this partition is done once its writes are
  // durable; a failed log write fails the results that depended on one.
  std::unordered_map<OpRequest*, size_t> req_index;
  std::vector<std::pair<std::shared_ptr<OpRequest>, std::vector<uint32_t>>>
      reqs;
  for (auto& [req, i] : pending) {
    auto [it, added] = req_index.try_emplace(req.get(), reqs.size());
    if (added) reqs.emplace_back(req, std::vector<uint32_t>{});
    reqs[it->second].second.push_back(i);
  }
  const bool reads_fail = Replicating();
  for (auto& [req, items] : reqs) {
    // Named captures: clang before 16 cannot capture structured bindings.
    // (A read may have seen a write not yet on the backups: it fails with
    // that write.)
    // (Every operation reads its key: all wait for the partition's records.)
    AfterCommit_st(
        part, writes > 0, part.repl_noted,
        [req = req, items = std::move(items), reads_fail](Status st) mutable {
          if (!st.ok()) {
            for (uint32_t i : items) {
              if (FailsWithItsCommit(req->results[i].status, reads_fail,
                                     req->wrote[i] != 0)) {
                req->results[i].status = st;
                req->results[i].data.clear();
              }
            }
          }
          req->fan->Done();
        });
  }
  const size_t ran = pending.size();
  pending.clear();  // the requests are held by their callbacks now
  return ran;
}

// --- moving shards (the manager's steps: cluster/member.h)

namespace {

// Per shard of the cluster: 1 if listed.
std::vector<uint8_t> ShardSet(const std::vector<uint32_t>& shards,
                              uint32_t num_shards) {
  std::vector<uint8_t> set(num_shards, 0);
  for (uint32_t s : shards) set[s] = 1;
  return set;
}

// Keys of the shards `set` marks (one entry per shard of the cluster).
TableSweep::Filter ShardFilter(std::vector<uint8_t> set) {
  return [set = std::move(set)](std::string_view key) {
    return set[cluster::ShardOf(key, uint32_t(set.size()))] != 0;
  };
}

// A move's call is refused (Conflict) unless it comes at the epoch this
// server has installed: one of another epoch (a manager that lost its
// place, a call that outlived its pass) must not take the keys noted for
// the current copy, nor release or drop what the current one needs.
Status AtMoveEpoch(const cluster::Ownership& o, uint32_t epoch) {
  if (epoch == o.epoch()) return Status::OK();
  return Status::Conflict("a move's call at epoch " + std::to_string(epoch) +
                          "; this server has installed epoch " +
                          std::to_string(o.epoch()));
}

// OK if the call's `epoch` is the installed one (AtMoveEpoch) and every
// shard of `shards` is moving away from this server (`away`) or to it;
// Conflict naming the first that is not.
Status CheckMoving(const cluster::Ownership& o, uint32_t epoch,
                   const std::vector<uint32_t>& shards, bool away) {
  REMEM_RETURN_IF_ERROR(AtMoveEpoch(o, epoch));
  for (uint32_t s : shards) {
    if (away ? o.MovingAway(s) : o.Incoming(s)) continue;
    return Status::Conflict("shard " + std::to_string(s) + " is not moving " +
                            (away ? "away from" : "to") +
                            " this server in epoch " +
                            std::to_string(o.epoch()));
  }
  return Status::OK();
}

// OK if the configuration installed here is at `epoch` and has this
// server fill every shard of `shards` as a backup (`as_primary`: owns each
// and has a backup fill it); Conflict otherwise (Busy before any).
Status CheckFilling(const cluster::Ownership& o, uint32_t epoch,
                    const std::vector<uint32_t>& shards,
                    bool as_primary = false) {
  const cluster::Ownership::Installed* c = o.current();
  if (c == nullptr) return Status::Busy("no cluster configuration yet");
  if (epoch != c->config.epoch) {
    return Status::Conflict("asked at epoch " + std::to_string(epoch) +
                            "; this server has installed epoch " +
                            std::to_string(c->config.epoch));
  }
  const cluster::Config& cfg = c->config;
  for (uint32_t s : shards) {
    bool ok = s < cfg.num_shards();
    if (ok && as_primary) {
      ok = c->owns[s] != 0;
      bool any = false;
      for (uint32_t i = 0; ok && i < cfg.replicas; ++i) {
        any = any || cfg.FillingAt(size_t(s) * cfg.replicas + i);
      }
      ok = ok && any;
    } else if (ok) {
      ok = !c->fills.empty() && c->fills[s] != 0;
    }
    if (!ok) {
      return Status::Conflict("shard " + std::to_string(s) + " is not " +
                              (as_primary
                                   ? "owned here with a backup being filled"
                                   : "being filled here") +
                              " in epoch " + std::to_string(cfg.epoch));
    }
  }
  return Status::OK();
}

}  // namespace

// A copy's pairs per batch: a write behind it waits for at most this much
// more to reach the backups, and for the new backup to apply it (growing
// its table in steps at the pace these pairs take room: docs/
// BENCHMARKS.md, "Re-replication"). 256 KiB until 2026-12-02: writes then
// waited up to 0.2-0.6 s; the copy takes no longer at 32 KiB.
constexpr size_t kFillBatchBytes = 32u << 10;

void HashService::FillStep_st(Partition& part) {
  Partition::Fill& fill = part.fill;
  if (fill.epoch == 0) return;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->config.epoch != fill.epoch) {
    // The roles may have changed: the manager starts another copy.
    fill = Partition::Fill{};
    return;
  }
  if (part.repl_in_flight || !fill.failed.ok() || fill.Sent()) return;
  Table& table = *part.table;
  if (!part.repl_batch) part.repl_batch = std::make_unique<ShardPairsWriter>();
  ShardPairsWriter& batch = *part.repl_batch;
  uint64_t added = 0;
  // Read now: the newest pair (deleted since: its delete is in the stream
  // already).
  auto send = [&](const std::string& key) {
    auto v = table.Get(key);
    if (!v.ok()) return;
    batch.AddFill(key, v->value, v->version);
    NoteShard_st(part, key);
    ++added;
  };
  constexpr uint64_t kChunk = 64;  // buckets between size checks
  const uint64_t budget = std::max<uint64_t>(options_.fill_scan_buckets, 1);
  uint64_t scanned = 0;
  std::vector<std::string> found;
  while (batch.bytes() < kFillBatchBytes) {
    if (!fill.found.empty()) {
      send(fill.found.front());
      fill.found.pop_front();
    } else if (!fill.scanned && scanned < budget) {
      const uint64_t chunk = std::min(kChunk, budget - scanned);
      fill.scanned = fill.sweep->Step(chunk, &found);
      scanned += chunk;
      for (std::string& k : found) fill.found.push_back(std::move(k));
      found.clear();
    } else {
      break;
    }
  }
  part.repl_noted += added;
  fill.upto = part.repl_noted;
  fill.sent += added;
  part.fill_pairs.Add(added);
}

void HashService::HandleShardFill(Call call) {
  auto list = DecodeShardList(call.payload);
  if (!list.ok()) return call.responder.Reply(list.status());
  if (list->flags != 0) {
    return call.responder.Reply(Status::InvalidArgument("bad fill flags"));
  }
  if (replicator_ == nullptr) {
    return call.responder.Reply(
        Status::Unsupported("this server does not replicate"));
  }
  const uint32_t epoch = call.epoch;
  if (Status st = CheckFilling(*cluster_, epoch, list->shards, true);
      !st.ok()) {
    return call.responder.Reply(st);
  }
  struct Progress {
    std::vector<uint8_t> set;
    std::vector<ShardFillProgress> parts;
    std::vector<Status> status;
    Responder responder;
  };
  auto progress = std::make_shared<Progress>();
  progress->set =
      ShardSet(list->shards, cluster_->current()->config.num_shards());
  progress->parts.resize(partitions_.size());
  progress->status.resize(partitions_.size());
  progress->responder = std::move(call.responder);
  auto fan = std::make_shared<server::FanIn>(partitions_.size(), [progress] {
    if (Status st = FirstError(progress->status); !st.ok()) {
      return progress->responder.Reply(st);
    }
    ShardFillProgress sum{true, 0, 0};
    for (const ShardFillProgress& p : progress->parts) {
      sum.done = sum.done && p.done;
      sum.pairs_total += p.pairs_total;
      sum.pairs_copied += p.pairs_copied;
    }
    progress->responder.Reply(Status::OK(), EncodeShardFillReply(sum));
  });
  for (uint32_t owner = 0; owner < partitions_.size(); ++owner) {
    ctx_->RunOn(owner, [this, owner, epoch, progress, fan] {
      Partition& part = *partitions_[owner];
      Partition::Fill& fill = part.fill;
      const cluster::Ownership::Installed* c = cluster_->current();
      if (c == nullptr || c->config.epoch != epoch) {
        progress->status[owner] =
            Status::Conflict("the configuration changed during the copy");
        return fan->Done();
      }
      if (fill.epoch != epoch || fill.set != progress->set) {
        // Started now: every write from here on follows in the stream, and
        // the scan (FillStep_st, a chunk per pass) sends the pairs there
        // are.
        fill = Partition::Fill{};
        fill.epoch = epoch;
        fill.set = progress->set;
        fill.sweep = std::make_unique<TableSweep>(part.table.get(),
                                                  ShardFilter(progress->set));
        fill.upto = part.repl_noted;
      }
      progress->status[owner] = fill.failed;
      // Pairs sent so far, and (until the scan is done) one more: the
      // copy is not over.
      progress->parts[owner] = {fill.Sent() && part.repl_done >= fill.upto,
                                fill.sent + (fill.Sent() ? 0 : 1), fill.sent};
      fan->Done();
    });
  }
}

void HashService::HandleShardExport_st(PartitionId p, Call call) {
  auto req = DecodeShardExport(call.payload);
  if (!req.ok()) return call.responder.Reply(req.status());
  if (Status st = CheckMoving(*cluster_, call.epoch, req->shards, true);
      !st.ok()) {
    return call.responder.Reply(st);
  }
  const uint32_t num_shards = cluster_->current()->config.num_shards();
  const std::vector<uint8_t> set = ShardSet(req->shards, num_shards);
  Partition& part = *partitions_[p];
  const Table& table = *part.table;
  const uint64_t generation = table.growths();
  const bool same = req->generation == generation;
  const uint64_t start = same ? req->cursor : 0;
  const std::string_view after = same ? std::string_view(req->after) : "";
  if (start >= table.num_buckets()) {
    return call.responder.Reply(
        Status::InvalidArgument("shard export: cursor past the table"));
  }
  if (start == 0 && after.empty()) {
    // The scan from the start sends every pair there is; changes noted so
    // far are in it.
    std::erase_if(part.changed, [&](const std::string& k) {
      return set[cluster::ShardOf(k, num_shards)] != 0;
    });
  }
  // A page stops before the pair that would pass max_bytes, and holds at
  // least one: the largest page still fits a reply.
  static_assert(proto::kMaxRpcPayload / 2 + Limits{}.max_key +
                    Limits{}.max_value + sizeof(ShardPair) +
                    sizeof(ShardPairsHeader) <=
                proto::kMaxRpcPayload);
  const uint32_t max_bytes = std::clamp<uint32_t>(
      req->max_bytes, 1, uint32_t(proto::kMaxRpcPayload / 2));
  ShardPairsWriter out;
  // At most this many buckets (8 MiB) per page, however few pairs match:
  // the partition's thread serves nothing else meanwhile.
  constexpr uint64_t kMaxScan = 16384;
  const uint64_t cursor = ExportShardPage(
      table,
      [&](std::string_view k) {
        return set[cluster::ShardOf(k, num_shards)] != 0;
      },
      start, after, max_bytes, kMaxScan, &out);
  call.responder.Reply(
      Status::OK(), out.Finish(generation, cursor, uint32_t(partitions_.size()),
                               table.last_version()));
}

// The budget plus the largest pair still fits a reply.
static_assert(kShardSyncBytes + Limits{}.max_key + Limits{}.max_value +
                  sizeof(ShardPair) + sizeof(ShardPairsHeader) <=
              proto::kMaxRpcPayload);

// What a ShardSync collects, partition after partition.
struct HashService::ShardSyncState {
  std::vector<uint8_t> set;
  uint32_t num_shards = 0;
  ShardPairsWriter out;
  uint64_t bytes = 0;        // of pairs in `out`
  uint64_t max_version = 0;  // the highest any partition issued
  bool more = false;         // changes left for the next request
  Responder responder;
};

void HashService::HandleShardSync(Call call) {
  auto list = DecodeShardList(call.payload);
  if (!list.ok()) return call.responder.Reply(list.status());
  if ((list->flags & ~kShardFreeze) != 0) {
    return call.responder.Reply(Status::InvalidArgument("bad sync flags"));
  }
  if (Status st = CheckMoving(*cluster_, call.epoch, list->shards, true);
      !st.ok()) {
    return call.responder.Reply(st);
  }
  if (list->flags & kShardFreeze) {
    // Before the partitions look: a write applied after a partition has
    // sent its changes finds the shard frozen (Writable, on the owner
    // thread, after this store).
    if (Status st = cluster_->Freeze(list->shards); !st.ok()) {
      return call.responder.Reply(st);
    }
  }
  auto sync = std::make_shared<ShardSyncState>();
  sync->num_shards = cluster_->current()->config.num_shards();
  sync->set = ShardSet(list->shards, sync->num_shards);
  sync->responder = std::move(call.responder);
  // The partitions one after another, so that one budget bounds the reply.
  ctx_->RunOn(0, [this, sync] { CollectChanges_st(sync, 0); });
}

void HashService::CollectChanges_st(std::shared_ptr<ShardSyncState> sync,
                                    PartitionId p) {
  Partition& part = *partitions_[p];
  for (auto it = part.changed.begin(); it != part.changed.end();) {
    if (!sync->set[cluster::ShardOf(*it, sync->num_shards)]) {
      ++it;
      continue;
    }
    auto v = part.table->Get(*it);
    const uint64_t size =
        it->size() + sizeof(ShardPair) + (v.ok() ? v->value.size() : 0);
    // At least one pair per reply, so the largest pair goes too.
    if (sync->bytes > 0 &&
        sync->bytes + size >
            std::min(options_.shard_sync_bytes, kShardSyncBytes)) {
      sync->more = true;
      break;
    }
    sync->bytes += size;
    if (v.ok()) {
      sync->out.Add(*it, v->value, v->version, false);
    } else {
      sync->out.Add(*it, {}, 0, true);
    }
    it = part.changed.erase(it);
  }
  sync->max_version = std::max(sync->max_version, part.table->last_version());
  auto next = [this, sync, p](Status st) {
    if (!st.ok()) return sync->responder.Reply(std::move(st));
    if (p + 1 < partitions_.size()) {
      return ctx_->RunOn(p + 1,
                         [this, sync, p] { CollectChanges_st(sync, p + 1); });
    }
    // Cursor 0: more changes are left, ask again.
    sync->responder.Reply(
        Status::OK(), sync->out.Finish(0, sync->more ? 0 : kShardCursorDone, 0,
                                       sync->max_version));
  };
  // Replicated (a drain hands shards over to a backup): once the backups
  // hold every write this partition made so far, so that the new owner
  // has every one the old owner made before the freeze.
  if (Replicating()) return AfterCommit_st(part, false, part.repl_noted, next);
  next(Status::OK());
}

void HashService::HandleShardImport(Call call) {
  struct Import {
    std::string payload;
    ShardPairs pairs;
    std::vector<Status> status;  // per partition
    Responder responder;
  };
  auto imp = std::make_shared<Import>();
  imp->payload = std::move(call.payload);
  imp->responder = std::move(call.responder);
  auto pairs = DecodeShardPairs(imp->payload);
  if (!pairs.ok()) return imp->responder.Reply(pairs.status());
  if (Status st = AtMoveEpoch(*cluster_, call.epoch); !st.ok()) {
    return imp->responder.Reply(st);
  }
  imp->pairs = std::move(*pairs);
  const uint32_t num_shards = cluster_->current() == nullptr
                                  ? 0
                                  : cluster_->current()->config.num_shards();
  std::vector<std::vector<uint32_t>> by_owner(partitions_.size());
  for (uint32_t i = 0; i < imp->pairs.pairs.size(); ++i) {
    const std::string_view key = imp->pairs.pairs[i].key;
    const uint32_t shard =
        num_shards == 0 ? 0 : cluster::ShardOf(key, num_shards);
    if (num_shards == 0 || !cluster_->Incoming(shard)) {
      return imp->responder.Reply(
          Status::Conflict("shard " + std::to_string(shard) +
                           " is not moving to this server in epoch " +
                           std::to_string(cluster_->epoch())));
    }
    by_owner[PartitionOf(key)].push_back(i);
  }
  imp->status.resize(partitions_.size());
  auto fan = std::make_shared<server::FanIn>(partitions_.size(), [imp] {
    imp->responder.Reply(FirstError(imp->status));
  });
  for (uint32_t owner = 0; owner < partitions_.size(); ++owner) {
    ctx_->RunOn(owner, [this, owner, imp, fan, num_shards,
                        items = std::move(by_owner[owner])] {
      Partition& part = *partitions_[owner];
      Table& table = *part.table;
      Status& st = imp->status[owner];
      // Settled by the configuration that completes or abandons the
      // move (SettleShards_st).
      if (!items.empty() && part.held.size() != num_shards) {
        part.held.assign(num_shards, 0);
      }
      for (uint32_t i : items) {
        part.held[cluster::ShardOf(imp->pairs.pairs[i].key, num_shards)] = 1;
      }
      // Every partition: a moved key re-inserted here later, in whichever
      // partition, must get a version its old owner never issued (a
      // client may hold one for compare-and-put).
      const bool raise = imp->pairs.max_version > table.last_version();
      if (part.store != nullptr && (raise || !items.empty())) {
        st = part.store->Writable();
      }
      if (raise && st.ok()) {
        table.RaiseVersion(imp->pairs.max_version);
        // Into the log too, so a restart keeps it: a delete of the empty
        // key (no key is empty) with that version; recovery raises its
        // counter to the highest version it replays.
        if (part.store) part.store->LogDelete({}, imp->pairs.max_version);
      }
      if (st.ok()) {
        st = ApplyPairs_st(part, imp->pairs, items, part.store != nullptr);
      }
      UpdateCounters_st(part);
      // A configuration that abandoned the move may have been installed
      // since the request was admitted (its settling ran before this).
      const cluster::Ownership::Installed* c = cluster_->current();
      if (c != nullptr && !items.empty()) SettleShards_st(owner, *c);
      if (part.store == nullptr || (items.empty() && !raise) || !st.ok()) {
        return fan->Done();
      }
      part.store->AfterDurable([imp, owner, fan](Status d) {
        if (!d.ok()) imp->status[owner] = d;
        fan->Done();
      });
    });
  }
}

void HashService::HandleShardDrop(Call call) {
  auto list = DecodeShardList(call.payload);
  if (!list.ok()) return call.responder.Reply(list.status());
  if (list->flags != 0 && list->flags != kShardRelease &&
      list->flags != kShardForFill && list->flags != kShardForget) {
    return call.responder.Reply(Status::InvalidArgument("bad drop flags"));
  }
  const bool release = (list->flags & kShardRelease) != 0;
  const bool forget = (list->flags & kShardForget) != 0;
  if (forget) {
    // Checked again by each partition, on its thread, when it deletes.
    if (cluster_->current() == nullptr) {
      return call.responder.Reply(Status::Busy("no configuration yet"));
    }
  } else if ((list->flags & kShardForFill) != 0) {
    // Shards this server is about to be filled with: what it held of them
    // before (an earlier role, an unfinished copy) goes first.
    if (Status st = CheckFilling(*cluster_, call.epoch, list->shards);
        !st.ok()) {
      return call.responder.Reply(st);
    }
  } else if (Status st =
                 CheckMoving(*cluster_, call.epoch, list->shards, release);
             !st.ok()) {
    // Released: shards moving away whose new owner has everything. Else
    // shards moving here: what an earlier, unfinished copy left.
    return call.responder.Reply(st);
  }
  if (release) {
    // Readers are refused before the copy goes (the serving mark vouches
    // for nothing until the next install, and the server, asked, says
    // Busy).
    if (Status st = cluster_->Release(list->shards); !st.ok()) {
      return call.responder.Reply(st);
    }
  }
  struct Drop {
    std::vector<uint8_t> set;
    uint32_t num_shards = 0;
    std::vector<Status> status;
    Responder responder;
  };
  auto drop = std::make_shared<Drop>();
  drop->num_shards = cluster_->current()->config.num_shards();
  drop->set = ShardSet(list->shards, drop->num_shards);
  drop->status.resize(partitions_.size());
  drop->responder = std::move(call.responder);
  auto fan = std::make_shared<server::FanIn>(partitions_.size(), [drop] {
    drop->responder.Reply(FirstError(drop->status));
  });
  if (!release && !forget) {
    // A chunk per pass (EmptyStep_st): the table may hold millions of
    // pairs of other shards.
    for (uint32_t owner = 0; owner < partitions_.size(); ++owner) {
      ctx_->RunOn(owner, [this, owner, epoch = call.epoch, drop, fan] {
        StartEmptying_st(*partitions_[owner], epoch, drop->set,
                         [drop, owner, fan](Status st) {
                           drop->status[owner] = st;
                           fan->Done();
                         });
      });
    }
    return;
  }
  // Released or retired: no reader is sent here for them any more, so they
  // are deleted in the background (Discard) and the drop is answered now:
  // a release is part of a move's pause, during which the shards take no
  // writes.
  for (uint32_t owner = 0; owner < partitions_.size(); ++owner) {
    ctx_->RunOn(owner, [this, owner, drop, fan, forget] {
      Partition& part = *partitions_[owner];
      const bool all = part.held.size() != drop->num_shards;
      std::vector<uint8_t> gone = drop->set;
      const cluster::Ownership::Installed* c = cluster_->current();
      for (uint32_t s = 0; s < drop->num_shards; ++s) {
        if (gone[s] == 0) continue;
        // Forgotten: not a shard held here now (a configuration installed
        // since may have made this server a backup of it again, whose
        // records this thread may have applied already). And one not
        // marked has nothing here: a retired member settles its copies
        // itself when it installs the configuration that drops them
        // (SettleShards_st), before the manager's forget.
        if (forget &&
            (cluster::Ownership::Holds(*c, s) || (!all && part.held[s] == 0))) {
          gone[s] = 0;
          continue;
        }
        if (!all) part.held[s] = 0;
      }
      Discard_st(part, gone);
      std::erase_if(part.changed, [&](const std::string& k) {
        return gone[cluster::ShardOf(k, drop->num_shards)] != 0;
      });
      fan->Done();
    });
  }
}

void HashService::StartEmptying_st(Partition& part, uint32_t epoch,
                                   const std::vector<uint8_t>& set,
                                   util::MoveFunction<void(Status)> done) {
  Partition::Emptying& e = part.emptying;
  if (e.epoch != epoch || e.set != set) {
    if (e.epoch != 0) {
      EndEmptying_st(
          part, Status::Conflict("another drop for a copy came before this one "
                                 "was over"));
    }
    e.epoch = epoch;
    e.set = set;
    e.sweep = std::make_unique<TableSweep>(part.table.get(), ShardFilter(set));
  }
  e.waiters.push_back(std::move(done));
}

size_t HashService::EmptyStep_st(Partition& part) {
  Partition::Emptying& e = part.emptying;
  if (e.epoch == 0) return 0;
  const cluster::Ownership::Installed* c = cluster_->current();
  if (c == nullptr || c->config.epoch != e.epoch) {
    // The roles may have changed: the manager drops again at the new epoch
    // if the copy is still to be made.
    EndEmptying_st(
        part, Status::Conflict("the configuration changed during the drop"));
    return 1;
  }
  std::vector<std::string> keys;
  const bool over =
      e.sweep->Step(std::max<uint64_t>(options_.fill_scan_buckets, 1), &keys);
  if (!keys.empty()) {
    if (part.store != nullptr) {
      if (Status st = part.store->Writable(); !st.ok()) {
        EndEmptying_st(part, st);
        return 1;
      }
      e.deleted = true;
    }
    const uint64_t before = part.table->size();
    DeletePairs_st(part, keys, part.store != nullptr);
    part.emptied_pairs.Add(before - part.table->size());
  }
  if (over) EndEmptying_st(part, Status::OK());
  return 1;
}

void HashService::EndEmptying_st(Partition& part, Status status) {
  Partition::Emptying e = std::move(part.emptying);
  part.emptying = Partition::Emptying{};
  const uint32_t num_shards = uint32_t(e.set.size());
  std::erase_if(part.changed, [&](const std::string& k) {
    return e.set[cluster::ShardOf(k, num_shards)] != 0;
  });
  UpdateCounters_st(part);
  auto answer = [waiters = std::move(e.waiters)](Status st) mutable {
    for (auto& w : waiters) w(st);
  };
  if (!status.ok() || !e.deleted) return answer(status);
  part.store->AfterDurable(std::move(answer));
}

}  // namespace remem::hash
