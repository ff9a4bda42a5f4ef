#include "cluster/config.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "cluster/wire.h"
#include "remem/cluster.h"

namespace remem::cluster {
namespace {

Config ThreeServers() {
  return InitialConfig(
      "prod", 4,
      {{"10.0.0.3:7400", 3}, {"10.0.0.1:7400", 1}, {"10.0.0.2:7400", 2}},
      kDefaultShards);
}

TEST(ClusterConfig, TheFirstConfigurationSplitsShardsEvenlyInAddressOrder) {
  const Config c = ThreeServers();
  ASSERT_EQ(c.members.size(), 3u);
  EXPECT_EQ(c.members[0].address, "10.0.0.1:7400");
  EXPECT_EQ(c.members[2].capacity, 3u);
  EXPECT_EQ(c.ShardsOf(0) + c.ShardsOf(1) + c.ShardsOf(2), kDefaultShards);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(c.ShardsOf(i), kDefaultShards / 3) << i;
    EXPECT_LE(c.ShardsOf(i), kDefaultShards / 3 + 1) << i;
  }
  EXPECT_EQ(c.IndexOf("10.0.0.2:7400"), 1);
  EXPECT_EQ(c.IndexOf("10.0.0.9:7400"), -1);
}

TEST(ClusterConfig, KeysSpreadOverShardsAndAlwaysMapAlike) {
  std::map<uint32_t, int> per_shard;
  for (int i = 0; i < 100000; ++i) {
    const std::string k = "key" + std::to_string(i);
    const uint32_t s = ShardOf(k, kDefaultShards);
    ASSERT_LT(s, kDefaultShards);
    EXPECT_EQ(s, ShardOf(k, kDefaultShards));
    ++per_shard[s];
  }
  EXPECT_EQ(per_shard.size(), kDefaultShards);
  for (const auto& [s, n] : per_shard) {
    EXPECT_GT(n, 40) << s;  // ~98 expected
    EXPECT_LT(n, 180) << s;
  }
}

TEST(ClusterConfig, EncodesAndDecodesAndRefusesEveryMalformedPart) {
  const Config c = ThreeServers();
  const std::string bytes = EncodeConfig(c);
  auto d = DecodeConfig(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->name, "prod");
  EXPECT_EQ(d->epoch, 4u);
  EXPECT_EQ(d->owner, c.owner);
  EXPECT_EQ(EncodeConfig(*d), bytes);
  EXPECT_EQ(d->OwnerOf("some key").address, c.OwnerOf("some key").address);

  // Every truncation is refused.
  for (size_t n = 0; n < bytes.size(); n += 7) {
    EXPECT_FALSE(DecodeConfig(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeConfig(bytes + "x").ok());
  auto patched = [&](size_t off, auto v) {
    std::string b = bytes;
    std::memcpy(b.data() + off, &v, sizeof(v));
    return DecodeConfig(b);
  };
  EXPECT_FALSE(patched(0, uint32_t(0)).ok());  // magic
  EXPECT_EQ(patched(4, uint16_t(kConfigVersion + 1)).status().code(),
            StatusCode::kProtocolError);                     // version
  EXPECT_FALSE(patched(8, uint32_t(0)).ok());                // epoch
  EXPECT_FALSE(patched(12, uint32_t(kMaxShards + 1)).ok());  // shards
  EXPECT_FALSE(patched(16, uint32_t(0)).ok());               // members
  EXPECT_FALSE(patched(20, uint32_t(1)).ok());  // replicas, no backups
  EXPECT_FALSE(patched(24, uint32_t(1)).ok());  // reserved
  // A shard owned by a member that does not exist, or moving to one.
  // (The tail: three incarnations, three empty failure domains, the
  // retiring table, the ordered ranges' count.)
  const size_t ranges = bytes.size() - sizeof(uint32_t);
  const size_t incarnations =
      ranges - 2 * kDefaultShards - 3 - 3 * sizeof(uint64_t);
  const size_t owners = incarnations - 4 * kDefaultShards;
  EXPECT_FALSE(patched(owners, uint16_t(3)).ok());
  EXPECT_FALSE(patched(incarnations - 2, uint16_t(3)).ok());
  // ... or moving to its own owner.
  EXPECT_FALSE(patched(incarnations - 2, c.owner.back()).ok());
  // A retiring copy in a configuration without replicas.
  EXPECT_FALSE(patched(ranges - 2, uint16_t(1)).ok());
  // Ordered ranges whose owners and splits are missing.
  EXPECT_FALSE(patched(ranges, uint32_t(1)).ok());
  // A name that is not a path component.
  std::string bad_name = bytes;
  bad_name[sizeof(ConfigHeader)] = '/';
  EXPECT_FALSE(DecodeConfig(bad_name).ok());
}

TEST(ClusterConfig, MemberRecordsAndZooKeeperTargets) {
  const Member m{"127.0.0.1:7400", 1ull << 30, 0x1234567890abcdefull};
  auto d = DecodeMemberRecord(EncodeMemberRecord(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->address, m.address);
  EXPECT_EQ(d->capacity, m.capacity);
  EXPECT_EQ(d->incarnation, m.incarnation);
  // Version 1 (no incarnation) is still read.
  auto v1 = DecodeMemberRecord("remem-member 1\na:1\n7\n");
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(v1->capacity, 7u);
  EXPECT_EQ(v1->incarnation, 0u);
  for (const char* bad :
       {"", "remem-member 2\na:1\n1\n", "remem-member 1\n\n1\n",
        "remem-member 1\na:1\n", "remem-member 1\na:1\n01\n",
        "remem-member 1\na:1\n1x\n", "remem-member 1\na:1\n1",
        "remem-member 2\na:1\n1\nx\n", "remem-member 3\na:1\n1\n2\n"}) {
    EXPECT_FALSE(DecodeMemberRecord(bad).ok()) << bad;
  }

  auto t = ParseZkTarget("10.0.0.1:2181,10.0.0.2:2181/remem/prod");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->hosts, "10.0.0.1:2181,10.0.0.2:2181");
  EXPECT_EQ(t->path, "/remem/prod");
  EXPECT_EQ(t->name, "prod");
  // A trailing slash too: it was stripped, and "h:1/remem/" formed a
  // cluster at /remem, the parent of other clusters.
  for (const char* bad :
       {"127.0.0.1:2181", "/remem", "h:1/", "h:1/a//b", "h:1/a/../b", "h:1/a b",
        "h:1/.", "h:1/remem/", "h:1/remem/prod//", "h:1//"}) {
    EXPECT_EQ(ParseZkTarget(bad).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(ClusterConfig, MovingShardsRoundTripAndVersionOneIsStillRead) {
  Config c = ThreeServers();
  c.next.assign(c.num_shards(), kNoMember);
  c.next[5] = 2;
  c.next[700] = 0;
  EXPECT_EQ(c.moving(), 2u);
  auto d = DecodeConfig(EncodeConfig(c));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->next, c.next);
  EXPECT_EQ(d->NextOf(5), 2);
  EXPECT_EQ(d->NextOf(6), kNoMember);

  // Version 1 (written before shards could move): no `next` table, no
  // incarnations.
  const Config plain = ThreeServers();
  std::string v1 = EncodeConfig(plain);
  // (version 7 ends with the ordered ranges' count, 0 here, before it
  // version 6 the retiring table, version 5 the domains, version 3 the
  // incarnations, version 2 the next table)
  v1.resize(v1.size() - sizeof(uint32_t) - 2 * plain.num_shards() -
            plain.members.size() * (sizeof(uint64_t) + 1) -
            2 * plain.num_shards());
  const uint16_t one = 1;
  std::memcpy(v1.data() + 4, &one, sizeof(one));
  auto old = DecodeConfig(v1);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->owner, plain.owner);
  EXPECT_EQ(old->moving(), 0u);
  // A version 2 configuration with nothing moving decodes to no table.
  auto none = DecodeConfig(EncodeConfig(plain));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->next.empty());
}

TEST(ClusterConfig, OrderedRangesRoundTripRouteByKeyAndRefuseBadTables) {
  const std::vector<std::string> splits = {"g", "n", "user5"};
  const Config c = InitialConfig(
      "prod", 1,
      {{"10.0.0.3:7400", 3}, {"10.0.0.1:7400", 1}, {"10.0.0.2:7400", 2}},
      kDefaultShards, 0, splits);
  ASSERT_TRUE(c.ordered());
  ASSERT_EQ(c.num_ranges(), 4u);
  // Range r to member r mod 3, in address order.
  EXPECT_EQ(c.range_owner, (std::vector<uint16_t>{0, 1, 2, 0}));
  EXPECT_EQ(c.RangesOf(0), 2u);
  EXPECT_EQ(c.RangesOf(2), 1u);
  // A split key starts its range; "" and keys below "g" are in range 0.
  const std::vector<std::pair<std::string, uint32_t>> where = {
      {"", 0},
      {"a", 0},
      {"f\xff", 0},
      {"g", 1},
      {std::string("g\0", 2), 1},
      {"mzz", 1},
      {"n", 2},
      {"user4999", 2},
      {"user5", 3},
      {"user50", 3},
      {"zzz", 3},
      {std::string(1, '\0'), 0}};
  for (const auto& [k, r] : where) EXPECT_EQ(c.RangeOf(k), r) << k;

  const std::string bytes = EncodeConfig(c);
  auto d = DecodeConfig(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->splits, splits);
  EXPECT_EQ(d->range_owner, c.range_owner);
  EXPECT_EQ(EncodeConfig(*d), bytes);
  for (size_t n = bytes.size() - 40; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeConfig(bytes.substr(0, n)).ok()) << n;
  }
  // The tables' offsets from the end: the ranges' moves (4 x 2), the
  // splits (2 + 1, 2 + 1, 2 + 5 bytes), the owners (4 x 2), the count.
  const size_t range_next_at = bytes.size() - 8;
  const size_t splits_at = range_next_at - 13;
  const size_t owners_at = splits_at - 8;
  const size_t count_at = owners_at - 4;
  auto patched = [&](size_t off, auto v) {
    std::string b = bytes;
    std::memcpy(b.data() + off, &v, sizeof(v));
    return DecodeConfig(b);
  };
  EXPECT_FALSE(patched(count_at, uint32_t(kMaxRanges + 1)).ok());
  // Three ranges: the fourth owner's bytes (0) read as an empty split key.
  EXPECT_FALSE(patched(count_at, uint32_t(3)).ok());
  EXPECT_FALSE(DecodeConfig(bytes + std::string(1, '\0')).ok());  // trailing
  // Ranges with replicas ride their carrier shards (a range placed
  // otherwise is refused: ReplicatedRangesFollowTheirCarrierShards).
  const Config replicated = InitialConfig(
      "prod", 1, {{"10.0.0.1:7400", 1}, {"10.0.0.2:7400", 1}}, 64, 1, splits);
  EXPECT_TRUE(DecodeConfig(EncodeConfig(replicated)).ok());
  Config unreplicated = replicated;
  unreplicated.range_owner.clear();
  unreplicated.splits.clear();
  EXPECT_TRUE(DecodeConfig(EncodeConfig(unreplicated)).ok());
  EXPECT_FALSE(patched(owners_at + 2, uint16_t(3)).ok());  // no member 3
  EXPECT_FALSE(patched(splits_at, uint16_t(0)).ok());      // an empty key
  // "n" -> "f": out of order.
  EXPECT_FALSE(patched(splits_at + 5, uint8_t('f')).ok());
  // "n" -> "g": given twice.
  EXPECT_FALSE(patched(splits_at + 5, uint8_t('g')).ok());
  EXPECT_TRUE(patched(splits_at + 5, uint8_t('h')).ok());
  // Range moves: range 1 (owned by member 1) moving to member 2 round
  // trips; moving to its own owner, or to no member, is refused.
  {
    auto moving = patched(range_next_at + 2, uint16_t(2));
    ASSERT_TRUE(moving.ok()) << moving.status().ToString();
    EXPECT_EQ(moving->moving_ranges(), 1u);
    EXPECT_EQ(moving->RangeNextOf(1), 2u);
    EXPECT_EQ(moving->RangeNextOf(0), kNoMember);
    EXPECT_EQ(DecodeConfig(EncodeConfig(*moving))->range_next,
              moving->range_next);
    const Config done = CompleteMoves(*moving);
    EXPECT_EQ(done.range_owner[1], 2u);
    EXPECT_EQ(done.moving_ranges(), 0u);
    EXPECT_TRUE(done.range_next.empty());
    const Config abandoned = AbandonMoves(*moving);
    EXPECT_EQ(abandoned.range_owner[1], 1u);
    EXPECT_EQ(abandoned.moving_ranges(), 0u);
  }
  EXPECT_FALSE(patched(range_next_at + 2, uint16_t(1)).ok());  // its owner
  EXPECT_FALSE(patched(range_next_at + 2, uint16_t(3)).ok());  // no member
  // Nothing moving decodes to no table.
  EXPECT_TRUE(d->range_next.empty());

  // Without splits: no ordered store; an empty list: one range.
  EXPECT_FALSE(ThreeServers().ordered());
  const Config one =
      InitialConfig("prod", 1, {{"10.0.0.1:7400", 1}}, kDefaultShards, 0,
                    std::vector<std::string>{});
  ASSERT_EQ(one.num_ranges(), 1u);
  EXPECT_EQ(one.RangeOf("anything"), 0u);
  auto od = DecodeConfig(EncodeConfig(one));
  ASSERT_TRUE(od.ok());
  EXPECT_TRUE(od->ordered());
}

TEST(ClusterConfig, SplitsAreParsedSortedAndBadListsRefused) {
  auto s = ParseSplits("m,c,user:5");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, (std::vector<std::string>{"c", "m", "user:5"}));
  auto none = ParseSplits("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  for (const std::string& bad :
       std::vector<std::string>{",", "a,", ",a", "a,,b", "a,b,a",
                                std::string(kMaxSplitBytes + 1, 'k')}) {
    auto r = ParseSplits(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  std::string many;
  for (uint32_t i = 0; i < kMaxRanges; ++i) {
    many += (i ? "," : "") + std::to_string(100000 + i);
  }
  EXPECT_FALSE(ParseSplits(many).ok());
  // At most 64 KiB in all (the configuration fits a ZooKeeper node).
  std::string big;
  for (int i = 0; i < 65; ++i) {
    big += (i ? "," : "") + std::to_string(100 + i) + std::string(1021, 'k');
  }
  EXPECT_TRUE(ParseSplits(big.substr(0, big.rfind(','))).ok());
  EXPECT_FALSE(ParseSplits(big).ok());
}

// Runs balance steps, each completed, until the cluster is balanced; the
// steps taken.
int Balance(Config* c, const std::vector<Member>& live,
            const std::vector<std::string>& drained, uint32_t max_moves) {
  int steps = 0;
  while (auto step = NextBalanceStep(*c, live, drained, max_moves)) {
    EXPECT_EQ(step->epoch, c->epoch + 1);
    // A step moves shards, or one ordered range, or only changes the
    // member list.
    const bool moves = step->moving() > 0 || step->moving_ranges() > 0;
    if (!moves) {
      EXPECT_NE(step->members.size(), c->members.size());
    }
    EXPECT_LE(step->moving(), max_moves);
    EXPECT_LE(step->moving_ranges(), 1u);
    EXPECT_TRUE(step->moving() == 0 || step->moving_ranges() == 0);
    // Only a step's moving shards and ranges change hands, and only on
    // completion.
    for (uint32_t s = 0; s < c->num_shards(); ++s) {
      EXPECT_EQ(step->members[step->owner[s]].address,
                c->members[c->owner[s]].address);
    }
    for (uint32_t r = 0; r < c->num_ranges(); ++r) {
      EXPECT_EQ(step->members[step->range_owner[r]].address,
                c->members[c->range_owner[r]].address);
    }
    *c = moves ? CompleteMoves(*step) : *step;
    EXPECT_EQ(c->moving(), 0u);
    EXPECT_EQ(c->moving_ranges(), 0u);
    if (++steps > 1000) break;
  }
  return steps;
}

TEST(ClusterConfig, RangesMoveToAJoinerAndOffADrainedMember) {
  Config c =
      InitialConfig("prod", 1, {{"10.0.0.1:1", 1}, {"10.0.0.2:1", 1}},
                    kDefaultShards, 0, std::vector<std::string>{"k", "t"});
  // Ranges 0 and 2 on 10.0.0.1, range 1 on 10.0.0.2.
  auto owner_of = [&](uint32_t r) {
    return c.members[c.range_owner[r]].address;
  };
  std::vector<Member> live = c.members;
  live.insert(live.begin(), {"10.0.0.0:1", 1});
  Balance(&c, live, {}, 200);
  EXPECT_EQ(c.members.size(), 3u);
  // The joiner takes the last range of the member with two (one each now).
  EXPECT_EQ(owner_of(0), "10.0.0.1:1");
  EXPECT_EQ(owner_of(1), "10.0.0.2:1");
  EXPECT_EQ(owner_of(2), "10.0.0.0:1");
  EXPECT_EQ(c.splits, (std::vector<std::string>{"k", "t"}));
  // Balanced with one range each: nothing more moves.
  EXPECT_FALSE(NextBalanceStep(c, live, {}, 200));
  // Drained: its shards leave, then its range, to the member with the
  // fewest (the first by address of a tie); then it is dropped.
  Balance(&c, live, {"10.0.0.1:1"}, 1024);
  EXPECT_EQ(c.IndexOf("10.0.0.1:1"), -1);
  EXPECT_EQ(c.members.size(), 2u);
  EXPECT_EQ(owner_of(0), "10.0.0.0:1");
  EXPECT_EQ(owner_of(1), "10.0.0.2:1");
  EXPECT_EQ(owner_of(2), "10.0.0.0:1");
  // A move the manager was refused (the joiner could not hold the range)
  // is not tried again: nothing else evens out by two, so the step only
  // lists the joiner.
  const Config f =
      InitialConfig("prod", 1, {{"10.0.0.0:1", 1}, {"10.0.0.1:1", 1}}, 1, 0,
                    std::vector<std::string>{"k", "t"});
  std::vector<Member> with_joiner = f.members;
  with_joiner.push_back({"10.0.0.2:1", 1});
  auto step = NextBalanceStep(f, with_joiner, {}, 64);
  ASSERT_TRUE(step);
  EXPECT_EQ(step->moving(), 0u);
  EXPECT_EQ(step->moving_ranges(), 1u);
  EXPECT_EQ(step->RangeNextOf(2), 2u);
  with_joiner.back().incarnation = 7;
  auto refused =
      NextBalanceStep(f, with_joiner, {}, 64, {{2, "10.0.0.2:1", 7}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->moving_ranges(), 0u);
  EXPECT_EQ(refused->members.size(), 3u);
  // The joiner restarted (another incarnation): tried again.
  with_joiner.back().incarnation = 8;
  auto again = NextBalanceStep(f, with_joiner, {}, 64, {{2, "10.0.0.2:1", 7}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->RangeNextOf(2), 2u);
  with_joiner.back().incarnation = 7;
  // Drained, its range refused at the member with the fewest goes to the
  // next one.
  auto around = NextBalanceStep(*refused, with_joiner, {"10.0.0.1:1"}, 64,
                                {{1, "10.0.0.2:1", 7}});
  ASSERT_TRUE(around);
  EXPECT_EQ(around->moving(), 0u);
  EXPECT_EQ(around->RangeNextOf(1), 0u);
  // A drained member that is not live keeps its range (its data is
  // nowhere else).
  Config e = InitialConfig("prod", 1, {{"10.0.0.1:1", 1}, {"10.0.0.2:1", 1}},
                           kDefaultShards, 0, std::vector<std::string>{"k"});
  auto gone = NextBalanceStep(e, {e.members[1]}, {"10.0.0.1:1"}, 1024);
  EXPECT_TRUE(!gone || gone->moving_ranges() == 0);
  // A member that owns no range and no shard is dropped; the ranges'
  // owner indexes follow (the second member's range is renumbered from
  // index 1 to 0 once the first is gone).
  Config d = InitialConfig("prod", 1, {{"10.0.0.1:1", 1}, {"10.0.0.2:1", 1}},
                           kDefaultShards, 0, std::vector<std::string>{});
  d.range_owner = {1};
  Balance(&d, d.members, {"10.0.0.1:1"}, 1024);
  ASSERT_EQ(d.members.size(), 1u);
  EXPECT_EQ(d.members[0].address, "10.0.0.2:1");
  EXPECT_EQ(d.range_owner, (std::vector<uint16_t>{0}));
}

TEST(ClusterConfig, AJoiningServerGetsItsShareInBoundedSteps) {
  Config c = InitialConfig("prod", 1, {{"10.0.0.1:1", 1}, {"10.0.0.2:1", 1}},
                           kDefaultShards);
  EXPECT_FALSE(NextBalanceStep(c, c.members, {}, 64));  // balanced
  std::vector<Member> live = c.members;
  live.push_back({"10.0.0.0:1", 1});  // sorts first: takes the extra shard
  const int steps = Balance(&c, live, {}, 64);
  EXPECT_EQ(steps, 6);  // 342 shards, 64 at a time
  ASSERT_EQ(c.members.size(), 3u);
  EXPECT_EQ(c.members[2].address, "10.0.0.0:1");  // appended: indexes kept
  EXPECT_EQ(c.ShardsOf(2), 342u);
  EXPECT_EQ(c.ShardsOf(0), 341u);
  EXPECT_EQ(c.ShardsOf(1), 341u);
  EXPECT_EQ(c.epoch, 1u + 2 * 6);
}

TEST(ClusterConfig, DrainedServersLoseEveryShardAndDeadOnesKeepTheirs) {
  Config c = ThreeServers();
  // Drained: everything moves to the other two, then it is dropped.
  Balance(&c, c.members, {"10.0.0.2:7400"}, 100);
  EXPECT_EQ(c.IndexOf("10.0.0.2:7400"), -1);
  ASSERT_EQ(c.members.size(), 2u);
  EXPECT_EQ(c.ShardsOf(0), 512u);
  EXPECT_EQ(c.ShardsOf(1), 512u);

  // A server that is not live keeps its shards (no replica has them): the
  // others are not unbalanced among themselves, so nothing moves.
  Config d = ThreeServers();
  std::vector<Member> two = {d.members[0], d.members[1]};
  EXPECT_FALSE(NextBalanceStep(d, two, {}, 64));
  // ... even drained: its shards wait for it.
  EXPECT_FALSE(NextBalanceStep(d, two, {"10.0.0.3:7400"}, 64));

  // Abandoned moves leave every shard with its owner.
  Config e = ThreeServers();
  auto step = NextBalanceStep(e, e.members, {"10.0.0.1:7400"}, 10);
  ASSERT_TRUE(step);
  const Config back = AbandonMoves(*step);
  EXPECT_EQ(back.epoch, e.epoch + 2);
  EXPECT_EQ(back.moving(), 0u);
  EXPECT_EQ(back.owner, step->owner);
}

TEST(ClusterConfig, ReplicasAreChainedRoundTripAndRefuseBadBackups) {
  const Config c = InitialConfig(
      "prod", 1, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 2);
  ASSERT_EQ(c.replicas, 2u);
  for (uint32_t s = 0; s < 12; ++s) {
    const std::vector<uint16_t> b = c.BackupsOf(s);
    ASSERT_EQ(b.size(), 2u) << s;
    EXPECT_EQ(b[0], (c.owner[s] + 1) % 3) << s;
    EXPECT_EQ(b[1], (c.owner[s] + 2) % 3) << s;
    EXPECT_TRUE(c.IsBackup(s, b[0]));
    EXPECT_FALSE(c.IsBackup(s, c.owner[s]));
  }
  const std::string bytes = EncodeConfig(c);
  auto d = DecodeConfig(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->replicas, 2u);
  EXPECT_EQ(d->backups, c.backups);
  EXPECT_EQ(d->members[2].incarnation, 13u);
  EXPECT_EQ(EncodeConfig(*d), bytes);
  // More replicas than members: the missing ones are none.
  const Config two = InitialConfig("p", 1, {{"a:1", 1}, {"b:1", 1}}, 4, 3);
  EXPECT_EQ(two.BackupsOf(0).size(), 1u);
  ASSERT_TRUE(DecodeConfig(EncodeConfig(two)).ok());

  // A backup that is the owner, a backup twice, a member that does not
  // exist, a backup after a missing one: refused.
  const size_t backups = bytes.size() - 3 - 3 * 8 - 2 * 2 * 12;
  auto patched = [&](size_t off, uint16_t v) {
    std::string b = bytes;
    std::memcpy(b.data() + off, &v, sizeof(v));
    return DecodeConfig(b);
  };
  EXPECT_FALSE(patched(backups, c.owner[0]).ok());
  EXPECT_FALSE(patched(backups + 2, c.backups[0]).ok());
  EXPECT_FALSE(patched(backups, 3).ok());
  EXPECT_FALSE(patched(backups, kNoMember).ok());
  EXPECT_TRUE(patched(backups + 2, kNoMember).ok());
  std::string many = bytes;
  const uint32_t too_many = kMaxReplicas + 1;
  std::memcpy(many.data() + 20, &too_many, sizeof(too_many));
  EXPECT_FALSE(DecodeConfig(many).ok());
  // Replicated clusters do not rebalance (not built yet).
  EXPECT_FALSE(NextBalanceStep(c, {{"d:1", 1}}, {}, 64));
}

TEST(ClusterConfig, DrainedMembersThatLeftHoldingNothingAreDropped) {
  const Config c = InitialConfig(
      "prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 1);
  // Nobody leaving, or one that still holds roles: nothing to drop.
  EXPECT_FALSE(DropLeftMembers(c, {}));
  EXPECT_FALSE(DropLeftMembers(c, {"b:1"}));
  // Unreplicated clusters drop members in NextBalanceStep.
  EXPECT_FALSE(DropLeftMembers(InitialConfig("p", 1, c.members, 12), {"b:1"}));
  // b holds nothing once failed over (as once drained): it goes, and c is
  // renumbered 1 in every role.
  auto f = Failover(c, {c.members[0], c.members[2]});
  ASSERT_TRUE(f);
  auto d = DropLeftMembers(*f, {"b:1"});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->epoch, f->epoch + 1);
  ASSERT_EQ(d->members.size(), 2u);
  EXPECT_EQ(d->members[1].address, "c:1");
  for (uint32_t s = 0; s < 12; ++s) {
    EXPECT_EQ(d->members[d->owner[s]].address, f->members[f->owner[s]].address)
        << s;
    const auto before = f->BackupsOf(s), after = d->BackupsOf(s);
    ASSERT_EQ(before.size(), after.size()) << s;
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(d->members[after[i]].address, f->members[before[i]].address);
    }
  }
  ASSERT_TRUE(DecodeConfig(EncodeConfig(*d)).ok());
  EXPECT_FALSE(DropLeftMembers(*d, {"b:1"}));
}

TEST(ClusterConfig, FailoverPromotesTheFirstBackupAndDropsWhoLeft) {
  const Config c = InitialConfig(
      "prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 1);
  // Everyone here: nothing to do.
  EXPECT_FALSE(Failover(c, c.members));
  // Unreplicated clusters never fail over.
  const Config plain = InitialConfig("p", 1, c.members, 12);
  EXPECT_FALSE(Failover(plain, {c.members[0]}));

  // b left: its shards go to their backup c, and b backs up nothing.
  auto f = Failover(c, {c.members[0], c.members[2]});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->epoch, 6u);
  for (uint32_t s = 0; s < 12; ++s) {
    if (c.owner[s] == 1) {
      EXPECT_EQ(f->owner[s], 2) << s;
      EXPECT_TRUE(f->BackupsOf(s).empty()) << s;
    } else {
      EXPECT_EQ(f->owner[s], c.owner[s]) << s;
      EXPECT_FALSE(f->IsBackup(s, 1)) << s;
    }
  }
  EXPECT_EQ(f->ShardsOf(1), 0u);
  EXPECT_FALSE(Failover(*f, {c.members[0], c.members[2]}));
  // Then c left too: its own shards go to their backup a; those it took
  // over from b have no copy left anywhere and stay with c.
  auto g = Failover(*f, {c.members[0]});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->ShardsOf(0), c.ShardsOf(0) + c.ShardsOf(2));
  EXPECT_EQ(g->ShardsOf(2), c.ShardsOf(1));
  for (uint32_t s = 0; s < 12; ++s) EXPECT_TRUE(g->BackupsOf(s).empty());
  // b and c judged dead at once: b's shards, backed up by c, lose every
  // copy and stay as they are (owner b, backup c listed); when c answers
  // again (the same incarnation: it was only slow), it is promoted.
  auto both = Failover(c, {c.members[0]});
  ASSERT_TRUE(both);
  for (uint32_t s = 0; s < 12; ++s) {
    if (c.owner[s] != 1) continue;
    EXPECT_EQ(both->owner[s], 1) << s;
    EXPECT_TRUE(both->IsBackup(s, 2)) << s;
  }
  auto back = Failover(*both, {c.members[0], c.members[2]});
  ASSERT_TRUE(back);
  for (uint32_t s = 0; s < 12; ++s) {
    if (c.owner[s] == 1) {
      EXPECT_EQ(back->owner[s], 2) << s;
    }
  }

  // b restarted (another incarnation): a new member at its old index, with
  // no role; its shards are its backup's.
  Member b2 = c.members[1];
  b2.incarnation = 99;
  auto r = Failover(c, {c.members[0], b2, c.members[2]});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->members[1].incarnation, 99u);
  EXPECT_EQ(r->ShardsOf(1), 0u);
  for (uint32_t s = 0; s < 12; ++s) EXPECT_FALSE(r->IsBackup(s, 1)) << s;
  // A new server is listed, with no role.
  auto n = Failover(c, {c.members[0], c.members[1], c.members[2], {"d:1", 1}});
  ASSERT_TRUE(n);
  EXPECT_EQ(n->members.size(), 4u);
  EXPECT_EQ(n->ShardsOf(3), 0u);
  EXPECT_EQ(n->owner, c.owner);
}

// Replicated ordered ranges ride carrier shards (range r: the shard in the
// middle of the r-th of num_ranges equal slices, CarrierOf): every step that
// moves a shard's owner moves the ranges it carries, once the configuration
// follows its carriers (as the manager writes every one); a configuration whose
// ranges do not is refused.
TEST(ClusterConfig, ReplicatedRangesFollowTheirCarrierShards) {
  const std::vector<std::string> splits = {"g", "p"};
  const Config c =
      InitialConfig("prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}},
                    12, 1, splits);
  ASSERT_EQ(c.num_ranges(), 3u);
  // The middles of three slices of 12 shards: one range per member.
  EXPECT_EQ(c.CarrierOf(0), 2u);
  EXPECT_EQ(c.CarrierOf(1), 6u);
  EXPECT_EQ(c.CarrierOf(2), 10u);
  for (uint32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(c.range_owner[r], c.owner[c.CarrierOf(r)]) << r;
    EXPECT_EQ(c.RangesOf(int(r)), 1u) << r;
  }
  EXPECT_TRUE(c.FollowsCarriers());
  auto d = DecodeConfig(EncodeConfig(c));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->range_owner, c.range_owner);
  EXPECT_EQ(d->splits, c.splits);
  // More ranges than shards: some share a carrier.
  const Config many = InitialConfig("p", 1, c.members, 2, 1, splits);
  EXPECT_EQ(many.CarrierOf(0), 0u);
  EXPECT_EQ(many.CarrierOf(1), 1u);
  EXPECT_EQ(many.CarrierOf(2), 1u);
  EXPECT_EQ(many.range_owner[2], many.owner[1]);

  // A range owner that is not its carrier's is refused.
  Config wrong = c;
  wrong.range_owner[0] = uint16_t((c.owner[0] + 1) % 3);
  EXPECT_FALSE(wrong.FollowsCarriers());
  auto bad = DecodeConfig(EncodeConfig(wrong));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("carrier"), std::string::npos)
      << bad.status().ToString();
  // Unreplicated ranges place themselves.
  Config plain = InitialConfig("p", 1, c.members, 12, 0, splits);
  plain.range_owner[0] = uint16_t((plain.range_owner[0] + 1) % 3);
  EXPECT_TRUE(plain.FollowsCarriers());
  EXPECT_TRUE(DecodeConfig(EncodeConfig(plain)).ok());

