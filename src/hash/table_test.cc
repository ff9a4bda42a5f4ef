// The hash table's server side and its verifying reader, in one process
// (testing::LocalTable): the arena is plain memory; readers copy it word by
// word as a one-sided read would. The same race runs over the network
// against remem-server in tests/hash_test.cc.

#include "hash/table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hash/reader.h"
#include "testing/local_table.h"
#include "testing/race.h"

namespace remem::hash {
namespace {

using testing::LocalTable;

// A partition in plain memory (testing::LocalTable); null after a recorded
// failure.
std::unique_ptr<LocalTable> NewTable(uint64_t initial_buckets,
                                     uint64_t arena_bytes, bool grow = true) {
  auto t = LocalTable::Create(initial_buckets, arena_bytes, grow);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

// A verified lookup that must come to an end.
LookupResult Lookup1(LocalTable& t, std::string_view key,
                     std::optional<ReadMode> mode = std::nullopt) {
  auto r = t.Get(key, nullptr, false, nullptr, mode);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : LookupResult{};
}

TEST(HashTable, BehavesLikeAMapUnderRandomOperations) {
  // Starts at 4 buckets: the table grows many times on the way.
  auto s_table = NewTable(4, 256 << 20);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  std::map<std::string, std::pair<std::string, uint64_t>> model;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string key = "key-" + std::to_string(rng() % 2000);
    // Inline pairs, extent pairs, and replacements that switch between them.
    const size_t len = rng() % 4 == 0 ? rng() % 70000 : rng() % 100;
    std::string value(len, char('a' + rng() % 26));
    switch (rng() % 5) {
      case 0:
      case 1: {
        auto v = s.table().Put(key, value);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        model[key] = {value, *v};
        break;
      }
      case 2: {
        Status st = s.table().Delete(key);
        EXPECT_EQ(st.ok(), model.erase(key) == 1) << st.ToString();
        break;
      }
      case 3: {
        auto it = model.find(key);
        uint64_t expected = it == model.end() ? 7 : it->second.second;
        if (rng() % 2 && it != model.end()) ++expected;  // a stale version
        auto v = s.table().CompareAndPut(key, value, expected);
        if (it == model.end()) {
          EXPECT_EQ(v.status().code(), StatusCode::kNotFound);
        } else if (expected != it->second.second) {
          EXPECT_EQ(v.status().code(), StatusCode::kConflict);
        } else {
          ASSERT_TRUE(v.ok());
          it->second = {value, *v};
        }
        break;
      }
      default: {
        LookupResult l = Lookup1(s, key);
        auto it = model.find(key);
        ASSERT_EQ(l.outcome == Lookup::kFound, it != model.end()) << key;
        if (it != model.end()) {
          EXPECT_EQ(l.value, it->second.first);
          EXPECT_EQ(l.version, it->second.second);
          auto server = s.table().Get(key);
          ASSERT_TRUE(server.ok());
          EXPECT_EQ(server->value, it->second.first);
        }
      }
    }
  }
  EXPECT_EQ(s.table().size(), model.size());
  // The server's own record of each bucket's fill, which placement trusts.
  EXPECT_TRUE(s.table().FillRecordMatches());
  EXPECT_GE(s.table().growths(), 4u);
  EXPECT_GT(s.table().inline_pairs(), 0u);
  EXPECT_LT(s.table().inline_pairs(), s.table().size());
  for (const auto& [k, v] : model) {
    LookupResult l = Lookup1(s, k);
    ASSERT_EQ(l.outcome, Lookup::kFound) << k;
    EXPECT_EQ(l.value, v.first);
  }
}

TEST(HashTable, BadSizesAreRefused) {
  auto s_table = NewTable(64, 1 << 20);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  EXPECT_EQ(s.table().Put("", "v").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.table().Put(std::string((64 << 10) + 1, 'k'), "v").status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.table().Put("k", std::string((16 << 20) + 1, 'v')).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(s.table().PutIfAbsent("k", "1").status().code(), StatusCode::kOk);
  EXPECT_EQ(s.table().PutIfAbsent("k", "2").status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(s.table().Delete("nope").code(), StatusCode::kNotFound);
}

TEST(HashTable, AFullStoreRefusesWritesAndKeepsEveryKey) {
  // A growing table in a 2 MiB arena: extents and bucket arrays together
  // run out of memory; every key stored before stays readable.
  auto s_table = NewTable(4, 2 << 20);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  std::map<std::string, std::string> stored;
  Status last;
  for (int i = 0; i < 1000000; ++i) {
    std::string k = "k" + std::to_string(i);
    std::string v(i % 3 == 0 ? 200 : 20, char('a' + i % 26));
    auto r = s.table().Put(k, v);
    if (!r.ok()) {
      last = r.status();
      break;
    }
    stored[k] = v;
  }
  EXPECT_EQ(last.code(), StatusCode::kOutOfMemory) << last.ToString();
  EXPECT_GT(stored.size(), 1000u);
  EXPECT_GE(s.table().growths(), 3u);
  // Replacing an existing key with a larger value fails the same way.
  auto grow = s.table().Put(stored.begin()->first, std::string(1 << 20, 'x'));
  EXPECT_EQ(grow.status().code(), StatusCode::kOutOfMemory);
  // The messages say which piece did not fit, and the flag that sizes it.
  EXPECT_NE(grow.status().message().find("no free extent of"),
            std::string::npos)
      << grow.status().ToString();
  EXPECT_NE(last.message().find("--hash-memory"), std::string::npos)
      << last.ToString();
  for (const auto& [k, v] : stored) {
    LookupResult l = Lookup1(s, k);
    ASSERT_EQ(l.outcome, Lookup::kFound) << k;
    ASSERT_EQ(l.value, v);
  }
  // Without growth, buckets run out before extents do.
  auto t_table = NewTable(4, 64 << 20, /*grow=*/false);
  ASSERT_NE(t_table, nullptr);
  LocalTable& t = *t_table;
  int n = 0;
  Status st;
  while ((st = t.table().Put("key" + std::to_string(n), "v").status()).ok())
    ++n;
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_GE(n, 40);  // 4 buckets x 11 entries of 40 bytes, 95% full at most
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(Lookup1(t, "key" + std::to_string(i)).outcome, Lookup::kFound);
  }
}

// Tables whose entries do not all fit in twice the buckets: in about one
// table in 20,000 of this workload (values of 0-299 bytes, inline and
// extent entries mixed), some entry finds no cuckoo path in the doubled
// array even at half the load. These seeds were found by a sweep of
// 100,000; a growth then takes 4x the buckets instead of refusing every
// write for good. Every key stays readable.
TEST(HashTable, ALayoutThatCannotDoubleGrowsLarger) {
  int skipped = 0;
  for (uint64_t seed : {5441, 20369, 33586, 66594, 79105}) {
    auto t = LocalTable::Create(4, 1 << 20, /*grow=*/true, seed);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Table& table = (*t)->table();
    for (int i = 0; i < 300; ++i) {
      auto r = table.Put("onesided" + std::to_string(i),
                         std::string(size_t(i % 300), 'p'));
      ASSERT_TRUE(r.ok()) << "seed " << seed << " key " << i << ": "
                          << r.status().ToString();
    }
    if (table.num_buckets() != (uint64_t{4} << table.growths())) ++skipped;
    for (int i = 0; i < 300; ++i) {
      LookupResult l = Lookup1(**t, "onesided" + std::to_string(i));
      ASSERT_EQ(l.outcome, Lookup::kFound) << "seed " << seed << " key " << i;
      ASSERT_EQ(l.value, std::string(size_t(i % 300), 'p'));
    }
    EXPECT_TRUE(table.FillRecordMatches());
  }
  // The seeds were chosen for that layout: if rehashing into twice the
  // buckets learnt to place them, pick seeds that still need a larger array.
  EXPECT_GT(skipped, 0);
}

// A growth whose doubled array cannot take every entry gives that array's
// memory back and tries 4x, then 8x; if none takes them, the write is
// refused with OutOfMemory, the table stays as it was (readable, writable
// where it has room) and the arena holds only the live arrays.
TEST(HashTable, AFailedRehashGivesItsArrayBack) {
  auto s_table = NewTable(4, 4 << 20);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  Table& table = s.table();
  std::vector<uint64_t> refused;  // array sizes an entry was refused in
  uint64_t refuse_below = 0;      // arrays smaller than this take nothing
  table.SetRehashHook([&](uint64_t buckets) {
    if (buckets >= refuse_below) return true;
    if (refused.empty() || refused.back() != buckets) {
      refused.push_back(buckets);
    }
    return false;
  });
  int n = 0;
  auto put_until_growth = [&] {
    const uint64_t before = table.num_buckets();
    Status st;
    while (table.num_buckets() == before &&
           (st = table.Put("k" + std::to_string(n), "v").status()).ok()) {
      ++n;
    }
    return st;
  };
  // Doubling refused: the next growth takes 4x.
  refuse_below = 16;
  ASSERT_TRUE(put_until_growth().ok());
  EXPECT_EQ(table.num_buckets(), 16u);
  EXPECT_EQ(refused, std::vector<uint64_t>{8});
  EXPECT_EQ(table.growths(), 1u);
  // Only the live arrays are carved: 4 and 16 buckets of 512 bytes, each
  // rounded up to a 64 KiB page; no extents (the values are inline).
  EXPECT_EQ(s.slab().bytes_carved(), 2u * (64 << 10));
  // Every size refused: OutOfMemory, and nothing more carved.
  refused.clear();
  refuse_below = ~uint64_t{0};
  const Status full = put_until_growth();
  EXPECT_EQ(full.code(), StatusCode::kOutOfMemory) << full.ToString();
  EXPECT_NE(full.message().find("could not rehash"), std::string::npos)
      << full.ToString();
  EXPECT_EQ(refused, (std::vector<uint64_t>{32, 64, 128}));
  EXPECT_EQ(table.num_buckets(), 16u);
  EXPECT_EQ(s.slab().bytes_carved(), 2u * (64 << 10));
  EXPECT_TRUE(table.FillRecordMatches());
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(Lookup1(s, "k" + std::to_string(i)).outcome, Lookup::kFound);
  }
  // Replacing a stored pair needs no growth.
  EXPECT_TRUE(table.Put("k0", "w").ok());
  // Once a larger array can take the entries, growth resumes.
  refuse_below = 0;
  ASSERT_TRUE(put_until_growth().ok());
  EXPECT_EQ(table.num_buckets(), 32u);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(Lookup1(s, "k" + std::to_string(i)).outcome, Lookup::kFound);
  }
}

// A growth is done in steps, a few buckets after each write, while the old
// array takes the writes (docs/ARCHITECTURE.md, "Growth in steps"): no
// write waits for a whole rehash. Writes, replacements that turn an inline
// value into an extent and back, deletes and re-inserts made while it runs,
// on keys the scan has passed and keys it has not reached, are all in the
// array it publishes; readers find every key before, during and after.
TEST(HashTable, AGrowthIsDoneInStepsAndKeepsTheWritesMadeMeanwhile) {
  auto t = NewTable(1024, 256 << 20);
  ASSERT_NE(t, nullptr);
  Table& table = t->table();
  std::map<std::string, std::string> model;
  std::mt19937_64 rng(7);
  int next_key = 0;
  auto put = [&](const std::string& k, const std::string& v) {
    auto r = table.Put(k, v);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    model[k] = v;
  };
  auto check_all = [&](const char* when) {
    for (const auto& [k, v] : model) {
      LookupResult l = Lookup1(*t, k);
      ASSERT_EQ(l.outcome, Lookup::kFound) << when << ": " << k;
      ASSERT_EQ(l.value, v) << when << ": " << k;
    }
  };
  // Each pair once in the array: a key the scan met twice (moved across
  // its cursor) and a mirror placed again would be there twice.
  auto entries_in_array = [&] {
    uint64_t entries = 0;
    table.ScanBuckets(
        0, table.num_buckets(),
        [&](std::string_view, std::string_view, uint64_t) { ++entries; });
    return entries;
  };
  while (!table.growing()) {
    ASSERT_EQ(table.growths(), 0u) << "grew at once, not in steps";
    ASSERT_NO_FATAL_FAILURE(
        put("key" + std::to_string(next_key++), std::string(32, 'a')));
  }
  EXPECT_EQ(table.num_buckets(), 1024u);
  ASSERT_NO_FATAL_FAILURE(check_all("at the start"));
  int writes_while_growing = 0;
  uint64_t deleted = 0;
  std::vector<std::string> gone;
  while (table.growing()) {
    ASSERT_EQ(table.growths(), 0u);
    ++writes_while_growing;
    const std::string k =
        "key" + std::to_string(rng() % uint64_t(next_key + 1));
    switch (rng() % 5) {
      case 0:  // a new key
        ASSERT_NO_FATAL_FAILURE(
            put("key" + std::to_string(next_key++), std::string(32, 'n')));
        break;
      case 1:  // an extent
        ASSERT_NO_FATAL_FAILURE(put(k, std::string(300 + rng() % 200, 'x')));
        break;
      case 2:  // inline again
        ASSERT_NO_FATAL_FAILURE(put(k, std::string(1 + rng() % 60, 'i')));
        break;
      default:
        if (model.count(k) != 0) {
          ASSERT_TRUE(table.Delete(k).ok());
          model.erase(k);
          gone.push_back(k);
          ++deleted;
        } else {
          ASSERT_NO_FATAL_FAILURE(put(k, "back"));
        }
        break;
    }
    // As a server's event loop does at each pass. (These writes take
    // about as much room as they give back: paced by the room alone, the
    // growth would wait for more.)
    if (writes_while_growing % 4 == 0) table.GrowStep(8);
    if (writes_while_growing % 64 == 0) {
      ASSERT_TRUE(table.FillRecordMatches());
      ASSERT_NO_FATAL_FAILURE(check_all("while growing"));
    }
    ASSERT_LT(writes_while_growing, 100000) << "the growth never ended";
  }
  // 6 x 1024 steps, 2 per write: it spans thousands of writes.
  EXPECT_GT(writes_while_growing, 1000);
  EXPECT_GT(deleted, 0u);
  EXPECT_EQ(table.growths(), 1u);
  EXPECT_EQ(table.num_buckets(), 2048u);
  EXPECT_EQ(table.size(), model.size());
  EXPECT_TRUE(table.FillRecordMatches());
  ASSERT_NO_FATAL_FAILURE(check_all("after"));
  EXPECT_EQ(entries_in_array(), model.size());
  for (const std::string& k : gone) {
    if (model.count(k) == 0) {
      EXPECT_EQ(Lookup1(*t, k).outcome, Lookup::kNotFound) << k;
      EXPECT_EQ(table.Get(k).status().code(), StatusCode::kNotFound) << k;
    }
  }
  // Paced by the writes alone (no GrowStep): new pairs of 64-byte entries
  // until the next growth ends. It must end by the time they took half the
  // room the old array had left when it started (10% of 2048 x 448 bytes:
  // 91,750 bytes, half of it 716 entries), and not at once.
  while (!table.growing()) {
    ASSERT_NO_FATAL_FAILURE(
        put("key" + std::to_string(next_key++), std::string(32, 'a')));
  }
  int inserts_while_growing = 0;
  while (table.growing()) {
    ++inserts_while_growing;
    ASSERT_NO_FATAL_FAILURE(
        put("key" + std::to_string(next_key++), std::string(32, 'a')));
    ASSERT_LT(inserts_while_growing, 100000) << "the growth never ended";
  }
  EXPECT_GT(inserts_while_growing, 100);
  EXPECT_LE(inserts_while_growing, 720);
  EXPECT_EQ(table.num_buckets(), 4096u);
  ASSERT_NO_FATAL_FAILURE(check_all("after the second"));
  EXPECT_EQ(entries_in_array(), model.size());
}

// A growth in steps ends at once when the old array has no room left for a
// write before it is done: the write is stored, not refused.
TEST(HashTable, AWriteThatFindsNoRoomFinishesTheGrowthInSteps) {
  TableOptions o;
  o.initial_buckets = 256;
  o.grow_pacing = 0;  // the growth waits for GrowStep
  auto made = LocalTable::Create(o, 64 << 20);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  LocalTable* t = made->get();
  Table& table = t->table();
  int n = 0;
  while (!table.growing()) {
    ASSERT_TRUE(table.Put("k" + std::to_string(n++), "v").ok());
  }
  // Part of it: the new array formatted (512 steps) and part of the old
  // one scanned, so that the writes below are mirrored.
  EXPECT_EQ(table.GrowStep(512 + 100), 612u);
  EXPECT_TRUE(table.growing());
  // No more steps: the old array fills, and the write that finds no room
  // in it finishes the growth.
  int during = 0;
  while (table.growing()) {
    auto r = table.Put("big" + std::to_string(during++), std::string(90, 'b'));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_LT(during, 100000) << "the growth never ended";
  }
  EXPECT_EQ(table.growths(), 1u);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(Lookup1(*t, "k" + std::to_string(i)).outcome, Lookup::kFound);
  }
  for (int i = 0; i < during; ++i) {
    ASSERT_EQ(Lookup1(*t, "big" + std::to_string(i)).value,
              std::string(90, 'b'));
  }
  EXPECT_TRUE(table.FillRecordMatches());
}

