#include "server/acceptor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "proto/codec.h"
#include "util/log.h"

namespace remem::server {

namespace {

using Clock = std::chrono::steady_clock;

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

constexpr uint64_t kListenTag = ~uint64_t{0};
constexpr uint64_t kEventTag = ~uint64_t{1};

}  // namespace

struct Acceptor::Peer {
  enum State { kHello, kAdmitting, kSession, kClosing };
  util::Socket sock;
  std::string name;  // "ip:port"
  State state = kHello;
  // Its entry in deadlines_, if it has one.
  std::multimap<Clock::time_point, Peer*>::iterator deadline;
  bool has_deadline = false;
  HelloReader hello;    // until admitted
  std::string out;      // bytes still to send
  ConnectionId id = 0;  // once admitting
  uint32_t thread = 0;  // once admitting
};

Result<std::unique_ptr<Acceptor>> Acceptor::Bind(const AcceptorOptions& options,
                                                 AdmitFn admit,
                                                 ClosedFn closed) {
  std::unique_ptr<Acceptor> a(new Acceptor());
  a->options_ = options;
  a->admit_ = std::move(admit);
  a->closed_ = std::move(closed);
  auto l = util::Listen(options.listen, 4096);
  if (!l.ok()) return l.status();
  a->listen_ = std::move(*l);
  auto addr = util::LocalAddress(a->listen_.fd());
  if (!addr.ok()) return addr.status();
  a->address_ = *addr;
  {
    std::string host;
    (void)util::ParseHostPort(a->address_, &host, &a->port_);
  }
  a->epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  a->event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (a->epoll_ < 0 || a->event_fd_ < 0) {
    return Status::IOError(std::string("epoll/eventfd: ") +
                           std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(a->epoll_, EPOLL_CTL_ADD, a->listen_.fd(), &ev);
  ev.data.u64 = kEventTag;
  ::epoll_ctl(a->epoll_, EPOLL_CTL_ADD, a->event_fd_, &ev);
  return a;
}

Status Acceptor::Start() {
  if (thread_.joinable()) return Status::Internal("acceptor already started");
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

Acceptor::~Acceptor() {
  Stop();
  if (epoll_ >= 0) ::close(epoll_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

void Acceptor::Stop() {
  if (stop_.exchange(true)) return;
  Notify();
  if (thread_.joinable()) thread_.join();
  peers_.clear();  // closes every socket: clients see the server go
  sessions_.clear();
  listen_.Close();
}

void Acceptor::Notify() {
  const uint64_t one = 1;
  (void)!::write(event_fd_, &one, sizeof(one));
}

void Acceptor::SessionClosed(ConnectionId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back({id, false, Status::OK(), {}});
  }
  Notify();
}

void Acceptor::Run() {
  std::vector<epoll_event> events(256);
  while (!stop_.load(std::memory_order_acquire)) {
    const auto now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    if (!deadlines_.empty()) wake = deadlines_.begin()->first;
    if (listen_paused_until_ != Clock::time_point{}) {
      if (listen_paused_until_ <= now) {
        listen_paused_until_ = {};
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenTag;
        ::epoll_ctl(epoll_, EPOLL_CTL_MOD, listen_.fd(), &ev);
      } else {
        wake = std::min(wake, listen_paused_until_);
      }
    }
    int timeout_ms = -1;
    if (wake != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(wake - now)
              .count() +
          1;
      timeout_ms = int(std::clamp<int64_t>(left, 0, 1000));
    }
    const int n =
        ::epoll_wait(epoll_, events.data(), int(events.size()), timeout_ms);
    for (int i = 0; i < n && !stop_.load(std::memory_order_relaxed); ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        OnListen();
        continue;
      }
      if (tag == kEventTag) {
        DrainEvents();
        continue;
      }
      auto it = peers_.find(int(tag));
      if (it == peers_.end()) continue;
      Peer* p = it->second.get();
      if (events[i].events & EPOLLOUT) {
        // Flush what was waiting to be sent.
        while (!p->out.empty()) {
          const ssize_t w =
              ::send(p->sock.fd(), p->out.data(), p->out.size(), MSG_NOSIGNAL);
          if (w > 0) {
            p->out.erase(0, size_t(w));
          } else {
            if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
            Close(p);
            p = nullptr;
            break;
          }
        }
        if (p == nullptr) continue;
        if (p->out.empty()) {
          if (p->state == Peer::kClosing) {
            // The refusal is out: let the client read it before the close.
            ::shutdown(p->sock.fd(), SHUT_WR);
          }
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.u64 = uint64_t(p->sock.fd());
          ::epoll_ctl(epoll_, EPOLL_CTL_MOD, p->sock.fd(), &ev);
        }
      }
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        OnReadable(p);
      }
    }
    ExpireHandshakes();
  }
}

void Acceptor::SetDeadline(Peer* p, Clock::time_point when) {
  ClearDeadline(p);
  p->deadline = deadlines_.emplace(when, p);
  p->has_deadline = true;
}

void Acceptor::ClearDeadline(Peer* p) {
  if (!p->has_deadline) return;
  deadlines_.erase(p->deadline);
  p->has_deadline = false;
}

void Acceptor::PauseListening() {
  // Level-triggered: a pending connection we cannot accept would wake us
  // at once, forever. Stop listening for a moment instead; connections wait
  // in the backlog.
  listen_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
  epoll_event ev{};
  ev.events = 0;
  ev.data.u64 = kListenTag;
  ::epoll_ctl(epoll_, EPOLL_CTL_MOD, listen_.fd(), &ev);
}

void Acceptor::OnListen() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listen_.fd(), reinterpret_cast<sockaddr*>(&ss),
                             &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // Rate-limited as refusals are: the pause repeats ten times a
        // second while the condition lasts.
        LogRefusal("a client not yet accepted",
                   Status::IOError(std::string("cannot accept: ") +
                                   std::strerror(errno) +
                                   "; pausing 100 ms (raise the open-files "
                                   "limit, or lower --max-connections)"));
        PauseListening();
      }
      return;  // EAGAIN: no more for now
    }
    auto p = std::make_unique<Peer>();
    p->sock = util::Socket(fd);
    p->name = util::FormatAddress(ss);
    util::TuneConnection(fd, 10);
    Peer* raw = p.get();
    peers_.emplace(fd, std::move(p));
    SetDeadline(raw, Clock::now() + options_.handshake_timeout);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = uint64_t(fd);
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    // Every connection in kHello counts in pending_ until it leaves that
    // state (Admit, Refuse or Close), refused ones included.
    ++pending_;
    if (counters_.sessions.Get() + pending_ > options_.max_connections) {
      counters_.refused_busy.Add(1);
      Refuse(raw, Status::Busy("the server has reached its limit of " +
                               std::to_string(options_.max_connections) +
                               " connections (sessions and handshakes in "
                               "progress together: --max-connections)"));
      continue;
    }
    if (pending_ > options_.max_pending) {
      counters_.refused_busy.Add(1);
      Refuse(raw, Status::Busy("too many connections are being set up at "
                               "once; try again"));
      continue;
    }
  }
}

