#include "server/dispatcher.h"

#include <atomic>
#include <cstdint>
#include <cstring>

#include "cluster/ownership.h"
#include "proto/codec.h"
#include "util/log.h"

namespace remem::server {

using fabric::AmMessage;

namespace {

thread_local int t_current_thread = -1;

// The copies of served reads and writes. Like a NIC's DMA, they race by
// design with the owner's writes to a service's region (and with other
// connections' served writes): readers verify what they read (checksums,
// versions) and retry. They copy with relaxed atomic accesses -- words where
// the region side is 8-aligned, bytes at the edges -- as the owner publishes
// with atomic stores (hash/layout.h StoreWords), so the race is not a C++
// data race and ThreadSanitizer checks everything else. (A memcpy here was
// suppressed by name, which fails whenever TSan cannot restore the copy's
// stack.) On x86 these are plain moves.
template <typename T>
T LoadRelaxed(const T* p) {
  return std::atomic_ref<T>(*const_cast<T*>(p)).load(std::memory_order_relaxed);
}
template <typename T>
void StoreRelaxed(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_relaxed);
}

void ServedCopyFromRegion(void* dst, const uint8_t* src, size_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  size_t i = 0;
  for (; i < len && reinterpret_cast<uintptr_t>(src + i) % 8 != 0; ++i) {
    d[i] = LoadRelaxed(src + i);
  }
  for (; len - i >= 8; i += 8) {
    const uint64_t w = LoadRelaxed(reinterpret_cast<const uint64_t*>(src + i));
    std::memcpy(d + i, &w, 8);
  }
  for (; i < len; ++i) d[i] = LoadRelaxed(src + i);
}

void ServedCopyToRegion(uint8_t* dst, const void* src, size_t len) {
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i < len && reinterpret_cast<uintptr_t>(dst + i) % 8 != 0; ++i) {
    StoreRelaxed(dst + i, s[i]);
  }
  for (; len - i >= 8; i += 8) {
    uint64_t w;
    std::memcpy(&w, s + i, 8);
    StoreRelaxed(reinterpret_cast<uint64_t*>(dst + i), w);
  }
  for (; i < len; ++i) StoreRelaxed(dst + i, s[i]);
}

}  // namespace

// --- Responder

Responder& Responder::operator=(Responder&& other) noexcept {
  if (this != &other) {
    if (dispatcher_ != nullptr) {
      Reply(Status::Internal("the request was dropped unanswered"));
    }
    dispatcher_ = other.dispatcher_;
    thread_ = other.thread_;
    connection_ = other.connection_;
    request_id_ = other.request_id_;
    service_ = other.service_;
    method_ = other.method_;
    other.dispatcher_ = nullptr;
  }
  return *this;
}

Responder::~Responder() {
  if (dispatcher_ != nullptr) {
    Reply(Status::Internal("the request was dropped unanswered"));
  }
}

void Responder::Reply(Status status, std::string payload) {
  Dispatcher* d = dispatcher_;
  if (d == nullptr) return;  // replied already (a bug) or empty
  dispatcher_ = nullptr;
  d->SendReply(thread_, connection_, request_id_, service_, method_,
               std::move(status), std::move(payload));
}

// --- Dispatcher

int Dispatcher::CurrentThread() { return t_current_thread; }
void Dispatcher::SetCurrentThread(int index) { t_current_thread = index; }

Status Dispatcher::Register(Service* service) {
  const proto::ServiceId id = service->id();
  if (services_[id] != nullptr) {
    return Status::InvalidArgument("two services claim id " +
                                   std::to_string(id) + ": " +
                                   std::string(services_[id]->name()) +
                                   " and " + std::string(service->name()));
  }
  if (service->num_methods() == 0) {
    return Status::InvalidArgument("service " + std::string(service->name()) +
                                   " has no methods");
  }
  services_[id] = service;
  service_list_.push_back(service);
  return Status::OK();
}

Status Dispatcher::Install() {
  for (ServerThread* t : threads_) {
    REMEM_RETURN_IF_ERROR(t->worker->SetAmHandler(
        proto::kAmRequest,
        [this, t](AmMessage&& m) { OnRequest_st(t, std::move(m)); }));
    REMEM_RETURN_IF_ERROR(t->worker->SetAmHandler(
        proto::kAmMemRequest,
        [this, t](AmMessage&& m) { OnMemRequest_st(t, std::move(m)); }));
  }
  return Status::OK();
}

