#include "space/codec.h"

#include <cstring>

#include "proto/buffer.h"

namespace remem::space {

using proto::Append;
using proto::Bad;
using proto::Reader;

std::string EncodeRequest(const Request& r) {
  SpaceRequest h{};
  h.magic = proto::kWireMagic;
  h.version = proto::kWireVersion;
  h.name_len = static_cast<uint16_t>(r.name.size());
  h.ns = r.ns;
  h.address = r.address;
  h.length = r.length;
  h.map_id = r.map_id;
  std::string out;
  out.reserve(sizeof(h) + r.name.size());
  Append(&out, h);
  out.append(r.name);
  return out;
}

Result<Request> DecodeRequest(std::string_view payload) {
  Reader in(payload);
  SpaceRequest h;
  if (!in.Read(&h)) return Bad("namespace request: truncated header");
  if (h.magic != proto::kWireMagic) return Bad("namespace request: bad magic");
  if (h.version != proto::kWireVersion) {
    return Bad("namespace request: wire version " + std::to_string(h.version) +
               ", this server speaks " + std::to_string(proto::kWireVersion));
  }
  if (h.name_len > kMaxNameBytes) {
    return Bad("namespace request: name longer than " +
               std::to_string(kMaxNameBytes) + " bytes");
  }
  Request r;
  if (!in.View(h.name_len, &r.name)) {
    return Bad("namespace request: truncated name");
  }
  if (in.remaining() != 0) return Bad("namespace request: trailing bytes");
  r.ns = h.ns;
  r.address = h.address;
  r.length = h.length;
  r.map_id = h.map_id;
  return r;
}

Status CheckName(std::string_view name) {
  if (name.empty()) {
    return Status::InvalidArgument("a namespace name cannot be empty");
  }
  if (name.size() > kMaxNameBytes) {
    return Status::InvalidArgument("namespace name longer than " +
                                   std::to_string(kMaxNameBytes) + " bytes");
  }
  for (char c : name) {
    if (c <= ' ' || c > '~') {
      return Status::InvalidArgument(
          "a namespace name is printable ASCII without spaces");
    }
  }
  return Status::OK();
}

namespace {

SpaceNamespaceWire ToWire(const NamespaceEntry& e, bool with_name) {
  SpaceNamespaceWire w{};
  w.ns = e.ns;
  w.reserved_bytes = e.reserved_bytes;
  w.allocated_bytes = e.allocated_bytes;
  w.segments = e.segments;
  w.chunk_bytes = e.chunk_bytes;
  w.name_len = with_name ? uint32_t(e.name.size()) : 0;
  return w;
}

NamespaceEntry FromWire(const SpaceNamespaceWire& w) {
  NamespaceEntry e;
  e.ns = w.ns;
  e.reserved_bytes = w.reserved_bytes;
  e.allocated_bytes = w.allocated_bytes;
  e.segments = w.segments;
  e.chunk_bytes = w.chunk_bytes;
  return e;
}

}  // namespace

std::string EncodeNamespace(const NamespaceEntry& e) {
  std::string out;
  Append(&out, ToWire(e, false));
  return out;
}

Result<NamespaceEntry> DecodeNamespace(std::string_view payload) {
  Reader in(payload);
  SpaceNamespaceWire w;
  if (!in.Read(&w) || in.remaining() != 0 || w.name_len != 0) {
    return Bad("namespace reply: malformed");
  }
  if (w.chunk_bytes == 0) return Bad("namespace reply: no chunk size");
  return FromWire(w);
}

std::string EncodeNamespaceList(const std::vector<NamespaceEntry>& list) {
  std::string out;
  SpaceListReply h{};
  h.count = uint32_t(list.size());
  Append(&out, h);
  for (const NamespaceEntry& e : list) {
    Append(&out, ToWire(e, true));
    out.append(e.name);
    out.resize(proto::Pad8(out.size()), '\0');
  }
  return out;
}

Result<std::vector<NamespaceEntry>> DecodeNamespaceList(
    std::string_view payload) {
  Reader in(payload);
  SpaceListReply h;
  if (!in.Read(&h)) return Bad("namespace list: truncated");
  if (h.count > kMaxNamespaces) return Bad("namespace list: too many");
  std::vector<NamespaceEntry> out;
  out.reserve(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    SpaceNamespaceWire w;
    if (!in.Read(&w)) return Bad("namespace list: truncated item");
    if (w.name_len == 0 || w.name_len > kMaxNameBytes) {
      return Bad("namespace list: bad name length");
    }
    NamespaceEntry e = FromWire(w);
    if (!in.ReadBytes(w.name_len, &e.name) ||
        !in.Skip(proto::Pad8(w.name_len) - w.name_len)) {
      return Bad("namespace list: truncated name");
    }
    out.push_back(std::move(e));
  }
  if (in.remaining() != 0) return Bad("namespace list: trailing bytes");
  return out;
}

std::string EncodeSegment(const SpaceSegmentWire& s) {
  std::string out;
  Append(&out, s);
  return out;
}

Result<SpaceSegmentWire> DecodeSegment(std::string_view payload) {
  Reader in(payload);
  SpaceSegmentWire s;
  if (!in.Read(&s) || in.remaining() != 0) return Bad("segment: malformed");
  return s;
}

std::string EncodeSegmentList(const std::vector<SpaceSegmentWire>& list) {
  std::string out;
  SpaceListReply h{};
  h.count = uint32_t(list.size());
  Append(&out, h);
  for (const SpaceSegmentWire& s : list) Append(&out, s);
  return out;
}

Result<std::vector<SpaceSegmentWire>> DecodeSegmentList(
    std::string_view payload) {
  Reader in(payload);
  SpaceListReply h;
  if (!in.Read(&h)) return Bad("segment list: truncated");
  if (uint64_t{h.count} * sizeof(SpaceSegmentWire) != in.remaining()) {
    return Bad("segment list: count and length disagree");
  }
  std::vector<SpaceSegmentWire> out(h.count);
  for (auto& s : out) in.Read(&s);
  return out;
}

std::string EncodeMapReply(const MapReply& m) {
  SpaceMapReply h{};
  h.map_id = m.map_id;
  h.address = m.address;
  h.length = m.length;
  h.extents = uint32_t(m.extents.size());
  std::string out;
  out.reserve(sizeof(h) + m.extents.size() * sizeof(SpaceExtentWire));
  Append(&out, h);
  for (const SpaceExtentWire& e : m.extents) Append(&out, e);
  return out;
}

Result<MapReply> DecodeMapReply(std::string_view payload) {
  Reader in(payload);
  SpaceMapReply h;
  if (!in.Read(&h)) return Bad("map reply: truncated");
  if (uint64_t{h.extents} * sizeof(SpaceExtentWire) != in.remaining()) {
    return Bad("map reply: extent count and length disagree");
  }
  MapReply m;
  m.map_id = h.map_id;
  m.address = h.address;
  m.length = h.length;
  m.extents.resize(h.extents);
  uint64_t sum = 0;
  for (SpaceExtentWire& e : m.extents) {
    in.Read(&e);
    if (e.length == 0 || e.offset + e.length < e.offset) {
      return Bad("map reply: bad extent");
    }
    sum += e.length;
    if (sum < e.length) return Bad("map reply: extents overflow");
  }
  if (sum != m.length) return Bad("map reply: extents do not cover the map");
  return m;
}

}  // namespace remem::space
