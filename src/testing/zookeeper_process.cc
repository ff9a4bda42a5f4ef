#include "testing/zookeeper_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "util/interrupt.h"

namespace remem::testing {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Binds a TCP socket to `port` on `host` (0: the kernel picks) and
// closes it again: the port bound, or -1 if the bind failed.
int BindAndRelease(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  socklen_t len = sizeof(a);
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    bound = int(ntohs(a.sin_port));
  }
  ::close(fd);
  return bound;
}

// Whether `port` on `host` can be bound now.
bool Bindable(const std::string& host, int port) {
  return BindAndRelease(host, port) == port;
}

// A port no one listens on now, below the kernel's ephemeral range:
// ZooKeeper binds it a second or so later, and an ephemeral port (another
// connection's local port, a server's port 0) taken meanwhile made it exit
// at start (once in a full local run).
Result<int> FreePort(const std::string& host) {
  int low = 32768, high = 60999;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  if (!(range >> low >> high) || low <= 2048) low = 32768;
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(low > 11024 ? 10000 : 1024, low - 1);
  for (int i = 0; i < 200; ++i) {
    const int port = pick(rng);
    if (Bindable(host, port)) return port;
  }
  // The kernel's choice for port 0.
  const int port = BindAndRelease(host, 0);
  if (port < 0) return Status::IOError("binding a free port on " + host);
  return port;
}

// ZooKeeper's four-letter `ruok`, answered `imok` once it serves.
bool AnswersRuok(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::send(fd, "ruok", 4, MSG_NOSIGNAL) == 4) {
    char buf[8] = {};
    size_t got = 0;
    while (got < 4) {
      const ssize_t n = ::recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
      if (n <= 0) break;
      got += size_t(n);
    }
    ok = std::string(buf, got).rfind("imok", 0) == 0;
  }
  ::close(fd);
  return ok;
}

}  // namespace

bool ZooKeeperInstalled(const ZooKeeperOptions& o) {
  std::string jar = o.classpath.substr(o.classpath.rfind(':') + 1);
  if (const char* cp = std::getenv("REMEM_ZOOKEEPER_CLASSPATH")) {
    std::string s(cp);
    jar = s.substr(s.rfind(':') + 1);
  }
  const char* java = std::getenv("REMEM_JAVA");
  return fs::exists(java ? java : o.java) && fs::exists(jar);
}

Result<std::unique_ptr<ZooKeeperProcess>> ZooKeeperProcess::Start(
    ZooKeeperOptions options) {
  if (const char* cp = std::getenv("REMEM_ZOOKEEPER_CLASSPATH")) {
    options.classpath = cp;
  }
  if (const char* java = std::getenv("REMEM_JAVA")) options.java = java;
  if (!ZooKeeperInstalled(options)) {
    return Status::Unavailable(
        "ZooKeeper is not installed (Debian package `zookeeper`; ./dev test "
        "installs it): no " +
        options.java + " or " + options.classpath);
  }
  std::unique_ptr<ZooKeeperProcess> zk(new ZooKeeperProcess());
  zk->options_ = std::move(options);
  char tmpl[] = "/tmp/remem-zk-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::IOError("mkdtemp");
  zk->dir_ = tmpl;
  RemoveOnInterrupt(zk->dir_);
  for (int attempt = 0;; ++attempt) {
    auto port = FreePort(zk->options_.listen_host);
    if (!port.ok()) return port.status();
    zk->port_ = *port;
    std::ofstream cfg(zk->dir_ + "/zoo.cfg");
    cfg << "tickTime=" << zk->options_.tick.count() << "\n"
        << "dataDir=" << zk->dir_ << "/data\n"
        << "clientPort=" << zk->port_ << "\n"
        << "clientPortAddress=" << zk->options_.listen_host << "\n"
        << "admin.enableServer=false\n"
        // Every test's servers connect from loopback (60 by default).
        << "maxClientCnxns=0\n"
        << "4lw.commands.whitelist=ruok\n"
        // No fsync of each transaction: a test's ZooKeeper outlives only
        // process kills and restarts (the page cache keeps its files), and
        // its sync thread took a seventh of ZooKeeper's CPU in the suites.
        << "forceSync=no\n";
    cfg.close();
    if (!cfg) return Status::IOError("writing " + zk->dir_ + "/zoo.cfg");
    Status st = zk->Launch();
    if (st.ok()) return zk;
    // Another process took the port before ZooKeeper bound it (it is held
    // now that ZooKeeper is gone): a new port. Any other failure stands.
    // (In another network namespace the port cannot be looked at here.)
    const bool taken = zk->options_.command_prefix.empty() && !zk->running() &&
                       !Bindable(zk->options_.listen_host, zk->port_);
    if (attempt >= 2 || !taken) return st;
  }
}

