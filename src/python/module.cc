// Copyright remem authors.
//
// The Python package: a pybind11 extension module `remem` over the client
// library's synchronous API (remem/session.h, hash.h, tree.h, space.h,
// txn.h, cluster.h, ops.h).
// Keys and values go in as bytes or str (UTF-8) and come back as bytes;
// a non-OK Status is raised as remem.Error or one of its subclasses.
//
// Lifetime. Every Python object of a session (its stores, namespaces and
// mappings) holds a shared_ptr to the session's state, so the C++ Session
// outlives them however Python collects them, and the state keeps a weak
// list of them: Session.close() destroys each one's C++ object first,
// newest first (the library's rules: transactions before their store,
// stores before their Session), then the Session. A transaction also holds
// its store's Python object, so the store outlives it. A call on
// an object whose session was closed raises remem.Unavailable.
//
// Threads. A C++ Session and its stores are single-threaded (one thread at a
// time). Every call takes the session's mutex, with the GIL released while
// it waits for the mutex and while the C++ call blocks, so two Python
// threads that share a session are serialized instead of racing. The mutex
// is never held while taking the GIL. A Cluster (the client of a cluster)
// is its own such state: its sessions are its own, and its ordered store
// (Cluster.tree()) lives as long as it does.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ops/vector.h"  // FitsFloat
#include "remem/cluster.h"
#include "remem/hash.h"
#include "remem/ops.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/space.h"
#include "remem/status.h"
#include "remem/tree.h"
#include "remem/txn.h"

namespace py = pybind11;

namespace {

// The GIL released around a blocking call (py::gil_scoped_release, but
// for one thing). A daemon thread that takes the GIL back while the
// interpreter finalizes is ended by Python with pthread_exit, whose forced
// unwind must pass through here: out of py::gil_scoped_release's destructor,
// noexcept, it became std::terminate ("terminate called without an active
// exception", the process aborted at exit). pybind11 lets it pass on.
class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() noexcept(false) { PyEval_RestoreThread(state_); }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

// --- exceptions

struct Exceptions {
  PyObject* base = nullptr;
  std::vector<std::pair<remem::StatusCode, PyObject*>> by_code;
};
Exceptions& Errors() {
  static Exceptions e;
  return e;
}

// Raises `status` (not OK) as its Python exception. Needs the GIL.
[[noreturn]] void Raise(const remem::Status& status) {
  PyObject* cls = Errors().base;
  for (const auto& [code, c] : Errors().by_code) {
    if (code == status.code()) cls = c;
  }
  py::object type = py::reinterpret_borrow<py::object>(cls);
  py::object exc = type(status.ToString());
  exc.attr("code") = py::str(std::string(remem::StatusCodeName(status.code())));
  exc.attr("message") = py::str(status.message());
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

template <typename T>
T Check(remem::Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}
void Check(const remem::Status& s) {
  if (!s.ok()) Raise(s);
}

[[noreturn]] void RaiseClosed(const char* what) {
  Raise(remem::Status::Unavailable(std::string(what) + ": session closed"));
}

// bytes, bytearray, memoryview or str (UTF-8) -> bytes.
std::string ToBytes(py::handle h, const char* what) {
  if (PyBytes_Check(h.ptr())) {
    char* data = nullptr;
    Py_ssize_t len = 0;
    PyBytes_AsStringAndSize(h.ptr(), &data, &len);
    return std::string(data, size_t(len));
  }
  if (PyUnicode_Check(h.ptr())) {
    Py_ssize_t len = 0;
    const char* data = PyUnicode_AsUTF8AndSize(h.ptr(), &len);
    if (data == nullptr) throw py::error_already_set();
    return std::string(data, size_t(len));
  }
  if (PyByteArray_Check(h.ptr()) || PyMemoryView_Check(h.ptr())) {
    return std::string(py::bytes(py::reinterpret_borrow<py::object>(h)));
  }
  throw py::type_error(std::string(what) + " must be bytes or str, not " +
                       std::string(py::str(h.get_type().attr("__name__"))));
}

py::bytes Bytes(const std::string& s) { return py::bytes(s.data(), s.size()); }

// --- the session's state, shared by everything attached to it

// What a session's objects have in common: close() destroys their C++ side.
class Attached {
 public:
  virtual ~Attached() = default;
  // Called with the session's mutex held.
  virtual void Detach() = 0;
};

struct SessionState {
  std::mutex mu;
  std::unique_ptr<remem::Session> session;  // null once closed
  std::vector<std::weak_ptr<Attached>> attached;

  // Destroys the attached objects' C++ side, then the Session. Mutex held.
  void CloseLocked() {
    for (auto it = attached.rbegin(); it != attached.rend(); ++it) {
      if (auto a = it->lock()) a->Detach();
    }
    attached.clear();
    session.reset();
  }
  ~SessionState() {
    // Everything attached holds a shared_ptr to this: all are gone.
    session.reset();
  }
};
using StatePtr = std::shared_ptr<SessionState>;

// Runs fn(*obj) with the GIL released and `mu` held; raises Unavailable
// ("WHAT: CLOSED") if obj is null (closed). fn must not touch Python.
template <typename T, typename Fn>
auto WithOpen(std::mutex& mu, const std::unique_ptr<T>& obj, const char* what,
              const char* closed_text, Fn fn) {
  bool closed = false;
  using R = decltype(fn(*obj));
  std::optional<R> out;
  {
    ReleaseGil release;
    std::lock_guard<std::mutex> lock(mu);
    if (!obj) {
      closed = true;
    } else {
      out.emplace(fn(*obj));
    }
  }
  if (closed) {
    Raise(remem::Status::Unavailable(std::string(what) + ": " + closed_text));
  }
  return std::move(*out);
}

// fn(session), as WithOpen.
template <typename Fn>
auto WithSession(SessionState& st, const char* what, Fn fn) {
  return WithOpen(st.mu, st.session, what, "session closed", fn);
}

// An object attached to a session, owning a C++ T (a store, namespace or
// mapping) that close() destroys.
template <typename T>
class Handle : public Attached {
 public:
  Handle(StatePtr state, std::unique_ptr<T> obj)
      : state_(std::move(state)), obj_(std::move(obj)) {}
  ~Handle() override { Release(); }
  // Destroys the C++ object now, under the mutex. The GIL is held here; the
  // mutex is never held while waiting for the GIL, so this cannot deadlock.
  void Release() {
    std::lock_guard<std::mutex> lock(state_->mu);
    obj_.reset();
  }
  void Detach() override { obj_.reset(); }

  // Runs fn(obj) as WithSession does; raises if closed.
  template <typename Fn>
  auto Call(const char* what, Fn fn) {
    bool closed = false;
    using R = decltype(fn(*obj_));
    std::optional<R> out;
    {
      ReleaseGil release;
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!obj_ || !state_->session) {
        closed = true;
      } else {
        out.emplace(fn(*obj_));
      }
    }
    if (closed) RaiseClosed(what);
    return std::move(*out);
  }
  // fn(obj) with the session's mutex already held (and the GIL released):
  // nothing if detached.
  template <typename Fn>
  auto CallLocked(Fn fn) -> std::optional<decltype(fn(std::declval<T&>()))> {
    if (!obj_) return std::nullopt;
    return fn(*obj_);
  }
  const StatePtr& state() const { return state_; }

 private:
  StatePtr state_;
  std::unique_ptr<T> obj_;
};

// Makes a Handle<T> of a freshly opened `obj` and registers it for close().
// Mutex held by the caller.
template <typename H, typename T>
std::shared_ptr<H> AttachLocked(const StatePtr& st, std::unique_ptr<T> obj) {
  auto h = std::make_shared<H>(st, std::move(obj));
  // Drop the entries of collected objects now and then.
  std::erase_if(st->attached, [](const auto& w) { return w.expired(); });
  st->attached.push_back(h);
  return h;
}

// --- Python classes

class PyHash : public Handle<remem::HashStore> {
 public:
  using Handle::Handle;
};
class PyTree : public Handle<remem::TreeStore> {
 public:
  using Handle::Handle;
};
class PyMapping : public Handle<remem::Mapping> {
 public:
  PyMapping(StatePtr st, std::unique_ptr<remem::Mapping> m)
      : Handle(std::move(st), std::move(m)) {}
  uint64_t address = 0;
  uint64_t length = 0;
};
class PyNamespace : public Handle<remem::Namespace> {
 public:
  PyNamespace(StatePtr st, std::unique_ptr<remem::Namespace> ns)
      : Handle(std::move(st), std::move(ns)) {}
  std::string name;
  uint64_t id = 0;
};

// The client of a cluster: the C++ Cluster (null once closed) behind a
// mutex, as a session's state.
struct ClusterState {
  std::mutex mu;
  std::unique_ptr<remem::Cluster> cluster;
};

// fn(cluster), as WithOpen.
template <typename Fn>
auto WithCluster(ClusterState& st, const char* what, Fn fn) {
  return WithOpen(st.mu, st.cluster, what, "cluster closed", fn);
}

class PyClusterTree;

class PyCluster {
 public:
  PyCluster(py::object seeds, const std::string& transport, py::object secret,
            std::optional<int64_t> timeout_ms, int64_t wait_for_config_ms,
            const std::string& read_from, const std::string& read_path) {
    remem::ClusterOptions o;
    if (PyUnicode_Check(seeds.ptr())) {
      o.seeds = Check(remem::ParseSeeds(seeds.cast<std::string>()));
    } else {
      for (py::handle h : py::iterable(seeds)) {
        o.seeds.push_back(ToBytes(h, "seed"));
      }
    }
    o.session.transport = Check(remem::ParseTransport(transport));
    o.session.read_path = Check(remem::ParseReadPath(read_path));
    if (!secret.is_none()) o.session.secret = ToBytes(secret, "secret");
    if (timeout_ms) {
      if (*timeout_ms <= 0) {
        Raise(remem::Status::InvalidArgument("timeout_ms must be positive"));
      }
      o.session.timeout = std::chrono::milliseconds(*timeout_ms);
    }
    if (wait_for_config_ms < 0) {
      Raise(remem::Status::InvalidArgument(
          "wait_for_config_ms must not be negative"));
    }
    o.wait_for_config = std::chrono::milliseconds(wait_for_config_ms);
    if (read_from == "any") {
      o.read_from = remem::ReadFrom::kAnyReplica;
    } else if (read_from != "primary") {
      Raise(
          remem::Status::InvalidArgument("read_from must be 'primary' or "
                                         "'any', not '" +
                                         read_from + "'"));
    }
    remem::Result<std::unique_ptr<remem::Cluster>> c = [&] {
      ReleaseGil release;
      return remem::Cluster::Connect(o);
    }();
    state_ = std::make_shared<ClusterState>();
    state_->cluster = Check(std::move(c));
  }

