// The testing library (src/testing) itself: the race workload must pass a
// correct store and catch a broken one (stale, torn, lost writes), and the
// server launcher builds the command lines the tests and benchmarks rely on.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "testing/kv_store.h"
#include "testing/race.h"
#include "testing/server_process.h"

namespace remem::testing {
namespace {

// A map under a lock: linearizable by construction. `bug` makes its
// readers (or writers) misbehave the way a broken one-sided reader would.
class FakeStore : public KvStore {
 public:
  enum class Bug { kNone, kStaleRead, kTornRead, kLostWrite };
  explicit FakeStore(Bug bug) : bug_(bug) {}
  // Readers' gets that found their key.
  uint64_t found_by_readers() const { return found_by_readers_.load(); }

  Result<std::unique_ptr<KvClient>> NewClient(Role role) override {
    return std::unique_ptr<KvClient>(new Client(this, role));
  }
  Result<KvStoreCounters> Counters() override { return KvStoreCounters{}; }

 private:
  struct Entry {
    KvValue now;
    std::optional<KvValue> before;  // the value it replaced
  };
  struct Yield {
    ~Yield() { std::this_thread::yield(); }
  };
  class Client : public KvClient {
   public:
    Client(FakeStore* s, Role role) : s_(s), role_(role) {}
    Result<KvValue> Get(std::string_view key) override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      ++gets_;
      auto it = s_->map_.find(std::string(key));
      if (it == s_->map_.end()) return Status::NotFound("");
      const Entry& e = it->second;
      if (role_ == Role::kReader) s_->found_by_readers_.fetch_add(1);
      if (role_ == Role::kReader && e.before && gets_ % 3 == 0) {
        if (s_->bug_ == Bug::kStaleRead) return *e.before;
        if (s_->bug_ == Bug::kTornRead) {
          KvValue torn = e.now;
          torn.value = e.now.value.substr(0, e.now.value.size() / 2) +
                       e.before->value.substr(std::min(
                           e.before->value.size(), e.before->value.size() / 2));
          return torn;
        }
      }
      return e.now;
    }
    Result<uint64_t> Put(std::string_view key,
                         std::string_view value) override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      return s_->Write(key, value);
    }
    Result<uint64_t> PutIfAbsent(std::string_view key,
                                 std::string_view value) override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      if (s_->map_.count(std::string(key))) return Status::AlreadyExists("");
      return s_->Write(key, value);
    }
    Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                   uint64_t expected) override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      auto it = s_->map_.find(std::string(key));
      if (it == s_->map_.end()) return Status::NotFound("");
      if (it->second.now.version != expected) return Status::Conflict("");
      return s_->Write(key, value);
    }
    Status Delete(std::string_view key) override {
      std::lock_guard<std::mutex> lock(s_->mu_);
      ++s_->version_;
      return s_->map_.erase(std::string(key)) ? Status::OK()
                                              : Status::NotFound("");
    }
    KvReadCounters read_counters() const override { return {gets_, 0, 0}; }

   private:
    FakeStore* s_;
    Role role_;
    uint64_t gets_ = 0;
  };

  uint64_t Write(std::string_view key, std::string_view value) {
    const uint64_t v = ++version_;
    if (bug_ == Bug::kLostWrite && v % 11 == 0) return v;  // acked, dropped
    Entry& e = map_[std::string(key)];
    if (!e.now.value.empty() || e.now.version) e.before = e.now;
    e.now = {std::string(value), v};
    return v;
  }

  const Bug bug_;
  std::atomic<uint64_t> found_by_readers_{0};
  std::mutex mu_;
  std::map<std::string, Entry> map_;
  uint64_t version_ = 0;
};

RaceOptions QuickRace() {
  RaceOptions o;
  o.writers = 2;
  o.readers = 2;
  // Long enough that readers and writers overlap however the threads are
  // scheduled; short enough to check in a fraction of a second.
  o.min_duration = std::chrono::milliseconds(100);
  o.min_writes = 200;
  o.max_writes = 20000;
  o.max_reads_per_reader = 3000;
  o.grow_every = 4;
  o.churn_keys = 20;
  return o;
}

