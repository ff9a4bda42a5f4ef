#include "fabric/endpoint.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "fabric/worker_address.h"
#include "proto/codec.h"

namespace remem::fabric {

// State of one asynchronous operation, freed after its continuation runs.
struct Op {
  Op(Worker* w, Completion d, const char* wh, std::string k = {},
     std::string h = {}, uint64_t o = 0)
      : worker(w),
        done(std::move(d)),
        what(wh),
        keep(std::move(k)),
        header(std::move(h)),
        operand(o) {}
  Worker* worker;
  Completion done;
  const char* what;
  std::string keep;      // payload kept alive until the send completes
  std::string header;    // AM header, likewise (UCX 1.13 does not copy it)
  uint64_t operand = 0;  // atomic operand, which must outlive the call
  // The endpoint's count of requests out (Endpoint::requests_out_), set
  // once the request is out; it outlives the endpoint.
  std::shared_ptr<size_t> requests_out;
};

namespace {

// One completion for several parts (the pieces of a large served transfer,
// the gets of a GetMany): `done` runs once every part has, with the first
// error among them. The issuer holds a count of its own until it has
// issued every part (EndIssue), so that no part ends it early.
struct Joint {
  size_t left = 1;
  Status first;
  Completion done;
};
// The completion of one more part of `j`.
Completion JointPart(const std::shared_ptr<Joint>& j) {
  ++j->left;
  return [j](Status st) {
    if (!st.ok() && j->first.ok()) j->first = std::move(st);
    if (--j->left == 0 && j->done) j->done(j->first);
  };
}
// Releases the issuer's count. Parts complete from Progress() only, so one
// is normally still out; if none is, `done` runs from the next Progress().
void EndIssue(const std::shared_ptr<Joint>& j, Worker* worker) {
  if (--j->left == 0) worker->Complete(std::move(j->done), j->first);
}

void CompleteLater(Op* op, Status st) {
  op->worker->Complete(std::move(op->done), std::move(st));
  delete op;
}

void OpCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  op->worker->RequestEnded();
  --*op->requests_out;
  CompleteLater(op, FromUcs(status, op->what));
  ucp_request_free(request);
}

}  // namespace

Result<std::unique_ptr<Endpoint>> Endpoint::Create(
    Worker* worker, std::string_view remote_address) {
  auto uuid = WorkerUuidOf(remote_address);
  if (!uuid.ok()) return uuid.status();
  std::unique_ptr<Endpoint> ep(new Endpoint(worker));
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &Endpoint::ErrorCallback;
  // The slot, not the endpoint: it outlives the endpoint while its UCX
  // endpoint is flushed before it is closed (~Endpoint), and reads null then.
  p.err_handler.arg = ep->alive_.get();
  // UCX takes the endpoint's number before it can fail (the address was
  // readable): counted either way.
  ep->number_ = worker->TakeEndpointNumber(*uuid);
  ucs_status_t s = ucp_ep_create(worker->handle(), &p, &ep->ep_);
  if (s != UCS_OK) return FromUcs(s, "creating an endpoint");
  ep->ucp_worker_ = worker->handle();
  worker->EndpointOpened(ep->ucp_worker_);
  return ep;
}

Result<std::unique_ptr<Endpoint>> Endpoint::CreateNumbered(
    Worker* worker, std::string_view remote_address, uint64_t number) {
  auto have = worker->EndpointNumber(remote_address);
  if (!have.ok()) return have.status();
  if (*have > number || number - *have > kMaxSkippedEndpoints) {
    return Status::Unavailable(
        "UCX endpoint numbers disagree: this worker has made " +
        std::to_string(*have) + " endpoints to the peer's, which made its " +
        "own as number " + std::to_string(number) + " (at most " +
        std::to_string(kMaxSkippedEndpoints) +
        " are skipped; connect from a new event loop)");
  }
  for (uint64_t n = *have; n < number; ++n) {
    // Paired with the peer's endpoint of the handshake given up (or with
    // nothing, if the peer closed it), then closed.
    auto skipped = Create(worker, remote_address);
    if (!skipped.ok()) return skipped.status();
  }
  return Create(worker, remote_address);
}

