// Hostile input against every socket remem-server listens on (issue #10,
// item 1). The test finds the server's listening TCP sockets itself, from
// /proc/<pid>/net/tcp{,6} and the socket inodes in /proc/<pid>/fd, and its
// abstract unix sockets (UCX's shared-memory wakeup sockets), and throws at
// each what a network peer could send: zeros, 0xff runs, seeded random
// bytes, fake and oversized length prefixes, every truncation of a valid
// handshake, a valid prefix then silence, a slow trickle, hundreds of such
// connections at once, connect-and-close, connect-and-reset, malformed and
// misdirected UCX worker addresses, and bytes on an authenticated session's
// connection. After each round the server must be alive and serving (a
// fresh client connects and does a put and a get), and its counters must say
// what happened: every failed handshake counted exactly once, and
// connections_current back to its base.
//
// UCX's own tcp ports get what does not pass UCX's 8-byte magic number
// (zeros, 0xff, random bytes, a cut-off magic): a crafted UCX frame after the
// magic can abort any UCX process (docs/SECURITY.md, "UCX's tcp ports"), so
// it is not a test that could pass.
//
// ctest runs this binary once per transport (REMEM_TEST_TRANSPORT=shm|tcp).
// The NonLoopback test runs the whole suite again inside a network
// namespace, against a server listening on a non-loopback address.

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "client/session_core.h"
#include "fabric/context.h"
#include "fabric/worker.h"
#include "fabric/worker_address.h"
#include "proto/codec.h"
#include "test_util.h"
#include "testing/raw_session.h"
#include "testing/scale.h"
#include "util/socket.h"

namespace remem {
namespace {

using testing::ConnectHashOrDie;
using testing::ConnectOrDie;
using testing::StartServer;
using testing::StatOf;
using testing::TestTransport;
using testing::WaitForStatOf;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kHandshakeTimeoutMs = 400;

// --- what the server listens on

struct TcpListener {
  std::string ip;  // as inet_ntop prints it
  uint16_t port = 0;
  std::string Address() const {
    return ip.find(':') != std::string::npos
               ? "[" + ip + "]:" + std::to_string(port)
               : ip + ":" + std::to_string(port);
  }
};

std::set<std::string> SocketInodesOf(pid_t pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    char target[128];
    const ssize_t n =
        readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    std::string t(target, size_t(n));
    if (t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
  }
  closedir(d);
  return out;
}

// Listening TCP sockets held by `pid` (in its network namespace).
std::vector<TcpListener> TcpListenersOf(pid_t pid) {
  const std::set<std::string> mine = SocketInodesOf(pid);
  std::vector<TcpListener> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state, q, t, r, uid, to, inode;
      if (!(f >> slot >> local >> remote >> state >> q >> t >> r >> uid >> to >>
            inode)) {
        continue;
      }
      if (state != "0A" || !mine.count(inode)) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      const std::string hex = local.substr(0, colon);
      uint8_t bytes[16];
      for (size_t w = 0; w < hex.size() / 8; ++w) {
        const uint32_t word =
            uint32_t(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
        std::memcpy(bytes + 4 * w, &word, 4);
      }
      char buf[INET6_ADDRSTRLEN];
      inet_ntop(hex.size() == 8 ? AF_INET : AF_INET6, bytes, buf, sizeof(buf));
      out.push_back(
          {buf, uint16_t(std::stoul(local.substr(colon + 1), nullptr, 16))});
    }
  }
  return out;
}

// Abstract unix sockets held by `pid` (UCX's shared-memory signal sockets),
// without the leading '@'.
std::vector<std::string> AbstractSocketsOf(pid_t pid) {
  const std::set<std::string> mine = SocketInodesOf(pid);
  std::vector<std::string> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/unix");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    if (!(f >> num >> refs >> proto >> flags >> type >> st >> inode)) continue;
    if (!(f >> path) || !mine.count(inode) || path.empty() || path[0] != '@') {
      continue;
    }
    out.push_back(path.substr(1));
  }
  return out;
}

// --- throwing bytes at a TCP port

struct Probe {
  std::string bytes;
  // kAwaitHello: keep open, and return as soon as a whole ServerHello is
  // in (a session the server admits stays open until the socket closes).
  enum Ending {
    kHalfClose,
    kKeepOpen,
    kReset,
    kAwaitHello
  } ending = kHalfClose;
  milliseconds trickle{0};  // pause between single bytes (a slow client)
};

struct Answer {
  bool connected = false;
  std::string received;  // everything the server sent before it closed
  bool closed = false;   // the server closed (EOF or reset)
  std::optional<proto::ServerHelloInfo> hello;
  double ms = 0;  // from connect to the server's close
};

Answer Throw(const std::string& address, const Probe& probe,
             milliseconds wait = milliseconds(5000)) {
  Answer a;
  const auto start = Clock::now();
  const auto deadline = start + wait;
  auto sock = util::Connect(address, deadline);
  if (!sock.ok()) return a;
  a.connected = true;
  const int fd = sock->fd();
  if (probe.trickle.count() > 0) {
    // One byte at a time, until the server answers (or closes).
    for (char c : probe.bytes) {
      if (!util::SendAll(fd, std::string_view(&c, 1), deadline).ok()) break;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, int(probe.trickle.count())) != 0) break;
    }
  } else if (!probe.bytes.empty()) {
    (void)util::SendAll(fd, probe.bytes, deadline);  // may be cut short
  }
  if (probe.ending == Probe::kReset) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    return a;  // the socket closes here: a reset
  }
  if (probe.ending == Probe::kHalfClose) shutdown(fd, SHUT_WR);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      a.received.append(buf, size_t(n));
      if (probe.ending == Probe::kAwaitHello &&
          a.received.size() >= sizeof(proto::ServerHello)) {
        proto::ServerHello h;
        auto body = proto::DecodeServerHelloPrefix(
            std::string_view(a.received).substr(0, sizeof(h)), &h);
        if (!body.ok() || a.received.size() >= sizeof(h) + *body) break;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    a.closed = true;
    break;
  }
  a.ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (a.received.size() >= sizeof(proto::ServerHello)) {
    auto h = proto::DecodeServerHello(a.received);
    if (h.ok()) a.hello = *h;
  }
  return a;
}

