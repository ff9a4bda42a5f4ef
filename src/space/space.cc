#include "space/space.h"

#include <cstring>
#include <utility>

namespace remem::space {

namespace {

uint64_t ChunksFor(uint64_t bytes, uint64_t chunk) {
  return bytes / chunk + (bytes % chunk != 0 ? 1 : 0);
}

std::string Bytes(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

SpaceTable::SpaceTable(const std::vector<SpaceRegion>& regions,
                       uint64_t chunk_bytes)
    : chunk_(chunk_bytes) {
  for (const SpaceRegion& r : regions) {
    const uint64_t n = r.length / chunk_;
    if (n == 0) continue;
    spans_.push_back({r.id, r.base, uint32_t(total_chunks_), uint32_t(n)});
    for (uint64_t i = 0; i < n; ++i) pool_.insert(uint32_t(total_chunks_ + i));
    total_chunks_ += n;
  }
  Publish();
}

void SpaceTable::Publish() {
  counters_.free_bytes.store(pool_.size() * chunk_, std::memory_order_relaxed);
  counters_.reserved_bytes.store(reserved_chunks_ * chunk_,
                                 std::memory_order_relaxed);
  counters_.allocated_bytes.store(allocated_chunks_ * chunk_,
                                  std::memory_order_relaxed);
  counters_.held_bytes.store(held_chunks_ * chunk_, std::memory_order_relaxed);
  counters_.namespaces.store(namespaces_.size(), std::memory_order_relaxed);
  counters_.maps.store(maps_.size(), std::memory_order_relaxed);
  counters_.segments.store(segments_.size() - held_segments_,
                           std::memory_order_relaxed);
}

Result<SpaceTable::Namespace*> SpaceTable::Find(uint64_t ns) {
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end()) {
    return Status::NotFound("namespace " + std::to_string(ns) +
                            " does not exist (deleted, or the server "
                            "restarted: namespaces are not kept across "
                            "restarts)");
  }
  return &it->second;
}

Result<const SpaceTable::Namespace*> SpaceTable::Find(uint64_t ns) const {
  auto r = const_cast<SpaceTable*>(this)->Find(ns);
  if (!r.ok()) return r.status();
  return *r;
}

NamespaceEntry SpaceTable::Entry(const Namespace& n, bool with_name) const {
  NamespaceEntry e;
  e.ns = n.id;
  e.reserved_bytes = n.reserved.size() * chunk_;
  e.allocated_bytes = n.allocated_bytes;
  e.segments = uint32_t(n.segments.size());
  e.chunk_bytes = uint32_t(chunk_);
  if (with_name) e.name = n.name;
  return e;
}

Result<NamespaceEntry> SpaceTable::Create(std::string_view name) {
  REMEM_RETURN_IF_ERROR(CheckName(name));
  if (by_name_.find(name) != by_name_.end()) {
    return Status::AlreadyExists("namespace '" + std::string(name) +
                                 "' exists");
  }
  if (namespaces_.size() >= kMaxNamespaces) {
    return Status::OutOfMemory("the server holds " +
                               std::to_string(kMaxNamespaces) +
                               " namespaces, its most; delete one first");
  }
  const uint64_t id = next_ns_++;
  Namespace& n = namespaces_[id];
  n.name = std::string(name);
  n.id = id;
  by_name_.emplace(n.name, id);
  Publish();
  return Entry(n, false);
}

Result<NamespaceEntry> SpaceTable::Open(std::string_view name) const {
  REMEM_RETURN_IF_ERROR(CheckName(name));
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return Status::NotFound("no namespace '" + std::string(name) + "'");
  }
  return Entry(namespaces_.at(it->second), false);
}

void SpaceTable::FreeSegment(Namespace* n, uint64_t uid) {
  Segment& s = segments_.at(uid);
  n->segments.erase(s.address);
  n->allocated_bytes -= s.chunks.size() * chunk_;
  allocated_chunks_ -= s.chunks.size();
  s.freed = true;
  if (s.maps == 0) {
    for (uint32_t c : s.chunks) n->reserved.insert(c);
    reserved_chunks_ += s.chunks.size();
    segments_.erase(uid);
  } else {
    held_chunks_ += s.chunks.size();
    ++held_segments_;
  }
}

Status SpaceTable::Delete(std::string_view name) {
  REMEM_RETURN_IF_ERROR(CheckName(name));
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return Status::NotFound("no namespace '" + std::string(name) + "'");
  }
  Namespace& n = namespaces_.at(it->second);
  while (!n.segments.empty()) FreeSegment(&n, n.segments.begin()->second);
  for (auto& [uid, s] : segments_) {
    if (s.ns == n.id) s.ns = 0;  // held ones go to the pool when unmapped
  }
  reserved_chunks_ -= n.reserved.size();
  pool_.insert(n.reserved.begin(), n.reserved.end());
  namespaces_.erase(n.id);
  by_name_.erase(it);
  Publish();
  return Status::OK();
}

