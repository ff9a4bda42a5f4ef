#include "fabric/worker.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "fabric/worker_address.h"
#include "proto/wire.h"

namespace remem::fabric {

struct Worker::PendingRecv {
  AmSlot* slot;
  AmMessage msg;
};

Status Worker::CreateUcp(const Context& ctx, ucp_worker_h* out, int* efd,
                         std::string* address) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w = nullptr;
  ucs_status_t s = ucp_worker_create(ctx.handle(), &params, &w);
  if (s != UCS_OK) return FromUcs(s, "ucp_worker_create");
  s = ucp_worker_get_efd(w, efd);
  if (s != UCS_OK) {
    ucp_worker_destroy(w);
    return FromUcs(s, "ucp_worker_get_efd");
  }
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(w, &addr, &addr_len);
  if (s != UCS_OK) {
    ucp_worker_destroy(w);
    return FromUcs(s, "ucp_worker_get_address");
  }
  address->assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(w, addr);
  *out = w;
  return Status::OK();
}

Result<std::unique_ptr<Worker>> Worker::Create(std::shared_ptr<Context> ctx,
                                               size_t max_am_data) {
  ucp_worker_h w = nullptr;
  int efd = -1;
  std::string address;
  REMEM_RETURN_IF_ERROR(CreateUcp(*ctx, &w, &efd, &address));
  std::unique_ptr<Worker> worker(
      new Worker(std::move(ctx), w, efd, max_am_data));
  worker->address_ = std::move(address);
  worker->nap_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (worker->nap_fd_ < 0) {
    return Status::IOError(std::string("eventfd: ") + std::strerror(errno));
  }
  Worker* raw = worker.get();
  REMEM_RETURN_IF_ERROR(
      worker->SetAmHandler(proto::kAmEndpointNotice, [raw](AmMessage&& m) {
        if (raw->notices_.size() == kMaxNotices) raw->notices_.pop_front();
        raw->notices_.emplace_back(std::string(m.header), m.reply_ep);
      }));
  return worker;
}

ucp_ep_h Worker::TakeNotice(std::string_view header) {
  for (auto it = notices_.begin(); it != notices_.end(); ++it) {
    if (it->first != header) continue;
    ucp_ep_h ep = it->second;
    notices_.erase(it);
    return ep;
  }
  return nullptr;
}

Worker::~Worker() {
  DrainCloses(Clock::now() + std::chrono::seconds(1));
  if (CloseFlushed(/*all=*/true) > 0) {
    DrainCloses(Clock::now() + std::chrono::seconds(1));
  }
  for (ucs_status_ptr_t r : closing_) ucp_request_free(r);
  for (auto& b : bindings_) (void)Bind(nullptr, b->slot->id, b->ucp);
  for (const Retired& r : retired_) ucp_worker_destroy(r.ucp);
  ucp_worker_destroy(handle());
  if (nap_fd_ >= 0) close(nap_fd_);
}

Status Worker::Bind(AmSlot* slot, unsigned am_id, ucp_worker_h ucp) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
  p.id = am_id;
  p.cb = nullptr;
  if (slot != nullptr) {
    auto binding = std::make_unique<AmBinding>(AmBinding{slot, ucp});
    p.field_mask |=
        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.cb = &Worker::AmCallback;
    p.arg = binding.get();
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucs_status_t s = ucp_worker_set_am_recv_handler(ucp, &p);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_set_am_recv_handler");
    bindings_.push_back(std::move(binding));
    return Status::OK();
  }
  (void)ucp_worker_set_am_recv_handler(ucp, &p);
  return Status::OK();
}

Status Worker::SetAmHandler(unsigned am_id, AmHandler handler) {
  auto slot = std::make_unique<AmSlot>(AmSlot{this, am_id, std::move(handler)});
  REMEM_RETURN_IF_ERROR(Bind(slot.get(), am_id, handle()));
  slots_.push_back(std::move(slot));
  return Status::OK();
}

