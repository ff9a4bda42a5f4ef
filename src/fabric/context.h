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

#include "remem/options.h"
#include "remem/status.h"

namespace remem::fabric {

// Maps a UCX status to a remem Status with `what` as context.
Status FromUcs(ucs_status_t s, std::string_view what);

class Context {
 public:
  // Returns the process's context for `transport`, creating it on first use.
  // Sets UCX_MM_ERROR_HANDLING=y and UCX_CMA_MEMORY_INVALIDATE=y in the
  // environment (unless already set) before creating it: without them, UCX
  // drops the shared-memory transports from endpoints that use peer error
  // handling, which remem needs to detect dead peers.
  static Result<std::shared_ptr<Context>> Shared(Transport transport);

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return ctx_; }
  Transport transport() const { return transport_; }

 private:
  Context(ucp_context_h ctx, Transport t) : ctx_(ctx), transport_(t) {}
  ucp_context_h ctx_;
  Transport transport_;
};

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_CONTEXT_H_
