#include "bench_durability.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string_view>
#include <utility>

#include "bench_common.h"
#include "remem/hash.h"
#include "remem/session.h"
#include "testing/server_process.h"
#include "util/interrupt.h"

namespace remem::bench {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string KeyOf(uint64_t i, size_t len) {
  std::string k = "k" + std::to_string(i);
  k.resize(std::max(len, k.size()), '.');
  return k;
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Recovery {
  uint64_t pairs = 0;  // hash_pairs after the restart
  uint64_t from_snapshots = 0;
  uint64_t log_records = 0;
  uint64_t server_ms = 0;  // the server's own recovery_ms
  double restart_ms = 0;   // kill -9 to listening again
};

struct PolicyRow {
  std::string policy;
  double load_puts_per_s = 0;
  uint64_t mix_ops = 0;
  double mix_ops_per_s = 0;
  double server_cpu_us_per_op = -1;
  std::optional<Recovery> recovery;
};

// A session and its hash store (members destroyed in reverse order: the
// store first, as it must be).
struct Client {
  std::unique_ptr<Session> session;
  std::unique_ptr<HashStore> hash;
};

Result<Client> Connect(const std::string& address, Transport t) {
  SessionOptions so;
  so.server = address;
  so.transport = t;
  so.timeout = std::chrono::seconds(60);  // --fsync always, big batches
  auto session = Session::Connect(so);
  if (!session.ok()) return session.status();
  auto hash = HashStore::Open(session->get());
  if (!hash.ok()) return hash.status();
  Client c;
  c.session = std::move(*session);
  c.hash = std::move(*hash);
  return c;
}

Status Load(HashStore& c, const DurabilityOptions& o) {
  const std::string value(o.value_size, 'v');
  constexpr uint64_t kBatch = 256;
  std::vector<std::string> keys;
  std::vector<std::pair<std::string_view, std::string_view>> batch;
  for (uint64_t i = 0; i < o.records; i += kBatch) {
    keys.clear();
    batch.clear();
    for (uint64_t j = i; j < std::min(o.records, i + kBatch); ++j) {
      keys.push_back(KeyOf(j, o.key_size));
    }
    for (const auto& k : keys) batch.emplace_back(k, value);
    for (const auto& r : c.MultiPut(batch)) {
      if (!r.ok()) return r.status().WithContext("load");
    }
  }
  return Status::OK();
}

// The YCSB-A-like mix: `ops` operations, `depth` in flight.
Status Mix(Client& c, const DurabilityOptions& o, uint64_t ops) {
  const std::string value(o.value_size, 'w');
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> coin(0, 1);
  uint64_t issued = 0, done = 0, errors = 0;
  int in_flight = 0;
  Status first;
  auto finish = [&](const Status& st) {
    --in_flight;
    ++done;
    if (!st.ok() && errors++ == 0) first = st;
  };
  while (done < ops) {
    while (in_flight < o.depth && issued < ops) {
      const std::string k = KeyOf(rng() % o.records, o.key_size);
      ++in_flight;
      ++issued;
      if (coin(rng) < o.write_fraction) {
        c.hash->PutAsync(k, value,
                         [&](Result<uint64_t> r) { finish(r.status()); });
      } else {
        c.hash->GetAsync(
            k, [&](Result<HashStore::Value> r) { finish(r.status()); });
      }
    }
    c.session->Poll();
    if (!c.session->connected()) {
      return Status::Unavailable("mix: the server went away");
    }
  }
  if (errors > 0) {
    return first.WithContext("mix: " + std::to_string(errors) +
                             " operations failed, the first");
  }
  return Status::OK();
}

Result<Recovery> KillAndRecover(testing::ServerProcess* server,
                                const DurabilityOptions& o) {
  const auto t0 = Clock::now();
  REMEM_RETURN_IF_ERROR(server->Kill());
  REMEM_RETURN_IF_ERROR(server->Restart());
  Recovery r;
  r.restart_ms = Since(t0) * 1000;
  auto c = Connect(server->address, o.transport);
  if (!c.ok()) return c.status().WithContext("after the restart");
  auto stats = c->session->Stats();
  if (!stats.ok()) return stats.status();
  r.pairs = stats->Get("hash_pairs");
  r.from_snapshots = stats->Get("recovered_pairs");
  r.log_records = stats->Get("recovered_log_records");
  r.server_ms = stats->Get("recovery_ms");
  if (r.pairs < o.records) {
    return Status::Corruption("after kill -9 the server recovered " +
                              std::to_string(r.pairs) + " pairs of the " +
                              std::to_string(o.records) + " loaded");
  }
  return r;
}

Result<PolicyRow> RunPolicy(const DurabilityOptions& o,
                            const std::string& policy) {
  PolicyRow row;
  row.policy = policy;
  std::string dir;
  if (policy != "none") {
    const fs::path parent = o.data_dir_parent.empty()
                                ? fs::temp_directory_path()
                                : fs::path(o.data_dir_parent);
    dir = (parent / "remem-durbench-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      return Status::IOError("cannot create a directory in " + parent.string());
    }
  }
  if (!dir.empty()) RemoveOnInterrupt(dir);
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      if (!dir.empty()) (void)RemoveNow(dir);
    }
  } remove_dir{dir};

