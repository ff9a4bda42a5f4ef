// Unit tests of the durability layer: the record format, the log writer
// under injected faults (short writes, ENOSPC, EIO), and PartitionStore's
// recovery (snapshot + log, torn tail, corruption) and snapshots taken
// while writes go on.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "durability/log.h"
#include "durability/snapshot.h"
#include "durability/store.h"
#include "hash/durable.h"
#include "hash/slab.h"
#include "hash/table.h"

namespace remem::durability {
namespace {

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
  explicit Mem(uint64_t arena = 32 << 20)
      : mem_(4096 + arena + 64), slab_(Base() + 4096, arena, 4096) {
    hash::TableOptions o;
    o.initial_buckets = 4;  // grows early: snapshots meet growth
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
  hash::SlabAllocator slab_;

 public:
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
  auto state = std::make_shared<FaultState>(*f);
  auto file = CreateFile(dir + "/log");
  EXPECT_TRUE(file.ok());
  LogWriter log(WithFaults(std::move(*file), state), 1);
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
    state->healed = true;
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
  EXPECT_EQ(rep.warnings.size(), 1u);
  EXPECT_GT(rep.truncated_bytes, 0u);
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
  {
    Mem m;
    RecoveryReport rep;
    auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
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
  auto s = PartitionStore::Open(Options(dir), m.durable(), &rep);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(m.table->size(), model.size());
  for (const auto& [k, v] : model) {
    auto got = m.table->Get(k);
    ASSERT_TRUE(got.ok()) << k;
    EXPECT_EQ(got->value, v);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem::durability
