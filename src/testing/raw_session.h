// testing::RawSession: a session made by hand, for tests that speak the
// wire protocol directly: remem's TCP handshake with any secret (or any
// bytes), a UCX endpoint to the serving thread, and hand-made active
// messages with their replies. Tests use it to send what no well-behaved
// client would: malformed headers, unknown services, oversized payloads,
// regions stretched past their end.
//
// Thread contract: one thread.

#ifndef REMEM_TESTING_RAW_SESSION_H_
#define REMEM_TESTING_RAW_SESSION_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fabric/endpoint.h"
#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "proto/codec.h"
#include "remem/options.h"
#include "util/socket.h"

namespace remem::testing {

class RawSession {
 public:
  // Completes the handshake (with `secret`) and the UCX connection.
  static Result<std::unique_ptr<RawSession>> Connect(
      const std::string& address, Transport transport,
      const std::string& secret = "");
  ~RawSession();

  // Sends an active message with any header bytes.
  void Send(const std::string& header, std::string payload);
  // Sends a well-formed request to `service`/`method`.
  void SendRequest(proto::ServiceId service, uint8_t method, uint64_t id,
                   std::string payload);
  // Waits (10 s) for the next reply: its decoded header and payload (a
  // sealed one verified: proto::VerifySeal).
  Result<std::pair<proto::RpcHeader, std::string>> NextReply();
  // A request and its reply.
  Result<std::pair<proto::RpcHeader, std::string>> Call(
      proto::ServiceId service, uint8_t method, std::string payload);
  size_t replies() const { return replies_.size(); }

  // Lists the server's regions and unpacks them for this endpoint; with
  // `stretch` added to each length, so the client-side bound no longer
  // protects the server (tests of the server's own checks).
  Status UnpackRegions(uint64_t stretch = 0);
  const proto::RegionsInfo& regions() const { return info_; }
  const fabric::RemoteRegion& region(size_t i) const { return *regions_[i]; }
  fabric::Worker& worker() { return *worker_; }
  fabric::Endpoint& ep() { return *ep_; }
  const proto::ServerHelloInfo& hello() const { return hello_; }
  int socket_fd() const { return socket_.fd(); }

 private:
  RawSession() = default;
  std::unique_ptr<fabric::Worker> worker_;
  util::Socket socket_;
  std::unique_ptr<fabric::Endpoint> ep_;
  std::vector<std::unique_ptr<fabric::RemoteRegion>> regions_;
  proto::RegionsInfo info_;
  proto::ServerHelloInfo hello_;
  std::vector<fabric::AmMessage> replies_;
  uint64_t next_id_ = 1u << 20;
};

// The server's answer to a handshake of arbitrary bytes: connects, sends
// `bytes`, half-closes, and reads what the server says before closing
// (its ServerHello, decoded when it is one). Unavailable if the server
// closed without a word.
Result<proto::ServerHelloInfo> RawHandshake(const std::string& address,
                                            const std::string& bytes);

}  // namespace remem::testing

#endif  // REMEM_TESTING_RAW_SESSION_H_