std::string Bytes(size_t n, char c) { return std::string(n, c); }

std::string Random(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

proto::ClientHello Prefix(uint32_t secret_len, uint32_t address_len) {
  proto::ClientHello h{};
  h.magic = proto::kWireMagic;
  h.version = proto::kWireVersion;
  h.secret_len = secret_len;
  h.address_len = address_len;
  return h;
}

std::string Raw(const proto::ClientHello& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::string Hello(const std::string& address, const std::string& secret = "") {
  proto::ClientHelloInfo info;
  info.secret = secret;
  info.worker_address = address;
  return proto::EncodeClientHello(info);
}

// A real worker address of this process for the test transport.
class LocalWorker {
 public:
  LocalWorker() {
    auto ctx = fabric::Context::Shared(TestTransport());
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    if (!ctx.ok()) return;
    auto w = fabric::Worker::Create(*ctx, proto::kMaxRpcPayload);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (w.ok()) worker_ = std::move(*w);
  }
  std::string address() const { return worker_ ? worker_->address() : ""; }

 private:
  std::unique_ptr<fabric::Worker> worker_;
};

// --- the fixture

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> extra = {"--handshake-timeout-ms",
                                      std::to_string(kHandshakeTimeoutMs)};
    if (const char* listen = std::getenv("REMEM_HOSTILE_LISTEN")) {
      extra.push_back("--listen");
      extra.push_back(listen);
    }
    for (const std::string& e : ExtraFlags()) extra.push_back(e);
    server_ = StartServer(extra);
    ASSERT_NE(server_.process, nullptr);
    observer_ = ConnectOrDie(server_.address, Secret());
    ASSERT_NE(observer_, nullptr);
    base_ = Stat("connections_current");
    ASSERT_EQ(base_, 1u);
  }
  virtual std::vector<std::string> ExtraFlags() const { return {}; }
  virtual std::string Secret() const { return ""; }

  uint64_t Stat(const char* name) { return StatOf(observer_.get(), name); }
  // Waits (bounded) until `name` equals `want`; returns the last value.
  uint64_t WaitForStat(const char* name, uint64_t want,
                       milliseconds bound = milliseconds(10000)) {
    return WaitForStatOf(observer_.get(), name, want, bound);
  }
  // The server is alive, a fresh client is served, and every connection of
  // the round is gone again.
  void ExpectServing(const std::string& round) {
    SCOPED_TRACE(round);
    ASSERT_TRUE(server_.process->running()) << "the server died";
    {
      auto c = ConnectHashOrDie(server_.address, Secret());
      ASSERT_TRUE(c) << "no fresh client after " << round;
      const std::string key = "after " + round;
      ASSERT_TRUE(c->Put(key, "still serving").ok());
      auto v = c->Get(key);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_EQ(v->value, "still serving");
    }
    EXPECT_EQ(WaitForStat("connections_current", base_), base_);
    EXPECT_TRUE(observer_->Ping().ok());
  }
  // What the server should have opened (server.cc, InitTransport): UCX's
  // tcp transport unless --transport shm, or auto on a loopback address.
  bool ExpectUcxTcp() const {
    const Transport t = TestTransport();
    if (t == Transport::kShm) return false;
    return t == Transport::kTcp || server_.address.rfind("127.", 0) != 0;
  }
  bool ExpectSharedMemory() const { return TestTransport() != Transport::kTcp; }
  std::vector<TcpListener> UcxTcpPorts() {
    std::vector<TcpListener> out;
    for (const TcpListener& l : TcpListenersOf(server_.process->pid())) {
      if (l.Address() != server_.address) out.push_back(l);
    }
    return out;
  }

  testing::ServerProcess server_;
  std::unique_ptr<Session> observer_;
  uint64_t base_ = 0;
};

// What remem-server listens on, per transport: the remem port on --listen;
// UCX's tcp ports only where tcp is enabled, and only on the --listen
// interface; UCX's shared-memory signal sockets where shared memory is.
TEST_F(Hostile, EveryListeningSocketIsAccountedFor) {
  const pid_t pid = server_.process->pid();
  const auto tcp = TcpListenersOf(pid);
  const auto unix_sockets = AbstractSocketsOf(pid);
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(util::ParseHostPort(server_.address, &host, &port).ok());
  std::ostringstream list;
  bool remem_port = false;
  for (const TcpListener& l : tcp) {
    list << " tcp " << l.Address();
    if (l.Address() == server_.address) remem_port = true;
    // Nothing on a wildcard or another interface than --listen.
    EXPECT_EQ(l.ip, host) << "a port on another interface: " << l.Address();
  }
  for (const std::string& u : unix_sockets) list << " unix @" << u;
  std::printf("remem-server (%s) listens on:%s\n",
              std::string(TransportName(TestTransport())).c_str(),
              list.str().c_str());
  EXPECT_TRUE(remem_port) << list.str();
  if (ExpectUcxTcp()) {
    EXPECT_GE(tcp.size(), 2u) << "no UCX tcp port:" << list.str();
  } else {
    EXPECT_EQ(tcp.size(), 1u) << "UCX tcp ports:" << list.str();
  }
  EXPECT_EQ(!unix_sockets.empty(), ExpectSharedMemory()) << list.str();
}

