// remem::HashStore: the client side of the hash store (include/remem/hash.h),
// on a Session's core (client/session_core.h).

#include <xxhash.h>

#include <optional>
#include <thread>
#include <unordered_set>

#include "client/path_selector.h"
#include "client/session_core.h"
#include "hash/codec.h"
#include "hash/reader.h"
#include "remem/hash.h"
#include "util/pass_queue.h"

namespace remem {

using fabric::Clock;

namespace {

// Verification failures before a one-sided get gives up and asks the
// server. Each failure means the server was writing that bucket or extent
// at that moment; a few in a row mean a hot key, where the server's answer
// is the cheaper one.
constexpr int kMaxOneSidedAttempts = 16;

}  // namespace

struct HashStore::Impl {
  using Value = HashStore::Value;
  client::SessionCore* core = nullptr;
  hash::HashInfo info;
  std::vector<hash::Geometry> partitions;
  std::unique_ptr<client::PathSelector> selector;
  // Batches (MultiGet) cost differently from single gets on each path, so
  // they are measured and chosen apart.
  std::unique_ptr<client::PathSelector> batch_selector;
  ReadStats read_stats;
  size_t in_flight = 0;
  int flush_hook = 0;
  // HashOptions::ordered_gets, and its asynchronous gets out by RPC
  // (queued, or sent and not answered): while any is, gets go by RPC.
  bool ordered_gets = false;
  size_t ordered_rpc_gets = 0;
  // hash::kHashReadAnyReplica with HashOptions::read_any_replica: every
  // get asks the server, and a backup of the key's shard may answer.
  uint32_t read_flags = 0;
  // Sampling of get latencies for the selector (auto mode only).
  client::PathTiming timing;  // of `selector`'s gets; last_now for all

  // Wraps a callback: the session's bookkeeping plus this store's count.
  template <typename Arg, typename Fn>
  auto Track(Fn done) {
    ++in_flight;
    return core->Track<Arg>([this, done = std::move(done)](Arg r) mutable {
      --in_flight;
      if (done) done(std::move(r));
    });
  }

  // Over a served transport (tcp) a queued RPC read rides in the message
  // the next flush sends anyway, while a served one-sided read costs
  // messages of its own, and the latencies the selector would compare are
  // then mostly queueing, which both paths share. So with other requests
  // in flight on the session's loop (this store's, or, in a cluster
  // client, any server's) or queued, a get or multi-get whose selector
  // `by` is auto goes by RPC, untimed, in issue order with the writes
  // queued ahead of it; lone ones are the selector's.
  bool RidesBatch(const client::PathSelector& by) const {
    return core->served() && by.mode() == ReadPath::kAuto &&
           (core->loop_in_flight() > 1 || !queued.empty());
  }
  // The path of the next single get and whether to time it
  // (client::PathTiming's rule).
  client::Path ChoosePath(bool* timed, Clock::time_point* start) {
    return timing.Choose(selector.get(), timed, start);
  }
  void RecordLatency(client::Path p, Clock::time_point start) {
    timing.Record(selector.get(), p, start);
  }
  void RecordLatency(client::PathSelector* into, client::Path p,
                     Clock::time_point start, double divide_by) {
    timing.Record(into, p, start, divide_by);
  }

  // A verified one-sided get (retried, re-reading the root when a bucket
  // fails) into *out, whose string keeps its capacity: on shared memory a
  // get then allocates nothing. *out is untouched unless found. Sets
  // *gave_up (and returns Busy) if it never verified: the caller asks the
  // server. `kh`: the key's hash under g's seed, if the caller has it.
  // `serving_epoch`: the epoch the get was routed by (a queued get's, from
  // when it was queued); by default the session's now.
  Status GetOneSidedInto(hash::Geometry* g, std::string_view key, Value* out,
                         bool* gave_up, const hash::KeyHash* kh = nullptr,
                         std::optional<uint32_t> serving_epoch = std::nullopt);
  // Re-reads the partition root into `g`.
  Status RefreshRoot(hash::Geometry* g);
  // After `g` names a new bucket array: fault this process's mapping of it
  // in now (shared memory only). Otherwise the first one-sided gets each
  // take a page fault and look slower than the RPC path, which the
  // selector then prefers for a long time. Only the live array: the rest
  // of the region may never have been touched by the server.
  void Prefault(const hash::Geometry& g) {
    const fabric::RemoteRegion* r = core->region(g.region);
    if (r == nullptr) return;
    r->PrefaultForReading(g.buckets_offset, g.num_buckets * hash::kBucketBytes);
  }
  hash::Geometry& PartitionOf(std::string_view key) {
    if (partitions.size() == 1) return partitions[0];
    return partitions[XXH3_64bits_withSeed(key.data(), key.size(),
                                           info.partition_seed) %
                      partitions.size()];
  }
  Result<Value> GetRpc(std::string_view key);
  Result<uint64_t> Put(std::string_view key, std::string_view value,
                       hash::PutMode mode, uint64_t expected);

  // An asynchronous get: the one-sided lookup steps through its reads (each
  // a copy when mapped, else a UCX get), falls back to the RPC get after
  // kMaxOneSidedAttempts, or goes by RPC from the start.
  struct AsyncGet {
    std::string key;
    hash::Geometry* g = nullptr;
    std::optional<hash::Lookup> lookup;
    hash::Root root;
    bool reading_root = false;
    bool root_loaded = false;
    int attempt = 0;
    client::Path path = client::Path::kOneSided;
    bool timed = false;  // its latency goes to the selector
    Clock::time_point start;
    GetCallback done;
    bool tracked = true;  // counted in in_flight (GetAsync; not MultiGet)
    // The epoch it was routed by: a refresh while its reads are in flight
    // changes the session's, which would judge the serving mark by a
    // configuration the get was not routed by.
    uint32_t serving_epoch = 0;
    bool ordered_rpc = false;  // counted in ordered_rpc_gets
  };
  // Asynchronous gets, puts and deletes that go by RPC wait here until the
  // next Poll/WaitAll (or a batch or synchronous call), which sends them
  // all as one message (a multi-get, a multi-put, or a mixed batch the
  // server does in order): many requests in flight cost one send each way
  // instead of one per request.
  // Where a queued get of an asynchronous multi-get puts its result.
  struct BatchSink {
    virtual ~BatchSink() = default;
    virtual void Set(size_t index, Result<Value> r) = 0;
  };
  struct Queued {
    hash::MultiOpKind kind;
    std::shared_ptr<AsyncGet> get;  // single gets
    // Puts (key, value), deletes (key) and multi-get keys (key).
    std::string key, value;
    std::function<void(Result<uint64_t>)> put_done;  // puts
    std::function<void(Status)> delete_done;         // deletes
    std::shared_ptr<BatchSink> sink;                 // multi-get keys
    size_t index = 0;                                // in the sink
  };
  std::vector<Queued> queued;
  void FlushQueued();
  // A lone request goes by its single-key method.
  void SendOne(Queued q);
  // Messages of many items, in issue order: a multi-get if all are gets, a
  // multi-put if all are puts, else a mixed batch.
  void SendBatches(std::vector<Queued> all);
  // What a queued request's answer completes.
  void Answer(Queued& q, const Status& st, hash::MultiItem* item);

