// The client side of namespaces (remem/space.h): calls to the namespace
// service for the control path, one-sided operations on the extents a map
// returned for the data path.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "client/session_core.h"
#include "remem/space.h"
#include "space/codec.h"
#include "space/wire.h"

namespace remem {

using client::SessionCore;
using space::SpaceMethod;

namespace {

Result<std::string> CallSpace(Session* session, SpaceMethod m,
                              const space::Request& r) {
  return session->core()->CallSync(space::kSpaceService, space::MethodId(m),
                                   space::EncodeRequest(r));
}

NamespaceInfo ToInfo(const space::NamespaceEntry& e) {
  NamespaceInfo i;
  i.name = e.name;
  i.id = e.ns;
  i.reserved_bytes = e.reserved_bytes;
  i.allocated_bytes = e.allocated_bytes;
  i.segments = e.segments;
  i.chunk_bytes = e.chunk_bytes;
  return i;
}

}  // namespace

Result<std::unique_ptr<Namespace>> Namespace::CreateOrOpen(
    Session* session, std::string_view name, bool create) {
  REMEM_RETURN_IF_ERROR(space::CheckName(name));
  space::Request r;
  r.name = name;
  auto reply =
      CallSpace(session, create ? SpaceMethod::kCreate : SpaceMethod::kOpen, r);
  if (!reply.ok()) return reply.status();
  auto e = space::DecodeNamespace(*reply);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Namespace>(
      new Namespace(session, std::string(name), e->ns));
}

Result<std::unique_ptr<Namespace>> Namespace::Create(Session* session,
                                                     std::string_view name) {
  return CreateOrOpen(session, name, true);
}

Result<std::unique_ptr<Namespace>> Namespace::Open(Session* session,
                                                   std::string_view name) {
  return CreateOrOpen(session, name, false);
}

Status Namespace::Delete(Session* session, std::string_view name) {
  REMEM_RETURN_IF_ERROR(space::CheckName(name));
  space::Request r;
  r.name = name;
  auto reply = CallSpace(session, SpaceMethod::kDelete, r);
  return reply.ok() ? Status::OK() : reply.status();
}

Result<std::vector<NamespaceInfo>> Namespace::List(Session* session) {
  auto reply = CallSpace(session, SpaceMethod::kList, {});
  if (!reply.ok()) return reply.status();
  auto list = space::DecodeNamespaceList(*reply);
  if (!list.ok()) return list.status();
  std::vector<NamespaceInfo> out;
  out.reserve(list->size());
  for (const auto& e : *list) out.push_back(ToInfo(e));
  return out;
}

Namespace::~Namespace() = default;

Result<NamespaceInfo> Namespace::Info() {
  space::Request r;
  r.ns = id_;
  auto reply = CallSpace(session_, SpaceMethod::kInfo, r);
  if (!reply.ok()) return reply.status();
  auto e = space::DecodeNamespace(*reply);
  if (!e.ok()) return e.status();
  NamespaceInfo i = ToInfo(*e);
  i.name = name_;
  return i;
}

Status Namespace::Reserve(uint64_t bytes) {
  space::Request r;
  r.ns = id_;
  r.length = bytes;
  auto reply = CallSpace(session_, SpaceMethod::kReserve, r);
  return reply.ok() ? Status::OK() : reply.status();
}

Status Namespace::Release(uint64_t bytes) {
  space::Request r;
  r.ns = id_;
  r.length = bytes;
  auto reply = CallSpace(session_, SpaceMethod::kRelease, r);
  return reply.ok() ? Status::OK() : reply.status();
}

Result<Segment> Namespace::Alloc(uint64_t bytes) {
  if (bytes == 0) return Status::InvalidArgument("cannot allocate 0 bytes");
  space::Request r;
  r.ns = id_;
  r.length = bytes;
  auto reply = CallSpace(session_, SpaceMethod::kAlloc, r);
  if (!reply.ok()) return reply.status();
  auto s = space::DecodeSegment(*reply);
  if (!s.ok()) return s.status();
  return Segment{s->address, s->length};
}

Status Namespace::Free(uint64_t address) {
  space::Request r;
  r.ns = id_;
  r.address = address;
  auto reply = CallSpace(session_, SpaceMethod::kFree, r);
  return reply.ok() ? Status::OK() : reply.status();
}

Result<std::vector<Segment>> Namespace::Segments() {
  space::Request r;
  r.ns = id_;
  auto reply = CallSpace(session_, SpaceMethod::kSegments, r);
  if (!reply.ok()) return reply.status();
  auto list = space::DecodeSegmentList(*reply);
  if (!list.ok()) return list.status();
  std::vector<Segment> out;
  out.reserve(list->size());
  for (const auto& s : *list) out.push_back({s.address, s.length});
  return out;
}

Result<std::unique_ptr<Mapping>> Namespace::Map(uint64_t address,
                                                uint64_t length) {
  if (length == 0) return Status::InvalidArgument("cannot map 0 bytes");
  space::Request r;
  r.ns = id_;
  r.address = address;
  r.length = length;
  auto reply = CallSpace(session_, SpaceMethod::kMap, r);
  if (!reply.ok()) return reply.status();
  auto m = space::DecodeMapReply(*reply);
  if (!m.ok()) return m.status();
  std::vector<Mapping::Extent> extents;
  extents.reserve(m->extents.size());
  uint64_t start = 0;
  Status bad;
  for (const auto& e : m->extents) {
    const fabric::RemoteRegion* region = session_->core()->region(e.region);
    if (region == nullptr || !region->Check(e.offset, e.length).ok()) {
      bad = Status::ProtocolError("map reply names memory outside region " +
                                  std::to_string(e.region));
    }
    extents.push_back({region, e.offset, e.length, start});
    start += e.length;
  }
  auto mapping = std::unique_ptr<Mapping>(new Mapping(
      session_, m->map_id, m->address, m->length, std::move(extents)));
  if (!bad.ok()) return bad;  // the destructor unmaps it
  return mapping;
}

// --- Mapping

Mapping::~Mapping() {
  space::Request r;
  r.map_id = map_id_;
  SessionCore* core = session_->core();
  // Not waited for: the server drops the map with the connection anyway.
  auto cb = core->Track<Status>(nullptr);
  core->Call(space::kSpaceService, space::MethodId(SpaceMethod::kUnmap),
             space::EncodeRequest(r),
             [cb](Status st, std::string) mutable { cb(st); });
}

namespace {

// One run of an operation: `len` bytes at `offset` of `region`, and where
// they start in the caller's buffer.
struct Piece {
  const fabric::RemoteRegion* region;
  uint64_t offset;
  uint64_t len;
  uint64_t buffer_at;
};

// Calls fn(piece) for each run of [offset, offset + len) over the extents,
// in order, until one returns an error; InvalidArgument if the range leaves
// the mapping. The data path: nothing is allocated.
template <typename Extent, typename Fn>
Status ForEachPiece(const std::vector<Extent>& ex, uint64_t length,
                    uint64_t offset, uint64_t len, Fn fn) {
  if (offset > length || len > length - offset) {
    return Status::InvalidArgument(
        "[" + std::to_string(offset) + ", +" + std::to_string(len) +
        ") is outside the mapping's " + std::to_string(length) + " bytes");
  }
  auto it = std::upper_bound(
      ex.begin(), ex.end(), offset,
      [](uint64_t off, const Extent& e) { return off < e.start; });
  --it;  // offset >= ex[0].start == 0
  uint64_t at = offset;
  uint64_t left = len;
  while (left > 0) {
    const uint64_t in = at - it->start;
    const uint64_t take = std::min(left, it->length - in);
    REMEM_RETURN_IF_ERROR(
        fn(Piece{it->region, it->offset + in, take, at - offset}));
    at += take;
    left -= take;
    ++it;
  }
  return Status::OK();
}

// The one word an atomic works on.
template <typename Extent>
Result<Piece> Word(const std::vector<Extent>& ex, uint64_t length,
                   uint64_t offset) {
  Piece word{};
  int pieces = 0;
  REMEM_RETURN_IF_ERROR(
      ForEachPiece(ex, length, offset, 8, [&](const Piece& p) {
        word = p;
        ++pieces;
        return Status::OK();
      }));
  if (pieces != 1 || word.offset % 8 != 0) {
    return Status::InvalidArgument(
        "atomic operations need an 8-byte aligned address");
  }
  return word;
}

// Joins the completions of an operation's pieces into one callback.
struct Join {
  size_t left = 0;
  Status first;
  std::function<void(Status)> done;
  void One(const Status& st) {
    if (!st.ok() && first.ok()) first = st;
    if (--left == 0) done(first);
  }
};

}  // namespace

Status Mapping::Read(uint64_t offset, void* dst, size_t len) {
  SessionCore* core = session_->core();
  auto* out = static_cast<uint8_t*>(dst);
  REMEM_RETURN_IF_ERROR(
      ForEachPiece(extents_, length_, offset, len, [&](const Piece& p) {
        return core->endpoint()->GetSync(out + p.buffer_at, p.len, *p.region,
                                         p.offset, core->options().timeout);
      }));
  return core->Vouch();
}

Status Mapping::Write(uint64_t offset, const void* src, size_t len) {
  SessionCore* core = session_->core();
  const auto* in = static_cast<const uint8_t*>(src);
  REMEM_RETURN_IF_ERROR(
      ForEachPiece(extents_, length_, offset, len, [&](const Piece& p) {
        return core->endpoint()->PutSync(in + p.buffer_at, p.len, *p.region,
                                         p.offset, core->options().timeout);
      }));
  return core->Vouch();
}

Result<uint64_t> Mapping::CompareAndSwap(uint64_t offset, uint64_t expected,
                                         uint64_t desired) {
  SessionCore* core = session_->core();
  auto w = Word(extents_, length_, offset);
  if (!w.ok()) return w.status();
  auto old = core->endpoint()->CompareSwapSync(
      expected, desired, *w->region, w->offset, core->options().timeout);
  if (!old.ok()) return old;
  REMEM_RETURN_IF_ERROR(core->Vouch());
  return old;
}

Result<uint64_t> Mapping::FetchAdd(uint64_t offset, uint64_t delta) {
  SessionCore* core = session_->core();
  auto w = Word(extents_, length_, offset);
  if (!w.ok()) return w.status();
  auto old = core->endpoint()->FetchAddSync(delta, *w->region, w->offset,
                                            core->options().timeout);
  if (!old.ok()) return old;
  REMEM_RETURN_IF_ERROR(core->Vouch());
  return old;
}

namespace {

// The shared body of ReadAsync and WriteAsync: `issue` starts one piece.
// (The range is walked twice, to count its pieces and then to issue them:
// cheaper than keeping them.)
template <typename Extent, typename IssueFn>
void PiecesAsync(SessionCore* core, const std::vector<Extent>& ex,
                 uint64_t length, uint64_t offset, size_t len,
                 Mapping::Callback done, IssueFn issue) {
  auto cb = core->Track<Status>(std::move(done));
  size_t pieces = 0;
  Status st = ForEachPiece(ex, length, offset, len, [&](const Piece&) {
    ++pieces;
    return Status::OK();
  });
  if (!st.ok() || pieces == 0) {
    core->Defer([cb, st]() mutable { cb(st); });
    return;
  }
  auto finish = [core, cb](Status s) mutable {
    cb(s.ok() ? core->Vouch() : s);
  };
  if (pieces == 1) {  // the usual case: no join to allocate
    (void)ForEachPiece(ex, length, offset, len, [&](const Piece& p) {
      issue(p, std::move(finish));
      return Status::OK();
    });
    return;
  }
  auto join = std::make_shared<Join>();
  join->left = pieces;
  join->done = std::move(finish);
  (void)ForEachPiece(ex, length, offset, len, [&](const Piece& p) {
    issue(p, [join](Status s) { join->One(s); });
    return Status::OK();
  });
}

template <typename Extent, typename IssueFn>
void WordAsync(SessionCore* core, const std::vector<Extent>& ex,
               uint64_t length, uint64_t offset, Mapping::ValueCallback done,
               IssueFn issue) {
  auto cb = core->Track<Result<uint64_t>>(std::move(done));
  auto w = Word(ex, length, offset);
  if (!w.ok()) {
    core->Defer([cb, st = w.status()]() mutable { cb(st); });
    return;
  }
  auto old = std::make_shared<uint64_t>(0);
  issue(*w, old.get(), [core, cb, old](Status s) mutable {
    if (s.ok()) s = core->Vouch();
    if (s.ok()) {
      cb(*old);
    } else {
      cb(s);
    }
  });
}

}  // namespace

void Mapping::ReadAsync(uint64_t offset, void* dst, size_t len, Callback done) {
  fabric::Endpoint* ep = session_->core()->endpoint();
  auto* out = static_cast<uint8_t*>(dst);
  PiecesAsync(session_->core(), extents_, length_, offset, len, std::move(done),
              [&](const Piece& p, fabric::Completion c) {
                ep->Get(out + p.buffer_at, p.len, *p.region, p.offset,
                        std::move(c));
              });
}

void Mapping::WriteAsync(uint64_t offset, const void* src, size_t len,
                         Callback done) {
  fabric::Endpoint* ep = session_->core()->endpoint();
  const auto* in = static_cast<const uint8_t*>(src);
  PiecesAsync(session_->core(), extents_, length_, offset, len, std::move(done),
              [&](const Piece& p, fabric::Completion c) {
                ep->Put(in + p.buffer_at, p.len, *p.region, p.offset,
                        std::move(c));
              });
}

void Mapping::CompareAndSwapAsync(uint64_t offset, uint64_t expected,
                                  uint64_t desired, ValueCallback done) {
  fabric::Endpoint* ep = session_->core()->endpoint();
  WordAsync(session_->core(), extents_, length_, offset, std::move(done),
            [&](const Piece& p, uint64_t* old, fabric::Completion c) {
              ep->CompareSwap(expected, desired, *p.region, p.offset, old,
                              std::move(c));
            });
}

void Mapping::FetchAddAsync(uint64_t offset, uint64_t delta,
                            ValueCallback done) {
  fabric::Endpoint* ep = session_->core()->endpoint();
  WordAsync(session_->core(), extents_, length_, offset, std::move(done),
            [&](const Piece& p, uint64_t* old, fabric::Completion c) {
              ep->FetchAdd(delta, *p.region, p.offset, old, std::move(c));
            });
}

}  // namespace remem
