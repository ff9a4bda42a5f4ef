#include "cluster/ownership.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace remem::cluster {
namespace {

Config TwoServers(uint32_t epoch, bool swapped = false) {
  Config c = InitialConfig("c", epoch, {{"a:1", 1}, {"b:1", 1}}, 64);
  if (swapped) {
    for (auto& o : c.owner) o = uint16_t(1 - o);
  }
  return c;
}

std::string KeyOwnedBy(const Config& c, const std::string& address) {
  for (int i = 0;; ++i) {
    const std::string k = "k" + std::to_string(i);
    if (c.OwnerOf(k).address == address) return k;
  }
}

TEST(Ownership, NothingIsOwnedBeforeTheFirstConfiguration) {
  Ownership o("a:1");
  EXPECT_EQ(o.epoch(), 0u);
  EXPECT_EQ(o.Owns("k").code(), StatusCode::kBusy);
  EXPECT_TRUE(o.Admits(0).ok());
  EXPECT_EQ(o.Admits(1).code(), StatusCode::kBusy);
}

TEST(Ownership, OrderedRangesAreOwnedByRangeAndScansStayInOne) {
  // Ranges ["", "g"), ["g", "p"), ["p", ...): a:1, b:1, a:1.
  const Config c = InitialConfig("c", 1, {{"a:1", 1}, {"b:1", 1}}, 64, 0,
                                 std::vector<std::string>{"g", "p"});
  Ownership a("a:1"), b("b:1");
  EXPECT_EQ(a.OwnsRange("k").code(), StatusCode::kBusy);
  ASSERT_TRUE(a.Install(c));
  ASSERT_TRUE(b.Install(c));
  EXPECT_TRUE(a.OwnsRange("").ok());
  EXPECT_TRUE(a.OwnsRange("f").ok());
  EXPECT_TRUE(a.OwnsRange("zzz").ok());
  EXPECT_EQ(a.OwnsRange("g").code(), StatusCode::kMoved);
  EXPECT_NE(a.OwnsRange("g").message().find("b:1"), std::string::npos);
  EXPECT_TRUE(b.OwnsRange("g").ok());
  EXPECT_TRUE(b.OwnsRange("ozz").ok());
  EXPECT_EQ(b.OwnsRange("p").code(), StatusCode::kMoved);
  // A scan within one range; up to its end ("p", excluded); past it.
  EXPECT_TRUE(b.OwnsScan("g", "p").ok());
  EXPECT_TRUE(b.OwnsScan("h", "i").ok());
  EXPECT_EQ(b.OwnsScan("h", std::string("p\0", 2)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(b.OwnsScan("h", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.OwnsScan("a", "b").code(), StatusCode::kMoved);
  EXPECT_TRUE(a.OwnsScan("p", "").ok());  // the last range is unbounded
  EXPECT_TRUE(a.OwnsScan("", "g").ok());

  // A cluster formed without --tree-splits has no ordered store.
  Ownership plain("a:1");
  ASSERT_TRUE(plain.Install(TwoServers(1)));
  EXPECT_EQ(plain.OwnsRange("k").code(), StatusCode::kUnsupported);
  EXPECT_EQ(plain.OwnsScan("a", "b").code(), StatusCode::kUnsupported);
  // A server the configuration does not name owns no range.
  Ownership stranger("z:1");
  ASSERT_TRUE(stranger.Install(c));
  EXPECT_EQ(stranger.OwnsRange("k").code(), StatusCode::kMoved);
}

TEST(Ownership, ARangeMovingAwayIsNotedThenFrozenThenReleased) {
  // Ranges ["", "g"), ["g", ...): a:1, b:1; range 0 moves to b:1 at epoch 2.
  Config c = InitialConfig("c", 1, {{"a:1", 1}, {"b:1", 1}}, 64, 0,
                           std::vector<std::string>{"g"});
  Ownership a("a:1"), b("b:1");
  std::vector<uint64_t> words;
  a.SetRangeServingListener([&](uint64_t w) { words.push_back(w); });
  ASSERT_TRUE(a.Install(c));
  ASSERT_TRUE(b.Install(c));
  EXPECT_EQ(a.range_serving_word(), 1ull | 1ull << 32);
  EXPECT_FALSE(a.RangeOutgoing("a"));
  EXPECT_EQ(a.FreezeRanges({0}).code(), StatusCode::kConflict);
  Config moving = c;
  moving.epoch = 2;
  moving.range_next = {1, kNoMember};
  ASSERT_TRUE(a.Install(moving));
  ASSERT_TRUE(b.Install(moving));
  // a serves and notes range 0's writes; b takes it in but does not serve
  // it; range 1 is untouched.
  EXPECT_TRUE(a.WritableRange("a").ok());
  EXPECT_TRUE(a.RangeOutgoing("a"));
  EXPECT_FALSE(a.RangeOutgoing("h"));
  EXPECT_TRUE(a.RangeMovingAway(0));
  EXPECT_FALSE(a.RangeIncoming(0));
  EXPECT_TRUE(b.RangeIncoming(0));
  EXPECT_FALSE(b.RangeIncoming(1));
  EXPECT_EQ(b.OwnsRange("a").code(), StatusCode::kMoved);
  EXPECT_EQ(b.FreezeRanges({0}).code(), StatusCode::kConflict);
  // The owned ranges are the same: the word's "since" stays at 1.
  EXPECT_EQ(a.range_serving_word(), 2ull | 1ull << 32);
  EXPECT_FALSE(a.RangeGone(0));
  EXPECT_FALSE(b.RangeGone(0));  // moving here
  EXPECT_TRUE(b.RangeGone(1) == false && a.RangeGone(1));
  ASSERT_TRUE(a.FreezeRanges({0}).ok());
  EXPECT_FALSE(a.RangeGone(0));
  EXPECT_EQ(a.WritableRange("a").code(), StatusCode::kBusy);
  EXPECT_TRUE(a.OwnsRange("a").ok());
  EXPECT_TRUE(a.OwnsScan("a", "b").ok());
  EXPECT_EQ(a.range_serving_word(), 0u);  // vouches for nothing
  ASSERT_TRUE(a.ReleaseRanges({0}).ok());
  EXPECT_TRUE(a.RangeGone(0));  // what is left of it may be deleted
  EXPECT_EQ(a.OwnsRange("a").code(), StatusCode::kBusy);
  EXPECT_EQ(a.OwnsScan("a", "b").code(), StatusCode::kBusy);
  // Released stays released: a freeze does not take it back.
  ASSERT_TRUE(a.FreezeRanges({0}).ok());
  EXPECT_EQ(a.OwnsRange("a").code(), StatusCode::kBusy);
  // The hash store's word is unaffected by a range's state.
  EXPECT_NE(a.serving_word(), 0u);
  const Config done = CompleteMoves(moving);
  ASSERT_TRUE(a.Install(done));
  ASSERT_TRUE(b.Install(done));
  EXPECT_EQ(a.OwnsRange("a").code(), StatusCode::kMoved);
  EXPECT_TRUE(b.WritableRange("a").ok());
  EXPECT_FALSE(a.RangeOutgoing("a"));
  EXPECT_TRUE(a.RangeGone(0));
  EXPECT_FALSE(b.RangeGone(0));
  // Both own other ranges since epoch 3.
  EXPECT_EQ(a.range_serving_word(), 3ull | 3ull << 32);
  EXPECT_EQ(b.range_serving_word(), 3ull | 3ull << 32);
  // Every change went to the listener, with 0 before each install.
  const std::vector<uint64_t> want = {
      0, 1ull | 1ull << 32, 0, 2ull | 1ull << 32, 0, 3ull | 3ull << 32};
  EXPECT_EQ(words, want);
  // Moving back: a is no longer to delete what it holds of it.
  Config back = done;
  back.epoch = 4;
  back.range_next = {0, kNoMember};
  ASSERT_TRUE(a.Install(back));
  EXPECT_FALSE(a.RangeGone(0));
  EXPECT_TRUE(a.RangeIncoming(0));
  // A server restarted during the move, maybe past its handoff, starts
  // with the range released (it may have deleted part of it).
  Ownership again("a:1");
  ASSERT_TRUE(again.Install(moving));
  EXPECT_EQ(again.WritableRange("a").code(), StatusCode::kBusy);
  EXPECT_EQ(again.OwnsRange("a").code(), StatusCode::kBusy);
  EXPECT_EQ(again.range_serving_word(), 0u);
  // Known not to be past its handoff: frozen.
  Ownership before("a:1");
  ASSERT_TRUE(before.Install(moving, /*past_handoff=*/false));
  EXPECT_EQ(before.WritableRange("a").code(), StatusCode::kBusy);
  EXPECT_TRUE(before.OwnsRange("a").ok());
  EXPECT_TRUE(again.WritableRange("h").code() == StatusCode::kMoved);
}

TEST(Ownership, TheFirstConfigurationIsServedOnlyOnceEveryPurgeIsDone) {
  Ownership o("a:1");
  o.RequirePurge(2);
  const Config c1 = TwoServers(1);
  const std::string mine = KeyOwnedBy(c1, "a:1");
  ASSERT_TRUE(o.Install(c1));
  // Pending: the purges read it; requests wait (Busy), as before any.
  ASSERT_NE(o.pending(), nullptr);
  EXPECT_EQ(o.current(), nullptr);
  EXPECT_EQ(o.latest(), o.pending());
  EXPECT_EQ(o.epoch(), 0u);
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kBusy);
  EXPECT_EQ(o.Admits(1).code(), StatusCode::kBusy);
  // A newer one meanwhile replaces it; an older one is still ignored.
  ASSERT_TRUE(o.Install(TwoServers(2)));
  EXPECT_FALSE(o.Install(TwoServers(1)));
  EXPECT_EQ(o.pending()->config.epoch, 2u);
  o.PurgeDone();
  EXPECT_EQ(o.current(), nullptr);
  o.PurgeDone();
  ASSERT_NE(o.current(), nullptr);
  EXPECT_EQ(o.pending(), nullptr);
  EXPECT_EQ(o.epoch(), 2u);
  EXPECT_TRUE(o.Owns(mine).ok());
  // Later configurations are served at once.
  ASSERT_TRUE(o.Install(TwoServers(3, /*swapped=*/true)));
  EXPECT_EQ(o.epoch(), 3u);
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kMoved);
}

TEST(Ownership, OwnsItsShardsAndRefusesOthersAndOtherEpochs) {
  Ownership o("a:1");
  const Config c1 = TwoServers(1);
  ASSERT_TRUE(o.Install(c1));
  EXPECT_EQ(o.current()->owned, c1.ShardsOf(0));
  const std::string mine = KeyOwnedBy(c1, "a:1");
  const std::string theirs = KeyOwnedBy(c1, "b:1");
  EXPECT_TRUE(o.Owns(mine).ok());
  Status moved = o.Owns(theirs);
  EXPECT_EQ(moved.code(), StatusCode::kMoved);
  EXPECT_NE(moved.message().find("b:1"), std::string::npos) << moved.message();
  EXPECT_TRUE(o.Admits(1).ok());
  EXPECT_EQ(o.Admits(2).code(), StatusCode::kBusy);  // not installed yet

  // A newer configuration that moved every shard: ownership follows the
  // new owners; a request of the old epoch is admitted and refused by key
  // (Owns), so one for a key still owned here is served.
  ASSERT_TRUE(o.Install(TwoServers(2, /*swapped=*/true)));
  EXPECT_TRUE(o.Admits(1).ok());
  EXPECT_TRUE(o.Admits(2).ok());
  EXPECT_EQ(o.Admits(3).code(), StatusCode::kBusy);
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kMoved);
  EXPECT_TRUE(o.Owns(theirs).ok());
  // Epochs only grow: an older or equal configuration is ignored.
  EXPECT_FALSE(o.Install(TwoServers(1)));
  EXPECT_FALSE(o.Install(TwoServers(2)));
  EXPECT_EQ(o.epoch(), 2u);
  EXPECT_TRUE(o.Owns(theirs).ok());
}

TEST(Ownership, AConfigurationWithoutThisServerOwnsNothing) {
  Ownership o("z:9");
  ASSERT_TRUE(o.Install(TwoServers(1)));
  EXPECT_EQ(o.current()->self, -1);
  EXPECT_EQ(o.current()->owned, 0u);
  EXPECT_EQ(o.Owns("k").code(), StatusCode::kMoved);
}

// The hash store settles what it keeps after each install
// (HashService::SettleShards_st): the listener hears every installed
// configuration, once, as the one installed (current here: no purges
// are pending); not an older one that Install refuses.
TEST(Ownership, TheInstallListenerHearsEachInstalledEpochOnce) {
  Ownership o("a:1");
  std::vector<uint32_t> heard;
  o.AddInstallListener([&](const Ownership::Installed& installed) {
    ASSERT_NE(o.current(), nullptr);
    EXPECT_EQ(o.current(), &installed);
    heard.push_back(installed.config.epoch);
  });
  ASSERT_TRUE(o.Install(TwoServers(1)));
  ASSERT_TRUE(o.Install(TwoServers(3, /*swapped=*/true)));
  EXPECT_FALSE(o.Install(TwoServers(2)));
  EXPECT_FALSE(o.Install(TwoServers(3)));
  EXPECT_EQ(heard, (std::vector<uint32_t>{1, 3}));
}

// A server whose first configuration (it restarted) has a shard moving
// away from it: the step may be past its freeze, so that shard takes no
// write (reads go on) until a configuration ends the move.
TEST(Ownership, AShardMovingAwayInTheFirstConfigurationStartsFrozenOrReleased) {
  Ownership o("a:1");
  Config c = TwoServers(1);
  const std::string mine = KeyOwnedBy(c, "a:1");
  const uint32_t shard = ShardOf(mine, c.num_shards());
  c.next.assign(c.num_shards(), kNoMember);
  c.next[shard] = 1;
  ASSERT_TRUE(o.Install(c));
  // Neither read nor written: this server may have deleted part of it.
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kBusy);
  EXPECT_EQ(o.Writable(mine).code(), StatusCode::kBusy);
  EXPECT_EQ(o.serving_word(), 0u);
  // Another shard of its own is written as ever.
  for (int i = 0;; ++i) {
    const std::string k = "k" + std::to_string(i);
    if (c.OwnerOf(k).address != "a:1" || ShardOf(k, c.num_shards()) == shard) {
      continue;
    }
    EXPECT_TRUE(o.Writable(k).ok());
    break;
  }
  // The move abandoned: written again.
  Config abandoned = c;
  abandoned.epoch = 2;
  abandoned.next.clear();
  ASSERT_TRUE(o.Install(abandoned));
  EXPECT_TRUE(o.Writable(mine).ok());
  // Not past its handoff (ZooKeeper says so): no release can have come,
  // so only frozen (reads served, writes Busy).
  Ownership before("a:1");
  ASSERT_TRUE(before.Install(c, /*past_handoff=*/false));
  EXPECT_TRUE(before.Owns(mine).ok());
  EXPECT_EQ(before.Writable(mine).code(), StatusCode::kBusy);
}

