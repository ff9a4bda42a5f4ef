// tree::NodeView and tree::NodeContent: reading and building the nodes of
// the ordered store (tree/layout.h).
//
// NodeView parses a node image (a copy, or the server's own memory) and
// refuses anything that does not verify: its bytes in use within the node,
// checksum, even version, magic, its own index, and a structure that lies
// within the bytes in use (so a reader may hand it any bytes, even a torn
// copy). It reads the header and the bytes in use, [0, 48 + used), and
// nothing after them. A node with long
// keys (layout.h: out of line, in key extents) is usable once ResolveKeys
// has copied them in from wherever its reader finds them. NodeContent is a
// node decoded into owned strings, which the server edits and encodes back
// (EncodeNode) to publish.
//
// Thread contract: a NodeView reads the bytes it was given, which must not
// change while it is used (a reader's private copy, or the server's memory
// on the owner thread); NodeContent is plain data.

#ifndef REMEM_TREE_NODE_H_
#define REMEM_TREE_NODE_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"
#include "tree/layout.h"

namespace remem::tree {

// A verified node. Accessors are valid only after Parse returned OK and,
// for a node with long keys (long_keys() > 0), ResolveKeys did too; after
// ResolveFences instead, low() and high() are, and key(i) once
// ResolveEntry(i) returned OK.
class NodeView {
 public:
  NodeView() = default;
  // Not copyable: resolved keys point into the view's own storage.
  NodeView(const NodeView&) = delete;
  NodeView& operator=(const NodeView&) = delete;

  // Verifies `image` as node `index` (kNoNode: any index). `image` holds at
  // least the header and the bytes in use it names (a buffer of kNodeBytes
  // always does; what follows the bytes in use may be anything).
  // Corruption (with what failed) if it does not verify. `checksum`
  // false skips the checksum and the entries' order (an image that
  // verified before and has not changed since: a cached copy, or the
  // owner's own memory); every length is still checked, so that what
  // parses lies within the node. The order check was most of the owner's
  // time on a write (a key comparison per entry of every node it descends
  // through).
  Status Parse(const uint8_t* image, uint32_t index, bool checksum = true);
  const uint8_t* image() const { return image_; }

  // Long keys: how many of the node's fences and entry keys are out of
  // line. Until ResolveKeys they read as empty.
  size_t long_keys() const { return long_keys_; }
  // Copies each long key in: `read(ref, dst)` writes the ref.key_len bytes
  // of the key extent `ref` names to dst, or answers Corruption when that
  // extent does not hold it any more (the node copy is stale). Then checks
  // the entries' order (Corruption if they are not ascending).
  using KeyReader = std::function<Status(const KeyRef&, char*)>;
  Status ResolveKeys(const KeyReader& read);
  // Lazily, for a point lookup in a leaf: resolves the fences' long keys
  // now and leaves the entries' for ResolveEntry, with `*read` (which must
  // outlive this view's use): a lookup compares only the keys its binary
  // search probes and its match, a few of a leaf's dozens. Until then
  // key(i) of a long key reads as empty. The entries' order is not checked
  // (each key is the one its verified KeyRef names, as the owner published
  // it, in order).
  Status ResolveFences(const KeyReader* read);
  // Whether keys are left to resolve (ResolveFences).
  bool lazy() const { return lazy_reader_ != nullptr; }
  // Entry i's key resolved, if it was left for later (ResolveFences):
  // Corruption if its extent no longer holds it (the copy is stale).
  Status ResolveEntry(size_t i) {
    // A long key is never empty: empty means not resolved yet.
    if (lazy_reader_ == nullptr || !keys_[i].empty()) return Status::OK();
    return ResolveLazily(i);
  }
  // LowerBound over a lazily resolved view, resolving each key it
  // compares; *at as LowerBound's answer.
  Status LowerBound(std::string_view key, size_t* at);
  // The long keys of `from`, a view of the same image, resolved (a cache
  // keeping a copy of a node it just read). False if `from` does not hold
  // this view's long keys.
  // False for a lazily resolved `from` too.
  bool AdoptKeys(const NodeView& from);
  // Bytes of the long keys copied in (ResolveKeys, AdoptKeys).
  size_t key_bytes() const { return long_keys_ > 0 ? key_store_.size() : 0; }
  // The KeyRefs of the long keys, appended to *out (the server counting
  // the places that name each key extent).
  void LongKeyRefs(std::vector<KeyRef>* out) const;
  // The KeyRef of entry i / a fence if that key is long; else all zero.
  KeyRef key_ref(size_t i) const;
  KeyRef low_ref() const;
  KeyRef high_ref() const;

  const NodeHeader& header() const { return h_; }
  uint8_t level() const { return h_.level; }
  bool leaf() const { return h_.level == 0; }
  uint32_t right() const { return h_.right; }
  uint64_t version() const { return h_.version; }
  uint64_t stamp() const { return h_.stamp; }
  size_t count() const { return h_.count; }
  std::string_view low() const { return low_; }
  bool has_high() const { return (h_.flags & kHasHigh) != 0; }
  // Merged away (layout.h, kDead): holds no keys; search again.
  bool dead() const { return (h_.flags & kDead) != 0; }
  std::string_view high() const { return high_; }

