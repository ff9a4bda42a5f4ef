// Unit tests of the durability layer: the record format, the Env (file
// modes, the lock, injected write and read faults), the log writer under
// injected faults (short writes, ENOSPC, EIO), and PartitionStore's
// recovery (snapshot + log, torn tail, corruption, generations and
// fallback, a full table restored into the same memory) and snapshots
// taken while writes go on.

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "durability/env.h"
#include "durability/log.h"
#include "durability/snapshot.h"
#include "durability/store.h"
#include "hash/durable.h"
#include "hash/slab.h"
#include "hash/table.h"
#include "testing/scale.h"

namespace remem::durability {
namespace {

// A store "killed": never destroyed (no clean stop runs), and kept
// reachable, so LeakSanitizer does not take the simulated crash for a
// leak.
void Abandon(std::unique_ptr<PartitionStore> store) {
  static auto* abandoned = new std::vector<std::unique_ptr<PartitionStore>>;
  abandoned->push_back(std::move(store));
}

namespace fs = std::filesystem;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "remem-dur-XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A table in plain memory.
class Mem {
 public:
  explicit Mem(uint64_t arena = 32 << 20, uint64_t initial_buckets = 4)
      : mem_(4096 + arena + 64), slab_(Base() + 4096, arena, 4096) {
    hash::TableOptions o;
    o.initial_buckets = initial_buckets;  // 4: snapshots meet growth
    auto t = hash::Table::Create(Base(), 1, &slab_, o);
    EXPECT_TRUE(t.ok());
    table = std::move(*t);
  }
  uint8_t* Base() {
    return reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(mem_.data()) + 63) & ~uintptr_t{63});
  }

 private:
  std::vector<uint8_t> mem_;

 public:
  hash::SlabAllocator slab_;
  std::unique_ptr<hash::Table> table;  // destroyed before its memory
  // The table as the durability layer sees it.
  hash::DurableTable* durable() {
    if (!durable_) durable_ = std::make_unique<hash::DurableTable>(table.get());
    return durable_.get();
  }

 private:
  std::unique_ptr<hash::DurableTable> durable_;
};

TEST(Record, RoundTripAndChecksum) {
  std::string buf;
  EncodeRecord(&buf, RecordType::kPut, 7, 42, "key", "value");
  EncodeRecord(&buf, RecordType::kDelete, 8, 43, "key", "");
  Record r{};
  size_t n = 0;
  ASSERT_EQ(ParseRecord(buf, &r, &n), ParseOutcome::kOk);
  EXPECT_EQ(r.type, RecordType::kPut);
  EXPECT_EQ(r.lsn, 7u);
  EXPECT_EQ(r.version, 42u);
  EXPECT_EQ(r.key, "key");
  EXPECT_EQ(r.value, "value");
  ASSERT_EQ(ParseRecord(std::string_view(buf).substr(n), &r, &n),
            ParseOutcome::kOk);
  EXPECT_EQ(r.type, RecordType::kDelete);
  // Every flipped bit is caught; every cut is short.
  const std::string one = buf.substr(0, sizeof(RecordHeader) + 8);
  for (size_t i = 0; i < one.size() * 8; ++i) {
    std::string bad = one;
    bad[i / 8] = char(bad[i / 8] ^ (1 << (i % 8)));
    EXPECT_NE(ParseRecord(bad, &r, &n), ParseOutcome::kOk) << i;
  }
  for (size_t len = 0; len < one.size(); ++len) {
    EXPECT_NE(ParseRecord(one.substr(0, len), &r, &n), ParseOutcome::kOk);
  }
}

// Writes records through a faulty file; returns the file's content.
struct FaultRun {
  Status first_error;
  std::string content;
  uint64_t records_ok = 0;
};

FaultRun RunWithFault(const std::string& spec, bool heal_and_retry) {
  const std::string dir = TempDir();
  auto f = ParseFaultSpec(spec);
  EXPECT_TRUE(f.ok());
  FaultyEnv env(Env::Posix(), *f);
  auto file = env.NewWritableFile(dir + "/log");
  EXPECT_TRUE(file.ok());
  LogWriter log(std::move(*file), 1);
  FaultRun run;
  for (int i = 0; i < 100; ++i) {
    log.Append(RecordType::kPut, uint64_t(i + 1), "k" + std::to_string(i),
               std::string(20, 'v'));
    Status st = log.Flush(true);
    if (!st.ok()) {
      run.first_error = st;
      break;
    }
    ++run.records_ok;
  }
  if (heal_and_retry) {
    env.Heal();
    EXPECT_TRUE(log.Flush(true).ok());
  }
  run.content = ReadAll(dir + "/log");
  fs::remove_all(dir);
  return run;
}

// Parses `data` fully; returns the record count (-1 if anything is left).
int CountRecords(std::string_view data) {
  int n = 0;
  while (!data.empty()) {
    Record r{};
    size_t len = 0;
    if (ParseRecord(data, &r, &len) != ParseOutcome::kOk) return -1;
    data.remove_prefix(len);
    ++n;
  }
  return n;
}

TEST(LogFaults, ShortWriteLeavesOnlyWholeRecords) {
  FaultRun run = RunWithFault("short-after:1000", false);
  EXPECT_EQ(run.first_error.code(), StatusCode::kIOError);
  EXPECT_NE(run.first_error.message().find("No space"), std::string::npos)
      << run.first_error.ToString();
  EXPECT_GT(run.records_ok, 0u);
  // The half-written record was cut back: the file is whole records only.
  EXPECT_EQ(CountRecords(run.content), int(run.records_ok));
}

TEST(LogFaults, EnospcThenSpaceAgainRetriesTheBuffer) {
  FaultRun run = RunWithFault("enospc-after:2000", true);
  EXPECT_EQ(run.first_error.code(), StatusCode::kIOError);
  // The refused record stayed buffered and went out once space came back.
  EXPECT_EQ(CountRecords(run.content), int(run.records_ok) + 1);
}

TEST(LogFaults, EioFailsWritesAndSyncs) {
  FaultRun run = RunWithFault("eio-after:500", false);
  EXPECT_EQ(run.first_error.code(), StatusCode::kIOError);
  EXPECT_NE(run.first_error.message().find("Input/output"), std::string::npos)
      << run.first_error.ToString();
  EXPECT_EQ(CountRecords(run.content), int(run.records_ok));
  EXPECT_FALSE(ParseFaultSpec("bogus:1").ok());
  EXPECT_FALSE(ParseFaultSpec("eio-after").ok());
}

StoreOptions Options(const std::string& dir) {
  StoreOptions o;
  o.dir = dir;
  o.fsync = FsyncPolicy::kAlways;
  o.snapshot_log_bytes = 0;
  return o;
}

// Drives the store's passes until `done` (or a bound).
void Passes(PartitionStore& s, int n = 1) {
  for (int i = 0; i < n; ++i) s.OnPass();
}

// A state that builds densest from keys in order (as the tree): a map,
// recording the keys recovery applies, in the order it applies them.
class OrderedState : public Recoverable {
 public:
  std::map<std::string, std::pair<std::string, uint64_t>> pairs;
  std::vector<std::string> applied;  // keys, in the order applied
  uint64_t version = 0;

