#include "hash/shard_export.h"

#include <algorithm>
#include <vector>

#include "hash/wire.h"

namespace remem::hash {

namespace {

struct PairRef {
  std::string_view key;
  std::string_view value;
  uint64_t version;
};

}  // namespace

uint64_t ExportShardPage(const Table& table,
                         const std::function<bool(std::string_view)>& wanted,
                         uint64_t cursor, std::string_view after,
                         uint64_t max_bytes, uint64_t max_buckets,
                         ShardPairsWriter* out) {
  const uint64_t end = std::min(table.num_buckets(),
                                cursor + std::max<uint64_t>(max_buckets, 1));
  // A bucket's pairs, read in place (nothing writes the table meanwhile).
  std::vector<PairRef> bucket;
  while (cursor < end) {
    bucket.clear();
    table.ScanBuckets(
        cursor, 1,
        [&](std::string_view k, std::string_view v, uint64_t version) {
          if (wanted(k)) bucket.push_back({k, v, version});
        });
    // Key order: the order a page cut inside the bucket resumes in.
    std::sort(bucket.begin(), bucket.end(),
              [](const PairRef& a, const PairRef& b) { return a.key < b.key; });
    auto it = bucket.begin();
    if (!after.empty()) {
      it = std::upper_bound(
          bucket.begin(), bucket.end(), after,
          [](std::string_view k, const PairRef& p) { return k < p.key; });
      after = {};
    }
    for (const auto first = it; it != bucket.end(); ++it) {
      const uint64_t size =
          sizeof(ShardPair) + it->key.size() + it->value.size();
      if (out->count() > 0 && out->bytes() + size > max_bytes) {
        // Inside the bucket only if this page holds some of its pairs (the
        // page's last key must be the bucket's).
        return it == first ? cursor : cursor | kShardCursorInBucket;
      }
      out->Add(it->key, it->value, it->version, false);
    }
    ++cursor;
    if (out->bytes() >= max_bytes) break;
  }
  return cursor >= table.num_buckets() ? kShardCursorDone : cursor;
}

}  // namespace remem::hash