std::vector<NamespaceEntry> SpaceTable::List() const {
  std::vector<NamespaceEntry> out;
  out.reserve(by_name_.size());
  for (const auto& [name, id] : by_name_) {
    out.push_back(Entry(namespaces_.at(id), true));
  }
  return out;
}

Result<NamespaceEntry> SpaceTable::Info(uint64_t ns) const {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  return Entry(**n, false);
}

std::vector<uint32_t> SpaceTable::Take(std::set<uint32_t>* from, uint64_t n) {
  std::vector<uint32_t> out;
  out.reserve(n);
  while (out.size() < n && !from->empty()) {
    out.push_back(*from->begin());
    from->erase(from->begin());
  }
  return out;
}

Result<NamespaceEntry> SpaceTable::Reserve(uint64_t ns, uint64_t bytes) {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  const uint64_t want = ChunksFor(bytes, chunk_);
  if (want > pool_.size()) {
    return Status::OutOfMemory(
        "cannot reserve " + Bytes(bytes) + ": the server has " +
        Bytes(pool_.size() * chunk_) + " of namespace memory free (of " +
        Bytes(total_bytes()) + ", --space-memory)");
  }
  for (uint32_t c : Take(&pool_, want)) (*n)->reserved.insert(c);
  reserved_chunks_ += want;
  Publish();
  return Entry(**n, false);
}

Result<NamespaceEntry> SpaceTable::Release(uint64_t ns, uint64_t bytes) {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  std::set<uint32_t>& r = (*n)->reserved;
  const uint64_t give = std::min<uint64_t>(
      bytes == UINT64_MAX ? r.size() : ChunksFor(bytes, chunk_), r.size());
  // The highest chunks go back, so the pool's low runs stay contiguous.
  for (uint64_t i = 0; i < give; ++i) {
    auto last = std::prev(r.end());
    pool_.insert(*last);
    r.erase(last);
  }
  reserved_chunks_ -= give;
  Publish();
  return Entry(**n, false);
}

uint8_t* SpaceTable::ChunkAddress(uint32_t chunk, uint32_t* region,
                                  uint64_t* offset) const {
  for (const RegionSpan& s : spans_) {
    if (chunk >= s.first_chunk && chunk < s.first_chunk + s.chunks) {
      const uint64_t off = uint64_t(chunk - s.first_chunk) * chunk_;
      if (region != nullptr) *region = s.id;
      if (offset != nullptr) *offset = off;
      return s.base + off;
    }
  }
  return nullptr;  // not reached: chunks come from spans_
}

Result<SpaceSegmentWire> SpaceTable::Alloc(uint64_t ns, uint64_t bytes) {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  if (bytes == 0) {
    return Status::InvalidArgument("cannot allocate 0 bytes");
  }
  const uint64_t want = ChunksFor(bytes, chunk_);
  Namespace& ns_ref = **n;
  if (want > ns_ref.reserved.size() + pool_.size()) {
    return Status::OutOfMemory(
        "cannot allocate " + Bytes(bytes) + ": namespace '" + ns_ref.name +
        "' has " + Bytes(ns_ref.reserved.size() * chunk_) +
        " reserved and the server " + Bytes(pool_.size() * chunk_) +
        " free (of " + Bytes(total_bytes()) + ", --space-memory)");
  }
  Segment s;
  s.ns = ns_ref.id;
  s.address = ns_ref.next_address;
  s.length = bytes;
  s.chunks = Take(&ns_ref.reserved, want);
  reserved_chunks_ -= s.chunks.size();
  if (s.chunks.size() < want) {
    for (uint32_t c : Take(&pool_, want - s.chunks.size())) {
      s.chunks.push_back(c);
    }
  }
  // Memory comes back from other namespaces and freed segments: a segment
  // starts zeroed, never with someone else's bytes.
  for (uint32_t c : s.chunks) {
    std::memset(ChunkAddress(c, nullptr, nullptr), 0, chunk_);
  }
  ns_ref.next_address += want * chunk_;
  ns_ref.allocated_bytes += want * chunk_;
  allocated_chunks_ += want;
  const uint64_t uid = next_segment_++;
  ns_ref.segments.emplace(s.address, uid);
  SpaceSegmentWire out{s.address, s.length};
  segments_.emplace(uid, std::move(s));
  Publish();
  return out;
}

