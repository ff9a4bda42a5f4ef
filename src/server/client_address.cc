#include "server/client_address.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fabric/worker_address.h"

namespace remem::server {

namespace {

// An IP address and port; IPv4 as IPv4-mapped IPv6.
struct Endpoint {
  std::array<uint8_t, 16> ip{};
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};

bool IsV4Mapped(const std::array<uint8_t, 16>& ip) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0,    0,
                                          0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(ip.data(), kPrefix, 12) == 0;
}

bool FromSockaddr(const sockaddr_storage& ss, Endpoint* out) {
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    out->ip = {};
    out->ip[10] = out->ip[11] = 0xff;
    std::memcpy(out->ip.data() + 12, &a->sin_addr, 4);
    out->port = ntohs(a->sin_port);
    return true;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    std::memcpy(out->ip.data(), &a->sin6_addr, 16);
    out->port = ntohs(a->sin6_port);
    return true;
  }
  return false;
}

// "0100007F:1F90" (tcp) or 32 hex digits ":" port (tcp6), as the kernel
// prints them: each 32-bit word of the address as a host-order number.
bool ParseProcAddress(const std::string& s, Endpoint* out) {
  const size_t colon = s.find(':');
  if (colon == std::string::npos) return false;
  const std::string ip = s.substr(0, colon);
  if (ip.size() != 8 && ip.size() != 32) return false;
  uint8_t bytes[16];
  for (size_t w = 0; w < ip.size() / 8; ++w) {
    const uint32_t word =
        static_cast<uint32_t>(std::stoul(ip.substr(w * 8, 8), nullptr, 16));
    std::memcpy(bytes + w * 4, &word, 4);
  }
  out->ip = {};
  if (ip.size() == 8) {
    out->ip[10] = out->ip[11] = 0xff;
    std::memcpy(out->ip.data() + 12, bytes, 4);
  } else {
    std::memcpy(out->ip.data(), bytes, 16);
  }
  out->port =
      static_cast<uint16_t>(std::stoul(s.substr(colon + 1), nullptr, 16));
  return true;
}

// Inodes of the sockets in /proc/<pid>/net/tcp{,6} whose local end is
// `local` and remote end `remote`.
std::vector<std::string> SocketInodes(int pid, const Endpoint& local,
                                      const Endpoint& remote) {
  std::vector<std::string> out;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/net/" + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, l, r, state, queues, timer, retr, uid, timeout, inode;
      if (!(fields >> slot >> l >> r >> state >> queues >> timer >> retr >>
            uid >> timeout >> inode)) {
        continue;
      }
      Endpoint le, re;
      try {
        if (!ParseProcAddress(l, &le) || !ParseProcAddress(r, &re)) continue;
      } catch (const std::exception&) {
        continue;
      }
      if (le == local && re == remote && inode != "0") out.push_back(inode);
    }
  }
  return out;
}

// Whether process `pid` is in this process's network namespace.
bool SameNetworkNamespace(int pid) {
  struct stat mine {
  }, theirs{};
  const std::string ns = "/proc/" + std::to_string(pid) + "/ns/net";
  return ::stat("/proc/self/ns/net", &mine) == 0 &&
         ::stat(ns.c_str(), &theirs) == 0 && mine.st_dev == theirs.st_dev &&
         mine.st_ino == theirs.st_ino;
}

// Whether the socket sock_diag answered with is the connected socket asked
// for: the kernel's lookup falls back to a socket *listening* on the local
// end (a wildcard listener matches any address) when no connection has
// that 4-tuple, and a listener some process holds must not pass for the
// client's end.
bool IsConnection(const inet_diag_msg& m, const Endpoint& local,
                  const Endpoint& remote) {
  if (m.idiag_state == TCP_LISTEN || m.id.idiag_sport != htons(local.port) ||
      m.id.idiag_dport != htons(remote.port)) {
    return false;
  }
  if (m.idiag_family == AF_INET) {
    return IsV4Mapped(local.ip) && IsV4Mapped(remote.ip) &&
           std::memcmp(m.id.idiag_src, local.ip.data() + 12, 4) == 0 &&
           std::memcmp(m.id.idiag_dst, remote.ip.data() + 12, 4) == 0;
  }
  return m.idiag_family == AF_INET6 &&
         std::memcmp(m.id.idiag_src, local.ip.data(), 16) == 0 &&
         std::memcmp(m.id.idiag_dst, remote.ip.data(), 16) == 0;
}