// The remem port refuses what is not a remem handshake, with a reason when
// the bytes say enough, and counts each one.
TEST_F(Hostile, RememPortRefusesHostileBytes) {
  std::mt19937_64 rng(20261123);
  struct Case {
    std::string name;
    Probe probe;
    // A refusal whose message contains this; empty: the server closes
    // without a word (the bytes never said enough to answer).
    std::string refusal;
  };
  std::vector<Case> cases = {
      {"17 zero bytes", {Bytes(17, 0)}, "not a remem client"},
      {"1 MiB of zeros", {Bytes(1 << 20, 0)}, "not a remem client"},
      {"5 bytes of 0xff", {Bytes(5, '\xff')}, "not a remem client"},
      {"32 bytes of 0xff", {Bytes(32, '\xff')}, "not a remem client"},
      {"64 KiB of 0xff", {Bytes(65536, '\xff')}, "not a remem client"},
      {"an HTTP request",
       {"GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
       "not a remem client"},
      {"UCX's tcp magic",
       {std::string("\x78\x56\x34\x12\xbe\xba\xfe\xca", 8)},
       "not a remem client"},
      {"3 bytes", {Bytes(3, 0)}, ""},
      {"nothing", {""}, ""},
  };
  for (size_t n : {4, 31, 32, 33, 100, 4096, 65536, 1 << 20}) {
    std::string bytes = Random(rng, n);
    ASSERT_NE(bytes.substr(0, 4), std::string("REMM"));
    cases.push_back(
        {std::to_string(n) + " random bytes", {bytes}, "not a remem client"});
  }
  {
    proto::ClientHello h = Prefix(0, 100);
    h.version = proto::kWireVersion + 1;
    cases.push_back({"another wire version", {Raw(h)}, "wire version"});
    h = Prefix(0, 100);
    h.flags = 1;
    cases.push_back({"unknown flags", {Raw(h)}, "reserved"});
    h = Prefix(0, 100);
    h.reserved[1] = 7;
    cases.push_back({"reserved bytes", {Raw(h)}, "reserved"});
    cases.push_back(
        {"a 4 GiB secret", {Raw(Prefix(0xffffffffu, 100))}, "secret of"});
    cases.push_back({"a secret just over the limit",
                     {Raw(Prefix(proto::kMaxSecretBytes + 1, 100))},
                     "secret of"});
    cases.push_back(
        {"a 4 GiB address", {Raw(Prefix(0, 0xffffffffu))}, "worker address"});
    cases.push_back({"an address just over the limit",
                     {Raw(Prefix(0, proto::kMaxWorkerAddressBytes + 1))},
                     "worker address"});
    cases.push_back(
        {"an empty address", {Raw(Prefix(0, 0))}, "worker address"});
    cases.push_back({"a prefix then a stream",
                     {Raw(Prefix(16, 16)) + Bytes(1 << 20, 'x')},
                     "malformed UCX worker address"});
  }
  // Every truncation of a valid handshake, then EOF: nothing to answer.
  LocalWorker worker;
  const std::string valid = Hello(worker.address());
  ASSERT_GT(valid.size(), sizeof(proto::ClientHello));
  for (size_t n = 1; n < valid.size(); ++n) {
    cases.push_back({"the first " + std::to_string(n) + " of " +
                         std::to_string(valid.size()) + " bytes",
                     {valid.substr(0, n)},
                     ""});
  }
  const uint64_t failures = Stat("handshake_failures");
  const uint64_t auth = Stat("auth_failures");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Answer a = Throw(server_.address, c.probe);
    ASSERT_TRUE(a.connected);
    EXPECT_TRUE(a.closed) << "the server kept the connection";
    if (c.refusal.empty()) {
      EXPECT_TRUE(a.received.empty()) << a.received.size() << " bytes";
    } else {
      ASSERT_TRUE(a.hello.has_value())
          << "no refusal (" << a.received.size() << " bytes)";
      EXPECT_FALSE(a.hello->status.ok());
      EXPECT_NE(a.hello->status.message().find(c.refusal), std::string::npos)
          << a.hello->status.ToString();
    }
  }
  EXPECT_EQ(WaitForStat("handshake_failures", failures + cases.size()),
            failures + cases.size());
  EXPECT_EQ(Stat("auth_failures"), auth);
  ExpectServing("hostile bytes");
}

