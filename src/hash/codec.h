// Encoders and validating decoders for the hash store's payloads
// (hash/wire.h), on the helpers of proto/buffer.h. Every decoder takes
// untrusted bytes and returns ProtocolError with a reason instead of
// reading past the end; fuzz/proto_fuzz.cc drives them.
//
// Thread contract: pure functions.

#ifndef REMEM_HASH_CODEC_H_
#define REMEM_HASH_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hash/wire.h"
#include "ops/apply.h"
#include "remem/status.h"

namespace remem::hash {

// Splits items [0, n) into runs that each fit one multi-item message: at
// most kMaxMultiItems items and (about) half the largest payload, counting
// size_of(i) bytes plus 16 of framing per item. Returns [begin, end) pairs.
template <typename SizeOf>
std::vector<std::pair<size_t, size_t>> SplitIntoMessages(size_t n,
                                                         SizeOf size_of) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0, bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t b = size_of(i) + 16;
    if (i > begin && (i - begin == kMaxMultiItems ||
                      bytes + b > proto::kMaxRpcPayload / 2)) {
      out.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += b;
  }
  if (n > begin) out.emplace_back(begin, n);
  return out;
}

struct HashInfo {
  uint32_t max_key = 0;
  uint32_t max_value = 0;
  uint64_t partition_seed = 0;
  std::vector<HashPartition> partitions;
};
std::string EncodeHashInfo(const HashInfo& info);
Result<HashInfo> DecodeHashInfo(std::string_view payload);

// A get's or delete's request; `flags`: kHashRead* (gets only).
std::string EncodeHashKey(std::string_view key, uint32_t flags = 0);
Result<std::string_view> DecodeHashKey(std::string_view payload);

// The kHashRead* flags of a get's request or of a multi request (the
// same field of both; 0 if the payload is too short to hold it: its
// decoder refuses it).
uint32_t HashReadFlags(std::string_view payload);

struct HashPut {
  std::string_view key;
  std::string_view value;
  PutMode mode = PutMode::kUpsert;
  uint64_t expected_version = 0;
};
std::string EncodeHashPut(const HashPut& put);
// The views point into `payload`.
Result<HashPut> DecodeHashPut(std::string_view payload);

std::string EncodeHashGetReply(uint64_t version, std::string_view value);
struct HashValue {
  uint64_t version = 0;
  std::string value;
};
Result<HashValue> DecodeHashGetReply(std::string_view payload);

std::string EncodeHashPutReply(uint64_t version);
Result<uint64_t> DecodeHashPutReply(std::string_view payload);

// Multi-get / multi-put (wire.h: HashMultiRequest). Decoders check every
// length against the payload and the item count against kMaxMultiItems.
// `flags` (kHashRead*): multi-gets, and batches that hold only gets.
std::string EncodeHashMultiGet(const std::vector<std::string_view>& keys,
                               uint32_t flags = 0);
Result<std::vector<std::string_view>> DecodeHashMultiGet(
    std::string_view payload);
using KeyValue = std::pair<std::string_view, std::string_view>;
std::string EncodeHashMultiPut(const std::vector<KeyValue>& pairs);
Result<std::vector<KeyValue>> DecodeHashMultiPut(std::string_view payload);
// Mixed batch (kMultiOp): the views point into the payload.
struct MultiOp {
  MultiOpKind op = MultiOpKind::kGet;
  std::string_view key;
  std::string_view value;  // puts only
};
std::string EncodeHashMultiOp(const std::vector<MultiOp>& ops,
                              uint32_t flags = 0);
Result<std::vector<MultiOp>> DecodeHashMultiOp(std::string_view payload);
struct MultiItem {
  Status status;
  uint64_t version = 0;
  std::string data;  // value (get) or nothing (put)
};
std::string EncodeHashMultiReply(const std::vector<MultiItem>& items);
Result<std::vector<MultiItem>> DecodeHashMultiReply(std::string_view payload,
                                                    size_t expected_count);

// Server-side operations (kOp, kOpBatch). Decoders check lengths and
// reserved bytes only; what an operation means is checked by ops::Apply,
// so one bad item of a batch fails alone. The views point into `payload`.
std::string EncodeHashOp(const ops::OpView& op);
Result<ops::OpView> DecodeHashOp(std::string_view payload);
std::string EncodeHashOpBatch(const std::vector<ops::OpView>& ops);
Result<std::vector<ops::OpView>> DecodeHashOpBatch(std::string_view payload);
// An item of a multi reply or an OpBatch reply left unanswered because the
// results before it filled the reply (kMaxMultiReplyBytes): asked again.
inline bool ReplyWasFull(const Status& st) {
  return st.code() == StatusCode::kBusy && st.message() == kMultiReplyFull;
}

struct OpItem {
  Status status;
  bool applied = true;
  uint64_t version = 0;
  std::string data;  // the op's result (status OK)
};
// A single kOp reply (the item's status is OK).
std::string EncodeHashOpReply(const OpItem& item);
Result<OpItem> DecodeHashOpReply(std::string_view payload);
std::string EncodeHashOpBatchReply(const std::vector<OpItem>& items);
Result<std::vector<OpItem>> DecodeHashOpBatchReply(std::string_view payload,
                                                   size_t expected_count);

// --- moving shards (hash/wire.h kShardExport .. kShardDrop, kShardFill)
struct ShardList {
  std::vector<uint32_t> shards;
  uint8_t flags = 0;
};
std::string EncodeShardList(const ShardList& list);
// Shard numbers are checked against `num_shards` by the caller.
Result<ShardList> DecodeShardList(std::string_view payload);

struct ShardExport {
  uint32_t partition = 0;
  uint64_t generation = 0;
  uint64_t cursor = 0;
  uint32_t max_bytes = 0;
  std::vector<uint32_t> shards;
  std::string after;  // resume inside bucket `cursor` after this key
};
std::string EncodeShardExport(const ShardExport& request);
Result<ShardExport> DecodeShardExport(std::string_view payload);

// A pair of a moving shard; views into the decoded payload.
struct ShardPairView {
  std::string_view key;
  std::string_view value;
  uint64_t version = 0;
  bool deleted = false;
  bool fill = false;  // ShardPairKind::kFill
};
struct ShardPairs {
  uint64_t generation = 0;
  uint64_t cursor = 0;
  uint32_t num_partitions = 0;
  uint64_t max_version = 0;
  std::vector<ShardPairView> pairs;
};
// Builds a ShardPairs message item by item.
class ShardPairsWriter {
 public:
  ShardPairsWriter();
  void Add(std::string_view key, std::string_view value, uint64_t version,
           bool deleted);
  // A pair of a shard's copy to a backup being filled (ShardPairKind::kFill).
  void AddFill(std::string_view key, std::string_view value, uint64_t version);
  uint32_t count() const { return count_; }
  size_t bytes() const { return out_.size(); }
  std::string Finish(uint64_t generation, uint64_t cursor,
                     uint32_t num_partitions, uint64_t max_version);

 private:
  std::string out_;
  uint32_t count_ = 0;
};
Result<ShardPairs> DecodeShardPairs(std::string_view payload);

struct ShardFillProgress {
  bool done = false;
  uint64_t pairs_total = 0;
  uint64_t pairs_copied = 0;
};
std::string EncodeShardFillReply(const ShardFillProgress& progress);
Result<ShardFillProgress> DecodeShardFillReply(std::string_view payload);

}  // namespace remem::hash

#endif  // REMEM_HASH_CODEC_H_
