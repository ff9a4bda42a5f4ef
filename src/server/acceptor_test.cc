// server::Acceptor alone, with a stand-in for the server threads: the
// handshake deadline measures the client, not the acceptor thread.

#include "server/acceptor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "fabric/context.h"
#include "fabric/worker.h"
#include "proto/codec.h"
#include "server/client_address.h"
#include "util/socket.h"

namespace remem::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A well-formed worker address (the acceptor's check reads its form).
std::string WorkerAddress() {
  auto ctx = fabric::Context::Shared(Transport::kTcp);
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  if (!ctx.ok()) return {};
  auto worker = fabric::Worker::Create(*ctx, 4096);
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
  return worker.ok() ? (*worker)->address() : std::string();
}

std::string ClientHello() {
  proto::ClientHelloInfo hello;
  hello.worker_address = WorkerAddress();
  return proto::EncodeClientHello(hello);
}

// The status of the ServerHello that arrives on `sock`.
Status ReadServerHello(const util::Socket& sock) {
  const auto deadline = Clock::now() + seconds(30);
  std::string prefix, rest;
  REMEM_RETURN_IF_ERROR(util::RecvExact(sock.fd(), sizeof(proto::ServerHello),
                                        &prefix, deadline));
  proto::ServerHello h;
  auto body = proto::DecodeServerHelloPrefix(prefix, &h);
  if (!body.ok()) return body.status();
  REMEM_RETURN_IF_ERROR(util::RecvExact(sock.fd(), *body, &rest, deadline));
  auto reply = proto::DecodeServerHello(prefix + rest);
  if (!reply.ok()) return reply.status();
  return reply->status;
}

class AcceptorTest : public ::testing::Test {
 protected:
  // An acceptor whose first admission keeps its thread busy for
  // `first_admission`, as the address checks of a storm of clients do.
  void Start(milliseconds handshake_timeout, milliseconds first_admission) {
    AcceptorOptions o;
    o.listen = "127.0.0.1:0";
    o.handshake_timeout = handshake_timeout;
    auto a = Acceptor::Bind(
        o,
        [this, first_admission](uint32_t, ConnectionId, std::string,
                                std::string, Acceptor::AdmitDone done) {
          if (admissions_.fetch_add(1) == 0) {
            std::this_thread::sleep_for(first_admission);
          }
          done(Status::OK(), "server worker address", 0);
        },
        [this](uint32_t, ConnectionId, bool goodbye) {
          std::lock_guard<std::mutex> lock(mu_);
          ends_.push_back(goodbye);
          ended_.notify_all();
        });
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    acceptor_ = std::move(*a);
    ASSERT_TRUE(acceptor_->Start().ok());
  }

  util::Socket Connect() {
    auto s = util::Connect(acceptor_->address(), Clock::now() + seconds(10));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : util::Socket();
  }

  // Waits for the n-th session end; whether it came with the goodbye.
  bool WaitForEnd(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(
        ended_.wait_for(lock, seconds(10), [&] { return ends_.size() >= n; }));
    return ends_.size() >= n && ends_[n - 1];
  }

  std::atomic<int> admissions_{0};
  std::mutex mu_;
  std::condition_variable ended_;
  std::vector<bool> ends_;  // per session end: came with the goodbye
  std::unique_ptr<Acceptor> acceptor_;
};

// A session's end tells whether the client said goodbye first (the server
// then does not suspect it died mid-send): only the goodbye byte does; a
// bare close, or another byte, does not.
TEST_F(AcceptorTest, OnlyTheGoodbyeByteEndsASessionInOrder) {
  Start(milliseconds(1000), milliseconds(0));
  const std::string hello = ClientHello();
  auto session = [&](const std::string& last) {
    util::Socket s = Connect();
    ASSERT_TRUE(util::SendAll(s.fd(), hello, Clock::now() + seconds(10)).ok());
    ASSERT_TRUE(ReadServerHello(s).ok());
    if (!last.empty()) {
      ASSERT_TRUE(util::SendAll(s.fd(), last, Clock::now() + seconds(10)).ok());
    }
  };
  session(std::string(1, char(proto::kSessionGoodbye)));
  EXPECT_TRUE(WaitForEnd(1));
  session("");
  EXPECT_FALSE(WaitForEnd(2));
  session("x");
  EXPECT_FALSE(WaitForEnd(3));
  session(std::string(1, char(proto::kSessionGoodbye)));
  EXPECT_TRUE(WaitForEnd(4));
}

// A client that sent its whole hello well before its deadline is admitted,
// though the acceptor thread was busy with another client until after that
// deadline (it once refused it: "no handshake within ... ms").
TEST_F(AcceptorTest, AHelloOnTimeIsAdmittedWhileTheAcceptorIsBusy) {
  Start(milliseconds(1000), milliseconds(2000));
  const std::string hello = ClientHello();
  util::Socket late = Connect();  // accepted now; its deadline in 1 s
  std::this_thread::sleep_for(milliseconds(100));
  util::Socket busy = Connect();  // its admission takes 2 s
  ASSERT_TRUE(util::SendAll(busy.fd(), hello, Clock::now() + seconds(10)).ok());
  std::this_thread::sleep_for(milliseconds(100));
  // 200 ms after its accept, while the acceptor is in the busy admission.
  ASSERT_TRUE(util::SendAll(late.fd(), hello, Clock::now() + seconds(10)).ok());
  EXPECT_TRUE(ReadServerHello(busy).ok());
  const Status st = ReadServerHello(late);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(acceptor_->counters().handshakes.Get(), 2u);
  EXPECT_EQ(acceptor_->counters().handshake_failures.Get(), 0u);
}

// What the deadline is for: a hello still incomplete then is refused.
TEST_F(AcceptorTest, AnIncompleteHelloIsRefusedAtTheDeadline) {
  Start(milliseconds(300), milliseconds(0));
  const std::string hello = ClientHello();
  util::Socket slow = Connect();
  const auto start = Clock::now();
  ASSERT_TRUE(util::SendAll(slow.fd(), hello.substr(0, hello.size() / 2),
                            Clock::now() + seconds(10))
                  .ok());
  const Status st = ReadServerHello(slow);
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st.ToString();
  EXPECT_GE(Clock::now() - start, milliseconds(250));
  EXPECT_EQ(acceptor_->counters().handshakes.Get(), 0u);
  EXPECT_EQ(acceptor_->counters().handshake_failures.Get(), 1u);
}

// A server thread that moved to a new UCX worker after a stall adds it to
// the check (AddOwn): a client may not hand the server that address either,
// and every copy of the check (the acceptor's) sees it.
TEST(ClientAddressCheckTest, AWorkerAddedLaterIsTheServersOwnToo) {
  const std::string first = WorkerAddress();
  const std::string later = WorkerAddress();
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(later.empty());
  auto check = ClientAddressCheck::Create({first});
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  const ClientAddressCheck acceptors = *check;
  EXPECT_EQ(acceptors.Check(first, -1).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(acceptors.Check(later, -1).ok());
  check->AddOwn(later);
  const Status st = acceptors.Check(later, -1);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("server's own"), std::string::npos);
}

// A connected pair on the loopback of `family`: {the accepted end, the
// connecting end}; {-1, -1} if this host has no such loopback.
std::pair<int, int> LoopbackPair(int family, bool mapped = false) {
  const int listener = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return {-1, -1};
  sockaddr_storage a{};
  socklen_t len;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    len = sizeof(sockaddr_in6);
  }
  const int client =
      ::socket(mapped ? AF_INET6 : family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int accepted = -1;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
      ::listen(listener, 1) == 0 &&
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    sockaddr_storage to = a;
    if (mapped) {  // ::ffff:127.0.0.1, the listener's port
      const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&to);
      *in6 = sockaddr_in6{};
      in6->sin6_family = AF_INET6;
      in6->sin6_port = in->sin_port;
      in6->sin6_addr.s6_addr[10] = in6->sin6_addr.s6_addr[11] = 0xff;
      std::memcpy(&in6->sin6_addr.s6_addr[12], &in->sin_addr, 4);
      len = sizeof(sockaddr_in6);
    }
    if (::connect(client, reinterpret_cast<sockaddr*>(&to), len) == 0) {
      accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    }
  }
  ::close(listener);
  if (accepted < 0) {
    ::close(client);
    return {-1, -1};
  }
  return {accepted, client};
}