  template <typename Fn>
  auto Call(const char* what, Fn fn) {
    return WithCluster(*state_, what, fn);
  }
  void Close() {
    ReleaseGil release;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->cluster.reset();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(state_->mu);
    return !state_->cluster;
  }
  const std::shared_ptr<ClusterState>& state() const { return state_; }

 private:
  std::shared_ptr<ClusterState> state_;
};

// Cluster.tree(): the cluster's ordered store, valid while the cluster is
// open (the C++ Cluster owns it).
class PyClusterTree {
 public:
  PyClusterTree(std::shared_ptr<ClusterState> st, remem::ClusterTree* tree)
      : state_(std::move(st)), tree_(tree) {}
  template <typename Fn>
  auto Call(const char* what, Fn fn) {
    return WithCluster(*state_, what,
                       [&](remem::Cluster&) { return fn(*tree_); });
  }

 private:
  std::shared_ptr<ClusterState> state_;
  remem::ClusterTree* tree_;
};

// Cluster.ops(): server-side operations, each run by its key's owner; valid
// while the cluster is open.
class PyClusterOps {
 public:
  explicit PyClusterOps(std::shared_ptr<ClusterState> st)
      : state_(std::move(st)) {}
  template <typename Fn>
  auto Call(const char* what, Fn fn) {
    return WithCluster(*state_, what, fn);
  }

 private:
  std::shared_ptr<ClusterState> state_;
};

class PyOps : public Handle<remem::OpsStore> {
 public:
  using Handle::Handle;
};

class PyObjects : public Handle<remem::ObjectStore> {
 public:
  using Handle::Handle;
};
class PyTransaction : public Handle<remem::Transaction> {
 public:
  using Handle::Handle;
  // The transaction goes before `store` (a member, destroyed before the
  // base class's destructor would run).
  ~PyTransaction() override { Release(); }
  std::shared_ptr<PyObjects> store;  // outlives the transaction
  bool over = false;                 // committed or aborted from Python
};

// A server's counters as a dict: name -> int, or str for a text one.
py::dict StatsDict(const remem::ServerStats& stats) {
  py::dict d;
  for (const auto& st : stats.all()) {
    if (st.is_text) {
      d[py::str(st.name)] = py::str(st.text);
    } else {
      d[py::str(st.name)] = py::int_(st.value);
    }
  }
  return d;
}

class PySession {
 public:
  PySession(const std::string& server, const std::string& transport,
            py::object secret, std::optional<int64_t> timeout_ms,
            const std::string& read_path) {
    remem::SessionOptions o;
    o.server = server;
    o.transport = Check(remem::ParseTransport(transport));
    o.read_path = Check(remem::ParseReadPath(read_path));
    if (!secret.is_none()) o.secret = ToBytes(secret, "secret");
    if (timeout_ms) {
      if (*timeout_ms <= 0) {
        Raise(remem::Status::InvalidArgument("timeout_ms must be positive"));
      }
      o.timeout = std::chrono::milliseconds(*timeout_ms);
    }
    remem::Result<std::unique_ptr<remem::Session>> s = [&] {
      ReleaseGil release;
      return remem::Session::Connect(o);
    }();
    state_ = std::make_shared<SessionState>();
    state_->session = Check(std::move(s));
  }

  void Close() {
    ReleaseGil release;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->CloseLocked();
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(state_->mu);
    return !state_->session;
  }

  py::tuple Ping() {
    auto r = WithSession(*state_, "ping",
                         [](remem::Session& s) { return s.Ping(); });
    auto p = Check(std::move(r));
    return py::make_tuple(p.rtt_us, p.transport);
  }
  py::dict Stats() {
    auto r = WithSession(*state_, "stats",
                         [](remem::Session& s) { return s.Stats(); });
    return StatsDict(Check(std::move(r)));
  }
  std::string Transport() {
    return WithSession(*state_, "transport",
                       [](remem::Session& s) { return s.transport(); });
  }
  uint64_t Incarnation() {
    return WithSession(*state_, "server_incarnation", [](remem::Session& s) {
      return s.server_incarnation();
    });
  }
  bool Connected() {
    return WithSession(*state_, "connected",
                       [](remem::Session& s) { return s.connected(); });
  }

  std::shared_ptr<PyHash> Hash() {
    return Open<PyHash>(
        "hash", [](remem::Session& s) { return remem::HashStore::Open(&s); });
  }
  std::shared_ptr<PyTree> Tree() {
    return Open<PyTree>(
        "tree", [](remem::Session& s) { return remem::TreeStore::Open(&s); });
  }

  std::shared_ptr<PyOps> Ops() {
    return Open<PyOps>(
        "ops", [](remem::Session& s) { return remem::OpsStore::Open(&s); });
  }
  std::shared_ptr<PyObjects> Objects() {
    return Open<PyObjects>("objects", [](remem::Session& s) {
      return remem::ObjectStore::Open(&s);
    });
  }

  // Opens a C++ object with fn(session) and attaches it, under the mutex.
  template <typename H, typename Fn>
  std::shared_ptr<H> Open(const char* what, Fn fn) {
    std::shared_ptr<H> h;
    using R = decltype(fn(*state_->session));
    std::optional<R> r;
    {
      ReleaseGil release;
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->session) {
        r.emplace(fn(*state_->session));
        if (r->ok()) h = AttachLocked<H>(state_, std::move(**r));
      }
    }
    if (!r) RaiseClosed(what);
    if (!r->ok()) Raise(r->status());
    return h;
  }
  const StatePtr& state() const { return state_; }

 private:
  StatePtr state_;
};

template <typename V>
py::object ValueOrNone(remem::Result<V> r) {
  if (r.ok()) return Bytes(r->value);
  if (r.status().code() == remem::StatusCode::kNotFound) return py::none();
  Raise(r.status());
}

