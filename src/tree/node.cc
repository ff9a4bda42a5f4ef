#include "tree/node.h"

#include <algorithm>
#include <cstring>

#include "hash/layout.h"

namespace remem::tree {

Status NodeView::Parse(const uint8_t* image, uint32_t index, bool checksum) {
  image_ = image;
  std::memcpy(&h_, image, sizeof(h_));
  if (checksum && h_.checksum != NodeChecksum(image)) {
    return Status::Corruption("node checksum mismatch");
  }
  if ((h_.version & 1) != 0) return Status::Corruption("node being written");
  if (h_.magic != kNodeMagic) return Status::Corruption("not a tree node");
  if (index != kNoNode && h_.self != index) {
    return Status::Corruption("node names another index");
  }
  if (h_.level >= kMaxLevels || h_.count > kMaxEntries || h_.used > kNodeArea ||
      h_.low_len > kMaxKey || h_.high_len > kMaxKey ||
      (!has_high() && h_.high_len != 0) ||
      (h_.flags & ~uint8_t{kHasHigh | kDead}) != 0 ||
      (dead() && h_.count != 0)) {
    return Status::Corruption("node header out of range");
  }
  const char* area = reinterpret_cast<const char*>(image) + sizeof(NodeHeader);
  size_t pos = size_t{h_.low_len} + h_.high_len;
  if (pos > h_.used) return Status::Corruption("node fences overflow");
  low_ = std::string_view(area, h_.low_len);
  high_ = std::string_view(area + h_.low_len, h_.high_len);
  for (size_t i = 0; i < h_.count; ++i) {
    size_t head, klen, vlen = 0;
    if (leaf()) {
      LeafEntryHead e;
      if (pos + sizeof(e) > h_.used) return Status::Corruption("entry head");
      std::memcpy(&e, area + pos, sizeof(e));
      head = sizeof(e);
      klen = e.key_len;
      vlen = e.value_len;
      if ((e.flags & ~uint32_t{kValueOutOfLine}) != 0 ||
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
    }
    if (pos + head + klen + vlen > h_.used) {
      return Status::Corruption("entry overflows the node");
    }
    offsets_[i] = uint16_t(pos);
    keys_[i] = std::string_view(area + pos + head, klen);
    if (i > 0 && !(keys_[i - 1] < keys_[i])) {
      return Status::Corruption("node entries out of order");
    }
    pos += head + klen + vlen;
  }
  if (pos != h_.used) return Status::Corruption("node length mismatch");
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
  c.low = std::string(v.low());
  c.has_high = v.has_high();
  c.dead = v.dead();
  c.high = std::string(v.high());
  c.entries.resize(v.count());
  for (size_t i = 0; i < v.count(); ++i) {
    NodeEntry& e = c.entries[i];
    e.key = std::string(v.key(i));
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
  return level == 0 ? sizeof(LeafEntryHead) + e.key.size() + e.value.size()
                    : sizeof(InternalEntryHead) + e.key.size();
}

size_t NodeContent::Bytes() const {
  size_t n = low.size() + high.size();
  for (size_t i = 0; i < entries.size(); ++i) n += EntryBytes(i);
  return n;
}

void EncodeNode(const NodeContent& c, uint64_t version, uint8_t* image) {
  std::memset(image, 0, kNodeBytes);
  NodeHeader h{};
  h.version = version;
  h.magic = kNodeMagic;
  h.self = c.self;
  h.right = c.right;
  h.level = c.level;
  h.flags = uint8_t((c.has_high ? kHasHigh : 0) | (c.dead ? kDead : 0));
  h.count = uint16_t(c.entries.size());
  h.low_len = uint16_t(c.low.size());
  h.high_len = uint16_t(c.has_high ? c.high.size() : 0);
  uint8_t* area = image + sizeof(NodeHeader);
  size_t pos = 0;
  auto put = [&](const void* p, size_t n) {
    if (n > 0) std::memcpy(area + pos, p, n);
    pos += n;
  };
  put(c.low.data(), c.low.size());
  if (c.has_high) put(c.high.data(), c.high.size());
  for (const NodeEntry& e : c.entries) {
    if (c.level == 0) {
      LeafEntryHead eh{};
      eh.key_len = uint16_t(e.key.size());
      eh.value_len = uint16_t(e.value.size());
      eh.flags = e.out_of_line ? uint32_t{kValueOutOfLine} : 0;
      eh.version = e.version;
      put(&eh, sizeof(eh));
      put(e.key.data(), e.key.size());
      put(e.value.data(), e.value.size());
    } else {
      InternalEntryHead eh{};
      eh.key_len = uint16_t(e.key.size());
      eh.child = e.child;
      put(&eh, sizeof(eh));
      put(e.key.data(), e.key.size());
    }
  }
  h.used = uint16_t(pos);
  std::memcpy(image, &h, sizeof(h));
  const uint64_t sum = NodeChecksum(image);
  std::memcpy(image, &sum, sizeof(sum));
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
