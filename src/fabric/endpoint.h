// fabric::Endpoint: one UCX connection (ucp_ep_h) with peer error handling,
// and the operations remem's layers build on:
//   - one-sided Get / Put / CompareSwap / FetchAdd on a peer's RemoteRegion,
//     each asynchronous with a continuation, or synchronous with a deadline;
//   - SendAm: an active message (header + payload of any size up to the
//     peer's limit; UCX picks eager or rendezvous).
//
// Served mode: where UCX would emulate RMA in software in the peer's
// progress engine (an endpoint whose lanes are all tcp), UCX 1.13 aborts the
// peer process if this endpoint fails while the peer answers an emulated
// get. A client puts such an endpoint in served mode once it is connected:
// every one-sided operation (on a region not mapped into this process) becomes
// a memory request active message (proto::MemRequest) that the remem server
// performs and answers, with errors it handles. The calls and their completions
// are the same in both modes; see docs/PROTOCOL.md, "Served memory requests".
//
// Continuations run on the worker's thread from Worker::Progress(), never
// inside the issuing call. A failed endpoint (peer gone, forced close,
// timed-out operation) completes every outstanding operation with an error,
// refuses new ones with Unavailable, and calls the failure handler once.
//
// Thread contract: belongs to its worker's thread.

#ifndef REMEM_FABRIC_ENDPOINT_H_
#define REMEM_FABRIC_ENDPOINT_H_

#include <ucp/api/ucp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "proto/wire.h"

namespace remem::fabric {

class Endpoint {
 public:
  // Creates an endpoint to the worker whose packed UCX address is
  // `remote_address` (ucp_worker_get_address), with peer error handling.
  // Both sides of a session create one to the other's worker; UCX pairs
  // the two into one connection by their numbers (Worker::EndpointNumber).
  // Returns at once: the connection is wired up in the background
  // (WaitConnected waits for it).
  static Result<std::unique_ptr<Endpoint>> Create(
      Worker* worker, std::string_view remote_address);
  // UCX's number of this endpoint among those its worker created to the
  // peer's (Worker::EndpointNumber): the peer's endpoint with the same
  // number is the one UCX pairs it with.
  uint64_t number() const { return number_; }
  // As Create, for the side that creates its endpoint second: the peer
  // made its own as number `number` toward this worker, so this one must
  // get that number too. Endpoints this worker never made (it gave up a
  // handshake after the peer had made its endpoint: the peer is ahead) are
  // made and closed first, so that the numbers agree again; without that,
  // every later endpoint would be paired with the wrong peer endpoint and
  // its messages dropped. Unavailable if this worker is already past
  // `number`, or more than kMaxSkippedEndpoints behind it (a number no
  // listening backlog could explain: a peer that is not telling the truth).
  static constexpr uint64_t kMaxSkippedEndpoints = 4096;
  static Result<std::unique_ptr<Endpoint>> CreateNumbered(
      Worker* worker, std::string_view remote_address, uint64_t number);
  // As CreateNumbered, for the side that creates second, made safe against
  // lanes that differ: waits until the peer's notice `notice` arrives (the
  // peer sent it with SendNotice on its endpoint, number `number`, as soon
  // as it made it), then creates this side's endpoint, which UCX makes from
  // the one the peer's wireup already made on this worker. Neither
  // endpoint is then configured twice: an endpoint made from a worker
  // address that a peer's wireup asks to change its lanes (a peer whose
  // UCX settings choose other ones, e.g. UCX_MAX_RNDV_LANES) aborts the
  // process in UCX 1.13 ("endpoint reconfiguration not supported yet",
  // openucx/ucx issue 7316), which creating before the peer's wireup
  // arrived let happen. Waits until `deadline` (TimedOut) or until
  // `peer_gone()`, asked between passes (at least every 100 ms), says the
  // peer is gone (Unavailable). Unavailable too if UCX did not make this
  // endpoint from the one the notice came on (numbers that disagree). A
  // notice not there after kNoticeGrace has this process probe, from a UCX
  // worker of its own, whether it can make an endpoint to the peer at all:
  // if not (the peer's shared memory is another user's, say) it returns
  // that error at once instead of waiting out the deadline. An endpoint the
  // probe made is closed only once its wireup has ended (the peer's UCX
  // aborts if it goes at the wrong instant: endpoint.cc), before this
  // returns; the probe runs while the notice is awaited.
  static constexpr auto kNoticeGrace = std::chrono::milliseconds(250);
  static Result<std::unique_ptr<Endpoint>> CreateJoined(
      Worker* worker, std::string_view remote_address, uint64_t number,
      std::string_view notice, Clock::time_point deadline,
      const std::function<bool()>& peer_gone);
  // Sends `notice` as the header of a kAmEndpointNotice message, for the
  // peer's CreateJoined. The side that creates first calls it at once.
  // Sent, as every message here, with UCP_AM_SEND_FLAG_REPLY: UCX holds
  // such a message until it knows the peer's endpoint id, which only the
  // peer's answer to this endpoint's wireup tells, and the peer answers
  // only once it has made the endpoint CreateJoined then takes (a message
  // without the flag could arrive first over shared memory, where the
  // endpoint is connected as soon as it is made). A notice that cannot be
  // sent fails this endpoint (the failure handler runs).
  //
  // Arrival of a notice says nothing more: any peer can send one.
  void SendNotice(std::string_view notice);
  // Waits until the connection is wired up: OK, Unavailable if it failed,
  // TimedOut (the endpoint is then failed) after `deadline`.
  Status WaitConnected(Clock::time_point deadline);
  // Closes the connection: flushes what was sent (at most a second), then
  // force-closes (UCX 1.13 keeps gracefully closed endpoints forever);
  // force-closes at once if the endpoint failed or a request is still out
  // (requests_out()).
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  ucp_ep_h handle() const { return ep_; }
  Worker* worker() const { return worker_; }
  bool failed() const { return failed_; }
  // Neither failed nor closed: operations may be started.
  bool usable() const { return !failed_ && !closed_; }
  const Status& failure() const { return failure_; }