// Lookups that share one extent buffer, as a client's synchronous gets do
// (Lookup::set_extent_buffer): each answers its own key's value whatever
// the buffer held before (a larger extent, a smaller one, an absent key),
// and the buffer keeps its capacity.
TEST(HashTable, LookupsSharingAnExtentBufferAnswerTheirOwnValues) {
  auto t_table = NewTable(64, 64 << 20);
  ASSERT_NE(t_table, nullptr);
  LocalTable& t = *t_table;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"big", std::string(512 << 10, 'b')},
      {"small", std::string(300, 's')},
      {"inline", "i"},
      {"bigger", std::string(700 << 10, 'B')},
      {"medium", std::string(20 << 10, 'm')},
  };
  for (const auto& [k, v] : pairs) ASSERT_TRUE(t.table().Put(k, v).ok()) << k;
  auto g = t.ReadGeometry();
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ReadFn read = t.Reader();
  std::vector<uint8_t> buffer;
  std::string value;
  auto get = [&](std::string_view key) {
    Lookup l(*g, key, ReadMode::kHeaderThenEntries, &value);
    l.set_extent_buffer(&buffer);
    ReadRequest req;
    while (l.Next(&req)) {
      EXPECT_TRUE(read(req.region, req.offset, req.dst, req.len).ok());
    }
    return l.outcome();
  };
  for (int round = 0; round < 2; ++round) {
    for (const auto& [k, v] : pairs) {
      ASSERT_EQ(get(k), Lookup::kFound) << k;
      EXPECT_EQ(value, v) << k;
      ASSERT_EQ(get("absent"), Lookup::kNotFound);
    }
  }
  EXPECT_GE(buffer.capacity(), size_t{700} << 10);
}

