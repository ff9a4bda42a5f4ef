// Copyright remem authors.
//
// remem::Session: a connection from this thread to one remem-server, and
// remem::EventLoop, the UCX worker that one client thread's sessions share.
//
// Connect opens remem's handshake over TCP (protocol version, the optional
// shared secret), then joins a UCX connection to the server thread that
// will serve the session and receives the server's exported regions with
// their remote keys. From then on the session can
//   - read and write raw server memory one-sided (Read, Write,
//     CompareAndSwap, FetchAdd): over shared memory these are copies and CPU
//     atomics done by this process, with no work by the server; over tcp
//     the server performs them on request (served one-sided operations);
//   - make calls to the server (Ping, Stats, Echo, TakeSnapshot);
//   - carry the data models: each is a class of its own attached to a
//     session, using its connection (each in its own header).
// Every call exists in two styles:
//   - synchronous: returns when done, or with TimedOut after
//     SessionOptions::timeout;
//   - asynchronous (*Async): returns at once; the callback runs on this
//     thread inside a later Poll()/WaitAll(), never inside the call that
//     issued it. Anything else that progresses the session may run it
//     too: a later synchronous call, and over tcp a later asynchronous one
//     that reads one-sided in the call. Any number may be in flight;
//     buffers passed to an async call must stay valid until its callback
//     runs.
//
// Liveness: memory this process has mapped stays readable after the server
// died, so a one-sided read alone proves nothing about the present. A value
// read one-sided is returned only while the server's lease vouches for it
// (the server renews it every lease/10; SessionOptions has no say, the
// server's --lease-ms does, default 1 s). Past the lease a one-sided value
// is never returned: a store's read asks the server instead (by RPC: a
// paused server's answer times out, TimedOut), and a raw one-sided read
// (Session::Read) fails with Unavailable. Once the session's TCP
// connection closes (the server died or stopped), every operation fails
// with Unavailable. So one-sided values are returned from a server that is
// gone only until the client sees its connection close (a few milliseconds
// on the same host; the session looks at it at most every 10 ms), and
// never past its lease, nor from a predecessor after a restarted server
// has acknowledged a write (a restarted server waits the old lease out
// first). Reconnect with a new Session.
//
// Failure: if the server stops or the connection breaks, every outstanding
// and later operation completes with Unavailable (never a hang). Each RPC
// has its own deadline (SessionOptions::timeout) and times out alone; an
// answer that came in time and is read late (this thread was busy in a
// callback, or not polling) is not late: the call succeeds. A
// one-sided operation cannot be cancelled: a synchronous one that times
// out, an asynchronous one that the server performs (over tcp, served)
// and that waited the timeout, or a WaitAll() that waits twice the timeout
// with no answer from the server (counted from its last one: a batch
// whose parts go as earlier ones answer may take longer in all), tears the
// connection down (the one that timed out says TimedOut, everything else
// outstanding and later Unavailable). Other asynchronous one-sided
// operations (shared memory, RDMA) have no deadline of their own.
//
// A dead peer on a shared EventLoop (shared memory): UCX receives every
// server's messages to one loop through one queue, in order, and a server
// killed while sending to it can block that queue for good (a UCX
// limitation; docs/ARCHITECTURE.md, UCX finding 20). The loop notices
// (half a second after a server of one of its sessions went away, if its
// queue stays blocked) and every session on it then fails with
// Unavailable, saying so:
// EventLoop::stalled() turns true, and new sessions must be connected on a
// new EventLoop (Session::Connect refuses this one). A Session with its own
// loop is reconnected with a new Session anyway. remem::Cluster does this
// by itself.
//
// Thread contract: a Session, its stores and its EventLoop are
// single-threaded: call them from one thread (any one, but one at a time;
// callbacks run on the caller of Poll()). Sessions on one EventLoop share
// its thread. Use one EventLoop (or one Session) per thread for
// parallelism.
//
// Processes: nothing of remem survives fork(). A child must not use its
// parent's sessions, and over tcp a child forked while its parent holds a
// session cannot connect either (UCX's threads do not follow a fork: the
// connect times out); fork before the first session, or exec.

#ifndef REMEM_SESSION_H_
#define REMEM_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"

namespace remem {

namespace client {
class SessionCore;  // what data-model stores build on (src/client)
class LoopCore;
}  // namespace client

// A raw memory region of the server, as exported.
struct RegionInfo {
  uint32_t id = 0;
  uint64_t length = 0;
};

// A location in a server's memory: region id + byte offset. Region ids are
// stable names, so an address stays meaningful whatever the region's virtual
// address on the server.
struct RemoteAddress {
  uint32_t region = 0;
  uint64_t offset = 0;
};

struct PingResult {
  double rtt_us = 0;      // one RPC round trip
  std::string transport;  // what UCX chose, e.g. "shm (posix,cma)"
};

// The server's counters: each service contributes its own, by name
// (README.md lists them; `remem stats` prints them all).
struct Stat {
  std::string name;
  bool is_text = false;
  uint64_t value = 0;  // numbers
  std::string text;    // texts (e.g. fsync_policy)
};
class ServerStats {
 public:
  ServerStats() = default;
  explicit ServerStats(std::vector<Stat> stats) : stats_(std::move(stats)) {}
  // In the server's order.
  const std::vector<Stat>& all() const { return stats_; }
  // The stat named `name`, or null.
  const Stat* Find(std::string_view name) const;
  // The value of a numeric stat, or 0 if there is none by that name.
  uint64_t Get(std::string_view name) const;
  // The text of a stat ("" if none; numbers as decimal).
  std::string Text(std::string_view name) const;

