// fabric::Context: one UCX context (ucp_context_h) per transport choice per
// process, with the features remem uses: RMA (get/put), 64-bit atomics,
// active messages, and wakeup (so idle loops can sleep on an event fd).
//
// Thread contract: thread-safe. The context is created with
// mt_workers_shared, so workers of different threads may share it; each
// Worker is single-threaded.

#ifndef REMEM_FABRIC_CONTEXT_H_
#define REMEM_FABRIC_CONTEXT_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "remem/options.h"
#include "remem/status.h"

namespace remem::fabric {

// Maps a UCX status to a remem Status with `what` as context.
Status FromUcs(ucs_status_t s, std::string_view what);

class Context {
 public:
  // Returns the process's context for `transport`, creating it on first use.
  // Turns on the shared-memory transports' own error handling (mm's
  // ERROR_HANDLING in the configuration, UCX_CMA_MEMORY_INVALIDATE=y in the
  // environment when the library is loaded; an operator's settings win):
  // without it, UCX drops them from endpoints that use peer error
  // handling, which remem needs to detect dead peers. Nothing here calls
  // setenv once the program runs, but a --shm-dir (`shm_dir`) is passed
  // to UCX in UCX_POSIX_DIR for the call.
  //
  // Transports (UCX_TLS; with kAuto, a UCX_TLS in the environment wins):
  //   kShm:  posix,cma,self
  //   kTcp:  tcp,self
  //   kAuto: ^sysv (everything else UCX finds), or ^sysv,tcp when
  //          `no_tcp` (a server that listens on loopback only: no client
  //          can come over tcp, so UCX opens no tcp port).
  // UCX's sysv transport is never chosen by remem: its segments are created
  // 0660, so members of the process's group could attach them; posix
  // segments are reached through /proc/<pid>/fd, which only the same user
  // (and root) may open. docs/SECURITY.md has the rest.
  //
  // Every context runs with UCX_ADAPTIVE_PROGRESS=n (an idle shared-memory
  // interface left to UCX's async thread aborts the process on a
  // zero-length datagram from any local user; docs/SECURITY.md).
  //
  // A server's context (`server`) offers no RMA feature and, over tcp, no
  // atomics: clients reach its memory directly over shared memory, and over
  // tcp only through remem's served requests. So UCX never installs its
  // software-emulated get handler in a server, which trusts any address a
  // peer names and aborts the process if the peer dies mid-reply (UCX
  // 1.13; docs/SECURITY.md, "UCX's tcp ports").
  //
  // `shm_dir` (UCX_POSIX_DIR while ucp_init runs; "" keeps UCX's default,
  // /dev/shm, or the environment's) is the directory whose files back the
  // memory a context allocates for shared-memory peers: point it at a
  // tmpfs mounted with huge=always and exported regions sit on 2 MiB pages
  // (ShmPagesAt tells). The process's first context for a transport
  // decides: asking again with another `shm_dir` is refused.
  struct Options {
    bool no_tcp = false;
    bool server = false;
    std::string shm_dir;
  };
  static Result<std::shared_ptr<Context>> Shared(Transport transport,
                                                 const Options& options);
  static Result<std::shared_ptr<Context>> Shared(Transport transport) {
    return Shared(transport, Options{});
  }
  // The UCX_TLS value remem uses for `transport` (see Shared).
  static std::string TlsFor(Transport transport, bool no_tcp);
  // The UCX_* variables of the environment, "NAME=value" separated by
  // spaces, but the default this library sets itself: what to name when
  // UCX cannot start ("" if none is set).
  static std::string OperatorSettings();

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return ctx_; }
  Transport transport() const { return transport_; }
  const std::string& shm_dir() const { return shm_dir_; }

 private:
  Context(ucp_context_h ctx, Transport t, std::string shm_dir)
      : ctx_(ctx), transport_(t), shm_dir_(std::move(shm_dir)) {}
  ucp_context_h ctx_;
  Transport transport_;
  std::string shm_dir_;
};

// The page size that backs files created in `dir` (a directory on tmpfs,
// as UCX's shared-memory segments are): 2 MiB where the tmpfs was mounted
// with huge=always or huge=within_size (or the kernel forces huge pages on
// every tmpfs), else the base page size. `mount` names the mount point
// and its huge= option, for messages. Reads /proc/self/mountinfo and
// /sys/kernel/mm/transparent_hugepage/shmem_enabled.
struct ShmPages {
  uint64_t page_bytes = 0;
  std::string mount;
  std::string dir;     // the directory judged ("" if anonymous)
  bool tmpfs = false;  // dir is on a tmpfs (memory, not a disk)
  // Free in its filesystem (statvfs); UINT64_MAX when unknown.
  uint64_t available_bytes = UINT64_MAX;
};
ShmPages ShmPagesOf(const std::string& dir);
// The same for the memory at `address` of this process, found in
// /proc/self/maps: the file mapped there, judged by its directory as
// above (anonymous memory: the base page size, `mount` says so).
ShmPages ShmPagesAt(const void* address);

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_CONTEXT_H_