// A str, bytes or bytearray is iterable, but as one key it would be taken
// for a list of one-character keys (multi_get("abc") looked up "a", "b"
// and "c"), and as a pair for a key and a value of one character each.
bool IsOneString(py::handle h) {
  return py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h) ||
         PyByteArray_Check(h.ptr());
}
std::vector<std::string> KeyList(py::iterable keys) {
  if (IsOneString(keys)) {
    throw py::type_error(
        "keys must be an iterable of keys (a list, say), not one str or "
        "bytes");
  }
  std::vector<std::string> out;
  for (py::handle k : keys) out.push_back(ToBytes(k, "key"));
  return out;
}
std::vector<std::pair<std::string, std::string>> PairList(py::iterable pairs) {
  if (IsOneString(pairs) || py::isinstance<py::dict>(pairs)) {
    throw py::type_error(
        "pairs must be an iterable of (key, value) sequences (for a dict: "
        "d.items())");
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (py::handle p : pairs) {
    if (!PySequence_Check(p.ptr()) || IsOneString(p)) {
      throw py::type_error("pairs must be (key, value) sequences");
    }
    py::sequence s = py::reinterpret_borrow<py::sequence>(p);
    if (s.size() != 2) {
      throw py::type_error("pairs must be (key, value) sequences");
    }
    out.emplace_back(ToBytes(s[0], "key"), ToBytes(s[1], "value"));
  }
  return out;
}
std::vector<std::string_view> Views(const std::vector<std::string>& v) {
  return {v.begin(), v.end()};
}
std::vector<std::pair<std::string_view, std::string_view>> Views(
    const std::vector<std::pair<std::string, std::string>>& v) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  out.reserve(v.size());
  for (const auto& [k, val] : v) out.emplace_back(k, val);
  return out;
}
template <typename V>
py::list ValuesOrNone(std::vector<remem::Result<V>> rs) {
  py::list out;
  for (auto& r : rs) out.append(ValueOrNone(std::move(r)));
  return out;
}
py::list Versions(std::vector<remem::Result<uint64_t>> rs) {
  py::list out;
  for (auto& r : rs) out.append(py::int_(Check(std::move(r))));
  return out;
}
bool DeletedOrMissing(const remem::Status& s) {
  if (s.code() == remem::StatusCode::kNotFound) return false;
  Check(s);
  return true;
}

py::tuple PageTuple(remem::TreeStore::Page page) {
  py::list items;
  for (const auto& it : page.items) {
    items.append(py::make_tuple(Bytes(it.key), Bytes(it.value)));
  }
  return py::make_tuple(items, page.more, Bytes(page.resume));
}

py::dict InfoDict(const remem::NamespaceInfo& i) {
  py::dict d;
  d["name"] = py::str(i.name);
  d["id"] = i.id;
  d["reserved_bytes"] = i.reserved_bytes;
  d["allocated_bytes"] = i.allocated_bytes;
  d["segments"] = i.segments;
  d["chunk_bytes"] = i.chunk_bytes;
  return d;
}

std::shared_ptr<PyNamespace> OpenNamespace(PySession& s, py::object name,
                                           bool create) {
  std::string n = ToBytes(name, "name");
  auto h = s.Open<PyNamespace>(
      create ? "Namespace.create" : "Namespace.open",
      [&](remem::Session& session) {
        return create ? remem::Namespace::Create(&session, n)
                      : remem::Namespace::Open(&session, n);
      });
  // Read under the mutex: name and id are plain fields of the C++ object.
  auto [nm, id] = h->Call("Namespace", [](remem::Namespace& ns) {
    return std::make_pair(ns.name(), ns.id());
  });
  h->name = nm;
  h->id = id;
  return h;
}

// An ObjectId, or its text "address:incarnation:capacity".
remem::ObjectId ToId(py::handle h) {
  if (py::isinstance<remem::ObjectId>(h)) return h.cast<remem::ObjectId>();
  if (PyUnicode_Check(h.ptr())) {
    return Check(remem::ObjectId::Parse(h.cast<std::string>()));
  }
  throw py::type_error("an object id must be a remem.ObjectId or str, not " +
                       std::string(py::str(h.get_type().attr("__name__"))));
}

std::shared_ptr<PyTransaction> Begin(const std::shared_ptr<PyObjects>& store) {
  std::shared_ptr<PyTransaction> h;
  bool closed = false;
  {
    ReleaseGil release;
    // Begun and attached under one hold of the mutex.
    std::lock_guard<std::mutex> lock(store->state()->mu);
    auto tx =
        store->CallLocked([](remem::ObjectStore& s) { return s.Begin(); });
    if (!tx || !store->state()->session) {
      closed = true;
    } else {
      h = AttachLocked<PyTransaction>(store->state(), std::move(*tx));
    }
  }
  if (closed) RaiseClosed("begin");
  h->store = store;
  return h;
}

bool IsConflict(const py::error_already_set& e) {
  PyObject* conflict = nullptr;
  for (const auto& [code, cls] : Errors().by_code) {
    if (code == remem::StatusCode::kConflict) conflict = cls;
  }
  return conflict != nullptr && e.matches(conflict);
}

// ObjectStore.run: the C++ Run's loop, with the body in Python (C++ Run
// would call it with the session's mutex held, and the body needs both the
// GIL and the mutex).
py::object RunBody(const std::shared_ptr<PyObjects>& store, py::function body,
                   int tries) {
  if (tries < 1) {
    Raise(remem::Status::InvalidArgument("tries must be at least 1"));
  }
  for (int i = 0;; ++i) {
    std::shared_ptr<PyTransaction> tx = Begin(store);
    py::object result;
    try {
      result = body(tx);
    } catch (py::error_already_set& e) {
      // An error drawn from reads that were not one state is not the
      // body's answer: it runs again (as in C++).
      remem::Status valid =
          tx->Call("run", [](remem::Transaction& t) { return t.Validate(); });
      tx->Call("run", [](remem::Transaction& t) {
        t.Abort();
        return 0;
      });
      tx->over = true;
      const bool again =
          valid.code() == remem::StatusCode::kConflict || IsConflict(e);
      if (!again || i + 1 >= tries) throw;
      continue;
    }
    remem::Status st =
        tx->Call("run", [](remem::Transaction& t) { return t.Commit(); });
    tx->over = true;
    if (st.ok()) return result;
    if (st.code() != remem::StatusCode::kConflict || i + 1 >= tries) Raise(st);
  }
}

py::dict CommittedVersions(PyTransaction& tx) {
  auto versions = tx.Call("committed_versions", [](remem::Transaction& t) {
    return t.committed_versions();
  });
  py::dict d;
  for (const auto& [id, v] : versions) d[py::cast(id)] = v;
  return d;
}

// The key-value methods of HashStore, TreeStore, Cluster and ClusterTree
// (S: the C++ store; H: its Python class, whose Call runs fn(S&)).
template <typename S, typename H, typename... Extra>
void DefKeyValue(py::class_<H, Extra...>& cls) {
  cls.def(
         "get",
         [](H& h, py::object key, bool with_version) -> py::object {
           std::string k = ToBytes(key, "key");
           auto r = h.Call("get", [&](S& s) { return s.Get(k); });
           if (!r.ok() && r.status().code() == remem::StatusCode::kNotFound) {
             return py::none();
           }
           auto v = Check(std::move(r));
           if (with_version) return py::make_tuple(Bytes(v.value), v.version);
           return Bytes(v.value);
         },
         py::arg("key"), py::arg("with_version") = false,
         "The value (bytes), or None if absent; with_version: (value, "
         "version), the version compare_and_put takes.")
      .def(
          "put",
          [](H& h, py::object key, py::object value) {
            std::string k = ToBytes(key, "key"), v = ToBytes(value, "value");
            return Check(h.Call("put", [&](S& s) { return s.Put(k, v); }));
          },
          py::arg("key"), py::arg("value"), "Insert or replace: the version.")
      .def(
          "put_if_absent",
          [](H& h, py::object key, py::object value) {
            std::string k = ToBytes(key, "key"), v = ToBytes(value, "value");
            return Check(h.Call("put_if_absent",
                                [&](S& s) { return s.PutIfAbsent(k, v); }));
          },
          py::arg("key"), py::arg("value"),
          "Insert only if absent: the version. Raises AlreadyExists.")
      .def(
          "compare_and_put",
          [](H& h, py::object key, py::object value, uint64_t expected) {
            std::string k = ToBytes(key, "key"), v = ToBytes(value, "value");
            return Check(h.Call("compare_and_put", [&](S& s) {
              return s.CompareAndPut(k, v, expected);
            }));
          },
          py::arg("key"), py::arg("value"), py::arg("expected"),
          "Replace only if the stored version is `expected`: the new "
          "version. Raises Conflict if it is not, NotFound if absent.")
      .def(
          "delete",
          [](H& h, py::object key) {
            std::string k = ToBytes(key, "key");
            return DeletedOrMissing(
                h.Call("delete", [&](S& s) { return s.Delete(k); }));
          },
          py::arg("key"), "True if it was there, False if absent.")
      .def(
          "multi_get",
          [](H& h, py::iterable keys) {
            auto ks = KeyList(keys);
            return ValuesOrNone(h.Call(
                "multi_get", [&](S& s) { return s.MultiGet(Views(ks)); }));
          },
          py::arg("keys"), "One value (or None) per key, in order.")
      .def(
          "multi_put",
          [](H& h, py::iterable pairs) {
            auto ps = PairList(pairs);
            return Versions(h.Call(
                "multi_put", [&](S& s) { return s.MultiPut(Views(ps)); }));
          },
          py::arg("pairs"),
          "Insert or replace (key, value) pairs: their versions. Raises the "
          "error of the first pair that failed, if any (the others may "
          "have been written).");
}

