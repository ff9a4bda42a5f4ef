#include "remem/client.h"

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

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
  ReadStats read_stats;

  Result<Value> HashGetOneSided(const hash::Geometry& g, std::string_view key,
                                bool* gave_up);
  Result<Value> HashGetRpc(std::string_view key);
  Result<uint64_t> HashPut(std::string_view key, std::string_view value,
                           proto::PutMode mode, uint64_t expected);
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
      (void)worker->ProgressUntil([this] { return in_flight == 0; },
                                  Clock::now() + options.timeout);
      if (in_flight > 0) ep->Fail(Status::Unavailable("client closed"));
    }
    if (rpc) rpc->FailAll(Status::Unavailable("client closed"));
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

namespace {

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
    impl->partitions.push_back(
        {uint16_t(p.region), p.buckets_offset, p.num_buckets, p.seed});
  }
  for (const auto& r : info->regions) {
    if (!impl->hash_regions.count(r.region_id)) {
      impl->regions.push_back({r.region_id, r.length});
    }
  }
  // Fault in this process's mapping of the hash regions now (shared memory
  // only): otherwise the first one-sided gets each take a page fault and
  // look slower than the RPC path, which the selector then prefers for a
  // long time.
  for (uint32_t rid : impl->hash_regions) {
    const fabric::RemoteRegion& r = *impl->remote.at(rid);
    if (r.mapped() != nullptr) PrefaultForReading(r.mapped(), r.length());
  }
  client::PathSelectorOptions so;
  so.mode = options.read_path;
  impl->selector = std::make_unique<client::PathSelector>(so);
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

namespace {
// Verification failures before a one-sided get gives up and asks the
// server. Each failure means the server was writing that bucket or extent
// at that moment; a few in a row mean a hot key, where the server's answer
// is the cheaper one.
constexpr int kMaxOneSidedAttempts = 16;
}  // namespace

Result<Client::Value> Client::Impl::HashGetOneSided(const hash::Geometry& g,
                                                    std::string_view key,
                                                    bool* gave_up) {
  hash::ReadFn read = [this](uint16_t region, uint64_t offset, void* dst,
                             size_t len) -> Status {
    auto it = remote.find(region);
    if (it == remote.end()) return Status::ProtocolError("unknown region");
    REMEM_RETURN_IF_ERROR(it->second->Check(offset, len));
    return ep->GetSync(dst, len, *it->second, offset, options.timeout);
  };
  for (int attempt = 0; attempt < kMaxOneSidedAttempts; ++attempt) {
    auto r = hash::LookupOnce(g, key, read);
    if (!r.ok()) return r.status();
    read_stats.reads += uint64_t(r->reads);
    if (r->outcome == hash::Lookup::kFound) {
      return Value{std::move(r->value), r->version};
    }
    if (r->outcome == hash::Lookup::kNotFound) {
      return Status::NotFound("key not found");
    }
    ++read_stats.retries;
    // Back off: spin briefly, then yield, so the writer can finish.
    if (attempt >= 4) std::this_thread::yield();
  }
  *gave_up = true;
  return Status::Busy("one-sided get did not verify");
}

Result<Client::Value> Client::Impl::HashGetRpc(std::string_view key) {
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
  if (value.size() > hash.max_value) {
    return Status::InvalidArgument("value of " + std::to_string(value.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(hash.max_value));
  }
  auto r = rpc->CallSync(proto::Opcode::kHashPut,
                         proto::EncodeHashPut({key, value, mode, expected}),
                         Deadline());
  if (!r.ok()) return r.status();
  return proto::DecodeHashPutReply(*r);
}

Result<Client::Value> Client::Get(std::string_view key) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  const auto& parts = impl_->partitions;
  const hash::Geometry& g =
      parts[XXH3_64bits_withSeed(key.data(), key.size(),
                                 impl_->hash.partition_seed) %
            parts.size()];
  auto start = Clock::now();
  client::ReadPath path = impl_->selector->Choose(start);
  if (path == client::ReadPath::kOneSided) {
    bool gave_up = false;
    auto r = impl_->HashGetOneSided(g, key, &gave_up);
    if (!gave_up) {
      auto end = Clock::now();
      impl_->selector->Record(
          path, std::chrono::duration<double, std::micro>(end - start).count(),
          end);
      ++impl_->read_stats.onesided_gets;
      return r;
    }
    ++impl_->read_stats.fallbacks;
  }
  auto r = impl_->HashGetRpc(key);
  auto end = Clock::now();
  impl_->selector->Record(
      path, std::chrono::duration<double, std::micro>(end - start).count(),
      end);
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
  return impl_->rpc
      ->CallSync(proto::Opcode::kHashDelete, proto::EncodeHashKey(key),
                 impl_->Deadline())
      .status();
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
  out.mem_requests_served = s->mem_requests_served;
  return out;
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
  size_t n = impl_->worker->Progress();
  if (impl_->rpc->pending() > 0 && impl_->rpc->NextDeadline() <= Clock::now()) {
    n += impl_->rpc->ExpireDeadlines(Clock::now());
  }
  return n;
}

Status Client::WaitAll() {
  // Each pending RPC has its own deadline; one-sided operations end when
  // the transport completes or fails them. The outer bound covers the
  // worst case of both.
  Status st = impl_->worker->ProgressUntil(
      [this] {
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
