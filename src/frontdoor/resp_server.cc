#include "frontdoor/resp_server.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "client/session_core.h"
#include "fabric/worker.h"
#include "frontdoor/resp.h"
#include "remem/cluster.h"
#include "remem/hash.h"
#include "remem/ops.h"
#include "remem/session.h"
#include "remem/version.h"
#include "util/log.h"
#include "util/socket.h"

namespace remem::frontdoor {

namespace {

using Clock = std::chrono::steady_clock;

// Replies owed to one connection and not sent yet: past this many its
// requests wait in the socket (Redis's clients pipeline thousands).
constexpr size_t kMaxPendingReplies = 4096;
// Bytes of replies not yet taken by the client before its requests wait.
constexpr size_t kMaxUnsentBytes = 64u << 20;
// How often the thread tries to open its session while it has none.
constexpr auto kConnectRetry = std::chrono::milliseconds(200);
// While commands are in flight the thread polls for their answers this
// long after its last work, then sleeps on the session's worker for at
// most kNap at a time.
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kNap = std::chrono::milliseconds(1);
// How long a connection may take none of the replies it is owed before it
// counts as not reading (RespServer::Impl::Shed).
constexpr auto kStalled = std::chrono::seconds(1);
// How long a connection closed for sending reads and drops what its client
// still sends (RespServer::Impl::Linger).
constexpr auto kLinger = std::chrono::seconds(2);
// A compare-and-swap that keeps losing to other writers (INCR, SET XX).
constexpr int kMaxCasAttempts = 1000;

// remem's statuses as Redis error replies: the code word first.
std::string ErrorOf(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOutOfMemory:
      return "OOM " + st.ToString();
    default:
      return "ERR " + st.ToString();
  }
}

// What the front door asks of remem: a session's stores, or a cluster.
class Backend {
 public:
  virtual ~Backend() = default;
  // `any_path`: no write of the connection is in flight, so the read may
  // take the store's read path (one-sided: it is not ordered with what is
  // sent beside it); otherwise it goes by RPC, after those writes.
  virtual void Get(std::string_view key, bool any_path,
                   HashStore::GetCallback done) = 0;
  virtual void MultiGet(const std::vector<std::string_view>& keys,
                        bool any_path, HashStore::MultiGetCallback done) = 0;
  virtual void Put(std::string_view key, std::string_view value,
                   HashStore::VersionCallback done) = 0;
  virtual void Delete(std::string_view key, HashStore::Callback done) = 0;
  // Synchronous, by RPC (the steps of INCR, SET NX/XX, APPEND).
  virtual Result<HashStore::Value> GetNow(std::string_view key) = 0;
  virtual Result<uint64_t> PutIfAbsent(std::string_view key,
                                       std::string_view value) = 0;
  virtual Result<uint64_t> CompareAndPut(std::string_view key,
                                         std::string_view value,
                                         uint64_t expected) = 0;
  virtual Result<OpReply> Execute(const Op& op) = 0;
  virtual size_t Poll() = 0;
  // Blocks until the session's worker has an event (a reply) or `timeout`.
  virtual void Sleep(std::chrono::milliseconds timeout) = 0;
  // The session lost its server (it restarted, or the session broke): a
  // new one is needed. (A cluster reconnects by itself.)
  virtual bool broken() const { return false; }
  virtual size_t in_flight() const = 0;
  // The larger of the largest key and the largest value.
  virtual size_t max_bulk() const = 0;
  // The largest key and value the store takes (HashStore::max_key,
  // max_value).
  virtual size_t max_key() const = 0;
  virtual size_t max_value() const = 0;
  // Pipelined commands of one connection keep their order (one server's
  // session does them in issue order); false: each waits for the last.
  virtual bool ordered_pipelining() const = 0;
  // Reads of the read-path store may be one-sided copies of mapped memory
  // (shared memory); false: they would be served, a round trip each.
  virtual bool local_reads() const { return false; }
};

class SessionBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Connect(const SessionOptions& o) {
    auto b = std::unique_ptr<SessionBackend>(new SessionBackend());
    auto session = Session::Connect(o);
    if (!session.ok()) return session.status();
    b->session_ = std::move(*session);
    // The read-path store first: the session flushes its stores in the
    // order they were opened, so its reads are done (or sent) before the
    // RPCs the other store queued after them.
    HashOptions ordered;
    ordered.ordered_gets = true;
    auto any = HashStore::Open(b->session_.get(), ordered);
    if (!any.ok()) return any.status();
    b->any_ = std::move(*any);
    HashOptions by_rpc;
    by_rpc.read_path = ReadPath::kRpc;
    auto rpc = HashStore::Open(b->session_.get(), by_rpc);
    if (!rpc.ok()) return rpc.status();
    b->rpc_ = std::move(*rpc);
    auto ops = OpsStore::Open(b->session_.get());
    if (!ops.ok()) return ops.status();
    b->ops_ = std::move(*ops);
    return std::unique_ptr<Backend>(std::move(b));
  }
  ~SessionBackend() override {
    ops_.reset();
    any_.reset();
    rpc_.reset();
    session_.reset();
  }
  void Get(std::string_view key, bool any_path,
           HashStore::GetCallback done) override {
    (any_path ? any_ : rpc_)->GetAsync(key, std::move(done));
  }
  void MultiGet(const std::vector<std::string_view>& keys, bool any_path,
                HashStore::MultiGetCallback done) override {
    (any_path ? any_ : rpc_)->MultiGetAsync(keys, std::move(done));
  }
  void Put(std::string_view key, std::string_view value,
           HashStore::VersionCallback done) override {
    rpc_->PutAsync(key, value, std::move(done));
  }
  void Delete(std::string_view key, HashStore::Callback done) override {
    rpc_->DeleteAsync(key, std::move(done));
  }
  Result<HashStore::Value> GetNow(std::string_view key) override {
    return rpc_->Get(key);
  }
  Result<uint64_t> PutIfAbsent(std::string_view key,
                               std::string_view value) override {
    return rpc_->PutIfAbsent(key, value);
  }
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected) override {
    return rpc_->CompareAndPut(key, value, expected);
  }
  Result<OpReply> Execute(const Op& op) override { return ops_->Execute(op); }
  size_t Poll() override { return session_->Poll(); }
  void Sleep(std::chrono::milliseconds timeout) override {
    session_->core()->worker()->Sleep(timeout);
  }
  bool broken() const override { return !session_->connected(); }
  size_t in_flight() const override {
    return rpc_->in_flight() + any_->in_flight();
  }
  size_t max_bulk() const override {
    return std::max(rpc_->max_key(), rpc_->max_value());
  }
  size_t max_key() const override { return rpc_->max_key(); }
  size_t max_value() const override { return rpc_->max_value(); }
  bool ordered_pipelining() const override { return true; }
  bool local_reads() const override { return session_->reads_are_local(); }

 private:
  SessionBackend() = default;
  std::unique_ptr<Session> session_;
  std::unique_ptr<HashStore> rpc_, any_;
  std::unique_ptr<OpsStore> ops_;
};

class ClusterBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Connect(
      const SessionOptions& o, const std::vector<std::string>& seeds) {
    ClusterOptions co;
    co.seeds = seeds;
    co.session = o;
    auto c = Cluster::Connect(co);
    if (!c.ok()) return c.status();
    auto b = std::unique_ptr<ClusterBackend>(new ClusterBackend());
    b->cluster_ = std::move(*c);
    // The largest the members accept: a store of the seed's session.
    auto s = Session::Connect(o);
    if (!s.ok()) return s.status();
    auto h = HashStore::Open(s->get());
    if (!h.ok()) return h.status();
    b->max_key_ = (*h)->max_key();
    b->max_value_ = (*h)->max_value();
    h->reset();
    return std::unique_ptr<Backend>(std::move(b));
  }
  void Get(std::string_view key, bool, HashStore::GetCallback done) override {
    cluster_->GetAsync(key, std::move(done));
  }
  void MultiGet(const std::vector<std::string_view>& keys, bool,
                HashStore::MultiGetCallback done) override {
    cluster_->MultiGetAsync(keys, std::move(done));
  }
  void Put(std::string_view key, std::string_view value,
           HashStore::VersionCallback done) override {
    cluster_->PutAsync(key, value, std::move(done));
  }
  void Delete(std::string_view key, HashStore::Callback done) override {
    cluster_->DeleteAsync(key, std::move(done));
  }
  Result<HashStore::Value> GetNow(std::string_view key) override {
    return cluster_->Get(key);
  }
  Result<uint64_t> PutIfAbsent(std::string_view key,
                               std::string_view value) override {
    return cluster_->PutIfAbsent(key, value);
  }
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected) override {
    return cluster_->CompareAndPut(key, value, expected);
  }
  Result<OpReply> Execute(const Op& op) override {
    return cluster_->Execute(op);
  }
  size_t Poll() override { return cluster_->Poll(); }
  void Sleep(std::chrono::milliseconds timeout) override {
    cluster_->loop()->core()->worker()->Sleep(timeout);
  }
  size_t in_flight() const override { return cluster_->in_flight(); }
  size_t max_bulk() const override { return std::max(max_key_, max_value_); }
  size_t max_key() const override { return max_key_; }
  size_t max_value() const override { return max_value_; }
  // Operations refused by a member that no longer owns their shard are
  // sent again after a refresh: two of one connection may then cross.
  bool ordered_pipelining() const override { return false; }

 private:
  ClusterBackend() = default;
  std::unique_ptr<Cluster> cluster_;
  size_t max_key_ = 0, max_value_ = 0;
};

}  // namespace

struct RespServer::Impl {
  struct Slot {
    bool done = false;
    bool any = false;  // a read that may be one-sided (Conn::any_reads)
    std::string reply;
  };
  struct Conn {
    int fd = -1;
    std::string in;
    size_t in_off = 0;
    std::string out;
    size_t out_off = 0;
    std::deque<std::unique_ptr<Slot>> slots;  // replies owed, in order
    size_t in_flight = 0;  // commands of this connection in flight
    size_t any_reads = 0;  // of those, reads that may be one-sided
    bool barrier = false;  // one in flight holds the later ones back
    bool closed = false;   // the socket is gone (replies are dropped)
    bool closing = false;  // close once what is owed has been sent
    bool eof = false;      // the client closed its side
    // Replies sent and our side shut: what comes is read and dropped until
    // the client closes too, or linger_until (Linger).
    bool lingering = false;
    Clock::time_point linger_until{};
    bool authed = false;  // AUTH given (or no secret needed)
    // A MULTI was refused: the commands up to its EXEC or DISCARD are
    // answered with an error and not run.
    bool refused_multi = false;
    std::string name;  // CLIENT SETNAME's (empty: none)
    size_t owed = 0;   // bytes of replies made and not yet sent
    // When it last took bytes of its replies, or when replies began to
    // wait for it: one that takes none for kStalled is not reading (Shed).
    Clock::time_point last_taken{};
    uint32_t events = 0;  // what epoll waits for on fd
  };
  using ConnPtr = std::shared_ptr<Conn>;

  RespOptions options;
  util::Socket listener;
  int epoll_fd = -1;
  int stop_fd = -1;
  std::unique_ptr<Backend> backend;
  Status connect_status = Status::Unavailable("connecting");
  Clock::time_point next_connect{};
  std::unordered_map<int, ConnPtr> conns;
  std::vector<ConnPtr> dirty;      // connections to serve and flush
  std::vector<ConnPtr> lingering;  // closed for sending (Linger)
  size_t owed_total = 0;           // the connections' owed, summed
  std::vector<std::string> args;

  ~Impl() {
    for (auto& [fd, c] : conns) {
      ::close(fd);
      c->closed = true;
    }
    conns.clear();
    backend.reset();  // waits for what is in flight
    if (epoll_fd >= 0) ::close(epoll_fd);
    if (stop_fd >= 0) ::close(stop_fd);
  }

