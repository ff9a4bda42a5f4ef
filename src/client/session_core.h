// client::LoopCore and client::SessionCore: the inside of remem::EventLoop
// and remem::Session, and what every data model's client-side store
// (src/<model>/store_client.cc) builds on:
//   - calls to a service's methods (Call, CallSync), with the session's
//     deadline, coalescing hooks (a store queues requests and sends them
//     together at the next Poll: AddFlushHook);
//   - one-sided reads of the server's regions (ReadNow, Read), and the
//     liveness check that must pass before a value read one-sided is
//     returned (Vouch);
//   - the bookkeeping of asynchronous operations (Track, Defer, in_flight).
//
// Thread contract: single-threaded, as the Session (session.h).

#ifndef REMEM_CLIENT_SESSION_CORE_H_
#define REMEM_CLIENT_SESSION_CORE_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/rpc_client.h"
#include "fabric/context.h"
#include "fabric/endpoint.h"
#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "proto/codec.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"
#include "util/socket.h"

namespace remem::client {

class SessionCore;

class LoopCore {
 public:
  static Result<std::unique_ptr<LoopCore>> Create(Transport transport);
  ~LoopCore();

  fabric::Worker* worker() const { return worker_.get(); }
  Transport transport() const { return transport_; }
  // Flushes the stores' queued requests, progresses the worker, expires
  // RPC deadlines of every session on the loop.
  size_t Poll();
  // Flushes every session's queued requests.
  void Flush();

  void Attach(SessionCore* s) { sessions_.push_back(s); }
  void Detach(SessionCore* s);
  size_t sessions() const { return sessions_.size(); }
  // Asynchronous operations in flight on every session of the loop (each
  // SessionCore's in_flight(), kept by them).
  size_t in_flight() const { return in_flight_; }

 private:
  LoopCore() = default;
  std::shared_ptr<fabric::Context> ctx_;
  std::unique_ptr<fabric::Worker> worker_;
  Transport transport_ = Transport::kAuto;
  std::vector<SessionCore*> sessions_;
  size_t in_flight_ = 0;
  friend class SessionCore;
};

// InvalidArgument unless `o`'s timeouts are more than 0 and at most
// kMaxTimeout (remem/options.h): deadlines are times from now, and a larger
// one overflows the clock.
Status CheckTimeouts(const SessionOptions& o);

class SessionCore {
 public:
  using Clock = fabric::Clock;
  // Connects on `loop` (which it owns if `owned` is set).
  static Result<std::unique_ptr<SessionCore>> Connect(
      const SessionOptions& options, LoopCore* loop,
      std::unique_ptr<LoopCore> owned);
  ~SessionCore();

  const SessionOptions& options() const { return options_; }
  fabric::Worker* worker() const { return loop_->worker(); }
  LoopCore* loop() const { return loop_; }
  Clock::time_point Deadline() const { return Clock::now() + options_.timeout; }

  // --- calls
  void Call(proto::ServiceId service, uint8_t method, std::string payload,
            RpcClient::ReplyFn done);
  Result<std::string> CallSync(proto::ServiceId service, uint8_t method,
                               std::string payload);
  // As CallSync, by `deadline` instead of the session timeout.
  Result<std::string> CallSyncUntil(proto::ServiceId service, uint8_t method,
                                    std::string payload,
                                    Clock::time_point deadline);