// The server asks which process holds a handshake connection's other end
// (the owner of the shared memory a client's address names). The process
// holding it is found over IPv4, IPv6, and from a dual-stack IPv6 socket
// connected to an IPv4 address, and one that does not is not, including
// once the connection is closed.
TEST(ClientAddressCheckTest, ThePeerSocketsHolderIsFoundAndNoOtherProcess) {
  int to_child[2];
  ASSERT_EQ(::pipe2(to_child, O_CLOEXEC), 0);
  const pid_t other = ::fork();
  ASSERT_GE(other, 0);
  if (other == 0) {  // holds no socket of ours; waits for the pipe to close
    char c;
    ::close(to_child[1]);
    (void)!::read(to_child[0], &c, 1);
    _exit(0);
  }
  ::close(to_child[0]);
  int families = 0;
  for (const auto& [family, mapped] :
       {std::pair{AF_INET, false}, {AF_INET6, false}, {AF_INET, true}}) {
    const auto [accepted, client] = LoopbackPair(family, mapped);
    if (accepted < 0) continue;  // no IPv6 loopback here
    ++families;
    EXPECT_TRUE(ProcessHoldsPeerSocket(::getpid(), accepted))
        << family << (mapped ? " mapped" : "");
    EXPECT_FALSE(ProcessHoldsPeerSocket(other, accepted))
        << family << (mapped ? " mapped" : "");
    // The connecting end is held too, but its peer is the accepted end.
    EXPECT_TRUE(ProcessHoldsPeerSocket(::getpid(), client))
        << family << (mapped ? " mapped" : "");
    // Half-closed, the peer is still held; closed, it is held by no one.
    EXPECT_FALSE(PeerSocketClosed(::getpid(), accepted));
    ASSERT_EQ(::shutdown(client, SHUT_WR), 0);
    EXPECT_FALSE(PeerSocketClosed(::getpid(), accepted));
    ::close(client);
    EXPECT_FALSE(ProcessHoldsPeerSocket(::getpid(), accepted))
        << family << (mapped ? " mapped" : "");
    EXPECT_TRUE(PeerSocketClosed(::getpid(), accepted))
        << family << (mapped ? " mapped" : "");
    ::close(accepted);
  }
  EXPECT_GE(families, 1);
  ::close(to_child[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(other, &status, 0), other);
}

// A connection that does not exist must not pass for one because some
// socket listens on its port: looked up by its four addresses, the kernel
// falls back to a listener. A connected UDP socket names such a connection:
// its peer is a port this process listens on (TCP, every address), and its
// own port is no TCP socket's.
TEST(ClientAddressCheckTest, AListenerOnThePeersPortIsNotTheClientsEnd) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(any);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&any), len), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&any), &len),
            0);
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(udp, 0);
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  peer.sin_port = any.sin_port;
  ASSERT_EQ(::connect(udp, reinterpret_cast<sockaddr*>(&peer), sizeof(peer)),
            0);
  EXPECT_FALSE(ProcessHoldsPeerSocket(::getpid(), udp));
  ::close(udp);
  ::close(listener);
}

}  // namespace
}  // namespace remem::server