void Worker::RemoveAmHandler(unsigned am_id) {
  for (auto& slot : slots_) {
    if (slot->id != am_id || !slot->handler) continue;
    for (auto& b : bindings_) {
      if (b->slot == slot.get()) (void)Bind(nullptr, am_id, b->ucp);
    }
    std::erase_if(bindings_,
                  [s = slot.get()](const auto& b) { return b->slot == s; });
    slot->handler = [](AmMessage&&) {};  // for rendezvous data still arriving
  }
  inbox_.DropIf(
      [am_id](const auto& m) {
        return m.first != nullptr && m.first->id == am_id;
      },
      [](auto& m) { m.first = nullptr; });
}

Result<uint64_t> Worker::RouteAm(unsigned am_id, ucp_ep_h ep,
                                 AmHandler handler) {
  bool installed = false;
  for (const auto& slot : slots_) installed |= slot->id == am_id;
  if (!installed) {
    REMEM_RETURN_IF_ERROR(SetAmHandler(am_id, [this, am_id](AmMessage&& m) {
      auto it = routes_.find({am_id, m.reply_ep});
      if (it != routes_.end()) it->second.handler(std::move(m));
    }));
  }
  const uint64_t token = next_route_token_++;
  routes_[{am_id, ep}] = Route{token, std::move(handler)};
  return token;
}

void Worker::UnrouteAm(unsigned am_id, ucp_ep_h ep, uint64_t token) {
  auto it = routes_.find({am_id, ep});
  if (it != routes_.end() && it->second.token == token) routes_.erase(it);
}

ucs_status_t Worker::AmCallback(void* arg, const void* header,
                                size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
  auto* binding = static_cast<AmBinding*>(arg);
  AmSlot* slot = binding->slot;
  Worker* w = slot->worker;
  AmMessage msg;
  msg.header.assign(static_cast<const char*>(header), header_length);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    msg.reply_ep = param->reply_ep;
  }
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (length > w->max_am_data_) {
    // Refuse without fetching; the handler answers with an error. Returning
    // OK for a rendezvous descriptor drops it and completes the sender.
    msg.refused_length = length;
    w->inbox_.Emplace(slot, std::move(msg));
    return UCS_OK;
  }
  if (!rndv) {
    msg.data.assign(static_cast<const char*>(data), length);
    w->inbox_.Emplace(slot, std::move(msg));
    return UCS_OK;
  }
  auto* pending = new PendingRecv{slot, std::move(msg)};
  pending->msg.data.resize(length);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &Worker::RecvDone;
  p.user_data = pending;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(
      binding->ucp, data, pending->msg.data.data(), length, &p);
  if (r == nullptr) {
    w->inbox_.Emplace(slot, std::move(pending->msg));
    delete pending;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete pending;  // the sender sees its send fail
  }
  return UCS_INPROGRESS;
}

void Worker::RecvDone(void* request, ucs_status_t status, size_t /*length*/,
                      void* user_data) {
  auto* pending = static_cast<PendingRecv*>(user_data);
  if (status == UCS_OK) {
    pending->slot->worker->inbox_.Emplace(pending->slot,
                                          std::move(pending->msg));
  }
  delete pending;
  ucp_request_free(request);
}

