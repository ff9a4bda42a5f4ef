// The size classes of the hash store's extents: multiples of 64 bytes
// growing by ~1.25x, from 64 B to just over the largest pair (64 KiB key +
// 16 MiB value + header). Part of the remote-memory layout: the server's
// slab carves extents of these sizes, and a one-sided reader checks that an
// extent's lengths fit the class its reference names.
//
// Thread contract: pure functions (the table is built once, thread-safely).

#ifndef REMEM_HASH_SIZE_CLASSES_H_
#define REMEM_HASH_SIZE_CLASSES_H_

#include <cstdint>

namespace remem::hash {

int NumSizeClasses();
uint64_t SizeClassBytes(int size_class);
// Smallest class holding `bytes`, or -1 if larger than the largest.
int SizeClassFor(uint64_t bytes);

}  // namespace remem::hash

#endif  // REMEM_HASH_SIZE_CLASSES_H_