void Dispatcher::AddConnection_st(uint32_t thread,
                                  std::unique_ptr<Connection> conn) {
  ServerThread* t = threads_[thread];
  Connection* c = conn.get();
  const ucp_ep_h h = c->ep->handle();
  const ConnectionId id = c->id;
  // UCX gives a new endpoint the handle of one force-closed at a failure
  // (docs/ARCHITECTURE.md, UCX item 19), whose connection is dropped only
  // at a later pass: drop it now, so that the handle names the new one.
  if (auto old = t->by_endpoint.find(h); old != t->by_endpoint.end()) {
    const fabric::Endpoint& ep = *old->second->ep;
    DropConnection_st(thread, old->second->id,
                      ep.failed() ? ep.failure()
                                  : Status::Unavailable("its endpoint closed"));
  }
  c->ep->SetFailureHandler([this, thread, id](const Status& why) {
    // Not from inside the endpoint's own callback: defer the destruction.
    threads_[thread]->worker->Defer(
        [this, thread, id, why] { DropConnection_st(thread, id, why); });
  });
  t->by_endpoint.emplace(h, std::move(conn));
  t->by_id.emplace(id, c);
  t->counters.connections_current.Add(1);
  t->counters.connections_total.Add(1);
}

void Dispatcher::DropConnection_st(uint32_t thread, ConnectionId id,
                                   const Status& why, bool peer_may_have_died) {
  ServerThread* t = threads_[thread];
  auto it = t->by_id.find(id);
  if (it == t->by_id.end()) return;
  Connection* c = it->second;
  log::Debug("session {} from {} closed: {}", id, c->peer, why.ToString());
  t->by_id.erase(it);
  auto conn = std::move(t->by_endpoint.at(c->ep->handle()));
  t->by_endpoint.erase(c->ep->handle());
  t->counters.connections_current.Set(t->counters.connections_current.Get() -
                                      1);
  // A live endpoint is flushed, so replies already sent go out, then
  // closed; a failed one, or one with a reply still out (a large one its
  // client has not fetched), is force-closed at once (fabric/endpoint.h).
  conn.reset();
  if (on_closed_) on_closed_(thread, id, peer_may_have_died);
}

void Dispatcher::DropAll_st(uint32_t thread) {
  ServerThread* t = threads_[thread];
  // Replies still out (queued behind a full transport, or large ones their
  // clients have not fetched yet) get a moment to go: an endpoint closed
  // with one out is force-closed, which gives it up.
  auto replies_out = [t] {
    for (const auto& [id, c] : t->by_id) {
      if (c->ep->requests_out() > 0) return true;
    }
    return false;
  };
  if (replies_out()) {
    (void)t->worker->ProgressUntil(
        [&] { return !replies_out(); },
        fabric::Clock::now() + std::chrono::milliseconds(300));
  }
  std::vector<ConnectionId> ids;
  for (const auto& [id, c] : t->by_id) ids.push_back(id);
  for (ConnectionId id : ids) {
    DropConnection_st(thread, id, Status::Unavailable("server stopping"),
                      /*peer_may_have_died=*/false);
  }
}

size_t Dispatcher::DropSharedMemory_st(uint32_t thread, const Status& why) {
  ServerThread* t = threads_[thread];
  std::vector<ConnectionId> ids;
  for (const auto& [id, c] : t->by_id) {
    if (c->ep->UsesSharedMemory()) ids.push_back(id);
  }
  size_t dropped = 0;
  for (ConnectionId id : ids) {
    // Fail progresses the worker (its forced close), which may drop a
    // connection of the list first.
    auto it = t->by_id.find(id);
    if (it == t->by_id.end()) continue;
    // Forced: a flush would wait on a peer that can no longer reach us.
    it->second->ep->Fail(why);
    DropConnection_st(thread, id, why, /*peer_may_have_died=*/false);
    ++dropped;
  }
  return dropped;
}

void Dispatcher::RunOn(uint32_t thread, util::MoveFunction<void()> fn) {
  if (closed_.load(std::memory_order_acquire)) return;
  if (t_current_thread == int(thread)) return fn();
  threads_[thread]->worker->Post(std::move(fn));
}