  // `forced`: the path a batch chose for all its keys; else the selector
  // chooses. `tracked`: counted in in_flight and the session's first error
  // (GetAsync); a MultiGet's own gets are not.
  // `into`: a GetAsync into caller storage (`done` is then null). A local
  // get writes into *into and calls `into_done`; the other paths, which
  // allocate anyway (the server's answer, a read over the network), take
  // IntoAdapter's callback.
  void StartGet(std::string_view key, GetCallback done, bool tracked,
                std::optional<client::Path> forced = std::nullopt,
                Value* into = nullptr, Callback into_done = nullptr);
  // An operation issued (GetAsync/PutAsync/DeleteAsync): counted until
  // Complete runs its callback.
  void Began() {
    ++in_flight;
    core->Began();
  }
  template <typename Arg, typename Fn>
  void Complete(Fn& done, Arg r) {
    --in_flight;
    core->Ended(r);
    if (done) done(std::move(r));
  }

  // --- gets on a table mapped into this process (shared memory)
  // A one-sided GetAsync there hashes its key and queues the get;
  // RunLocalGets performs the queued gets together, from the flush hook
  // (before every Poll, WaitAll and synchronous call) or once kLocalWindow
  // are queued. Their callbacks then run at the next Poll, as every
  // asynchronous callback does. Nothing here allocates once the vectors
  // have grown: keys are copied into one arena.
  //
  // So the cache and TLB misses of the gets in flight overlap instead of
  // being paid one after the other (MICA and KV-Direct batch their memory
  // accesses the same way): a window of gets (the queued ones, or up to
  // kPrefetchWindow keys of a MultiGet or MultiGetAsync) first prefetches
  // every line of each get's first bucket, all in one burst, and then
  // performs them. Only the first get queued in an empty window prefetches
  // at once, which a lone get gains by. Measured against the alternatives
  // (docs/BENCHMARKS.md): the same prefetch spread out (made as each get
  // was queued, or rolled a window ahead while the gets ran) overlapped
  // far less, and a prefetch of headers and then of the entries they name
  // (two dependent misses) was slower. The copy itself still reads only
  // the header and the entry (hash::ReadMode::kHeaderThenEntries).
  static constexpr size_t kLocalWindow = 32;
  static constexpr size_t kPrefetchWindow = kLocalWindow;
  static GetCallback IntoAdapter(Value* into, Callback done) {
    return [into, done = std::move(done)](Result<Value> r) {
      if (r.ok()) *into = std::move(*r);
      if (done) done(r.ok() ? Status::OK() : r.status());
    };
  }
  struct LocalGet {
    uint32_t key_begin = 0;
    uint32_t key_len = 0;
    hash::Geometry* g = nullptr;
    GetCallback done;
    Value* into = nullptr;  // a get into caller storage: into_done, not done
    Callback into_done;
    hash::KeyHash kh;            // under g's seed, hashed when queued
    uint32_t serving_epoch = 0;  // as AsyncGet's
  };
  struct LocalDone {
    GetCallback done;    // a plain get: gets `value` or `status`
    Callback into_done;  // a get into caller storage: gets `status`
    Status status;
    Value value;  // a plain get's (a get into storage fills the caller's)
  };
  std::vector<LocalGet> local_queue, local_running;
  std::string lookup_scratch;  // GetOneSidedInto's value, before it is known
  std::vector<uint8_t> extent_scratch;  // its out-of-line values' copies
  bool one_sided_get_running = false;   // GetOneSidedInto is under way
  // The last epoch a serving mark called stale (ServingCovers).
  uint32_t stale_epoch = UINT32_MAX;
  std::vector<size_t> batch_valid, batch_by_rpc;  // MultiGetAsync's, reused
  // LookupMapped's, per key: its partition and its hash there.
  std::vector<hash::Geometry*> batch_partitions;
  std::vector<hash::KeyHash> batch_hashes;
  std::string local_keys, local_running_keys;
  // Answered, their callbacks not yet run (DrainLocalDone). A callback
  // that polls drains the rest itself (util/pass_queue.h): the swap of a
  // vector that was here let a drain nested in a callback swap out the
  // vector its caller was walking, and answers were lost or run twice.
  util::PassQueue<LocalDone> local_done;
  bool drain_deferred = false;
  // Per partition: the mapping of its region (null if not mapped) and its
  // length.
  std::vector<const fabric::RemoteRegion*> partition_regions;
  void QueueLocalGet(hash::Geometry* g, std::string_view key, GetCallback done,
                     Value* into, Callback into_done);
  void RunLocalGets();
  void DrainLocalDone();
  // How lookups copy buckets: header then entries where a read is a copy
  // out of a mapping, whole buckets where each read is a round trip.
  hash::ReadMode ReadMode() const {
    return core->reads_are_local() ? hash::ReadMode::kHeaderThenEntries
                                   : hash::ReadMode::kWholeBuckets;
  }
  // The mapped address of the first bucket `kh` reads under `g`, or null
  // (not mapped, or outside the region: then no prefetch).
  const uint8_t* MappedFirstBucket(const hash::Geometry& g,
                                   const hash::KeyHash& kh) const {
    const fabric::RemoteRegion* r =
        partition_regions[size_t(&g - partitions.data())];
    if (r == nullptr || r->mapped() == nullptr) return nullptr;
    const uint64_t offset = hash::FirstBucketOffset(g, kh);
    if (offset > r->length() || r->length() - offset < hash::kBucketBytes) {
      return nullptr;
    }
    return r->mapped() + offset;
  }
  // Prefetches every line of the first bucket `kh` reads under `g` (a
  // hint: harmless if the table grows meanwhile), so that the lookup's
  // entry does not wait for its header.
  void PrefetchWholeBucket(const hash::Geometry& g, const hash::KeyHash& kh) {
    const uint8_t* p = MappedFirstBucket(g, kh);
    if (p == nullptr) return;
    for (size_t line = 0; line < hash::kBucketBytes; line += 64) {
      __builtin_prefetch(p + line, 0, 3);
    }
  }
  // Looks up keys[i] for each i in `indices` (valid keys) in the mapped
  // tables, kPrefetchWindow at a time, each window's buckets prefetched
  // together first (MultiGet, MultiGetAsync). A found value goes to
  // (*values)[i], the outcome to (*statuses)[i]; a lookup that gives up appends
  // i to *gave_up instead (its status untouched).
  void LookupMapped(const std::vector<std::string_view>& keys,
                    const std::vector<size_t>& indices,
                    std::vector<Value>* values, std::vector<Status>* statuses,
                    std::vector<size_t>* gave_up);
  // Runs the queued local gets and sends the queued RPCs.
  void FlushAll() {
    RunLocalGets();
    FlushQueued();
  }
  void DriveOneSided(std::shared_ptr<AsyncGet> op);
  void GetByRpc(std::shared_ptr<AsyncGet> op);
  void FinishGet(const std::shared_ptr<AsyncGet>& op, Result<Value> r);
  // A one-sided lookup's result, if the server's lease covers it; else
  // nullopt (the get asks the server).
  bool Vouched() {
    if (core->Vouch().ok()) return true;
    ++read_stats.unvouched;
    return false;
  }
  // A pair of `version` read one-sided out of partition g, vouched for,
  // by a get routed by configuration `epoch`: OK if it may be returned (a
  // store not routed by a cluster, or the serving mark covers it:
  // hash/layout.h); Moved if that configuration is older than the server's
  // leadership (the caller fetches it again); otherwise Busy (ask the
  // server) or the read's error.
  Status ServingCovers(const hash::Geometry& g, uint64_t version,
                       uint32_t epoch) {
    if (!core->serving_checked()) return Status::OK();
    hash::ServingMark mark;
    // Unreplicated: every pair is as replicated as it will be.
    if (!core->serving_versions_checked()) version = 0;
    for (int i = 0; i < kMaxOneSidedAttempts; ++i) {
      const hash::ReadRequest req = hash::ServingMarkRequest(g, &mark);
      REMEM_RETURN_IF_ERROR(
          core->ReadNow(req.region, req.offset, req.dst, req.len));
      ++read_stats.reads;
      switch (hash::JudgeServingMark(mark, epoch, version)) {
        case hash::MarkVerdict::kTrusted:
          return Status::OK();
        case hash::MarkVerdict::kTorn:
          continue;
        case hash::MarkVerdict::kAskServer:
          ++read_stats.unreplicated;
          return Status::Busy("the server does not vouch for this pair yet");
        case hash::MarkVerdict::kStale:
          ++read_stats.unreplicated;
          // Once per epoch: a refresh that brought no newer configuration
          // (the member it asked lags) would say Moved again until the
          // deadline, while the server answers this key by RPC.
          if (epoch == stale_epoch && core->serving_epoch() == epoch) {
            return Status::Busy("the configuration is stale; ask the server");
          }
          stale_epoch = epoch;
          return Status::Moved(
              epoch == 0
                  ? std::string("the configuration names another incarnation "
                                "of this server (it restarted): it is stale")
                  : "the server leads other shards since an epoch "
                    "after " +
                        std::to_string(epoch) +
                        " (the configuration is stale)");
      }
    }
    return Status::Busy("the serving mark did not verify");
  }
  // Sends a multi-get or multi-put message and decodes its items.
  Result<std::vector<hash::MultiItem>> CallMulti(hash::HashMethod m,
                                                 std::string payload,
                                                 size_t count);
  Status CheckValue(std::string_view value) const {
    if (value.size() > info.max_value) {
      return Status::InvalidArgument(
          "value of " + std::to_string(value.size()) +
          " bytes exceeds the limit of " + std::to_string(info.max_value));
    }
    return Status::OK();
  }
  Status CheckKey(std::string_view key) const {
    if (key.empty()) return Status::InvalidArgument("empty key");
    if (key.size() > info.max_key) {
      return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(info.max_key));
    }
    return Status::OK();
  }
};

