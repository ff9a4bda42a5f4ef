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

// How the tree is loaded: keys in ascending order (each leaf filled, then
// the next: full leaves, laid out in the region in key order), or in a
// random order (leaves split wherever keys land: partly full, and a
// leaf's right sibling anywhere in the region), as online inserts leave it.
enum class TreeLoadOrder { kSorted, kRandom };

int RunTree(const FabricOptions& o, uint64_t records, size_t key_len,
            size_t value_len,
            TreeLoadOrder load_order = TreeLoadOrder::kSorted);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_TREE_H_
