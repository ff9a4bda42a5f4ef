#include "fabric/memory_region.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

// --- A key that fails to unpack, under UCX before 1.19 ---
//
// ucp_ep_rkey_unpack unpacks a peer's key one memory domain at a time
// (uct_rkey_unpack); when one fails for another reason than "unreachable",
// UCX up to 1.18 destroys the half-made key with its map still naming
// that domain and the ones after it, and so releases transport keys it
// never unpacked (uct_rkey_release on a null or stale handle): the process
// dies of a segmentation fault, or frees what is not its own. Over shared
// memory that is what a peer killed between listing its regions and this
// unpack causes: the key names a segment the dead process held open
// (/proc/<pid>/fd/<n>), which can no longer be attached. UCX fixed it in
// 1.19 (openucx/ucx 8721af17d3, "Keep md_map consistent with tl_rkey");
// Debian 12 has 1.13.1. The cluster's fault suite hit it: a server's
// replicator connecting to a backup the suite had just killed.
//
// remem's binaries and libremem define the two UCT calls UCP makes here,
// so the dynamic linker binds UCP's calls to them (UCP imports them from
// libuct); each passes the call on to libuct's. Inside RemoteRegion::
// Unpack, on its thread, they note the transport keys unpacked, and a
// release of any other is skipped: only ucp_rkey_destroy's error path
// releases during an unpack, and it then releases exactly what was
// unpacked. Outside Unpack, and with a UCX of 1.19 or later, they only
// pass the call on. (UCP's own unpacks are not watched: a rendezvous's
// key of a large message names the sender's heap, which only cross-memory
// attach reaches over shared memory, whose unpack opens nothing.)
namespace {

struct UnpackWatch {
  struct Unpacked {
    uct_component_h component;
    uct_rkey_t rkey;
    void* handle;
  };
  std::vector<Unpacked> unpacked;
};
thread_local UnpackWatch* t_watch = nullptr;

// libuct's definition of `name`: the next one after this object's in the
// lookup order, or (if this object comes after libuct there, and so is
// not called by UCP at all) libuct's own.
void* LibuctSymbol(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    if (void* lib = dlopen("libuct.so.0", RTLD_NOW | RTLD_NOLOAD)) {
      f = dlsym(lib, name);
    }
  }
  if (f == nullptr) {
    std::fprintf(stderr, "remem: UCX's %s not found: %s\n", name, dlerror());
    std::abort();
  }
  return f;
}

// Whether this process's UCX has the bug (fixed in 1.19, whose UCP also
// unpacks through another call, uct_rkey_unpack_v2, which the watch would
// not see).
bool UcxReleasesKeysItNeverUnpacked() {
  static const bool buggy = [] {
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    return major < 1 || (major == 1 && minor < 19);
  }();
  return buggy;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) ucs_status_t uct_rkey_unpack(
    uct_component_h component, const void* rkey_buffer,
    uct_rkey_bundle_t* rkey_ob) {
  using Fn = ucs_status_t (*)(uct_component_h, const void*, uct_rkey_bundle_t*);
  static const auto next = reinterpret_cast<Fn>(LibuctSymbol(__func__));
  const ucs_status_t s = next(component, rkey_buffer, rkey_ob);
  if (s == UCS_OK && t_watch != nullptr) {
    t_watch->unpacked.push_back({component, rkey_ob->rkey, rkey_ob->handle});
  }
  return s;
}

__attribute__((visibility("default"))) ucs_status_t uct_rkey_release(
    uct_component_h component, const uct_rkey_bundle_t* rkey_ob) {
  using Fn = ucs_status_t (*)(uct_component_h, const uct_rkey_bundle_t*);
  static const auto next = reinterpret_cast<Fn>(LibuctSymbol(__func__));
  if (t_watch != nullptr) {
    auto& u = t_watch->unpacked;
    auto it = std::find_if(u.begin(), u.end(), [&](const auto& k) {
      return k.component == component && k.rkey == rkey_ob->rkey &&
             k.handle == rkey_ob->handle;
    });
    if (it == u.end()) return UCS_OK;  // never unpacked: not released
    u.erase(it);
  }
  return next(component, rkey_ob);
}

}  // extern "C"