TEST(Ownership, FreezeAndReleaseHoldOnlyWhileAShardMovesAway) {
  Ownership o("a:1");
  Config c = TwoServers(1);
  ASSERT_TRUE(o.Install(c));
  const std::string mine = KeyOwnedBy(c, "a:1");
  const uint32_t shard = ShardOf(mine, c.num_shards());
  // Not moving: nothing to freeze.
  EXPECT_EQ(o.Freeze({shard}).code(), StatusCode::kConflict);
  EXPECT_FALSE(o.Outgoing(mine));

  // Moving to b:1: still served here, its changes noted.
  Config moving = c;
  moving.epoch = 2;
  moving.next.assign(c.num_shards(), kNoMember);
  moving.next[shard] = 1;
  ASSERT_TRUE(o.Install(moving));
  EXPECT_TRUE(o.Outgoing(mine));
  EXPECT_TRUE(o.MovingAway(shard));
  EXPECT_FALSE(o.Incoming(shard));
  EXPECT_TRUE(o.Writable(mine).ok());
  // Frozen: reads go on, writes wait.
  ASSERT_TRUE(o.Freeze({shard}).ok());
  EXPECT_TRUE(o.Owns(mine).ok());
  EXPECT_EQ(o.Writable(mine).code(), StatusCode::kBusy);
  // Released: reads wait too; freezing again does not undo it.
  ASSERT_TRUE(o.Release({shard}).ok());
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kBusy);
  ASSERT_TRUE(o.Freeze({shard}).ok());
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kBusy);

  // The move completes: the shard is b:1's (Moved here); b:1 saw it coming.
  Config done = CompleteMoves(moving);
  ASSERT_TRUE(o.Install(done));
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kMoved);
  EXPECT_FALSE(o.Outgoing(mine));
  Ownership b("b:1");
  ASSERT_TRUE(b.Install(moving));
  EXPECT_TRUE(b.Incoming(shard));
  EXPECT_EQ(b.Owns(mine).code(), StatusCode::kMoved);
  ASSERT_TRUE(b.Install(done));
  EXPECT_TRUE(b.Owns(mine).ok());
  EXPECT_FALSE(b.Incoming(shard));

  // An abandoned move serves the shard here again, writes included.
  Ownership a2("a:1");
  ASSERT_TRUE(a2.Install(moving));
  ASSERT_TRUE(a2.Release({shard}).ok());
  ASSERT_TRUE(a2.Install(AbandonMoves(moving)));
  EXPECT_TRUE(a2.Writable(mine).ok());
}

