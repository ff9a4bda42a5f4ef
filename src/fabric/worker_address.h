// fabric::ParseWorkerAddress: a bounds-checked reading of a packed UCX
// worker address (ucp_worker_get_address) as UCX 1.13 lays it out, so that
// the bytes a client sends in its handshake reach UCX's own parser only
// once they are known to be well formed.
//
// Why: ucp_ep_create() takes an address without a length and trusts it.
// UCX 1.13's ucp_address_unpack() reads past the end of a short buffer and
// aborts the process on a bad version byte; its transports then act on what
// the address names (a tcp host and port to connect to; for shared memory a
// process id and file descriptor whose /proc link is opened and mapped
// read-write). So remem-server parses the address first, refuses anything
// malformed, and checks what it names (server/client_address.h:
// ClientAddressCheck::Check). docs/SECURITY.md has the whole story.
//
// What is checked here (pure, no system calls):
//   - the header: version 1 or 2, known flags; the worker uuid;
//   - every device and interface entry: lengths inside the buffer, at most
//     UCX's limit of entries, no endpoint addresses (a worker address has
//     none), no bytes left over;
//   - interface attributes that are numbers UCX computes with (v1 floats)
//     are finite and in range;
//   - for the transports remem uses (self, tcp, posix, cma), the device,
//     interface and endpoint addresses have exactly the length UCX reads.
// Entries of other transports (RDMA, sysv) are kept as bytes: UCX ignores
// those it has no local transport for.
//
// Not supported (refused): UCX's "unified mode" (UCX_UNIFIED_MODE=y), whose
// addresses cannot be read without the peer's configuration.
//
// Thread contract: free functions on immutable input; thread-safe.

#ifndef REMEM_FABRIC_WORKER_ADDRESS_H_
#define REMEM_FABRIC_WORKER_ADDRESS_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::fabric {

// UCX's names for transports, as packed: ucs_crc16_string(name).
uint16_t UcxTransportChecksum(std::string_view name);

struct WorkerAddressIface {
  uint16_t transport = 0;           // UcxTransportChecksum of its name
  uint8_t device = 0;               // index of its device entry in the address
  std::string_view device_address;  // views into the parsed bytes
  std::string_view iface_address;
};

struct ParsedWorkerAddress {
  unsigned version = 1;  // UCX's v1 or v2 layout
  bool has_uuid = false;
  uint64_t uuid = 0;
  std::vector<WorkerAddressIface> ifaces;
};

// Parses `bytes` (which must stay alive while the result is used).
// ProtocolError, with what is wrong, if UCX 1.13 could not read it safely.
Result<ParsedWorkerAddress> ParseWorkerAddress(std::string_view bytes);
// The worker uuid the address carries; ProtocolError if it carries none
// (or is unreadable).
Result<uint64_t> WorkerUuidOf(std::string_view bytes);

// What a shared-memory interface entry names (posix or cma), decoded from
// its interface address. `pid` is the process whose memory the transport
// reaches; for posix `fd` is the file descriptor of its receive FIFO
// segment in that process (reached as /proc/<pid>/fd/<fd>), when
// `procfs` is set. `system_id` is the device address: which host (and
// IPC namespace) the entry is reachable from.
struct SharedMemoryRef {
  bool posix = false;  // else cma
  bool procfs = true;
  int pid = 0;
  int fd = -1;
  std::string_view system_id;
};
// For a posix or cma entry of a parsed address; InvalidArgument otherwise.
Result<SharedMemoryRef> SharedMemoryRefOf(const WorkerAddressIface& iface);

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_WORKER_ADDRESS_H_
