// server::Acceptor: remem-server's listening port. It speaks only remem's
// own small handshake (ClientHello / ServerHello, proto/wire.h), so nothing
// a network peer sends before authenticating reaches UCX's parsers:
//
//   1. a client connects over TCP and sends ClientHello: its wire version,
//      the shared secret, its UCX worker address;
//   2. the acceptor checks the bytes (magic, lengths, version) as they
//      arrive, refusing at once anything foreign or oversized, then the
//      secret (constant time), then the UCX worker address: its form and
//      what it names (client_address.h), so that no bytes from the network
//      reach UCX's own parser unchecked;
//   3. it hands the session to a server thread, which creates a UCX
//      endpoint to the client's worker and adopts the connection
//      (Dispatcher::AddConnection_st);
//   4. it answers ServerHello with that thread's worker address and the
//      number UCX gave the server's endpoint; the client creates its
//      endpoint to it with the same number, and UCX joins the two.
//
// The TCP connection then stays open, silent, for the life of the session:
// when the client process dies its kernel closes the socket and the server
// releases the session at once (and the other way round). Bytes sent on it
// after the handshake end the session.
//
// Every refusal carries a reason (ServerHello status + message): bad bytes,
// wrong version, wrong secret, a worker address the server will not use,
// too many connections, a handshake that took longer than the timeout, a
// client the server's transports cannot reach. Every accepted connection is
// counted once when it ends without a session: handshake_failures,
// auth_failures or refused_busy.
//
// Resources: at most max_connections sessions and handshakes together, at
// most max_pending handshakes; a handshake has handshake_timeout from the
// accept for the client to send its whole hello (a hello that arrived in
// time counts even if the acceptor, busy with other peers, reads it later).
// When the process runs out of file descriptors the acceptor stops accepting
// for a moment (connections wait in the kernel's backlog) instead of spinning
// on the listening socket.
//
// Thread contract: Start, address, counters and SessionClosed are
// thread-safe; the acceptor runs on its own thread.

#ifndef REMEM_SERVER_ACCEPTOR_H_
#define REMEM_SERVER_ACCEPTOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "remem/status.h"
#include "server/client_address.h"
#include "server/hello_reader.h"
#include "server/service.h"
#include "util/socket.h"

namespace remem::server {

struct AcceptorOptions {
  std::string listen;
  std::string secret;
  uint32_t max_connections = 4096;
  // Handshakes in progress at once; more are accepted and refused with Busy
  // (counted in refused_busy).
  uint32_t max_pending = 1024;
  std::chrono::milliseconds handshake_timeout{10000};
  uint64_t incarnation = 0;
  uint32_t server_threads = 1;
  uint32_t lease_ms = 0;
  // Checks the worker address of each client (after the secret).
  ClientAddressCheck address_check;
};

struct AcceptorCounters {
  Counter handshakes;          // completed: sessions admitted
  Counter auth_failures;       // wrong or missing secret
  Counter handshake_failures;  // bad bytes, wrong version, bad address,
                               // timeouts, closed or failed mid-handshake
  Counter refused_busy;        // connection limit reached
  Counter sessions;            // open now
};

class Acceptor {
 public:
  // Called on the acceptor thread: it must create the endpoint to the
  // client's worker and adopt the connection on the chosen server thread,
  // then call `done` (from that thread)
  // with OK, the thread's worker address and the endpoint's number
  // (fabric::Worker::EndpointNumber), or why it could not.
  using AdmitDone = util::MoveFunction<void(Status, std::string, uint64_t)>;
  using AdmitFn =
      std::function<void(uint32_t thread, ConnectionId id, std::string peer,
                         std::string client_address, AdmitDone done)>;
  // Runs on the acceptor thread when a session's socket closed: release
  // the connection on its thread. `goodbye`: the client said it ended the
  // session in order (proto::kSessionGoodbye), so it did not die mid-send.
  using ClosedFn =
      std::function<void(uint32_t thread, ConnectionId id, bool goodbye)>;

  // Binds and listens (connections wait in the kernel's backlog until
  // Start). Unavailable if the address is in use.
  static Result<std::unique_ptr<Acceptor>> Bind(const AcceptorOptions& options,
                                                AdmitFn admit, ClosedFn closed);
  // Starts answering handshakes on the acceptor's own thread.
  Status Start();
  ~Acceptor();  // Stop()

  // The bound "host:port".
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  // Closes the listening socket and every session's socket.
  void Stop();
  // The server released session `id` (its endpoint failed): close its
  // socket so the client sees it at once. Thread-safe.
  void SessionClosed(ConnectionId id);

  const AcceptorCounters& counters() const { return counters_; }

 private:
  struct Peer;
  Acceptor() = default;
  void Run();
  void OnListen();
  void OnReadable(Peer* p);
  void Refuse(Peer* p, Status why);
  void LogRefusal(const std::string& peer, const Status& why);
  void Admit(Peer* p, std::string worker_address);
  void Close(Peer* p, bool goodbye = false);
  void DrainEvents();
  void Notify();
  void ExpireHandshakes();
  // Deadlines: handshakes (kHello) and refusals being read (kClosing).
  void SetDeadline(Peer* p, std::chrono::steady_clock::time_point when);
  void ClearDeadline(Peer* p);
  void PauseListening();

  AcceptorOptions options_;
  AdmitFn admit_;
  ClosedFn closed_;
  util::Socket listen_;
  int epoll_ = -1;
  int event_fd_ = -1;
  std::string address_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint32_t> next_thread_{0};
  std::atomic<uint64_t> next_id_{1};
  // Acceptor thread only.
  std::unordered_map<int, std::unique_ptr<Peer>> peers_;
  std::unordered_map<ConnectionId, Peer*> sessions_;
  std::multimap<std::chrono::steady_clock::time_point, Peer*> deadlines_;
  uint32_t pending_ = 0;
  std::chrono::steady_clock::time_point last_refusal_log_{};
  uint64_t quiet_refusals_ = 0;
  // Out of file descriptors: accepting resumes at this time.
  std::chrono::steady_clock::time_point listen_paused_until_{};
  // From other threads, under mu_.
  struct Event {
    ConnectionId id;
    bool admitted;  // else: the session was closed by the server
    Status status;
    std::string worker_address;
    uint64_t endpoint_number = 0;
  };
  std::mutex mu_;
  std::vector<Event> events_;
  AcceptorCounters counters_;
};

}  // namespace remem::server

#endif  // REMEM_SERVER_ACCEPTOR_H_