  // The owner of range 1's carrier dies: the range goes to the promoted
  // backup with the shard.
  const uint32_t s1 = c.CarrierOf(1);
  const uint16_t dead = c.owner[s1];
  std::vector<Member> live;
  for (uint16_t i = 0; i < 3; ++i) {
    if (i != dead) live.push_back(c.members[i]);
  }
  auto f = Failover(c, live);
  ASSERT_TRUE(f);
  f->FollowCarriers();
  EXPECT_NE(f->owner[s1], dead);
  EXPECT_EQ(f->range_owner[1], f->owner[s1]);
  EXPECT_TRUE(DecodeConfig(EncodeConfig(*f)).ok());

  // A drain hands range 0's carrier over to its backup: the range moves
  // with it, and completing the move completes both.
  const uint32_t s0 = c.CarrierOf(0);
  auto step = DrainStep(c, c.members, {c.members[c.owner[s0]].address});
  ASSERT_TRUE(step);
  step->FollowCarriers();
  ASSERT_NE(step->NextOf(s0), kNoMember);
  EXPECT_EQ(step->RangeNextOf(0), step->NextOf(s0));
  EXPECT_TRUE(DecodeConfig(EncodeConfig(*step)).ok());
  Config done = CompleteMoves(*step);
  done.FollowCarriers();
  EXPECT_EQ(done.range_owner[0], step->NextOf(s0));
  EXPECT_EQ(done.RangeNextOf(0), kNoMember);
  EXPECT_TRUE(DecodeConfig(EncodeConfig(done)).ok());
}

