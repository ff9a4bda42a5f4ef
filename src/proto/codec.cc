#include "proto/codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unordered_set>
#include <utility>
#include <vector>

#include "proto/buffer.h"

namespace remem::proto {

// --- the TCP handshake

std::string EncodeClientHello(const ClientHelloInfo& hello) {
  ClientHello h{};
  h.magic = kWireMagic;
  h.version = hello.version;
  h.secret_len = static_cast<uint32_t>(hello.secret.size());
  h.address_len = static_cast<uint32_t>(hello.worker_address.size());
  std::string out;
  out.reserve(sizeof(h) + hello.secret.size() + hello.worker_address.size());
  Append(&out, h);
  out += hello.secret;
  out += hello.worker_address;
  return out;
}

Result<size_t> DecodeClientHelloPrefix(std::string_view prefix,
                                       ClientHello* out) {
  if (prefix.size() != sizeof(ClientHello)) {
    return Bad("client hello prefix is " + std::to_string(prefix.size()) +
               " bytes, expected " + std::to_string(sizeof(ClientHello)));
  }
  ClientHello h;
  std::memcpy(&h, prefix.data(), sizeof(h));
  if (h.magic != kWireMagic) {
    return Bad("not a remem client (bad magic in the handshake)");
  }
  if (h.flags != 0 || h.reserved[0] != 0 || h.reserved[1] != 0) {
    return Bad("unknown flags or reserved bytes in the client hello");
  }
  if (h.secret_len > kMaxSecretBytes) {
    return Bad("client hello: secret of " + std::to_string(h.secret_len) +
               " bytes exceeds " + std::to_string(kMaxSecretBytes));
  }
  if (h.address_len == 0 || h.address_len > kMaxWorkerAddressBytes) {
    return Bad("client hello: worker address of " +
               std::to_string(h.address_len) + " bytes is out of range (1.." +
               std::to_string(kMaxWorkerAddressBytes) + ")");
  }
  *out = h;
  return size_t{h.secret_len} + h.address_len;
}

Result<ClientHelloInfo> DecodeClientHello(std::string_view message) {
  if (message.size() < sizeof(ClientHello)) {
    return Bad("client hello truncated");
  }
  ClientHello h;
  auto body = DecodeClientHelloPrefix(message.substr(0, sizeof(h)), &h);
  if (!body.ok()) return body.status();
  if (message.size() - sizeof(h) != *body) {
    return Bad("client hello: body of " +
               std::to_string(message.size() - sizeof(h)) +
               " bytes, the prefix says " + std::to_string(*body));
  }
  ClientHelloInfo info;
  info.version = h.version;
  info.secret.assign(message.substr(sizeof(h), h.secret_len));
  info.worker_address.assign(
      message.substr(sizeof(h) + h.secret_len, h.address_len));
  return info;
}

std::string EncodeServerHello(const ServerHelloInfo& hello) {
  ServerHello h{};
  h.magic = kWireMagic;
  h.version = hello.version;
  h.status = static_cast<int32_t>(hello.status.code());
  const std::string& body =
      hello.status.ok() ? hello.worker_address : hello.status.message();
  const size_t len =
      hello.status.ok()
          ? body.size()
          : std::min<size_t>(body.size(), kMaxHandshakeMessageBytes);
  h.body_len = static_cast<uint32_t>(len);
  h.incarnation = hello.incarnation;
  h.session_id = hello.session_id;
  h.server_threads = hello.server_threads;
  h.lease_ms = hello.lease_ms;
  h.endpoint_number = hello.endpoint_number;
  std::string out;
  Append(&out, h);
  out.append(body.data(), len);
  return out;
}

std::string EncodeEndpointNotice(uint64_t incarnation, uint64_t session_id,
                                 uint64_t endpoint_number) {
  EndpointNotice n{};
  n.magic = kWireMagic;
  n.version = kWireVersion;
  n.incarnation = incarnation;
  n.session_id = session_id;
  n.endpoint_number = endpoint_number;
  std::string out;
  Append(&out, n);
  return out;
}

Result<size_t> DecodeServerHelloPrefix(std::string_view prefix,
                                       ServerHello* out) {
  if (prefix.size() != sizeof(ServerHello)) {
    return Bad("server hello prefix is " + std::to_string(prefix.size()) +
               " bytes, expected " + std::to_string(sizeof(ServerHello)));
  }
  ServerHello h;
  std::memcpy(&h, prefix.data(), sizeof(h));
  if (h.magic != kWireMagic) {
    return Bad("not a remem server (bad magic in the handshake)");
  }
  if (h.status < 0 || h.status > static_cast<int32_t>(StatusCode::kMoved)) {
    return Bad("server hello: unknown status " + std::to_string(h.status));
  }
  const uint32_t limit =
      h.status == 0 ? kMaxWorkerAddressBytes : kMaxHandshakeMessageBytes;
  if (h.body_len > limit || (h.status == 0 && h.body_len == 0)) {
    return Bad("server hello: body of " + std::to_string(h.body_len) +
               " bytes is out of range");
  }
  *out = h;
  return size_t{h.body_len};
}

Result<ServerHelloInfo> DecodeServerHello(std::string_view message) {
  if (message.size() < sizeof(ServerHello)) {
    return Bad("server hello truncated");
  }
  ServerHello h;
  auto body = DecodeServerHelloPrefix(message.substr(0, sizeof(h)), &h);
  if (!body.ok()) return body.status();
  if (message.size() - sizeof(h) != *body) {
    return Bad("server hello: body length mismatch");
  }
  ServerHelloInfo info;
  info.version = h.version;
  info.incarnation = h.incarnation;
  info.session_id = h.session_id;
  info.server_threads = h.server_threads;
  info.lease_ms = h.lease_ms;
  info.endpoint_number = h.endpoint_number;
  const std::string_view rest = message.substr(sizeof(h));
  if (h.status == 0) {
    info.worker_address.assign(rest);
  } else {
    info.status = Status(static_cast<StatusCode>(h.status), std::string(rest));
  }
  return info;
}

// --- RPCs

RpcHeader MakeHeader(ServiceId service, uint8_t method, uint64_t request_id,
                     uint64_t payload_len, bool reply, StatusCode status,
                     uint32_t epoch) {
  RpcHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.service = service;
  h.method = method;
  h.flags = reply ? kFlagReply : 0;
  h.status = static_cast<int32_t>(status);
  h.request_id = request_id;
  // Saturated: a payload over 4 GiB (never sent: kMaxRpcPayload is far
  // below) cannot pass for a short one.
  h.payload_len =
      static_cast<uint32_t>(std::min<uint64_t>(payload_len, UINT32_MAX));
  h.epoch = epoch;
  return h;
}

Result<RpcHeader> DecodeHeader(const void* data, size_t len, size_t data_len) {
  if (data == nullptr ||
      (len != sizeof(RpcHeader) && len != sizeof(SealedRpcHeader))) {
    return Bad("rpc header is " + std::to_string(len) + " bytes, expected " +
               std::to_string(sizeof(RpcHeader)) + " (" +
               std::to_string(sizeof(SealedRpcHeader)) + " sealed)");
  }
  RpcHeader h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != kWireMagic) return Bad("bad magic in rpc header");
  if (h.version != kWireVersion) {
    return Bad("unsupported wire version " + std::to_string(h.version) +
               " (this build speaks " + std::to_string(kWireVersion) + ")");
  }
  if ((h.flags & ~(kFlagReply | kFlagSealed)) != 0 || h.reserved != 0) {
    return Bad("unknown flags in rpc header");
  }
  if (((h.flags & kFlagSealed) != 0) != (len == sizeof(SealedRpcHeader))) {
    return Bad("a sealed rpc header is " +
               std::to_string(sizeof(SealedRpcHeader)) +
               " bytes, an unsealed one " + std::to_string(sizeof(RpcHeader)));
  }
  if (h.status < 0 || h.status > static_cast<int32_t>(StatusCode::kMoved)) {
    return Bad("unknown status " + std::to_string(h.status) + " in rpc header");
  }
  if (h.payload_len != data_len) {
    return Bad("payload length " + std::to_string(data_len) +
               " does not match header " + std::to_string(h.payload_len));
  }
  if (h.payload_len > kMaxRpcPayload) return Bad("payload too large");
  return h;
}

