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

// A retiring or next table with no entry is kept empty (as decoded).
void DropEmptyTables(Config* c) {
  auto none = [](const std::vector<uint16_t>& t) {
    return std::all_of(t.begin(), t.end(),
                       [](uint16_t m) { return m == kNoMember; });
  };
  if (none(c->retiring)) c->retiring.clear();
  if (none(c->next)) c->next.clear();
  if (none(c->range_next)) c->range_next.clear();
}

// Whether members a and b declared the same failure domain.
bool SameDomain(const Member& a, const Member& b) {
  return !a.domain.empty() && a.domain == b.domain;
}

}  // namespace

bool ValidDomain(std::string_view domain) {
  return domain.empty() ||
         (domain.size() <= kMaxDomainBytes && ValidComponent(domain));
}

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

bool Config::IsBackup(uint32_t s, int index) const {
  if (index < 0) return false;
  for (uint32_t i = 0; i < replicas; ++i) {
    if (backups[size_t(s) * replicas + i] == uint16_t(index)) return true;
  }
  return RetiringOf(s) == uint16_t(index);
}

std::vector<uint16_t> Config::BackupsOf(uint32_t s) const {
  std::vector<uint16_t> out;
  for (uint32_t i = 0; i < replicas; ++i) {
    const uint16_t b = backups[size_t(s) * replicas + i];
    if (b != kNoMember) out.push_back(b);
  }
  if (RetiringOf(s) != kNoMember) out.push_back(RetiringOf(s));
  return out;
}

bool Config::IsFilling(uint32_t s, int index) const {
  if (index < 0) return false;
  for (uint32_t i = 0; i < replicas; ++i) {
    const size_t at = size_t(s) * replicas + i;
    if (backups[at] == uint16_t(index)) return FillingAt(at);
  }
  return false;
}

uint32_t Config::filling_shards() const {
  uint32_t n = 0;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    for (uint32_t i = 0; i < replicas; ++i) {
      if (FillingAt(size_t(s) * replicas + i)) {
        ++n;
        break;
      }
    }
  }
  return n;
}

uint32_t Config::RangeOf(std::string_view key) const {
  // The number of split keys at or below `key`.
  return uint32_t(
      std::upper_bound(splits.begin(), splits.end(), key,
                       [](std::string_view k, const std::string& s) {
                         return k < std::string_view(s);
                       }) -
      splits.begin());
}

uint32_t Config::moving_ranges() const {
  return uint32_t(std::count_if(range_next.begin(), range_next.end(),
                                [](uint16_t m) { return m != kNoMember; }));
}

uint32_t Config::RangesOf(int index) const {
  return uint32_t(
      std::count(range_owner.begin(), range_owner.end(), uint16_t(index)));
}

Result<std::vector<std::string>> ParseSplits(std::string_view list) {
  std::vector<std::string> out;
  if (list.empty()) return out;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view one = list.substr(0, comma);
    if (one.empty()) {
      return Status::InvalidArgument(
          "--tree-splits: an empty split key (keys are separated by single "
          "commas)");
    }
    if (one.size() > kMaxSplitBytes) {
      return Status::InvalidArgument("--tree-splits: a split key is at most " +
                                     std::to_string(kMaxSplitBytes) + " bytes");
    }
    out.emplace_back(one);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i] == out[i - 1]) {
      return Status::InvalidArgument("--tree-splits: '" + out[i] +
                                     "' is given twice");
    }
  }
  if (out.size() >= kMaxRanges) {
    return Status::InvalidArgument("--tree-splits: at most " +
                                   std::to_string(kMaxRanges - 1) +
                                   " split keys");
  }
  size_t total = 0;
  for (const std::string& k : out) total += k.size();
  if (total > kMaxSplitsTotalBytes) {
    return Status::InvalidArgument("--tree-splits: at most " +
                                   std::to_string(kMaxSplitsTotalBytes) +
                                   " bytes of split keys in all");
  }
  return out;
}

uint32_t Config::moving() const {
  return uint32_t(std::count_if(next.begin(), next.end(),
                                [](uint16_t n) { return n != kNoMember; }));
}

Config InitialConfig(std::string name, uint32_t epoch,
                     std::vector<Member> members, uint32_t num_shards,
                     uint32_t replicas,
                     const std::optional<std::vector<std::string>>& splits) {
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
  c.replicas = replicas;
  c.backups.assign(size_t(num_shards) * replicas, kNoMember);
  c.filling.assign(c.backups.size(), 0);
  // Each owner's backups, chained: the next members in address order,
  // those of other failure domains first.
  std::vector<std::vector<uint16_t>> chain(n);
  for (uint64_t o = 0; o < n; ++o) {
    std::vector<uint16_t>& b = chain[o];
    for (int pass = 0; pass < 2; ++pass) {
      for (uint64_t k = 1; k < n && b.size() < replicas; ++k) {
        const uint16_t m = uint16_t((o + k) % n);
        if (std::find(b.begin(), b.end(), m) != b.end()) continue;
        bool apart = !SameDomain(c.members[m], c.members[o]);
        for (uint16_t x : b)
          apart = apart && !SameDomain(c.members[m], c.members[x]);
        if (pass == 0 && !apart) continue;
        b.push_back(m);
      }
    }
  }
  for (uint64_t s = 0; s < num_shards; ++s) {
    const std::vector<uint16_t>& b = chain[c.owner[s]];
    for (uint32_t i = 0; i < b.size(); ++i) c.backups[s * replicas + i] = b[i];
  }
  if (splits.has_value()) {
    c.splits = *splits;
    c.range_owner.resize(splits->size() + 1);
    for (size_t r = 0; r < c.range_owner.size(); ++r) {
      c.range_owner[r] = uint16_t(r % n);
    }
    c.FollowCarriers();
  }
  return c;
}