// Every server restarted (a whole cluster stopped and started again from
// its data directories): no copy of any shard is left with the
// incarnation the configuration names, and each restarted owner holds
// every write it acknowledged. It owns its shards again; its backups,
// restarted too, are filled again from it (they may lack its last,
// unacknowledged writes). Before, the shards stayed listed under the
// restarted servers, which had purged what they recovered: every key was
// gone.
TEST(ClusterConfig, AWholeClusterRestartedKeepsItsOwnersAndRefillsBackups) {
  const Config c = InitialConfig(
      "prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 1);
  std::vector<Member> again = c.members;
  for (Member& m : again) m.incarnation += 100;
  auto r = Failover(c, again);
  ASSERT_TRUE(r);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->members[i].incarnation, again[i].incarnation);
  }
  for (uint32_t s = 0; s < 12; ++s) {
    EXPECT_EQ(r->owner[s], c.owner[s]) << s;
    EXPECT_EQ(r->backups[s], c.backups[s]) << s;
    EXPECT_TRUE(r->IsFilling(s, c.backups[s])) << s;
  }
  // Only a and b back (c still down): b's shards (backed up by c) keep b,
  // c dropped from their backups; c's own (backed up by a) stay with c,
  // listed, until it is back.
  auto two = Failover(c, {again[0], again[1]});
  ASSERT_TRUE(two);
  for (uint32_t s = 0; s < 12; ++s) {
    EXPECT_EQ(two->owner[s], c.owner[s]) << s;
    if (c.owner[s] == 1) {
      EXPECT_TRUE(two->BackupsOf(s).empty()) << s;
    }
    if (c.owner[s] == 0) {
      EXPECT_TRUE(two->IsFilling(s, 1)) << s;
    }
  }
  // Both are configurations a server accepts.
  EXPECT_TRUE(DecodeConfig(EncodeConfig(*r)).ok());
  EXPECT_TRUE(DecodeConfig(EncodeConfig(*two)).ok());
}

