#include "util/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

namespace remem {

using Clock = std::chrono::steady_clock;

namespace {

// Every child not yet reaped, for StopAll. A pid leaves the set before it
// is reaped, under the lock, so a pid in the set is never one that another
// process took over. Never destroyed: StopAll may run while the process
// exits.
std::mutex& LiveMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<pid_t>& Live() {
  static auto* live = new std::set<pid_t>();
  return *live;
}
// Set by StopAll, under LiveMutex: nothing is forked after it.
bool g_stopped_all = false;

// Every child is forked on one thread that lives as long as the process.
// PR_SET_PDEATHSIG (in Spawn's child) fires when the *thread* that forked
// the child ends, not the process: a server started from a helper thread
// (remem-bench failover --join started the joining server on one) was
// killed with SIGKILL the moment that thread returned, and a client
// writing to it saw its session close.
class Spawner {
 public:
  // Never destroyed: its thread serves until the process exits.
  static Spawner& Get() {
    static Spawner* spawner = new Spawner();
    return *spawner;
  }
  // fork() on the spawner's thread; the child runs `in_child` (which must
  // not return: it execs or _exits). The parent's pid result, or -1 with
  // *error set.
  pid_t Fork(const std::function<void()>& in_child, int* error) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return job_ == nullptr; });
    Job job{&in_child};
    job_ = &job;
    cv_.notify_all();
    cv_.wait(lock, [&job] { return job.done; });
    *error = job.error;
    return job.pid;
  }

 private:
  struct Job {
    const std::function<void()>* in_child;
    pid_t pid = -1;
    int error = 0;
    bool done = false;
  };
  Spawner() {
    std::thread([this] { Run(); }).detach();
  }
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return job_ != nullptr && !job_->done; });
      Job* job = job_;
      lock.unlock();
      // A child is in Live() from the moment it exists: StopAll, which
      // holds this lock, stops it or finds that it was never forked (an
      // interrupt between the fork and a later registration left the
      // child out). The child itself only execs or _exits.
      std::unique_lock<std::mutex> live(LiveMutex());
      pid_t pid = -1;
      int error = ECANCELED;
      if (!g_stopped_all) {
        pid = fork();
        if (pid == 0) {
          (*job->in_child)();
          _exit(127);
        }
        error = errno;
        if (pid > 0) Live().insert(pid);
      }
      live.unlock();
      lock.lock();
      job->pid = pid;
      job->error = pid < 0 ? error : 0;
      job->done = true;
      job_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  Job* job_ = nullptr;  // under mu_
};

int PidfdOpen(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}
void PidfdSignal(int pidfd, int sig) {
  (void)syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0);
}
// Whether the process behind `pidfd` exited within `timeout`.
bool PidfdExited(int pidfd, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd pfd{pidfd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    const int rc = poll(&pfd, 1,
                        static_cast<int>(std::max<int64_t>(
                            0, static_cast<int64_t>(left.count()))));
    if (rc > 0) return true;
    if (rc == 0 || errno != EINTR) return false;
  }
}

}  // namespace

size_t Subprocess::StopAll(std::chrono::milliseconds grace) {
  std::vector<int> pidfds;
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    g_stopped_all = true;
    for (pid_t pid : Live()) {
      const int fd = PidfdOpen(pid);
      if (fd < 0) continue;
      PidfdSignal(fd, SIGTERM);
      pidfds.push_back(fd);
    }
  }
  const auto deadline = Clock::now() + grace;
  for (int fd : pidfds) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (!PidfdExited(fd, std::max(left, std::chrono::milliseconds(0)))) {
      PidfdSignal(fd, SIGKILL);
      (void)PidfdExited(fd, std::chrono::seconds(5));
    }
    close(fd);
  }
  return pidfds.size();
}

Result<std::unique_ptr<Subprocess>> Subprocess::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return Status::InvalidArgument("empty argv");
  int fds[2] = {-1, -1};
  if (o.capture_stdout && pipe2(fds, O_CLOEXEC) != 0) {
    return Status::IOError(std::string("pipe: ") + std::strerror(errno));
  }
  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (const auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  // The child runs where the calling thread may run, as if forked by it.
  cpu_set_t caller_cpus;
  CPU_ZERO(&caller_cpus);
  const bool have_caller_cpus =
      sched_getaffinity(0, sizeof(caller_cpus), &caller_cpus) == 0;
  const std::function<void()> in_child = [&] {
    // Die with the parent: a crashed test or benchmark must not leave
    // servers behind (holding its output pipe open, among other things).
    // (With the thread that forked it, which is why that is the spawner's.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (o.capture_stdout) dup2(fds[1], STDOUT_FILENO);
    if (o.capture_stdout && o.merge_stderr) dup2(fds[1], STDERR_FILENO);
    if (o.quiet_stderr) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, STDERR_FILENO);
    }
    for (const auto& [k, v] : o.env) setenv(k.c_str(), v.c_str(), 1);
    if (o.cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
    } else if (have_caller_cpus) {
      sched_setaffinity(0, sizeof(caller_cpus), &caller_cpus);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  };
  int error = 0;
  const pid_t pid = Spawner::Get().Fork(in_child, &error);
  if (pid < 0) {
    if (o.capture_stdout) {
      close(fds[0]);
      close(fds[1]);
    }
    if (error == ECANCELED) {
      return Status::Unavailable(
          "no process is started once StopAll has run (the program is "
          "being interrupted)");
    }
    return Status::IOError(std::string("fork: ") + std::strerror(error));
  }
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;  // in Live() already (Spawner::Run)
  if (o.capture_stdout) {
    close(fds[1]);
    p->out_fd_ = fds[0];
  }
  return p;
}

