#include "fabric/worker_address.h"

#include <sys/socket.h>

#include <cmath>
#include <cstring>
#include <string>

namespace remem::fabric {

namespace {

// The layout below follows UCX 1.13.1, src/ucp/wireup/address.c
// (ucp_address_unpack and the helpers it calls), in non-unified mode, as
// ucp_ep_create unpacks an address: worker uuid and name flags on, no
// resource indices.
constexpr unsigned kVersionV1 = 0;  // UCP_OBJECT_VERSION_V1
constexpr unsigned kVersionV2 = 1;  // UCP_OBJECT_VERSION_V2

// Header flags.
constexpr uint8_t kHeaderDebugInfo = 1u << 0;
constexpr uint8_t kHeaderWorkerUuid = 1u << 1;
constexpr uint8_t kHeaderClientId = 1u << 2;
constexpr uint8_t kHeaderAmOnly = 1u << 3;
constexpr uint8_t kHeaderKnown =
    kHeaderDebugInfo | kHeaderWorkerUuid | kHeaderClientId | kHeaderAmOnly;

constexpr uint8_t kNullResource = 0xff;   // an empty address list
constexpr uint8_t kFlagLast = 0x80;       // last device / iface / ep address
constexpr uint8_t kFlagHasEpAddr = 0x40;  // iface: ep addresses follow
constexpr uint8_t kFlagNumPaths = 0x40;   // device: a path count follows
constexpr uint8_t kFlagSysDevice = 0x20;  // device: a system device follows
constexpr uint8_t kMdEmptyDev = 0x80;     // device without interfaces
constexpr uint8_t kMdMaskV1 = 0x1f;
constexpr uint8_t kMdMaskV2 = 0x7f;
constexpr uint8_t kDeviceLenMask = 0x1f;
constexpr uint8_t kIfaceLenMask = 0x3f;

// UCX's bounds.
constexpr size_t kMaxEntries = 128;  // UCP_MAX_RESOURCES
constexpr size_t kMaxDevices = 128;  // remem's own bound

constexpr size_t kV1AttrBytes = 16;  // 3 floats + prio/cap flags
constexpr size_t kV2AttrBytes = 8;   // 3 fp8 + prio + seg size + flags

// Transport-specific address layouts (UCX 1.13.1, src/uct).
constexpr uint64_t kLocalAddrFlagNs = 1ull << 63;  // sm device address
constexpr uint64_t kPosixFlagProcfs = 1ull << 63;
constexpr uint64_t kPosixFlagShmOpen = 1ull << 62;
constexpr uint64_t kPosixFlagPidNs = 1ull << 60;
constexpr uint64_t kPosixFlagsMask = 0xfull << 60;
constexpr unsigned kPosixPidBits = 30;
constexpr uint32_t kCmaFlagPidNs = 1u << 31;
constexpr uint8_t kTcpFlagLoopback = 1u << 0;

Status Bad(const std::string& what) {
  return Status::ProtocolError("malformed UCX worker address: " + what);
}

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == b_.size(); }
  bool Byte(uint8_t* out) {
    if (pos_ >= b_.size()) return false;
    *out = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool Peek(uint8_t* out) const {
    if (pos_ >= b_.size()) return false;
    *out = static_cast<uint8_t>(b_[pos_]);
    return true;
  }
  bool Take(size_t n, std::string_view* out) {
    if (n > b_.size() - pos_) return false;
    *out = b_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  // ucp_address_unpack_byte_extended: the masked low bits, or (v2) the next
  // byte when they are all set.
  bool Extended(uint8_t mask, unsigned version, uint8_t* out) {
    uint8_t v;
    if (!Byte(&v)) return false;
    v &= mask;
    if (version != kVersionV1 && v == mask && !Byte(&v)) return false;
    *out = v;
    return true;
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

template <typename T>
T Load(std::string_view s, size_t at = 0) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(v));
  return v;
}

bool InRange(float v, double lo, double hi) {
  return std::isfinite(v) && v >= lo && v <= hi;
}

// Interface attributes UCX computes with.
Status CheckAttributes(std::string_view attr, unsigned version) {
  if (version == kVersionV1) {
    const float overhead = Load<float>(attr, 0);
    const float bandwidth = Load<float>(attr, 4);
    const float latency = Load<float>(attr, 8);
    if (!InRange(overhead, 0, 1) || !InRange(latency, 0, 1) ||
        !InRange(std::fabs(bandwidth), 1, 1e15)) {
      return Bad("interface attributes out of range");
    }
    return Status::OK();
  }
  // fp8 values: overhead, bandwidth, latency; exponent 0xf is NaN, a zero
  // bandwidth is refused by UCX itself.
  for (size_t i = 0; i < 3; ++i) {
    if ((static_cast<uint8_t>(attr[i]) & 0x0f) == 0x0f) {
      return Bad("interface attributes out of range");
    }
  }
  if ((static_cast<uint8_t>(attr[1]) & 0x0f) == 0) {
    return Bad("interface bandwidth is zero");
  }
  return Status::OK();
}

bool SmDeviceAddressOk(std::string_view dev) {
  if (dev.size() == 8) return !(Load<uint64_t>(dev) & kLocalAddrFlagNs);
  if (dev.size() == 16) return (Load<uint64_t>(dev) & kLocalAddrFlagNs) != 0;
  return false;
}

// The lengths UCX reads for the transports remem uses, whatever the length
// fields say.
Status CheckTransport(const WorkerAddressIface& e) {
  static const uint16_t kSelf = UcxTransportChecksum("self");
  static const uint16_t kTcp = UcxTransportChecksum("tcp");
  static const uint16_t kPosix = UcxTransportChecksum("posix");
  static const uint16_t kCma = UcxTransportChecksum("cma");
  const std::string_view dev = e.device_address;
  const std::string_view iface = e.iface_address;
  if (e.transport == kSelf) {
    if (iface.size() != 8) return Bad("self interface address length");
    return Status::OK();
  }
  if (e.transport == kTcp) {
    if (dev.size() < 2) return Bad("tcp device address too short");
    const uint8_t flags = static_cast<uint8_t>(dev[0]);
    const uint8_t family = static_cast<uint8_t>(dev[1]);
    if ((flags & ~kTcpFlagLoopback) != 0) return Bad("tcp device flags");
    size_t want;
    if (flags & kTcpFlagLoopback) {
      want = 2 + 16;  // uct_iface_local_addr_ns_t
    } else if (family == AF_INET) {
      want = 2 + 4;
    } else if (family == AF_INET6) {
      want = 2 + 16;
    } else {
      return Bad("tcp device address family " + std::to_string(family));
    }
    if (dev.size() != want) return Bad("tcp device address length");
    if (iface.size() != 2) return Bad("tcp interface address length");
    return Status::OK();
  }
  if (e.transport == kPosix) {
    if (!SmDeviceAddressOk(dev) || iface.size() < 8) {
      return Bad("posix address length");
    }
    const uint64_t seg = Load<uint64_t>(iface);
    if (iface.size() != ((seg & kPosixFlagPidNs) ? 16u : 8u)) {
      return Bad("posix interface address length");
    }
    return Status::OK();
  }
  if (e.transport == kCma) {
    if (!SmDeviceAddressOk(dev) || iface.size() < 4) {
      return Bad("cma address length");
    }
    const uint32_t id = Load<uint32_t>(iface);
    if (iface.size() != ((id & kCmaFlagPidNs) ? 12u : 4u)) {
      return Bad("cma interface address length");
    }
    return Status::OK();
  }
  return Status::OK();
}

}  // namespace

uint16_t UcxTransportChecksum(std::string_view name) {
  // ucs_crc16_string: CRC-16-CCITT, reflected, initial 0xffff, inverted.
  uint16_t crc = 0xffff;
  for (char c : name) {
    crc ^= static_cast<uint8_t>(c);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc >> 1) ^ ((crc & 1) ? 0x8408 : 0));
    }
  }
  return static_cast<uint16_t>(~crc);
}