  testing::ServerOptions so;
  so.binary = o.server_binary;
  so.transport = o.transport;
  so.memory = o.memory;
  so.threads = o.server_threads;
  so.pin_threads = o.server_threads == 1 && o.server_cpu >= 0;
  so.cpu = o.server_threads == 1 ? o.server_cpu : -1;
  if (!o.hash_memory.empty()) so.flags = {"--hash-memory", o.hash_memory};
  if (policy == "none") {
    so.flags.push_back("--no-persistence");
  } else {
    so.flags.insert(so.flags.end(), {"--data-dir", dir, "--fsync", policy});
  }
  auto server = testing::ServerProcess::Start(so);
  if (!server.ok()) return server.status();
  {
    auto c = Connect(server->address, o.transport);
    if (!c.ok()) return c.status();
    auto t0 = Clock::now();
    REMEM_RETURN_IF_ERROR(Load(*c->hash, o));
    row.load_puts_per_s = double(o.records) / Since(t0);
    row.mix_ops = policy == "always" ? std::min(o.ops, o.always_ops) : o.ops;
    auto cpu0 = server->CpuSeconds();
    t0 = Clock::now();
    REMEM_RETURN_IF_ERROR(Mix(*c, o, row.mix_ops));
    row.mix_ops_per_s = double(row.mix_ops) / Since(t0);
    auto cpu1 = server->CpuSeconds();
    if (cpu0.ok() && cpu1.ok() && row.mix_ops > 0) {
      row.server_cpu_us_per_op = (*cpu1 - *cpu0) * 1e6 / double(row.mix_ops);
    }
  }
  if (o.recovery && policy != "none") {
    auto r = KillAndRecover(&*server, o);
    if (!r.ok()) return r.status().WithContext("--fsync " + policy);
    row.recovery = *r;
  }
  return row;
}

}  // namespace