void Acceptor::OnReadable(Peer* p) {
  if (p->state == Peer::kSession || p->state == Peer::kAdmitting) {
    // Nothing may arrive after the handshake but the goodbye: either the
    // peer ended the session (in order, or it went away) or it misbehaves.
    // Either way the session ends.
    char c;
    const ssize_t r = ::recv(p->sock.fd(), &c, 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    const bool goodbye = r == 1 && uint8_t(c) == proto::kSessionGoodbye &&
                         p->state == Peer::kSession;
    if (r > 0 && !goodbye) {
      log::Warn("session {} from {}: bytes after the handshake; closing it",
                p->id, p->name);
    }
    return Close(p, goodbye);
  }
  if (p->state == Peer::kClosing) {
    char buf[4096];
    const ssize_t r = ::recv(p->sock.fd(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) Close(p);
    return;  // discard whatever else it sends while the refusal goes out
  }
  // kHello: read what is there, never more than the hello can hold; the
  // reader judges each part as soon as it is in (hello_reader.h).
  for (;;) {
    const size_t want = p->hello.Wanted();
    if (want == 0) break;
    char buf[16384];
    const ssize_t r =
        ::recv(p->sock.fd(), buf, std::min(sizeof(buf), want), MSG_DONTWAIT);
    if (r == 0) {
      counters_.handshake_failures.Add(1);
      log::Debug("connection from {} closed during the handshake", p->name);
      return Close(p);
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      counters_.handshake_failures.Add(1);
      return Close(p);
    }
    if (Status st = p->hello.Feed(std::string_view(buf, size_t(r))); !st.ok()) {
      counters_.handshake_failures.Add(1);
      return Refuse(p, st);
    }
  }
  auto hello = p->hello.Take();
  if (!hello.ok()) {
    counters_.handshake_failures.Add(1);
    return Refuse(p, hello.status());
  }
  if (!options_.secret.empty() &&
      !ConstantTimeEqual(hello->secret, options_.secret)) {
    counters_.auth_failures.Add(1);
    return Refuse(p, Status::PermissionDenied(
                         hello->secret.empty()
                             ? "this server requires a shared secret "
                               "(--auth-file)"
                             : "authentication failed: wrong shared secret"));
  }
  // Only now, and only checked, do the client's bytes go to UCX.
  if (Status st =
          options_.address_check.Check(hello->worker_address, p->sock.fd());
      !st.ok()) {
    counters_.handshake_failures.Add(1);
    return Refuse(p, st);
  }
  Admit(p, std::move(hello->worker_address));
}

void Acceptor::Admit(Peer* p, std::string worker_address) {
  ClearDeadline(p);
  p->state = Peer::kAdmitting;
  p->id = next_id_.fetch_add(1);
  p->thread = next_thread_.fetch_add(1) % options_.server_threads;
  sessions_.emplace(p->id, p);
  --pending_;
  counters_.sessions.Add(1);
  const ConnectionId id = p->id;
  admit_(p->thread, id, p->name, std::move(worker_address),
         [this, id](Status st, std::string address, uint64_t number) {
           {
             std::lock_guard<std::mutex> lock(mu_);
             events_.push_back(
                 {id, true, std::move(st), std::move(address), number});
           }
           Notify();
         });
}

void Acceptor::DrainEvents() {
  uint64_t n;
  (void)!::read(event_fd_, &n, sizeof(n));
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(events_);
  }
  for (Event& e : events) {
    auto it = sessions_.find(e.id);
    if (it == sessions_.end()) continue;  // its socket closed meanwhile
    Peer* p = it->second;
    if (!e.admitted) {
      // The server dropped the session (its endpoint failed): let the
      // client see it.
      sessions_.erase(it);
      counters_.sessions.Set(counters_.sessions.Get() - 1);
      p->id = 0;
      Close(p);
      continue;
    }
    if (!e.status.ok()) {
      sessions_.erase(it);
      counters_.sessions.Set(counters_.sessions.Get() - 1);
      p->id = 0;
      counters_.handshake_failures.Add(1);
      Refuse(p, e.status);
      continue;
    }
    counters_.handshakes.Add(1);
    log::Debug("session {} from {} on thread {}", p->id, p->name, p->thread);
    proto::ServerHelloInfo hello;
    hello.worker_address = std::move(e.worker_address);
    hello.incarnation = options_.incarnation;
    hello.session_id = p->id;
    hello.server_threads = options_.server_threads;
    hello.lease_ms = options_.lease_ms;
    hello.endpoint_number = e.endpoint_number;
    p->state = Peer::kSession;
    p->out = proto::EncodeServerHello(hello);
    const ssize_t w =
        ::send(p->sock.fd(), p->out.data(), p->out.size(), MSG_NOSIGNAL);
    if (w > 0) p->out.erase(0, size_t(w));
    if (!p->out.empty()) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
      ev.data.u64 = uint64_t(p->sock.fd());
      ::epoll_ctl(epoll_, EPOLL_CTL_MOD, p->sock.fd(), &ev);
    }
  }
}

