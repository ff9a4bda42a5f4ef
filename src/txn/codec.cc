#include "txn/codec.h"

#include "proto/buffer.h"

namespace remem::txn {

using proto::Append;
using proto::Bad;
using proto::Reader;

namespace {

Status CheckMagic(uint32_t magic, uint16_t version, const char* what) {
  if (magic != proto::kWireMagic) return Bad(std::string(what) + ": bad magic");
  if (version != proto::kWireVersion) {
    return Bad(std::string(what) + ": wire version " + std::to_string(version) +
               ", this build speaks " + std::to_string(proto::kWireVersion));
  }
  return Status::OK();
}

}  // namespace

std::string EncodeRequest(const Request& r) {
  TxnRequest h{};
  h.magic = proto::kWireMagic;
  h.version = proto::kWireVersion;
  h.capacity = r.capacity;
  h.id = r.id;
  std::string out;
  Append(&out, h);
  return out;
}

Result<Request> DecodeRequest(std::string_view payload) {
  Reader in(payload);
  TxnRequest h;
  if (!in.Read(&h)) return Bad("object request: truncated");
  REMEM_RETURN_IF_ERROR(CheckMagic(h.magic, h.version, "object request"));
  if (in.remaining() != 0) return Bad("object request: trailing bytes");
  Request r;
  r.capacity = h.capacity;
  r.id = h.id;
  return r;
}

std::string EncodeInfo(const Info& i) {
  TxnInfoReply h{};
  h.max_object = i.max_object;
  h.regions = uint32_t(i.regions.size());
  h.heap_bytes = i.heap_bytes;
  std::string out;
  Append(&out, h);
  for (const TxnRegionWire& r : i.regions) Append(&out, r);
  return out;
}

Result<Info> DecodeInfo(std::string_view payload) {
  Reader in(payload);
  TxnInfoReply h;
  if (!in.Read(&h)) return Bad("object info: truncated");
  if (h.regions > 1024 || in.remaining() != h.regions * sizeof(TxnRegionWire)) {
    return Bad("object info: malformed region list");
  }
  Info i;
  i.max_object = h.max_object;
  i.heap_bytes = h.heap_bytes;
  uint64_t at = 0;
  for (uint32_t k = 0; k < h.regions; ++k) {
    TxnRegionWire r;
    (void)in.Read(&r);
    if (r.heap_offset != at || r.length == 0 || r.length % kPageBytes != 0) {
      return Bad("object info: regions do not tile the heap");
    }
    at += r.length;
    i.regions.push_back(r);
  }
  if (at != h.heap_bytes)
    return Bad("object info: regions do not tile the heap");
  if (h.heap_bytes != 0 &&
      (h.max_object == 0 || h.max_object > kMaxObjectBytes)) {
    return Bad("object info: bad largest object");
  }
  return i;
}

std::string EncodeObjectId(const TxnObjectIdWire& id) {
  std::string out;
  Append(&out, id);
  return out;
}

Result<TxnObjectIdWire> DecodeObjectId(std::string_view payload) {
  Reader in(payload);
  TxnObjectIdWire id;
  if (!in.Read(&id) || in.remaining() != 0) return Bad("object id: malformed");
  return id;
}

std::string EncodeCommit(const std::vector<CommitEntry>& entries) {
  TxnCommitHeader h{};
  h.magic = proto::kWireMagic;
  h.version = proto::kWireVersion;
  h.entries = uint32_t(entries.size());
  std::string out;
  Append(&out, h);
  for (const CommitEntry& e : entries) {
    TxnCommitEntry w{};
    w.id = e.id;
    w.version = e.version;
    w.op = static_cast<uint32_t>(e.op);
    w.size = uint32_t(e.data.size());
    Append(&out, w);
    out.append(e.data);
    out.resize(proto::Pad8(out.size()), '\0');
  }
  return out;
}

Result<std::vector<CommitEntry>> DecodeCommit(std::string_view payload) {
  Reader in(payload);
  TxnCommitHeader h;
  if (!in.Read(&h)) return Bad("commit: truncated header");
  REMEM_RETURN_IF_ERROR(CheckMagic(h.magic, h.version, "commit"));
  if (h.entries == 0 || h.entries > kMaxCommitEntries) {
    return Bad("commit: " + std::to_string(h.entries) + " entries (1 to " +
               std::to_string(kMaxCommitEntries) + ")");
  }
  std::vector<CommitEntry> out;
  out.reserve(h.entries);
  for (uint32_t k = 0; k < h.entries; ++k) {
    TxnCommitEntry w;
    if (!in.Read(&w)) return Bad("commit: truncated entry");
    if (w.op > static_cast<uint32_t>(TxnOp::kFree)) {
      return Bad("commit: unknown operation " + std::to_string(w.op));
    }
    CommitEntry e;
    e.id = w.id;
    e.version = w.version;
    e.op = static_cast<TxnOp>(w.op);
    const bool carries = e.op == TxnOp::kWrite || e.op == TxnOp::kCreate;
    if (!carries && w.size != 0) return Bad("commit: data on a check or free");
    if (w.size > kMaxObjectBytes) return Bad("commit: object too large");
    if (!in.View(w.size, &e.data) || !in.Skip(proto::Pad8(w.size) - w.size)) {
      return Bad("commit: truncated data");
    }
    out.push_back(e);
  }
  if (in.remaining() != 0) return Bad("commit: trailing bytes");
  return out;
}

std::string EncodeVersions(const std::vector<uint64_t>& versions) {
  TxnCommitReply h{};
  h.count = uint32_t(versions.size());
  std::string out;
  Append(&out, h);
  for (uint64_t v : versions) Append(&out, v);
  return out;
}

Result<std::vector<uint64_t>> DecodeVersions(std::string_view payload) {
  Reader in(payload);
  TxnCommitReply h;
  if (!in.Read(&h) || h.count > kMaxCommitEntries ||
      in.remaining() != size_t(h.count) * 8) {
    return Bad("commit reply: malformed");
  }
  std::vector<uint64_t> out(h.count);
  for (uint64_t& v : out) (void)in.Read(&v);
  return out;
}

std::string EncodeReadReply(uint64_t version, std::string_view data) {
  TxnReadReply h{};
  h.version = version;
  h.size = uint32_t(data.size());
  std::string out;
  Append(&out, h);
  out.append(data);
  return out;
}

Result<ReadReply> DecodeReadReply(std::string_view payload) {
  Reader in(payload);
  TxnReadReply h;
  ReadReply r;
  if (!in.Read(&h) || h.size > kMaxObjectBytes || !in.View(h.size, &r.data) ||
      in.remaining() != 0) {
    return Bad("object read reply: malformed");
  }
  if (h.version == 0 || h.version % 2 != 0) {
    return Bad("object read reply: bad version");
  }
  r.version = h.version;
  return r;
}

}  // namespace remem::txn
