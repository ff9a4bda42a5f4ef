// Encoders and validating decoders for the namespace service's payloads
// (space/wire.h), on the helpers of proto/buffer.h. Every decoder takes
// untrusted bytes and returns ProtocolError with a reason instead of
// reading past the end; fuzz/proto_fuzz.cc drives them.
//
// Thread contract: pure functions.

#ifndef REMEM_SPACE_CODEC_H_
#define REMEM_SPACE_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"
#include "space/wire.h"

namespace remem::space {

struct Request {
  uint64_t ns = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t map_id = 0;
  std::string_view name;  // into the payload
};
std::string EncodeRequest(const Request& r);
// Checks the magic and version, and that the name fits; not the name's
// characters (CheckName).
Result<Request> DecodeRequest(std::string_view payload);

// InvalidArgument unless `name` is 1..kMaxNameBytes of printable ASCII
// without spaces.
Status CheckName(std::string_view name);

struct NamespaceEntry {
  uint64_t ns = 0;
  uint64_t reserved_bytes = 0;
  uint64_t allocated_bytes = 0;
  uint32_t segments = 0;
  uint32_t chunk_bytes = 0;
  std::string name;  // in lists only
};
std::string EncodeNamespace(const NamespaceEntry& e);
Result<NamespaceEntry> DecodeNamespace(std::string_view payload);
std::string EncodeNamespaceList(const std::vector<NamespaceEntry>& list);
Result<std::vector<NamespaceEntry>> DecodeNamespaceList(
    std::string_view payload);

std::string EncodeSegment(const SpaceSegmentWire& s);
Result<SpaceSegmentWire> DecodeSegment(std::string_view payload);
std::string EncodeSegmentList(const std::vector<SpaceSegmentWire>& list);
Result<std::vector<SpaceSegmentWire>> DecodeSegmentList(
    std::string_view payload);

struct MapReply {
  uint64_t map_id = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  std::vector<SpaceExtentWire> extents;
};
std::string EncodeMapReply(const MapReply& m);
// Also checks that the extents add up to the length, each non-empty.
Result<MapReply> DecodeMapReply(std::string_view payload);

}  // namespace remem::space

#endif  // REMEM_SPACE_CODEC_H_
