// fabric::Listener: a UCX listener on a TCP address. Each incoming
// connection request is handed to `on_request` (inside UCX progress of the
// listener's worker: the handler must only hand the request on, e.g. Post it
// to the worker that will own the connection).
//
// Thread contract: belongs to its worker's thread.

#ifndef REMEM_FABRIC_LISTENER_H_
#define REMEM_FABRIC_LISTENER_H_

#include <ucp/api/ucp.h>

#include <functional>
#include <memory>
#include <string>

#include "fabric/worker.h"

namespace remem::fabric {

class Listener {
 public:
  using RequestHandler = std::function<void(ucp_conn_request_h)>;
  // `address` is "host:port"; port 0 picks a free port.
  static Result<std::unique_ptr<Listener>> Create(Worker* worker,
                                                  const std::string& address,
                                                  RequestHandler on_request);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // "host:port" actually bound (port resolved).
  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }

  // Rejects a request that will not be served.
  void Reject(ucp_conn_request_h request);

 private:
  Listener() = default;
  static void OnRequest(ucp_conn_request_h request, void* arg);
  ucp_listener_h listener_ = nullptr;
  RequestHandler on_request_;
  std::string address_;
  uint16_t port_ = 0;
};

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_LISTENER_H_