void Config::FollowCarriers() {
  if (replicas == 0 || !ordered() || num_shards() == 0) return;
  range_next.clear();
  for (uint32_t r = 0; r < num_ranges(); ++r) {
    const uint32_t s = CarrierOf(r);
    range_owner[r] = owner[s];
    if (NextOf(s) != kNoMember) {
      if (range_next.empty()) range_next.assign(num_ranges(), kNoMember);
      range_next[r] = NextOf(s);
    }
  }
}

bool Config::FollowsCarriers() const {
  if (replicas == 0 || !ordered() || num_shards() == 0) return true;
  for (uint32_t r = 0; r < num_ranges(); ++r) {
    const uint32_t s = CarrierOf(r);
    if (range_owner[r] != owner[s] || RangeNextOf(r) != NextOf(s)) {
      return false;
    }
  }
  return true;
}

std::optional<Config> Failover(const Config& current,
                               const std::vector<Member>& live) {
  if (current.replicas == 0) return std::nullopt;
  Config next = current;
  next.epoch = current.epoch + 1;
  bool changed = false;
  // left[i]: members[i] is gone (or came back as another incarnation:
  // restarted[i]).
  std::vector<uint8_t> left(current.members.size(), 1);
  std::vector<uint8_t> restarted(current.members.size(), 0);
  for (size_t i = 0; i < current.members.size(); ++i) {
    const Member& m = current.members[i];
    for (const Member& l : live) {
      if (l.address != m.address) continue;
      if (l.incarnation == m.incarnation) {
        left[i] = 0;
      } else {
        next.members[i].incarnation = l.incarnation;
        next.members[i].capacity = l.capacity;
        restarted[i] = 1;
        changed = true;
      }
    }
  }
  const uint32_t f = current.replicas;
  next.filling.resize(next.backups.size(), 0);
  for (uint32_t s = 0; s < current.num_shards(); ++s) {
    uint16_t* b = &next.backups[size_t(s) * f];
    uint8_t* fill = &next.filling[size_t(s) * f];
    // The backups still here, in order: ready ones, then filling ones.
    std::vector<uint16_t> ready, filling;
    for (uint32_t i = 0; i < f; ++i) {
      if (b[i] == kNoMember || left[b[i]]) continue;
      (fill[i] != 0 ? filling : ready).push_back(b[i]);
    }
    // A retiring copy is whole too: promoted when no other ready one is
    // left, dropped when its member left.
    const uint16_t retiring = current.RetiringOf(s);
    const bool retiring_here = retiring != kNoMember && !left[retiring];
    // No ready copy left: the shard stays as it is, its owner and its
    // backups listed (its data is nowhere else; a member judged dead that
    // was only slow comes back with it, and is promoted then).
    const bool no_copy_left =
        left[next.owner[s]] && ready.empty() && !retiring_here;
    if (no_copy_left) {
      if (!restarted[next.owner[s]]) continue;
      // Its owner restarted (every copy went down: a whole cluster
      // stopped): it comes back with what it recovered from its data
      // directory, which holds every write it acknowledged, and owns the
      // shard again (its index now names the new incarnation). Its backups
      // that restarted too are filled again from it (they may lack its
      // last writes, never acknowledged); those gone are dropped below.
      // (`filling` holds the live ones being filled already.)
      for (uint32_t i = 0; i < f; ++i) {
        if (b[i] != kNoMember && restarted[b[i]]) filling.push_back(b[i]);
      }
    }
    uint16_t keep_retiring = retiring_here ? retiring : kNoMember;
    if (left[next.owner[s]] && !no_copy_left) {
      if (!ready.empty()) {
        next.owner[s] = ready.front();
        ready.erase(ready.begin());
      } else {
        next.owner[s] = retiring;
        keep_retiring = kNoMember;
      }
    }
    if (keep_retiring != retiring) {
      next.retiring.resize(next.num_shards(), kNoMember);
      next.retiring[s] = keep_retiring;
      changed = true;
    }
    for (uint32_t i = 0; i < f; ++i) {
      uint16_t v = kNoMember;
      uint8_t filled = 0;
      if (i < ready.size()) {
        v = ready[i];
      } else if (i < ready.size() + filling.size()) {
        v = filling[i - ready.size()];
        filled = 1;
      }
      if (b[i] != v || fill[i] != filled) changed = true;
      b[i] = v;
      fill[i] = filled;
    }
    if (next.owner[s] != current.owner[s]) changed = true;
  }
  for (const Member& l : live) {
    if (next.IndexOf(l.address) >= 0) continue;
    if (next.members.size() >= kMaxMembers) break;
    next.members.push_back(l);
    changed = true;
  }
  if (!changed) return std::nullopt;
  // A hand-over under way (a drain) starts again from the new roles.
  next.next.clear();
  DropEmptyTables(&next);
  return next;
}

