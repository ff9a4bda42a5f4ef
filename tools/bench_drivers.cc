#include "bench_drivers.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "bench_common.h"
#include "remem/cluster.h"
#include "remem/hash.h"
#include "remem/session.h"
#include "remem/tree.h"

namespace remem::bench {

namespace {

// ---------------------------------------------------------------- remem

// A get of one key or a batch of them on a hash store (HashStore, or
// Cluster: the same calls), read into storage kept with the request
// (remem's allocation-free gets) and then copied into r->values, whose
// strings keep their capacity too. The callbacks capture one pointer,
// which std::function keeps without allocating; `d->Complete(r)` ends the
// request.
template <typename Driver, typename Store>
void IssueHashGet(Driver* d, Store* store, KvRequest* r) {
  struct Scratch : KvRequest::Scratch {
    Driver* driver = nullptr;
    KvRequest* r = nullptr;  // the request that keeps this scratch
    std::vector<std::string_view> keys;
    std::vector<HashStore::Value> values;
    std::vector<Status> statuses;
    // Key i's outcome into r: its value, nullopt if absent, or the
    // request's error. The value's string trades places with r's (each
    // keeps its capacity for the next get), as a caller that reads into
    // storage of its own would have it: no copy.
    void Take(size_t i, const Status& st) {
      if (st.ok()) {
        if (!r->values[i]) r->values[i].emplace();
        r->values[i]->swap(values[i].value);
      } else {
        r->values[i].reset();
        if (st.code() != StatusCode::kNotFound) r->status = st;
      }
    }
  };
  if (r->scratch == nullptr) {
    auto g = std::make_unique<Scratch>();
    g->driver = d;
    g->r = r;
    r->scratch = std::move(g);
  }
  auto* g = static_cast<Scratch*>(r->scratch.get());
  r->values.resize(r->keys.size());
  if (r->keys.size() > 1) {
    g->keys.assign(r->keys.begin(), r->keys.end());
    store->MultiGetAsync(g->keys, &g->values, &g->statuses, [g](Status) {
      for (size_t i = 0; i < g->statuses.size(); ++i) {
        g->Take(i, g->statuses[i]);
      }
      g->driver->Complete(g->r);
    });
    return;
  }
  g->values.resize(1);
  store->GetAsync(r->keys[0], &g->values[0], [g](Status st) {
    g->Take(0, st);
    g->driver->Complete(g->r);
  });
}

// What the drivers of one remem session share: the stores' callbacks
// Complete() requests, and WaitSome polls the session until one has. A
// derived driver's store is its own member, destroyed before the session.
class SessionDriver : public KvDriver {
 public:
  Status WaitSome(std::vector<KvRequest*>* done) override {
    while (done_.empty()) {
      if (StoreInFlight() == 0) break;
      s_->Poll();
      if (!s_->connected()) {
        return Status::Unavailable("remem: the connection failed");
      }
    }
    done->insert(done->end(), done_.begin(), done_.end());
    done_.clear();
    return Status::OK();
  }
  size_t in_flight() const override { return StoreInFlight() + done_.size(); }
  // Ends `r` (its stores' callbacks call it).
  void Complete(KvRequest* r) {
    r->done_ns = RequestNs();
    done_.push_back(r);
  }

 protected:
  explicit SessionDriver(std::unique_ptr<Session> s) : s_(std::move(s)) {}
  // The store's operations issued and not yet completed.
  virtual size_t StoreInFlight() const = 0;

 private:
  std::unique_ptr<Session> s_;
  std::vector<KvRequest*> done_;
};

class RememDriver : public SessionDriver {
 public:
  RememDriver(std::unique_ptr<Session> s, std::unique_ptr<HashStore> h)
      : SessionDriver(std::move(s)), c_(std::move(h)) {}