Status ZooKeeperProcess::Launch() {
  SpawnOptions so;
  so.argv = options_.command_prefix;
  std::vector<std::string> java = {options_.java,
                                   "-Xmx256m",
                                   "-XX:+UseSerialGC",
                                   "-XX:TieredStopAtLevel=1",
                                   "-Dzookeeper.admin.enableServer=false",
                                   "-cp",
                                   options_.classpath,
                                   "org.apache.zookeeper.server."
                                   "ZooKeeperServerMain",
                                   dir_ + "/zoo.cfg"};
  so.argv.insert(so.argv.end(), java.begin(), java.end());
  so.merge_stderr = true;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return p.status();
  process_ = std::move(*p);
  // No line to wait for (its logger prints nothing): ask until it answers.
  const auto until = Clock::now() + options_.ready_timeout;
  while (Clock::now() < until) {
    if (!process_->running()) {
      (void)process_->ReadToEnd(std::chrono::milliseconds(1000));
      return Status::Unavailable("ZooKeeper exited at start: " +
                                 process_->output());
    }
    bool up = false;
    // Listening on every interface: ask on loopback.
    const std::string probe_host =
        options_.listen_host == "0.0.0.0" ? "127.0.0.1" : options_.listen_host;
    if (options_.command_prefix.empty()) {
      up = AnswersRuok(probe_host, port_);
    } else {
      // In another network namespace: ask from there.
      std::vector<std::string> argv = options_.command_prefix;
      argv.insert(argv.end(), {"bash", "-c",
                               "exec 3<>/dev/tcp/" + options_.listen_host +
                                   "/" + std::to_string(port_) +
                                   " && printf ruok >&3 && timeout 1 cat <&3"});
      SpawnOptions po;
      po.argv = argv;
      po.quiet_stderr = true;
      auto probe = Subprocess::Spawn(po);
      if (probe.ok()) {
        (void)(*probe)->ReadToEnd(std::chrono::milliseconds(3000));
        up = (*probe)->output().rfind("imok", 0) == 0;
      }
    }
    if (up) return Status::OK();
    // Polling: ZooKeeper signals readiness to nobody.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::TimedOut("ZooKeeper did not answer on port " +
                          std::to_string(port_));
}

Result<std::string> SharedZooKeeperHosts() {
  const char* dir = std::getenv("REMEM_TEST_ZOOKEEPER_DIR");
  if (dir == nullptr || *dir == '\0') {
    return Status::NotFound("no shared ZooKeeper (REMEM_TEST_ZOOKEEPER_DIR)");
  }
  std::ifstream in(std::string(dir) + "/hosts");
  std::string hosts;
  if (!std::getline(in, hosts) || hosts.empty()) {
    return Status::Unavailable(std::string("the shared ZooKeeper in ") + dir +
                               " is not running (see the test "
                               "zookeeper.start's output)");
  }
  return hosts;
}

ZooKeeperProcess::~ZooKeeperProcess() {
  process_.reset();  // SIGKILL and reap
  (void)RemoveNow(dir_);
}

std::string ZooKeeperProcess::hosts() const {
  return options_.listen_host + ":" + std::to_string(port_);
}

Status ZooKeeperProcess::Stop() {
  if (process_ == nullptr) return Status::OK();
  REMEM_RETURN_IF_ERROR(process_->Signal(SIGTERM));
  auto code = process_->Wait(std::chrono::seconds(30));
  if (!code.ok()) return code.status();
  process_.reset();
  return Status::OK();
}

Status ZooKeeperProcess::Restart() {
  process_.reset();
  return Launch();
}

}  // namespace remem::testing
