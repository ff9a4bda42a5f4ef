// Liveness of one-sided reads (BRIEF.md; docs/ARCHITECTURE.md, "Liveness of
// one-sided reads"): a client reading one-sided in a loop while its server
// is killed with kill -9 and restarted on the same port (with the same data
// directory, or none), and another client writes a new value. The reader
// must never return the old value from a get that started after that write
// was acknowledged, and must see Unavailable within the lease (1 s).
// Runs over shared memory (reads of mapped memory that outlives the server)
// and over tcp (reads the server performs).

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "test_util.h"
#include "testing/clock.h"

namespace remem {
namespace {

namespace fs = std::filesystem;
using testing::NowNs;
using testing::StartServer;
using testing::TestTransport;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "remem-live-XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

struct ReaderReport {
  std::map<std::string, uint64_t> last_start;  // value -> latest get start
  uint64_t first_unavailable = 0;
  uint64_t reads = 0;
  uint64_t reconnects = 0;
  uint64_t errors = 0;
};

ReaderReport Parse(const std::string& out) {
  ReaderReport r;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string word;
    l >> word;
    if (word == "VALUE") {
      std::string value;
      uint64_t at = 0;
      l >> value >> at;
      r.last_start[value] = at;
    } else if (word == "SUMMARY") {
      std::string kv;
      while (l >> kv) {
        const size_t eq = kv.find('=');
        const std::string k = kv.substr(0, eq);
        const uint64_t v = std::stoull(kv.substr(eq + 1));
        if (k == "reads") r.reads = v;
        if (k == "reconnects") r.reconnects = v;
        if (k == "errors") r.errors = v;
        if (k == "first_unavailable") r.first_unavailable = v;
      }
    }
  }
  return r;
}

void RunKillAndRestart(bool with_data_dir) {
  const std::string dir = TempDir();
  std::vector<std::string> flags = {"--threads", "1", "--runtime-dir", dir};
  if (with_data_dir) {
    flags.insert(flags.end(),
                 {"--data-dir", dir + "/data", "--fsync", "always"});
  }
  auto server = StartServer(flags, "64M");
  ASSERT_NE(server.process, nullptr);
  const std::string address = server.address;
  {
    auto c = testing::ConnectHashOrDie(address);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Put("k", "old").ok());
  }
  SpawnOptions o;
  o.argv = {REMEM_LIVENESS_READER_BIN, address,
            std::string(TransportName(TestTransport())), "k"};
  auto reader = Subprocess::Spawn(o);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_TRUE(
      (*reader)->WaitForLine("FIRST old", std::chrono::seconds(30)).ok())
      << (*reader)->output();

  // Kill the server while the reader reads, restart it on the same port.
  const uint64_t killed = NowNs();
  ASSERT_TRUE(server.Kill().ok());
  const Status restarted = server.Restart();
  ASSERT_TRUE(restarted.ok()) << restarted.ToString();
  ASSERT_EQ(server.address, address);
  const uint64_t listening = NowNs();

  // Another client writes a new value; note when it was acknowledged.
  uint64_t acked = 0;
  {
    auto c = testing::ConnectHashOrDie(address);
    ASSERT_TRUE(c);
    if (with_data_dir) {
      auto got = c->Get("k");
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->value, "old");  // recovered
    }
    ASSERT_TRUE(c->Put("k", "new").ok());
    acked = NowNs();
  }
  // The reader reconnects and reads the new value; then it reports.
  ASSERT_TRUE(
      (*reader)->WaitForLine("FIRST new", std::chrono::seconds(30)).ok())
      << (*reader)->output();
  ASSERT_TRUE((*reader)->Signal(SIGUSR1).ok());
  ASSERT_TRUE((*reader)->ReadToEnd(std::chrono::seconds(20)).ok());
  ASSERT_TRUE((*reader)->Wait(std::chrono::seconds(10)).ok());
  const ReaderReport report = Parse((*reader)->output());
  EXPECT_EQ(report.errors, 0u) << (*reader)->output();
  ASSERT_GT(report.last_start.count("old"), 0u) << (*reader)->output();
  // The property: no get that started after the new value was acknowledged
  // returned the old one.
  EXPECT_LT(report.last_start.at("old"), acked)
      << "a get started " << (report.last_start.at("old") - acked) / 1000
      << " us after the write's acknowledgement returned the old value";
  // Unavailable within the lease of the kill.
  ASSERT_GT(report.first_unavailable, 0u) << (*reader)->output();
  const uint64_t to_unavailable = report.first_unavailable - killed;
  EXPECT_LT(to_unavailable, 1'000'000'000ull)
      << "Unavailable came " << to_unavailable / 1000000
      << " ms after the kill";
  ::testing::Test::RecordProperty("kill_to_unavailable_us",
                                  int(to_unavailable / 1000));
  ::testing::Test::RecordProperty("kill_to_listening_ms",
                                  int((listening - killed) / 1000000));
  std::printf(
      "reader: %llu gets, %llu reconnects; Unavailable %.1f ms after the "
      "kill; the restarted server listened %.1f ms after it\n",
      static_cast<unsigned long long>(report.reads),
      static_cast<unsigned long long>(report.reconnects),
      double(to_unavailable) / 1e6, double(listening - killed) / 1e6);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(Liveness, NoOldValueAfterARestartedServerAcknowledgedAWrite) {
  RunKillAndRestart(/*with_data_dir=*/true);
}

TEST(Liveness, NoOldValueAfterARestartedCacheAcknowledgedAWrite) {
  RunKillAndRestart(/*with_data_dir=*/false);
}

}  // namespace
}  // namespace remem