// The scans of TreeStore and ClusterTree.
template <typename S, typename H, typename... Extra>
void DefScans(py::class_<H, Extra...>& cls) {
  cls.def(
         "scan",
         [](H& h, py::object start, py::object end, uint32_t limit,
            bool descending) {
           std::string a = ToBytes(start, "start"), b = ToBytes(end, "end");
           auto order = descending ? remem::TreeStore::Order::kDescending
                                   : remem::TreeStore::Order::kAscending;
           return PageTuple(Check(h.Call(
               "scan", [&](S& s) { return s.Scan(a, b, limit, order); })));
         },
         py::arg("start"), py::arg("end") = py::bytes(""),
         py::arg("limit") = 100, py::arg("descending") = false,
         "Keys in [start, end) (end b'': unbounded), at most `limit`: "
         "(items as (key, value) pairs, more, resume). With more set, the "
         "next page is scan(resume, end) ascending, scan(start, resume) "
         "descending.")
      .def(
          "scan_prefix",
          [](H& h, py::object prefix, uint32_t limit, bool descending) {
            std::string p = ToBytes(prefix, "prefix");
            auto order = descending ? remem::TreeStore::Order::kDescending
                                    : remem::TreeStore::Order::kAscending;
            return PageTuple(Check(h.Call("scan_prefix", [&](S& s) {
              return s.ScanPrefix(p, limit, order);
            })));
          },
          py::arg("prefix"), py::arg("limit") = 100,
          py::arg("descending") = false);
}

// --- server-side operations: Python numbers and lists to the library's

// A Python int as int64, a float as double.
int64_t ToInt64(py::handle h) {
  if (PyBool_Check(h.ptr()) || !PyLong_Check(h.ptr())) {
    throw py::type_error("an int, not " +
                         std::string(py::str(h.get_type().attr("__name__"))));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0) throw py::value_error("an int beyond 64 bits");
  return int64_t(v);
}

remem::Number ToNumber(py::handle h) {
  if (PyBool_Check(h.ptr())) throw py::type_error("a number, not a bool");
  if (PyLong_Check(h.ptr())) return remem::Number(ToInt64(h));
  if (PyFloat_Check(h.ptr())) return remem::Number(h.cast<double>());
  throw py::type_error("a number must be an int or a float, not " +
                       std::string(py::str(h.get_type().attr("__name__"))));
}
py::object FromNumber(const remem::Number& n) {
  if (const int64_t* i = std::get_if<int64_t>(&n)) return py::int_(*i);
  return py::float_(std::get<double>(n));
}

// A list of numbers as a vector of `type` ("int64", "double", "float",
// "int32"; "": int64 if every element is an int, else double). A number
// past float's range in a float vector is refused (InvalidArgument), as a
// scalar operand is by the server and an element by the CLI: never stored
// as an infinity it was not.
remem::VectorData ToVector(py::iterable items, std::string type) {
  std::vector<py::handle> xs;
  for (py::handle h : items) xs.push_back(h);
  if (type.empty()) {
    type = "int64";
    for (py::handle h : xs) {
      if (!std::holds_alternative<int64_t>(ToNumber(h))) type = "double";
    }
  }
  auto fill = [&](auto v) {
    using T = typename decltype(v)::value_type;
    for (size_t i = 0; i < xs.size(); ++i) {
      py::handle h = xs[i];
      if constexpr (std::is_integral_v<T>) {
        const int64_t x = ToInt64(h);
        if (x < int64_t(std::numeric_limits<T>::min()) ||
            x > int64_t(std::numeric_limits<T>::max())) {
          throw py::value_error("an element beyond the vector's type");
        }
        v.push_back(T(x));
      } else {
        const remem::Number n = ToNumber(h);
        const double d = std::holds_alternative<int64_t>(n)
                             ? double(std::get<int64_t>(n))
                             : std::get<double>(n);
        if (std::is_same_v<T, float> && !remem::ops::FitsFloat(d)) {
          char text[32];
          std::snprintf(text, sizeof text, "%g", d);
          Raise(remem::Status::InvalidArgument(
              std::string("the element ") + text + " at index " +
              std::to_string(i) +
              " does not fit a float; the value is unchanged"));
        }
        v.push_back(T(d));
      }
    }
    return remem::VectorData(std::move(v));
  };
  if (type == "int64") return fill(std::vector<int64_t>{});
  if (type == "double") return fill(std::vector<double>{});
  if (type == "float") return fill(std::vector<float>{});
  if (type == "int32") return fill(std::vector<int32_t>{});
  Raise(remem::Status::InvalidArgument(
      "a vector's type is int64, double, float or int32, not '" + type + "'"));
}
py::list FromVector(const remem::VectorData& v) {
  py::list out;
  std::visit(
      [&](const auto& xs) {
        for (const auto& x : xs) out.append(x);
      },
      v);
  return out;
}
const char* TypeName(const remem::VectorData& v) {
  switch (remem::TypeOf(v)) {
    case remem::ElemType::kInt64:
      return "int64";
    case remem::ElemType::kDouble:
      return "double";
    case remem::ElemType::kFloat:
      return "float";
    case remem::ElemType::kInt32:
      return "int32";
  }
  return "?";
}

remem::VecFn ToVecFn(const std::string& s) {
  if (s == "add") return remem::VecFn::kAdd;
  if (s == "mul") return remem::VecFn::kMul;
  if (s == "set") return remem::VecFn::kSet;
  if (s == "min") return remem::VecFn::kMin;
  if (s == "max") return remem::VecFn::kMax;
  Raise(remem::Status::InvalidArgument(
      "a vector update is add, mul, set, min or max, not '" + s + "'"));
}
remem::Predicate ToPredicate(const std::string& s) {
  if (s == "<") return remem::Predicate::kLt;
  if (s == "<=") return remem::Predicate::kLe;
  if (s == ">") return remem::Predicate::kGt;
  if (s == ">=") return remem::Predicate::kGe;
  if (s == "==") return remem::Predicate::kEq;
  if (s == "!=") return remem::Predicate::kNe;
  Raise(remem::Status::InvalidArgument(
      "a filter's predicate is <, <=, >, >=, == or !=, not '" + s + "'"));
}