  // The longest argument taken: the largest key or value, and at least a
  // secret's (kMaxSecretBytes), so that AUTH takes any secret.
  size_t max_bulk() const {
    return backend != nullptr ? std::max(backend->max_bulk(), kMaxSecretBytes)
                              : size_t{64} << 20;
  }
  // Buffered request bytes past which a request that is still incomplete
  // is refused (it could never be held): 64 MiB, or two of the largest
  // bulk strings if that is more. (Two bulk strings alone refused an MSET
  // of many pairs under small limits, or of three 16 MiB values, that
  // Redis takes, and whether it was refused hung on how its bytes
  // arrived; found black-box.)
  size_t max_request() const {
    return std::max(kMaxRequestBytes, 2 * max_bulk() + kMaxInlineBytes);
  }
  static constexpr size_t kMaxRequestBytes = size_t{64} << 20;
  // Before AUTH (with a secret) only AUTH, HELLO and QUIT do anything, and
  // their arguments are names and a secret: a peer without the secret may
  // not make the front door hold megabytes for it (Redis 6.2.6 and later
  // refuse such a peer's long arguments too).
  size_t bulk_limit(const Conn& c) const {
    return c.authed ? max_bulk() : kMaxSecretBytes;
  }
  size_t request_limit(const Conn& c) const {
    return c.authed ? max_request() : kMaxInlineBytes + 4 * kMaxSecretBytes;
  }

  void Run();
  void TryConnect();
  void Accept();
  void Read(const ConnPtr& c);
  void Write(const ConnPtr& c);
  void Linger(const ConnPtr& c);
  void Shed();
  void Serve(const ConnPtr& c);
  void Flush(const ConnPtr& c);
  void Close(const ConnPtr& c);
  void Watch(const ConnPtr& c);
  // Runs one command; false if it must wait for the connection's commands
  // in flight (it was not consumed).
  bool Dispatch(const ConnPtr& c, std::vector<std::string>& a);
  Slot* NewSlot(const ConnPtr& c) {
    c->slots.push_back(std::make_unique<Slot>());
    return c->slots.back().get();
  }
  void Reply(const ConnPtr& c, std::string reply) {
    Slot* s = NewSlot(c);
    Owe(c, reply.size());
    s->reply = std::move(reply);
    s->done = true;
  }
  // Marks `s` answered with `reply` (from a callback).
  void Complete(const ConnPtr& c, Slot* s, std::string reply) {
    if (c->closed) reply.clear();  // nobody will read it
    Owe(c, reply.size());
    s->reply = std::move(reply);
    s->done = true;
    --c->in_flight;
    if (s->any) --c->any_reads;
    c->barrier = false;
    dirty.push_back(c);
  }
  void Owe(const ConnPtr& c, size_t bytes) {
    c->owed += bytes;
    owed_total += bytes;
  }
  void Began(const ConnPtr& c, bool barrier) {
    ++c->in_flight;
    if (barrier) c->barrier = true;
  }
  // The synchronous commands.
  std::string Incr(const std::string& key, int64_t by);
  std::string SetConditional(const std::string& key, const std::string& value,
                             bool nx, bool xx);
  // AUTH's check of the secret: OK (the connection is authenticated) or
  // WRONGPASS (it keeps whatever it had, as Redis 7 does). Without a
  // secret, a user name and password (`with_user`) are taken as Redis 7's
  // default user without a password takes them; a lone password is an
  // error, as there.
  std::string Authenticate(const ConnPtr& c, const std::string& given,
                           bool with_user);
  // HELLO [2 [AUTH user secret] [SETNAME name]].
  void Hello(const ConnPtr& c, const std::vector<std::string>& a);
  // CLIENT SETNAME's rule (Redis's): no spaces, newlines or other
  // characters outside '!'..'~'; an empty name clears it.
  std::string SetName(const ConnPtr& c, const std::string& name);
  // A command's keys (and values) past the store's limits, checked before
  // any of it runs, so that a multi-key command is refused whole: an
  // error reply, or empty.
  std::string CheckArgs(const std::vector<std::string>& a, size_t first,
                        size_t step, bool values) const;
};

Result<std::unique_ptr<RespServer>> RespServer::Start(RespOptions options) {
  std::string host;
  uint16_t port = 0;
  REMEM_RETURN_IF_ERROR(util::ParseHostPort(options.listen, &host, &port));
  auto listener = util::Listen(options.listen, 511);
  if (!listener.ok()) {
    return Status::IOError("the Redis front door (--resp) cannot listen on " +
                           options.listen + ": " +
                           listener.status().ToString());
  }
  auto bound = util::LocalAddress(listener->fd());
  if (!bound.ok()) return bound.status();
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->listener = std::move(*listener);
  impl->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epoll_fd < 0 || impl->stop_fd < 0) {
    return Status::IOError(std::string("epoll/eventfd: ") +
                           std::strerror(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = impl->listener.fd();
  ::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->listener.fd(), &ev);
  ev.data.fd = impl->stop_fd;
  ::epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->stop_fd, &ev);
  auto server = std::unique_ptr<RespServer>(new RespServer());
  server->address_ = *bound;
  server->impl_ = std::move(impl);
  Impl* raw = server->impl_.get();
  server->thread_ = std::thread([raw] { raw->Run(); });
  return server;
}

void RespServer::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  ssize_t w = ::write(impl_->stop_fd, &one, sizeof(one));
  (void)w;
  thread_.join();
  impl_.reset();
}

RespServer::~RespServer() { Stop(); }

void RespServer::Impl::TryConnect() {
  if (Clock::now() < next_connect) return;
  auto b =
      options.cluster_seeds.empty()
          ? SessionBackend::Connect(options.session)
          : ClusterBackend::Connect(options.session, options.cluster_seeds);
  if (b.ok()) {
    backend = std::move(*b);
    log::Info("Redis front door: connected to {}", options.cluster_seeds.empty()
                                                       ? options.session.server
                                                       : "the cluster");
    return;
  }
  if (b.status().ToString() != connect_status.ToString()) {
    log::Warn("Redis front door: cannot reach the store yet: {}",
              b.status().ToString());
  }
  connect_status = b.status();
  next_connect = Clock::now() + kConnectRetry;
}