TEST(ClusterConfig,
     ShardsShortOfCopiesGetFillingBackupsThatOnlyCountOnceFilled) {
  const Config c = InitialConfig(
      "prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 1);
  // Every shard has its backup: nothing to plan.
  EXPECT_FALSE(PlanBackups(c, c.members, 1000));
  // b left: the shards it owned are c's, with no backup; those c owned had
  // b as backup and have none either.
  auto f = Failover(c, {c.members[0], c.members[2]});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->filling_shards(), 0u);
  // b is not live: only a and c can take copies, each of the other's
  // shards.
  auto p = PlanBackups(*f, {c.members[0], c.members[2]}, 1000);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->epoch, f->epoch + 1);
  EXPECT_EQ(p->owner, f->owner);
  uint32_t short_before = 0;
  for (uint32_t s = 0; s < 12; ++s) {
    if (f->BackupsOf(s).empty()) ++short_before;
    const std::vector<uint16_t> b = p->BackupsOf(s);
    ASSERT_EQ(b.size(), 1u) << s;
    EXPECT_NE(b[0], p->owner[s]) << s;
    EXPECT_NE(b[0], 1) << s;
    EXPECT_EQ(p->IsFilling(s, b[0]), f->BackupsOf(s).empty()) << s;
  }
  EXPECT_EQ(p->filling_shards(), short_before);
  // The filling flags survive the encoding; version 4.
  auto d = DecodeConfig(EncodeConfig(*p));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->filling, p->filling);
  EXPECT_EQ(d->backups, p->backups);
  // A filling backup is never promoted: if a owner of a shard whose only
  // backup c is filling leaves, the shard stays with a (its data is
  // nowhere else) and c stays filling.
  uint32_t filled_by_c = 12;
  for (uint32_t s = 0; s < 12; ++s) {
    if (p->owner[s] == 0 && p->IsFilling(s, 2)) filled_by_c = s;
  }
  ASSERT_LT(filled_by_c, 12u);
  auto g = Failover(*p, {c.members[2]});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->owner[filled_by_c], 0);
  EXPECT_TRUE(g->IsFilling(filled_by_c, 2));
  // Once filled (CompleteFills), c is promoted like any backup.
  std::vector<uint32_t> all(12);
  for (uint32_t s = 0; s < 12; ++s) all[s] = s;
  const Config done = CompleteFills(*p, all);
  EXPECT_EQ(done.epoch, p->epoch + 1);
  EXPECT_EQ(done.filling_shards(), 0u);
  EXPECT_FALSE(PlanBackups(done, {c.members[0], c.members[2]}, 1000));
  auto h = Failover(done, {c.members[2]});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->owner[filled_by_c], 2);
  // A new member takes copies before members that hold more; a step plans
  // at most max_shards shards.
  auto n = Failover(*f, {c.members[0], c.members[2], {"d:1", 1, 14}});
  ASSERT_TRUE(n);
  auto q = PlanBackups(*n, {n->members[0], n->members[2], n->members[3]}, 2);
  ASSERT_TRUE(q);
  EXPECT_EQ(q->filling_shards(), 2u);
  for (uint32_t s = 0; s < 12; ++s) {
    for (uint16_t b : q->BackupsOf(s)) {
      if (q->IsFilling(s, b)) {
        EXPECT_EQ(b, 3) << s;
      }
    }
  }
  // The flag in a version 3 configuration: refused.
  const std::string bytes = EncodeConfig(*p);
  const size_t retiring = 2 * 12;  // version 6's table
  const size_t at = bytes.size() - retiring - 3 - 3 * 8 - 2 * 12;
  uint16_t raw;
  std::memcpy(&raw, bytes.data() + at, 2);
  ASSERT_NE(raw & kBackupFilling, 0) << "shard 0's backup should be filling";
  // No domains, no retiring table.
  std::string v3 = bytes.substr(0, bytes.size() - retiring - 3);
  const uint16_t three = 3;
  std::memcpy(v3.data() + 4, &three, 2);
  EXPECT_FALSE(DecodeConfig(v3).ok());
}

