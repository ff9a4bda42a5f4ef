// Registered memory on both sides of a connection.
//
// LocalRegion: memory that UCX allocates and registers itself
// (ucp_mem_map with UCP_MEM_MAP_ALLOCATE). Only such memory is read truly
// one-sided over shared memory: UCX backs it with a sysv/posix segment that
// a peer on the same host attaches, so a get is a copy by the reader with
// no work by the owner. Everything remotely read is carved out of these.
//
// RemoteRegion: a peer's region whose packed key was unpacked for one
// endpoint. When the transport maps the peer's memory into this process
// (shared memory), `mapped()` is the local address of its byte 0.
//
// Thread contract: LocalRegion is immutable after creation; its memory is
// shared with every peer and its users synchronise on the data itself.
// RemoteRegion belongs to the thread of its endpoint's worker.

#ifndef REMEM_FABRIC_MEMORY_REGION_H_
#define REMEM_FABRIC_MEMORY_REGION_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "fabric/context.h"
#include "remem/status.h"

namespace remem::fabric {

class LocalRegion {
 public:
  static Result<std::unique_ptr<LocalRegion>> Allocate(
      std::shared_ptr<Context> ctx, uint32_t id, size_t length);
  ~LocalRegion();
  LocalRegion(const LocalRegion&) = delete;
  LocalRegion& operator=(const LocalRegion&) = delete;

  uint32_t id() const { return id_; }
  uint8_t* base() const { return base_; }
  size_t length() const { return length_; }
  // The remote key that lets a peer access this region.
  const std::string& packed_rkey() const { return packed_rkey_; }

 private:
  LocalRegion() = default;
  std::shared_ptr<Context> ctx_;
  ucp_mem_h memh_ = nullptr;
  uint32_t id_ = 0;
  uint8_t* base_ = nullptr;
  size_t length_ = 0;
  std::string packed_rkey_;
};

class RemoteRegion {
 public:
  // Unpacks `rkey` (the peer's LocalRegion::packed_rkey) for `ep`. Fails
  // (IOError over shared memory) when the peer's memory cannot be attached
  // any more, as when the peer has just died; never crashes then, though
  // UCX before 1.19 would (memory_region.cc).
  static Result<std::unique_ptr<RemoteRegion>> Unpack(ucp_ep_h ep, uint32_t id,
                                                      uint64_t base,
                                                      uint64_t length,
                                                      const std::string& rkey);
  ~RemoteRegion();
  RemoteRegion(const RemoteRegion&) = delete;
  RemoteRegion& operator=(const RemoteRegion&) = delete;

  uint32_t id() const { return id_; }
  uint64_t base() const { return base_; }
  uint64_t length() const { return length_; }
  ucp_rkey_h rkey() const { return rkey_; }
  // Local address of the peer's byte 0, or nullptr if not mapped.
  const uint8_t* mapped() const { return mapped_; }

  // Whether [offset, offset+len) lies inside the region.
  bool Contains(uint64_t offset, uint64_t len) const {
    return offset <= length_ && len <= length_ - offset;
  }
  // InvalidArgument unless it does (Contains).
  Status Check(uint64_t offset, uint64_t len) const;

  // Where the region is mapped (shared memory), maps [offset, offset+len)
  // into this process for reading now (MADV_POPULATE_READ), then reads one
  // byte of each page of its first 512 MiB; otherwise (or outside the
  // region) does nothing. Best effort. The reads are for hosts with shadow
  // page tables (this project's VMs): there a populated page still traps to
  // the hypervisor on its first access, about 2 us per page read in a row,
  // but 30 to 130 us for a lone one-sided read of a random page, which made
  // the one-sided path look slower than the RPC path for as long as most
  // pages were cold. Elsewhere they cost a TLB miss each. Beyond 512 MiB,
  // pages warm as reads touch them.
  void PrefaultForReading(uint64_t offset, uint64_t len) const;

 private:
  RemoteRegion() = default;
  uint32_t id_ = 0;
  uint64_t base_ = 0;
  uint64_t length_ = 0;
  ucp_rkey_h rkey_ = nullptr;
  const uint8_t* mapped_ = nullptr;
};

}  // namespace remem::fabric

#endif  // REMEM_FABRIC_MEMORY_REGION_H_
