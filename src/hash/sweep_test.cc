// The table sweep (hash/sweep.h) on a partition in plain memory: run a
// bucket at a time while other keys are written between its steps, so
// that cuckoo moves carry keys behind its cursor and the table grows
// under it, it still returns every wanted key that stayed in the table.

#include "hash/sweep.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "testing/local_table.h"

namespace remem::hash {
namespace {

using testing::LocalTable;

bool EndsEven(std::string_view key) { return key.back() % 2 == 0; }

TEST(TableSweep, FindsEveryKeyThatStaysWhileWritesMoveAndGrowTheTable) {
  auto t = LocalTable::Create(64, 256 << 20);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Table& table = (*t)->table();
  std::set<std::string> stays;  // wanted, in the table throughout
  for (int i = 0; i < 4500; ++i) {
    const std::string key = "old-" + std::to_string(i);
    ASSERT_TRUE(table.Put(key, std::string(20 + i % 40, 'v')).ok());
    if (EndsEven(key)) stays.insert(key);
  }
  TableSweep sweep(&table, EndsEven);
  table.SetChangeHook([&](std::string_view k, uint64_t from, uint64_t to) {
    sweep.OnChange(k, from, to);
  });
  std::vector<std::string> found;
  std::mt19937_64 rng(7);
  const uint64_t moves_before = table.moves();
  int written = 0;
  while (!sweep.Step(1, &found)) {
    // Writes between the steps: three per bucket scanned until the table
    // has grown under the sweep, then one. Each is a new key, or a wanted
    // key written and deleted again (never one that stays).
    for (int n = sweep.restarts() == 0 ? 3 : 1; n > 0; --n) {
      const std::string key = "new-" + std::to_string(written++);
      ASSERT_TRUE(table.Put(key, std::string(20 + rng() % 40, 'w')).ok());
      if (rng() % 4 == 0) {
        ASSERT_TRUE(table.Delete(key).ok());
      }
    }
    table.GrowStep(64);  // as the server does at each pass
    ASSERT_LT(written, 200000) << "the sweep never ends";
  }
  table.SetChangeHook(nullptr);
  std::set<std::string> seen(found.begin(), found.end());
  for (const std::string& k : seen) EXPECT_TRUE(EndsEven(k)) << k;
  size_t missed = 0;
  for (const std::string& k : stays) missed += seen.count(k) == 0 ? 1 : 0;
  EXPECT_EQ(missed, 0u) << "of " << stays.size() << " keys that stayed";
  // The test is about moves and growth: both happened.
  EXPECT_GT(table.moves(), moves_before);
  EXPECT_GT(sweep.restarts(), 0u);
  EXPECT_GT(sweep.moved_keys(), 0u);
  // Over: further steps find nothing.
  std::vector<std::string> more;
  EXPECT_TRUE(sweep.Step(1, &more));
  EXPECT_TRUE(more.empty());
}

TEST(TableSweep, AnEmptyTableOrNoWantedKeyEndsAtOnceWithNothing) {
  auto t = LocalTable::Create(8, 16 << 20);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Table& table = (*t)->table();
  std::vector<std::string> found;
  TableSweep empty(&table, EndsEven);
  EXPECT_TRUE(empty.Step(1000, &found));
  EXPECT_TRUE(found.empty());
  ASSERT_TRUE(table.Put("odd-1", "v").ok());
  TableSweep none(&table, EndsEven);
  EXPECT_TRUE(none.Step(1000, &found));
  EXPECT_TRUE(found.empty());
}

}  // namespace
}  // namespace remem::hash
