#include "server/server.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "cluster/member.h"
#include "cluster/member_lease.h"
#include "cluster/ownership.h"
#include "cluster/replicator.h"
#include "durability/durability.h"
#include "durability/env.h"
#include "fabric/context.h"
#include "fabric/endpoint.h"
#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "fabric/worker_address.h"
#include "proto/buffer.h"
#include "proto/codec.h"
#include "server/acceptor.h"
#include "server/dispatcher.h"
#include "server/lease.h"
#include "util/log.h"
#include "util/size.h"
#include "util/socket.h"

namespace remem::server {

using fabric::Clock;

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t DefaultMemory() {
  return (PhysicalMemory() / 4) & ~((1ull << 20) - 1);
}

namespace {

// How soon a server thread may move to a new UCX worker again after a
// stall (fabric::Worker::RenewAfterStall).
constexpr auto kRenewalInterval = std::chrono::seconds(60);

// The server's own methods: ping, echo, stats, regions, snapshot, and in a
// cluster its configuration, drains and member leases. Part of the server,
// not a data model, but plugged in through the same seam.
class CoreService final : public Service {
 public:
  explicit CoreService(Server::Impl* server) : server_(server) {}
  proto::ServiceId id() const override { return proto::kCoreService; }
  std::string_view name() const override { return "core"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(proto::CoreMethod::kCount);
  }
  Status Init(ServiceContext* ctx) override {
    ctx_ = ctx;
    return Status::OK();
  }
  Result<Route> RouteCall(uint8_t method, std::string_view) const override {
    if (method == static_cast<uint8_t>(proto::CoreMethod::kError)) {
      return Status::ProtocolError("kError is a reply, not a request");
    }
    return Route::Here();
  }
  void Handle(PartitionId p, Call call) override;

 private:
  Server::Impl* server_;
  ServiceContext* ctx_ = nullptr;
};

}  // namespace

struct Server::Impl : public ServiceContext {
  struct Thread {
    ServerThread state;
    std::thread thread;
  };

  ServerConfig config;
  // Before everything that may hold a Responder (the services, the
  // durability layer, the cluster): destroyed after them, closed once the
  // threads have exited (JoinThreads), so a Responder destroyed then
  // answers nothing instead of reaching a freed dispatcher.
  std::unique_ptr<Dispatcher> dispatcher;
  std::vector<std::unique_ptr<Service>> services;
  std::unique_ptr<CoreService> core;
  std::shared_ptr<fabric::Context> ctx;
  // Regions before the threads (their destruction deregisters memory that
  // a late callback must not touch).
  std::vector<std::unique_ptr<fabric::LocalRegion>> regions;
  uint32_t next_region_id = proto::kRootRegion;
  uint64_t allocated = 0;
  // Each service's memory flag (NameMemory) and the bytes it has
  // allocated, in the order the services started.
  struct MemoryUse {
    proto::ServiceId service;
    std::string flag;
    uint64_t bytes;  // as the flag sized them
    bool by_default;
    uint64_t allocated = 0;
  };
  std::vector<MemoryUse> memory_uses;
  fabric::LocalRegion* root = nullptr;
  bool initialising = true;
  std::unique_ptr<durability::Durability> durable;
  std::vector<std::unique_ptr<Thread>> threads;
  bool threads_started = false;
  // StopPartitions has run; its mutex makes a second caller wait for the
  // first.
  std::mutex partitions_stop_mu;
  bool partitions_stopped = false;
  std::unique_ptr<LeaseKeeper> lease;
  std::unique_ptr<Acceptor> acceptor;
  std::string address;
  std::string regions_reply;  // encoded once: regions never change
  uint64_t incarnation_id = 0;
  Clock::time_point started = Clock::now();
  std::atomic<bool> stop{false};
  std::vector<int> cpus;
  std::string recovery_summary;
  std::chrono::milliseconds lease_waited{0};
  bool no_tcp = false;          // UCX opened no tcp transport
  uint64_t shm_page_bytes = 0;  // pages backing regions (0: no shm peers)
  std::atomic<bool> fault_stall_done{false};  // --fault-receive-stall used
  // The acceptor's check of client addresses, which a renewed worker's
  // address joins (a copy: they share the server's own identities).
  ClientAddressCheck address_check;
  // Cluster (null on a single server). The member installs into the
  // ownership, so it is declared after it (destroyed first); the threads
  // that read the ownership are joined before the Impl is destroyed. The
  // ownership is declared after the services (destroyed before them): the
  // hash service's serving listener lives in it.
  std::unique_ptr<cluster::Ownership> ownership;
  std::unique_ptr<cluster::ClusterMember> member;
  std::unique_ptr<cluster::Replicator> replicator_of_cluster;
  std::unique_ptr<cluster::MemberLease> member_lease;
  // Set once the member lease has started (after the threads): Stats reads
  // it from any thread.
  std::atomic<cluster::MemberLease*> member_lease_view{nullptr};
  // The member as the server threads' Stats see it: published once it
  // exists (the threads serve before the member has joined).
  std::atomic<cluster::ClusterMember*> member_view{nullptr};
  Status StartCluster();
  // Sessions to other members (the replicator's, the manager's, the member
  // lease's): the cluster's one secret, over this server's transport (on
  // auto beside a server on shm, a loop would open tcp too and poll its
  // interface for nothing).
  SessionOptions PeerSessionOptions() const {
    SessionOptions so;
    so.secret = config.secret;
    so.transport = config.transport;
    return so;
  }

  Status Init();
  Status InitTransport();
  // InvalidArgument if the first worker's address (`own_address`) offers
  // none of the transports the server serves over (a UCX setting took them
  // away): it would say it listens and refuse every client.
  Status CheckReachable(std::string_view own_address) const;
  void ChooseCpus();
  void RunThread(Thread* t);
  void AdmitOn(uint32_t thread, ConnectionId id, std::string peer,
               std::string client_address, Acceptor::AdmitDone done);
  void OnConnectionClosed(uint32_t thread, ConnectionId id,
                          bool peer_may_have_died);
  // On the thread: its worker's receive queue stalled (a pass hook saw it).
  void RenewAfterStall_st(ServerThread* st);
  std::vector<proto::StatValue> Stats() const;
  void Shutdown();
  // Before the sessions' sockets close (a client fails its calls once it
  // sees its socket closed): every partition answers what it holds for
  // later (Durability::Stop: a snapshot being taken gets "the server is
  // stopping"), and the replies that sends across threads are sent. Once;
  // returns when the threads have done it.
  void StopPartitions();
  // Joins the threads (if they run), then closes the dispatcher.
  void JoinThreads();

