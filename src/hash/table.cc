#include "hash/table.h"

#include <atomic>
#include <cstring>
#include <deque>
#include <vector>

namespace remem::hash {

Table::Table(uint8_t* bucket_mem, Geometry geometry, SlabAllocator* slab,
             Limits limits)
    : mem_(bucket_mem),
      geo_(geometry),
      slab_(slab),
      limits_(limits),
      mask_(geometry.num_buckets - 1) {
  // Format: every bucket verifies from the start (zeroed memory would not:
  // its checksum field is 0, not the checksum of an empty bucket).
  for (uint64_t i = 0; i < geo_.num_buckets; ++i) {
    Bucket empty{};
    empty.checksum = BucketChecksum(empty);
    StoreWords(At(i), &empty, sizeof(empty));
  }
}

Bucket* Table::At(uint64_t i) const {
  return reinterpret_cast<Bucket*>(mem_ + i * kBucketBytes);
}

void Table::Publish(uint64_t i, const Bucket& next) {
  Bucket* live = At(i);
  // This thread is the only writer, so it may read its own words plainly.
  const uint64_t v = live->version;
  std::atomic_ref<uint64_t>(live->version)
      .store(v + 1, std::memory_order_release);
  Bucket b = next;
  b.version = v + 2;
  b.checksum = BucketChecksum(b);
  StoreWords(live->slots, b.slots, sizeof(b.slots));
  StoreWords(&live->checksum, &b.checksum, sizeof(b.checksum));
  std::atomic_ref<uint64_t>(live->version)
      .store(v + 2, std::memory_order_release);
}

std::optional<Table::Found> Table::Find(std::string_view key,
                                        const KeyHash& kh) const {
  const uint64_t b1 = PrimaryBucket(kh, mask_);
  const uint64_t b2 = AltBucket(b1, kh.tag, mask_);
  for (uint64_t b : {b1, b2}) {
    const Bucket* bucket = At(b);
    for (int i = 0; i < kSlotsPerBucket; ++i) {
      const Slot& s = bucket->slots[i];
      if (s.ref == 0 || s.tag != kh.tag) continue;
      const uint8_t* e = slab_->At(RefOffset(s.ref));
      const auto* h = reinterpret_cast<const ExtentHeader*>(e);
      if (h->key_len == key.size() &&
          std::memcmp(e + sizeof(ExtentHeader), key.data(), key.size()) == 0) {
        return Found{b, i, s, h->version};
      }
    }
    if (b1 == b2) break;
  }
  return std::nullopt;
}

Status Table::CheckSizes(std::string_view key, std::string_view value) const {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > limits_.max_key) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits_.max_key));
  }
  if (value.size() > limits_.max_value) {
    return Status::InvalidArgument("value of " + std::to_string(value.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits_.max_value));
  }
  return Status::OK();
}

Result<SlabAllocator::Extent> Table::WriteExtent(std::string_view key,
                                                 std::string_view value,
                                                 uint64_t version) {
  const uint64_t bytes = sizeof(ExtentHeader) + key.size() + value.size();
  auto ext = slab_->Allocate(bytes);
  if (!ext.ok()) return ext.status();
  std::vector<uint8_t> buf((bytes + 7) & ~uint64_t{7}, 0);
  ExtentHeader h{};
  h.incarnation = ext->incarnation;
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.version = version;
  std::memcpy(buf.data(), &h, sizeof(h));
  std::memcpy(buf.data() + sizeof(h), key.data(), key.size());
  std::memcpy(buf.data() + sizeof(h) + key.size(), value.data(), value.size());
  h.checksum = ExtentChecksum(buf.data(), key.size(), value.size());
  std::memcpy(buf.data(), &h.checksum, 8);
  // Release stores: the extent is complete before any slot points to it.
  StoreWords(slab_->At(ext->offset), buf.data(), buf.size());
  return ext;
}