namespace {

// Whether this process can make a UCX endpoint to a peer at all, asked
// from a worker of its own (none of the caller's endpoint numbers is used):
// Start gives the error making one at once (the peer's shared memory
// belongs to a user this one may not map, say), or OK.
//
// An endpoint it made is closed only once its wireup has ended (Poll, then
// Finish): the peer answers a wireup on a tcp connection of its own to the
// probe's worker, and a peer whose connection completes just as that
// worker goes away aborts in UCX 1.13 (its answer, queued for that
// connection, fails while it is being sent: "Assertion
// `wireup_ep->pending_count == 0'", wireup_ep.c:241). Closing the probe at
// once stopped the server in about one connection storm in ten, where
// nearly every client probes. Poll runs it while the caller waits for
// something else, so the wait for its wireup is mostly hidden.
class ReachabilityProbe {
 public:
  Status Start(const Worker& worker, std::string_view remote_address) {
    auto w = Worker::Create(worker.shared_context(), 0);
    if (!w.ok()) return Status::OK();  // nothing learned
    auto ep = Endpoint::Create(w->get(), remote_address);
    if (!ep.ok()) return ep.status();
    worker_ = std::move(*w);
    ep_ = std::move(*ep);
    ucp_request_param_t p{};
    flush_ = ucp_ep_flush_nbx(ep_->handle(), &p);
    if (UCS_PTR_IS_ERR(flush_)) flush_ = nullptr;
    return Status::OK();
  }
  // Progresses the probe; true once its wireup has ended and it is closed
  // (or it never ran).
  bool Poll() {
    if (worker_ == nullptr) return true;
    (void)worker_->Progress();
    if (!WireupEnded()) return false;
    Close();
    return true;
  }
  // Waits until Poll says so, `deadline` or `peer_gone()`, then closes.
  void Finish(Clock::time_point deadline,
              const std::function<bool()>& peer_gone) {
    if (worker_ == nullptr) return;
    (void)worker_->ProgressUntil(
        [&] { return WireupEnded() || (peer_gone && peer_gone()); }, deadline);
    Close();
  }
  ~ReachabilityProbe() { Close(); }

