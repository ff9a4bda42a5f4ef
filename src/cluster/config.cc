#include "cluster/config.h"

#include <xxhash.h>

#include <algorithm>
#include <charconv>

#include "cluster/wire.h"
#include "proto/buffer.h"

namespace remem::cluster {

namespace {

constexpr uint64_t kShardSeed = 0x72656d656d736864ull;  // "rememshd"

bool ValidComponent(std::string_view c) {
  if (c.empty() || c == "." || c == "..") return false;
  return std::all_of(c.begin(), c.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
  });
}

}  // namespace

uint32_t ShardOf(std::string_view key, uint32_t num_shards) {
  return uint32_t(XXH3_64bits_withSeed(key.data(), key.size(), kShardSeed) %
                  num_shards);
}

int Config::IndexOf(std::string_view address) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].address == address) return int(i);
  }
  return -1;
}

uint32_t Config::ShardsOf(int index) const {
  return uint32_t(std::count(owner.begin(), owner.end(), uint16_t(index)));
}

Config InitialConfig(std::string name, uint32_t epoch,
                     std::vector<Member> members, uint32_t num_shards) {
  std::sort(
      members.begin(), members.end(),
      [](const Member& a, const Member& b) { return a.address < b.address; });
  Config c;
  c.name = std::move(name);
  c.epoch = epoch;
  c.members = std::move(members);
  c.owner.resize(num_shards);
  const uint64_t n = c.members.size();
  for (uint64_t s = 0; s < num_shards; ++s) {
    c.owner[s] = uint16_t(s * n / num_shards);
  }
  return c;
}

std::string EncodeConfig(const Config& c) {
  std::string out;
  ConfigHeader h{};
  h.magic = kConfigMagic;
  h.version = kConfigVersion;
  h.name_len = uint16_t(c.name.size());
  h.epoch = c.epoch;
  h.num_shards = c.num_shards();
  h.num_members = uint32_t(c.members.size());
  proto::Append(&out, h);
  out += c.name;
  for (const Member& m : c.members) {
    MemberEntry e{};
    e.capacity = m.capacity;
    e.address_len = uint32_t(m.address.size());
    proto::Append(&out, e);
    out += m.address;
  }
  for (uint16_t o : c.owner) proto::Append(&out, o);
  return out;
}

Result<Config> DecodeConfig(std::string_view bytes) {
  proto::Reader r(bytes);
  ConfigHeader h;
  if (!r.Read(&h)) return proto::Bad("cluster configuration: truncated header");
  if (h.magic != kConfigMagic) {
    return proto::Bad("cluster configuration: bad magic");
  }
  if (h.version != kConfigVersion) {
    return proto::Bad("cluster configuration: version " +
                      std::to_string(h.version) + ", this build reads " +
                      std::to_string(kConfigVersion));
  }
  if (h.reserved[0] || h.reserved[1] || h.reserved[2]) {
    return proto::Bad("cluster configuration: reserved bytes set");
  }
  if (h.epoch == 0) return proto::Bad("cluster configuration: epoch 0");
  if (h.name_len == 0 || h.name_len > kMaxNameBytes) {
    return proto::Bad("cluster configuration: bad name length");
  }
  if (h.num_shards == 0 || h.num_shards > kMaxShards) {
    return proto::Bad("cluster configuration: bad shard count");
  }
  if (h.num_members == 0 || h.num_members > kMaxMembers) {
    return proto::Bad("cluster configuration: bad member count");
  }
  Config c;
  c.epoch = h.epoch;
  if (!r.ReadBytes(h.name_len, &c.name)) {
    return proto::Bad("cluster configuration: truncated name");
  }
  if (!ValidComponent(c.name)) {
    return proto::Bad("cluster configuration: bad name");
  }
  c.members.resize(h.num_members);
  for (Member& m : c.members) {
    MemberEntry e;
    if (!r.Read(&e))
      return proto::Bad("cluster configuration: truncated member");
    if (e.reserved != 0 || e.address_len == 0 ||
        e.address_len > kMaxAddressBytes) {
      return proto::Bad("cluster configuration: bad member entry");
    }
    m.capacity = e.capacity;
    if (!r.ReadBytes(e.address_len, &m.address)) {
      return proto::Bad("cluster configuration: truncated address");
    }
  }
  if (r.remaining() != uint64_t(h.num_shards) * sizeof(uint16_t)) {
    return proto::Bad("cluster configuration: shard table length");
  }
  c.owner.resize(h.num_shards);
  for (uint16_t& o : c.owner) {
    (void)r.Read(&o);
    if (o >= h.num_members) {
      return proto::Bad("cluster configuration: shard owned by no member");
    }
  }
  return c;
}

std::string EncodeMemberRecord(const Member& m) {
  return "remem-member 1\n" + m.address + "\n" + std::to_string(m.capacity) +
         "\n";
}

Result<Member> DecodeMemberRecord(std::string_view bytes) {
  constexpr std::string_view kHead = "remem-member 1\n";
  if (bytes.substr(0, kHead.size()) != kHead) {
    return proto::Bad("member record: bad header");
  }
  bytes.remove_prefix(kHead.size());
  const size_t nl = bytes.find('\n');
  if (nl == std::string_view::npos || nl == 0 || nl > kMaxAddressBytes) {
    return proto::Bad("member record: bad address");
  }
  Member m;
  m.address = std::string(bytes.substr(0, nl));
  bytes.remove_prefix(nl + 1);
  if (bytes.empty() || bytes.back() != '\n') {
    return proto::Bad("member record: bad capacity");
  }
  bytes.remove_suffix(1);
  if (bytes.size() > 1 && bytes[0] == '0') {
    return proto::Bad("member record: bad capacity");
  }
  auto [p, ec] =
      std::from_chars(bytes.data(), bytes.data() + bytes.size(), m.capacity);
  if (ec != std::errc() || p != bytes.data() + bytes.size()) {
    return proto::Bad("member record: bad capacity");
  }
  return m;
}

Result<ZkTarget> ParseZkTarget(std::string_view spec) {
  const size_t slash = spec.find('/');
  if (slash == std::string_view::npos || slash == 0) {
    return Status::InvalidArgument(
        "--cluster wants ZK_HOSTS/PATH, e.g. 127.0.0.1:2181/remem/prod; got '" +
        std::string(spec) + "'");
  }
  ZkTarget t;
  t.hosts = std::string(spec.substr(0, slash));
  std::string_view path = spec.substr(slash);
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (path.size() <= 1) {
    return Status::InvalidArgument("--cluster: the path names no cluster in '" +
                                   std::string(spec) + "'");
  }
  std::string_view rest = path.substr(1);
  while (!rest.empty()) {
    const size_t n = rest.find('/');
    std::string_view c = rest.substr(0, n);
    if (!ValidComponent(c)) {
      return Status::InvalidArgument(
          "--cluster: path components are [A-Za-z0-9_.-]+; got '" +
          std::string(path) + "'");
    }
    t.name = std::string(c);
    if (n == std::string_view::npos) break;
    rest.remove_prefix(n + 1);
  }
  if (t.name.size() > kMaxNameBytes) {
    return Status::InvalidArgument("--cluster: the cluster name is too long");
  }
  t.path = std::string(path);
  return t;
}

}  // namespace remem::cluster
