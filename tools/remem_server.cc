// remem-server: the remem daemon. See `remem-server --help` and README.md.
//
// Exit codes: 0 clean shutdown (SIGINT/SIGTERM, also one while it waits out
// an old lease at start), 1 could not start (address in use, memory that
// cannot be allocated, durable state it cannot read) or a stop outlasted
// --stop-timeout-ms, 2 bad flags.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include "cli_flags.h"
#include "cluster/config.h"
#include "frontdoor/resp_server.h"
#include "registry/registry.h"
#include "remem/version.h"
#include "server/lease.h"
#include "server/server.h"
#include "util/log.h"
#include "util/size.h"
#include "util/socket.h"

namespace {

using namespace remem;

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "remem-server: %s\n", msg.c_str());
  return code;
}

// "" if no --config file named in argv is a directory or a device, or a
// file of more than 1 MiB or with a NUL byte; else why it is refused. CLI11
// took /dev/zero as an empty file and a file with NULs as unparseable with an
// empty reason; a device or a binary file given by mistake is refused, naming
// it.
std::string CheckConfigFiles(int argc, char** argv) {
  constexpr off_t kMaxConfigBytes = off_t{1} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    std::string path;
    if (arg == "--config" && i + 1 < argc) {
      path = argv[++i];
    } else if (arg.starts_with("--config=")) {
      path = std::string(arg.substr(9));
    } else {
      continue;
    }
    if (path.empty()) continue;  // refused as an empty value later
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;  // CLI11 says it is not readable
    struct stat st {};
    std::string why;
    if (fstat(fd, &st) != 0) {
      why = std::string("cannot be read: ") + std::strerror(errno);
    } else if (S_ISDIR(st.st_mode)) {
      why = "is a directory";
    } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      why = "is a device, not a file";
    } else if (!S_ISREG(st.st_mode)) {
      // A pipe (`--config <(...)`): CLI11 reads it as it comes.
    } else if (st.st_size > kMaxConfigBytes) {
      why = "is larger than 1 MiB";
    } else {
      std::string text(size_t(st.st_size), '\0');
      const ssize_t n = pread(fd, text.data(), text.size(), 0);
      if (n < 0) {
        why = std::string("cannot be read: ") + std::strerror(errno);
      } else if (text.find('\0', 0) < size_t(n)) {
        why = "holds a NUL byte (a binary file, not key = value lines)";
      }
    }
    close(fd);
    if (!why.empty()) return "--config " + path + " " + why;
  }
  return "";
}

// Services' options as CLI11 flags. Sizes are parsed after CLI11 (it does
// not know "512M"), so they go through strings kept here.
class CliOptions final : public server::OptionSet {
 public:
  explicit CliOptions(CLI::App* app) : app_(app) {}
  void AddString(const std::string& flag, std::string* value,
                 const std::string& help, bool testing) override {
    Group(app_->add_option(flag, *value, help)->capture_default_str(), testing);
  }
  void AddStrings(const std::string& flag, std::vector<std::string>* values,
                  const std::string& help, bool testing) override {
    Group(app_->add_option(flag, *values, help)
              ->take_all()
              ->allow_extra_args(false),
          testing);
  }
  void AddUint(const std::string& flag, uint64_t* value,
               const std::string& help, bool testing) override {
    Group(app_->add_option(flag, *value, help)->capture_default_str(), testing);
  }
  void AddSize(const std::string& flag, uint64_t* value,
               const std::string& help, bool testing) override {
    sizes_.push_back({flag, value, std::make_unique<std::string>()});
    Group(app_->add_option(flag, *sizes_.back().text, help), testing);
  }
  // Parses the size flags that were given.
  Status ParseSizes() {
    for (const auto& s : sizes_) {
      if (s.text->empty()) continue;
      auto n = ParseSize(*s.text);
      if (!n.ok()) return n.status().WithContext(s.flag);
      // 0 is how a service says "not given": an explicit 0 would silently
      // mean the default.
      if (*n == 0) {
        return Status::InvalidArgument(
            s.flag + " must be more than 0 (leave it out for the default)");
      }
      *s.value = *n;
    }
    return Status::OK();
  }