size_t Worker::Progress() {
  // This call takes over what enclosing passes hold if its caller asked;
  // the passes of callbacks it runs do not, unless they ask themselves.
  struct Depth {
    Worker* w;
    bool take_over;
    explicit Depth(Worker* worker) : w(worker), take_over(worker->take_over_) {
      ++w->progress_depth_;
      w->take_over_ = false;
    }
    ~Depth() {
      --w->progress_depth_;
      w->take_over_ = take_over;
    }
  } depth(this);
  const bool take_over = depth.take_over;
  size_t work = 0;
  // Stop progressing UCX once a message or completion is ready: another
  // ucp_worker_progress (a poll of every transport, a syscall on tcp) would
  // delay handling it, and the next Progress() picks up the rest.
  bool drained = true;  // UCX had nothing more to deliver (ProgressMark)
  while (unsigned n = ucp_worker_progress(handle())) {
    work += n;
    if (inbox_.HasRunnable(take_over) || completed_.HasRunnable(take_over)) {
      drained = false;
      break;
    }
  }
  if (!retired_.empty() && RetiredActive()) {
    // Once per pass, and counted as work only for what it delivered: a
    // stalled worker's progress may keep answering without delivering.
    const size_t before = inbox_.size() + completed_.size();
    for (const Retired& r : retired_) {
      if (r.endpoints > 0 || !closing_.empty() || !flushing_.empty())
        (void)ucp_worker_progress(r.ucp);
    }
    work += inbox_.size() + completed_.size() - before;
  }

  // Cleared before the tasks are taken: a Post or Notify after this finds
  // it cleared and sets it again, for the next pass or Sleep. A Notify
  // counts as work (its task is in the notifier's own queue, which the
  // caller looks at again before it sleeps).
  if (has_posted_.load(std::memory_order_relaxed) &&
      has_posted_.exchange(false, std::memory_order_seq_cst)) {
    std::vector<util::MoveFunction<void()>> posted;
    {
      std::lock_guard<std::mutex> lock(posted_mu_);
      posted.swap(posted_);
    }
    for (auto& fn : posted) fn();
    work += std::max<size_t>(posted.size(), 1);
  }
  // One pass over what is ready now: a completion that issues a new
  // operation which completes at once must not keep this call from
  // returning, so new entries wait for the next Progress(). A pass nested
  // in a callback runs later entries only, unless it takes over
  // (util/pass_queue.h).
  if (!inbox_.empty()) {
    work += inbox_.RunPass(
        [](std::pair<AmSlot*, AmMessage>&& m) {
          if (m.first != nullptr) m.first->handler(std::move(m.second));
        },
        take_over);
  }
  if (!completed_.empty()) {
    work += completed_.RunPass(
        [](std::pair<Completion, Status>&& c) {
          if (c.first) c.first(std::move(c.second));
        },
        take_over);
  }
  if (!deferred_.empty()) {
    work += deferred_.RunPass([](util::MoveFunction<void()>&& fn) { fn(); },
                              take_over);
  }
  for (auto& hook : pass_hooks_) work += hook();
  if (!flushing_.empty()) work += CloseFlushed(/*all=*/false);
  if (!closing_.empty()) {
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
  }
  if (!retired_.empty() && closing_.empty() && flushing_.empty()) {
    DestroyIdleRetired();
  }
  if (work > 0) {
    busy_arms_ = 0;
    next_nap_ = kFirstNap;
  }
  if (work == 0 && stall_watch_until_ != Clock::time_point{}) {
    LookForStall();
  }
  ++passes_;
  if (drained) ++drains_;
  return work;
}

void Worker::WatchForStall() {
  if (ctx_->transport() == Transport::kTcp) return;  // no shared-memory ring
  stall_watch_until_ = Clock::now() + kStallWatch;
}

Status Worker::StalledStatus() {
  return Status::Unavailable(
      "this event loop's shared-memory receive queue is blocked by a peer "
      "that died while sending to it (UCX cannot skip the message it left "
      "unfinished): connect again on a new event loop");
}

void Worker::LookForStall() {
  const auto now = Clock::now();
  if (now < next_stall_look_ || receive_stalled_) return;
  if (now >= stall_watch_until_) {
    stall_watch_until_ = {};
    busy_looks_ = 0;
    return;
  }
  next_stall_look_ = now + kStallLook;
  // Arm answers busy for our own sends waiting on a peer's full queue
  // (UCX wakes a worker for send completions): no verdict while any
  // request of ours is out.
  if (requests_in_flight_ > 0 || !closing_.empty() || !flushing_.empty()) {
    return;
  }
  // Busy: a message is claimed that Progress could not read. But arm also
  // answers busy, once each, for a signal left in its event fd (a Wake or
  // Notify that woke an earlier Sleep), for a datagram left on the shared
  // memory signal socket and for the keepalive timer, and that answer
  // drains it without looking further: only four busy answers in a row
  // count.
  int busy = 0;
  while (busy < 4 && ucp_worker_arm(handle()) == UCS_ERR_BUSY) ++busy;
  // What was drained may have been a Wake meant to end the next Sleep.
  if (busy > 0) signal_drained_ = true;
  if (busy < 4) {
    busy_looks_ = 0;
    return;
  }
  // A slot is busy for a moment whenever a peer is mid-copy: on a worker
  // that seldom idles, two looks far apart could both meet one. So only
  // looks in a row, each close to the last, count: for kStallAfter and
  // kStallLooks of them.
  if (busy_looks_ > 0 && now - last_busy_look_ > 5 * kStallLook) {
    busy_looks_ = 0;
  }
  last_busy_look_ = now;
  if (busy_looks_++ == 0) busy_since_ = now;
  if (now - busy_since_ >= kStallAfter && busy_looks_ >= kStallLooks) {
    receive_stalled_ = true;
  }
}

