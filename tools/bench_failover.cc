#include "bench_failover.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "remem/cluster.h"
#include "remem/session.h"
#include "testing/clock.h"
#include "testing/server_process.h"
#include "testing/zookeeper_process.h"

namespace remem::bench {

namespace {

struct Trial {
  double failover_ms = -1;  // -1: no write after the kill succeeded
  uint64_t unknown = 0;     // writes that failed (in flight at the kill)
  bool killed_manager = false;
  // With records: from the kill until every shard was whole again (-1:
  // never), the manager's copy round and pairs, and the writes' latencies
  // meanwhile (ns).
  double whole_ms = -1;
  uint64_t fill_ms = 0, fill_pairs = 0;
  std::vector<uint64_t> write_ns;
  // --drain / --join: until done (-1: never), and writes that failed;
  // --join: until the new server was listed in the configuration (its
  // start included).
  double reshape_ms = -1, listed_ms = -1;
  std::string first_failure;
  uint64_t failed_writes = 0;
};

// Every shard has all its backups, none being filled, none at `dead`.
bool Whole(const Cluster::Info& info, const std::string& dead) {
  if (info.filling != 0) return false;
  for (uint32_t s = 0; s < info.num_shards; ++s) {
    if (info.nodes[info.shard_owner[s]].address == dead) return false;
    for (uint32_t i = 0; i < info.replicas; ++i) {
      const int32_t b = info.shard_backups[s * info.replicas + i];
      if (b < 0 || info.nodes[size_t(b)].address == dead) return false;
    }
  }
  return true;
}

// Balanced: every shard whole, nothing moving, and every server within one
// shard of the others in primaries and in shards held.
bool Balanced(const Cluster::Info& info, size_t servers) {
  if (info.nodes.size() != servers || info.moving != 0 || !Whole(info, "")) {
    return false;
  }
  uint32_t lo_p = ~0u, hi_p = 0, lo_h = ~0u, hi_h = 0;
  for (const auto& n : info.nodes) {
    lo_p = std::min(lo_p, n.shards);
    hi_p = std::max(hi_p, n.shards);
    lo_h = std::min(lo_h, n.shards + n.backups);
    hi_h = std::max(hi_h, n.shards + n.backups);
  }
  return hi_p <= lo_p + 1 && hi_h <= lo_h + 1;
}

Status Load(Cluster* c, uint64_t records) {
  constexpr uint64_t kBatch = 1000;
  std::vector<std::string> keys, values;
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  for (uint64_t first = 0; first < records; first += kBatch) {
    keys.clear();
    values.clear();
    pairs.clear();
    for (uint64_t i = first; i < std::min(records, first + kBatch); ++i) {
      char k[24],
          v[40];  // room for any u64; the first 16 and 32 bytes are used
      std::snprintf(k, sizeof(k), "rec%013llu", (unsigned long long)i);
      std::snprintf(v, sizeof(v), "value-%026llu", (unsigned long long)i);
      keys.emplace_back(k, 16);
      values.emplace_back(v, 32);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      pairs.emplace_back(keys[i], values[i]);
    }
    for (const auto& r : c->MultiPut(pairs)) {
      if (!r.ok()) return r.status().WithContext("loading");
    }
  }
  return Status::OK();
}

Result<Trial> RunTrial(const FabricOptions& o, const FailoverOptions& f,
                       const std::string& zk, int n) {
  const std::string cluster = zk + "/bench-failover/t" + std::to_string(n);
  const std::vector<std::string> flags = {"--cluster",
                                          cluster,
                                          "--cluster-size",
                                          std::to_string(f.servers),
                                          "--replicas",
                                          std::to_string(f.replicas),
                                          "--shards",
                                          "64",
                                          "--cluster-lease-ms",
                                          std::to_string(f.lease_ms),
                                          "--cluster-session-ms",
                                          std::to_string(f.session_ms)};
  // A member of the trial's cluster (--join starts one more).
  auto start_server = [&]() {
    testing::ServerOptions so;
    so.binary = o.server_binary;
    so.transport = o.transport;
    so.memory = f.records > 0 ? "2G" : "256M";
    so.threads = 1;
    so.cpu = o.server_cpu;
    so.flags = flags;
    return testing::ServerProcess::Start(std::move(so));
  };
  std::vector<testing::ServerProcess> servers;
  for (int i = 0; i < f.servers; ++i) {
    auto s = start_server();
    if (!s.ok()) return s.status();
    servers.push_back(std::move(*s));
  }
  ClusterOptions co;
  for (const auto& s : servers) co.seeds.push_back(s.address);
  co.session.transport = o.transport;
  co.session.timeout = std::chrono::seconds(30);
  co.wait_for_config = std::chrono::seconds(30);
  auto c = Cluster::Connect(co);
  if (!c.ok()) return c.status();
  if (f.records > 0) REMEM_RETURN_IF_ERROR(Load(c->get(), f.records));
  // The manager, by its stats.
  std::string manager;
  for (const auto& s : servers) {
    SessionOptions so;
    so.server = s.address;
    so.transport = o.transport;
    auto probe = Session::Connect(so);
    if (!probe.ok()) return probe.status();
    auto st = (*probe)->Stats();
    if (st.ok() && st->Get("cluster_manager") == 1) manager = s.address;
  }
  // A key whose primary is (or is not) the manager.
  std::string key;
  for (int i = 0; key.empty() && i < 100000; ++i) {
    const std::string k = "probe-" + std::to_string(i);
    if (((*c)->OwnerOf(k) == manager) == f.kill_manager) key = k;
  }
  if (key.empty()) return Status::Internal("no key of the right primary");
  const std::string victim = (*c)->OwnerOf(key);
  Trial t;
  t.killed_manager = victim == manager;
  const auto warm_until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(f.warmup_ms);
  uint64_t v = 0;
  while (std::chrono::steady_clock::now() < warm_until) {
    auto r = (*c)->Put(key, "v" + std::to_string(v++));
    if (!r.ok()) return r.status().WithContext("before the kill");
  }
  if (f.drain || f.join) {
    // Writes to the key go on while the cluster reshapes.
    std::atomic<bool> done{false};
    Status reshaped;
    const uint64_t start_ns = testing::NowNs();
    // The second client outlives the writes (its sessions close after the
    // measurement).
    auto other = Cluster::Connect(co);
    std::thread reshaper([&] {
      if (!other.ok()) {
        reshaped = other.status();
      } else if (f.drain) {
        reshaped = (*other)->Drain(victim, std::chrono::seconds(120));
      } else {
        auto s = start_server();
        if (!s.ok()) {
          reshaped = s.status();
        } else {
          servers.push_back(std::move(*s));
          const uint64_t until = testing::NowNs() + 120'000'000'000ull;
          reshaped = Status::TimedOut("not balanced within 120 s");
          while (testing::NowNs() < until) {
            if (!(*other)->Refresh().ok()) continue;
            if (t.listed_ms < 0 &&
                (*other)->info().nodes.size() == servers.size()) {
              t.listed_ms = double(testing::NowNs() - start_ns) / 1e6;
            }
            if (Balanced((*other)->info(), servers.size())) {
              reshaped = Status::OK();
              break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        }
      }
      if (reshaped.ok())
        t.reshape_ms = double(testing::NowNs() - start_ns) / 1e6;
      done = true;
    });
    while (!done) {
      const uint64_t call_ns = testing::NowNs();
      auto r = (*c)->Put(key, "v" + std::to_string(v++));
      if (r.ok()) {
        t.write_ns.push_back(testing::NowNs() - call_ns);
      } else if (t.failed_writes++ == 0) {
        t.first_failure = r.status().ToString();
      }
    }
    reshaper.join();
    if (!reshaped.ok()) {
      return reshaped.WithContext(f.drain ? "draining" : "balancing");
    }
    t.failover_ms = 0;
    c->reset();
    for (auto& s : servers) (void)s.Kill();
    return t;
  }
  const uint64_t killed_ns = testing::NowNs();
  for (auto& s : servers) {
    if (s.address == victim) REMEM_RETURN_IF_ERROR(s.Kill());
  }
  const uint64_t give_up_ns = killed_ns + 60'000'000'000ull;
  while (testing::NowNs() < give_up_ns) {
    const uint64_t call_ns = testing::NowNs();
    auto r = (*c)->Put(key, "v" + std::to_string(v++));
    if (r.ok() && call_ns >= killed_ns) {
      t.failover_ms = double(testing::NowNs() - killed_ns) / 1e6;
      break;
    }
    if (!r.ok()) ++t.unknown;
  }
  if (f.records > 0 && t.failover_ms >= 0) {
    // Writes go on while the shards short of copies are copied.
    auto next_check = std::chrono::steady_clock::now();
    while (testing::NowNs() < give_up_ns) {
      const uint64_t call_ns = testing::NowNs();
      auto r = (*c)->Put(key, "v" + std::to_string(v++));
      if (r.ok()) t.write_ns.push_back(testing::NowNs() - call_ns);
      if (std::chrono::steady_clock::now() < next_check) continue;
      next_check += std::chrono::milliseconds(20);
      if ((*c)->Refresh().ok() && Whole((*c)->info(), victim)) {
        t.whole_ms = double(testing::NowNs() - killed_ns) / 1e6;
        break;
      }
    }
    for (auto& [address, st] : (*c)->Stats()) {
      if (st.ok() && st->Get("cluster_manager") == 1) {
        t.fill_ms = st->Get("cluster_last_fill_ms");
      }
      if (st.ok()) t.fill_pairs += st->Get("hash_fill_pairs");
    }
  }
  c->reset();
  for (auto& s : servers) (void)s.Kill();
  return t;
}

}  // namespace

int RunFailover(const FabricOptions& o, const FailoverOptions& f) {
  auto zk = testing::ZooKeeperProcess::Start();
  if (!zk.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", zk.status().ToString().c_str());
    return 1;
  }
  if (o.client_cpu >= 0) (void)PinThisThread(o.client_cpu);
  std::printf(
      "failover: %d trials, %d servers, %d backup(s) per shard, lease %llu "
      "ms, ZooKeeper session %llu ms, %s, %s\n",
      f.trials, f.servers, f.replicas,
      static_cast<unsigned long long>(f.lease_ms),
      static_cast<unsigned long long>(f.session_ms),
      std::string(TransportName(o.transport)).c_str(),
      f.drain          ? "draining a primary that is not the manager"
      : f.join         ? "one more server joining"
      : f.kill_manager ? "killing the manager"
                       : "killing a primary that is not the manager");
  if (f.records > 0) {
    std::printf(
        "re-replication: %llu pairs of 16 B keys and 32 B values "
        "loaded before each kill\n",
        static_cast<unsigned long long>(f.records));
  }
  std::vector<double> ms, whole;
  std::vector<uint64_t> write_ns;
  uint64_t unknown = 0;
  int failed = 0;
  for (int n = 0; n < f.trials; ++n) {
    auto t = RunTrial(o, f, (*zk)->hosts(), n);
    if (!t.ok()) {
      std::fprintf(stderr, "trial %d: %s\n", n, t.status().ToString().c_str());
      ++failed;
      continue;
    }
    if (f.drain || f.join) {
      std::vector<uint64_t> w = t->write_ns;
      std::sort(w.begin(), w.end());
      auto at = [&](double p) {
        return w.empty()
                   ? 0.0
                   : double(w[std::min(w.size() - 1,
                                       size_t(p * double(w.size() - 1)))]) /
                         1e3;
      };
      const std::string listed =
          f.join ? " (listed after " + std::to_string(int(t->listed_ms)) +
                       " ms: the server's start)"
                 : "";
      std::printf(
          "trial %3d: %s in %8.1f ms%s; %zu writes meanwhile: p50 %.0f us, "
          "p99 %.0f us, max %.0f us; %llu failed%s\n",
          n, f.drain ? "drained" : "balanced", t->reshape_ms, listed.c_str(),
          w.size(), at(0.5), at(0.99), at(1.0),
          static_cast<unsigned long long>(t->failed_writes),
          t->first_failure.empty() ? ""
                                   : (" (" + t->first_failure + ")").c_str());
      ms.push_back(t->reshape_ms);
      unknown += t->failed_writes;
      continue;
    }
    unknown += t->unknown;
    if (t->failover_ms < 0) {
      ++failed;
      continue;
    }
    ms.push_back(t->failover_ms);
    if (f.records == 0) {
      std::printf("trial %3d: %8.1f ms\n", n, t->failover_ms);
      continue;
    }
    std::vector<uint64_t> w = t->write_ns;
    std::sort(w.begin(), w.end());
    auto at = [&](double p) {
      return w.empty() ? 0.0
                       : double(w[std::min(w.size() - 1,
                                           size_t(p * double(w.size() - 1)))]) /
                             1e3;
    };
    char whole_text[96];
    if (t->whole_ms < 0) {
      std::snprintf(whole_text, sizeof(whole_text),
                    "the shards never whole again (given up)");
    } else {
      std::snprintf(whole_text, sizeof(whole_text),
                    "every shard whole again %8.1f ms after the kill",
                    t->whole_ms);
    }
    std::printf(
        "trial %3d: failover %8.1f ms; %s (the manager's copy round %llu ms, "
        "%llu pairs sent); %zu writes meanwhile: p50 %.0f us, p99 %.0f us, "
        "max %.0f us\n",
        n, t->failover_ms, whole_text,
        static_cast<unsigned long long>(t->fill_ms),
        static_cast<unsigned long long>(t->fill_pairs), w.size(), at(0.5),
        at(0.99), at(1.0));
    if (t->whole_ms < 0) {
      ++failed;
    } else {
      whole.push_back(t->whole_ms);
    }
  }
  if (ms.empty()) return 1;
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) {
    return ms[std::min(ms.size() - 1, size_t(p * double(ms.size() - 1) + 0.5))];
  };
  if (f.drain || f.join) {
    std::printf(
        "%s_ms trials %zu  p50 %.1f  max %.1f  (failed trials %d, failed "
        "writes %llu)\n",
        f.drain ? "drain" : "balance", ms.size(), pct(0.5), ms.back(), failed,
        static_cast<unsigned long long>(unknown));
    return failed == 0 && unknown == 0 ? 0 : 1;
  }
  std::printf(
      "failover_ms trials %zu  p50 %.1f  p99 %.1f  min %.1f  max %.1f  "
      "(failed trials %d, writes with unknown outcome %llu)\n",
      ms.size(), pct(0.5), pct(0.99), ms.front(), ms.back(), failed,
      static_cast<unsigned long long>(unknown));
  if (!whole.empty()) {
    std::sort(whole.begin(), whole.end());
    std::printf(
        "whole_again_ms trials %zu  p50 %.1f  max %.1f (from the kill until "
        "every shard had all its backups)\n",
        whole.size(), whole[whole.size() / 2], whole.back());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace remem::bench
