#include "space/service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "fabric/memory_region.h"
#include "space/codec.h"
#include "util/size.h"

namespace remem::space {

using server::Route;

namespace {

constexpr uint64_t kDefaultChunk = 64 << 10;
// The most one region may hold: chunk indices are 32-bit, and regions stay
// under the server's --region-size default.
constexpr uint64_t kRegionBytes = 1ull << 30;

}  // namespace

void SpaceService::DeclareOptions(server::OptionSet* o) {
  o->AddSize(
      "--space-memory", &options_.memory,
      "of --memory, bytes for namespaces of raw remote memory "
      "(default a sixteenth, or what the hash store and the tree leave if "
      "less; none if that is under 1 MiB)");
  o->AddSize("--space-chunk", &options_.chunk,
             "the namespaces' allocation unit: a power of two from 4K to 64M "
             "(default 64K)");
}

Status SpaceService::Init(server::ServiceContext* ctx) {
  uint64_t chunk = options_.chunk == 0 ? kDefaultChunk : options_.chunk;
  if (chunk < 4096 || chunk > (64ull << 20) || (chunk & (chunk - 1)) != 0) {
    return Status::InvalidArgument(
        "--space-chunk must be a power of two from 4K to 64M");
  }
  uint64_t memory = options_.memory;
  if (memory == 0) {
    // A sixteenth, of what the other services left: a server whose
    // --hash-memory and --tree-memory take all of --memory still starts
    // (with no namespaces, as it did before there were any).
    memory = std::min(ctx->memory_budget() / 16, ctx->memory_unallocated());
    if (memory < (1ull << 20)) memory = 0;
    // A chunk asked for that the default cannot hold: refused, as one that
    // an explicit --space-memory cannot hold is (namespaces were silently
    // off).
    if (options_.chunk != 0 && memory < chunk) {
      return Status::InvalidArgument(
          "--space-chunk " + FormatSize(chunk) +
          " is more than the namespaces' memory, " + FormatSize(memory) +
          " (--space-memory, by default a sixteenth of --memory or what "
          "--hash-memory and --tree-memory leave, none under 1 MiB): give "
          "--space-memory of at least one --space-chunk, or a smaller "
          "--space-chunk");
    }
  } else if (memory < chunk) {
    return Status::InvalidArgument(
        "--space-memory must hold at least one --space-chunk");
  }
  if (memory >= ctx->memory_budget()) {
    return Status::InvalidArgument("--space-memory must be less than --memory");
  }
  memory -= memory % chunk;
  ctx->NameMemory("--space-memory", memory, options_.memory == 0);
  std::vector<SpaceRegion> regions;
  while (memory > 0) {
    const uint64_t len = std::min(memory, kRegionBytes);
    auto r = ctx->AllocateRegion(len, proto::RegionAccess::kReadWrite);
    if (!r.ok()) return r.status();
    regions.push_back({(*r)->id(), static_cast<uint8_t*>((*r)->base()), len});
    memory -= len;
  }
  table_ = std::make_unique<SpaceTable>(regions, chunk);
  return Status::OK();
}

Result<Route> SpaceService::RouteCall(uint8_t method,
                                      std::string_view payload) const {
  if (method >= num_methods()) {
    return Status::ProtocolError("unknown namespace method");
  }
  auto r = DecodeRequest(payload);
  if (!r.ok()) return r.status();
  return Route::To(0);
}

Status SpaceService::Run(const server::Call& call, std::string* reply) {
  auto req = DecodeRequest(call.payload);
  if (!req.ok()) return req.status();
  SpaceTable& t = *table_;
  if (t.total_bytes() == 0) {
    return Status::Unsupported(
        "this server has no memory for namespaces (start it with "
        "--space-memory SIZE)");
  }
  auto entry = [&](Result<NamespaceEntry> e) {
    if (!e.ok()) return e.status();
    *reply = EncodeNamespace(*e);
    return Status::OK();
  };
  switch (static_cast<SpaceMethod>(call.method)) {
    case SpaceMethod::kCreate:
      return entry(t.Create(req->name));
    case SpaceMethod::kOpen:
      return entry(t.Open(req->name));
    case SpaceMethod::kDelete:
      return t.Delete(req->name);
    case SpaceMethod::kList:
      *reply = EncodeNamespaceList(t.List());
      return Status::OK();
    case SpaceMethod::kInfo:
      return entry(t.Info(req->ns));
    case SpaceMethod::kReserve:
      return entry(t.Reserve(req->ns, req->length));
    case SpaceMethod::kRelease:
      return entry(t.Release(req->ns, req->length));
    case SpaceMethod::kAlloc: {
      auto s = t.Alloc(req->ns, req->length);
      if (!s.ok()) return s.status();
      *reply = EncodeSegment(*s);
      return Status::OK();
    }
    case SpaceMethod::kFree:
      return t.Free(req->ns, req->address);
    case SpaceMethod::kSegments: {
      auto s = t.Segments(req->ns);
      if (!s.ok()) return s.status();
      *reply = EncodeSegmentList(*s);
      return Status::OK();
    }
    case SpaceMethod::kMap: {
      auto m = t.Map(req->ns, req->address, req->length, call.connection);
      if (!m.ok()) return m.status();
      *reply = EncodeMapReply(*m);
      return Status::OK();
    }
    case SpaceMethod::kUnmap:
      return t.Unmap(req->map_id, call.connection);
    case SpaceMethod::kCount:
      break;
  }
  return Status::ProtocolError("unknown namespace method");
}

void SpaceService::Handle(server::PartitionId /*p*/, server::Call call) {
  std::string reply;
  Status st = Run(call, &reply);
  call.responder.Reply(st, std::move(reply));
}

void SpaceService::OnConnectionClosed(server::PartitionId p,
                                      server::ConnectionId c) {
  if (p == 0 && table_ != nullptr) table_->DropConnection(c);
}

void SpaceService::Stats(server::StatsBuilder* out) const {
  if (table_ == nullptr) return;
  const SpaceTable::Counters& c = table_->counters();
  out->Add("space_bytes_total", table_->total_bytes());
  out->Add("space_chunk_bytes", table_->chunk_bytes());
  out->Add("space_bytes_free", c.free_bytes.load(std::memory_order_relaxed));
  out->Add("space_bytes_reserved",
           c.reserved_bytes.load(std::memory_order_relaxed));
  out->Add("space_bytes_allocated",
           c.allocated_bytes.load(std::memory_order_relaxed));
  out->Add("space_bytes_held", c.held_bytes.load(std::memory_order_relaxed));
  out->Add("space_namespaces", c.namespaces.load(std::memory_order_relaxed));
  out->Add("space_segments", c.segments.load(std::memory_order_relaxed));
  out->Add("space_maps", c.maps.load(std::memory_order_relaxed));
}

}  // namespace remem::space