Subprocess::~Subprocess() {
  if (!reaped_ && pid_ > 0) {
    {
      std::lock_guard<std::mutex> lock(LiveMutex());
      Live().erase(pid_);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

Result<std::string> Subprocess::WaitForLine(const std::string& needle,
                                            std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    size_t nl;
    while ((nl = output_.find('\n', scanned_)) != std::string::npos) {
      std::string line = output_.substr(scanned_, nl - scanned_);
      scanned_ = nl + 1;
      if (line.find(needle) != std::string::npos) return line;
    }
    if (out_fd_ < 0) return Status::Unavailable("stdout is closed");
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      return Status::TimedOut("no line containing '" + needle + "'");
    }
    pollfd pfd{out_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) {
      return Status::IOError(std::string("poll: ") + std::strerror(errno));
    }
    if (rc <= 0) continue;
    char buf[4096];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      close(out_fd_);
      out_fd_ = -1;
      return Status::Unavailable("process exited before printing '" + needle +
                                 "'");
    }
    output_.append(buf, static_cast<size_t>(n));
  }
}

// Not WaitForLine for a NUL byte, as it was: output that has one (a binary
// value a command prints) ended the read there, and a child then blocked
// on a full pipe that nobody read until the caller's Wait timed out.
Status Subprocess::ReadToEnd(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (out_fd_ >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) return Status::TimedOut("stdout still open");
    pollfd pfd{out_fd_, POLLIN, 0};
    const int rc = poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) {
      return Status::IOError(std::string("poll: ") + std::strerror(errno));
    }
    if (rc <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(out_fd_);
      out_fd_ = -1;
      break;
    }
    output_.append(buf, static_cast<size_t>(n));
  }
  return Status::OK();
}

Status Subprocess::Signal(int sig) {
  if (reaped_) return Status::NotFound("process already exited");
  if (kill(pid_, sig) != 0) {
    return Status::IOError(std::string("kill: ") + std::strerror(errno));
  }
  return Status::OK();
}

bool Subprocess::running() {
  if (reaped_) return false;
  int st = 0;
  pid_t r;
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) Live().erase(pid_);
  }
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  return true;
}

Result<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (reaped_) return exit_code_;
  // A pidfd becomes readable when the process exits.
  int pidfd = PidfdOpen(pid_);
  if (pidfd < 0) {
    return Status::IOError(std::string("pidfd_open: ") + std::strerror(errno));
  }
  auto deadline = Clock::now() + timeout;
  while (running()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      close(pidfd);
      return Status::TimedOut("process " + std::to_string(pid_) +
                              " did not exit");
    }
    pollfd pfd{pidfd, POLLIN, 0};
    (void)poll(&pfd, 1, static_cast<int>(left.count()));
  }
  close(pidfd);
  return exit_code_;
}

Result<double> Subprocess::CpuSeconds() const {
  return ProcessCpuSeconds(pid_);
}

namespace {

// The fields of /proc/<pid>/stat after the ")" that closes the command name
// (the first is the state, field 3 of the whole line).
Result<std::string> StatFields(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) {
    return Status::NotFound("no /proc entry for pid " + std::to_string(pid));
  }
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) {
    return Status::Corruption("bad stat line");
  }
  return stat.substr(close + 2);
}

}  // namespace

Result<char> Subprocess::State() const {
  auto fields = StatFields(pid_);
  if (!fields.ok()) return fields.status();
  return (*fields)[0];
}

Result<double> ProcessCpuSeconds(pid_t pid) {
  auto fields = StatFields(pid);
  if (!fields.ok()) return fields.status();
  // utime and stime are fields 14 and 15 of the whole line.
  std::istringstream ss(*fields);
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && ss >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(utime + stime) / hz;
}

std::string SelfDirectory() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace remem