 private:
  std::vector<Stat> stats_;
};

// The UCX worker of one client thread. Sessions created on it share it, so
// one thread can hold sessions to many servers and progress them all with
// one Poll(). A Session created without one gets a private loop.
class EventLoop {
 public:
  static Result<std::unique_ptr<EventLoop>> Create(
      Transport transport = Transport::kAuto);
  // Sessions on the loop must be destroyed first.
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Progresses every session on this loop and runs ready callbacks;
  // returns how many events were handled. Never blocks.
  size_t Poll();

  // True once a server died while sending to this loop and blocked its
  // shared-memory receive queue (above): connect on a new EventLoop.
  bool stalled() const;

  client::LoopCore* core() { return core_.get(); }

 private:
  explicit EventLoop(std::unique_ptr<client::LoopCore> core);
  std::unique_ptr<client::LoopCore> core_;
};

class Session {
 public:
  using Callback = std::function<void(Status)>;
  using ValueCallback = std::function<void(Result<uint64_t>)>;
  using ReplyCallback = std::function<void(Result<std::string>)>;

  // Connects and authenticates. Errors: InvalidArgument (bad address),
  // Unavailable (no server there, or not reachable over the forced
  // transport), PermissionDenied (secret refused), Busy (the server has no
  // room for another connection), ProtocolError (another wire version),
  // TimedOut.
  static Result<std::unique_ptr<Session>> Connect(
      const SessionOptions& options);
  // The same on a shared loop (which must use the same transport and
  // outlive the session).
  static Result<std::unique_ptr<Session>> Connect(const SessionOptions& options,
                                                  EventLoop* loop);
  // Lets outstanding operations finish (at most SessionOptions::timeout;
  // the rest then fail with Unavailable), runs their callbacks, and closes
  // the connection. Stores attached to the session must be destroyed first.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // --- server calls (synchronous)
  Result<PingResult> Ping();
  Result<ServerStats> Stats();
  // Asks the server to snapshot every durable service to its data
  // directory now; returns once the snapshots are on disk. Unsupported when
  // the server runs without persistence.
  Status TakeSnapshot();
  Result<std::string> Echo(std::string_view payload);
  void EchoAsync(std::string payload, ReplyCallback done);

  // --- one-sided operations on raw server memory (synchronous). `len` may
  // be anything inside the region; atomics need 8-byte aligned offsets.
  Status Read(RemoteAddress addr, void* dst, size_t len);
  // Returns when the data is in the server's memory.
  Status Write(RemoteAddress addr, const void* src, size_t len);
  // Atomically: old = *addr; if (old == expected) *addr = desired. Returns old.
  Result<uint64_t> CompareAndSwap(RemoteAddress addr, uint64_t expected,
                                  uint64_t desired);
  // Atomically: old = *addr; *addr += delta. Returns old.
  Result<uint64_t> FetchAdd(RemoteAddress addr, uint64_t delta);

  // --- asynchronous versions
  void ReadAsync(RemoteAddress addr, void* dst, size_t len, Callback done);
  void WriteAsync(RemoteAddress addr, const void* src, size_t len,
                  Callback done);
  void CompareAndSwapAsync(RemoteAddress addr, uint64_t expected,
                           uint64_t desired, ValueCallback done);
  void FetchAddAsync(RemoteAddress addr, uint64_t delta, ValueCallback done);

  // Progresses the session's loop (every session on it) and runs ready
  // callbacks; returns how many events were handled. Never blocks.
  size_t Poll();
  // Polls until every operation issued on this session (and its stores)
  // has completed. Returns the first error seen among them since the last
  // WaitAll, or OK: "first" in the order they completed, which differs by
  // transport, and a single get's NotFound counts (a multi-get reports
  // only its other errors); a caller that expects misses looks at each
  // callback's status instead. A callback may Poll, issue operations, make
  // synchronous calls, or WaitAll: inside a callback, WaitAll returns once
  // every operation has completed but those answered together with the
  // running one (in the same message, or the rest of a batch's), whose
  // callbacks run after it returns. What a callback issued and then waited
  // for has completed when WaitAll returns.
  Status WaitAll();
  // Operations issued on this session (and its stores), not yet completed.
  size_t in_flight() const;

  // --- what the handshake told us
  // The server's raw regions, free for the application (RStore-style raw
  // remote memory). Regions holding a data model's structures are not
  // listed; raw access to them is refused.
  const std::vector<RegionInfo>& regions() const;
  // Random per server start: a different value means the server restarted.
  uint64_t server_incarnation() const;
  // The server's name for this session (its logs use it).
  uint64_t session_id() const;
  // What UCX chose for this connection.
  std::string transport() const;
  // True if one-sided reads land directly in this process's mapping of the
  // server's memory (shared memory).
  bool reads_are_local() const;
  // False once the connection has failed or the server has gone. Cheap
  // enough to call in a polling loop: it looks at the session's TCP
  // connection at most once per 10 ms, so a server that died is noticed
  // within about that long.
  bool connected() const;
  const SessionOptions& options() const;

  // For data-model stores in this library (src/client/session_core.h).
  client::SessionCore* core() const { return core_.get(); }

 private:
  explicit Session(std::unique_ptr<client::SessionCore> core);
  std::unique_ptr<client::SessionCore> core_;
};

}  // namespace remem

#endif  // REMEM_SESSION_H_
