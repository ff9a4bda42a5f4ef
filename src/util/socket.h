// Plain TCP sockets: address parsing and resolution, a listening socket,
// connecting and exchanging whole messages under a deadline. remem's own
// handshake (proto/wire.h) runs over these before UCX is involved.
//
// Thread contract: free functions; a Socket is used by one thread at a
// time.

#ifndef REMEM_UTIL_SOCKET_H_
#define REMEM_UTIL_SOCKET_H_

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem::util {

using Deadline = std::chrono::steady_clock::time_point;

// Parses "host:port" or "[v6]:port" (a port of 0 to 65535; InvalidArgument
// for anything else, "host:port:5" and an unbracketed "::1:7400" included).
Status ParseHostPort(const std::string& s, std::string* host, uint16_t* port);

// Resolves "host:port" to a socket address (`passive`: for listening, where
// host "*" means any address).
Status ResolveAddress(const std::string& address, bool passive,
                      sockaddr_storage* out, socklen_t* out_len);

// "ip:port" of a socket address.
std::string FormatAddress(const sockaddr_storage& addr);

// The name of the network interface that holds `ip` ("lo" for 127.0.0.1),
// or an empty string for a wildcard address (0.0.0.0, ::) or one no
// interface holds.
std::string InterfaceOf(const sockaddr_storage& addr);

// An owned file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close();

 private:
  int fd_ = -1;
};

// A non-blocking listening socket with SO_REUSEADDR (a restarted server
// binds again at once, whatever connections of its predecessor linger in
// TIME_WAIT). Port 0 picks a free port. Unavailable if the address is in
// use.
Result<Socket> Listen(const std::string& address, int backlog);
// The bound "host:port" of a socket.
Result<std::string> LocalAddress(int fd);

// This process's open descriptors and its soft limit on them (0 for what
// cannot be read). For messages: a library that failed for want of a
// descriptor (UCX making an endpoint) does not say so. Any thread.
struct OpenFiles {
  size_t open = 0;   // descriptors open
  size_t limit = 0;  // RLIMIT_NOFILE: new descriptors are numbered below it
  size_t free = 0;   // numbers below the limit not in use
  // At most `margin` descriptors could still be made.
  bool Exhausted(size_t margin) const { return limit > 0 && free <= margin; }
};
OpenFiles CountOpenFiles();

// Connects (non-blocking underneath) within `deadline`, trying each address
// the name resolves to in turn (localhost: 127.0.0.1 and ::1); the first
// failure if none answers. The returned socket is non-blocking, with
// TCP_NODELAY and keepalive.
Result<Socket> Connect(const std::string& address, Deadline deadline);

// Writes all of `data`, waiting for the socket as needed until `deadline`.
Status SendAll(int fd, std::string_view data, Deadline deadline);
// Reads exactly `n` bytes into `out`, until `deadline`. Unavailable if the
// peer closes first.
Status RecvExact(int fd, size_t n, std::string* out, Deadline deadline);

Status SetNonBlocking(int fd);
// TCP_NODELAY, and keepalive probes that find a vanished peer host in
// about `keepalive_s` seconds.
void TuneConnection(int fd, int keepalive_s);

// For a connected socket: false once the peer has closed it or it failed
// (a non-blocking peek; no data is consumed). True while it is open.
bool PeerStillThere(int fd);
// The same, waiting up to `wait` for the peer to close it: false as soon as
// it has; true if it is still open after `wait`.
bool PeerStillThereAfter(int fd, std::chrono::milliseconds wait);

}  // namespace remem::util

#endif  // REMEM_UTIL_SOCKET_H_
