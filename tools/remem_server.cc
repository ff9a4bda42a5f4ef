// remem-server: the remem daemon. See `remem-server --help` and README.md.

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "server/server.h"
#include "util/log.h"
#include "util/size.h"

namespace {

int Fail(const std::string& msg, int code) {
  std::fprintf(stderr, "remem-server: %s\n", msg.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace remem;
  CLI::App app{
      "remem-server: exports registered memory that remem clients read "
      "one-sided, and serves their RPCs"};
  app.set_config("--config", "",
                 "read options from a TOML/INI file (key = value, same names "
                 "as the long flags)");
  server::ServerConfig cfg;
  std::string memory = "default";
  std::string region_size = "1G";
  std::string transport = "auto";
  std::string auth_file;
  std::string log_level = "info";
  int64_t spin_us = 100;
  bool no_pin = false;
  app.add_option("--listen", cfg.listen,
                 "host:port to listen on (port 0 picks a free one)")
      ->capture_default_str();
  app.add_option("--memory", memory,
                 "bytes of registered memory to export, e.g. 512M, 4G "
                 "(default: a quarter of physical memory)")
      ->capture_default_str();
  std::string hash_memory = "half";
  app.add_option("--fault-pause-mid-write-us", cfg.fault_pause_mid_write_us,
                 "testing: pause every hash bucket write half done for this "
                 "many microseconds (readers see the torn bucket)")
      ->group("Testing");
  app.add_option("--hash-initial-buckets", cfg.hash_initial_buckets,
                 "buckets each hash partition starts with (a power of two; "
                 "tables double as they fill)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        uint64_t n = 0;
        try {
          n = std::stoull(v);
        } catch (...) {
          return std::string("must be a number");
        }
        return n >= 2 && (n & (n - 1)) == 0 && n <= (1ull << 30)
                   ? std::string()
                   : std::string("must be a power of two in [2, 2^30]");
      })
      ->group("Testing");
  app.add_option("--max-key-bytes", cfg.max_key_bytes,
                 "largest hash store key accepted (at most 64 KiB)")
      ->capture_default_str();
  app.add_option("--max-value-bytes", cfg.max_value_bytes,
                 "largest hash store value accepted (at most 16 MiB)")
      ->capture_default_str();
  app.add_option("--hash-memory", hash_memory,
                 "of --memory, bytes for the hash store (one partition per "
                 "thread); the rest is raw regions")
      ->capture_default_str();
  app.add_option("--region-size", region_size,
                 "memory is exported as regions of at most this size")
      ->capture_default_str();
  app.add_option("--threads", cfg.threads,
                 "server threads, each with its own UCX worker, pinned to "
                 "the CPUs of the process's affinity mask in order")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--transport", transport,
                 "auto | shm | tcp: UCX transports allowed "
                 "(auto: UCX decides; shm: UCX_TLS=sm,self,tcp; "
                 "tcp: UCX_TLS=tcp,self)")
      ->capture_default_str();
  app.add_option("--data-dir", cfg.data_dir,
                 "directory for the hash store's operation logs and "
                 "snapshots; recovered at start (without it: a pure cache)");
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
                 "much since the last (0: only on demand, `remem snapshot`)")
      ->capture_default_str();
  std::string recovery = "strict";
  app.add_option("--recovery", recovery,
                 "strict: refuse to start on a corrupt log record before the "
                 "end of the log | truncate: drop it and everything after it")
      ->capture_default_str();
  app.add_option("--fault-log-io", cfg.fault_log_io,
                 "testing: make log and snapshot file I/O fail: "
                 "short-after:N | enospc-after:N | eio-after:N (bytes per "
                 "partition)")
      ->group("Testing");
  app.add_option("--fault-slow-snapshot-us", cfg.fault_slow_snapshot_us,
                 "testing: snapshots copy 8 buckets per pass and pause this "
                 "many microseconds after each (kills land inside them)")
      ->group("Testing");
  app.add_option("--auth-file", auth_file,
                 "file holding a shared secret clients must present");
  app.add_option("--log-level", log_level,
                 "trace | debug | info | warn | error | off")
      ->capture_default_str();
  app.add_option("--spin-us", spin_us,
                 "microseconds a thread busy-polls after its last event "
                 "before sleeping on the worker's event fd")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}));
  app.add_flag("--no-pin", no_pin, "do not pin threads to CPUs");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the error
    return code == 0 ? 0 : 2;      // every usage error exits 2
  }

  if (Status st = log::SetLevel(log_level); !st.ok())
    return Fail(st.message(), 2);
  auto t = ParseTransport(transport);
  if (!t.ok()) return Fail(t.status().message(), 2);
  cfg.transport = *t;
  if (memory != "default") {
    auto m = ParseSize(memory);
    if (!m.ok()) return Fail("--memory: " + m.status().message(), 2);
    cfg.memory = *m;
  }
  if (hash_memory != "half") {
    auto h = ParseSize(hash_memory);
    if (!h.ok()) return Fail("--hash-memory: " + h.status().message(), 2);
    cfg.hash_memory = *h;
  }
  auto rs = ParseSize(region_size);
  if (!rs.ok()) return Fail("--region-size: " + rs.status().message(), 2);
  cfg.region_size = *rs;
  cfg.spin = std::chrono::microseconds(spin_us);
  cfg.pin_threads = !no_pin;
  if (!auth_file.empty()) {
    auto secret = ReadSecretFile(auth_file);
    if (!secret.ok()) return Fail(secret.status().message(), 2);
    cfg.secret = *secret;
  }
  auto policy = durability::ParseFsyncPolicy(fsync);
  if (!policy.ok()) return Fail(policy.status().message(), 2);
  cfg.fsync = *policy;
  cfg.persistence = !no_persistence;
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
  if (!cfg.data_dir.empty() && cfg.persistence) {
    std::error_code ec;
    std::filesystem::create_directories(cfg.data_dir, ec);
    if (ec) {
      return Fail("--data-dir " + cfg.data_dir + ": " + ec.message(), 2);
    }
  }

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto server = server::Server::Start(cfg);
  if (!server.ok()) {
    const Status& st = server.status();
    int code = st.code() == StatusCode::kInvalidArgument ? 2 : 1;
    return Fail(st.ToString(), code);
  }
  if (!(*server)->recovery_summary().empty()) {
    std::fprintf(stderr, "remem-server: %s\n",
                 (*server)->recovery_summary().c_str());
  }
  auto stats = (*server)->Snapshot();
  // Scripts and tests wait for this line.
  std::printf(
      "remem-server listening on %s (transport %s, %d thread%s, %s in %llu "
      "region%s%s)\n",
      (*server)->address().c_str(),
      std::string(TransportName(cfg.transport)).c_str(), cfg.threads,
      cfg.threads == 1 ? "" : "s", FormatSize(stats.memory_registered).c_str(),
      static_cast<unsigned long long>(stats.regions),
      stats.regions == 1 ? "" : "s", cfg.secret.empty() ? "" : ", auth on");
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  log::Info("signal {}: shutting down", sig);
  (*server)->Stop();
  (*server)->Wait();
  server->reset();
  std::printf("remem-server stopped\n");
  return 0;
}