HashStore::HashStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HashStore::~HashStore() {
  Impl& s = *impl_;
  // Our callbacks point into this store: let them run first (bounded by
  // the session's timeout; a session that gives up fails the rest).
  if (s.in_flight > 0 || !s.queued.empty()) {
    (void)s.core->ProgressUntil(
        [&s] {
          s.FlushAll();
          return s.in_flight == 0;
        },
        Clock::now() + s.core->options().timeout);
    if (s.in_flight > 0) {
      s.core->Fail(Status::Unavailable("the hash store was closed"));
      (void)s.core->worker()->ProgressUntil(
          [&s] { return s.in_flight == 0; },
          Clock::now() + std::chrono::seconds(30));
    }
  }
  s.core->RemoveFlushHook(s.flush_hook);
}

Result<std::unique_ptr<HashStore>> HashStore::Open(Session* session,
                                                   const HashOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->core = session->core();
  auto reply = impl->core->CallSync(
      hash::kHashService, hash::MethodId(hash::HashMethod::kInfo), {});
  if (!reply.ok()) return reply.status().WithContext("opening the hash store");
  auto info = hash::DecodeHashInfo(*reply);
  if (!info.ok()) return info.status().WithContext("opening the hash store");
  impl->info = std::move(*info);
  for (const hash::HashPartition& p : impl->info.partitions) {
    bool ours = false;
    for (const proto::RegionInfoWire& r : impl->core->all_regions()) {
      ours |= r.region_id == p.region && r.service == hash::kHashService;
    }
    if (!ours) {
      return Status::ProtocolError("hash partition in unknown region " +
                                   std::to_string(p.region));
    }
    impl->partitions.push_back({uint16_t(p.region), p.root_offset, 0,
                                p.buckets_offset, p.num_buckets, p.seed});
  }
  // The tables may have grown since the server encoded its hash info.
  for (hash::Geometry& g : impl->partitions) {
    Status st = impl->RefreshRoot(&g);
    if (!st.ok()) return st.WithContext("reading the hash store's root");
    // A store reading from any replica never reads the table itself.
    if (!options.read_any_replica) impl->Prefault(g);
  }
  impl->ordered_gets = options.ordered_gets;
  client::PathSelectorOptions so;
  so.mode = options.read_path.value_or(impl->core->options().read_path);
  if (options.read_any_replica) {
    // A backup's memory is not vouched for to one-sided readers (only a
    // primary's serving mark is): it is asked.
    impl->read_flags = hash::kHashReadAnyReplica;
    so.mode = ReadPath::kRpc;
  }
  if (!impl->core->cluster_routed()) {
    // A cluster member holds only its own shards. Gets that it does not
    // answer itself would read its memory one-sided, find nothing for a
    // key owned elsewhere and say NotFound; asked, the server says Moved.
    // So a store outside remem::Cluster asks (the routed stores of
    // remem::Cluster read one-sided, on the right server).
    auto cfg = impl->core->CallSync(
        proto::kCoreService,
        static_cast<uint8_t>(proto::CoreMethod::kClusterConfig), {});
    if (cfg.ok() || cfg.status().code() == StatusCode::kBusy) {
      so.mode = ReadPath::kRpc;
    }
  }
  impl->selector = std::make_unique<client::PathSelector>(so);
  impl->batch_selector = std::make_unique<client::PathSelector>(so);
  Impl* raw = impl.get();
  for (const hash::Geometry& g : impl->partitions) {
    impl->partition_regions.push_back(impl->core->region(g.region));
  }
  impl->flush_hook = impl->core->AddFlushHook([raw] { raw->FlushAll(); });
  return std::unique_ptr<HashStore>(new HashStore(std::move(impl)));
}

// --- synchronous

