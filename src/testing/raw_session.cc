#include "testing/raw_session.h"

#include <sys/socket.h>

namespace remem::testing {

using fabric::Clock;

Result<std::unique_ptr<RawSession>> RawSession::Connect(
    const std::string& address, Transport transport,
    const std::string& secret) {
  std::unique_ptr<RawSession> s(new RawSession());
  auto ctx = fabric::Context::Shared(transport);
  if (!ctx.ok()) return ctx.status();
  auto w = fabric::Worker::Create(*ctx, proto::kMaxRpcPayload);
  if (!w.ok()) return w.status();
  s->worker_ = std::move(*w);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto sock = util::Connect(address, deadline);
  if (!sock.ok()) return sock.status();
  s->socket_ = std::move(*sock);
  proto::ClientHelloInfo hello;
  hello.secret = secret;
  hello.worker_address = s->worker_->address();
  REMEM_RETURN_IF_ERROR(util::SendAll(
      s->socket_.fd(), proto::EncodeClientHello(hello), deadline));
  std::string prefix, rest;
  REMEM_RETURN_IF_ERROR(util::RecvExact(
      s->socket_.fd(), sizeof(proto::ServerHello), &prefix, deadline));
  proto::ServerHello h;
  auto body = proto::DecodeServerHelloPrefix(prefix, &h);
  if (!body.ok()) return body.status();
  REMEM_RETURN_IF_ERROR(
      util::RecvExact(s->socket_.fd(), *body, &rest, deadline));
  auto reply = proto::DecodeServerHello(prefix + rest);
  if (!reply.ok()) return reply.status();
  if (!reply->status.ok()) return reply->status;
  s->hello_ = *reply;
  auto ep = fabric::Endpoint::CreateJoined(
      s->worker_.get(), reply->worker_address, reply->endpoint_number,
      proto::EncodeEndpointNotice(reply->incarnation, reply->session_id,
                                  reply->endpoint_number),
      deadline, [fd = s->socket_.fd()] { return !util::PeerStillThere(fd); });
  if (!ep.ok()) return ep.status();
  s->ep_ = std::move(*ep);
  REMEM_RETURN_IF_ERROR(s->ep_->WaitConnected(deadline));
  // As every remem client: one-sided operations that UCX would emulate
  // (tcp) go as served memory requests.
  REMEM_RETURN_IF_ERROR(s->ep_->set_served(s->ep_->RmaIsEmulated()));
  RawSession* raw = s.get();
  // Routed by endpoint, as a session's RpcClient routes its replies (a test
  // may put one on this endpoint instead).
  auto token = s->worker_->RouteAm(
      proto::kAmReply, s->ep_->handle(),
      [raw](fabric::AmMessage&& m) { raw->replies_.push_back(std::move(m)); });
  if (!token.ok()) return token.status();
  return s;
}

RawSession::~RawSession() {
  regions_.clear();
  ep_.reset();
  worker_.reset();
}

void RawSession::Send(const std::string& header, std::string payload) {
  ep_->SendAm(proto::kAmRequest, header.data(), header.size(),
              std::move(payload), nullptr);
}

void RawSession::SendRequest(proto::ServiceId service, uint8_t method,
                             uint64_t id, std::string payload) {
  proto::RpcHeader h =
      proto::MakeHeader(service, method, id, payload.size(), false);
  Send(std::string(reinterpret_cast<const char*>(&h), sizeof(h)),
       std::move(payload));
}

Result<std::pair<proto::RpcHeader, std::string>> RawSession::NextReply() {
  Status st = worker_->ProgressUntil([&] { return !replies_.empty(); },
                                     Clock::now() + std::chrono::seconds(10));
  if (!st.ok()) return st.WithContext("waiting for a reply");
  fabric::AmMessage m = std::move(replies_.front());
  replies_.erase(replies_.begin());
  auto h = proto::DecodeHeader(m.header.data(), m.header.size(), m.data.size());
  if (!h.ok()) return h.status();
  REMEM_RETURN_IF_ERROR(
      proto::VerifySeal(m.header.data(), m.header.size(), m.data));
  return std::make_pair(*h, std::move(m.data));
}

Result<std::pair<proto::RpcHeader, std::string>> RawSession::Call(
    proto::ServiceId service, uint8_t method, std::string payload) {
  SendRequest(service, method, next_id_++, std::move(payload));
  return NextReply();
}

Status RawSession::UnpackRegions(uint64_t stretch) {
  auto r = Call(proto::kCoreService,
                static_cast<uint8_t>(proto::CoreMethod::kRegions), {});
  if (!r.ok()) return r.status();
  if (r->first.status != 0) return Status::Internal(r->second);
  auto info = proto::DecodeRegionsReply(r->second);
  if (!info.ok()) return info.status();
  info_ = *info;
  regions_.clear();
  for (const auto& reg : info_.regions) {
    auto region = fabric::RemoteRegion::Unpack(
        ep_->handle(), reg.region_id, reg.base, reg.length + stretch, reg.rkey);
    if (!region.ok()) return region.status();
    regions_.push_back(std::move(*region));
  }
  return Status::OK();
}

Result<proto::ServerHelloInfo> RawHandshake(const std::string& address,
                                            const std::string& bytes) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto sock = util::Connect(address, deadline);
  if (!sock.ok()) return sock.status();
  Status sent = util::SendAll(sock->fd(), bytes, deadline);
  // The server may refuse and close before taking every byte.
  ::shutdown(sock->fd(), SHUT_WR);
  std::string prefix, rest;
  Status st = util::RecvExact(sock->fd(), sizeof(proto::ServerHello), &prefix,
                              deadline);
  if (!st.ok()) return sent.ok() ? st : sent;
  proto::ServerHello h;
  auto body = proto::DecodeServerHelloPrefix(prefix, &h);
  if (!body.ok()) return body.status();
  REMEM_RETURN_IF_ERROR(util::RecvExact(sock->fd(), *body, &rest, deadline));
  return proto::DecodeServerHello(prefix + rest);
}

}  // namespace remem::testing