// The inode of the connected TCP socket of this network namespace whose
// local end is `local` and remote end `remote` (`ifindex`: an IPv6 scope,
// else 0): one exact lookup by NETLINK_SOCK_DIAG (what `ss` asks). Reading
// /proc/net/tcp instead walks every bucket of the kernel's connection
// table, 10 ms and more of the server's CPU per handshake on a host with
// gigabytes of memory, whether it holds 1 socket or 10,000. NotFound if
// there is none (a client socket bound to a device by SO_BINDTODEVICE is
// not found either: such a client is refused); IOError if netlink fails.
Result<std::string> SocketInodeByDiag(const Endpoint& local,
                                      const Endpoint& remote,
                                      uint32_t ifindex) {
  // IPv4 ends are asked as AF_INET: the kernel keeps a dual-stack socket's
  // IPv4-mapped connection in the same table, under its IPv4 addresses.
  const int family =
      IsV4Mapped(local.ip) && IsV4Mapped(remote.ip) ? AF_INET : AF_INET6;
  struct {
    nlmsghdr header;
    inet_diag_req_v2 req;
  } ask{};
  ask.header.nlmsg_len = sizeof(ask);
  ask.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  ask.header.nlmsg_flags = NLM_F_REQUEST;  // one socket, not a dump
  ask.req.sdiag_family = uint8_t(family);
  ask.req.sdiag_protocol = IPPROTO_TCP;
  ask.req.idiag_states = ~0u;
  ask.req.id.idiag_sport = htons(local.port);
  ask.req.id.idiag_dport = htons(remote.port);
  const size_t from = family == AF_INET ? 12 : 0;
  std::memcpy(ask.req.id.idiag_src, local.ip.data() + from, 16 - from);
  std::memcpy(ask.req.id.idiag_dst, remote.ip.data() + from, 16 - from);
  ask.req.id.idiag_if = ifindex;
  ask.req.id.idiag_cookie[0] = ask.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  const int fd =
      ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return Status::IOError("netlink socket");
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  alignas(nlmsghdr) char buf[8192];
  ssize_t n = ::sendto(fd, &ask, sizeof(ask), 0,
                       reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel));
  if (n >= 0) n = ::recv(fd, buf, sizeof(buf), 0);
  const int err = errno;  // of sendto or recv, before close
  ::close(fd);
  if (n < 0) {
    return Status::IOError(std::string("netlink: ") + std::strerror(err));
  }
  // The one message of the reply (NLMSG_OK and NLMSG_NEXT compare signed
  // with unsigned lengths).
  const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
  if (size_t(n) < sizeof(nlmsghdr) || h->nlmsg_len < sizeof(nlmsghdr) ||
      h->nlmsg_len > size_t(n)) {
    return Status::IOError("sock_diag: no answer");
  }
  if (h->nlmsg_type == NLMSG_ERROR &&
      h->nlmsg_len >= NLMSG_LENGTH(sizeof(nlmsgerr))) {
    const int error = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
    if (error == 0 || error == -ENOENT) {
      return Status::NotFound("no such socket");
    }
    return Status::IOError(std::string("sock_diag: ") + std::strerror(-error));
  }
  if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) {
    return Status::IOError("sock_diag: no answer");
  }
  const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
  if (m->idiag_inode == 0 || !IsConnection(*m, local, remote)) {
    return Status::NotFound("no such socket");
  }
  return std::to_string(m->idiag_inode);
}

bool Contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

const uint16_t kSelfTransport = fabric::UcxTransportChecksum("self");

}  // namespace