Status HashStore::Impl::RefreshRoot(hash::Geometry* g) {
  hash::Root root;
  for (int i = 0; i < kMaxOneSidedAttempts; ++i) {
    const hash::ReadRequest req = hash::RootRequest(*g, &root);
    REMEM_RETURN_IF_ERROR(
        core->ReadNow(req.region, req.offset, req.dst, req.len));
    ++read_stats.reads;
    const uint64_t generation = g->generation;
    const uint64_t buckets = g->num_buckets;
    if (hash::ApplyRoot(root, g)) {
      if (g->generation != generation || g->num_buckets != buckets) {
        Prefault(*g);
      }
      return Status::OK();
    }
  }
  return Status::Busy("the partition root did not verify");
}

Status HashStore::Impl::GetOneSidedInto(hash::Geometry* g, std::string_view key,
                                        Value* out, bool* gave_up,
                                        const hash::KeyHash* kh,
                                        std::optional<uint32_t> serving_epoch) {
  const uint32_t epoch = serving_epoch.value_or(core->serving_epoch());
  // A callback run while this get waits for a read (over a network) or
  // for the lease may make a get of its own: only the outermost get uses
  // the store's kept buffers, a nested one buffers of its own.
  struct Outermost {
    bool* busy;
    bool nested = *busy;
    ~Outermost() { *busy = nested; }
  } outermost{&one_sided_get_running};
  one_sided_get_running = true;
  std::string nested_scratch;
  std::string* scratch = outermost.nested ? &nested_scratch : &lookup_scratch;
  for (int attempt = 0; attempt < kMaxOneSidedAttempts; ++attempt) {
    // The value is assigned to a scratch string that then trades places
    // with *out's: both keep their capacity, and *out changes only when
    // the key is found. Extents are copied into a buffer kept likewise.
    hash::Lookup lookup(*g, key, ReadMode(), scratch, kh);
    if (!outermost.nested) lookup.set_extent_buffer(&extent_scratch);
    hash::ReadRequest req;
    // The partition's own region is looked up once (extents may live in
    // others).
    const fabric::RemoteRegion* own =
        partition_regions[size_t(g - partitions.data())];
    while (lookup.Next(&req)) {
      REMEM_RETURN_IF_ERROR(
          own != nullptr && req.region == own->id()
              ? core->ReadNow(*own, req.offset, req.dst, req.len)
              : core->ReadNow(req.region, req.offset, req.dst, req.len));
    }
    read_stats.reads += uint64_t(lookup.reads());
    if (lookup.outcome() == hash::Lookup::kFound) {
      if (!Vouched()) break;
      if (Status c = ServingCovers(*g, lookup.version(), epoch); !c.ok()) {
        if (c.code() == StatusCode::kBusy) break;
        return c;
      }
      out->value.swap(*scratch);
      out->version = lookup.version();
      return Status::OK();
    }
    if (lookup.outcome() == hash::Lookup::kNotFound) {
      // In a cluster an absent key may be one whose shard has just moved
      // away (its old owner deletes its copy before the new owner serves
      // it): the server confirms (NotFound, or Moved, or Busy).
      if (!Vouched() || core->cluster_routed()) break;
      return Status::NotFound("key not found");
    }
    ++read_stats.retries;
    // The table may have grown: the root names the live bucket array.
    if (lookup.bucket_failed()) {
      Status st = RefreshRoot(g);
      if (!st.ok() && st.code() != StatusCode::kBusy) return st;
    }
    // Back off: spin briefly, then yield, so the writer can finish.
    if (attempt >= 4) std::this_thread::yield();
  }
  *gave_up = true;
  return Status::Busy("one-sided get did not verify");
}

Result<HashStore::Value> HashStore::Impl::GetRpc(std::string_view key) {
  auto r =
      core->CallSync(hash::kHashService, hash::MethodId(hash::HashMethod::kGet),
                     hash::EncodeHashKey(key, read_flags));
  if (!r.ok()) return r.status();
  auto v = hash::DecodeHashGetReply(*r);
  if (!v.ok()) return v.status();
  return Value{std::move(v->value), v->version};
}

Result<uint64_t> HashStore::Impl::Put(std::string_view key,
                                      std::string_view value,
                                      hash::PutMode mode, uint64_t expected) {
  REMEM_RETURN_IF_ERROR(CheckKey(key));
  REMEM_RETURN_IF_ERROR(CheckValue(value));
  auto r =
      core->CallSync(hash::kHashService, hash::MethodId(hash::HashMethod::kPut),
                     hash::EncodeHashPut({key, value, mode, expected}));
  if (!r.ok()) return r.status();
  return hash::DecodeHashPutReply(*r);
}

Result<HashStore::Value> HashStore::Get(std::string_view key) {
  Value v;
  REMEM_RETURN_IF_ERROR(Get(key, &v));
  return v;
}

Status HashStore::Get(std::string_view key, Value* into) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  hash::Geometry& g = impl_->PartitionOf(key);
  // Latencies feed the selector only in auto mode; a forced path skips the
  // two clock reads.
  bool timed = false;
  Clock::time_point start;
  const client::Path path = impl_->ChoosePath(&timed, &start);
  auto record = [&] {
    if (timed) impl_->RecordLatency(path, start);
  };
  if (path == client::Path::kOneSided) {
    bool gave_up = false;
    const hash::KeyHash kh = hash::HashKey(key, g.seed);
    impl_->PrefetchWholeBucket(g, kh);
    Status st = impl_->GetOneSidedInto(&g, key, into, &gave_up, &kh);
    if (!gave_up) {
      record();
      ++impl_->read_stats.onesided_gets;
      return st;
    }
    ++impl_->read_stats.fallbacks;
    timed = false;  // a fallback's time is neither path's
  }
  auto r = impl_->GetRpc(key);
  record();
  ++impl_->read_stats.rpc_gets;
  if (!r.ok()) return r.status();
  *into = std::move(*r);
  return Status::OK();
}

Result<uint64_t> HashStore::Put(std::string_view key, std::string_view value) {
  return impl_->Put(key, value, hash::PutMode::kUpsert, 0);
}

Result<uint64_t> HashStore::PutIfAbsent(std::string_view key,
                                        std::string_view value) {
  return impl_->Put(key, value, hash::PutMode::kIfAbsent, 0);
}

Result<uint64_t> HashStore::CompareAndPut(std::string_view key,
                                          std::string_view value,
                                          uint64_t expected) {
  return impl_->Put(key, value, hash::PutMode::kIfVersion, expected);
}

Status HashStore::Delete(std::string_view key) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  return impl_->core
      ->CallSync(hash::kHashService, hash::MethodId(hash::HashMethod::kDelete),
                 hash::EncodeHashKey(key))
      .status();
}

// --- asynchronous and batched

