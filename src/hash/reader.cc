#include "hash/reader.h"

#include <cstring>

#include "hash/size_classes.h"

namespace remem::hash {

namespace {

bool Verified(const Bucket& b) {
  return (b.version & 1) == 0 && BucketChecksum(b) == b.checksum;
}

}  // namespace

Lookup::Lookup(const Geometry& g, std::string_view key, std::string* value_into,
               const KeyHash* hash)
    : g_(g),
      key_(key),
      kh_(hash != nullptr ? *hash : HashKey(key, g.seed)),
      value_(value_into != nullptr ? value_into : &own_value_) {
  const uint64_t mask = g.num_buckets - 1;
  b_[0] = PrimaryBucket(kh_, mask);
  b_[1] = AltBucket(b_[0], kh_.tag, mask);
}

bool Lookup::ReadBucket(uint64_t b, Bucket* into, ReadRequest* req) {
  *req = {g_.region, g_.buckets_offset + b * kBucketBytes, into,
          sizeof(Bucket)};
  return true;
}

bool Lookup::Next(ReadRequest* req) {
  switch (stage_) {
    case kStart:
      stage_ = kGotBucket;
      return ReadBucket(b_[0], &bucket_, req);
    case kGotBucket:
      ++reads_;
      if (!Verified(bucket_)) {
        bucket_failed_ = true;
        return Retry(bucket_.version == kMovedVersion
                         ? "the table grew"
                         : "bucket failed verification");
      }
      if (which_ == 0) first_version_ = bucket_.version;
      scanned_ = 0;
      return Scan(req);
    case kGotExtent: {
      ++reads_;
      ExtentHeader h;
      std::memcpy(&h, extent_.data(), sizeof(h));
      if (h.incarnation != extent_incarnation_ ||
          uint64_t{h.key_len} + h.value_len >
              extent_size_ - sizeof(ExtentHeader) ||
          ExtentChecksum(extent_.data(), h.key_len, h.value_len) !=
              h.checksum) {
        return Retry("extent failed verification or was reused");
      }
      if (h.key_len == key_.size() &&
          std::memcmp(extent_.data() + sizeof(h), key_.data(), key_.size()) ==
              0) {
        outcome_ = kFound;
        value_->assign(reinterpret_cast<const char*>(extent_.data()) +
                           sizeof(h) + h.key_len,
                       h.value_len);
        version_ = h.version;
        return false;
      }
      return Scan(req);  // same tag, other key
    }
    case kGotRecheck:
      ++reads_;
      if (!Verified(bucket_)) {
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
  EntryCursor c(bucket_.entries);
  int index = 0;
  while (c.Next()) {
    if (index++ < scanned_) continue;
    ++scanned_;
    if (c.head().tag != kh_.tag) continue;
    if (c.head().kind == kInline) {
      if (c.key_len() != key_.size() ||
          std::memcmp(c.inline_key(), key_.data(), key_.size()) != 0) {
        continue;
      }
      outcome_ = kFound;
      value_->assign(c.inline_value(), c.value_len());
      version_ = c.word1();
      return false;
    }
    const uint64_t ref = c.word1();
    if (RefClass(ref) >= NumSizeClasses()) {
      return Retry("entry names no size class");
    }
    extent_size_ = SizeClassBytes(RefClass(ref));
    extent_incarnation_ = c.head().meta;
    extent_.resize(extent_size_);
    *req = {RefRegion(ref), RefOffset(ref), extent_.data(), extent_size_};
    stage_ = kGotExtent;
    return true;
  }
  if (!c.ok()) return Retry("malformed bucket entry");
  if (which_ == 0 && b_[1] != b_[0]) {
    which_ = 1;
    stage_ = kGotBucket;
    return ReadBucket(b_[1], &bucket_, req);
  }
  stage_ = kGotRecheck;
  return ReadBucket(b_[0], &bucket_, req);
}

Result<LookupResult> LookupOnce(const Geometry& g, std::string_view key,
                                const ReadFn& read) {
  Lookup l(g, key);
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

}  // namespace remem::hash