  bool AppliesInKeyOrder() const override { return true; }
  Status Reserve(uint64_t, uint64_t) override { return Status::OK(); }
  Status ApplyPut(std::string_view key, std::string_view value,
                  uint64_t v) override {
    applied.emplace_back(key);
    auto it = pairs.find(std::string(key));
    if (it == pairs.end() || it->second.second < v) {
      pairs[std::string(key)] = {std::string(value), v};
    }
    return Status::OK();
  }
  Status ApplyDelete(std::string_view key, uint64_t v) override {
    applied.emplace_back(key);
    auto it = pairs.find(std::string(key));
    if (it != pairs.end() && it->second.second < v) pairs.erase(it);
    return Status::OK();
  }
  void RaiseVersion(uint64_t v) override { version = std::max(version, v); }
  uint64_t last_version() const override { return version; }
  std::unique_ptr<SnapshotScan> BeginSnapshot() override {
    struct Walk : SnapshotScan {
      explicit Walk(const OrderedState* s) : s_(s) {}
      bool Step(SnapshotSink* sink, uint64_t) override {
        auto it = s_->pairs.upper_bound(last_);
        if (started_ == false) it = s_->pairs.begin();
        started_ = true;
        for (int n = 0; n < 3 && it != s_->pairs.end(); ++n, ++it) {
          sink->Add(it->first, it->second.first, it->second.second);
          last_ = it->first;
        }
        return it == s_->pairs.end();
      }
      uint64_t shape() const override { return 0; }
      const OrderedState* s_;
      std::string last_;
      bool started_ = false;
    };
    return std::make_unique<Walk>(this);
  }
  // The write path: the new version, logged.
  void Put(PartitionStore* s, const std::string& k, const std::string& v) {
    pairs[k] = {v, ++version};
    s->LogPut(k, v, version);
  }
  void Delete(PartitionStore* s, const std::string& k) {
    pairs.erase(k);
    s->LogDelete(k, ++version);
  }
};

// Recovery of such a state applies the log's last records merged by key
// into the snapshot's pairs: every key once, all in ascending (bytewise)
// order, puts and deletes, keys the snapshot also holds, keys with bytes
// over 0x7f; and with the log only (no snapshot), the same.
TEST(Store, AnOrderedStateRecoversInKeyOrder) {
  for (bool snapshot : {true, false}) {
    const std::string dir = TempDir();
    OrderedState live;
    {
      RecoveryReport rep;
      auto s = PartitionStore::Open(Options(dir), &live, &rep);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      for (int i = 0; i < 60; ++i) {
        live.Put(s->get(), "k" + std::to_string(i * 7 % 60), "snap");
      }
      live.Put(s->get(), "\xff\x01high", "snap");
      if (snapshot) {
        bool snapped = false;
        (*s)->RequestSnapshot([&](Status st) {
          EXPECT_TRUE(st.ok()) << st.ToString();
          snapped = true;
        });
        while (!snapped) Passes(**s);
      }
      // After the snapshot (in the log only): new keys between and around
      // the snapshot's, overwrites and deletes of its keys, a new key put
      // then deleted, a key deleted then put again.
      for (const char* k : {"k33x", "a", "k5", "zz", "\x80mid", "k1"}) {
        live.Put(s->get(), k, std::string("log-") + k);
      }
      live.Delete(s->get(), "k7");
      live.Delete(s->get(), "\xff\x01high");
      live.Put(s->get(), "gone", "x");
      live.Delete(s->get(), "gone");
      live.Delete(s->get(), "k8");
      live.Put(s->get(), "k8", "back");
      Passes(**s, 3);
    }
    OrderedState again;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), &again, &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(rep.snapshot.empty(), !snapshot);
    EXPECT_EQ(again.pairs, live.pairs) << "snapshot " << snapshot;
    EXPECT_TRUE(std::is_sorted(again.applied.begin(), again.applied.end()))
        << "snapshot " << snapshot;
    EXPECT_EQ(std::adjacent_find(again.applied.begin(), again.applied.end()),
              again.applied.end())
        << "a key applied twice";
    EXPECT_GE(again.version, live.version);
    fs::remove_all(dir);
  }
}

// The report counts the snapshot's pairs it applied and, apart, those
// whose keys the log after it wrote or deleted again (taken from the log):
// a snapshot of 10 pairs, 5 deleted and 2 rewritten since, is 3 + 7, not
// "3 pairs from snapshots" alone.
TEST(Store, RecoveryCountsTheSnapshotPairsTheLogSuperseded) {
  const std::string dir = TempDir();
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 10; ++i) {
      const std::string k = "k" + std::to_string(i);
      auto ver = m.table->Put(k, "v");
      ASSERT_TRUE(ver.ok());
      (*s)->LogPut(k, "v", *ver);
    }
    bool snapped = false;
    (*s)->RequestSnapshot([&](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      snapped = true;
    });
    while (!snapped) Passes(**s);
    for (int i = 0; i < 5; ++i) {
      const std::string k = "k" + std::to_string(i);
      ASSERT_TRUE(m.table->Delete(k).ok());
      (*s)->LogDelete(k, m.table->last_version());
    }
    for (int i = 5; i < 7; ++i) {
      const std::string k = "k" + std::to_string(i);
      auto ver = m.table->Put(k, "w");
      ASSERT_TRUE(ver.ok());
      (*s)->LogPut(k, "w", *ver);
    }
    Passes(**s);
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(rep.snapshot.empty());
  EXPECT_EQ(rep.snapshot_pairs, 3u);
  EXPECT_EQ(rep.snapshot_superseded, 7u);
  EXPECT_EQ(rep.log_records, 7u);
  EXPECT_EQ(m.table->size(), 5u);
  fs::remove_all(dir);
}

TEST(Store, RecoversLogAndSnapshotIdempotently) {
  const std::string dir = TempDir();
  std::map<std::string, std::pair<std::string, uint64_t>> model;
  uint64_t last_version = 0;
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::mt19937 rng(1);
    bool snapped = false;
    for (int i = 0; i < 3000; ++i) {
      const std::string k = "key" + std::to_string(rng() % 500);
      if (rng() % 5 == 0) {
        if (m.table->Delete(k).ok()) {
          (*s)->LogDelete(k, m.table->last_version());
          model.erase(k);
        }
      } else {
        const std::string v(rng() % 100, char('a' + rng() % 26));
        auto ver = m.table->Put(k, v);
        ASSERT_TRUE(ver.ok());
        (*s)->LogPut(k, v, *ver);
        model[k] = {v, *ver};
      }
      if (i % 7 == 0) Passes(**s);
      if (i == 1500) {
        (*s)->RequestSnapshot([&](Status st) {
          EXPECT_TRUE(st.ok()) << st.ToString();
          snapped = true;
        });
      }
    }
    while (!snapped) Passes(**s);
    Passes(**s);
    last_version = m.table->last_version();
    EXPECT_EQ((*s)->stats().snapshots.load(), 1u);
  }
  for (int round = 0; round < 2; ++round) {  // recovering twice is the same
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(rep.snapshot.empty());
    EXPECT_GT(rep.snapshot_pairs, 0u);
    EXPECT_EQ(m.table->size(), model.size());
    for (const auto& [k, vv] : model) {
      auto got = m.table->Get(k);
      ASSERT_TRUE(got.ok()) << k;
      EXPECT_EQ(got->value, vv.first);
      EXPECT_EQ(got->version, vv.second);
    }
    // New versions continue above every recovered one.
    auto v = m.table->Put("fresh" + std::to_string(round), "x");
    ASSERT_TRUE(v.ok());
    EXPECT_GT(*v, last_version);
    last_version = *v;
    (*s)->LogPut("fresh" + std::to_string(round), "x", *v);
    Passes(**s);
    model["fresh" + std::to_string(round)] = {"x", *v};
  }
  fs::remove_all(dir);
}

// The newest log file of `dir`.
std::string LastLog(const std::string& dir) {
  std::string last;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().string();
    if (n.ends_with(".rlog") && fs::file_size(n) > 0 && n > last) last = n;
  }
  return last;
}

// Writes `n` puts through a store in `dir`, then closes it.
void WritePuts(const std::string& dir, int n) {
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < n; ++i) {
    const std::string k = "k" + std::to_string(i);
    auto v = m.table->Put(k, "value");
    (*s)->LogPut(k, "value", *v);
    Passes(**s);
  }
}