void HashStore::Impl::StartGet(std::string_view key, GetCallback done,
                               bool tracked, std::optional<client::Path> forced,
                               Value* into, Callback into_done) {
  if (tracked) Began();
  Status st = CheckKey(key);
  if (!st.ok()) {
    auto op = std::make_shared<AsyncGet>();
    op->done = into != nullptr ? IntoAdapter(into, std::move(into_done))
                               : std::move(done);
    op->tracked = tracked;
    FinishGet(op, st);
    return;
  }
  hash::Geometry* g = &PartitionOf(key);
  bool timed = false;
  Clock::time_point start;
  // Over a served transport (tcp) a queued RPC get rides in the message the
  // next flush sends anyway, while a served one-sided get costs messages of
  // its own, and the latencies the selector would compare are then mostly
  // queueing, which both paths share. So with other requests in flight on
  // the session's loop (this store's, or, in a cluster client, any
  // server's) or queued, auto sends the get by RPC, untimed; lone gets are
  // the selector's.
  const bool rides_batch = !forced && tracked && RidesBatch(*selector);
  // Ordered: behind a get out by RPC, by RPC (HashOptions::ordered_gets).
  const bool behind_rpc = tracked && ordered_gets && ordered_rpc_gets > 0;
  const client::Path path = forced ? *forced
                            : rides_batch || behind_rpc
                                ? client::Path::kRpc
                                : ChoosePath(&timed, &start);
  if (path == client::Path::kOneSided && tracked && core->reads_are_local()) {
    // Timed per window instead (RunLocalGets).
    return QueueLocalGet(g, key, std::move(done), into, std::move(into_done));
  }
  if (into != nullptr) done = IntoAdapter(into, std::move(into_done));
  auto op = std::make_shared<AsyncGet>();
  op->done = std::move(done);
  op->tracked = tracked;
  op->key = std::string(key);
  op->g = g;
  op->path = path;
  op->timed = timed;
  op->start = start;
  op->serving_epoch = core->serving_epoch();
  if (op->path == client::Path::kRpc) return GetByRpc(std::move(op));
  op->lookup.emplace(*op->g, op->key, ReadMode());
  DriveOneSided(std::move(op));
}

void HashStore::Impl::DriveOneSided(std::shared_ptr<AsyncGet> op) {
  while (true) {
    hash::ReadRequest req;
    if (op->reading_root && op->root_loaded) {
      op->root_loaded = false;
      const uint64_t generation = op->g->generation;
      if (hash::ApplyRoot(op->root, op->g)) {
        if (op->g->generation != generation) Prefault(*op->g);
        op->reading_root = false;
        op->lookup.emplace(*op->g, op->key, ReadMode());
        continue;
      }
      if (++op->attempt >= kMaxOneSidedAttempts) break;
      req = hash::RootRequest(*op->g, &op->root);
    } else if (op->reading_root) {
      req = hash::RootRequest(*op->g, &op->root);
    } else if (!op->lookup->Next(&req)) {
      hash::Lookup& l = *op->lookup;
      read_stats.reads += uint64_t(l.reads());
      if (l.outcome() == hash::Lookup::kFound) {
        if (!Vouched()) break;
        if (Status c = ServingCovers(*op->g, l.version(), op->serving_epoch);
            !c.ok()) {
          if (c.code() == StatusCode::kBusy) break;
          return FinishGet(op, std::move(c));
        }
        ++read_stats.onesided_gets;
        return FinishGet(op, Value{std::move(l.value()), l.version()});
      }
      if (l.outcome() == hash::Lookup::kNotFound) {
        // In a cluster the server confirms an absent key (see
        // GetOneSidedInto).
        if (!Vouched() || core->cluster_routed()) break;
        ++read_stats.onesided_gets;
        return FinishGet(op, Status::NotFound("key not found"));
      }
      ++read_stats.retries;
      if (++op->attempt >= kMaxOneSidedAttempts) break;
      if (l.bucket_failed()) {
        op->reading_root = true;  // the table may have grown
      } else {
        op->lookup.emplace(*op->g, op->key, ReadMode());
      }
      continue;
    }
    const fabric::RemoteRegion* r = core->region(req.region);
    Status st = r == nullptr ? Status::ProtocolError("unknown region")
                             : r->Check(req.offset, req.len);
    if (!st.ok()) return FinishGet(op, st);
    if (op->reading_root) ++read_stats.reads;
    if (r->mapped() != nullptr) {
      // A copy out of the mapping: done at once.
      st = core->ReadNow(req.region, req.offset, req.dst, req.len);
      if (!st.ok()) return FinishGet(op, st);
      if (op->reading_root) op->root_loaded = true;
      continue;
    }
    core->Read(req.region, req.offset, req.dst, req.len,
               [this, op](Status s) mutable {
                 if (!s.ok()) return FinishGet(op, s);
                 if (op->reading_root) op->root_loaded = true;
                 DriveOneSided(std::move(op));
               });
    return;
  }
  ++read_stats.fallbacks;
  GetByRpc(std::move(op));
}

void HashStore::Impl::GetByRpc(std::shared_ptr<AsyncGet> op) {
  if (ordered_gets && op->tracked && !op->ordered_rpc) {
    op->ordered_rpc = true;
    ++ordered_rpc_gets;
  }
  queued.push_back(
      {hash::MultiOpKind::kGet, std::move(op), {}, {}, {}, {}, nullptr, 0});
}

void HashStore::Impl::FlushQueued() {
  if (queued.empty()) return;
  std::vector<Queued> all;
  all.swap(queued);
  if (all.size() == 1 && all[0].sink == nullptr) {
    return SendOne(std::move(all[0]));
  }
  SendBatches(std::move(all));
}

void HashStore::Impl::Answer(Queued& q, const Status& st,
                             hash::MultiItem* item) {
  switch (q.kind) {
    case hash::MultiOpKind::kGet: {
      ++read_stats.rpc_gets;
      Result<Value> r = st;
      if (st.ok()) r = Value{std::move(item->data), item->version};
      if (q.sink) return q.sink->Set(q.index, std::move(r));
      return FinishGet(q.get, std::move(r));
    }
    case hash::MultiOpKind::kPut:
      if (!st.ok()) return q.put_done(st);
      return q.put_done(item->version);
    case hash::MultiOpKind::kDelete:
      return q.delete_done(st);
  }
}

void HashStore::Impl::SendOne(Queued q) {
  auto one = std::make_shared<Queued>(std::move(q));
  switch (one->kind) {
    case hash::MultiOpKind::kGet:
      return core->Call(hash::kHashService,
                        hash::MethodId(hash::HashMethod::kGet),
                        hash::EncodeHashKey(one->get->key, read_flags),
                        [this, one](Status st, std::string reply) {
                          auto v = st.ok() ? hash::DecodeHashGetReply(reply)
                                           : Result<hash::HashValue>(st);
                          hash::MultiItem item;
                          if (v.ok()) {
                            item.version = v->version;
                            item.data = std::move(v->value);
                          }
                          Answer(*one, v.status(), &item);
                        });
    case hash::MultiOpKind::kPut:
      return core->Call(hash::kHashService,
                        hash::MethodId(hash::HashMethod::kPut),
                        hash::EncodeHashPut(
                            {one->key, one->value, hash::PutMode::kUpsert, 0}),
                        [this, one](Status st, std::string reply) {
                          auto v = st.ok() ? hash::DecodeHashPutReply(reply)
                                           : Result<uint64_t>(st);
                          hash::MultiItem item;
                          if (v.ok()) item.version = *v;
                          Answer(*one, v.status(), &item);
                        });
    case hash::MultiOpKind::kDelete:
      return core->Call(
          hash::kHashService, hash::MethodId(hash::HashMethod::kDelete),
          hash::EncodeHashKey(one->key),
          [this, one](Status st, std::string) { Answer(*one, st, nullptr); });
  }
}

