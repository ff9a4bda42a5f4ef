#include "hash/codec.h"

#include <cstddef>
#include <cstring>

#include "hash/layout.h"
#include "proto/buffer.h"

namespace remem::hash {

using proto::Append;
using proto::Bad;
using proto::kWireMagic;
using proto::kWireVersion;
using proto::Reader;

std::string EncodeHashInfo(const HashInfo& info) {
  HashInfoReply r{};
  r.magic = kWireMagic;
  r.version = kWireVersion;
  r.num_partitions = static_cast<uint32_t>(info.partitions.size());
  r.max_key = info.max_key;
  r.max_value = info.max_value;
  r.partition_seed = info.partition_seed;
  std::string out;
  Append(&out, r);
  for (const HashPartition& p : info.partitions) Append(&out, p);
  return out;
}

Result<HashInfo> DecodeHashInfo(std::string_view payload) {
  Reader rd(payload);
  HashInfoReply r;
  if (!rd.Read(&r)) return Bad("hash info truncated");
  if (r.magic != kWireMagic || r.version != kWireVersion) {
    return Bad("bad magic or version in hash info");
  }
  if (r.num_partitions == 0 || r.num_partitions > proto::kMaxRegions) {
    return Bad("hash info: partition count out of range");
  }
  HashInfo info;
  info.max_key = r.max_key;
  info.max_value = r.max_value;
  info.partition_seed = r.partition_seed;
  for (uint32_t i = 0; i < r.num_partitions; ++i) {
    HashPartition p;
    if (!rd.Read(&p)) return Bad("hash partition truncated");
    if (p.num_buckets < 2 || (p.num_buckets & (p.num_buckets - 1)) != 0 ||
        p.num_buckets > (1ull << 40)) {
      return Bad("hash partition: bucket count is not a power of two");
    }
    info.partitions.push_back(p);
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after hash info");
  return info;
}

std::string EncodeHashKey(std::string_view key, uint32_t flags) {
  HashKeyRequest r{};
  r.key_len = static_cast<uint32_t>(key.size());
  r.flags = flags;
  std::string out;
  Append(&out, r);
  out += key;
  return out;
}

Result<std::string_view> DecodeHashKey(std::string_view payload) {
  Reader rd(payload);
  HashKeyRequest r;
  if (!rd.Read(&r)) return Bad("hash key request truncated");
  if (rd.remaining() != r.key_len) return Bad("hash key length mismatch");
  return payload.substr(sizeof(r));
}

std::string EncodeHashPut(const HashPut& put) {
  HashPutRequest r{};
  r.key_len = static_cast<uint32_t>(put.key.size());
  r.value_len = static_cast<uint32_t>(put.value.size());
  r.mode = static_cast<uint8_t>(put.mode);
  r.expected_version = put.expected_version;
  std::string out;
  out.reserve(sizeof(r) + put.key.size() + put.value.size());
  Append(&out, r);
  out += put.key;
  out += put.value;
  return out;
}

Result<HashPut> DecodeHashPut(std::string_view payload) {
  Reader rd(payload);
  HashPutRequest r;
  if (!rd.Read(&r)) return Bad("hash put request truncated");
  if (r.mode > static_cast<uint8_t>(PutMode::kIfVersion)) {
    return Bad("hash put: unknown mode");
  }
  if (uint64_t{r.key_len} + r.value_len != rd.remaining()) {
    return Bad("hash put: lengths do not match the payload");
  }
  HashPut put;
  put.key = payload.substr(sizeof(r), r.key_len);
  put.value = payload.substr(sizeof(r) + r.key_len, r.value_len);
  put.mode = static_cast<PutMode>(r.mode);
  put.expected_version = r.expected_version;
  return put;
}

std::string EncodeHashGetReply(uint64_t version, std::string_view value) {
  HashGetReply r{};
  r.version = version;
  r.value_len = static_cast<uint32_t>(value.size());
  std::string out;
  out.reserve(sizeof(r) + value.size());
  Append(&out, r);
  out += value;
  return out;
}

Result<HashValue> DecodeHashGetReply(std::string_view payload) {
  Reader rd(payload);
  HashGetReply r;
  if (!rd.Read(&r)) return Bad("hash get reply truncated");
  if (rd.remaining() != r.value_len) return Bad("hash get reply length");
  return HashValue{r.version, std::string(payload.substr(sizeof(r)))};
}

std::string EncodeHashPutReply(uint64_t version) {
  std::string out;
  Append(&out, HashPutReply{version});
  return out;
}

Result<uint64_t> DecodeHashPutReply(std::string_view payload) {
  if (payload.size() != sizeof(HashPutReply)) return Bad("hash put reply size");
  HashPutReply r;
  std::memcpy(&r, payload.data(), sizeof(r));
  return r.version;
}

namespace {

Result<uint32_t> ReadMultiCount(Reader* rd) {
  HashMultiRequest r;
  if (!rd->Read(&r)) return Bad("hash multi request truncated");
  if (r.count == 0 || r.count > kMaxMultiItems) {
    return Bad("hash multi request: item count out of range");
  }
  return r.count;
}

std::string_view Take(std::string_view payload, size_t at, size_t n) {
  return payload.substr(at, n);
}

}  // namespace

uint32_t HashReadFlags(std::string_view payload) {
  if (payload.size() < sizeof(HashKeyRequest)) return 0;
  uint32_t flags;
  std::memcpy(&flags, payload.data() + offsetof(HashKeyRequest, flags),
              sizeof(flags));
  return flags;
}

std::string EncodeHashMultiGet(const std::vector<std::string_view>& keys,
                               uint32_t flags) {
  std::string out;
  Append(&out, HashMultiRequest{static_cast<uint32_t>(keys.size()), flags});
  for (std::string_view k : keys) {
    Append(&out, HashMultiKey{static_cast<uint32_t>(k.size())});
    out += k;
  }
  return out;
}

Result<std::vector<std::string_view>> DecodeHashMultiGet(
    std::string_view payload) {
  Reader rd(payload);
  auto count = ReadMultiCount(&rd);
  if (!count.ok()) return count.status();
  std::vector<std::string_view> keys;
  keys.reserve(*count);
  for (uint32_t i = 0; i < *count; ++i) {
    HashMultiKey k;
    if (!rd.Read(&k)) return Bad("hash multi-get item truncated");
    const size_t at = payload.size() - rd.remaining();
    if (!rd.Skip(k.key_len)) return Bad("hash multi-get key truncated");
    keys.push_back(Take(payload, at, k.key_len));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after multi-get items");
  return keys;
}

std::string EncodeHashMultiPut(const std::vector<KeyValue>& pairs) {
  std::string out;
  Append(&out, HashMultiRequest{static_cast<uint32_t>(pairs.size()), 0});
  for (const auto& [k, v] : pairs) {
    Append(&out, HashMultiPair{static_cast<uint32_t>(k.size()),
                               static_cast<uint32_t>(v.size())});
    out += k;
    out += v;
  }
  return out;
}

Result<std::vector<KeyValue>> DecodeHashMultiPut(std::string_view payload) {
  Reader rd(payload);
  auto count = ReadMultiCount(&rd);
  if (!count.ok()) return count.status();
  std::vector<KeyValue> pairs;
  pairs.reserve(*count);
  for (uint32_t i = 0; i < *count; ++i) {
    HashMultiPair p;
    if (!rd.Read(&p)) return Bad("hash multi-put item truncated");
    const size_t at = payload.size() - rd.remaining();
    if (!rd.Skip(uint64_t{p.key_len} + p.value_len)) {
      return Bad("hash multi-put pair truncated");
    }
    pairs.emplace_back(Take(payload, at, p.key_len),
                       Take(payload, at + p.key_len, p.value_len));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after multi-put items");
  return pairs;
}

std::string EncodeHashMultiOp(const std::vector<MultiOp>& ops, uint32_t flags) {
  size_t bytes = sizeof(HashMultiRequest);
  for (const MultiOp& o : ops) {
    bytes += sizeof(HashMultiOp) + o.key.size() + o.value.size();
  }
  std::string out;
  out.reserve(bytes);
  Append(&out, HashMultiRequest{static_cast<uint32_t>(ops.size()), flags});
  for (const MultiOp& o : ops) {
    HashMultiOp h{};
    h.op = static_cast<uint8_t>(o.op);
    h.key_len = static_cast<uint32_t>(o.key.size());
    h.value_len = static_cast<uint32_t>(o.value.size());
    Append(&out, h);
    out += o.key;
    out += o.value;
  }
  return out;
}

Result<std::vector<MultiOp>> DecodeHashMultiOp(std::string_view payload) {
  Reader rd(payload);
  auto count = ReadMultiCount(&rd);
  if (!count.ok()) return count.status();
  std::vector<MultiOp> ops;
  ops.reserve(*count);
  for (uint32_t i = 0; i < *count; ++i) {
    HashMultiOp h;
    if (!rd.Read(&h)) return Bad("hash multi-op item truncated");
    if (h.reserved != 0 || h.reserved2 != 0) {
      return Bad("hash multi-op item: reserved bytes set");
    }
    const auto op = static_cast<MultiOpKind>(h.op);
    if (op != MultiOpKind::kGet && op != MultiOpKind::kPut &&
        op != MultiOpKind::kDelete) {
      return Bad("hash multi-op item: unknown operation " +
                 std::to_string(h.op));
    }
    if (op != MultiOpKind::kPut && h.value_len != 0) {
      return Bad("hash multi-op item: a value with a get or delete");
    }
    const size_t at = payload.size() - rd.remaining();
    if (!rd.Skip(uint64_t{h.key_len} + h.value_len)) {
      return Bad("hash multi-op item truncated");
    }
    ops.push_back({op, Take(payload, at, h.key_len),
                   Take(payload, at + h.key_len, h.value_len)});
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after multi-op items");
  return ops;
}

std::string EncodeHashMultiReply(const std::vector<MultiItem>& items) {
  std::string out;
  Append(&out, HashMultiReply{static_cast<uint32_t>(items.size()), 0});
  for (const MultiItem& it : items) {
    const std::string& data = it.status.ok() ? it.data : it.status.message();
    HashMultiItem h{};
    h.status = static_cast<uint16_t>(it.status.code());
    h.data_len = static_cast<uint32_t>(data.size());
    h.version = it.version;
    Append(&out, h);
    out += data;
  }
  return out;
}

Result<std::vector<MultiItem>> DecodeHashMultiReply(std::string_view payload,
                                                    size_t expected_count) {
  Reader rd(payload);
  HashMultiReply r;
  if (!rd.Read(&r)) return Bad("hash multi reply truncated");
  if (r.count != expected_count) return Bad("hash multi reply: wrong count");
  // Untrusted count: bound it before allocating.
  if (r.count > kMaxMultiItems ||
      uint64_t{r.count} * sizeof(HashMultiItem) > rd.remaining()) {
    return Bad("hash multi reply: more items than bytes");
  }
  std::vector<MultiItem> items(r.count);
  for (MultiItem& it : items) {
    HashMultiItem h;
    if (!rd.Read(&h)) return Bad("hash multi reply item truncated");
    if (h.status > static_cast<uint16_t>(StatusCode::kMoved)) {
      return Bad("hash multi reply: unknown status");
    }
    std::string data;
    if (!rd.ReadBytes(h.data_len, &data)) {
      return Bad("hash multi reply data truncated");
    }
    const auto code = static_cast<StatusCode>(h.status);
    if (code == StatusCode::kOk) {
      it.data = std::move(data);
      it.version = h.version;
    } else {
      it.status = Status(code, std::move(data));
    }
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after multi reply");
  return items;
}

namespace {

void AppendOp(std::string* out, const ops::OpView& op) {
  HashOpRequest h{};
  h.op = static_cast<uint8_t>(op.kind);
  h.flags = op.flags;
  h.fn = op.fn;
  h.key_len = static_cast<uint32_t>(op.key.size());
  h.arg_len = static_cast<uint32_t>(op.arg.size());
  h.expected_len = static_cast<uint32_t>(op.expected.size());
  h.function_id = op.function_id;
  h.initial = op.initial;
  Append(out, h);
  *out += op.key;
  *out += op.arg;
  *out += op.expected;
}

// One HashOpRequest and its bytes, from `rd` over `payload`.
Result<ops::OpView> ReadOp(std::string_view payload, Reader* rd) {
  HashOpRequest h;
  if (!rd->Read(&h)) return Bad("hash op truncated");
  if (h.reserved != 0 || h.reserved2 != 0) {
    return Bad("hash op: reserved bytes set");
  }
  const size_t at = payload.size() - rd->remaining();
  if (!rd->Skip(uint64_t{h.key_len} + h.arg_len + h.expected_len)) {
    return Bad("hash op truncated");
  }
  ops::OpView op;
  op.kind = static_cast<OpKind>(h.op);
  op.flags = h.flags;
  op.fn = h.fn;
  op.function_id = h.function_id;
  op.initial = h.initial;
  op.key = Take(payload, at, h.key_len);
  op.arg = Take(payload, at + h.key_len, h.arg_len);
  op.expected = Take(payload, at + h.key_len + h.arg_len, h.expected_len);
  return op;
}

void AppendOpItem(std::string* out, const OpItem& it) {
  const std::string& data = it.status.ok() ? it.data : it.status.message();
  HashOpItem h{};
  h.status = static_cast<uint16_t>(it.status.code());
  h.applied = it.applied ? 1 : 0;
  h.data_len = static_cast<uint32_t>(data.size());
  h.version = it.version;
  Append(out, h);
  *out += data;
}

Result<OpItem> ReadOpItem(Reader* rd) {
  HashOpItem h;
  if (!rd->Read(&h)) return Bad("hash op reply truncated");
  if (h.status > static_cast<uint16_t>(StatusCode::kMoved) || h.applied > 1 ||
      h.reserved != 0) {
    return Bad("hash op reply: unknown status or flags");
  }
  std::string data;
  if (!rd->ReadBytes(h.data_len, &data)) {
    return Bad("hash op reply data truncated");
  }
  OpItem it;
  const auto code = static_cast<StatusCode>(h.status);
  if (code == StatusCode::kOk) {
    it.data = std::move(data);
    it.version = h.version;
    it.applied = h.applied != 0;
  } else {
    it.status = Status(code, std::move(data));
  }
  return it;
}

}  // namespace

std::string EncodeHashOp(const ops::OpView& op) {
  std::string out;
  AppendOp(&out, op);
  return out;
}

Result<ops::OpView> DecodeHashOp(std::string_view payload) {
  Reader rd(payload);
  auto op = ReadOp(payload, &rd);
  if (!op.ok()) return op.status();
  if (rd.remaining() != 0) return Bad("trailing bytes after hash op");
  return op;
}

std::string EncodeHashOpBatch(const std::vector<ops::OpView>& ops) {
  std::string out;
  Append(&out, HashMultiRequest{static_cast<uint32_t>(ops.size()), 0});
  for (const ops::OpView& op : ops) AppendOp(&out, op);
  return out;
}

Result<std::vector<ops::OpView>> DecodeHashOpBatch(std::string_view payload) {
  Reader rd(payload);
  auto count = ReadMultiCount(&rd);
  if (!count.ok()) return count.status();
  std::vector<ops::OpView> ops;
  ops.reserve(*count);
  for (uint32_t i = 0; i < *count; ++i) {
    auto op = ReadOp(payload, &rd);
    if (!op.ok()) return op.status();
    ops.push_back(*op);
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after hash op batch");
  return ops;
}

std::string EncodeHashOpReply(const OpItem& item) {
  std::string out;
  AppendOpItem(&out, item);
  return out;
}

Result<OpItem> DecodeHashOpReply(std::string_view payload) {
  Reader rd(payload);
  auto it = ReadOpItem(&rd);
  if (!it.ok()) return it.status();
  if (!it->status.ok()) return Bad("hash op reply: an error in a success");
  if (rd.remaining() != 0) return Bad("trailing bytes after hash op reply");
  return it;
}

std::string EncodeHashOpBatchReply(const std::vector<OpItem>& items) {
  std::string out;
  Append(&out, HashMultiReply{static_cast<uint32_t>(items.size()), 0});
  for (const OpItem& it : items) AppendOpItem(&out, it);
  return out;
}

Result<std::vector<OpItem>> DecodeHashOpBatchReply(std::string_view payload,
                                                   size_t expected_count) {
  Reader rd(payload);
  HashMultiReply r;
  if (!rd.Read(&r)) return Bad("hash op batch reply truncated");
  if (r.count != expected_count) {
    return Bad("hash op batch reply: wrong count");
  }
  if (r.count > kMaxMultiItems ||
      uint64_t{r.count} * sizeof(HashOpItem) > rd.remaining()) {
    return Bad("hash op batch reply: more items than bytes");
  }
  std::vector<OpItem> items;
  items.reserve(r.count);
  for (uint32_t i = 0; i < r.count; ++i) {
    auto it = ReadOpItem(&rd);
    if (!it.ok()) return it.status();
    items.push_back(std::move(*it));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after op batch reply");
  return items;
}

// --- moving shards

namespace {

Status ReadShardNumbers(Reader* rd, uint32_t count,
                        std::vector<uint32_t>* out) {
  if (count == 0 || count > kMaxShardList) return Bad("bad shard count");
  if (rd->remaining() != uint64_t{count} * sizeof(uint32_t)) {
    return Bad("shard list length");
  }
  out->resize(count);
  for (uint32_t& s : *out) (void)rd->Read(&s);
  return Status::OK();
}

}  // namespace

std::string EncodeShardList(const ShardList& list) {
  std::string out;
  ShardListRequest h{};
  h.count = uint32_t(list.shards.size());
  h.flags = list.flags;
  Append(&out, h);
  for (uint32_t s : list.shards) Append(&out, s);
  return out;
}

Result<ShardList> DecodeShardList(std::string_view payload) {
  Reader rd(payload);
  ShardListRequest h;
  if (!rd.Read(&h)) return Bad("shard list truncated");
  if (h.reserved[0] || h.reserved[1] || h.reserved[2] ||
      (h.flags &
       ~(kShardFreeze | kShardRelease | kShardForFill | kShardForget)) != 0) {
    return Bad("shard list: reserved bits set");
  }
  ShardList out;
  out.flags = h.flags;
  REMEM_RETURN_IF_ERROR(ReadShardNumbers(&rd, h.count, &out.shards));
  return out;
}

std::string EncodeShardExport(const ShardExport& r) {
  std::string out;
  ShardExportRequest h{};
  h.partition = r.partition;
  h.count = uint32_t(r.shards.size());
  h.generation = r.generation;
  h.cursor = r.cursor;
  h.max_bytes = r.max_bytes;
  h.after_len = uint32_t(r.after.size());
  Append(&out, h);
  for (uint32_t s : r.shards) Append(&out, s);
  out.append(r.after);
  return out;
}

Result<ShardExport> DecodeShardExport(std::string_view payload) {
  Reader rd(payload);
  ShardExportRequest h;
  if (!rd.Read(&h)) return Bad("shard export request truncated");
  if (h.after_len > Limits{}.max_key) {
    return Bad("shard export: resume key too long");
  }
  if ((h.cursor & kShardCursorInBucket) != 0) {
    return Bad("shard export: cursor past any table");
  }
  ShardExport out;
  out.partition = h.partition;
  out.generation = h.generation;
  out.cursor = h.cursor;
  out.max_bytes = h.max_bytes;
  // The resume key is the last h.after_len bytes; the shard numbers all
  // that comes before it.
  if (rd.remaining() < h.after_len) {
    return Bad("shard export: resume key truncated");
  }
  Reader shards(payload.substr(rd.position(), rd.remaining() - h.after_len));
  REMEM_RETURN_IF_ERROR(ReadShardNumbers(&shards, h.count, &out.shards));
  out.after.assign(payload.substr(payload.size() - h.after_len));
  return out;
}

ShardPairsWriter::ShardPairsWriter() { out_.resize(sizeof(ShardPairsHeader)); }

void ShardPairsWriter::Add(std::string_view key, std::string_view value,
                           uint64_t version, bool deleted) {
  ShardPair p{};
  p.version = version;
  p.key_len = uint32_t(key.size());
  p.value_len = deleted ? 0 : uint32_t(value.size());
  p.kind = static_cast<uint8_t>(deleted ? ShardPairKind::kDeleted
                                        : ShardPairKind::kPut);
  Append(&out_, p);
  out_ += key;
  if (!deleted) out_ += value;
  ++count_;
}

void ShardPairsWriter::AddFill(std::string_view key, std::string_view value,
                               uint64_t version) {
  ShardPair p{};
  p.version = version;
  p.key_len = uint32_t(key.size());
  p.value_len = uint32_t(value.size());
  p.kind = static_cast<uint8_t>(ShardPairKind::kFill);
  Append(&out_, p);
  out_ += key;
  out_ += value;
  ++count_;
}

std::string ShardPairsWriter::Finish(uint64_t generation, uint64_t cursor,
                                     uint32_t num_partitions,
                                     uint64_t max_version) {
  ShardPairsHeader h{};
  h.generation = generation;
  h.cursor = cursor;
  h.count = count_;
  h.num_partitions = num_partitions;
  h.max_version = max_version;
  std::memcpy(out_.data(), &h, sizeof(h));
  count_ = 0;
  std::string done = std::move(out_);
  out_.assign(sizeof(ShardPairsHeader), '\0');
  return done;
}

Result<ShardPairs> DecodeShardPairs(std::string_view payload) {
  Reader rd(payload);
  ShardPairsHeader h;
  if (!rd.Read(&h)) return Bad("shard pairs truncated");
  // Every pair takes at least its header and a byte of key.
  if (h.count > rd.remaining() / (sizeof(ShardPair) + 1)) {
    return Bad("shard pairs: count beyond the payload");
  }
  ShardPairs out;
  out.generation = h.generation;
  out.cursor = h.cursor;
  out.num_partitions = h.num_partitions;
  out.max_version = h.max_version;
  out.pairs.reserve(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    ShardPair p;
    if (!rd.Read(&p)) return Bad("shard pair truncated");
    if (p.kind > static_cast<uint8_t>(ShardPairKind::kFill) || p.key_len == 0 ||
        p.reserved[0] || p.reserved[1] || p.reserved[2] || p.reserved[3] ||
        p.reserved[4] || p.reserved[5] || p.reserved[6]) {
      return Bad("shard pair: bad header");
    }
    const bool deleted =
        p.kind == static_cast<uint8_t>(ShardPairKind::kDeleted);
    if (deleted && p.value_len != 0)
      return Bad("shard pair: deleted with a value");
    const size_t at = payload.size() - rd.remaining();
    if (!rd.Skip(uint64_t{p.key_len} + p.value_len)) {
      return Bad("shard pair truncated");
    }
    out.pairs.push_back({Take(payload, at, p.key_len),
                         Take(payload, at + p.key_len, p.value_len), p.version,
                         deleted,
                         p.kind == static_cast<uint8_t>(ShardPairKind::kFill)});
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after shard pairs");
  return out;
}

std::string EncodeShardFillReply(const ShardFillProgress& progress) {
  ShardFillReply r{};
  r.done = progress.done ? 1 : 0;
  r.pairs_total = progress.pairs_total;
  r.pairs_copied = progress.pairs_copied;
  std::string out;
  Append(&out, r);
  return out;
}

Result<ShardFillProgress> DecodeShardFillReply(std::string_view payload) {
  Reader rd(payload);
  ShardFillReply r;
  if (!rd.Read(&r) || rd.remaining() != 0) {
    return Bad("shard fill reply: bad length");
  }
  if (r.done > 1 || r.reserved != 0 || r.pairs_copied > r.pairs_total) {
    return Bad("shard fill reply: bad fields");
  }
  return ShardFillProgress{r.done != 0, r.pairs_total, r.pairs_copied};
}

}  // namespace remem::hash