TEST(Ownership, AReplicatedMemberServesOnlyWhileItHoldsItsLease) {
  Ownership o("a:1", /*incarnation=*/7);
  const Config c = InitialConfig("c", 1, {{"a:1", 1, 7}, {"b:1", 1, 8}}, 64, 1);
  ASSERT_TRUE(o.Install(c));
  const std::string mine = KeyOwnedBy(c, "a:1");
  const std::string theirs = KeyOwnedBy(c, "b:1");
  ASSERT_TRUE(o.replicated());
  // Primary of its keys, backup of the others'.
  EXPECT_TRUE(Ownership::BacksUp(*o.current(), theirs));
  EXPECT_FALSE(Ownership::BacksUp(*o.current(), mine));
  // No lease yet: nothing served (ask again).
  EXPECT_EQ(o.Owns(mine).code(), StatusCode::kBusy);
  EXPECT_EQ(o.Writable(mine).code(), StatusCode::kBusy);
  o.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  EXPECT_TRUE(o.Owns(mine).ok());
  EXPECT_TRUE(o.Leased().ok());
  EXPECT_EQ(o.Owns(theirs).code(), StatusCode::kMoved);
  // A lease never shrinks; one that ran out stops everything again.
  o.ExtendLease(1);
  EXPECT_TRUE(o.Owns(mine).ok());
  Ownership lapsed("a:1", 7);
  ASSERT_TRUE(lapsed.Install(c));
  lapsed.ExtendLease(LeaseClockNs() - 1);
  EXPECT_EQ(lapsed.Owns(mine).code(), StatusCode::kBusy);
  // Its likely cause named when this member has lost ZooKeeper too (the
  // message sent operators to the wrong cause; found by a black-box run).
  EXPECT_EQ(lapsed.Owns(mine).message().find("ZooKeeper"), std::string::npos);
  lapsed.NoteZooKeeper(false);
  EXPECT_EQ(lapsed.Owns(mine).code(), StatusCode::kBusy);
  EXPECT_NE(lapsed.Owns(mine).message().find("not connected to ZooKeeper"),
            std::string::npos)
      << lapsed.Owns(mine).ToString();
  // Records are kept only at the epoch installed.
  EXPECT_TRUE(o.AdmitsReplication(1).ok());
  EXPECT_EQ(o.AdmitsReplication(2).status().code(), StatusCode::kConflict);

  // A restarted server (another incarnation at the same address) holds
  // none of its predecessor's roles.
  Ownership restarted("a:1", 9);
  ASSERT_TRUE(restarted.Install(c));
  restarted.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  EXPECT_EQ(restarted.Owns(mine).code(), StatusCode::kMoved);
  EXPECT_FALSE(Ownership::BacksUp(*restarted.current(), theirs));
  // Unreplicated configurations need no lease.
  Ownership plain("a:1", 7);
  ASSERT_TRUE(plain.Install(TwoServers(1)));
  EXPECT_TRUE(plain.Owns(KeyOwnedBy(TwoServers(1), "a:1")).ok());
}

