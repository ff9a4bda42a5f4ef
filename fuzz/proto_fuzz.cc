// libFuzzer target for remem's wire decoders (the TCP handshake the server's
// listening port reads first, RPC headers, regions, stats, served memory
// requests, the hash store's payloads, durable records, bucket walks):
// every decoder must reject or accept arbitrary bytes without reading out
// of bounds, and whatever a decoder accepts must re-encode consistently.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "durability/log.h"
#include "hash/codec.h"
#include "hash/layout.h"
#include "proto/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace remem::proto;
  using namespace remem::hash;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (size >= sizeof(RpcHeader)) {
    (void)DecodeHeader(data, sizeof(RpcHeader), size - sizeof(RpcHeader));
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
  }
  (void)DecodeMemRequest(in, 0);
  (void)DecodeMemReply(in);
  (void)DecodeHashInfo(in);
  (void)DecodeHashKey(in);
  (void)DecodeHashGetReply(in);
  (void)DecodeHashPutReply(in);
  auto put = DecodeHashPut(in);
  if (put.ok() && EncodeHashPut(*put).size() != size) std::abort();
  // Reserved fields are not round-tripped: compare what was decoded.
  auto mget = DecodeHashMultiGet(in);
  if (mget.ok()) {
    const std::string encoded = EncodeHashMultiGet(*mget);  // views into it
    auto again = DecodeHashMultiGet(encoded);
    if (!again.ok() || *again != *mget) std::abort();
  }
  auto mput = DecodeHashMultiPut(in);
  if (mput.ok()) {
    const std::string encoded = EncodeHashMultiPut(*mput);
    auto again = DecodeHashMultiPut(encoded);
    if (!again.ok() || *again != *mput) std::abort();
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
  // A bucket's entry area as a reader walks it: a checksum can be forged,
  // so the walk itself must stay inside the area whatever the bytes.
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
  return 0;
}
