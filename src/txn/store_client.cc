// The client side of transactional objects (remem/txn.h): one-sided reads
// of objects, verified by their checksums, and commits by one call to the
// object service (or, read-only, by reading the versions again).

#include <charconv>
#include <cstring>
#include <set>
#include <thread>

#include "client/session_core.h"
#include "remem/txn.h"
#include "txn/codec.h"
#include "txn/wire.h"

namespace remem {

namespace txn {

struct StoreState {
  Session* session = nullptr;
  Info info;
  std::vector<const fabric::RemoteRegion*> regions;  // heap order
  std::string scratch;                               // reads' buffer
};

}  // namespace txn

using client::SessionCore;
using txn::TxnMethod;

namespace {

// Copies that fail verification (a commit writing the object, or a torn
// copy) before the server is asked.
constexpr int kOneSidedTries = 32;

txn::TxnObjectIdWire ToWire(const ObjectId& id) {
  return {id.address, id.incarnation, id.capacity};
}

Result<std::string> Call(txn::StoreState* s, TxnMethod m, std::string payload) {
  return s->session->core()->CallSync(txn::kTxnService, txn::MethodId(m),
                                      std::move(payload));
}

std::string Describe(const ObjectId& id) { return "object " + id.ToString(); }

// Where `bytes` of the slot `id` names lie: its region and offset there;
// InvalidArgument for an id no slot could have, NotFound for one whose
// capacity would run past its region's end (a slot of another class, as
// the server answers).
Status Locate(const txn::StoreState& s, const ObjectId& id, uint64_t bytes,
              const fabric::RemoteRegion** region, uint64_t* offset) {
  const uint64_t in_region = id.address % txn::kRegionBytes;
  const size_t r = id.address / txn::kRegionBytes;
  if (!txn::IsSlotShaped(id.address, id.capacity) || r >= s.regions.size() ||
      in_region >= s.info.regions[r].length) {
    return Status::InvalidArgument(Describe(id) + " is not an object id");
  }
  if (in_region + bytes > s.info.regions[r].length) {
    return Status::NotFound("no object " + id.ToString());
  }
  *region = s.regions[r];
  *offset = in_region;
  return Status::OK();
}

// Whether the header of a copy of the slot `id` names verifies: kVerified
// (in *h), kOtherSlot (it verifies under another class's capacity: the id's
// capacity is not its slot's, and the id names no object), or kTorn.
enum class HeaderIs { kVerified, kOtherSlot, kTorn };
HeaderIs CheckHeader(const char* copy, const ObjectId& id,
                     txn::ObjectHeader* h) {
  std::memcpy(h, copy, sizeof(*h));
  if (txn::HeaderCheck(*h, id.capacity) == h->header_check) {
    return HeaderIs::kVerified;
  }
  for (size_t c = 0; c < txn::kNumClasses; ++c) {
    const uint32_t capacity = txn::CapacityOf(c);
    if (capacity != id.capacity &&
        txn::HeaderCheck(*h, capacity) == h->header_check) {
      return HeaderIs::kOtherSlot;
    }
  }
  return HeaderIs::kTorn;
}

// What a one-sided copy of the object `id` (header and capacity bytes)
// holds: the object (kWhole, in *object), no object (kGone: freed, never
// committed, or a slot of another capacity than the id's), or nothing to
// trust (kTorn: it raced a commit).
enum class CopyIs { kWhole, kGone, kTorn };
CopyIs Judge(const char* copy, const ObjectId& id,
             ObjectStore::Object* object) {
  txn::ObjectHeader h;
  switch (CheckHeader(copy, id, &h)) {
    case HeaderIs::kVerified:
      break;
    case HeaderIs::kOtherSlot:
      return CopyIs::kGone;
    case HeaderIs::kTorn:
      return CopyIs::kTorn;
  }
  if (h.incarnation != id.incarnation || h.version == 0) return CopyIs::kGone;
  if (h.version % 2 != 0 || h.size > id.capacity) return CopyIs::kTorn;
  const char* data = copy + sizeof(h);
  if (txn::DataChecksum(h, data, h.size) != h.checksum) return CopyIs::kTorn;
  *object = ObjectStore::Object{std::string(data, h.size), h.version};
  return CopyIs::kWhole;
}

// One verified one-sided copy of the object: OK, NotFound, or Busy when
// every copy failed verification (ask the server).
Result<ObjectStore::Object> ReadOneSided(txn::StoreState* s,
                                         const ObjectId& id) {
  const fabric::RemoteRegion* region = nullptr;
  uint64_t offset = 0;
  const uint64_t n = sizeof(txn::ObjectHeader) + id.capacity;
  REMEM_RETURN_IF_ERROR(Locate(*s, id, n, &region, &offset));
  SessionCore* core = s->session->core();
  s->scratch.resize(n);
  for (int attempt = 0; attempt < kOneSidedTries; ++attempt) {
    if (attempt >= 4) std::this_thread::yield();  // a commit is writing it
    REMEM_RETURN_IF_ERROR(core->ReadNow(*region, offset, s->scratch.data(), n));
    ObjectStore::Object object;
    switch (Judge(s->scratch.data(), id, &object)) {
      case CopyIs::kTorn:
        continue;
      case CopyIs::kGone:
        REMEM_RETURN_IF_ERROR(core->Vouch());
        return Status::NotFound("no " + Describe(id));
      case CopyIs::kWhole:
        REMEM_RETURN_IF_ERROR(core->Vouch());
        return object;
    }
  }
  return Status::Busy("every copy of " + Describe(id) + " was torn");
}

Result<ObjectStore::Object> ReadObject(txn::StoreState* s, const ObjectId& id) {
  auto got = ReadOneSided(s, id);
  if (got.ok() || got.status().code() != StatusCode::kBusy) return got;
  txn::Request r;
  r.id = ToWire(id);
  auto reply = Call(s, TxnMethod::kRead, txn::EncodeRequest(r));
  if (!reply.ok()) return reply.status();
  auto rr = txn::DecodeReadReply(*reply);
  if (!rr.ok()) return rr.status();
  return ObjectStore::Object{std::string(rr->data), rr->version};
}

// The objects `ids` read at once: one-sided in one burst (where the server
// performs one-sided reads, one request for all of them), each verified;
// one whose copy raced a commit is read again alone (ReadObject). out[i]
// is ids[i]'s; NotFound for the first that is gone.
Status ReadObjects(txn::StoreState* s, const std::vector<ObjectId>& ids,
                   std::vector<ObjectStore::Object>* out) {
  std::vector<fabric::Endpoint::GetSpan> spans;
  std::vector<size_t> at;  // each copy's place in `copies`
  size_t total = 0;
  for (const ObjectId& id : ids) {
    fabric::Endpoint::GetSpan g{
        nullptr, sizeof(txn::ObjectHeader) + id.capacity, nullptr, 0};
    REMEM_RETURN_IF_ERROR(Locate(*s, id, g.len, &g.region, &g.offset));
    spans.push_back(g);
    at.push_back(total);
    total += g.len;
  }
  // Not s->scratch, which ReadObject uses.
  std::string copies(total, '\0');
  for (size_t i = 0; i < spans.size(); ++i) {
    spans[i].dst = copies.data() + at[i];
  }
  SessionCore* core = s->session->core();
  REMEM_RETURN_IF_ERROR(core->ReadManyNow(spans));
  out->assign(ids.size(), ObjectStore::Object{});
  for (size_t i = 0; i < ids.size(); ++i) {
    switch (Judge(copies.data() + at[i], ids[i], &(*out)[i])) {
      case CopyIs::kWhole:
        break;
      case CopyIs::kGone:
        REMEM_RETURN_IF_ERROR(core->Vouch());
        return Status::NotFound("no " + Describe(ids[i]));
      case CopyIs::kTorn: {
        auto again = ReadObject(s, ids[i]);
        if (!again.ok()) return again.status();
        (*out)[i] = std::move(*again);
        break;
      }
    }
  }
  return core->Vouch();
}

// Whether the object still has the version read (FaRM's validation of a
// read-only transaction, one object): OK or Conflict. The caller vouches
// for the reads once all are done.
Status ValidateOne(txn::StoreState* s, const ObjectId& id, uint64_t version) {
  SessionCore* core = s->session->core();
  char copy[sizeof(txn::ObjectHeader)];
  const fabric::RemoteRegion* region = nullptr;
  uint64_t offset = 0;
  REMEM_RETURN_IF_ERROR(Locate(*s, id, sizeof(copy), &region, &offset));
  for (int attempt = 0; attempt < kOneSidedTries; ++attempt) {
    if (attempt >= 4) std::this_thread::yield();
    REMEM_RETURN_IF_ERROR(core->ReadNow(*region, offset, copy, sizeof(copy)));
    txn::ObjectHeader h;
    const HeaderIs is = CheckHeader(copy, id, &h);
    if (is == HeaderIs::kOtherSlot) break;
    if (is == HeaderIs::kTorn) continue;  // torn, or being written
    if (h.version == version && h.incarnation == id.incarnation) {
      return Status::OK();
    }
    break;
  }
  return Status::Conflict(Describe(id) + " changed since it was read");
}

}  // namespace

// --- ObjectId

std::string ObjectId::Encode() const {
  std::string out(kEncodedBytes, '\0');
  std::memcpy(out.data(), &address, 8);
  std::memcpy(out.data() + 8, &incarnation, 4);
  std::memcpy(out.data() + 12, &capacity, 4);
  return out;
}

Result<ObjectId> ObjectId::Decode(std::string_view bytes) {
  if (bytes.size() != kEncodedBytes) {
    return Status::InvalidArgument("an encoded object id is 16 bytes");
  }
  ObjectId id;
  std::memcpy(&id.address, bytes.data(), 8);
  std::memcpy(&id.incarnation, bytes.data() + 8, 4);
  std::memcpy(&id.capacity, bytes.data() + 12, 4);
  return id;
}

std::string ObjectId::ToString() const {
  return std::to_string(address) + ":" + std::to_string(incarnation) + ":" +
         std::to_string(capacity);
}

Result<ObjectId> ObjectId::Parse(std::string_view text) {
  ObjectId id;
  auto field = [&](std::string_view part, auto* out) {
    auto [at, ec] =
        std::from_chars(part.data(), part.data() + part.size(), *out);
    return !part.empty() && ec == std::errc() &&
           at == part.data() + part.size();
  };
  const size_t a = text.find(':');
  const size_t b = a == std::string_view::npos ? a : text.find(':', a + 1);
  if (b == std::string_view::npos || !field(text.substr(0, a), &id.address) ||
      !field(text.substr(a + 1, b - a - 1), &id.incarnation) ||
      !field(text.substr(b + 1), &id.capacity)) {
    return Status::InvalidArgument("bad object id '" + std::string(text) +
                                   "' (ADDRESS:INCARNATION:CAPACITY)");
  }
  return id;
}

// --- ObjectStore

ObjectStore::ObjectStore(std::unique_ptr<txn::StoreState> state)
    : state_(std::move(state)) {}
ObjectStore::~ObjectStore() = default;

Result<std::unique_ptr<ObjectStore>> ObjectStore::Open(Session* session) {
  auto s = std::make_unique<txn::StoreState>();
  s->session = session;
  auto reply = Call(s.get(), TxnMethod::kInfo, txn::EncodeRequest({}));
  if (!reply.ok()) return reply.status();
  auto info = txn::DecodeInfo(*reply);
  if (!info.ok()) return info.status();
  if (info->heap_bytes == 0) {
    return Status::Unsupported(
        "this server has no memory for transactional objects (start it "
        "with --txn-memory SIZE)");
  }
  for (const txn::TxnRegionWire& r : info->regions) {
    const fabric::RemoteRegion* region = session->core()->region(r.region);
    if (region == nullptr || !region->Check(0, r.length).ok()) {
      return Status::ProtocolError("object info names memory outside region " +
                                   std::to_string(r.region));
    }
    s->regions.push_back(region);
  }
  s->info = std::move(*info);
  return std::unique_ptr<ObjectStore>(new ObjectStore(std::move(s)));
}

uint32_t ObjectStore::max_object() const { return state_->info.max_object; }

Result<ObjectStore::Object> ObjectStore::Read(ObjectId id) {
  return ReadObject(state_.get(), id);
}

std::unique_ptr<Transaction> ObjectStore::Begin() {
  return std::unique_ptr<Transaction>(new Transaction(state_.get()));
}

Status ObjectStore::Run(const std::function<Status(Transaction&)>& body,
                        int tries) {
  Status st = Status::Conflict("no try was made");
  for (int i = 0; i < tries; ++i) {
    std::unique_ptr<Transaction> tx = Begin();
    Status done = body(*tx);
    if (!done.ok()) {
      // An error the body drew from reads that were not consistent with
      // each other (an object changed between two of them) is not the
      // body's answer: it runs again.
      Status valid = tx->ValidateReads();
      tx->Abort();
      if (valid.code() == StatusCode::kConflict) continue;
      return done;
    }
    st = tx->Commit();
    if (st.code() != StatusCode::kConflict) return st;
    if (i >= 2) std::this_thread::yield();
  }
  return st;
}

// --- Transaction

Transaction::~Transaction() { Abort(); }

Status Transaction::ValidateReads() {
  SessionCore* core = store_->session->core();
  if (core->reads_are_local() || reads_.size() < 2) {
    // Copies of mapped memory (or one header): nothing to gain from a
    // burst.
    for (const auto& [id, r] : reads_) {
      REMEM_RETURN_IF_ERROR(ValidateOne(store_, id, r.version));
    }
    return core->Vouch();
  }
  // Every header read again in one burst (where the server performs
  // one-sided reads, one request); one that raced a commit is read again
  // alone.
  constexpr size_t kHeader = sizeof(txn::ObjectHeader);
  std::vector<fabric::Endpoint::GetSpan> spans;
  std::string copies(reads_.size() * kHeader, '\0');
  for (const auto& [id, r] : reads_) {
    fabric::Endpoint::GetSpan g{copies.data() + spans.size() * kHeader, kHeader,
                                nullptr, 0};
    REMEM_RETURN_IF_ERROR(Locate(*store_, id, kHeader, &g.region, &g.offset));
    spans.push_back(g);
  }
  REMEM_RETURN_IF_ERROR(core->ReadManyNow(spans));
  size_t i = 0;
  for (const auto& [id, r] : reads_) {
    txn::ObjectHeader h;
    if (CheckHeader(copies.data() + kHeader * i++, id, &h) !=
        HeaderIs::kVerified) {
      REMEM_RETURN_IF_ERROR(ValidateOne(store_, id, r.version));
    } else if (h.version != r.version || h.incarnation != id.incarnation) {
      return Status::Conflict(Describe(id) + " changed since it was read");
    }
  }
  return core->Vouch();
}

Status Transaction::Validate() {
  REMEM_RETURN_IF_ERROR(Usable());
  return ValidateReads();
}

Status Transaction::Usable() const {
  if (done_) {
    return Status::InvalidArgument(
        "the transaction is over (committed or "
        "aborted)");
  }
  return Status::OK();
}

Result<std::string> Transaction::Read(ObjectId id, uint64_t* version) {
  REMEM_RETURN_IF_ERROR(Usable());
  if (version != nullptr) *version = 0;
  if (auto w = writes_.find(id); w != writes_.end()) {
    if (w->second.freed) {
      return Status::NotFound(Describe(id) + " was freed by this transaction");
    }
    return w->second.data;
  }
  if (auto r = reads_.find(id); r != reads_.end()) {
    if (version != nullptr) *version = r->second.version;
    return r->second.data;
  }
  auto got = ReadObject(store_, id);
  if (!got.ok()) return got.status();
  ReadEntry& e = reads_[id];
  e.version = got->version;
  e.data = std::move(got->data);
  if (version != nullptr) *version = e.version;
  return e.data;
}

Result<std::vector<std::string>> Transaction::ReadMany(
    const std::vector<ObjectId>& ids, std::vector<uint64_t>* versions) {
  REMEM_RETURN_IF_ERROR(Usable());
  // What neither this transaction wrote nor it read yet, once each.
  std::vector<ObjectId> fresh;
  std::set<ObjectId> seen;
  for (const ObjectId& id : ids) {
    if (auto w = writes_.find(id); w != writes_.end()) {
      if (w->second.freed) {
        return Status::NotFound(Describe(id) +
                                " was freed by this transaction");
      }
    } else if (reads_.count(id) == 0 && seen.insert(id).second) {
      fresh.push_back(id);
    }
  }
  // Copies of mapped memory gain nothing from a burst: each is read as
  // Read reads it, and noted only once all are.
  std::vector<ObjectStore::Object> got;
  if (fresh.empty()) {
    // Nothing to read: what Read gives for each.
  } else if (store_->session->core()->reads_are_local()) {
    for (const ObjectId& id : fresh) {
      auto one = ReadObject(store_, id);
      if (!one.ok()) return one.status();
      got.push_back(std::move(*one));
    }
  } else {
    REMEM_RETURN_IF_ERROR(ReadObjects(store_, fresh, &got));
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    ReadEntry& e = reads_[fresh[i]];
    e.version = got[i].version;
    e.data = std::move(got[i].data);
  }
  std::vector<std::string> out;
  out.reserve(ids.size());
  if (versions != nullptr) versions->assign(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto one = Read(ids[i], versions == nullptr ? nullptr : &(*versions)[i]);
    if (!one.ok()) return one.status();
    out.push_back(std::move(*one));
  }
  return out;
}

Status Transaction::Write(ObjectId id, std::string_view data) {
  REMEM_RETURN_IF_ERROR(Usable());
  if (data.size() > id.capacity) {
    return Status::InvalidArgument(
        Describe(id) + " holds " + std::to_string(id.capacity) +
        " bytes, not " + std::to_string(data.size()));
  }
  WriteEntry& w = writes_[id];
  if (w.freed) {
    return Status::InvalidArgument(Describe(id) +
                                   " was freed by this transaction");
  }
  w.data.assign(data);
  return Status::OK();
}

Result<ObjectId> Transaction::Alloc(std::string_view data, uint32_t capacity) {
  REMEM_RETURN_IF_ERROR(Usable());
  if (data.size() > store_->info.max_object ||
      capacity > store_->info.max_object) {
    return Status::InvalidArgument("an object holds at most " +
                                   std::to_string(store_->info.max_object) +
                                   " bytes");
  }
  txn::Request r;
  r.capacity = std::max<uint32_t>(capacity, uint32_t(data.size()));
  auto reply = Call(store_, TxnMethod::kAlloc, txn::EncodeRequest(r));
  if (!reply.ok()) return reply.status();
  auto w = txn::DecodeObjectId(*reply);
  if (!w.ok()) return w.status();
  const ObjectId id{w->address, w->incarnation, w->capacity};
  WriteEntry& e = writes_[id];
  e.data.assign(data);
  e.allocated = true;
  return id;
}

Status Transaction::Free(ObjectId id) {
  REMEM_RETURN_IF_ERROR(Usable());
  auto w = writes_.find(id);
  if (w != writes_.end() && w->second.allocated) {
    // Never committed: its reservation goes back now.
    txn::Request r;
    r.id = ToWire(id);
    writes_.erase(w);
    auto reply = Call(store_, TxnMethod::kRelease, txn::EncodeRequest(r));
    return reply.ok() ? Status::OK() : reply.status();
  }
  WriteEntry& e = writes_[id];
  e.freed = true;
  e.data.clear();
  return Status::OK();
}

Status Transaction::Commit() {
  REMEM_RETURN_IF_ERROR(Usable());
  // A read-only transaction validates one-sided (FaRM), but where the
  // server performs one-sided reads (tcp) each is a round trip: two or
  // more objects are checked by the server in one call instead.
  if (writes_.empty() &&
      (!store_->session->core()->served() || reads_.size() < 2 ||
       reads_.size() > txn::kMaxCommitEntries)) {
    done_ = true;
    return ValidateReads();
  }
  std::vector<txn::CommitEntry> entries;
  entries.reserve(reads_.size() + writes_.size());
  for (const auto& [id, r] : reads_) {
    if (writes_.count(id) != 0) continue;
    txn::CommitEntry e;
    e.id = ToWire(id);
    e.version = r.version;
    e.op = txn::TxnOp::kCheck;
    entries.push_back(e);
  }
  std::vector<ObjectId> written;
  for (const auto& [id, w] : writes_) {
    txn::CommitEntry e;
    e.id = ToWire(id);
    auto r = reads_.find(id);
    e.version = r == reads_.end() ? 0 : r->second.version;
    e.op = w.allocated ? txn::TxnOp::kCreate
           : w.freed   ? txn::TxnOp::kFree
                       : txn::TxnOp::kWrite;
    if (!w.freed) {
      e.data = w.data;
      written.push_back(id);
    }
    entries.push_back(e);
  }
  if (entries.size() > txn::kMaxCommitEntries) {
    Abort();
    return Status::InvalidArgument("a transaction uses at most " +
                                   std::to_string(txn::kMaxCommitEntries) +
                                   " objects");
  }
  done_ = true;
  // The server releases the reservations of a commit it refuses.
  for (auto& [id, w] : writes_) w.allocated = false;
  auto reply = Call(store_, TxnMethod::kCommit, txn::EncodeCommit(entries));
  if (!reply.ok()) return reply.status();
  auto versions = txn::DecodeVersions(*reply);
  if (!versions.ok()) return versions.status();
  if (versions->size() != written.size()) {
    return Status::ProtocolError("commit reply: wrong number of versions");
  }
  for (size_t i = 0; i < written.size(); ++i) {
    committed_[written[i]] = (*versions)[i];
  }
  return Status::OK();
}

void Transaction::Abort() {
  if (done_) return;
  done_ = true;
  SessionCore* core = store_->session->core();
  for (const auto& [id, w] : writes_) {
    if (!w.allocated) continue;
    // Not waited for: the server drops the reservations with the
    // connection anyway.
    txn::Request r;
    r.id = ToWire(id);
    auto cb = core->Track<Status>(nullptr);
    core->Call(txn::kTxnService, txn::MethodId(TxnMethod::kRelease),
               txn::EncodeRequest(r),
               [cb](Status st, std::string) mutable { cb(st); });
  }
}

}  // namespace remem
