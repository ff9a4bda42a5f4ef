#include "hash/reader.h"

#include <cstring>
#include <vector>

namespace remem::hash {

namespace {

bool Verified(const Bucket& b) {
  return (b.version & 1) == 0 && BucketChecksum(b) == b.checksum;
}

}  // namespace

Result<Lookup> LookupOnce(const Geometry& g, std::string_view key,
                          const ReadFn& read) {
  Lookup out;
  const uint64_t mask = g.num_buckets - 1;
  const KeyHash kh = HashKey(key, g.seed);
  const uint64_t b1 = PrimaryBucket(kh, mask);
  const uint64_t b2 = AltBucket(b1, kh.tag, mask);
  Bucket first{};
  std::vector<uint8_t> extent;
  for (uint64_t b : {b1, b2}) {
    Bucket copy;
    REMEM_RETURN_IF_ERROR(read(g.region, g.buckets_offset + b * kBucketBytes,
                               &copy, sizeof(copy)));
    ++out.reads;
    if (!Verified(copy)) {
      out.retry_reason = "bucket failed verification";
      return out;
    }
    if (b == b1) first = copy;
    for (const Slot& s : copy.slots) {
      if (s.ref == 0 || s.tag != kh.tag) continue;
      if (s.size_class >= SlabAllocator::NumClasses()) {
        out.retry_reason = "slot names no size class";
        return out;
      }
      const uint64_t size = SlabAllocator::ClassSize(s.size_class);
      extent.resize(size);
      REMEM_RETURN_IF_ERROR(
          read(RefRegion(s.ref), RefOffset(s.ref), extent.data(), size));
      ++out.reads;
      ExtentHeader h;
      std::memcpy(&h, extent.data(), sizeof(h));
      if (h.incarnation != s.incarnation ||
          uint64_t{h.key_len} + h.value_len > size - sizeof(ExtentHeader) ||
          ExtentChecksum(extent.data(), h.key_len, h.value_len) != h.checksum) {
        out.retry_reason = "extent failed verification or was reused";
        return out;
      }
      if (h.key_len != key.size() ||
          std::memcmp(extent.data() + sizeof(h), key.data(), key.size()) != 0) {
        continue;  // same tag, other key
      }
      out.outcome = Lookup::kFound;
      out.value.assign(
          reinterpret_cast<const char*>(extent.data()) + sizeof(h) + h.key_len,
          h.value_len);
      out.version = h.version;
      return out;
    }
    if (b1 == b2) break;
  }
  Bucket again;
  REMEM_RETURN_IF_ERROR(read(g.region, g.buckets_offset + b1 * kBucketBytes,
                             &again, sizeof(again)));
  ++out.reads;
  if (!Verified(again) || again.version != first.version) {
    out.retry_reason = "first bucket changed during the lookup";
    return out;
  }
  out.outcome = Lookup::kNotFound;
  return out;
}

}  // namespace remem::hash
