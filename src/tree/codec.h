// Encoders and validating decoders for the ordered store's payloads
// (tree/wire.h), on the helpers of proto/buffer.h. Every decoder takes
// untrusted bytes and returns ProtocolError with a reason instead of
// reading past the end; fuzz/proto_fuzz.cc drives them.
//
// Thread contract: pure functions.

#ifndef REMEM_TREE_CODEC_H_
#define REMEM_TREE_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/status.h"
#include "tree/search.h"
#include "tree/wire.h"

namespace remem::tree {

// The most items one scan page holds.
inline constexpr uint32_t kMaxScanLimit = 10000;

struct TreeInfo {
  uint32_t region = 0;
  uint32_t max_key = 0;
  uint32_t max_value = 0;
  uint32_t max_scan = 0;
};
std::string EncodeTreeInfo(const TreeInfo& info);
// Also checks the layout: node size and layout version must be this
// build's.
Result<TreeInfo> DecodeTreeInfo(std::string_view payload);

std::string EncodeTreeKey(std::string_view key);
Result<std::string_view> DecodeTreeKey(std::string_view payload);

struct TreePut {
  std::string_view key;
  std::string_view value;
  PutMode mode = PutMode::kUpsert;
  uint64_t expected_version = 0;
};
std::string EncodeTreePut(const TreePut& put);
inline std::string EncodePutFor(std::string_view key, std::string_view value,
                                PutMode mode, uint64_t expected) {
  TreePut p;
  p.key = key;
  p.value = value;
  p.mode = mode;
  p.expected_version = expected;
  return EncodeTreePut(p);
}
Result<TreePut> DecodeTreePut(std::string_view payload);

std::string EncodeTreeGetReply(uint64_t version, std::string_view value);
Result<std::pair<uint64_t, std::string>> DecodeTreeGetReply(
    std::string_view payload);
std::string EncodeTreePutReply(uint64_t version);
Result<uint64_t> DecodeTreePutReply(std::string_view payload);
struct TreeRangeFillProgress {
  bool done = false;
  uint64_t copied = 0;
};
std::string EncodeTreeRangeFillReply(const TreeRangeFillProgress& progress);
Result<TreeRangeFillProgress> DecodeTreeRangeFillReply(
    std::string_view payload);

struct TreeScan {
  std::string_view start;
  std::string_view end;  // empty: unbounded
  uint32_t limit = 0;
  bool descending = false;
};
std::string EncodeTreeScan(const TreeScan& scan);
// Checks the framing only (lengths, flags); the range and limit are the
// service's to judge.
Result<TreeScan> DecodeTreeScan(std::string_view payload);
std::string EncodeTreeScanReply(const ScanPage& page);
Result<ScanPage> DecodeTreeScanReply(std::string_view payload);
// The same into *page, reusing its storage (as ScanRange); on an error the
// page is empty.
Status DecodeTreeScanReply(std::string_view payload, ScanPage* page);

// A batch of gets (TreeMethod::kMultiGet). The decoder checks the framing
// (count 1..kMaxMultiGetKeys, every length within the payload); the keys'
// sizes are the service's to judge.
std::string EncodeTreeMultiGet(const std::vector<std::string_view>& keys);
Result<std::vector<std::string_view>> DecodeTreeMultiGet(
    std::string_view payload);
// The reply, built an item at a time.
class TreeMultiReplyWriter {
 public:
  explicit TreeMultiReplyWriter(uint32_t count);
  void AddValue(uint64_t version, std::string_view value);
  // A put's result: its new version.
  void AddVersion(uint64_t version) { AddValue(version, {}); }
  void AddError(const Status& status);
  size_t bytes() const { return out_.size(); }
  std::string Finish() { return std::move(out_); }

 private:
  std::string out_;
};
// One result per key: a value and version, or the item's error. The count
// must be `expected`.
Result<std::vector<Result<TreeStore::Value>>> DecodeTreeMultiGetReply(
    std::string_view payload, size_t expected);

// A batch of puts (TreeMethod::kMultiPut): framing checked as for
// multi-gets (count 1..kMaxMultiGetKeys, lengths within the payload); the
// pairs' sizes are the service's to judge. The reply is a
// TreeMultiReplyWriter's, AddVersion or AddError per pair.
using KeyValueView = std::pair<std::string_view, std::string_view>;
std::string EncodeTreeMultiPut(const std::vector<KeyValueView>& pairs);
Result<std::vector<KeyValueView>> DecodeTreeMultiPut(std::string_view payload);
// One result per pair: its new version, or its error. The count must be
// `expected`.
Result<std::vector<Result<uint64_t>>> DecodeTreeMultiPutReply(
    std::string_view payload, size_t expected);

// Range moves (wire.h, TreeRangeRequest).
struct TreeRange {
  uint32_t range = 0;
  uint8_t flags = 0;        // TreeRangeFlags
  std::string_view resume;  // Export: where to go on from ("": the start)
};
std::string EncodeTreeRange(const TreeRange& req);
Result<TreeRange> DecodeTreeRange(std::string_view payload);

struct RangeItem {
  std::string_view key;
  std::string_view value;
  uint64_t version = 0;
  bool deleted = false;
  bool fill = false;  // kRangeItemFill
};
struct RangePairs {
  std::vector<RangeItem> items;  // views into the decoded payload
  std::string_view resume;
  uint64_t max_version = 0;
  bool more = false;
  uint64_t sender = 0;  // a Replicate's stream (wire.h)
};
class RangePairsWriter {
 public:
  void Add(std::string_view key, std::string_view value, uint64_t version,
           bool deleted);
  // A pair of a range's copy to a backup being filled (kRangeItemFill).
  void AddFill(std::string_view key, std::string_view value, uint64_t version);
  size_t bytes() const { return body_.size(); }
  size_t count() const { return count_; }
  std::string Finish(std::string_view resume, uint64_t max_version, bool more,
                     uint64_t sender = 0);

 private:
  std::string body_;
  uint32_t count_ = 0;
};
// Validates every length; keys 1..kMaxKey bytes, values up to kMaxValue.
Result<RangePairs> DecodeRangePairs(std::string_view payload);

}  // namespace remem::tree

#endif  // REMEM_TREE_CODEC_H_
