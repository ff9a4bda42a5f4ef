#include "txn/service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "durability/durability.h"
#include "fabric/memory_region.h"
#include "txn/codec.h"

namespace remem::txn {

using server::Route;

void TxnService::DeclareOptions(server::OptionSet* o) {
  o->AddSize("--txn-memory", &memory_option_,
             "of --memory, bytes for transactional objects (default a "
             "sixteenth, or what the other data models leave if less; none "
             "if that is under 1 MiB); rounded down to whole MiB, its pages");
}

Status TxnService::Init(server::ServiceContext* ctx) {
  uint64_t memory = memory_option_;
  if (memory == 0) {
    memory = std::min(ctx->memory_budget() / 16, ctx->memory_unallocated());
    if (memory < kPageBytes) memory = 0;
  } else if (memory < kPageBytes) {
    return Status::InvalidArgument("--txn-memory must be at least 1M");
  }
  if (memory >= ctx->memory_budget()) {
    return Status::InvalidArgument("--txn-memory must be less than --memory");
  }
  memory -= memory % kPageBytes;
  ctx->NameMemory("--txn-memory", memory, memory_option_ == 0);
  std::vector<ObjectHeap::Region> regions;
  Info info;
  info.max_object = kMaxObjectBytes;
  while (memory > 0) {
    const uint64_t len = std::min(memory, kRegionBytes);
    auto r = ctx->AllocateRegion(len, proto::RegionAccess::kReadOnly);
    if (!r.ok()) return r.status();
    TxnRegionWire w{};
    w.region = (*r)->id();
    w.heap_offset = info.heap_bytes;
    w.length = len;
    info.regions.push_back(w);
    info.heap_bytes += len;
    regions.push_back({(*r)->id(), static_cast<uint8_t*>((*r)->base()), len});
    memory -= len;
  }
  // Without a data directory every start is a new heap: its slots start at
  // an incarnation of this start (the server's random incarnation, folded),
  // so that an id from before a restart does not name an object made after
  // it. With one, slots keep their incarnations across restarts.
  durability::Durability* d = ctx->durability();
  const uint64_t start = ctx->incarnation();
  const uint32_t first_incarnation =
      d != nullptr ? 1 : uint32_t(start ^ (start >> 32));
  heap_ = std::make_unique<ObjectHeap>(std::move(regions), first_incarnation);
  info_reply_ = EncodeInfo(info);
  if (d != nullptr) {
    durable_ = std::make_unique<DurableHeap>(heap_.get());
    // Also with no object memory: objects on disk are then refused loudly,
    // never dropped.
    auto store = d->OpenPartition(name(), 0, durable_.get());
    if (!store.ok()) return store.status();
    store_ = *store;
  }
  return Status::OK();
}

Result<Route> TxnService::RouteCall(uint8_t method,
                                    std::string_view payload) const {
  if (method >= num_methods()) {
    return Status::ProtocolError("unknown object method");
  }
  // Malformed fixed requests are refused before they are queued. A commit
  // is decoded once, where it runs (Run refuses a malformed one there): its
  // entries are the commit's whole cost on the server.
  if (static_cast<TxnMethod>(method) != TxnMethod::kCommit) {
    auto r = DecodeRequest(payload);
    if (!r.ok()) return r.status();
  }
  return Route::To(0);
}

Status TxnService::Run(const server::Call& call, std::string* reply) {
  const auto method = static_cast<TxnMethod>(call.method);
  if (method == TxnMethod::kInfo) {
    *reply = info_reply_;
    return Status::OK();
  }
  if (heap_->heap_bytes() == 0) {
    return Status::Unsupported(
        "this server has no memory for transactional objects (start it "
        "with --txn-memory SIZE)");
  }
  if (store_ != nullptr &&
      (method == TxnMethod::kCommit || method == TxnMethod::kRelease)) {
    // A disk that fails refuses changes before any is made.
    REMEM_RETURN_IF_ERROR(store_->Writable());
  }
  if (method == TxnMethod::kCommit) {
    auto entries = DecodeCommit(call.payload);
    if (!entries.ok()) return entries.status();
    auto versions = heap_->Commit(*entries, call.connection);
    if (!versions.ok()) return versions.status();
    *reply = EncodeVersions(*versions);
    return Status::OK();
  }
  auto req = DecodeRequest(call.payload);
  if (!req.ok()) return req.status();
  switch (method) {
    case TxnMethod::kAlloc: {
      auto id = heap_->Reserve(req->capacity, call.connection);
      if (!id.ok()) return id.status();
      *reply = EncodeObjectId(*id);
      return Status::OK();
    }
    case TxnMethod::kRelease:
      return heap_->Release(req->id, call.connection);
    case TxnMethod::kRead: {
      auto got = heap_->Read(req->id);
      if (!got.ok()) return got.status();
      *reply = EncodeReadReply(got->first, got->second);
      return Status::OK();
    }
    default:
      break;
  }
  return Status::ProtocolError("unknown object method");
}

void TxnService::Handle(server::PartitionId /*p*/, server::Call call) {
  std::string reply;
  Status st = Run(call, &reply);
  const auto method = static_cast<TxnMethod>(call.method);
  if (store_ == nullptr ||
      (method != TxnMethod::kCommit && method != TxnMethod::kRelease) ||
      !durable_->LogChanged(store_)) {
    return call.responder.Reply(st, std::move(reply));
  }
  // Answered once its records are on disk (as the fsync policy says); a
  // refused commit too, since it gave its reservations back.
  store_->AfterDurable([responder = std::move(call.responder),
                        st = std::move(st),
                        reply = std::move(reply)](Status disk) mutable {
    responder.Reply(st.ok() ? std::move(disk) : std::move(st),
                    std::move(reply));
  });
}

void TxnService::OnConnectionClosed(server::PartitionId p,
                                    server::ConnectionId c) {
  if (p != 0 || heap_ == nullptr) return;
  heap_->DropOwner(c);
  if (store_ != nullptr) durable_->LogChanged(store_);
}

void TxnService::Stats(server::StatsBuilder* out) const {
  if (heap_ == nullptr) return;
  const ObjectHeap::Counters& c = heap_->counters();
  auto get = [](const std::atomic<uint64_t>& v) {
    return v.load(std::memory_order_relaxed);
  };
  out->Add("txn_bytes_total", heap_->heap_bytes());
  out->Add("txn_bytes_used", get(c.bytes_used));
  out->Add("txn_pages_used", get(c.pages_used));
  out->Add("txn_objects", get(c.objects));
  out->Add("txn_reserved", get(c.reserved));
  out->Add("txn_commits", get(c.commits));
  out->Add("txn_conflicts", get(c.conflicts));
}

}  // namespace remem::txn
