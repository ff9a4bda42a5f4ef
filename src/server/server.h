// server::Server: the body of remem-server. It owns the registered memory it
// exports, one fabric::Worker and thread per partition (--threads), the
// acceptor (remem's own TCP handshake, acceptor.h), the dispatcher that
// hands requests to services (dispatcher.h), the services themselves
// (service.h; src/registry lists them), the durability layer, and the
// server lease that vouches for one-sided reads (lease.h).
//
// Memory: --memory is split between the services (each takes what its own
// flags say) and raw regions (the rest), which clients read, write and
// update atomically one-sided (RStore's raw remote memory).
//
// Thread contract: Start/Stop/Wait/address/Stats are thread-safe and may be
// called from any thread; everything else runs on the server's threads.

#ifndef REMEM_SERVER_SERVER_H_
#define REMEM_SERVER_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "durability/store.h"
#include "proto/codec.h"
#include "remem/options.h"
#include "remem/status.h"
#include "server/service.h"

namespace remem::server {

struct ServerConfig {
  std::string listen = "127.0.0.1:7400";
  uint64_t memory = 0;  // bytes to export; 0 = DefaultMemory()
  uint64_t region_size = 1ull << 30;
  int threads = 1;
  Transport transport = Transport::kAuto;
  // Directory whose files back the exported regions for shared-memory
  // clients (UCX_POSIX_DIR; "" = /dev/shm or the environment's). A tmpfs
  // mounted with huge=always puts them on 2 MiB pages (stat
  // shm_page_bytes). The process's first server decides: another server
  // of the same process asking for a different one is refused.
  std::string shm_dir;
  // Durability: with a data dir (and persistence on), every durable
  // service logs its writes under data_dir and recovers them at start;
  // README.md describes what each fsync policy guarantees. Empty: a pure
  // cache.
  std::string data_dir;
  bool persistence = true;  // false (--no-persistence): ignore data_dir
  durability::FsyncPolicy fsync = durability::FsyncPolicy::kEverySec;
  uint64_t snapshot_log_bytes = 64ull << 20;  // 0: only on demand
  durability::RecoveryMode recovery = durability::RecoveryMode::kStrict;
  std::string fault_log_io;             // tests: fault spec for the log files
  uint64_t fault_slow_snapshot_us = 0;  // tests: see StoreOptions
  std::string secret;                   // empty: no authentication
  // CPUs to pin thread i to (cpus[i % size]); empty: pin only when the
  // process's affinity mask was narrowed (taskset), else let the kernel
  // schedule, so two servers never share one CPU by default.
  std::vector<int> cpus;
  bool pin_threads = true;              // false (--no-pin): never pin
  std::chrono::microseconds spin{100};  // busy-poll before sleeping
  // The server lease: one-sided readers stop trusting what they read this
  // long after the server stopped renewing it (docs/ARCHITECTURE.md,
  // "Liveness of one-sided reads").
  std::chrono::milliseconds lease{1000};
  // Connections: at most this many at once, and a handshake must complete
  // within `handshake_timeout` (others are refused with a reason).
  uint32_t max_connections = 4096;
  std::chrono::milliseconds handshake_timeout{10000};
  // Where the lease horizon is kept across restarts when there is no data
  // directory ("" = /dev/shm; the file is keyed by user id and port:
  // --runtime-dir).
  std::string runtime_dir;
  // Cluster (docs/ARCHITECTURE.md, "Cluster"): "ZK_HOSTS/PATH" joins the
  // cluster kept at PATH in ZooKeeper; empty: a single server.
  std::string cluster;
  std::string advertise;      // address clients reach; "" = bound one
  uint32_t cluster_size = 1;  // servers the first configuration waits for
  uint32_t shards = 1024;     // shards of a new cluster
  uint32_t replicas = 0;      // backups per shard of a new cluster
  // The ordered store's split keys of a new cluster (cluster/config.h,
  // "ordered shards"; cluster::ParseSplits's list): nullopt, no ordered
  // store in the cluster. Every server of a cluster must agree.
  std::optional<std::string> tree_splits;
  std::string failure_domain;  // this server's ("": none declared)
  // As the manager: the share (percent) of the time shard copies may keep
  // the servers busy (cluster::MemberOptions::move_share).
  uint32_t move_share = 25;
  // Testing: cluster::MemberOptions::fault_kill_after_handoff.
  bool fault_kill_after_handoff = false;
  // Testing: cluster::MemberOptions::fault_move_hold, in milliseconds.
  uint32_t fault_move_hold_ms = 0;
  // Testing: the first session whose connection closes leaves its server
  // thread's receive queue stalled, as a client killed mid-send over shared
  // memory can (fabric::Worker::SimulateReceiveStallForTesting).
  bool fault_receive_stall = false;
  // Testing: each replication batch is held this long before it is sent.
  uint32_t fault_replication_delay_ms = 0;
  // Testing: each batch reaches the last backup of each of its shards this
  // long after the others.
  uint32_t fault_last_backup_delay_ms = 0;
  std::chrono::milliseconds cluster_session{10000};  // ZooKeeper session
  // How long a starting server waits for ZooKeeper's first answer.
  std::chrono::milliseconds cluster_wait{10000};
  // The member lease a replicated cluster's manager grants.
  std::chrono::milliseconds cluster_lease{500};
};

// A quarter of physical memory, rounded down to a MiB.
uint64_t DefaultMemory();
// Physical memory in bytes.
uint64_t PhysicalMemory();

class Server {
 public:
  // Validates the config, initialises every service (regions, recovery),
  // allocates the raw regions, starts the threads and the acceptor. Errors:
  // InvalidArgument (bad config), OutOfMemory (memory cannot be allocated),
  // Unavailable (address in use), Corruption / IOError (durable state).
  static Result<std::unique_ptr<Server>> Start(
      const ServerConfig& config,
      std::vector<std::unique_ptr<Service>> services);
  ~Server();  // Stop() + Wait()

  // The bound "host:port".
  const std::string& address() const;
  // Asks every thread to stop, once every partition has answered what it
  // holds for later (a snapshot being taken gets Unavailable, "the server
  // is stopping") while the sessions are open, or after 5 s for a thread
  // that has not (stuck in a user function: a warning names it); returns
  // then, without waiting for the threads to exit. A second call waits for
  // the first's answers. Marks the stop begun first (MarkStopping).
  void Stop();
  // Says the clean stop has begun where a server started on the same
  // --data-dir looks (durability::Durability::MarkStopping), so that it
  // waits for this one to finish rather than being refused. Any thread.
  void MarkStopping();
  // Blocks until every thread has exited.
  void Wait();
  // Current counters of the server and every service.
  std::vector<proto::StatValue> Stats() const;
  // What recovery found at start, one line (empty without persistence).
  const std::string& recovery_summary() const;
  // How long the start waited for a predecessor's lease to expire (after
  // an unclean stop of a server on the same port or data directory).
  std::chrono::milliseconds lease_wait() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remem::server

#endif  // REMEM_SERVER_SERVER_H_
