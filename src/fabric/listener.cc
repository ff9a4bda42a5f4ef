#include "fabric/listener.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>

#include "fabric/endpoint.h"

namespace remem::fabric {

Result<std::unique_ptr<Listener>> Listener::Create(Worker* worker,
                                                   const std::string& address,
                                                   RequestHandler on_request) {
  sockaddr_storage ss{};
  socklen_t sslen = 0;
  REMEM_RETURN_IF_ERROR(ResolveAddress(address, true, &ss, &sslen));

  std::unique_ptr<Listener> l(new Listener());
  l->on_request_ = std::move(on_request);
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                 UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  p.sockaddr.addrlen = sslen;
  p.conn_handler.cb = &Listener::OnRequest;
  p.conn_handler.arg = l.get();
  ucs_status_t s = ucp_listener_create(worker->handle(), &p, &l->listener_);
  if (s == UCS_ERR_BUSY) {
    return Status::Unavailable("cannot listen on " + address +
                               ": address already in use");
  }
  if (s != UCS_OK) return FromUcs(s, "cannot listen on " + address);

  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(l->listener_, &attr);
  if (s != UCS_OK) return FromUcs(s, "ucp_listener_query");
  char buf[INET6_ADDRSTRLEN] = {0};
  if (attr.sockaddr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    l->port_ = ntohs(a->sin6_port);
    l->address_ = "[" + std::string(buf) + "]:" + std::to_string(l->port_);
  } else {
    auto* a = reinterpret_cast<const sockaddr_in*>(&attr.sockaddr);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    l->port_ = ntohs(a->sin_port);
    l->address_ = std::string(buf) + ":" + std::to_string(l->port_);
  }
  return l;
}

Listener::~Listener() {
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
}

void Listener::OnRequest(ucp_conn_request_h request, void* arg) {
  static_cast<Listener*>(arg)->on_request_(request);
}

void Listener::Reject(ucp_conn_request_h request) {
  (void)ucp_listener_reject(listener_, request);
}

}  // namespace remem::fabric
