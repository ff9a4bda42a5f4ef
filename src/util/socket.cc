#include "util/socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace remem::util {

namespace {

Status Errno(const std::string& what, int err) {
  return Status::IOError(what + ": " + std::strerror(err));
}

int MillisLeft(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30));
}

// Waits for `events` on fd until the deadline: OK, or TimedOut.
Status WaitFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int ms = MillisLeft(deadline);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::OK();
    if (rc == 0) return Status::TimedOut(std::string(what) + " timed out");
    if (errno != EINTR) return Errno(std::string("poll for ") + what, errno);
  }
}

}  // namespace

Status ParseHostPort(const std::string& s, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() ||
        s[close + 1] != ':') {
      return Status::InvalidArgument("bad address '" + s +
                                     "' (expected [v6addr]:port)");
    }
    h = s.substr(1, close - 1);
    p = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) {
      return Status::InvalidArgument("bad address '" + s +
                                     "' (expected host:port)");
    }
    h = s.substr(0, colon);
    p = s.substr(colon + 1);
    // "host:port:5" is not host "host:port": a colon in the host is an
    // IPv6 address, which is written in brackets.
    if (h.find(':') != std::string::npos) {
      return Status::InvalidArgument(
          "bad address '" + s +
          "' (expected host:port, or [v6addr]:port for an IPv6 address)");
    }
  }
  if (h.empty()) return Status::InvalidArgument("empty host in '" + s + "'");
  char* end = nullptr;
  unsigned long v = std::strtoul(p.c_str(), &end, 10);
  if (p.empty() || *end != '\0' || v > 65535) {
    return Status::InvalidArgument("bad port in '" + s + "'");
  }
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::OK();
}

namespace {

// Every address `address` resolves to, in getaddrinfo's order (`passive`:
// for listening, where host "*" means any address).
Result<std::vector<sockaddr_storage>> ResolveAll(const std::string& address,
                                                 bool passive) {
  std::string host;
  uint16_t port = 0;
  REMEM_RETURN_IF_ERROR(ParseHostPort(address, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const char* node = passive && host == "*" ? nullptr : host.c_str();
  const int rc = getaddrinfo(node, std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return Status::InvalidArgument("cannot resolve '" + host +
                                   "': " + gai_strerror(rc));
  }
  std::vector<sockaddr_storage> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, a->ai_addr, a->ai_addrlen);
    out.push_back(ss);
  }
  freeaddrinfo(res);
  return out;
}

socklen_t LengthOf(const sockaddr_storage& ss) {
  return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

}  // namespace

Status ResolveAddress(const std::string& address, bool passive,
                      sockaddr_storage* out, socklen_t* out_len) {
  auto all = ResolveAll(address, passive);
  if (!all.ok()) return all.status();
  *out = all->front();  // getaddrinfo answers at least one or fails
  *out_len = LengthOf(*out);
  return Status::OK();
}

std::string FormatAddress(const sockaddr_storage& addr) {
  // Built with snprintf: g++ 12 -O3 reports a false -Wrestrict on
  // `"[" + std::string(...)` (GCC bug 105329).
  char buf[INET6_ADDRSTRLEN] = {0};
  char out[INET6_ADDRSTRLEN + 16];
  if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    std::snprintf(out, sizeof(out), "[%s]:%u", buf, ntohs(a->sin6_port));
    return out;
  }
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    std::snprintf(out, sizeof(out), "%s:%u", buf, ntohs(a->sin_port));
    return out;
  }
  return "?";
}

std::string InterfaceOf(const sockaddr_storage& addr) {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return {};
  std::string name;
  for (ifaddrs* i = ifs; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != addr.ss_family) {
      continue;
    }
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      auto* b = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (a->sin_addr.s_addr == htonl(INADDR_ANY)) break;
      if (a->sin_addr.s_addr == b->sin_addr.s_addr) name = i->ifa_name;
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      auto* b = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr)) break;
      if (std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(in6_addr)) == 0) {
        name = i->ifa_name;
      }
    }
  }
  freeifaddrs(ifs);
  return name;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Status SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return Errno("fcntl O_NONBLOCK", errno);
  }
  return Status::OK();
}