  // Single gets and puts are asynchronous (any number in flight, completed
  // by Poll); a batch of keys is one MultiGetAsync (one batch of one-sided
  // reads or one message), also any number in flight.
  void Issue(KvRequest* r) override {
    if (r->kind == KvRequest::Kind::kGet) {
      return IssueHashGet(this, c_.get(), r);
    }
    c_->PutAsync(r->keys[0], r->value, [this, r](Result<uint64_t> v) {
      if (!v.ok()) r->status = v.status();
      Complete(r);
    });
  }
  std::optional<ReadPathCounts> read_path_counts() const override {
    const auto& s = c_->read_stats();
    return ReadPathCounts{s.onesided_gets, s.rpc_gets, s.retries, s.fallbacks};
  }

 private:
  size_t StoreInFlight() const override { return c_->in_flight(); }

  std::unique_ptr<HashStore> c_;
};

// A request on the ordered store of one server (TreeStore) or of a cluster
// (ClusterTree), whose calls are the same: a scan into a page kept with
// the request (ScanInto's reuse of storage), whose items trade places
// with r->items when it is issued and when it ends, so one set of strings
// per request is filled in place and read, never copied; a single get; a
// put. complete(r) when it is done.
struct OrderedScanScratch : KvRequest::Scratch {
  TreeStore::Page page;
};
template <typename Tree, typename Complete>
void IssueOrdered(Tree* t, KvRequest* r, Complete complete) {
  using ScanScratch = OrderedScanScratch;
  switch (r->kind) {
    case KvRequest::Kind::kScan: {
      if (r->scratch == nullptr) r->scratch = std::make_unique<ScanScratch>();
      auto* sc = static_cast<ScanScratch*>(r->scratch.get());
      sc->page.items.swap(r->items);
      r->scanned = 0;
      t->ScanAsync(r->keys[0], {}, r->limit, TreeStore::Order::kAscending,
                   &sc->page, [complete, r, sc](Status st) {
                     if (!st.ok()) {
                       r->status = st;
                       return complete(r);
                     }
                     r->items.swap(sc->page.items);
                     r->scanned = r->items.size();
                     complete(r);
                   });
      return;
    }
    case KvRequest::Kind::kGet:
      if (r->keys.size() != 1) {
        r->status = Status::Unsupported(
            "remem-bench: batched gets of the ordered store");
        return complete(r);
      }
      r->values.resize(1);
      t->GetAsync(r->keys[0], [complete, r](Result<TreeStore::Value> v) {
        if (v.ok()) {
          r->values[0].emplace(std::move(v->value));
        } else {
          r->values[0].reset();
          if (v.status().code() != StatusCode::kNotFound) {
            r->status = v.status();
          }
        }
        complete(r);
      });
      return;
    case KvRequest::Kind::kPut:
      t->PutAsync(r->keys[0], r->value, [complete, r](Result<uint64_t> v) {
        if (!v.ok()) r->status = v.status();
        complete(r);
      });
      return;
  }
}

// The ordered store of one remem server: scans, puts and gets, each
// asynchronous, any number in flight (TreeStore's own pipelining).
class RememTreeDriver : public SessionDriver {
 public:
  RememTreeDriver(std::unique_ptr<Session> s, std::unique_ptr<TreeStore> t)
      : SessionDriver(std::move(s)), t_(std::move(t)) {}

  void Issue(KvRequest* r) override {
    IssueOrdered(t_.get(), r, [this](KvRequest* done) { Complete(done); });
  }
  std::optional<ReadPathCounts> read_path_counts() const override {
    // A scan page counts as one read.
    const auto& s = t_->read_stats();
    return ReadPathCounts{s.onesided_gets + s.onesided_scans,
                          s.rpc_gets + s.rpc_scans, s.retries, s.fallbacks};
  }

 private:
  size_t StoreInFlight() const override { return t_->in_flight(); }