  // --- ServiceContext
  uint32_t partitions() const override { return uint32_t(config.threads); }
  uint64_t incarnation() const override { return incarnation_id; }
  uint64_t memory_budget() const override { return config.memory; }
  uint64_t memory_unallocated() const override {
    return config.memory > allocated ? config.memory - allocated : 0;
  }
  Result<fabric::LocalRegion*> AllocateRegion(
      uint64_t bytes, proto::RegionAccess access) override {
    return Allocate(bytes, access, current_service);
  }
  void NameMemory(std::string flag, uint64_t bytes, bool by_default) override {
    memory_uses.push_back(
        {current_service, std::move(flag), bytes, by_default, 0});
  }
  // Why `owner`'s region of `bytes` does not fit in --memory.
  Status MemoryRefusal(proto::ServiceId owner, uint64_t bytes) const;
  Result<fabric::LocalRegion*> Allocate(uint64_t bytes,
                                        proto::RegionAccess access,
                                        proto::ServiceId owner);
  Status ForEachPartition(
      const std::function<Status(PartitionId)>& fn) override;
  durability::Durability* durability() override { return durable.get(); }
  void RunOn(PartitionId p, util::MoveFunction<void()> fn) override {
    dispatcher->RunOn(p, std::move(fn));
  }
  bool IsOwner(PartitionId p) const override {
    return Dispatcher::CurrentThread() == int(p);
  }
  const cluster::Ownership* cluster() const override { return ownership.get(); }
  cluster::Replicator* replicator() override {
    return replicator_of_cluster.get();
  }
  proto::ServiceId current_service = proto::kCoreService;
};

void CoreService::Handle(PartitionId, Call call) {
  using M = proto::CoreMethod;
  switch (static_cast<M>(call.method)) {
    case M::kPing:
      return call.responder.Reply(Status::OK());
    case M::kEcho:
      return call.responder.Reply(Status::OK(), std::move(call.payload));
    case M::kStats:
      return call.responder.Reply(Status::OK(),
                                  proto::EncodeStatsReply(server_->Stats()));
    case M::kRegions:
      return call.responder.Reply(Status::OK(), server_->regions_reply);
    case M::kSnapshot:
      break;
    case M::kClusterConfig: {
      const cluster::Ownership* o = server_->ownership.get();
      if (o == nullptr) {
        return call.responder.Reply(Status::Unsupported(
            "this server is not in a cluster (started without --cluster)"));
      }
      const cluster::Ownership::Installed* c = o->current();
      if (c == nullptr) {
        cluster::ClusterMember* m =
            server_->member_view.load(std::memory_order_acquire);
        // No member yet: it is still connecting to ZooKeeper or
        // registering there (up to --cluster-wait-ms), serving already
        // (found black-box: the answer said only "still forming").
        return call.responder.Reply(Status::Busy(
            "this cluster member has no configuration yet (the cluster is "
            "still forming: " +
            (m == nullptr ? "this server has not joined through ZooKeeper (" +
                                server_->config.cluster +
                                ") yet: it is connecting or registering"
                          : m->FormingState()) +
            ")"));
      }
      return call.responder.Reply(Status::OK(), c->encoded);
    }
    case M::kClusterLease: {
      cluster::ClusterMember* m =
          server_->member_view.load(std::memory_order_acquire);
      if (m == nullptr) {
        return call.responder.Reply(Status::Unsupported(
            "this server is not in a cluster (started without --cluster)"));
      }
      auto grant = m->GrantLease(call.payload);
      if (!grant.ok()) return call.responder.Reply(grant.status());
      return call.responder.Reply(Status::OK(), std::move(*grant));
    }
    case M::kClusterDrain: {
      const cluster::Ownership* o = server_->ownership.get();
      if (o == nullptr) {
        return call.responder.Reply(Status::Unsupported(
            "this server is not in a cluster (started without --cluster)"));
      }
      cluster::ClusterMember* m =
          server_->member_view.load(std::memory_order_acquire);
      const cluster::Ownership::Installed* c = o->current();
      if (m == nullptr || c == nullptr) {
        return call.responder.Reply(Status::Busy(
            "this cluster member has no configuration yet (the cluster is "
            "still forming)"));
      }
      if (c->config.IndexOf(call.payload) < 0) {
        return call.responder.Reply(Status::NotFound(
            "no member '" + call.payload + "' in configuration epoch " +
            std::to_string(c->config.epoch)));
      }
      // Replicated: the members that stay must be enough for every copy.
      // Not asked of a member that holds nothing (failed over, dead): its
      // drain takes no copy away, and retires it.
      if (const uint32_t f = c->config.replicas;
          f > 0 && c->config.members.size() < f + 2 &&
          c->config.HoldsAnyRole(c->config.IndexOf(call.payload))) {
        return call.responder.Reply(Status::Unsupported(
            "cannot drain " + call.payload + ": the cluster has " +
            std::to_string(c->config.members.size()) +
            " members, and its shards' " + std::to_string(f + 1) +
            " copies need " + std::to_string(f + 1) +
            " members besides the drained one (start another server "
            "first)"));
      }
      // Answered once the drain is in ZooKeeper (a member killed before
      // it got there has not acknowledged it).
      // The reply names the incarnation drained, so that a client waiting
      // for the drain can tell a server restarted at that address meanwhile
      // (a new member, not drained).
      m->RequestDrain(std::move(call.payload),
                      [responder = std::move(call.responder)](
                          Result<uint64_t> drained) mutable {
                        if (!drained.ok()) {
                          return responder.Reply(drained.status());
                        }
                        std::string reply;
                        proto::Append(&reply, *drained);
                        responder.Reply(Status::OK(), std::move(reply));
                      });
      return;
    }
    case M::kError:
    case M::kCount:
      return call.responder.Reply(Status::ProtocolError("not a request"));
  }
  durability::Durability* d = server_->durable.get();
  if (d == nullptr) {
    return call.responder.Reply(
        Status::Unsupported("this server runs without persistence (no "
                            "--data-dir, or --no-persistence)"));
  }
  // Every partition snapshots every durable service it holds; the last to
  // finish answers.
  struct Join {
    std::mutex mu;
    Status first;
    Responder responder;
  };
  auto join = std::make_shared<Join>();
  join->responder = std::move(call.responder);
  auto fan = std::make_shared<FanIn>(
      ctx_->partitions(), [join] { join->responder.Reply(join->first); });
  for (PartitionId p = 0; p < ctx_->partitions(); ++p) {
    ctx_->RunOn(p, [d, p, join, fan] {
      d->RequestSnapshot(p, [join, fan](Status st) {
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(join->mu);
          if (join->first.ok()) join->first = st;
        }
        fan->Done();
      });
    });
  }
}

