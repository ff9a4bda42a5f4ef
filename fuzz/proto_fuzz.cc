// libFuzzer target for remem's wire decoders: every decoder must reject or
// accept arbitrary bytes without reading out of bounds, and whatever a
// decoder accepts must re-encode to the same bytes.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "proto/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace remem::proto;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  if (size >= sizeof(RpcHeader)) {
    (void)DecodeHeader(data, sizeof(RpcHeader), size - sizeof(RpcHeader));
  }
  (void)DecodeHeader(data, size, 0);

  auto hello = DecodeHelloRequest(in);
  if (hello.ok() && hello->version == kWireVersion) {
    // Reserved fields are not round-tripped, so only check the length.
    if (EncodeHelloRequest(*hello).size() != size) std::abort();
  }
  auto reply = DecodeHelloReply(in);
  if (reply.ok()) {
    auto again = DecodeHelloReply(EncodeHelloReply(*reply));
    if (!again.ok() || again->regions.size() != reply->regions.size()) {
      std::abort();
    }
  }
  (void)DecodeStatsReply(in);
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
  return 0;
}