  std::string_view key(size_t i) const { return keys_[i]; }
  // Leaf entries. value(i): the bytes stored after the key: the value, or
  // for an entry out_of_line(i) its ValueRef (value_ref(i)).
  std::string_view value(size_t i) const;
  uint64_t entry_version(size_t i) const;
  bool out_of_line(size_t i) const;
  ValueRef value_ref(size_t i) const;
  // Entry i's head, read once (a scan's per-item path).
  LeafEntryHead leaf_head(size_t i) const {
    LeafEntryHead e;
    std::memcpy(&e, image_ + sizeof(NodeHeader) + offsets_[i], sizeof(e));
    return e;
  }
  // The bytes after entry i's key, given its head.
  std::string_view stored(size_t i, const LeafEntryHead& e) const {
    return std::string_view(reinterpret_cast<const char*>(image_) +
                                sizeof(NodeHeader) + offsets_[i] +
                                sizeof(LeafEntryHead) + e.key_len,
                            e.value_len);
  }
  // Internal entries.
  uint32_t child(size_t i) const;

  // The first entry whose key is >= key (count() if none).
  size_t LowerBound(std::string_view key) const;
  // Fences: is `key` below the low fence / at or beyond the high fence?
  bool Below(std::string_view key) const { return key < low_; }
  bool AtOrBeyondHigh(std::string_view key) const {
    return has_high() && key >= high_;
  }

 private:
  bool EntryKeyOutOfLine(size_t i) const;
  // The long keys' KeyRefs into *refs (slot order), and their bytes.
  size_t LongKeyRefsAndBytes(std::vector<KeyRef>* refs) const;
  Status ResolveLazily(size_t i);
  // Points the long keys' views at key_store_ (their bytes in slot order:
  // low, high, entries).
  void PointAtStore();
  Status CheckOrder() const;

  const uint8_t* image_ = nullptr;
  NodeHeader h_{};
  std::string_view low_, high_;
  size_t long_keys_ = 0;
  bool check_order_ = true;  // Parse's `checksum`
  // The long keys' bytes, once resolved. Lazily (ResolveFences), its
  // capacity holds them all and resolved ones are appended: a vector's
  // resize within its capacity never moves those already pointed at.
  std::vector<char> key_store_;
  const KeyReader* lazy_reader_ = nullptr;  // set by ResolveFences
  std::array<std::string_view, kMaxEntries> keys_;
  std::array<uint16_t, kMaxEntries> offsets_;  // of each entry's head
};

// A key as a node stores it: its bytes and, for a long key (more than
// kMaxInlineKey bytes), the key extent holding them (ref.key_len != 0).
struct NodeKey {
  std::string bytes;
  KeyRef ref{};
  bool out_of_line() const { return ref.key_len != 0; }
  // Bytes it takes in a node.
  size_t stored_size() const {
    return out_of_line() ? sizeof(KeyRef) : bytes.size();
  }
};

struct NodeEntry {
  NodeKey key;
  std::string value;         // leaf: the value, or the ValueRef's bytes
  bool out_of_line = false;  // leaf: `value` is a ValueRef
  uint64_t version = 0;      // leaf
  uint32_t child = 0;        // internal
};

struct NodeContent {
  uint32_t self = kNoNode;
  uint32_t right = kNoNode;
  uint8_t level = 0;
  NodeKey low;
  bool has_high = false;
  NodeKey high;
  bool dead = false;
  std::vector<NodeEntry> entries;  // in key order

  // Bytes after the header this content needs.
  size_t Bytes() const;
  bool Fits() const { return Bytes() <= kNodeArea; }
  size_t EntryBytes(size_t i) const;
};

NodeContent Decode(const NodeView& v);
// Writes the node image (kNodeBytes) with `version` (even), `stamp`
// (layout.h, "Stamps") and its checksum. The content must fit (Fits()), and
// every key over kMaxInlineKey bytes must name its key extent.
void EncodeNode(const NodeContent& c, uint64_t version, uint8_t* image,
                uint64_t stamp = 0);
// Calls fn(ref) for each long key of `c`.
template <typename Fn>
void ForEachKeyRef(const NodeContent& c, Fn fn) {
  if (c.low.out_of_line()) fn(c.low.ref);
  if (c.has_high && c.high.out_of_line()) fn(c.high.ref);
  for (const NodeEntry& e : c.entries) {
    if (e.key.out_of_line()) fn(e.key.ref);
  }
}

// The bytes to read of a key extent: its header and key, rounded up to
// words.
uint64_t KeyExtentReadBytes(const KeyRef& ref);
// Verifies a copy (KeyExtentReadBytes long) of the key extent `ref` names
// and copies the key to dst (ref.key_len bytes). Corruption if it does not
// verify: torn, or freed or reused since the node naming it was copied.
Status VerifyKeyExtent(const uint8_t* copy, const KeyRef& ref, char* dst);

// The bytes to read of the extent a leaf entry of `key_len` names: its
// header, key and value, rounded up to words.
uint64_t ExtentReadBytes(size_t key_len, const ValueRef& ref);
// Verifies a copy (ExtentReadBytes long) of the extent `ref` names as the
// value of `key` at `version`, and copies the value into *value.
// Corruption if it does not verify: torn, or no longer that value (freed
// or reused since the leaf naming it was copied).
Status VerifyExtent(const uint8_t* copy, std::string_view key, uint64_t version,
                    const ValueRef& ref, std::string* value);

// Verifies a root copy: checksum, even version, magic, layout version.
Status ParseRoot(const TreeRoot& r);

}  // namespace remem::tree

#endif  // REMEM_TREE_NODE_H_