// A reader's steps interleaved by hand with a cuckoo move: key K sits in its
// second bucket; the reader reads K's first bucket; an insert then moves K
// from its second bucket to its first; the reader reads the second bucket.
// Without the re-read of the first bucket the reader would answer "not
// found" for a key that was present throughout. The same moves also make a
// torn copy of the first bucket's header by hand: the version after the
// move with the index from before it (a copy has no byte order). Only the
// header's checksum can refuse it: its index hides K, and the re-read then
// finds the same version.
TEST(HashTable, AMoveBehindAReaderNeverHidesAKey) {
  // A nearly full table without growth, churned (delete one key, insert
  // another) so that inserts keep moving entries between buckets.
  auto s_table = NewTable(64, 64 << 20, /*grow=*/false);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  const std::string value(32, 'v');
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 420; ++i) {
    keys.push_back("key" + std::to_string(i));
    ASSERT_TRUE(s.table().Put(keys.back(), value).ok());
  }
  const Geometry g = s.table().geometry();
  const uint64_t mask = g.num_buckets - 1;
  auto primary = [&](const std::string& k) {
    return PrimaryBucket(HashKey(k, g.seed), mask);
  };
  std::mt19937_64 rng(9);
  int scenarios = 0;
  for (int x = 0; x < 20000 && scenarios < 20; ++x) {
    // Every key now in its second bucket starts a lookup and reads its
    // first bucket.
    struct Pending {
      std::unique_ptr<std::string> key;  // the lookup keeps a view of it
      std::unique_ptr<Lookup> lookup;
      ReadRequest req;
      Bucket first_before;  // the first bucket's header line, before
    };
    std::vector<Pending> pending;
    std::vector<size_t> in_first;  // candidates to delete
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string& k = keys[i];
      auto at = s.table().BucketOf(k);
      ASSERT_TRUE(at.has_value()) << k;
      if (*at == primary(k)) {
        in_first.push_back(i);
        continue;
      }
      Pending p{std::make_unique<std::string>(k), nullptr, {}, {}};
      ASSERT_TRUE(s.Reader()(g.region,
                             g.buckets_offset + primary(k) * kBucketBytes,
                             &p.first_before, kBucketHeaderBytes)
                      .ok());
      p.lookup = std::make_unique<Lookup>(g, *p.key, ReadMode::kWholeBuckets);
      ASSERT_TRUE(p.lookup->Next(&p.req));
      ASSERT_TRUE(
          s.Reader()(p.req.region, p.req.offset, p.req.dst, p.req.len).ok());
      ASSERT_TRUE(p.lookup->Next(&p.req));  // wants the second bucket
      pending.push_back(std::move(p));
    }
    // Churn: a key in its first bucket goes (never one being looked up),
    // a new one comes, perhaps moving others.
    ASSERT_FALSE(in_first.empty());
    const size_t victim = in_first[rng() % in_first.size()];
    ASSERT_TRUE(s.table().Delete(keys[victim]).ok());
    keys[victim] = "new" + std::to_string(x);
    ASSERT_TRUE(s.table().Put(keys[victim], value).ok());
    for (Pending& p : pending) {
      if (s.table().BucketOf(*p.key) != primary(*p.key)) continue;
      ++scenarios;  // moved from its second bucket to its first
      do {
        ASSERT_TRUE(
            s.Reader()(p.req.region, p.req.offset, p.req.dst, p.req.len).ok());
      } while (p.lookup->Next(&p.req));
      EXPECT_NE(p.lookup->outcome(), Lookup::kNotFound)
          << *p.key << " was present throughout";
      // The torn header: the version of now, the index and checksum of
      // before. Every other read is of the table as it is.
      const uint64_t first_offset =
          g.buckets_offset + primary(*p.key) * kBucketBytes;
      Bucket now{};
      ASSERT_TRUE(
          s.Reader()(g.region, first_offset, &now, kBucketHeaderBytes).ok());
      Bucket torn = p.first_before;
      torn.version = now.version;
      for (ReadMode mode :
           {ReadMode::kHeaderThenEntries, ReadMode::kWholeBuckets}) {
        Lookup l(g, *p.key, mode);
        ReadRequest req;
        bool first = true;
        while (l.Next(&req)) {
          ASSERT_TRUE(
              s.Reader()(req.region, req.offset, req.dst, req.len).ok());
          if (first) std::memcpy(req.dst, &torn, kBucketHeaderBytes);
          first = false;
        }
        EXPECT_NE(l.outcome(), Lookup::kNotFound)
            << *p.key << ": a torn header hid it";
      }
    }
  }
  EXPECT_GT(scenarios, 0) << "no insert moved a key into its first bucket";
}