// What a session's OpsStore and a Cluster do differently in the operations
// below: a vector's put and get (a hash-store value) and a reduction (an
// OpsStore chooses where to reduce; a cluster asks the key's owner).
remem::Result<uint64_t> VecPutOn(remem::OpsStore& s, std::string_view k,
                                 const remem::VectorData& v) {
  return s.VecPut(k, v);
}
remem::Result<uint64_t> VecPutOn(remem::Cluster& c, std::string_view k,
                                 const remem::VectorData& v) {
  return c.Put(k, remem::EncodeVector(v));
}
remem::Result<remem::OpsStore::VectorValue> VecGetOn(remem::OpsStore& s,
                                                     std::string_view k) {
  return s.VecGet(k);
}
remem::Result<remem::OpsStore::VectorValue> VecGetOn(remem::Cluster& c,
                                                     std::string_view k) {
  auto r = c.Get(k);
  if (!r.ok()) return r.status();
  auto v = remem::DecodeVector(r->value);
  if (!v.ok()) return v.status();
  return remem::OpsStore::VectorValue{std::move(*v), r->version};
}
template <typename R>  // remem::Reduction, or a function id
remem::Result<remem::Number> VecReduceOn(remem::OpsStore& s, std::string_view k,
                                         R reduction) {
  return s.VecReduce(k, reduction);
}
template <typename R>
remem::Result<remem::Number> VecReduceOn(remem::Cluster& c, std::string_view k,
                                         R reduction) {
  auto r = c.Execute(remem::Op::VecReduce(std::string(k), reduction));
  if (!r.ok()) return r.status();
  return r->AsNumber();
}

// The server-side operations of OpsStore (Session.ops()) and of a Cluster
// (Cluster.ops(), routed to each key's owner). S: the C++ object; H: its
// Python class, whose Call runs fn(S&).
template <typename S, typename H, typename... Extra>
void DefOps(py::class_<H, Extra...>& ops) {
  // Integer atomics share a shape: (key, delta or operand, create,
  // initial) -> (integer, version).
  using IntOp = remem::Op (*)(std::string, int64_t, bool, int64_t);
  for (const auto& [name, build, doc] :
       {std::tuple<const char*, IntOp, const char*>{
            "fetch_add", &remem::Op::FetchAdd, "Adds: (old value, version)."},
        {"add_fetch", &remem::Op::AddFetch, "Adds: (new value, version)."},
        {"min", &remem::Op::Min, "Keeps the smaller: (new value, version)."},
        {"max", &remem::Op::Max, "Keeps the larger: (new value, version)."}}) {
    ops.def(
        name,
        [build = build, name = name](H& o, py::object key, int64_t operand,
                                     bool create, int64_t initial) {
          remem::Op op = build(ToBytes(key, "key"), operand, create, initial);
          auto reply = Check(o.Call(name, [&](S& s) { return s.Execute(op); }));
          return py::make_tuple(Check(reply.Int()), reply.version);
        },
        py::arg("key"), py::arg("operand"), py::arg("create") = false,
        py::arg("initial") = 0, doc);
  }
  ops.def(
         "compare_swap",
         [](H& o, py::object key, py::object expected, py::object desired,
            bool create) {
           remem::Op op = remem::Op::CompareSwap(
               ToBytes(key, "key"), ToBytes(expected, "expected"),
               ToBytes(desired, "desired"), create);
           auto r = Check(
               o.Call("compare_swap", [&](S& s) { return s.Execute(op); }));
           return py::make_tuple(r.applied, Bytes(r.value), r.version);
         },
         py::arg("key"), py::arg("expected"), py::arg("desired"),
         py::arg("create") = false,
         "Stores desired if the value is expected: (applied, the value "
         "compared, version).")
      .def(
          "append",
          [](H& o, py::object key, py::object data, bool create) {
            remem::Op op = remem::Op::Append(ToBytes(key, "key"),
                                             ToBytes(data, "data"), create);
            auto r =
                Check(o.Call("append", [&](S& s) { return s.Execute(op); }));
            return py::make_tuple(Check(r.Int()), r.version);
          },
          py::arg("key"), py::arg("data"), py::arg("create") = false,
          "Appends: (new length, version).")
      .def(
          "vec_put",
          [](H& o, py::object key, py::iterable items,
             const std::string& type) {
            std::string k = ToBytes(key, "key");
            remem::VectorData v = ToVector(items, type);
            return Check(
                o.Call("vec_put", [&](S& s) { return VecPutOn(s, k, v); }));
          },
          py::arg("key"), py::arg("items"), py::arg("type") = "",
          "Stores a vector (type int64, double, float or int32; by default "
          "int64 if every item is an int, else double): its version. An "
          "item past float's range in a float vector raises "
          "InvalidArgument, storing nothing.")
      .def(
          "vec_get",
          [](H& o, py::object key) -> py::object {
            std::string k = ToBytes(key, "key");
            auto r = o.Call("vec_get", [&](S& s) { return VecGetOn(s, k); });
            if (!r.ok() && r.status().code() == remem::StatusCode::kNotFound) {
              return py::none();
            }
            auto v = Check(std::move(r));
            return py::make_tuple(FromVector(v.data), TypeName(v.data),
                                  v.version);
          },
          py::arg("key"), "(items, type, version), or None if absent.")
      .def(
          "vec_update",
          [](H& o, py::object key, const std::string& fn, py::object operand,
             const std::string& type) {
            std::string k = ToBytes(key, "key");
            remem::VecFn f = ToVecFn(fn);
            remem::Op op =
                PyLong_Check(operand.ptr()) || PyFloat_Check(operand.ptr())
                    ? remem::Op::VecUpdate(k, f, ToNumber(operand))
                    : remem::Op::VecUpdate(k, f, ToVector(operand, type));
            return Check(o.Call("vec_update",
                                [&](S& s) { return s.Execute(op); }))
                .version;
          },
          py::arg("key"), py::arg("fn"), py::arg("operand"),
          py::arg("type") = "",
          "Elementwise element = fn(element, operand) (fn add, mul, set, "
          "min or max; operand a number, or a list as long of the "
          "vector's type, which `type` names as vec_put's does): the new "
          "version. On a float vector an operand, or an item of one, past "
          "float's range raises InvalidArgument, changing nothing.")
      .def(
          "vec_reduce",
          [](H& o, py::object key, py::object reduction) {
            std::string k = ToBytes(key, "key");
            if (PyLong_Check(reduction.ptr()) &&
                !PyBool_Check(reduction.ptr())) {
              int overflow = 0;
              const long long v =
                  PyLong_AsLongLongAndOverflow(reduction.ptr(), &overflow);
              if (overflow != 0 || v < 0 ||
                  v > std::numeric_limits<uint32_t>::max()) {
                throw py::value_error(
                    "a reduction's function id is from 0 to 4294967295, not " +
                    std::string(py::str(reduction)));
              }
              const uint32_t id = uint32_t(v);
              return FromNumber(Check(o.Call(
                  "vec_reduce", [&](S& s) { return VecReduceOn(s, k, id); })));
            }
            if (!PyUnicode_Check(reduction.ptr())) {
              throw py::type_error(
                  "a reduction is a str (sum, min, max or count) or an int "
                  "(a function id), not " +
                  std::string(py::str(reduction.get_type().attr("__name__"))));
            }
            const std::string r = reduction.cast<std::string>();
            remem::Reduction red;
            if (r == "sum") {
              red = remem::Reduction::kSum;
            } else if (r == "min") {
              red = remem::Reduction::kMin;
            } else if (r == "max") {
              red = remem::Reduction::kMax;
            } else if (r == "count") {
              red = remem::Reduction::kCount;
            } else {
              Raise(remem::Status::InvalidArgument(
                  "a reduction is sum, min, max, count or a function id, "
                  "not '" +
                  r + "'"));
            }
            return FromNumber(Check(o.Call(
                "vec_reduce", [&](S& s) { return VecReduceOn(s, k, red); })));
          },
          py::arg("key"), py::arg("reduction"),
          "sum, min, max or count (or the id of a --ops-library reduction): "
          "an int or a float.")
      .def(
          "vec_filter",
          [](H& o, py::object key, const std::string& predicate,
             py::object operand, bool indices) {
            remem::Op op = remem::Op::VecFilter(ToBytes(key, "key"),
                                                ToPredicate(predicate),
                                                ToNumber(operand), indices);
            auto r = Check(
                o.Call("vec_filter", [&](S& s) { return s.Execute(op); }));
            return FromVector(Check(remem::DecodeVector(r.value)));
          },
          py::arg("key"), py::arg("predicate"), py::arg("operand"),
          py::arg("indices") = false,
          "The elements e with `e predicate operand` (or their indices).")
      .def(
          "call",
          [](H& o, py::object key, uint32_t function_id, py::object arg) {
            remem::Op op = remem::Op::Call(ToBytes(key, "key"), function_id,
                                           ToBytes(arg, "arg"));
            auto r = Check(o.Call("call", [&](S& s) { return s.Execute(op); }));
            return py::make_tuple(Bytes(r.value), r.version);
          },
          py::arg("key"), py::arg("function_id"),
          py::arg("arg") = py::bytes(""),
          "A function of the server's --ops-library: (new value, version).");
}

