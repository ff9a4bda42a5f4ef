// fabric::Worker: one UCX worker and the event loop of the thread that owns
// it (FaRM's per-thread event loop). It progresses UCX, receives active
// messages into an inbox, and runs completions (continuations) on the owning
// thread, never inside UCX callbacks, so a continuation may itself issue and
// wait for operations.
//
// Idle policy (Run): busy-poll while there is work; after `spin` with
// nothing to do, arm the worker and block on its event fd, so an idle
// server uses no CPU, and wake at the next message or Wake() (but at
// least every millisecond while a worker replaced after a stall still has
// peers: RenewAfterStall; every 200 ms with pass hooks, sooner if one asks:
// WakeBy).
//
// Thread contract: single-threaded (UCS_THREAD_MODE_SINGLE); every method
// must be called on the owning thread except Post(), Wake() and Notify(),
// which are thread-safe.

#ifndef REMEM_FABRIC_WORKER_H_
#define REMEM_FABRIC_WORKER_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/context.h"
#include "remem/status.h"
#include "util/move_function.h"
#include "util/pass_queue.h"

namespace remem::fabric {

using Clock = std::chrono::steady_clock;
using Completion = std::function<void(Status)>;

// An active message's header: remem's headers (32 to 56 bytes) are kept
// inline, so receiving one allocates nothing; a longer one (only a broken or
// hostile peer sends one) goes to the heap.
class AmHeader {
 public:
  void assign(const char* p, size_t n) {
    size_ = n;
    if (n <= kInline) {
      if (n > 0) std::memcpy(inline_, p, n);
      heap_.clear();
    } else {
      heap_.assign(p, n);
    }
  }
  const char* data() const { return size_ <= kInline ? inline_ : heap_.data(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  operator std::string_view() const { return {data(), size_}; }

 private:
  static constexpr size_t kInline = 64;
  char inline_[kInline] = {};
  std::string heap_;
  size_t size_ = 0;
};

// One received active message, owned by the handler.
struct AmMessage {
  AmHeader header;
  std::string data;
  ucp_ep_h reply_ep = nullptr;  // the sender's endpoint on this worker
  // Set when the data was refused for being larger than the worker's limit;
  // `data` is then empty and this holds the length the sender tried.
  size_t refused_length = 0;
};

class Worker {
 public:
  // `max_am_data`: active-message data above this size is not received;
  // the handler sees the message with `refused_length` set.
  static Result<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx,
                                                size_t max_am_data);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The UCX worker that new endpoints are made on (RenewAfterStall may
  // replace it).
  ucp_worker_h handle() const {
    return worker_.load(std::memory_order_relaxed);
  }
  Context& context() const { return *ctx_; }
  const std::shared_ptr<Context>& shared_context() const { return ctx_; }
  // This worker's packed UCX address: what a peer needs to create an
  // endpoint to it (Endpoint::Create). A new one after RenewAfterStall.
  const std::string& address() const { return address_; }

  using AmHandler = std::function<void(AmMessage&&)>;
  Status SetAmHandler(unsigned am_id, AmHandler handler);
  // Unregisters `am_id`'s handler and drops its undelivered messages, so an
  // object the handler points to can be destroyed.
  void RemoveAmHandler(unsigned am_id);

  // Per-endpoint routing of one AM id: messages `am_id` whose reply
  // endpoint is `ep` go to `handler`; messages from endpoints without a
  // route are dropped. The first route installs the worker's handler for
  // `am_id` (do not also SetAmHandler it). A handler must not remove its
  // own route while it runs. Returns the route's token for UnrouteAm.
  Result<uint64_t> RouteAm(unsigned am_id, ucp_ep_h ep, AmHandler handler);
  // Removes `ep`'s route if it is still the one `token` installed: UCX may
  // give a new endpoint the handle of one that was force-closed (at a
  // failure) while its owner still held the route, and that owner, removing
  // its route later, must not remove the new endpoint's.
  void UnrouteAm(unsigned am_id, ucp_ep_h ep, uint64_t token);

  // UCX joins the endpoints two workers create to each other by their
  // order (ucp's connection sequence numbers): the n-th endpoint this
  // worker creates to a peer worker is paired with the n-th that worker
  // creates to this one, whichever comes first. The number the next
  // endpoint to the worker at `remote_address` gets: how many this worker
  // has created to it (Endpoint::number). ProtocolError if the address
  // names no worker uuid.
  Result<uint64_t> EndpointNumber(std::string_view remote_address) const;

  // Endpoint notices (proto::kAmEndpointNotice): the first message a peer
  // sends on an endpoint it created to this worker (Endpoint::SendNotice,
  // with the reply flag), which reaches this worker only after UCX's
  // wireup of that endpoint has made one here for it. The worker keeps the last
  // kMaxNotices it got with the endpoints they came on (a notice nobody takes,
  // of a handshake its side gave up, is dropped in time). Takes the notice
  // whose header is `header`: the endpoint it came on, or null if none has
  // come.
  ucp_ep_h TakeNotice(std::string_view header);
  static constexpr size_t kMaxNotices = 64;

  // A fresh id, unique on this worker, for matching replies to requests.
  uint64_t NextRequestId() { return next_request_id_++; }

  // Progresses UCX until it has nothing more or a message or completion is
  // ready, then runs posted tasks, delivered messages, completions, deferred
  // calls and pass hooks. Returns how much work was done
  // (0 means idle).
  size_t Progress();
  // Whether a Progress() is under way on this thread: code that runs then
  // runs inside a callback (or a message handler) that a pass called.
  bool in_progress() const { return progress_depth_ > 0; }
  // Marks code that runs callbacks outside Progress() (a session's
  // housekeeping fails calls past their deadline) for in_progress().
  class CallbackScope {
   public:
    explicit CallbackScope(Worker* w) : w_(w) { ++w_->progress_depth_; }
    ~CallbackScope() { --w_->progress_depth_; }
    CallbackScope(const CallbackScope&) = delete;
    CallbackScope& operator=(const CallbackScope&) = delete;

   private:
    Worker* w_;
  };
  // Whether the next Progress() calls made at this level (not those inside
  // the callbacks they run) also run what the passes under way still hold
  // (util/pass_queue.h, take_over): a WaitAll inside a callback sets it
  // for its wait, and puts back what it found after.
  bool take_over() const { return take_over_; }
  void set_take_over(bool take_over) { take_over_ = take_over; }
  // Whether the next Progress() at this level has something to run without
  // asking UCX: messages, completions or deferred calls (not those the
  // passes under way hold, unless take_over()), or tasks posted to it.
  bool HasPendingWork();
  // Whether a message `am_id` from the peer of endpoint `ep`, for which
  // `pred(const AmMessage&)` holds, has been received and not yet run: a
  // pass under way holds it (a pass nested in a callback does not run what
  // the passes under way hold), or the next pass will run it. An operation
  // whose answer is such a message has been answered, whatever the clock
  // says since.
  template <typename Pred>
  bool HoldsMessage(unsigned am_id, ucp_ep_h ep, Pred&& pred) const {
    return inbox_.AnyWaiting([&](const std::pair<AmSlot*, AmMessage>& e) {
      return e.first != nullptr && e.first->id == am_id &&
             e.second.reply_ep == ep && pred(e.second);
    });
  }
  // A mark of this worker's progress now (Mark), and whether every message
  // that had arrived by then has been handled since (HandledSince): a pass
  // after it polled UCX until it had nothing more to deliver and ran what
  // it delivered (a drain), or, in a loop that never runs dry,
  // kMarkPasses passes ended. An operation whose deadline had passed at
  // the mark and that is still unanswered once this holds is late; one
  // whose reply came in time and sat unread is not (RpcClient's
  // ExpireOverdue, SessionCore's served operations). A drain in a nested
  // pass does not run what the passes under way hold: those waiters ask
  // HoldsMessage for their own answer too.
  struct ProgressMark {
    uint64_t passes = 0;  // Progress() passes ended (at any level)
    uint64_t drains = 0;  // of them, the drains
  };
  static constexpr uint64_t kMarkPasses = 8;
  ProgressMark Mark() const { return {passes_, drains_}; }
  bool HandledSince(const ProgressMark& m) const {
    return drains_ != m.drains || passes_ - m.passes >= kMarkPasses;
  }

  // Blocks until UCX has an event, Wake() is called, or `timeout` passes.
  // Returns at once if work is already pending. While UCX cannot arm the
  // worker (it holds a send or a discard to a paused peer whose receive
  // queue is full), it naps instead: at most 1 ms, so what arrives then is
  // seen that late at worst (next_nap_).
  void Sleep(std::chrono::milliseconds timeout);

  // Progresses until `done()` or `deadline`. Busy-polls for `spin`, then
  // sleeps on the event fd between checks, at most `max_sleep` at a time
  // (so that `done` also sees what sends no event: a closed socket, the
  // clock). TimedOut on deadline, once `done()` was asked again before and
  // after one more pass (a predicate that expires calls past their
  // deadline does so only after a pass read what had arrived by then).
  Status ProgressUntil(
      const std::function<bool()>& done, Clock::time_point deadline,
      std::chrono::microseconds spin = std::chrono::microseconds(200),
      std::chrono::milliseconds max_sleep = std::chrono::milliseconds(100));

  // The event loop: progress with poll-then-sleep until `stop` is set (set it
  // then call Wake()).
  void Run(const std::atomic<bool>& stop, std::chrono::microseconds spin);

  // Waits for a UCX request returned by a *_nbx call made without callback.
  // On TimedOut the request is still in flight: the caller must force-close
  // its endpoint before the operation's buffers are reused.
  Status Wait(ucs_status_ptr_t request, Clock::time_point deadline,
              std::string_view what);

  // Runs `fn` on this worker's thread at its next Progress(); wakes the
  // thread if it sleeps. Thread-safe.
  void Post(util::MoveFunction<void()> fn);
  // Interrupts Sleep(). Thread-safe.
  void Wake();
  // Makes the owner's next Sleep() return at once, or interrupts the one it
  // is in (a system call only then), and its next Progress() count one unit
  // of work. For a thread that hands the owner work through a queue of its
  // own, filled before this call, which the owner looks at whenever
  // Progress() did work. Thread-safe.
  void Notify();

  // Runs `fn` at the next Progress() on this thread.
  void Defer(util::MoveFunction<void()> fn) {
    deferred_.Emplace(std::move(fn));
  }
  // Runs `done(status)` at the next Progress() on this thread. Cheaper than
  // Defer for the common case of completing an operation: no allocation.
  void Complete(Completion done, Status status) {
    completed_.Emplace(std::move(done), std::move(status));
  }

  // Runs `hook` at the end of every Progress() pass, after everything the
  // pass delivered (services' batching, then the durability layer's group
  // commit: one log write for the pass's requests, before their replies).
  // Hooks run in the order added; each returns the work it did.
  void AddPassHook(std::function<size_t()> hook) {
    pass_hooks_.push_back(std::move(hook));
  }
  // From a pass hook (owner thread): Run's next idle sleep ends by `at` at
  // the latest, for timed work of the hook's sooner than the idle wake-up
  // (the durability layer's retry of a failing disk). Asked again by each
  // pass that wants it; the earliest asked since the last sleep counts.
  void WakeBy(Clock::time_point at) {
    if (wake_by_ == Clock::time_point{} || at < wake_by_) wake_by_ = at;
  }

  // A receive queue blocked for good. Over shared memory UCX (1.13, the mm
  // transport) receives every peer's active messages through one ring per
  // worker, read in order; a sender claims a slot, fills it, then marks it
  // full. A peer killed between the claim and the mark (a kill -9 mid-send)
  // leaves a slot that is never marked: nothing sent to this worker after
  // it, by any peer, is delivered again, and UCX has no way to skip it.
  //
  // The worker watches for it for kStallWatch after a peer failed (the
  // only way a sender can die mid-send; WatchForStall): if, for kStallAfter
  // and at least kStallLooks looks in a row (each within 50 ms of the
  // last, while no request of this worker is out), every look finds
  // messages claimed (ucp_worker_arm: busy four times over) when Progress
  // had nothing to deliver, the queue is stalled. Sticky: the owner must
  // move its peers to a new worker (or renew this one: RenewAfterStall);
  // ProgressUntil (and the waits built on it) then ends at once with
  // StalledStatus(). A peer merely paused
  // mid-send (SIGSTOP) past kStallAfter, while another failed, counts as
  // stalled too. Never set on a tcp-only worker.
  bool receive_stalled() const { return receive_stalled_; }
  // Whether the watch (WatchForStall) is on. Owner thread.
  bool watching_for_stall() const {
    return stall_watch_until_ != Clock::time_point{};
  }
  static constexpr auto kStallAfter = std::chrono::milliseconds(500);
  static constexpr int kStallLooks = 20;
  // How long after an endpoint failed the worker watches.
  static constexpr auto kStallWatch = std::chrono::seconds(60);
  // Starts (or extends) the watch: called when a peer of this worker
  // failed or went away (an endpoint's error, a session's or connection's
  // socket closed), not for a failure of this side's making.
  void WatchForStall();
  // Endpoint's asynchronous UCX requests out now: a look for a stall gives
  // no verdict while any is (a send waiting on a peer's full queue makes
  // the worker look busy too).
  void RequestIssued() { ++requests_in_flight_; }
  void RequestEnded() { --requests_in_flight_; }
  // The error of an operation on a worker whose queue stalled.
  static Status StalledStatus();
  // Tests: what a stall leads to, without a peer killed mid-send (on any
  // worker, tcp-only included: what follows is the same).
  void SimulateReceiveStallForTesting() { receive_stalled_ = true; }

  // Recovers from a stall: a new UCX worker (a new receive queue, a new
  // address()) takes over. Every handler is installed on it, endpoints made
  // from now on are its, and the stall and its watch are cleared. The old
  // worker is kept for the endpoints it has, and progressed while any of
  // them is open (or closing): a tcp peer on it is still served, but while
  // one is, Sleep wakes at least every kRetiredPoll (a stalled worker
  // cannot be armed to wake it). A shared-memory peer on it gets nothing
  // through any more: the owner should close those endpoints. The old
  // worker is destroyed once its last endpoint has closed. A handler set
  // afterwards is installed on the new worker only. Owner thread,
  // outside any handler.
  Status RenewAfterStall();
  // How many times RenewAfterStall replaced the UCX worker, and how many
  // replaced workers are still kept for their endpoints.
  uint64_t renewals() const { return renewals_; }
  size_t retired_workers() const { return retired_.size(); }
  static constexpr auto kRetiredPoll = std::chrono::milliseconds(1);

  // Keeps an endpoint-close request until it completes, then frees it.
  void TrackClose(ucs_status_ptr_t request);
  // Flushes `ep` (what was sent to it goes out), then force-closes it, at a
  // later Progress if the flush takes time, and at kFlushDeadline at the
  // latest: a paused peer whose receive queue is full never lets a flush
  // complete. (UCX's discard of the closed endpoint then waits too, and
  // arm answers BUSY until the peer resumes or dies: Sleep naps, see
  // there.) `keep` is held until the close is issued (the endpoint's error
  // callback argument). DrainCloses waits for these too.
  void CloseAfterFlush(ucp_ep_h ep, std::shared_ptr<void> keep);
  static constexpr auto kFlushDeadline = std::chrono::seconds(1);
  // Progresses until every tracked close has completed, or `deadline`.
  void DrainCloses(Clock::time_point deadline);

 private:
  struct AmSlot {
    Worker* worker;
    unsigned id;
    AmHandler handler;
  };
  // A slot's registration on one UCX worker (the callback's argument: a
  // rendezvous message is fetched through the worker it came to).
  struct AmBinding {
    AmSlot* slot;
    ucp_worker_h ucp;
  };
  // A UCX worker replaced by RenewAfterStall, and its open endpoints.
  struct Retired {
    ucp_worker_h ucp;
    size_t endpoints;
    int idle_passes = 0;  // passes since it was last seen with endpoints
  };
  struct PendingRecv;

  Worker(std::shared_ptr<Context> ctx, ucp_worker_h w, int efd, size_t max)
      : ctx_(std::move(ctx)), worker_(w), efd_(efd), max_am_data_(max) {}
  // A UCX worker with its event fd and packed address.
  static Status CreateUcp(const Context& ctx, ucp_worker_h* w, int* efd,
                          std::string* address);
  // Installs `slot`'s callback on `ucp` (or removes it: `slot` null).
  Status Bind(AmSlot* slot, unsigned am_id, ucp_worker_h ucp);
  // Some retired worker still has endpoints (or closes are pending).
  bool RetiredActive() const;
  // Destroys the retired workers left without endpoints (no close pending).
  void DestroyIdleRetired();

  static ucs_status_t AmCallback(void* arg, const void* header,
                                 size_t header_length, void* data,
                                 size_t length,
                                 const ucp_am_recv_param_t* param);
  static void RecvDone(void* request, ucs_status_t status, size_t length,
                       void* user_data);
  // Progress found nothing to do while watching: looks at the receive
  // queue (at most every kStallLook).
  void LookForStall();
  static constexpr auto kStallLook = std::chrono::milliseconds(10);
  friend class Endpoint;  // takes the numbers, counts itself
  // The number of an endpoint being created to the worker of `uuid`.
  uint64_t TakeEndpointNumber(uint64_t uuid) { return endpoints_to_[uuid]++; }
  // An endpoint was made on, or closed by, the UCX worker `ucp`.
  void EndpointOpened(ucp_worker_h ucp);
  void EndpointClosed(ucp_worker_h ucp);
  // Endpoints created to each peer worker, by its uuid (EndpointNumber).
  std::map<uint64_t, uint64_t> endpoints_to_;
  // TakeNotice: headers and the endpoints they came on, oldest first.
  std::deque<std::pair<std::string, ucp_ep_h>> notices_;

  std::shared_ptr<Context> ctx_;
  // Written only by the owner thread (RenewAfterStall); read by Wake too.
  std::atomic<ucp_worker_h> worker_;
  int efd_;
  size_t max_am_data_;
  std::vector<std::unique_ptr<AmSlot>> slots_;
  std::vector<std::unique_ptr<AmBinding>> bindings_;
  size_t endpoints_ = 0;  // open endpoints made on worker_
  std::vector<Retired> retired_;
  uint64_t renewals_ = 0;
  // Wake's signal against the destruction of a retired worker.
  std::mutex wake_mu_;
  // Passes of these may nest (a callback that polls): util/pass_queue.h.
  int progress_depth_ = 0;  // Progress() calls under way (they nest)
  // Sleeps in a row whose arm UCX answered BUSY with nothing delivered,
  // since first_busy_arm_. Once that lasted kBusyBeforeNap, each such Sleep
  // naps (Nap): next_nap_, from kFirstNap doubling up to kLongestNap and
  // back to kFirstNap once something is delivered. A reply awaited on such
  // a worker is seen soon after it arrives; an idle one wakes 1,000 times
  // a second.
  unsigned busy_arms_ = 0;
  Clock::time_point first_busy_arm_{};
  static constexpr auto kBusyBeforeNap = std::chrono::microseconds(50);
  static constexpr auto kFirstNap = std::chrono::microseconds(20);
  static constexpr auto kLongestNap = std::chrono::microseconds(1000);
  std::chrono::microseconds next_nap_ = kFirstNap;
  // Sleeps on nap_fd_ (an eventfd Wake signals while napping_) for
  // min(timeout, next_nap_).
  void Nap(std::chrono::milliseconds timeout);
  int nap_fd_ = -1;
  std::atomic<bool> napping_{false};
  // Set by every Wake: a nap about to start does not (one that has is
  // signalled through nap_fd_).
  std::atomic<bool> wake_requested_{false};
  bool take_over_ = false;                                // set_take_over
  util::PassQueue<std::pair<AmSlot*, AmMessage>> inbox_;  // slot null: dropped
  util::PassQueue<util::MoveFunction<void()>> deferred_;
  util::PassQueue<std::pair<Completion, Status>> completed_;
  std::vector<ucs_status_ptr_t> closing_;
  struct Flushing {
    ucs_status_ptr_t request;
    ucp_ep_h ep;
    std::shared_ptr<void> keep;
    Clock::time_point until;  // force-closed then, flushed or not
  };
  std::vector<Flushing> flushing_;  // CloseAfterFlush's, before the close
  void ForceClose(ucp_ep_h ep);
  // Force-closes the endpoints whose flush has ended (all of them if
  // `all`); returns how many.
  size_t CloseFlushed(bool all);
  struct Route {
    uint64_t token = 0;
    AmHandler handler;
  };
  std::map<std::pair<unsigned, ucp_ep_h>, Route> routes_;
  uint64_t next_route_token_ = 1;
  uint64_t next_request_id_ = 1;
  uint64_t passes_ = 0;  // ProgressMark
  uint64_t drains_ = 0;  // ProgressMark
  std::vector<std::function<size_t()>> pass_hooks_;
  Clock::time_point wake_by_{};  // WakeBy's; {}: none asked
  // The stall watch (receive_stalled): until when, the next look, and since
  // when (and for how many looks) every look found the queue busy.
  Clock::time_point stall_watch_until_{};
  Clock::time_point next_stall_look_{};
  Clock::time_point busy_since_{};
  Clock::time_point last_busy_look_{};
  int busy_looks_ = 0;
  size_t requests_in_flight_ = 0;  // RequestIssued
  // A look drained the event fd: the next Sleep returns at once.
  bool signal_drained_ = false;
  bool receive_stalled_ = false;
  std::string address_;

  std::mutex posted_mu_;
  std::vector<util::MoveFunction<void()>> posted_;
  std::atomic<bool> has_posted_{false};
  // Set by the owner thread while in Sleep(): Post() signals only then.
  std::atomic<bool> sleeping_{false};
};

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_WORKER_H_