Connection* Dispatcher::ConnectionOf_st(ServerThread* t, ucp_ep_h ep) {
  auto it = t->by_endpoint.find(ep);
  if (it == t->by_endpoint.end()) {
    // A message from an endpoint this thread does not own: not a session
    // the acceptor let in (or one already dropped). Nothing to answer on.
    t->counters.unknown_endpoint_messages.Add(1);
    return nullptr;
  }
  return it->second->closing ? nullptr : it->second.get();
}

Responder Dispatcher::MakeResponder(uint32_t thread, ConnectionId conn,
                                    uint64_t id, proto::ServiceId service,
                                    uint8_t method) {
  Responder r;
  r.dispatcher_ = this;
  r.thread_ = thread;
  r.connection_ = conn;
  r.request_id_ = id;
  r.service_ = service;
  r.method_ = method;
  return r;
}

namespace {

// Whether a reply with status `code` counts in rpc_errors: a request that
// failed (malformed, refused, or the server could not do it), not one
// answered with an outcome the client acts on (absent, present, changed,
// overflowed, moved, busy, not offered here: a get of a missing key, or a
// client's probe of a feature, is no error).
bool CountsAsError(StatusCode code) {
  switch (code) {
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kConflict:
    case StatusCode::kOutOfRange:
    case StatusCode::kMoved:
    case StatusCode::kBusy:
    case StatusCode::kUnsupported:
      return false;
    default:
      return true;
  }
}

}  // namespace

void Dispatcher::Send_st(ServerThread* t, Connection& c, uint64_t request_id,
                         proto::ServiceId service, uint8_t method,
                         Status status, std::string payload) {
  if (!status.ok()) {
    payload = status.message();
    if (CountsAsError(status.code())) t->counters.rpc_errors.Add(1);
  }
  proto::SealedRpcHeader h;
  const size_t header_len = proto::SealHeader(
      proto::MakeHeader(service, method, request_id, payload.size(),
                        /*reply=*/true, status.code()),
      payload, &h);
  t->counters.rpc_bytes_out.Add(payload.size());
  c.ep->SendAm(proto::kAmReply, &h, header_len, std::move(payload), nullptr);
}

void Dispatcher::SendReply(uint32_t thread, ConnectionId conn,
                           uint64_t request_id, proto::ServiceId service,
                           uint8_t method, Status status, std::string payload) {
  // After the stop: the connection is gone, and so may the worker be.
  if (closed_.load(std::memory_order_acquire)) return;
  ServerThread* t = threads_[thread];
  if (t_current_thread == int(thread)) {
    auto it = t->by_id.find(conn);
    if (it == t->by_id.end() || it->second->closing) return;  // gone
    return Send_st(t, *it->second, request_id, service, method,
                   std::move(status), std::move(payload));
  }
  t->worker->Post([this, thread, conn, request_id, service, method,
                   status = std::move(status),
                   payload = std::move(payload)]() mutable {
    SendReply(thread, conn, request_id, service, method, std::move(status),
              std::move(payload));
  });
}

