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

uint32_t Config::moving() const {
  return uint32_t(std::count_if(next.begin(), next.end(),
                                [](uint16_t n) { return n != kNoMember; }));
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

std::optional<Config> NextBalanceStep(const Config& current,
                                      const std::vector<Member>& live,
                                      const std::vector<std::string>& drained,
                                      uint32_t max_moves) {
  auto is_live = [&](const std::string& a) {
    return std::any_of(live.begin(), live.end(),
                       [&](const Member& m) { return m.address == a; });
  };
  auto is_drained = [&](const std::string& a) {
    return std::find(drained.begin(), drained.end(), a) != drained.end();
  };
  const uint32_t num_shards = current.num_shards();
  // The members of the next configuration: the current ones that still
  // own shards or take them, then the live ones that are new.
  std::vector<uint32_t> count(current.members.size(), 0);
  for (uint16_t o : current.owner) ++count[o];
  Config next;
  next.name = current.name;
  next.epoch = current.epoch + 1;
  std::vector<int> remap(current.members.size(), -1);
  for (size_t i = 0; i < current.members.size(); ++i) {
    const Member& m = current.members[i];
    const bool keep =
        count[i] > 0 || (is_live(m.address) && !is_drained(m.address));
    if (!keep) continue;
    remap[i] = int(next.members.size());
    next.members.push_back(m);
  }
  for (const Member& m : live) {
    if (next.IndexOf(m.address) >= 0 || current.IndexOf(m.address) >= 0 ||
        is_drained(m.address)) {
      continue;
    }
    if (next.members.size() >= kMaxMembers) break;
    next.members.push_back(m);
  }
  next.owner.resize(num_shards);
  for (uint32_t s = 0; s < num_shards; ++s) {
    next.owner[s] = uint16_t(remap[current.owner[s]]);
  }
  next.next.assign(num_shards, kNoMember);
  // Each eligible member's share, the first ones by address taking the
  // remainder.
  std::vector<uint32_t> eligible;
  for (uint32_t i = 0; i < next.members.size(); ++i) {
    const std::string& a = next.members[i].address;
    if (is_live(a) && !is_drained(a)) eligible.push_back(i);
  }
  if (eligible.empty()) return std::nullopt;
  std::sort(eligible.begin(), eligible.end(), [&](uint32_t a, uint32_t b) {
    return next.members[a].address < next.members[b].address;
  });
  std::vector<int64_t> want(next.members.size(), 0);
  for (size_t r = 0; r < eligible.size(); ++r) {
    want[eligible[r]] = num_shards / eligible.size() +
                        (r < num_shards % eligible.size() ? 1 : 0);
  }
  std::vector<int64_t> have(next.members.size(), 0);
  for (uint16_t o : next.owner) ++have[o];
  // Shards that may leave: all of a live drained member's, and the last
  // ones of an eligible member above its share. A member that is not live
  // keeps its shards.
  std::vector<uint32_t> leaving;
  std::vector<int64_t> excess(next.members.size(), 0);
  for (uint32_t i = 0; i < next.members.size(); ++i) {
    const std::string& a = next.members[i].address;
    if (!is_live(a)) continue;
    excess[i] =
        is_drained(a) ? have[i] : std::max<int64_t>(0, have[i] - want[i]);
  }
  for (uint32_t s = num_shards; s-- > 0;) {
    const uint16_t o = next.owner[s];
    if (excess[o] > 0) {
      --excess[o];
      leaving.push_back(s);
    }
  }
  std::reverse(leaving.begin(), leaving.end());
  uint32_t moves = 0;
  size_t r = 0;
  for (uint32_t s : leaving) {
    if (moves >= max_moves) break;
    while (r < eligible.size() && have[eligible[r]] >= want[eligible[r]]) ++r;
    if (r == eligible.size()) break;
    const uint32_t to = eligible[r];
    next.next[s] = uint16_t(to);
    --have[next.owner[s]];
    ++have[to];
    ++moves;
  }
  if (moves == 0) {
    // Nothing to move; a step still drops members that are done with (a
    // drained member that owns nothing) and lists new ones.
    bool same = next.members.size() == current.members.size();
    for (size_t i = 0; same && i < next.members.size(); ++i) {
      same = next.members[i].address == current.members[i].address;
    }
    if (same) return std::nullopt;
    next.next.clear();
  }
  return next;
}

Config CompleteMoves(const Config& moving) {
  Config c = moving;
  c.epoch = moving.epoch + 1;
  for (uint32_t s = 0; s < c.num_shards(); ++s) {
    if (c.NextOf(s) != kNoMember) c.owner[s] = c.next[s];
  }
  c.next.clear();
  return c;
}

Config AbandonMoves(const Config& moving) {
  Config c = moving;
  c.epoch = moving.epoch + 1;
  c.next.clear();
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
  for (uint32_t s = 0; s < c.num_shards(); ++s) {
    proto::Append(&out, c.NextOf(s));
  }
  return out;
}

Result<Config> DecodeConfig(std::string_view bytes) {
  proto::Reader r(bytes);
  ConfigHeader h;
  if (!r.Read(&h)) return proto::Bad("cluster configuration: truncated header");
  if (h.magic != kConfigMagic) {
    return proto::Bad("cluster configuration: bad magic");
  }
  if (h.version != kConfigVersion && h.version != 1) {
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
  const uint64_t tables = h.version == 1 ? 1 : 2;
  if (r.remaining() != tables * h.num_shards * sizeof(uint16_t)) {
    return proto::Bad("cluster configuration: shard table length");
  }
  c.owner.resize(h.num_shards);
  for (uint16_t& o : c.owner) {
    (void)r.Read(&o);
    if (o >= h.num_members) {
      return proto::Bad("cluster configuration: shard owned by no member");
    }
  }
  if (tables == 2) {
    c.next.assign(h.num_shards, kNoMember);
    bool any = false;
    for (uint32_t s = 0; s < h.num_shards; ++s) {
      uint16_t n = kNoMember;
      (void)r.Read(&n);
      if (n == kNoMember) continue;
      if (n >= h.num_members || n == c.owner[s]) {
        return proto::Bad("cluster configuration: a shard moving nowhere");
      }
      c.next[s] = n;
      any = true;
    }
    if (!any) c.next.clear();
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
