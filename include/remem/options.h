// Copyright remem authors.
//
// Options shared by the client library and the server: which UCX transports
// to allow, and a session's connection options.
//
// Thread contract: plain values.

#ifndef REMEM_OPTIONS_H_
#define REMEM_OPTIONS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem {

// Which UCX transports a process may use. This is process-wide for a UCX
// context; remem keeps one context per transport choice per process.
//   kAuto: UCX's own choice (UCX_TLS as the environment sets it, else every
//          transport UCX finds but sysv, `^sysv`):
//          shared memory to a server on the same host, tcp otherwise,
//          verbs where RDMA hardware exists.
//   kShm:  UCX_TLS=posix,cma,self. Everything moves over shared memory (remem's
//          own handshake uses a plain TCP socket, not UCX); connecting to a
//          server that is not reachable over shared memory fails.
//   kTcp:  UCX_TLS=tcp,self. Everything over tcp, even on one host.
enum class Transport { kAuto, kShm, kTcp };

std::string_view TransportName(Transport t);
Result<Transport> ParseTransport(std::string_view name);

// How a client reads a data model's structures (the hash store's buckets,
// ...).
//   kOneSided: copy them out of the server's memory and verify them (no
//              server CPU on shared memory); after repeated verification
//              failures a read falls back to kRpc.
//   kRpc:      ask the server (Pilaf-VO, the control).
//   kAuto:     choose per read from measured latencies (Cell's selector).
enum class ReadPath { kAuto, kOneSided, kRpc };
std::string_view ReadPathName(ReadPath p);
Result<ReadPath> ParseReadPath(std::string_view name);

struct SessionOptions {
  // "host:port" of a remem-server listener.
  std::string server = "127.0.0.1:7400";
  Transport transport = Transport::kAuto;
  // Shared secret sent in the handshake; empty sends none. A server started
  // with --auth-file refuses a client whose secret does not match. Over
  // kMaxSecretBytes: Connect fails with InvalidArgument.
  std::string secret;
  // Deadline for connecting and for each synchronous call. It and
  // connect_timeout must be more than 0 and at most kMaxTimeout: Connect
  // fails with InvalidArgument otherwise.
  std::chrono::milliseconds timeout{10000};
  // Deadline for connecting alone (the handshake, the UCX endpoint and
  // the list of the server's regions), if it should be shorter (a server
  // that is paused accepts the TCP connection and never answers); unset:
  // `timeout`. remem::Cluster sets it to look elsewhere
  // for a paused member's shards.
  std::optional<std::chrono::milliseconds> connect_timeout;
  // The read path of the stores attached to the session (each store's own
  // options may override it).
  ReadPath read_path = ReadPath::kAuto;
};

// Longest SessionOptions timeout: a year.
inline constexpr std::chrono::milliseconds kMaxTimeout{365ll * 86400 * 1000};

// Largest shared secret (bytes).
inline constexpr size_t kMaxSecretBytes = 4096;

// Reads a shared secret from `path`: the file's bytes with one trailing
// line end ("\n", "\r\n" or "\r") removed. Errors if the file is a directory,
// unreadable, empty, or over kMaxSecretBytes.
Result<std::string> ReadSecretFile(const std::string& path);

}  // namespace remem

#endif  // REMEM_OPTIONS_H_