void RespServer::Impl::Run() {
  std::vector<epoll_event> events(128);
  Clock::time_point last_work = Clock::now();
  for (;;) {
    if (backend != nullptr && backend->in_flight() == 0 && backend->broken()) {
      log::Warn(
          "Redis front door: the session to the store broke; "
          "connecting again");
      backend.reset();
      connect_status = Status::Unavailable("the session to the store broke");
    }
    if (backend == nullptr) TryConnect();
    const bool waiting = backend != nullptr && backend->in_flight() > 0;
    int timeout_ms = backend == nullptr ? 50 : 100;
    if (!dirty.empty() || waiting) timeout_ms = 0;
    if (waiting && dirty.empty() && Clock::now() - last_work >= kSpin) {
      // Commands wait for the server's answers: sleep on its replies, not
      // in a spin. The server's thread may share this CPU (remem-server
      // pinned with taskset), and a spinning front door took the time it
      // needed to answer. Requests that arrive meanwhile are read once a
      // reply comes, or after kNap.
      backend->Sleep(kNap);
    }
    const int n =
        ::epoll_wait(epoll_fd, events.data(), int(events.size()), timeout_ms);
    if (n > 0) last_work = Clock::now();
    if (n < 0 && errno != EINTR) {
      log::Error("Redis front door: epoll_wait: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == stop_fd) return;
      if (fd == listener.fd()) {
        Accept();
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      ConnPtr c = it->second;
      const uint32_t ev = events[size_t(i)].events;
      if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) Read(c);
      if (!c->closed && (ev & EPOLLOUT)) Write(c);
    }
    if (!lingering.empty()) {
      const auto now = Clock::now();
      std::erase_if(lingering, [&](const ConnPtr& c) {
        if (!c->closed && now >= c->linger_until) Close(c);
        return c->closed;
      });
    }
    if (backend != nullptr && backend->Poll() > 0) last_work = Clock::now();
    // Serving a connection can complete commands of others (a synchronous
    // step polls the session): loop until nothing is left to do.
    while (!dirty.empty()) {
      std::vector<ConnPtr> now;
      now.swap(dirty);
      std::sort(now.begin(), now.end());
      now.erase(std::unique(now.begin(), now.end()), now.end());
      for (const ConnPtr& c : now) {
        if (c->closed) continue;
        Serve(c);
        Flush(c);
      }
    }
    if (owed_total > options.max_unread_bytes) Shed();
  }
}

void RespServer::Impl::Accept() {
  for (;;) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        log::Warn("Redis front door: accept: {}", std::strerror(errno));
      }
      return;
    }
    if (conns.size() >= options.max_clients) {
      static constexpr char kFull[] = "-ERR max number of clients reached\r\n";
      ssize_t w = ::send(fd, kFull, sizeof(kFull) - 1, MSG_NOSIGNAL);
      (void)w;
      ::close(fd);
      continue;
    }
    util::TuneConnection(fd, 60);
    auto c = std::make_shared<Conn>();
    c->fd = fd;
    c->last_taken = Clock::now();
    c->authed = options.session.secret.empty();
    c->events = EPOLLIN;
    epoll_event ev{};
    ev.events = c->events;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      continue;
    }
    conns.emplace(fd, c);
  }
}

// Asks epoll for what `c` can use now: its requests only while it can take
// more, its socket's room only while replies wait.
void RespServer::Impl::Watch(const ConnPtr& c) {
  if (c->closed) return;
  uint32_t want = 0;
  const size_t buffered = c->in.size() - c->in_off;
  if (c->lingering) {
    want = EPOLLIN;
  } else if (!c->eof && !c->closing && buffered <= request_limit(*c) &&
             c->slots.size() < kMaxPendingReplies &&
             c->out.size() - c->out_off < kMaxUnsentBytes) {
    want |= EPOLLIN;
  }
  if (c->out_off < c->out.size()) want |= EPOLLOUT;
  if (want == c->events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.fd = c->fd;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c->fd, &ev);
  c->events = want;
}