// A shard that moved away and came back: its key's put, the delete that
// released it (a newer version), then the pair re-imported at its older
// version, and more after it. The log's order is the state: recovery
// brings the pair back, with and without a snapshot before the move.
// (Recovery took each key's highest version: the release's delete won,
// and every key of a shard that had come back was lost at the restart.)
TEST(Store, AKeyWhoseVersionGoesBackAlongTheLogEndsAsTheLogSays) {
  for (const bool snapshot_first : {false, true}) {
    const std::string dir = TempDir();
    {
      Mem m;
      RecoveryReport rep;
      auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      auto v10 = m.table->Put("moved", "v");
      ASSERT_TRUE(v10.ok());
      (*s)->LogPut("moved", "v", *v10);
      ASSERT_TRUE(m.table->Put("gone", "g").ok());
      (*s)->LogPut("gone", "g", m.table->last_version());
      Passes(**s);
      if (snapshot_first) {
        bool snapped = false;
        (*s)->RequestSnapshot([&](Status st) {
          EXPECT_TRUE(st.ok()) << st.ToString();
          snapped = true;
        });
        while (!snapped) Passes(**s);
      }
      // Released: both deleted, each delete with a version of its own.
      for (const char* k : {"moved", "gone"}) {
        ASSERT_TRUE(m.table->Delete(k).ok());
        (*s)->LogDelete(k, m.table->last_version());
      }
      // Back: "moved" re-imported at its old version; "gone" stays gone.
      auto back = m.table->Import("moved", "v", *v10);
      ASSERT_TRUE(back.ok());
      ASSERT_EQ(*back, *v10);
      (*s)->LogPut("moved", "v", *v10);
      Passes(**s);
    }
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto got = m.table->Get("moved");
    ASSERT_TRUE(got.ok()) << "snapshot first: " << snapshot_first << ": "
                          << got.status().ToString();
    EXPECT_EQ(got->value, "v");
    EXPECT_EQ(m.table->Get("gone").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(m.table->size(), 1u);
    s->reset();
    fs::remove_all(dir);
  }
}

TEST(Store, TornTailIsTruncated) {
  const std::string dir = TempDir();
  WritePuts(dir, 10);
  const std::string log = LastLog(dir);
  const auto size = fs::file_size(log);
  fs::resize_file(log, size - 5);  // the last record cut short
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(m.table->size(), 9u);
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find(log + ".torn"), std::string::npos)
      << rep.warnings[0];
  EXPECT_GT(rep.truncated_bytes, 0u);
  // The bytes cut off are kept beside the log (damage to a whole last
  // record looks like a torn write; a post-mortem can tell them apart), and
  // the log ends where they began.
  EXPECT_EQ(fs::file_size(log) + fs::file_size(log + ".torn"), size - 5);
  EXPECT_EQ(rep.truncated_bytes, fs::file_size(log + ".torn"));
  s->reset();
  // A second start takes the kept bytes for what they are, not a log.
  Mem again;
  RecoveryReport rep2;
  auto s2 = PartitionStore::Open(Options(dir), again.durable(), &rep2);
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  EXPECT_EQ(again.table->size(), 9u);
  EXPECT_TRUE(rep2.warnings.empty());
  EXPECT_TRUE(fs::exists(log + ".torn"));
  s2->reset();
  fs::remove_all(dir);
}

// A transaction's records are one atomic group: cut short by the end of
// the log (a crash inside the write), none of it is applied, and the log
// goes on from the group's first LSN (a second restart finds no gap).
TEST(Store, AnAtomicGroupCutShortIsNotAppliedAtAll) {
  const std::string dir = TempDir();
  auto put_group = [](Mem& m, PartitionStore& s,
                      std::initializer_list<const char*> keys) {
    size_t left = keys.size();
    for (const char* k : keys) {
      auto v = m.table->Put(k, "value");
      ASSERT_TRUE(v.ok());
      s.LogPut(k, "value", *v, --left > 0);
    }
    Passes(s);
  };
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    put_group(m, **s, {"a", "b", "c"});
    put_group(m, **s, {"x", "y", "z"});
  }
  const std::string log = LastLog(dir);
  fs::resize_file(log, fs::file_size(log) - 5);  // "z" cut short
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(m.table->size(), 3u);
    for (const char* k : {"a", "b", "c"})
      EXPECT_TRUE(m.table->Get(k).ok()) << k;
    for (const char* k : {"x", "y"}) {
      EXPECT_EQ(m.table->Get(k).status().code(), StatusCode::kNotFound) << k;
    }
    EXPECT_EQ(rep.last_lsn, 3u);
    EXPECT_EQ(rep.log_records, 3u);
    ASSERT_EQ(rep.warnings.size(), 1u);
    EXPECT_NE(rep.warnings[0].find("its 2 whole records"), std::string::npos)
        << rep.warnings[0];
    put_group(m, **s, {"after"});
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(m.table->size(), 4u);
  EXPECT_TRUE(m.table->Get("after").ok());
  EXPECT_TRUE(rep.warnings.empty());
  fs::remove_all(dir);
}

TEST(Store, CorruptionInTheMiddleRefusesUnlessTruncating) {
  const std::string dir = TempDir();
  WritePuts(dir, 10);
  const std::string log = LastLog(dir);
  constexpr size_t kRec = sizeof(RecordHeader) + 2 + 5;  // "kN", "value"
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3 * kRec + 45);  // inside the 4th record's payload
    f.put('!');
  }
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
    EXPECT_NE(s.status().message().find(log), std::string::npos);
    EXPECT_NE(s.status().message().find("offset " + std::to_string(3 * kRec)),
              std::string::npos)
        << s.status().ToString();
  }
  Mem m;
  RecoveryReport rep;
  StoreOptions o = Options(dir);
  o.recovery = RecoveryMode::kTruncate;
  auto s = PartitionStore::Open(o, m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(m.table->size(), 3u);
  // It says what it dropped: LSN 4..10, from that byte offset.
  ASSERT_EQ(rep.lost.size(), 1u);
  EXPECT_EQ(rep.lost_records, 7u);
  EXPECT_NE(rep.lost[0].find("LSN 4..10 (7 records)"), std::string::npos)
      << rep.lost[0];
  EXPECT_NE(rep.lost[0].find("offset " + std::to_string(3 * kRec)),
            std::string::npos)
      << rep.lost[0];
  EXPECT_EQ(rep.last_lsn, 3u);
  // The dropped bytes are kept beside the log.
  EXPECT_TRUE(fs::exists(log + ".dropped"));
  fs::remove_all(dir);
}

TEST(Store, DiskErrorsRefuseWritesUntilTheDiskRecovers) {
  const std::string dir = TempDir();
  Mem m;
  RecoveryReport rep;
  StoreOptions o = Options(dir);
  o.fault = "enospc-after:300";
  auto s = PartitionStore::Open(o, m.durable(), &rep);
  ASSERT_TRUE(s.ok());
  int acked = 0, failed = 0;
  for (int i = 0; i < 20; ++i) {
    if (!(*s)->Writable().ok()) {
      ++failed;
      continue;
    }
    const std::string k = "k" + std::to_string(i);
    auto v = m.table->Put(k, "value");
    (*s)->LogPut(k, "value", *v);
    Status result = Status::Internal("no answer");
    (*s)->AfterDurable([&](Status st) { result = st; });
    Passes(**s);
    if (result.ok()) {
      ++acked;
    } else {
      EXPECT_EQ(result.code(), StatusCode::kIOError);
      EXPECT_NE(result.message().find("No space"), std::string::npos);
      ++failed;
    }
  }
  EXPECT_GT(acked, 0);
  EXPECT_GT(failed, 0);
  EXPECT_EQ((*s)->stats().failing.load(), 1u);
  EXPECT_GE((*s)->stats().write_errors.load(), 1u);
  s->reset();
  // What was acknowledged is on disk, whole.
  Mem m2;
  auto s2 = PartitionStore::Open(Options(dir), m2.durable(), &rep);
  ASSERT_TRUE(s2.ok()) << s2.status().ToString();
  for (int i = 0; i < acked; ++i) {
    EXPECT_TRUE(m2.table->Get("k" + std::to_string(i)).ok()) << i;
  }
  fs::remove_all(dir);
}