Status Server::Impl::MemoryRefusal(proto::ServiceId owner,
                                   uint64_t bytes) const {
  const MemoryUse* asking = nullptr;
  std::vector<std::string> took;
  for (const MemoryUse& u : memory_uses) {
    if (u.service == owner) {
      asking = &u;
    } else if (u.allocated > 0) {
      took.push_back(u.flag + " " + FormatSize(u.allocated) +
                     (u.by_default ? " (its default)" : ""));
    }
  }
  std::string others;
  for (size_t i = 0; i < took.size(); ++i) {
    if (i > 0) others += i + 1 == took.size() ? " and " : ", ";
    others += took[i];
  }
  const uint64_t left =
      config.memory > allocated ? config.memory - allocated : 0;
  std::string what = asking != nullptr
                         ? asking->flag + " " + FormatSize(asking->bytes) +
                               (asking->by_default ? " (its default)" : "")
                         : FormatSize(bytes) + " more";
  return Status::InvalidArgument(
      what + " does not fit in --memory " + FormatSize(config.memory) + ": " +
      FormatSize(left) + " of it is left" +
      (others.empty() ? std::string() : ", the rest taken by " + others) +
      "; lower one of them (a default too, by giving its flag), or raise "
      "--memory");
}

Result<fabric::LocalRegion*> Server::Impl::Allocate(uint64_t bytes,
                                                    proto::RegionAccess access,
                                                    proto::ServiceId owner) {
  if (!initialising) {
    return Status::Internal("regions are allocated only at start");
  }
  if (owner != proto::kCoreService && allocated + bytes > config.memory) {
    return MemoryRefusal(owner, bytes);
  }
  if (next_region_id > 0xffff) {
    return Status::InvalidArgument(
        "too many regions (raise --region-size or lower --threads)");
  }
  auto r = fabric::LocalRegion::Allocate(ctx, next_region_id, bytes);
  if (!r.ok()) {
    return Status::OutOfMemory(
        "cannot allocate " + std::to_string(bytes) +
        " bytes of registered memory: " + r.status().message());
  }
  ++next_region_id;
  if (owner != proto::kCoreService ||
      access == proto::RegionAccess::kReadWrite) {
    allocated += bytes;
  }
  for (MemoryUse& u : memory_uses) {
    if (u.service == owner) u.allocated += bytes;
  }
  fabric::LocalRegion* raw = r->get();
  regions.push_back(std::move(*r));
  if (regions.size() == 1 && config.transport != Transport::kTcp) {
    // One-sided gets over shared memory pay a TLB miss per bucket on 4 KiB
    // pages; 2 MiB pages measured up to 1.5x faster (docs/BENCHMARKS.md).
    const fabric::ShmPages pages = fabric::ShmPagesAt(raw->base());
    shm_page_bytes = pages.page_bytes;
    // The files are sparse: a tmpfs too small for --memory is found only
    // when a page cannot be had, by a SIGBUS in whichever process touches
    // it first (this server, or a client reading one-sided). Refuse now.
    if (!pages.dir.empty() && pages.available_bytes < config.memory) {
      return Status::OutOfMemory(fmt::format(
          "--memory {} is more than the {} free in {}, where shared memory "
          "for local clients is kept: lower --memory, or give --shm-dir a "
          "larger tmpfs",
          FormatSize(config.memory), FormatSize(pages.available_bytes),
          pages.mount));
    }
    if (pages.page_bytes >= (uint64_t{2} << 20)) {
      log::Info("shared-memory exports on {} pages: {}",
                FormatSize(pages.page_bytes), pages.mount);
    } else {
      log::Info(
          "shared-memory exports on {} pages: {}; --shm-dir on a tmpfs "
          "mounted with huge=always gives 2 MiB pages and faster one-sided "
          "gets (README, \"Huge pages\")",
          FormatSize(pages.page_bytes), pages.mount);
    }
  }
  dispatcher->Export(raw->id(), {raw, owner, access});
  return raw;
}

Status Server::Impl::ForEachPartition(
    const std::function<Status(PartitionId)>& fn) {
  std::vector<Status> errors(partitions());
  std::vector<std::thread> workers;
  for (PartitionId p = 0; p < partitions(); ++p) {
    workers.emplace_back([&, p] { errors[p] = fn(p); });
  }
  for (auto& w : workers) w.join();
  for (const Status& st : errors) {
    if (!st.ok()) return st;
  }
  return Status::OK();
}