std::optional<Config> PlanBackups(const Config& current,
                                  const std::vector<Member>& live,
                                  uint32_t max_shards,
                                  const std::vector<std::string>& excluded) {
  const uint32_t f = current.replicas;
  if (f == 0) return std::nullopt;
  const size_t n = current.members.size();
  std::vector<uint8_t> is_live(n, 0);
  for (const Member& l : live) {
    const int i = current.IndexOf(l.address);
    if (i >= 0 && current.members[size_t(i)].incarnation == l.incarnation) {
      is_live[size_t(i)] = 1;
    }
  }
  // May take a copy: live and not excluded.
  std::vector<uint8_t> takes = is_live;
  for (const std::string& a : excluded) {
    const int i = current.IndexOf(a);
    if (i >= 0) takes[size_t(i)] = 0;
  }
  // Shards each member holds (owned, backed up or filling).
  std::vector<uint64_t> load(n, 0);
  for (uint32_t s = 0; s < current.num_shards(); ++s) {
    ++load[current.owner[s]];
    for (uint16_t b : current.BackupsOf(s)) ++load[b];
  }
  Config next = current;
  next.epoch = current.epoch + 1;
  next.filling.resize(next.backups.size(), 0);
  uint32_t planned = 0;
  for (uint32_t s = 0; s < current.num_shards() && planned < max_shards; ++s) {
    if (!is_live[current.owner[s]]) continue;
    bool added = false;
    for (uint32_t i = 0; i < f; ++i) {
      const size_t at = size_t(s) * f + i;
      if (next.backups[at] != kNoMember) continue;
      // Apart: of a failure domain that neither the owner nor a backup
      // has; such a member wins, then the least loaded.
      auto apart = [&](size_t m) {
        if (SameDomain(next.members[m], next.members[next.owner[s]])) {
          return false;
        }
        for (uint16_t b : next.BackupsOf(s)) {
          if (SameDomain(next.members[m], next.members[b])) return false;
        }
        return true;
      };
      int best = -1;
      bool best_apart = false;
      for (size_t m = 0; m < n; ++m) {
        if (!takes[m] || m == next.owner[s] || next.IsBackup(s, int(m))) {
          continue;
        }
        const bool a = apart(m);
        if (best < 0 || (a && !best_apart) ||
            (a == best_apart && load[m] < load[size_t(best)])) {
          best = int(m);
          best_apart = a;
        }
      }
      if (best < 0) break;
      next.backups[at] = uint16_t(best);
      next.filling[at] = 1;
      ++load[size_t(best)];
      added = true;
    }
    if (added) ++planned;
  }
  if (planned == 0) return std::nullopt;
  return next;
}

Config CompleteFills(const Config& filling,
                     const std::vector<uint32_t>& shards) {
  Config c = filling;
  c.epoch = filling.epoch + 1;
  c.filling.resize(c.backups.size(), 0);
  for (uint32_t s : shards) {
    if (s >= c.num_shards()) continue;
    for (uint32_t i = 0; i < c.replicas; ++i) {
      c.filling[size_t(s) * c.replicas + i] = 0;
    }
    if (!c.retiring.empty()) c.retiring[s] = kNoMember;
  }
  DropEmptyTables(&c);
  return c;
}