 private:
  static void Group(CLI::Option* o, bool testing) {
    if (testing) o->group("Testing");
  }
  struct SizeFlag {
    std::string flag;
    uint64_t* value;
    std::unique_ptr<std::string> text;
  };
  CLI::App* app_;
  std::vector<SizeFlag> sizes_;
};

std::vector<int> ParseCpus(const std::string& list, Status* st) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoi(item));
      } else {
        const int a = std::stoi(item.substr(0, dash));
        const int b = std::stoi(item.substr(dash + 1));
        if (b < a || b - a > 4096) throw std::out_of_range("range");
        for (int c = a; c <= b; ++c) out.push_back(c);
      }
    } catch (const std::exception&) {
      *st = Status::InvalidArgument("--cpus: bad CPU list '" + list +
                                    "' (expected e.g. 0,2-3)");
      return {};
    }
    pos = comma + 1;
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool known = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
  for (int c : out) {
    if (c < 0 || c >= CPU_SETSIZE) {
      *st = Status::InvalidArgument("--cpus: CPU " + std::to_string(c) +
                                    " out of range");
      return {};
    }
    // Pinning to a CPU the process may not run on fails in the thread:
    // say so here instead of running unpinned.
    if (known && !CPU_ISSET(c, &allowed)) {
      std::string list;
      for (int a = 0; a < CPU_SETSIZE; ++a) {
        if (!CPU_ISSET(a, &allowed)) continue;
        list += (list.empty() ? "" : ",") + std::to_string(a);
      }
      *st = Status::InvalidArgument("--cpus: CPU " + std::to_string(c) +
                                    " is not one this process may run on (" +
                                    list + ")");
      return {};
    }
  }
  return out;
}

// The TOML/INI reader of --config, but for the options whose value is a
// comma-separated list (--cpus, --cluster, --tree-splits): there a value
// written without quotes (`cpus = 0,2`) is a TOML list of two values, which
// the single-valued option refused ("--cpus: At Most 1 required but
// received 2"); it is joined back with commas into the one value meant.
// (CLI11's own join would split the command line's values too, and drop
// empty elements: --tree-splits a,,b taken as a,b.)
class ConfigWithLists : public CLI::ConfigTOML {
 public:
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    for (CLI::ConfigItem& item : items) {
      if (item.inputs.size() > 1 && item.parents.empty() &&
          (item.name == "cpus" || item.name == "cluster" ||
           item.name == "tree-splits")) {
        std::string joined;
        for (size_t i = 0; i < item.inputs.size(); ++i) {
          joined += (i == 0 ? "" : ",") + item.inputs[i];
        }
        item.inputs = {joined};
      }
    }
    return items;
  }
};

}  // namespace