bool Worker::HasPendingWork() {
  // What the next Progress() at this level can run: not what the passes
  // under way hold, unless it takes over (util/pass_queue.h).
  return inbox_.HasRunnable(take_over_) || deferred_.HasRunnable(take_over_) ||
         completed_.HasRunnable(take_over_) ||
         has_posted_.load(std::memory_order_seq_cst);
}

void Worker::Sleep(std::chrono::milliseconds timeout) {
  if (HasPendingWork()) return;
  if (signal_drained_) {
    // A look for a stall drained the event fd: perhaps of a Wake.
    signal_drained_ = false;
    return;
  }
  // Post() signals only a worker that may be asleep: it sets has_posted_
  // before it looks at `sleeping_`, and this looks at has_posted_ after
  // setting `sleeping_` (all four sequentially consistent), so one of the
  // two sees the other.
  // A retired worker's tcp peers: polled, since it cannot be armed.
  if (!retired_.empty() && RetiredActive()) {
    timeout = std::min<std::chrono::milliseconds>(timeout, kRetiredPoll);
  }
  sleeping_.store(true, std::memory_order_seq_cst);
  ucs_status_t s = ucp_worker_arm(handle());
  // UCS_ERR_BUSY: events arrived meanwhile; HasPendingWork: a Post() raced
  // with arm.
  if (s == UCS_OK && !HasPendingWork()) {
    busy_arms_ = 0;
    next_nap_ = kFirstNap;
    pollfd pfd{efd_, POLLIN, 0};
    (void)poll(&pfd, 1, static_cast<int>(timeout.count()));
  } else if (s == UCS_ERR_BUSY && !HasPendingWork()) {
    // BUSY again and again with nothing delivered in between: UCX holds
    // an operation it cannot progress (the discard of a closed endpoint to
    // a paused peer whose receive queue is full, ARCHITECTURE finding 29)
    // and will not arm. Returning at once spun a core until the peer
    // resumed; nap instead.
    const auto now = Clock::now();
    if (busy_arms_++ == 0) first_busy_arm_ = now;
    if (now - first_busy_arm_ >= kBusyBeforeNap) Nap(timeout);
  }
  sleeping_.store(false, std::memory_order_relaxed);
}

Status Worker::ProgressUntil(const std::function<bool()>& done,
                             Clock::time_point deadline,
                             std::chrono::microseconds spin,
                             std::chrono::milliseconds max_sleep) {
  auto last_work = Clock::now();
  unsigned idle_polls = 0;
  while (!done()) {
    if (Progress() > 0) {
      last_work = Clock::now();
      continue;
    }
    // Nothing more arrives: waiting longer would only end in TimedOut.
    if (receive_stalled_) return StalledStatus();
    auto now = Clock::now();
    if (now >= deadline) {
      // Asked again, then after one more pass: a call past its deadline is
      // given up only once a pass after its deadline was seen read what
      // had arrived (SessionCore::Housekeeping), so a wait bounded by that
      // deadline sees it end rather than time out itself.
      if (done()) break;
      (void)Progress();
      if (done()) break;
      return Status::TimedOut("operation timed out");
    }
    if (now - last_work <= spin) {
      // Nothing to do while spinning: now and then let a process sharing
      // this CPU (often the peer) run instead of burning our time slice.
      if ((++idle_polls & 31) == 0) sched_yield();
    } else {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - now) +
                  std::chrono::milliseconds(1);
      Sleep(std::min(left, max_sleep));
    }
  }
  return Status::OK();
}