// A valid prefix then silence is refused at the handshake timeout, and so is
// a client too slow to finish; a slow client that finishes in time is
// served.
TEST_F(Hostile, SilenceAndSlowTrickle) {
  LocalWorker worker;
  const std::string valid = Hello(worker.address());
  const uint64_t failures = Stat("handshake_failures");
  for (const std::string& bytes :
       {Raw(Prefix(0, uint32_t(worker.address().size()))), std::string(),
        Raw(Prefix(0, proto::kMaxWorkerAddressBytes)),
        valid.substr(0, valid.size() - 1)}) {
    Probe p{bytes, Probe::kKeepOpen};
    Answer a = Throw(server_.address, p);
    ASSERT_TRUE(a.hello.has_value()) << a.received.size() << " bytes";
    EXPECT_EQ(a.hello->status.code(), StatusCode::kTimedOut)
        << a.hello->status.ToString();
    EXPECT_GE(a.ms, kHandshakeTimeoutMs * 0.9);
    EXPECT_LT(a.ms, kHandshakeTimeoutMs + 3000.0);
  }
  // Slower than the timeout: one byte every 10 ms.
  {
    Probe p{valid, Probe::kKeepOpen, milliseconds(10)};
    ASSERT_GT(valid.size() * 10, size_t(kHandshakeTimeoutMs) * 2);
    Answer a = Throw(server_.address, p);
    ASSERT_TRUE(a.hello.has_value());
    EXPECT_EQ(a.hello->status.code(), StatusCode::kTimedOut);
  }
  EXPECT_EQ(WaitForStat("handshake_failures", failures + 5), failures + 5);
  // Slow but in time: the first 40 bytes one by one, then the rest; the
  // server admits the session (and releases it when the socket closes).
  {
    const uint64_t sessions = Stat("connections_total");
    auto sock =
        util::Connect(server_.address, Clock::now() + milliseconds(5000));
    ASSERT_TRUE(sock.ok());
    const auto deadline = Clock::now() + milliseconds(5000);
    for (size_t i = 0; i < 40; ++i) {
      ASSERT_TRUE(util::SendAll(sock->fd(), valid.substr(i, 1), deadline).ok());
      std::this_thread::sleep_for(milliseconds(2));
    }
    ASSERT_TRUE(util::SendAll(sock->fd(), valid.substr(40), deadline).ok());
    std::string prefix, rest;
    ASSERT_TRUE(util::RecvExact(sock->fd(), sizeof(proto::ServerHello), &prefix,
                                deadline)
                    .ok());
    proto::ServerHello h;
    auto body = proto::DecodeServerHelloPrefix(prefix, &h);
    ASSERT_TRUE(body.ok());
    ASSERT_TRUE(util::RecvExact(sock->fd(), *body, &rest, deadline).ok());
    auto hello = proto::DecodeServerHello(prefix + rest);
    ASSERT_TRUE(hello.ok());
    EXPECT_TRUE(hello->status.ok()) << hello->status.ToString();
    EXPECT_EQ(WaitForStat("connections_total", sessions + 1), sessions + 1);
  }
  ExpectServing("silence and trickles");
}

