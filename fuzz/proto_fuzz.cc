// libFuzzer target for remem's wire decoders (the TCP handshake the server's
// listening port reads first, RPC headers, regions, stats, served memory
// requests, the hash store's payloads, durable records, bucket walks, the
// cluster configuration), and
// for what the server reads before anything reaches UCX: the acceptor's
// incremental handshake reader (server/hello_reader.h) fed in arbitrary
// pieces, and the UCX worker address parser (fabric/worker_address.h);
// and the Redis front door's request decoder (frontdoor/resp.h).
// Every decoder must reject or accept arbitrary bytes without reading out
// of bounds, and whatever a decoder accepts must re-encode consistently.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/config.h"
#include "cluster/wire.h"
#include "durability/log.h"
#include "fabric/worker_address.h"
#include "frontdoor/resp.h"
#include "hash/codec.h"
#include "hash/layout.h"
#include "ops/apply.h"
#include "ops/vector.h"
#include "proto/codec.h"
#include "server/hello_reader.h"
#include "space/codec.h"
#include "tree/codec.h"
#include "tree/node.h"
#include "txn/codec.h"

namespace {

// A function table for the engine: one update function and one reduction
// (id 1 and 2, as a --ops-library would register), so decoded calls and
// user reductions reach a function. Both read every byte they are given.
int FuzzUpdate(int present, const uint8_t* value, size_t value_len,
               const uint8_t* arg, size_t arg_len, uint8_t* out, size_t out_cap,
               size_t* out_len) {
  size_t n = 0;
  for (size_t i = 0; present && i < value_len && n < out_cap; ++i) {
    out[n++] = value[i];
  }
  for (size_t i = 0; i < arg_len && n < out_cap; ++i) out[n++] = arg[i];
  *out_len = n;
  return n % 3 == 0 ? REMEM_OPS_REFUSE : REMEM_OPS_WRITE;
}
int FuzzReduce(uint32_t elem_type, const void* elems, uint64_t count,
               remem_ops_number* out) {
  const size_t size =
      elem_type == REMEM_OPS_INT64 || elem_type == REMEM_OPS_DOUBLE ? 8 : 4;
  const auto* p = static_cast<const uint8_t*>(elems);
  int64_t acc = 0;
  for (uint64_t i = 0; i < count * size; ++i) acc += p[i];
  out->type = acc % 2 == 0 ? REMEM_OPS_INT64 : REMEM_OPS_DOUBLE;
  out->i = acc;
  out->d = double(acc);
  return acc % 5 == 0 ? REMEM_OPS_REFUSE : REMEM_OPS_REDUCED;
}
struct FuzzFunctions : remem::ops::FunctionLookup {
  remem::ops::UserFunction update{1, "fuzz_update", FuzzUpdate};
  remem::ops::UserReduction reduce{
      2, "fuzz_reduce",
      REMEM_OPS_TYPE_BIT(REMEM_OPS_INT64) | REMEM_OPS_TYPE_BIT(REMEM_OPS_INT32),
      FuzzReduce};
  const remem::ops::UserFunction* Find(uint32_t id) const override {
    return id == 1 ? &update : nullptr;
  }
  const remem::ops::UserReduction* FindReduction(uint32_t id) const override {
    return id == 2 ? &reduce : nullptr;
  }
};

struct ReaderRun {
  size_t consumed = 0;
  bool done = false;
  std::string error;  // the refusal, if any
};

// Feeds `in` to a HelloReader in pieces whose sizes come from `cuts` (one
// byte per piece, cycled; empty: as much as it wants each time), never more
// than it asks for, until it is done, refuses, or the input ends.
ReaderRun FeedReader(std::string_view in, std::string_view cuts) {
  remem::server::HelloReader r;
  ReaderRun run;
  size_t c = 0;
  while (run.consumed < in.size()) {
    const size_t wanted = r.Wanted();
    if (wanted == 0) break;
    size_t n = wanted;
    if (!cuts.empty()) {
      n = 1 + static_cast<uint8_t>(cuts[c++ % cuts.size()]) % 64;
      n = std::min(n, wanted);
    }
    n = std::min(n, in.size() - run.consumed);
    remem::Status st = r.Feed(in.substr(run.consumed, n));
    run.consumed += n;
    if (!st.ok()) {
      run.error = st.message();
      return run;
    }
  }
  run.done = r.done();
  if (run.done) {
    auto hello = r.Take();
    if (!hello.ok()) std::abort();  // done means decodable
    if (remem::proto::EncodeClientHello(*hello) != in.substr(0, run.consumed)) {
      std::abort();
    }
  }
  return run;
}

// The Redis front door's decoder over a stream of requests: each command
// consumed is within the bytes, re-encodes as a multibulk request that
// decodes to the same arguments, and a multibulk request's first half
// needs more.
void FuzzResp(std::string_view in) {
  using remem::frontdoor::Decoded;
  constexpr size_t kMaxBulk = 4096;
  std::vector<std::string> args, again;
  std::string error;
  for (int n = 0; n < 64 && !in.empty(); ++n) {
    size_t used = 0;
    const Decoded d =
        remem::frontdoor::DecodeRequest(in, kMaxBulk, &args, &used, &error);
    if (d == Decoded::kNeedMore || d == Decoded::kError) return;
    if (used == 0 || used > in.size()) std::abort();
    if (d == Decoded::kCommand) {
      if (args.empty()) std::abort();
      std::string re = "*" + std::to_string(args.size()) + "\r\n";
      for (const auto& a : args) {
        if (a.size() > kMaxBulk) std::abort();
        re += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
      }
      size_t used_again = 0;
      if (remem::frontdoor::DecodeRequest(re, kMaxBulk, &again, &used_again,
                                          &error) != Decoded::kCommand ||
          again != args || used_again != re.size()) {
        std::abort();
      }
      if (in[0] == '*' && used > 1 &&
          remem::frontdoor::DecodeRequest(in.substr(0, used / 2), kMaxBulk,
                                          &again, &used_again,
                                          &error) != Decoded::kNeedMore) {
        std::abort();
      }
    }
    in.remove_prefix(used);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace remem::proto;
  using namespace remem::hash;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (size >= sizeof(RpcHeader)) {
    (void)DecodeHeader(data, sizeof(RpcHeader), size - sizeof(RpcHeader));
  }
  if (size >= sizeof(SealedRpcHeader)) {
    const size_t n = size - sizeof(SealedRpcHeader);
    auto h = DecodeHeader(data, sizeof(SealedRpcHeader), n);
    if (h.ok()) {
      (void)VerifySeal(data, sizeof(SealedRpcHeader),
                       in.substr(sizeof(SealedRpcHeader)));
    }
  }
  (void)DecodeHeader(data, size, 0);

  // The handshake, as the server's acceptor reads it: the prefix alone,
  // then the whole message; whatever is accepted re-encodes to its length.
  if (size >= sizeof(ClientHello)) {
    ClientHello h;
    auto body = DecodeClientHelloPrefix(in.substr(0, sizeof(h)), &h);
    if (body.ok() &&
        (*body > size_t{kMaxSecretBytes} + kMaxWorkerAddressBytes)) {
      std::abort();  // the prefix must bound what the server reads next
    }
  }
  auto hello = DecodeClientHello(in);
  if (hello.ok() && EncodeClientHello(*hello).size() != size) std::abort();

  // The acceptor's reader: the same verdict however the bytes are cut, and
  // never more bytes than the prefix allows.
  {
    const size_t split = size == 0 ? 0 : data[0] % 16;
    const std::string_view cuts = in.substr(0, std::min(split, size));
    const ReaderRun whole = FeedReader(in, {});
    const ReaderRun pieces = FeedReader(in, cuts);
    if (whole.done != pieces.done || whole.error != pieces.error) std::abort();
    if (whole.error.empty() && whole.consumed != pieces.consumed) std::abort();
    if (whole.consumed >
        sizeof(ClientHello) + kMaxSecretBytes + kMaxWorkerAddressBytes) {
      std::abort();
    }
    // A hello the one-shot decoder accepts, of this wire version, is one
    // the reader accepts (the decoder leaves the version to its caller).
    if (hello.ok() && hello->version == kWireVersion &&
        !(whole.done && whole.consumed == size)) {
      std::abort();
    }
  }

  // A UCX worker address: parsed within bounds, views inside the input.
  {
    auto addr = remem::fabric::ParseWorkerAddress(in);
    if (addr.ok()) {
      const char* lo = in.data();
      const char* hi = in.data() + in.size();
      for (const auto& e : addr->ifaces) {
        for (std::string_view v : {e.device_address, e.iface_address}) {
          if (!v.empty() && (v.data() < lo || v.data() + v.size() > hi)) {
            std::abort();
          }
        }
        (void)remem::fabric::SharedMemoryRefOf(e);
      }
    }
  }
  auto server_hello = DecodeServerHello(in);
  if (server_hello.ok()) {
    auto again = DecodeServerHello(EncodeServerHello(*server_hello));
    if (!again.ok() || again->worker_address != server_hello->worker_address ||
        again->status.code() != server_hello->status.code()) {
      std::abort();
    }
  }
  auto regions = DecodeRegionsReply(in);
  if (regions.ok()) {
    auto again = DecodeRegionsReply(EncodeRegionsReply(*regions));
    if (!again.ok() || again->regions.size() != regions->regions.size()) {
      std::abort();
    }
  }
  auto stats = DecodeStatsReply(in);
  if (stats.ok()) {
    auto again = DecodeStatsReply(EncodeStatsReply(*stats));
    if (!again.ok() || again->size() != stats->size()) std::abort();
  }
  if (size >= sizeof(ServerLease)) {
    ServerLease l;
    std::memcpy(&l, data, sizeof(l));
    (void)LeaseVerifies(l);
  }
  if (size >= sizeof(MemRequest)) {
    auto mem = DecodeMemRequest(in.substr(0, sizeof(MemRequest)),
                                size - sizeof(MemRequest));
    if (mem.ok() && mem->length > kMaxMemTransfer) std::abort();
    if (mem.ok() && mem->op == uint8_t(MemOp::kReadMany)) {
      // The server's next step: the spans, which must add up to the
      // header's length, each within one request, and survive re-encoding.
      std::vector<MemSpan> spans;
      const std::string_view rest = in.substr(sizeof(MemRequest));
      if (DecodeMemSpans(rest, mem->length, &spans).ok()) {
        uint64_t total = 0;
        for (const MemSpan& s : spans) {
          if (s.length > kMaxMemTransfer || s.reserved != 0) std::abort();
          total += s.length;
        }
        if (total != mem->length || spans.empty() ||
            spans.size() > kMaxMemSpans || EncodeMemSpans(spans) != rest) {
          std::abort();
        }
      }
    }
  }
  {
    // Spans alone, against the length their first 8 bytes name.
    uint64_t length = 0;
    if (size >= 8) std::memcpy(&length, data, 8);
    std::vector<MemSpan> spans;
    if (DecodeMemSpans(in.substr(std::min<size_t>(size, 8)), length, &spans)
            .ok() &&
        spans.empty()) {
      std::abort();
    }
  }
  (void)DecodeMemRequest(in, 0);
  (void)DecodeMemReply(in);
  (void)DecodeHashInfo(in);
  if (auto key = DecodeHashKey(in); key.ok()) {
    // A get's flags survive the round trip with its key.
    const uint32_t flags = HashReadFlags(in);
    const std::string encoded = EncodeHashKey(*key, flags);
    if (encoded != in || HashReadFlags(encoded) != flags) std::abort();
  }
  (void)DecodeHashGetReply(in);
  (void)DecodeHashPutReply(in);
  auto put = DecodeHashPut(in);
  if (put.ok() && EncodeHashPut(*put).size() != size) std::abort();
  // Reserved fields are not round-tripped: compare what was decoded.
  auto mget = DecodeHashMultiGet(in);
  if (mget.ok()) {
    const uint32_t flags = HashReadFlags(in);
    // Views into it.
    const std::string encoded = EncodeHashMultiGet(*mget, flags);
    auto again = DecodeHashMultiGet(encoded);
    if (!again.ok() || *again != *mget || encoded != in) std::abort();
  }
  auto mput = DecodeHashMultiPut(in);
  if (mput.ok()) {
    const std::string encoded = EncodeHashMultiPut(*mput);
    auto again = DecodeHashMultiPut(encoded);
    if (!again.ok() || *again != *mput) std::abort();
  }
  auto mop = DecodeHashMultiOp(in);
  if (mop.ok()) {
    const std::string encoded = EncodeHashMultiOp(*mop);
    auto again = DecodeHashMultiOp(encoded);
    if (!again.ok() || again->size() != mop->size()) std::abort();
    for (size_t i = 0; i < mop->size(); ++i) {
      const auto& a = (*again)[i];
      const auto& b = (*mop)[i];
      if (a.op != b.op || a.key != b.key || a.value != b.value) std::abort();
    }
  }
  if (size >= sizeof(HashMultiReply)) {
    uint32_t count;
    std::memcpy(&count, data, sizeof(count));
    auto items = DecodeHashMultiReply(in, count);
    if (items.ok()) {
      auto again = DecodeHashMultiReply(EncodeHashMultiReply(*items), count);
      if (!again.ok() || again->size() != items->size()) std::abort();
    }
  }

  // Server-side operations: requests round-trip (what was decoded); the
  // engine's pure functions take any decoded op on any value without
  // reading out of bounds.
  auto op = DecodeHashOp(in);
  if (op.ok()) {
    if (EncodeHashOp(*op).size() != size) std::abort();
    bool present = true;
    std::string value(in.substr(0, size / 2));
    remem::ops::Outcome out;
    static const FuzzFunctions functions;
    (void)remem::ops::Apply(*op, 1 << 16, nullptr, &present, &value, &out);
    value = std::string(op->arg);
    (void)remem::ops::Apply(*op, 1 << 16, &functions, &present, &value, &out);
    // A user reduction or call by the table's ids on the argument's bytes
    // (a vector when the input makes one).
    remem::ops::OpView user = *op;
    user.function_id = user.kind == remem::OpKind::kCall ? 1 : 2;
    value = std::string(op->arg);
    present = true;
    (void)remem::ops::Apply(user, 1 << 16, &functions, &present, &value, &out);
  }
  auto opb = DecodeHashOpBatch(in);
  if (opb.ok()) {
    const std::string encoded = EncodeHashOpBatch(*opb);
    auto again = DecodeHashOpBatch(encoded);
    if (!again.ok() || again->size() != opb->size()) std::abort();
    for (size_t i = 0; i < opb->size(); ++i) {
      const auto& a = (*again)[i];
      const auto& b = (*opb)[i];
      if (a.kind != b.kind || a.key != b.key || a.arg != b.arg ||
          a.expected != b.expected || a.initial != b.initial) {
        std::abort();
      }
    }
  }
  auto opr = DecodeHashOpReply(in);
  if (opr.ok() && EncodeHashOpReply(*opr).size() != size) std::abort();
  if (size >= sizeof(HashMultiReply)) {
    uint32_t count;
    std::memcpy(&count, data, sizeof(count));
    auto items = DecodeHashOpBatchReply(in, count);
    if (items.ok()) {
      auto again =
          DecodeHashOpBatchReply(EncodeHashOpBatchReply(*items), count);
      if (!again.ok() || again->size() != items->size()) std::abort();
    }
  }
  (void)remem::ops::ParseVector(in);
  if (size > 9) {
    std::string v(in.substr(9));
    (void)remem::ops::UpdateVector(&v, remem::VecFn(data[0] % 6),
                                   in.substr(1, 8));
    (void)remem::ops::ReduceVector(v, remem::Reduction(data[0] % 6));
    (void)remem::ops::FilterVector(v, remem::Predicate(data[0] % 7),
                                   in.substr(1, 8), data[0] & 1);
  }

  // A durable record (log or snapshot file bytes, read back from disk):
  // whatever parses re-encodes to the same bytes.
  {
    remem::durability::Record r{};
    size_t n = 0;
    if (remem::durability::ParseRecord(in, &r, &n) ==
        remem::durability::ParseOutcome::kOk) {
      std::string out;
      remem::durability::EncodeRecord(&out, r.type, r.lsn, r.version, r.key,
                                      r.value);
      if (n > size || out != in.substr(0, n)) std::abort();
    }
  }
  // Moving shards between cluster members (hash/wire.h kShardExport ..):
  // what decodes re-encodes to the same bytes.
  {
    if (auto l = DecodeShardList(in); l.ok()) {
      if (EncodeShardList(*l) != in) std::abort();
    }
    if (auto e = DecodeShardExport(in); e.ok()) {
      if (EncodeShardExport(*e) != in) std::abort();
    }
    if (auto p = DecodeShardPairs(in); p.ok()) {
      ShardPairsWriter w;
      for (const auto& pr : p->pairs) {
        if (pr.fill) {
          w.AddFill(pr.key, pr.value, pr.version);
        } else {
          w.Add(pr.key, pr.value, pr.version, pr.deleted);
        }
      }
      if (w.Finish(p->generation, p->cursor, p->num_partitions,
                   p->max_version) != in) {
        std::abort();
      }
    }
    if (auto f = DecodeShardFillReply(in); f.ok()) {
      if (EncodeShardFillReply(*f) != in) std::abort();
    }
  }
  // The cluster configuration (served to clients by any member; read from
  // ZooKeeper by servers) and a member's registration: whatever decodes
  // re-encodes to the same bytes.
  {
    auto c = remem::cluster::DecodeConfig(in);
    if (c.ok()) {
      // Older versions (still read) re-encode as the current one: what
      // that gives decodes to itself; an input of the current version
      // re-encodes to its own bytes.
      const std::string again = remem::cluster::EncodeConfig(*c);
      auto c2 = remem::cluster::DecodeConfig(again);
      if (!c2.ok() || remem::cluster::EncodeConfig(*c2) != again) std::abort();
      uint16_t version = 0;
      std::memcpy(&version, in.data() + 4, sizeof(version));
      if (version == remem::cluster::kConfigVersion && again != in) {
        std::abort();
      }
    }
    // An older registration re-encodes as version 3, which decodes to the
    // same member; a version 3 one re-encodes to its own bytes.
    auto m = remem::cluster::DecodeMemberRecord(in);
    if (m.ok()) {
      const std::string again = remem::cluster::EncodeMemberRecord(*m);
      auto m2 = remem::cluster::DecodeMemberRecord(again);
      if (!m2.ok() || m2->address != m->address ||
          m2->capacity != m->capacity || m2->incarnation != m->incarnation ||
          m2->domain != m->domain) {
        std::abort();
      }
      if (in.rfind("remem-member 3\n", 0) == 0 && again != in) std::abort();
    }
  }
  // A member's lease ask and the manager's grant: re-encode to the bytes.
  {
    auto a = remem::cluster::DecodeLeaseAsk(in);
    if (a.ok() && remem::cluster::EncodeLeaseAsk(*a) != in) std::abort();
    auto g = remem::cluster::DecodeLeaseGrant(in);
    if (g.ok() && remem::cluster::EncodeLeaseGrant(*g) != in) std::abort();
  }
  // A bucket's entry area as EntryCursor walks it (the server, and the
  // seal that indexes it): the walk must stay inside the area whatever the
  // bytes.
  if (size >= remem::hash::kEntryAreaBytes) {
    remem::hash::EntryCursor c(data);
    char sink[remem::hash::kEntryAreaBytes];
    while (c.Next()) {
      if (c.head().kind == remem::hash::kInline) {
        std::memcpy(sink, c.inline_key(), c.key_len());
        std::memcpy(sink, c.inline_value(), c.value_len());
      }
      (void)c.word1();
    }
  }
  // The namespace service's payloads: what a decoder accepts re-encodes to
  // the same bytes (reserved fields aside: compare the decoded fields).
  {
    namespace space = remem::space;
    if (auto r = space::DecodeRequest(in); r.ok()) {
      const std::string bytes = space::EncodeRequest(*r);  // `again` views it
      auto again = space::DecodeRequest(bytes);
      if (!again.ok() || again->ns != r->ns || again->address != r->address ||
          again->length != r->length || again->map_id != r->map_id ||
          again->name != r->name) {
        std::abort();
      }
    }
    if (auto m = space::DecodeMapReply(in); m.ok()) {
      auto again = space::DecodeMapReply(space::EncodeMapReply(*m));
      if (!again.ok() || again->extents.size() != m->extents.size() ||
          again->length != m->length) {
        std::abort();
      }
    }
    if (auto l = space::DecodeNamespaceList(in); l.ok()) {
      auto again = space::DecodeNamespaceList(space::EncodeNamespaceList(*l));
      if (!again.ok() || again->size() != l->size()) std::abort();
    }
    if (auto sl = space::DecodeSegmentList(in); sl.ok()) {
      if (space::EncodeSegmentList(*sl).size() != in.size()) std::abort();
    }
    (void)space::DecodeNamespace(in);
    (void)space::DecodeSegment(in);
  }
  // The object service's payloads (transactions): an accepted commit
  // re-encodes to the same entries; data views stay inside the input.
  {
    namespace txn = remem::txn;
    if (auto c = txn::DecodeCommit(in); c.ok()) {
      const char* lo = in.data();
      const char* hi = in.data() + in.size();
      for (const auto& e : *c) {
        if (!e.data.empty() &&
            (e.data.data() < lo || e.data.data() + e.data.size() > hi)) {
          std::abort();
        }
      }
      const std::string bytes = txn::EncodeCommit(*c);
      auto again = txn::DecodeCommit(bytes);
      if (!again.ok() || again->size() != c->size()) std::abort();
      for (size_t i = 0; i < c->size(); ++i) {
        if ((*again)[i].data != (*c)[i].data || (*again)[i].op != (*c)[i].op ||
            (*again)[i].version != (*c)[i].version) {
          std::abort();
        }
      }
    }
    if (auto i = txn::DecodeInfo(in); i.ok()) {
      if (txn::EncodeInfo(*i).size() != in.size()) std::abort();
    }
    if (auto v = txn::DecodeVersions(in); v.ok()) {
      if (txn::EncodeVersions(*v).size() != in.size()) std::abort();
    }
    if (auto r = txn::DecodeReadReply(in); r.ok()) {
      if (r->version % 2 != 0 || r->data.size() > txn::kMaxObjectBytes) {
        std::abort();
      }
    }
    (void)txn::DecodeRequest(in);
    (void)txn::DecodeObjectId(in);
  }
  // The ordered store's payloads: what a decoder accepts re-encodes to the
  // same bytes; and a node image as a reader parses it (checksum skipped,
  // so the structural checks see arbitrary bytes) stays inside the node.
  {
    namespace tree = remem::tree;
    if (auto k = tree::DecodeTreeKey(in); k.ok()) {
      if (tree::EncodeTreeKey(*k) != in) std::abort();
    }
    if (auto p = tree::DecodeTreePut(in); p.ok()) {
      // Reserved bytes are not checked: compare the decoded fields.
      const std::string bytes = tree::EncodeTreePut(*p);
      auto again = tree::DecodeTreePut(bytes);
      if (!again.ok() || again->key != p->key || again->value != p->value ||
          again->mode != p->mode ||
          again->expected_version != p->expected_version) {
        std::abort();
      }
    }
    if (auto sc = tree::DecodeTreeScan(in); sc.ok()) {
      const std::string bytes = tree::EncodeTreeScan(*sc);
      auto again = tree::DecodeTreeScan(bytes);
      if (!again.ok() || again->start != sc->start || again->end != sc->end ||
          again->limit != sc->limit || again->descending != sc->descending) {
        std::abort();
      }
    }
    if (auto page = tree::DecodeTreeScanReply(in); page.ok()) {
      auto again = tree::DecodeTreeScanReply(tree::EncodeTreeScanReply(*page));
      if (!again.ok() || again->items.size() != page->items.size() ||
          again->resume != page->resume || again->more != page->more) {
        std::abort();
      }
    }
    if (auto keys = tree::DecodeTreeMultiGet(in); keys.ok()) {
      if (tree::EncodeTreeMultiGet(*keys) != in) std::abort();
    }
    if (auto rr = tree::DecodeTreeRange(in); rr.ok()) {
      if (tree::EncodeTreeRange(*rr) != in) std::abort();
    }
    if (auto rp = tree::DecodeRangePairs(in); rp.ok()) {
      tree::RangePairsWriter w;
      for (const tree::RangeItem& it : rp->items) {
        if (it.fill) {
          w.AddFill(it.key, it.value, it.version);
        } else {
          w.Add(it.key, it.value, it.version, it.deleted);
        }
      }
      if (w.Finish(rp->resume, rp->max_version, rp->more, rp->sender) != in) {
        std::abort();
      }
    }
    if (auto pairs = tree::DecodeTreeMultiPut(in); pairs.ok()) {
      if (tree::EncodeTreeMultiPut(*pairs) != in) std::abort();
    }
    if (in.size() >= sizeof(tree::TreeMultiReply)) {
      uint32_t count;
      std::memcpy(&count, in.data(), sizeof(count));
      (void)tree::DecodeTreeMultiGetReply(in, count);
      (void)tree::DecodeTreeMultiPutReply(in, count);
    }
    (void)tree::DecodeTreeInfo(in);
    (void)tree::DecodeTreeGetReply(in);
    (void)tree::DecodeTreePutReply(in);
    if (auto fill = tree::DecodeTreeRangeFillReply(in); fill.ok()) {
      if (tree::EncodeTreeRangeFillReply(*fill) != in) std::abort();
    }
    if (size >= tree::kNodeBytes) {
      // As a reader's copy (the checksum made right, so that the order
      // and length checks behind it run), and as a cached or own image.
      // (A `used` past the node is refused before the checksum.)
      std::vector<uint8_t> copy(data, data + tree::kNodeBytes);
      tree::NodeHeader h;
      std::memcpy(&h, copy.data(), sizeof(h));
      const size_t in_use = tree::NodeBytesInUse(h.used);
      const uint64_t sum =
          tree::NodeChecksum(copy.data(), uint16_t(in_use - sizeof(h)));
      std::memcpy(copy.data(), &sum, sizeof(sum));
      // The copy ends after its bytes in use (ASan sees a read past them).
      copy.resize(in_use);
      tree::NodeView checked;
      if (checked.Parse(copy.data(), remem::tree::kNoNode).ok()) {
        (void)checked.ResolveKeys([](const tree::KeyRef& r, char* dst) {
          std::memset(dst, 'k', r.key_len);
          return remem::Status::OK();
        });
      }
      tree::NodeView v;
      if (v.Parse(data, remem::tree::kNoNode, /*checksum=*/false).ok()) {
        // Whatever parses lies inside the node (a long key takes a KeyRef
        // there, and names at most kMaxKey bytes).
        auto stored = [](std::string_view k, const tree::KeyRef& r) {
          if (r.key_len > tree::kMaxKey) std::abort();
          return r.key_len != 0 ? sizeof(tree::KeyRef) : k.size();
        };
        size_t bytes = stored(v.low(), v.low_ref()) +
                       (v.has_high() ? stored(v.high(), v.high_ref()) : 0);
        for (size_t i = 0; i < v.count(); ++i) {
          bytes += stored(v.key(i), v.key_ref(i));
          if (v.leaf()) {
            bytes += v.value(i).size();
            (void)v.entry_version(i);
          } else {
            (void)v.child(i);
          }
        }
        if (bytes > v.header().used) std::abort();
        // Long keys resolved to made-up bytes: in order or refused.
        int next = 0;
        const bool resolved =
            v.ResolveKeys([&next](const tree::KeyRef& r, char* dst) {
               std::memset(dst, 'a' + next++ % 26, r.key_len);
               return remem::Status::OK();
             }).ok();
        if (resolved) {
          (void)v.LowerBound(in.substr(0, 8));
          (void)tree::Decode(v);
        }
      }
    }
  }
  FuzzResp(in);
  return 0;
}
