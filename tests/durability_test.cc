// Process-level durability tests: the real remem-server with --data-dir,
// killed with SIGKILL at random moments (also during snapshots) while
// clients write, restarted on the same directory and checked against what
// the clients were told; disk faults; refusing to start on corruption.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "remem/hash.h"
#include "remem/session.h"
#include "test_util.h"
#include "util/subprocess.h"

namespace remem {
namespace {

namespace fs = std::filesystem;
using testing::ServerProcess;
using testing::StartServer;
using testing::TestTransport;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "remem-crash-XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

testing::HashClient Connect(const std::string& address, bool must = true) {
  SessionOptions o;
  o.server = address;
  o.transport = TestTransport();
  o.timeout = std::chrono::milliseconds(3000);
  testing::HashClient c;
  auto s = Session::Connect(o);
  if (must) {
    EXPECT_TRUE(s.ok()) << s.status().ToString();
  }
  if (!s.ok()) return c;
  c.session = std::move(*s);
  auto h = HashStore::Open(c.session.get());
  if (must) {
    EXPECT_TRUE(h.ok()) << h.status().ToString();
  }
  if (h.ok()) c.store = std::move(*h);
  return c;
}

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : def;
}

// What a writer knows about one key.
struct KeyState {
  std::optional<std::string> value;  // acknowledged; nullopt = absent
  uint64_t version = 0;
  // The operation in flight when the server died: its outcome is unknown.
  bool in_flight = false;
  std::optional<std::string> in_flight_value;  // nullopt: a delete
};

struct CrashResult {
  int iterations = 0;
  uint64_t keys_checked = 0;
  uint64_t acked_writes = 0;
  uint64_t lost = 0;           // acknowledged writes missing after restart
  uint64_t phantoms = 0;       // values never written or never acknowledged
  uint64_t in_flight = 0;      // keys whose last write was in flight
  int killed_in_snapshot = 0;  // a requested snapshot never finished
};

// One writer per key range: puts, deletes, compare-and-puts and
// put-if-absent, recording every acknowledgement.
void Writer(const std::string& address, int id, int keys, int iteration,
            std::vector<KeyState>* model, std::atomic<uint64_t>* acked) {
  // The server may already be gone (a short iteration).
  auto c = Connect(address, false);
  if (!c) return;
  std::mt19937 rng(uint32_t(iteration * 100 + id));
  for (uint64_t seq = 0;; ++seq) {
    const int k = int(rng() % uint32_t(keys));
    KeyState& ks = (*model)[size_t(k)];
    const std::string key = "w" + std::to_string(id) + "-" + std::to_string(k);
    const std::string value = "it" + std::to_string(iteration) + "-w" +
                              std::to_string(id) + "-" + std::to_string(seq) +
                              std::string(rng() % 40, 'x');
    const uint32_t op = rng() % 10;
    Status st;
    uint64_t version = 0;
    ks.in_flight = true;
    if (op < 2) {
      ks.in_flight_value.reset();
      st = c->Delete(key);
      if (st.code() == StatusCode::kNotFound && !ks.value) st = Status::OK();
    } else {
      ks.in_flight_value = value;
      Result<uint64_t> r = Status::Internal("unset");
      if (op < 4 && ks.value) {
        r = c->CompareAndPut(key, value, ks.version);
      } else if (op < 5 && !ks.value) {
        r = c->PutIfAbsent(key, value);
      } else {
        r = c->Put(key, value);
      }
      st = r.ok() ? Status::OK() : r.status();
      if (r.ok()) version = *r;
    }
    if (!st.ok()) {
      // Unavailable/TimedOut: the server died with this write in flight.
      // Anything else is a bug the check below reports.
      if (st.code() != StatusCode::kUnavailable &&
          st.code() != StatusCode::kTimedOut) {
        ADD_FAILURE() << "writer " << id << ": " << st.ToString();
      }
      return;
    }
    ks.in_flight = false;
    ks.value = ks.in_flight_value;
    ks.version = version;
    acked->fetch_add(1, std::memory_order_relaxed);
  }
}

CrashResult CrashLoop(const std::string& policy, int iterations) {
  const std::string dir = TempDir();
  constexpr int kWriters = 2;
  constexpr int kKeys = 300;
  const std::vector<std::string> flags = {"--data-dir",
                                          dir,
                                          "--fsync",
                                          policy,
                                          "--threads",
                                          "2",
                                          "--hash-initial-buckets",
                                          "16",
                                          "--snapshot-log-bytes",
                                          "96K"};
  std::vector<std::vector<KeyState>> model(kWriters,
                                           std::vector<KeyState>(kKeys));
  CrashResult res;
  std::mt19937 rng(12345);
  for (int it = 0; it < iterations; ++it) {
    ServerProcess server = StartServer(flags);
    if (!server.process) break;
    // Check what the previous incarnation acknowledged.
    auto reader = Connect(server.address);
    if (!reader) break;
    for (int w = 0; w < kWriters; ++w) {
      for (int k = 0; k < kKeys; ++k) {
        KeyState& ks = model[size_t(w)][size_t(k)];
        const std::string key =
            "w" + std::to_string(w) + "-" + std::to_string(k);
        auto got = reader->Get(key);
        if (!got.ok() && got.status().code() != StatusCode::kNotFound) {
          ADD_FAILURE() << key << ": " << got.status().ToString();
          return res;
        }
        std::optional<std::string> now;
        if (got.ok()) now = got->value;
        ++res.keys_checked;
        const bool acked_ok =
            now == ks.value && (!now || got->version == ks.version);
        const bool in_flight_ok = ks.in_flight && now == ks.in_flight_value;
        if (ks.in_flight) ++res.in_flight;
        if (!acked_ok && !in_flight_ok) {
          // Either an acknowledged write is missing, or something appears
          // that was never acknowledged nor in flight.
          const bool older = now && ks.value && got->version < ks.version;
          if (!now || older) {
            ++res.lost;
          } else {
            ++res.phantoms;
          }
          if (policy == "always") {
            ADD_FAILURE() << "iteration " << it << " key " << key
                          << ": expected " << ks.value.value_or("<absent>")
                          << " v" << ks.version << (ks.in_flight ? " (or " : "")
                          << (ks.in_flight
                                  ? ks.in_flight_value.value_or("<absent>") +
                                        ")"
                                  : "")
                          << ", found " << now.value_or("<absent>");
          }
        }
        ks.value = now;
        ks.version = got.ok() ? got->version : 0;
        ks.in_flight = false;
      }
    }
    reader = {};
    if (it + 1 == iterations) break;
    // Load, then SIGKILL at a random moment; every other time just after
    // asking for a snapshot, so the kill often lands inside one.
    std::atomic<uint64_t> acked{0};
    // Connected up front, so the snapshot starts right when asked.
    testing::HashClient snap_client =
        it % 2 == 1 ? Connect(server.address) : testing::HashClient();
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back(Writer, server.address, w, kKeys, it,
                           &model[size_t(w)], &acked);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 400));
    std::thread snapper;
    std::atomic<bool> snap_unfinished{false};
    if (it % 2 == 1 && snap_client) {
      snapper = std::thread([&snap_unfinished, c = snap_client.session.get()] {
        if (!c->TakeSnapshot().ok()) snap_unfinished = true;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % 12));
    }
    EXPECT_TRUE(server.process->Signal(SIGKILL).ok());
    (void)server.process->Wait(std::chrono::seconds(10));
    for (auto& t : writers) t.join();
    if (snapper.joinable()) snapper.join();
    snap_client = {};
    if (snap_unfinished) ++res.killed_in_snapshot;
    res.acked_writes += acked.load();
    ++res.iterations;
  }
  fs::remove_all(dir);
  return res;
}