Status Server::Impl::InitTransport() {
  // The operator's UCX settings, before this sets any of its own (but the
  // library's own default, fabric/context.cc).
  const std::string operator_ucx = fabric::Context::OperatorSettings();
  // UCX 1.13's new protocol layer overruns a stack buffer inside libucp on
  // the serving thread at the first handshake, aborting the server ("stack
  // smashing detected"; a client with it is fine): refused up front.
  if (const char* proto = std::getenv("UCX_PROTO_ENABLE")) {
    std::string v(proto);
    std::transform(v.begin(), v.end(), v.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (v == "y" || v == "yes" || v == "on" || v == "1" || v == "true") {
      return Status::InvalidArgument(
          "UCX_PROTO_ENABLE=" + std::string(proto) +
          " is not supported by remem-server: UCX 1.13's new protocols "
          "abort the server at its first client; unset it (a client may "
          "set it)");
    }
  }
  // UCX's tcp transport opens a listening socket on every network device it
  // uses, and trusts whoever connects to it (docs/SECURITY.md, "UCX's tcp
  // ports"). Keep it on the interface the operator chose to listen on
  // (a server on 127.0.0.1 opens nothing on eth0), unless the operator set
  // UCX_NET_DEVICES; and with --transport auto on loopback, where no client
  // can come over tcp, open no tcp port at all.
  bool loopback = false;
  sockaddr_storage ss{};
  socklen_t len = 0;
  REMEM_RETURN_IF_ERROR(util::ResolveAddress(config.listen, true, &ss, &len));
  const std::string dev = util::InterfaceOf(ss);
  loopback = dev == "lo";
  if (config.transport != Transport::kShm &&
      getenv("UCX_NET_DEVICES") == nullptr && !dev.empty()) {
    setenv("UCX_NET_DEVICES", dev.c_str(), 1);
  }
  no_tcp = config.transport == Transport::kShm ||
           (config.transport == Transport::kAuto && loopback);
  fabric::Context::Options co;
  co.no_tcp = config.transport == Transport::kAuto && loopback;
  co.server = true;
  if (!config.shm_dir.empty()) {
    if (config.transport == Transport::kTcp) {
      return Status::InvalidArgument(
          "--shm-dir is for shared-memory clients; with --transport tcp "
          "there are none");
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(config.shm_dir, ec)) {
      return Status::InvalidArgument("--shm-dir " + config.shm_dir +
                                     ": not a directory");
    }
    if (::access(config.shm_dir.c_str(), W_OK | X_OK) != 0) {
      return Status::InvalidArgument("--shm-dir " + config.shm_dir +
                                     ": cannot create files there (" +
                                     std::strerror(errno) + ")");
    }
    // Anywhere else the exported memory would be a file on disk.
    if (const fabric::ShmPages on = fabric::ShmPagesOf(config.shm_dir);
        !on.tmpfs) {
      return Status::InvalidArgument("--shm-dir " + config.shm_dir +
                                     " is not on a tmpfs: " + on.mount);
    }
    co.shm_dir = config.shm_dir;
  }
  auto ctx_or = fabric::Context::Shared(config.transport, co);
  if (!ctx_or.ok()) {
    // UCX that cannot start under the operator's UCX_* settings (a
    // UCX_TLS naming no transport) is a bad setting, refused as a bad flag
    // is (exit 2), naming them.
    if (!operator_ucx.empty()) {
      return Status::InvalidArgument(
          "UCX cannot start under the UCX settings " + operator_ucx + " (" +
          ctx_or.status().message() + "): check them");
    }
    return ctx_or.status();
  }
  ctx = *ctx_or;
  return Status::OK();
}

Status Server::Impl::CheckReachable(std::string_view own_address) const {
  auto parsed = fabric::ParseWorkerAddress(own_address);
  if (!parsed.ok()) return Status::OK();  // UCX's to judge, not ours
  static const uint16_t kTcp = fabric::UcxTransportChecksum("tcp");
  // UCX's shared-memory transports that carry messages (cma only reads
  // and writes): posix by default, sysv when the operator chose it
  // (docs/SECURITY.md), xpmem where the kernel has it.
  static const uint16_t kShm[] = {fabric::UcxTransportChecksum("posix"),
                                  fabric::UcxTransportChecksum("sysv"),
                                  fabric::UcxTransportChecksum("xpmem")};
  bool tcp = false, shm = false;
  for (const fabric::WorkerAddressIface& e : parsed->ifaces) {
    tcp = tcp || e.transport == kTcp;
    shm = shm || std::find(std::begin(kShm), std::end(kShm), e.transport) !=
                     std::end(kShm);
  }
  // What clients could use: tcp unless the server opened none (no_tcp),
  // shared memory unless --transport tcp.
  const bool tcp_wanted = !no_tcp;
  const bool shm_wanted = config.transport != Transport::kTcp;
  if ((tcp_wanted && tcp) || (shm_wanted && shm)) return Status::OK();
  std::string why;
  if (tcp_wanted) {
    const char* devices = std::getenv("UCX_NET_DEVICES");
    why += "no tcp transport (UCX_NET_DEVICES=" +
           std::string(devices != nullptr ? devices : "") +
           "; it must name a device UCX can use, such as the one " +
           config.listen + " is on)";
  }
  if (shm_wanted) {
    if (!why.empty()) why += " and ";
    const char* dir = std::getenv("UCX_POSIX_DIR");
    why += "no shared-memory transport (UCX's posix or sysv";
    why += dir != nullptr ? ", UCX_POSIX_DIR=" + std::string(dir) : "";
    why += ")";
  }
  return Status::InvalidArgument("UCX gives this server " + why +
                                 ", so no client could reach it; see UCX's "
                                 "warnings above, and UCX_TLS if it is set");
}

void Server::Impl::ChooseCpus() {
  if (!config.pin_threads) return;
  if (!config.cpus.empty()) {
    cpus = config.cpus;
    return;
  }
  // Pin only where the operator narrowed the process's CPUs (taskset, a
  // cgroup): two servers started with defaults must not share one CPU.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && CPU_COUNT(&set) >= online) return;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
}

Status Server::Impl::Init() {
  if (config.threads < 1 || config.threads > 256) {
    return Status::InvalidArgument("--threads must be between 1 and 256");
  }
  if (config.memory == 0) config.memory = DefaultMemory();
  const uint64_t phys = PhysicalMemory();
  // The hash store's own check says how much for more threads.
  if (config.memory < (4ull << 20)) {
    return Status::InvalidArgument(
        "--memory must be at least 4 MiB per server thread" +
        (config.threads > 1
             ? " (" + std::to_string(4 * config.threads) + " MiB for " +
                   std::to_string(config.threads) + " threads)"
             : std::string()));
  }
  if (phys != 0 && config.memory > phys) {
    return Status::OutOfMemory(
        "--memory " + std::to_string(config.memory) +
        " bytes is more than this machine's physical memory (" +
        std::to_string(phys) + " bytes)");
  }
  if (config.region_size < (1ull << 20)) {
    return Status::InvalidArgument("--region-size must be at least 1 MiB");
  }
  if (config.lease < std::chrono::milliseconds(10)) {
    return Status::InvalidArgument("--lease-ms must be at least 10");
  }
  // One file descriptor per session: take what the hard limit allows.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);
  }

  std::random_device rd;
  incarnation_id =
      (uint64_t{rd()} << 32) ^ rd() ^
      static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  REMEM_RETURN_IF_ERROR(InitTransport());
  ChooseCpus();

  if (config.persistence && !config.data_dir.empty()) {
    durability::DurabilityOptions d;
    d.data_dir = config.data_dir;
    d.fsync = config.fsync;
    d.snapshot_log_bytes = config.snapshot_log_bytes;
    d.recovery = config.recovery;
    d.fault = config.fault_log_io;
    d.slow_snapshot_us = config.fault_slow_snapshot_us;
    auto opened = durability::Durability::Open(d, uint32_t(config.threads));
    if (!opened.ok()) return opened.status();
    durable = std::move(*opened);
  }

  std::vector<ServerThread*> states;
  for (int i = 0; i < config.threads; ++i) {
    auto t = std::make_unique<Thread>();
    t->state.index = uint32_t(i);
    auto w = fabric::Worker::Create(ctx, proto::kMaxRpcPayload);
    if (!w.ok()) return w.status();
    if (i == 0) REMEM_RETURN_IF_ERROR(CheckReachable((*w)->address()));
    t->state.worker = std::move(*w);
    states.push_back(&t->state);
    threads.push_back(std::move(t));
  }
  dispatcher = std::make_unique<Dispatcher>(
      states, [this](uint32_t thread, ConnectionId id, bool may_have_died) {
        OnConnectionClosed(thread, id, may_have_died);
      });

  // Bind early: an address in use is reported before any recovery, and
  // clients that connect while the server recovers (or waits out a
  // predecessor's lease) wait in the backlog instead of being refused.
  AcceptorOptions ao;
  ao.listen = config.listen;
  ao.secret = config.secret;
  ao.max_connections = config.max_connections;
  ao.handshake_timeout = config.handshake_timeout;
  ao.incarnation = incarnation_id;
  ao.server_threads = uint32_t(config.threads);
  ao.lease_ms = uint32_t(config.lease.count());
  {
    // Clients' worker addresses are checked against what the server's own
    // workers look like (client_address.h).
    std::vector<std::string> own;
    for (const auto& t : threads) own.push_back(t->state.worker->address());
    auto check = ClientAddressCheck::Create(own);
    if (!check.ok()) return check.status();
    address_check = *check;  // shares the server's own identities
    ao.address_check = std::move(*check);
  }
  auto acc = Acceptor::Bind(
      ao,
      [this](uint32_t thread, ConnectionId id, std::string peer,
             std::string client_address, Acceptor::AdmitDone done) {
        AdmitOn(thread, id, std::move(peer), std::move(client_address),
                std::move(done));
      },
      [this](uint32_t thread, ConnectionId id, bool goodbye) {
        threads[thread]->state.worker->Post([this, thread, id, goodbye] {
          dispatcher->DropConnection_st(
              thread, id,
              Status::Unavailable(goodbye ? "the client ended its session"
                                          : "the client closed its session"),
              /*peer_may_have_died=*/!goodbye);
        });
      });
  if (!acc.ok()) return acc.status();
  acceptor = std::move(*acc);
  address = acceptor->address();
  if (!config.cluster.empty()) {
    std::string self = config.advertise.empty() ? address : config.advertise;
    if (self.rfind("0.0.0.0:", 0) == 0 || self.rfind("*:", 0) == 0) {
      return Status::InvalidArgument(
          "--cluster with --listen on every interface needs --advertise "
          "HOST:PORT (the address clients reach this server at)");
    }
    ownership =
        std::make_unique<cluster::Ownership>(std::move(self), incarnation_id);
    dispatcher->set_cluster(ownership.get());
    SessionOptions so = PeerSessionOptions();
    // A backup that has not answered a batch within a few leases is asked
    // again on a new session (the manager drops a dead one within a lease;
    // a session can break without telling, as to a member that restarted).
    so.timeout = std::max<std::chrono::milliseconds>(
        4 * config.cluster_lease, std::chrono::milliseconds(1000));
    auto r = cluster::Replicator::Start(
        ownership.get(), so, config.spin,
        std::chrono::milliseconds(config.fault_replication_delay_ms),
        std::chrono::milliseconds(config.fault_last_backup_delay_ms));
    if (!r.ok()) return r.status();
    replicator_of_cluster = std::move(*r);
  }

  // The root region: the server lease at offset 0.
  auto root_or =
      Allocate(4096, proto::RegionAccess::kReadOnly, proto::kCoreService);
  if (!root_or.ok()) return root_or.status();
  root = *root_or;

  core = std::make_unique<CoreService>(this);
  REMEM_RETURN_IF_ERROR(dispatcher->Register(core.get()));
  REMEM_RETURN_IF_ERROR(core->Init(this));
  for (auto& s : services) {
    REMEM_RETURN_IF_ERROR(dispatcher->Register(s.get()));
    current_service = s->id();
    Status st = s->Init(this);
    current_service = proto::kCoreService;
    if (!st.ok()) return st.WithContext(std::string(s->name()));
  }
  if (durable) recovery_summary = durable->recovery_summary();

  // What the services did not take is raw memory.
  uint64_t left = config.memory > allocated ? config.memory - allocated : 0;
  while (left >= (1ull << 20)) {
    const uint64_t len = std::min(left, config.region_size);
    auto r =
        Allocate(len, proto::RegionAccess::kReadWrite, proto::kCoreService);
    if (!r.ok()) return r.status();
    left -= len;
  }
  initialising = false;

  proto::RegionsInfo info;
  info.incarnation = incarnation_id;
  info.max_payload = proto::kMaxRpcPayload;
  info.server_threads = uint32_t(config.threads);
  for (const auto& r : regions) {
    const ExportedRegion& e = dispatcher->regions().at(r->id());
    info.regions.push_back({r->id(), reinterpret_cast<uint64_t>(r->base()),
                            r->length(), e.service, e.access,
                            r->packed_rkey()});
  }
  regions_reply = proto::EncodeRegionsReply(info);

  REMEM_RETURN_IF_ERROR(dispatcher->Install());
  for (auto& t : threads) {
    const uint32_t p = t->state.index;
    for (auto& s : services) {
      Service* raw = s.get();
      t->state.worker->AddPassHook([raw, p] { return raw->OnPass(p); });
    }
    if (durable) {
      durability::Durability* d = durable.get();
      fabric::Worker* w = t->state.worker.get();
      t->state.worker->AddPassHook([d, p, w] {
        const size_t work = d->OnPass(p);
        // A failing disk is retried on the clock, writes or not.
        if (auto at = d->RetryAt(p)) w->WakeBy(*at);
        return work;
      });
    }
    // A client killed while sending to this thread over shared memory may
    // have blocked its receive queue for good (fabric/worker.h): UCX cannot
    // unblock it, so the thread moves to a new UCX worker.
    t->state.worker->AddPassHook([this, st = &t->state] {
      const uint64_t watching = st->worker->watching_for_stall() ? 1 : 0;
      if (st->counters.receive_watching.Get() != watching) {
        st->counters.receive_watching.Set(watching);
      }
      if (st->worker->renewals() > 0) {  // else none retired
        const uint64_t retired = st->worker->retired_workers();
        if (st->counters.receive_retired_workers.Get() != retired) {
          st->counters.receive_retired_workers.Set(retired);
        }
      }
      if (!st->worker->receive_stalled() ||
          st->counters.receive_stalled.Get() != 0) {
        return size_t{0};
      }
      // At most one move a minute: a flood of datagrams to the signal
      // socket can make a healthy queue look blocked (docs/SECURITY.md).
      // Until then new shared-memory sessions are refused (AdmitOn).
      if (Clock::now() < st->next_renewal) return size_t{0};
      // Next pass, outside the hooks: closing the sessions progresses.
      st->worker->Defer([this, st] { RenewAfterStall_st(st); });
      return size_t{1};
    });
  }

  // The lease: a successor of a server that died on this port or data
  // directory waits until nobody can trust the dead one's memory.
  std::string horizon;
  if (durable) {
    horizon = config.data_dir + "/lease";
  } else {
    const std::string dir =
        config.runtime_dir.empty() ? "/dev/shm" : config.runtime_dir;
    const std::string prefix = fmt::format("remem-lease-{}-", getuid());
    horizon = fmt::format("{}/{}{}", dir, prefix, acceptor->port());
    // Servers killed on ports no server took again left theirs (one per
    // port: tests and scripts on port 0 made hundreds).
    LeaseKeeper::RemoveStaleHorizons(dir, prefix, std::chrono::minutes(10));
  }
  auto keeper = LeaseKeeper::Start(root->base(), incarnation_id, config.lease,
                                   horizon, &lease_waited,
                                   /*remake_removed=*/!durable);
  if (!keeper.ok()) return keeper.status();
  lease = std::move(*keeper);
  if (ownership) {
    // One-sided readers trust a member's memory only once it serves a
    // configuration, and in a replicated one only while it holds its member
    // lease. Capped before any client can connect: a reader keeps a lease
    // it read until it expires, and one read uncapped (a server lease, a
    // second by default) outlived a failover of this server paused at
    // once.
    lease->CapBy([o = ownership.get()]() -> uint64_t {
      const cluster::Ownership::Installed* c = o->current();
      if (c == nullptr) return 1;  // in the past: vouches for nothing
      return c->replicated ? o->lease_expires_ns() : UINT64_MAX;
    });
  }

  threads_started = true;
  for (auto& t : threads) {
    Thread* raw = t.get();
    t->thread = std::thread([this, raw] { RunThread(raw); });
    // Named (for ps, top and the tests: "remem-p<partition>") and pinned
    // before the server says it is listening.
    const std::string name = "remem-p" + std::to_string(t->state.index);
    pthread_setname_np(t->thread.native_handle(), name.c_str());
    if (!cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[t->state.index % cpus.size()], &set);
      pthread_setaffinity_np(t->thread.native_handle(), sizeof(set), &set);
    }
  }
  REMEM_RETURN_IF_ERROR(acceptor->Start());
  if (ownership) REMEM_RETURN_IF_ERROR(StartCluster());

  return Status::OK();
}

