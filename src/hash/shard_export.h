// hash::ExportShardPage: one page of a partition's pairs of moving shards
// (kShardExport), cut at a byte budget even inside a bucket.
//
// Thread contract: runs on the table's owner thread (it reads the table in
// place).

#ifndef REMEM_HASH_SHARD_EXPORT_H_
#define REMEM_HASH_SHARD_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "hash/codec.h"
#include "hash/table.h"

namespace remem::hash {

// Adds to `out` the pairs of `table` whose key `wanted` accepts, bucket by
// bucket from `cursor` (below num_buckets()), each bucket's pairs in key
// order. `after` non-empty: bucket `cursor`'s keys up to and including it
// are skipped (the previous page sent them). Stops before a pair that would
// take `out` past `max_bytes` (the page holds at least one pair), or once
// `max_buckets` buckets were scanned. Returns the cursor of the reply: the
// next bucket, kShardCursorDone after the last, or the bucket with
// kShardCursorInBucket when its pairs did not all fit (resume after the
// page's last key).
//
// A key written, deleted or moved by a cuckoo move between two pages is
// not this page's to find again: the export's change hook notes it for the
// ShardSync that follows. A key unchanged since the last page stays in its
// bucket, so resuming by key order misses none.
uint64_t ExportShardPage(const Table& table,
                         const std::function<bool(std::string_view)>& wanted,
                         uint64_t cursor, std::string_view after,
                         uint64_t max_bytes, uint64_t max_buckets,
                         ShardPairsWriter* out);

}  // namespace remem::hash

#endif  // REMEM_HASH_SHARD_EXPORT_H_