 private:
  // The flush issued at Start completes once the wireup has ended.
  bool WireupEnded() const {
    return flush_ == nullptr ||
           ucp_request_check_status(flush_) != UCS_INPROGRESS;
  }
  void Close() {
    if (worker_ == nullptr) return;
    if (flush_ != nullptr) ucp_request_free(flush_);  // freed once it ends
    flush_ = nullptr;
    ep_->Fail(Status::Unavailable("the probe is done"));
    ep_.reset();
    worker_.reset();
  }

  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Endpoint> ep_;
  ucs_status_ptr_t flush_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Endpoint>> Endpoint::CreateJoined(
    Worker* worker, std::string_view remote_address, uint64_t number,
    std::string_view notice, Clock::time_point deadline,
    const std::function<bool()>& peer_gone) {
  ucp_ep_h made_here = nullptr;
  bool gone = false;
  // A peer whose endpoint this worker cannot take (UCX fails to make the
  // one its wireup asks for, logs why and answers nothing) never sends
  // its notice: once the notice is late, a probe says whether UCX can
  // reach the peer from here at all.
  const auto probe_at = Clock::now() + kNoticeGrace;
  bool probed = false;
  ReachabilityProbe probe;
  Status unreachable;
  Status waited = worker->ProgressUntil(
      [&] {
        if (probed) (void)probe.Poll();
        made_here = worker->TakeNotice(notice);
        if (made_here != nullptr) return true;
        gone = peer_gone && peer_gone();
        if (gone) return true;
        if (!probed && Clock::now() >= probe_at) {
          probed = true;
          unreachable = probe.Start(*worker, remote_address);
        }
        return !unreachable.ok();
      },
      deadline);
  probe.Finish(deadline, peer_gone);
  if (!unreachable.ok()) return unreachable;
  if (!waited.ok()) {
    if (waited.code() != StatusCode::kTimedOut) return waited;
    return Status::TimedOut(
        "the peer's UCX endpoint did not reach this worker in time");
  }
  if (gone) {
    return Status::Unavailable(
        "the peer went away before its UCX endpoint reached this worker");
  }
  auto ep = CreateNumbered(worker, remote_address, number);
  if (!ep.ok()) return ep.status();
  if ((*ep)->handle() != made_here) {
    return Status::Unavailable(
        "UCX did not pair this endpoint with the peer's (endpoint numbers "
        "disagree); connect from a new event loop");
  }
  return ep;
}

void Endpoint::SendNotice(std::string_view notice) {
  // SendAm's reply flag is what makes the notice wait for the wireup (see
  // the header). A notice that cannot be sent would leave the peer waiting
  // to its deadline: the endpoint fails instead, and its owner hears it.
  SendAm(proto::kAmEndpointNotice, notice.data(), notice.size(), {},
         [alive = alive_](Status st) {
           Endpoint* self = *alive;
           if (st.ok() || self == nullptr) return;
           self->Fail(st.WithContext("sending the endpoint notice"));
         });
}

Status Endpoint::WaitConnected(Clock::time_point deadline) {
  if (failed_ || closed_) return Unusable();
  // The connection is made lazily; a flush completes once wireup is done,
  // or fails if the peer is unreachable or goes away.
  ucp_request_param_t fp{};
  Status st =
      Settle(ucp_ep_flush_nbx(ep_, &fp), deadline - Clock::now(), "connecting");
  if (st.ok() && failed_) st = failure_;
  return st;
}

Endpoint::~Endpoint() {
  *alive_ = nullptr;
  FailServed(Status::Unavailable("endpoint closed"));
  if (routed_) worker_->UnrouteAm(proto::kAmMemReply, ep_, route_token_);
  if (ucp_worker_ != nullptr) worker_->EndpointClosed(ucp_worker_);
  if (ep_ == nullptr || closed_) return;
  // A request still out (a rendezvous send whose peer is paused, say) is
  // given up: a forced close. Otherwise what was sent goes out first (a
  // flush), then the endpoint is force-closed all the same: UCX 1.13 never
  // destroys an endpoint closed gracefully while its peer's endpoint to it
  // exists ("destroyed only when the worker is destroyed"), so a server
  // kept every departed shared-memory client's mappings, 4 MiB each, for
  // good (a kill -9 or a client that exits leaves the peer's endpoint).
  if (failed_ || *requests_out_ > 0) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    worker_->TrackClose(ucp_ep_close_nbx(ep_, &p));
    return;
  }
  worker_->CloseAfterFlush(ep_, alive_);
}

void Endpoint::ErrorCallback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  Endpoint* self = *static_cast<Endpoint**>(arg);
  if (self == nullptr || self->failed_) return;  // destroyed, being flushed
  self->failed_ = true;
  // UCX's tcp transport reports a peer that closed or died as a timeout.
  self->failure_ = FromUcs(
      status, "connection lost (the peer stopped, died or cannot be reached)");
  // The peer may have died mid-send.
  self->worker_->WatchForStall();
  self->FailServed(self->failure_);
  // Closing from inside a UCX callback is not allowed; do it after (unless
  // the endpoint is destroyed first: its destructor force-closes it).
  self->worker_->Defer([alive = self->alive_] {
    Endpoint* self = *alive;
    if (self == nullptr) return;
    if (!self->closed_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      self->closed_ = true;
      self->worker_->TrackClose(ucp_ep_close_nbx(self->ep_, &p));
    }
    self->ReportFailure();
  });
}

void Endpoint::ReportFailure() {
  if (failure_reported_ || !on_failure_) return;
  failure_reported_ = true;
  on_failure_(failure_);
}

void Endpoint::Fail(Status why) {
  if (closed_) return;
  if (!failed_) {
    failed_ = true;
    // An operation that timed out has its own TimedOut; what the teardown
    // fails, and every later operation, finds the connection gone.
    failure_ = why.code() == StatusCode::kTimedOut
                   ? Status::Unavailable(
                         "the connection was closed after an "
                         "operation timed out (" +
                         why.message() + ")")
                   : std::move(why);
  }
  closed_ = true;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  worker_->TrackClose(ucp_ep_close_nbx(ep_, &p));
  // Served operations end here: their replies can no longer arrive.
  FailServed(failure_);
  // Let the forced close complete the outstanding operations now, so their
  // buffers are released before the caller reuses them (their continuations
  // run at the next Progress). A forced close completes them at once in
  // practice; the bound only guards against a UCX bug.
  // What runs meanwhile may destroy this endpoint (a deferred drop of its
  // connection): nothing of it is touched after, unless it still exists.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  const std::shared_ptr<Endpoint*> alive = alive_;
  const std::shared_ptr<size_t> requests_out = requests_out_;
  worker_->DrainCloses(deadline);
  if (*alive != nullptr && *requests_out > 0) {
    (void)worker_->ProgressUntil([&requests_out] { return *requests_out == 0; },
                                 deadline);
  }
  if (*alive == nullptr) return;
  // The handler runs later, and only if this endpoint still exists then:
  // its owner may destroy it (and what the handler touches) first.
  if (on_failure_) {
    worker_->Defer([alive = alive_] {
      Endpoint* self = *alive;
      if (self != nullptr) self->ReportFailure();
    });
  }
}