int main(int argc, char** argv) {
  // Signals the main thread waits for: block them before any thread starts
  // (UCX's included), so none runs a handler. SIGHUP reopens the log file:
  // without this, UCX's own handler would switch it to trace logging.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A closed pipe on stdout or stderr (a `| head -1` that waited for the
  // ready line, a log reader that died) must not kill the server: writes
  // there fail instead, and sockets send with MSG_NOSIGNAL anyway.
  signal(SIGPIPE, SIG_IGN);

  CLI::App app{
      "remem-server: exports registered memory that remem clients read "
      "one-sided, and serves their calls"};
  app.set_version_flag("--version", std::string("remem-server ") + kVersion +
                                        " (wire version " +
                                        std::to_string(kWireVersion) + ")");
  app.set_config("--config", "",
                 "read options from a TOML/INI file (key = value, same names "
                 "as the long flags)");
  app.config_formatter(std::make_shared<ConfigWithLists>());
  // A misspelt key must not leave a setting silently at its default.
  app.allow_config_extras(CLI::config_extras_mode::error);
  server::ServerConfig cfg;
  std::string memory = "default";
  std::string region_size = "1G";
  std::string transport = "auto";
  std::string auth_file;
  std::string log_level = "info";
  std::string log_file;
  std::string cpus;
  int64_t spin_us = 100;
  int64_t lease_ms = 1000;
  int64_t handshake_ms = 10000;
  bool no_pin = false;
  app.add_option("--listen", cfg.listen,
                 "host:port to listen on (port 0 picks a free one; host * or "
                 "0.0.0.0: every interface)")
      ->capture_default_str();
  app.add_option("--memory", memory,
                 "bytes of registered memory to export, e.g. 512M, 4G "
                 "(default: a quarter of physical memory)")
      ->capture_default_str();
  app.add_option("--region-size", region_size,
                 "raw memory is exported as regions of at most this size")
      ->capture_default_str();
  app.add_option("--threads", cfg.threads,
                 "server threads (partitions), each with its own UCX worker")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 256));
  app.add_option("--cpus", cpus,
                 "pin thread i to the i-th CPU of this list, one per thread "
                 "(--threads), e.g. 0,2-3 for three (default: pin only if "
                 "the process's CPUs were narrowed, e.g. by taskset)");
  app.add_flag("--no-pin", no_pin, "never pin threads to CPUs");
  app.add_option("--transport", transport,
                 "auto | shm | tcp: UCX transports allowed (auto: UCX "
                 "decides; shm: posix,cma,self; tcp: tcp,self)")
      ->capture_default_str();
  app.add_option("--shm-dir", cfg.shm_dir,
                 "directory whose files back the memory exported to "
                 "shared-memory clients (default /dev/shm); a tmpfs mounted "
                 "with huge=always puts it on 2 MiB pages: faster one-sided "
                 "gets (README, \"Huge pages\")");
  app.add_option("--data-dir", cfg.data_dir,
                 "directory for the operation logs and snapshots of the "
                 "durable services; recovered at start (without it: a pure "
                 "cache)");
  std::string fsync = "everysec";
  app.add_option("--fsync", fsync,
                 "always (a write is acknowledged once its log record is "
                 "fdatasynced) | everysec (fdatasync about once a second) | "
                 "no (the OS decides)")
      ->capture_default_str();
  bool no_persistence = false;
  app.add_flag("--no-persistence", no_persistence,
               "pure cache: ignore --data-dir, write nothing to disk");
  std::string snapshot_log_bytes = "64M";
  app.add_option("--snapshot-log-bytes", snapshot_log_bytes,
                 "a partition takes a snapshot once its log has grown this "
                 "much since the last one (across restarts), and at least "
                 "as much as that snapshot's size (0: only on demand, `remem "
                 "snapshot`)")
      ->capture_default_str();
  std::string recovery = "strict";
  app.add_option("--recovery", recovery,
                 "strict: refuse to start unless everything on disk is "
                 "recovered (a corrupt newest snapshot falls back to the "
                 "previous one) | truncate: start from the intact part of "
                 "the history and report the log records dropped")
      ->capture_default_str();
  app.add_option("--fault-log-io", cfg.fault_log_io,
                 "testing: make data-dir file I/O fail, a comma-separated "
                 "list of short-after:N | enospc-after:N | eio-after:N "
                 "(bytes written per partition) and read-eio:TEXT | "
                 "read-short:TEXT | read-flip:TEXT (reads of files whose "
                 "name contains TEXT)")
      ->group("Testing");
  app.add_option("--fault-slow-snapshot-us", cfg.fault_slow_snapshot_us,
                 "testing: snapshots copy 8 buckets per pass and pause this "
                 "many microseconds after each (kills land inside them)")
      ->group("Testing");
  app.add_option("--fault-replication-delay-ms", cfg.fault_replication_delay_ms,
                 "testing: in a replicated cluster, hold each batch of a "
                 "primary's writes this long before sending it to the "
                 "backups")
      ->check(tools::NumberIn(0u, 600'000u))
      ->group("Testing");
  app.add_option("--fault-replication-last-backup-delay-ms",
                 cfg.fault_last_backup_delay_ms,
                 "testing: in a replicated cluster, send each batch to each "
                 "shard's last backup this long after the others")
      ->check(tools::NumberIn(0u, 600'000u))
      ->group("Testing");
  app.add_flag("--fault-kill-after-handoff", cfg.fault_kill_after_handoff,
               "testing: as configuration manager, kill this server "
               "(SIGKILL) right after it records a move's handoff in "
               "ZooKeeper, before the old owners release their copies")
      ->group("Testing");
  app.add_option("--fault-move-hold-ms", cfg.fault_move_hold_ms,
                 "testing: as configuration manager of an unreplicated "
                 "cluster, hold each move step this long once its shards "
                 "are copied to their new owners, before their old owners "
                 "stop writing them")
      ->group("Testing");
  app.add_flag("--fault-receive-stall", cfg.fault_receive_stall,
               "testing: the first session whose connection closes leaves "
               "its server thread's shared-memory receive queue blocked, as "
               "a client killed mid-send can (the thread then moves to a "
               "new UCX worker)")
      ->group("Testing");
  app.add_option("--runtime-dir", cfg.runtime_dir,
                 "where the lease file of a server without --data-dir is "
                 "kept (default /dev/shm, which every local user may write: "
                 "a directory only this user can write keeps them from "
                 "getting in its way)");
  app.add_option("--auth-file", auth_file,
                 "file holding a shared secret clients must present");
  app.add_option("--max-connections", cfg.max_connections,
                 "connections at once, sessions and handshakes in progress "
                 "together; more are refused with a reason")
      ->capture_default_str()
      ->check(tools::NumberIn(1u, 1u << 20));
  app.add_option("--handshake-timeout-ms", handshake_ms,
                 "a connection that has not completed the handshake by then "
                 "is refused")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{10}, int64_t{600'000}));
  app.add_option("--lease-ms", lease_ms,
                 "the server lease: clients stop trusting what they read "
                 "one-sided this long after the server stopped renewing it; "
                 "a restart after a crash waits it out")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{10},
                              int64_t{server::LeaseKeeper::kMaxLease.count()}));
  int64_t stop_timeout_ms = 30'000;
  app.add_option("--stop-timeout-ms", stop_timeout_ms,
                 "after SIGINT/SIGTERM, how long the server may take to stop "
                 "cleanly before it exits anyway (exit 1, as a crash: durable "
                 "state recovers)")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{100}, int64_t{3'600'000}));
  app.add_option("--log-level", log_level,
                 "trace | debug | info | warn | error | off")
      ->capture_default_str();
  app.add_option("--log-file", log_file,
                 "append the log to this file instead of stderr (SIGHUP "
                 "reopens it, for log rotation)");
  app.add_option("--spin-us", spin_us,
                 "microseconds a thread busy-polls after its last event "
                 "before sleeping on the worker's event fd")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{0}, int64_t{10'000'000}));
  std::string resp_listen;
  app.add_option("--resp", resp_listen,
                 "also serve Redis clients (redis-cli, redis-py, hiredis...) "
                 "on this host:port, e.g. 127.0.0.1:6379: Redis's string "
                 "commands on the hash store (README, \"Redis clients\"); "
                 "port 0 picks a free one");
  std::string resp_max_unread = "1G";
  app.add_option("--resp-max-unread", resp_max_unread,
                 "bytes of replies the Redis front door holds for its "
                 "clients before they read them, all connections together; "
                 "past it those that read none for a second are closed")
      ->capture_default_str();
  uint64_t resp_max_unread_bytes = 0;
  // Cluster.
  int64_t cluster_session_ms = 10000;
  int64_t cluster_wait_ms = 10000;
  int64_t cluster_lease_ms = 500;
  app.add_option("--cluster", cfg.cluster,
                 "join the cluster kept in ZooKeeper at ZK_HOSTS/PATH, e.g. "
                 "127.0.0.1:2181/remem/prod (the cluster's name is PATH's "
                 "last component); without it: a single server");
  app.add_option("--advertise", cfg.advertise,
                 "with --cluster: the host:port clients reach this server "
                 "at (default: the --listen address)");
  auto* cluster_size_opt =
      app.add_option("--cluster-size", cfg.cluster_size,
                     "with --cluster: servers a new cluster waits for before "
                     "its first configuration spreads the shards over them")
          ->capture_default_str()
          ->check(tools::NumberIn(1u, 4096u));
  app.add_option("--shards", cfg.shards,
                 "with --cluster: shards of a new cluster (every server of "
                 "a cluster must agree)")
      ->capture_default_str()
      ->check(tools::NumberIn(1u, 65536u));
  app.add_option("--replicas", cfg.replicas,
                 "with --cluster: backups per shard of a new cluster (each "
                 "write is held by its shard's primary and f backups before "
                 "it is acknowledged; a primary that dies is replaced by a "
                 "backup). Needs --cluster-size of at least f+1 (without "
                 "--cluster-size: f+1)")
      ->capture_default_str()
      ->check(tools::NumberIn(0u, 4u));
  std::string tree_splits;
  auto* tree_splits_opt = app.add_option(
      "--tree-splits", tree_splits,
      "with --cluster: give the new cluster an ordered store, sharded by key "
      "range: the split keys, comma-separated (\"g,p\": [..g) [g..p) "
      "[p..); \"\": one range). Ranges are spread over the first "
      "servers and move as shards do (joins, drains); every server of the "
      "cluster must agree. "
      "Without it the cluster has no ordered store. With --replicas each "
      "range rides a hash shard and is kept on its f + 1 servers");
  app.add_option("--failure-domain", cfg.failure_domain,
                 "with --cluster: the failure domain this server is in (a "
                 "rack, a host, a zone: [A-Za-z0-9_.-], up to 64 bytes); a "
                 "shard's backups go to servers of other domains first")
      ->check([](const std::string& d) {
        return remem::cluster::ValidDomain(d)
                   ? std::string()
                   : std::string(
                         "a failure domain is 1 to 64 of "
                         "[A-Za-z0-9_.-]");
      });
  app.add_option("--move-share", cfg.move_share,
                 "with --cluster, as configuration manager: the share (%) of "
                 "the time copying shards may keep servers busy; the rest "
                 "of a move's copy is paced out, so clients keep most of "
                 "the servers' time (100: copy at full speed)")
      ->capture_default_str()
      ->check(tools::NumberIn(1u, 100u));
  app.add_option("--cluster-session-ms", cluster_session_ms,
                 "with --cluster: the ZooKeeper session timeout (a killed "
                 "configuration manager is replaced after about this long)")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{1000}, int64_t{60'000}));
  app.add_option("--cluster-wait-ms", cluster_wait_ms,
                 "with --cluster: how long a starting server waits for "
                 "ZooKeeper to answer before it exits (at least the session "
                 "timeout: ZooKeeper may be starting too)")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{100}, int64_t{600'000}));
  app.add_option("--cluster-lease-ms", cluster_lease_ms,
                 "with --cluster: the member lease the configuration manager "
                 "grants; in a replicated cluster a member that has not "
                 "renewed it for this long stops serving and is failed over "
                 "(shorter: faster failover; too short for the machine: "
                 "false suspicions). At most --cluster-session-ms minus 100")
      ->capture_default_str()
      ->check(tools::NumberIn(int64_t{50}, int64_t{30'000}));
  // Each data model's own flags.
  std::vector<std::unique_ptr<server::Service>> services =
      server::DefaultServices();
  CliOptions service_options(&app);
  for (auto& s : services) s->DeclareOptions(&service_options);

  if (std::string bad = CheckConfigFiles(argc, argv); !bad.empty()) {
    return Fail(bad, 2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    // CLI11 says "INI was not able to parse NAME" of a key it does not
    // know, as if the file's syntax were wrong.
    static constexpr std::string_view kExtra = "INI was not able to parse ";
    const std::string what = e.what();
    if (what.rfind(kExtra, 0) == 0) {
      const std::string key = what.substr(kExtra.size());
      if (key.find('.') != std::string::npos) {
        return Fail("--config: '" + key.substr(0, key.find('.')) +
                        "': the file takes key = value lines without "
                        "[sections]",
                    2);
      }
      return Fail("--config: unknown option '" + key +
                      "' (the file takes remem-server's long options, "
                      "without their dashes: remem-server --help)",
                  2);
    }
    return Fail("--config: " + what, 2);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, the version or the error
    return code == 0 ? 0 : 2;      // every usage error exits 2
  }
  // An option given an empty value (`--auth-file "$UNSET"`, in a --config
  // file `data-dir =`) is refused: taken as not given, it started a server
  // without authentication, or without durability, and said nothing.
  // (--tree-splits "" means one range: empty is its documented value.)
  if (std::string empty = tools::OptionGivenEmpty(app, {"--tree-splits"});
      !empty.empty()) {
    return Fail(empty + " was given an empty value", 2);
  }

  if (Status st = log::SetLevel(log_level); !st.ok())
    return Fail(st.message(), 2);
  if (!log_file.empty()) {
    if (Status st = log::SetFile(log_file); !st.ok())
      return Fail(st.message(), 2);
  }
  if (Status st = service_options.ParseSizes(); !st.ok())
    return Fail(st.message(), 2);
  auto t = ParseTransport(transport);
  if (!t.ok()) return Fail(t.status().message(), 2);
  cfg.transport = *t;
  if (memory != "default") {
    auto m = ParseSize(memory);
    if (!m.ok()) return Fail("--memory: " + m.status().message(), 2);
    if (*m == 0) {
      return Fail(
          "--memory must be more than 0 (leave it out for the default, a "
          "quarter of physical memory)",
          2);
    }
    cfg.memory = *m;
  }
  auto rs = ParseSize(region_size);
  if (!rs.ok()) return Fail("--region-size: " + rs.status().message(), 2);
  if (*rs == 0) return Fail("--region-size must be more than 0", 2);
  cfg.region_size = *rs;
  cfg.spin = std::chrono::microseconds(spin_us);
  cfg.lease = std::chrono::milliseconds(lease_ms);
  cfg.cluster_session = std::chrono::milliseconds(cluster_session_ms);
  cfg.cluster_wait = std::chrono::milliseconds(cluster_wait_ms);
  cfg.cluster_lease = std::chrono::milliseconds(cluster_lease_ms);
  // Flags that mean something only in a cluster, or only with a data
  // directory: given without it, the user expects what they cannot have
  // (a replicated server, a durable one), so they are refused.
  if (cfg.cluster.empty()) {
    for (const char* name :
         {"--advertise", "--cluster-size", "--shards", "--replicas",
          "--tree-splits", "--failure-domain", "--move-share",
          "--cluster-session-ms", "--cluster-wait-ms", "--cluster-lease-ms",
          "--fault-replication-delay-ms",
          "--fault-replication-last-backup-delay-ms",
          "--fault-kill-after-handoff", "--fault-move-hold-ms"}) {
      if (app.count(name) > 0) {
        return Fail(std::string(name) +
                        " needs --cluster (without it: a single server)",
                    2);
      }
    }
  }
  if (!resp_listen.empty()) {
    std::string host;
    uint16_t port = 0;
    if (Status st = util::ParseHostPort(resp_listen, &host, &port); !st.ok()) {
      return Fail("--resp: " + st.message(), 2);
    }
  }
  {
    auto n = ParseSize(resp_max_unread);
    if (!n.ok()) return Fail("--resp-max-unread: " + n.status().message(), 2);
    if (*n < (size_t{1} << 20)) {
      return Fail("--resp-max-unread must be at least 1M", 2);
    }
    resp_max_unread_bytes = *n;
  }
  if (!cfg.advertise.empty()) {
    // What clients are told to connect to: checked here, since a bad one
    // would be registered, and every client of the cluster would fail.
    std::string host;
    uint16_t port = 0;
    Status st = util::ParseHostPort(cfg.advertise, &host, &port);
    if (st.ok() && port == 0) {
      st = Status::InvalidArgument("port 0 in '" + cfg.advertise +
                                   "' (clients need the real port)");
    }
    if (st.ok() && (host == "0.0.0.0" || host == "::" || host == "*")) {
      st = Status::InvalidArgument(
          "'" + cfg.advertise +
          "' is every address of this host, which no client can connect "
          "to: give the one clients reach it at");
    }
    if (!st.ok()) return Fail("--advertise: " + st.message(), 2);
  }
  for (const char* name : {"--fsync", "--snapshot-log-bytes", "--recovery",
                           "--fault-log-io", "--fault-slow-snapshot-us"}) {
    if (app.count(name) == 0) continue;
    if (no_persistence) {
      return Fail(std::string(name) +
                      " with --no-persistence: nothing is written to disk",
                  2);
    }
    if (cfg.data_dir.empty()) {
      return Fail(std::string(name) +
                      " needs --data-dir (without it the server is a pure "
                      "cache: nothing is written to disk)",
                  2);
    }
  }
  if (tree_splits_opt->count() > 0) {
    auto splits = cluster::ParseSplits(tree_splits);
    if (!splits.ok()) return Fail(splits.status().message(), 2);
    cfg.tree_splits = tree_splits;
  }
  // A server joining a formed replicated cluster need not say how large it
  // was formed: without --cluster-size, a new one waits for f+1 servers.
  if (cluster_size_opt->count() == 0 && cfg.replicas > 0) {
    cfg.cluster_size = cfg.replicas + 1;
  }
  cfg.handshake_timeout = std::chrono::milliseconds(handshake_ms);
  cfg.pin_threads = !no_pin;
  if (!cpus.empty()) {
    if (no_pin) return Fail("--cpus and --no-pin: pin, or do not", 2);
    Status st;
    cfg.cpus = ParseCpus(cpus, &st);
    if (!st.ok()) return Fail(st.message(), 2);
    // Thread i takes the i-th CPU: a shorter list would stack threads on
    // its first CPUs, a longer one leave CPUs unused, neither said.
    if (cfg.cpus.size() != size_t(cfg.threads)) {
      return Fail("--cpus lists " + std::to_string(cfg.cpus.size()) + " CPU" +
                      (cfg.cpus.size() == 1 ? "" : "s") + " for " +
                      std::to_string(cfg.threads) + " thread" +
                      (cfg.threads == 1 ? "" : "s") +
                      " (--threads): one per thread, in order (a CPU may "
                      "repeat: 0,1,0)",
                  2);
    }
  }
  if (!auth_file.empty()) {
    auto secret = ReadSecretFile(auth_file);
    if (!secret.ok()) return Fail(secret.status().message(), 2);
    cfg.secret = *secret;
    // As ssh says of a private key others can read (the secret is the
    // only thing between a network peer and the store).
    struct stat st;
    if (::stat(auth_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      std::fprintf(stderr,
                   "remem-server: warning: the auth file %s can be read or "
                   "written by other users (mode %04o): chmod 600 it\n",
                   auth_file.c_str(), unsigned(st.st_mode & 07777));
    }
  }
  auto policy = durability::ParseFsyncPolicy(fsync);
  if (!policy.ok()) return Fail(policy.status().message(), 2);
  cfg.fsync = *policy;
  cfg.persistence = !no_persistence;
  if (no_persistence && !cfg.data_dir.empty()) {
    // Documented, but a restart that comes back empty must not surprise.
    std::fprintf(stderr,
                 "remem-server: --no-persistence: %s is neither recovered "
                 "nor written (a pure cache)\n",
                 cfg.data_dir.c_str());
  }
  if (auto n = ParseSize(snapshot_log_bytes); n.ok()) {
    cfg.snapshot_log_bytes = *n;
  } else if (snapshot_log_bytes == "0") {
    cfg.snapshot_log_bytes = 0;
  } else {
    return Fail("--snapshot-log-bytes: " + n.status().message(), 2);
  }
  if (recovery == "strict") {
    cfg.recovery = durability::RecoveryMode::kStrict;
  } else if (recovery == "truncate") {
    cfg.recovery = durability::RecoveryMode::kTruncate;
  } else {
    return Fail("--recovery must be strict or truncate", 2);
  }

  auto server = server::Server::Start(cfg, std::move(services));
  if (!server.ok()) {
    const Status& st = server.status();
    // SIGINT or SIGTERM while it waited out a predecessor's lease: the
    // clean stop that was asked for.
    sigset_t pending;
    sigemptyset(&pending);
    if (st.code() == StatusCode::kUnavailable && sigpending(&pending) == 0 &&
        (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM))) {
      std::fprintf(stderr, "remem-server: %s\n", st.ToString().c_str());
      std::printf("remem-server stopped\n");
      return 0;
    }
    int code = st.code() == StatusCode::kInvalidArgument ? 2 : 1;
    return Fail(st.ToString(), code);
  }
  if (!(*server)->recovery_summary().empty()) {
    std::fprintf(stderr, "remem-server: %s\n",
                 (*server)->recovery_summary().c_str());
  }
  std::unique_ptr<frontdoor::RespServer> resp;
  std::string resp_note;
  if (!resp_listen.empty()) {
    frontdoor::RespOptions ro;
    ro.listen = resp_listen;
    ro.session.server = (*server)->address();
    ro.session.transport = cfg.transport;
    ro.session.secret = cfg.secret;
    ro.max_unread_bytes = resp_max_unread_bytes;
    if (!cfg.cluster.empty()) {
      ro.cluster_seeds = {cfg.advertise.empty() ? (*server)->address()
                                                : cfg.advertise};
    }
    auto started = frontdoor::RespServer::Start(std::move(ro));
    if (!started.ok()) {
      (*server)->Stop();
      (*server)->Wait();
      const bool bad = started.status().code() == StatusCode::kInvalidArgument;
      return Fail("--resp: " + started.status().ToString(), bad ? 2 : 1);
    }
    resp = std::move(*started);
    resp_note = "; Redis clients on " + resp->address();
  }
  uint64_t registered = 0, regions = 0;
  for (const auto& s : (*server)->Stats()) {
    if (s.name == "memory_registered") registered = s.value;
    if (s.name == "regions") regions = s.value;
  }
  // Scripts and tests wait for this line.
  std::printf(
      "remem-server listening on %s (transport %s, %d thread%s, %s in %llu "
      "region%s%s)%s\n",
      (*server)->address().c_str(),
      std::string(TransportName(cfg.transport)).c_str(), cfg.threads,
      cfg.threads == 1 ? "" : "s", FormatSize(registered).c_str(),
      static_cast<unsigned long long>(regions), regions == 1 ? "" : "s",
      cfg.secret.empty() ? "" : ", auth on", resp_note.c_str());
  std::fflush(stdout);

  for (;;) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGHUP) {
      if (Status st = log::ReopenFile(); !st.ok()) {
        std::fprintf(stderr, "remem-server: %s\n", st.ToString().c_str());
      }
      log::Info("SIGHUP: log file reopened");
      continue;
    }
    // Said first: a server started on the data directory now waits for
    // this one's clean stop instead of being refused.
    (*server)->MarkStopping();
    log::Info("signal {}: shutting down", sig);
    break;
  }
  // A thread that does not stop (a user function that never returns: the
  // plugin ABI forbids it, but nothing can interrupt one) kept the process
  // alive for ever. Past --stop-timeout-ms it exits as a crash would:
  // durable state recovers as after kill -9. Counted from before Stop(),
  // which joins threads of its own (the cluster member's, the acceptor's).
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopped = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(stop_mu);
    if (stop_cv.wait_for(lock, std::chrono::milliseconds(stop_timeout_ms),
                         [&] { return stopped; })) {
      return;
    }
    log::Error(
        "a server thread did not stop within {} ms (--stop-timeout-ms): is "
        "it running a user function (--ops-library) that does not return? "
        "Exiting without a clean stop; durable state recovers as after a "
        "crash",
        stop_timeout_ms);
    std::fprintf(stderr,
                 "remem-server: a server thread did not stop within %lld ms "
                 "(a user function that does not return?): exiting without "
                 "a clean stop\n",
                 static_cast<long long>(stop_timeout_ms));
    std::_Exit(1);
  });
  // The front door first: it is a client of the server.
  resp.reset();
  (*server)->Stop();
  (*server)->Wait();
  server->reset();
  {
    std::lock_guard<std::mutex> lock(stop_mu);
    stopped = true;
  }
  stop_cv.notify_all();
  watchdog.join();
  std::printf("remem-server stopped\n");
  return 0;
}
