// remem-bench failover: how long a replicated cluster's keys are
// unwritable when a primary is killed (issue #13; docs/BENCHMARKS.md,
// "Replication"). Starts its own ZooKeeper, then per trial a new cluster of
// --servers servers with --replicas backups per shard (every server pinned
// to --server-cpu), a client on --client-cpu that writes one key back to
// back, and kill -9 of that key's primary (not the configuration manager,
// unless --kill-manager) after --warmup-ms of writes. A trial's time is
// from the kill to the first write to that key acknowledged after it. The
// trials' p50, p99, min and max, and how many writes failed (outcome
// unknown: in flight when the primary died).
//
// Re-replication: with --records N, each trial first loads N pairs (16 B
// keys, 32 B values); after the failover the client goes on writing its key
// until every shard has all its backups again (the cluster's configuration
// says none is short or being filled), and reports that time from the kill,
// the pairs the manager had copied and how long its copy round took, and
// the writes' latency meanwhile (p50, p99, max): what the copy costs the
// foreground.
//
// --drain, instead of the kill: `remem cluster drain` of that key's primary
// (Cluster::Drain, from a second client) while the first writes its key;
// reports the drain's time (until the drained server holds nothing) and
// the writes' latency meanwhile (its max is the hand-over's pause) and
// failures. --join: one more server starts, and the time until the
// cluster is balanced (every server within one shard of the others in
// primaries and in copies, every shard whole) is reported the same way.
//
// Thread contract: one function, run on the calling thread.

#ifndef REMEM_TOOLS_BENCH_FAILOVER_H_
#define REMEM_TOOLS_BENCH_FAILOVER_H_

#include <cstdint>

#include "bench_fabric.h"

namespace remem::bench {

struct FailoverOptions {
  int trials = 50;
  int servers = 3;
  int replicas = 1;
  uint64_t lease_ms = 500;     // --cluster-lease-ms
  uint64_t session_ms = 2000;  // --cluster-session-ms
  uint64_t warmup_ms = 300;
  bool kill_manager = false;
  uint64_t records = 0;  // pairs loaded before the kill (re-replication)
  bool drain = false;    // drain the primary instead of killing it
  bool join = false;     // start one more server instead of killing one
};

int RunFailover(const FabricOptions& o, const FailoverOptions& f);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_FAILOVER_H_