void Print(const char* policy, const CrashResult& r) {
  std::printf(
      "fsync %s: iterations %d (%d killed inside a snapshot), keys checked "
      "%llu, acknowledged writes %llu, in flight at the kill %llu, lost "
      "%llu, phantoms %llu\n",
      policy, r.iterations, r.killed_in_snapshot,
      (unsigned long long)r.keys_checked, (unsigned long long)r.acked_writes,
      (unsigned long long)r.in_flight, (unsigned long long)r.lost,
      (unsigned long long)r.phantoms);
}

TEST(Durability, CrashLoopFsyncAlwaysLosesNothingAcknowledged) {
  CrashResult r = CrashLoop("always", EnvInt("REMEM_CRASH_ITERATIONS", 30));
  Print("always", r);
  EXPECT_GE(r.iterations, 1);
  EXPECT_GT(r.acked_writes, 0u);
  EXPECT_EQ(r.lost, 0u);
  EXPECT_EQ(r.phantoms, 0u);
}

TEST(Durability, CrashLoopFsyncEverySecLossIsBounded) {
  // SIGKILL leaves the page cache alone, and replies wait for the log's
  // write(): a process crash loses nothing under everysec either. (Only an
  // OS crash or power loss could lose up to about a second; not testable
  // here.) The bound asserted is the issue's: loss is reported.
  CrashResult r =
      CrashLoop("everysec", EnvInt("REMEM_CRASH_ITERATIONS", 30) / 2);
  Print("everysec", r);
  EXPECT_GE(r.iterations, 1);
  EXPECT_EQ(r.lost, 0u);
  EXPECT_EQ(r.phantoms, 0u);
}