// A store on an Env whose disk fills after `bytes`, with a write that the
// full disk refused: its record is buffered, the store failing. Returns the
// refused key ("" if every write was taken).
std::string FillUntilAWriteFails(PartitionStore& s, Mem& m) {
  for (int i = 0; i < 100; ++i) {
    if (!s.Writable().ok()) break;
    const std::string k = "key-" + std::to_string(i) + "-of-the-log";
    auto v = m.table->Put(k, "value");
    if (!v.ok()) {
      ADD_FAILURE() << v.status().ToString();
      return "";
    }
    s.LogPut(k, "value", *v);
    Status result = Status::Internal("no answer");
    s.AfterDurable([&](Status st) { result = st; });
    Passes(s);
    if (!result.ok()) {
      EXPECT_EQ(result.code(), StatusCode::kIOError) << result.ToString();
      return k;
    }
  }
  return "";
}

// The bytes of every log file in `dir`.
std::string LogBytes(const std::string& dir) {
  std::string all;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".rlog") all += ReadAll(e.path().string());
  }
  return all;
}

// A record that the full disk refused reaches it by itself once the disk
// has room again: the store retries every 100 ms with no further write
// (only a write retried, so an idle partition kept the record buffered and
// a clean stop dropped it), and the record survives a restart.
TEST(Store, ARefusedRecordReachesTheDiskOnceItHasRoomWithoutAnotherWrite) {
  const std::string dir = TempDir();
  std::string refused;
  auto spec = ParseFaultSpec("enospc-after:300");
  ASSERT_TRUE(spec.ok());
  FaultyEnv env(Env::Posix(), *spec);
  StoreOptions o = Options(dir);
  o.env = &env;
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(o, m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    refused = FillUntilAWriteFails(**s, m);
    ASSERT_FALSE(refused.empty());
    ASSERT_EQ((*s)->stats().failing.load(), 1u);
    ASSERT_TRUE((*s)->retry_at().has_value());
    EXPECT_EQ(LogBytes(dir).find(refused), std::string::npos);
    env.Heal();
    // Passes only (an idle event loop's), each when the store asks for it.
    for (int i = 0; i < 5 && (*s)->stats().failing.load() != 0; ++i) {
      auto at = (*s)->retry_at();
      ASSERT_TRUE(at.has_value());
      std::this_thread::sleep_until(*at);
      Passes(**s);
    }
    EXPECT_EQ((*s)->stats().failing.load(), 0u);
    EXPECT_FALSE((*s)->retry_at().has_value());
    EXPECT_NE(LogBytes(dir).find(refused), std::string::npos)
        << "the refused record is not on disk before the stop";
    EXPECT_TRUE((*s)->Writable().ok());
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(m.table->Get(refused).ok()) << refused;
  fs::remove_all(dir);
}

// A clean stop writes a failing log's buffered records if the disk takes
// them then (it skipped a failing log, and they were lost).
TEST(Store, AStopWritesTheRefusedRecordsIfTheDiskTakesThemThen) {
  const std::string dir = TempDir();
  auto spec = ParseFaultSpec("enospc-after:300");
  ASSERT_TRUE(spec.ok());
  FaultyEnv env(Env::Posix(), *spec);
  StoreOptions o = Options(dir);
  o.env = &env;
  std::string refused;
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(o, m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    refused = FillUntilAWriteFails(**s, m);
    ASSERT_FALSE(refused.empty());
    ASSERT_EQ((*s)->stats().failing.load(), 1u);
    env.Heal();  // and the store is destroyed with no pass in between
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(m.table->Get(refused).ok()) << refused;
  fs::remove_all(dir);
}

// A write applied in memory (and so read by clients, one-sided too) whose
// record never reached the log consumed a version: after the restart that
// lost it, the version is never handed out again, so a compare-and-put by
// a client that read the lost value is a Conflict, not a success against a
// value it never saw. Here the disk refused the record (IOError to the
// writer) and the store stopped with the disk still full; then a crash
// (no clean stop) after a write whose record was never written; then a
// crash of a run that logged nothing after its gap. A clean stop keeps
// versions contiguous. (Before, each restart continued from the highest
// version on disk: the lost versions were issued again.)
TEST(Store, VersionsALostWriteConsumedAreNeverIssuedAgain) {
  const std::string dir = TempDir();
  auto spec = ParseFaultSpec("enospc-after:600");
  ASSERT_TRUE(spec.ok());
  FaultyEnv env(Env::Posix(), *spec);
  StoreOptions o = Options(dir);
  o.env = &env;
  uint64_t lost_version = 0;
  std::string refused;
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(o, m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(rep.unclean);  // a new partition
    refused = FillUntilAWriteFails(**s, m);
    ASSERT_FALSE(refused.empty());
    // Served meanwhile at this version.
    lost_version = m.table->Get(refused)->version;
  }  // a clean stop, the disk still full: the record is lost
  uint64_t last = 0;
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(rep.unclean);
    EXPECT_FALSE(m.table->Get(refused).ok());
    auto v = m.table->Put(refused, "another value");
    ASSERT_TRUE(v.ok());
    EXPECT_GT(*v, lost_version);
    EXPECT_GE(*v, lost_version + kUncleanVersionGap);
    (*s)->LogPut(refused, "another value", *v);
    Passes(**s);
    // Applied and read, never logged: the process dies.
    auto lost = m.table->Put(refused, "lost");
    ASSERT_TRUE(lost.ok());
    lost_version = *lost;
    Abandon(std::move(*s));
  }
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(rep.unclean);
    EXPECT_EQ(m.table->Get(refused)->value, "another value");
    last = m.table->last_version();
    EXPECT_GT(last, lost_version);
    // Read at a version of this run's, never logged: the run logs nothing
    // and dies.
    auto lost = m.table->Put(refused, "lost again");
    ASSERT_TRUE(lost.ok());
    lost_version = *lost;
    Abandon(std::move(*s));
  }
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(rep.unclean);
    last = m.table->last_version();
    EXPECT_GT(last, lost_version);
    auto v = m.table->Put("k", "v");
    (*s)->LogPut("k", "v", *v);
    Passes(**s);
    last = *v;
  }  // clean
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(rep.unclean);
  EXPECT_EQ(m.table->last_version(), last);  // contiguous after a clean stop
  EXPECT_EQ(*m.table->Put("k", "w"), last + 1);
  fs::remove_all(dir);
}

// --recovery truncate drops records, and the restart after it skips
// versions as after a crash: the records it dropped may have been read.
// A run file that names another LSN than the log's last (the log was cut
// after a clean stop) is no clean stop either.
TEST(Store, ARecoveryThatDropsRecordsSkipsVersions) {
  {
    const std::string clean = TempDir();
    WritePuts(clean, 10);  // a clean stop
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(clean), m.durable(), &rep);
    ASSERT_TRUE(s.ok());
    EXPECT_FALSE(rep.unclean);
    EXPECT_EQ(m.table->last_version(), 10u);
    fs::remove_all(clean);
  }
  const std::string dir = TempDir();
  WritePuts(dir, 10);  // a clean stop, then the log cut short
  const std::string log = LastLog(dir);
  fs::resize_file(log, fs::file_size(log) - 3);  // a torn last record
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(rep.unclean);
  EXPECT_EQ(m.table->size(), 9u);
  EXPECT_GE(m.table->last_version(), 9 + kUncleanVersionGap);
  fs::remove_all(dir);
}

TEST(Store, BackToBackSnapshotsKeepTheLiveLog) {
  const std::string dir = TempDir();
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
    ASSERT_TRUE(s.ok());
    for (int round = 0; round < 3; ++round) {  // nothing written between
      bool done = false;
      (*s)->RequestSnapshot([&](Status st) {
        EXPECT_TRUE(st.ok()) << st.ToString();
        done = true;
      });
      while (!done) Passes(**s);
    }
    auto v = m.table->Put("after", "x");
    (*s)->LogPut("after", "x", *v);
    Passes(**s);
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(m.table->Get("after").ok());
  fs::remove_all(dir);
}