// Hundreds of hostile connections at once, of every kind above plus
// connect-and-close and connect-and-reset: every one ends, is counted once,
// and the server serves on.
TEST_F(Hostile, ManyHostileConnectionsAtOnce) {
  std::mt19937_64 rng(7);
  LocalWorker worker;
  const std::string valid = Hello(worker.address());
  std::vector<Probe> probes;
  for (int i = 0; i < 240; ++i) {
    switch (i % 8) {
      case 0:
        probes.push_back({Bytes(17, 0)});
        break;
      case 1:
        probes.push_back({Random(rng, 1 + rng() % 5000)});
        break;
      case 2:
        probes.push_back({Bytes(1 + rng() % 5000, '\xff')});
        break;
      case 3:
        probes.push_back({Raw(Prefix(0xffffffffu, 0xffffffffu))});
        break;
      case 4:
        probes.push_back({valid.substr(0, rng() % valid.size())});
        break;
      case 5:
        probes.push_back({"", Probe::kHalfClose});
        break;
      case 6:
        probes.push_back({Random(rng, rng() % 64), Probe::kReset});
        break;
      case 7:
        probes.push_back({Raw(Prefix(0, 64)) + Random(rng, 64)});
        break;
    }
  }
  // A few that only go silent (refused at the timeout).
  for (int i = 0; i < 8; ++i) probes.push_back({Bytes(8, 0), Probe::kKeepOpen});
  for (int i = 0; i < 8; ++i) {
    probes.push_back({valid.substr(0, 20), Probe::kKeepOpen});
  }
  const uint64_t failures = Stat("handshake_failures");
  std::atomic<int> unconnected{0};
  std::vector<std::thread> threads;
  for (const Probe& p : probes) {
    threads.emplace_back([&, p] {
      if (!Throw(server_.address, p).connected) ++unconnected;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(unconnected.load(), 0);
  EXPECT_EQ(WaitForStat("handshake_failures", failures + probes.size()),
            failures + probes.size());
  ExpectServing("many at once");
}

// The worker address is the one part of the handshake that goes on to UCX:
// malformed ones, and ones naming memory that is not the client's, are
// refused before UCX sees them.
TEST_F(Hostile, HostileWorkerAddressesAreRefused) {
  std::mt19937_64 rng(99);
  LocalWorker worker;
  const std::string real = worker.address();
  auto parsed = fabric::ParseWorkerAddress(real);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const uint64_t failures = Stat("handshake_failures");
  size_t sent = 0;
  auto expect_refused = [&](const std::string& address,
                            const char* why) -> Status {
    Answer a = Throw(server_.address, {Hello(address)});
    ++sent;
    EXPECT_TRUE(a.hello.has_value()) << why;
    if (!a.hello.has_value()) return Status::Internal("no answer");
    EXPECT_FALSE(a.hello->status.ok()) << why;
    return a.hello->status;
  };
  // Random bytes of every size class.
  for (size_t n : {1, 2, 8, 16, 64, 145, 300, 4096, 65536}) {
    for (int i = 0; i < 4; ++i) {
      Status st = expect_refused(Random(rng, n), "random");
      EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.ToString();
    }
  }
  // Every truncation and a byte appended.
  for (size_t n = 1; n < real.size(); ++n) {
    Status st = expect_refused(real.substr(0, n), "truncated");
    EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st.ToString();
  }
  EXPECT_EQ(expect_refused(real + "x", "one byte more").code(),
            StatusCode::kProtocolError);
  // Bit flips: refused, or (when the flip leaves a well-formed address)
  // refused or served as UCX decides; either way the server lives.
  for (int i = 0; i < 200; ++i) {
    std::string a = real;
    for (int k = 0; k < 1 + int(rng() % 4); ++k) {
      a[rng() % a.size()] ^= char(1u << (rng() % 8));
    }
    Answer ans = Throw(server_.address, {Hello(a), Probe::kAwaitHello});
    ASSERT_TRUE(ans.hello.has_value()) << ans.received.size() << " bytes";
    if (!ans.hello->status.ok()) ++sent;  // a refusal is a failed handshake
  }
  // Shared memory that is not the client's: the server's own process, or a
  // process that did not open the connection.
  for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
    auto ref = fabric::SharedMemoryRefOf(e);
    if (!ref.ok()) continue;
    const size_t at = size_t(e.iface_address.data() - real.data());
    auto with_pid = [&](int pid) {
      std::string a = real;
      if (ref->posix) {
        uint64_t seg;
        std::memcpy(&seg, a.data() + at, 8);
        seg = (seg & ~((1ull << 30) - 1)) | uint64_t(pid);
        std::memcpy(a.data() + at, &seg, 8);
      } else {
        uint32_t id;
        std::memcpy(&id, a.data() + at, 4);
        id = (id & (1u << 31)) | uint32_t(pid);
        std::memcpy(a.data() + at, &id, 4);
      }
      return a;
    };
    Status own = expect_refused(with_pid(server_.process->pid()), "own pid");
    EXPECT_EQ(own.code(), StatusCode::kPermissionDenied) << own.ToString();
    Status other = expect_refused(with_pid(getppid()), "another process");
    EXPECT_EQ(other.code(), StatusCode::kPermissionDenied) << other.ToString();
    // A process that is gone (a client that gave up waiting before the
    // server read its handshake): refused as such, not as an intruder.
    int dead = 4000000;
    while (dead > 2 && !(::kill(dead, 0) != 0 && errno == ESRCH)) --dead;
    Status gone = expect_refused(with_pid(dead), "a process that exited");
    EXPECT_EQ(gone.code(), StatusCode::kUnavailable) << gone.ToString();
    EXPECT_NE(gone.message().find("exited before its handshake was read"),
              std::string::npos)
        << gone.ToString();
  }
  if (TestTransport() == Transport::kShm) {
    EXPECT_NE(parsed->ifaces.size(), 0u);
  }
  EXPECT_EQ(WaitForStat("handshake_failures", failures + sent),
            failures + sent);
  ExpectServing("worker addresses");
}

// A client that lives on and tries again on a new connection (its
// handshake timed out while the server was paused): the first connection's
// handshake, read after it was closed, is refused as given up, not as
// another process's (that warning read like an intrusion; found black-box).
// A fresh server: its first refusal is logged as a warning.
TEST(HostileRetry, AHandshakeItsClientGaveUpOnIsRefusedAsSuch) {
  if (TestTransport() != Transport::kShm) {
    GTEST_SKIP() << "only a shared-memory address names the client's process";
  }
  const std::string log_path = ::testing::TempDir() + "/hostile-retry-" +
                               std::to_string(::getpid()) + ".log";
  auto server = StartServer({"--log-file", log_path});
  ASSERT_NE(server.process, nullptr);
  auto observer = ConnectOrDie(server.address);
  ASSERT_TRUE(observer);
  auto failures = [&] {
    auto st = observer->Stats();
    return st.ok() ? st->Get("handshake_failures") : ~uint64_t{0};
  };
  const uint64_t before = failures();
  LocalWorker worker;
  ASSERT_TRUE(server.process->Signal(SIGSTOP).ok());
  ASSERT_TRUE(testing::AllThreadsStopped(server.process->pid()));
  {
    const auto deadline = Clock::now() + milliseconds(5000);
    auto sock = util::Connect(server.address, deadline);
    ASSERT_TRUE(sock.ok()) << sock.status().ToString();
    ASSERT_TRUE(
        util::SendAll(sock->fd(), Hello(worker.address()), deadline).ok());
  }
  ASSERT_TRUE(server.process->Signal(SIGCONT).ok());
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (failures() == before && Clock::now() < until) {
    std::this_thread::yield();
  }
  EXPECT_EQ(failures(), before + 1);
  std::ifstream in(log_path);
  const std::string log{std::istreambuf_iterator<char>(in), {}};
  EXPECT_NE(log.find("closed this connection before its handshake was "
                     "read: it gave up waiting"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("which is not the process that connected"),
            std::string::npos)
      << log;
  std::remove(log_path.c_str());
}

// Bytes on an authenticated session's own TCP connection end that session
// and no other.
TEST_F(Hostile, BytesAfterTheHandshakeEndOnlyThatSession) {
  auto raw =
      testing::RawSession::Connect(server_.address, TestTransport(), Secret());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto other = ConnectHashOrDie(server_.address, Secret());
  ASSERT_TRUE(other);
  ASSERT_TRUE(other->Put("other", "fine").ok());
  EXPECT_EQ(WaitForStat("connections_current", base_ + 2), base_ + 2);
  const std::string garbage = Bytes(1000, '\xff');
  ASSERT_TRUE(util::SendAll((*raw)->socket_fd(), garbage,
                            Clock::now() + milliseconds(5000))
                  .ok());
  // The server closes that session's socket...
  {
    pollfd p{(*raw)->socket_fd(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);
    char c;
    const ssize_t n = recv((*raw)->socket_fd(), &c, 1, 0);
    // A close, or a reset (the server did not read all of the garbage).
    EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET))
        << n << " " << std::strerror(errno);
  }
  // ...and drops its endpoint; the other session is untouched.
  EXPECT_EQ(WaitForStat("connections_current", base_ + 1), base_ + 1);
  auto v = other->Get("other");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->value, "fine");
  raw->reset();
  other = {};
  ExpectServing("bytes after the handshake");
}

// This process's sockets connected to the server's listening port: the
// sessions' own TCP connections (UCX's connections go to other ports).
std::set<int> SessionSocketsTo(const std::string& address) {
  const uint16_t port =
      uint16_t(std::stoi(address.substr(address.rfind(':') + 1)));
  std::set<int> fds;
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_storage a{};
    socklen_t n = sizeof(a);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) continue;
    uint16_t peer = 0;
    if (a.ss_family == AF_INET) {
      peer = ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    } else if (a.ss_family == AF_INET6) {
      peer = ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
    }
    if (peer == port) fds.insert(fd);
  }
  return fds;
}

