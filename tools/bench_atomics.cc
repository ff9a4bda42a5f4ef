// remem-bench atomics (bench_atomics.h).

#include "bench_atomics.h"

#include <hiredis/hiredis.h>

#include <functional>
#include <numeric>

#include "bench_common.h"
#include "bench_drivers.h"
#include "bench_ycsb_gen.h"
#include "ops/vector.h"
#include "remem/ops.h"

namespace remem::bench {

namespace {

using Clock = std::chrono::steady_clock;

std::string CounterKey(uint64_t i) { return "ctr" + std::to_string(i); }

// Keys of a row: uniform, zipfian or one.
std::function<uint64_t()> Chooser(const std::string& dist, uint64_t keys,
                                  ycsb::Rng* rng) {
  if (dist == "single") return [] { return uint64_t{0}; };
  if (dist == "zipf") {
    auto z = std::make_shared<ycsb::Zipfian>(keys, 0.99);
    return [z, rng] { return z->Next(*rng); };
  }
  return [rng, keys] { return rng->Next() % keys; };
}

struct Measured {
  Row row;
  double writes_per_op = -1;
};

// Runs `issue(done)` keeping `depth` in flight for `seconds`; `done` is
// called by the operation's callback.
template <typename Issue>
Status Window(Session* s, int depth, double seconds, Issue issue, Row* row) {
  int in_flight = 0;
  Status err;
  auto done = [&](const Status& st) {
    --in_flight;
    if (!st.ok() && err.ok()) err = st;
    ++row->ops;
  };
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  while (Clock::now() < end && err.ok()) {
    while (in_flight < depth) {
      ++in_flight;
      issue(done);
    }
    (void)s->Poll();
  }
  while (in_flight > 0) (void)s->Poll();
  row->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return err;
}

// A server counter (0 if the stats call fails).
uint64_t StatOr(Session* s, const char* name) {
  auto st = s->Stats();
  return st.ok() ? st->Get(name) : 0;
}

std::vector<int64_t> VectorOf(size_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 1);
  return v;
}

}  // namespace