TEST(Race, ACorrectStorePasses) {
  FakeStore store(FakeStore::Bug::kNone);
  RaceOptions options = QuickRace();
  // Readers a loaded machine starves still read while the writers write.
  options.min_reads = 200;
  auto report = RunRace(&store, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->Verdict().ok()) << report->Verdict().ToString();
  // 2 writers x at least MinWritesPerWriter tries, of which most are
  // acknowledged. A fixed 100 failed under TSan (scaled down) with 95.
  EXPECT_GE(report->writes, MinWritesPerWriter(options) / 2);
  EXPECT_GT(report->size_switches, 0u);
  EXPECT_GT(report->found, 0u);
}

TEST(Race, StaleTornAndLostAreEachCaught) {
  for (FakeStore::Bug bug :
       {FakeStore::Bug::kStaleRead, FakeStore::Bug::kTornRead,
        FakeStore::Bug::kLostWrite}) {
    SCOPED_TRACE(int(bug));
    FakeStore store(bug);
    RaceOptions o = QuickRace();
    // The writers go on until the readers have met keys often (a third of
    // those reads misbehave): on a loaded machine the readers can spend
    // their whole recorded history before the writers have written, and
    // then there is nothing to catch.
    o.keep_going = [&store] { return store.found_by_readers() < 600; };
    auto report = RunRace(&store, o);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    const Status verdict = report->Verdict();
    EXPECT_FALSE(verdict.ok()) << report->Summary();
    switch (bug) {
      case FakeStore::Bug::kTornRead:
        EXPECT_GT(report->malformed, 0u);
        EXPECT_NE(verdict.message().find("torn or phantom"), std::string::npos)
            << verdict.ToString();
        break;
      case FakeStore::Bug::kStaleRead:
        // In the recorded history, or by a reader alone past it.
        EXPECT_TRUE(!report->not_linearizable.empty() || report->backwards > 0)
            << report->Summary();
        break;
      default:  // only the history shows a lost write
        EXPECT_FALSE(report->not_linearizable.empty()) << report->Summary();
    }
  }
}

TEST(Race, NothingRunIsNotAPass) {
  RaceReport empty;
  EXPECT_FALSE(empty.Verdict().ok());
  RaceReport errors;
  errors.writes = errors.reads = 1;
  EXPECT_TRUE(errors.Verdict().ok());
  errors.errors = 1;
  errors.first_error = "hot0: Unavailable";
  EXPECT_NE(errors.Verdict().message().find("hot0: Unavailable"),
            std::string::npos);
}

TEST(ServerProcess, CommandLines) {
  ServerOptions o;
  o.binary = "/bin/remem-server";
  o.memory = "32M";
  o.transport = Transport::kTcp;
  EXPECT_EQ(ServerArgv(o),
            (std::vector<std::string>{
                "/bin/remem-server", "--memory", "32M", "--log-level", "warn",
                "--no-pin", "--listen", "127.0.0.1:0", "--transport", "tcp"}));
  // Flags that name --listen or --transport replace the defaults.
  o.flags = {"--listen", "10.0.0.1:7", "--transport", "shm", "--threads", "2"};
  o.command_prefix = {"ip", "netns", "exec", "a"};
  o.pin_threads = true;
  o.memory.clear();
  EXPECT_EQ(ServerArgv(o), (std::vector<std::string>{
                               "ip", "netns", "exec", "a", "/bin/remem-server",
                               "--log-level", "warn", "--listen", "10.0.0.1:7",
                               "--transport", "shm", "--threads", "2"}));
  // A restart keeps the address it had.
  const auto again = ServerArgv(o, "10.0.0.1:41000");
  EXPECT_EQ(std::count(again.begin(), again.end(), "--listen"), 1);
  EXPECT_NE(std::find(again.begin(), again.end(), "10.0.0.1:41000"),
            again.end());
}

TEST(ServerProcess, ReadyLine) {
  auto a = AddressFromReadyLine(
      "remem-server listening on 127.0.0.1:41234 (2 threads, 64.0 MiB)");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, "127.0.0.1:41234");
  EXPECT_FALSE(AddressFromReadyLine("remem-server starting").ok());
  EXPECT_FALSE(AddressFromReadyLine("listening on nowhere").ok());
}

TEST(ServerProcess, AServerThatCannotStartSaysWhy) {
  ServerOptions o;
  o.binary = "/nonexistent/remem-server";
  auto s = ServerProcess::Start(o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/nonexistent/remem-server"),
            std::string::npos)
      << s.status().ToString();
}

}  // namespace
}  // namespace remem::testing
