#include "remem/options.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace remem {

std::string_view TransportName(Transport t) {
  switch (t) {
    case Transport::kAuto:
      return "auto";
    case Transport::kShm:
      return "shm";
    case Transport::kTcp:
      return "tcp";
  }
  return "?";
}

Result<Transport> ParseTransport(std::string_view name) {
  if (name == "auto") return Transport::kAuto;
  if (name == "shm") return Transport::kShm;
  if (name == "tcp") return Transport::kTcp;
  return Status::InvalidArgument("unknown transport '" + std::string(name) +
                                 "' (expected auto, shm or tcp)");
}

std::string_view ReadPathName(ReadPath p) {
  switch (p) {
    case ReadPath::kAuto:
      return "auto";
    case ReadPath::kOneSided:
      return "onesided";
    case ReadPath::kRpc:
      return "rpc";
  }
  return "?";
}

Result<ReadPath> ParseReadPath(std::string_view name) {
  if (name == "auto") return ReadPath::kAuto;
  if (name == "onesided" || name == "one-sided") return ReadPath::kOneSided;
  if (name == "rpc") return ReadPath::kRpc;
  return Status::InvalidArgument("unknown read path '" + std::string(name) +
                                 "' (expected onesided, rpc or auto)");
}

Result<std::string> ReadSecretFile(const std::string& path) {
  // A directory opens and reads as empty: it said the file was empty.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument("auth file " + path +
                                   " is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::IOError("cannot read auth file " + path + ": " +
                           std::strerror(errno));
  }
  // At most the longest secret, its line end, and one byte more: a file
  // without end (/dev/zero) or of gigabytes is refused after reading that
  // much, not read whole first (it ran out of memory).
  constexpr size_t kMaxRead = kMaxSecretBytes + 2;
  std::string secret(kMaxRead + 1, '\0');
  in.read(secret.data(), std::streamsize(secret.size()));
  if (in.bad()) {
    return Status::IOError("cannot read auth file " + path + ": " +
                           std::strerror(errno));
  }
  secret.resize(size_t(in.gcount()));
  if (secret.size() > kMaxRead) {
    return Status::InvalidArgument("auth file " + path + " is over " +
                                   std::to_string(kMaxSecretBytes) + " bytes");
  }
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) {
    return Status::InvalidArgument("auth file " + path + " is empty");
  }
  if (secret.size() > kMaxSecretBytes) {
    return Status::InvalidArgument("auth file " + path + " is over " +
                                   std::to_string(kMaxSecretBytes) + " bytes");
  }
  return secret;
}

}  // namespace remem