// A copy of an entry torn between two publishes (its first bytes from one,
// the rest from the next: a copy has no byte order) is refused, in both
// read modes, though its head, lengths and key all look right: only the
// entry's checksum, seeded with the header's version, can tell.
TEST(HashTable, ATornEntryCopyIsRefused) {
  auto s_table = NewTable(16, 1 << 20, /*grow=*/false);
  ASSERT_NE(s_table, nullptr);
  LocalTable& s = *s_table;
  const std::string key = "torn-key", a(32, 'a'), b(32, 'b');
  ASSERT_TRUE(s.table().Put(key, a).ok());
  const Geometry g = s.table().geometry();
  const auto at = s.table().BucketOf(key);
  ASSERT_TRUE(at.has_value());
  const uint64_t bucket_offset = g.buckets_offset + *at * kBucketBytes;
  Bucket before, after;
  ASSERT_TRUE(s.Reader()(g.region, bucket_offset, &before, kBucketBytes).ok());
  ASSERT_TRUE(s.table().Put(key, b).ok());
  ASSERT_TRUE(s.Reader()(g.region, bucket_offset, &after, kBucketBytes).ok());
  // The key is the bucket's only entry, at the start of the area in both.
  ASSERT_EQ(before.index[0].offset_words, 0);
  ASSERT_EQ(after.index[0].offset_words, 0);
  // Reads of that bucket see `before` up to the middle of the value and
  // `after` from there on; every other read sees the table as it is.
  const uint64_t tear = bucket_offset + kBucketHeaderBytes + 40;
  auto read = [&](uint16_t region, uint64_t off, void* dst, size_t len) {
    REMEM_RETURN_IF_ERROR(s.Reader()(region, off, dst, len));
    auto* d = static_cast<uint8_t*>(dst);
    for (size_t i = 0; i < len; ++i) {
      const uint64_t x = off + i;
      if (x < bucket_offset || x >= bucket_offset + kBucketBytes) continue;
      const auto* from = reinterpret_cast<const uint8_t*>(
          x < tear ? static_cast<const void*>(&before)
                   : static_cast<const void*>(&after));
      d[i] = from[x - bucket_offset];
    }
    return Status::OK();
  };
  for (ReadMode mode :
       {ReadMode::kHeaderThenEntries, ReadMode::kWholeBuckets}) {
    auto r = LookupOnce(g, key, read, mode);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->outcome, Lookup::kRetry)
        << "a torn entry was accepted: '" << r->value << "'";
  }
}

