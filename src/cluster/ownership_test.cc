#include "cluster/ownership.h"

#include <gtest/gtest.h>

#include <string>

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

  // A newer configuration that moved every shard: the old epoch is now
  // stale (Moved), and ownership follows the new owners.
  ASSERT_TRUE(o.Install(TwoServers(2, /*swapped=*/true)));
  EXPECT_EQ(o.Admits(1).code(), StatusCode::kMoved);
  EXPECT_TRUE(o.Admits(2).ok());
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

}  // namespace
}  // namespace remem::cluster
