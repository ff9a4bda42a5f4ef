// remem-bench atomics: server-side operations (remem/ops.h) against plain
// puts and Redis. Rows, each for --duration seconds on a server pinned to one
// core and one client thread pinned to the other:
//   put_uniform          HashStore::PutAsync of 8-byte values, uniform keys
//   faa_uniform          fetch-add (ExecuteAsync), uniform over --keys keys
//   faa_zipf             fetch-add, zipfian (theta 0.99) over --keys keys
//   faa_single           fetch-add, one key
//   faa_single_sync      fetch-add, one key, one at a time (depth 1)
//   redis_incr_uniform   Redis INCRBY, pipelined at the same depth
//   redis_incr_single    Redis INCRBY on one key, pipelined
//   reduce_{srv,cli,redis}_{1K,64K}  sum of an int64 vector of that many
//                        elements: on the server (one RPC), here after a
//                        hash-store get (one-sided on shared memory), and
//                        Redis GET + the same local sum
// with the server's CPU per operation, and (remem atomics) the bucket
// writes per operation (below 1 when a pass held several ops on one key).
//
// Thread contract: one function, run on the calling thread.

#ifndef REMEM_TOOLS_BENCH_ATOMICS_H_
#define REMEM_TOOLS_BENCH_ATOMICS_H_

#include <cstdint>

#include "bench_fabric.h"

namespace remem::bench {

struct AtomicsOptions {
  uint64_t keys = 100000;  // counters of the uniform and zipfian rows
  bool redis = true;       // the Redis rows (needs redis-server)
  bool vectors = true;     // the reduce rows
};

int RunAtomics(const FabricOptions& o, const AtomicsOptions& a);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_ATOMICS_H_
