// zookeeper_fixture start DIR | stop DIR: the ZooKeeper shared by the
// cluster tests of one ctest run (testing::SharedZooKeeperHosts), as ctest's
// fixture tests zookeeper.start and zookeeper.stop.
//
// start: a daemon (a session of its own, its output in DIR/daemon.log)
// starts ZooKeeper, writes DIR/pid and then DIR/hosts, and waits for
// SIGTERM (or for a day to pass, should stop never come); start returns
// once the daemon says ZooKeeper answers. A daemon left by an earlier run
// in DIR is stopped first.
// stop: SIGTERM to the daemon, whose ZooKeeper dies with it (Subprocess's
// PR_SET_PDEATHSIG); waits for it to exit, and removes DIR.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "remem/status.h"
#include "testing/zookeeper_process.h"

namespace remem {
namespace {

namespace fs = std::filesystem;

// Whether process `pid` runs this program with `dir` (a pid file left by
// a run that never stopped its daemon may name another process by now).
bool IsOurDaemon(pid_t pid, const std::string& dir) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  const std::string cmdline((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = cmdline.find('\0', at);
    args.push_back(cmdline.substr(at, end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return args.size() == 3 &&
         fs::path(args[0]).filename() == "zookeeper_fixture" &&
         args[1] == "start" && args[2] == dir;
}

// Ends the daemon named in dir/pid, if it still runs, and removes dir.
Status StopDaemon(const std::string& dir) {
  std::ifstream in(dir + "/pid");
  pid_t pid = 0;
  if (in >> pid && pid > 0 && IsOurDaemon(pid, dir)) {
    // A pidfd says when a process that is not our child has exited.
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (fd >= 0) {
      if (::kill(pid, SIGTERM) == 0) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 30000) != 1) {
          ::kill(pid, SIGKILL);
          (void)::poll(&p, 1, 30000);
        }
      }
      ::close(fd);
    } else if (errno != ESRCH) {
      return Status::IOError(std::string("pidfd_open: ") +
                             std::strerror(errno));
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (ec) return Status::IOError("removing " + dir + ": " + ec.message());
  return Status::OK();
}

// The daemon's life: ZooKeeper up, its address written, SIGTERM awaited.
// Says "ok" or why not on `report`, then closes it.
int RunDaemon(const std::string& dir, int report) {
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGINT);
  sigaddset(&term, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
  auto say = [&](const std::string& what) {
    (void)!::write(report, what.data(), what.size());
    ::close(report);
  };
  auto zk = testing::ZooKeeperProcess::Start();
  if (!zk.ok()) {
    say(zk.status().ToString());
    return 1;
  }
  {
    std::ofstream out(dir + "/hosts.tmp");
    out << (*zk)->hosts() << "\n";
    out.close();
    std::error_code ec;
    fs::rename(dir + "/hosts.tmp", dir + "/hosts", ec);
    if (!out || ec) {
      say("writing " + dir + "/hosts failed");
      return 1;
    }
  }
  say("ok " + (*zk)->hosts());
  const timespec day{24 * 3600, 0};
  while (sigtimedwait(&term, nullptr, &day) < 0 && errno == EINTR) {
  }
  return 0;  // ~ZooKeeperProcess kills it
}

Status Start(const std::string& dir) {
  REMEM_RETURN_IF_ERROR(StopDaemon(dir));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError("creating " + dir + ": " + ec.message());
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::IOError("pipe");
  const pid_t child = ::fork();
  if (child < 0) return Status::IOError("fork");
  if (child == 0) {
    ::close(fds[0]);
    // A session of its own, and no end of ctest's output pipes: ctest waits
    // for those to close before it calls start done.
    ::setsid();
    const int log = ::open((dir + "/daemon.log").c_str(),
                           O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_RDONLY);
    if (log < 0 || null < 0) _exit(1);
    ::dup2(null, STDIN_FILENO);
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    // The daemon is the grandchild: start's caller reaps start alone.
    const pid_t daemon = ::fork();
    if (daemon != 0) _exit(daemon < 0 ? 1 : 0);
    {
      std::ofstream pid(dir + "/pid");
      pid << ::getpid() << "\n";
    }
    _exit(RunDaemon(dir, fds[1]));
  }
  ::close(fds[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::string said;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) said.append(buf, n);
  ::close(fds[0]);
  if (said.rfind("ok ", 0) != 0) {
    std::ifstream log(dir + "/daemon.log");
    const std::string logged((std::istreambuf_iterator<char>(log)),
                             std::istreambuf_iterator<char>());
    (void)StopDaemon(dir);
    return Status::Unavailable("the shared ZooKeeper did not start: " +
                               (said.empty() ? logged : said));
  }
  std::printf("shared ZooKeeper on %s (directory %s)\n", said.c_str() + 3,
              dir.c_str());
  return Status::OK();
}

}  // namespace
}  // namespace remem

int main(int argc, char** argv) {
  const std::string cmd = argc == 3 ? argv[1] : "";
  if (cmd != "start" && cmd != "stop") {
    std::fprintf(stderr, "usage: zookeeper_fixture start|stop DIR\n");
    return 2;
  }
  const remem::Status st =
      cmd == "start" ? remem::Start(argv[2]) : remem::StopDaemon(argv[2]);
  if (!st.ok()) {
    std::fprintf(stderr, "zookeeper_fixture %s: %s\n", cmd.c_str(),
                 st.ToString().c_str());
    return 1;
  }
  return 0;
}
