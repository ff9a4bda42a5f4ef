// Encoders and validating decoders for the messages in wire.h (the
// handshake, the RPC header, regions, stats, served memory requests).
// Services keep their own codecs beside their wire structs (src/hash/codec.h)
// and build them on proto/buffer.h.
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
#include <vector>

#include "proto/wire.h"
#include "remem/status.h"

namespace remem::proto {

// --- the TCP handshake

struct ClientHelloInfo {
  uint16_t version = kWireVersion;
  std::string secret;
  std::string worker_address;  // the client's UCX worker address
};
std::string EncodeClientHello(const ClientHelloInfo& hello);
// Validates the fixed part alone (magic, version is left to the caller,
// flags, reserved, lengths), so a server can refuse an oversized or foreign
// prefix before reading more. Returns the number of body bytes that follow.
Result<size_t> DecodeClientHelloPrefix(std::string_view prefix,
                                       ClientHello* out);
// The whole message: prefix and body.
Result<ClientHelloInfo> DecodeClientHello(std::string_view message);

struct ServerHelloInfo {
  Status status;               // OK, or why the server refused
  std::string worker_address;  // status OK: the serving worker's address
  uint16_t version = kWireVersion;
  uint64_t incarnation = 0;
  uint64_t session_id = 0;
  uint32_t server_threads = 0;
  uint32_t lease_ms = 0;
  uint64_t endpoint_number = 0;
};
std::string EncodeServerHello(const ServerHelloInfo& hello);
// As DecodeClientHelloPrefix, for the client.
Result<size_t> DecodeServerHelloPrefix(std::string_view prefix,
                                       ServerHello* out);
Result<ServerHelloInfo> DecodeServerHello(std::string_view message);
// The EndpointNotice the serving thread sends for a session it admitted,
// from the ServerHello's incarnation, session id and endpoint number: the
// client builds the same bytes from the ServerHello it read and waits for a
// notice equal to them (fabric::Endpoint::CreateJoined).
std::string EncodeEndpointNotice(uint64_t incarnation, uint64_t session_id,
                                 uint64_t endpoint_number);

// --- RPCs

// Builds a header for a request or reply.
RpcHeader MakeHeader(ServiceId service, uint8_t method, uint64_t request_id,
                     uint64_t payload_len, bool reply,
                     StatusCode status = StatusCode::kOk, uint32_t epoch = 0);

// Validates an AM header: size (32 bytes, or 40 when sealed), magic,
// version, flags, reserved, and that `payload_len` matches the AM data
// length `data_len`. The service and
// method are the dispatcher's to check (it knows which exist).
Result<RpcHeader> DecodeHeader(const void* data, size_t len, size_t data_len);

// The AM header to send `payload` with: `h` alone (32 bytes), or, for a
// payload of kSealMin bytes or more, `h` with kFlagSealed and the payload's
// seal (a SealedRpcHeader, 40 bytes), in *out. Returns its length.
size_t SealHeader(const RpcHeader& h, std::string_view payload,
                  SealedRpcHeader* out);
// For a header DecodeHeader accepted: OK if it is not sealed or `payload`
// matches its seal; ProtocolError otherwise (the payload is not the one
// sealed).
Status VerifySeal(const void* header, size_t len, std::string_view payload);

struct RegionInfoWire {
  uint32_t region_id = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  ServiceId service = kCoreService;
  RegionAccess access = RegionAccess::kReadWrite;
  std::string rkey;  // packed UCX remote key
};

struct RegionsInfo {
  uint64_t incarnation = 0;
  uint64_t max_payload = 0;
  uint32_t server_threads = 0;
  std::vector<RegionInfoWire> regions;
};
std::string EncodeRegionsReply(const RegionsInfo& info);
Result<RegionsInfo> DecodeRegionsReply(std::string_view payload);

// Named stats, in the order the server listed them.
struct StatValue {
  std::string name;
  StatKind kind = StatKind::kNumber;
  uint64_t value = 0;
  std::string text;
};
std::string EncodeStatsReply(const std::vector<StatValue>& stats);
Result<std::vector<StatValue>> DecodeStatsReply(std::string_view payload);
// True if `name` is a valid stat name ([a-z0-9_.], 1..kMaxStatName).
bool ValidStatName(std::string_view name);

// --- served one-sided operations
MemRequest MakeMemRequest(MemOp op, uint32_t region, uint64_t request_id,
                          uint64_t offset, uint64_t length,
                          uint64_t operand = 0, uint64_t operand2 = 0);
// Validates a memory request header (the AM header) against the AM data
// length: size, magic, version, op, reserved fields, atomics of 8 bytes,
// writes carrying exactly `length` bytes, reads and atomics carrying none,
// a kReadMany region and offset 0 and 1 to kMaxMemSpans whole spans, and
// `length` at most kMaxMemTransfer. Bounds are the server's to check.
Result<MemRequest> DecodeMemRequest(std::string_view header, size_t data_len);
// The spans of a kReadMany (AM data), packed.
std::string EncodeMemSpans(const std::vector<MemSpan>& spans);
// The spans of a kReadMany whose header said `length` bytes: 1 to
// kMaxMemSpans whole spans, reserved fields zero, lengths adding up to
// `length`. Bounds are the server's to check.
Status DecodeMemSpans(std::string_view data, uint64_t length,
                      std::vector<MemSpan>* spans);

MemReply MakeMemReply(MemOp op, uint64_t request_id, StatusCode status,
                      uint64_t value = 0);
// Validates a memory reply header: size, magic, version, op, reserved.
Result<MemReply> DecodeMemReply(std::string_view header);

// --- the server lease (read one-sided by clients)

// The lease image the server publishes (version even, checksum set).
ServerLease MakeLease(uint64_t version, uint64_t incarnation,
                      uint64_t expires_ns, uint64_t renewals,
                      uint64_t lease_ns);
// True if a copy of the lease verifies: even version, magic, checksum.
bool LeaseVerifies(const ServerLease& lease);

}  // namespace remem::proto

#endif  // REMEM_PROTO_CODEC_H_
