#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace remem::testing {

std::string ServerBinary() { return REMEM_SERVER_BIN; }
std::string CliBinary() { return REMEM_CLI_BIN; }
std::string BenchBinary() { return REMEM_BENCH_BIN; }

Transport TestTransport() {
  const char* t = std::getenv("REMEM_TEST_TRANSPORT");
  if (t == nullptr) return Transport::kShm;
  auto parsed = ParseTransport(t);
  if (!parsed.ok()) {
    std::fprintf(stderr, "REMEM_TEST_TRANSPORT: %s\n",
                 parsed.status().ToString().c_str());
    std::abort();
  }
  return *parsed;
}

ServerProcess StartServer(const std::vector<std::string>& extra,
                          const std::string& memory) {
  SpawnOptions o;
  o.argv = {ServerBinary(), "--memory", memory,
            "--log-level",  "warn",     "--no-pin"};
  auto named = [&](const char* flag) {
    return std::find(extra.begin(), extra.end(), flag) != extra.end();
  };
  // A free loopback port, unless the test names an address.
  if (!named("--listen")) {
    o.argv.push_back("--listen");
    o.argv.push_back("127.0.0.1:0");
  }
  // The test transport, unless the test names one.
  if (!named("--transport")) {
    o.argv.push_back("--transport");
    o.argv.push_back(std::string(TransportName(TestTransport())));
  }
  o.argv.insert(o.argv.end(), extra.begin(), extra.end());
  auto p = Subprocess::Spawn(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  ServerProcess s;
  if (!p.ok()) return s;
  auto line = (*p)->WaitForLine("listening on", std::chrono::seconds(30));
  EXPECT_TRUE(line.ok()) << line.status().ToString();
  if (!line.ok()) return s;
  size_t at = line->find("listening on ") + 13;
  s.address = line->substr(at, line->find(' ', at) - at);
  s.ready_line = *line;
  s.process = std::move(*p);
  return s;
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

}  // namespace remem::testing