// Replicated ordered ranges ride their carrier shards (config.h): the
// range's owner serves it under its lease, the carrier's backup backs it
// up and may keep it, and one-sided readers are vouched for as in an
// unreplicated cluster (the tree's mark then says which writes the backups
// hold), but from a promotion until its resync is done (RequireResync),
// when the range serving word is 0 as the shards' serving word is.
TEST(Ownership, AReplicatedRangeIsServedAndBackedUpAsItsCarrier) {
  Config c = InitialConfig("c", 1, {{"a:1", 1, 7}, {"b:1", 1, 8}}, 64, 1,
                           std::vector<std::string>{"m"});
  ASSERT_EQ(c.num_ranges(), 2u);
  Ownership a("a:1", 7), b("b:1", 8);
  a.RequireResync(1);
  std::vector<uint64_t> words;
  a.SetRangeServingListener([&](uint64_t w) { words.push_back(w); });
  ASSERT_TRUE(a.Install(c));
  ASSERT_TRUE(b.Install(c));
  // Range 0 ("" to "m") rides shard 16, range 1 shard 48: one on each.
  ASSERT_EQ(c.range_owner[0], c.owner[c.CarrierOf(0)]);
  const int owner0 = c.range_owner[0];
  Ownership& primary = owner0 == 0 ? a : b;
  Ownership& backup = owner0 == 0 ? b : a;
  EXPECT_EQ(primary.OwnsRange("a").code(), StatusCode::kBusy);  // no lease
  primary.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  EXPECT_TRUE(primary.OwnsRange("a").ok());
  EXPECT_TRUE(primary.WritableRange("a").ok());
  backup.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  EXPECT_EQ(backup.OwnsRange("a").code(), StatusCode::kMoved);
  EXPECT_TRUE(Ownership::BacksUpRange(*backup.current(), 0));
  EXPECT_FALSE(Ownership::BacksUpRange(*primary.current(), 0));
  EXPECT_FALSE(Ownership::FillsRange(*backup.current(), 0));
  EXPECT_TRUE(Ownership::MayKeepRange(*backup.current(), 0));
  EXPECT_TRUE(Ownership::MayKeepRange(*primary.current(), 0));
  constexpr uint64_t kEpoch1 = 1ull | 1ull << 32;
  EXPECT_EQ(a.range_serving_word(), kEpoch1);
  EXPECT_EQ(words.back(), kEpoch1);
  // b:1 fails over: a:1 leads its shards, and so the range b:1 carried,
  // and vouches for no range before its resync is done.
  c.epoch = 2;
  for (auto& owner : c.owner) owner = 0;
  for (auto& backup : c.backups) backup = kNoMember;
  c.FollowCarriers();
  ASSERT_TRUE(a.Install(c));
  EXPECT_EQ(a.range_serving_word(), 0u);
  a.ResyncDone(2);
  EXPECT_EQ(a.range_serving_word(), 2ull | 2ull << 32);
  EXPECT_EQ(words.back(), 2ull | 2ull << 32);
  a.SetRangeServingListener(nullptr);
  // A lapsed lease refuses the range too.
  Ownership lapsed(owner0 == 0 ? "a:1" : "b:1", owner0 == 0 ? 7 : 8);
  ASSERT_TRUE(lapsed.Install(c));
  lapsed.ExtendLease(LeaseClockNs() - 1);
  EXPECT_EQ(lapsed.OwnsRange("a").code(), StatusCode::kBusy);
}