int RunAtomics(const FabricOptions& o, const AtomicsOptions& a) {
  if (Status st = PinThisThread(o.client_cpu); !st.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  auto started =
      ServerFor(o.server, o.server_binary, o.transport, o.server_cpu, "1G");
  if (!started.ok()) return 1;
  ServerUnderTest server = std::move(*started);
  const std::string tname(TransportName(o.transport));
  auto session = ConnectOrReport(server.address, o.transport, o.secret);
  if (session == nullptr) return 1;
  auto opened = OpsStore::Open(session.get());
  if (!opened.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n",
                 opened.status().ToString().c_str());
    return 1;
  }
  OpsStore& ops = **opened;
  // The client-side reductions read one-sided (the hash store's read path
  // forced), whatever the selector would choose.
  auto onesided_session = ConnectOrReport(server.address, o.transport, o.secret,
                                          ReadPath::kOneSided);
  if (onesided_session == nullptr) return 1;
  auto onesided = HashStore::Open(onesided_session.get());
  if (!onesided.ok()) return 1;
  std::vector<Row> rows;
  std::vector<std::string> notes;
  const int depth = o.depth;

  // Counters exist before the rows (8-byte zeros), so every row does the
  // same work per operation.
  {
    std::vector<Op> load;
    for (uint64_t i = 0; i < a.keys; ++i) {
      load.push_back(Op::CompareSwap(CounterKey(i), "", ops::EncodeI64(0),
                                     /*create=*/true));
      if (load.size() == 4096 || i + 1 == a.keys) {
        for (auto& r : ops.ExecuteBatch(load)) {
          if (!r.ok()) {
            std::fprintf(stderr, "remem-bench: load: %s\n",
                         r.status().ToString().c_str());
            return 1;
          }
        }
        load.clear();
      }
    }
  }
  auto measure = [&](const std::string& name, int d, auto body) -> Status {
    Row row;
    row.test = name;
    row.transport = tname;
    row.size = 8;
    row.depth = d;
    const uint64_t writes0 = StatOr(session.get(), "hash_op_writes");
    const uint64_t ops0 = StatOr(session.get(), "hash_ops");
    auto before = server.CpuSeconds();
    Status st = body(&row);
    auto after = server.CpuSeconds();
    if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
    const uint64_t dops = StatOr(session.get(), "hash_ops") - ops0;
    if (dops > 0) {
      const double w =
          double(StatOr(session.get(), "hash_op_writes") - writes0) / dops;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s: %.3f bucket writes per operation",
                    name.c_str(), w);
      notes.push_back(buf);
    }
    rows.push_back(std::move(row));
    return st;
  };

  ycsb::Rng rng(42);
  {
    auto next = Chooser("uniform", a.keys, &rng);
    const std::string value = ops::EncodeI64(1);
    Status st = measure("put_uniform", depth, [&](Row* row) {
      return Window(
          session.get(), depth, o.seconds,
          [&](auto& done) {
            ops.hash()->PutAsync(
                CounterKey(next()), value,
                [&done](Result<uint64_t> r) { done(r.status()); });
          },
          row);
    });
    if (!st.ok()) {
      std::fprintf(stderr, "remem-bench: put: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  for (const char* dist : {"uniform", "zipf", "single"}) {
    auto next = Chooser(dist, a.keys, &rng);
    Status st = measure(std::string("faa_") + dist, depth, [&](Row* row) {
      return Window(
          session.get(), depth, o.seconds,
          [&](auto& done) {
            ops.ExecuteAsync(Op::FetchAdd(CounterKey(next()), 1),
                             [&done](Result<OpReply> r) { done(r.status()); });
          },
          row);
    });
    if (!st.ok()) {
      std::fprintf(stderr, "remem-bench: fetch-add: %s\n",
                   st.ToString().c_str());
      return 1;
    }
  }
  {
    Status st = measure("faa_single_sync", 1, [&](Row* row) {
      const auto start = Clock::now();
      const auto end = start + std::chrono::duration<double>(o.seconds);
      while (Clock::now() < end) {
        for (int i = 0; i < 64; ++i) {
          const uint64_t t0 = NowNs();
          auto r = ops.FetchAdd(CounterKey(0), 1);
          row->latency_ns.Record(NowNs() - t0);
          if (!r.ok()) return r.status();
          ++row->ops;
        }
      }
      row->seconds =
          std::chrono::duration<double>(Clock::now() - start).count();
      return Status::OK();
    });
    if (!st.ok()) {
      std::fprintf(stderr, "remem-bench: fetch-add: %s\n",
                   st.ToString().c_str());
      return 1;
    }
  }
  if (a.vectors) {
    for (size_t n : {size_t{1024}, size_t{65536}}) {
      const std::string key = "vec" + std::to_string(n);
      if (!ops.VecPut(key, VectorOf(n)).ok()) {
        std::fprintf(stderr, "remem-bench: vector put failed\n");
        return 1;
      }
      const std::string suffix = n == 1024 ? "_1K" : "_64K";
      const int64_t want = int64_t(n) * int64_t(n + 1) / 2;
      for (bool server_side : {true, false}) {
        Status st = measure(
            std::string(server_side ? "reduce_srv" : "reduce_cli") + suffix, 1,
            [&](Row* row) -> Status {
              HashStore::Value kept;
              const auto start = Clock::now();
              const auto end = start + std::chrono::duration<double>(o.seconds);
              while (Clock::now() < end) {
                const uint64_t t0 = NowNs();
                Result<Number> r = Status::Internal("unset");
                if (server_side) {
                  auto rep = ops.Execute(Op::VecReduce(key, Reduction::kSum));
                  if (!rep.ok()) return rep.status();
                  r = rep->AsNumber();
                } else {
                  // Into storage kept across reductions (what OpsStore's
                  // local path does), so the copy is not allocated anew.
                  Status g = (*onesided)->Get(key, &kept);
                  if (!g.ok()) return g;
                  auto s = ops::ReduceVector(kept.value, Reduction::kSum);
                  if (!s.ok()) return s.status();
                  OpReply rep;
                  rep.value = std::move(*s);
                  r = rep.AsNumber();
                }
                row->latency_ns.Record(NowNs() - t0);
                if (!r.ok()) return r.status();
                if (std::get<int64_t>(*r) != want) {
                  return Status::Internal("wrong sum");
                }
                ++row->ops;
              }
              row->seconds =
                  std::chrono::duration<double>(Clock::now() - start).count();
              return Status::OK();
            });
        rows.back().size = 16 + 8 * n;
        if (!st.ok()) {
          std::fprintf(stderr, "remem-bench: reduce: %s\n",
                       st.ToString().c_str());
          return 1;
        }
      }
      // The adaptive choice (OpsOptions::reduce_path kAuto), a store of its
      // own so it learns this size only.
      auto adaptive = OpsStore::Open(session.get());
      if (!adaptive.ok()) return 1;
      Status st = measure("reduce_auto" + suffix, 1, [&](Row* row) -> Status {
        const auto start = Clock::now();
        const auto end = start + std::chrono::duration<double>(o.seconds);
        while (Clock::now() < end) {
          const uint64_t t0 = NowNs();
          auto r = (*adaptive)->VecReduce(key, Reduction::kSum);
          row->latency_ns.Record(NowNs() - t0);
          if (!r.ok()) return r.status();
          ++row->ops;
        }
        row->seconds =
            std::chrono::duration<double>(Clock::now() - start).count();
        return Status::OK();
      });
      rows.back().size = 16 + 8 * n;
      if (!st.ok()) return 1;
      const auto rs = (*adaptive)->reduce_stats();
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "reduce_auto%s: %llu local, %llu on the server "
                    "(estimates %.1f / %.1f us)",
                    suffix.c_str(), static_cast<unsigned long long>(rs.local),
                    static_cast<unsigned long long>(rs.server),
                    rs.local_estimate_us, rs.server_estimate_us);
      notes.push_back(buf);
    }
  }

  if (a.redis) {
    SystemSpec spec;
    spec.name = "redis";
    spec.kind = SystemSpec::Kind::kRedis;
    SystemServer::Options so;
    so.cpu = o.server_cpu;
    auto redis = SystemServer::Start(spec, so);
    if (!redis.ok()) {
      notes.push_back("redis rows skipped: " + redis.status().ToString());
    } else {
      const std::string& addr = (*redis)->address();
      const int port = std::stoi(addr.substr(addr.rfind(':') + 1));
      redisContext* c = redisConnect("127.0.0.1", port);
      if (c == nullptr || c->err) {
        notes.push_back("redis rows skipped: cannot connect");
      } else {
        auto redis_row = [&](const std::string& name, const std::string& dist) {
          auto next = Chooser(dist, a.keys, &rng);
          Row row;
          row.test = name;
          row.transport = "tcp";
          row.size = 8;
          row.depth = depth;
          auto before = (*redis)->CpuSeconds();
          const auto start = Clock::now();
          const auto end = start + std::chrono::duration<double>(o.seconds);
          int in_flight = 0;
          bool ok = true;
          auto append = [&] {
            const std::string k = CounterKey(next());
            redisAppendCommand(c, "INCRBY %b 1", k.data(), k.size());
            ++in_flight;
          };
          for (int i = 0; i < depth; ++i) append();
          while (ok) {
            void* reply = nullptr;
            if (redisGetReply(c, &reply) != REDIS_OK) {
              ok = false;
              break;
            }
            freeReplyObject(reply);
            --in_flight;
            ++row.ops;
            if (Clock::now() < end) {
              append();
            } else if (in_flight == 0) {
              break;
            }
          }
          row.seconds =
              std::chrono::duration<double>(Clock::now() - start).count();
          auto after = (*redis)->CpuSeconds();
          if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
          rows.push_back(std::move(row));
        };
        redis_row("redis_incr_uniform", "uniform");
        redis_row("redis_incr_single", "single");
        if (a.vectors) {
          for (size_t n : {size_t{1024}, size_t{65536}}) {
            const std::string value = EncodeVector(VectorOf(n));
            const std::string key = "vec" + std::to_string(n);
            freeReplyObject(redisCommand(c, "SET %b %b", key.data(), key.size(),
                                         value.data(), value.size()));
            Row row;
            row.test =
                std::string("reduce_redis") + (n == 1024 ? "_1K" : "_64K");
            row.transport = "tcp";
            row.size = value.size();
            auto before = (*redis)->CpuSeconds();
            const auto start = Clock::now();
            const auto end = start + std::chrono::duration<double>(o.seconds);
            while (Clock::now() < end) {
              const uint64_t t0 = NowNs();
              auto* r = static_cast<redisReply*>(
                  redisCommand(c, "GET %b", key.data(), key.size()));
              if (r == nullptr || r->type != REDIS_REPLY_STRING) break;
              auto s = ops::ReduceVector(std::string_view(r->str, r->len),
                                         Reduction::kSum);
              freeReplyObject(r);
              row.latency_ns.Record(NowNs() - t0);
              if (!s.ok()) break;
              ++row.ops;
            }
            row.seconds =
                std::chrono::duration<double>(Clock::now() - start).count();
            auto after = (*redis)->CpuSeconds();
            if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
            rows.push_back(std::move(row));
          }
        }
      }
      if (c) redisFree(c);
    }
  }

  if (o.json) {
    PrintJson(rows, "\"workload\":\"atomics\",");
  } else {
    PrintTable(rows);
    for (const auto& n : notes) std::printf("  %s\n", n.c_str());
  }
  return 0;
}

}  // namespace remem::bench
