#include "remem/session.h"

#include <time.h>

#include <atomic>
#include <cstring>

#include "client/session_core.h"
#include "proto/codec.h"

namespace remem {

using fabric::Clock;

namespace client {

namespace {

// CLOCK_MONOTONIC_COARSE lags the precise clock by up to one tick; a
// vouch ends this much before the lease so a coarse reading never
// overstates it.
uint64_t CoarseMarginNs() {
  static const uint64_t margin = [] {
    timespec res{};
    clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return 2 * (uint64_t(res.tv_sec) * 1000000000ull + uint64_t(res.tv_nsec)) +
           1000000ull;
  }();
  return margin;
}

uint64_t PreciseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace

// --- LoopCore

Result<std::unique_ptr<LoopCore>> LoopCore::Create(Transport transport) {
  std::unique_ptr<LoopCore> l(new LoopCore());
  auto ctx = fabric::Context::Shared(transport);
  if (!ctx.ok()) {
    // As the server says it (a UCX_TLS naming no transport).
    if (const std::string ucx = fabric::Context::OperatorSettings();
        !ucx.empty()) {
      return Status(ctx.status().code(),
                    "UCX cannot start under the UCX settings " + ucx + " (" +
                        ctx.status().message() +
                        "): check them (if one of them is the cause)");
    }
    return ctx.status();
  }
  l->ctx_ = *ctx;
  l->transport_ = transport;
  auto worker = fabric::Worker::Create(l->ctx_, proto::kMaxRpcPayload);
  if (!worker.ok()) return worker.status();
  l->worker_ = std::move(*worker);
  return l;
}

LoopCore::~LoopCore() = default;

void LoopCore::Detach(SessionCore* s) { std::erase(sessions_, s); }

// By index: a session's flush or housekeeping fails what it had in flight,
// and a callback may connect a new session on this loop (Attach appends,
// which would move a vector a range-for walks).
void LoopCore::Flush() {
  for (size_t i = 0; i < sessions_.size(); ++i) sessions_[i]->Flush();
}

size_t LoopCore::Poll() {
  if (worker_->receive_stalled()) {
    // Nothing more arrives (what was readable ahead of the blocked message
    // was taken by earlier polls): the sessions fail at once (Housekeeping).
    for (size_t i = 0; i < sessions_.size(); ++i) sessions_[i]->Housekeeping();
  }
  Flush();
  size_t n = worker_->Progress();
  for (size_t i = 0; i < sessions_.size(); ++i) {
    n += sessions_[i]->Housekeeping();
  }
  return n;
}

// --- SessionCore

uint64_t SessionCore::CoarseNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Status CheckTimeouts(const SessionOptions& o) {
  auto check = [](std::string_view name, std::chrono::milliseconds t) {
    if (t.count() > 0 && t <= kMaxTimeout) return Status::OK();
    return Status::InvalidArgument(
        "SessionOptions::" + std::string(name) + " is " +
        std::to_string(t.count()) + " ms; it must be more than 0 and at most " +
        std::to_string(kMaxTimeout.count()) + " ms (a year)");
  };
  REMEM_RETURN_IF_ERROR(check("timeout", o.timeout));
  if (o.connect_timeout) {
    REMEM_RETURN_IF_ERROR(check("connect_timeout", *o.connect_timeout));
  }
  return Status::OK();
}

Result<std::unique_ptr<SessionCore>> SessionCore::Connect(
    const SessionOptions& options, LoopCore* loop,
    std::unique_ptr<LoopCore> owned) {
  REMEM_RETURN_IF_ERROR(CheckTimeouts(options));
  if (loop->worker()->receive_stalled()) {
    return fabric::Worker::StalledStatus();
  }
  if (options.secret.size() > kMaxSecretBytes) {
    return Status::InvalidArgument(
        "the shared secret is " + std::to_string(options.secret.size()) +
        " bytes; at most " + std::to_string(kMaxSecretBytes));
  }
  std::unique_ptr<SessionCore> s(
      new SessionCore(options, loop, std::move(owned)));
  // The handshake, the endpoint's setup and the list of regions.
  const auto deadline =
      Clock::now() + options.connect_timeout.value_or(options.timeout);
  REMEM_RETURN_IF_ERROR(s->Handshake(deadline));
  // With the number of the server's endpoint (UCX pairs the two by it),
  // once that endpoint's notice came: the session's socket closing (the
  // server dropped the session, or died) ends the wait.
  const int fd = s->socket_.fd();
  auto ep = fabric::Endpoint::CreateJoined(
      s->worker(), s->server_address_, s->endpoint_number_,
      proto::EncodeEndpointNotice(s->incarnation_, s->session_id_,
                                  s->endpoint_number_),
      deadline, [fd] { return !util::PeerStillThere(fd); });
  if (!ep.ok()) {
    Status st = ep.status().WithContext(
        "cannot reach the server at " + options.server +
        " over UCX (--transport " +
        std::string(TransportName(options.transport)) + ")");
    if (st.message().find("Shared memory error") != std::string::npos) {
      // UCX's own words say nothing of why (docs/SECURITY.md).
      st = Status(st.code(),
                  st.message() +
                      ": a server's shared memory can be mapped only by "
                      "processes of the server's own user (and root); run "
                      "as that user, or connect with --transport tcp");
    }
    return st;
  }
  s->ep_ = std::move(*ep);
  SessionCore* raw = s.get();
  Status st = s->ep_->WaitConnected(deadline);
  if (!st.ok()) return st.WithContext("connecting to " + options.server);
  REMEM_RETURN_IF_ERROR(s->ep_->set_served(s->ep_->RmaIsEmulated()));
  auto rpc = RpcClient::Create(s->worker(), s->ep_.get());
  if (!rpc.ok()) return rpc.status();
  s->rpc_ = std::move(*rpc);
  s->ep_->SetFailureHandler(
      [raw](const Status& why) { raw->rpc_->FailAll(why); });
  // A synchronous served operation (over tcp) waits in the endpoint: it
  // must see the session's socket close as calls do (session.h), not wait
  // for its timeout.
  s->ep_->SetWaitHook([raw] { raw->Housekeeping(); });
  loop->Attach(raw);
  REMEM_RETURN_IF_ERROR(s->LoadRegions(deadline));
  s->transport_ = s->ep_->TransportDescription();
  // Over tcp the server performs one-sided operations itself (see
  // fabric/endpoint.h); say so where the transport is shown.
  if (s->ep_->served()) s->transport_ += ", one-sided served by remem";
  if (options.transport == Transport::kShm && !s->ep_->UsesSharedMemory()) {
    return Status::Unavailable(
        "--transport shm: the server at " + options.server +
        " is not reachable over shared memory (UCX chose " + s->transport_ +
        "); is it on another host?");
  }
  return s;
}

Status SessionCore::Handshake(Clock::time_point deadline) {
  auto sock = util::Connect(options_.server, deadline);
  if (!sock.ok()) return sock.status();
  socket_ = std::move(*sock);
  proto::ClientHelloInfo hello;
  hello.secret = options_.secret;
  hello.worker_address = worker()->address();
  REMEM_RETURN_IF_ERROR(
      util::SendAll(socket_.fd(), proto::EncodeClientHello(hello), deadline));
  std::string prefix;
  Status st = util::RecvExact(socket_.fd(), sizeof(proto::ServerHello), &prefix,
                              deadline);
  if (!st.ok()) {
    if (st.code() == StatusCode::kUnavailable) {
      return Status::Unavailable(
          "the server at " + options_.server +
          " closed the connection during the handshake (it stopped or "
          "restarted, or it is not a remem server)");
    }
    return st.WithContext("handshake with " + options_.server);
  }
  proto::ServerHello h;
  auto body = proto::DecodeServerHelloPrefix(prefix, &h);
  if (!body.ok())
    return body.status().WithContext("handshake with " + options_.server);
  std::string rest;
  REMEM_RETURN_IF_ERROR(util::RecvExact(socket_.fd(), *body, &rest, deadline));
  auto reply = proto::DecodeServerHello(prefix + rest);
  if (!reply.ok()) {
    return reply.status().WithContext("handshake with " + options_.server);
  }
  if (!reply->status.ok()) {
    return reply->status.WithContext("the server at " + options_.server +
                                     " refused the session");
  }
  if (reply->version != proto::kWireVersion) {
    return Status::ProtocolError(
        "the server speaks wire version " + std::to_string(reply->version) +
        ", this client " + std::to_string(proto::kWireVersion));
  }
  server_address_ = std::move(reply->worker_address);
  incarnation_ = reply->incarnation;
  session_id_ = reply->session_id;
  lease_ms_ = reply->lease_ms;
  endpoint_number_ = reply->endpoint_number;
  return Status::OK();
}

Status SessionCore::LoadRegions(Clock::time_point deadline) {
  auto reply = CallSyncUntil(proto::kCoreService,
                             static_cast<uint8_t>(proto::CoreMethod::kRegions),
                             {}, deadline);
  if (!reply.ok()) return reply.status().WithContext("listing regions");
  auto info = proto::DecodeRegionsReply(*reply);
  if (!info.ok()) return info.status().WithContext("listing regions");
  if (info->incarnation != incarnation_) {
    return Status::ProtocolError("the regions reply names another server");
  }
  bool have_root = false;
  for (proto::RegionInfoWire& r : info->regions) {
    auto region = fabric::RemoteRegion::Unpack(ep_->handle(), r.region_id,
                                               r.base, r.length, r.rkey);
    if (!region.ok()) {
      // Over shared memory the key names the server's segment, which a
      // server that died since it listed its regions no longer has: that
      // is a server gone away (as any call to it would find), not a fault
      // of this machine's shared memory.
      if (!util::PeerStillThereAfter(socket_.fd(),
                                     std::chrono::milliseconds(100))) {
        return Status::Unavailable("the server at " + options_.server +
                                   " went away while the session was set "
                                   "up (" +
                                   region.status().message() + ")");
      }
      return region.status();
    }
    if (r.region_id == proto::kRootRegion) {
      have_root = r.length >= sizeof(proto::ServerLease);
    } else if (r.service == proto::kCoreService &&
               r.access == proto::RegionAccess::kReadWrite) {
      raw_regions_.push_back({r.region_id, r.length});
      raw_ids_.insert(r.region_id);
    }
    remote_.emplace(r.region_id, std::move(*region));
    r.rkey.clear();
    region_list_.push_back(std::move(r));
  }
  if (!have_root) return Status::ProtocolError("the server has no root region");
  local_reads_ = remote_.at(proto::kRootRegion)->mapped() != nullptr;
  // One-sided reads that do not pass through the server need its lease.
  needs_lease_ = !ep_->served();
  if (needs_lease_) {
    // A lease that has lapsed (a cluster member without its member lease)
    // refuses one-sided reads, not the session; a server that is not the
    // one that answered the handshake fails it.
    Status st = RenewVouch();
    if (!st.ok() && ep_->failed()) return st;
  }
  return Status::OK();
}

Status SessionCore::RenewVouch() {
  if (ep_->failed()) return ep_->failure();
  const uint64_t coarse = CoarseNowNs();
  next_socket_check_ns_ = coarse + kSocketCheckNs;
  if (!util::PeerStillThere(socket_.fd())) {
    ServerGone();
    return ep_->failure();
  }
  proto::ServerLease lease{};
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Word by word, as the server publishes it (a copy in any byte order
    // is verified by the checksum).
    uint64_t words[sizeof(lease) / 8];
    const fabric::RemoteRegion& root = *remote_.at(proto::kRootRegion);
    if (const uint8_t* m = root.mapped()) {
      auto* src = const_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(m));
      for (size_t i = 0; i < sizeof(lease) / 8; ++i) {
        words[i] =
            std::atomic_ref<uint64_t>(src[i]).load(std::memory_order_acquire);
      }
    } else {
      REMEM_RETURN_IF_ERROR(
          ep_->GetSync(words, sizeof(words), root, 0, options_.timeout));
    }
    std::memcpy(&lease, words, sizeof(lease));
    if (proto::LeaseVerifies(lease)) break;
    lease.magic = 0;
  }
  if (lease.magic != proto::kLeaseMagic) {
    return Status::Unavailable("the server's lease did not verify");
  }
  if (lease.incarnation != incarnation_) {
    Fail(Status::Unavailable("the server restarted (another incarnation)"));
    return ep_->failure();
  }
  const uint64_t now = PreciseNowNs();
  if (lease.expires_ns <= now) {
    vouched_until_ns_ = 0;
    return Status::Unavailable(
        lease.expires_ns == 0
            ? "the server revoked its lease (it is stopping)"
            : "the server's lease expired: it stopped renewing it (dead or "
              "paused)");
  }
  vouched_until_ns_ = lease.expires_ns - CoarseMarginNs();
  return Status::OK();
}

SessionCore::~SessionCore() {
  // Outstanding operations complete here, while every member their
  // callbacks touch is still alive. First let them finish (bounded by the
  // timeout) so the connection can close gracefully; whatever is left then
  // fails with Unavailable.
  if (ep_ && !ep_->failed() && in_flight_ > 0) {
    (void)ProgressUntil([this] { return in_flight_ == 0; },
                        Clock::now() + options_.timeout);
    if (in_flight_ > 0) ep_->Fail(Status::Unavailable("session closed"));
  }
  // A request whose call timed out may still be in UCX's hands (a large one
  // goes by rendezvous, which waits for the server): only a forced close
  // gives it up (fabric/endpoint.h, requests_out). Its payload is sealed:
  // a server that fetches it after this process reused the memory finds it
  // does not verify (proto::kFlagSealed).
  if (ep_ && !ep_->failed() && ep_->requests_out() > 0) {
    ep_->Fail(Status::Unavailable(
        "the session closed while a request was still being sent"));
  }
  // Nothing of this session is out: the server may know it did not die
  // while sending (proto::kSessionGoodbye).
  const bool goodbye = ep_ && !ep_->failed() && in_flight_ == 0;
  if (rpc_) rpc_->FailAll(Status::Unavailable("session closed"));
  if (in_flight_ > 0) {
    (void)worker()->ProgressUntil([this] { return in_flight_ == 0; },
                                  Clock::now() + std::chrono::seconds(30));
  }
  // Operations whose callbacks never ran leave the loop's count with it.
  loop_->in_flight_ -= in_flight_;
  loop_->Detach(this);
  // The handler calls rpc_, which goes first.
  if (ep_) ep_->SetFailureHandler(nullptr);
  // Keys before the endpoint, calls before the endpoint.
  remote_.clear();
  rpc_.reset();
  ep_.reset();
  if (goodbye && socket_.fd() >= 0) {
    const uint8_t bye = proto::kSessionGoodbye;
    (void)::send(socket_.fd(), &bye, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  socket_.Close();
}

void SessionCore::ServerGone() {
  // It may have died while sending to this loop (fabric/worker.h).
  worker()->WatchForStall();
  Fail(Status::Unavailable("the server at " + options_.server +
                           " closed the session (it stopped or died)"));
}

void SessionCore::Fail(const Status& why) {
  if (ep_ && !ep_->failed()) ep_->Fail(why);
  if (rpc_) rpc_->FailAll(ep_ ? ep_->failure() : why);
}

bool SessionCore::connected() {
  if (!ep_ || ep_->failed()) return false;
  if (worker()->receive_stalled()) {
    Fail(fabric::Worker::StalledStatus());
    return false;
  }
  // The socket is looked at once per kSocketCheckNs, as Housekeeping does:
  // callers poll this in their loops, and a system call per call costs more
  // than a one-sided get.
  const uint64_t coarse = CoarseNowNs();
  if (coarse < next_socket_check_ns_) return true;
  next_socket_check_ns_ = coarse + kSocketCheckNs;
  if (!util::PeerStillThere(socket_.fd())) {
    ServerGone();
    return false;
  }
  return true;
}

size_t SessionCore::Housekeeping() {
  // Calls it fails (past their deadline, the server gone) run their
  // callbacks here, outside any Progress(): a WaitAll in one of them is
  // inside a callback all the same (Worker::in_progress).
  fabric::Worker::CallbackScope in_callbacks(worker());
  size_t n = 0;
  // Deadlines are looked at on the coarse clock first
  // (CLOCK_MONOTONIC_COARSE, the coarse reading of the CLOCK_MONOTONIC that
  // steady_clock counts), and on the precise one only within a tick of the
  // next: a poll costs a quarter of a precise read (38 ns on the
  // development VM, where that read was a fifth of a one-sided scan's
  // client time: this runs at every Poll), and calls still expire on time
  // but for a pass (waits bounded by the timeout on the precise clock, as
  // WaitForBatch's, count on it: Worker::ProgressUntil looks again after a
  // last pass before it times out).
  const uint64_t coarse = CoarseNowNs();
  if (rpc_ && rpc_->pending() > 0) {
    const Clock::time_point next = rpc_->NextDeadline();
    Clock::time_point now{std::chrono::nanoseconds(coarse)};
    if (next <= now + std::chrono::nanoseconds(CoarseMarginNs())) {
      now = Clock::now();
    }
    // A call answered in time whose reply sat unread (this client was
    // busy elsewhere past the deadline) is not late: expired only once a
    // pass after the deadline was seen read what had come (ExpireOverdue).
    if (next <= now) n += rpc_->ExpireOverdue(now);
  }
  // A served one-sided operation (over tcp the server performs them) that
  // waited the timeout ends TimedOut and tears the connection down, as a
  // synchronous one does (session.h): a paused server answers none, and
  // without this an asynchronous one waited for WaitAll's deadline, or
  // for good.
  const Clock::time_point oldest_served =
      ep_ && ep_->served() ? ep_->oldest_served() : Clock::time_point::max();
  if (oldest_served != Clock::time_point::max()) {
    Clock::time_point now{std::chrono::nanoseconds(coarse)};
    const Clock::time_point due = oldest_served + options_.timeout;
    if (due <= now + std::chrono::nanoseconds(CoarseMarginNs())) {
      now = Clock::now();
    }
    if (due > now) {
      served_due_id_ = 0;
    } else if (served_due_id_ != ep_->oldest_served_id()) {
      // Past its deadline, but its answer may sit unread (nobody polled
      // since): it is given up only once the worker handled what had come
      // by now (Worker::HandledSince), as a call is.
      served_due_id_ = ep_->oldest_served_id();
      served_due_mark_ = worker()->Mark();
      ++n;  // poll again rather than sleep
    } else if (worker()->HandledSince(served_due_mark_)) {
      if (ep_->ServedAnswerHeld(served_due_id_)) {
        // Answered: a pass under way holds the answer while a callback it
        // runs waits (the answer runs once that callback returns).
        served_due_mark_ = worker()->Mark();
        ++n;
      } else {
        served_due_id_ = 0;
        n += ep_->ExpireServed(now - options_.timeout);
        ep_->Fail(Status::TimedOut(
            "a one-sided operation had no reply within the timeout"));
      }
    }
  }
  if (slow_hook_ && !in_slow_hook_ && ep_ && !ep_->failed() &&
      coarse >= next_slow_check_ns_ &&
      ((rpc_ && rpc_->pending() > 0) ||
       (ep_ && ep_->served() && ep_->served_in_flight() > 0))) {
    // Calls are sent with a deadline of the timeout from then, so the
    // earliest deadline dates the oldest call (one sent with a shorter
    // deadline only looks older: one more look than needed).
    const Clock::time_point now{std::chrono::nanoseconds(coarse)};
    Clock::time_point oldest =
        ep_ && ep_->served() ? ep_->oldest_served() : Clock::time_point::max();
    if (rpc_ && rpc_->pending() > 0) {
      oldest = std::min(oldest, rpc_->NextDeadline() - options_.timeout);
    }
    if (oldest != Clock::time_point::max() && oldest + slow_every_ <= now) {
      next_slow_check_ns_ =
          coarse +
          uint64_t(
              std::chrono::duration_cast<std::chrono::nanoseconds>(slow_every_)
                  .count());
      in_slow_hook_ = true;
      slow_hook_();
      in_slow_hook_ = false;
      ++n;
    }
  }
  if (ep_ && !ep_->failed() && worker()->receive_stalled()) {
    // Replies can no longer arrive: fail now, not at each deadline.
    Fail(fabric::Worker::StalledStatus());
    ++n;
  }
  if (gone_seen_ && ep_ && !ep_->failed()) {
    // The session's socket closed: what the server sent before it closed
    // it (a stopping server's last replies, a snapshot's "stopping") is
    // handled first, then the rest fails. Failing at once lost a reply
    // already delivered to the worker, unread.
    if (worker()->HandledSince(gone_mark_)) {
      ServerGone();
    }
    ++n;  // poll again rather than sleep
  } else if (coarse >= next_socket_check_ns_) {
    next_socket_check_ns_ = coarse + kSocketCheckNs;
    if (ep_ && !ep_->failed() && !util::PeerStillThere(socket_.fd())) {
      gone_seen_ = true;
      gone_mark_ = worker()->Mark();
      ++n;
    }
  }
  return n;
}

void SessionCore::Call(proto::ServiceId service, uint8_t method,
                       std::string payload, RpcClient::ReplyFn done) {
  rpc_->Call(service, method, std::move(payload), Deadline(), std::move(done));
}

Result<std::string> SessionCore::CallSync(proto::ServiceId service,
                                          uint8_t method, std::string payload) {
  return CallSyncUntil(service, method, std::move(payload), Deadline());
}

Result<std::string> SessionCore::CallSyncUntil(proto::ServiceId service,
                                               uint8_t method,
                                               std::string payload,
                                               Clock::time_point deadline) {
  Flush();  // requests go out in issue order
  bool finished = false;
  Status status;
  std::string reply;
  rpc_->Call(service, method, std::move(payload), deadline,
             [&](Status st, std::string data) {
               finished = true;
               status = std::move(st);
               reply = std::move(data);
             });
  Status wait = ProgressUntil([&] { return finished; },
                              deadline + std::chrono::milliseconds(50));
  if (!finished) rpc_->ExpireDeadlines(Clock::time_point::max());
  if (!status.ok()) return status;
  if (!finished)
    return wait.ok() ? Status::TimedOut("rpc did not complete") : wait;
  return reply;
}

const fabric::RemoteRegion* SessionCore::region(uint32_t id) const {
  auto it = remote_.find(id);
  return it == remote_.end() ? nullptr : it->second.get();
}

Status SessionCore::ReadNow(uint32_t region_id, uint64_t offset, void* dst,
                            size_t len) {
  const fabric::RemoteRegion* r = region(region_id);
  if (r == nullptr) return Status::ProtocolError("unknown region");
  return ReadNow(*r, offset, dst, len);
}

Status SessionCore::ReadNowSlow(const fabric::RemoteRegion& region,
                                uint64_t offset, void* dst, size_t len) {
  REMEM_RETURN_IF_ERROR(region.Check(offset, len));
  if (!slow_hook_ || !ep_->served() || region.mapped() != nullptr ||
      ep_->failed()) {
    return ep_->GetSync(dst, len, region, offset, options_.timeout);
  }
  // A served read is the server's work, as a call is: a paused or cut-off
  // server holds it until the deadline, so it is waited for as calls are,
  // with Housekeeping, whose slow-call hook may fail the session (the read
  // then ends Unavailable).
  return WaitForReads([&](fabric::Completion done) {
    ep_->Get(dst, len, region, offset, std::move(done));
  });
}

Status SessionCore::WaitForReads(
    const std::function<void(fabric::Completion)>& issue) {
  struct State {
    bool done = false;
    Status status;
  };
  // Shared with the completion, which may run after this returns.
  auto state = std::make_shared<State>();
  issue([state](Status st) {
    state->done = true;
    state->status = std::move(st);
  });
  Status wait = ProgressUntil([&] { return state->done; },
                              Clock::now() + options_.timeout);
  if (state->done) return state->status;
  // Failing the endpoint drops the reads before their buffers go away.
  Status st = wait.WithContext("get");
  ep_->Fail(st);
  return st;
}

Status SessionCore::ReadManyNow(
    const std::vector<fabric::Endpoint::GetSpan>& spans) {
  bool mapped = true;
  for (const fabric::Endpoint::GetSpan& g : spans) {
    REMEM_RETURN_IF_ERROR(g.region->Check(g.offset, g.len));
    mapped = mapped && g.region->mapped() != nullptr;
  }
  if (mapped || spans.size() == 1 || ep_->failed()) {
    for (const fabric::Endpoint::GetSpan& g : spans) {
      REMEM_RETURN_IF_ERROR(ReadNow(*g.region, g.offset, g.dst, g.len));
    }
    return Status::OK();
  }
  return WaitForReads(
      [&](fabric::Completion done) { ep_->GetMany(spans, std::move(done)); });
}

void SessionCore::Read(uint32_t region_id, uint64_t offset, void* dst,
                       size_t len, fabric::Completion done) {
  const fabric::RemoteRegion* r = region(region_id);
  Status st = r == nullptr ? Status::ProtocolError("unknown region")
                           : r->Check(offset, len);
  if (!st.ok()) return worker()->Complete(std::move(done), st);
  ep_->Get(dst, len, *r, offset, std::move(done));
}

void SessionCore::ReadMany(uint32_t region_id,
                           std::vector<fabric::Endpoint::GetSpan> spans,
                           fabric::Completion done) {
  const fabric::RemoteRegion* r = region(region_id);
  if (r == nullptr) {
    return worker()->Complete(std::move(done),
                              Status::ProtocolError("unknown region"));
  }
  for (fabric::Endpoint::GetSpan& g : spans) {
    Status st = r->Check(g.offset, g.len);
    if (!st.ok()) return worker()->Complete(std::move(done), st);
    g.region = r;
  }
  ep_->GetMany(spans, std::move(done));
}

int SessionCore::AddFlushHook(std::function<void()> hook) {
  flush_hooks_.emplace(next_hook_, std::move(hook));
  return next_hook_++;
}

void SessionCore::RemoveFlushHook(int handle) { flush_hooks_.erase(handle); }

void SessionCore::Flush() {
  for (auto& [id, hook] : flush_hooks_) hook();
}

Status SessionCore::ProgressUntil(const std::function<bool()>& done,
                                  Clock::time_point deadline) {
  // Sleeps of at most the socket check's period: a server that died on
  // this host is noticed within it (its closed socket wakes nothing).
  return worker()->ProgressUntil(
      [&] {
        Flush();  // requests queued meanwhile (fallbacks) go out
        Housekeeping();
        return done();
      },
      deadline, std::chrono::microseconds(200),
      std::chrono::milliseconds(kSocketCheckNs / 1'000'000));
}

Status SessionCore::ProgressWhileAnswered(const std::function<bool()>& done,
                                          Clock::duration idle) {
  for (;;) {
    const uint64_t replies = rpc_->replies();
    Status st = ProgressUntil(done, Clock::now() + idle);
    if (st.ok() || rpc_->replies() == replies) return st;
  }
}

bool SessionCore::NothingOutstanding() {
  if (worker()->HasPendingWork()) return false;
  if (rpc_ && rpc_->pending() > 0) return false;
  return !ep_ || ep_->failed() ||
         (ep_->requests_out() == 0 && ep_->served_in_flight() == 0);
}

Status SessionCore::WaitAll() {
  Flush();
  // Each pending RPC has its own deadline; one-sided operations end when
  // the transport completes or fails them. The bound covers the worst case
  // of both, counted from the server's last reply (a batched tree request
  // sends its parts as earlier ones answer).
  // Inside a callback, the passes under way hold what they have not run
  // yet: this wait takes it over (util/pass_queue.h). The operations
  // answered with the running one by a store that runs their callbacks one
  // after another (the other answers of its message) complete only once
  // it returns: a wait for them would never end. So there, WaitAll ends
  // once nothing more can arrive: nothing left to run, to send, or to hear
  // back.
  const bool nested = worker()->in_progress();
  const bool took_over = worker()->take_over();
  const auto ended = [this, nested] {
    return in_flight_ == 0 || (nested && NothingOutstanding());
  };
  if (nested) worker()->set_take_over(true);
  Status st = ProgressWhileAnswered(ended, 2 * options_.timeout);
  if (!st.ok()) {
    // One-sided operations did not finish: tear the connection down so they
    // complete (with errors) before their buffers go away. (Nested, the
    // same end as above: the operations held for after the running
    // callback never end before it returns.)
    ep_->Fail(Status::TimedOut("operations did not complete"));
    (void)worker()->ProgressUntil(ended,
                                  Clock::now() + std::chrono::seconds(5));
  }
  worker()->set_take_over(took_over);
  if (!st.ok()) {
    // What the teardown failed says Unavailable; this wait timed out.
    (void)TakeFirstError();
    return Status::TimedOut(
        "operations did not complete within twice the timeout; the "
        "connection was closed");
  }
  return TakeFirstError();
}

}  // namespace client

// --- ServerStats

const Stat* ServerStats::Find(std::string_view name) const {
  for (const Stat& s : stats_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

uint64_t ServerStats::Get(std::string_view name) const {
  const Stat* s = Find(name);
  return s != nullptr && !s->is_text ? s->value : 0;
}

std::string ServerStats::Text(std::string_view name) const {
  const Stat* s = Find(name);
  if (s == nullptr) return {};
  return s->is_text ? s->text : std::to_string(s->value);
}

// --- EventLoop

EventLoop::EventLoop(std::unique_ptr<client::LoopCore> core)
    : core_(std::move(core)) {}
EventLoop::~EventLoop() = default;

Result<std::unique_ptr<EventLoop>> EventLoop::Create(Transport transport) {
  auto core = client::LoopCore::Create(transport);
  if (!core.ok()) return core.status();
  return std::unique_ptr<EventLoop>(new EventLoop(std::move(*core)));
}

size_t EventLoop::Poll() { return core_->Poll(); }

bool EventLoop::stalled() const { return core_->worker()->receive_stalled(); }

// --- Session

using client::SessionCore;

Session::Session(std::unique_ptr<client::SessionCore> core)
    : core_(std::move(core)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::Connect(
    const SessionOptions& options) {
  auto loop = client::LoopCore::Create(options.transport);
  if (!loop.ok()) return loop.status();
  client::LoopCore* raw = loop->get();
  auto core = SessionCore::Connect(options, raw, std::move(*loop));
  if (!core.ok()) return core.status();
  return std::unique_ptr<Session>(new Session(std::move(*core)));
}

Result<std::unique_ptr<Session>> Session::Connect(const SessionOptions& options,
                                                  EventLoop* loop) {
  if (loop == nullptr) return Connect(options);
  if (loop->core()->transport() != options.transport) {
    return Status::InvalidArgument(
        "the event loop uses another transport than the session options");
  }
  auto core = SessionCore::Connect(options, loop->core(), nullptr);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Session>(new Session(std::move(*core)));
}

Result<PingResult> Session::Ping() {
  auto start = Clock::now();
  auto r = core_->CallSync(proto::kCoreService,
                           static_cast<uint8_t>(proto::CoreMethod::kPing), {});
  if (!r.ok()) return r.status();
  PingResult out;
  out.rtt_us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  out.transport = core_->transport();
  return out;
}

Result<ServerStats> Session::Stats() {
  auto r = core_->CallSync(proto::kCoreService,
                           static_cast<uint8_t>(proto::CoreMethod::kStats), {});
  if (!r.ok()) return r.status();
  auto s = proto::DecodeStatsReply(*r);
  if (!s.ok()) return s.status();
  std::vector<Stat> out;
  out.reserve(s->size());
  for (proto::StatValue& v : *s) {
    out.push_back({std::move(v.name), v.kind == proto::StatKind::kText, v.value,
                   std::move(v.text)});
  }
  return ServerStats(std::move(out));
}

Status Session::TakeSnapshot() {
  auto r =
      core_->CallSync(proto::kCoreService,
                      static_cast<uint8_t>(proto::CoreMethod::kSnapshot), {});
  return r.ok() ? Status::OK() : r.status();
}

Result<std::string> Session::Echo(std::string_view payload) {
  return core_->CallSync(proto::kCoreService,
                         static_cast<uint8_t>(proto::CoreMethod::kEcho),
                         std::string(payload));
}

void Session::EchoAsync(std::string payload, ReplyCallback done) {
  auto cb = core_->Track<Result<std::string>>(std::move(done));
  core_->Flush();
  core_->Call(proto::kCoreService,
              static_cast<uint8_t>(proto::CoreMethod::kEcho),
              std::move(payload), [cb](Status st, std::string reply) mutable {
                if (st.ok()) {
                  cb(std::move(reply));
                } else {
                  cb(st);
                }
              });
}

namespace {

// The raw region `a` names, checked for [offset, offset + len).
Result<const fabric::RemoteRegion*> Locate(SessionCore* core, RemoteAddress a,
                                           uint64_t len) {
  const fabric::RemoteRegion* r = core->region(a.region);
  if (r != nullptr && !core->is_raw(a.region)) {
    return Status::InvalidArgument(
        "region " + std::to_string(a.region) +
        " holds a data model's structures; raw access to it is refused");
  }
  if (r == nullptr) {
    return Status::InvalidArgument("no region " + std::to_string(a.region) +
                                   " on this server");
  }
  REMEM_RETURN_IF_ERROR(r->Check(a.offset, len));
  return r;
}

Status CheckAtomic(RemoteAddress a) {
  if (a.offset % 8 != 0) {
    return Status::InvalidArgument(
        "atomic operations need an 8-byte aligned offset");
  }
  return Status::OK();
}

}  // namespace

Status Session::Read(RemoteAddress addr, void* dst, size_t len) {
  auto region = Locate(core_.get(), addr, len);
  if (!region.ok()) return region.status();
  REMEM_RETURN_IF_ERROR(core_->endpoint()->GetSync(
      dst, len, **region, addr.offset, core_->options().timeout));
  return core_->Vouch();
}

Status Session::Write(RemoteAddress addr, const void* src, size_t len) {
  auto region = Locate(core_.get(), addr, len);
  if (!region.ok()) return region.status();
  REMEM_RETURN_IF_ERROR(core_->endpoint()->PutSync(
      src, len, **region, addr.offset, core_->options().timeout));
  return core_->Vouch();
}

Result<uint64_t> Session::CompareAndSwap(RemoteAddress addr, uint64_t expected,
                                         uint64_t desired) {
  REMEM_RETURN_IF_ERROR(CheckAtomic(addr));
  auto region = Locate(core_.get(), addr, 8);
  if (!region.ok()) return region.status();
  auto old = core_->endpoint()->CompareSwapSync(
      expected, desired, **region, addr.offset, core_->options().timeout);
  if (!old.ok()) return old;
  REMEM_RETURN_IF_ERROR(core_->Vouch());
  return old;
}

Result<uint64_t> Session::FetchAdd(RemoteAddress addr, uint64_t delta) {
  REMEM_RETURN_IF_ERROR(CheckAtomic(addr));
  auto region = Locate(core_.get(), addr, 8);
  if (!region.ok()) return region.status();
  auto old = core_->endpoint()->FetchAddSync(delta, **region, addr.offset,
                                             core_->options().timeout);
  if (!old.ok()) return old;
  REMEM_RETURN_IF_ERROR(core_->Vouch());
  return old;
}

void Session::ReadAsync(RemoteAddress addr, void* dst, size_t len,
                        Callback done) {
  auto cb = core_->Track<Status>(std::move(done));
  auto region = Locate(core_.get(), addr, len);
  if (!region.ok()) {
    core_->Defer([cb, st = region.status()]() mutable { cb(st); });
    return;
  }
  SessionCore* core = core_.get();
  core->endpoint()->Get(
      dst, len, **region, addr.offset,
      [core, cb](Status st) mutable { cb(st.ok() ? core->Vouch() : st); });
}

void Session::WriteAsync(RemoteAddress addr, const void* src, size_t len,
                         Callback done) {
  auto cb = core_->Track<Status>(std::move(done));
  auto region = Locate(core_.get(), addr, len);
  if (!region.ok()) {
    core_->Defer([cb, st = region.status()]() mutable { cb(st); });
    return;
  }
  SessionCore* core = core_.get();
  core->endpoint()->Put(
      src, len, **region, addr.offset,
      [core, cb](Status st) mutable { cb(st.ok() ? core->Vouch() : st); });
}

namespace {

// The shared body of the two asynchronous atomics: checks the address, and
// turns the endpoint's (status, old value) completion into a Result.
template <typename IssueFn>
void AtomicAsync(SessionCore* core, RemoteAddress addr,
                 Session::ValueCallback done, IssueFn issue) {
  auto cb = core->Track<Result<uint64_t>>(std::move(done));
  Status st = CheckAtomic(addr);
  auto region = Locate(core, addr, 8);
  if (st.ok() && !region.ok()) st = region.status();
  if (!st.ok()) {
    core->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  auto old = std::make_shared<uint64_t>(0);
  issue(**region, old.get(), [core, cb, old](Status s) mutable {
    if (s.ok()) s = core->Vouch();
    if (s.ok()) {
      cb(*old);
    } else {
      cb(s);
    }
  });
}

}  // namespace

void Session::CompareAndSwapAsync(RemoteAddress addr, uint64_t expected,
                                  uint64_t desired, ValueCallback done) {
  fabric::Endpoint* ep = core_->endpoint();
  AtomicAsync(
      core_.get(), addr, std::move(done),
      [&](const fabric::RemoteRegion& r, uint64_t* old, fabric::Completion c) {
        ep->CompareSwap(expected, desired, r, addr.offset, old, std::move(c));
      });
}

void Session::FetchAddAsync(RemoteAddress addr, uint64_t delta,
                            ValueCallback done) {
  fabric::Endpoint* ep = core_->endpoint();
  AtomicAsync(
      core_.get(), addr, std::move(done),
      [&](const fabric::RemoteRegion& r, uint64_t* old, fabric::Completion c) {
        ep->FetchAdd(delta, r, addr.offset, old, std::move(c));
      });
}

size_t Session::Poll() { return core_->loop()->Poll(); }
Status Session::WaitAll() { return core_->WaitAll(); }
size_t Session::in_flight() const { return core_->in_flight(); }
const std::vector<RegionInfo>& Session::regions() const {
  return core_->raw_regions();
}
uint64_t Session::server_incarnation() const { return core_->incarnation(); }
uint64_t Session::session_id() const { return core_->session_id(); }
std::string Session::transport() const { return core_->transport(); }
bool Session::reads_are_local() const { return core_->reads_are_local(); }
bool Session::connected() const { return core_->connected(); }
const SessionOptions& Session::options() const { return core_->options(); }

}  // namespace remem