Status Server::Impl::StartCluster() {
  auto target = cluster::ParseZkTarget(config.cluster);
  if (!target.ok()) return target.status();
  if (!config.data_dir.empty() && config.persistence) {
    // A data directory holds one cluster's shards: joining another cluster
    // with it would serve them to the wrong cluster.
    const std::string file = config.data_dir + "/cluster";
    std::ifstream in(file);
    std::string recorded;
    if (in && std::getline(in, recorded)) {
      if (recorded != target->path) {
        return Status::InvalidArgument(
            "the data directory " + config.data_dir + " belongs to cluster " +
            recorded + ", not " + target->path +
            " (start with that --cluster, or another --data-dir)");
      }
    } else {
      // Through the durability Env, as every file of the directory: 0600
      // whatever the umask, written whole or not at all.
      REMEM_RETURN_IF_ERROR(durability::WriteFileAtomically(
          durability::Env::Posix(), config.data_dir, "cluster",
          target->path + "\n"));
    }
  }
  cluster::MemberOptions mo;
  mo.target = std::move(*target);
  mo.self.address = ownership->self();
  mo.self.capacity = config.memory;
  mo.self.incarnation = incarnation_id;
  mo.self.domain = config.failure_domain;
  mo.initial_size = config.cluster_size;
  mo.num_shards = config.shards;
  mo.replicas = config.replicas;
  if (config.tree_splits.has_value()) {
    auto splits = cluster::ParseSplits(*config.tree_splits);
    if (!splits.ok()) return splits.status();
    mo.tree_splits = std::move(*splits);
  }
  mo.lease = config.cluster_lease;
  mo.move_share = config.move_share;
  mo.fault_kill_after_handoff = config.fault_kill_after_handoff;
  mo.fault_move_hold = std::chrono::milliseconds(config.fault_move_hold_ms);
  mo.session_timeout = config.cluster_session;
  mo.first_session_wait = config.cluster_wait;
  mo.session = PeerSessionOptions();
  auto m = cluster::ClusterMember::Start(std::move(mo), ownership.get());
  if (!m.ok()) return m.status().WithContext("joining the cluster");
  member = std::move(*m);
  member_view.store(member.get(), std::memory_order_release);
  cluster::MemberLeaseOptions lo;
  lo.self = ownership->self();
  lo.incarnation = incarnation_id;
  lo.lease = config.cluster_lease;
  lo.session = PeerSessionOptions();
  auto ml = cluster::MemberLease::Start(
      lo, ownership.get(), [m = member.get()] { return m->manager_address(); });
  if (!ml.ok()) return ml.status().WithContext("the member lease");
  member_lease = std::move(*ml);
  member_lease_view.store(member_lease.get(), std::memory_order_release);
  return Status::OK();
}

