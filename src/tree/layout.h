// Remote-memory layout of the ordered store (a B-link tree): what a client
// reads one-sided out of the server's tree region. docs/PROTOCOL.md
// ("Ordered store") describes the same layout in prose; change both
// together.
//
// Tree region: a TreeRoot at offset 0 names the root node and the tree's
// height; a serving mark (hash::ServingMark, the hash store's, whose
// `serving` half is the member's range serving word: cluster/ownership.h)
// at kTreeServingMarkOffset, which a one-sided reader in a cluster checks
// after each search as a hash reader checks its partition's (hash/layout.h,
// "Serving mark"; its `replicated` half is the tree's: versions up to it,
// of writes this server made, are on every backup); from kNodesOffset on the
// region is an arena of 64 KiB pages (hash::SlabAllocator, the hash store's
// slab scheme), each holding either nodes (the node slots wholly inside it: 64
// of 1 KiB, or 63 when an extent of a class over 64 KiB left the page off a
// node boundary) or extents of one size class. Node i lies at kNodesOffset + i
// * kNodeBytes wherever its page is. A node index is the node's name: it
// survives the region being mapped anywhere. Index 0 is never a node
// (kNoNode), and every node's index is below the TreeRoot's node_limit
// (republished whenever node pages are added).
//
// Node (kNodeBytes, fixed): a NodeHeader, then the low fence key, the high
// fence key (absent when the node is the rightmost of its level: +infinity),
// then the entries, packed, in key order:
//   - leaf (level 0): LeafEntryHead (key_len, value_len, flags, version),
//     key, then the value (up to kMaxInlineValue bytes) or, with
//     kValueOutOfLine, a ValueRef naming the extent that holds it;
//   - internal (level >= 1): InternalEntryHead (key_len, flags, child), key.
//     The child holds the keys from this entry's key up to the next entry's
//     key (the first entry's key is the node's low fence).
// A leaf's fences need not be stored keys: when the right half's first key
// is long, a leaf split makes the shortest prefix of it that lies above the
// left half's last key the fence between them (suffix truncation), unless
// that prefix would be a long key too.
// Long keys: a key of more than kMaxInlineKey bytes (a fence or an entry's
// key) is stored out of line, in a key extent (an extent of the arena
// holding the key and no value), and its place in the node holds a KeyRef
// instead (the fence's or entry's key_len is then sizeof(KeyRef), and a
// flag says so: kLowOutOfLine, kHighOutOfLine, kKeyOutOfLine). A reader
// resolves them when it copies the node: it reads each key extent and
// trusts it only if its checksum verifies and its incarnation and length
// are the KeyRef's (else its node copy is stale: it reads the node again).
// Key extents never change while a node names them; the server counts the
// places in published nodes that name each one (a split's new fences and
// separators share the key's extent) and frees it when the last is
// republished without it.
// An extent is the hash store's (hash::ExtentHeader: checksum,
// incarnation, key and value lengths, the pair's version; then the key and
// the value); its checksum covers everything after the checksum word.
// A node holds the keys k with low <= k < high; a key beyond the high fence
// lives to the right (follow `right`, the B-link pointer). The empty key is
// the lowest fence (-infinity); stored keys are never empty.
//
// Self-verification (BRIEF.md: a one-sided copy has no byte order): the
// header's checksum is xxh3-64 of the node's bytes in use, [8, 48 + used)
// (the header from the version on, the fences and the entries): a reader
// need copy no more (a leaf of 16-byte keys uses about 70% of its bytes;
// remem's client on shared memory copies just those, over a round trip the
// whole node in one read). The
// server makes the version odd before it rewrites a node and publishes the new
// content with an even version and its checksum; a reader trusts a copy only if
// its checksum verifies, its version is even, its magic and its own index
// (`self`) are right, and its structure parses within the node. A torn copy is
// refused and read again. An extent is trusted only if its checksum verifies
// and its incarnation, lengths, version and key are those of the leaf entry
// that named it. Extents are written whole before the leaf that names them is
// published, and freed (incarnation bumped, hash::SlabAllocator::Free) after
// the leaf that stopped naming them is: a reader holding an older leaf copy
// finds the incarnation changed and reads the leaf again.
//
// Stamps: every node is published with the tree's last version then in its
// header (`stamp`); every write consumes its version before it publishes,
// so a leaf's stamp is at least the version of every write (put or delete)
// whose result it shows. A one-sided reader of a replicated range trusts
// what its leaves say (a value, or a key's absence) only if the highest
// stamp among them is within the serving mark's `replicated` half, read
// after them: then every write they show is on the range's backups, and no
// failover can undo it (docs/ARCHITECTURE.md, "Replicated ordered ranges").
//
// Merges: a delete that leaves a node under a quarter full merges it with
// a sibling of the same parent when both fit in three quarters of a node:
// the left one takes over the right one's entries and range (published
// first, so both claim the range with the same keys for a moment), the
// right one is published dead (kDead), then the parent drops its entry (and
// may merge in turn). A root left with one child gives way to it: the
// TreeRoot names the child, then the old root is published dead. Node pages
// stay node pages (type-stable), and a dead node's index is reused by a later
// split. A reader holding a stale index (a cached parent, a right pointer, an
// old copy) is protected as it is from any stale copy: it trusts a leaf only
// for keys within the fences of a fresh verified copy, searches again when the
// node is dead, of another level than expected, or starts above the key, and
// moves right when the key lies at or beyond the high fence. Every live leaf
// holds, at every moment, exactly the keys of its range; so the fences play the
// role of an incarnation.
//
// Thread contract: plain data.

