#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace remem::testing {

std::string ServerBinary() { return REMEM_SERVER_BIN; }
std::string CliBinary() { return REMEM_CLI_BIN; }
std::string BenchBinary() { return REMEM_BENCH_BIN; }

ServerOptions TestServerOptions(const std::vector<std::string>& extra,
                                const std::string& memory) {
  ServerOptions o;
  o.binary = ServerBinary();
  o.transport = TestTransport();
  o.memory = memory;
  o.flags = extra;
  // Debugging a test: its servers' log at another level.
  if (const char* level = std::getenv("REMEM_TEST_LOG_LEVEL")) {
    o.log_level = level;
  }
  return o;
}

ServerProcess StartServer(const std::vector<std::string>& extra,
                          const std::string& memory) {
  auto s = ServerProcess::Start(TestServerOptions(extra, memory));
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return ServerProcess{};
  return std::move(*s);
}

std::unique_ptr<Session> ConnectOrDie(const std::string& address,
                                      const std::string& secret,
                                      ReadPath read_path) {
  SessionOptions o;
  o.server = address;
  o.transport = TestTransport();
  o.secret = secret;
  o.read_path = read_path;
  auto c = Session::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  return std::move(*c);
}

HashClient ConnectHashOrDie(const std::string& address,
                            const std::string& secret, ReadPath read_path) {
  HashClient c;
  c.session = ConnectOrDie(address, secret, read_path);
  if (c.session == nullptr) return c;
  auto h = HashStore::Open(c.session.get());
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (h.ok()) c.store = std::move(*h);
  return c;
}

CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::vector<std::pair<std::string, std::string>> env,
                         int timeout_s) {
  SpawnOptions o;
  o.argv = argv;
  o.env = std::move(env);
  o.merge_stderr = true;
  CommandResult r;
  auto p = Subprocess::Spawn(o);
  if (!p.ok()) return r;
  (void)(*p)->ReadToEnd(std::chrono::seconds(timeout_s));
  auto code = (*p)->Wait(std::chrono::seconds(timeout_s));
  r.exit_code = code.ok() ? *code : -1;
  r.out = (*p)->output();
  return r;
}

uint64_t StatOf(Session* session, const char* name) {
  auto s = session->Stats();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s->Get(name) : ~uint64_t{0};
}

uint64_t WaitForStatOf(Session* session, const char* name, uint64_t want,
                       std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  uint64_t v = StatOf(session, name);
  while (v != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    v = StatOf(session, name);
  }
  return v;
}

bool AllThreadsStopped(pid_t pid) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator(
             "/proc/" + std::to_string(pid) + "/task", ec)) {
      std::ifstream in(task.path() / "stat");
      std::string line;
      std::getline(in, line);
      const size_t close = line.rfind(')');
      if (close == std::string::npos || close + 2 >= line.size() ||
          (line[close + 2] != 'T' && line[close + 2] != 't')) {
        all = false;
        break;
      }
    }
    if (all && !ec) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace remem::testing