Status Endpoint::Unusable() const {
  if (failed_) return failure_;
  return Status::Unavailable("endpoint closed");
}

ucp_request_param_t Endpoint::Params(Op* op) const {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &OpCallback;
  p.user_data = op;
  return p;
}

void Endpoint::Finish(ucs_status_ptr_t r, Op* op) {
  if (r == nullptr) {
    CompleteLater(op, Status::OK());
  } else if (UCS_PTR_IS_ERR(r)) {
    CompleteLater(op, FromUcs(UCS_PTR_STATUS(r), op->what));
  } else {
    worker_->RequestIssued();  // OpCallback completes it
    ++*requests_out_;
    op->requests_out = requests_out_;
  }
}

Status Endpoint::Settle(ucs_status_ptr_t r, Clock::duration timeout,
                        std::string_view what) {
  if (r == nullptr) return Status::OK();  // completed in the call
  Status st = worker_->Wait(r, Clock::now() + timeout, what);
  if (st.code() == StatusCode::kTimedOut) Fail(st);
  return st;
}

void Endpoint::Get(void* dst, size_t len, const RemoteRegion& region,
                   uint64_t offset, Completion done) {
  if (failed_ || closed_) return worker_->Complete(std::move(done), Unusable());
  if (const uint8_t* m = region.mapped()) {
    std::memcpy(dst, m + offset, len);
    return worker_->Complete(std::move(done), Status::OK());
  }
  if (served_) {
    return ServedTransfer(false, static_cast<uint8_t*>(dst), len, region,
                          offset, std::move(done));
  }
  auto* op = new Op{worker_, std::move(done), "get", {}, {}};
  ucp_request_param_t p = Params(op);
  Finish(ucp_get_nbx(ep_, dst, len, region.base() + offset, region.rkey(), &p),
         op);
}

void Endpoint::GetMany(const std::vector<GetSpan>& spans, Completion done) {
  if (spans.size() == 1) {
    const GetSpan& g = spans[0];
    return Get(g.dst, g.len, *g.region, g.offset, std::move(done));
  }
  if (failed_ || closed_ || spans.empty()) {
    return worker_->Complete(std::move(done),
                             spans.empty() ? Status::OK() : Unusable());
  }
  auto joint = std::make_shared<Joint>();
  joint->done = std::move(done);
  std::vector<proto::MemSpan> batch;
  ServedOp sop;
  uint64_t bytes = 0;
  auto send = [&] {
    if (batch.empty()) return;
    sop.done = JointPart(joint);
    sop.op = uint8_t(proto::MemOp::kReadMany);
    IssueServed(proto::MakeMemRequest(proto::MemOp::kReadMany, 0, 0, 0, bytes),
                proto::EncodeMemSpans(batch), std::move(sop));
    batch.clear();
    sop = ServedOp{};
    bytes = 0;
  };
  for (const GetSpan& g : spans) {
    // Unserved, mapped, or too large for one request: a get of its own.
    if (!served_ || g.region->mapped() != nullptr ||
        g.len > proto::kMaxMemTransfer) {
      Get(g.dst, g.len, *g.region, g.offset, JointPart(joint));
      continue;
    }
    if (batch.size() == proto::kMaxMemSpans ||
        bytes + g.len > proto::kMaxMemTransfer) {
      send();
    }
    batch.push_back({g.region->id(), 0, g.offset, g.len});
    sop.spans.emplace_back(g.dst, g.len);
    bytes += g.len;
  }
  send();
  EndIssue(joint, worker_);
}

void Endpoint::Put(const void* src, size_t len, const RemoteRegion& region,
                   uint64_t offset, Completion done) {
  if (failed_ || closed_) return worker_->Complete(std::move(done), Unusable());
  if (region.mapped() != nullptr) {
    std::memcpy(const_cast<uint8_t*>(region.mapped()) + offset, src, len);
    return worker_->Complete(std::move(done), Status::OK());
  }
  if (served_) {
    return ServedTransfer(true, static_cast<uint8_t*>(const_cast<void*>(src)),
                          len, region, offset, std::move(done));
  }
  auto* op = new Op{worker_, std::move(done), "put", {}, {}};
  // The put's own completion only frees the source buffer; the flush after
  // it completes once the data is in the peer's memory.
  ucp_request_param_t none{};
  ucs_status_ptr_t r =
      ucp_put_nbx(ep_, src, len, region.base() + offset, region.rkey(), &none);
  if (UCS_PTR_IS_ERR(r)) {
    return CompleteLater(op, FromUcs(UCS_PTR_STATUS(r), "put"));
  }
  if (r != nullptr) ucp_request_free(r);
  ucp_request_param_t p = Params(op);
  Finish(ucp_ep_flush_nbx(ep_, &p), op);
}

