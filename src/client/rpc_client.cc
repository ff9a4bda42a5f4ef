#include "client/rpc_client.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "proto/codec.h"

namespace remem::client {

Result<std::unique_ptr<RpcClient>> RpcClient::Create(Worker* worker,
                                                     Endpoint* endpoint) {
  std::unique_ptr<RpcClient> c(new RpcClient(worker, endpoint));
  RpcClient* self = c.get();
  auto token =
      worker->RouteAm(proto::kAmReply, endpoint->handle(),
                      [self](AmMessage&& m) { self->OnReply(std::move(m)); });
  if (!token.ok()) return token.status();
  c->route_token_ = *token;
  return c;
}

RpcClient::~RpcClient() {
  worker_->UnrouteAm(proto::kAmReply, endpoint_->handle(), route_token_);
}

void RpcClient::Call(proto::ServiceId service, uint8_t method,
                     std::string payload, Clock::time_point deadline,
                     ReplyFn done) {
  if (payload.size() > proto::kMaxRpcPayload) {
    worker_->Defer([done = std::move(done), n = payload.size()] {
      done(Status::InvalidArgument("rpc payload of " + std::to_string(n) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(proto::kMaxRpcPayload)),
           {});
    });
    return;
  }
  if (endpoint_->failed()) {
    worker_->Defer(
        [done = std::move(done), st = endpoint_->failure()] { done(st, {}); });
    return;
  }
  uint64_t id = next_id_++;
  proto::SealedRpcHeader h;
  const size_t header_len = proto::SealHeader(
      proto::MakeHeader(service, method, id, payload.size(),
                        /*reply=*/false, StatusCode::kOk, epoch_),
      payload, &h);
  pending_.emplace(id,
                   Pending{std::move(done), deadlines_.emplace(deadline, id)});
  // No completion: one would refer to this client, which may be destroyed
  // before it runs (a send still out when its session closes completes
  // later, with an error). A send that fails fails the endpoint, whose
  // failure fails every pending call (the owner's handler: FailAll); one
  // refused for good otherwise (never seen) times out.
  endpoint_->SendAm(proto::kAmRequest, &h, header_len, std::move(payload),
                    nullptr);
}

RpcClient::ReplyFn RpcClient::Take(PendingMap::iterator it) {
  ReplyFn fn = std::move(it->second.done);
  deadlines_.erase(it->second.deadline);
  pending_.erase(it);
  return fn;
}

Result<std::string> RpcClient::CallSync(proto::ServiceId service,
                                        uint8_t method, std::string payload,
                                        Clock::time_point deadline) {
  bool finished = false;
  Status status;
  std::string reply;
  Call(service, method, std::move(payload), deadline,
       [&](Status st, std::string data) {
         finished = true;
         status = std::move(st);
         reply = std::move(data);
       });
  Status wait = worker_->ProgressUntil(
      [&] {
        if (!finished) ExpireOverdue(Clock::now());
        return finished;
      },
      deadline + std::chrono::milliseconds(50));
  if (!wait.ok() && !finished) ExpireDeadlines(Clock::time_point::max());
  if (!status.ok()) return status;
  if (!finished) return Status::TimedOut("rpc did not complete");
  return reply;
}

namespace {

// The request id a reply's RpcHeader carries, or 0 (no call has it) when
// the header is too short to hold one.
uint64_t ReplyRequestId(const AmMessage& m) {
  constexpr size_t kIdEnd = offsetof(proto::RpcHeader, request_id) + 8;
  uint64_t id = 0;
  if (m.header.size() >= kIdEnd) {
    std::memcpy(&id, m.header.data() + kIdEnd - 8, sizeof(id));
  }
  return id;
}

}  // namespace

void RpcClient::OnReply(AmMessage&& msg) {
  if (msg.refused_length) {
    // Too large to accept: fail the call it answers without fetching it.
    auto it = pending_.find(ReplyRequestId(msg));
    if (it == pending_.end()) {
      ++stray_replies_;
      return;
    }
    ++replies_;
    Take(it)(
        Status::OutOfMemory("reply of " + std::to_string(msg.refused_length) +
                            " bytes exceeds this client's limit"),
        {});
    return;
  }
  auto h = proto::DecodeHeader(msg.header.data(), msg.header.size(),
                               msg.data.size());
  if (!h.ok() || !(h->flags & proto::kFlagReply)) {
    ++stray_replies_;
    return;
  }
  auto it = pending_.find(h->request_id);
  if (it == pending_.end()) {
    ++stray_replies_;  // timed out earlier, or not ours
    return;
  }
  ReplyFn fn = Take(it);
  ++replies_;
  if (Status st =
          proto::VerifySeal(msg.header.data(), msg.header.size(), msg.data);
      !st.ok()) {
    return fn(st, {});
  }
  if (h->status != 0) {
    fn(Status(static_cast<StatusCode>(h->status), std::move(msg.data)), {});
    return;
  }
  fn(Status::OK(), std::move(msg.data));
}

void RpcClient::FailAll(const Status& why) {
  auto pending = std::move(pending_);
  pending_.clear();
  deadlines_.clear();
  looked_ = false;
  for (auto& [id, p] : pending) p.done(why, {});
}

size_t RpcClient::ExpireDeadlines(Clock::time_point now) {
  return Expire(now, /*spare_held=*/false);
}

size_t RpcClient::Expire(Clock::time_point now, bool spare_held) {
  size_t n = 0;
  if (!spare_held) {
    // Until none is left due: also the calls the callbacks make meanwhile
    // (a teardown expires everything, time_point::max()).
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto it = pending_.find(deadlines_.begin()->second);
      if (it == pending_.end()) {  // cannot happen: entries leave together
        deadlines_.erase(deadlines_.begin());
        continue;
      }
      Take(it)(Status::TimedOut("no reply from the server within the deadline"),
               {});
      ++n;
    }
    return n;
  }
  // The calls due and not answered by a reply the worker holds, chosen
  // first: the callbacks may make or end calls.
  std::vector<uint64_t> due;
  for (auto d = deadlines_.begin(); d != deadlines_.end() && d->first <= now;
       ++d) {
    const uint64_t id = d->second;
    if (!worker_->HoldsMessage(
            proto::kAmReply, endpoint_->handle(),
            [id](const AmMessage& m) { return ReplyRequestId(m) == id; })) {
      due.push_back(id);
    }
  }
  for (uint64_t id : due) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;  // an earlier callback ended it
    Take(it)(Status::TimedOut("no reply from the server within the deadline"),
             {});
    ++n;
  }
  return n;
}

size_t RpcClient::ExpireOverdue(Clock::time_point now) {
  size_t n = 0;
  if (looked_ && worker_->HandledSince(look_mark_)) {
    looked_ = false;
    n += Expire(look_at_, /*spare_held=*/true);
  }
  // The first look keeps its time until it is acted on: a loop that looks
  // at every pass would otherwise never count its passes.
  if (!looked_ && NextDeadline() <= now) {
    looked_ = true;
    look_at_ = now;
    look_mark_ = worker_->Mark();
    ++n;
  }
  return n;
}

Clock::time_point RpcClient::NextDeadline() const {
  return deadlines_.empty() ? Clock::time_point::max()
                            : deadlines_.begin()->first;
}

}  // namespace remem::client