void Server::Impl::RenewAfterStall_st(ServerThread* st) {
  if (!st->worker->receive_stalled()) return;  // a nested pass renewed it
  Status renewed = st->worker->RenewAfterStall();
  if (!renewed.ok()) {
    st->counters.receive_stalled.Set(1);
    log::Error(
        "server thread {}: its shared-memory receive queue is blocked by a "
        "client that died while sending to it (a UCX limitation), and a new "
        "UCX worker could not be made ({}): shared-memory clients of this "
        "thread get no answers and new ones are refused; tcp clients are "
        "served. Restart the server to recover",
        st->index, renewed.ToString());
    return;
  }
  st->counters.receive_renewals.Add(1);
  st->next_renewal = Clock::now() + kRenewalInterval;
  // A client must not hand the server its own new address either.
  address_check.AddOwn(st->worker->address());
  // Their requests can no longer reach the thread: each client sees its
  // session end (its socket closed) and can connect again at once.
  const size_t dropped = dispatcher->DropSharedMemory_st(
      st->index,
      Status::Unavailable(
          "the server thread's shared-memory receive queue was blocked by "
          "another client that died mid-message; connect again"));
  log::Warn(
      "server thread {}: its shared-memory receive queue was blocked by a "
      "client that died while sending to it (a UCX limitation, "
      "docs/ARCHITECTURE.md); the thread now receives on a new UCX worker. "
      "Its {} shared-memory sessions were closed (their clients connect "
      "again); its tcp sessions are kept",
      st->index, dropped);
}

