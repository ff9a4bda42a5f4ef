// Subprocess: starts a program with a pipe on its standard output, optional
// extra environment and CPU pinning, and lets the parent wait for a line it
// prints (how remem-bench and the tests know a server is ready: it prints
// "listening on ..." once it accepts connections). The child dies with the
// parent process (PR_SET_PDEATHSIG), whichever thread spawned it: every
// child is forked on one thread that lives as long as the process.
//
// Thread contract: Spawn and StopAll from any thread; a Subprocess is not
// thread-safe: one owner.

#ifndef REMEM_UTIL_SUBPROCESS_H_
#define REMEM_UTIL_SUBPROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remem/status.h"

namespace remem {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program path
  std::vector<std::pair<std::string, std::string>> env;  // added/overridden
  int cpu = -1;                // pin the child to this CPU (-1: inherit)
  bool capture_stdout = true;  // else the child shares our stdout
  bool quiet_stderr = false;   // send the child's stderr to /dev/null
  bool merge_stderr = false;   // send the child's stderr into the stdout pipe
};

class Subprocess {
 public:
  static Result<std::unique_ptr<Subprocess>> Spawn(const SpawnOptions& opts);
  // Stops every child spawned here and not yet reaped, whoever owns it:
  // SIGTERM (a server then shuts down cleanly), and SIGKILL to those still
  // running after `grace`. Returns once all have exited (they are left for
  // their owners to reap). For an interrupted program (util/interrupt.h);
  // any thread. Returns how many it signalled. Spawn fails (Unavailable)
  // from then on: a child forked while it ran is one it stopped.
  static size_t StopAll(std::chrono::milliseconds grace);
  ~Subprocess();  // SIGKILLs and reaps the child if still running

  pid_t pid() const { return pid_; }
  // Reads stdout until a line containing `needle`; returns that line.
  // Unavailable if the child closes stdout first, TimedOut at `timeout`.
  Result<std::string> WaitForLine(const std::string& needle,
                                  std::chrono::milliseconds timeout);
  // All stdout read so far (including lines consumed by WaitForLine).
  const std::string& output() const { return output_; }
  // Reads the rest of stdout until EOF (or timeout).
  Status ReadToEnd(std::chrono::milliseconds timeout);
  Status Signal(int sig);
  // Waits for exit; returns the exit code, or 128+signal if killed.
  Result<int> Wait(std::chrono::milliseconds timeout);
  bool running();
  // User+system CPU time consumed so far, from /proc/<pid>/stat.
  Result<double> CpuSeconds() const;
  // Its state letter in /proc/<pid>/stat ('R', 'S', 'T' once a SIGSTOP took
  // effect, ...).
  Result<char> State() const;

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

// CPU seconds (user+system) of any process, from /proc/<pid>/stat.
Result<double> ProcessCpuSeconds(pid_t pid);

// Directory holding the running executable.
std::string SelfDirectory();

}  // namespace remem

#endif  // REMEM_UTIL_SUBPROCESS_H_