std::optional<Config> NextBalanceStep(const Config& current,
                                      const std::vector<Member>& live,
                                      const std::vector<std::string>& drained,
                                      uint32_t max_moves,
                                      const std::vector<RefusedMove>& refused) {
  if (current.replicas > 0) return std::nullopt;
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
  for (uint16_t o : current.range_owner) ++count[o];
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
    // The incarnation registered now (a member restarted since it was
    // listed keeps its shards): a step's moves are abandoned once one of
    // their servers is not that incarnation any more.
    for (const Member& l : live) {
      if (l.address == m.address) {
        next.members.back().incarnation = l.incarnation;
      }
    }
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
  next.splits = current.splits;
  for (uint16_t o : current.range_owner) {
    next.range_owner.push_back(uint16_t(remap[o]));
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
  if (moves == 0 && next.ordered()) {
    // No shard to move: one ordered range, if one should move. From a
    // live drained member first; else from the member with the most
    // ranges, if it has two more than another eligible one.
    std::vector<uint32_t> ranges(next.members.size(), 0);
    for (uint16_t o : next.range_owner) ++ranges[o];
    auto is_refused = [&](uint32_t r, uint32_t to) {
      const std::string& a = next.members[to].address;
      uint64_t incarnation = 0;
      for (const Member& m : live) {
        if (m.address == a) incarnation = m.incarnation;
      }
      return std::any_of(refused.begin(), refused.end(), [&](const auto& x) {
        return x.range == r && x.address == a && x.incarnation == incarnation;
      });
    };
    // The eligible member with the fewest ranges that may take range r
    // (-1: none), and whether moving r there is a step: off a drained
    // member always, else only to even out a difference of two or more.
    auto target = [&](uint32_t r, bool drained_from) -> int {
      int to = -1;
      for (uint32_t i : eligible) {
        if (i == next.range_owner[r] || is_refused(r, i)) continue;
        if (to < 0 || ranges[i] < ranges[size_t(to)]) to = int(i);
      }
      if (to < 0) return -1;
      if (!drained_from &&
          ranges[next.range_owner[r]] < ranges[size_t(to)] + 2) {
        return -1;
      }
      return to;
    };
    int from_range = -1, to = -1;
    for (uint32_t r = 0; r < next.num_ranges() && from_range < 0; ++r) {
      const std::string& a = next.members[next.range_owner[r]].address;
      if (!is_live(a) || !is_drained(a)) continue;
      if ((to = target(r, true)) >= 0) from_range = int(r);
    }
    if (from_range < 0) {
      // The eligible members by ranges owned, most first (ties to the
      // first by address), each giving its last range (the one whose keys
      // sort last) if it should.
      std::vector<uint32_t> givers = eligible;
      std::stable_sort(
          givers.begin(), givers.end(),
          [&](uint32_t a, uint32_t b) { return ranges[a] > ranges[b]; });
      for (uint32_t from : givers) {
        for (uint32_t r = next.num_ranges(); r-- > 0;) {
          if (next.range_owner[r] != from) continue;
          if ((to = target(r, false)) >= 0) from_range = int(r);
          break;
        }
        if (from_range >= 0) break;
      }
    }
    if (from_range >= 0) {
      next.range_next.assign(next.num_ranges(), kNoMember);
      next.range_next[size_t(from_range)] = uint16_t(to);
      next.next.clear();
      return next;
    }
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
    const uint16_t to = c.NextOf(s);
    if (to == kNoMember) continue;
    // Replicated: `to` was a ready backup; the old owner, which holds the
    // same pairs, takes its place.
    for (uint32_t i = 0; i < c.replicas; ++i) {
      const size_t at = size_t(s) * c.replicas + i;
      if (c.backups[at] == to) c.backups[at] = c.owner[s];
    }
    c.owner[s] = to;
  }
  for (uint32_t r = 0; r < c.num_ranges(); ++r) {
    if (c.RangeNextOf(r) != kNoMember) c.range_owner[r] = c.range_next[r];
  }
  c.next.clear();
  c.range_next.clear();
  return c;
}

std::optional<Config> DrainStep(const Config& current,
                                const std::vector<Member>& live,
                                const std::vector<std::string>& drained) {
  const uint32_t f = current.replicas;
  if (f == 0 || current.moving() > 0 || current.filling_shards() > 0) {
    return std::nullopt;
  }
  const size_t n = current.members.size();
  std::vector<uint8_t> is_live(n, 0), is_drained(n, 0);
  for (const Member& l : live) {
    const int i = current.IndexOf(l.address);
    if (i >= 0 && current.members[size_t(i)].incarnation == l.incarnation) {
      is_live[size_t(i)] = 1;
    }
  }
  for (const std::string& a : drained) {
    const int i = current.IndexOf(a);
    if (i >= 0) is_drained[size_t(i)] = 1;
  }
  // 1. Primaries: each shard of a drained owner moves to a ready backup
  // that is live and stays.
  Config next = current;
  next.epoch = current.epoch + 1;
  next.next.assign(current.num_shards(), kNoMember);
  bool moves = false;
  for (uint32_t s = 0; s < current.num_shards(); ++s) {
    if (!is_drained[current.owner[s]]) continue;
    for (uint32_t i = 0; i < f; ++i) {
      const size_t at = size_t(s) * f + i;
      const uint16_t b = current.backups[at];
      if (b == kNoMember || current.FillingAt(at) || !is_live[b] ||
          is_drained[b]) {
        continue;
      }
      next.next[s] = b;
      moves = true;
      break;
    }
  }
  if (moves) return next;
  // 2. Backups: a drained member's copy retires in favour of one on a
  // member that stays (filled from the shard's owner), one per shard.
  Config vacated = current;
  vacated.next.clear();
  vacated.filling.resize(vacated.backups.size(), 0);
  vacated.retiring.resize(current.num_shards(), kNoMember);
  std::vector<uint8_t> touched(current.num_shards(), 0);
  for (uint32_t s = 0; s < current.num_shards(); ++s) {
    // One copy on its way out at a time (a fill that failed over left
    // one: re-replication fills its slot first).
    if (current.RetiringOf(s) != kNoMember) continue;
    std::vector<std::pair<uint16_t, uint8_t>> kept;
    for (uint32_t i = 0; i < f; ++i) {
      const size_t at = size_t(s) * f + i;
      const uint16_t b = current.backups[at];
      if (b == kNoMember) continue;
      if (is_drained[b] && !touched[s]) {
        touched[s] = 1;
        // A filling one is not a copy yet: simply dropped.
        if (!current.FillingAt(at)) vacated.retiring[s] = b;
        continue;
      }
      kept.emplace_back(b, current.FillingAt(at) ? 1 : 0);
    }
    if (!touched[s]) continue;
    // Ready ones first, then filling ones.
    std::stable_sort(
        kept.begin(), kept.end(),
        [](const auto& x, const auto& y) { return x.second < y.second; });
    for (uint32_t i = 0; i < f; ++i) {
      const size_t at = size_t(s) * f + i;
      vacated.backups[at] = i < kept.size() ? kept[i].first : kNoMember;
      vacated.filling[at] = i < kept.size() ? kept[i].second : 0;
    }
  }
  if (std::none_of(touched.begin(), touched.end(),
                   [](uint8_t t) { return t != 0; })) {
    return std::nullopt;
  }
  std::optional<Config> planned =
      PlanBackups(vacated, live, kMaxShards, drained);
  if (!planned) return std::nullopt;
  // A shard that got no member in the drained one's place keeps it.
  bool changed = false;
  planned->retiring.resize(current.num_shards(), kNoMember);
  for (uint32_t s = 0; s < current.num_shards(); ++s) {
    if (!touched[s]) continue;
    uint32_t slots_before = 0, slots_after = 0;
    for (uint32_t i = 0; i < f; ++i) {
      slots_before += current.backups[size_t(s) * f + i] != kNoMember;
      slots_after += planned->backups[size_t(s) * f + i] != kNoMember;
    }
    if (slots_after < slots_before) {
      for (uint32_t i = 0; i < f; ++i) {
        const size_t at = size_t(s) * f + i;
        planned->backups[at] = current.backups[at];
        planned->filling[at] = current.FillingAt(at) ? 1 : 0;
      }
      planned->retiring[s] = current.RetiringOf(s);
    } else {
      changed = true;
    }
  }
  if (!changed) return std::nullopt;
  planned->epoch = current.epoch + 1;
  DropEmptyTables(&*planned);
  return planned;
}

bool Config::HoldsAnyRole(int index) const {
  if (index < 0) return false;
  const uint16_t m = uint16_t(index);
  auto in = [m](const std::vector<uint16_t>& roles) {
    return std::find(roles.begin(), roles.end(), m) != roles.end();
  };
  return in(owner) || in(next) || in(backups) || in(retiring) ||
         in(range_owner) || in(range_next);
}

std::optional<Config> DropLeftMembers(const Config& current,
                                      const std::vector<std::string>& leaving) {
  if (current.replicas == 0) return std::nullopt;
  const size_t n = current.members.size();
  std::vector<uint8_t> keep(n, 1);
  for (size_t i = 0; i < n; ++i) {
    keep[i] = std::find(leaving.begin(), leaving.end(),
                        current.members[i].address) == leaving.end() ||
              current.HoldsAnyRole(int(i));
  }
  if (std::all_of(keep.begin(), keep.end(), [](uint8_t k) { return k; })) {
    return std::nullopt;
  }
  Config next = current;
  next.epoch = current.epoch + 1;
  next.members.clear();
  std::vector<uint16_t> remap(n, kNoMember);
  for (size_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    remap[i] = uint16_t(next.members.size());
    next.members.push_back(current.members[i]);
  }
  auto renumber = [&](std::vector<uint16_t>* roles) {
    for (uint16_t& m : *roles) {
      if (m != kNoMember) m = remap[m];
    }
  };
  renumber(&next.owner);
  renumber(&next.next);
  renumber(&next.backups);
  renumber(&next.retiring);
  renumber(&next.range_owner);
  renumber(&next.range_next);
  return next;
}

std::optional<Config> BalanceReplicas(const Config& current,
                                      const std::vector<Member>& live,
                                      const std::vector<std::string>& drained,
                                      uint32_t max_moves) {
  const uint32_t f = current.replicas;
  if (f == 0 || max_moves == 0 || current.moving() > 0 ||
      current.filling_shards() > 0 || !current.retiring.empty()) {
    return std::nullopt;
  }
  const size_t n = current.members.size();
  const uint32_t num_shards = current.num_shards();
  std::vector<uint8_t> eligible(n, 0);
  for (const Member& l : live) {
    const int i = current.IndexOf(l.address);
    if (i >= 0 && current.members[size_t(i)].incarnation == l.incarnation &&
        std::find(drained.begin(), drained.end(), l.address) == drained.end()) {
      eligible[size_t(i)] = 1;
    }
  }
  // Only a whole cluster is balanced: every role on an eligible member,
  // every shard with all its copies.
  std::vector<uint32_t> load(n, 0), owned(n, 0);
  for (uint32_t s = 0; s < num_shards; ++s) {
    if (!eligible[current.owner[s]]) return std::nullopt;
    ++load[current.owner[s]];
    ++owned[current.owner[s]];
    const std::vector<uint16_t> b = current.BackupsOf(s);
    if (b.size() < f) return std::nullopt;
    for (uint16_t m : b) {
      if (!eligible[m]) return std::nullopt;
      ++load[m];
    }
  }
  // 1. Copies: from the most loaded member to the least, a backup copy of
  // a shard the latter holds nothing of.
  Config next = current;
  next.epoch = current.epoch + 1;
  next.filling.resize(next.backups.size(), 0);
  next.retiring.assign(num_shards, kNoMember);
  uint32_t moves = 0;
  while (moves < max_moves) {
    int hi = -1, lo = -1;
    for (size_t m = 0; m < n; ++m) {
      if (!eligible[m]) continue;
      if (hi < 0 || load[m] > load[size_t(hi)]) hi = int(m);
      if (lo < 0 || load[m] < load[size_t(lo)]) lo = int(m);
    }
    if (hi < 0 || load[size_t(hi)] < load[size_t(lo)] + 2) break;
    bool moved = false;
    for (uint32_t s = 0; s < num_shards && !moved; ++s) {
      if (next.retiring[s] != kNoMember || next.owner[s] == uint16_t(lo) ||
          next.IsBackup(s, lo)) {
        continue;
      }
      for (uint32_t i = 0; i < f && !moved; ++i) {
        const size_t at = size_t(s) * f + i;
        if (next.backups[at] != uint16_t(hi) || next.FillingAt(at)) continue;
        // Not onto a failure domain the shard's other copies have, unless
        // the copy moved away shared one too.
        auto apart = [&](int m) {
          if (SameDomain(next.members[size_t(m)],
                         next.members[next.owner[s]])) {
            return false;
          }
          for (uint16_t b : next.BackupsOf(s)) {
            if (b != uint16_t(hi) &&
                SameDomain(next.members[size_t(m)], next.members[b])) {
              return false;
            }
          }
          return true;
        };
        if (!apart(lo) && apart(hi)) continue;
        // The copy retires; the new one fills at the end of the slots.
        next.retiring[s] = uint16_t(hi);
        for (uint32_t j = i; j + 1 < f; ++j) {
          next.backups[size_t(s) * f + j] = next.backups[size_t(s) * f + j + 1];
          next.filling[size_t(s) * f + j] = next.filling[size_t(s) * f + j + 1];
        }
        next.backups[size_t(s) * f + f - 1] = uint16_t(lo);
        next.filling[size_t(s) * f + f - 1] = 1;
        --load[size_t(hi)];
        ++load[size_t(lo)];
        moved = true;
      }
    }
    if (!moved) break;
    ++moves;
  }
  if (moves > 0) {
    DropEmptyTables(&next);
    return next;
  }
  // 2. Primaries: a shard moves to one of its ready backups that owns two
  // or more shards fewer than its owner.
  next = current;
  next.epoch = current.epoch + 1;
  next.next.assign(num_shards, kNoMember);
  for (uint32_t s = 0; s < num_shards && moves < max_moves; ++s) {
    const uint16_t o = current.owner[s];
    int best = -1;
    for (uint32_t i = 0; i < f; ++i) {
      const size_t at = size_t(s) * f + i;
      const uint16_t b = current.backups[at];
      if (b == kNoMember || current.FillingAt(at) || !eligible[b]) continue;
      if (owned[b] + 2 <= owned[o] &&
          (best < 0 || owned[b] < owned[size_t(best)])) {
        best = b;
      }
    }
    if (best < 0) continue;
    next.next[s] = uint16_t(best);
    --owned[o];
    ++owned[size_t(best)];
    ++moves;
  }
  if (moves == 0) return std::nullopt;
  return next;
}

Config AbandonMoves(const Config& moving) {
  Config c = moving;
  c.epoch = moving.epoch + 1;
  c.next.clear();
  c.range_next.clear();
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
  h.replicas = c.replicas;
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
  for (size_t i = 0; i < c.backups.size(); ++i) {
    const uint16_t b = c.backups[i];
    proto::Append(
        &out,
        uint16_t(b != kNoMember && c.FillingAt(i) ? b | kBackupFilling : b));
  }
  for (const Member& m : c.members) proto::Append(&out, m.incarnation);
  for (const Member& m : c.members) {
    proto::Append(&out, uint8_t(m.domain.size()));
    out += m.domain;
  }
  for (uint32_t s = 0; s < c.num_shards(); ++s) {
    proto::Append(&out, c.RetiringOf(s));
  }
  proto::Append(&out, c.num_ranges());
  for (uint16_t o : c.range_owner) proto::Append(&out, o);
  for (const std::string& k : c.splits) {
    proto::Append(&out, uint16_t(k.size()));
    out += k;
  }
  for (uint32_t r = 0; r < c.num_ranges(); ++r) {
    proto::Append(&out, c.RangeNextOf(r));
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
  if (h.version < 1 || h.version > kConfigVersion) {
    return proto::Bad("cluster configuration: version " +
                      std::to_string(h.version) + ", this build reads " +
                      std::to_string(kConfigVersion));
  }
  if (h.reserved[0] || h.reserved[1] || (h.version < 3 && h.replicas != 0)) {
    return proto::Bad("cluster configuration: reserved bytes set");
  }
  if (h.replicas > kMaxReplicas) {
    return proto::Bad("cluster configuration: " + std::to_string(h.replicas) +
                      " replicas (at most " + std::to_string(kMaxReplicas) +
                      ")");
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
  const uint64_t tail =
      h.version < 3 ? 0
                    : uint64_t(h.num_shards) * h.replicas * sizeof(uint16_t) +
                          uint64_t(h.num_members) * sizeof(uint64_t);
  // Version 5 ends with the members' failure domains (a length byte, then
  // the name each), whose length only reading them tells.
  const uint64_t fixed = tables * h.num_shards * sizeof(uint16_t) + tail +
                         (h.version >= 6 ? h.num_shards * sizeof(uint16_t) : 0);
  if (h.version < 5 ? r.remaining() != fixed
                    : r.remaining() < fixed + h.num_members) {
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
  if (h.version >= 3) {
    c.replicas = h.replicas;
    c.backups.assign(size_t(h.num_shards) * h.replicas, kNoMember);
    c.filling.assign(c.backups.size(), 0);
    for (uint32_t s = 0; s < h.num_shards; ++s) {
      // A kNoMember seen: the rest must be too; a filling one seen: the
      // rest are filling or kNoMember.
      bool none = false, filling = false;
      for (uint32_t i = 0; i < h.replicas; ++i) {
        uint16_t b = kNoMember;
        (void)r.Read(&b);
        const bool fill =
            h.version >= 4 && b != kNoMember && (b & kBackupFilling) != 0;
        if (fill) b &= uint16_t(~kBackupFilling);
        if (b == kNoMember) {
          none = true;
        } else if (none || (filling && !fill) || b >= h.num_members ||
                   b == c.owner[s] || c.IsBackup(s, b)) {
          return proto::Bad("cluster configuration: bad backup of shard " +
                            std::to_string(s));
        }
        filling = filling || fill;
        c.backups[size_t(s) * h.replicas + i] = b;
        c.filling[size_t(s) * h.replicas + i] = fill ? 1 : 0;
      }
    }
    for (Member& m : c.members) (void)r.Read(&m.incarnation);
  }
  if (h.version >= 5) {
    for (Member& m : c.members) {
      uint8_t len = 0;
      if (!r.Read(&len) || !r.ReadBytes(len, &m.domain) ||
          !ValidDomain(m.domain)) {
        return proto::Bad("cluster configuration: bad failure domain");
      }
    }
  }
  if (h.version >= 6) {
    c.retiring.assign(h.num_shards, kNoMember);
    bool any = false;
    for (uint32_t s = 0; s < h.num_shards; ++s) {
      uint16_t x = kNoMember;
      if (!r.Read(&x)) {
        return proto::Bad("cluster configuration: truncated retiring table");
      }
      if (x == kNoMember) continue;
      if (h.replicas == 0 || x >= h.num_members || x == c.owner[s] ||
          c.IsBackup(s, x)) {
        return proto::Bad("cluster configuration: bad retiring copy of shard " +
                          std::to_string(s));
      }
      c.retiring[s] = x;
      any = true;
    }
    if (!any) c.retiring.clear();
  }
  if (h.version >= 7) {
    uint32_t ranges = 0;
    if (!r.Read(&ranges) || ranges > kMaxRanges ||
        r.remaining() < uint64_t(ranges) * sizeof(uint16_t)) {
      return proto::Bad("cluster configuration: bad ordered range count");
    }
    c.range_owner.resize(ranges);
    for (uint16_t& o : c.range_owner) {
      (void)r.Read(&o);
      if (o >= h.num_members) {
        return proto::Bad("cluster configuration: range owned by no member");
      }
    }
    size_t total = 0;
    for (uint32_t i = 0; i + 1 < ranges; ++i) {
      uint16_t len = 0;
      std::string k;
      if (!r.Read(&len) || len == 0 || len > kMaxSplitBytes ||
          (total += len) > kMaxSplitsTotalBytes || !r.ReadBytes(len, &k) ||
          (i > 0 && !(c.splits.back() < k))) {
        return proto::Bad("cluster configuration: bad split key " +
                          std::to_string(i));
      }
      c.splits.push_back(std::move(k));
    }
    if (h.version >= 8) {
      c.range_next.assign(ranges, kNoMember);
      for (uint32_t i = 0; i < ranges; ++i) {
        uint16_t n = kNoMember;
        if (!r.Read(&n)) {
          return proto::Bad("cluster configuration: truncated range moves");
        }
        if (n != kNoMember && (n >= h.num_members || n == c.range_owner[i])) {
          return proto::Bad("cluster configuration: range " +
                            std::to_string(i) + " moving nowhere");
        }
        c.range_next[i] = n;
      }
      DropEmptyTables(&c);
    }
    if (!c.FollowsCarriers()) {
      return proto::Bad(
          "cluster configuration: a replicated range not with its carrier "
          "shard");
    }
  }
  if (h.version >= 5) {
    if (r.remaining() != 0) {
      return proto::Bad("cluster configuration: trailing bytes");
    }
  }
  return c;
}

std::string EncodeMemberRecord(const Member& m) {
  return "remem-member 3\n" + m.address + "\n" + std::to_string(m.capacity) +
         "\n" + std::to_string(m.incarnation) + "\n" + m.domain + "\n";
}

namespace {

// A decimal uint64 without leading zeros.
bool ParseNumber(std::string_view s, uint64_t* out) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Result<Member> DecodeMemberRecord(std::string_view bytes) {
  constexpr std::string_view kHead1 = "remem-member 1\n";
  constexpr std::string_view kHead2 = "remem-member 2\n";
  constexpr std::string_view kHead3 = "remem-member 3\n";
  const bool v3 = bytes.substr(0, kHead3.size()) == kHead3;
  const bool v2 = v3 || bytes.substr(0, kHead2.size()) == kHead2;
  if (!v2 && bytes.substr(0, kHead1.size()) != kHead1) {
    return proto::Bad("member record: bad header");
  }
  bytes.remove_prefix(kHead1.size());
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
  if (v3) {
    // The domain is the last line (possibly empty).
    const size_t last = bytes.rfind('\n');
    if (last == std::string_view::npos) {
      return proto::Bad("member record: no failure domain");
    }
    m.domain = std::string(bytes.substr(last + 1));
    if (!ValidDomain(m.domain)) {
      return proto::Bad("member record: bad failure domain");
    }
    bytes.remove_suffix(bytes.size() - last);
  }
  std::string_view capacity = bytes;
  if (v2) {
    const size_t nl2 = bytes.find('\n');
    if (nl2 == std::string_view::npos) {
      return proto::Bad("member record: no incarnation");
    }
    capacity = bytes.substr(0, nl2);
    if (!ParseNumber(bytes.substr(nl2 + 1), &m.incarnation)) {
      return proto::Bad("member record: bad incarnation");
    }
  }
  if (!ParseNumber(capacity, &m.capacity)) {
    return proto::Bad("member record: bad capacity");
  }
  return m;
}

std::string EncodeLeaseAsk(const LeaseAsk& ask) {
  std::string out;
  LeaseRequest r{};
  r.magic = kLeaseRequestMagic;
  r.epoch = ask.epoch;
  r.incarnation = ask.incarnation;
  r.address_len = uint32_t(ask.address.size());
  proto::Append(&out, r);
  out += ask.address;
  return out;
}

Result<LeaseAsk> DecodeLeaseAsk(std::string_view bytes) {
  proto::Reader r(bytes);
  LeaseRequest h;
  if (!r.Read(&h) || h.magic != kLeaseRequestMagic || h.reserved != 0 ||
      h.address_len == 0 || h.address_len > kMaxAddressBytes ||
      r.remaining() != h.address_len) {
    return proto::Bad("lease request: malformed");
  }
  LeaseAsk a;
  a.epoch = h.epoch;
  a.incarnation = h.incarnation;
  (void)r.ReadBytes(h.address_len, &a.address);
  return a;
}

std::string EncodeLeaseGrant(const LeaseGrant& grant) {
  std::string out;
  LeaseReply r{};
  r.magic = kLeaseReplyMagic;
  r.epoch = grant.epoch;
  r.lease_ms = grant.lease_ms;
  r.config_len = uint32_t(grant.config.size());
  proto::Append(&out, r);
  out += grant.config;
  return out;
}

Result<LeaseGrant> DecodeLeaseGrant(std::string_view bytes) {
  proto::Reader r(bytes);
  LeaseReply h;
  if (!r.Read(&h) || h.magic != kLeaseReplyMagic || h.lease_ms == 0 ||
      r.remaining() != h.config_len) {
    return proto::Bad("lease grant: malformed");
  }
  LeaseGrant g;
  g.epoch = h.epoch;
  g.lease_ms = h.lease_ms;
  (void)r.ReadBytes(h.config_len, &g.config);
  return g;
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
  // A trailing slash is an empty last component, refused below like any
  // other: stripped, "ZK/remem/" formed a cluster at /remem, the parent
  // of the clusters beneath it.
  if (path.size() <= 1) {
    return Status::InvalidArgument("--cluster: the path names no cluster in '" +
                                   std::string(spec) + "'");
  }
  std::string_view rest = path.substr(1);
  while (true) {
    const size_t n = rest.find('/');
    std::string_view c = rest.substr(0, n);
    if (!ValidComponent(c)) {
      return Status::InvalidArgument(
          "--cluster: path components are [A-Za-z0-9_.-]+, none empty (no "
          "'//', no trailing '/'); got '" +
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