Status SpaceTable::Free(uint64_t ns, uint64_t address) {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  auto it = (*n)->segments.find(address);
  if (it == (*n)->segments.end()) {
    return Status::NotFound("no segment starts at address " +
                            std::to_string(address) + " of namespace '" +
                            (*n)->name + "'");
  }
  FreeSegment(*n, it->second);
  Publish();
  return Status::OK();
}

Result<std::vector<SpaceSegmentWire>> SpaceTable::Segments(uint64_t ns) const {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  std::vector<SpaceSegmentWire> out;
  out.reserve((*n)->segments.size());
  for (const auto& [address, uid] : (*n)->segments) {
    out.push_back({address, segments_.at(uid).length});
  }
  return out;
}

Result<MapReply> SpaceTable::Map(uint64_t ns, uint64_t address, uint64_t length,
                                 uint64_t connection) {
  auto n = Find(ns);
  if (!n.ok()) return n.status();
  if (length == 0) return Status::InvalidArgument("cannot map 0 bytes");
  // The segment that starts at or before `address`.
  auto& segs = (*n)->segments;
  auto it = segs.upper_bound(address);
  if (it == segs.begin()) {
    return Status::NotFound("no segment holds address " +
                            std::to_string(address));
  }
  --it;
  Segment& s = segments_.at(it->second);
  const uint64_t rel = address - s.address;
  if (rel >= s.length) {
    return Status::NotFound("no segment holds address " +
                            std::to_string(address));
  }
  if (length > s.length - rel) {
    return Status::InvalidArgument(
        "[" + std::to_string(address) + ", +" + std::to_string(length) +
        ") runs past the end of its segment [" + std::to_string(s.address) +
        ", +" + std::to_string(s.length) + ")");
  }
  auto& mine = maps_of_[connection];
  if (mine.size() >= kMaxMapsPerConnection) {
    return Status::OutOfMemory("this connection holds " +
                               std::to_string(kMaxMapsPerConnection) +
                               " maps, its most; unmap some first");
  }
  MapReply m;
  m.address = address;
  m.length = length;
  uint64_t at = rel;
  uint64_t left = length;
  while (left > 0) {
    const uint64_t in_chunk = at % chunk_;
    const uint64_t take = std::min(left, chunk_ - in_chunk);
    SpaceExtentWire e{};
    uint64_t off = 0;
    ChunkAddress(s.chunks[at / chunk_], &e.region, &off);
    e.offset = off + in_chunk;
    e.length = take;
    if (!m.extents.empty() && m.extents.back().region == e.region &&
        m.extents.back().offset + m.extents.back().length == e.offset) {
      m.extents.back().length += take;
    } else {
      m.extents.push_back(e);
    }
    at += take;
    left -= take;
  }
  m.map_id = next_map_++;
  maps_.emplace(m.map_id, MapEntry{connection, it->second});
  mine.insert(m.map_id);
  ++s.maps;
  Publish();
  return m;
}

void SpaceTable::Reclaim(uint64_t uid) {
  Segment& s = segments_.at(uid);
  held_chunks_ -= s.chunks.size();
  --held_segments_;
  auto n = namespaces_.find(s.ns);
  if (n != namespaces_.end()) {
    n->second.reserved.insert(s.chunks.begin(), s.chunks.end());
    reserved_chunks_ += s.chunks.size();
  } else {
    pool_.insert(s.chunks.begin(), s.chunks.end());
  }
  segments_.erase(uid);
}

Status SpaceTable::Unmap(uint64_t map_id, uint64_t connection) {
  auto it = maps_.find(map_id);
  if (it == maps_.end() || it->second.connection != connection) {
    return Status::NotFound("no map " + std::to_string(map_id) +
                            " on this connection");
  }
  const uint64_t uid = it->second.segment;
  maps_.erase(it);
  auto mine = maps_of_.find(connection);
  mine->second.erase(map_id);
  if (mine->second.empty()) maps_of_.erase(mine);
  Segment& s = segments_.at(uid);
  if (--s.maps == 0 && s.freed) Reclaim(uid);
  Publish();
  return Status::OK();
}

void SpaceTable::DropConnection(uint64_t connection) {
  auto mine = maps_of_.find(connection);
  if (mine == maps_of_.end()) return;
  const std::vector<uint64_t> ids(mine->second.begin(), mine->second.end());
  for (uint64_t id : ids) (void)Unmap(id, connection);
}

}  // namespace remem::space