  std::unique_ptr<TreeStore> t_;
};

// A remem cluster through remem::Cluster: each key routed to its owner.
// Gets, puts and batches of keys (the cluster's MultiGetAsync: split per
// server, all at once) are asynchronous, any number in flight, and read
// into storage kept with each request.
class ClusterDriver : public KvDriver {
 public:
  explicit ClusterDriver(std::unique_ptr<Cluster> c) : c_(std::move(c)) {}

  void Issue(KvRequest* r) override {
    if (r->kind == KvRequest::Kind::kGet) {
      return IssueHashGet(this, c_.get(), r);
    }
    c_->PutAsync(r->keys[0], r->value, [this, r](Result<uint64_t> v) {
      if (!v.ok()) r->status = v.status();
      Complete(r);
    });
  }
  Status WaitSome(std::vector<KvRequest*>* done) override {
    while (done_.empty() && c_->in_flight() > 0) c_->Poll();
    done->insert(done->end(), done_.begin(), done_.end());
    done_.clear();
    return Status::OK();
  }
  size_t in_flight() const override { return c_->in_flight() + done_.size(); }

  // Ends `r` (the cluster's callbacks call it).
  void Complete(KvRequest* r) {
    r->done_ns = RequestNs();
    done_.push_back(r);
  }

 private:
  // done_ first: ~Cluster waits for operations in flight, whose callbacks
  // add to it.
  std::vector<KvRequest*> done_;
  std::unique_ptr<Cluster> c_;
};

// The ordered store of a remem cluster formed with --tree-splits, through
// ClusterTree: each key to its range's owner, a scan across the ranges in
// order; asynchronous, any number in flight.
class ClusterTreeDriver : public KvDriver {
 public:
  ClusterTreeDriver(std::unique_ptr<Cluster> c, ClusterTree* t)
      : c_(std::move(c)), t_(t) {}

  void Issue(KvRequest* r) override {
    IssueOrdered(t_, r, [this](KvRequest* done) { Complete(done); });
  }
  Status WaitSome(std::vector<KvRequest*>* done) override {
    while (done_.empty() && c_->in_flight() > 0) c_->Poll();
    done->insert(done->end(), done_.begin(), done_.end());
    done_.clear();
    return Status::OK();
  }
  size_t in_flight() const override { return c_->in_flight() + done_.size(); }

 private:
  void Complete(KvRequest* r) {
    r->done_ns = RequestNs();
    done_.push_back(r);
  }

  // done_ first: ~Cluster waits for operations in flight, whose callbacks
  // add to it.
  std::vector<KvRequest*> done_;
  std::unique_ptr<Cluster> c_;
  ClusterTree* t_;  // c_'s
};

// ---------------------------------------------------------------- Redis

class RedisDriver : public KvDriver {
 public:
  // `ordered`: keys live in the sorted set kSortedSet (bench_drivers.h).
  RedisDriver(redisContext* c, bool ordered) : c_(c), ordered_(ordered) {}
  ~RedisDriver() override { redisFree(c_); }

  void Issue(KvRequest* r) override {
    argv_.clear();
    lens_.clear();
    auto arg = [&](const char* p, size_t n) {
      argv_.push_back(p);
      lens_.push_back(n);
    };
    if (ordered_) {
      switch (r->kind) {
        case KvRequest::Kind::kPut:
          member_ = r->keys[0];
          member_ += r->value;
          arg("ZADD", 4);
          arg(kSortedSet, sizeof(kSortedSet) - 1);
          arg("0", 1);
          arg(member_.data(), member_.size());
          break;
        case KvRequest::Kind::kScan:
          bound_ = "[" + r->keys[0];
          limit_ = std::to_string(r->limit);
          arg("ZRANGEBYLEX", 11);
          arg(kSortedSet, sizeof(kSortedSet) - 1);
          arg(bound_.data(), bound_.size());
          arg("+", 1);
          arg("LIMIT", 5);
          arg("0", 1);
          arg(limit_.data(), limit_.size());
          break;
        case KvRequest::Kind::kGet:
          r->status =
              Status::Unsupported("remem-bench: gets of Redis's sorted set");
          r->done_ns = RequestNs();
          failed_.push_back(r);
          return;
      }
      return Append(r);
    }
    if (r->kind == KvRequest::Kind::kGet) {
      if (r->keys.size() == 1) {
        arg("GET", 3);
      } else {
        arg("MGET", 4);
      }
      for (const auto& k : r->keys) arg(k.data(), k.size());
    } else {
      arg("SET", 3);
      arg(r->keys[0].data(), r->keys[0].size());
      arg(r->value.data(), r->value.size());
    }
    Append(r);
  }