  // --- regions and one-sided reads
  // Every region the server exported (raw ones and services' ones).
  const std::vector<proto::RegionInfoWire>& all_regions() const {
    return region_list_;
  }
  const std::vector<RegionInfo>& raw_regions() const { return raw_regions_; }
  bool is_raw(uint32_t id) const { return raw_ids_.count(id) != 0; }
  // The region `id`, or null.
  const fabric::RemoteRegion* region(uint32_t id) const;
  // A read done before returning (a copy when mapped, else a UCX get, or
  // a served read, during which the slow-call hook runs as for a call).
  Status ReadNow(uint32_t region, uint64_t offset, void* dst, size_t len);
  // The same for a region the caller looked up already (region()): a hot
  // loop over one region skips the lookup. A copy out of a mapped region
  // is inline (a get over shared memory makes two or three of them).
  Status ReadNow(const fabric::RemoteRegion& region, uint64_t offset, void* dst,
                 size_t len) {
    if (const uint8_t* m = region.mapped();
        m != nullptr && ep_->usable() && region.Contains(offset, len)) {
      std::memcpy(dst, m + offset, len);
      return Status::OK();
    }
    return ReadNowSlow(region, offset, dst, len);
  }
  // Several reads done before returning, each span naming its region
  // (region()): copies where mapped, else one fabric::Endpoint::GetMany
  // (served: one request for all of them), waited for as ReadNow waits.
  Status ReadManyNow(const std::vector<fabric::Endpoint::GetSpan>& spans);
  // An asynchronous read; `done` runs from Poll (or at once, deferred).
  void Read(uint32_t region, uint64_t offset, void* dst, size_t len,
            fabric::Completion done);
  // Several asynchronous reads of one region with one completion (the first
  // error); served (tcp), one request to the server for all of them
  // (fabric::Endpoint::GetMany). Each span's `region` is set here.
  void ReadMany(uint32_t region, std::vector<fabric::Endpoint::GetSpan> spans,
                fabric::Completion done);
  // Set by remem::Cluster on the sessions it routes keys to: their stores
  // may read one-sided (a store on another session of a cluster member
  // asks the server, which knows the shards it owns).
  void set_cluster_routed(bool routed) { cluster_routed_ = routed; }
  bool cluster_routed() const { return cluster_routed_; }
  // Set by remem::Cluster on the sessions it routes by: a pair read
  // one-sided is returned only if the partition's serving mark covers it
  // (hash/layout.h, "Serving mark"), judged by serving_epoch(): the epoch
  // of the configuration the client routes by (in a replicated cluster:
  // if that configuration names this session's incarnation of the server,
  // else 0, which the mark calls stale). The mark's replicated versions
  // are checked only with serving_versions_checked() (a replicated
  // cluster).
  void set_serving_checked(bool checked, bool versions) {
    serving_checked_ = checked;
    serving_versions_checked_ = versions;
  }
  bool serving_checked() const { return serving_checked_; }
  bool serving_versions_checked() const { return serving_versions_checked_; }
  void set_serving_epoch(uint32_t epoch) { serving_epoch_ = epoch; }
  uint32_t serving_epoch() const { return serving_epoch_; }
  bool reads_are_local() const { return local_reads_; }
  // True where one-sided operations are performed by the server (tcp).
  bool served() const { return ep_->served(); }
  // OK if values read one-sided so far may be returned now: the server's
  // lease vouches for them (shared memory), or the server performed the
  // reads (served). Otherwise Unavailable: the server is gone or its lease
  // lapsed (the caller asks the server instead, or reports it).
  //
  // Cost on the fast path: one coarse clock read (no system call). Every
  // kSocketCheckNs it also looks at the session's TCP connection, so a
  // server that died on this host is noticed within about 10 ms, well
  // before its lease runs out.
  Status Vouch() {
    if (!needs_lease_) return ep_->failed() ? ep_->failure() : Status::OK();
    const uint64_t now = CoarseNowNs();
    if (now < vouched_until_ns_ && now < next_socket_check_ns_) {
      return Status::OK();
    }
    return RenewVouch();
  }
  static constexpr uint64_t kSocketCheckNs = 10'000'000;

  // --- asynchronous bookkeeping
  // Wraps a callback so in_flight/first_error are kept.
  template <typename Arg, typename Fn>
  auto Track(Fn fn) {
    Began();
    std::function<void(Arg)> done = std::move(fn);
    return [this, done = std::move(done)](Arg r) mutable {
      --in_flight_;
      --loop_->in_flight_;
      const Status& st = StatusOf(r);
      if (!st.ok() && first_error_.ok()) first_error_ = st;
      if (done) done(std::move(r));
    };
  }
  // The same bookkeeping without a wrapper, for stores that keep their own
  // callbacks (no allocation per operation): Began when an operation is
  // issued, Ended with its outcome just before its callback runs.
  void Began() {
    ++in_flight_;
    ++loop_->in_flight_;
  }
  void Ended(const Status& st) {
    --in_flight_;
    --loop_->in_flight_;
    if (!st.ok() && first_error_.ok()) first_error_ = st;
  }
  template <typename T>
  void Ended(const Result<T>& r) {
    Ended(r.status());
  }
  // Runs `fn` at the next Poll (never inside the issuing call).
  void Defer(util::MoveFunction<void()> fn) { worker()->Defer(std::move(fn)); }
  size_t in_flight() const { return in_flight_; }
  // The same on every session of this session's loop (a cluster client's
  // sessions share one): a synchronous one-sided search over a served
  // transport holds up all of them, not only this session's.
  size_t loop_in_flight() const { return loop_->in_flight(); }
  Status TakeFirstError() {
    Status s = first_error_;
    first_error_ = Status::OK();
    return s;
  }
  // A store's queue of requests to send together: run before every Poll,
  // WaitAll and synchronous call, the hooks in the order they were added
  // (the RESP front door relies on it). Returns a handle for
  // RemoveFlushHook.
  int AddFlushHook(std::function<void()> hook);
  void RemoveFlushHook(int handle);
  void Flush();

