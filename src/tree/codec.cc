#include "tree/codec.h"

#include "proto/buffer.h"
#include "tree/layout.h"

namespace remem::tree {

using proto::Append;
using proto::Bad;
using proto::Reader;

std::string EncodeTreeInfo(const TreeInfo& info) {
  TreeInfoReply r{};
  r.magic = proto::kWireMagic;
  r.version = proto::kWireVersion;
  r.layout_version = kTreeLayoutVersion;
  r.region = info.region;
  r.node_bytes = kNodeBytes;
  r.max_key = info.max_key;
  r.max_value = info.max_value;
  r.max_scan = info.max_scan;
  std::string out;
  Append(&out, r);
  return out;
}

Result<TreeInfo> DecodeTreeInfo(std::string_view payload) {
  Reader rd(payload);
  TreeInfoReply r;
  if (!rd.Read(&r)) return Bad("tree info truncated");
  if (rd.remaining() != 0) return Bad("trailing bytes after tree info");
  if (r.magic != proto::kWireMagic || r.version != proto::kWireVersion) {
    return Bad("bad magic or version in tree info");
  }
  if (r.layout_version != kTreeLayoutVersion || r.node_bytes != kNodeBytes) {
    return Bad("tree info: a node layout this client does not read");
  }
  if (r.max_key == 0 || r.max_key > kMaxKey || r.max_value > kMaxValue ||
      r.max_scan == 0 || r.max_scan > kMaxScanLimit) {
    return Bad("tree info: limits out of range");
  }
  return TreeInfo{r.region, r.max_key, r.max_value, r.max_scan};
}

std::string EncodeTreeKey(std::string_view key) {
  TreeKeyRequest r{};
  r.key_len = uint32_t(key.size());
  std::string out;
  Append(&out, r);
  out += key;
  return out;
}

Result<std::string_view> DecodeTreeKey(std::string_view payload) {
  Reader rd(payload);
  TreeKeyRequest r;
  if (!rd.Read(&r)) return Bad("tree key request truncated");
  if (r.reserved != 0) return Bad("tree key request: reserved bytes set");
  if (rd.remaining() != r.key_len) return Bad("tree key length mismatch");
  return payload.substr(sizeof(r));
}

std::string EncodeTreePut(const TreePut& put) {
  TreePutRequest r{};
  r.key_len = uint32_t(put.key.size());
  r.value_len = uint32_t(put.value.size());
  r.mode = uint8_t(put.mode);
  r.expected_version = put.expected_version;
  std::string out;
  out.reserve(sizeof(r) + put.key.size() + put.value.size());
  Append(&out, r);
  out += put.key;
  out += put.value;
  return out;
}

Result<TreePut> DecodeTreePut(std::string_view payload) {
  Reader rd(payload);
  TreePutRequest r;
  if (!rd.Read(&r)) return Bad("tree put request truncated");
  if (r.mode > uint8_t(PutMode::kIfVersion))
    return Bad("tree put: unknown mode");
  if (uint64_t{r.key_len} + r.value_len != rd.remaining()) {
    return Bad("tree put: lengths do not match the payload");
  }
  TreePut put;
  put.key = payload.substr(sizeof(r), r.key_len);
  put.value = payload.substr(sizeof(r) + r.key_len, r.value_len);
  put.mode = PutMode(r.mode);
  put.expected_version = r.expected_version;
  return put;
}

std::string EncodeTreeGetReply(uint64_t version, std::string_view value) {
  TreeGetReply r{};
  r.version = version;
  r.value_len = uint32_t(value.size());
  std::string out;
  Append(&out, r);
  out += value;
  return out;
}

Result<std::pair<uint64_t, std::string>> DecodeTreeGetReply(
    std::string_view payload) {
  Reader rd(payload);
  TreeGetReply r;
  if (!rd.Read(&r)) return Bad("tree get reply truncated");
  if (rd.remaining() != r.value_len) return Bad("tree get reply length");
  return std::make_pair(r.version, std::string(payload.substr(sizeof(r))));
}

std::string EncodeTreePutReply(uint64_t version) {
  TreePutReply r{version};
  std::string out;
  Append(&out, r);
  return out;
}

Result<uint64_t> DecodeTreePutReply(std::string_view payload) {
  Reader rd(payload);
  TreePutReply r;
  if (!rd.Read(&r) || rd.remaining() != 0) return Bad("tree put reply length");
  return r.version;
}

std::string EncodeTreeRangeFillReply(const TreeRangeFillProgress& progress) {
  TreeRangeFillReply r{};
  r.done = progress.done ? 1 : 0;
  r.copied = progress.copied;
  std::string out;
  Append(&out, r);
  return out;
}

Result<TreeRangeFillProgress> DecodeTreeRangeFillReply(
    std::string_view payload) {
  Reader rd(payload);
  TreeRangeFillReply r;
  if (!rd.Read(&r) || rd.remaining() != 0 || r.done > 1 || r.reserved != 0) {
    return Bad("tree range fill reply");
  }
  return TreeRangeFillProgress{r.done != 0, r.copied};
}

std::string EncodeTreeScan(const TreeScan& scan) {
  TreeScanRequest r{};
  r.start_len = uint32_t(scan.start.size());
  r.end_len = uint32_t(scan.end.size());
  r.limit = scan.limit;
  r.flags = scan.descending ? kScanDescending : 0;
  std::string out;
  Append(&out, r);
  out += scan.start;
  out += scan.end;
  return out;
}

Result<TreeScan> DecodeTreeScan(std::string_view payload) {
  Reader rd(payload);
  TreeScanRequest r;
  if (!rd.Read(&r)) return Bad("tree scan request truncated");
  if ((r.flags & ~kScanDescending) != 0) return Bad("tree scan: unknown flags");
  if (uint64_t{r.start_len} + r.end_len != rd.remaining()) {
    return Bad("tree scan: lengths do not match the payload");
  }
  TreeScan s;
  s.start = payload.substr(sizeof(r), r.start_len);
  s.end = payload.substr(sizeof(r) + r.start_len, r.end_len);
  s.limit = r.limit;
  s.descending = (r.flags & kScanDescending) != 0;
  return s;
}

std::string EncodeTreeScanReply(const ScanPage& page) {
  TreeScanReply r{};
  r.count = uint32_t(page.items.size());
  r.resume_len = uint32_t(page.resume.size());
  r.flags = page.more ? kScanMore : 0;
  size_t bytes = sizeof(r) + page.resume.size();
  for (const ScanItem& it : page.items) {
    bytes += sizeof(TreeScanItem) + it.key.size() + it.value.size();
  }
  std::string out;
  out.reserve(bytes);
  Append(&out, r);
  out += page.resume;
  for (const ScanItem& it : page.items) {
    TreeScanItem h{};
    h.key_len = uint32_t(it.key.size());
    h.value_len = uint32_t(it.value.size());
    h.version = it.version;
    Append(&out, h);
    out += it.key;
    out += it.value;
  }
  return out;
}

namespace {

Status DecodeScanReplyInto(std::string_view payload, ScanPage* page) {
  Reader rd(payload);
  TreeScanReply r;
  if (!rd.Read(&r)) return Bad("tree scan reply truncated");
  if ((r.flags & ~kScanMore) != 0) return Bad("tree scan reply: unknown flags");
  if (r.count > kMaxScanLimit) return Bad("tree scan reply: too many items");
  if (r.resume_len > kMaxKey + 1) return Bad("tree scan reply: resume key");
  page->more = (r.flags & kScanMore) != 0;
  if (!rd.ReadBytes(r.resume_len, &page->resume)) {
    return Bad("tree scan reply: resume key truncated");
  }
  ResizePage(page, r.count);
  for (ScanItem& it : page->items) {
    TreeScanItem h;
    if (!rd.Read(&h)) return Bad("tree scan item truncated");
    if (h.key_len > kMaxKey || h.value_len > kMaxValue) {
      return Bad("tree scan item: lengths out of range");
    }
    if (!rd.ReadBytes(h.key_len, &it.key) ||
        !rd.ReadBytes(h.value_len, &it.value)) {
      return Bad("tree scan item truncated");
    }
    it.version = h.version;
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree scan reply");
  return Status::OK();
}

}  // namespace

Status DecodeTreeScanReply(std::string_view payload, ScanPage* page) {
  Status st = DecodeScanReplyInto(payload, page);
  if (!st.ok()) ClearPage(page);
  return st;
}

Result<ScanPage> DecodeTreeScanReply(std::string_view payload) {
  ScanPage page;
  REMEM_RETURN_IF_ERROR(DecodeScanReplyInto(payload, &page));
  return page;
}

std::string EncodeTreeMultiGet(const std::vector<std::string_view>& keys) {
  TreeMultiRequest r{};
  r.count = uint32_t(keys.size());
  size_t bytes = sizeof(r);
  for (std::string_view k : keys) bytes += sizeof(TreeKeyRequest) + k.size();
  std::string out;
  out.reserve(bytes);
  Append(&out, r);
  for (std::string_view k : keys) {
    TreeKeyRequest h{};
    h.key_len = uint32_t(k.size());
    Append(&out, h);
    out += k;
  }
  return out;
}

Result<std::vector<std::string_view>> DecodeTreeMultiGet(
    std::string_view payload) {
  Reader rd(payload);
  TreeMultiRequest r;
  if (!rd.Read(&r)) return Bad("tree multi-get truncated");
  if (r.reserved != 0) return Bad("tree multi-get: reserved bytes set");
  if (r.count == 0 || r.count > kMaxMultiGetKeys) {
    return Bad("tree multi-get: 1.." + std::to_string(kMaxMultiGetKeys) +
               " keys");
  }
  std::vector<std::string_view> keys(r.count);
  for (std::string_view& key : keys) {
    TreeKeyRequest h;
    if (!rd.Read(&h)) return Bad("tree multi-get item truncated");
    if (h.reserved != 0) return Bad("tree multi-get item: reserved bytes set");
    if (!rd.View(h.key_len, &key)) return Bad("tree multi-get key truncated");
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree multi-get");
  return keys;
}

std::string EncodeTreeMultiPut(const std::vector<KeyValueView>& pairs) {
  TreeMultiRequest r{};
  r.count = uint32_t(pairs.size());
  size_t bytes = sizeof(r);
  for (const auto& [k, v] : pairs) {
    bytes += sizeof(TreeMultiPutItem) + k.size() + v.size();
  }
  std::string out;
  out.reserve(bytes);
  Append(&out, r);
  for (const auto& [k, v] : pairs) {
    TreeMultiPutItem h{};
    h.key_len = uint32_t(k.size());
    h.value_len = uint32_t(v.size());
    Append(&out, h);
    out += k;
    out += v;
  }
  return out;
}

Result<std::vector<KeyValueView>> DecodeTreeMultiPut(std::string_view payload) {
  Reader rd(payload);
  TreeMultiRequest r;
  if (!rd.Read(&r)) return Bad("tree multi-put truncated");
  if (r.reserved != 0) return Bad("tree multi-put: reserved bytes set");
  if (r.count == 0 || r.count > kMaxMultiGetKeys) {
    return Bad("tree multi-put: 1.." + std::to_string(kMaxMultiGetKeys) +
               " pairs");
  }
  std::vector<KeyValueView> pairs(r.count);
  for (auto& [key, value] : pairs) {
    TreeMultiPutItem h;
    if (!rd.Read(&h)) return Bad("tree multi-put item truncated");
    if (!rd.View(h.key_len, &key) || !rd.View(h.value_len, &value)) {
      return Bad("tree multi-put pair truncated");
    }
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree multi-put");
  return pairs;
}

Result<std::vector<Result<uint64_t>>> DecodeTreeMultiPutReply(
    std::string_view payload, size_t expected) {
  Reader rd(payload);
  TreeMultiReply r;
  if (!rd.Read(&r)) return Bad("tree multi-put reply truncated");
  if (r.reserved != 0 || r.count != expected || r.count > kMaxMultiGetKeys) {
    return Bad("tree multi-put reply: another count than the request's");
  }
  std::vector<Result<uint64_t>> out;
  out.reserve(r.count);
  for (uint32_t i = 0; i < r.count; ++i) {
    TreeMultiItem h;
    std::string message;
    if (!rd.Read(&h) || !rd.ReadBytes(h.value_len, &message)) {
      return Bad("tree multi-put reply item truncated");
    }
    if (h.status == 0) {
      if (h.value_len != 0) return Bad("tree multi-put reply: a value");
      out.push_back(h.version);
    } else if (h.status < 0 || h.status > int32_t(StatusCode::kMoved)) {
      return Bad("tree multi-put reply: unknown status");
    } else {
      out.push_back(Status(StatusCode(h.status), std::move(message)));
    }
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree multi-put");
  return out;
}

TreeMultiReplyWriter::TreeMultiReplyWriter(uint32_t count) {
  TreeMultiReply r{};
  r.count = count;
  Append(&out_, r);
}

void TreeMultiReplyWriter::AddValue(uint64_t version, std::string_view value) {
  TreeMultiItem h{};
  h.status = 0;
  h.value_len = uint32_t(value.size());
  h.version = version;
  Append(&out_, h);
  out_ += value;
}

void TreeMultiReplyWriter::AddError(const Status& status) {
  TreeMultiItem h{};
  h.status = int32_t(status.code());
  h.value_len = uint32_t(status.message().size());
  Append(&out_, h);
  out_ += status.message();
}

Result<std::vector<Result<TreeStore::Value>>> DecodeTreeMultiGetReply(
    std::string_view payload, size_t expected) {
  Reader rd(payload);
  TreeMultiReply r;
  if (!rd.Read(&r)) return Bad("tree multi-get reply truncated");
  if (r.reserved != 0 || r.count != expected || r.count > kMaxMultiGetKeys) {
    return Bad("tree multi-get reply: another count than the request's");
  }
  std::vector<Result<TreeStore::Value>> out;
  out.reserve(r.count);
  for (uint32_t i = 0; i < r.count; ++i) {
    TreeMultiItem h;
    std::string bytes;
    if (!rd.Read(&h) || !rd.ReadBytes(h.value_len, &bytes)) {
      return Bad("tree multi-get reply item truncated");
    }
    if (h.status == 0) {
      out.push_back(TreeStore::Value{std::move(bytes), h.version});
    } else if (h.status < 0 || h.status > int32_t(StatusCode::kMoved)) {
      return Bad("tree multi-get reply: unknown status");
    } else {
      out.push_back(Status(StatusCode(h.status), std::move(bytes)));
    }
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree multi-get");
  return out;
}

std::string EncodeTreeRange(const TreeRange& req) {
  TreeRangeRequest h{};
  h.range = req.range;
  h.resume_len = uint32_t(req.resume.size());
  h.flags = req.flags;
  std::string out;
  out.reserve(sizeof(h) + req.resume.size());
  Append(&out, h);
  out += req.resume;
  return out;
}

Result<TreeRange> DecodeTreeRange(std::string_view payload) {
  Reader rd(payload);
  TreeRangeRequest h;
  if (!rd.Read(&h)) return Bad("tree range request truncated");
  for (uint8_t b : h.reserved) {
    if (b != 0) return Bad("tree range request: reserved bytes set");
  }
  if ((h.flags &
       ~(kRangeFirst | kRangeFreeze | kRangeRelease | kRangeForFill)) != 0) {
    return Bad("tree range request: unknown flags");
  }
  if (h.resume_len > kMaxKey) return Bad("tree range request: resume key");
  TreeRange req;
  req.range = h.range;
  req.flags = h.flags;
  if (!rd.View(h.resume_len, &req.resume)) {
    return Bad("tree range request: resume key truncated");
  }
  if (rd.remaining() != 0)
    return Bad("trailing bytes after tree range request");
  return req;
}

void RangePairsWriter::Add(std::string_view key, std::string_view value,
                           uint64_t version, bool deleted) {
  TreeRangeItem h{};
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.version = version;
  h.flags = deleted ? kRangeItemDeleted : 0;
  Append(&body_, h);
  body_ += key;
  body_ += value;
  ++count_;
}

void RangePairsWriter::AddFill(std::string_view key, std::string_view value,
                               uint64_t version) {
  TreeRangeItem h{};
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.version = version;
  h.flags = kRangeItemFill;
  Append(&body_, h);
  body_ += key;
  body_ += value;
  ++count_;
}

std::string RangePairsWriter::Finish(std::string_view resume,
                                     uint64_t max_version, bool more,
                                     uint64_t sender) {
  TreeRangePairs h{};
  h.count = count_;
  h.resume_len = uint32_t(resume.size());
  h.max_version = max_version;
  h.sender = sender;
  h.flags = more ? kRangeMore : 0;
  std::string out;
  out.reserve(sizeof(h) + resume.size() + body_.size());
  Append(&out, h);
  out += resume;
  out += body_;
  body_.clear();
  count_ = 0;
  return out;
}

Result<RangePairs> DecodeRangePairs(std::string_view payload) {
  Reader rd(payload);
  TreeRangePairs h;
  if (!rd.Read(&h)) return Bad("tree range pairs truncated");
  for (uint8_t b : h.reserved) {
    if (b != 0) return Bad("tree range pairs: reserved bytes set");
  }
  if ((h.flags & ~kRangeMore) != 0)
    return Bad("tree range pairs: unknown flags");
  if (h.resume_len > kMaxKey) return Bad("tree range pairs: resume key");
  // Each item takes at least its header and a byte of key.
  if (h.count > rd.remaining() / (sizeof(TreeRangeItem) + 1)) {
    return Bad("tree range pairs: more items than bytes");
  }
  RangePairs out;
  out.max_version = h.max_version;
  out.more = (h.flags & kRangeMore) != 0;
  out.sender = h.sender;
  if (!rd.View(h.resume_len, &out.resume)) {
    return Bad("tree range pairs: resume key truncated");
  }
  out.items.resize(h.count);
  for (RangeItem& it : out.items) {
    TreeRangeItem ih;
    if (!rd.Read(&ih)) return Bad("tree range item truncated");
    for (uint8_t b : ih.reserved) {
      if (b != 0) return Bad("tree range item: reserved bytes set");
    }
    if ((ih.flags & ~(kRangeItemDeleted | kRangeItemFill)) != 0 ||
        ih.flags == (kRangeItemDeleted | kRangeItemFill)) {
      return Bad("tree range item: unknown flags");
    }
    it.deleted = (ih.flags & kRangeItemDeleted) != 0;
    it.fill = (ih.flags & kRangeItemFill) != 0;
    if (ih.key_len == 0 || ih.key_len > kMaxKey || ih.value_len > kMaxValue ||
        (it.deleted && ih.value_len != 0)) {
      return Bad("tree range item: bad lengths");
    }
    it.version = ih.version;
    if (!rd.View(ih.key_len, &it.key) || !rd.View(ih.value_len, &it.value)) {
      return Bad("tree range item truncated");
    }
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after tree range pairs");
  return out;
}

}  // namespace remem::tree