size_t SealHeader(const RpcHeader& h, std::string_view payload,
                  SealedRpcHeader* out) {
  out->rpc = h;
  if (payload.size() < kSealMin) return sizeof(RpcHeader);
  out->rpc.flags |= kFlagSealed;
  out->seal = XXH3_64bits(payload.data(), payload.size());
  return sizeof(SealedRpcHeader);
}

Status VerifySeal(const void* header, size_t len, std::string_view payload) {
  if (len != sizeof(SealedRpcHeader)) return Status::OK();
  SealedRpcHeader sh;
  std::memcpy(&sh, header, sizeof(sh));
  if ((sh.rpc.flags & kFlagSealed) == 0) return Status::OK();
  if (sh.seal != XXH3_64bits(payload.data(), payload.size())) {
    return Status::ProtocolError(
        "a payload of " + std::to_string(payload.size()) +
        " bytes did not verify against its seal (the sender's buffer "
        "changed under the transfer)");
  }
  return Status::OK();
}

std::string EncodeRegionsReply(const RegionsInfo& info) {
  RegionsReply r{};
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
    d.service = reg.service;
    d.access = static_cast<uint8_t>(reg.access);
    Append(&out, d);
    out += reg.rkey;
    out.append(Pad8(reg.rkey.size()) - reg.rkey.size(), '\0');
  }
  return out;
}