void Server::Impl::AdmitOn(uint32_t thread, ConnectionId id, std::string peer,
                           std::string client_address,
                           Acceptor::AdmitDone done) {
  fabric::Worker* w = threads[thread]->state.worker.get();
  w->Post([this, thread, id, w, peer = std::move(peer),
           client_address = std::move(client_address),
           done = std::move(done)]() mutable {
    if (stop.load(std::memory_order_acquire)) {
      return done(Status::Unavailable("the server is stopping"), {}, 0);
    }
    auto ep = fabric::Endpoint::Create(w, client_address);
    if (!ep.ok()) {
      const util::OpenFiles files = util::CountOpenFiles();
      if (files.Exhausted(8)) {
        // Once a second at most: a storm of clients would flood the log.
        static std::atomic<int64_t> last_warned_ms{0};
        const int64_t now_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now().time_since_epoch())
                .count();
        int64_t last = last_warned_ms.load();
        if (now_ms - last >= 1000 &&
            last_warned_ms.compare_exchange_strong(last, now_ms)) {
          log::Warn(
              "cannot make an endpoint for a client: {} descriptors of the "
              "open-files limit of {} are left; raise the limit, or lower "
              "--max-connections",
              files.free, files.limit);
        }
        return done(Status::Unavailable(
                        "the server has run out of open files (" +
                        std::to_string(files.free) + " left of its limit of " +
                        std::to_string(files.limit) +
                        "): try again later, or have its operator raise "
                        "the limit or lower --max-connections"),
                    {}, 0);
      }
      const char* hint =
          no_tcp ? "it uses shared memory only (--transport shm, or auto on "
                   "a loopback address): connect from its host with "
                   "--transport shm or auto, or start it with --transport "
                   "tcp"
                 : "check that the client's --transport matches the "
                   "server's and that UCX_NET_DEVICES names a routable "
                   "interface";
      return done(
          Status::Unavailable("the server cannot reach the client over its "
                              "transports (" +
                              ep.status().message() + "); " + hint),
          {}, 0);
    }
    if (w->receive_stalled() && (*ep)->UsesSharedMemory()) {
      return done(Status::Unavailable(
                      "the server thread's shared-memory receive queue is "
                      "blocked by a client that died mid-message (see the "
                      "server's log): connect over tcp, or restart the "
                      "server"),
                  {}, 0);
    }
    // The client creates its endpoint with the same number (ServerHello),
    // once this notice has reached it (fabric::Endpoint::CreateJoined).
    const uint64_t number = (*ep)->number();
    (*ep)->SendNotice(proto::EncodeEndpointNotice(incarnation_id, id, number));
    auto conn = std::make_unique<Connection>();
    conn->id = id;
    conn->peer = std::move(peer);
    conn->ep = std::move(*ep);
    dispatcher->AddConnection_st(thread, std::move(conn));
    done(Status::OK(), w->address(), number);
  });
}

void Server::Impl::OnConnectionClosed(uint32_t thread, ConnectionId id,
                                      bool peer_may_have_died) {
  if (acceptor) acceptor->SessionClosed(id);
  // The client may have died while sending to that thread (fabric/worker.h),
  // unless it said goodbye: watching after every orderly end kept the watch
  // on for good on a busy server, where a client thread preempted mid-send
  // for half a second (hundreds of client threads on two cores) looked
  // like a dead one.
  if (thread < threads.size()) {
    fabric::Worker* w = threads[thread]->state.worker.get();
    const bool stall =
        config.fault_receive_stall && !fault_stall_done.exchange(true);
    w->Post([w, stall, peer_may_have_died] {
      if (peer_may_have_died) w->WatchForStall();
      if (stall) w->SimulateReceiveStallForTesting();
    });
  }
  for (auto& s : services) {
    Service* raw = s.get();
    for (PartitionId p = 0; p < partitions(); ++p) {
      RunOn(p, [raw, p, id] { raw->OnConnectionClosed(p, id); });
    }
  }
}

void Server::Impl::RunThread(Thread* t) {
  Dispatcher::SetCurrentThread(int(t->state.index));
  t->state.worker->Run(stop, config.spin);
  // Close every connection so clients see the server go, not a hang.
  // A client that polls acknowledges the close at once; one that is idle
  // (not polling) would hold the stop until the deadline, and needs no
  // wait: it sees the connection fail once this process is gone.
  dispatcher->DropAll_st(t->state.index);
  t->state.worker->DrainCloses(Clock::now() + std::chrono::milliseconds(300));
}

std::vector<proto::StatValue> Server::Impl::Stats() const {
  std::vector<proto::StatValue> out;
  auto num = [&out](const char* name, uint64_t v) {
    out.push_back({name, proto::StatKind::kNumber, v, {}});
  };
  uint64_t current = 0, total = 0, rpcs = 0, in = 0, bytes_out = 0, errors = 0,
           served = 0, stray = 0, stalled = 0, renewals = 0, retired = 0,
           watching = 0;
  for (const auto& t : threads) {
    const ThreadCounters& c = t->state.counters;
    current += c.connections_current.Get();
    total += c.connections_total.Get();
    rpcs += c.rpcs_served.Get();
    in += c.rpc_bytes_in.Get();
    bytes_out += c.rpc_bytes_out.Get();
    errors += c.rpc_errors.Get();
    served += c.mem_requests_served.Get();
    stray += c.unknown_endpoint_messages.Get();
    stalled += c.receive_stalled.Get();
    renewals += c.receive_renewals.Get();
    retired += c.receive_retired_workers.Get();
    watching += c.receive_watching.Get();
  }
  uint64_t registered = 0;
  for (const auto& r : regions) registered += r->length();
  num("uptime_ms",
      uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                   Clock::now() - started)
                   .count()));
  num("connections_current", current);
  num("connections_total", total);
  const AcceptorCounters* a = acceptor ? &acceptor->counters() : nullptr;
  num("auth_failures", a ? a->auth_failures.Get() : 0);
  num("handshake_failures", a ? a->handshake_failures.Get() : 0);
  num("connections_refused", a ? a->refused_busy.Get() : 0);
  num("rpcs_served", rpcs);
  num("rpc_bytes_in", in);
  num("rpc_bytes_out", bytes_out);
  num("rpc_errors", errors);
  num("stray_messages", stray);
  num("shm_receive_stalled_threads", stalled);
  num("shm_receive_renewals", renewals);
  num("shm_receive_retired_workers", retired);
  num("shm_receive_watching_threads", watching);
  num("memory_registered", registered);
  num("regions", regions.size());
  num("shm_page_bytes", shm_page_bytes);
  num("server_threads", threads.size());
  num("incarnation", incarnation_id);
  num("lease_ms", uint64_t(config.lease.count()));
  num("mem_requests_served", served);
  if (ownership) {
    const cluster::ClusterMember* m =
        member_view.load(std::memory_order_acquire);
    const cluster::Ownership::Installed* c = ownership->current();
    num("cluster_epoch", c ? c->config.epoch : 0);
    num("cluster_shards_owned", c ? c->owned : 0);
    num("cluster_members", c ? c->config.members.size() : 0);
    num("cluster_manager", m && m->manager() ? 1 : 0);
    num("cluster_zk_connected", m && m->connected() ? 1 : 0);
    num("cluster_zk_registered", m && m->registered() ? 1 : 0);
    num("cluster_zk_sessions", m ? m->sessions() : 0);
    num("cluster_zk_members_seen", m ? m->members_seen() : 0);
    num("cluster_shards_moving", c ? c->config.moving() : 0);
    num("cluster_shards_moved", m ? m->shards_moved() : 0);
    num("cluster_ranges_moving", c ? c->config.moving_ranges() : 0);
    num("cluster_ranges_moved", m ? m->ranges_moved() : 0);
    num("cluster_ranges_refused", m ? m->ranges_refused() : 0);
    num("cluster_pairs_moved", m ? m->pairs_moved() : 0);
    num("cluster_last_move_ms", m ? m->last_step_ms() : 0);
    num("cluster_last_pause_ms", m ? m->last_pause_ms() : 0);
    num("cluster_moves_held", m ? m->moves_held() : 0);  // testing
    num("cluster_replicas", c ? c->config.replicas : 0);
    num("cluster_ranges", c ? c->config.num_ranges() : 0);
    num("cluster_ranges_owned", c ? c->config.RangesOf(c->self) : 0);
    num("cluster_shards_backed_up",
        c ? uint64_t(std::count(c->backs.begin(), c->backs.end(), 1)) : 0);
    num("cluster_failovers", m ? m->failovers() : 0);
    num("cluster_shards_filling", c ? c->config.filling_shards() : 0);
    num("cluster_shards_filled", m ? m->shards_filled() : 0);
    num("cluster_last_fill_ms", m ? m->last_fill_ms() : 0);
    const cluster::MemberLease* ml =
        member_lease_view.load(std::memory_order_acquire);
    num("cluster_lease_renewals", ml ? ml->renewals() : 0);
    num("cluster_lease_failures", ml ? ml->failures() : 0);
    num("cluster_replicated_batches",
        replicator_of_cluster ? replicator_of_cluster->batches() : 0);
    num("cluster_replication_retries",
        replicator_of_cluster ? replicator_of_cluster->retries() : 0);
  }
  StatsBuilder b;
  for (const auto& s : services) s->Stats(&b);
  for (auto& v : b.stats()) out.push_back(std::move(v));
  if (durable) {
    durable->AddStats(&out);
  } else {
    out.push_back({"fsync_policy", proto::StatKind::kText, 0, "none"});
  }
  return out;
}