  // Progresses until `done()` (flushing stores each round), or the
  // deadline; TimedOut then. Checks the server is still there.
  Status ProgressUntil(const std::function<bool()>& done,
                       Clock::time_point deadline);
  // As ProgressUntil, but gives up (TimedOut) only after `idle` passes
  // with no reply from the server: a wait for a batch whose requests go a
  // few at a time, each when one before has answered, may take many
  // timeouts in all while every request meets its own deadline.
  Status ProgressWhileAnswered(const std::function<bool()>& done,
                               Clock::duration idle);
  // Progress until nothing of this session is in flight (WaitAll); inside
  // a callback, until NothingOutstanding.
  Status WaitAll();
  // Nothing left on this session's loop to run, and nothing sent on this
  // session still to be heard back (calls, one-sided reads).
  bool NothingOutstanding();
  // Expires deadlines and checks the session's TCP connection.
  size_t Housekeeping();

  // --- the session
  fabric::Endpoint* endpoint() const { return ep_.get(); }
  RpcClient* rpc() const { return rpc_.get(); }
  uint64_t incarnation() const { return incarnation_; }
  uint64_t session_id() const { return session_id_; }
  const std::string& transport() const { return transport_; }
  // False once failed; looks at the TCP connection at most once per
  // kSocketCheckNs.
  bool connected();
  // Tears the session down: everything outstanding and later fails with
  // `why`.
  void Fail(const Status& why);
  // Housekeeping calls `hook` (at most once per `every`, never from inside
  // itself) while the oldest RPC or served one-sided operation still
  // pending on this session has waited longer than `every` (ReadNow waits
  // for a served read with Housekeeping): the cluster client then asks whether
  // the server was failed over, and fails the session if so (a paused or
  // cut-off server never answers). Null: none.
  void SetSlowCallHook(Clock::duration every, std::function<void()> hook) {
    slow_every_ = every;
    slow_hook_ = std::move(hook);
  }

 private:
  // ReadNow's other cases: a range outside the region, an endpoint that
  // failed, a UCX get, or a served read.
  Status ReadNowSlow(const fabric::RemoteRegion& region, uint64_t offset,
                     void* dst, size_t len);
  SessionCore(const SessionOptions& o, LoopCore* loop,
              std::unique_ptr<LoopCore> owned)
      : options_(o), loop_(loop), owned_loop_(std::move(owned)) {}
  Status Handshake(Clock::time_point deadline);
  // Part of connecting: by the connection's deadline.
  Status LoadRegions(Clock::time_point deadline);
  Status RenewVouch();
  // Issues reads with `issue` (given their one completion) and waits for
  // them as for a call (ProgressUntil, with Housekeeping, by the session
  // timeout); on a timeout, fails the endpoint, which drops the reads
  // before their buffers go away.
  Status WaitForReads(const std::function<void(fabric::Completion)>& issue);
  // The session's TCP connection closed: fails it, and has the loop watch
  // for a stall.
  void ServerGone();
  static uint64_t CoarseNowNs();
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static const Status& StatusOf(const Result<T>& r) {
    return r.status();
  }

  SessionOptions options_;
  LoopCore* loop_;
  // Declared before the endpoint and calls: destroyed after them.
  std::unique_ptr<LoopCore> owned_loop_;
  util::Socket socket_;  // the session's TCP connection
  std::unique_ptr<fabric::Endpoint> ep_;
  std::unique_ptr<RpcClient> rpc_;
  std::unordered_map<uint32_t, std::unique_ptr<fabric::RemoteRegion>> remote_;
  std::vector<proto::RegionInfoWire> region_list_;
  std::vector<RegionInfo> raw_regions_;
  std::unordered_set<uint32_t> raw_ids_;
  std::string server_address_;  // the server's worker address
  uint64_t incarnation_ = 0;
  uint64_t session_id_ = 0;
  uint32_t lease_ms_ = 0;
  uint64_t endpoint_number_ = 0;  // the server endpoint's (ServerHello)
  std::string transport_;
  bool local_reads_ = false;
  bool cluster_routed_ = false;
  bool serving_checked_ = false;
  bool serving_versions_checked_ = false;
  uint32_t serving_epoch_ = 0;
  bool needs_lease_ = false;
  uint64_t vouched_until_ns_ = 0;  // CLOCK_MONOTONIC_COARSE
  uint64_t next_socket_check_ns_ = 0;
  std::function<void()> slow_hook_;
  Clock::duration slow_every_{};
  uint64_t next_slow_check_ns_ = 0;
  bool in_slow_hook_ = false;
  // The served operation seen past its deadline (0: none), and the
  // worker's progress then (Housekeeping gives it up once
  // Worker::HandledSince that mark).
  uint64_t served_due_id_ = 0;
  fabric::Worker::ProgressMark served_due_mark_;
  // Housekeeping saw the session's socket closed, at this mark: the
  // session fails once the worker handled what had come by then.
  bool gone_seen_ = false;
  fabric::Worker::ProgressMark gone_mark_;
  size_t in_flight_ = 0;
  Status first_error_;
  std::map<int, std::function<void()>> flush_hooks_;
  int next_hook_ = 1;
};

}  // namespace remem::client

#endif  // REMEM_CLIENT_SESSION_CORE_H_