// Reads per lookup and memory per pair at fixed occupancies, for inline
// pairs (16 B keys, 32 B values: 6 per bucket) and extent pairs (16 B keys,
// 200 B values: 11 references per bucket), 8 K buckets without growth.
// Reads are whole-bucket reads (ReadMode::kWholeBuckets: what a reader
// over a network pays in round trips).
// The figures are the ones docs/BENCHMARKS.md ("Reads per lookup and memory
// per pair") and docs/ARCHITECTURE.md quote: the table is deterministic (its
// seed, the keys and the probes are fixed), so a change to the layout or the
// cuckoo policy that moves them fails here until the docs are updated.
TEST(HashTable, ReadsPerLookupAtOccupancyAreTheDocumentedOnes) {
  struct Expected {
    double occupancy;
    double reads_per_hit;
    double one_read_percent;
    double reads_per_miss;
    double bytes_per_pair;
  };
  struct Case {
    const char* name;
    size_t value_len;
    uint64_t per_bucket;
    std::vector<Expected> expected;
  };
  // docs/BENCHMARKS.md, rounded as printed there.
  const Case cases[] = {
      {"inline 16/32",
       32,
       kEntryAreaBytes / InlineEntryBytes(16, 32),
       {{0.50, 1.016, 98.4, 3.000, 170.7},
        {0.75, 1.081, 91.9, 3.000, 113.8},
        {0.90, 1.163, 83.7, 3.000, 94.8},
        {0.95, 1.205, 79.5, 3.000, 89.8}}},
      {"extent 16/200",
       200,
       kEntryAreaBytes / kExtentEntryBytes,
       {{0.50, 2.003, 0.0, 3.000, 349.1},
        {0.75, 2.040, 0.0, 3.000, 318.1},
        {0.90, 2.099, 0.0, 3.000, 307.7},
        {0.95, 2.132, 0.0, 3.000, 305.0}}},
  };
  for (const Case& c : cases) {
    const uint64_t buckets = 1 << 13;
    auto s_table = NewTable(buckets, 512 << 20, /*grow=*/false);
    ASSERT_NE(s_table, nullptr);
    LocalTable& s = *s_table;
    const uint64_t capacity = buckets * c.per_bucket;
    const std::string value(c.value_len, 'v');
    auto key = [](uint64_t i) {
      std::string k = "user" + std::to_string(i);
      k.resize(16, '.');
      return k;
    };
    uint64_t inserted = 0;
    for (const Expected& e : c.expected) {
      SCOPED_TRACE(std::string(c.name) + " at " +
                   std::to_string(int(e.occupancy * 100)) + "%");
      while (inserted < uint64_t(e.occupancy * double(capacity))) {
        const Status st = s.table().Put(key(inserted), value).status();
        ASSERT_TRUE(st.ok())
            << "full at occupancy " << double(inserted) / double(capacity)
            << ": " << st.ToString();
        ++inserted;
      }
      uint64_t reads_hit = 0, reads_miss = 0, one_read = 0;
      const int kProbe = 20000;
      for (int i = 0; i < kProbe; ++i) {
        LookupResult hit = Lookup1(s, key(uint64_t(i) * 7919 % inserted),
                                   ReadMode::kWholeBuckets);
        ASSERT_EQ(hit.outcome, Lookup::kFound);
        reads_hit += uint64_t(hit.reads);
        one_read += hit.reads == 1;
        LookupResult miss =
            Lookup1(s, "absent" + std::to_string(i), ReadMode::kWholeBuckets);
        ASSERT_EQ(miss.outcome, Lookup::kNotFound);
        reads_miss += uint64_t(miss.reads);
      }
      const double per_hit = double(reads_hit) / kProbe;
      const double per_miss = double(reads_miss) / kProbe;
      const double one_read_percent = 100.0 * double(one_read) / kProbe;
      const double per_pair =
          (double(s.slab().bytes_in_use()) + double(buckets * kBucketBytes)) /
          double(inserted);
      std::printf(
          "%s occupancy %.2f: %.3f reads per hit, %.3f per miss, %.1f%% of "
          "hits in one read, %llu cuckoo moves so far; %.1f bytes per pair "
          "for %zu bytes of key+value (%.0f%% utilization)\n",
          c.name, double(inserted) / double(capacity), per_hit, per_miss,
          one_read_percent, static_cast<unsigned long long>(s.table().moves()),
          per_pair, 16 + c.value_len,
          100.0 * double(16 + c.value_len) / per_pair);
      // The docs print 3 decimals of reads and 1 of percent and bytes.
      EXPECT_NEAR(per_hit, e.reads_per_hit, 0.0015);
      EXPECT_NEAR(per_miss, e.reads_per_miss, 0.0015);
      EXPECT_NEAR(one_read_percent, e.one_read_percent, 0.15);
      EXPECT_NEAR(per_pair, e.bytes_per_pair, 0.15);
      // What the layout promises whatever the figures: a miss reads both
      // buckets and re-reads the first; a hit reads at most both buckets
      // (and an extent).
      EXPECT_GE(per_miss, 3.0);
      EXPECT_LE(per_hit, c.value_len == 32 ? 2.0 : 3.0);
    }
  }
}