TEST(ClusterConfig, ADrainedReplicaHandsItsShardsToBackupsThenItsCopies) {
  const Config c = InitialConfig(
      "prod", 5,
      {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}, {"d:1", 1, 14}}, 16, 1);
  const std::vector<std::string> drained = {"b:1"};
  // Nothing to drain, or nothing that can move: no step.
  EXPECT_FALSE(DrainStep(c, c.members, {}));
  EXPECT_FALSE(
      DrainStep(InitialConfig("p", 1, c.members, 16), c.members, drained));
  // 1. b's shards move to their ready backup (c, chained), nothing else.
  auto one = DrainStep(c, c.members, drained);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->epoch, 6u);
  EXPECT_EQ(one->owner, c.owner);
  EXPECT_EQ(one->backups, c.backups);
  EXPECT_EQ(one->moving(), c.ShardsOf(1));
  for (uint32_t s = 0; s < 16; ++s) {
    EXPECT_EQ(one->NextOf(s), c.owner[s] == 1 ? 2 : kNoMember) << s;
  }
  // It round-trips, and while it moves there is no further step.
  auto coded = DecodeConfig(EncodeConfig(*one));
  ASSERT_TRUE(coded.ok()) << coded.status().ToString();
  EXPECT_EQ(coded->next, one->next);
  EXPECT_FALSE(DrainStep(*one, c.members, drained));
  // The hand-over swaps the roles: c owns, b backs up (it holds the same
  // pairs).
  const Config two = CompleteMoves(*one);
  EXPECT_EQ(two.moving(), 0u);
  for (uint32_t s = 0; s < 16; ++s) {
    if (c.owner[s] != 1) continue;
    EXPECT_EQ(two.owner[s], 2) << s;
    EXPECT_TRUE(two.IsBackup(s, 1)) << s;
    EXPECT_FALSE(two.IsFilling(s, 1)) << s;
  }
  EXPECT_EQ(two.ShardsOf(1), 0u);
  // 2. b's copies retire in favour of copies on others, filling (never on
  // b, nor on the shard's owner): b stays a backup until they are ready,
  // so no shard ever has fewer than two whole copies.
  auto three = DrainStep(two, c.members, drained);
  ASSERT_TRUE(three);
  EXPECT_EQ(three->owner, two.owner);
  uint32_t filling = 0;
  for (uint32_t s = 0; s < 16; ++s) {
    if (two.IsBackup(s, 1)) {
      EXPECT_EQ(three->RetiringOf(s), 1) << s;
      EXPECT_TRUE(three->IsBackup(s, 1)) << s;
      const uint16_t b = three->backups[s];
      EXPECT_NE(b, 1) << s;
      EXPECT_NE(b, three->owner[s]) << s;
      EXPECT_TRUE(three->IsFilling(s, b)) << s;
      EXPECT_EQ(three->BackupsOf(s), (std::vector<uint16_t>{b, 1})) << s;
      ++filling;
    } else {
      EXPECT_EQ(three->RetiringOf(s), kNoMember) << s;
      EXPECT_EQ(three->BackupsOf(s), two.BackupsOf(s)) << s;
    }
  }
  EXPECT_EQ(three->filling_shards(), filling);
  // Version 6 keeps the retiring copies, and refuses one that is its
  // shard's owner, one of its backups or no member.
  auto coded3 = DecodeConfig(EncodeConfig(*three));
  ASSERT_TRUE(coded3.ok()) << coded3.status().ToString();
  EXPECT_EQ(coded3->retiring, three->retiring);
  for (uint16_t bad :
       {uint16_t(three->owner[0]), uint16_t(three->backups[0]), uint16_t(7)}) {
    std::string bytes = EncodeConfig(*three);
    std::memcpy(bytes.data() + bytes.size() - 2 * 16, &bad, 2);
    EXPECT_FALSE(DecodeConfig(bytes).ok()) << bad;
  }
  // If the shard's owner died while the copy fills, the retiring copy is
  // promoted (the filling one never is).
  uint32_t r = 16;
  for (uint32_t s = 0; s < 16 && r == 16; ++s) {
    if (three->RetiringOf(s) == 1) r = s;
  }
  ASSERT_LT(r, 16u);
  std::vector<Member> without_owner;
  for (size_t m = 0; m < c.members.size(); ++m) {
    if (m != three->owner[r]) without_owner.push_back(c.members[m]);
  }
  auto promoted = Failover(*three, without_owner);
  ASSERT_TRUE(promoted);
  EXPECT_EQ(promoted->owner[r], 1);
  EXPECT_EQ(promoted->RetiringOf(r), kNoMember);
  EXPECT_TRUE(promoted->IsFilling(r, three->backups[r]));
  // b killed instead: its retiring copies are dropped.
  std::vector<Member> without_b = {c.members[0], c.members[2], c.members[3]};
  auto dropped = Failover(*three, without_b);
  ASSERT_TRUE(dropped);
  EXPECT_TRUE(dropped->retiring.empty());
  // Filling: no step until the copies are held; then b holds nothing and
  // there is nothing left to do.
  EXPECT_FALSE(DrainStep(*three, c.members, drained));
  std::vector<uint32_t> all(16);
  for (uint32_t s = 0; s < 16; ++s) all[s] = s;
  const Config done = CompleteFills(*three, all);
  EXPECT_TRUE(done.retiring.empty());
  EXPECT_FALSE(DrainStep(done, c.members, drained));
  for (uint32_t s = 0; s < 16; ++s) EXPECT_FALSE(done.IsBackup(s, 1)) << s;

  // A shard whose only backup is drained too first gets a new backup, then
  // moves.
  auto both = DrainStep(c, c.members, {"b:1", "c:1"});
  ASSERT_TRUE(both);
  for (uint32_t s = 0; s < 16; ++s) {
    // b's shards are backed up by c (drained): they stay; c's move to d.
    EXPECT_EQ(both->NextOf(s), c.owner[s] == 2 ? 3 : kNoMember) << s;
  }
  const Config after = CompleteMoves(*both);
  auto copies = DrainStep(after, c.members, {"b:1", "c:1"});
  ASSERT_TRUE(copies);
  for (uint32_t s = 0; s < 16; ++s) {
    for (uint32_t i = 0; i < 1; ++i) {
      const uint16_t b = copies->backups[s];
      EXPECT_TRUE(b == 0 || b == 3) << s << ": " << b;
    }
  }
  // Nobody left to take a drained member's copy: it keeps it (a two-member
  // cluster cannot drain one).
  const Config pair =
      InitialConfig("p", 1, {{"a:1", 1, 1}, {"b:1", 1, 2}}, 8, 1);
  auto moved = DrainStep(pair, pair.members, {"b:1"});
  ASSERT_TRUE(moved);  // b's shards go to a, b backs them up
  const Config swapped = CompleteMoves(*moved);
  EXPECT_EQ(swapped.ShardsOf(0), 8u);
  EXPECT_FALSE(DrainStep(swapped, pair.members, {"b:1"}));
  for (uint32_t s = 0; s < 8; ++s) EXPECT_TRUE(swapped.IsBackup(s, 1));

  // A failover during a hand-over abandons it.
  auto failed = Failover(*one, {c.members[0], c.members[1], c.members[3]});
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->moving(), 0u);
}

