#include "hash/reader.h"

#include <cstring>

#include "hash/size_classes.h"

namespace remem::hash {

Lookup::Lookup(const Geometry& g, std::string_view key, ReadMode mode,
               std::string* value_into, const KeyHash* hash)
    : g_(g),
      key_(key),
      mode_(mode),
      kh_(hash != nullptr ? *hash : HashKey(key, g.seed)),
      value_(value_into != nullptr ? value_into : &own_value_) {
  const uint64_t mask = g.num_buckets - 1;
  b_[0] = PrimaryBucket(kh_, mask);
  b_[1] = AltBucket(b_[0], kh_.tag, mask);
}

bool Lookup::ReadBucket(uint64_t b, bool whole, ReadRequest* req) {
  *req = {g_.region, g_.buckets_offset + b * kBucketBytes, &bucket_,
          whole ? sizeof(Bucket) : kBucketHeaderBytes};
  return true;
}

bool Lookup::HeaderVerifies() const {
  return (bucket_.version & 1) == 0 &&
         HeaderChecksum(bucket_) == bucket_.checksum;
}

bool Lookup::Next(ReadRequest* req) {
  switch (stage_) {
    case kStart:
      stage_ = kGotHeader;
      return ReadBucket(b_[0], mode_ == ReadMode::kWholeBuckets, req);
    case kGotHeader:
      ++reads_;
      if (!HeaderVerifies()) {
        bucket_failed_ = true;
        return Retry(bucket_.version == kMovedVersion
                         ? "the table grew"
                         : "bucket failed verification");
      }
      if (which_ == 0) first_version_ = bucket_.version;
      slot_ = 0;
      return Scan(req);
    case kGotEntry:
      ++reads_;
      return CheckEntry(req);
    case kGotExtent: {
      ++reads_;
      ExtentHeader h;
      std::memcpy(&h, extent_->data(), sizeof(h));
      if (h.incarnation != extent_incarnation_ ||
          uint64_t{h.key_len} + h.value_len >
              extent_size_ - sizeof(ExtentHeader) ||
          ExtentChecksum(extent_->data(), h.key_len, h.value_len) !=
              h.checksum) {
        return Retry("extent failed verification or was reused");
      }
      if (h.key_len == key_.size() &&
          std::memcmp(extent_->data() + sizeof(h), key_.data(), key_.size()) ==
              0) {
        outcome_ = kFound;
        value_->assign(reinterpret_cast<const char*>(extent_->data()) +
                           sizeof(h) + h.key_len,
                       h.value_len);
        version_ = h.version;
        return false;
      }
      return Scan(req);  // same tag, other key
    }
    case kGotRecheck:
      ++reads_;
      if (!HeaderVerifies()) {
        bucket_failed_ = true;
        return Retry("first bucket failed verification");
      }
      if (bucket_.version != first_version_) {
        return Retry("first bucket changed during the lookup");
      }
      outcome_ = kNotFound;
      return false;
  }
  return false;
}

bool Lookup::Scan(ReadRequest* req) {
  while (slot_ < kIndexSlots) {
    const IndexSlot s = bucket_.index[slot_];
    if (s.tag == 0) break;  // the index lists entries first
    ++slot_;
    if (s.tag != kh_.tag) continue;
    entry_offset_ = size_t{s.offset_words} * 8;
    entry_bytes_ = size_t{s.words} * 8;
    if (entry_bytes_ < kMinEntryBytes ||
        entry_offset_ + entry_bytes_ > kEntryAreaBytes) {
      return Retry("malformed bucket index");
    }
    if (mode_ == ReadMode::kWholeBuckets) return CheckEntry(req);
    *req = {g_.region,
            g_.buckets_offset + b_[which_] * kBucketBytes + kBucketHeaderBytes +
                entry_offset_,
            bucket_.entries + entry_offset_, entry_bytes_};
    stage_ = kGotEntry;
    return true;
  }
  if (which_ == 0 && b_[1] != b_[0]) {
    which_ = 1;
    stage_ = kGotHeader;
    return ReadBucket(b_[1], mode_ == ReadMode::kWholeBuckets, req);
  }
  // A miss: the first bucket's header again (see the header comment).
  stage_ = kGotRecheck;
  return ReadBucket(b_[0], /*whole=*/false, req);
}

bool Lookup::CheckEntry(ReadRequest* req) {
  const uint8_t* entry = bucket_.entries + entry_offset_;
  if (StoredEntryChecksum(entry, entry_bytes_) !=
      EntryChecksum(entry, entry_bytes_, bucket_.version)) {
    return Retry("entry failed verification");
  }
  EntryHead h;
  std::memcpy(&h, entry, sizeof(h));
  if (h.tag != kh_.tag || size_t{h.words} * 8 != entry_bytes_) {
    return Retry("entry disagrees with its index slot");
  }
  uint64_t word1;
  std::memcpy(&word1, entry + 8, 8);
  if (h.kind == kInline) {
    const size_t key_len = h.meta & 0xffff, value_len = h.meta >> 16;
    if (InlineEntryBytes(key_len, value_len) != entry_bytes_) {
      return Retry("malformed bucket entry");
    }
    const char* k = reinterpret_cast<const char*>(entry + kInlineOverhead);
    if (key_len == key_.size() &&
        std::memcmp(k, key_.data(), key_.size()) == 0) {
      outcome_ = kFound;
      value_->assign(k + key_len, value_len);
      version_ = word1;
      return false;
    }
    return Scan(req);
  }
  if (h.kind != kExtent || entry_bytes_ != kExtentEntryBytes) {
    return Retry("malformed bucket entry");
  }
  if (RefClass(word1) >= NumSizeClasses()) {
    return Retry("entry names no size class");
  }
  extent_size_ = SizeClassBytes(RefClass(word1));
  extent_incarnation_ = h.meta;
  extent_->resize(extent_size_);
  *req = {RefRegion(word1), RefOffset(word1), extent_->data(), extent_size_};
  stage_ = kGotExtent;
  return true;
}

Result<LookupResult> LookupOnce(const Geometry& g, std::string_view key,
                                const ReadFn& read, ReadMode mode) {
  Lookup l(g, key, mode);
  ReadRequest req;
  while (l.Next(&req)) {
    REMEM_RETURN_IF_ERROR(read(req.region, req.offset, req.dst, req.len));
  }
  LookupResult out;
  out.outcome = l.outcome();
  out.value = std::move(l.value());
  out.version = l.version();
  out.retry_reason = l.retry_reason();
  out.bucket_failed = l.bucket_failed();
  out.reads = l.reads();
  return out;
}

uint64_t FirstBucketOffset(const Geometry& g, std::string_view key) {
  return FirstBucketOffset(g, HashKey(key, g.seed));
}

uint64_t FirstBucketOffset(const Geometry& g, const KeyHash& hash) {
  return g.buckets_offset +
         PrimaryBucket(hash, g.num_buckets - 1) * kBucketBytes;
}

ReadRequest RootRequest(const Geometry& g, Root* root) {
  return {g.region, g.root_offset, root, sizeof(Root)};
}

bool ApplyRoot(const Root& root, Geometry* g) {
  if ((root.version & 1) != 0 || root.magic != kRootMagic ||
      root.layout_version != kLayoutVersion ||
      RootChecksum(root) != root.checksum || root.num_buckets < 2 ||
      (root.num_buckets & (root.num_buckets - 1)) != 0) {
    return false;
  }
  g->generation = root.generation;
  g->buckets_offset = root.buckets_offset;
  g->num_buckets = root.num_buckets;
  g->seed = root.seed;
  return true;
}

ReadRequest ServingMarkRequest(const Geometry& g, ServingMark* mark) {
  return {g.region, g.root_offset + kServingMarkOffset, mark,
          sizeof(ServingMark)};
}

MarkVerdict JudgeServingMark(const ServingMark& mark, uint32_t epoch,
                             uint64_t version) {
  if (MarkCheck(mark.serving, kServingHalf) != mark.serving_check ||
      MarkCheck(mark.replicated, kReplicatedHalf) != mark.replicated_check) {
    return MarkVerdict::kTorn;
  }
  if (mark.serving == 0) return MarkVerdict::kAskServer;
  const auto installed = uint32_t(mark.serving);
  const auto primary_since = uint32_t(mark.serving >> 32);
  if (epoch < primary_since) return MarkVerdict::kStale;
  if (epoch > installed || version > mark.replicated) {
    return MarkVerdict::kAskServer;
  }
  return MarkVerdict::kTrusted;
}

}  // namespace remem::hash
