// Remote-memory layout of the ordered store (a B-link tree): what a client
// reads one-sided out of the server's tree region. docs/PROTOCOL.md
// ("Ordered store") describes the same layout in prose; change both
// together.
//
// Tree region: a TreeRoot at offset 0 names the root node and the tree's
// height; nodes follow from kNodesOffset, node i at kNodesOffset + i *
// kNodeBytes. A node index is the node's name: it survives the region being
// mapped anywhere. Node 0 is never used (kNoNode).
//
// Node (kNodeBytes, fixed): a NodeHeader, then the low fence key, the high
// fence key (absent when the node is the rightmost of its level: +infinity),
// then the entries, packed, in key order:
//   - leaf (level 0): LeafEntryHead (key_len, value_len, version), key,
//     value;
//   - internal (level >= 1): InternalEntryHead (key_len, child), key. The
//     child holds the keys from this entry's key up to the next entry's key
//     (the first entry's key is the node's low fence).
// A node holds the keys k with low <= k < high; a key beyond the high fence
// lives to the right (follow `right`, the B-link pointer). The empty key is
// the lowest fence (-infinity); stored keys are never empty.
//
// Self-verification (BRIEF.md: a one-sided copy has no byte order): the
// header's checksum is xxh3-64 of the node's bytes [8, kNodeBytes), which
// include the version. The server makes the version odd before it rewrites
// a node and publishes the new content with an even version and its
// checksum; a reader trusts a copy only if its checksum verifies, its
// version is even, its magic and its own index (`self`) are right, and its
// structure parses within the node. A torn copy is refused and read again.
//
// Nodes are never freed in this slice (deletes are lazy: no merges), so a
// node index a reader holds (a cached node, a right pointer, an old root)
// always names a node of the same level whose low fence never changes; a
// stale copy is detected by its fences (the key lies beyond the high fence
// of the fresh copy of the child it leads to), never trusted.
//
// Thread contract: plain data.

#ifndef REMEM_TREE_LAYOUT_H_
#define REMEM_TREE_LAYOUT_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace remem::tree {

inline constexpr size_t kNodeBytes = 1024;
inline constexpr uint64_t kNodesOffset = 4096;
inline constexpr uint32_t kNoNode = 0;
inline constexpr uint32_t kNodeMagic = 0x45444F4E;      // "NODE"
inline constexpr uint32_t kTreeRootMagic = 0x45455254;  // "TREE"
inline constexpr uint16_t kTreeLayoutVersion = 1;
inline constexpr uint8_t kMaxLevels = 32;

// Limits: a key and a value are bounded so that any split of a full node
// leaves both halves within a node (see kMaxLeafEntryBytes). Values larger
// than kMaxValue are not stored in this slice (no out-of-line values).
inline constexpr uint32_t kMaxKey = 64;
inline constexpr uint32_t kMaxValue = 256;

struct TreeRoot {
  uint64_t checksum;  // xxh3-64 of bytes [8, 64)
  uint64_t version;   // even when stable
  uint32_t magic;     // kTreeRootMagic
  uint16_t layout_version;
  uint8_t height;  // levels: 1 = the root is a leaf
  uint8_t reserved;
  uint32_t root;       // node index of the root
  uint32_t num_nodes;  // nodes allocated so far (indices 1 .. num_nodes)
  uint64_t reserved2[4];
};
static_assert(sizeof(TreeRoot) == 64);

enum NodeFlags : uint8_t { kHasHigh = 1 };

struct NodeHeader {
  uint64_t checksum;  // xxh3-64 of the node's bytes [8, kNodeBytes)
  uint64_t version;   // even: stable; odd: the server is rewriting it
  uint32_t magic;     // kNodeMagic
  uint32_t self;      // this node's index
  uint32_t right;     // right sibling (kNoNode: the rightmost)
  uint8_t level;      // 0: leaf
  uint8_t flags;      // NodeFlags
  uint16_t count;     // entries
  uint16_t low_len;   // bytes of the low fence key
  uint16_t high_len;  // bytes of the high fence key (0 without kHasHigh)
  uint16_t used;      // bytes after the header in use (fences + entries)
  uint16_t reserved;
  uint64_t reserved2;
};
static_assert(sizeof(NodeHeader) == 48);

struct LeafEntryHead {
  uint16_t key_len;
  uint16_t value_len;
  uint32_t reserved;
  uint64_t version;  // the pair's version (compare-and-put)
};
static_assert(sizeof(LeafEntryHead) == 16);

struct InternalEntryHead {
  uint16_t key_len;
  uint16_t reserved;
  uint32_t child;
};
static_assert(sizeof(InternalEntryHead) == 8);

inline constexpr size_t kNodeArea = kNodeBytes - sizeof(NodeHeader);
// Entries a node can hold at most (the smallest entry is 8 + 1 bytes).
inline constexpr size_t kMaxEntries = kNodeArea / 9;
inline constexpr size_t kMaxLeafEntryBytes =
    sizeof(LeafEntryHead) + kMaxKey + kMaxValue;
inline constexpr size_t kMaxInternalEntryBytes =
    sizeof(InternalEntryHead) + kMaxKey;
// What entries always have room for: the area less two fences at most.
inline constexpr size_t kEntryRoom = kNodeArea - 2 * kMaxKey;
// A full node (at most kEntryRoom of entries) plus one more entry splits
// into halves of at most (total + largest entry) / 2 bytes each: they must
// fit.
static_assert(2 * kMaxLeafEntryBytes <= kEntryRoom);
static_assert(2 * kMaxInternalEntryBytes <= kEntryRoom);

inline uint64_t NodeChecksum(const void* node) {
  return XXH3_64bits(static_cast<const uint8_t*>(node) + 8, kNodeBytes - 8);
}
inline uint64_t TreeRootChecksum(const TreeRoot& r) {
  return XXH3_64bits(reinterpret_cast<const uint8_t*>(&r) + 8,
                     sizeof(TreeRoot) - 8);
}
inline uint64_t NodeOffset(uint32_t index) {
  return kNodesOffset + uint64_t{index} * kNodeBytes;
}

}  // namespace remem::tree

#endif  // REMEM_TREE_LAYOUT_H_
