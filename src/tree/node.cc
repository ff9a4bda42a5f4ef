#include "tree/node.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hash/layout.h"

namespace remem::tree {

namespace {

// A fence or key slot of `len` bytes: inline (at most kMaxInlineKey) or a
// KeyRef naming a long key.
bool SlotOk(size_t len, bool out_of_line, const char* at) {
  if (!out_of_line) return len <= kMaxInlineKey;
  if (len != sizeof(KeyRef)) return false;
  KeyRef r;
  std::memcpy(&r, at, sizeof(r));
  return r.key_len > kMaxInlineKey && r.key_len <= kMaxKey;
}

KeyRef RefAt(const char* at) {
  KeyRef r;
  std::memcpy(&r, at, sizeof(r));
  return r;
}

}  // namespace

Status NodeView::Parse(const uint8_t* image, uint32_t index, bool checksum) {
  image_ = image;
  long_keys_ = 0;
  lazy_reader_ = nullptr;
  check_order_ = checksum;
  std::memcpy(&h_, image, sizeof(h_));
  if (h_.used > kNodeArea) {
    return Status::Corruption("node header out of range");
  }
  if (checksum && h_.checksum != NodeChecksum(image, h_.used)) {
    return Status::Corruption("node checksum mismatch");
  }
  if ((h_.version & 1) != 0) return Status::Corruption("node being written");
  if (h_.magic != kNodeMagic) return Status::Corruption("not a tree node");
  if (index != kNoNode && h_.self != index) {
    return Status::Corruption("node names another index");
  }
  const char* area = reinterpret_cast<const char*>(image) + sizeof(NodeHeader);
  const bool low_long = (h_.flags & kLowOutOfLine) != 0;
  const bool high_long = (h_.flags & kHighOutOfLine) != 0;
  if (h_.level >= kMaxLevels || h_.count > kMaxEntries ||
      (!has_high() && (h_.high_len != 0 || high_long)) ||
      (h_.flags & ~kAllNodeFlags) != 0 || (dead() && h_.count != 0) ||
      size_t{h_.low_len} + h_.high_len > h_.used ||
      !SlotOk(h_.low_len, low_long, area) ||
      !SlotOk(h_.high_len, high_long, area + h_.low_len)) {
    return Status::Corruption("node header out of range");
  }
  size_t pos = size_t{h_.low_len} + h_.high_len;
  low_ = low_long ? std::string_view() : std::string_view(area, h_.low_len);
  high_ = high_long ? std::string_view()
                    : std::string_view(area + h_.low_len, h_.high_len);
  long_keys_ = size_t{low_long} + size_t{high_long};
  bool last_long = false;  // entry i - 1's key
  for (size_t i = 0; i < h_.count; ++i) {
    size_t head, klen, vlen = 0;
    bool key_long;
    if (leaf()) {
      LeafEntryHead e;
      if (pos + sizeof(e) > h_.used) return Status::Corruption("entry head");
      std::memcpy(&e, area + pos, sizeof(e));
      head = sizeof(e);
      klen = e.key_len;
      vlen = e.value_len;
      key_long = (e.flags & kKeyOutOfLine) != 0;
      if ((e.flags & ~uint32_t{kValueOutOfLine | kKeyOutOfLine}) != 0 ||
          ((e.flags & kValueOutOfLine) != 0 ? vlen != sizeof(ValueRef)
                                            : vlen > kMaxInlineValue)) {
        return Status::Corruption("leaf entry: bad flags or value length");
      }
    } else {
      InternalEntryHead e;
      if (pos + sizeof(e) > h_.used) return Status::Corruption("entry head");
      std::memcpy(&e, area + pos, sizeof(e));
      head = sizeof(e);
      klen = e.key_len;
      key_long = (e.flags & kKeyOutOfLine) != 0;
      if ((e.flags & ~uint16_t{kKeyOutOfLine}) != 0) {
        return Status::Corruption("internal entry: bad flags");
      }
    }
    if (pos + head + klen + vlen > h_.used ||
        !SlotOk(klen, key_long, area + pos + head)) {
      return Status::Corruption("entry overflows the node");
    }
    offsets_[i] = uint16_t(pos);
    keys_[i] = std::string_view(area + pos + head, klen);
    if (key_long) {
      ++long_keys_;
    } else if (checksum && i > 0 && !last_long && !(keys_[i - 1] < keys_[i])) {
      return Status::Corruption("node entries out of order");
    }
    last_long = key_long;
    pos += head + klen + vlen;
  }
  if (pos != h_.used) return Status::Corruption("node length mismatch");
  // With long keys, the order is checked once they are resolved.
  if (long_keys_ > 0) {
    for (size_t i = 0; i < h_.count; ++i) {
      if (EntryKeyOutOfLine(i)) keys_[i] = std::string_view();
    }
  }
  return Status::OK();
}

bool NodeView::EntryKeyOutOfLine(size_t i) const {
  const uint8_t* at = image_ + sizeof(NodeHeader) + offsets_[i];
  if (leaf()) {
    LeafEntryHead e;
    std::memcpy(&e, at, sizeof(e));
    return (e.flags & kKeyOutOfLine) != 0;
  }
  InternalEntryHead e;
  std::memcpy(&e, at, sizeof(e));
  return (e.flags & kKeyOutOfLine) != 0;
}

KeyRef NodeView::key_ref(size_t i) const {
  if (!EntryKeyOutOfLine(i)) return KeyRef{};
  const size_t head =
      leaf() ? sizeof(LeafEntryHead) : sizeof(InternalEntryHead);
  return RefAt(reinterpret_cast<const char*>(image_) + sizeof(NodeHeader) +
               offsets_[i] + head);
}

KeyRef NodeView::low_ref() const {
  if ((h_.flags & kLowOutOfLine) == 0) return KeyRef{};
  return RefAt(reinterpret_cast<const char*>(image_) + sizeof(NodeHeader));
}

KeyRef NodeView::high_ref() const {
  if ((h_.flags & kHighOutOfLine) == 0) return KeyRef{};
  return RefAt(reinterpret_cast<const char*>(image_) + sizeof(NodeHeader) +
               h_.low_len);
}

void NodeView::LongKeyRefs(std::vector<KeyRef>* out) const {
  if (long_keys_ == 0) return;
  if ((h_.flags & kLowOutOfLine) != 0) out->push_back(low_ref());
  if ((h_.flags & kHighOutOfLine) != 0) out->push_back(high_ref());
  for (size_t i = 0; i < h_.count; ++i) {
    if (EntryKeyOutOfLine(i)) out->push_back(key_ref(i));
  }
}

size_t NodeView::LongKeyRefsAndBytes(std::vector<KeyRef>* refs) const {
  refs->reserve(long_keys_);
  LongKeyRefs(refs);
  size_t total = 0;
  for (const KeyRef& r : *refs) total += r.key_len;
  return total;
}

Status NodeView::ResolveKeys(const KeyReader& read) {
  lazy_reader_ = nullptr;
  if (long_keys_ == 0) return Status::OK();
  std::vector<KeyRef> refs;
  key_store_.resize(LongKeyRefsAndBytes(&refs));
  size_t pos = 0;
  for (const KeyRef& r : refs) {
    REMEM_RETURN_IF_ERROR(read(r, key_store_.data() + pos));
    pos += r.key_len;
  }
  PointAtStore();
  return check_order_ ? CheckOrder() : Status::OK();
}

Status NodeView::ResolveFences(const KeyReader* read) {
  lazy_reader_ = read;
  if (long_keys_ == 0) return Status::OK();
  std::vector<KeyRef> refs;
  key_store_.clear();
  key_store_.reserve(LongKeyRefsAndBytes(&refs));
  auto append = [&](const KeyRef& r, std::string_view* into) -> Status {
    const size_t at = key_store_.size();
    key_store_.resize(at + r.key_len);  // within capacity: nothing moves
    REMEM_RETURN_IF_ERROR((*read)(r, key_store_.data() + at));
    *into = std::string_view(key_store_.data() + at, r.key_len);
    return Status::OK();
  };
  if ((h_.flags & kLowOutOfLine) != 0) {
    REMEM_RETURN_IF_ERROR(append(low_ref(), &low_));
  }
  if ((h_.flags & kHighOutOfLine) != 0) {
    REMEM_RETURN_IF_ERROR(append(high_ref(), &high_));
  }
  return Status::OK();
}

Status NodeView::ResolveLazily(size_t i) {
  if (!EntryKeyOutOfLine(i)) return Status::OK();  // an empty inline key
  const KeyRef r = key_ref(i);
  const size_t at = key_store_.size();
  if (key_store_.capacity() - at < r.key_len) {
    return Status::Internal("a lazily resolved key does not fit its store");
  }
  key_store_.resize(at + r.key_len);
  Status st = (*lazy_reader_)(r, key_store_.data() + at);
  if (!st.ok()) {
    key_store_.resize(at);
    return st;
  }
  keys_[i] = std::string_view(key_store_.data() + at, r.key_len);
  return Status::OK();
}

Status NodeView::LowerBound(std::string_view key, size_t* at) {
  size_t lo = 0, hi = h_.count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    REMEM_RETURN_IF_ERROR(ResolveEntry(mid));
    if (keys_[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *at = lo;
  return Status::OK();
}

bool NodeView::AdoptKeys(const NodeView& from) {
  if (long_keys_ == 0) return true;
  if (from.lazy_reader_ != nullptr) return false;
  std::vector<KeyRef> refs;
  const size_t total = LongKeyRefsAndBytes(&refs);
  if (from.long_keys_ != long_keys_ || from.key_store_.size() != total) {
    return false;
  }
  key_store_ = from.key_store_;
  PointAtStore();
  return true;
}

void NodeView::PointAtStore() {
  size_t pos = 0;
  auto next = [&](const KeyRef& r) {
    std::string_view k(key_store_.data() + pos, r.key_len);
    pos += r.key_len;
    return k;
  };
  if ((h_.flags & kLowOutOfLine) != 0) low_ = next(low_ref());
  if ((h_.flags & kHighOutOfLine) != 0) high_ = next(high_ref());
  for (size_t i = 0; i < h_.count; ++i) {
    if (EntryKeyOutOfLine(i)) keys_[i] = next(key_ref(i));
  }
}

Status NodeView::CheckOrder() const {
  for (size_t i = 1; i < h_.count; ++i) {
    if (!(keys_[i - 1] < keys_[i])) {
      return Status::Corruption("node entries out of order");
    }
  }
  return Status::OK();
}

std::string_view NodeView::value(size_t i) const {
  LeafEntryHead e;
  const char* at =
      reinterpret_cast<const char*>(image_) + sizeof(NodeHeader) + offsets_[i];
  std::memcpy(&e, at, sizeof(e));
  return std::string_view(at + sizeof(e) + e.key_len, e.value_len);
}

uint64_t NodeView::entry_version(size_t i) const {
  LeafEntryHead e;
  std::memcpy(&e, image_ + sizeof(NodeHeader) + offsets_[i], sizeof(e));
  return e.version;
}

bool NodeView::out_of_line(size_t i) const {
  LeafEntryHead e;
  std::memcpy(&e, image_ + sizeof(NodeHeader) + offsets_[i], sizeof(e));
  return (e.flags & kValueOutOfLine) != 0;
}

ValueRef NodeView::value_ref(size_t i) const {
  ValueRef r;
  std::memcpy(&r, value(i).data(), sizeof(r));  // Parse checked the length
  return r;
}

uint32_t NodeView::child(size_t i) const {
  InternalEntryHead e;
  std::memcpy(&e, image_ + sizeof(NodeHeader) + offsets_[i], sizeof(e));
  return e.child;
}

size_t NodeView::LowerBound(std::string_view key) const {
  size_t lo = 0, hi = h_.count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (keys_[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

NodeContent Decode(const NodeView& v) {
  NodeContent c;
  c.self = v.header().self;
  c.right = v.right();
  c.level = v.level();
  const bool long_keys = v.long_keys() > 0;
  c.low.bytes = std::string(v.low());
  if (long_keys) c.low.ref = v.low_ref();
  c.has_high = v.has_high();
  c.dead = v.dead();
  c.high.bytes = std::string(v.high());
  if (long_keys) c.high.ref = v.high_ref();
  c.entries.resize(v.count());
  for (size_t i = 0; i < v.count(); ++i) {
    NodeEntry& e = c.entries[i];
    e.key.bytes = std::string(v.key(i));
    if (long_keys) e.key.ref = v.key_ref(i);
    if (v.leaf()) {
      e.value = std::string(v.value(i));
      e.out_of_line = v.out_of_line(i);
      e.version = v.entry_version(i);
    } else {
      e.child = v.child(i);
    }
  }
  return c;
}

size_t NodeContent::EntryBytes(size_t i) const {
  const NodeEntry& e = entries[i];
  return level == 0
             ? sizeof(LeafEntryHead) + e.key.stored_size() + e.value.size()
             : sizeof(InternalEntryHead) + e.key.stored_size();
}

size_t NodeContent::Bytes() const {
  size_t n = low.stored_size() + (has_high ? high.stored_size() : 0);
  for (size_t i = 0; i < entries.size(); ++i) n += EntryBytes(i);
  return n;
}

void EncodeNode(const NodeContent& c, uint64_t version, uint8_t* image,
                uint64_t stamp) {
  std::memset(image, 0, kNodeBytes);
  NodeHeader h{};
  h.version = version;
  h.stamp = stamp;
  h.magic = kNodeMagic;
  h.self = c.self;
  h.right = c.right;
  h.level = c.level;
  h.flags = uint8_t((c.has_high ? kHasHigh : 0) | (c.dead ? kDead : 0) |
                    (c.low.out_of_line() ? kLowOutOfLine : 0) |
                    (c.has_high && c.high.out_of_line() ? kHighOutOfLine : 0));
  h.count = uint16_t(c.entries.size());
  h.low_len = uint16_t(c.low.stored_size());
  h.high_len = uint16_t(c.has_high ? c.high.stored_size() : 0);
  uint8_t* area = image + sizeof(NodeHeader);
  size_t pos = 0;
  auto put = [&](const void* p, size_t n) {
    if (n > 0) std::memcpy(area + pos, p, n);
    pos += n;
  };
  auto put_key = [&](const NodeKey& k) {
    if (k.out_of_line() != (k.bytes.size() > kMaxInlineKey)) {
      // A long key without its extent (or a short one with one) would
      // publish a node no reader can parse: a bug in the owner, stop.
      std::fprintf(stderr, "remem: tree key of %zu bytes %s a key extent\n",
                   k.bytes.size(), k.out_of_line() ? "with" : "without");
      std::abort();
    }
    if (k.out_of_line()) {
      put(&k.ref, sizeof(k.ref));
    } else {
      put(k.bytes.data(), k.bytes.size());
    }
  };
  put_key(c.low);
  if (c.has_high) put_key(c.high);
  for (const NodeEntry& e : c.entries) {
    if (c.level == 0) {
      LeafEntryHead eh{};
      eh.key_len = uint16_t(e.key.stored_size());
      eh.value_len = uint16_t(e.value.size());
      eh.flags = (e.out_of_line ? uint32_t{kValueOutOfLine} : 0) |
                 (e.key.out_of_line() ? uint32_t{kKeyOutOfLine} : 0);
      eh.version = e.version;
      put(&eh, sizeof(eh));
      put_key(e.key);
      put(e.value.data(), e.value.size());
    } else {
      InternalEntryHead eh{};
      eh.key_len = uint16_t(e.key.stored_size());
      eh.flags = e.key.out_of_line() ? uint16_t{kKeyOutOfLine} : 0;
      eh.child = e.child;
      put(&eh, sizeof(eh));
      put_key(e.key);
    }
  }
  h.used = uint16_t(pos);
  std::memcpy(image, &h, sizeof(h));
  const uint64_t sum = NodeChecksum(image, h.used);
  std::memcpy(image, &sum, sizeof(sum));
}

uint64_t KeyExtentReadBytes(const KeyRef& ref) {
  return (sizeof(hash::ExtentHeader) + ref.key_len + 7) & ~uint64_t{7};
}

Status VerifyKeyExtent(const uint8_t* copy, const KeyRef& ref, char* dst) {
  hash::ExtentHeader h;
  std::memcpy(&h, copy, sizeof(h));
  if (h.incarnation != ref.incarnation || h.version != 0 ||
      h.key_len != ref.key_len || h.value_len != 0 ||
      h.checksum != hash::ExtentChecksum(copy, h.key_len, 0)) {
    return Status::Corruption("a long key's extent was freed or reused");
  }
  std::memcpy(dst, copy + sizeof(h), h.key_len);
  return Status::OK();
}

uint64_t ExtentReadBytes(size_t key_len, const ValueRef& ref) {
  return (sizeof(hash::ExtentHeader) + key_len + ref.value_len + 7) &
         ~uint64_t{7};
}

Status VerifyExtent(const uint8_t* copy, std::string_view key, uint64_t version,
                    const ValueRef& ref, std::string* value) {
  hash::ExtentHeader h;
  std::memcpy(&h, copy, sizeof(h));
  // Lengths first: the checksum then stays within the copy.
  if (h.incarnation != ref.incarnation || h.version != version ||
      h.key_len != key.size() || h.value_len != ref.value_len ||
      h.checksum != hash::ExtentChecksum(copy, h.key_len, h.value_len) ||
      std::memcmp(copy + sizeof(h), key.data(), key.size()) != 0) {
    return Status::Corruption("the value's extent was rewritten");
  }
  value->assign(reinterpret_cast<const char*>(copy) + sizeof(h) + key.size(),
                h.value_len);
  return Status::OK();
}

Status ParseRoot(const TreeRoot& r) {
  if (r.checksum != TreeRootChecksum(r)) {
    return Status::Corruption("tree root checksum mismatch");
  }
  if ((r.version & 1) != 0)
    return Status::Corruption("tree root being written");
  if (r.magic != kTreeRootMagic || r.layout_version != kTreeLayoutVersion) {
    return Status::Corruption("not a tree root of this layout");
  }
  if (r.root == kNoNode || r.height == 0 || r.height > kMaxLevels ||
      r.root >= r.node_limit) {
    return Status::Corruption("tree root out of range");
  }
  return Status::OK();
}

}  // namespace remem::tree