void Dispatcher::OnRequest_st(ServerThread* t, AmMessage&& m) {
  Connection* conn = ConnectionOf_st(t, m.reply_ep);
  if (conn == nullptr) return;
  Connection& c = *conn;
  const size_t data_len = m.refused_length ? m.refused_length : m.data.size();
  t->counters.rpc_bytes_in.Add(data_len + m.header.size());
  // The request id, if the header is long enough to hold one, so that even a
  // malformed request's call fails with the reason instead of timing out.
  constexpr size_t kIdEnd = offsetof(proto::RpcHeader, request_id) + 8;
  uint64_t raw_id = 0;
  if (m.header.size() >= kIdEnd) {
    std::memcpy(&raw_id, m.header.data() + kIdEnd - 8, sizeof(raw_id));
  }
  const auto error_method = static_cast<uint8_t>(proto::CoreMethod::kError);
  if (m.refused_length) {
    // Refused before the data was fetched.
    if (m.header.size() < kIdEnd) return t->counters.rpc_errors.Add(1);
    return Send_st(
        t, c, raw_id, proto::kCoreService, error_method,
        Status::InvalidArgument("request payload of " +
                                std::to_string(m.refused_length) +
                                " bytes exceeds the server's limit of " +
                                std::to_string(proto::kMaxRpcPayload)),
        {});
  }
  auto h = proto::DecodeHeader(m.header.data(), m.header.size(), data_len);
  if (!h.ok()) {
    if (m.header.size() < kIdEnd) return t->counters.rpc_errors.Add(1);
    return Send_st(t, c, raw_id, proto::kCoreService, error_method, h.status(),
                   {});
  }
  const uint64_t id = h->request_id;
  if (h->flags & proto::kFlagReply) {
    return Send_st(t, c, id, proto::kCoreService, error_method,
                   Status::ProtocolError("a reply sent as a request"), {});
  }
  if (h->status != 0) {
    return Send_st(t, c, id, proto::kCoreService, error_method,
                   Status::ProtocolError("a request with a status"), {});
  }
  if (Status st = proto::VerifySeal(m.header.data(), m.header.size(), m.data);
      !st.ok()) {
    return Send_st(t, c, id, proto::kCoreService, error_method, st, {});
  }
  Service* s = services_[h->service];
  if (s == nullptr) {
    return Send_st(t, c, id, proto::kCoreService, error_method,
                   Status::Unsupported("this server has no service " +
                                       std::to_string(h->service)),
                   {});
  }
  if (h->method >= s->num_methods()) {
    return Send_st(
        t, c, id, proto::kCoreService, error_method,
        Status::ProtocolError("service " + std::string(s->name()) +
                              " has no method " + std::to_string(h->method)),
        {});
  }
  t->counters.rpcs_served.Add(1);
  if (cluster_ != nullptr && h->service != proto::kCoreService) {
    if (Status st = cluster_->Admits(h->epoch); !st.ok()) {
      return Send_st(t, c, id, h->service, h->method, std::move(st), {});
    }
  } else if (h->epoch != 0 && h->service != proto::kCoreService) {
    // A cluster client's request (routed by a configuration epoch) at a
    // server of no cluster: one started at the address of a member that
    // went away. Served, the client's writes and reads went to a process
    // that is no member (found black-box).
    return Send_st(
        t, c, id, h->service, h->method,
        Status::Conflict("this server is not in a cluster (started without "
                         "--cluster): a request routed by cluster "
                         "configuration epoch " +
                         std::to_string(h->epoch) +
                         " is refused (the member that was at this address "
                         "is gone)"),
        {});
  }
  auto route = s->RouteCall(h->method, m.data);
  if (!route.ok()) {
    return Send_st(t, c, id, h->service, h->method, route.status(), {});
  }
  Call call;
  call.method = h->method;
  call.payload = std::move(m.data);
  call.epoch = h->epoch;
  call.connection = c.id;
  call.responder = MakeResponder(t->index, c.id, id, h->service, h->method);
  if (route->kind == Route::kHere || route->partition == t->index) {
    return s->Handle(route->kind == Route::kHere ? t->index : route->partition,
                     std::move(call));
  }
  if (route->partition >= threads_.size()) {
    return call.responder.Reply(
        Status::Internal("service routed to a partition that does not exist"));
  }
  // Another thread owns the partition: run there. The reply comes back
  // through the Responder.
  const PartitionId p = route->partition;
  threads_[p]->worker->Post([s, p, call = std::move(call)]() mutable {
    s->Handle(p, std::move(call));
  });
}