TEST(Ownership, AWholeBackupAnswersReadsFromAnyReplicaUnderItsLease) {
  const Config c = InitialConfig(
      "c", 1, {{"a:1", 1, 7}, {"b:1", 1, 8}, {"c:1", 1, 9}}, 64, 1);
  Ownership a("a:1", 7);
  ASSERT_TRUE(a.Install(c));
  std::string backed, elsewhere;  // b:1's keys a:1 backs up, and c:1's
  for (int i = 0; backed.empty() || elsewhere.empty(); ++i) {
    const std::string k = "k" + std::to_string(i);
    if (c.OwnerOf(k).address == "a:1") continue;
    if (Ownership::BacksUp(*a.current(), k)) {
      if (backed.empty()) backed = k;
    } else if (elsewhere.empty()) {
      elsewhere = k;
    }
  }
  const std::string mine = KeyOwnedBy(c, "a:1");
  // No lease: nothing (ask again).
  EXPECT_EQ(a.ReplicaReadable(backed).code(), StatusCode::kBusy);
  a.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  EXPECT_TRUE(a.ReplicaReadable(backed).ok());
  EXPECT_TRUE(a.ReplicaReadable(mine).ok());
  bool as_backup = false;
  ASSERT_TRUE(a.ReplicaReadable(backed, &as_backup).ok());
  EXPECT_TRUE(as_backup);
  as_backup = false;
  ASSERT_TRUE(a.ReplicaReadable(mine, &as_backup).ok());
  EXPECT_FALSE(as_backup);
  EXPECT_EQ(a.Owns(backed).code(), StatusCode::kMoved);
  EXPECT_EQ(a.ReplicaReadable(elsewhere).code(), StatusCode::kMoved);

  // A backup being filled does not hold a whole copy yet.
  Config filling = c;
  filling.epoch = 2;
  filling.filling.assign(filling.backups.size(), 1);
  ASSERT_TRUE(a.Install(filling));
  EXPECT_EQ(a.ReplicaReadable(backed).code(), StatusCode::kMoved);
  EXPECT_TRUE(a.ReplicaReadable(mine).ok());
  // Without replicas there are no backups: the owner alone.
  Ownership plain("a:1");
  ASSERT_TRUE(plain.Install(TwoServers(1)));
  EXPECT_EQ(plain.ReplicaReadable(KeyOwnedBy(TwoServers(1), "b:1")).code(),
            StatusCode::kMoved);
}

