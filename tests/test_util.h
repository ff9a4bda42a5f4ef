// Helpers for remem's process-level tests: start the real remem-server
// binary on a free loopback port and wait for its ready line.

#ifndef REMEM_TESTS_TEST_UTIL_H_
#define REMEM_TESTS_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "remem/hash.h"
#include "remem/options.h"
#include "remem/session.h"
#include "util/subprocess.h"

namespace remem::testing {

// Paths of the binaries under test (set by CMake).
std::string ServerBinary();
std::string CliBinary();
std::string BenchBinary();

// The transport the current test process uses: REMEM_TEST_TRANSPORT
// (shm or tcp; default shm; anything else aborts the test program). One UCX
// transport per process, so ctest runs the suites once per transport.
Transport TestTransport();

struct ServerProcess {
  std::unique_ptr<Subprocess> process;
  std::string address;
  std::string ready_line;
};

// Starts remem-server with `extra` flags on 127.0.0.1:0 and the test
// transport, and waits until it is listening.
ServerProcess StartServer(const std::vector<std::string>& extra = {},
                          const std::string& memory = "64M");

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

// Runs a command to completion, capturing stdout; returns exit code.
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