// A session whose socket the server closed while it lives on (bytes after
// the handshake here; a middlebox that drops the connection does the same)
// fails its next operation with Unavailable at once, whichever path it
// takes. A get served one-sided over tcp waited in the endpoint for its
// whole timeout and then said TimedOut (found black-box).
TEST_F(Hostile, ASessionWhoseSocketTheServerClosedFailsAtOnce) {
  for (ReadPath path : {ReadPath::kOneSided, ReadPath::kRpc}) {
    SCOPED_TRACE(std::string(ReadPathName(path)));
    const std::set<int> before = SessionSocketsTo(server_.address);
    auto c = ConnectHashOrDie(server_.address, Secret(), path);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Put("k", "v").ok());
    std::vector<int> fresh;
    for (int fd : SessionSocketsTo(server_.address)) {
      if (!before.contains(fd)) fresh.push_back(fd);
    }
    ASSERT_EQ(fresh.size(), 1u);
    EXPECT_EQ(WaitForStat("connections_current", base_ + 1), base_ + 1);
    ASSERT_TRUE(
        util::SendAll(fresh[0], "\x01", Clock::now() + milliseconds(5000))
            .ok());
    EXPECT_EQ(WaitForStat("connections_current", base_), base_);
    // The session looks at its socket every 10 ms (session.h): until then
    // a get over shared memory may still read the live server's memory.
    const auto start = Clock::now();
    Status st;
    while (Clock::now() - start < milliseconds(2000)) {
      auto v = c->Get("k");
      if (!v.ok()) {
        st = v.status();
        break;
      }
      EXPECT_EQ(v->value, "v");
    }
    EXPECT_LT(Clock::now() - start, milliseconds(1000));
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.ToString().find("closed the session"), std::string::npos)
        << st.ToString();
  }
  ExpectServing("sessions closed by the server");
}

// A server that has run out of open files says so to the client it cannot
// take, and serves again once descriptors are free: it sent the client to
// check its --transport and UCX_NET_DEVICES (found black-box).
TEST_F(Hostile, AServerOutOfOpenFilesSaysSoAndRecovers) {
  if (TransportName(TestTransport()) != "tcp") {
    GTEST_SKIP() << "tcp endpoints each take a descriptor";
  }
  if (testing::kSanitized) {
    // Their runtimes need descriptors of their own (UBSan's check that
    // memory is readable writes to a pipe) and report falsely in a server
    // that has none left.
    GTEST_SKIP() << "a sanitized server misreports without descriptors";
  }
  const pid_t pid = server_.process->pid();
  std::set<long> fds;
  for (const auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    fds.insert(std::stol(e.path().filename().string()));
  }
  // The limit at the second free number: one descriptor can be made (the
  // session's socket takes it), and UCX's endpoint finds none.
  long limit = 0;
  for (int gaps = 0; gaps < 2; ++limit) {
    if (!fds.contains(limit) && ++gaps == 2) break;
  }
  rlimit old{};
  ASSERT_EQ(::prlimit(pid, RLIMIT_NOFILE, nullptr, &old), 0);
  const rlimit tight{rlim_t(limit), old.rlim_max};
  ASSERT_EQ(::prlimit(pid, RLIMIT_NOFILE, &tight, nullptr), 0);
  SessionOptions o;
  o.server = server_.address;
  o.transport = TestTransport();
  o.secret = Secret();
  o.timeout = milliseconds(3000);
  auto refused = Session::Connect(o);
  ASSERT_EQ(::prlimit(pid, RLIMIT_NOFILE, &old, nullptr), 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("run out of open files"),
            std::string::npos)
      << refused.status().ToString();
  ExpectServing("out of open files");
}

// A client worker whose handshakes the server admitted but that never made
// its own endpoint (it gave up at its deadline: the server was paused, or
// slow) still gets sessions afterwards. UCX pairs the two sides' endpoints
// between two workers by how many each side has created: without the
// server's count in the hello, every later session of that worker would be
// paired with the endpoint of an abandoned one, and its messages dropped
// (the stuck re-replication of long fault runs).
TEST_F(Hostile, HandshakesAbandonedAfterTheServersHelloLeaveTheWorkerUsable) {
  auto loop = EventLoop::Create(TestTransport());
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  const std::string address = (*loop)->core()->worker()->address();
  const uint64_t stray = Stat("stray_messages");
  for (int i = 0; i < 3; ++i) {
    Probe p;
    p.bytes = Hello(address, Secret());
    p.ending = Probe::kAwaitHello;
    // Admitted (the server made its endpoint), then dropped: the socket
    // closes when Throw returns.
    const Answer a = Throw(server_.address, p);
    ASSERT_TRUE(a.hello.has_value()) << a.received.size();
    ASSERT_TRUE(a.hello->status.ok()) << a.hello->status.ToString();
  }
  SessionOptions o;
  o.server = server_.address;
  o.transport = TestTransport();
  o.secret = Secret();
  o.timeout = std::chrono::seconds(5);
  for (int i = 0; i < 2; ++i) {
    auto s = Session::Connect(o, loop->get());
    ASSERT_TRUE(s.ok()) << "session " << i << ": " << s.status().ToString();
    EXPECT_TRUE((*s)->Ping().ok());
  }
  EXPECT_EQ(Stat("stray_messages"), stray);
  ExpectServing("abandoned handshakes");
}