void HashStore::Impl::SendBatches(std::vector<Queued> all) {
  auto key_of = [](const Queued& q) -> std::string_view {
    return q.get ? std::string_view(q.get->key) : std::string_view(q.key);
  };
  for (auto [b, e] : hash::SplitIntoMessages(all.size(), [&](size_t i) {
         return key_of(all[i]).size() + all[i].value.size();
       })) {
    auto batch = std::make_shared<std::vector<Queued>>(
        std::make_move_iterator(all.begin() + long(b)),
        std::make_move_iterator(all.begin() + long(e)));
    bool only_gets = true, only_puts = true;
    for (const Queued& q : *batch) {
      only_gets &= q.kind == hash::MultiOpKind::kGet;
      only_puts &= q.kind == hash::MultiOpKind::kPut;
    }
    hash::HashMethod method;
    std::string payload;
    if (only_gets) {
      std::vector<std::string_view> keys;
      keys.reserve(batch->size());
      for (const Queued& q : *batch) keys.push_back(key_of(q));
      method = hash::HashMethod::kMultiGet;
      payload = hash::EncodeHashMultiGet(keys, read_flags);
    } else if (only_puts) {
      std::vector<hash::KeyValue> pairs;
      pairs.reserve(batch->size());
      for (const Queued& q : *batch) pairs.emplace_back(q.key, q.value);
      method = hash::HashMethod::kMultiPut;
      payload = hash::EncodeHashMultiPut(pairs);
    } else {
      std::vector<hash::MultiOp> ops;
      ops.reserve(batch->size());
      for (const Queued& q : *batch) {
        ops.push_back({q.kind, key_of(q), q.value});
      }
      method = hash::HashMethod::kMultiOp;
      payload = hash::EncodeHashMultiOp(ops);
    }
    core->Call(hash::kHashService, hash::MethodId(method), std::move(payload),
               [this, batch](Status st, std::string reply) {
                 auto items =
                     st.ok() ? hash::DecodeHashMultiReply(reply, batch->size())
                             : Result<std::vector<hash::MultiItem>>(st);
                 std::vector<Queued> again;
                 for (size_t i = 0; i < batch->size(); ++i) {
                   if (!items.ok()) {
                     Answer((*batch)[i], items.status(), nullptr);
                   } else if (hash::ReplyWasFull((*items)[i].status)) {
                     again.push_back(std::move((*batch)[i]));
                   } else {
                     Answer((*batch)[i], (*items)[i].status, &(*items)[i]);
                   }
                 }
                 // Asked again with the next flush, ahead of what was
                 // issued after them (their values did not fit the reply;
                 // each reply answers its first item, so they get there).
                 queued.insert(queued.begin(),
                               std::make_move_iterator(again.begin()),
                               std::make_move_iterator(again.end()));
               });
  }
}

void HashStore::Impl::FinishGet(const std::shared_ptr<AsyncGet>& op,
                                Result<Value> r) {
  if (op->timed) RecordLatency(op->path, op->start);
  if (op->ordered_rpc) {
    op->ordered_rpc = false;
    --ordered_rpc_gets;
  }
  // Never inside the issuing call: a mapped lookup finishes right there.
  core->Defer([this, op, r = std::move(r)]() mutable {
    if (op->tracked) {
      Complete(op->done, std::move(r));
    } else {
      op->done(std::move(r));
    }
  });
}

void HashStore::Impl::QueueLocalGet(hash::Geometry* g, std::string_view key,
                                    GetCallback done, Value* into,
                                    Callback into_done) {
  const hash::KeyHash kh = hash::HashKey(key, g->seed);
  if (local_queue.empty()) PrefetchWholeBucket(*g, kh);
  local_queue.push_back({uint32_t(local_keys.size()), uint32_t(key.size()), g,
                         std::move(done), into, std::move(into_done), kh,
                         core->serving_epoch()});
  local_keys.append(key);
  if (local_queue.size() >= kLocalWindow) RunLocalGets();
}

void HashStore::Impl::LookupMapped(const std::vector<std::string_view>& keys,
                                   const std::vector<size_t>& indices,
                                   std::vector<Value>* values,
                                   std::vector<Status>* statuses,
                                   std::vector<size_t>* gave_up) {
  batch_partitions.resize(indices.size());
  batch_hashes.resize(indices.size());
  for (size_t n = 0; n < indices.size(); ++n) {
    if (n % kPrefetchWindow == 0) {
      // The next window: its addresses, then its prefetches in one burst.
      const size_t end = std::min(n + kPrefetchWindow, indices.size());
      for (size_t j = n; j < end; ++j) {
        const std::string_view k = keys[indices[j]];
        batch_partitions[j] = &PartitionOf(k);
        batch_hashes[j] = hash::HashKey(k, batch_partitions[j]->seed);
      }
      for (size_t j = n; j < end; ++j) {
        PrefetchWholeBucket(*batch_partitions[j], batch_hashes[j]);
      }
    }
    const size_t i = indices[n];
    bool gave = false;
    Status r = GetOneSidedInto(batch_partitions[n], keys[i], &(*values)[i],
                               &gave, &batch_hashes[n]);
    if (gave) {
      ++read_stats.fallbacks;
      gave_up->push_back(i);
    } else {
      ++read_stats.onesided_gets;
      (*statuses)[i] = std::move(r);
    }
  }
}

void HashStore::Impl::RunLocalGets() {
  if (local_queue.empty()) return;
  // Swapped out first: a fallback below queues an RPC, never a local get,
  // but the buffers are reused without reallocating either way.
  local_running.swap(local_queue);
  local_running_keys.swap(local_keys);
  // Sampled as ChoosePath samples single gets: once the path has a
  // history, every 8th window only (two clock reads cost about a tenth of
  // a lone one-sided get).
  const bool timed = selector->mode() == ReadPath::kAuto &&
                     timing.Sample(*selector, client::Path::kOneSided);
  const Clock::time_point start = timed ? Clock::now() : timing.last_now();
  size_t answered = 0;
  for (const LocalGet& op : local_running) PrefetchWholeBucket(*op.g, op.kh);
  for (LocalGet& op : local_running) {
    const std::string_view key(local_running_keys.data() + op.key_begin,
                               op.key_len);
    bool gave_up = false;
    LocalDone d;
    Status st;
    // Ordered (HashOptions::ordered_gets): behind a get that asks the
    // server, by RPC too.
    const bool behind_rpc = ordered_gets && ordered_rpc_gets > 0;
    if (!behind_rpc) {
      st = GetOneSidedInto(op.g, key, op.into ? op.into : &d.value, &gave_up,
                           &op.kh, op.serving_epoch);
    }
    if (gave_up || behind_rpc) {
      // Asks the server (sent by FlushQueued, after this).
      if (gave_up) ++read_stats.fallbacks;
      auto a = std::make_shared<AsyncGet>();
      a->key = std::string(key);
      a->g = op.g;
      a->path = client::Path::kRpc;
      a->done = op.into != nullptr
                    ? IntoAdapter(op.into, std::move(op.into_done))
                    : std::move(op.done);
      GetByRpc(std::move(a));
      continue;
    }
    ++read_stats.onesided_gets;
    ++answered;
    d.done = std::move(op.done);
    d.into_done = std::move(op.into_done);
    d.status = std::move(st);
    local_done.Emplace(std::move(d));
  }
  local_running.clear();
  local_running_keys.clear();
  if (timed && answered > 0) {
    RecordLatency(selector.get(), client::Path::kOneSided, start,
                  double(answered));
  }
  if (!local_done.empty() && !drain_deferred) {
    drain_deferred = true;
    core->Defer([this] { DrainLocalDone(); });
  }
}