TEST(Durability, DiskFullFailsWritesClearlyWhileReadsGoOn) {
  const std::string dir = TempDir();
  ServerProcess server = StartServer({"--data-dir", dir, "--fsync", "always",
                                      "--fault-log-io", "enospc-after:4000"});
  ASSERT_TRUE(server.process);
  auto c = Connect(server.address);
  ASSERT_TRUE(c);
  int acked = 0;
  Status failure;
  for (int i = 0; i < 200; ++i) {
    auto r = c->Put("k" + std::to_string(i), "value-" + std::to_string(i));
    if (!r.ok()) {
      failure = r.status();
      break;
    }
    ++acked;
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_EQ(failure.code(), StatusCode::kIOError) << failure.ToString();
  EXPECT_NE(failure.message().find("No space left"), std::string::npos)
      << failure.ToString();
  // Later writes are refused too; reads go on.
  EXPECT_EQ(c->Put("another", "x").status().code(), StatusCode::kIOError);
  for (int i = 0; i < acked; ++i) {
    auto g = c->Get("k" + std::to_string(i));
    ASSERT_TRUE(g.ok()) << i;
    EXPECT_EQ(g->value, "value-" + std::to_string(i));
  }
  auto stats = c.session->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->Get("log_write_errors"), 1u);
  EXPECT_EQ(stats->Get("log_failing"), 1u);
  EXPECT_EQ(stats->Text("fsync_policy"), "always");
  // Nothing already durable was damaged: a restart (without the fault)
  // recovers every acknowledged write.
  ASSERT_TRUE(server.process->Signal(SIGKILL).ok());
  (void)server.process->Wait(std::chrono::seconds(10));
  ServerProcess again = StartServer({"--data-dir", dir});
  ASSERT_TRUE(again.process);
  auto c2 = Connect(again.address);
  ASSERT_TRUE(c2);
  for (int i = 0; i < acked; ++i) {
    EXPECT_TRUE(c2->Get("k" + std::to_string(i)).ok()) << i;
  }
  fs::remove_all(dir);
}

TEST(Durability, CorruptLogRefusesToStartUnlessTruncating) {
  const std::string dir = TempDir();
  {
    ServerProcess server = StartServer({"--data-dir", dir, "--fsync", "no"});
    ASSERT_TRUE(server.process);
    auto c = Connect(server.address);
    ASSERT_TRUE(c);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(c->Put("k" + std::to_string(i), "v").ok());
    }
    auto stats = c.session->Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->Get("log_bytes"), 0u);
    ASSERT_TRUE(server.process->Signal(SIGKILL).ok());
    (void)server.process->Wait(std::chrono::seconds(10));
  }
  std::string log;
  for (const auto& e : fs::directory_iterator(dir + "/hash/p0")) {
    if (e.path().extension() == ".rlog" && fs::file_size(e.path()) > 0) {
      log = e.path().string();
    }
  }
  ASSERT_FALSE(log.empty());
  {
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('#');
  }
  SpawnOptions o;
  o.argv = {testing::ServerBinary(),
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "64M",
            "--transport",
            std::string(TransportName(TestTransport())),
            "--data-dir",
            dir};
  o.merge_stderr = true;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok());
  auto code = (*p)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.ok()) << "the server started on a corrupt log";
  EXPECT_EQ(*code, 1);
  ASSERT_TRUE((*p)->ReadToEnd(std::chrono::seconds(5)).ok());
  EXPECT_NE((*p)->output().find(log + " at byte offset"), std::string::npos)
      << (*p)->output();
  EXPECT_NE((*p)->output().find("--recovery=truncate"), std::string::npos);
  ServerProcess server =
      StartServer({"--data-dir", dir, "--recovery", "truncate"});
  ASSERT_TRUE(server.process);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem
