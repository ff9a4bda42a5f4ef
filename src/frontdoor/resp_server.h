// frontdoor::RespServer: remem-server's Redis front door (--resp). Redis
// clients (redis-cli, redis-py, hiredis, Jedis, ...) connect to its port and
// reach the hash store with Redis's string commands; README.md, "Redis
// clients", lists the commands and where they differ from Redis's.
//
// It is a client of the server it runs in: one thread owns a listening
// socket, the clients' sockets (epoll) and one remem session to the server
// (or, for a server in a cluster, a remem::Cluster seeded with it, so that
// every key reaches its owner wherever it is). Requests become the
// library's asynchronous operations, and pipelined requests travel
// together: the server does them in issue order, in one message.
//
// Order, as Redis gives it: the commands of one connection take effect in
// the order they were sent, and a reply is sent for each, in that order.
// Commands that go to the server by RPC are pipelined freely (the server
// does one session's operations in issue order). A GET or MGET with no
// write of its connection in flight takes the store's read path (one-
// sided on shared memory, so the server's threads spend nothing on it);
// a write waits until such reads are answered, and a read behind a write
// goes by RPC, after it. Commands made of several steps (INCR's read and
// compare-and-swap, SET's NX and XX, APPEND) wait for the connection's
// earlier commands and hold back its later ones. In a cluster every
// command waits for the previous one of its connection.
//
// While commands are in flight the thread polls for their answers briefly,
// then sleeps on the session's worker (it may share a CPU with the
// server's thread that must answer).
//
// Thread contract: Start, Stop, address and the destructor from one
// thread; everything else runs on the front door's own thread.

#ifndef REMEM_FRONTDOOR_RESP_SERVER_H_
#define REMEM_FRONTDOOR_RESP_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"

namespace remem::frontdoor {

struct RespOptions {
  // "host:port" to listen on for Redis clients (port 0: any free one).
  std::string listen;
  // How to reach the remem server: its address, transport and secret
  // (`timeout` bounds each command, as a remem client's calls).
  SessionOptions session;
  // Non-empty: the server is a cluster member; keys go to their owners
  // through remem::Cluster seeded with these addresses.
  std::vector<std::string> cluster_seeds;
  // Connections beyond this are refused with an error reply.
  uint32_t max_clients = 10000;
  // Replies made and not yet taken by their clients, all connections
  // together, past which the connections that have taken none of theirs
  // for a second are closed, those owed the most first (a client that
  // sends and never reads would have every reply it asked for held).
  size_t max_unread_bytes = size_t{1} << 30;
};

class RespServer {
 public:
  // Binds the listening socket and starts the thread; the session to the
  // server is opened by the thread (a cluster may still be forming: until
  // it answers, commands are refused with -LOADING). Errors: InvalidArgument
  // (a bad address), IOError (the port cannot be bound).
  static Result<std::unique_ptr<RespServer>> Start(RespOptions options);
  // Closes every connection and the session; commands in flight get no
  // reply. The destructor calls it.
  void Stop();
  ~RespServer();
  RespServer(const RespServer&) = delete;
  RespServer& operator=(const RespServer&) = delete;

  // "host:port" actually bound.
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  RespServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string address_;
  std::thread thread_;
};

}  // namespace remem::frontdoor

#endif  // REMEM_FRONTDOOR_RESP_SERVER_H_