void TuneConnection(int fd, int keepalive_s) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = std::max(1, keepalive_s / 2);
  int intvl = std::max(1, keepalive_s / 6);
  int cnt = 3;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  // Unacknowledged data also gives up after the same time.
  unsigned timeout_ms = unsigned(keepalive_s) * 1000u;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms,
                     sizeof(timeout_ms));
}

Result<Socket> Listen(const std::string& address, int backlog) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  REMEM_RETURN_IF_ERROR(ResolveAddress(address, true, &ss, &len));
  Socket s(
      ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Errno("socket", errno);
  int one = 1;
  (void)::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    if (errno == EADDRINUSE) {
      return Status::Unavailable("cannot listen on " + address +
                                 ": address already in use");
    }
    if (errno == EADDRNOTAVAIL) {
      return Status::InvalidArgument("cannot listen on " + address +
                                     ": no interface has that address");
    }
    return Errno("cannot listen on " + address + ": bind", errno);
  }
  if (::listen(s.fd(), backlog) != 0) return Errno("listen", errno);
  return s;
}

OpenFiles CountOpenFiles() {
  OpenFiles f;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur != RLIM_INFINITY) {
    f.limit = size_t(nofile.rlim_cur);
  }
  size_t below = 0;  // open descriptors numbered below the limit
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const long fd = std::strtol(e->d_name, nullptr, 10);
      if (fd == own) continue;
      ++f.open;
      if (size_t(fd) < f.limit) ++below;
    }
    ::closedir(d);
    f.free = f.limit > below ? f.limit - below : 0;
  } else if (errno == EMFILE || errno == ENFILE) {
    f.free = 0;  // not one left (or none in the system), even to look
  } else {
    f.limit = 0;  // unknown
  }
  return f;
}

Result<std::string> LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Errno("getsockname", errno);
  }
  return FormatAddress(ss);
}

namespace {

Result<Socket> ConnectTo(const sockaddr_storage& ss, const std::string& address,
                         Deadline deadline) {
  Socket s(
      ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Errno("socket", errno);
  if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&ss), LengthOf(ss)) !=
      0) {
    if (errno != EINPROGRESS) {
      return Status::Unavailable("cannot connect to " + address + ": " +
                                 std::strerror(errno));
    }
    Status st = WaitFor(s.fd(), POLLOUT, deadline, "connecting");
    if (!st.ok()) return st.WithContext("connecting to " + address);
    int err = 0;
    socklen_t elen = sizeof(err);
    (void)::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      return Status::Unavailable("cannot connect to " + address + ": " +
                                 std::strerror(err));
    }
  }
  TuneConnection(s.fd(), 10);
  return s;
}

}  // namespace

Result<Socket> Connect(const std::string& address, Deadline deadline) {
  auto resolved = ResolveAll(address, false);
  if (!resolved.ok()) return resolved.status();
  const std::vector<sockaddr_storage>& all = *resolved;
  // Each address in turn, as every TCP client does: a name such as
  // localhost may resolve to 127.0.0.1 and ::1, and the server listen on
  // one of them only.
  Status first;
  for (const sockaddr_storage& ss : all) {
    const std::string where =
        all.size() == 1 ? address : address + " (" + FormatAddress(ss) + ")";
    auto s = ConnectTo(ss, where, deadline);
    if (s.ok()) return s;
    if (first.ok()) first = s.status();
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  return first;
}

Status SendAll(int fd, std::string_view data, Deadline deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      REMEM_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "sending"));
      continue;
    }
    return Status::Unavailable(std::string("send: ") + std::strerror(errno));
  }
  return Status::OK();
}

Status RecvExact(int fd, size_t n, std::string* out, Deadline deadline) {
  out->resize(n);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, out->data() + done, n - done, 0);
    if (r > 0) {
      done += size_t(r);
      continue;
    }
    if (r == 0) return Status::Unavailable("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      REMEM_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "receiving"));
      continue;
    }
    return Status::Unavailable(std::string("recv: ") + std::strerror(errno));
  }
  return Status::OK();
}

bool PeerStillThere(int fd) {
  char c;
  const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r > 0) return true;
  if (r == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

bool PeerStillThereAfter(int fd, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  while (PeerStillThere(fd)) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return true;
    // Woken by a close (peeked again above) or by data, which alone says
    // the peer is there.
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) == 0) return true;
    if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return true;
  }
  return false;
}

}  // namespace remem::util