  // Called at most once, on the worker's thread, from a later Progress()
  // after the endpoint fails; never after the endpoint is destroyed.
  void SetFailureHandler(std::function<void(const Status&)> fn) {
    on_failure_ = std::move(fn);
  }
  // Called at each pass, and at least every 10 ms, while a synchronous
  // served operation (GetSync, PutSync and the atomics over tcp) waits, on
  // the worker's thread: the owner looks at what the endpoint cannot see
  // (a session whose socket the server closed) and may Fail it, which ends
  // the wait at once instead of at its timeout.
  void SetWaitHook(std::function<void()> fn) { wait_hook_ = std::move(fn); }
  // Marks the endpoint failed with `why` and force-closes it: every
  // outstanding operation completes with an error. A TimedOut `why` (an
  // operation that timed out tears the connection down) is kept as
  // Unavailable naming it: the connection, not the later operations, is
  // what ended.
  void Fail(Status why);

  // --- asynchronous one-sided operations; buffers must stay valid until
  // `done` runs.
  void Get(void* dst, size_t len, const RemoteRegion& region, uint64_t offset,
           Completion done);
  // Several gets with one completion (the first error among them). Served,
  // they travel together: one memory request (proto::MemOp::kReadMany) and
  // one reply per kMaxMemSpans spans and kMaxMemTransfer bytes, rather than
  // a round trip of the server's each; otherwise each is a Get.
  struct GetSpan {
    void* dst;
    size_t len;
    const RemoteRegion* region;
    uint64_t offset;
  };
  void GetMany(const std::vector<GetSpan>& spans, Completion done);
  // `done` runs when the data is in the peer's memory (put + flush).
  void Put(const void* src, size_t len, const RemoteRegion& region,
           uint64_t offset, Completion done);
  // Atomically: old = *addr; if (old == expected) *addr = desired.
  // `*old` receives the previous value.
  void CompareSwap(uint64_t expected, uint64_t desired,
                   const RemoteRegion& region, uint64_t offset, uint64_t* old,
                   Completion done);
  // Atomically: old = *addr; *addr += delta.
  void FetchAdd(uint64_t delta, const RemoteRegion& region, uint64_t offset,
                uint64_t* old, Completion done);

  // --- synchronous versions; a TimedOut (after `timeout`) fails the
  // endpoint (the operation cannot be cancelled, so the connection is torn
  // down to bound it).
  //
  // Get and Put on a region mapped into this process (shared memory, see
  // RemoteRegion::mapped) are a memcpy from or to the mapping: the same
  // copy UCX's shared-memory transport would make, without its call path.
  Status GetSync(void* dst, size_t len, const RemoteRegion& region,
                 uint64_t offset, Clock::duration timeout);
  Status PutSync(const void* src, size_t len, const RemoteRegion& region,
                 uint64_t offset, Clock::duration timeout);
  Result<uint64_t> CompareSwapSync(uint64_t expected, uint64_t desired,
                                   const RemoteRegion& region, uint64_t offset,
                                   Clock::duration timeout);
  Result<uint64_t> FetchAddSync(uint64_t delta, const RemoteRegion& region,
                                uint64_t offset, Clock::duration timeout);

  // Sends an active message; `header` is copied at once, `payload` is kept
  // until the send completes. The receiver is always given a reply
  // endpoint (UCP_AM_SEND_FLAG_REPLY). `done` may be empty.
  void SendAm(unsigned am_id, const void* header, size_t header_len,
              std::string payload, Completion done);