TEST(Store, SnapshotWhileWritingMissesNothing) {
  // Many small snapshots interleaved with writes that move pairs (cuckoo)
  // and grow the table mid-scan; after each, recovery equals the model.
  const std::string dir = TempDir();
  std::map<std::string, std::string> model;
  StoreOptions o = Options(dir);
  o.fsync = FsyncPolicy::kNo;  // about the snapshots' content, not syncs
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(o, m.durable(), &rep);
    ASSERT_TRUE(s.ok());
    std::mt19937 rng(7);
    int snaps = 0;
    for (int i = 0; i < 20000; ++i) {
      const std::string k = "key" + std::to_string(rng() % 4000);
      const std::string v = std::to_string(i);
      auto ver = m.table->Put(k, v);
      ASSERT_TRUE(ver.ok());
      (*s)->LogPut(k, v, *ver);
      model[k] = v;
      Passes(**s);  // one snapshot chunk per write
      if (i % 2500 == 0) {
        (*s)->RequestSnapshot([&](Status st) {
          EXPECT_TRUE(st.ok());
          ++snaps;
        });
      }
    }
    while ((*s)->stats().snapshots.load() < 8) Passes(**s);
    EXPECT_EQ(snaps, 8);
  }
  Mem m;
  RecoveryReport rep;
  auto s = PartitionStore::Open(o, m.durable(), &rep);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(m.table->size(), model.size());
  for (const auto& [k, v] : model) {
    auto got = m.table->Get(k);
    ASSERT_TRUE(got.ok()) << k;
    EXPECT_EQ(got->value, v);
  }
  fs::remove_all(dir);
}

// --- the Env