Result<ParsedWorkerAddress> ParseWorkerAddress(std::string_view bytes) {
  ParsedWorkerAddress out;
  Reader r(bytes);
  uint8_t b0;
  if (!r.Byte(&b0)) return Bad("empty");
  const unsigned version = b0 & 0x0f;
  uint8_t flags;
  if (version == kVersionV1) {
    flags = b0 >> 4;
  } else if (version == kVersionV2) {
    if (!r.Byte(&flags)) return Bad("truncated header");
  } else {
    return Bad("unknown version " + std::to_string(version));
  }
  if (flags & ~kHeaderKnown) return Bad("unknown header flags");
  out.version = version == kVersionV1 ? 1 : 2;
  std::string_view field;
  // ucp_ep_create unpacks the uuid of every v1 address, flagged or not.
  if (version == kVersionV1 || (flags & kHeaderWorkerUuid)) {
    if (!r.Take(8, &field)) return Bad("truncated worker uuid");
    out.has_uuid = (flags & kHeaderWorkerUuid) != 0;
    out.uuid = out.has_uuid ? Load<uint64_t>(field) : 0;
  }
  if ((flags & kHeaderClientId) && !r.Take(8, &field)) {
    return Bad("truncated client id");
  }
  if (flags & kHeaderDebugInfo) {
    uint8_t len;
    if (!r.Byte(&len) || !r.Take(len, &field)) {
      return Bad("truncated worker name");
    }
  }
  uint8_t next;
  if (!r.Peek(&next)) return Bad("no device list");
  if (next == kNullResource) {
    (void)r.Byte(&next);
    if (!r.done()) return Bad("bytes after an empty device list");
    return out;
  }
  const uint8_t md_mask = version == kVersionV1 ? kMdMaskV1 : kMdMaskV2;
  bool last_dev = false;
  for (size_t dev = 0; !last_dev; ++dev) {
    if (dev >= kMaxDevices) return Bad("too many devices");
    uint8_t md_byte, md_index;
    if (!r.Peek(&md_byte) || !r.Extended(md_mask, version, &md_index)) {
      return Bad("truncated device entry");
    }
    const bool empty_dev = (md_byte & kMdEmptyDev) != 0;
    uint8_t len_byte, dev_len;
    if (!r.Peek(&len_byte) || !r.Extended(kDeviceLenMask, version, &dev_len)) {
      return Bad("truncated device entry");
    }
    last_dev = (len_byte & kFlagLast) != 0;
    uint8_t ignored;
    if ((len_byte & kFlagNumPaths) && !r.Byte(&ignored)) {
      return Bad("truncated device entry");
    }
    if ((len_byte & kFlagSysDevice) && !r.Byte(&ignored)) {
      return Bad("truncated device entry");
    }
    std::string_view dev_addr;
    if (!r.Take(dev_len, &dev_addr)) return Bad("truncated device address");
    bool last_tl = empty_dev;
    while (!last_tl) {
      if (out.ifaces.size() >= kMaxEntries) return Bad("too many interfaces");
      WorkerAddressIface e;
      e.device = static_cast<uint8_t>(dev);
      e.device_address = dev_addr;
      std::string_view csum, attr;
      if (!r.Take(2, &csum)) return Bad("truncated interface entry");
      e.transport = Load<uint16_t>(csum);
      if (!r.Take(version == kVersionV1 ? kV1AttrBytes : kV2AttrBytes, &attr)) {
        return Bad("truncated interface attributes");
      }
      REMEM_RETURN_IF_ERROR(CheckAttributes(attr, version));
      uint8_t iface_flags, iface_len;
      if (!r.Peek(&iface_flags) ||
          !r.Extended(kIfaceLenMask, version, &iface_len)) {
        return Bad("truncated interface entry");
      }
      last_tl = (iface_flags & kFlagLast) != 0;
      if (!r.Take(iface_len, &e.iface_address)) {
        return Bad("truncated interface address");
      }
      // ucp_worker_get_address packs no endpoint addresses (those travel in
      // UCX's own wireup messages): refuse them rather than parse them.
      if (iface_flags & kFlagHasEpAddr) {
        return Bad("endpoint addresses in a worker address");
      }
      REMEM_RETURN_IF_ERROR(CheckTransport(e));
      out.ifaces.push_back(e);
    }
  }
  if (!r.done()) {
    return Bad(std::to_string(bytes.size() - r.pos()) +
               " bytes after the last device");
  }
  return out;
}