// UCX's own tcp ports (tcp enabled): what does not pass UCX's magic number
// is dropped by UCX, and the server serves on. Only where tcp is enabled.
TEST_F(Hostile, UcxTcpPortsDropWhatIsNotUcx) {
  const auto ports = UcxTcpPorts();
  if (!ExpectUcxTcp()) {
    EXPECT_TRUE(ports.empty());
    GTEST_SKIP() << "no UCX tcp port on a " << TransportName(TestTransport())
                 << " server on " << server_.address;
  }
  ASSERT_FALSE(ports.empty());
  std::mt19937_64 rng(5);
  const std::string magic("\x78\x56\x34\x12\xbe\xba\xfe\xca", 8);
  for (const TcpListener& port : ports) {
    SCOPED_TRACE(port.Address());
    std::vector<Probe> probes = {
        {Bytes(8, 0)},
        {Bytes(17, 0)},
        {Bytes(1 << 20, 0)},
        {Bytes(8, '\xff')},
        {Bytes(65536, '\xff')},
        {magic.substr(0, 7)},
        {""},
        {Random(rng, 3), Probe::kReset},
    };
    for (size_t n : {1, 8, 9, 100, 4096, 65536}) {
      std::string r = Random(rng, n);
      if (r.size() >= 8) {
        ASSERT_NE(r.substr(0, 8), magic);
      }
      probes.push_back({r});
    }
    for (const Probe& p : probes) {
      Answer a = Throw(port.Address(), p, milliseconds(3000));
      EXPECT_TRUE(a.connected);
    }
    std::vector<std::thread> many;
    for (int i = 0; i < 100; ++i) {
      const Probe p{Random(rng, 1 + rng() % 2000),
                    i % 3 == 0 ? Probe::kReset : Probe::kHalfClose};
      many.emplace_back(
          [&, p] { (void)Throw(port.Address(), p, milliseconds(3000)); });
    }
    for (auto& t : many) t.join();
    ASSERT_TRUE(server_.process->running());
  }
  ExpectServing("UCX tcp ports");
}

// Sends datagrams of every size, empty ones included, to each abstract unix
// socket `pid` holds; returns how many went out.
int SendDatagrams(pid_t pid, std::mt19937_64& rng) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  EXPECT_GE(fd, 0);
  int sent = 0;
  for (const std::string& name : AbstractSocketsOf(pid)) {
    sockaddr_un to{};
    to.sun_family = AF_UNIX;
    if (name.size() + 1 >= sizeof(to.sun_path)) continue;
    std::memcpy(to.sun_path + 1, name.data(), name.size());
    const socklen_t len =
        socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    for (size_t size : {0, 0, 0, 1, 8, 4096, 60000}) {
      const std::string d = Random(rng, size);
      if (sendto(fd, d.data(), d.size(), 0,
                 reinterpret_cast<const sockaddr*>(&to), len) >= 0) {
        ++sent;
      }
    }
  }
  close(fd);
  return sent;
}

// UCX's shared-memory signal sockets (abstract unix sockets any local user
// can write to): datagrams of any size, including empty ones, which UCX
// 1.13 took for a closed peer and aborted on when the interface was idle
// (fabric/context.h). First against a server that never had a session (its
// interface idle), then against one serving a session.
TEST_F(Hostile, SharedMemorySignalSocketsSurviveDatagrams) {
  if (!ExpectSharedMemory()) {
    EXPECT_TRUE(AbstractSocketsOf(server_.process->pid()).empty());
    GTEST_SKIP() << "no shared-memory transport on this server";
  }
  std::mt19937_64 rng(11);
  {
    std::vector<std::string> extra;
    if (const char* listen = std::getenv("REMEM_HOSTILE_LISTEN")) {
      extra = {"--listen", listen};
    }
    testing::ServerProcess idle = StartServer(extra);
    ASSERT_NE(idle.process, nullptr);
    ASSERT_FALSE(AbstractSocketsOf(idle.process->pid()).empty());
    EXPECT_GT(SendDatagrams(idle.process->pid(), rng), 0);
    // Its first session wakes the thread that sleeps on those sockets.
    auto c = ConnectHashOrDie(idle.address);
    ASSERT_TRUE(c) << "the idle server died";
    ASSERT_TRUE(c->Put("k", "v").ok());
    EXPECT_TRUE(idle.process->running());
  }
  // The socket's queue holds 10 datagrams (net.unix.max_dgram_qlen); what
  // does not fit is refused to the sender, so count what went out.
  int sent = 0;
  for (int round = 0; round < 3; ++round) {
    sent += SendDatagrams(server_.process->pid(), rng);
    EXPECT_TRUE(observer_->Ping().ok());
  }
  EXPECT_GT(sent, 0);
  ExpectServing("datagrams");
}