#ifndef REMEM_TREE_LAYOUT_H_
#define REMEM_TREE_LAYOUT_H_

#include <xxhash.h>

#include <cstddef>
#include <cstdint>

// The node size: 1 KiB, Cell's choice, which the measurements in
// docs/BENCHMARKS.md ("Node size") confirm here. A build can set another
// power of two from 512 to 8192 (cmake -DREMEM_TREE_NODE_BYTES=...) to
// measure it; clients and servers must then agree (TreeInfoReply carries
// it, and a client refuses another).
#ifndef REMEM_TREE_NODE_BYTES
#define REMEM_TREE_NODE_BYTES 1024
#endif

namespace remem::tree {

inline constexpr size_t kNodeBytes = REMEM_TREE_NODE_BYTES;
static_assert(kNodeBytes >= 512 && kNodeBytes <= 8192 &&
                  (kNodeBytes & (kNodeBytes - 1)) == 0,
              "tree nodes are a power of two from 512 to 8192 bytes");
inline constexpr uint64_t kNodesOffset = 4096;
inline constexpr uint32_t kNoNode = 0;
inline constexpr uint32_t kNodeMagic = 0x45444F4E;      // "NODE"
inline constexpr uint32_t kTreeRootMagic = 0x45455254;  // "TREE"
// 2: out-of-line values, the arena of pages, 32-bit scan item value lengths.
// 3: out-of-line keys (KeyRef), 32-bit scan item key lengths.
// 4: a node's checksum covers its bytes in use, not the whole node.
// 5: the serving mark at kTreeServingMarkOffset (ordered ranges move).
// 6: a node's stamp; the serving mark's replicated half (one-sided reads of
//    replicated ranges).
inline constexpr uint16_t kTreeLayoutVersion = 6;
inline constexpr uint64_t kTreeServingMarkOffset = 64;
inline constexpr uint8_t kMaxLevels = 32;

// Limits: an inline key and an inline value are bounded so that any split
// of a full node leaves both halves within a node (see kMaxLeafEntryBytes).
// Keys of more than kMaxInlineKey bytes are stored out of line (a KeyRef in
// the node), up to kMaxKey; values of more than kMaxInlineValue bytes (256,
// or less in nodes under 1 KiB) are stored out of line, in an extent, up to
// kMaxValue. Both limits are the hash store's.
inline constexpr uint32_t kMaxInlineKey = 64;
inline constexpr uint32_t kMaxKey = 64 << 10;
// The largest inline value the split rule allows: a leaf entry is a
// 16-byte head, the key and the value, and two of the largest must fit in
// a node's area less three fences (48: the NodeHeader; kSplitRoom).
inline constexpr uint32_t kMaxInlineValue = uint32_t(
    (kNodeBytes - 48 - 3 * kMaxInlineKey) / 2 - 16 - kMaxInlineKey < 256
        ? (kNodeBytes - 48 - 3 * kMaxInlineKey) / 2 - 16 - kMaxInlineKey
        : 256);
inline constexpr uint32_t kMaxValue = 16u << 20;
// Nodes are carved from the arena a page at a time.
inline constexpr uint64_t kNodePageBytes = 64 << 10;

struct TreeRoot {
  uint64_t checksum;  // xxh3-64 of bytes [8, 64)
  uint64_t version;   // even when stable
  uint32_t magic;     // kTreeRootMagic
  uint16_t layout_version;
  uint8_t height;  // levels: 1 = the root is a leaf
  uint8_t reserved;
  uint32_t root;        // node index of the root
  uint32_t node_limit;  // every node's index is below this
  uint64_t reserved2[4];
};
static_assert(sizeof(TreeRoot) == 64);

// kDead: a node merged into its left sibling (which took over its range)
// and dropped from its parent, or a root that gave way to its only child;
// it holds no keys nor fences, and a reader that reaches it (through an
// older copy of its parent, sibling or the TreeRoot) searches again. Its
// index is then reused by a later split.
// kLowOutOfLine, kHighOutOfLine: that fence is a KeyRef (a long key).
enum NodeFlags : uint8_t {
  kHasHigh = 1,
  kDead = 2,
  kLowOutOfLine = 4,
  kHighOutOfLine = 8,
};
inline constexpr uint8_t kAllNodeFlags =
    kHasHigh | kDead | kLowOutOfLine | kHighOutOfLine;

struct NodeHeader {
  uint64_t checksum;  // xxh3-64 of the node's bytes [8, 48 + used)
  uint64_t version;   // even: stable; odd: the server is rewriting it
  uint32_t magic;     // kNodeMagic
  uint32_t self;      // this node's index
  uint32_t right;     // right sibling (kNoNode: the rightmost)
  uint8_t level;      // 0: leaf
  uint8_t flags;      // NodeFlags
  uint16_t count;     // entries
  uint16_t low_len;   // bytes of the low fence key (or its KeyRef)
  uint16_t high_len;  // bytes of the high fence key (0 without kHasHigh)
  uint16_t used;      // bytes after the header in use (fences + entries)
  uint16_t reserved;
  uint64_t stamp;  // the tree's last version when it was published (above)
};
static_assert(sizeof(NodeHeader) == 48);

// kKeyOutOfLine (leaf and internal entries): the key's bytes are a KeyRef.
enum LeafEntryFlags : uint32_t { kValueOutOfLine = 1, kKeyOutOfLine = 2 };

struct LeafEntryHead {
  uint16_t key_len;    // bytes of the key (or its KeyRef)
  uint16_t value_len;  // bytes after the key: the value, or a ValueRef
  uint32_t flags;      // LeafEntryFlags
  uint64_t version;    // the pair's version (compare-and-put)
};
static_assert(sizeof(LeafEntryHead) == 16);

// An out-of-line value: its extent (an ExtentHeader, the key, the value).
struct ValueRef {
  uint64_t offset;       // region offset of the extent
  uint32_t incarnation;  // the extent's, when it was written
  uint8_t size_class;    // hash::SlabAllocator's
  uint8_t reserved[3];
  uint32_t value_len;
  uint32_t reserved2;
};
static_assert(sizeof(ValueRef) == 24);
static_assert(sizeof(ValueRef) <= kMaxInlineValue);

// A long key (more than kMaxInlineKey bytes): the key extent holding it
// (a hash::ExtentHeader with value_len 0 and version 0, then the key).
struct KeyRef {
  uint64_t offset;       // region offset of the extent
  uint32_t incarnation;  // the extent's, when it was written
  uint8_t size_class;    // hash::SlabAllocator's
  uint8_t reserved[3];
  uint32_t key_len;  // kMaxInlineKey < key_len <= kMaxKey
  uint32_t reserved2;
};
static_assert(sizeof(KeyRef) == 24);
static_assert(sizeof(KeyRef) <= kMaxInlineKey);

struct InternalEntryHead {
  uint16_t key_len;  // bytes of the key (or its KeyRef)
  uint16_t flags;    // kKeyOutOfLine
  uint32_t child;
};
static_assert(sizeof(InternalEntryHead) == 8);

inline constexpr size_t kNodeArea = kNodeBytes - sizeof(NodeHeader);
// Entries a node can hold at most (the smallest entry is 8 + 1 bytes).
inline constexpr size_t kMaxEntries = kNodeArea / 9;
inline constexpr size_t kMaxLeafEntryBytes =
    sizeof(LeafEntryHead) + kMaxInlineKey + kMaxInlineValue;
inline constexpr size_t kMaxInternalEntryBytes =
    sizeof(InternalEntryHead) + kMaxInlineKey;
// A node's entries take up to its area less its two fences (all of it
// when both are short: a leftmost node's low fence is empty). A split
// adds one entry, and each half gets a new fence (at most kMaxInlineKey
// bytes) beside one it had: the larger half, at most (entries + largest
// entry) / 2 bytes, must fit beside two fences. With fences a and b and at
// most area - a - b of entries, that is 2 x largest entry <= area - 128 -
// a + b, whose worst case (a = 64, b = 0) is the area less three fences.
// (Two fences were counted before: 512-byte nodes could fail a split.)
inline constexpr size_t kSplitRoom = kNodeArea - 3 * kMaxInlineKey;
static_assert(2 * kMaxLeafEntryBytes <= kSplitRoom);
static_assert(2 * kMaxInternalEntryBytes <= kSplitRoom);

// The checksum of a node whose header says `used` (at most kNodeArea: a
// reader checks it first, as a torn copy may say anything).
inline uint64_t NodeChecksum(const void* node, uint16_t used) {
  return XXH3_64bits(static_cast<const uint8_t*>(node) + 8,
                     sizeof(NodeHeader) - 8 + used);
}
// The bytes a reader copies of a node whose header (maybe torn) says
// `used`: the header and the bytes in use, never past the node.
inline size_t NodeBytesInUse(uint16_t used) {
  return sizeof(NodeHeader) + (used < kNodeArea ? used : kNodeArea);
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
