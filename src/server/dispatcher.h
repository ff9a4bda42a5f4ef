// server::Dispatcher: everything between a UCX active message and a
// service's Handle: the connections of each server thread, framing and
// header checks, routing a request to the partition that must run it,
// replies (from any thread, through Responder), and the one-sided
// operations the server performs itself for clients without real RMA
// (served memory requests, docs/PROTOCOL.md section 8).
//
// Connections are created by the acceptor (acceptor.h) once a client has
// passed remem's TCP handshake, so every UCX endpoint the dispatcher knows
// belongs to an authenticated session; messages from any other endpoint
// are dropped unanswered.
//
// Lifetime: the dispatcher outlives everything that may hold a Responder
// (the services, the durability layer, the cluster member): once the
// server's threads have exited, Close makes later replies and RunOn tasks
// be dropped, so a Responder destroyed then (a request still waiting in a
// service at the stop, whose connection is gone) answers nothing. Close is
// a flag, not a barrier: threads other than the server's that may reply
// (the replicator's) are stopped before it (Server::Stop).
//
// Thread contract: one Dispatcher per server. Functions ending in _st run
// only on the thread that owns the connection (CODING_STYLE.md); SendReply,
// RunOn and Close may be called from any thread; setup (Register, Export,
// Install) before the threads start.

#ifndef REMEM_SERVER_DISPATCHER_H_
#define REMEM_SERVER_DISPATCHER_H_

#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/endpoint.h"
#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "server/service.h"

namespace remem::server {

// One authenticated session, on the thread that owns its endpoint.
struct Connection {
  ConnectionId id = 0;
  std::string peer;  // "ip:port" of the client's TCP handshake
  std::unique_ptr<fabric::Endpoint> ep;
  bool closing = false;
};

// Counters of one server thread, read by Stats from any thread.
struct ThreadCounters {
  Counter connections_current;
  Counter connections_total;
  Counter rpcs_served;
  Counter rpc_bytes_in;
  Counter rpc_bytes_out;
  Counter rpc_errors;
  Counter mem_requests_served;
  Counter unknown_endpoint_messages;
  // 1 while the thread's shared-memory receive queue is stalled and could
  // not be renewed (fabric::Worker::receive_stalled, RenewAfterStall).
  Counter receive_stalled;
  // Stalls the thread recovered from with a new UCX worker, and the
  // replaced workers it still keeps for their (tcp) sessions.
  Counter receive_renewals;
  Counter receive_retired_workers;
  // 1 while the thread watches its shared-memory receive queue for a stall
  // (fabric::Worker::watching_for_stall: a client may have died mid-send).
  Counter receive_watching;
};

// A server thread: its worker and the connections it owns.
struct ServerThread {
  uint32_t index = 0;
  // Declared before the worker so they outlive it: the worker's destructor
  // may still progress, running handlers that look them up.
  std::unordered_map<ucp_ep_h, std::unique_ptr<Connection>> by_endpoint;
  std::unordered_map<ConnectionId, Connection*> by_id;
  std::unique_ptr<fabric::Worker> worker;
  ThreadCounters counters;
  // The earliest time the worker may be renewed again after a stall
  // (owner thread).
  fabric::Clock::time_point next_renewal{};
};

// An exported region as a served memory request names it.
struct ExportedRegion {
  fabric::LocalRegion* region = nullptr;
  proto::ServiceId service = proto::kCoreService;
  proto::RegionAccess access = proto::RegionAccess::kReadWrite;
};

class Dispatcher {
 public:
  // Called when a connection goes away (on its thread), after it left the
  // thread's tables. `peer_may_have_died`: false when the client ended the
  // session in order or this server closed it.
  using ClosedFn = std::function<void(uint32_t thread, ConnectionId id,
                                      bool peer_may_have_died)>;

  Dispatcher(std::vector<ServerThread*> threads, ClosedFn on_closed)
      : threads_(std::move(threads)), on_closed_(std::move(on_closed)) {}