  Status WaitSome(std::vector<KvRequest*>* done) override {
    if (!failed_.empty()) {
      done->insert(done->end(), failed_.begin(), failed_.end());
      failed_.clear();
      return Status::OK();
    }
    if (queue_.empty()) return Status::OK();
    // The first reply may block (flushing what was appended); later ones
    // are taken only if already read, so the window keeps sliding.
    void* reply = nullptr;
    if (redisGetReply(c_, &reply) != REDIS_OK) {
      return Status::Unavailable(std::string("redis: ") + c_->errstr);
    }
    do {
      KvRequest* r = queue_.front();
      queue_.pop_front();
      Complete(r, static_cast<redisReply*>(reply));
      freeReplyObject(reply);
      done->push_back(r);
      reply = nullptr;
      if (queue_.empty() || redisReaderGetReply(c_->reader, &reply) != REDIS_OK)
        break;
    } while (reply != nullptr);
    return Status::OK();
  }
  size_t in_flight() const override { return queue_.size() + failed_.size(); }

 private:
  static constexpr char kSortedSet[] = "ycsb";

  // Queues the command in argv_/lens_ for `r`.
  void Append(KvRequest* r) {
    if (redisAppendCommandArgv(c_, int(argv_.size()), argv_.data(),
                               lens_.data()) != REDIS_OK) {
      // Nothing was queued for it, so no reply will come.
      r->status = Status::Internal(std::string("redis: ") + c_->errstr);
      r->done_ns = RequestNs();
      failed_.push_back(r);
      return;
    }
    queue_.push_back(r);
  }

  static void Complete(KvRequest* r, redisReply* rep) {
    r->done_ns = RequestNs();
    if (rep->type == REDIS_REPLY_ERROR) {
      r->status = Status::Internal(std::string("redis: ") + rep->str);
      return;
    }
    if (r->kind == KvRequest::Kind::kPut) return;
    if (r->kind == KvRequest::Kind::kScan) {
      // Members are key + value, every key as long as the start key.
      const size_t key_size = r->keys[0].size();
      r->scanned = 0;
      if (rep->type != REDIS_REPLY_ARRAY) {
        r->status = Status::ProtocolError("redis: ZRANGEBYLEX: not an array");
        return;
      }
      if (r->items.size() < rep->elements) r->items.resize(rep->elements);
      for (size_t i = 0; i < rep->elements; ++i) {
        const redisReply* e = rep->element[i];
        if (e->type != REDIS_REPLY_STRING || e->len < key_size) {
          r->status =
              Status::ProtocolError("redis: a member shorter than a key");
          return;
        }
        r->items[i].key.assign(e->str, key_size);
        r->items[i].value.assign(e->str + key_size, e->len - key_size);
      }
      r->scanned = rep->elements;
      return;
    }
    r->values.assign(r->keys.size(), std::nullopt);
    auto one = [](redisReply* e, std::optional<std::string>* out) {
      if (e->type == REDIS_REPLY_STRING) out->emplace(e->str, e->len);
    };
    if (rep->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < rep->elements && i < r->keys.size(); ++i) {
        one(rep->element[i], &r->values[i]);
      }
    } else {
      one(rep, &r->values[0]);
    }
  }