void Endpoint::CompareSwap(uint64_t expected, uint64_t desired,
                           const RemoteRegion& region, uint64_t offset,
                           uint64_t* old, Completion done) {
  if (served_ && !failed_ && !closed_) {
    ServedOp sop{std::move(done), uint8_t(proto::MemOp::kCompareSwap)};
    sop.old = old;
    return IssueServed(
        proto::MakeMemRequest(proto::MemOp::kCompareSwap, region.id(), 0,
                              offset, 8, expected, desired),
        {}, std::move(sop));
  }
  // UCX CSWAP: compare value in `buffer`, swap value in `reply_buffer`,
  // which receives the old value. `expected` must outlive the operation.
  auto* op =
      new Op{worker_, std::move(done), "compare-and-swap", {}, {}, expected};
  if (failed_ || closed_) return CompleteLater(op, Unusable());
  *old = desired;
  ucp_request_param_t p = Params(op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER | UCP_OP_ATTR_FIELD_DATATYPE;
  p.reply_buffer = old;
  p.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  Finish(ucp_atomic_op_nbx(ep_, UCP_ATOMIC_OP_CSWAP, &op->operand, 1,
                           region.base() + offset, region.rkey(), &p),
         op);
}

void Endpoint::FetchAdd(uint64_t delta, const RemoteRegion& region,
                        uint64_t offset, uint64_t* old, Completion done) {
  if (served_ && !failed_ && !closed_) {
    ServedOp sop{std::move(done), uint8_t(proto::MemOp::kFetchAdd)};
    sop.old = old;
    return IssueServed(proto::MakeMemRequest(proto::MemOp::kFetchAdd,
                                             region.id(), 0, offset, 8, delta),
                       {}, std::move(sop));
  }
  auto* op = new Op{worker_, std::move(done), "fetch-add", {}, {}, delta};
  if (failed_ || closed_) return CompleteLater(op, Unusable());
  ucp_request_param_t p = Params(op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER | UCP_OP_ATTR_FIELD_DATATYPE;
  p.reply_buffer = old;
  p.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  Finish(ucp_atomic_op_nbx(ep_, UCP_ATOMIC_OP_ADD, &op->operand, 1,
                           region.base() + offset, region.rkey(), &p),
         op);
}

Status Endpoint::GetSync(void* dst, size_t len, const RemoteRegion& region,
                         uint64_t offset, Clock::duration timeout) {
  if (failed_ || closed_) return Unusable();
  if (const uint8_t* m = region.mapped()) {
    std::memcpy(dst, m + offset, len);
    return Status::OK();
  }
  if (served_) {
    return RunSync(
        [&](Completion c) { Get(dst, len, region, offset, std::move(c)); },
        timeout, "get");
  }
  ucp_request_param_t p{};
  return Settle(
      ucp_get_nbx(ep_, dst, len, region.base() + offset, region.rkey(), &p),
      timeout, "get");
}

Status Endpoint::PutSync(const void* src, size_t len,
                         const RemoteRegion& region, uint64_t offset,
                         Clock::duration timeout) {
  if (failed_ || closed_) return Unusable();
  if (region.mapped() != nullptr) {
    std::memcpy(const_cast<uint8_t*>(region.mapped()) + offset, src, len);
    return Status::OK();
  }
  if (served_) {
    return RunSync(
        [&](Completion c) { Put(src, len, region, offset, std::move(c)); },
        timeout, "put");
  }
  ucp_request_param_t p{};
  REMEM_RETURN_IF_ERROR(Settle(
      ucp_put_nbx(ep_, src, len, region.base() + offset, region.rkey(), &p),
      timeout, "put"));
  if (failed_ || closed_) return Unusable();
  return Settle(ucp_ep_flush_nbx(ep_, &p), timeout, "flush");
}

Result<uint64_t> Endpoint::CompareSwapSync(uint64_t expected, uint64_t desired,
                                           const RemoteRegion& region,
                                           uint64_t offset,
                                           Clock::duration timeout) {
  if (failed_ || closed_) return Unusable();
  if (served_) {
    // On the stack: no reply lands after RunSync returns (a timeout fails
    // the endpoint, which drops the operation first).
    uint64_t old = 0;
    REMEM_RETURN_IF_ERROR(RunSync(
        [&](Completion c) {
          CompareSwap(expected, desired, region, offset, &old, std::move(c));
        },
        timeout, "compare-and-swap"));
    return old;
  }
  uint64_t result = desired;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_REPLY_BUFFER | UCP_OP_ATTR_FIELD_DATATYPE;
  p.reply_buffer = &result;
  p.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  REMEM_RETURN_IF_ERROR(
      Settle(ucp_atomic_op_nbx(ep_, UCP_ATOMIC_OP_CSWAP, &expected, 1,
                               region.base() + offset, region.rkey(), &p),
             timeout, "compare-and-swap"));
  return result;
}

Result<uint64_t> Endpoint::FetchAddSync(uint64_t delta,
                                        const RemoteRegion& region,
                                        uint64_t offset,
                                        Clock::duration timeout) {
  if (failed_ || closed_) return Unusable();
  if (served_) {
    uint64_t old = 0;
    REMEM_RETURN_IF_ERROR(RunSync(
        [&](Completion c) {
          FetchAdd(delta, region, offset, &old, std::move(c));
        },
        timeout, "fetch-add"));
    return old;
  }
  uint64_t result = 0;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_REPLY_BUFFER | UCP_OP_ATTR_FIELD_DATATYPE;
  p.reply_buffer = &result;
  p.datatype = ucp_dt_make_contig(sizeof(uint64_t));
  REMEM_RETURN_IF_ERROR(
      Settle(ucp_atomic_op_nbx(ep_, UCP_ATOMIC_OP_ADD, &delta, 1,
                               region.base() + offset, region.rkey(), &p),
             timeout, "fetch-add"));
  return result;
}

void Endpoint::SendAm(unsigned am_id, const void* header, size_t header_len,
                      std::string payload, Completion done) {
  if (!failed_ && !closed_) {
    // First without keeping anything: a message small enough for the
    // transport's inline send (every reply to a get of a small value) is
    // copied out during the call, so no operation state, no copy of the
    // header and no completion entry is needed. UCX refuses with
    // NO_RESOURCE, sending nothing, whatever it cannot complete in the call.
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep_, am_id, header, header_len,
                                         payload.data(), payload.size(), &p);
    if (r == nullptr) {
      if (done) worker_->Complete(std::move(done), Status::OK());
      return;
    }
    if (!UCS_PTR_IS_ERR(r)) {
      // Against UCX's contract for FORCE_IMM_CMPL: the request would refer
      // to buffers about to go away.
      std::fprintf(stderr,
                   "remem: UCX returned a request for an immediate send\n");
      std::abort();
    }
    if (UCS_PTR_STATUS(r) != UCS_ERR_NO_RESOURCE) {
      if (done) {
        worker_->Complete(std::move(done), FromUcs(UCS_PTR_STATUS(r), "send"));
      }
      return;
    }
  }
  auto* op = new Op{worker_, std::move(done), "send", std::move(payload),
                    std::string(static_cast<const char*>(header), header_len)};
  if (failed_ || closed_) return CompleteLater(op, Unusable());
  ucp_request_param_t p = Params(op);
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  Finish(ucp_am_send_nbx(ep_, am_id, op->header.data(), op->header.size(),
                         op->keep.data(), op->keep.size(), &p),
         op);
}

// --- served mode

Status Endpoint::set_served(bool served) {
  if (served && !routed_ && ep_ != nullptr) {
    auto token =
        worker_->RouteAm(proto::kAmMemReply, ep_,
                         [this](AmMessage&& m) { OnMemReply(std::move(m)); });
    if (!token.ok()) return token.status();
    route_token_ = *token;
    routed_ = true;
  }
  served_ = served;
  return Status::OK();
}

void Endpoint::IssueServed(const proto::MemRequest& request,
                           std::string payload, ServedOp op) {
  if (failed_ || closed_) {
    return worker_->Complete(std::move(op.done), Unusable());
  }
  proto::MemRequest h = request;
  h.request_id = worker_->NextRequestId();
  const uint64_t id = h.request_id;
  op.issued = Clock::now();
  // Ids only grow: the new one goes last.
  served_ops_.emplace_hint(served_ops_.end(), id, std::move(op));
  // A send that fails completes the operation; one that succeeds waits for
  // the reply. The endpoint may be gone by the time the send completes.
  SendAm(proto::kAmMemRequest, &h, sizeof(h), std::move(payload),
         [alive = alive_, id](Status st) {
           Endpoint* self = *alive;
           if (st.ok() || self == nullptr) return;
           auto it = self->served_ops_.find(id);
           if (it == self->served_ops_.end()) return;
           Completion done = std::move(it->second.done);
           self->served_ops_.erase(it);
           done(std::move(st));
         });
}

void Endpoint::ServedTransfer(bool write, uint8_t* local, size_t len,
                              const RemoteRegion& region, uint64_t offset,
                              Completion done) {
  const auto op = write ? proto::MemOp::kWrite : proto::MemOp::kRead;
  auto issue = [&](uint8_t* at, size_t n, uint64_t off, Completion c) {
    ServedOp sop{std::move(c), uint8_t(op)};
    if (!write) {
      sop.dst = at;
      sop.len = n;
    }
    IssueServed(proto::MakeMemRequest(op, region.id(), 0, off, n),
                write ? std::string(reinterpret_cast<const char*>(at), n)
                      : std::string(),
                std::move(sop));
  };
  if (len <= proto::kMaxMemTransfer) {
    return issue(local, len, offset, std::move(done));
  }
  // One completion for all the pieces, with the first error among them.
  auto joint = std::make_shared<Joint>();
  joint->done = std::move(done);
  for (size_t pos = 0; pos < len; pos += proto::kMaxMemTransfer) {
    const size_t n = std::min<size_t>(proto::kMaxMemTransfer, len - pos);
    issue(local + pos, n, offset + pos, JointPart(joint));
  }
  EndIssue(joint, worker_);
}

bool Endpoint::ServedAnswerHeld(uint64_t id) const {
  return routed_ && ep_ != nullptr &&
         worker_->HoldsMessage(proto::kAmMemReply, ep_,
                               [id](const AmMessage& m) {
                                 auto h = proto::DecodeMemReply(m.header);
                                 return h.ok() && h->request_id == id;
                               });
}

void Endpoint::OnMemReply(AmMessage&& msg) {
  auto h = proto::DecodeMemReply(msg.header);
  if (!h.ok()) return;  // not a reply to anything we can name
  auto it = served_ops_.find(h->request_id);
  if (it == served_ops_.end()) return;  // failed or timed out earlier
  ServedOp op = std::move(it->second);
  served_ops_.erase(it);
  Status st;
  if (h->status != 0) {
    st = Status(static_cast<StatusCode>(h->status), std::move(msg.data));
  } else if (h->op != op.op) {
    st = Status::ProtocolError("memory reply for another operation");
  } else if (!op.spans.empty()) {
    size_t want = 0;
    for (const auto& [dst, len] : op.spans) want += len;
    if (msg.refused_length != 0 || msg.data.size() != want) {
      st = Status::ProtocolError("memory reply of " +
                                 std::to_string(msg.data.size()) +
                                 " bytes to reads of " + std::to_string(want));
    } else {
      size_t at = 0;
      for (const auto& [dst, len] : op.spans) {
        std::memcpy(dst, msg.data.data() + at, len);
        at += len;
      }
    }
  } else if (op.dst != nullptr) {
    if (msg.refused_length != 0 || msg.data.size() != op.len) {
      st = Status::ProtocolError(
          "memory reply of " + std::to_string(msg.data.size()) +
          " bytes to a read of " + std::to_string(op.len));
    } else {
      std::memcpy(op.dst, msg.data.data(), op.len);
    }
  } else if (op.old != nullptr) {
    *op.old = h->value;
  }
  worker_->Complete(std::move(op.done), std::move(st));
}

size_t Endpoint::ExpireServed(Clock::time_point issued_by) {
  size_t n = 0;
  while (!served_ops_.empty() &&
         served_ops_.begin()->second.issued <= issued_by) {
    Completion done = std::move(served_ops_.begin()->second.done);
    served_ops_.erase(served_ops_.begin());
    worker_->Complete(std::move(done),
                      Status::TimedOut("no reply to a one-sided operation "
                                       "within the timeout"));
    ++n;
  }
  return n;
}

void Endpoint::FailServed(const Status& why) {
  if (served_ops_.empty()) return;
  auto ops = std::move(served_ops_);
  served_ops_.clear();
  for (auto& [id, op] : ops) worker_->Complete(std::move(op.done), why);
}

Status Endpoint::RunSync(const std::function<void(Completion)>& issue,
                         Clock::duration timeout, std::string_view what) {
  struct State {
    bool done = false;
    Status status;
  };
  // Shared with the completion, which may run after a timeout returns.
  auto state = std::make_shared<State>();
  issue([state](Status st) {
    state->done = true;
    state->status = std::move(st);
  });
  Status wait = worker_->ProgressUntil(
      [&] {
        if (wait_hook_ && !state->done) wait_hook_();
        return state->done;
      },
      Clock::now() + timeout, std::chrono::microseconds(200),
      std::chrono::milliseconds(wait_hook_ ? 10 : 100));
  if (!wait.ok() && !state->done) {
    Status st = wait.WithContext(what);
    Fail(st);
    return st;
  }
  return state->status;
}

std::string Endpoint::LaneInfo() const {
  if (ep_ == nullptr || closed_) return {};
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return {};
  ucp_ep_print_info(ep_, f);
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  return out;
}

// ucp_ep_print_info lists one line per lane, e.g.
//   lane[1]:  2:posix/memory.0 md[1]          -> md[1]/posix/sysdev[255]
//   rma_bw#0 lane[2]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255]
//   am am_bw#0
// Collect the transport names of the lanes, skipping the handshake-only
// "cm" lanes.
namespace {

bool IsSharedMemoryTransport(const std::string& tl) {
  return tl == "posix" || tl == "sysv" || tl == "cma" || tl == "xpmem" ||
         tl == "knem";
}

}  // namespace

std::vector<Endpoint::Lane> Endpoint::Lanes() const {
  const std::string info = LaneInfo();
  std::vector<Lane> out;
  size_t pos = 0;
  while ((pos = info.find("lane[", pos)) != std::string::npos) {
    size_t eol = info.find('\n', pos);
    std::string line = info.substr(pos, eol - pos);
    pos = eol == std::string::npos ? info.size() : eol;
    // "lane[1]:  1:tcp/lo.0 md[1] ... rma_bw#0": the transport between the
    // second ':' and the first '/', the device up to the next blank. A
    // handshake-only "cm" lane has neither.
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    size_t tl_start = line.find(':', colon + 1);
    size_t slash = line.find('/', colon);
    if (tl_start == std::string::npos || slash == std::string::npos ||
        tl_start > slash) {
      continue;
    }
    Lane lane;
    lane.transport = line.substr(tl_start + 1, slash - tl_start - 1);
    size_t dev_end = line.find_first_of(" \t", slash);
    lane.device = line.substr(slash + 1, dev_end - slash - 1);
    lane.rma = line.find("rma") != std::string::npos;
    if (!lane.transport.empty()) out.push_back(std::move(lane));
  }
  return out;
}

std::string Endpoint::TransportDescription() const {
  std::set<std::string> shm, net;
  for (const Lane& l : Lanes()) {
    if (IsSharedMemoryTransport(l.transport)) {
      shm.insert(l.transport);
    } else if (l.transport != "self") {
      net.insert(l.transport + ":" + l.device);
    }
  }
  std::string out;
  auto join = [](const std::set<std::string>& s) {
    std::string r;
    for (const auto& x : s) r += (r.empty() ? "" : ",") + x;
    return r;
  };
  if (!shm.empty()) out = "shm (" + join(shm) + ")";
  if (!net.empty())
    out += (out.empty() ? "" : " + ") + std::string("net (") + join(net) + ")";
  return out.empty() ? "unknown" : out;
}

// UCX runs ucp_get / atomics on a real RMA transport when the endpoint has
// one: shared memory (posix, sysv, cma, xpmem, knem), RDMA (rc_*, dc_*,
// ud_*, ib), or self. tcp has none, so a tcp-only endpoint gets the
// software emulation that the peer's progress engine serves. Only that case
// is served by remem; anything else keeps UCX's path.
bool Endpoint::RmaIsEmulated() const {
  std::vector<Lane> lanes = Lanes();
  if (lanes.empty()) return false;
  for (const Lane& l : lanes) {
    if (l.transport != "tcp") return false;
  }
  return true;
}

bool Endpoint::UsesSharedMemory() const {
  // Any lane: a peer whose UCX settings leave out the RMA lanes (no cma
  // lane with UCX_MAX_RNDV_LANES=0) still sends through a shared-memory
  // FIFO, and its regions are still mapped.
  for (const Lane& l : Lanes()) {
    if (IsSharedMemoryTransport(l.transport)) return true;
  }
  return false;
}

}  // namespace remem::fabric
