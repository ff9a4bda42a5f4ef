// testing::ServerProcess: a remem-server child process, for tests and
// benchmarks (the one launcher both use).
//
// Start runs the binary with the options' flags on a free loopback port
// (unless told otherwise) and returns once the server printed its ready
// line ("remem-server listening on HOST:PORT (...)"), with the address it
// listens on. The server can then be killed (kill -9), stopped (SIGTERM) and
// restarted on the same address, and its CPU time read. The child dies with
// this process (PR_SET_PDEATHSIG), so a crashed test leaves no server behind.
//
// It is a plain handle: tests reach the child process directly
// (`server.process->Signal(...)`, `->Wait(...)`), and a benchmark that runs
// against a server it did not start holds one with an address and no
// process (External).
//
// Thread contract: one owner thread (as Subprocess).

#ifndef REMEM_TESTING_SERVER_PROCESS_H_
#define REMEM_TESTING_SERVER_PROCESS_H_

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"
#include "util/subprocess.h"

namespace remem::testing {

struct ServerOptions {
  std::string binary;  // the remem-server to run
  // --transport and --listen, unless `flags` names them itself.
  Transport transport = Transport::kShm;
  std::string listen = "127.0.0.1:0";
  std::string memory = "64M";  // --memory ("": the server's default)
  int threads = 0;             // --threads (0: the server's default)
  // The server pins its threads to CPUs unless told not to (--no-pin);
  // tests, which run many servers side by side, leave it off.
  bool pin_threads = false;
  int cpu = -1;  // >= 0: the whole process runs on this CPU (benchmarks)
  std::string log_level = "warn";  // --log-level ("": the default)
  std::vector<std::string> flags;  // more flags, after all of the above
  // Run through this command, e.g. {"ip", "netns", "exec", "ns1"}.
  std::vector<std::string> command_prefix;
  std::vector<std::pair<std::string, std::string>> env;
  std::chrono::milliseconds ready_timeout{30000};
  // When the handle is destroyed with the server still running: stop it
  // (SIGTERM, up to 10 s, then kill -9), so that it removes its files
  // (benchmarks); else kill -9 (tests, which start hundreds).
  bool stop_on_destroy = false;
};

struct ServerProcess {
  ServerProcess() = default;
  ServerProcess(ServerProcess&&) = default;
  ServerProcess& operator=(ServerProcess&&) = default;
  ~ServerProcess();

  ServerOptions options;                // what it was started with
  std::unique_ptr<Subprocess> process;  // null: not started here
  std::string address;                  // host:port it listens on
  std::string ready_line;               // the server's ready line

  // Starts a server and waits for its ready line. Errors: the binary could
  // not run, the server exited first (Unavailable, with what it printed),
  // or TimedOut after options.ready_timeout.
  static Result<ServerProcess> Start(ServerOptions options);
  // A server started by someone else, at `address`: no process.
  static ServerProcess External(std::string address);

  // kill -9, and reaps it. OK if it was not running.
  Status Kill();
  // SIGTERM, and waits for it to exit: its exit code.
  Result<int> Stop(
      std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // SIGSTOP, and returns once the process is stopped (its /proc state):
  // kill() returns before the stop takes effect, and under gVisor a
  // server's threads ran on for a while, serving a test that acted at once
  // as though it were paused. TimedOut after 10 s.
  Status Pause();
  // Starts it again with the same options on the same address (kills a
  // running one first). The ready line and process are replaced.
  Status Restart();
  // CPU seconds the server used so far (NotFound for an external one).
  Result<double> CpuSeconds() const;
  bool running() const;
};

// The argument vector Start runs (`listen` replaces options.listen and any
// --listen in options.flags when not empty). Exposed for tests.
std::vector<std::string> ServerArgv(const ServerOptions& options,
                                    const std::string& listen = "");

// The address in a ready line "... listening on HOST:PORT ...", or
// InvalidArgument.
Result<std::string> AddressFromReadyLine(const std::string& line);

}  // namespace remem::testing

#endif  // REMEM_TESTING_SERVER_PROCESS_H_