Result<SharedMemoryRef> SharedMemoryRefOf(const WorkerAddressIface& iface) {
  static const uint16_t kPosix = UcxTransportChecksum("posix");
  static const uint16_t kCma = UcxTransportChecksum("cma");
  SharedMemoryRef ref;
  ref.system_id = iface.device_address;
  if (iface.transport == kPosix && iface.iface_address.size() >= 8) {
    const uint64_t seg = Load<uint64_t>(iface.iface_address);
    ref.posix = true;
    ref.procfs = (seg & kPosixFlagProcfs) != 0;
    const uint64_t mmid = seg & ~kPosixFlagsMask;
    ref.pid = static_cast<int>(mmid & ((1ull << kPosixPidBits) - 1));
    ref.fd = static_cast<int>(mmid >> kPosixPidBits);
    if (!ref.procfs && !(seg & kPosixFlagShmOpen)) ref.fd = -1;
    return ref;
  }
  if (iface.transport == kCma && iface.iface_address.size() >= 4) {
    ref.pid =
        static_cast<int>(Load<uint32_t>(iface.iface_address) & ~kCmaFlagPidNs);
    return ref;
  }
  return Status::InvalidArgument("not a shared-memory interface entry");
}

Result<uint64_t> WorkerUuidOf(std::string_view bytes) {
  auto parsed = ParseWorkerAddress(bytes);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_uuid) {
    return Status::ProtocolError("the UCX worker address carries no uuid");
  }
  return parsed->uuid;
}

}  // namespace remem::fabric