TEST(ClusterConfig, AJoinedReplicaTakesCopiesThenPrimariesInSteps) {
  const Config c = InitialConfig(
      "prod", 5, {{"a:1", 1, 11}, {"b:1", 1, 12}, {"c:1", 1, 13}}, 12, 1);
  // Balanced: nothing to do.
  EXPECT_FALSE(BalanceReplicas(c, c.members, {}, 64));
  // d joins (Failover lists it, with no role).
  Member d{"d:1", 1, 14};
  std::vector<Member> live = {c.members[0], c.members[1], c.members[2], d};
  auto joined = Failover(c, live);
  ASSERT_TRUE(joined);
  ASSERT_EQ(joined->members.size(), 4u);
  // Each member's shards, owned and backed up.
  auto load = [](const Config& x, int m) {
    uint32_t n = x.ShardsOf(m);
    for (uint32_t s = 0; s < x.num_shards(); ++s) n += x.IsBackup(s, m);
    return n;
  };
  // 1. Copies move to d, each retiring where it was: a shard's copies stay
  // whole meanwhile; at most max_moves a step.
  auto one = BalanceReplicas(*joined, live, {}, 2);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->owner, joined->owner);
  EXPECT_EQ(one->filling_shards(), 2u);
  Config at = *one;
  for (int step = 0; step < 20; ++step) {
    for (uint32_t s = 0; s < at.num_shards(); ++s) {
      if (at.RetiringOf(s) != kNoMember) {
        EXPECT_TRUE(at.IsFilling(s, 3)) << s;
        EXPECT_EQ(at.BackupsOf(s).size(), 2u) << s;
      }
    }
    if (at.filling_shards() > 0) {
      EXPECT_FALSE(BalanceReplicas(at, live, {}, 2));  // one step at a time
    }
    std::vector<uint32_t> all(12);
    for (uint32_t s = 0; s < 12; ++s) all[s] = s;
    at = CompleteFills(at, all);
    auto next = BalanceReplicas(at, live, {}, 2);
    if (!next) break;
    if (next->moving() > 0) {
      // 2. Then primaries: hand-overs to ready backups.
      EXPECT_EQ(next->filling_shards(), 0u);
      for (uint32_t s = 0; s < 12; ++s) {
        if (next->NextOf(s) != kNoMember) {
          EXPECT_TRUE(at.IsBackup(s, next->NextOf(s))) << s;
          EXPECT_FALSE(at.IsFilling(s, next->NextOf(s))) << s;
        }
      }
      at = CompleteMoves(*next);
    } else {
      at = *next;
    }
  }
  // Balanced: 12 shards x 2 copies over 4 members, 3 primaries each.
  for (int m = 0; m < 4; ++m) {
    EXPECT_EQ(load(at, m), 6u) << m;
    EXPECT_EQ(at.ShardsOf(m), 3u) << m;
  }
  EXPECT_FALSE(BalanceReplicas(at, live, {}, 64));
  // Nothing while a member is dead, drained or a shard short of copies.
  EXPECT_FALSE(
      BalanceReplicas(*joined, {c.members[0], c.members[1], d}, {}, 64));
  EXPECT_FALSE(BalanceReplicas(*joined, live, {"a:1"}, 64));
}