int RunDurability(const DurabilityOptions& o) {
  for (const std::string& p : o.policies) {
    if (p != "none" && p != "no" && p != "everysec" && p != "always") {
      std::fprintf(stderr,
                   "remem-bench: a policy is none, no, everysec or always, "
                   "not '%s'\n",
                   p.c_str());
      return 2;
    }
  }
  if (o.records == 0 || o.depth < 1) {
    std::fprintf(stderr, "remem-bench: --records and --depth must be > 0\n");
    return 2;
  }
  if (Status st = PinThisThread(o.client_cpu); !st.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  if (!o.json) {
    std::printf(
        "durability: %llu pairs (%zu B keys, %zu B values) loaded by "
        "multi-puts of 256, then a mix of %.0f%% puts and %.0f%% gets on "
        "uniform keys, %d in flight\n",
        static_cast<unsigned long long>(o.records), o.key_size, o.value_size,
        o.write_fraction * 100, (1 - o.write_fraction) * 100, o.depth);
  }
  std::vector<PolicyRow> rows;
  for (const std::string& p : o.policies) {
    auto row = RunPolicy(o, p);
    if (!row.ok()) {
      std::fprintf(stderr, "remem-bench: durability, policy %s: %s\n",
                   p.c_str(), row.status().ToString().c_str());
      return 1;
    }
    rows.push_back(*row);
  }
  double none = 0;
  for (const PolicyRow& r : rows) {
    if (r.policy == "none") none = r.mix_ops_per_s;
  }
  auto vs_none = [&](const PolicyRow& r) {
    return none > 0 ? 100.0 * r.mix_ops_per_s / none : -1;
  };
  if (o.json) {
    std::printf(
        "{\"workload\":\"durability\",\"records\":%llu,\"depth\":%d,"
        "\"write_fraction\":%.3f,\"results\":[",
        static_cast<unsigned long long>(o.records), o.depth, o.write_fraction);
    for (size_t i = 0; i < rows.size(); ++i) {
      const PolicyRow& r = rows[i];
      // null without a "none" row to compare with (the table's n/a).
      char pct[32] = "null";
      if (vs_none(r) >= 0) std::snprintf(pct, sizeof(pct), "%.1f", vs_none(r));
      std::printf(
          "%s{\"policy\":\"%s\",\"load_puts_per_s\":%.1f,\"mix_ops\":%llu,"
          "\"mix_ops_per_s\":%.1f,\"mix_vs_none_pct\":%s,"
          "\"server_cpu_us_per_op\":%.3f",
          i ? "," : "", r.policy.c_str(), r.load_puts_per_s,
          static_cast<unsigned long long>(r.mix_ops), r.mix_ops_per_s, pct,
          r.server_cpu_us_per_op);
      if (r.recovery) {
        std::printf(
            ",\"recovery\":{\"pairs\":%llu,\"snapshot_pairs\":%llu,"
            "\"log_records\":%llu,\"server_ms\":%llu,\"restart_ms\":%.1f}",
            static_cast<unsigned long long>(r.recovery->pairs),
            static_cast<unsigned long long>(r.recovery->from_snapshots),
            static_cast<unsigned long long>(r.recovery->log_records),
            static_cast<unsigned long long>(r.recovery->server_ms),
            r.recovery->restart_ms);
      }
      std::printf("}");
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("%-9s %14s %10s %12s %8s %14s\n", "policy", "load puts/s",
              "mix ops", "mix ops/s", "vs none", "srv_cpu_us/op");
  for (const PolicyRow& r : rows) {
    char vs[16] = "n/a";
    if (vs_none(r) >= 0) std::snprintf(vs, sizeof(vs), "%.0f%%", vs_none(r));
    std::printf("%-9s %14.0f %10llu %12.0f %8s %14.3f\n", r.policy.c_str(),
                r.load_puts_per_s, static_cast<unsigned long long>(r.mix_ops),
                r.mix_ops_per_s, vs, r.server_cpu_us_per_op);
  }
  for (const PolicyRow& r : rows) {
    if (!r.recovery) continue;
    std::printf(
        "recovery (%s): kill -9, then %llu pairs back (%llu from snapshots "
        "+ %llu log records) in %llu ms by the server's count; %.0f ms from "
        "the kill to listening again (waiting out the old lease included)\n",
        r.policy.c_str(), static_cast<unsigned long long>(r.recovery->pairs),
        static_cast<unsigned long long>(r.recovery->from_snapshots),
        static_cast<unsigned long long>(r.recovery->log_records),
        static_cast<unsigned long long>(r.recovery->server_ms),
        r.recovery->restart_ms);
  }
  return 0;
}

}  // namespace remem::bench
