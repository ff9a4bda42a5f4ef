// What an operator meets (issue #9, "operations traps"): a restart binds its
// address again at once; SIGHUP reopens the log file (and does not switch
// UCX to trace logging); servers started with defaults do not pin their
// threads to one CPU; log lines about a connection name its peer.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace remem {
namespace {

namespace fs = std::filesystem;
using testing::ServerBinary;
using testing::TestTransport;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "remem-ops-XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A server spawned by hand (not through StartServer, which passes
// --no-pin): its address from the ready line.
struct Spawned {
  std::unique_ptr<Subprocess> process;
  std::string address;
};
Spawned Spawn(std::vector<std::string> flags, int cpu = -1) {
  SpawnOptions o;
  o.argv = {ServerBinary(), "--memory", "32M", "--transport",
            std::string(TransportName(TestTransport()))};
  o.argv.insert(o.argv.end(), flags.begin(), flags.end());
  o.cpu = cpu;
  o.merge_stderr = true;
  Spawned s;
  auto p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return s;
  auto line = (*p)->WaitForLine("listening on", std::chrono::seconds(30));
  EXPECT_TRUE(line.ok()) << line.status().ToString() << (*p)->output();
  if (!line.ok()) return s;
  const size_t at = line->find("listening on ") + 13;
  s.address = line->substr(at, line->find(' ', at) - at);
  s.process = std::move(*p);
  return s;
}

// "Cpus_allowed_list" of each named thread of `pid`.
std::map<std::string, std::string> ThreadCpus(pid_t pid) {
  std::map<std::string, std::string> out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& e : fs::directory_iterator(task)) {
    const std::string comm = ReadFile(e.path().string() + "/comm");
    std::istringstream status(ReadFile(e.path().string() + "/status"));
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        std::string name = comm.substr(0, comm.find('\n'));
        std::string list = line.substr(line.find(':') + 1);
        list.erase(0, list.find_first_not_of(" \t"));
        out[name] = list;
      }
    }
  }
  return out;
}

std::string OnlineCpus() {
  std::string s = ReadFile("/sys/devices/system/cpu/online");
  return s.substr(0, s.find('\n'));
}

TEST(Ops, ARestartBindsItsAddressAgainAtOnce) {
  auto first = Spawn({"--listen", "127.0.0.1:0"});
  ASSERT_NE(first.process, nullptr);
  {
    // A session, so the server's side of a connection closes first on the
    // way down (TIME_WAIT on the server's address).
    auto c = testing::ConnectHashOrDie(first.address);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->Put("k", "v").ok());
    ASSERT_TRUE(first.process->Signal(SIGTERM).ok());
    ASSERT_TRUE(first.process->Wait(std::chrono::seconds(20)).ok());
  }
  auto again = Spawn({"--listen", first.address});
  ASSERT_NE(again.process, nullptr) << "the address stayed in use";
  EXPECT_EQ(again.address, first.address);
  auto c = testing::ConnectHashOrDie(again.address);
  EXPECT_TRUE(c);
}

TEST(Ops, SighupReopensTheLogFileAndLeavesUcxLoggingAlone) {
  const std::string dir = TempDir();
  const std::string log = dir + "/remem.log";
  auto s = Spawn(
      {"--listen", "127.0.0.1:0", "--log-file", log, "--log-level", "info"});
  ASSERT_NE(s.process, nullptr);
  ASSERT_TRUE(fs::exists(log));
  EXPECT_EQ(fs::status(log).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // Rotate: move the file away, then SIGHUP.
  fs::rename(log, log + ".1");
  const size_t before = s.process->output().size();
  ASSERT_TRUE(s.process->Signal(SIGHUP).ok());
  // The event: the server writes its reopen line into a new file.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         ReadFile(log).find("log file reopened") == std::string::npos) {
    std::this_thread::yield();
  }
  EXPECT_NE(ReadFile(log).find("log file reopened"), std::string::npos);
  // Work after the signal: with UCX's own SIGHUP handler, UCX would now log
  // at trace-data level to the server's output.
  auto c = testing::ConnectHashOrDie(s.address);
  ASSERT_TRUE(c);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(c->Put("k", "v").ok());
  ASSERT_TRUE(c.session->Ping().ok());
  c = {};
  ASSERT_TRUE(s.process->Signal(SIGTERM).ok());
  ASSERT_TRUE(s.process->ReadToEnd(std::chrono::seconds(20)).ok());
  const std::string after = s.process->output().substr(before);
  EXPECT_EQ(after.find("UCX  TRACE"), std::string::npos) << after;
  EXPECT_EQ(after.find("UCX  DEBUG"), std::string::npos) << after;
  EXPECT_NE(after.find("remem-server stopped"), std::string::npos) << after;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(Ops, ServersStartedWithDefaultsDoNotShareAPinnedCpu) {
  auto a = Spawn({"--listen", "127.0.0.1:0", "--threads", "2"});
  auto b = Spawn({"--listen", "127.0.0.1:0", "--threads", "2"});
  ASSERT_NE(a.process, nullptr);
  ASSERT_NE(b.process, nullptr);
  const std::string all = OnlineCpus();
  for (const Spawned* s : {&a, &b}) {
    auto cpus = ThreadCpus(s->process->pid());
    ASSERT_EQ(cpus.count("remem-p0"), 1u);
    ASSERT_EQ(cpus.count("remem-p1"), 1u);
    // Not pinned: every thread may run on every online CPU.
    EXPECT_EQ(cpus["remem-p0"], all);
    EXPECT_EQ(cpus["remem-p1"], all);
  }
  // Narrowed by the operator (as taskset does): pinned, in order.
  auto pinned = Spawn({"--listen", "127.0.0.1:0"}, /*cpu=*/0);
  ASSERT_NE(pinned.process, nullptr);
  EXPECT_EQ(ThreadCpus(pinned.process->pid())["remem-p0"], "0");
  // Explicit.
  const int last = int(sysconf(_SC_NPROCESSORS_ONLN)) - 1;
  auto explicit_cpus =
      Spawn({"--listen", "127.0.0.1:0", "--cpus", std::to_string(last)});
  ASSERT_NE(explicit_cpus.process, nullptr);
  EXPECT_EQ(ThreadCpus(explicit_cpus.process->pid())["remem-p0"],
            std::to_string(last));
  // A bad list is a usage error.
  auto bad = testing::RunCommand(
      {ServerBinary(), "--listen", "127.0.0.1:0", "--cpus", "a-b"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
}

TEST(Ops, LogLinesAboutAConnectionNameItsPeer) {
  char path[] = "/tmp/remem-ops-secret-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "s3cret\n", 7), 7);
  close(fd);
  auto s = Spawn({"--listen", "127.0.0.1:0", "--auth-file", path});
  ASSERT_NE(s.process, nullptr);
  SessionOptions o;
  o.server = s.address;
  o.transport = TestTransport();
  o.secret = "wrong";
  auto refused = Session::Connect(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  // The server's warning names the client's address.
  ASSERT_TRUE(
      s.process->WaitForLine("authentication failed", std::chrono::seconds(20))
          .ok())
      << s.process->output();
  const std::string& out = s.process->output();
  const size_t at = out.find("authentication failed");
  const size_t line_start = out.rfind('\n', at) + 1;
  const std::string line =
      out.substr(line_start, out.find('\n', at) - line_start);
  EXPECT_NE(line.find("from 127.0.0.1:"), std::string::npos) << line;
  unlink(path);
}

}  // namespace
}  // namespace remem
