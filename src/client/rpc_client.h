// client::RpcClient: request/response calls over active messages on one
// endpoint. Each call names a service and method and gets a fresh request
// id; the reply (matched by id) is routed to the caller's continuation on
// the worker's thread. Calls past their deadline complete with TimedOut (a
// late reply is then dropped); when the endpoint fails, every pending call
// completes with its failure.
//
// Thread contract: belongs to its worker's thread. Many RpcClients may
// share a worker (one per endpoint: replies are routed by endpoint).

#ifndef REMEM_CLIENT_RPC_CLIENT_H_
#define REMEM_CLIENT_RPC_CLIENT_H_

#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "fabric/endpoint.h"
#include "fabric/worker.h"
#include "proto/wire.h"

namespace remem::client {

using fabric::AmMessage;
using fabric::Clock;
using fabric::Endpoint;
using fabric::Worker;

class RpcClient {
 public:
  using ReplyFn = std::function<void(Status, std::string)>;

  // Routes `endpoint`'s replies on `worker` to this client. `endpoint`
  // must outlive this, and its owner fails every pending call when it
  // fails (FailAll from its failure handler): a call whose send fails is
  // failed that way. Nothing the worker runs later refers to this client
  // (its sends have no completion).
  static Result<std::unique_ptr<RpcClient>> Create(Worker* worker,
                                                   Endpoint* endpoint);
  ~RpcClient();

  // Issues a call; `done` receives the reply payload, or the error (a
  // server-side error arrives as its Status with the server's message).
  void Call(proto::ServiceId service, uint8_t method, std::string payload,
            Clock::time_point deadline, ReplyFn done);
  // Issues a call and progresses until it completes.
  Result<std::string> CallSync(proto::ServiceId service, uint8_t method,
                               std::string payload, Clock::time_point deadline);

  size_t pending() const { return pending_.size(); }
  // The cluster configuration epoch sent in every later request (0: none;
  // set by the cluster client, include/remem/cluster.h).
  void set_epoch(uint32_t epoch) { epoch_ = epoch; }
  uint32_t epoch() const { return epoch_; }
  // Deadlines tracked: one per pending call, never more.
  size_t deadlines_tracked() const { return deadlines_.size(); }
  // Completes every pending call with `why`.
  void FailAll(const Status& why);
  // Completes calls whose deadline has passed with TimedOut. Returns the
  // number expired.
  size_t ExpireDeadlines(Clock::time_point now);
  // The same for the polls of a waiting client: a call whose deadline had
  // passed at an earlier look (a call of this at `now`, the time then)
  // ends TimedOut once the worker handled everything that had arrived by
  // that look (Worker::HandledSince), unless its reply is among what the
  // worker has received and not run yet (Worker::HoldsMessage: a pass
  // under way holds it while a callback it ran waits in nested passes). A
  // reply that came in time and sat unread because the client was busy
  // elsewhere (a long callback, a descheduled process) is not late.
  // Returns the number expired, plus one for a new look (a loop should
  // poll again rather than sleep).
  size_t ExpireOverdue(Clock::time_point now);
  // Earliest pending deadline, or time_point::max().
  Clock::time_point NextDeadline() const;

  // Replies that could not be matched or decoded (diagnostics).
  uint64_t stray_replies() const { return stray_replies_; }
  // Replies matched to their calls so far: a wait that sees it grow knows
  // the server is answering (SessionCore::ProgressWhileAnswered).
  uint64_t replies() const { return replies_; }

 private:
  RpcClient(Worker* w, Endpoint* ep) : worker_(w), endpoint_(ep) {}
  void OnReply(AmMessage&& msg);

  using Deadlines = std::multimap<Clock::time_point, uint64_t>;
  struct Pending {
    ReplyFn done;
    Deadlines::iterator deadline;  // this call's entry in deadlines_
  };
  using PendingMap = std::unordered_map<uint64_t, Pending>;
  // Removes a pending call (and its deadline) and returns its callback.
  ReplyFn Take(PendingMap::iterator it);
  // ExpireDeadlines, sparing the calls whose reply the worker holds unrun
  // when `spare_held`.
  size_t Expire(Clock::time_point now, bool spare_held);

  Worker* worker_;
  Endpoint* endpoint_;
  uint64_t route_token_ = 0;  // of this client's reply route
  uint64_t next_id_ = 1;
  uint32_t epoch_ = 0;
  PendingMap pending_;
  // One entry per pending call, removed with it: the map stays as small as
  // the calls in flight (it once kept every answered call until its
  // deadline, a tree of millions of entries at a few hundred thousand
  // calls a second, which slowed every call).
  Deadlines deadlines_;
  uint64_t stray_replies_ = 0;
  uint64_t replies_ = 0;
  // ExpireOverdue's last look while a deadline had passed: when, and the
  // worker's progress then.
  bool looked_ = false;
  Clock::time_point look_at_{};
  Worker::ProgressMark look_mark_;
};

}  // namespace remem::client

#endif  // REMEM_CLIENT_RPC_CLIENT_H_
