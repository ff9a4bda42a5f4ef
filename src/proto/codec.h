// Encoders and validating decoders for the messages in wire.h.
//
// Every decoder takes untrusted bytes, checks every length against the
// buffer before reading, and returns ProtocolError with a reason instead of
// reading past the end. The fuzz target in fuzz/ drives all of them.
//
// Thread contract: pure functions.

#ifndef REMEM_PROTO_CODEC_H_
#define REMEM_PROTO_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/wire.h"
#include "remem/status.h"

namespace remem::proto {

// Builds a header for a request or reply.
RpcHeader MakeHeader(Opcode op, uint64_t request_id, uint64_t payload_len,
                     bool reply, StatusCode status = StatusCode::kOk);

// Validates an AM header: size, magic, version, opcode range, flags, and that
// `payload_len` matches the AM data length `data_len`.
Result<RpcHeader> DecodeHeader(const void* data, size_t len, size_t data_len);

struct Hello {
  uint16_t version = kWireVersion;
  std::string secret;
};
std::string EncodeHelloRequest(const Hello& hello);
Result<Hello> DecodeHelloRequest(std::string_view payload);

struct RegionInfoWire {
  uint32_t region_id = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;  // packed UCX remote key
};

struct HelloReplyInfo {
  uint64_t incarnation = 0;
  uint64_t max_payload = 0;
  uint32_t server_threads = 0;
  std::vector<RegionInfoWire> regions;
};
std::string EncodeHelloReply(const HelloReplyInfo& info);
Result<HelloReplyInfo> DecodeHelloReply(std::string_view payload);

std::string EncodeStatsReply(const StatsReply& stats);
Result<StatsReply> DecodeStatsReply(std::string_view payload);

// --- served one-sided operations
MemRequest MakeMemRequest(MemOp op, uint32_t region, uint64_t request_id,
                          uint64_t offset, uint64_t length,
                          uint64_t operand = 0, uint64_t operand2 = 0);
// Validates a memory request header (the AM header) against the AM data
// length: size, magic, version, op, reserved fields, atomics of 8 bytes,
// writes carrying exactly `length` bytes, reads and atomics carrying none,
// and `length` at most kMaxMemTransfer. Bounds are the server's to check.
Result<MemRequest> DecodeMemRequest(std::string_view header, size_t data_len);

MemReply MakeMemReply(MemOp op, uint64_t request_id, StatusCode status,
                      uint64_t value = 0);
// Validates a memory reply header: size, magic, version, op, reserved.
Result<MemReply> DecodeMemReply(std::string_view header);

// --- hash store
struct HashInfo {
  uint32_t max_key = 0;
  uint32_t max_value = 0;
  uint64_t partition_seed = 0;
  std::vector<HashPartition> partitions;
};
std::string EncodeHashInfo(const HashInfo& info);
Result<HashInfo> DecodeHashInfo(std::string_view payload);

std::string EncodeHashKey(std::string_view key);
Result<std::string_view> DecodeHashKey(std::string_view payload);

struct HashPut {
  std::string_view key;
  std::string_view value;
  PutMode mode = PutMode::kUpsert;
  uint64_t expected_version = 0;
};
std::string EncodeHashPut(const HashPut& put);
// The views point into `payload`.
Result<HashPut> DecodeHashPut(std::string_view payload);

std::string EncodeHashGetReply(uint64_t version, std::string_view value);
struct HashValue {
  uint64_t version = 0;
  std::string value;
};
Result<HashValue> DecodeHashGetReply(std::string_view payload);

std::string EncodeHashPutReply(uint64_t version);
Result<uint64_t> DecodeHashPutReply(std::string_view payload);

// Multi-get / multi-put (wire.h: HashMultiRequest). Decoders check every
// length against the payload and the item count against kMaxMultiItems.
std::string EncodeHashMultiGet(const std::vector<std::string_view>& keys);
Result<std::vector<std::string_view>> DecodeHashMultiGet(
    std::string_view payload);
using KeyValue = std::pair<std::string_view, std::string_view>;
std::string EncodeHashMultiPut(const std::vector<KeyValue>& pairs);
Result<std::vector<KeyValue>> DecodeHashMultiPut(std::string_view payload);
struct MultiItem {
  Status status;
  uint64_t version = 0;
  std::string data;  // value (get) or nothing (put)
};
std::string EncodeHashMultiReply(const std::vector<MultiItem>& items);
Result<std::vector<MultiItem>> DecodeHashMultiReply(std::string_view payload,
                                                    size_t expected_count);

}  // namespace remem::proto

#endif  // REMEM_PROTO_CODEC_H_