py::dict ClusterInfo(const remem::Cluster::Info& i) {
  py::dict d;
  d["name"] = py::str(i.name);
  d["epoch"] = i.epoch;
  d["num_shards"] = i.num_shards;
  d["replicas"] = i.replicas;
  py::list nodes;
  for (const auto& n : i.nodes) {
    py::dict nd;
    nd["address"] = py::str(n.address);
    nd["capacity"] = n.capacity;
    nd["shards"] = n.shards;
    nd["backups"] = n.backups;
    nd["ranges"] = n.ranges;
    nd["domain"] = py::str(n.domain);
    nodes.append(nd);
  }
  d["nodes"] = nodes;
  py::list splits;
  for (const auto& sp : i.splits) splits.append(Bytes(sp));
  d["splits"] = splits;
  return d;
}

}  // namespace

PYBIND11_MODULE(remem, m) {
  m.doc() =
      "remem: a client of a remem-server (hash store, server-side "
      "operations, ordered store, namespaces of raw remote memory, "
      "transactional objects) or of a cluster of them. Synchronous; bytes "
      "in and out. A "
      "Session and everything attached to it must be used by one thread at "
      "a time (calls from several threads are serialized by a lock).";

  // Exceptions: remem.Error(Exception), with .code (the StatusCode's name)
  // and .message; a subclass for the codes callers commonly handle.
  Exceptions& ex = Errors();
  ex.base = PyErr_NewExceptionWithDoc(
      "remem.Error",
      "A remem operation failed. .code is the status code's name (e.g. "
      "'Unavailable'), .message the library's message.",
      PyExc_Exception, nullptr);
  m.add_object("Error", py::handle(ex.base));
  const std::pair<remem::StatusCode, const char*> subclasses[] = {
      {remem::StatusCode::kNotFound, "NotFound"},
      {remem::StatusCode::kInvalidArgument, "InvalidArgument"},
      {remem::StatusCode::kUnavailable, "Unavailable"},
      {remem::StatusCode::kTimedOut, "TimedOut"},
      {remem::StatusCode::kOutOfMemory, "OutOfMemory"},
      {remem::StatusCode::kAlreadyExists, "AlreadyExists"},
      {remem::StatusCode::kConflict, "Conflict"},
      {remem::StatusCode::kPermissionDenied, "PermissionDenied"},
  };
  for (const auto& [code, name] : subclasses) {
    std::string full = std::string("remem.") + name;
    PyObject* cls =
        PyErr_NewExceptionWithDoc(full.c_str(), nullptr, ex.base, nullptr);
    ex.by_code.emplace_back(code, cls);
    m.add_object(name, py::handle(cls));
  }

  // The classes that methods return, registered before any method is
  // defined: a signature names a class registered by then by its Python
  // name, one registered later by its C++ one ("(anonymous
  // namespace)::PyHash" in help()).
  py::class_<PyHash, std::shared_ptr<PyHash>> hash(m, "HashStore");
  py::class_<PyTree, std::shared_ptr<PyTree>> tree(m, "TreeStore");
  py::class_<PyOps, std::shared_ptr<PyOps>> ops(
      m, "OpsStore",
      "Server-side operations on hash-store values (KV-Direct's): atomics "
      "on 8-byte integers, compare-and-swap, append, vectors, and "
      "functions of a --ops-library. Each is linearizable per key.");
  py::class_<PyClusterTree> cluster_tree(
      m, "ClusterTree",
      "A cluster's ordered store: keys by range, scans across ranges in "
      "order.");
  py::class_<PyMapping, std::shared_ptr<PyMapping>> mapping(
      m, "Mapping", "A mapped range of a namespace; offsets from its start.");
  py::class_<PyTransaction, std::shared_ptr<PyTransaction>> transaction(
      m, "Transaction",
      "Reads objects one-sided and buffers writes, allocations and frees; "
      "commit() applies them all atomically or raises (Conflict, NotFound, "
      "InvalidArgument) with nothing applied.");
  py::class_<PyObjects, std::shared_ptr<PyObjects>> objects(
      m, "ObjectStore",
      "Transactional objects (FaRM) on the session's server: objects read "
      "one-sided, changed by transactions that commit atomically.");

  py::class_<PySession>(m, "Session",
                        "A connection to one remem-server. Use it from one "
                        "thread at a time; close() (or a with block) ends it "
                        "and every store, namespace and mapping of it.")
      .def(py::init<const std::string&, const std::string&, py::object,
                    std::optional<int64_t>, const std::string&>(),
           py::arg("server") = "127.0.0.1:7400", py::arg("transport") = "auto",
           py::arg("secret") = py::none(), py::arg("timeout_ms") = py::none(),
           py::arg("read_path") = "auto")
      .def("ping", &PySession::Ping, "One round trip: (rtt_us, transport).")
      .def("stats", &PySession::Stats,
           "The server's counters: name -> int|str.")
      .def("close", &PySession::Close)
      .def_property_readonly("closed", &PySession::closed)
      .def_property_readonly("connected", &PySession::Connected)
      .def_property_readonly("transport", &PySession::Transport)
      .def_property_readonly("server_incarnation", &PySession::Incarnation)
      .def("hash", &PySession::Hash, "The server's hash store.")
      .def("tree", &PySession::Tree, "The server's ordered store.")
      .def("objects", &PySession::Objects,
           "The server's transactional objects (an ObjectStore).")
      .def("ops", &PySession::Ops,
           "Server-side operations on the hash store's values (an "
           "OpsStore: atomics, vectors, user functions).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PySession& s, py::args) {
        s.Close();
        return false;
      });

  DefKeyValue<remem::HashStore>(hash);
  hash.def_property_readonly(
          "max_key",
          [](PyHash& h) {
            return h.Call("max_key",
                          [](remem::HashStore& s) { return s.max_key(); });
          })
      .def_property_readonly("max_value", [](PyHash& h) {
        return h.Call("max_value",
                      [](remem::HashStore& s) { return s.max_value(); });
      });

  DefKeyValue<remem::TreeStore>(tree);
  DefScans<remem::TreeStore>(tree);
  tree.def_property_readonly(
          "max_key",
          [](PyTree& h) {
            return h.Call("max_key",
                          [](remem::TreeStore& s) { return s.max_key(); });
          })
      .def_property_readonly(
          "max_value",
          [](PyTree& h) {
            return h.Call("max_value",
                          [](remem::TreeStore& s) { return s.max_value(); });
          })
      .def_property_readonly("max_scan", [](PyTree& h) {
        return h.Call("max_scan",
                      [](remem::TreeStore& s) { return s.max_scan(); });
      });

  DefOps<remem::OpsStore>(ops);

  py::class_<PyClusterOps> cluster_ops(
      m, "ClusterOps",
      "A cluster's server-side operations (Cluster.ops()): OpsStore's, each "
      "run by its key's owner.");
  DefOps<remem::Cluster>(cluster_ops);

  py::class_<PyCluster> cluster(
      m, "Cluster",
      "The client of a remem cluster: its hash store, routed by key to the "
      "server that owns it (refreshing the configuration as shards move), "
      "and tree(), its ordered store. Use it from one thread at a time; "
      "close() (or a with block) ends it.");
  cluster.def(py::init<py::object, const std::string&, py::object,
                       std::optional<int64_t>, int64_t, const std::string&,
                       const std::string&>(),
              py::arg("seeds"), py::arg("transport") = "auto",
              py::arg("secret") = py::none(),
              py::arg("timeout_ms") = py::none(),
              py::arg("wait_for_config_ms") = 0,
              py::arg("read_from") = "primary", py::arg("read_path") = "auto",
              "seeds: some of its servers, a list of 'host:port' or one "
              "comma-separated str. wait_for_config_ms: how long to wait for a "
              "cluster still forming. read_from: 'primary' (linearizable) or "
              "'any' (a replicated cluster's backups too: weaker, README).");
  DefKeyValue<remem::Cluster>(cluster);
  cluster
      .def_property_readonly(
          "info",
          [](PyCluster& c) {
            auto i =
                c.Call("info", [](remem::Cluster& cl) { return cl.info(); });
            return ClusterInfo(i);
          },
          "The configuration this client routes by: name, epoch, "
          "num_shards, replicas, nodes (dicts) and the ordered store's "
          "splits.")
      .def(
          "refresh",
          [](PyCluster& c) {
            Check(c.Call("refresh",
                         [](remem::Cluster& cl) { return cl.Refresh(); }));
          },
          "Fetches the configuration again.")
      .def(
          "owner_of",
          [](PyCluster& c, py::object key) {
            std::string k = ToBytes(key, "key");
            return c.Call("owner_of",
                          [&](remem::Cluster& cl) { return cl.OwnerOf(k); });
          },
          py::arg("key"), "'host:port' of the server that owns the key.")
      .def(
          "tree",
          [](PyCluster& c) {
            remem::ClusterTree* t = Check(
                c.Call("tree", [](remem::Cluster& cl) { return cl.Tree(); }));
            return std::make_unique<PyClusterTree>(c.state(), t);
          },
          "The cluster's ordered store (a ClusterTree; the cluster must "
          "have been formed with --tree-splits).")
      .def(
          "ops",
          [](PyCluster& c) {
            if (c.closed()) {
              Raise(remem::Status::Unavailable("ops: cluster closed"));
            }
            return std::make_unique<PyClusterOps>(c.state());
          },
          "The cluster's server-side operations (a ClusterOps: OpsStore's "
          "methods), each run by its key's owner.")
      .def(
          "stats",
          [](PyCluster& c) {
            auto all =
                c.Call("stats", [](remem::Cluster& cl) { return cl.Stats(); });
            py::dict d;
            for (const auto& [address, r] : all) {
              if (r.ok()) {
                d[py::str(address)] = StatsDict(*r);
              } else {
                py::dict e;
                e["error"] = py::str(r.status().ToString());
                d[py::str(address)] = e;
              }
            }
            return d;
          },
          "Each server's counters, by address ('host:port' -> dict, as "
          "Session.stats(); a server that cannot be reached: {'error': "
          "why}).")
      .def(
          "drain",
          [](PyCluster& c, const std::string& address, int64_t wait_ms) {
            if (wait_ms < 0) {
              Raise(remem::Status::InvalidArgument(
                  "wait_ms must not be negative"));
            }
            Check(c.Call("drain", [&](remem::Cluster& cl) {
              return cl.Drain(address, std::chrono::milliseconds(wait_ms));
            }));
          },
          py::arg("address"), py::arg("wait_ms") = 60000,
          "Moves every shard and range away from the server at address "
          "('host:port', a member), e.g. before stopping it; with wait_ms "
          "> 0 waits until it holds none (TimedOut if longer: the drain "
          "goes on). Raises NotFound (not a member), Conflict (with wait_ms "
          "> 0: a new server started there meanwhile), and remem.Error "
          "with .code 'Unsupported' if too few servers would be left for "
          "every shard's copies (the last one, or a replicated cluster too "
          "small without it).")
      .def("close", &PyCluster::Close)
      .def_property_readonly("closed", &PyCluster::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyCluster& c, py::args) {
        c.Close();
        return false;
      });

  DefKeyValue<remem::ClusterTree>(cluster_tree);
  DefScans<remem::ClusterTree>(cluster_tree);

  py::class_<PyNamespace, std::shared_ptr<PyNamespace>>(
      m, "Namespace",
      "A namespace of raw remote memory on the session's server.")
      .def_static(
          "create",
          [](PySession& s, py::object name) {
            return OpenNamespace(s, name, true);
          },
          py::arg("session"), py::arg("name"))
      .def_static(
          "open",
          [](PySession& s, py::object name) {
            return OpenNamespace(s, name, false);
          },
          py::arg("session"), py::arg("name"))
      .def_static(
          "delete",
          [](PySession& s, py::object name) {
            std::string n = ToBytes(name, "name");
            Check(WithSession(*s.state(), "Namespace.delete",
                              [&](remem::Session& session) {
                                return remem::Namespace::Delete(&session, n);
                              }));
          },
          py::arg("session"), py::arg("name"))
      .def_static(
          "list",
          [](PySession& s) {
            auto infos = Check(WithSession(
                *s.state(), "Namespace.list", [](remem::Session& session) {
                  return remem::Namespace::List(&session);
                }));
            py::list out;
            for (const auto& i : infos) out.append(InfoDict(i));
            return out;
          },
          py::arg("session"))
      .def_property_readonly("name",
                             [](PyNamespace& n) { return py::str(n.name); })
      .def_property_readonly("id", [](PyNamespace& n) { return n.id; })
      .def("info",
           [](PyNamespace& n) {
             return InfoDict(Check(n.Call(
                 "info", [](remem::Namespace& ns) { return ns.Info(); })));
           })
      .def(
          "reserve",
          [](PyNamespace& n, uint64_t bytes) {
            Check(n.Call("reserve", [&](remem::Namespace& ns) {
              return ns.Reserve(bytes);
            }));
          },
          py::arg("bytes"))
      .def(
          "release",
          [](PyNamespace& n, uint64_t bytes) {
            Check(n.Call("release", [&](remem::Namespace& ns) {
              return ns.Release(bytes);
            }));
          },
          py::arg("bytes") = UINT64_MAX)
      .def(
          "alloc",
          [](PyNamespace& n, uint64_t bytes) {
            auto seg = Check(n.Call("alloc", [&](remem::Namespace& ns) {
              return ns.Alloc(bytes);
            }));
            return py::make_tuple(seg.address, seg.length);
          },
          py::arg("bytes"), "A new zeroed segment: (address, length).")
      .def(
          "free",
          [](PyNamespace& n, uint64_t address) {
            Check(n.Call("free", [&](remem::Namespace& ns) {
              return ns.Free(address);
            }));
          },
          py::arg("address"))
      .def("segments",
           [](PyNamespace& n) {
             auto segs = Check(n.Call("segments", [](remem::Namespace& ns) {
               return ns.Segments();
             }));
             py::list out;
             for (const auto& s : segs) {
               out.append(py::make_tuple(s.address, s.length));
             }
             return out;
           })
      .def(
          "map",
          [](PyNamespace& n, uint64_t address, uint64_t length) {
            std::shared_ptr<PyMapping> h;
            bool closed = false;
            std::optional<remem::Status> error;
            {
              ReleaseGil release;
              // Mapped and attached under one hold of the mutex (not Call:
              // attaching needs it held too).
              std::lock_guard<std::mutex> lock(n.state()->mu);
              if (!n.state()->session) {
                closed = true;
              } else {
                auto r = n.CallLocked([&](remem::Namespace& ns) {
                  return ns.Map(address, length);
                });
                if (!r) {
                  closed = true;
                } else if (!r->ok()) {
                  error = r->status();
                } else {
                  h = AttachLocked<PyMapping>(n.state(), std::move(**r));
                  h->address = address;
                  h->length = length;
                }
              }
            }
            if (closed) RaiseClosed("map");
            if (error) Raise(*error);
            return h;
          },
          py::arg("address"), py::arg("length"),
          "Maps [address, address + length) of one segment: a Mapping.");

  mapping
      .def_property_readonly("address",
                             [](PyMapping& mp) { return mp.address; })
      .def_property_readonly("length", [](PyMapping& mp) { return mp.length; })
      .def(
          "read",
          [](PyMapping& mp, uint64_t offset, size_t length) {
            std::string buf;
            Check(mp.Call("read", [&](remem::Mapping& map) {
              // The range is checked before the buffer is made: a length
              // past the mapping is refused as Mapping::Read refuses it,
              // without allocating it first (10**10 took 10 GB).
              if (offset > map.length() || length > map.length() - offset) {
                return remem::Status::InvalidArgument(
                    "[" + std::to_string(offset) + ", +" +
                    std::to_string(length) + ") is outside the mapping's " +
                    std::to_string(map.length()) + " bytes");
              }
              buf.resize(length);
              return map.Read(offset, buf.data(), length);
            }));
            return Bytes(buf);
          },
          py::arg("offset"), py::arg("length"))
      .def(
          "write",
          [](PyMapping& mp, uint64_t offset, py::object data) {
            std::string d = ToBytes(data, "data");
            Check(mp.Call("write", [&](remem::Mapping& map) {
              return map.Write(offset, d.data(), d.size());
            }));
          },
          py::arg("offset"), py::arg("data"))
      .def(
          "compare_and_swap",
          [](PyMapping& mp, uint64_t offset, uint64_t expected,
             uint64_t desired) {
            return Check(mp.Call("compare_and_swap", [&](remem::Mapping& map) {
              return map.CompareAndSwap(offset, expected, desired);
            }));
          },
          py::arg("offset"), py::arg("expected"), py::arg("desired"),
          "Atomically on the 8-byte word at offset: the old value.")
      .def(
          "fetch_add",
          [](PyMapping& mp, uint64_t offset, uint64_t delta) {
            return Check(mp.Call("fetch_add", [&](remem::Mapping& map) {
              return map.FetchAdd(offset, delta);
            }));
          },
          py::arg("offset"), py::arg("delta"),
          "Atomically adds to the 8-byte word at offset: the old value.");

  py::class_<remem::ObjectId>(
      m, "ObjectId",
      "The id of a transactional object: its slot's address, the slot's "
      "incarnation and the object's capacity. str() is "
      "'address:incarnation:capacity' (ObjectId.parse reads it back); "
      "encode() is 16 bytes, for storing an id in an object.")
      .def(py::init(
               [](uint64_t address, uint32_t incarnation, uint32_t capacity) {
                 return remem::ObjectId{address, incarnation, capacity};
               }),
           py::arg("address"), py::arg("incarnation"), py::arg("capacity"))
      .def_readonly("address", &remem::ObjectId::address)
      .def_readonly("incarnation", &remem::ObjectId::incarnation)
      .def_readonly("capacity", &remem::ObjectId::capacity)
      .def_static(
          "parse",
          [](const std::string& text) {
            return Check(remem::ObjectId::Parse(text));
          },
          py::arg("text"))
      .def_static(
          "decode",
          [](py::object data) {
            return Check(remem::ObjectId::Decode(ToBytes(data, "data")));
          },
          py::arg("data"))
      .def("encode",
           [](const remem::ObjectId& id) { return Bytes(id.Encode()); })
      .def("__str__", &remem::ObjectId::ToString)
      .def("__repr__",
           [](const remem::ObjectId& id) {
             return "remem.ObjectId('" + id.ToString() + "')";
           })
      .def("__eq__",
           [](const remem::ObjectId& a, py::object b) {
             return py::isinstance<remem::ObjectId>(b) &&
                    a == b.cast<remem::ObjectId>();
           })
      .def("__hash__", [](const remem::ObjectId& id) {
        return py::hash(
            py::make_tuple(id.address, id.incarnation, id.capacity));
      });

  objects
      .def(
          "read",
          [](PyObjects& o, py::object id) {
            remem::ObjectId i = ToId(id);
            auto obj = Check(o.Call(
                "read", [&](remem::ObjectStore& s) { return s.Read(i); }));
            return py::make_tuple(Bytes(obj.data), obj.version);
          },
          py::arg("id"),
          "The object as last committed: (bytes, version). Raises NotFound "
          "if there is none at the id.")
      .def(
          "begin", [](const std::shared_ptr<PyObjects>& o) { return Begin(o); },
          "A new Transaction (a with block commits it at the end, or aborts "
          "it on an exception).")
      .def("run", &RunBody, py::arg("body"), py::arg("tries") = 64,
           "Calls body(tx) in a new transaction and commits it, again in a "
           "fresh one while the commit (or the body, from reads that were "
           "not one state) fails with Conflict, up to `tries` times; returns "
           "the body's result. The body's own exception aborts and is "
           "raised, except a remem.Conflict (whatever raised it) or an "
           "exception after reads that were not one state: those run the "
           "body again, and once the tries are spent the last exception is "
           "raised.")
      .def_property_readonly("max_object", [](PyObjects& o) {
        return o.Call("max_object",
                      [](remem::ObjectStore& s) { return s.max_object(); });
      });

  transaction
      .def(
          "read",
          [](PyTransaction& t, py::object id, bool with_version) -> py::object {
            remem::ObjectId i = ToId(id);
            uint64_t version = 0;
            auto data = Check(t.Call("read", [&](remem::Transaction& tx) {
              return tx.Read(i, &version);
            }));
            if (with_version) return py::make_tuple(Bytes(data), version);
            return Bytes(data);
          },
          py::arg("id"), py::arg("with_version") = false,
          "The object's bytes (this transaction's own write if it wrote it); "
          "with_version: (bytes, version): the version read, or 0 for this "
          "transaction's own write or allocation.")
      .def(
          "read_many",
          [](PyTransaction& t, py::iterable ids,
             bool with_version) -> py::object {
            // A str is iterable too: one id given alone is refused.
            if (py::isinstance<py::str>(ids) ||
                py::isinstance<py::bytes>(ids)) {
              throw py::type_error("read_many takes a list of ids, not one");
            }
            std::vector<remem::ObjectId> is;
            for (py::handle h : ids) is.push_back(ToId(h));
            std::vector<uint64_t> versions;
            auto data = Check(t.Call("read_many", [&](remem::Transaction& tx) {
              return tx.ReadMany(is, &versions);
            }));
            py::list out;
            for (size_t i = 0; i < data.size(); ++i) {
              if (with_version) {
                out.append(py::make_tuple(Bytes(data[i]), versions[i]));
              } else {
                out.append(Bytes(data[i]));
              }
            }
            return out;
          },
          py::arg("ids"), py::arg("with_version") = false,
          "read() of each id, in order, the ones not read yet read together "
          "(over tcp one round trip for all of them).")
      .def(
          "write",
          [](PyTransaction& t, py::object id, py::object data) {
            remem::ObjectId i = ToId(id);
            std::string d = ToBytes(data, "data");
            Check(t.Call("write", [&](remem::Transaction& tx) {
              return tx.Write(i, d);
            }));
          },
          py::arg("id"), py::arg("data"))
      .def(
          "alloc",
          [](PyTransaction& t, py::object data, uint32_t capacity) {
            std::string d = ToBytes(data, "data");
            return Check(t.Call("alloc", [&](remem::Transaction& tx) {
              return tx.Alloc(d, capacity);
            }));
          },
          py::arg("data"), py::arg("capacity") = 0,
          "A new object of data, with room for at least capacity bytes and "
          "for data (a smaller capacity, 0 included, is raised to data's "
          "size; the object gets its size class's, ObjectId.capacity); it "
          "exists once this commits. Its ObjectId.")
      .def(
          "free",
          [](PyTransaction& t, py::object id) {
            remem::ObjectId i = ToId(id);
            Check(t.Call("free",
                         [&](remem::Transaction& tx) { return tx.Free(i); }));
          },
          py::arg("id"))
      .def(
          "validate",
          [](PyTransaction& t) {
            Check(t.Call("validate",
                         [](remem::Transaction& tx) { return tx.Validate(); }));
          },
          "Raises Conflict if an object read so far has changed since.")
      .def(
          "commit",
          [](PyTransaction& t) {
            remem::Status st = t.Call(
                "commit", [](remem::Transaction& tx) { return tx.Commit(); });
            t.over = true;
            Check(st);
          },
          "Applies everything atomically, or raises Conflict (an object read "
          "changed), NotFound (an object written or freed unread is gone) or "
          "InvalidArgument (over 4096 objects, or data over a capacity), "
          "with nothing applied. The transaction is over either way.")
      .def(
          "abort",
          [](PyTransaction& t) {
            t.Call("abort", [](remem::Transaction& tx) {
              tx.Abort();
              return 0;
            });
            t.over = true;
          },
          "Ends it without applying anything.")
      .def_property_readonly("committed_versions", &CommittedVersions,
                             "{ObjectId: version} of the objects a committed "
                             "transaction wrote or allocated.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyTransaction& t, py::object type, py::args) {
        if (t.over) return false;
        t.over = true;
        if (type.is_none()) {
          Check(t.Call("commit",
                       [](remem::Transaction& tx) { return tx.Commit(); }));
        } else {
          t.Call("abort", [](remem::Transaction& tx) {
            tx.Abort();
            return 0;
          });
        }
        return false;
      });
}