namespace {

// The two ends of the connected TCP socket `sock`, as its peer sees them
// (the client's address is its local end): kGone if the connection is
// reset, kUnknown if `sock` is no such socket.
struct ConnectionEnds {
  enum { kOk, kGone, kUnknown } state = kUnknown;
  Endpoint server_end, client_end;
  uint32_t scope = 0;  // an IPv6 scope, else 0
};
ConnectionEnds EndsOf(int sock) {
  ConnectionEnds c;
  sockaddr_storage mine{}, theirs{};
  socklen_t len = sizeof(mine);
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&mine), &len) != 0) {
    return c;
  }
  len = sizeof(theirs);
  if (::getpeername(sock, reinterpret_cast<sockaddr*>(&theirs), &len) != 0) {
    if (errno == ENOTCONN) c.state = ConnectionEnds::kGone;
    return c;
  }
  if (!FromSockaddr(mine, &c.server_end) ||
      !FromSockaddr(theirs, &c.client_end)) {
    return c;
  }
  c.scope = mine.ss_family == AF_INET6
                ? reinterpret_cast<const sockaddr_in6*>(&mine)->sin6_scope_id
                : 0;
  c.state = ConnectionEnds::kOk;
  return c;
}

}  // namespace

bool ProcessHoldsPeerSocket(int pid, int sock) {
  const ConnectionEnds c = EndsOf(sock);
  if (c.state != ConnectionEnds::kOk) return false;
  // The client's socket, seen from its own namespace: local end = the
  // client's address, remote end = ours.
  std::vector<std::string> inodes;
  Result<std::string> diag = Status::Unsupported("another network namespace");
  if (SameNetworkNamespace(pid)) {
    diag = SocketInodeByDiag(c.client_end, c.server_end, c.scope);
  }
  if (diag.ok()) {
    inodes.push_back(*diag);
  } else if (diag.status().code() != StatusCode::kNotFound) {
    // The client's namespace is not ours (netlink sees only ours), or
    // netlink failed: the namespace's table in /proc.
    inodes = SocketInodes(pid, c.client_end, c.server_end);
  }
  if (inodes.empty()) return false;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[64];
    const std::string link = dir + "/" + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string_view t(target, size_t(n));
    if (t.substr(0, 8) != "socket:[") continue;
    for (const std::string& inode : inodes) {
      if (t == "socket:[" + inode + "]") found = true;
    }
    if (found) break;
  }
  ::closedir(d);
  return found;
}

bool PeerSocketClosed(int pid, int sock) {
  const ConnectionEnds c = EndsOf(sock);
  if (c.state == ConnectionEnds::kGone) return true;
  if (c.state != ConnectionEnds::kOk || !SameNetworkNamespace(pid)) {
    return false;
  }
  // A socket its process closed lingers (FIN_WAIT2) with no inode: the
  // lookup says NotFound for it as for one that is gone.
  auto diag = SocketInodeByDiag(c.client_end, c.server_end, c.scope);
  return !diag.ok() && diag.status().code() == StatusCode::kNotFound;
}

Result<ClientAddressCheck> ClientAddressCheck::Create(
    const std::vector<std::string>& own_addresses) {
  ClientAddressCheck c;
  for (const std::string& a : own_addresses) {
    auto parsed = fabric::ParseWorkerAddress(a);
    if (!parsed.ok()) {
      return Status::Unsupported(
          "remem-server cannot read its own UCX worker address, so it could "
          "not check its clients' (" +
          parsed.status().message() +
          "); is UCX configured in a way remem does not support, e.g. "
          "UCX_UNIFIED_MODE=y or UCX_ADDRESS_DEBUG_INFO?");
    }
    if (parsed->has_uuid) c.own_->uuids.push_back(parsed->uuid);
    for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
      if (e.transport == kSelfTransport) {
        c.own_->self_ids.emplace_back(e.iface_address);
        continue;
      }
      auto ref = fabric::SharedMemoryRefOf(e);
      if (!ref.ok()) continue;
      if (!Contains(c.own_system_ids_, ref->system_id)) {
        c.own_system_ids_.emplace_back(ref->system_id);
      }
      if (ref->posix && ref->procfs && ref->pid == ::getpid() &&
          c.fifo_bytes_ < 0) {
        struct stat st {};
        if (::fstat(ref->fd, &st) == 0) c.fifo_bytes_ = st.st_size;
      }
    }
  }
  return c;
}

