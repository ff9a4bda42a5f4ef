// The seam between remem-server's dispatcher and its data models.
//
// A data model is a Service: its own folder under src/ (layout, server-side
// handler, reader, wire structs, client-side store), registered with the
// server by one line in src/registry/registry.cc (DefaultServices). The
// dispatcher (dispatcher.h) owns connections, framing, the auth gate, routing
// to the owner thread and replies; a service sees requests only as Calls, and
// the server's resources only through the ServiceContext it is given at Init.
//
// Partitions: the server runs one thread per partition (--threads), and
// each partition's state is written by its owner thread only (FaRM's
// per-thread event loops). A service decides, from a request's bytes, which
// partition must run it (Route); the dispatcher runs Handle there. A
// request that touches many partitions routes kHere and fans out itself
// with ServiceContext::RunOn and FanIn.
//
// docs/ARCHITECTURE.md, "Adding a data model", walks through a new service.
//
// Thread contract: Init runs once, before any server thread starts, on the
// thread that calls Server::Start. Route runs on the thread that received
// the request; Handle(p, ...) and OnPass(p) on partition p's owner thread;
// OnConnectionClosed(p, ...) on p's owner thread; Stats on any thread (it
// reads counters the owners publish atomically). A Responder may be used
// from any thread.

#ifndef REMEM_SERVER_SERVICE_H_
#define REMEM_SERVER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proto/codec.h"
#include "proto/wire.h"
#include "remem/status.h"
#include "util/move_function.h"

namespace remem::fabric {
class LocalRegion;
}  // namespace remem::fabric

namespace remem::durability {
class Durability;
}  // namespace remem::durability

namespace remem::cluster {
class Ownership;
class Replicator;
}  // namespace remem::cluster

namespace remem::server {

using PartitionId = uint32_t;
using ConnectionId = uint64_t;

class Dispatcher;

// Answers one request, exactly once, from any thread. A Responder destroyed
// without replying answers Internal, so a client never waits for a request
// a service dropped by mistake; once the server's threads have exited
// (Dispatcher::Close) it answers nothing: its connection is closed. A
// Responder must not outlive the server's Dispatcher. Move-only.
class Responder {
 public:
  Responder() = default;
  Responder(Responder&& other) noexcept { *this = std::move(other); }
  Responder& operator=(Responder&& other) noexcept;
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();

  // Sends the reply: `payload` if `status` is OK, else the status and its
  // message. Replies to a connection that has closed meanwhile are
  // dropped.
  void Reply(Status status, std::string payload = {});
  bool pending() const { return dispatcher_ != nullptr; }

 private:
  friend class Dispatcher;
  Dispatcher* dispatcher_ = nullptr;
  uint32_t thread_ = 0;  // the connection's thread
  ConnectionId connection_ = 0;
  uint64_t request_id_ = 0;
  proto::ServiceId service_ = 0;
  uint8_t method_ = 0;
};

// One request, as a service sees it.
struct Call {
  uint8_t method = 0;
  std::string payload;  // owned by the call
  uint32_t epoch = 0;   // the configuration epoch the client used
  ConnectionId connection = 0;
  Responder responder;
};

// Where a request runs.
struct Route {
  enum Kind : uint8_t { kPartition, kHere };
  Kind kind = kHere;
  PartitionId partition = 0;
  static Route To(PartitionId p) { return {kPartition, p}; }
  // On the thread that received it: requests that need no partition's state,
  // or that fan out to several partitions.
  static Route Here() { return {kHere, 0}; }
};

// Named counters a service contributes to `remem stats`. Names are
// [a-z0-9_.], unique across the server; by convention a service prefixes
// its own with its name ("<name>_pairs").
class StatsBuilder {
 public:
  void Add(std::string name, uint64_t value) {
    stats_.push_back({std::move(name), proto::StatKind::kNumber, value, {}});
  }
  void AddText(std::string name, std::string text) {
    stats_.push_back(
        {std::move(name), proto::StatKind::kText, 0, std::move(text)});
  }
  const std::vector<proto::StatValue>& stats() const { return stats_; }
  std::vector<proto::StatValue>& stats() { return stats_; }

