#include "fabric/context.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

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

// The cma memory domain's setting that keeps it under peer error handling
// can only come from the environment (ucp_config_modify does not reach
// memory domains). setenv while the program runs is unsafe: adding a
// variable may move glibc's environment array while another thread's
// getenv reads it (getenv takes no lock), and that crashed a program whose
// threads connected sessions while others read the environment
// (tree_test, once). So it is set here, while the library is loaded,
// before the program's threads exist; every memory domain's settings are
// read whatever the transport, so UCX never calls it unused. overwrite=0
// keeps an operator's choice.
[[maybe_unused]] const bool g_cma_invalidate_set = [] {
  setenv("UCX_CMA_MEMORY_INVALIDATE", "y", 0);
  return true;
}();

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
  if (auto existing = Registry()[transport].lock()) {
    if (!options.shm_dir.empty() && options.shm_dir != existing->shm_dir()) {
      return Status::InvalidArgument(
          "this process's UCX context already backs shared memory with " +
          (existing->shm_dir().empty() ? std::string("UCX's default")
                                       : existing->shm_dir()) +
          ", not " + options.shm_dir);
    }
    return existing;
  }

  // UCX prints its log (warnings such as "unused env variable", errors) on
  // standard output unless UCX_LOG_FILE says otherwise: in the middle of
  // the data a `remem get` or a --json command writes there. Unless the
  // operator chose a file, it goes to standard error, set before the first
  // context (UCX read its options when it was loaded; its log is reopened).
  static std::once_flag log_to_stderr;
  std::call_once(log_to_stderr, [] {
    if (getenv("UCX_LOG_FILE") != nullptr) return;
    if (ucs_global_opts_set_value("LOG_FILE", "stderr") != UCS_OK) return;
    ucs_log_cleanup();
    ucs_log_init();
  });

  // UCX 1.13 asserts, aborting the process at its first connection, when
  // peer error handling (every remem endpoint asks for it) meets a
  // keepalive interval of zero; "inf" is UCX's way to turn keepalive off.
  if (const char* ka = getenv("UCX_KEEPALIVE_INTERVAL")) {
    char* end = nullptr;
    const double interval = std::strtod(ka, &end);
    if (end != ka && interval == 0) {
      return Status::InvalidArgument(
          std::string("UCX_KEEPALIVE_INTERVAL=") + ka +
          " is not supported: UCX 1.13 aborts a process whose endpoints "
          "detect peer failures, as remem's do, when the interval is zero; "
          "unset it, or set it to inf to turn keepalive off");
    }
  }

  // UCX's posix memory domain reads its directory from the environment
  // when ucp_init opens it (ucp_config_modify does not reach it); the
  // environment is given back after, so later contexts keep the default.
  struct PosixDirRestorer {
    bool set = false;
    std::optional<std::string> before;
    ~PosixDirRestorer() {
      if (!set) return;
      if (before) {
        setenv("UCX_POSIX_DIR", before->c_str(), 1);
      } else {
        unsetenv("UCX_POSIX_DIR");
      }
    }
  } posix_dir;
  if (!options.shm_dir.empty() && transport != Transport::kTcp) {
    if (const char* b = getenv("UCX_POSIX_DIR")) posix_dir.before = b;
    posix_dir.set = true;
    setenv("UCX_POSIX_DIR", options.shm_dir.c_str(), 1);
  }

  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "ucp_config_read");
  // --transport shm|tcp is explicit and wins; with auto, an operator's
  // UCX_TLS does (docs/SECURITY.md, "Shared memory", explains the risks).
  std::string tls = getenv("UCX_TLS") != nullptr ? getenv("UCX_TLS") : "";
  if (transport != Transport::kAuto || getenv("UCX_TLS") == nullptr) {
    tls = TlsFor(transport, options.no_tcp);
    s = ucp_config_modify(config, "TLS", tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, "setting UCX_TLS");
    }
  }

  // Peer error handling (every remem endpoint asks for it) drops the
  // shared-memory transports unless they handle errors themselves: the mm
  // interfaces' setting, given through the configuration (as CONN_NB
  // below), not with setenv (g_cma_invalidate_set says why). An operator's
  // UCX_MM_ERROR_HANDLING wins. (Not for tcp alone: UCX warns of a setting
  // that no transport took.)
  if (transport != Transport::kTcp &&
      getenv("UCX_MM_ERROR_HANDLING") == nullptr) {
    s = ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    if (s != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, "setting UCX_MM_ERROR_HANDLING");
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

  // Over tcp, UCX 1.13 connects an endpoint's socket to its peer in the
  // call that makes the endpoint (blocking connects, its default); if the
  // peer dies between accepting that connection and UCX's first message on
  // it, UCX marks the endpoint failed before giving it the right to send,
  // and its cleanup then asserts, aborting the process (ARCHITECTURE.md,
  // UCX finding 22: a server killed by clients that die while they
  // connect). A non-blocking connect completes later, on an endpoint that
  // can already send, where the same failure is an ordinary endpoint
  // error. An operator's UCX_TCP_CONN_NB wins. (Set only where tcp may be
  // opened: UCX warns of a setting that no transport took.)
  const bool tcp_listed = tls.find("tcp") != std::string::npos;
  const bool may_use_tcp =
      tls.empty() || tls == "all" || (tls[0] == '^' ? !tcp_listed : tcp_listed);
  if (may_use_tcp && getenv("UCX_TCP_CONN_NB") == nullptr) {
    // The name of the tcp interface's own setting (TCP_CONN_NB is not
    // found there, and UCX would warn of it).
    s = ucp_config_modify(config, "CONN_NB", "y");
    if (s != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, "setting UCX_TCP_CONN_NB");
    }
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

  std::shared_ptr<Context> c(new Context(ctx, transport, options.shm_dir));
  Registry()[transport] = c;
  return c;
}

