// server::Server: the body of remem-server. Owns the registered regions it
// exports, one fabric::Worker and thread per --threads (each pinned to a CPU
// of the process's affinity mask), and the listener on thread 0, which deals
// incoming connections to threads round-robin. Each thread serves the RPCs
// of its own connections and, over tcp, the one-sided operations that
// target them, as served memory requests (the NIC's role; see
// docs/PROTOCOL.md section 8).
//
// Every connection must begin with Hello (protocol version, and the shared
// secret when the server has one); until it succeeds every other request is
// answered PermissionDenied and no remote key is handed out.
//
// Thread contract: Start/Stop/Wait/address/Snapshot are thread-safe and may
// be called from any thread; everything else runs on the server's threads.

#ifndef REMEM_SERVER_SERVER_H_
#define REMEM_SERVER_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "durability/store.h"
#include "proto/wire.h"
#include "remem/options.h"
#include "remem/status.h"

namespace remem::server {

struct ServerConfig {
  std::string listen = "127.0.0.1:7400";
  uint64_t memory = 0;  // bytes to export; 0 = DefaultMemory()
  // Of `memory`, bytes for the hash store (split into one partition per
  // thread); the rest is raw regions. 0 = half.
  uint64_t hash_memory = 0;
  uint64_t region_size = 1ull << 30;
  int threads = 1;
  Transport transport = Transport::kAuto;
  // Durability: with a data dir (and persistence on), every hash write is
  // logged to data_dir/p<N>/ and recovered at start; README.md describes
  // what each fsync policy guarantees. Empty: a pure cache.
  std::string data_dir;
  bool persistence = true;  // false (--no-persistence): ignore data_dir
  durability::FsyncPolicy fsync = durability::FsyncPolicy::kEverySec;
  uint64_t snapshot_log_bytes = 64ull << 20;  // 0: only on demand
  durability::RecoveryMode recovery = durability::RecoveryMode::kStrict;
  std::string fault_log_io;             // tests: fault spec for the log files
  uint64_t fault_slow_snapshot_us = 0;  // tests: see StoreOptions
  std::string secret;                   // empty: no authentication
  bool pin_threads = true;
  std::chrono::microseconds spin{100};  // busy-poll before sleeping
  // Fault injection for tests: every hash bucket write pauses this long
  // half done (odd version, half the entries stored). 0 = off.
  uint64_t fault_pause_mid_write_us = 0;
  // Buckets each partition's table starts with (a power of two; it doubles
  // as it fills). Small values make tests cover growth early.
  uint64_t hash_initial_buckets = 256;
  // Largest key and value the hash store accepts (at most the defaults:
  // the slab's size classes end there).
  uint32_t max_key_bytes = 64 << 10;
  uint32_t max_value_bytes = 16 << 20;
};

// A quarter of physical memory, rounded down to a MiB.
uint64_t DefaultMemory();
// Physical memory in bytes.
uint64_t PhysicalMemory();

class Server {
 public:
  // Validates the config, allocates and registers the regions, starts the
  // threads and the listener. Errors: InvalidArgument (bad config),
  // OutOfMemory (memory cannot be allocated), Unavailable (address in use).
  static Result<std::unique_ptr<Server>> Start(const ServerConfig& config);
  ~Server();  // Stop() + Wait()

  // The bound "host:port".
  const std::string& address() const;
  // Asks every thread to stop; returns at once.
  void Stop();
  // Blocks until every thread has exited.
  void Wait();
  // Current counters.
  proto::StatsReply Snapshot() const;
  // What recovery found at start, one line (empty without persistence).
  const std::string& recovery_summary() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remem::server

#endif  // REMEM_SERVER_SERVER_H_