  // Setup, before the threads start.
  Status Register(Service* service);
  void Export(uint32_t region_id, ExportedRegion r) { regions_[region_id] = r; }
  const std::unordered_map<uint32_t, ExportedRegion>& regions() const {
    return regions_;
  }
  // Installs the request handlers on every thread's worker.
  Status Install();

  // On `thread`: adopts a connection.
  void AddConnection_st(uint32_t thread, std::unique_ptr<Connection> conn);
  // On `thread`: closes a connection (a live endpoint is flushed first, a
  // failed one force-closed); no-op if it is already gone.
  // `peer_may_have_died`: as ClosedFn's.
  void DropConnection_st(uint32_t thread, ConnectionId id, const Status& why,
                         bool peer_may_have_died = true);
  // On `thread`: closes every connection (shutdown), after up to 300 ms
  // for the replies still out to go.
  void DropAll_st(uint32_t thread);
  // On `thread`: closes every connection whose endpoint uses shared memory,
  // force-closing the endpoints (their UCX worker's receive queue stalled:
  // fabric::Worker::RenewAfterStall). Returns how many.
  size_t DropSharedMemory_st(uint32_t thread, const Status& why);

  // Runs fn on `thread` (inline if already there). Thread-safe. After
  // Close, fn is destroyed unrun.
  void RunOn(uint32_t thread, util::MoveFunction<void()> fn);
  // Once every server thread has exited (their connections are closed):
  // replies and RunOn tasks from now on are dropped, and the threads'
  // workers are no longer touched (they may be destroyed).
  void Close() { closed_.store(true, std::memory_order_release); }
  // The server thread the caller runs on, or -1.
  static int CurrentThread();
  static void SetCurrentThread(int index);

  // Sends a reply on the connection's thread (posting there if needed);
  // dropped after Close.
  void SendReply(uint32_t thread, ConnectionId conn, uint64_t request_id,
                 proto::ServiceId service, uint8_t method, Status status,
                 std::string payload);

  Service* service(proto::ServiceId id) const { return services_[id]; }
  // In a cluster: requests to services (not the core one) whose epoch is
  // newer than the installed one are refused with Busy (Ownership::Admits);
  // 0 and older epochs pass, and the service checks the key
  // (Ownership::Owns). Without (a server of no cluster), such requests
  // with an epoch > 0 are refused with Conflict. Setup only.
  void set_cluster(const cluster::Ownership* ownership) {
    cluster_ = ownership;
  }
  const std::vector<Service*>& services() const { return service_list_; }

 private:
  void OnRequest_st(ServerThread* t, fabric::AmMessage&& m);
  void OnMemRequest_st(ServerThread* t, fabric::AmMessage&& m);
  Connection* ConnectionOf_st(ServerThread* t, ucp_ep_h ep);
  void Send_st(ServerThread* t, Connection& c, uint64_t request_id,
               proto::ServiceId service, uint8_t method, Status status,
               std::string payload);
  Responder MakeResponder(uint32_t thread, ConnectionId conn, uint64_t id,
                          proto::ServiceId service, uint8_t method);
  Status ServeMemory_st(const proto::MemRequest& r, const std::string& data,
                        uint64_t* value, std::string* out);
  // The bytes [offset, offset + length) of region `id`, if a served `op`
  // may touch them (docs/PROTOCOL.md, "What the server checks").
  Result<uint8_t*> ServedBytes_st(uint32_t id, uint64_t offset, uint64_t length,
                                  proto::MemOp op);

  std::vector<ServerThread*> threads_;
  ClosedFn on_closed_;
  const cluster::Ownership* cluster_ = nullptr;
  std::array<Service*, 256> services_{};
  std::vector<Service*> service_list_;
  // By id; built before the threads start, then only read.
  std::unordered_map<uint32_t, ExportedRegion> regions_;
  std::atomic<bool> closed_{false};
};

}  // namespace remem::server

#endif  // REMEM_SERVER_DISPATCHER_H_