void Worker::Run(const std::atomic<bool>& stop,
                 std::chrono::microseconds spin) {
  auto last_work = Clock::now();
  unsigned idle_polls = 0;
  while (!stop.load(std::memory_order_acquire)) {
    if (Progress() > 0) {
      last_work = Clock::now();
      continue;
    }
    if (Clock::now() - last_work > spin) {
      // A pass hook (durability) may have timed work (the once-a-second
      // fsync): wake often enough for it, and by the time it asked for.
      auto timeout =
          std::chrono::milliseconds(pass_hooks_.empty() ? 1000 : 200);
      if (wake_by_ != Clock::time_point{}) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(
            wake_by_ - Clock::now());
        timeout = std::clamp(left, std::chrono::milliseconds(0), timeout);
        wake_by_ = {};
      }
      Sleep(timeout);
      last_work = Clock::now();
    } else if ((++idle_polls & 31) == 0) {
      sched_yield();
    }
  }
}

Status Worker::Wait(ucs_status_ptr_t request, Clock::time_point deadline,
                    std::string_view what) {
  if (request == nullptr) return Status::OK();
  if (UCS_PTR_IS_ERR(request)) return FromUcs(UCS_PTR_STATUS(request), what);
  ucs_status_t s = UCS_INPROGRESS;
  Status st = ProgressUntil(
      [&] {
        s = ucp_request_check_status(request);
        return s != UCS_INPROGRESS;
      },
      deadline);
  if (!st.ok()) {
    // RMA cannot be cancelled: the request stays tracked and is freed when
    // it completes. The caller must force-close the endpoint (which completes
    // it) before reusing the operation's buffers.
    TrackClose(request);
    return st.WithContext(what);
  }
  ucp_request_free(request);
  return FromUcs(s, what);
}

void Worker::Post(util::MoveFunction<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }
  Notify();
}

