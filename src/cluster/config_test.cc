#include "cluster/config.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "cluster/wire.h"

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
  EXPECT_EQ(patched(4, uint16_t(2)).status().code(),
            StatusCode::kProtocolError);                     // version
  EXPECT_FALSE(patched(8, uint32_t(0)).ok());                // epoch
  EXPECT_FALSE(patched(12, uint32_t(kMaxShards + 1)).ok());  // shards
  EXPECT_FALSE(patched(16, uint32_t(0)).ok());               // members
  EXPECT_FALSE(patched(20, uint32_t(1)).ok());               // reserved
  // A shard owned by a member that does not exist.
  EXPECT_FALSE(patched(bytes.size() - 2, uint16_t(3)).ok());
  // A name that is not a path component.
  std::string bad_name = bytes;
  bad_name[sizeof(ConfigHeader)] = '/';
  EXPECT_FALSE(DecodeConfig(bad_name).ok());
}

TEST(ClusterConfig, MemberRecordsAndZooKeeperTargets) {
  const Member m{"127.0.0.1:7400", 1ull << 30};
  auto d = DecodeMemberRecord(EncodeMemberRecord(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->address, m.address);
  EXPECT_EQ(d->capacity, m.capacity);
  for (const char* bad :
       {"", "remem-member 2\na:1\n1\n", "remem-member 1\n\n1\n",
        "remem-member 1\na:1\n", "remem-member 1\na:1\n01\n",
        "remem-member 1\na:1\n1x\n", "remem-member 1\na:1\n1"}) {
    EXPECT_FALSE(DecodeMemberRecord(bad).ok()) << bad;
  }

  auto t = ParseZkTarget("10.0.0.1:2181,10.0.0.2:2181/remem/prod/");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->hosts, "10.0.0.1:2181,10.0.0.2:2181");
  EXPECT_EQ(t->path, "/remem/prod");
  EXPECT_EQ(t->name, "prod");
  for (const char* bad : {"127.0.0.1:2181", "/remem", "h:1/", "h:1/a//b",
                          "h:1/a/../b", "h:1/a b", "h:1/."}) {
    EXPECT_EQ(ParseZkTarget(bad).status().code(), StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace remem::cluster