// The worker address parser reads what this UCX packs, for every transport:
// the checksums UCX names transports by, the uuid, and for shared memory
// this process's own pid.
TEST(WorkerAddressParser, ReadsTheAddressesThisUcxPacks) {
  EXPECT_EQ(fabric::UcxTransportChecksum("tcp"), 0x19cf);
  EXPECT_EQ(fabric::UcxTransportChecksum("posix"), 0xd3a7);
  EXPECT_EQ(fabric::UcxTransportChecksum("cma"), 0x8b47);
  EXPECT_EQ(fabric::UcxTransportChecksum("self"), 0x7563);
  for (Transport t : {Transport::kShm, Transport::kTcp, Transport::kAuto}) {
    SCOPED_TRACE(std::string(TransportName(t)));
    auto ctx = fabric::Context::Shared(t);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    auto w = fabric::Worker::Create(*ctx, proto::kMaxRpcPayload);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const std::string a = (*w)->address();
    auto parsed = fabric::ParseWorkerAddress(a);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_TRUE(parsed->has_uuid);
    EXPECT_NE(parsed->uuid, 0u);
    EXPECT_FALSE(parsed->ifaces.empty());
    size_t shm = 0;
    for (const auto& e : parsed->ifaces) {
      auto ref = fabric::SharedMemoryRefOf(e);
      if (!ref.ok()) continue;
      ++shm;
      EXPECT_EQ(ref->pid, getpid());
      if (ref->posix) {
        EXPECT_TRUE(ref->procfs);
        EXPECT_GE(ref->fd, 0);
      }
    }
    EXPECT_EQ(shm > 0, t != Transport::kTcp);
  }
}

// The same handshake attacks against a server with a secret: the secret is
// checked before the address, and wrong ones are counted as such.
class HostileWithSecret : public Hostile {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/hostile-secret-" + std::to_string(getpid());
    std::system(("mkdir -p " + dir_).c_str());
    std::ofstream(dir_ + "/secret") << "s3cret";
    Hostile::SetUp();
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::vector<std::string> ExtraFlags() const override {
    return {"--auth-file", dir_ + "/secret"};
  }
  std::string Secret() const override { return "s3cret"; }
  std::string dir_;
};

TEST_F(HostileWithSecret, WrongSecretsAreRefusedBeforeTheAddress) {
  std::mt19937_64 rng(3);
  LocalWorker worker;
  const uint64_t auth = Stat("auth_failures");
  const uint64_t failures = Stat("handshake_failures");
  const std::vector<std::string> secrets = {"", "s3cre", "s3cret\n", "S3CRET",
                                            Random(rng, 4096)};
  for (const std::string& s : secrets) {
    // A garbage address behind a wrong secret: refused for the secret.
    Answer a = Throw(server_.address, {Hello(Random(rng, 100), s)});
    ASSERT_TRUE(a.hello.has_value());
    EXPECT_EQ(a.hello->status.code(), StatusCode::kPermissionDenied)
        << a.hello->status.ToString();
  }
  // The right secret with a garbage address: refused for the address.
  Answer a = Throw(server_.address, {Hello(Random(rng, 100), "s3cret")});
  ASSERT_TRUE(a.hello.has_value());
  EXPECT_EQ(a.hello->status.code(), StatusCode::kProtocolError);
  EXPECT_EQ(WaitForStat("auth_failures", auth + secrets.size()),
            auth + secrets.size());
  EXPECT_EQ(Stat("handshake_failures"), failures + 1);
  ExpectServing("secrets");
}

// The whole suite again, inside a network namespace where the server
// listens on a non-loopback address (so UCX's tcp ports, where enabled, are
// on that interface too), with --transport tcp or auto.
TEST(HostileNonLoopback, TheSuiteInANetworkNamespace) {
  if (std::getenv("REMEM_HOSTILE_LISTEN") != nullptr) {
    GTEST_SKIP() << "already inside the namespace";
  }
  const std::string id = std::to_string(getpid() % 100000);
  const std::string ns = "remem-h-" + id, a = "rha" + id, b = "rhb" + id;
  auto sh = [](const std::string& cmd) { return std::system(cmd.c_str()); };
  if (sh("ip netns add " + ns + " 2>/dev/null") != 0) {
    GTEST_SKIP() << "cannot create network namespaces here (needs root and "
                    "iproute2)";
  }
  struct Cleanup {
    std::string ns;
    ~Cleanup() { std::system(("ip netns del " + ns + " 2>/dev/null").c_str()); }
  } cleanup{ns};
  // One veth pair inside the namespace, an address on one end only, no IPv6
  // (its link-local addresses would be unroutable UCX devices).
  for (const std::string& cmd :
       {"ip link add " + a + " type veth peer name " + b,
        "ip link set " + a + " netns " + ns,
        "ip link set " + b + " netns " + ns,
        "ip netns exec " + ns + " sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
        "ip netns exec " + ns +
            " sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
        "ip -n " + ns + " addr add 198.18.0.1/30 dev " + a,
        "ip -n " + ns + " link set " + a + " up",
        "ip -n " + ns + " link set " + b + " up",
        "ip -n " + ns + " link set lo up"}) {
    ASSERT_EQ(sh(cmd), 0) << cmd;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = 0;
  // The shm run checks --transport auto there: shared memory and UCX's tcp
  // ports on one server, the most exposed configuration.
  const std::string inner = TestTransport() == Transport::kShm ? "auto" : "tcp";
  auto r = testing::RunCommand(
      {"ip", "netns", "exec", ns, self, "--gtest_filter=Hostile*.*"},
      {{"REMEM_HOSTILE_LISTEN", "198.18.0.1:0"},
       {"REMEM_TEST_TRANSPORT", inner}},
      240);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("listens on: tcp 198.18.0.1:"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace remem
