// remem-bench ycsb / compare: YCSB core workloads (A to F) against
// remem, Redis and memcached with identical key sequences, sizes, client
// threads and requests in flight. For each (workload, value size, system):
// start the server pinned to --server-cpu, load --records pairs (progress
// bar on a tty), then for each (depth, batch) point warm up and run for
// --duration, and stop the server. Prints a table (or JSON) of throughput,
// latency percentiles, server CPU per operation, value-check failures and,
// for remem, read-path retries and fallbacks, one row per point; with
// several points, a summary of each system at its best point and at depth 1
// batch 1. `compare` adds ratios against Redis and memcached and can write
// gnuplot plots (--plot DIR).
//
// Thread contract: RunYcsb runs on the main thread and starts its own
// client threads.

#ifndef REMEM_TOOLS_BENCH_YCSB_H_
#define REMEM_TOOLS_BENCH_YCSB_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench_ycsb_gen.h"
#include "remem/options.h"

namespace remem::bench {

struct YcsbOptions {
  // Names: A B C D E F. E (scans and inserts) runs on ordered keys (remem's
  // ordered store, a Redis sorted set; bench_drivers.h); memcached and
  // remem-resp, which have none, are skipped; a remem cluster runs it
  // through ClusterTree (a run error, exit 1, if formed without
  // --tree-splits).
  std::vector<std::string> workloads = {"C"};
  std::vector<std::string> systems = {"remem"};
  // Overrides each workload's own distribution when set.
  std::optional<ycsb::Distribution> distribution;
  uint64_t records = 100000;
  size_t key_size = 16;
  std::vector<size_t> value_sizes = {32};
  int threads = 1;
  // Requests in flight per client thread, and keys per read request
  // (multi-get). Every depth runs with every batch (bench_curve.h), one
  // after another on a single load of each system.
  std::vector<int> depths = {1};
  std::vector<int> batches = {1};
  double duration = 5;
  double warmup = 1;
  // > 0: also print the throughput of every `interval` seconds of each run
  // (on stderr), to see a run change over time (a shard moving).
  double interval = 0;
  int server_cpu = 0;
  int client_cpu = 1;  // every client thread; -1 unpinned
  uint64_t seed = 1;
  int check_every = 1;  // verify every Nth value read (0: never)
  bool json = false;
  bool compare = false;  // ratio columns vs redis and memcached
  std::string plot_dir;  // compare: write .dat/.gp (and SVGs) here
  // The transport of systems named plain "remem" (which then read
  // "remem-TRANSPORT"); a system that names one keeps it.
  std::optional<Transport> transport;
  std::string remem_binary;
  std::string remem_address;      // external remem-server
  std::string remem_cluster;      // external cluster: seeds host:port,...
  bool read_any_replica = false;  // its gets from any copy (--read-from any)
  std::vector<int> server_pids;   // external servers' processes (CPU time)
  std::string secret;
};

// Returns the process exit code: 0 ok, 1 a run failed (or read wrong
// values), 2 bad options.
int RunYcsb(const YcsbOptions& o);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_YCSB_H_
