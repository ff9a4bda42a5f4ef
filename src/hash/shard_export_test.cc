// Export pages of moving shards (hash/shard_export.h) on a partition in
// plain memory: the byte budget holds inside a bucket of large values, and
// paging by bucket and key misses no key that stayed put while other keys
// were written, deleted and moved between pages.

#include "hash/shard_export.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>

#include "hash/wire.h"
#include "testing/local_table.h"

namespace remem::hash {
namespace {

using testing::LocalTable;

bool Wanted(std::string_view key) { return key.back() % 2 == 0; }

// Keys, by how many times the pages returned each.
struct Pages {
  std::map<std::string, int> seen;
  uint64_t largest_page = 0;  // bytes of a page of more than one pair
  int pages = 0;
  size_t most_pairs = 0;  // in one page
  int cut_inside_a_bucket = 0;
};

// Pages through `t` from the start, calling `between` after every page.
Pages Export(
    LocalTable& t, uint64_t max_bytes,
    const std::function<void()>& between = [] {}) {
  Pages result;
  uint64_t cursor = 0;
  std::string after;
  do {
    ShardPairsWriter w;
    cursor =
        ExportShardPage(t.table(), Wanted, cursor, after, max_bytes, 16384, &w);
    const std::string bytes = w.Finish(t.table().growths(), cursor, 1, 0);
    auto page = DecodeShardPairs(bytes);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    if (!page.ok()) break;
    ++result.pages;
    result.most_pairs = std::max(result.most_pairs, page->pairs.size());
    if (page->pairs.size() > 1) {
      result.largest_page =
          std::max<uint64_t>(result.largest_page, bytes.size());
    }
    for (const ShardPairView& p : page->pairs) {
      EXPECT_TRUE(Wanted(p.key)) << p.key;
      ++result.seen[std::string(p.key)];
    }
    after.clear();
    if (cursor != kShardCursorDone && (cursor & kShardCursorInBucket) != 0) {
      ++result.cut_inside_a_bucket;
      EXPECT_FALSE(page->pairs.empty());
      if (page->pairs.empty()) break;
      cursor &= ~kShardCursorInBucket;
      after.assign(page->pairs.back().key);
    }
    between();
  } while (cursor != kShardCursorDone);
  return result;
}

TEST(ShardExport, APageStaysWithinItsBudgetInsideABucketOfLargeValues) {
  // 4 buckets that never grow (they hold 42 keys): 40 values of 1 MiB share
  // them, 20 of them exported.
  auto t = LocalTable::Create(4, 256 << 20, /*grow=*/false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::set<std::string> wanted;
  for (int i = 0; i < 40; ++i) {
    const std::string key = "big-" + std::to_string(i);
    auto v = (*t)->table().Put(key, std::string(1 << 20, 'v'));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    if (Wanted(key)) wanted.insert(key);
  }
  constexpr uint64_t kBudget = 2500 << 10;  // two values and a half
  Pages pages = Export(**t, kBudget);
  // (The budget counts the header too.)
  EXPECT_GT(pages.largest_page, kBudget / 2);
  EXPECT_LE(pages.largest_page, kBudget);
  EXPECT_GT(pages.cut_inside_a_bucket, 0);
  ASSERT_EQ(pages.seen.size(), wanted.size());
  for (const auto& [key, times] : pages.seen) {
    EXPECT_TRUE(wanted.count(key)) << key;
    EXPECT_EQ(times, 1) << key;
  }
  // A budget below one pair: a pair per page.
  pages = Export(**t, 1);
  EXPECT_EQ(pages.most_pairs, 1u);
  EXPECT_EQ(pages.seen.size(), wanted.size());
}

// One run of the test below.
void PageWhileOthersChange(uint64_t seed) {
  auto t = LocalTable::Create(64, 256 << 20, /*grow=*/false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Table& table = (*t)->table();
  std::mt19937_64 rng(seed);
  std::set<std::string> present;
  auto value = [&] { return std::string(rng() % 3000, 'x'); };
  for (int i = 0; i < 500; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(table.Put(key, value()).ok());
    present.insert(key);
  }
  const std::set<std::string> at_start = present;
  // What the change hook notes: written, deleted or moved since the start
  // (the ShardSync's to send, not the pages').
  std::set<std::string> changed;
  table.SetChangeHook(
      [&](std::string_view key, uint64_t, uint64_t) { changed.emplace(key); });
  int next = 500;
  Pages pages = Export(**t, 16 << 10, [&] {
    for (int i = 0; i < 8; ++i) {
      switch (rng() % 3) {
        case 0: {  // a new key (its cuckoo moves move others)
          const std::string key = "k" + std::to_string(next++);
          if (table.Put(key, value()).ok()) present.insert(key);
          break;
        }
        case 1: {  // a delete
          auto it = present.begin();
          std::advance(it, rng() % present.size());
          ASSERT_TRUE(table.Delete(*it).ok());
          present.erase(it);
          break;
        }
        default: {  // an update
          auto it = present.begin();
          std::advance(it, rng() % present.size());
          ASSERT_TRUE(table.Put(*it, value()).ok());
        }
      }
    }
  });
  table.SetChangeHook(nullptr);
  EXPECT_GT(pages.pages, 10);
  EXPECT_GT(pages.cut_inside_a_bucket, 0);
  int checked = 0;
  for (const std::string& key : at_start) {
    if (!Wanted(key) || changed.count(key)) continue;
    ++checked;
    EXPECT_EQ(pages.seen[key], 1) << key;
  }
  EXPECT_GT(checked, 100);
  for (const auto& [key, times] : pages.seen) {
    EXPECT_TRUE(at_start.count(key) || changed.count(key)) << key;
  }
}

TEST(ShardExport, PagingMissesNoKeyThatStayedPutWhileOthersChanged) {
  for (uint64_t seed : {11, 12, 13, 14}) {
    SCOPED_TRACE(seed);
    PageWhileOthersChange(seed);
  }
}

}  // namespace
}  // namespace remem::hash