// Files and directories the POSIX Env makes are private under any umask.
TEST(Env, FilesAre0600AndDirectories0700WhateverTheUmask) {
  const std::string top = TempDir();
  for (mode_t mask : {mode_t(0), mode_t(022), mode_t(0277)}) {
    const mode_t old = ::umask(mask);
    const std::string dir = top + "/u" + std::to_string(mask) + "/data";
    auto made = Env::Posix()->CreateDir(dir);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_EQ(*made, DirState::kCreated);
    auto f = Env::Posix()->NewWritableFile(dir + "/f");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto l = Env::Posix()->LockFile(dir + "/LOCK", "me");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ::umask(old);
    struct stat st;
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << "umask " << mask;
    ASSERT_EQ(::stat((dir + "/f").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << "umask " << mask;
    ASSERT_EQ(::stat((dir + "/LOCK").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << "umask " << mask;
  }
  // An existing directory open to others is tightened, and says so.
  const std::string open_dir = top + "/open";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0755), 0);
  auto made = Env::Posix()->CreateDir(open_dir);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(*made, DirState::kTightened);
  struct stat st;
  ASSERT_EQ(::stat(open_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(*Env::Posix()->CreateDir(open_dir), DirState::kExisted);
  // Directories above the one asked for that exist already (/tmp, $HOME,
  // the working directory) keep their modes; missing ones are made 0700.
  ASSERT_EQ(::chmod(open_dir.c_str(), 0755), 0);
  made = Env::Posix()->CreateDir(open_dir + "/new/data");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(*made, DirState::kCreated);
  ASSERT_EQ(::stat(open_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  ASSERT_EQ(::stat((open_dir + "/new").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((open_dir + "/new/data").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  fs::remove_all(top);
}

TEST(Env, ASecondLockIsRefusedNamingTheHolder) {
  const std::string dir = TempDir();
  auto first = Env::Posix()->LockFile(dir + "/LOCK", "server pid 123\n");
  ASSERT_TRUE(first.ok());
  auto second = Env::Posix()->LockFile(dir + "/LOCK", "another");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kBusy);
  EXPECT_NE(second.status().message().find("server pid 123"), std::string::npos)
      << second.status().ToString();
  first->reset();  // released: the next one gets it
  auto third = Env::Posix()->LockFile(dir + "/LOCK", "third");
  EXPECT_TRUE(third.ok()) << third.status().ToString();
  fs::remove_all(dir);
}

// A child process that takes `dir`/LOCK (naming its pid, as a server
// does), runs `prepare`, says so, then `hold` (which never returns).
template <typename Prepare, typename Hold>
pid_t ForkLockHolder(const std::string& dir, Prepare prepare, Hold hold) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    auto lock = Env::Posix()->LockFile(
        dir + "/LOCK", "remem-server pid " + std::to_string(::getpid()));
    if (!lock.ok()) ::_exit(1);
    prepare();
    (void)!::write(ready[1], "x", 1);
    hold();
  }
  ::close(ready[1]);
  char byte;
  const bool up = child > 0 && ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  return up ? child : -1;
}

// Until `pid` is exiting, as LockFile judges a holder (a bound of 5 s).
void WaitUntilExiting(pid_t pid) {
  const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!ProcessIsExiting(pid)) {
    ASSERT_LT(std::chrono::steady_clock::now(), bound) << "pid " << pid;
    std::this_thread::yield();
  }
}

// A holder killed with -9 that has not had a CPU since (a busy machine)
// has SIGKILL pending and counts as exiting: /proc/PID/status as the
// kernel writes it.
TEST(Env, AKillPendingCountsAsExiting) {
  const std::string killed =
      "Name:\tremem-server\nState:\tR (running)\nSigQ:\t1/95000\n"
      "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n"
      "SigBlk:\t0000000000000000\n";
  EXPECT_TRUE(StatusHasKillPending(killed));
  EXPECT_TRUE(StatusHasKillPending(
      "SigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n"));
  // SIGTERM (bit 15) and SIGSTOP (bit 19) pending are not a kill.
  EXPECT_FALSE(StatusHasKillPending(
      "SigPnd:\t0000000000004000\nShdPnd:\t0000000000040000\n"));
  EXPECT_FALSE(StatusHasKillPending("Name:\tx\n"));
  EXPECT_FALSE(StatusHasKillPending("SigPnd:\tzz\n"));
  // A live process of this test is not exiting.
  EXPECT_FALSE(ProcessIsExiting(::getpid()));
}

// A holder that is exiting (its main thread gone, another still tearing
// down, as a server killed with -9 is for a while) is waited for: the lock
// is taken once it is released, not refused.
TEST(Env, ALockOfAnExitingHolderIsWaitedFor) {
  const std::string dir = TempDir();
  const pid_t child = ForkLockHolder(
      dir,
      [] {
        // The lock outlives the main thread: another thread holds the
        // process (and its files) for a while, then ends it.
        std::thread([] {
          ::usleep(300000);
          ::_exit(0);
        }).detach();
      },
      [] {
        // This thread alone ends (the exit system call, not exit_group;
        // no unwinding through the test framework).
        ::syscall(SYS_exit, 0);
      });
  ASSERT_GT(child, 0);
  ASSERT_NO_FATAL_FAILURE(WaitUntilExiting(child));
  auto lock = Env::Posix()->LockFile(dir + "/LOCK", "the next server");
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  fs::remove_all(dir);
}

// The case that matters: a holder killed with -9 while it holds a lot of
// memory keeps its lock while its last thread tears that memory down (the
// main thread is then often still running, flagged exiting); a lock taken
// right after the kill waits for it instead of being refused.
TEST(Env, ALockOfAHolderKilledWithNineIsWaitedFor) {
  const std::string dir = TempDir();
  const pid_t child = ForkLockHolder(
      dir,
      [] {
        // (Less under the sanitizers, whose memset of it takes seconds.)
        const size_t bytes = size_t(testing::Scaled(512, 128)) << 20;
        void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) ::_exit(1);
        std::memset(mem, 1, bytes);
        for (int i = 0; i < 3; ++i) {
          std::thread([] {
            for (;;) ::pause();
          }).detach();
        }
      },
      [] {
        for (;;) ::pause();
      });
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  // Until the kill has taken. (A restarted server execs and starts up
  // first; the test would race the signal's delivery.)
  ASSERT_NO_FATAL_FAILURE(WaitUntilExiting(child));
  auto lock = Env::Posix()->LockFile(dir + "/LOCK", "the next server");
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  fs::remove_all(dir);
}

// A holder in its clean stop (a server sent SIGTERM: its LOCK says
// "stopping", or SIGTERM is still pending) is waited for too: a restart
// right after `kill PID` was refused or not by chance (found black-box).
// A holder that is neither is still refused at once.
TEST(Env, ALockOfAStoppingHolderIsWaitedFor) {
  EXPECT_TRUE(
      StatusHasStopPending("SigPnd:\t0000000000000000\n"
                           "ShdPnd:\t0000000000004000\n"));          // TERM
  EXPECT_TRUE(StatusHasStopPending("ShdPnd:\t0000000000000002\n"));  // INT
  EXPECT_FALSE(StatusHasStopPending("ShdPnd:\t0000000000000100\n"));
  const std::string dir = TempDir();
  int status = 0;
  const pid_t running = ForkLockHolder(
      dir, [] {}, [] { ::pause(); });
  ASSERT_GT(running, 0);
  // Running, not stopping: refused at once.
  const auto start = std::chrono::steady_clock::now();
  auto refused = Env::Posix()->LockFile(dir + "/LOCK", "the next server");
  EXPECT_EQ(refused.status().code(), StatusCode::kBusy);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ::kill(running, SIGKILL);
  ASSERT_EQ(::waitpid(running, &status, 0), running);
  // A holder that says it is stopping (as Durability::MarkStopping does),
  // and lets go 300 ms later.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t stopping = ::fork();
  if (stopping == 0) {
    auto held = Env::Posix()->LockFile(
        dir + "/LOCK", "remem-server pid " + std::to_string(::getpid()));
    if (!held.ok() || !(*held)
                           ->Note("remem-server pid " +
                                  std::to_string(::getpid()) + " stopping\n")
                           .ok()) {
      ::_exit(1);
    }
    (void)!::write(ready[1], "x", 1);
    ::usleep(300000);
    ::_exit(0);
  }
  ASSERT_GT(stopping, 0);
  ::close(ready[1]);
  char byte;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  auto lock = Env::Posix()->LockFile(dir + "/LOCK", "the next server");
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
  ASSERT_EQ(::waitpid(stopping, &status, 0), stopping);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  fs::remove_all(dir);
}

TEST(Env, ReadFaultsFailShortenOrFlip) {
  const std::string dir = TempDir();
  ASSERT_TRUE(
      WriteFileAtomically(Env::Posix(), dir, "snapshot-1.snap", "0123456789")
          .ok());
  ASSERT_TRUE(
      WriteFileAtomically(Env::Posix(), dir, "log-1.rlog", "abcdef").ok());
  auto spec = ParseFaultSpec("read-eio:log-,read-short:nothing");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  FaultyEnv eio(Env::Posix(), *spec);
  auto r = eio.ReadFile(dir + "/log-1.rlog");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Input/output"), std::string::npos);
  auto fine = eio.ReadFile(dir + "/snapshot-1.snap");
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ((*fine)->data(), "0123456789");
  FaultyEnv shorter(Env::Posix(), *ParseFaultSpec("read-short:snapshot"));
  EXPECT_EQ((*shorter.ReadFile(dir + "/snapshot-1.snap"))->data(), "01234");
  FaultyEnv flip(Env::Posix(), *ParseFaultSpec("read-flip:snap"));
  auto flipped = flip.ReadFile(dir + "/snapshot-1.snap");
  ASSERT_TRUE(flipped.ok());
  EXPECT_EQ((*flipped)->data().size(), 10u);
  EXPECT_NE((*flipped)->data(), "0123456789");
  EXPECT_EQ((*flipped)->data().substr(0, 5), "01234");
  EXPECT_FALSE(ParseFaultSpec("read-eio").ok());
  EXPECT_FALSE(ParseFaultSpec("eio-after:x").ok());
  EXPECT_TRUE(ParseFaultSpec("eio-after:5,read-flip:.tmp").ok());
  fs::remove_all(dir);
}

// --- generations

// A table and its store, written as the hash service writes them.
struct Node {
  Mem mem;
  RecoveryReport report;
  std::unique_ptr<PartitionStore> store;
  Status open;
  explicit Node(const StoreOptions& o, uint64_t arena = 32 << 20,
                uint64_t initial_buckets = 4)
      : mem(arena, initial_buckets) {
    auto s = PartitionStore::Open(o, mem.durable(), &report);
    open = s.ok() ? Status::OK() : s.status();
    if (s.ok()) store = std::move(*s);
  }
  Result<uint64_t> Put(const std::string& k, const std::string& v) {
    auto r = mem.table->Put(k, v);
    if (r.ok()) store->LogPut(k, v, *r);
    store->OnPass();
    return r;
  }
  Status Delete(const std::string& k) {
    Status st = mem.table->Delete(k);
    if (st.ok()) store->LogDelete(k, mem.table->last_version());
    store->OnPass();
    return st;
  }
  Status Snapshot() {
    Status result = Status::Internal("no answer");
    bool done = false;
    store->RequestSnapshot([&](Status st) {
      result = st;
      done = true;
    });
    while (!done) store->OnPass();
    return result;
  }
};

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void Flip(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  const char c = char(f.get());
  f.seekp(std::streamoff(at));
  f.put(char(~c));
}

// Writes keys k0.. in three rounds with a snapshot after the first two:
// snapshot A (LSN 11), snapshot B (LSN 21), 10 more records.
void ThreeRounds(const std::string& dir) {
  Node n(Options(dir));
  ASSERT_TRUE(n.open.ok());
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(n.Put("k" + std::to_string(i), "v" + std::to_string(i)).ok());
    if (i == 9 || i == 19) {
      ASSERT_TRUE(n.Snapshot().ok());
    }
  }
}

TEST(Generations, TheNewestTwoSnapshotsAndTheLogFromTheOlderOneStay) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  // Snapshot B's generation, and A's with the log from A's LSN.
  EXPECT_EQ(Names(dir),
            (std::vector<std::string>{LogName(11), LogName(21), "run",
                                      SnapshotName(11), SnapshotName(21)}));
  {
    Node n(Options(dir));  // a restart keeps them too
    ASSERT_TRUE(n.open.ok());
    EXPECT_EQ(n.report.snapshot, SnapshotName(21));
    EXPECT_EQ(n.report.log_records, 10u);
    ASSERT_TRUE(n.Put("k30", "v30").ok());
    ASSERT_TRUE(n.Snapshot().ok());  // snapshot C at LSN 32: A goes
  }
  EXPECT_EQ(Names(dir), (std::vector<std::string>{
                            LogName(21), LogName(31), LogName(32), "run",
                            SnapshotName(21), SnapshotName(32)}));
  fs::remove_all(dir);
}

TEST(Generations, ACorruptNewestSnapshotFallsBackAndLosesNothing) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  Flip(dir + "/" + SnapshotName(21), 60);
  {
    Node n(Options(dir));
    ASSERT_TRUE(n.open.ok()) << n.open.ToString();
    EXPECT_TRUE(n.report.fell_back);
    EXPECT_EQ(n.report.snapshot, SnapshotName(11));
    EXPECT_EQ(n.report.log_records, 20u);
    EXPECT_TRUE(n.report.lost.empty());
    EXPECT_EQ(n.mem.table->size(), 30u);
    for (int i = 0; i < 30; ++i) {
      auto g = n.mem.table->Get("k" + std::to_string(i));
      ASSERT_TRUE(g.ok()) << i;
      EXPECT_EQ(g->value, "v" + std::to_string(i));
    }
    ASSERT_FALSE(n.report.warnings.empty());
    EXPECT_NE(n.report.warnings[0].find(SnapshotName(21)), std::string::npos);
    // Kept aside until the next snapshot is verified.
    EXPECT_TRUE(fs::exists(dir + "/" + SnapshotName(21) + ".corrupt"));
    ASSERT_TRUE(n.Snapshot().ok());
    EXPECT_FALSE(fs::exists(dir + "/" + SnapshotName(21) + ".corrupt"));
  }
  fs::remove_all(dir);
}

// Both snapshots corrupt, the log from the older one on: the refusal says
// the snapshots held the writes before the log's first LSN (it said a log
// file was missing, and that the files held LSN 1..30), and that truncate
// starts empty (it said "from LSN 0").
TEST(Generations, EverySnapshotCorruptSaysTheyHeldTheWritesBeforeTheLog) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  Flip(dir + "/" + SnapshotName(21), 60);
  Flip(dir + "/" + SnapshotName(11), 60);
  Node n(Options(dir));
  ASSERT_FALSE(n.open.ok());
  EXPECT_EQ(n.open.code(), StatusCode::kCorruption);
  const std::string& m = n.open.message();
  EXPECT_NE(m.find("the log begins at LSN 11, and the snapshots that held "
                   "LSN 1..10 are unusable"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("a log file is missing"), std::string::npos) << m;
  EXPECT_NE(m.find("the writes LSN 1..30 (30 records) are out of reach (LSN "
                   "11..30 (20 records) in "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("reaches no record"), std::string::npos) << m;
  EXPECT_NE(m.find("--recovery=truncate to start empty"), std::string::npos)
      << m;
  fs::remove_all(dir);
}

TEST(Generations, NoValidStateUpToTheNewestRecordRefusesUnlessTruncating) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  // The newest snapshot is corrupt and the log the previous generation
  // needs past it is gone: LSN 11..20 are nowhere.
  Flip(dir + "/" + SnapshotName(21), 60);
  fs::remove(dir + "/" + LogName(11));
  {
    Node n(Options(dir));
    ASSERT_FALSE(n.open.ok());
    EXPECT_EQ(n.open.code(), StatusCode::kCorruption);
    EXPECT_NE(n.open.message().find("LSN 11..30 (20 records)"),
              std::string::npos)
        << n.open.ToString();
    EXPECT_NE(n.open.message().find("--recovery=truncate"), std::string::npos);
    // Nothing on disk changed.
    EXPECT_TRUE(fs::exists(dir + "/" + SnapshotName(21)));
  }
  StoreOptions o = Options(dir);
  o.recovery = RecoveryMode::kTruncate;
  Node n(o);
  ASSERT_TRUE(n.open.ok()) << n.open.ToString();
  ASSERT_EQ(n.report.lost.size(), 1u);
  EXPECT_EQ(n.report.lost_records, 20u);
  EXPECT_NE(n.report.lost[0].find("LSN 11..30"), std::string::npos)
      << n.report.lost[0];
  EXPECT_EQ(n.report.last_lsn, 10u);
  // The intact prefix: the first snapshot's ten keys, nothing after.
  EXPECT_EQ(n.mem.table->size(), 10u);
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(n.mem.table->Get("k" + std::to_string(i)).ok(), i < 10) << i;
  }
  // New writes continue from LSN 11, above every version seen.
  auto v = n.Put("after", "x");
  ASSERT_TRUE(v.ok());
  EXPECT_GT(*v, 30u);
  fs::remove_all(dir);
}