  // What UCX chose for this endpoint, e.g. "shm (posix,cma)" or
  // "net (tcp:lo)", from
  // the lanes of its configuration.
  std::string TransportDescription() const;
  // True if any lane (messages or RMA) goes over a shared-memory transport
  // (one with no RMA lane of its own still has its regions mapped).
  bool UsesSharedMemory() const;
  // True if UCX would emulate RMA on this endpoint in the peer's progress
  // engine: every data lane is tcp (no shared memory, no RDMA lane).
  bool RmaIsEmulated() const;

  // Whether one-sided operations are served by the peer (see above). The
  // client sets it from RmaIsEmulated() once connected; tests and
  // benchmarks may choose. Only change it with no operation outstanding.
  bool served() const { return served_; }
  Status set_served(bool served);
  // Served operations issued and not yet completed.
  size_t served_in_flight() const { return served_ops_.size(); }
  // When the oldest of them was issued (Clock::time_point::max() if none),
  // and its request id (0 if none).
  Clock::time_point oldest_served() const {
    return served_ops_.empty() ? Clock::time_point::max()
                               : served_ops_.begin()->second.issued;
  }
  uint64_t oldest_served_id() const {
    return served_ops_.empty() ? 0 : served_ops_.begin()->first;
  }
  // Whether the answer of served operation `id` has come and waits, unrun,
  // in the worker (Worker::HoldsMessage: a pass under way holds it while a
  // callback it runs waits in nested passes). Such an operation is answered,
  // whatever the clock says since.
  bool ServedAnswerHeld(uint64_t id) const;
  // Completes with TimedOut every served operation issued at or before
  // `issued_by` (a reply that comes later is dropped); returns how many.
  size_t ExpireServed(Clock::time_point issued_by);
  // UCX requests of asynchronous operations issued and not yet completed
  // (a send or an operation that completed in its call is not counted).
  // Destroying the endpoint with any out force-closes it: they complete
  // with an error.
  size_t requests_out() const { return *requests_out_; }

 private:
  explicit Endpoint(Worker* worker) : worker_(worker) {}
  static void ErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);
  Status Unusable() const;
  ucp_request_param_t Params(struct Op* op) const;
  void Finish(ucs_status_ptr_t r, struct Op* op);
  Status Settle(ucs_status_ptr_t r, Clock::duration timeout,
                std::string_view what);
  std::string LaneInfo() const;
  // The endpoint's lanes as UCX printed them, without "cm" lanes.
  struct Lane {
    std::string transport;  // e.g. "tcp", "sysv", "rc_mlx5"
    std::string device;     // e.g. "lo", "memory"
    bool rma = false;       // the lane carries RMA ("rma_bw")
  };
  std::vector<Lane> Lanes() const;

  // --- served mode
  struct ServedOp {
    Completion done;
    uint8_t op = 0;           // proto::MemOp
    void* dst = nullptr;      // reads: where the data goes
    size_t len = 0;           // reads: bytes expected
    uint64_t* old = nullptr;  // atomics: where the old value goes
    // kReadMany: where each span's bytes go, in order.
    std::vector<std::pair<void*, size_t>> spans{};
    Clock::time_point issued{};
  };
  void IssueServed(const proto::MemRequest& request, std::string payload,
                   ServedOp op);
  // Splits a read or write into requests of at most kMaxMemTransfer.
  void ServedTransfer(bool write, uint8_t* local, size_t len,
                      const RemoteRegion& region, uint64_t offset,
                      Completion done);
  void OnMemReply(AmMessage&& msg);
  // Completes every outstanding served operation with `why`.
  void FailServed(const Status& why);
  void ReportFailure();
  // Issues one operation through `issue` and progresses until it completes
  // or `timeout` passes (then fails the endpoint, like Settle).
  Status RunSync(const std::function<void(Completion)>& issue,
                 Clock::duration timeout, std::string_view what);

  Worker* worker_;
  // The UCX worker it was made on (Worker::RenewAfterStall may replace
  // the worker's).
  ucp_worker_h ucp_worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  uint64_t number_ = 0;  // number()
  bool failed_ = false;
  bool closed_ = false;
  Status failure_;
  std::function<void(const Status&)> on_failure_;
  std::function<void()> wait_hook_;  // SetWaitHook
  bool failure_reported_ = false;    // on_failure_ has run
  bool served_ = false;
  bool routed_ = false;       // this endpoint's kAmMemReply route is installed
  uint64_t route_token_ = 0;  // its token (Worker::UnrouteAm)
  // By request id: the worker numbers requests in the order they are
  // issued, so the first is the oldest.
  std::map<uint64_t, ServedOp> served_ops_;
  // requests_out(); shared with each request's state, which may outlive the
  // endpoint.
  std::shared_ptr<size_t> requests_out_ = std::make_shared<size_t>(0);
  // Cleared by the destructor: send completions that outlive the endpoint
  // check it before touching it.
  std::shared_ptr<Endpoint*> alive_ = std::make_shared<Endpoint*>(this);
};

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_ENDPOINT_H_