Context::~Context() { ucp_cleanup(ctx_); }

namespace {

// mountinfo escapes space, tab, newline and backslash as octal (\040).
std::string UnescapeMountField(const std::string& f) {
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '\\' && i + 3 < f.size()) {
      const std::string oct = f.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == oct.npos) {
        out.push_back(static_cast<char>(std::stoi(oct, nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(f[i]);
  }
  return out;
}

uint64_t BasePageBytes() {
  const long base = sysconf(_SC_PAGESIZE);
  return base > 0 ? uint64_t(base) : 4096;
}

bool UnderMount(const std::string& path, const std::string& mount) {
  if (mount == "/") return true;
  return path.compare(0, mount.size(), mount) == 0 &&
         (path.size() == mount.size() || path[mount.size()] == '/');
}

}  // namespace

ShmPages ShmPagesOf(const std::string& dir_in) {
  std::string dir = dir_in;
  if (dir.empty()) {
    const char* env = getenv("UCX_POSIX_DIR");
    dir = env != nullptr && *env != '\0' ? env : "/dev/shm";
  }
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(dir, ec);
  if (!ec) dir = real.string();
  ShmPages out;
  out.page_bytes = BasePageBytes();
  out.dir = dir;
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) == 0) {
    out.available_bytes = uint64_t(fs.f_bavail) * fs.f_frsize;
  }
  // The mount the directory lives on: the longest mount point above it
  // with the directory's device (a mount hidden by another mounted over a
  // directory above it has the same prefix but not the device).
  struct stat st {};
  std::string want_dev;
  if (::stat(dir.c_str(), &st) == 0) {
    want_dev = std::to_string(major(st.st_dev)) + ":" +
               std::to_string(minor(st.st_dev));
  }
  std::ifstream mi("/proc/self/mountinfo");
  std::string line, best_mount, best_type, best_super;
  bool best_dev_matches = false;
  while (std::getline(mi, line)) {
    std::istringstream in(line);
    std::string id, parent, devno, root, mount_point, opts, field;
    if (!(in >> id >> parent >> devno >> root >> mount_point >> opts)) continue;
    while (in >> field && field != "-") {
    }
    std::string type, source, super;
    if (!(in >> type >> source >> super)) continue;
    mount_point = UnescapeMountField(mount_point);
    if (!UnderMount(dir, mount_point)) continue;
    const bool dev_matches = devno == want_dev;
    if (best_dev_matches && !dev_matches) continue;
    if ((dev_matches && !best_dev_matches) ||
        mount_point.size() >= best_mount.size()) {
      best_mount = mount_point;
      best_type = type;
      best_super = super;
      best_dev_matches = dev_matches;
    }
  }
  out.mount = best_mount.empty() ? dir : best_mount;
  out.tmpfs = best_type == "tmpfs";
  if (!out.tmpfs) {
    out.mount += " (" + (best_type.empty() ? std::string("?") : best_type) +
                 ", not tmpfs)";
    return out;
  }
  std::string huge = "never";
  std::istringstream so(best_super);
  for (std::string o; std::getline(so, o, ',');) {
    if (o.rfind("huge=", 0) == 0) huge = o.substr(5);
  }
  std::string forced;
  std::ifstream se("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string modes;
  std::getline(se, modes);
  if (modes.find("[force]") != std::string::npos) forced = "force";
  if (modes.find("[deny]") != std::string::npos) forced = "deny";
  out.mount += " (huge=" + huge +
               (forced.empty() ? "" : ", shmem_enabled " + forced) + ")";
  const bool on =
      forced == "force" ||
      (forced.empty() && (huge == "always" || huge == "within_size"));
  if (on) {
    uint64_t pmd = 0;
    std::ifstream hp("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    if (!(hp >> pmd) || pmd == 0) pmd = uint64_t{2} << 20;
    out.page_bytes = pmd;
  }
  return out;
}

ShmPages ShmPagesAt(const void* address) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode;
    if (!(in >> range >> perms >> offset >> dev >> inode)) continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    uintptr_t lo = 0, hi = 0;
    const char* text = range.data();
    if (std::from_chars(text, text + dash, lo, 16).ec != std::errc() ||
        std::from_chars(text + dash + 1, text + range.size(), hi, 16).ec !=
            std::errc()) {
      continue;
    }
    if (at < lo || at >= hi) continue;
    std::string path;
    std::getline(in >> std::ws, path);
    constexpr std::string_view kDeleted = " (deleted)";
    if (path.size() > kDeleted.size() &&
        path.compare(path.size() - kDeleted.size(), kDeleted.size(),
                     kDeleted) == 0) {
      path.resize(path.size() - kDeleted.size());
    }
    if (path.empty() || path[0] != '/') break;
    return ShmPagesOf(std::filesystem::path(path).parent_path().string());
  }
  ShmPages out;
  out.page_bytes = BasePageBytes();
  out.mount = "anonymous memory";
  return out;
}

std::string Context::OperatorSettings() {
  std::string out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("UCX_") && v != "UCX_CMA_MEMORY_INVALIDATE=y") {
      out += (out.empty() ? "" : " ") + std::string(v);
    }
  }
  return out;
}

}  // namespace remem::fabric
