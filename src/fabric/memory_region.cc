#include "fabric/memory_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

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
  ucs_status_t s = ucp_ep_rkey_unpack(ep, rkey.data(), &r->rkey_);
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
  if (offset > length_ || len > length_ - offset) {
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
