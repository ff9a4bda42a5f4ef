#include "server/hello_reader.h"

#include <cstring>

#include "remem/version.h"

namespace remem::server {

// The public header's wire version (remem/version.h) is this one.
static_assert(kWireVersion == proto::kWireVersion);

size_t HelloReader::Wanted() const {
  const size_t need = want_ != 0 ? want_ : sizeof(proto::ClientHello);
  return need - in_.size();
}

Status HelloReader::Feed(std::string_view bytes) {
  if (bytes.size() > Wanted()) {
    return Status::Internal("HelloReader fed more than it wants");
  }
  const size_t before = in_.size();
  in_.append(bytes);
  if (want_ != 0) return Status::OK();
  const size_t have = in_.size();
  constexpr size_t kMagicEnd = sizeof(uint32_t);
  if (before < kMagicEnd && have >= kMagicEnd) {
    uint32_t magic;
    std::memcpy(&magic, in_.data(), sizeof(magic));
    if (magic != proto::kWireMagic) {
      return Status::ProtocolError(
          "not a remem client (bad magic in the handshake)");
    }
  }
  constexpr size_t kVersionEnd = offsetof(proto::ClientHello, version) + 2;
  if (before < kVersionEnd && have >= kVersionEnd) {
    uint16_t version;
    std::memcpy(&version, in_.data() + kVersionEnd - 2, sizeof(version));
    if (version != proto::kWireVersion) {
      return Status::ProtocolError(
          "client speaks wire version " + std::to_string(version) +
          ", server speaks " + std::to_string(proto::kWireVersion));
    }
  }
  if (have == sizeof(proto::ClientHello)) {
    proto::ClientHello h;
    auto body = proto::DecodeClientHelloPrefix(in_, &h);
    if (!body.ok()) return body.status();
    want_ = sizeof(h) + *body;
  }
  return Status::OK();
}

Result<proto::ClientHelloInfo> HelloReader::Take() const {
  if (!done()) return Status::ProtocolError("client hello incomplete");
  return proto::DecodeClientHello(in_);
}

}  // namespace remem::server