  redisContext* c_;
  const bool ordered_;
  std::string member_, bound_, limit_;  // arguments of the command in argv_
  std::deque<KvRequest*> queue_;        // replies come back in this order
  std::vector<KvRequest*> failed_;
  std::vector<const char*> argv_;
  std::vector<size_t> lens_;
};

// ---------------------------------------------------------------- memcached

class MemcachedDriver : public KvDriver {
 public:
  MemcachedDriver(memcached_st* mc, memcached_st* quiet)
      : mc_(mc), quiet_(quiet) {}
  ~MemcachedDriver() override {
    memcached_result_free(result_);
    memcached_free(mc_);
    memcached_free(quiet_);
  }

  void Issue(KvRequest* r) override { pending_.push_back(r); }

  Status WaitSome(std::vector<KvRequest*>* done) override {
    // Everything pending completes now: runs of gets as one mget, puts one
    // by one (quiet ones without waiting for an answer).
    size_t i = 0;
    while (i < pending_.size()) {
      KvRequest* r = pending_[i];
      if (r->kind == KvRequest::Kind::kPut) {
        memcached_st* m = r->quiet ? quiet_ : mc_;
        memcached_return_t rc =
            memcached_set(m, r->keys[0].data(), r->keys[0].size(),
                          r->value.data(), r->value.size(), 0, 0);
        if (!memcached_success(rc) && rc != MEMCACHED_BUFFERED) {
          r->status = Status::Unavailable(std::string("memcached set: ") +
                                          memcached_strerror(m, rc));
        }
        r->done_ns = RequestNs();
        ++i;
        continue;
      }
      size_t j = i;
      while (j < pending_.size() && pending_[j]->kind == KvRequest::Kind::kGet)
        ++j;
      REMEM_RETURN_IF_ERROR(MultiGet(i, j));
      i = j;
    }
    done->insert(done->end(), pending_.begin(), pending_.end());
    pending_.clear();
    return Status::OK();
  }
  size_t in_flight() const override { return pending_.size(); }

  Status FinishLoad() override {
    memcached_return_t rc = memcached_flush_buffers(quiet_);
    if (!memcached_success(rc)) {
      return Status::Unavailable(std::string("memcached flush: ") +
                                 memcached_strerror(quiet_, rc));
    }
    // A get on the same connection is answered after every earlier set.
    size_t len = 0;
    uint32_t flags = 0;
    char* v = memcached_get(quiet_, "x", 1, &len, &flags, &rc);
    free(v);
    if (!memcached_success(rc) && rc != MEMCACHED_NOTFOUND) {
      return Status::Unavailable(std::string("memcached: ") +
                                 memcached_strerror(quiet_, rc));
    }
    return Status::OK();
  }

 private:
  Status MultiGet(size_t from, size_t to) {
    keys_.clear();
    lens_.clear();
    slots_.clear();
    for (size_t i = from; i < to; ++i) {
      KvRequest* r = pending_[i];
      r->values.assign(r->keys.size(), std::nullopt);
      for (size_t k = 0; k < r->keys.size(); ++k) {
        keys_.push_back(r->keys[k].data());
        lens_.push_back(r->keys[k].size());
        slots_[r->keys[k]].push_back(&r->values[k]);
      }
    }
    memcached_return_t rc =
        memcached_mget(mc_, keys_.data(), lens_.data(), keys_.size());
    if (!memcached_success(rc)) {
      return Status::Unavailable(std::string("memcached mget: ") +
                                 memcached_strerror(mc_, rc));
    }
    memcached_result_st* res;
    while ((res = memcached_fetch_result(mc_, result_, &rc)) != nullptr) {
      std::string key(memcached_result_key_value(res),
                      memcached_result_key_length(res));
      auto it = slots_.find(key);
      if (it == slots_.end()) continue;
      for (auto* out : it->second) {
        out->emplace(memcached_result_value(res), memcached_result_length(res));
      }
    }
    if (rc != MEMCACHED_END && rc != MEMCACHED_SUCCESS &&
        rc != MEMCACHED_NOTFOUND) {
      return Status::Unavailable(std::string("memcached fetch: ") +
                                 memcached_strerror(mc_, rc));
    }
    const uint64_t now = RequestNs();
    for (size_t i = from; i < to; ++i) pending_[i]->done_ns = now;
    return Status::OK();
  }