TEST(Ownership, APromotedMemberVouchesForNothingUntilItsPartsResynced) {
  Ownership o("a:1", /*incarnation=*/7);
  o.RequireResync(2);
  std::vector<uint64_t> heard;
  o.SetServingListener([&](uint64_t w) { heard.push_back(w); });
  auto word = [](uint32_t installed, uint32_t since) {
    return uint64_t{installed} | uint64_t{since} << 32;
  };
  Config c = InitialConfig(
      "c", 1, {{"a:1", 1, 7}, {"b:1", 1, 8}, {"c:1", 1, 9}}, 64, 1);
  o.ExtendLease(LeaseClockNs() + 60'000'000'000ull);
  // The first configuration: nothing was held as a backup before it.
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), word(1, 1));
  // The same shards at the next epoch: nothing to send on.
  c.epoch = 2;
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), word(2, 1));
  // b:1 failed over: a:1 leads its shards too.
  const std::string theirs = KeyOwnedBy(c, "b:1");
  c.epoch = 3;
  for (auto& owner : c.owner) {
    if (owner == 1) owner = 0;
  }
  heard.clear();
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), 0u);
  EXPECT_TRUE(o.Owns(theirs).ok());  // served by RPC meanwhile
  o.ResyncDone(2);                   // an older epoch's report: nothing
  o.ResyncDone(3);
  EXPECT_EQ(o.serving_word(), 0u);  // one part left
  // Another configuration before the last part reported: every part
  // reports again, for it.
  c.epoch = 4;
  ASSERT_TRUE(o.Install(c));
  o.ResyncDone(3);
  o.ResyncDone(4);
  EXPECT_EQ(o.serving_word(), 0u);
  o.ResyncDone(4);
  EXPECT_EQ(o.serving_word(), word(4, 3));
  EXPECT_EQ(heard.back(), word(4, 3));
  o.ResyncDone(4);  // past the count: nothing
  EXPECT_EQ(o.serving_word(), word(4, 3));
  o.SetServingListener(nullptr);
  // Unreplicated, a shard moved here is not held back.
  Ownership plain("a:1", 7);
  plain.RequireResync(1);
  ASSERT_TRUE(plain.Install(TwoServers(1)));
  ASSERT_TRUE(plain.Install(TwoServers(2, /*swapped=*/true)));
  EXPECT_EQ(plain.serving_word(), word(2, 2));
}