TEST(ClusterConfig, BackupsGoToOtherFailureDomainsFirst) {
  // Two racks of two servers, one backup per shard: every backup is in the
  // other rack (without domains, chained placement would put a's shards
  // on b, in a's rack).
  const std::vector<Member> racks = {{"a:1", 1, 1, "r1"},
                                     {"b:1", 1, 2, "r1"},
                                     {"c:1", 1, 3, "r2"},
                                     {"d:1", 1, 4, "r2"}};
  const Config c = InitialConfig("prod", 1, racks, 64, 1);
  for (uint32_t s = 0; s < 64; ++s) {
    const std::vector<uint16_t> b = c.BackupsOf(s);
    ASSERT_EQ(b.size(), 1u) << s;
    EXPECT_NE(c.members[b[0]].domain, c.members[c.owner[s]].domain) << s;
  }
  // Two backups over two racks: the first in the other rack, the second
  // wherever is left.
  const Config two = InitialConfig("prod", 1, racks, 64, 2);
  for (uint32_t s = 0; s < 64; ++s) {
    const std::vector<uint16_t> b = two.BackupsOf(s);
    ASSERT_EQ(b.size(), 2u) << s;
    EXPECT_NE(two.members[b[0]].domain, two.members[two.owner[s]].domain);
  }
  // The domains survive the encoding (version 5); a bad one is refused.
  auto d = DecodeConfig(EncodeConfig(c));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->members[2].domain, "r2");
  std::string bad = EncodeConfig(c);
  bad[bad.size() - 2 * c.num_shards() - 1] = '/';  // before the retiring
  EXPECT_FALSE(DecodeConfig(bad).ok());
  EXPECT_FALSE(DecodeConfig(EncodeConfig(c) + "x").ok());
  // A new backup goes to another domain even when a member of the owner's
  // holds fewer shards: c (r2) left, its shards went to d (r2), and their
  // new backups are a or b (r1).
  auto f = Failover(c, {racks[0], racks[1], racks[3]});
  ASSERT_TRUE(f);
  auto p = PlanBackups(*f, {racks[0], racks[1], racks[3]}, 1000);
  ASSERT_TRUE(p);
  for (uint32_t s = 0; s < 64; ++s) {
    for (uint16_t b : p->BackupsOf(s)) {
      if (p->IsFilling(s, b)) {
        EXPECT_NE(p->members[b].domain, p->members[p->owner[s]].domain) << s;
      }
    }
  }
  // Member records carry the domain (version 3); versions 1 and 2 have
  // none.
  auto m = DecodeMemberRecord(EncodeMemberRecord(racks[2]));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->domain, "r2");
  EXPECT_EQ(m->incarnation, 3u);
  auto none = DecodeMemberRecord(EncodeMemberRecord({"e:1", 5, 6}));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->domain, "");
  EXPECT_EQ(none->incarnation, 6u);
  EXPECT_FALSE(DecodeMemberRecord("remem-member 3\na:1\n1\n2\nr/1\n").ok());
  EXPECT_TRUE(ValidDomain("rack-1.zone_a"));
  EXPECT_FALSE(ValidDomain(std::string(65, 'x')));
  EXPECT_FALSE(ValidDomain(".."));
}

