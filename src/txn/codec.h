// Encoders and validating decoders for the object service's payloads
// (txn/wire.h), on the helpers of proto/buffer.h. Every decoder takes
// untrusted bytes and returns ProtocolError with a reason instead of
// reading past the end; fuzz/proto_fuzz.cc drives them.
//
// Thread contract: pure functions.

#ifndef REMEM_TXN_CODEC_H_
#define REMEM_TXN_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"
#include "txn/wire.h"

namespace remem::txn {

struct Request {
  uint32_t capacity = 0;
  TxnObjectIdWire id{};
};
std::string EncodeRequest(const Request& r);
Result<Request> DecodeRequest(std::string_view payload);

struct Info {
  uint32_t max_object = 0;
  uint64_t heap_bytes = 0;
  std::vector<TxnRegionWire> regions;
};
std::string EncodeInfo(const Info& i);
// Also checks that the regions tile [0, heap_bytes) in order.
Result<Info> DecodeInfo(std::string_view payload);

std::string EncodeObjectId(const TxnObjectIdWire& id);
Result<TxnObjectIdWire> DecodeObjectId(std::string_view payload);

struct CommitEntry {
  TxnObjectIdWire id{};
  uint64_t version = 0;
  TxnOp op = TxnOp::kCheck;
  std::string_view data;  // kWrite, kCreate (into the payload when decoded)
};
std::string EncodeCommit(const std::vector<CommitEntry>& entries);
// Checks the magic, version, ops, sizes (at most kMaxObjectBytes, data only
// on kWrite and kCreate) and the entry count (1..kMaxCommitEntries).
Result<std::vector<CommitEntry>> DecodeCommit(std::string_view payload);

std::string EncodeVersions(const std::vector<uint64_t>& versions);
Result<std::vector<uint64_t>> DecodeVersions(std::string_view payload);

struct ReadReply {
  uint64_t version = 0;
  std::string_view data;  // into the payload
};
std::string EncodeReadReply(uint64_t version, std::string_view data);
Result<ReadReply> DecodeReadReply(std::string_view payload);

}  // namespace remem::txn

#endif  // REMEM_TXN_CODEC_H_
