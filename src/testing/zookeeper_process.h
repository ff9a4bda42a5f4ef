// testing::ZooKeeperProcess: a ZooKeeper server of the tests' own (Debian's
// `zookeeper` package, run standalone through its Java main class), on a
// free loopback port with a temporary data directory, for the cluster
// tests and benchmarks. It can be stopped and started again on the same
// port and data directory (a ZooKeeper restart), and dies with this
// process.
//
// Thread contract: one owner thread (as Subprocess).

#ifndef REMEM_TESTING_ZOOKEEPER_PROCESS_H_
#define REMEM_TESTING_ZOOKEEPER_PROCESS_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "remem/status.h"
#include "util/subprocess.h"

namespace remem::testing {

struct ZooKeeperOptions {
  // Where ZooKeeper lives (Debian's paths; $REMEM_ZOOKEEPER_CLASSPATH and
  // $REMEM_JAVA override them).
  std::string java = "/usr/bin/java";
  std::string classpath = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";
  // ZooKeeper's tick: sessions may last from 2 to 20 ticks.
  std::chrono::milliseconds tick{500};
  std::string listen_host = "127.0.0.1";  // "0.0.0.0": every interface
  // Run through this command, e.g. {"ip", "netns", "exec", "ns1"}.
  std::vector<std::string> command_prefix;
  std::chrono::milliseconds ready_timeout{60000};
};

class ZooKeeperProcess {
 public:
  // Starts ZooKeeper in a new temporary directory on a free port and waits
  // until it answers `ruok`. Unavailable (with the reason) if ZooKeeper is
  // not installed or exits at start; TimedOut if it does not answer within
  // the ready timeout; IOError for its directory, its configuration or its
  // port.
  static Result<std::unique_ptr<ZooKeeperProcess>> Start(
      ZooKeeperOptions options = {});
  // Kills it and removes its directory.
  ~ZooKeeperProcess();

  // host:port, for --cluster HOSTS/PATH.
  std::string hosts() const;
  int port() const { return port_; }
  // SIGTERM, and waits for the exit.
  Status Stop();
  // Starts it again on the same port and data directory.
  Status Restart();
  bool running() const { return process_ != nullptr && process_->running(); }

 private:
  ZooKeeperProcess() = default;
  Status Launch();

  ZooKeeperOptions options_;
  std::string dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

// Whether ZooKeeper (Java and its jar) is installed where options say.
bool ZooKeeperInstalled(const ZooKeeperOptions& options = {});

// A ZooKeeper shared by the tests of one ctest run: ctest starts it before
// the first test that needs it and stops it after the last (the fixture
// tests/zookeeper_fixture.cc), and names its directory in
// $REMEM_TEST_ZOOKEEPER_DIR. A JVM's start costs more CPU than most cluster
// tests spend; tests that stop or restart ZooKeeper start their own.
// Its host:port, NotFound if this run has none (a test program run by hand:
// start one), Unavailable if the fixture did not start it.
Result<std::string> SharedZooKeeperHosts();

}  // namespace remem::testing

#endif  // REMEM_TESTING_ZOOKEEPER_PROCESS_H_