void Server::Impl::Shutdown() {
  // The cluster member's thread first, while the threads still serve: its
  // sessions (one is to this server) close at once instead of holding the
  // threads' DrainCloses to its deadline. It stays registered until the
  // Impl is destroyed, after the memory stopped being served.
  if (member_lease) member_lease->Stop();
  if (member) member->Stop();
  // Writes waiting for backups fail (their outcome unknown) while the
  // threads still run their replies.
  if (replicator_of_cluster) replicator_of_cluster->Stop();
  // Readers stop trusting our memory first, then sessions see their
  // sockets close, then the threads drop their endpoints.
  if (lease) lease->Revoke();
  StopPartitions();
  if (acceptor) acceptor->Stop();
  stop.store(true, std::memory_order_release);
  for (auto& t : threads) {
    if (t->state.worker) t->state.worker->Wake();
  }
  JoinThreads();
}

namespace {

// A count of partitions yet to run a task posted to them, waited for with
// a bound: a thread stuck in a user function (--ops-library) must not hold
// up a stop for ever. Shared with the tasks, which may run after a wait
// that gave up.
struct PartitionCountdown {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> done;
  explicit PartitionCountdown(uint32_t n) : done(n, false) {}
  void Done(PartitionId p) {
    std::lock_guard<std::mutex> lock(mu);
    done[p] = true;
    cv.notify_all();
  }
  // Waits up to `bound`; returns the partitions that have not run it.
  std::vector<PartitionId> Wait(std::chrono::milliseconds bound) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, bound, [this] {
      return std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    });
    std::vector<PartitionId> late;
    for (PartitionId p = 0; p < done.size(); ++p) {
      if (!done[p]) late.push_back(p);
    }
    return late;
  }
};

// How long a stop waits for each partition's answer to what it holds.
constexpr std::chrono::seconds kPartitionStopBound{5};

}  // namespace

void Server::Impl::StopPartitions() {
  std::lock_guard<std::mutex> once(partitions_stop_mu);
  if (!durable || !threads_started || partitions_stopped) return;
  partitions_stopped = true;
  const uint32_t n = partitions();
  auto run_on_each = [this, n](auto task) {
    auto countdown = std::make_shared<PartitionCountdown>(n);
    for (PartitionId p = 0; p < n; ++p) {
      dispatcher->RunOn(p, [task, countdown, p] {
        task(p);
        countdown->Done(p);
      });
    }
    return countdown->Wait(
        std::chrono::duration_cast<std::chrono::milliseconds>(
            kPartitionStopBound));
  };
  std::vector<PartitionId> late =
      run_on_each([this](PartitionId p) { durable->Stop(p); });
  // A thread runs what is posted to it in order: once each has run this,
  // the replies posted to it above are in the transport's hands.
  if (late.empty()) late = run_on_each([](PartitionId) {});
  if (!late.empty()) {
    std::string which;
    for (PartitionId p : late) {
      which += (which.empty() ? "" : ", ") + std::to_string(p);
    }
    log::Warn(
        "stopping: partition thread(s) {} did not answer within {} s (a "
        "thread stuck in a user function?); stopping without their "
        "answers to waiting snapshot requests",
        which, kPartitionStopBound.count());
  }
}

void Server::Impl::JoinThreads() {
  for (auto& t : threads) {
    if (t->thread.joinable()) t->thread.join();
  }
  if (dispatcher) dispatcher->Close();
}

Result<std::unique_ptr<Server>> Server::Start(
    const ServerConfig& config,
    std::vector<std::unique_ptr<Service>> services) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->services = std::move(services);
  Status st = impl->Init();
  if (!st.ok()) {
    impl->Shutdown();
    return st;
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
  Wait();
}

const std::string& Server::address() const { return impl_->address; }

void Server::MarkStopping() {
  if (impl_->durable) impl_->durable->MarkStopping();
}

void Server::Stop() {
  MarkStopping();
  // See Impl::Shutdown. Both install configurations, whose tasks for the
  // threads (a hash partition's settling) must not be left queued once the
  // threads have stopped: the workers run them when they are destroyed,
  // after the ownership holding those configurations is gone.
  if (impl_->member_lease) impl_->member_lease->Stop();
  if (impl_->member) impl_->member->Stop();
  // Writes waiting for backups fail while the threads still run their
  // replies; no reply comes from its thread after the dispatcher closes.
  if (impl_->replicator_of_cluster) impl_->replicator_of_cluster->Stop();
  if (impl_->lease) impl_->lease->Revoke();
  impl_->StopPartitions();
  if (impl_->acceptor) impl_->acceptor->Stop();
  impl_->stop.store(true, std::memory_order_release);
  for (auto& t : impl_->threads) t->state.worker->Wake();
}

void Server::Wait() { impl_->JoinThreads(); }

std::vector<proto::StatValue> Server::Stats() const { return impl_->Stats(); }

const std::string& Server::recovery_summary() const {
  return impl_->recovery_summary;
}

std::chrono::milliseconds Server::lease_wait() const {
  return impl_->lease_waited;
}

}  // namespace remem::server