namespace remem::fabric {

Result<std::unique_ptr<LocalRegion>> LocalRegion::Allocate(
    std::shared_ptr<Context> ctx, uint32_t id, size_t length) {
  if (length == 0) return Status::InvalidArgument("region length is zero");
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  p.length = length;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  std::unique_ptr<LocalRegion> r(new LocalRegion());
  ucs_status_t s = ucp_mem_map(ctx->handle(), &p, &r->memh_);
  if (s != UCS_OK) {
    return FromUcs(s, "allocating a registered region of " +
                          std::to_string(length) + " bytes");
  }
  r->ctx_ = std::move(ctx);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(r->memh_, &attr);
  if (s != UCS_OK) return FromUcs(s, "ucp_mem_query");
  r->id_ = id;
  r->base_ = static_cast<uint8_t*>(attr.address);
  r->length_ = length;
  void* packed = nullptr;
  size_t packed_len = 0;
  s = ucp_rkey_pack(r->ctx_->handle(), r->memh_, &packed, &packed_len);
  if (s != UCS_OK) return FromUcs(s, "ucp_rkey_pack");
  r->packed_rkey_.assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  return r;
}

LocalRegion::~LocalRegion() {
  if (memh_ != nullptr) (void)ucp_mem_unmap(ctx_->handle(), memh_);
}

Result<std::unique_ptr<RemoteRegion>> RemoteRegion::Unpack(
    ucp_ep_h ep, uint32_t id, uint64_t base, uint64_t length,
    const std::string& rkey) {
  std::unique_ptr<RemoteRegion> r(new RemoteRegion());
  UnpackWatch watch;
  if (UcxReleasesKeysItNeverUnpacked()) t_watch = &watch;
  ucs_status_t s = ucp_ep_rkey_unpack(ep, rkey.data(), &r->rkey_);
  t_watch = nullptr;
  if (s != UCS_OK)
    return FromUcs(s, "unpacking the key of region " + std::to_string(id));
  r->id_ = id;
  r->base_ = base;
  r->length_ = length;
  void* local = nullptr;
  if (ucp_rkey_ptr(r->rkey_, base, &local) == UCS_OK) {
    r->mapped_ = static_cast<const uint8_t*>(local);
  }
  return r;
}

RemoteRegion::~RemoteRegion() {
  if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
}

Status RemoteRegion::Check(uint64_t offset, uint64_t len) const {
  if (!Contains(offset, len)) {
    return Status::InvalidArgument(
        "range [" + std::to_string(offset) + ", +" + std::to_string(len) +
        ") is outside region " + std::to_string(id_) + " of " +
        std::to_string(length_) + " bytes");
  }
  return Status::OK();
}

void RemoteRegion::PrefaultForReading(uint64_t offset, uint64_t len) const {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14
#endif
  if (mapped_ == nullptr || len == 0 || !Check(offset, len).ok()) return;
  constexpr uint64_t kTouchedBytes = uint64_t{512} << 20;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(mapped_ + offset);
  const uintptr_t start = first & ~(page - 1);
  const uintptr_t end = first + len;
  // An older kernel refuses, and reads then fault lazily.
  (void)madvise(reinterpret_cast<void*>(start), end - start,
                MADV_POPULATE_READ);
  uint8_t sum = 0;
  const uintptr_t touched_end = std::min(end, start + kTouchedBytes);
  for (uintptr_t at = start; at < touched_end; at += page) {
    sum += *reinterpret_cast<const volatile uint8_t*>(at);
  }
  asm volatile("" : : "r"(sum));  // the reads are the point: keep them
}

}  // namespace remem::fabric