bool Table::MakeRoom(uint64_t b1, uint64_t b2, uint64_t* bucket, int* slot) {
  for (uint64_t b : {b1, b2}) {
    const Bucket* bk = At(b);
    for (int i = 0; i < kSlotsPerBucket; ++i) {
      if (bk->slots[i].ref == 0) {
        *bucket = b;
        *slot = i;
        return true;
      }
    }
  }
  // Breadth-first search for a short cuckoo path ending in a free slot.
  struct Node {
    uint64_t bucket;
    int parent;  // index in `nodes`, -1 for roots
    int slot;    // slot of the parent bucket whose entry moves here
  };
  constexpr size_t kMaxNodes = 4096;
  std::vector<Node> nodes{{b1, -1, -1}, {b2, -1, -1}};
  for (size_t n = 0; n < nodes.size() && nodes.size() < kMaxNodes; ++n) {
    const Bucket* bk = At(nodes[n].bucket);
    for (int i = 0; i < kSlotsPerBucket; ++i) {
      const uint64_t alt = AltBucket(nodes[n].bucket, bk->slots[i].tag, mask_);
      // A path must not visit a bucket twice: a later hop would move
      // whatever an earlier hop put in that slot, into a bucket that is not
      // one of its two.
      bool cycle = false;
      for (int a = int(n); a >= 0; a = nodes[size_t(a)].parent) {
        if (nodes[size_t(a)].bucket == alt) {
          cycle = true;
          break;
        }
      }
      if (cycle) continue;
      nodes.push_back({alt, int(n), i});
      const Bucket* ab = At(alt);
      int free_slot = -1;
      for (int j = 0; j < kSlotsPerBucket; ++j) {
        if (ab->slots[j].ref == 0) {
          free_slot = j;
          break;
        }
      }
      if (free_slot < 0) continue;
      // Move entries along the path, last hop first: each entry is copied
      // into its other bucket before it is erased from where it was.
      int to = int(nodes.size()) - 1;
      int to_slot = free_slot;
      while (nodes[size_t(to)].parent >= 0) {
        const Node& hop = nodes[size_t(to)];
        const uint64_t from = nodes[size_t(hop.parent)].bucket;
        Bucket dst = *At(hop.bucket);
        dst.slots[to_slot] = At(from)->slots[hop.slot];
        Publish(hop.bucket, dst);
        Bucket src = *At(from);
        src.slots[hop.slot] = Slot{};
        Publish(from, src);
        ++moves_;
        to_slot = hop.slot;
        to = hop.parent;
      }
      *bucket = nodes[size_t(to)].bucket;
      *slot = to_slot;
      return true;
    }
  }
  return false;
}

Result<uint64_t> Table::Write(std::string_view key, std::string_view value,
                              Mode mode, uint64_t expected) {
  REMEM_RETURN_IF_ERROR(CheckSizes(key, value));
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (mode == Mode::kIfAbsent && found) {
    return Status::AlreadyExists("key exists");
  }
  if (mode == Mode::kIfVersion) {
    if (!found) return Status::NotFound("key not found");
    if (found->version != expected) {
      return Status::Conflict("version is " + std::to_string(found->version) +
                              ", not " + std::to_string(expected));
    }
  }
  const uint64_t version = next_version_;
  uint64_t bucket = 0;
  int slot = 0;
  if (found) {
    bucket = found->bucket;
    slot = found->slot;
  } else if (!MakeRoom(PrimaryBucket(kh, mask_),
                       AltBucket(PrimaryBucket(kh, mask_), kh.tag, mask_),
                       &bucket, &slot)) {
    return Status::OutOfMemory("the hash table is full (" +
                               std::to_string(size_) + " keys)");
  }
  auto ext = WriteExtent(key, value, version);
  if (!ext.ok()) return ext.status();
  ++next_version_;
  Bucket next = *At(bucket);
  next.slots[slot] = Slot{MakeRef(geo_.region, ext->offset), ext->incarnation,
                          kh.tag, ext->size_class};
  Publish(bucket, next);
  if (found) {
    slab_->Free(RefOffset(found->s.ref), found->s.size_class);
  } else {
    ++size_;
  }
  return version;
}

Result<uint64_t> Table::Put(std::string_view key, std::string_view value) {
  return Write(key, value, Mode::kUpsert, 0);
}

Result<uint64_t> Table::CompareAndPut(std::string_view key,
                                      std::string_view value,
                                      uint64_t expected) {
  return Write(key, value, Mode::kIfVersion, expected);
}

Result<uint64_t> Table::PutIfAbsent(std::string_view key,
                                    std::string_view value) {
  return Write(key, value, Mode::kIfAbsent, 0);
}

Status Table::Delete(std::string_view key) {
  if (key.empty() || key.size() > limits_.max_key) {
    return Status::InvalidArgument("bad key size");
  }
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (!found) return Status::NotFound("key not found");
  Bucket next = *At(found->bucket);
  next.slots[found->slot] = Slot{};
  Publish(found->bucket, next);
  slab_->Free(RefOffset(found->s.ref), found->s.size_class);
  --size_;
  ++next_version_;  // a delete is a write too
  return Status::OK();
}

Result<Table::Value> Table::Get(std::string_view key) const {
  if (key.empty() || key.size() > limits_.max_key) {
    return Status::InvalidArgument("bad key size");
  }
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (!found) return Status::NotFound("key not found");
  const uint8_t* e = slab_->At(RefOffset(found->s.ref));
  const auto* h = reinterpret_cast<const ExtentHeader*>(e);
  Value v;
  v.value.assign(
      reinterpret_cast<const char*>(e) + sizeof(ExtentHeader) + h->key_len,
      h->value_len);
  v.version = h->version;
  return v;
}

}  // namespace remem::hash
