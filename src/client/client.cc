#include "remem/client.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "client/path_selector.h"
#include "fabric/context.h"
#include "fabric/endpoint.h"
#include "fabric/memory_region.h"
#include "fabric/rpc_client.h"
#include "fabric/worker.h"
#include "hash/reader.h"
#include "proto/codec.h"

namespace remem {

using fabric::Clock;

namespace {
// Verification failures before a one-sided get gives up and asks the
// server. Each failure means the server was writing that bucket or extent
// at that moment; a few in a row mean a hot key, where the server's answer
// is the cheaper one.
constexpr int kMaxOneSidedAttempts = 16;

void PrefaultForReading(const uint8_t* p, uint64_t len) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14
#endif
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + len;
  // Best effort: an older kernel refuses, and reads then fault lazily.
  (void)madvise(reinterpret_cast<void*>(start), end - start,
                MADV_POPULATE_READ);
}
}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<fabric::Context> ctx;
  std::unique_ptr<fabric::Worker> worker;
  std::unique_ptr<fabric::Endpoint> ep;
  std::unique_ptr<fabric::RpcClient> rpc;
  std::unordered_map<uint32_t, std::unique_ptr<fabric::RemoteRegion>> remote;
  std::vector<RegionInfo> regions;
  uint64_t incarnation = 0;
  std::string transport;
  bool local_reads = false;
  size_t in_flight = 0;
  Status first_error;
  // Hash store.
  proto::HashInfo hash;
  std::vector<hash::Geometry> partitions;
  std::unordered_set<uint32_t> hash_regions;
  std::unique_ptr<client::PathSelector> selector;
  // Batches (MultiGet) cost differently from single gets on each path, so
  // they are measured and chosen apart.
  std::unique_ptr<client::PathSelector> batch_selector;
  ReadStats read_stats;
  // Sampling of get latencies for the selector (auto mode only).
  client::ReadPath last_path = client::ReadPath::kOneSided;
  uint64_t sample_counter = 0;
  Clock::time_point last_now = Clock::now();

  // Chooses the path of the next get and whether to time it. Two clock
  // reads cost about a third of a one-sided get on shared memory, so once a
  // path has enough samples only every 8th get on it is timed; a change of
  // path (exploration, or a switch) is always timed. Choose() gets the last
  // measured time, which is enough for its 3 s idle reset.
  client::ReadPath ChoosePath(bool* timed, Clock::time_point* start) {
    if (selector->mode() != ReadPath::kAuto) {
      *timed = false;
      return selector->Choose(last_now);
    }
    const client::ReadPath p = selector->Choose(last_now);
    *timed = p != last_path || selector->Samples(p) < 32 ||
             (++sample_counter & 7) == 0;
    last_path = p;
    if (*timed) {
      *start = Clock::now();
      last_now = *start;
    }
    return p;
  }
  void RecordLatency(client::ReadPath p, Clock::time_point start) {
    RecordLatency(selector.get(), p, start, 1);
  }
  void RecordLatency(client::PathSelector* into, client::ReadPath p,
                     Clock::time_point start, double divide_by) {
    const auto end = Clock::now();
    last_now = end;
    into->Record(
        p,
        std::chrono::duration<double, std::micro>(end - start).count() /
            divide_by,
        end);
  }

  Result<Value> HashGetOneSided(hash::Geometry* g, std::string_view key,
                                bool* gave_up);
  // A one-sided read, done before returning (a copy when mapped).
  Status ReadNow(const hash::ReadRequest& req);
  // Re-reads the partition root into `g`.
  Status RefreshRoot(hash::Geometry* g);
  // After `g` names a new bucket array: fault this process's mapping of it
  // in now (shared memory only). Otherwise the first one-sided gets each
  // take a page fault and look slower than the RPC path, which the
  // selector then prefers for a long time. Only the live array: the rest
  // of the region may never have been touched by the server.
  void Prefault(const hash::Geometry& g) {
    const fabric::RemoteRegion& r = *remote.at(g.region);
    if (r.mapped() == nullptr) return;
    const uint64_t bytes = g.num_buckets * hash::kBucketBytes;
    if (r.Check(g.buckets_offset, bytes).ok()) {
      PrefaultForReading(r.mapped() + g.buckets_offset, bytes);
    }
  }
  hash::Geometry& PartitionOf(std::string_view key) {
    return partitions[XXH3_64bits_withSeed(key.data(), key.size(),
                                           hash.partition_seed) %
                      partitions.size()];
  }
  Result<Value> HashGetRpc(std::string_view key);
  Result<uint64_t> HashPut(std::string_view key, std::string_view value,
                           proto::PutMode mode, uint64_t expected);
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
    client::ReadPath path = client::ReadPath::kOneSided;
    bool timed = false;  // its latency goes to the selector
    Clock::time_point start;
    std::function<void(Result<Value>)> done;
  };
  // `forced`: the path a batch chose for all its keys; else the selector
  // chooses.
  // Asynchronous gets and puts that go by RPC wait here until the next
  // Poll/WaitAll (or a batch call), which sends each run of consecutive
  // gets (or puts) as one message: many requests in flight cost one send
  // each way instead of one per request (what Redis calls pipelining, done
  // for the application). Runs go out in issue order.
  struct Queued {
    bool is_get;
    std::shared_ptr<AsyncGet> get;  // is_get
    std::string key, value;         // !is_get
    std::function<void(Result<uint64_t>)> put_done;
  };
  std::vector<Queued> queued;
  void FlushQueued();
  void SendGets(std::vector<std::shared_ptr<AsyncGet>> ops);
  void SendPuts(std::vector<Queued> puts);

  void StartGet(std::string key, std::function<void(Result<Value>)> done,
                std::optional<client::ReadPath> forced = std::nullopt);
  void DriveOneSided(std::shared_ptr<AsyncGet> op);
  void GetByRpc(std::shared_ptr<AsyncGet> op);
  void FinishGet(const std::shared_ptr<AsyncGet>& op, Result<Value> r);
  // Sends a multi-get or multi-put message and decodes its items.
  Result<std::vector<proto::MultiItem>> CallMulti(proto::Opcode op,
                                                  std::string payload,
                                                  size_t count);
  Status CheckValue(std::string_view value) const {
    if (value.size() > hash.max_value) {
      return Status::InvalidArgument(
          "value of " + std::to_string(value.size()) +
          " bytes exceeds the limit of " + std::to_string(hash.max_value));
    }
    return Status::OK();
  }
  Status CheckKey(std::string_view key) const {
    if (key.empty()) return Status::InvalidArgument("empty key");
    if (key.size() > hash.max_key) {
      return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(hash.max_key));
    }
    return Status::OK();
  }

  ~Impl() {
    // Outstanding operations complete here, while every member their
    // callbacks touch is still alive. First let them finish (bounded by the
    // timeout) so the connection can close gracefully and the server is
    // not left answering a closed connection (harmless since one-sided
    // operations over tcp are served by remem, see docs/ARCHITECTURE.md
    // item 10, but wasted). Whatever is left then fails with Unavailable.
    if (ep && !ep->failed() && worker) {
      // (Fallbacks queue RPCs while this waits: flush each round.)
      (void)worker->ProgressUntil(
          [this] {
            FlushQueued();
            return in_flight == 0;
          },
          Clock::now() + options.timeout);
      if (in_flight > 0) ep->Fail(Status::Unavailable("client closed"));
    }
    if (rpc) rpc->FailAll(Status::Unavailable("client closed"));
    // Requests never sent (the connection failed first).
    for (Queued& q : queued) {
      const Status gone = Status::Unavailable("client closed");
      if (q.is_get) {
        if (worker) FinishGet(q.get, gone);
      } else if (worker) {
        worker->Defer(
            [cb = std::move(q.put_done), gone]() mutable { cb(gone); });
      }
    }
    queued.clear();
    if (worker) {
      (void)worker->ProgressUntil([this] { return in_flight == 0; },
                                  Clock::now() + std::chrono::seconds(30));
      // No reply may reach the RpcClient once it is gone.
      worker->RemoveAmHandler(proto::kAmReply);
    }
    // Keys before the endpoint, calls before the worker.
    remote.clear();
    rpc.reset();
    ep.reset();
  }

  Clock::time_point Deadline() const { return Clock::now() + options.timeout; }

  Result<const fabric::RemoteRegion*> Locate(RemoteAddress a, uint64_t len) {
    auto it = remote.find(a.region);
    if (hash_regions.count(a.region)) {
      return Status::InvalidArgument("region " + std::to_string(a.region) +
                                     " holds the hash store; raw access to it "
                                     "is refused");
    }
    if (it == remote.end()) {
      return Status::InvalidArgument("no region " + std::to_string(a.region) +
                                     " on this server");
    }
    REMEM_RETURN_IF_ERROR(it->second->Check(a.offset, len));
    return it->second.get();
  }

  Status CheckAtomic(RemoteAddress a) {
    if (a.offset % 8 != 0) {
      return Status::InvalidArgument(
          "atomic operations need an 8-byte "
          "aligned offset");
    }
    return Status::OK();
  }

  // Wraps an async callback so in_flight/first_error are kept.
  template <typename Arg, typename Fn>
  auto Track(Fn done) {
    ++in_flight;
    return [this, done = std::move(done)](Arg r) mutable {
      --in_flight;
      const Status& st = StatusOf(r);
      if (!st.ok() && first_error.ok()) first_error = st;
      if (done) done(std::move(r));
    };
  }
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static const Status& StatusOf(const Result<T>& r) {
    return r.status();
  }
};

