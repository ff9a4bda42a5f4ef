// server::ClientAddressCheck: what remem-server checks in the UCX worker
// address a client sends in its handshake, before the address reaches UCX
// (ucp_ep_create), which trusts it entirely.
//
//   1. Its form (fabric::ParseWorkerAddress): UCX 1.13 reads a malformed
//      address past its end or aborts the process on it.
//   2. It is not the server's own: not one of the server workers' uuids or
//      self-transport ids (the server would connect to itself), those of
//      workers made after a stall included (AddOwn).
//   3. Shared memory it names that this server can reach (posix and cma
//      entries of this host's system id) belongs to the process that opened
//      the handshake connection: that process's /proc/<pid>/fd holds the
//      client end of the connection (the server's own process only when
//      it opened the connection itself: the cluster manager's session to
//      its own server). Otherwise a peer could make the server
//      map and write into any file some process of the server's user holds
//      open (posix names a /proc/<pid>/fd/<fd> link), or read another
//      process's memory (cma names a pid). A posix entry must name a UCX
//      receive FIFO: a /dev/shm/ucx_shm_posix_* file of the size of the
//      server's own.
//
// What it cannot check: the tcp hosts and ports an address names (the server
// connects to them; reachable ones are the client's by construction only if
// the client is honest). docs/SECURITY.md says what that means.
//
// Thread contract: Check and AddOwn may be called from any thread. Copies
// share the server's own identities (AddOwn on one is seen by all).

#ifndef REMEM_SERVER_CLIENT_ADDRESS_H_
#define REMEM_SERVER_CLIENT_ADDRESS_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::server {

class ClientAddressCheck {
 public:
  // From the packed addresses of the server's own workers. Unsupported if
  // remem cannot read them (a UCX configuration it does not know, e.g.
  // UCX_UNIFIED_MODE=y): then it could not read its clients' either.
  static Result<ClientAddressCheck> Create(
      const std::vector<std::string>& own_addresses);
  // An empty check (tests of the acceptor alone): form only.
  ClientAddressCheck() = default;
  // Adds a worker of the server's made later (a server thread's new worker
  // after a stall: fabric::Worker::RenewAfterStall). Ignored if unreadable
  // (Create read the server's first workers, of the same form).
  void AddOwn(std::string_view own_address);

  // OK, or why the server refuses a client whose handshake came on the
  // connected socket `sock` with `address` (ProtocolError: malformed;
  // PermissionDenied: names what is not the client's; Unavailable: the
  // client exited before its hello was read; Unsupported).
  Status Check(std::string_view address, int sock) const;

 private:
  struct Own {
    std::mutex mu;
    std::vector<uint64_t> uuids;        // under mu
    std::vector<std::string> self_ids;  // under mu
  };
  std::shared_ptr<Own> own_ = std::make_shared<Own>();
  std::vector<std::string> own_system_ids_;  // posix / cma device addresses
  int64_t fifo_bytes_ = -1;  // the server's own posix FIFO segment size
};

// True if process `pid` holds (in /proc/<pid>/fd) the other end of the
// connected TCP socket `sock`, looked up in that process's own network
// namespace: by NETLINK_SOCK_DIAG if it is this process's, in
// /proc/<pid>/net/tcp{,6} otherwise.
bool ProcessHoldsPeerSocket(int pid, int sock);
// True if the other end of the connected TCP socket `sock` is held by no
// process any more (its holder closed it, or the connection is gone), as
// seen from `pid`'s network namespace if it is this process's; false while
// it is held (a half-closed end too), or if `pid` is in another namespace.
bool PeerSocketClosed(int pid, int sock);

}  // namespace remem::server

#endif  // REMEM_SERVER_CLIENT_ADDRESS_H_