// The newest log file, the one the newest snapshot begins, removed: no
// later file shows the gap, and recovery used to start from the snapshot
// with LSN 21..30 gone without a word (found black-box). A restart with
// nothing written since the snapshot keeps that log, empty, in place.
TEST(Generations, TheSnapshotsLogRemovedRefusesUnlessTruncating) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  for (int restart = 0; restart < 2; ++restart) {
    Node n(Options(dir));
    ASSERT_TRUE(n.open.ok()) << n.open.ToString();
  }
  {
    Node n(Options(dir));
    ASSERT_TRUE(n.open.ok());
    ASSERT_TRUE(n.Snapshot().ok());  // at LSN 31, its log empty
  }
  for (int restart = 0; restart < 2; ++restart) {
    Node n(Options(dir));
    ASSERT_TRUE(n.open.ok()) << n.open.ToString();
    EXPECT_EQ(n.mem.table->size(), 30u);
    EXPECT_TRUE(fs::exists(dir + "/" + LogName(31)));
  }
  {
    Node n(Options(dir));
    ASSERT_TRUE(n.open.ok());
    ASSERT_TRUE(n.Put("k30", "v30").ok());  // LSN 31, in log-31
  }
  fs::remove(dir + "/" + LogName(31));
  {
    Node n(Options(dir));
    ASSERT_FALSE(n.open.ok());
    EXPECT_EQ(n.open.code(), StatusCode::kCorruption);
    EXPECT_NE(n.open.message().find(dir + "/" + LogName(31) +
                                    ", the log that begins at"),
              std::string::npos)
        << n.open.ToString();
    EXPECT_NE(n.open.message().find("--recovery=truncate"), std::string::npos);
  }
  StoreOptions o = Options(dir);
  o.recovery = RecoveryMode::kTruncate;
  {
    Node n(o);
    ASSERT_TRUE(n.open.ok()) << n.open.ToString();
    ASSERT_EQ(n.report.lost.size(), 1u);
    EXPECT_NE(n.report.lost[0].find(LogName(31)), std::string::npos);
    EXPECT_EQ(n.mem.table->size(), 30u);
    EXPECT_FALSE(n.mem.table->Get("k30").ok());
  }
  // Said once: the log it opened makes the directory whole again.
  Node n(Options(dir));
  ASSERT_TRUE(n.open.ok()) << n.open.ToString();
  EXPECT_TRUE(n.report.lost.empty());
  fs::remove_all(dir);
}

TEST(Generations, ASnapshotThatDoesNotVerifyKeepsThePreviousOne) {
  const std::string dir = TempDir();
  ThreeRounds(dir);
  StoreOptions o = Options(dir);
  o.fault = "read-flip:.tmp";  // reading the new file back sees a bad byte
  {
    Node n(o);
    ASSERT_TRUE(n.open.ok());
    ASSERT_TRUE(n.Put("k30", "v30").ok());
    Status st = n.Snapshot();
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("verifying"), std::string::npos);
    EXPECT_EQ(n.store->stats().snapshot_failures.load(), 1u);
    EXPECT_EQ(n.store->stats().snapshots.load(), 0u);
    // The log took every record: a failed snapshot is no write error.
    EXPECT_EQ(n.store->stats().write_errors.load(), 0u);
  }
  {
    // So the stop was clean, and versions go on where they were (found
    // black-box: a snapshot refused by a full disk made the next clean
    // stop skip 2^32 versions).
    Node n(o);
    ASSERT_TRUE(n.open.ok()) << n.open.ToString();
    EXPECT_FALSE(n.report.unclean);
    EXPECT_LT(n.mem.table->last_version(), kUncleanVersionGap);
  }
  // Both generations are still there, nothing new replaced them.
  EXPECT_EQ(Names(dir), (std::vector<std::string>{
                            LogName(11), LogName(21), LogName(31), LogName(32),
                            "run", SnapshotName(11), SnapshotName(21)}));
  Node n(Options(dir));
  ASSERT_TRUE(n.open.ok());
  EXPECT_EQ(n.mem.table->size(), 31u);
  fs::remove_all(dir);
}

TEST(Generations, AShortReadIsAnErrorNotATornTail) {
  const std::string dir = TempDir();
  WritePuts(dir, 10);
  StoreOptions o = Options(dir);
  o.fault = "read-short:log-";
  {
    Node n(o);
    ASSERT_FALSE(n.open.ok());
    EXPECT_NE(n.open.message().find("bytes"), std::string::npos)
        << n.open.ToString();
  }
  o.fault = "read-eio:log-";
  {
    Node n(o);
    ASSERT_FALSE(n.open.ok());
    EXPECT_EQ(n.open.code(), StatusCode::kIOError) << n.open.ToString();
  }
  // A file that cannot be read is not corruption: truncate does not drop
  // it either (it said "dropped 0 records" and moved it aside).
  o.recovery = RecoveryMode::kTruncate;
  {
    Node n(o);
    ASSERT_FALSE(n.open.ok());
    EXPECT_EQ(n.open.code(), StatusCode::kIOError) << n.open.ToString();
    EXPECT_NE(n.open.message().find("under any --recovery"), std::string::npos)
        << n.open.ToString();
  }
  Node n(Options(dir));  // nothing was truncated
  ASSERT_TRUE(n.open.ok());
  EXPECT_EQ(n.mem.table->size(), 10u);
  fs::remove_all(dir);
}