void Dispatcher::OnMemRequest_st(ServerThread* t, AmMessage&& m) {
  Connection* conn = ConnectionOf_st(t, m.reply_ep);
  if (conn == nullptr) return;
  Connection& c = *conn;
  const size_t data_len = m.refused_length ? m.refused_length : m.data.size();
  auto req = proto::DecodeMemRequest(m.header, data_len);
  // Answer even a malformed request when it names an id, so its operation
  // fails with the reason instead of timing out.
  constexpr size_t kIdEnd = offsetof(proto::MemRequest, request_id) + 8;
  proto::MemRequest r{};
  Status st;
  if (req.ok()) {
    r = *req;
  } else if (m.header.size() >= kIdEnd) {
    std::memcpy(&r, m.header.data(), kIdEnd);
    if (r.op == 0 || r.op > proto::kMaxMemOp) r.op = 1;
    st = req.status();
  } else {
    t->counters.rpc_errors.Add(1);
    return;
  }
  uint64_t value = 0;
  std::string out;
  if (st.ok()) st = ServeMemory_st(r, m.data, &value, &out);
  if (!st.ok()) {
    out = st.message();
    if (CountsAsError(st.code())) t->counters.rpc_errors.Add(1);
  }
  t->counters.mem_requests_served.Add(1);
  proto::MemReply h = proto::MakeMemReply(static_cast<proto::MemOp>(r.op),
                                          r.request_id, st.code(), value);
  // A dead client's reply fails to send; that is all (no completion).
  c.ep->SendAm(proto::kAmMemReply, &h, sizeof(h), std::move(out), nullptr);
}

Result<uint8_t*> Dispatcher::ServedBytes_st(uint32_t id, uint64_t offset,
                                            uint64_t length, proto::MemOp op) {
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return Status::InvalidArgument("no region " + std::to_string(id) +
                                   " on this server");
  }
  const fabric::LocalRegion& region = *it->second.region;
  if (offset > region.length() || length > region.length() - offset) {
    return Status::InvalidArgument(
        "range [" + std::to_string(offset) + ", +" + std::to_string(length) +
        ") is outside region " + std::to_string(id) + " of " +
        std::to_string(region.length()) + " bytes");
  }
  const bool read = op == proto::MemOp::kRead || op == proto::MemOp::kReadMany;
  if (!read && it->second.access == proto::RegionAccess::kReadOnly) {
    return Status::InvalidArgument(
        "region " + std::to_string(id) +
        " is read-only (it holds a service's structures); raw access to it "
        "is refused");
  }
  if (cluster_ != nullptr &&
      it->second.access == proto::RegionAccess::kReadOnly) {
    // A service's structures: in a replicated cluster, read for a client
    // only while this member holds its lease (as the server lease caps
    // what shared-memory readers trust).
    REMEM_RETURN_IF_ERROR(cluster_->Leased());
  }
  return region.base() + offset;
}

Status Dispatcher::ServeMemory_st(const proto::MemRequest& r,
                                  const std::string& data, uint64_t* value,
                                  std::string* out) {
  const auto op = static_cast<proto::MemOp>(r.op);
  if (op == proto::MemOp::kReadMany) {
    // Every span checked before any is copied: an error answers the whole
    // request.
    std::vector<proto::MemSpan> spans;
    REMEM_RETURN_IF_ERROR(proto::DecodeMemSpans(data, r.length, &spans));
    std::vector<uint8_t*> from(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      auto p =
          ServedBytes_st(spans[i].region, spans[i].offset, spans[i].length, op);
      if (!p.ok()) return p.status();
      from[i] = *p;
    }
    out->resize(r.length);
    size_t at = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      ServedCopyFromRegion(out->data() + at, from[i], spans[i].length);
      at += spans[i].length;
    }
    return Status::OK();
  }
  auto bytes = ServedBytes_st(r.region, r.offset, r.length, op);
  if (!bytes.ok()) return bytes.status();
  uint8_t* p = *bytes;
  switch (op) {
    case proto::MemOp::kRead:
      out->resize(r.length);
      ServedCopyFromRegion(out->data(), p, r.length);
      return Status::OK();
    case proto::MemOp::kWrite:
      ServedCopyToRegion(p, data.data(), data.size());
      return Status::OK();
    case proto::MemOp::kCompareSwap:
    case proto::MemOp::kFetchAdd:
    case proto::MemOp::kReadMany:
      break;
  }
  if (r.offset % 8 != 0) {
    return Status::InvalidArgument(
        "atomic operations need an 8-byte aligned offset");
  }
  // Region bases are page-aligned, so the word is too. CPU atomics, as a
  // shared-memory client's atomics on its mapping of the same region are.
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
  if (op == proto::MemOp::kFetchAdd) {
    *value = word.fetch_add(r.operand);
  } else {
    uint64_t expected = r.operand;
    word.compare_exchange_strong(expected, r.operand2);
    *value = expected;  // the old value whether or not it swapped
  }
  return Status::OK();
}

}  // namespace remem::server
