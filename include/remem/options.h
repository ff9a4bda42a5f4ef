// Copyright remem authors.
//
// Options shared by the client library and the server: which UCX transports
// to allow, and the client's connection options.
//
// Thread contract: plain values.

#ifndef REMEM_OPTIONS_H_
#define REMEM_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem {

// Which UCX transports a process may use. This is process-wide for a UCX
// context; remem keeps one context per transport choice per process.
//   kAuto: UCX's own choice (UCX_TLS as the environment sets it, else all):
//          shared memory to a server on the same host, tcp otherwise,
//          verbs where RDMA hardware exists.
//   kShm:  UCX_TLS=sm,self,tcp. tcp only carries the connection handshake;
//          data must move over shared memory, and connecting to a server
//          that is not reachable over shared memory fails.
//   kTcp:  UCX_TLS=tcp,self. Everything over tcp, even on one host.
enum class Transport { kAuto, kShm, kTcp };

std::string_view TransportName(Transport t);
Result<Transport> ParseTransport(std::string_view name);

// How a client reads the hash store.
//   kOneSided: copy buckets and extents out of the server's memory and
//              verify them (no server CPU on shared memory); after repeated
//              verification failures a get falls back to kRpc.
//   kRpc:      ask the server (Pilaf-VO, the control).
//   kAuto:     choose per get from measured latencies (Cell's selector).
enum class ReadPath { kAuto, kOneSided, kRpc };
std::string_view ReadPathName(ReadPath p);
Result<ReadPath> ParseReadPath(std::string_view name);

struct ClientOptions {
  // "host:port" of a remem-server listener.
  std::string server = "127.0.0.1:7400";
  Transport transport = Transport::kAuto;
  // Shared secret sent in the handshake; empty sends none. A server started
  // with --auth-file refuses a client whose secret does not match.
  std::string secret;
  // Deadline for connecting and for each synchronous call.
  std::chrono::milliseconds timeout{10000};
  ReadPath read_path = ReadPath::kAuto;
};

// Reads a shared secret from `path`: the file's bytes with one trailing
// newline removed. Errors if the file is unreadable, empty, or over 4 KiB.
Result<std::string> ReadSecretFile(const std::string& path);

}  // namespace remem

#endif  // REMEM_OPTIONS_H_
