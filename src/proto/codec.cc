#include "proto/codec.h"

#include <cstring>
#include <utility>
#include <vector>

namespace remem::proto {

namespace {

template <typename T>
void Append(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// Reads fixed structs and byte runs from untrusted input, never past the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Read(T* out) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(out, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadBytes(size_t n, std::string* out) {
    if (in_.size() - pos_ < n) return false;
    out->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (in_.size() - pos_ < n) return false;
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

Status Bad(std::string what) { return Status::ProtocolError(std::move(what)); }

}  // namespace

RpcHeader MakeHeader(Opcode op, uint64_t request_id, uint64_t payload_len,
                     bool reply, StatusCode status) {
  RpcHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.opcode = static_cast<uint16_t>(op);
  h.flags = reply ? kFlagReply : 0;
  h.status = static_cast<int32_t>(status);
  h.request_id = request_id;
  h.payload_len = payload_len;
  return h;
}

Result<RpcHeader> DecodeHeader(const void* data, size_t len, size_t data_len) {
  if (data == nullptr || len != sizeof(RpcHeader)) {
    return Bad("rpc header is " + std::to_string(len) + " bytes, expected " +
               std::to_string(sizeof(RpcHeader)));
  }
  RpcHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kWireMagic) return Bad("bad magic in rpc header");
  if (h.version != kWireVersion) {
    return Bad("unsupported wire version " + std::to_string(h.version) +
               " (this build speaks " + std::to_string(kWireVersion) + ")");
  }
  if (h.opcode == 0 || h.opcode > kMaxOpcode) {
    return Bad("unknown opcode " + std::to_string(h.opcode));
  }
  if ((h.flags & ~kFlagReply) != 0 || h.reserved != 0) {
    return Bad("unknown flags in rpc header");
  }
  if (h.payload_len != data_len) {
    return Bad("payload length " + std::to_string(data_len) +
               " does not match header " + std::to_string(h.payload_len));
  }
  if (h.payload_len > kMaxRpcPayload) return Bad("payload too large");
  return h;
}

std::string EncodeHelloRequest(const Hello& hello) {
  HelloRequest r{};
  r.magic = kWireMagic;
  r.version = hello.version;
  r.secret_len = static_cast<uint32_t>(hello.secret.size());
  std::string out;
  out.reserve(sizeof(r) + hello.secret.size());
  Append(&out, r);
  out += hello.secret;
  return out;
}

Result<Hello> DecodeHelloRequest(std::string_view payload) {
  Reader rd(payload);
  HelloRequest r;
  if (!rd.Read(&r)) return Bad("hello request truncated");
  if (r.magic != kWireMagic) return Bad("bad magic in hello request");
  if (r.secret_len > kMaxSecretBytes) return Bad("hello secret too long");
  Hello hello;
  hello.version = r.version;
  if (!rd.ReadBytes(r.secret_len, &hello.secret)) {
    return Bad("hello secret truncated");
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after hello request");
  return hello;
}

std::string EncodeHelloReply(const HelloReplyInfo& info) {
  HelloReply r{};
  r.magic = kWireMagic;
  r.version = kWireVersion;
  r.incarnation = info.incarnation;
  r.max_payload = info.max_payload;
  r.num_regions = static_cast<uint32_t>(info.regions.size());
  r.server_threads = info.server_threads;
  std::string out;
  Append(&out, r);
  for (const RegionInfoWire& reg : info.regions) {
    RegionDescriptor d{};
    d.region_id = reg.region_id;
    d.rkey_len = static_cast<uint32_t>(reg.rkey.size());
    d.base = reg.base;
    d.length = reg.length;
    Append(&out, d);
    out += reg.rkey;
    out.append(Pad8(reg.rkey.size()) - reg.rkey.size(), '\0');
  }
  return out;
}

Result<HelloReplyInfo> DecodeHelloReply(std::string_view payload) {
  Reader rd(payload);
  HelloReply r;
  if (!rd.Read(&r)) return Bad("hello reply truncated");
  if (r.magic != kWireMagic) return Bad("bad magic in hello reply");
  if (r.version != kWireVersion) return Bad("server speaks another version");
  if (r.num_regions > kMaxRegions) return Bad("too many regions");
  HelloReplyInfo info;
  info.incarnation = r.incarnation;
  info.max_payload = r.max_payload;
  info.server_threads = r.server_threads;
  info.regions.reserve(r.num_regions);
  for (uint32_t i = 0; i < r.num_regions; ++i) {
    RegionDescriptor d;
    if (!rd.Read(&d)) return Bad("region descriptor truncated");
    if (d.rkey_len == 0 || d.rkey_len > kMaxRkeyBytes) {
      return Bad("region rkey length out of range");
    }
    if (d.length == 0 || d.base + d.length < d.base) {
      return Bad("region bounds invalid");
    }
    RegionInfoWire reg;
    reg.region_id = d.region_id;
    reg.base = d.base;
    reg.length = d.length;
    if (!rd.ReadBytes(d.rkey_len, &reg.rkey)) return Bad("rkey truncated");
    if (!rd.Skip(Pad8(d.rkey_len) - d.rkey_len)) {
      return Bad("rkey padding truncated");
    }
    for (const RegionInfoWire& prev : info.regions) {
      if (prev.region_id == reg.region_id) return Bad("duplicate region id");
    }
    info.regions.push_back(std::move(reg));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after hello reply");
  return info;
}

std::string EncodeStatsReply(const StatsReply& stats) {
  StatsReply s = stats;
  s.magic = kWireMagic;
  s.version = kWireVersion;
  std::string out;
  Append(&out, s);
  return out;
}

Result<StatsReply> DecodeStatsReply(std::string_view payload) {
  if (payload.size() != sizeof(StatsReply)) return Bad("stats reply size");
  StatsReply s{};
  std::memcpy(&s, payload.data(), payload.size());
  if (s.magic != kWireMagic) return Bad("bad magic in stats reply");
  if (s.version != kWireVersion) return Bad("stats reply version");
  return s;
}

MemRequest MakeMemRequest(MemOp op, uint32_t region, uint64_t request_id,
                          uint64_t offset, uint64_t length, uint64_t operand,
                          uint64_t operand2) {
  MemRequest r{};
  r.magic = kWireMagic;
  r.version = kWireVersion;
  r.op = static_cast<uint8_t>(op);
  r.region = region;
  r.request_id = request_id;
  r.offset = offset;
  r.length = length;
  r.operand = operand;
  r.operand2 = operand2;
  return r;
}

Result<MemRequest> DecodeMemRequest(std::string_view header, size_t data_len) {
  if (header.size() != sizeof(MemRequest)) {
    return Bad("memory request header is " + std::to_string(header.size()) +
               " bytes, expected " + std::to_string(sizeof(MemRequest)));
  }
  MemRequest r;
  std::memcpy(&r, header.data(), sizeof(r));
  if (r.magic != kWireMagic) return Bad("bad magic in memory request");
  if (r.version != kWireVersion) {
    return Bad("unsupported wire version " + std::to_string(r.version) +
               " in memory request");
  }
  if (r.op == 0 || r.op > kMaxMemOp) {
    return Bad("unknown memory operation " + std::to_string(r.op));
  }
  if (r.reserved != 0 || r.reserved2 != 0) {
    return Bad("reserved fields set in memory request");
  }
  const auto op = static_cast<MemOp>(r.op);
  if (r.length > kMaxMemTransfer) {
    return Bad("memory request of " + std::to_string(r.length) +
               " bytes exceeds " + std::to_string(kMaxMemTransfer));
  }
  if ((op == MemOp::kCompareSwap || op == MemOp::kFetchAdd) && r.length != 8) {
    return Bad("atomic memory request of length " + std::to_string(r.length));
  }
  const size_t want = op == MemOp::kWrite ? r.length : 0;
  if (data_len != want) {
    return Bad("memory request carries " + std::to_string(data_len) +
               " bytes, expected " + std::to_string(want));
  }
  return r;
}

MemReply MakeMemReply(MemOp op, uint64_t request_id, StatusCode status,
                      uint64_t value) {
  MemReply r{};
  r.magic = kWireMagic;
  r.version = kWireVersion;
  r.op = static_cast<uint8_t>(op);
  r.status = static_cast<int32_t>(status);
  r.request_id = request_id;
  r.value = value;
  return r;
}

Result<MemReply> DecodeMemReply(std::string_view header) {
  if (header.size() != sizeof(MemReply)) return Bad("memory reply size");
  MemReply r;
  std::memcpy(&r, header.data(), sizeof(r));
  if (r.magic != kWireMagic || r.version != kWireVersion) {
    return Bad("bad magic or version in memory reply");
  }
  if (r.op == 0 || r.op > kMaxMemOp) return Bad("unknown op in memory reply");
  if (r.reserved != 0 || r.reserved2 != 0) {
    return Bad("reserved fields set in memory reply");
  }
  return r;
}

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
  if (r.num_partitions == 0 || r.num_partitions > kMaxRegions) {
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

std::string EncodeHashKey(std::string_view key) {
  HashKeyRequest r{};
  r.key_len = static_cast<uint32_t>(key.size());
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

std::string EncodeHashMultiGet(const std::vector<std::string_view>& keys) {
  std::string out;
  Append(&out, HashMultiRequest{static_cast<uint32_t>(keys.size()), 0});
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
    if (h.status > static_cast<uint16_t>(StatusCode::kConflict)) {
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

}  // namespace remem::proto
