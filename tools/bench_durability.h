// remem-bench durability: write throughput per fsync policy, and recovery
// time (docs/BENCHMARKS.md, "Durability"). For each policy (none: no data
// directory; no, everysec, always) it starts a remem-server of its own on a
// fresh temporary data directory, loads --records pairs with multi-puts of
// 256, runs a YCSB-A-like mix (uniform keys, --write-fraction puts, the rest
// gets) with --depth operations in flight from one client thread, and
// reports both rates and the mix against the policy "none". With
// --recovery it then kills the server with SIGKILL, restarts it on the same
// directory, and reports what it recovered and how long that took; every
// loaded key must be back.
//
// Thread contract: RunDurability runs on the calling thread (pinned to
// --client-cpu).

#ifndef REMEM_TOOLS_BENCH_DURABILITY_H_
#define REMEM_TOOLS_BENCH_DURABILITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "remem/options.h"

namespace remem::bench {

struct DurabilityOptions {
  std::string server_binary;
  Transport transport = Transport::kShm;
  std::vector<std::string> policies = {"none", "no", "everysec", "always"};
  uint64_t records = 200000;
  uint64_t ops = 500000;         // operations in the mix
  uint64_t always_ops = 100000;  // ... under --fsync always (slow)
  int depth = 16;
  double write_fraction = 0.5;  // 0.5 = YCSB-A
  size_t key_size = 16;
  size_t value_size = 32;
  std::string memory = "2G";  // --memory of the servers
  std::string hash_memory;    // --hash-memory ("": the server's default)
  int server_threads = 1;
  bool recovery = false;
  std::string data_dir_parent;  // "": the system's temporary directory
  int server_cpu = 0;           // -1: unpinned
  int client_cpu = 1;
  bool json = false;
};

// Returns the exit code: 0, 1 (a run failed or lost keys), 2 (bad options).
int RunDurability(const DurabilityOptions& o);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_DURABILITY_H_