void HashStore::Impl::DrainLocalDone() {
  drain_deferred = false;
  // A callback may issue more gets: they land in local_done again, with a
  // drain of their own.
  local_done.RunPass([this](LocalDone&& d) {
    if (!d.done) {
      Complete(d.into_done, std::move(d.status));
    } else if (d.status.ok()) {
      Complete(d.done, Result<Value>(std::move(d.value)));
    } else {
      Complete(d.done, Result<Value>(std::move(d.status)));
    }
  });
}

void HashStore::GetAsync(std::string_view key, GetCallback done) {
  impl_->StartGet(key, std::move(done), /*tracked=*/true);
}

void HashStore::GetAsync(std::string_view key, Value* into, Callback done) {
  impl_->StartGet(key, nullptr, /*tracked=*/true, std::nullopt, into,
                  std::move(done));
}

void HashStore::PutAsync(std::string_view key, std::string_view value,
                         VersionCallback done) {
  auto cb = impl_->Track<Result<uint64_t>>(std::move(done));
  Status st = impl_->CheckKey(key);
  if (st.ok()) st = impl_->CheckValue(value);
  if (!st.ok()) {
    impl_->core->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  impl_->queued.push_back({hash::MultiOpKind::kPut,
                           nullptr,
                           std::string(key),
                           std::string(value),
                           std::move(cb),
                           {},
                           nullptr,
                           0});
}

void HashStore::DeleteAsync(std::string_view key, Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  Status st = impl_->CheckKey(key);
  if (!st.ok()) {
    impl_->core->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  impl_->queued.push_back({hash::MultiOpKind::kDelete,
                           nullptr,
                           std::string(key),
                           {},
                           {},
                           std::move(cb),
                           nullptr,
                           0});
}

Result<std::vector<hash::MultiItem>> HashStore::Impl::CallMulti(
    hash::HashMethod m, std::string payload, size_t count) {
  auto r =
      core->CallSync(hash::kHashService, hash::MethodId(m), std::move(payload));
  if (!r.ok()) return r.status();
  return hash::DecodeHashMultiReply(*r, count);
}

std::vector<Result<HashStore::Value>> HashStore::MultiGet(
    const std::vector<std::string_view>& keys) {
  std::vector<Result<Value>> out(keys.size(), Status::Internal("not answered"));
  if (keys.empty()) return out;
  Impl& s = *impl_;
  // Batches have their own selector: timed every time (one clock pair per
  // batch is cheap).
  const bool timed = s.batch_selector->mode() == ReadPath::kAuto;
  const Clock::time_point start = timed ? Clock::now() : s.timing.last_now();
  const client::Path path = s.batch_selector->Choose(start);
  // By RPC: the keys at `index` in one message (or a few, for very large
  // batches), under one deadline; keys whose values did not fit a reply
  // are asked again (each reply answers at least its first key).
  auto by_rpc = [&](std::vector<size_t> index) {
    while (!index.empty()) {
      std::vector<size_t> again;
      for (auto [b, e] : hash::SplitIntoMessages(
               index.size(), [&](size_t i) { return keys[index[i]].size(); })) {
        std::vector<std::string_view> batch;
        for (size_t i = b; i < e; ++i) batch.push_back(keys[index[i]]);
        auto items = s.CallMulti(hash::HashMethod::kMultiGet,
                                 hash::EncodeHashMultiGet(batch, s.read_flags),
                                 batch.size());
        for (size_t i = b; i < e; ++i) {
          if (!items.ok()) {
            out[index[i]] = items.status();
            continue;
          }
          hash::MultiItem& it = (*items)[i - b];
          if (it.status.ok()) {
            out[index[i]] = Value{std::move(it.data), it.version};
          } else if (hash::ReplyWasFull(it.status)) {
            again.push_back(index[i]);
          } else {
            out[index[i]] = it.status;
          }
        }
        s.read_stats.rpc_gets += e - b;
      }
      index.swap(again);
    }
  };
  if (path == client::Path::kOneSided && s.core->reads_are_local()) {
    // Shared memory: each read is a copy, done at once, in prefetched
    // windows (LookupMapped); a get that gives up asks the server.
    std::vector<size_t> valid, gave_up;
    for (size_t i = 0; i < keys.size(); ++i) {
      Status st = s.CheckKey(keys[i]);
      if (st.ok()) {
        valid.push_back(i);
      } else {
        out[i] = st;
      }
    }
    std::vector<Value> values(keys.size());
    std::vector<Status> statuses(keys.size());
    s.LookupMapped(keys, valid, &values, &statuses, &gave_up);
    for (size_t i : valid) {
      if (statuses[i].ok()) {
        out[i] = std::move(values[i]);
      } else {
        out[i] = std::move(statuses[i]);
      }
    }
    // Together, as one batch by RPC: asked one by one, each waited out
    // its own deadline when the server was paused (N timeouts for N keys).
    if (!gave_up.empty()) by_rpc(std::move(gave_up));
    if (timed) {
      s.RecordLatency(s.batch_selector.get(), path, start, double(keys.size()));
    }
    return out;
  }
  if (path == client::Path::kOneSided) {
    // One batch of reads: every lookup in flight at once.
    size_t pending = keys.size();
    for (size_t i = 0; i < keys.size(); ++i) {
      s.StartGet(
          keys[i],
          [&out, &pending, i](auto r) {
            out[i] = std::move(r);
            --pending;
          },
          /*tracked=*/false, path);
    }
    // Gets that fall back to RPC queue it meanwhile: ProgressUntil flushes
    // each round.
    Status st =
        s.core->ProgressUntil([&] { return pending == 0; },
                              Clock::now() + 2 * s.core->options().timeout);
    if (!st.ok()) {
      s.core->Fail(Status::TimedOut("multi-get did not complete"));
      (void)s.core->worker()->ProgressUntil(
          [&] { return pending == 0; }, Clock::now() + std::chrono::seconds(5));
    }
    if (timed) {
      s.RecordLatency(s.batch_selector.get(), path, start, double(keys.size()));
    }
    return out;
  }
  // One message (or a few, for very large batches).
  std::vector<size_t> index;  // keys that passed the local checks
  for (size_t i = 0; i < keys.size(); ++i) {
    Status st = s.CheckKey(keys[i]);
    if (st.ok()) {
      index.push_back(i);
    } else {
      out[i] = st;
    }
  }
  by_rpc(std::move(index));
  // Per key, so that batches of different sizes compare.
  if (timed) {
    s.RecordLatency(s.batch_selector.get(), path, start, double(keys.size()));
  }
  return out;
}

void HashStore::MultiGetAsync(const std::vector<std::string_view>& keys,
                              MultiGetCallback done) {
  // Storage of its own, then the results as Result<Value>s.
  struct Holder {
    std::vector<Value> values;
    std::vector<Status> statuses;
  };
  auto h = std::make_shared<Holder>();
  MultiGetAsync(keys, &h->values, &h->statuses,
                [h, done = std::move(done)](Status) {
                  std::vector<Result<Value>> out;
                  out.reserve(h->values.size());
                  for (size_t i = 0; i < h->values.size(); ++i) {
                    if (h->statuses[i].ok()) {
                      out.emplace_back(std::move(h->values[i]));
                    } else {
                      out.emplace_back(std::move(h->statuses[i]));
                    }
                  }
                  if (done) done(std::move(out));
                });
}

void HashStore::MultiGetAsync(const std::vector<std::string_view>& keys,
                              std::vector<Value>* values,
                              std::vector<Status>* statuses, Callback done) {
  Impl& s = *impl_;
  struct State : Impl::BatchSink, std::enable_shared_from_this<State> {
    Impl* s = nullptr;
    std::vector<Value>* values = nullptr;
    std::vector<Status>* statuses = nullptr;
    size_t pending = 1;  // the issuing call's own share, released last
    Callback done;
    bool timed = false;
    Clock::time_point start;
    client::Path path = client::Path::kOneSided;
    // Called once per share; the last one answers (at a Poll: never
    // inside the issuing call).
    void Release() {
      if (--pending > 0) return;
      if (timed) {
        s->RecordLatency(s->batch_selector.get(), path, start,
                         double(values->size()));
      }
      s->core->Defer([self = shared_from_this()] {
        Status first;  // the first error other than NotFound
        for (const Status& k : *self->statuses) {
          if (!k.ok() && k.code() != StatusCode::kNotFound) {
            first = k;
            break;
          }
        }
        --self->s->in_flight;
        // WaitAll reports it as the callback gets it (it was OK always,
        // so a timed-out multi-get went unseen by a caller that checks
        // only WaitAll).
        self->s->core->Ended(first);
        if (self->done) self->done(std::move(first));
      });
    }
    void Set(size_t index, Result<Value> r) override {
      if (r.ok()) {
        (*values)[index] = std::move(*r);
        (*statuses)[index] = Status::OK();
      } else {
        (*statuses)[index] = r.status();
      }
      Release();
    }
  };
  values->resize(keys.size());
  statuses->resize(keys.size());
  auto st = std::make_shared<State>();
  st->s = &s;
  st->values = values;
  st->statuses = statuses;
  st->done = std::move(done);
  s.Began();
  const bool rides_batch = !keys.empty() && s.RidesBatch(*s.batch_selector);
  st->timed = !rides_batch && s.batch_selector->mode() == ReadPath::kAuto &&
              !keys.empty();
  st->start = st->timed ? Clock::now() : s.timing.last_now();
  st->path =
      rides_batch ? client::Path::kRpc : s.batch_selector->Choose(st->start);
  auto release = [st] { st->Release(); };
  std::vector<size_t>& by_rpc = s.batch_by_rpc;  // keys the server answers
  std::vector<size_t>& valid = s.batch_valid;
  by_rpc.clear();
  valid.clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    Status c = s.CheckKey(keys[i]);
    if (c.ok()) {
      valid.push_back(i);
    } else {
      (*statuses)[i] = std::move(c);
    }
  }
  if (st->path == client::Path::kOneSided && s.core->reads_are_local()) {
    // A get that gives up asks the server, in one message with the others.
    s.LookupMapped(keys, valid, values, statuses, &by_rpc);
  } else if (st->path == client::Path::kOneSided) {
    // One-sided reads over the network: every lookup in flight at once.
    for (size_t i : valid) {
      ++st->pending;
      s.StartGet(
          keys[i], [st, i](Result<Value> r) { st->Set(i, std::move(r)); },
          /*tracked=*/false, client::Path::kOneSided);
    }
  } else {
    by_rpc.swap(valid);
  }
  // Keys the server answers join the store's queue: they go out at the next
  // Poll in one message with every other request queued meanwhile (other
  // batches, single gets, puts), in issue order.
  for (size_t i : by_rpc) {
    ++st->pending;
    s.queued.push_back({hash::MultiOpKind::kGet,
                        nullptr,
                        std::string(keys[i]),
                        {},
                        {},
                        {},
                        st,
                        i});
  }
  release();
}

std::vector<Result<uint64_t>> HashStore::MultiPut(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  std::vector<Result<uint64_t>> out(pairs.size(),
                                    Status::Internal("not answered"));
  Impl& s = *impl_;
  std::vector<size_t> index;
  for (size_t i = 0; i < pairs.size(); ++i) {
    Status st = s.CheckKey(pairs[i].first);
    if (st.ok()) st = s.CheckValue(pairs[i].second);
    if (st.ok()) {
      index.push_back(i);
    } else {
      out[i] = st;
    }
  }
  for (auto [b, e] : hash::SplitIntoMessages(index.size(), [&](size_t i) {
         return pairs[index[i]].first.size() + pairs[index[i]].second.size();
       })) {
    std::vector<hash::KeyValue> batch;
    for (size_t i = b; i < e; ++i) batch.push_back(pairs[index[i]]);
    auto items = s.CallMulti(hash::HashMethod::kMultiPut,
                             hash::EncodeHashMultiPut(batch), batch.size());
    for (size_t i = b; i < e; ++i) {
      if (!items.ok()) {
        out[index[i]] = items.status();
        continue;
      }
      const hash::MultiItem& it = (*items)[i - b];
      if (it.status.ok()) {
        out[index[i]] = it.version;
      } else {
        out[index[i]] = it.status;
      }
    }
  }
  return out;
}

const HashStore::ReadStats& HashStore::read_stats() const {
  impl_->read_stats.onesided_estimate_us =
      impl_->selector->Estimate(client::Path::kOneSided);
  impl_->read_stats.rpc_estimate_us =
      impl_->selector->Estimate(client::Path::kRpc);
  return impl_->read_stats;
}

uint32_t HashStore::max_key() const { return impl_->info.max_key; }
uint32_t HashStore::max_value() const { return impl_->info.max_value; }
ReadPath HashStore::read_path() const { return impl_->selector->mode(); }
size_t HashStore::in_flight() const { return impl_->in_flight; }

}  // namespace remem