void Acceptor::LogRefusal(const std::string& peer, const Status& why) {
  // At most one refusal a second is logged as a warning, so that a flood of
  // hostile connections cannot flood the log; the rest go to debug.
  const auto now = Clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(1)) {
    ++quiet_refusals_;
    log::Debug("refusing a connection from {}: {}", peer, why.ToString());
    return;
  }
  if (quiet_refusals_ > 0) {
    log::Warn(
        "refusing a connection from {}: {} ({} more refused since the last "
        "such message)",
        peer, why.ToString(), quiet_refusals_);
  } else {
    log::Warn("refusing a connection from {}: {}", peer, why.ToString());
  }
  last_refusal_log_ = now;
  quiet_refusals_ = 0;
}

void Acceptor::Refuse(Peer* p, Status why) {
  LogRefusal(p->name, why);
  if (p->state == Peer::kHello) --pending_;
  p->state = Peer::kClosing;
  proto::ServerHelloInfo hello;
  hello.status = std::move(why);
  hello.incarnation = options_.incarnation;
  p->out = proto::EncodeServerHello(hello);
  const ssize_t w =
      ::send(p->sock.fd(), p->out.data(), p->out.size(), MSG_NOSIGNAL);
  if (w > 0) p->out.erase(0, size_t(w));
  // Let the client read the refusal before the close: shut down our side
  // once it is out and keep the socket (discarding what the client still
  // sends, so that the close is not a reset that could destroy the refusal)
  // until the client closes, at most a second.
  SetDeadline(p, Clock::now() + std::chrono::seconds(1));
  if (p->out.empty()) {
    ::shutdown(p->sock.fd(), SHUT_WR);
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
  ev.data.u64 = uint64_t(p->sock.fd());
  ::epoll_ctl(epoll_, EPOLL_CTL_MOD, p->sock.fd(), &ev);
}

void Acceptor::Close(Peer* p, bool goodbye) {
  const int fd = p->sock.fd();
  ClearDeadline(p);
  if (p->state == Peer::kHello) --pending_;
  if (p->id != 0) {
    auto it = sessions_.find(p->id);
    if (it != sessions_.end()) {
      sessions_.erase(it);
      counters_.sessions.Set(counters_.sessions.Get() - 1);
      // Admitting or in session: the thread holds (or will hold) an
      // endpoint for it. Release it there.
      closed_(p->thread, p->id, goodbye);
    }
  }
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  peers_.erase(fd);  // closes the socket
}

void Acceptor::ExpireHandshakes() {
  const auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Peer* p = deadlines_.begin()->second;
    ClearDeadline(p);
    if (p->state == Peer::kHello) {
      // The timeout is the client's, not this thread's: a hello that came in
      // while this thread was busy with other peers (a storm of clients,
      // each with its address check, on a loaded machine) is on time,
      // though its readiness was not handled yet. Take what the client has
      // sent first; refuse it only if the hello is still incomplete.
      const int fd = p->sock.fd();
      OnReadable(p);  // may admit, refuse or close it
      if (peers_.find(fd) == peers_.end() || p->state != Peer::kHello) {
        continue;
      }
      counters_.handshake_failures.Add(1);
      log::Debug("connection from {}: no handshake within {} ms", p->name,
                 options_.handshake_timeout.count());
      Refuse(p,
             Status::TimedOut(
                 "no handshake within " +
                 std::to_string(options_.handshake_timeout.count()) + " ms"));
      continue;
    }
    Close(p);  // a refusal the client never read to the end
  }
}

}  // namespace remem::server