  memcached_st* mc_;
  memcached_st* quiet_;  // NOREPLY + buffered: for the load phase
  memcached_result_st result_storage_{};
  memcached_result_st* result_ = memcached_result_create(mc_, &result_storage_);
  std::vector<KvRequest*> pending_;
  std::vector<const char*> keys_;
  std::vector<size_t> lens_;
  std::unordered_map<std::string, std::vector<std::optional<std::string>*>>
      slots_;
};

Result<memcached_st*> MemcachedConnect(int port, bool quiet) {
  memcached_st* mc = memcached_create(nullptr);
  if (mc == nullptr) return Status::OutOfMemory("memcached_create");
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
  memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  if (quiet) {
    memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_NOREPLY, 1);
    memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_BUFFER_REQUESTS, 1);
  }
  memcached_return_t rc =
      memcached_server_add(mc, "127.0.0.1", in_port_t(port));
  if (!memcached_success(rc)) {
    memcached_free(mc);
    return Status::Unavailable("memcached_server_add failed");
  }
  return mc;
}

Result<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::IOError("socket: " + std::string(strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return Status::IOError("bind: " + std::string(strerror(errno)));
  }
  close(fd);
  return int(ntohs(a.sin_port));
}

bool CanConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

}  // namespace

Result<std::string> FindProgram(const std::string& program,
                                const std::string& package) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  p += ":/usr/sbin:/sbin";
  size_t at = 0;
  while (at <= p.size()) {
    size_t end = p.find(':', at);
    if (end == std::string::npos) end = p.size();
    std::string candidate = p.substr(at, end - at) + "/" + program;
    if (end > at && access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return Status::NotFound(program + " not found: install " + package +
                          " (./dev deps-bench)");
}

Result<SystemSpec> ParseSystem(const std::string& name) {
  SystemSpec s;
  s.name = name;
  if (name == "redis") {
    s.kind = SystemSpec::Kind::kRedis;
    return s;
  }
  if (name == "memcached") {
    s.kind = SystemSpec::Kind::kMemcached;
    return s;
  }
  if (name == "remem-resp") {
    s.kind = SystemSpec::Kind::kRememResp;
    s.transport = Transport::kAuto;
    return s;
  }
  auto bad = [&] {
    return Status::InvalidArgument(
        "system must be redis, memcached, remem-resp or "
        "remem[-shm|-tcp|-auto][-onesided|-rpc|-auto], not '" +
        name + "'");
  };
  if (name.rfind("remem", 0) != 0) return bad();
  std::string rest = name.substr(5);
  std::vector<std::string> parts;
  while (!rest.empty()) {
    if (rest[0] != '-') return bad();
    size_t end = rest.find('-', 1);
    parts.push_back(rest.substr(1, end == std::string::npos ? end : end - 1));
    rest = end == std::string::npos ? "" : rest.substr(end);
  }
  if (parts.size() > 2) return bad();
  if (!parts.empty()) {
    auto t = ParseTransport(parts[0]);
    if (!t.ok()) return bad();
    s.transport = *t;
  }
  if (parts.size() == 2) {
    auto p = ParseReadPath(parts[1]);
    if (!p.ok()) return bad();
    s.read_path = *p;
  }
  return s;
}

Result<std::unique_ptr<SystemServer>> SystemServer::Start(
    const SystemSpec& spec, const Options& o) {
  std::unique_ptr<SystemServer> s(new SystemServer());
  s->spec_ = spec;
  s->options_ = o;
  const uint64_t mib =
      std::max<uint64_t>(64, (o.memory_bytes + (1 << 20) - 1) >> 20);
  switch (spec.kind) {
    case SystemSpec::Kind::kRemem: {
      if (!o.remem_address.empty() || !o.remem_cluster.empty()) {
        s->address_ =
            o.remem_cluster.empty() ? o.remem_address : o.remem_cluster;
        return s;
      }
      std::vector<std::string> flags;
      if (o.tree_bytes > 0) {
        flags = {"--tree-memory",
                 std::to_string((o.tree_bytes + (1 << 20) - 1) >> 20) + "M"};
      }
      auto started = StartServer(o.remem_binary, spec.transport, o.cpu,
                                 std::to_string(mib) + "M", flags);
      if (!started.ok()) return started.status();
      s->address_ = started->address;
      s->process_ = std::move(started->process);
      return s;
    }
    case SystemSpec::Kind::kRememResp: {
      if (!o.remem_address.empty() || !o.remem_cluster.empty()) {
        return Status::InvalidArgument(
            "remem-resp starts its own server (with --resp): not with "
            "--server or --cluster");
      }
      auto port = FreePort();
      if (!port.ok()) return port.status();
      auto started = StartServer(
          o.remem_binary, spec.transport, o.cpu, std::to_string(mib) + "M",
          {"--resp", "127.0.0.1:" + std::to_string(*port)});
      if (!started.ok()) return started.status();
      s->port_ = *port;
      s->address_ = "127.0.0.1:" + std::to_string(*port);
      s->process_ = std::move(started->process);
      return s;
    }
    case SystemSpec::Kind::kRedis: {
      auto bin = FindProgram("redis-server", "redis-server");
      if (!bin.ok()) return bin.status();
      auto port = FreePort();
      if (!port.ok()) return port.status();
      SpawnOptions so;
      // No persistence, loopback only, logs to stdout (where we wait for
      // the ready line).
      so.argv = {*bin,
                 "--port",
                 std::to_string(*port),
                 "--bind",
                 "127.0.0.1",
                 "--save",
                 "",
                 "--appendonly",
                 "no",
                 "--daemonize",
                 "no",
                 "--logfile",
                 "",
                 "--loglevel",
                 "notice"};
      so.cpu = o.cpu;
      auto p = Subprocess::Spawn(so);
      if (!p.ok()) return p.status();
      auto line = (*p)->WaitForLine("Ready to accept connections",
                                    std::chrono::seconds(20));
      if (!line.ok()) {
        return line.status().WithContext("starting redis-server: " +
                                         (*p)->output());
      }
      s->port_ = *port;
      s->address_ = "127.0.0.1:" + std::to_string(*port);
      s->process_ = std::move(*p);
      return s;
    }
    case SystemSpec::Kind::kMemcached: {
      auto bin = FindProgram("memcached", "memcached");
      if (!bin.ok()) return bin.status();
      auto port = FreePort();
      if (!port.ok()) return port.status();
      SpawnOptions so;
      // -m: item memory in MiB; -U 0: no UDP. memcached refuses to run as
      // root without naming a user.
      so.argv = {*bin,
                 "-t",
                 "1",
                 "-l",
                 "127.0.0.1",
                 "-p",
                 std::to_string(*port),
                 "-U",
                 "0",
                 "-m",
                 std::to_string(mib),
                 "-c",
                 "4096"};
      if (geteuid() == 0) {
        so.argv.push_back("-u");
        so.argv.push_back("root");
      }
      so.cpu = o.cpu;
      so.merge_stderr = true;
      auto p = Subprocess::Spawn(so);
      if (!p.ok()) return p.status();
      // memcached prints nothing when ready: poll its port.
      auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!CanConnect(*port)) {
        if (!(*p)->running()) {
          (void)(*p)->ReadToEnd(std::chrono::seconds(1));
          return Status::Unavailable("memcached exited: " + (*p)->output());
        }
        if (std::chrono::steady_clock::now() > deadline) {
          return Status::TimedOut("memcached did not open port " +
                                  std::to_string(*port));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      s->port_ = *port;
      s->address_ = "127.0.0.1:" + std::to_string(*port);
      s->process_ = std::move(*p);
      return s;
    }
  }
  return Status::Internal("unknown system");
}

SystemServer::~SystemServer() {
  if (process_ && process_->running()) {
    (void)process_->Signal(SIGTERM);
    (void)process_->Wait(std::chrono::seconds(5));
  }
}

Result<double> SystemServer::CpuSeconds() const {
  if (process_) return process_->CpuSeconds();
  if (options_.server_pids.empty()) return Status::NotFound("external server");
  // External servers whose processes the caller named (a cluster on this
  // host): their CPU time summed.
  double sum = 0;
  for (int pid : options_.server_pids) {
    auto s = ProcessCpuSeconds(pid);
    if (!s.ok()) return s.status();
    sum += *s;
  }
  return sum;
}

Result<std::unique_ptr<KvDriver>> SystemServer::Connect(bool ordered) const {
  switch (spec_.kind) {
    case SystemSpec::Kind::kRemem: {
      if (!options_.remem_cluster.empty()) {
        auto seeds = ParseSeeds(options_.remem_cluster);
        if (!seeds.ok()) return seeds.status();
        ClusterOptions co;
        co.seeds = std::move(*seeds);
        co.session.transport = spec_.transport;
        co.session.read_path = spec_.read_path;
        co.session.secret = options_.secret;
        co.wait_for_config = co.session.timeout;
        if (options_.read_any_replica) co.read_from = ReadFrom::kAnyReplica;
        auto c = Cluster::Connect(co);
        if (!c.ok()) return c.status();
        if (ordered) {
          // Unsupported unless its servers were started with --tree-splits.
          auto t = (*c)->Tree();
          if (!t.ok()) return t.status();
          return std::unique_ptr<KvDriver>(
              new ClusterTreeDriver(std::move(*c), *t));
        }
        return std::unique_ptr<KvDriver>(new ClusterDriver(std::move(*c)));
      }
      SessionOptions so;
      so.server = address_;
      so.transport = spec_.transport;
      so.read_path = spec_.read_path;
      so.secret = options_.secret;
      auto s = Session::Connect(so);
      if (!s.ok()) return s.status();
      if (ordered) {
        auto t = TreeStore::Open(s->get());
        if (!t.ok()) return t.status();
        return std::unique_ptr<KvDriver>(
            new RememTreeDriver(std::move(*s), std::move(*t)));
      }
      auto h = HashStore::Open(s->get());
      if (!h.ok()) return h.status();
      return std::unique_ptr<KvDriver>(
          new RememDriver(std::move(*s), std::move(*h)));
    }
    case SystemSpec::Kind::kRememResp:
      if (ordered) {
        return Status::Unsupported(
            "remem's Redis front door has no sorted sets: no scans (YCSB-E)");
      }
      [[fallthrough]];
    case SystemSpec::Kind::kRedis: {
      timeval tv{10, 0};
      redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
      if (c == nullptr || c->err) {
        std::string err = c ? c->errstr : "out of memory";
        if (c) redisFree(c);
        return Status::Unavailable("redis connect: " + err);
      }
      return std::unique_ptr<KvDriver>(new RedisDriver(c, ordered));
    }
    case SystemSpec::Kind::kMemcached: {
      if (ordered) {
        return Status::Unsupported(
            "memcached keeps no key order: no scans (YCSB-E)");
      }
      auto mc = MemcachedConnect(port_, false);
      if (!mc.ok()) return mc.status();
      auto quiet = MemcachedConnect(port_, true);
      if (!quiet.ok()) {
        memcached_free(*mc);
        return quiet.status();
      }
      return std::unique_ptr<KvDriver>(new MemcachedDriver(*mc, *quiet));
    }
  }
  return Status::Internal("unknown system");
}

}  // namespace remem::bench
