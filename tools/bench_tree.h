// remem-bench tree: the ordered store's point gets and scans on each read
// path, beside the hash store's one-sided get on the same keys.
//
// Thread contract: runs on the calling thread (pinned to the client CPU).

#ifndef REMEM_TOOLS_BENCH_TREE_H_
#define REMEM_TOOLS_BENCH_TREE_H_

#include <cstddef>
#include <cstdint>

#include "bench_fabric.h"

namespace remem::bench {

int RunTree(const FabricOptions& o, uint64_t records, size_t key_len,
            size_t value_len);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_TREE_H_