void RespServer::Impl::Read(const ConnPtr& c) {
  char buf[64 * 1024];
  while (c->lingering) {
    const ssize_t r = ::recv(c->fd, buf, sizeof(buf), 0);
    if (r > 0) continue;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    Close(c);  // the client closed its side too, or reset
    return;
  }
  for (;;) {
    if (c->in.size() - c->in_off > request_limit(*c)) break;
    const ssize_t r = ::recv(c->fd, buf, sizeof(buf), 0);
    if (r > 0) {
      c->in.append(buf, size_t(r));
      continue;
    }
    if (r == 0) {
      c->eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    Close(c);  // reset by the peer
    return;
  }
  dirty.push_back(c);
}

void RespServer::Impl::Serve(const ConnPtr& c) {
  bool starved = c->in_off == c->in.size();  // all its requests were read
  while (!c->closed && !c->closing && !c->barrier &&
         c->slots.size() < kMaxPendingReplies &&
         c->out.size() - c->out_off < kMaxUnsentBytes) {
    const std::string_view pending = std::string_view(c->in).substr(c->in_off);
    size_t used = 0;
    std::string error;
    const Decoded d =
        DecodeRequest(pending, bulk_limit(*c), &args, &used, &error);
    const char* before_auth = c->authed ? "" : " before AUTH";
    if (d == Decoded::kNeedMore) {
      starved = true;
      if (pending.size() > request_limit(*c)) {
        Reply(c, "-ERR Protocol error: a request of over " +
                     std::to_string(request_limit(*c)) + " bytes" +
                     before_auth + "\r\n");
        c->closing = true;
      }
      break;
    }
    if (d == Decoded::kError) {
      if (!c->authed) {
        static constexpr std::string_view kLargest = "this server's largest";
        if (const size_t at = error.find(kLargest); at != std::string::npos) {
          error.replace(at, kLargest.size(), "the largest before AUTH");
        }
      }
      std::string r;
      AppendError(&r, "ERR " + error);
      Reply(c, std::move(r));
      c->closing = true;  // Redis closes too: the stream has lost its frame
      break;
    }
    if (d == Decoded::kCommand && !Dispatch(c, args)) break;
    c->in_off += used;
  }
  // Keep the unread tail only.
  if (c->in_off > 0 && (c->in_off == c->in.size() || c->in_off > (1u << 20))) {
    c->in.erase(0, c->in_off);
    c->in_off = 0;
  }
  // The client closed its side and every request it completed was taken:
  // close once the replies are sent (a request it left unfinished never
  // will be).
  if (c->eof && c->in_flight == 0 && starved) c->closing = true;
}

void RespServer::Impl::Flush(const ConnPtr& c) {
  // Bytes for it to take from now on: its wait starts now.
  if (c->out_off == c->out.size() && !c->slots.empty() &&
      c->slots.front()->done) {
    c->last_taken = Clock::now();
  }
  while (!c->slots.empty() && c->slots.front()->done) {
    c->out.append(c->slots.front()->reply);
    c->slots.pop_front();
  }
  Write(c);
}

void RespServer::Impl::Write(const ConnPtr& c) {
  while (!c->closed && c->out_off < c->out.size()) {
    const ssize_t w = ::send(c->fd, c->out.data() + c->out_off,
                             c->out.size() - c->out_off, MSG_NOSIGNAL);
    if (w > 0) {
      // Requests held back while replies piled up can go on now.
      if (c->in_off < c->in.size()) dirty.push_back(c);
      c->out_off += size_t(w);
      c->owed -= size_t(w);
      owed_total -= size_t(w);
      c->last_taken = Clock::now();
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    Close(c);
    return;
  }
  if (c->out_off == c->out.size()) {
    c->out.clear();
    c->out_off = 0;
    if (c->closing && c->slots.empty()) {
      if (c->eof) {
        Close(c);
      } else {
        Linger(c);
      }
      return;
    }
  }
  Watch(c);
}

// A close while the client's bytes still arrive (the rest of a request
// refused from its header, or commands pipelined after QUIT) makes the
// kernel reset the connection, and a reset discards the replies the client
// has not read yet: the error that says why it was closed. So shut our
// side only, and read and drop what comes until the client closes its side
// or kLinger has passed (Redis's clients read the reply once their send is
// done).
void RespServer::Impl::Linger(const ConnPtr& c) {
  if (c->lingering) return;
  ::shutdown(c->fd, SHUT_WR);
  c->lingering = true;
  c->linger_until = Clock::now() + kLinger;
  lingering.push_back(c);
  c->in.clear();
  c->in_off = 0;
  Watch(c);
}

void RespServer::Impl::Close(const ConnPtr& c) {
  if (c->closed) return;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  conns.erase(c->fd);
  c->closed = true;
  owed_total -= c->owed;
  c->owed = 0;
}

// Past options.max_unread_bytes of replies not taken, the connections that
// have taken none of theirs for kStalled are closed, those owed the most
// first, with their replies: clients that send and do not read (found
// black-box: 4,096 GETs of a 1 MiB value, never read, had the server hold
// 4 GB). A client that reads, however far behind, is left alone.
void RespServer::Impl::Shed() {
  const auto now = Clock::now();
  while (owed_total > options.max_unread_bytes) {
    ConnPtr most;
    for (const auto& [fd, c] : conns) {
      // Stalled: replies in its socket's way, none taken for kStalled.
      if (c->out_off == c->out.size() || now - c->last_taken < kStalled) {
        continue;
      }
      if (most == nullptr || c->owed > most->owed) most = c;
    }
    if (most == nullptr) return;
    log::Warn(
        "Redis front door: closing a connection owed {} bytes of replies it "
        "has not read for a second (--resp-max-unread: the front door holds "
        "at most {} bytes of replies not taken, all connections together)",
        most->owed, options.max_unread_bytes);
    Close(most);
  }
}

namespace {

// What a store command needs of the connection before it runs.
enum class Need {
  kOrdered,  // pipelined: sent in issue order
  kAlone,    // waits for the connection's commands in flight, then holds
             // back the later ones until it is done
};

std::string Arity(std::string_view name) {
  std::string r;
  AppendError(&r, "ERR wrong number of arguments for '" + std::string(name) +
                      "' command");
  return r;
}

std::string Err(std::string_view s) {
  std::string r;
  AppendError(&r, s);
  return r;
}

std::string Bulk(std::string_view s) {
  std::string r;
  AppendBulk(&r, s);
  return r;
}

std::string Int(int64_t v) {
  std::string r;
  AppendInteger(&r, v);
  return r;
}

std::string Simple(std::string_view s) {
  std::string r;
  AppendSimple(&r, s);
  return r;
}

constexpr std::string_view kNil = "$-1\r\n";

// How many found, or the first error that is not NotFound.
template <typename Results>
Result<int64_t> CountFound(const Results& results) {
  int64_t n = 0;
  for (const auto& r : results) {
    if (r.ok()) {
      ++n;
    } else if (r.status().code() != StatusCode::kNotFound) {
      return r.status();
    }
  }
  return n;
}

}  // namespace

std::string RespServer::Impl::Incr(const std::string& key, int64_t by) {
  for (int attempt = 0; attempt < kMaxCasAttempts; ++attempt) {
    auto v = backend->GetNow(key);
    const bool absent = !v.ok() && v.status().code() == StatusCode::kNotFound;
    if (!v.ok() && !absent) return Err(ErrorOf(v.status()));
    int64_t now = 0;
    if (!absent && !ParseInt64(v->value, &now)) {
      return Err("ERR value is not an integer or out of range");
    }
    int64_t next = 0;
    if (__builtin_add_overflow(now, by, &next)) {
      return Err("ERR increment or decrement would overflow");
    }
    const std::string text = std::to_string(next);
    auto r = backend->Execute(Op::CompareSwap(
        key, absent ? std::string() : v->value, text, /*create=*/absent));
    if (r.ok() && r->applied) return Int(next);
    if (r.ok() || r.status().code() == StatusCode::kNotFound) continue;
    return Err(ErrorOf(r.status()));
  }
  return Err("ERR the key kept changing under the increment (try again)");
}

std::string RespServer::Impl::SetConditional(const std::string& key,
                                             const std::string& value, bool nx,
                                             bool xx) {
  if (nx) {
    auto r = backend->PutIfAbsent(key, value);
    if (r.ok()) return Simple("OK");
    if (r.status().code() == StatusCode::kAlreadyExists) {
      return std::string(kNil);
    }
    return Err(ErrorOf(r.status()));
  }
  (void)xx;
  for (int attempt = 0; attempt < kMaxCasAttempts; ++attempt) {
    auto v = backend->GetNow(key);
    if (!v.ok()) {
      if (v.status().code() == StatusCode::kNotFound) return std::string(kNil);
      return Err(ErrorOf(v.status()));
    }
    auto r = backend->CompareAndPut(key, value, v->version);
    if (r.ok()) return Simple("OK");
    if (r.status().code() == StatusCode::kNotFound) return std::string(kNil);
    if (r.status().code() != StatusCode::kConflict) {
      return Err(ErrorOf(r.status()));
    }
  }
  return Err("ERR the key kept changing under SET XX (try again)");
}

std::string RespServer::Impl::Authenticate(const ConnPtr& c,
                                           const std::string& given,
                                           bool with_user) {
  const std::string& secret = options.session.secret;
  if (secret.empty()) {
    if (with_user) return Simple("OK");
    return Err(
        "ERR AUTH called without any password configured (the server "
        "has no --auth-file)");
  }
  // Constant time in the secret's bytes, as the handshake's check.
  unsigned diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    diff |= uint8_t(secret[i] ^ (i < given.size() ? given[i] : 0));
  }
  if (diff != 0) {
    return Err(
        "WRONGPASS invalid username-password pair or user is "
        "disabled.");
  }
  c->authed = true;
  return Simple("OK");
}

std::string RespServer::Impl::SetName(const ConnPtr& c,
                                      const std::string& name) {
  for (char ch : name) {
    if (ch < '!' || ch > '~') {
      return Err(
          "ERR Client names cannot contain spaces, newlines or "
          "special characters.");
    }
  }
  c->name = name;
  return Simple("OK");
}

void RespServer::Impl::Hello(const ConnPtr& c,
                             const std::vector<std::string>& a) {
  // RESP3 is not spoken: clients fall back to RESP2 on this error.
  if (a.size() >= 2 && a[1] != "2") {
    return Reply(
        c, Err("NOPROTO unsupported protocol version (remem speaks RESP2)"));
  }
  const std::string* secret = nullptr;
  const std::string* name = nullptr;
  for (size_t i = 2; i < a.size(); ++i) {
    const std::string opt = Lower(a[i]);
    if (opt == "auth" && i + 2 < a.size()) {
      secret = &a[i + 2];
      i += 2;
    } else if (opt == "setname" && i + 1 < a.size()) {
      name = &a[++i];
    } else {
      return Reply(c, Err("ERR Syntax error in HELLO option '" +
                          a[i].substr(0, 64) + "'"));
    }
  }
  if (secret != nullptr) {
    std::string r = Authenticate(c, *secret, /*with_user=*/true);
    if (r[0] == '-') return Reply(c, std::move(r));
  }
  if (!c->authed) {
    return Reply(c, Err("NOAUTH HELLO must be called with the client already "
                        "authenticated, otherwise the HELLO <proto> AUTH "
                        "<user> <pass> option can be used to authenticate the "
                        "client and select the RESP protocol version at the "
                        "same time"));
  }
  if (name != nullptr) {
    std::string r = SetName(c, *name);
    if (r[0] == '-') return Reply(c, std::move(r));
  }
  std::string r;
  AppendArrayHeader(&r, 6);
  AppendBulk(&r, "server");
  AppendBulk(&r, "remem");
  AppendBulk(&r, "version");
  AppendBulk(&r, kVersion);
  AppendBulk(&r, "proto");
  AppendInteger(&r, 2);
  Reply(c, std::move(r));
}

std::string RespServer::Impl::CheckArgs(const std::vector<std::string>& a,
                                        size_t first, size_t step,
                                        bool values) const {
  for (size_t i = first; i < a.size(); i += step) {
    const std::string& key = a[i];
    if (key.empty() || key.size() > backend->max_key()) {
      return Err(ErrorOf(Status::InvalidArgument(
          key.empty() ? "empty key"
                      : "a key of " + std::to_string(key.size()) +
                            " bytes is over the store's limit of " +
                            std::to_string(backend->max_key()))));
    }
    if (values && i + 1 < a.size() && a[i + 1].size() > backend->max_value()) {
      return Err(ErrorOf(Status::InvalidArgument(
          "a value of " + std::to_string(a[i + 1].size()) +
          " bytes is over the store's limit of " +
          std::to_string(backend->max_value()))));
    }
  }
  return std::string();
}

bool RespServer::Impl::Dispatch(const ConnPtr& c, std::vector<std::string>& a) {
  const std::string name = Lower(a[0]);
  const size_t argc = a.size();
  // The server's --auth-file secret, as Redis's requirepass: AUTH [user]
  // secret before anything but QUIT.
  if (name == "auth") {
    if (argc != 2 && argc != 3) return Reply(c, Arity(name)), true;
    Reply(c, Authenticate(c, a[argc - 1], /*with_user=*/argc == 3));
    return true;
  }
  // HELLO may authenticate (HELLO 2 AUTH user secret), as in Redis.
  if (name == "hello") return Hello(c, a), true;
  if (!c->authed && name != "quit") {
    Reply(c, Err("NOAUTH Authentication required."));
    return true;
  }
  // No transactions: a refused MULTI's commands are not run either, and
  // its EXEC aborts, as Redis aborts a transaction with a refused command.
  // (They ran on their own, so a client that took the errors for a failed
  // transaction and sent it again applied its writes twice: redis-py's
  // default pipeline() is a MULTI/EXEC; found black-box.)
  if (name == "multi") {
    c->refused_multi = true;
    Reply(c, Err("ERR remem has no transactions: MULTI is not supported by "
                 "remem's front door (the commands up to EXEC or DISCARD "
                 "will not run)"));
    return true;
  }
  if (c->refused_multi) {
    if (name == "exec" || name == "discard") {
      c->refused_multi = false;
      Reply(c, name == "exec"
                   ? Err("EXECABORT Transaction discarded because MULTI is "
                         "not supported by remem's front door")
                   : Simple("OK"));
    } else if (name == "quit") {
      Reply(c, Simple("OK"));
      c->closing = true;
    } else {
      Reply(c, Err("ERR not run: inside a MULTI that remem's front door "
                   "refused (no transactions)"));
    }
    return true;
  }
  // Commands answered here, with or without a store.
  if (name == "ping") {
    if (argc > 2) return Reply(c, Arity(name)), true;
    Reply(c, argc == 2 ? Bulk(a[1]) : Simple("PONG"));
    return true;
  }
  if (name == "echo") {
    Reply(c, argc == 2 ? Bulk(a[1]) : Arity(name));
    return true;
  }
  if (name == "quit") {
    Reply(c, Simple("OK"));
    c->closing = true;
    return true;
  }
  if (name == "select") {
    if (argc != 2) return Reply(c, Arity(name)), true;
    Reply(c, a[1] == "0" ? Simple("OK")
                         : Err("ERR DB index is out of range (remem has one "
                               "keyspace: database 0)"));
    return true;
  }
  if (name == "command") {
    // Clients ask for the command table (redis-cli: COMMAND DOCS) and do
    // without it; COMMAND COUNT is a number in Redis (redis-py's
    // command_count() failed on the empty table; found black-box).
    Reply(c, argc >= 2 && Lower(a[1]) == "count" ? Int(0) : "*0\r\n");
    return true;
  }
  if (name == "client") {
    const std::string sub = argc >= 2 ? Lower(a[1]) : "";
    if (sub == "setname") {
      if (argc != 3) return Reply(c, Arity("client|setname")), true;
      Reply(c, SetName(c, a[2]));
      return true;
    }
    if (sub == "setinfo") return Reply(c, Simple("OK")), true;
    if (sub == "getname") {
      Reply(c, c->name.empty() ? std::string(kNil) : Bulk(c->name));
      return true;
    }
    Reply(c, Err("ERR remem's front door takes CLIENT SETNAME, SETINFO and "
                 "GETNAME only"));
    return true;
  }
  if (name == "info") {
    // INFO [section ...]: the sections asked for, as Redis answers (one it
    // does not have adds nothing).
    bool server = argc == 1, clients = argc == 1;
    for (size_t i = 1; i < argc; ++i) {
      const std::string section = Lower(a[i]);
      const bool all =
          section == "all" || section == "default" || section == "everything";
      server = server || all || section == "server";
      clients = clients || all || section == "clients";
    }
    std::string text;
    if (server) {
      text += "# Server\r\nremem_version:" + std::string(kVersion) +
              "\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n";
    }
    if (clients) {
      if (!text.empty()) text += "\r\n";
      text += "# Clients\r\nconnected_clients:" + std::to_string(conns.size()) +
              "\r\n";
    }
    Reply(c, Bulk(text));
    return true;
  }
  static const char* const kNoSuch[][2] = {
      {"expire", "remem keeps no expiry"},
      {"pexpire", "remem keeps no expiry"},
      {"expireat", "remem keeps no expiry"},
      {"setex", "remem keeps no expiry"},
      {"psetex", "remem keeps no expiry"},
      {"keys", "remem's hash store cannot list its keys"},
      {"scan",
       "remem's hash store cannot list its keys (the ordered store "
       "scans: remem tree scan)"},
      {"flushdb", "remem does not empty its store from a client"},
      {"flushall", "remem does not empty its store from a client"},
      {"exec", "remem has no transactions (MULTI/EXEC)"},
      {"discard", "remem has no transactions (MULTI/EXEC)"},
      {"watch", "remem has no transactions (MULTI/EXEC)"},
  };
  for (const auto& [cmd, why] : kNoSuch) {
    if (name == cmd) {
      Reply(c, Err("ERR " + std::string(why) + ": '" + name +
                   "' is not supported by remem's front door"));
      return true;
    }
  }

  // The store's commands: first their arity and arguments.
  enum class Kind {
    kGet,
    kMGet,
    kExists,
    kStrlen,
    kTtl,
    kPttl,
    kType,
    kSet,
    kSetNx,
    kMSet,
    kDel,
    kIncr,
    kAppend,
    kUnknown
  };
  Kind kind = Kind::kUnknown;
  int64_t by = 0;
  bool nx = false, xx = false;
  bool arity_ok = true;
  if (name == "get") {
    kind = Kind::kGet, arity_ok = argc == 2;
  } else if (name == "mget") {
    kind = Kind::kMGet, arity_ok = argc >= 2;
  } else if (name == "exists") {
    kind = Kind::kExists, arity_ok = argc >= 2;
  } else if (name == "strlen") {
    kind = Kind::kStrlen, arity_ok = argc == 2;
  } else if (name == "ttl") {
    kind = Kind::kTtl, arity_ok = argc == 2;
  } else if (name == "pttl") {
    kind = Kind::kPttl, arity_ok = argc == 2;
  } else if (name == "type") {
    kind = Kind::kType, arity_ok = argc == 2;
  } else if (name == "set") {
    kind = Kind::kSet, arity_ok = argc >= 3;
    for (size_t i = 3; arity_ok && i < argc; ++i) {
      const std::string opt = Lower(a[i]);
      if (opt == "nx") {
        nx = true;
      } else if (opt == "xx") {
        xx = true;
      } else if (opt == "ex" || opt == "px" || opt == "exat" || opt == "pxat" ||
                 opt == "keepttl") {
        Reply(c, Err("ERR remem keeps no expiry: SET's " + Lower(a[i]) +
                     " is not supported"));
        return true;
      } else {
        Reply(c, Err("ERR syntax error (remem's SET takes NX or XX)"));
        return true;
      }
    }
    if (nx && xx) {
      Reply(c, Err("ERR syntax error"));
      return true;
    }
  } else if (name == "setnx") {
    kind = Kind::kSetNx, arity_ok = argc == 3;
  } else if (name == "mset") {
    kind = Kind::kMSet, arity_ok = argc >= 3 && argc % 2 == 1;
  } else if (name == "del" || name == "unlink") {
    kind = Kind::kDel, arity_ok = argc >= 2;
  } else if (name == "incr" || name == "decr") {
    kind = Kind::kIncr, arity_ok = argc == 2, by = name == "incr" ? 1 : -1;
  } else if (name == "incrby" || name == "decrby") {
    kind = Kind::kIncr, arity_ok = argc == 3;
    if (arity_ok) {
      if (!ParseInt64(a[2], &by)) {
        Reply(c, Err("ERR value is not an integer or out of range"));
        return true;
      }
      // Its negation does not fit (Redis's words).
      if (name == "decrby" && by == std::numeric_limits<int64_t>::min()) {
        Reply(c, Err("ERR decrement would overflow"));
        return true;
      }
      if (name == "decrby") by = -by;
    }
  } else if (name == "append") {
    kind = Kind::kAppend, arity_ok = argc == 3;
  }
  if (kind == Kind::kUnknown) {
    std::string msg =
        "ERR unknown command '" + a[0] + "', with args beginning with:";
    for (size_t i = 1; i < argc && i < 4; ++i)
      msg += " '" + a[i].substr(0, 64) + "'";
    Reply(c, Err(msg));
    return true;
  }
  if (!arity_ok) return Reply(c, Arity(name)), true;
  if (backend == nullptr) {
    Reply(c, Err("LOADING remem's front door is not connected to the store "
                 "yet: " +
                 connect_status.ToString()));
    return true;
  }
  // A command of many keys is refused whole if one is past the limits
  // (DEL a "" b deleted a and b and answered an error).
  if (kind == Kind::kMSet || kind == Kind::kDel) {
    std::string bad = CheckArgs(a, 1, kind == Kind::kMSet ? 2 : 1,
                                /*values=*/kind == Kind::kMSet);
    if (!bad.empty()) return Reply(c, std::move(bad)), true;
  }

  // When it may run.
  const bool reads = kind == Kind::kGet || kind == Kind::kMGet ||
                     kind == Kind::kExists || kind == Kind::kStrlen ||
                     kind == Kind::kTtl || kind == Kind::kPttl ||
                     kind == Kind::kType;
  const bool steps = kind == Kind::kIncr || kind == Kind::kAppend ||
                     kind == Kind::kSetNx || (kind == Kind::kSet && (nx || xx));
  // A single-key read with nothing but such reads of its connection in
  // flight may take the read path (one-sided where reads are local
  // copies). That store does its gets in issue order (ordered_gets: one
  // that asks the server holds the later ones behind it; without it, a
  // pipeline of GETs of a key being written showed an older value after a
  // newer one, found black-box), and a write waits until they are
  // answered; a read behind a write goes by RPC, after it. MGET and EXISTS
  // go by RPC, so that each partition does its keys at once, as Redis does
  // all of them (one-sided, each key was read at its own instant).
  Need need = Need::kOrdered;
  bool any_path = false;
  if (steps || !backend->ordered_pipelining()) {
    need = Need::kAlone;
  } else if (reads && kind != Kind::kMGet && kind != Kind::kExists &&
             c->in_flight == c->any_reads && backend->local_reads()) {
    any_path = true;
  }
  if (need == Need::kAlone && c->in_flight > 0) return false;
  if (!reads && c->any_reads > 0) return false;

  if (steps) {
    // Synchronous: nothing of this connection is in flight.
    std::string r;
    if (kind == Kind::kIncr) {
      r = Incr(a[1], by);
    } else if (kind == Kind::kAppend) {
      auto x = backend->Execute(Op::Append(a[1], a[2], /*create=*/true));
      if (!x.ok()) {
        r = Err(ErrorOf(x.status()));
      } else {
        auto len = x->Int();
        r = len.ok() ? Int(*len) : Err(ErrorOf(len.status()));
      }
    } else if (kind == Kind::kSetNx) {
      r = SetConditional(a[1], a[2], true, false);
      if (r[0] == '+') {
        r = Int(1);
      } else if (r == kNil) {
        r = Int(0);
      }
    } else {
      r = SetConditional(a[1], a[2], nx, xx);
    }
    Reply(c, std::move(r));
    return true;
  }

  Slot* slot = NewSlot(c);
  const bool barrier = need == Need::kAlone;
  if (any_path) {
    slot->any = true;
    ++c->any_reads;
  }
  switch (kind) {
    case Kind::kGet:
    case Kind::kStrlen:
    case Kind::kTtl:
    case Kind::kPttl:
    case Kind::kType: {
      Began(c, barrier);
      backend->Get(
          a[1], any_path, [this, c, slot, kind](Result<HashStore::Value> r) {
            const bool found = r.ok();
            if (!found && r.status().code() != StatusCode::kNotFound) {
              return Complete(c, slot, Err(ErrorOf(r.status())));
            }
            switch (kind) {
              case Kind::kGet:
                return Complete(c, slot,
                                found ? Bulk(r->value) : std::string(kNil));
              case Kind::kStrlen:
                return Complete(c, slot,
                                Int(found ? int64_t(r->value.size()) : 0));
              case Kind::kType:
                return Complete(c, slot, Simple(found ? "string" : "none"));
              default:  // no expiry: -1 for a key, -2 for none
                return Complete(c, slot, Int(found ? -1 : -2));
            }
          });
      return true;
    }
    case Kind::kMGet:
    case Kind::kExists: {
      std::vector<std::string_view> keys(a.begin() + 1, a.end());
      Began(c, barrier);
      backend->MultiGet(
          keys, any_path,
          [this, c, slot, kind](std::vector<Result<HashStore::Value>> rs) {
            if (kind == Kind::kExists) {
              auto n = CountFound(rs);
              return Complete(c, slot,
                              n.ok() ? Int(*n) : Err(ErrorOf(n.status())));
            }
            std::string r;
            AppendArrayHeader(&r, rs.size());
            for (const auto& v : rs) {
              if (v.ok()) {
                AppendBulk(&r, v->value);
              } else if (v.status().code() == StatusCode::kNotFound) {
                AppendNil(&r);
              } else {
                return Complete(c, slot, Err(ErrorOf(v.status())));
              }
            }
            Complete(c, slot, std::move(r));
          });
      return true;
    }
    case Kind::kSet:
    case Kind::kMSet:
    case Kind::kDel: {
      // One reply once each key's operation is done: OK (SET, MSET), the
      // number deleted (DEL), or the first error.
      struct Join {
        size_t left = 0;
        int64_t deleted = 0;
        Status error;
      };
      auto join = std::make_shared<Join>();
      const bool del = kind == Kind::kDel;
      join->left = del ? argc - 1 : (argc - 1) / 2;
      if (kind == Kind::kSet) join->left = 1;
      Began(c, barrier);
      auto one = [this, c, slot, join, del](Status st) {
        if (st.ok()) {
          ++join->deleted;
        } else if (!(del && st.code() == StatusCode::kNotFound) &&
                   join->error.ok()) {
          join->error = std::move(st);
        }
        if (--join->left > 0) return;
        if (!join->error.ok())
          return Complete(c, slot, Err(ErrorOf(join->error)));
        Complete(c, slot, del ? Int(join->deleted) : Simple("OK"));
      };
      if (del) {
        for (size_t i = 1; i < argc; ++i) backend->Delete(a[i], one);
      } else {
        for (size_t i = 1; i + 1 < argc; i += 2) {
          backend->Put(a[i], a[i + 1], [one](Result<uint64_t> r) {
            one(r.ok() ? Status::OK() : r.status());
          });
          if (kind == Kind::kSet) break;
        }
      }
      return true;
    }
    default:
      break;
  }
  slot->reply = Err("ERR internal: unhandled command");
  Owe(c, slot->reply.size());
  slot->done = true;
  return true;
}

}  // namespace remem::frontdoor