TEST(Ownership, TheServingWordNamesTheEpochSinceWhichItLedTheSameShards) {
  Ownership o("a:1", /*incarnation=*/7);
  std::vector<uint64_t> heard;
  o.SetServingListener([&](uint64_t w) { heard.push_back(w); });
  ASSERT_EQ(heard, std::vector<uint64_t>{0});  // nothing yet
  Config c = InitialConfig("c", 1, {{"a:1", 1, 7}, {"b:1", 1, 8}}, 64, 1);
  ASSERT_TRUE(o.Install(c));
  auto word = [](uint32_t installed, uint32_t since) {
    return uint64_t{installed} | uint64_t{since} << 32;
  };
  EXPECT_EQ(o.serving_word(), word(1, 1));
  // The next epoch with the same primaries (a backup changed, say): the
  // readers of epoch 1 still read the right primary.
  c.epoch = 2;
  heard.clear();
  ASSERT_TRUE(o.Install(c));
  // Withdrawn first, then the new word.
  EXPECT_EQ(heard, (std::vector<uint64_t>{0, word(2, 1)}));
  // A shard of a:1's handed over: frozen, nothing is vouched for.
  const std::string mine = KeyOwnedBy(c, "a:1");
  const uint32_t shard = ShardOf(mine, c.num_shards());
  c.epoch = 3;
  c.next.assign(c.num_shards(), kNoMember);
  c.next[shard] = 1;
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), word(3, 1));
  ASSERT_TRUE(o.Freeze({shard}).ok());
  EXPECT_EQ(o.serving_word(), 0u);
  // b:1 leads it now: a:1 leads other shards since epoch 4.
  c.epoch = 4;
  c.next[shard] = kNoMember;
  c.owner[shard] = 1;
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), word(4, 4));
  // An install that skipped epochs: what it led in between is unknown.
  c.epoch = 6;
  ASSERT_TRUE(o.Install(c));
  EXPECT_EQ(o.serving_word(), word(6, 6));
  // A configuration that gives this incarnation nothing vouches for
  // nothing.
  Ownership other("a:1", /*incarnation=*/9);
  ASSERT_TRUE(other.Install(c));
  EXPECT_EQ(other.serving_word(), 0u);
  o.SetServingListener(nullptr);
  // An unreplicated member vouches too (its memory holds shards being
  // copied in, and copies it gave away), whatever its incarnation: its
  // shards stay its own across a restart.
  Ownership plain("a:1", 7);
  ASSERT_TRUE(plain.Install(TwoServers(1)));
  EXPECT_EQ(plain.serving_word(), word(1, 1));
  ASSERT_TRUE(plain.Install(TwoServers(2)));
  EXPECT_EQ(plain.serving_word(), word(2, 1));
  ASSERT_TRUE(plain.Install(TwoServers(3, /*swapped=*/true)));
  EXPECT_EQ(plain.serving_word(), word(3, 3));
  Ownership restarted("a:1", 8);
  ASSERT_TRUE(restarted.Install(TwoServers(3, /*swapped=*/true)));
  EXPECT_EQ(restarted.serving_word(), word(3, 3));
}

}  // namespace
}  // namespace remem::cluster
