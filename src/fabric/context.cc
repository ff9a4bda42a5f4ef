#include "fabric/context.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace remem::fabric {

Status FromUcs(ucs_status_t s, std::string_view what) {
  if (s == UCS_OK) return Status::OK();
  std::string msg = std::string(what) + ": " + ucs_status_string(s);
  switch (s) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return Status::OutOfMemory(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return Status::InvalidArgument(msg);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_IO_ERROR:
      return Status::Unavailable(msg);
    case UCS_ERR_TIMED_OUT:
      return Status::TimedOut(msg);
    case UCS_ERR_BUSY:
      return Status::Busy(msg);
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
      return Status::Unsupported(msg);
    default:
      return Status::IOError(msg);
  }
}

namespace {

std::mutex g_mu;
std::map<Transport, std::weak_ptr<Context>>& Registry() {
  static auto* r = new std::map<Transport, std::weak_ptr<Context>>();
  return *r;
}

}  // namespace

std::string Context::TlsFor(Transport transport, bool no_tcp) {
  switch (transport) {
    case Transport::kShm:
      return "posix,cma,self";
    case Transport::kTcp:
      return "tcp,self";
    case Transport::kAuto:
      break;
  }
  return no_tcp ? "^sysv,tcp" : "^sysv";
}

Result<std::shared_ptr<Context>> Context::Shared(Transport transport,
                                                 const Options& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = Registry()[transport].lock()) return existing;

  // UCT options are read from the environment when ucp_init opens the
  // transports; overwrite=0 keeps a user's explicit choice.
  if (transport != Transport::kTcp) {
    setenv("UCX_MM_ERROR_HANDLING", "y", 0);
    setenv("UCX_CMA_MEMORY_INVALIDATE", "y", 0);
  }

  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "ucp_config_read");
  // --transport shm|tcp is explicit and wins; with auto, an operator's
  // UCX_TLS does (docs/SECURITY.md, "Shared memory", explains the risks).
  if (transport != Transport::kAuto || getenv("UCX_TLS") == nullptr) {
    s = ucp_config_modify(config, "TLS",
                          TlsFor(transport, options.no_tcp).c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, "setting UCX_TLS");
    }
  }

  // Every interface stays active (polled, armed through the worker) instead
  // of UCX 1.13's "adaptive progress", which leaves an idle interface to
  // its async thread: there a zero-length datagram on a shared-memory
  // interface's signal socket (an abstract unix socket any local user can
  // write to) makes UCX abort the process ("failed to arm iface ...:
  // Connection reset by remote peer"). Armed through the worker, the same
  // datagram only makes ucp_worker_arm return an error (Worker::Sleep polls
  // again). docs/SECURITY.md, "Shared memory".
  s = ucp_config_modify(config, "ADAPTIVE_PROGRESS", "n");
  if (s != UCS_OK) {
    ucp_config_release(config);
    return FromUcs(s, "setting UCX_ADAPTIVE_PROGRESS");
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  if (!options.server) {
    params.features |= UCP_FEATURE_RMA | UCP_FEATURE_AMO64;
  } else if (transport != Transport::kTcp) {
    // Shared-memory clients' atomics run on the server's iface.
    params.features |= UCP_FEATURE_AMO64;
  }
  params.mt_workers_shared = 1;
  params.name = "remem";
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return FromUcs(s, "ucp_init");

  std::shared_ptr<Context> c(new Context(ctx, transport));
  Registry()[transport] = c;
  return c;
}

Context::~Context() { ucp_cleanup(ctx_); }

}  // namespace remem::fabric