namespace {}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const auto deadline = impl->Deadline();
  auto ctx = fabric::Context::Shared(options.transport);
  if (!ctx.ok()) return ctx.status();
  impl->ctx = *ctx;
  auto worker = fabric::Worker::Create(impl->ctx, proto::kMaxRpcPayload);
  if (!worker.ok()) return worker.status();
  impl->worker = std::move(*worker);
  auto ep =
      fabric::Endpoint::Connect(impl->worker.get(), options.server, deadline);
  if (!ep.ok()) return ep.status();
  impl->ep = std::move(*ep);
  auto rpc = fabric::RpcClient::Create(impl->worker.get(), impl->ep.get());
  if (!rpc.ok()) return rpc.status();
  impl->rpc = std::move(*rpc);
  Impl* raw = impl.get();
  impl->ep->SetFailureHandler(
      [raw](const Status& why) { raw->rpc->FailAll(why); });

  proto::Hello hello;
  hello.secret = options.secret;
  auto reply = impl->rpc->CallSync(proto::Opcode::kHello,
                                   proto::EncodeHelloRequest(hello), deadline);
  if (!reply.ok()) {
    return reply.status().WithContext("handshake with " + options.server);
  }
  auto info = proto::DecodeHelloReply(*reply);
  if (!info.ok()) {
    return info.status().WithContext("handshake with " + options.server);
  }
  impl->incarnation = info->incarnation;
  for (const auto& r : info->regions) {
    auto region = fabric::RemoteRegion::Unpack(impl->ep->handle(), r.region_id,
                                               r.base, r.length, r.rkey);
    if (!region.ok()) return region.status();
    impl->remote.emplace(r.region_id, std::move(*region));
  }
  auto hash_reply =
      impl->rpc->CallSync(proto::Opcode::kHashInfo, {}, impl->Deadline());
  if (!hash_reply.ok()) return hash_reply.status().WithContext("hash info");
  auto hash_info = proto::DecodeHashInfo(*hash_reply);
  if (!hash_info.ok()) return hash_info.status().WithContext("hash info");
  impl->hash = std::move(*hash_info);
  for (const proto::HashPartition& p : impl->hash.partitions) {
    if (!impl->remote.count(p.region)) {
      return Status::ProtocolError("hash partition in unknown region " +
                                   std::to_string(p.region));
    }
    impl->hash_regions.insert(p.region);
    impl->partitions.push_back({uint16_t(p.region), p.root_offset, 0,
                                p.buckets_offset, p.num_buckets, p.seed});
  }
  for (const auto& r : info->regions) {
    if (!impl->hash_regions.count(r.region_id)) {
      impl->regions.push_back({r.region_id, r.length});
    }
  }
  // The tables may have grown since the server encoded its hash info.
  for (hash::Geometry& g : impl->partitions) {
    Status st = impl->RefreshRoot(&g);
    if (!st.ok()) return st.WithContext("reading the hash store's root");
    impl->Prefault(g);
  }
  client::PathSelectorOptions so;
  so.mode = options.read_path;
  impl->selector = std::make_unique<client::PathSelector>(so);
  impl->batch_selector = std::make_unique<client::PathSelector>(so);
  impl->transport = impl->ep->TransportDescription();
  // Over tcp the server performs one-sided operations itself (see
  // fabric/endpoint.h); say so where the transport is shown.
  if (impl->ep->served()) impl->transport += ", one-sided served by remem";
  impl->local_reads = !impl->remote.empty() &&
                      impl->remote.begin()->second->mapped() != nullptr;
  if (options.transport == Transport::kShm && !impl->ep->UsesSharedMemory()) {
    return Status::Unavailable(
        "--transport shm: the server at " + options.server +
        " is not reachable over shared memory (UCX chose " + impl->transport +
        "); is it on another host?");
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

// --- hash store

Status Client::Impl::ReadNow(const hash::ReadRequest& req) {
  auto it = remote.find(req.region);
  if (it == remote.end()) return Status::ProtocolError("unknown region");
  REMEM_RETURN_IF_ERROR(it->second->Check(req.offset, req.len));
  return ep->GetSync(req.dst, req.len, *it->second, req.offset,
                     options.timeout);
}

Status Client::Impl::RefreshRoot(hash::Geometry* g) {
  hash::Root root;
  for (int i = 0; i < kMaxOneSidedAttempts; ++i) {
    REMEM_RETURN_IF_ERROR(ReadNow(hash::RootRequest(*g, &root)));
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

Result<Client::Value> Client::Impl::HashGetOneSided(hash::Geometry* g,
                                                    std::string_view key,
                                                    bool* gave_up) {
  for (int attempt = 0; attempt < kMaxOneSidedAttempts; ++attempt) {
    hash::Lookup lookup(*g, key);
    hash::ReadRequest req;
    while (lookup.Next(&req)) REMEM_RETURN_IF_ERROR(ReadNow(req));
    read_stats.reads += uint64_t(lookup.reads());
    if (lookup.outcome() == hash::Lookup::kFound) {
      return Value{std::move(lookup.value()), lookup.version()};
    }
    if (lookup.outcome() == hash::Lookup::kNotFound) {
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

Result<Client::Value> Client::Impl::HashGetRpc(std::string_view key) {
  FlushQueued();  // requests go out in issue order
  auto r = rpc->CallSync(proto::Opcode::kHashGet, proto::EncodeHashKey(key),
                         Deadline());
  if (!r.ok()) return r.status();
  auto v = proto::DecodeHashGetReply(*r);
  if (!v.ok()) return v.status();
  return Value{std::move(v->value), v->version};
}

Result<uint64_t> Client::Impl::HashPut(std::string_view key,
                                       std::string_view value,
                                       proto::PutMode mode, uint64_t expected) {
  REMEM_RETURN_IF_ERROR(CheckKey(key));
  REMEM_RETURN_IF_ERROR(CheckValue(value));
  FlushQueued();  // requests go out in issue order
  auto r = rpc->CallSync(proto::Opcode::kHashPut,
                         proto::EncodeHashPut({key, value, mode, expected}),
                         Deadline());
  if (!r.ok()) return r.status();
  return proto::DecodeHashPutReply(*r);
}

Result<Client::Value> Client::Get(std::string_view key) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  hash::Geometry& g = impl_->PartitionOf(key);
  // Latencies feed the selector only in auto mode; a forced path skips the
  // two clock reads (a tenth of a one-sided get's cost on shared memory).
  bool timed = false;
  Clock::time_point start;
  const client::ReadPath path = impl_->ChoosePath(&timed, &start);
  auto record = [&] {
    if (timed) impl_->RecordLatency(path, start);
  };
  if (path == client::ReadPath::kOneSided) {
    bool gave_up = false;
    auto r = impl_->HashGetOneSided(&g, key, &gave_up);
    if (!gave_up) {
      record();
      ++impl_->read_stats.onesided_gets;
      return r;
    }
    ++impl_->read_stats.fallbacks;
  }
  auto r = impl_->HashGetRpc(key);
  record();
  ++impl_->read_stats.rpc_gets;
  return r;
}

Result<uint64_t> Client::Put(std::string_view key, std::string_view value) {
  return impl_->HashPut(key, value, proto::PutMode::kUpsert, 0);
}

Result<uint64_t> Client::PutIfAbsent(std::string_view key,
                                     std::string_view value) {
  return impl_->HashPut(key, value, proto::PutMode::kIfAbsent, 0);
}

Result<uint64_t> Client::CompareAndPut(std::string_view key,
                                       std::string_view value,
                                       uint64_t expected) {
  return impl_->HashPut(key, value, proto::PutMode::kIfVersion, expected);
}

Status Client::Delete(std::string_view key) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  impl_->FlushQueued();  // requests go out in issue order
  return impl_->rpc
      ->CallSync(proto::Opcode::kHashDelete, proto::EncodeHashKey(key),
                 impl_->Deadline())
      .status();
}

// --- hash store, asynchronous and batched

void Client::Impl::StartGet(std::string key,
                            std::function<void(Result<Value>)> done,
                            std::optional<client::ReadPath> forced) {
  auto op = std::make_shared<AsyncGet>();
  op->done = std::move(done);
  Status st = CheckKey(key);
  if (!st.ok()) {
    worker->Defer([op, st] { op->done(st); });
    return;
  }
  op->key = std::move(key);
  op->g = &PartitionOf(op->key);
  if (forced) {
    op->path = *forced;
  } else {
    op->path = ChoosePath(&op->timed, &op->start);
  }
  if (op->path == client::ReadPath::kRpc) return GetByRpc(std::move(op));
  op->lookup.emplace(*op->g, op->key);
  DriveOneSided(std::move(op));
}

void Client::Impl::DriveOneSided(std::shared_ptr<AsyncGet> op) {
  while (true) {
    hash::ReadRequest req;
    if (op->reading_root && op->root_loaded) {
      op->root_loaded = false;
      const uint64_t generation = op->g->generation;
      if (hash::ApplyRoot(op->root, op->g)) {
        if (op->g->generation != generation) Prefault(*op->g);
        op->reading_root = false;
        op->lookup.emplace(*op->g, op->key);
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
        ++read_stats.onesided_gets;
        return FinishGet(op, Value{std::move(l.value()), l.version()});
      }
      if (l.outcome() == hash::Lookup::kNotFound) {
        ++read_stats.onesided_gets;
        return FinishGet(op, Status::NotFound("key not found"));
      }
      ++read_stats.retries;
      if (++op->attempt >= kMaxOneSidedAttempts) break;
      if (l.bucket_failed()) {
        op->reading_root = true;  // the table may have grown
      } else {
        op->lookup.emplace(*op->g, op->key);
      }
      continue;
    }
    auto it = remote.find(req.region);
    Status st = it == remote.end() ? Status::ProtocolError("unknown region")
                                   : it->second->Check(req.offset, req.len);
    if (!st.ok()) return FinishGet(op, st);
    if (op->reading_root) ++read_stats.reads;
    if (it->second->mapped() != nullptr) {
      // A copy out of the mapping: done at once.
      st = ep->GetSync(req.dst, req.len, *it->second, req.offset,
                       options.timeout);
      if (!st.ok()) return FinishGet(op, st);
      if (op->reading_root) op->root_loaded = true;
      continue;
    }
    ep->Get(req.dst, req.len, *it->second, req.offset,
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

void Client::Impl::GetByRpc(std::shared_ptr<AsyncGet> op) {
  queued.push_back({true, std::move(op), {}, {}, nullptr});
}

void Client::Impl::FlushQueued() {
  if (queued.empty()) return;
  std::vector<Queued> all;
  all.swap(queued);
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].is_get == all[i].is_get) ++j;
    if (all[i].is_get) {
      std::vector<std::shared_ptr<AsyncGet>> ops;
      for (size_t k = i; k < j; ++k) ops.push_back(std::move(all[k].get));
      SendGets(std::move(ops));
    } else {
      SendPuts(std::vector<Queued>(std::make_move_iterator(all.begin() + i),
                                   std::make_move_iterator(all.begin() + j)));
    }
    i = j;
  }
}

void Client::Impl::SendGets(std::vector<std::shared_ptr<AsyncGet>> ops) {
  if (ops.size() == 1) {
    auto op = std::move(ops[0]);
    rpc->Call(proto::Opcode::kHashGet, proto::EncodeHashKey(op->key),
              Deadline(), [this, op](Status st, std::string reply) {
                ++read_stats.rpc_gets;
                if (!st.ok()) return FinishGet(op, st);
                auto v = proto::DecodeHashGetReply(reply);
                if (!v.ok()) return FinishGet(op, v.status());
                FinishGet(op, Value{std::move(v->value), v->version});
              });
    return;
  }
  // At most kMaxMultiItems and about 16 MiB of keys per message.
  for (size_t b = 0, e = 0; b < ops.size(); b = e) {
    size_t bytes = 0;
    for (e = b; e < ops.size() && e - b < proto::kMaxMultiItems &&
                (e == b || bytes + ops[e]->key.size() < (16u << 20));
         ++e) {
      bytes += ops[e]->key.size();
    }
    auto batch = std::make_shared<std::vector<std::shared_ptr<AsyncGet>>>(
        ops.begin() + long(b), ops.begin() + long(e));
    std::vector<std::string_view> keys;
    for (const auto& op : *batch) keys.push_back(op->key);
    rpc->Call(proto::Opcode::kHashMultiGet, proto::EncodeHashMultiGet(keys),
              Deadline(), [this, batch](Status st, std::string reply) {
                read_stats.rpc_gets += batch->size();
                auto items =
                    st.ok() ? proto::DecodeHashMultiReply(reply, batch->size())
                            : Result<std::vector<proto::MultiItem>>(st);
                for (size_t i = 0; i < batch->size(); ++i) {
                  if (!items.ok()) {
                    FinishGet((*batch)[i], items.status());
                  } else if (!(*items)[i].status.ok()) {
                    FinishGet((*batch)[i], (*items)[i].status);
                  } else {
                    FinishGet((*batch)[i], Value{std::move((*items)[i].data),
                                                 (*items)[i].version});
                  }
                }
              });
  }
}

void Client::Impl::SendPuts(std::vector<Queued> puts) {
  if (puts.size() == 1) {
    auto cb = std::move(puts[0].put_done);
    rpc->Call(proto::Opcode::kHashPut,
              proto::EncodeHashPut(
                  {puts[0].key, puts[0].value, proto::PutMode::kUpsert, 0}),
              Deadline(), [cb](Status s, std::string reply) mutable {
                if (!s.ok()) return cb(s);
                cb(proto::DecodeHashPutReply(reply));
              });
    return;
  }
  // At most kMaxMultiItems and about 16 MiB per message.
  size_t b = 0;
  while (b < puts.size()) {
    size_t e = b, bytes = 0;
    while (e < puts.size() && e - b < proto::kMaxMultiItems &&
           (e == b ||
            bytes + puts[e].key.size() + puts[e].value.size() < (16u << 20))) {
      bytes += puts[e].key.size() + puts[e].value.size();
      ++e;
    }
    auto batch = std::make_shared<std::vector<Queued>>(
        std::make_move_iterator(puts.begin() + long(b)),
        std::make_move_iterator(puts.begin() + long(e)));
    std::vector<proto::KeyValue> pairs;
    for (const auto& q : *batch) pairs.emplace_back(q.key, q.value);
    rpc->Call(proto::Opcode::kHashMultiPut, proto::EncodeHashMultiPut(pairs),
              Deadline(), [batch](Status st, std::string reply) {
                auto items =
                    st.ok() ? proto::DecodeHashMultiReply(reply, batch->size())
                            : Result<std::vector<proto::MultiItem>>(st);
                for (size_t i = 0; i < batch->size(); ++i) {
                  auto& cb = (*batch)[i].put_done;
                  if (!items.ok()) {
                    cb(items.status());
                  } else if (!(*items)[i].status.ok()) {
                    cb((*items)[i].status);
                  } else {
                    cb((*items)[i].version);
                  }
                }
              });
    b = e;
  }
}

void Client::Impl::FinishGet(const std::shared_ptr<AsyncGet>& op,
                             Result<Value> r) {
  if (op->timed) RecordLatency(op->path, op->start);
  // Never inside the issuing call: a mapped lookup finishes right there.
  worker->Defer([op, r = std::move(r)]() mutable { op->done(std::move(r)); });
}

void Client::GetAsync(std::string_view key, GetCallback done) {
  impl_->StartGet(std::string(key),
                  impl_->Track<Result<Value>>(std::move(done)));
}

void Client::PutAsync(std::string_view key, std::string_view value,
                      ValueCallback done) {
  auto cb = impl_->Track<Result<uint64_t>>(std::move(done));
  Status st = impl_->CheckKey(key);
  if (st.ok()) st = impl_->CheckValue(value);
  if (!st.ok()) {
    impl_->worker->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  impl_->queued.push_back(
      {false, nullptr, std::string(key), std::string(value), std::move(cb)});
}

void Client::DeleteAsync(std::string_view key, Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  Status st = impl_->CheckKey(key);
  if (!st.ok()) {
    impl_->worker->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  impl_->FlushQueued();  // requests go out in issue order
  impl_->rpc->Call(proto::Opcode::kHashDelete, proto::EncodeHashKey(key),
                   impl_->Deadline(),
                   [cb](Status s, std::string) mutable { cb(s); });
}

Result<std::vector<proto::MultiItem>> Client::Impl::CallMulti(
    proto::Opcode op, std::string payload, size_t count) {
  auto r = rpc->CallSync(op, std::move(payload), Deadline());
  if (!r.ok()) return r.status();
  return proto::DecodeHashMultiReply(*r, count);
}

namespace {

// Splits [0, n) into batches that fit one message: at most kMaxMultiItems
// items and (about) half the largest payload.
template <typename SizeOf>
std::vector<std::pair<size_t, size_t>> Batches(size_t n, SizeOf size_of) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0, bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t b = size_of(i) + 16;
    if (i > begin && (i - begin == proto::kMaxMultiItems ||
                      bytes + b > proto::kMaxRpcPayload / 2)) {
      out.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += b;
  }
  if (n > begin) out.emplace_back(begin, n);
  return out;
}

}  // namespace

std::vector<Result<Client::Value>> Client::MultiGet(
    const std::vector<std::string_view>& keys) {
  std::vector<Result<Value>> out(keys.size(), Status::Internal("not answered"));
  if (keys.empty()) return out;
  // Batches have their own selector: timed every time (one clock pair per
  // batch is cheap).
  const bool timed = impl_->batch_selector->mode() == ReadPath::kAuto;
  const Clock::time_point start = timed ? Clock::now() : impl_->last_now;
  const client::ReadPath path = impl_->batch_selector->Choose(start);
  if (path == client::ReadPath::kOneSided && impl_->local_reads) {
    // Shared memory: each read is a copy, done at once; nothing to overlap.
    for (size_t i = 0; i < keys.size(); ++i) {
      Status st = impl_->CheckKey(keys[i]);
      if (!st.ok()) {
        out[i] = st;
        continue;
      }
      bool gave_up = false;
      out[i] = impl_->HashGetOneSided(&impl_->PartitionOf(keys[i]), keys[i],
                                      &gave_up);
      if (gave_up) {
        ++impl_->read_stats.fallbacks;
        ++impl_->read_stats.rpc_gets;
        out[i] = impl_->HashGetRpc(keys[i]);
      } else {
        ++impl_->read_stats.onesided_gets;
      }
    }
    if (timed) {
      impl_->RecordLatency(impl_->batch_selector.get(), path, start,
                           double(keys.size()));
    }
    return out;
  }
  if (path == client::ReadPath::kOneSided) {
    // One batch of reads: every lookup in flight at once.
    size_t pending = keys.size();
    for (size_t i = 0; i < keys.size(); ++i) {
      impl_->StartGet(
          std::string(keys[i]),
          [&out, &pending, i](auto r) {
            out[i] = std::move(r);
            --pending;
          },
          path);
    }
    // Gets that fall back to RPC queue it meanwhile: flush each round.
    Status st = impl_->worker->ProgressUntil(
        [&] {
          impl_->FlushQueued();
          return pending == 0;
        },
        Clock::now() + 2 * impl_->options.timeout);
    if (!st.ok()) {
      impl_->ep->Fail(Status::TimedOut("multi-get did not complete"));
      (void)impl_->worker->ProgressUntil(
          [&] { return pending == 0; }, Clock::now() + std::chrono::seconds(5));
    }
    if (timed) {
      impl_->RecordLatency(impl_->batch_selector.get(), path, start,
                           double(keys.size()));
    }
    return out;
  }
  // One message (or a few, for very large batches).
  std::vector<size_t> index;  // keys that passed the local checks
  for (size_t i = 0; i < keys.size(); ++i) {
    Status st = impl_->CheckKey(keys[i]);
    if (st.ok()) {
      index.push_back(i);
    } else {
      out[i] = st;
    }
  }
  for (auto [b, e] :
       Batches(index.size(), [&](size_t i) { return keys[index[i]].size(); })) {
    std::vector<std::string_view> batch;
    for (size_t i = b; i < e; ++i) batch.push_back(keys[index[i]]);
    auto items =
        impl_->CallMulti(proto::Opcode::kHashMultiGet,
                         proto::EncodeHashMultiGet(batch), batch.size());
    for (size_t i = b; i < e; ++i) {
      if (!items.ok()) {
        out[index[i]] = items.status();
        continue;
      }
      proto::MultiItem& it = (*items)[i - b];
      if (it.status.ok()) {
        out[index[i]] = Value{std::move(it.data), it.version};
      } else {
        out[index[i]] = it.status;
      }
    }
    impl_->read_stats.rpc_gets += e - b;
  }
  // Per key, so that batches of different sizes compare.
  if (timed) {
    impl_->RecordLatency(impl_->batch_selector.get(), path, start,
                         double(keys.size()));
  }
  return out;
}

std::vector<Result<uint64_t>> Client::MultiPut(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  std::vector<Result<uint64_t>> out(pairs.size(),
                                    Status::Internal("not answered"));
  impl_->FlushQueued();  // requests go out in issue order
  std::vector<size_t> index;
  for (size_t i = 0; i < pairs.size(); ++i) {
    Status st = impl_->CheckKey(pairs[i].first);
    if (st.ok()) st = impl_->CheckValue(pairs[i].second);
    if (st.ok()) {
      index.push_back(i);
    } else {
      out[i] = st;
    }
  }
  for (auto [b, e] : Batches(index.size(), [&](size_t i) {
         return pairs[index[i]].first.size() + pairs[index[i]].second.size();
       })) {
    std::vector<proto::KeyValue> batch;
    for (size_t i = b; i < e; ++i) batch.push_back(pairs[index[i]]);
    auto items =
        impl_->CallMulti(proto::Opcode::kHashMultiPut,
                         proto::EncodeHashMultiPut(batch), batch.size());
    for (size_t i = b; i < e; ++i) {
      if (!items.ok()) {
        out[index[i]] = items.status();
        continue;
      }
      const proto::MultiItem& it = (*items)[i - b];
      if (it.status.ok()) {
        out[index[i]] = it.version;
      } else {
        out[index[i]] = it.status;
      }
    }
  }
  return out;
}

const Client::ReadStats& Client::read_stats() const {
  impl_->read_stats.onesided_estimate_us =
      impl_->selector->Estimate(client::ReadPath::kOneSided);
  impl_->read_stats.rpc_estimate_us =
      impl_->selector->Estimate(client::ReadPath::kRpc);
  return impl_->read_stats;
}

Result<PingResult> Client::Ping() {
  auto start = Clock::now();
  auto r = impl_->rpc->CallSync(proto::Opcode::kPing, {}, impl_->Deadline());
  if (!r.ok()) return r.status();
  PingResult out;
  out.rtt_us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  out.transport = impl_->transport;
  return out;
}

Result<ServerStats> Client::Stats() {
  auto r = impl_->rpc->CallSync(proto::Opcode::kStats, {}, impl_->Deadline());
  if (!r.ok()) return r.status();
  auto s = proto::DecodeStatsReply(*r);
  if (!s.ok()) return s.status();
  ServerStats out;
  out.uptime_ms = s->uptime_ms;
  out.connections_current = s->connections_current;
  out.connections_total = s->connections_total;
  out.auth_failures = s->auth_failures;
  out.rpcs_served = s->rpcs_served;
  out.rpc_bytes_in = s->rpc_bytes_in;
  out.rpc_bytes_out = s->rpc_bytes_out;
  out.rpc_errors = s->rpc_errors;
  out.memory_registered = s->memory_registered;
  out.regions = s->regions;
  out.server_threads = s->server_threads;
  out.incarnation = s->incarnation;
  out.hash_pairs = s->hash_pairs;
  out.hash_growths = s->hash_growths;
  out.hash_bytes_used = s->hash_bytes_used;
  out.hash_bytes_total = s->hash_bytes_total;
  out.mem_requests_served = s->mem_requests_served;
  static constexpr const char* kPolicies[] = {"none", "no", "everysec",
                                              "always"};
  out.fsync_policy = s->fsync_policy < 4 ? kPolicies[s->fsync_policy] : "?";
  out.log_bytes = s->log_bytes;
  out.last_snapshot_unix_ms = s->last_snapshot_unix_ms;
  out.last_snapshot_bytes = s->last_snapshot_bytes;
  out.snapshots = s->snapshots;
  out.log_write_errors = s->log_write_errors;
  out.log_failing = s->log_failing;
  out.recovered_pairs = s->recovered_pairs;
  out.recovered_log_records = s->recovered_log_records;
  out.recovery_ms = s->recovery_ms;
  return out;
}

Status Client::Snapshot() {
  auto r =
      impl_->rpc->CallSync(proto::Opcode::kSnapshot, {}, impl_->Deadline());
  return r.ok() ? Status::OK() : r.status();
}

Result<std::string> Client::Echo(std::string_view payload) {
  return impl_->rpc->CallSync(proto::Opcode::kEcho, std::string(payload),
                              impl_->Deadline());
}

Status Client::Read(RemoteAddress addr, void* dst, size_t len) {
  auto region = impl_->Locate(addr, len);
  if (!region.ok()) return region.status();
  return impl_->ep->GetSync(dst, len, **region, addr.offset,
                            impl_->options.timeout);
}

Status Client::Write(RemoteAddress addr, const void* src, size_t len) {
  auto region = impl_->Locate(addr, len);
  if (!region.ok()) return region.status();
  return impl_->ep->PutSync(src, len, **region, addr.offset,
                            impl_->options.timeout);
}

Result<uint64_t> Client::CompareAndSwap(RemoteAddress addr, uint64_t expected,
                                        uint64_t desired) {
  REMEM_RETURN_IF_ERROR(impl_->CheckAtomic(addr));
  auto region = impl_->Locate(addr, 8);
  if (!region.ok()) return region.status();
  return impl_->ep->CompareSwapSync(expected, desired, **region, addr.offset,
                                    impl_->options.timeout);
}

Result<uint64_t> Client::FetchAdd(RemoteAddress addr, uint64_t delta) {
  REMEM_RETURN_IF_ERROR(impl_->CheckAtomic(addr));
  auto region = impl_->Locate(addr, 8);
  if (!region.ok()) return region.status();
  return impl_->ep->FetchAddSync(delta, **region, addr.offset,
                                 impl_->options.timeout);
}

void Client::ReadAsync(RemoteAddress addr, void* dst, size_t len,
                       Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  auto region = impl_->Locate(addr, len);
  if (!region.ok()) {
    impl_->worker->Defer([cb, st = region.status()]() mutable { cb(st); });
    return;
  }
  impl_->ep->Get(dst, len, **region, addr.offset, std::move(cb));
}

void Client::WriteAsync(RemoteAddress addr, const void* src, size_t len,
                        Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  auto region = impl_->Locate(addr, len);
  if (!region.ok()) {
    impl_->worker->Defer([cb, st = region.status()]() mutable { cb(st); });
    return;
  }
  impl_->ep->Put(src, len, **region, addr.offset, std::move(cb));
}

// The shared body of the two asynchronous atomics: checks the address, and
// turns the endpoint's (status, old value) completion into a Result.
template <typename Issue>
void AtomicAsync(Client::Impl* impl, RemoteAddress addr,
                 Client::ValueCallback done, Issue issue) {
  auto cb = impl->Track<Result<uint64_t>>(std::move(done));
  Status st = impl->CheckAtomic(addr);
  auto region = impl->Locate(addr, 8);
  if (st.ok() && !region.ok()) st = region.status();
  if (!st.ok()) {
    impl->worker->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  auto old = std::make_shared<uint64_t>(0);
  issue(**region, old.get(), [cb, old](Status s) mutable {
    if (s.ok()) {
      cb(*old);
    } else {
      cb(s);
    }
  });
}

void Client::CompareAndSwapAsync(RemoteAddress addr, uint64_t expected,
                                 uint64_t desired, ValueCallback done) {
  AtomicAsync(
      impl_.get(), addr, std::move(done),
      [&](const fabric::RemoteRegion& r, uint64_t* old, fabric::Completion c) {
        impl_->ep->CompareSwap(expected, desired, r, addr.offset, old,
                               std::move(c));
      });
}

void Client::FetchAddAsync(RemoteAddress addr, uint64_t delta,
                           ValueCallback done) {
  AtomicAsync(
      impl_.get(), addr, std::move(done),
      [&](const fabric::RemoteRegion& r, uint64_t* old, fabric::Completion c) {
        impl_->ep->FetchAdd(delta, r, addr.offset, old, std::move(c));
      });
}

void Client::EchoAsync(std::string payload, ReplyCallback done) {
  auto cb = impl_->Track<Result<std::string>>(std::move(done));
  impl_->rpc->Call(proto::Opcode::kEcho, std::move(payload), impl_->Deadline(),
                   [cb](Status st, std::string reply) mutable {
                     if (st.ok()) {
                       cb(std::move(reply));
                     } else {
                       cb(st);
                     }
                   });
}

size_t Client::Poll() {
  impl_->FlushQueued();
  size_t n = impl_->worker->Progress();
  if (impl_->rpc->pending() > 0 && impl_->rpc->NextDeadline() <= Clock::now()) {
    n += impl_->rpc->ExpireDeadlines(Clock::now());
  }
  return n;
}

Status Client::WaitAll() {
  impl_->FlushQueued();
  // Each pending RPC has its own deadline; one-sided operations end when
  // the transport completes or fails them. The outer bound covers the
  // worst case of both.
  Status st = impl_->worker->ProgressUntil(
      [this] {
        impl_->FlushQueued();  // fallbacks queue RPCs meanwhile
        if (impl_->rpc->pending() > 0) {
          impl_->rpc->ExpireDeadlines(Clock::now());
        }
        return impl_->in_flight == 0;
      },
      Clock::now() + 2 * impl_->options.timeout);
  if (!st.ok()) {
    // One-sided operations did not finish: tear the connection down so they
    // complete (with errors) before their buffers go away.
    impl_->ep->Fail(Status::TimedOut("operations did not complete"));
    (void)impl_->worker->ProgressUntil([this] { return impl_->in_flight == 0; },
                                       Clock::now() + std::chrono::seconds(5));
  }
  Status first = impl_->first_error;
  impl_->first_error = Status::OK();
  if (!st.ok() && first.ok()) return st;
  return first;
}

size_t Client::in_flight() const { return impl_->in_flight; }
const std::vector<RegionInfo>& Client::regions() const {
  return impl_->regions;
}
uint64_t Client::server_incarnation() const { return impl_->incarnation; }
std::string Client::transport() const { return impl_->transport; }
bool Client::reads_are_local() const { return impl_->local_reads; }
bool Client::connected() const { return !impl_->ep->failed(); }

}  // namespace remem