// --- a full table recovers into the same memory

// Values of a few shapes: inline of many sizes, extents, and the mixes
// that pack worst in another order (large inline entries).
std::string Value(std::mt19937_64& rng, int mix) {
  switch (mix) {
    case 0:  // half inline, half extents
      return std::string(rng() % 2 ? 8 + rng() % 40 : 300 + rng() % 2000, 'v');
    case 1:  // inline, every size
      return std::string(8 + rng() % 90, 'v');
    default:  // large inline entries only
      return std::string(40 + rng() % 50, 'v');
  }
}

// Fills `n` with writes (inserts, overwrites that change sizes, deletes)
// until 200 inserts got OutOfMemory, then with inserts only until 100 in a
// row did.
void FillToOutOfMemory(Node& n, std::mt19937_64& rng, int mix,
                       std::map<std::string, std::string>* model,
                       uint64_t* next_key) {
  int refused = 0, full = 0;
  while (full < 100) {
    if (refused < 200 && !model->empty() && rng() % 4 == 0) {
      auto it = model->lower_bound("k" + std::to_string(rng() % *next_key));
      if (it == model->end()) it = model->begin();
      if (rng() % 2 == 0) {
        ASSERT_TRUE(n.Delete(it->first).ok());
        model->erase(it);
      } else {
        const std::string v = Value(rng, mix);
        auto r = n.Put(it->first, v);
        if (r.ok()) it->second = v;
      }
      continue;
    }
    const std::string k = "k" + std::to_string((*next_key)++);
    const std::string v = Value(rng, mix);
    auto r = n.Put(k, v);
    if (r.ok()) {
      (*model)[k] = v;
      full = 0;
    } else {
      ASSERT_EQ(r.status().code(), StatusCode::kOutOfMemory);
      ++refused;
      if (refused >= 200) ++full;
    }
  }
}

TEST(FullStore, RecoversIntoTheSameMemoryAfterEveryKindOfRestart) {
  // Small partitions so the tables fill in a few thousand writes; every
  // restart refills the recovered store to OutOfMemory first.
  constexpr uint64_t kArena = 2 << 20;
  for (int mix = 0; mix < 3; ++mix) {
    for (int how = 0; how < 2; ++how) {  // 0: log only, 1: snapshot + log
      const std::string dir = TempDir();
      StoreOptions o = Options(dir);
      o.fsync = FsyncPolicy::kNo;
      std::mt19937_64 rng(uint64_t(mix * 10 + how));
      std::map<std::string, std::string> model;
      uint64_t next_key = 0;
      for (int restart = 0; restart < 3; ++restart) {
        Node n(o, kArena, 16);
        ASSERT_TRUE(n.open.ok())
            << "mix " << mix << " how " << how << " restart " << restart << ": "
            << n.open.ToString();
        ASSERT_EQ(n.mem.table->size(), model.size());
        for (const auto& [k, v] : model) {
          auto g = n.mem.table->Get(k);
          ASSERT_TRUE(g.ok()) << k;
          ASSERT_EQ(g->value, v) << k;
        }
        FillToOutOfMemory(n, rng, mix, &model, &next_key);
        if (how == 1) {
          ASSERT_TRUE(n.Snapshot().ok());
        }
        // More writes after the snapshot: some in the log only.
        for (int i = 0; i < 200; ++i) {
          auto it = model.lower_bound("k" + std::to_string(rng() % next_key));
          if (it == model.end()) continue;
          const std::string v = Value(rng, mix);
          if (n.Put(it->first, v).ok()) it->second = v;
        }
      }
      fs::remove_all(dir);
    }
  }
}

// --- the everysec bound

// Records when bytes were written and when they were synced.
class RecordingEnv final : public Env {
 public:
  using Clock = std::chrono::steady_clock;
  struct Event {
    Clock::time_point at;
    uint64_t bytes;  // written so far (for a sync: covered so far)
  };
  std::vector<Event> writes, syncs;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    auto f = Env::Posix()->NewWritableFile(path);
    if (!f.ok()) return f.status();
    return std::unique_ptr<WritableFile>(new File(this, std::move(*f)));
  }
  Result<std::unique_ptr<FileData>> ReadFile(const std::string& p) override {
    return Env::Posix()->ReadFile(p);
  }
  Result<bool> FileExists(const std::string& p) override {
    return Env::Posix()->FileExists(p);
  }
  Result<uint64_t> FileSize(const std::string& p) override {
    return Env::Posix()->FileSize(p);
  }
  Result<uint64_t> FileMtimeMs(const std::string& p) override {
    return Env::Posix()->FileMtimeMs(p);
  }
  Result<std::vector<std::string>> ListDir(const std::string& d) override {
    return Env::Posix()->ListDir(d);
  }
  Result<DirState> CreateDir(const std::string& d) override {
    return Env::Posix()->CreateDir(d);
  }
  Status Rename(const std::string& a, const std::string& b) override {
    return Env::Posix()->Rename(a, b);
  }
  Status RemoveFile(const std::string& p) override {
    return Env::Posix()->RemoveFile(p);
  }
  Status SyncDir(const std::string& d) override {
    return Env::Posix()->SyncDir(d);
  }
  Status TruncateFile(const std::string& p, uint64_t n) override {
    return Env::Posix()->TruncateFile(p, n);
  }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& p,
                                             const std::string& h) override {
    return Env::Posix()->LockFile(p, h);
  }

 private:
  class File final : public WritableFile {
   public:
    File(RecordingEnv* env, std::unique_ptr<WritableFile> f)
        : env_(env), f_(std::move(f)) {}
    Result<size_t> Write(const void* data, size_t len) override {
      auto n = f_->Write(data, len);
      if (n.ok()) {
        env_->total_ += *n;
        env_->writes.push_back({Clock::now(), env_->total_});
      }
      return n;
    }
    // A sync is recorded when it starts: what the policy decides. How long
    // the disk then takes (a quarter second beside a build's writes) is
    // the disk's.
    Status Sync() override {
      const Clock::time_point at = Clock::now();
      Status st = f_->Sync();
      if (st.ok()) env_->syncs.push_back({at, env_->total_});
      return st;
    }
    Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    const std::string& path() const override { return f_->path(); }

   private:
    RecordingEnv* env_;
    std::unique_ptr<WritableFile> f_;
  };
  uint64_t total_ = 0;
};

// The power-loss bound of `everysec`, at the seam (a kill cannot show it):
// every written byte is in an fdatasync that starts within about a second,
// and writes are not synced one by one.
TEST(Store, EverySecSyncsEveryWriteWithinASecond) {
  const std::string dir = TempDir();
  RecordingEnv env;
  StoreOptions o = Options(dir);
  o.env = &env;
  o.fsync = FsyncPolicy::kEverySec;
  Node n(o);
  ASSERT_TRUE(n.open.ok());
  const auto start = RecordingEnv::Clock::now();
  int i = 0;
  // A write every 5 ms for 2.5 s, with the passes an event loop would run.
  while (RecordingEnv::Clock::now() - start < std::chrono::milliseconds(2500)) {
    ASSERT_TRUE(n.Put("k" + std::to_string(i % 100), "v").ok());
    ++i;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n.store->OnPass();
  }
  const auto end = RecordingEnv::Clock::now();
  ASSERT_GT(env.writes.size(), 100u);
  // About one sync a second (the one OpenLog's file gets is not counted).
  EXPECT_GE(env.syncs.size(), 2u);
  EXPECT_LE(env.syncs.size(), 4u);
  for (const auto& w : env.writes) {
    if (end - w.at < std::chrono::milliseconds(1200)) break;  // not due yet
    auto covered = std::find_if(env.syncs.begin(), env.syncs.end(),
                                [&](const RecordingEnv::Event& s) {
                                  return s.bytes >= w.bytes && s.at >= w.at;
                                });
    ASSERT_NE(covered, env.syncs.end());
    EXPECT_LE(covered->at - w.at, std::chrono::milliseconds(1200));
  }
  n.store.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem::durability