// One writer thread (the partition owner) rewrites, deletes and re-inserts a
// few hot keys with values of many sizes while reader threads look them up
// with verified copies (one of them pausing mid-copy), through the race
// workload (testing/race.h). The table starts small and most of the way
// full, and filler keys churn, so the race covers cuckoo moves, growth and
// extent reuse from the first writes on. Every value read must be well
// formed, and each key's history linearizable.
TEST(HashTable, ConcurrentReadersSeeOnlyLinearizableValues) {
  auto table = NewTable(16, 256 << 20);
  ASSERT_NE(table, nullptr);
  testing::LocalTableKv store(table.get());
  testing::RaceOptions o;
  o.keys = 4;
  o.readers = 2;
  o.min_duration = std::chrono::seconds(2);
  o.min_writes = 2000;
  o.max_duration = std::chrono::seconds(60);
  o.large_min = 1000;
  o.grow_every = 8;
  o.prefill = 40;
  o.churn_keys = 260;
  // (Its 20,000 writes took 0.3 s beside two cluster tests in CI, while
  // the readers made 953 reads.)
  o.min_reads = 1001;
  auto report = testing::RunRace(&store, o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto counters = store.Counters();
  ASSERT_TRUE(counters.ok());
  std::printf("%s; %lld moves, %lld growths\n", report->Summary().c_str(),
              static_cast<long long>(counters->moves),
              static_cast<long long>(counters->growths));
  EXPECT_TRUE(report->Verdict().ok()) << report->Verdict().ToString();
  EXPECT_GT(report->reads, 1000u);
  EXPECT_GT(report->size_switches, 0u) << "no value moved inline <-> extent";
  EXPECT_GT(counters->moves, 0) << "the race should cover cuckoo moves";
  EXPECT_GT(counters->growths, 0) << "the race should cover growth";
}

ServingMark MakeMark(uint64_t serving, uint64_t replicated) {
  return {serving, MarkCheck(serving, kServingHalf), replicated,
          MarkCheck(replicated, kReplicatedHalf)};
}

TEST(ServingMark, AReaderTrustsAPairOnlyIfTheMarkCoversItsEpochAndVersion) {
  // Installed epoch 9, leading the same shards since epoch 5; pairs up to
  // version 100 on the backups.
  const ServingMark m = MakeMark(ServingWord(9, 5), 100);
  EXPECT_EQ(JudgeServingMark(m, 5, 100), MarkVerdict::kTrusted);
  EXPECT_EQ(JudgeServingMark(m, 9, 1), MarkVerdict::kTrusted);
  // Not on the backups yet: the server answers once it is.
  EXPECT_EQ(JudgeServingMark(m, 9, 101), MarkVerdict::kAskServer);
  // The reader's configuration is newer than the server's.
  EXPECT_EQ(JudgeServingMark(m, 10, 1), MarkVerdict::kAskServer);
  // The server's leadership changed after the reader's configuration.
  EXPECT_EQ(JudgeServingMark(m, 4, 1), MarkVerdict::kStale);
  // The reader's configuration names another incarnation of the server.
  EXPECT_EQ(JudgeServingMark(m, 0, 1), MarkVerdict::kStale);
  // Nothing vouched for (a hand-over, no configuration).
  EXPECT_EQ(JudgeServingMark(MakeMark(0, 100), 9, 1), MarkVerdict::kAskServer);
  // A copy torn between two publishes of either half verifies never.
  ServingMark torn = m;
  torn.replicated = 101;
  EXPECT_EQ(JudgeServingMark(torn, 9, 1), MarkVerdict::kTorn);
  torn = m;
  torn.serving = ServingWord(10, 5);
  EXPECT_EQ(JudgeServingMark(torn, 9, 1), MarkVerdict::kTorn);
  // Zeroed memory is no mark.
  EXPECT_EQ(JudgeServingMark(ServingMark{}, 9, 1), MarkVerdict::kTorn);
}

}  // namespace
}  // namespace remem::hash