Result<RegionsInfo> DecodeRegionsReply(std::string_view payload) {
  Reader rd(payload);
  RegionsReply r;
  if (!rd.Read(&r)) return Bad("regions reply truncated");
  if (r.magic != kWireMagic) return Bad("bad magic in regions reply");
  if (r.version != kWireVersion) return Bad("server speaks another version");
  if (r.num_regions > kMaxRegions) return Bad("too many regions");
  if (uint64_t{r.num_regions} * sizeof(RegionDescriptor) > rd.remaining()) {
    return Bad("regions reply: more regions than bytes");
  }
  RegionsInfo info;
  info.incarnation = r.incarnation;
  info.max_payload = r.max_payload;
  info.server_threads = r.server_threads;
  info.regions.reserve(r.num_regions);
  std::unordered_set<uint32_t> seen;
  for (uint32_t i = 0; i < r.num_regions; ++i) {
    RegionDescriptor d;
    if (!rd.Read(&d)) return Bad("region descriptor truncated");
    if (d.rkey_len == 0 || d.rkey_len > kMaxRkeyBytes) {
      return Bad("region rkey length out of range");
    }
    if (d.length == 0 || d.base + d.length < d.base) {
      return Bad("region bounds invalid");
    }
    if (d.access > static_cast<uint8_t>(RegionAccess::kReadOnly) ||
        d.reserved != 0 || d.reserved2 != 0) {
      return Bad("region descriptor: unknown access or reserved bytes set");
    }
    RegionInfoWire reg;
    reg.region_id = d.region_id;
    reg.base = d.base;
    reg.length = d.length;
    reg.service = d.service;
    reg.access = static_cast<RegionAccess>(d.access);
    if (!rd.ReadBytes(d.rkey_len, &reg.rkey)) return Bad("rkey truncated");
    if (!rd.Skip(Pad8(d.rkey_len) - d.rkey_len)) {
      return Bad("rkey padding truncated");
    }
    if (!seen.insert(reg.region_id).second) return Bad("duplicate region id");
    info.regions.push_back(std::move(reg));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after regions reply");
  return info;
}

bool ValidStatName(std::string_view name) {
  if (name.empty() || name.size() > kMaxStatName) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string EncodeStatsReply(const std::vector<StatValue>& stats) {
  StatsReply r{};
  r.magic = kWireMagic;
  r.version = kWireVersion;
  r.count = static_cast<uint32_t>(stats.size());
  std::string out;
  Append(&out, r);
  for (const StatValue& s : stats) {
    StatEntry e{};
    e.name_len = static_cast<uint16_t>(s.name.size());
    e.kind = static_cast<uint8_t>(s.kind);
    const size_t text = s.kind == StatKind::kText
                            ? std::min<size_t>(s.text.size(), kMaxStatText)
                            : 0;
    e.text_len = static_cast<uint32_t>(text);
    e.value = s.kind == StatKind::kNumber ? s.value : 0;
    Append(&out, e);
    out += s.name;
    out.append(s.text.data(), text);
  }
  return out;
}

Result<std::vector<StatValue>> DecodeStatsReply(std::string_view payload) {
  Reader rd(payload);
  StatsReply r;
  if (!rd.Read(&r)) return Bad("stats reply truncated");
  if (r.magic != kWireMagic || r.version != kWireVersion) {
    return Bad("bad magic or version in stats reply");
  }
  if (r.count > kMaxStats ||
      uint64_t{r.count} * sizeof(StatEntry) > rd.remaining()) {
    return Bad("stats reply: more entries than bytes");
  }
  std::vector<StatValue> out;
  out.reserve(r.count);
  std::unordered_set<std::string> seen;
  for (uint32_t i = 0; i < r.count; ++i) {
    StatEntry e;
    if (!rd.Read(&e)) return Bad("stat entry truncated");
    if (e.kind > static_cast<uint8_t>(StatKind::kText) || e.reserved != 0) {
      return Bad("stat entry: unknown kind");
    }
    StatValue s;
    s.kind = static_cast<StatKind>(e.kind);
    if (e.name_len > kMaxStatName || !rd.ReadBytes(e.name_len, &s.name) ||
        !ValidStatName(s.name)) {
      return Bad("stat entry: bad name");
    }
    if (s.kind == StatKind::kNumber) {
      if (e.text_len != 0) return Bad("stat entry: text on a number");
      s.value = e.value;
    } else if (e.text_len > kMaxStatText || e.value != 0 ||
               !rd.ReadBytes(e.text_len, &s.text)) {
      return Bad("stat entry: bad text");
    }
    if (!seen.insert(s.name).second) return Bad("duplicate stat " + s.name);
    out.push_back(std::move(s));
  }
  if (rd.remaining() != 0) return Bad("trailing bytes after stats");
  return out;
}

// --- served one-sided operations

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
  if (op == MemOp::kReadMany) {
    if (r.region != 0 || r.offset != 0) {
      return Bad("a multiple read names no region or offset of its own");
    }
    if (data_len == 0 || data_len % sizeof(MemSpan) != 0 ||
        data_len / sizeof(MemSpan) > kMaxMemSpans) {
      return Bad("a multiple read carries " + std::to_string(data_len) +
                 " bytes of spans: 1 to " + std::to_string(kMaxMemSpans) +
                 " spans of " + std::to_string(sizeof(MemSpan)) + " bytes");
    }
    return r;
  }
  const size_t want = op == MemOp::kWrite ? r.length : 0;
  if (data_len != want) {
    return Bad("memory request carries " + std::to_string(data_len) +
               " bytes, expected " + std::to_string(want));
  }
  return r;
}

std::string EncodeMemSpans(const std::vector<MemSpan>& spans) {
  std::string out(spans.size() * sizeof(MemSpan), '\0');
  if (!spans.empty()) std::memcpy(out.data(), spans.data(), out.size());
  return out;
}

Status DecodeMemSpans(std::string_view data, uint64_t length,
                      std::vector<MemSpan>* spans) {
  spans->clear();
  if (data.empty() || data.size() % sizeof(MemSpan) != 0 ||
      data.size() / sizeof(MemSpan) > kMaxMemSpans) {
    return Bad("a multiple read's spans are " + std::to_string(data.size()) +
               " bytes");
  }
  spans->resize(data.size() / sizeof(MemSpan));
  std::memcpy(spans->data(), data.data(), data.size());
  uint64_t total = 0;
  for (const MemSpan& s : *spans) {
    if (s.reserved != 0) return Bad("reserved field set in a span");
    // Each at most kMaxMemTransfer, so the sum of 1024 cannot overflow.
    if (s.length > kMaxMemTransfer) return Bad("a span exceeds one request");
    total += s.length;
  }
  if (total != length) {
    return Bad("a multiple read's spans add up to " + std::to_string(total) +
               " bytes, its header says " + std::to_string(length));
  }
  return Status::OK();
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

// --- the server lease

ServerLease MakeLease(uint64_t version, uint64_t incarnation,
                      uint64_t expires_ns, uint64_t renewals,
                      uint64_t lease_ns) {
  ServerLease l{};
  l.version = version;
  l.magic = kLeaseMagic;
  l.incarnation = incarnation;
  l.expires_ns = expires_ns;
  l.renewals = renewals;
  l.lease_ns = lease_ns;
  l.checksum = XXH3_64bits(&l, offsetof(ServerLease, checksum));
  return l;
}

bool LeaseVerifies(const ServerLease& lease) {
  return lease.version % 2 == 0 && lease.magic == kLeaseMagic &&
         lease.checksum == XXH3_64bits(&lease, offsetof(ServerLease, checksum));
}

}  // namespace remem::proto