void ClientAddressCheck::AddOwn(std::string_view own_address) {
  auto parsed = fabric::ParseWorkerAddress(own_address);
  if (!parsed.ok()) return;
  std::lock_guard<std::mutex> lock(own_->mu);
  if (parsed->has_uuid) own_->uuids.push_back(parsed->uuid);
  for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
    if (e.transport == kSelfTransport) {
      own_->self_ids.emplace_back(e.iface_address);
    }
  }
}

Status ClientAddressCheck::Check(std::string_view address, int sock) const {
  auto parsed = fabric::ParseWorkerAddress(address);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_uuid || parsed->uuid == 0) {
    return Status::ProtocolError("the UCX worker address carries no uuid");
  }
  {
    std::lock_guard<std::mutex> lock(own_->mu);
    if (std::find(own_->uuids.begin(), own_->uuids.end(), parsed->uuid) !=
        own_->uuids.end()) {
      return Status::PermissionDenied(
          "the UCX worker address is the server's own");
    }
    for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
      if (e.transport == kSelfTransport &&
          Contains(own_->self_ids, e.iface_address)) {
        return Status::PermissionDenied(
            "the UCX worker address names the server's own self transport");
      }
    }
  }
  int checked_pid = 0;
  for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
    if (e.transport == kSelfTransport) continue;
    auto ref = fabric::SharedMemoryRefOf(e);
    if (!ref.ok()) continue;
    // UCX reaches shared memory only on this host (and IPC namespace):
    // entries of another system id are unreachable and never used.
    if (!Contains(own_system_ids_, ref->system_id)) continue;
    if (ref->posix && (!ref->procfs || ref->fd < 0)) {
      return Status::Unsupported(
          "the client's posix shared memory is not shared through /proc "
          "links (UCX_POSIX_USE_PROC_LINK=n), which remem-server refuses");
    }
    // The server's own pid passes only if the server's process opened the
    // connection itself (the cluster manager's session to its own server,
    // cluster/member.h): the socket check below holds for no one else.
    if (ref->pid <= 0) {
      return Status::PermissionDenied(
          "the UCX worker address names shared memory of no process");
    }
    if (ref->pid != checked_pid) {
      if (!ProcessHoldsPeerSocket(ref->pid, sock)) {
        // A client that gave up waiting (its timeout, after the server was
        // paused) is gone by the time its handshake is read: not an
        // intruder, and not worth a warning that reads like one.
        if (::kill(ref->pid, 0) != 0 && errno == ESRCH) {
          return Status::Unavailable(
              "the client (process " + std::to_string(ref->pid) +
              ") exited before its handshake was read: it gave up waiting");
        }
        // Or it lives on, and closed this connection to try again on a new
        // one (a client's retry after a pause or a restart of the server).
        if (PeerSocketClosed(ref->pid, sock)) {
          return Status::Unavailable(
              "the client (process " + std::to_string(ref->pid) +
              ") closed this connection before its handshake was read: it "
              "gave up waiting");
        }
        return Status::PermissionDenied(
            "the UCX worker address names shared memory of process " +
            std::to_string(ref->pid) +
            ", which is not the process that connected (or the server may "
            "not inspect it: another user?)");
      }
      checked_pid = ref->pid;
    }
    if (!ref->posix) continue;
    const std::string link =
        "/proc/" + std::to_string(ref->pid) + "/fd/" + std::to_string(ref->fd);
    char target[256];
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    const std::string_view t(target, n > 0 ? size_t(n) : 0);
    struct stat st {};
    if (t.substr(0, 23) != "/dev/shm/ucx_shm_posix_" ||
        ::stat(link.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Status::PermissionDenied(
          "the UCX worker address names a file of process " +
          std::to_string(ref->pid) + " that is not a UCX receive FIFO");
    }
    if (fifo_bytes_ >= 0 && st.st_size != fifo_bytes_) {
      // Most likely a UCX setting that differs (the FIFO's size is
      // UCX_MM_FIFO_SIZE elements): refused all the same.
      return Status::Unsupported(
          "the client's UCX shared-memory receive FIFO has " +
          std::to_string(st.st_size) + " bytes and the server's " +
          std::to_string(fifo_bytes_) +
          ": set UCX_MM_FIFO_SIZE (and the other UCX_MM_ settings) alike "
          "on client and server");
    }
  }
  return Status::OK();
}

}  // namespace remem::server