 private:
  std::vector<proto::StatValue> stats_;
};

// A counter that its owner thread writes and Stats reads from anywhere.
class Counter {
 public:
  void Add(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  void Set(uint64_t n) { v_.store(n, std::memory_order_relaxed); }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Joins a fan-out: Done() from any thread; the last of `n` runs `done` on
// its own thread, and destroys it (with what it captured) before Done
// returns. So `done` may hold the object that owns this FanIn (a request
// holding its fan-in, whose `done` holds the request) without a cycle: the
// FanIn may be destroyed by that last Done, which touches nothing of it
// afterwards.
class FanIn {
 public:
  FanIn(size_t n, util::MoveFunction<void()> done)
      : left_(n), done_(std::move(done)) {}
  void Done() {
    if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      util::MoveFunction<void()> done = std::move(done_);
      done();
    }
  }

 private:
  std::atomic<size_t> left_;
  util::MoveFunction<void()> done_;
};

// Options a service declares (its command-line flags and config keys).
// The server binary maps them to CLI11; tests set the values directly.
class OptionSet {
 public:
  virtual ~OptionSet() = default;
  virtual void AddString(const std::string& flag, std::string* value,
                         const std::string& help, bool testing = false) = 0;
  virtual void AddUint(const std::string& flag, uint64_t* value,
                       const std::string& help, bool testing = false) = 0;
  // A flag that may be given several times; each value is appended.
  virtual void AddStrings(const std::string& flag,
                          std::vector<std::string>* values,
                          const std::string& help, bool testing = false) = 0;
  // A byte size such as 512M; `*value` 0 means "the service's default".
  virtual void AddSize(const std::string& flag, uint64_t* value,
                       const std::string& help, bool testing = false) = 0;
};

// What the server gives a service: its view of the server's threads,
// memory and durability.
class ServiceContext {
 public:
  virtual ~ServiceContext() = default;

  // Partitions = server threads; partition p is owned by thread p.
  virtual uint32_t partitions() const = 0;
  virtual uint64_t incarnation() const = 0;
  // Bytes of --memory this service may allocate in regions. Services that
  // keep large structures declare a size flag of their own.
  virtual uint64_t memory_budget() const = 0;
  // Init only: the part of memory_budget() that services registered before
  // this one have not allocated yet (a default size that fits what is
  // left, instead of refusing to start).
  virtual uint64_t memory_unallocated() const = 0;

  // Init only: allocates and registers a region of `bytes` (UCX ALLOCATE,
  // so clients on the same host read it truly one-sided), exported to
  // clients with `access`. Region ids are stable names. InvalidArgument
  // if the services' regions together would pass --memory: the message
  // names the flags that sized them (NameMemory).
  virtual Result<fabric::LocalRegion*> AllocateRegion(
      uint64_t bytes, proto::RegionAccess access) = 0;
  // Init only, before AllocateRegion: `flag` (e.g. "--txn-memory") sized
  // this service's regions to `bytes` in all, by its default if
  // `by_default`; a refusal of AllocateRegion names the flag that asked and
  // those, defaults included, that took --memory before it.
  virtual void NameMemory(std::string /*flag*/, uint64_t /*bytes*/,
                          bool /*by_default*/) {}
  // Init only: runs fn(p) for every partition, in parallel, and returns the
  // first error (recovery of independent partitions).
  virtual Status ForEachPartition(
      const std::function<Status(PartitionId)>& fn) = 0;

  // Durable state (null without --data-dir or with --no-persistence).
  virtual durability::Durability* durability() = 0;

  // Runs `fn` on partition p's owner thread: at once if called there, else
  // at its next event-loop pass. Thread-safe.
  virtual void RunOn(PartitionId p, util::MoveFunction<void()> fn) = 0;
  // True on partition p's owner thread.
  virtual bool IsOwner(PartitionId p) const = 0;

  // In a cluster (--cluster), which keys this server owns now: a service
  // refuses a request for a key it does not own with Ownership::Owns's
  // status (Moved), before changing anything. Null on a single server.
  // The dispatcher has already refused requests of a newer epoch.
  virtual const cluster::Ownership* cluster() const { return nullptr; }
  // In a cluster: ships a partition's writes to the backups of their
  // shards (cluster/replicator.h) when the configuration replicates them.
  // Null on a single server.
  virtual cluster::Replicator* replicator() { return nullptr; }
};

class Service {
 public:
  virtual ~Service() = default;

  virtual proto::ServiceId id() const = 0;
  // Lower-case name: the prefix of its stats, its folder in --data-dir.
  virtual std::string_view name() const = 0;
  // Its methods are 0 .. num_methods()-1 (from its method enum's kCount).
  virtual uint8_t num_methods() const = 0;

  virtual void DeclareOptions(OptionSet* /*options*/) {}
  // Allocates regions, recovers durable state. Before the threads start.
  virtual Status Init(ServiceContext* ctx) = 0;
  // Which partition runs the request. An error is the reply (the request
  // is malformed); Handle is not called.
  virtual Result<Route> RouteCall(uint8_t method,
                                  std::string_view payload) const = 0;
  // Runs the request on partition p's owner thread (or, for Route::Here,
  // on the receiving thread with p = the receiving thread's partition).
  virtual void Handle(PartitionId p, Call call) = 0;
  // Contributes counters; may be called from any thread.
  virtual void Stats(StatsBuilder* /*out*/) const {}
  // At the end of every event-loop pass of p's owner thread, before the
  // durability layer's group commit. Returns work done (0 = idle).
  virtual size_t OnPass(PartitionId /*p*/) { return 0; }
  // A connection went away: release what it held in partition p.
  virtual void OnConnectionClosed(PartitionId /*p*/, ConnectionId /*c*/) {}
};

}  // namespace remem::server

#endif  // REMEM_SERVER_SERVICE_H_