void Worker::Notify() {
  // A worker that is not asleep finds has_posted_ at its next Progress():
  // the signal (a system call, and a wake-up of a thread that may share
  // this CPU) is for a sleeping one only. See Sleep().
  has_posted_.store(true, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
}

void Worker::Nap(std::chrono::milliseconds timeout) {
  // Not on the event fd: what UCX could not arm leaves it readable (the
  // shared-memory transport answers BUSY before it drains its signal
  // socket), so a poll there returns at once. On the nap fd instead, which
  // Wake signals while `napping_` (the same handshake as `sleeping_` with
  // has_posted_ in Notify, and wake_requested_ for a Wake of its own).
  napping_.store(true, std::memory_order_seq_cst);
  if (!HasPendingWork() &&
      !wake_requested_.exchange(false, std::memory_order_seq_cst)) {
    pollfd pfd{nap_fd_, POLLIN, 0};
    const auto nap = std::min<std::chrono::nanoseconds>(timeout, next_nap_);
    next_nap_ = std::min<std::chrono::microseconds>(2 * next_nap_, kLongestNap);
    const timespec ts{0, static_cast<long>(nap.count())};
    if (ppoll(&pfd, 1, &ts, nullptr) > 0) {
      uint64_t count = 0;
      (void)!read(nap_fd_, &count, sizeof(count));
    }
  }
  napping_.store(false, std::memory_order_relaxed);
}

void Worker::Wake() {
  // A Wake racing with RenewAfterStall may signal the old worker: the owner
  // is awake then, and finds the posted work before it sleeps again. The
  // lock keeps the old worker alive until the signal is given.
  std::lock_guard<std::mutex> lock(wake_mu_);
  (void)ucp_worker_signal(worker_.load(std::memory_order_acquire));
  wake_requested_.store(true, std::memory_order_seq_cst);
  if (napping_.load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    (void)!write(nap_fd_, &one, sizeof(one));
  }
}

Status Worker::RenewAfterStall() {
  ucp_worker_h fresh = nullptr;
  int efd = -1;
  std::string address;
  REMEM_RETURN_IF_ERROR(CreateUcp(*ctx_, &fresh, &efd, &address));
  // Every handler, on the new worker too (each slot once: the old worker's
  // bindings are not copied twice).
  std::vector<AmSlot*> bound;
  for (auto& b : bindings_) {
    if (b->ucp == handle()) bound.push_back(b->slot);
  }
  for (AmSlot* slot : bound) {
    Status st = Bind(slot, slot->id, fresh);
    if (!st.ok()) {
      std::erase_if(bindings_,
                    [fresh](const auto& b) { return b->ucp == fresh; });
      ucp_worker_destroy(fresh);
      return st;
    }
  }
  retired_.push_back(Retired{handle(), endpoints_, 0});
  ++renewals_;
  endpoints_ = 0;
  worker_.store(fresh, std::memory_order_release);
  efd_ = efd;
  address_ = std::move(address);
  // UCX pairs endpoints per worker: the new one has made none.
  endpoints_to_.clear();
  receive_stalled_ = false;
  stall_watch_until_ = {};
  busy_looks_ = 0;
  signal_drained_ = true;  // the next Sleep looks at the new worker first
  return Status::OK();
}

void Worker::DestroyIdleRetired() {
  for (size_t i = 0; i < retired_.size();) {
    if (retired_[i].endpoints > 0) {
      retired_[i].idle_passes = 0;
      ++i;
      continue;
    }
    const ucp_worker_h ucp = retired_[i].ucp;
    if (retired_[i].idle_passes++ < 2) {
      // Let UCX finish what the last closes left (a forced close may
      // complete at once while UCX still discards the connection).
      (void)ucp_worker_progress(ucp);
      ++i;
      continue;
    }
    std::erase_if(bindings_, [ucp](const auto& b) { return b->ucp == ucp; });
    {
      // A Wake that read the pointer before the renewal signals under the
      // lock, before this.
      std::lock_guard<std::mutex> lock(wake_mu_);
      ucp_worker_destroy(ucp);
    }
    retired_.erase(retired_.begin() + i);
  }
}

bool Worker::RetiredActive() const {
  if (!closing_.empty() || !flushing_.empty()) return true;
  for (const Retired& r : retired_) {
    if (r.endpoints > 0) return true;
  }
  return false;
}

void Worker::EndpointOpened(ucp_worker_h ucp) {
  if (ucp == handle()) {
    ++endpoints_;
    return;
  }
  for (Retired& r : retired_) {
    if (r.ucp == ucp) ++r.endpoints;
  }
}

void Worker::EndpointClosed(ucp_worker_h ucp) {
  if (ucp == handle()) {
    --endpoints_;
    return;
  }
  for (Retired& r : retired_) {
    if (r.ucp == ucp) --r.endpoints;
  }
}

void Worker::TrackClose(ucs_status_ptr_t request) {
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  closing_.push_back(request);
}

void Worker::ForceClose(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  TrackClose(ucp_ep_close_nbx(ep, &p));
}

void Worker::CloseAfterFlush(ucp_ep_h ep, std::shared_ptr<void> keep) {
  ucp_request_param_t p{};
  const ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &p);
  if (flush == nullptr || UCS_PTR_IS_ERR(flush)) {
    ForceClose(ep);
    return;
  }
  flushing_.push_back(
      {flush, ep, std::move(keep), Clock::now() + kFlushDeadline});
}

size_t Worker::CloseFlushed(bool all) {
  size_t closed = 0;
  std::optional<Clock::time_point> now;
  for (size_t i = 0; i < flushing_.size();) {
    Flushing& f = flushing_[i];
    if (!all && ucp_request_check_status(f.request) == UCS_INPROGRESS) {
      if (!now) now = Clock::now();
      if (*now < f.until) {
        ++i;
        continue;
      }
    }
    // Freed before it completes, a request is released when it does.
    ucp_request_free(f.request);
    ForceClose(f.ep);
    flushing_[i] = std::move(flushing_.back());
    flushing_.pop_back();
    ++closed;
  }
  return closed;
}

void Worker::DrainCloses(Clock::time_point deadline) {
  (void)ProgressUntil([&] { return closing_.empty() && flushing_.empty(); },
                      deadline);
}

Result<uint64_t> Worker::EndpointNumber(std::string_view remote_address) const {
  auto uuid = WorkerUuidOf(remote_address);
  if (!uuid.ok()) return uuid.status();
  auto it = endpoints_to_.find(*uuid);
  return it == endpoints_to_.end() ? uint64_t{0} : it->second;
}

}  // namespace remem::fabric
