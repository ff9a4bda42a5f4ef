// Helpers for remem's process-level tests, over the testing library
// (src/testing): start the real remem-server binary on a free loopback port
// with the test transport and wait for its ready line; connect sessions and
// hash stores; run the binaries as a user would.

#ifndef REMEM_TESTS_TEST_UTIL_H_
#define REMEM_TESTS_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remem/hash.h"
#include "remem/options.h"
#include "remem/session.h"
#include "testing/server_process.h"
#include "testing/test_transport.h"
#include "util/subprocess.h"

namespace remem::testing {

// Paths of the binaries under test (set by CMake).
std::string ServerBinary();
std::string CliBinary();
std::string BenchBinary();

// The options StartServer uses: ServerBinary(), the test transport,
// `memory`, --no-pin, then `extra` (which may name --listen or --transport
// itself).
ServerOptions TestServerOptions(const std::vector<std::string>& extra = {},
                                const std::string& memory = "64M");

// Starts remem-server with `extra` flags on 127.0.0.1:0 and the test
// transport, and waits until it is listening. On failure, records a test
// failure and returns a ServerProcess whose `process` is null.
ServerProcess StartServer(const std::vector<std::string>& extra = {},
                          const std::string& memory = "64M");

// Waits (at most 5 s) until every thread of `pid` is stopped: a SIGSTOP is
// delivered asynchronously, and a thread may serve a request after kill()
// returned. False if they were not all stopped by then.
bool AllThreadsStopped(pid_t pid);

// Connects a session to `address` with the test transport.
std::unique_ptr<Session> ConnectOrDie(const std::string& address,
                                      const std::string& secret = "",
                                      ReadPath read_path = ReadPath::kAuto);

// A session and its hash store (destroyed store first).
struct HashClient {
  std::unique_ptr<Session> session;
  std::unique_ptr<HashStore> store;
  HashClient() = default;
  HashClient(HashClient&&) = default;
  HashClient& operator=(HashClient&& o) {
    store = std::move(o.store);
    session = std::move(o.session);
    return *this;
  }
  ~HashClient() { store.reset(); }
  HashStore* operator->() const { return store.get(); }
  explicit operator bool() const { return store != nullptr; }
};
// Connects and opens the hash store; a null store on failure (after a test
// failure is recorded).
HashClient ConnectHashOrDie(const std::string& address,
                            const std::string& secret = "",
                            ReadPath read_path = ReadPath::kAuto);

// The server's counter `name` as `session` reads it (a test failure and
// ~0 if the stats call fails).
uint64_t StatOf(Session* session, const char* name);
// Polls StatOf until it equals `want` or `bound` passes; the last value.
uint64_t WaitForStatOf(Session* session, const char* name, uint64_t want,
                       std::chrono::milliseconds bound);

// Runs a command to completion, capturing its standard output and
// standard error, merged; returns exit code.
struct CommandResult {
  int exit_code = -1;
  std::string out;
};
CommandResult RunCommand(
    const std::vector<std::string>& argv,
    std::vector<std::pair<std::string, std::string>> env = {},
    int timeout_s = 60);

}  // namespace remem::testing

#endif  // REMEM_TESTS_TEST_UTIL_H_