TEST(ClusterConfig, LeaseAsksAndGrantsRoundTripAndRefuseMalformedBytes) {
  const LeaseAsk ask{7, 0xabcdefull, "10.0.0.1:7400"};
  auto a = DecodeLeaseAsk(EncodeLeaseAsk(ask));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->epoch, 7u);
  EXPECT_EQ(a->incarnation, 0xabcdefull);
  EXPECT_EQ(a->address, ask.address);
  const LeaseGrant grant{9, 500, EncodeConfig(ThreeServers())};
  auto g = DecodeLeaseGrant(EncodeLeaseGrant(grant));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->epoch, 9u);
  EXPECT_EQ(g->lease_ms, 500u);
  EXPECT_EQ(g->config, grant.config);
  const std::string ab = EncodeLeaseAsk(ask), gb = EncodeLeaseGrant(grant);
  for (size_t n = 0; n < ab.size(); ++n) {
    EXPECT_FALSE(DecodeLeaseAsk(ab.substr(0, n)).ok()) << n;
  }
  for (size_t n = 0; n < gb.size(); n += 97) {
    EXPECT_FALSE(DecodeLeaseGrant(gb.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeLeaseAsk(ab + "x").ok());
  EXPECT_FALSE(DecodeLeaseAsk(gb).ok());  // magic
  EXPECT_FALSE(DecodeLeaseGrant(ab).ok());
  EXPECT_FALSE(DecodeLeaseAsk(EncodeLeaseAsk({1, 1, ""})).ok());
  EXPECT_FALSE(DecodeLeaseGrant(EncodeLeaseGrant({1, 0, ""})).ok());
}

// What `remem cluster info` calls short of copies: a shard with fewer
// whole backups than the cluster keeps. A retiring copy (a drain's) is
// whole until the one filled in its place is ready.
TEST(ClusterInfo, AShardWithARetiringCopyIsNotShortOfCopies) {
  Cluster::Info info;
  info.num_shards = 5;
  info.replicas = 1;
  // 0: a ready backup; 1: filling, a retiring copy beside it (a drain);
  // 2: filling alone (after a failover); 3: none; 4: ready, and a retiring
  // copy still listed.
  info.shard_backups = {1, 2, 2, -1, 1};
  info.shard_filling = {0, 1, 1, 0, 0};
  info.shard_retiring = {-1, 0, -1, -1, 2};
  EXPECT_EQ(info.ShortOfCopies(), 2u);
  info.replicas = 0;  // not replicated: nothing is short
  EXPECT_EQ(info.ShortOfCopies(), 0u);
  // Two backups per shard: one ready and one filling beside a retiring copy
  // is whole; one ready and one filling alone is short.
  info.num_shards = 2;
  info.replicas = 2;
  info.shard_backups = {1, 2, 1, 2};
  info.shard_filling = {0, 1, 0, 1};
  info.shard_retiring = {0, -1};
  EXPECT_EQ(info.ShortOfCopies(), 1u);
}

}  // namespace
}  // namespace remem::cluster
