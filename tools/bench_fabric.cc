// remem-bench fabric: the transport layer alone. One-sided get/put/atomic and
// RPC round trips against one remem-server, latency at depth 1 and
// throughput with many operations in flight; then the data paths built
// directly on them: a namespace's Mapping, and transactional objects.

#include "bench_fabric.h"

#include <hiredis/hiredis.h>

#include <cstring>
#include <deque>
#include <functional>
#include <random>

#include "bench_common.h"
#include "bench_drivers.h"
#include "remem/session.h"
#include "remem/space.h"
#include "remem/txn.h"
#include "util/size.h"

namespace remem::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Runs `op` synchronously until `seconds` pass; records each latency.
Row RunSync(const std::string& name, uint64_t size, double seconds,
            const std::function<Status()>& op, Status* err) {
  Row row;
  row.test = name;
  row.size = size;
  auto end = Clock::now() + std::chrono::duration<double>(seconds);
  auto start = Clock::now();
  while (true) {
    // Check the clock every 64 operations.
    for (int i = 0; i < 64; ++i) {
      uint64_t t0 = NowNs();
      Status st = op();
      row.latency_ns.Record(NowNs() - t0);
      if (!st.ok()) {
        *err = st;
        return row;
      }
      ++row.ops;
    }
    if (Clock::now() >= end) break;
  }
  row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return row;
}

// Keeps `depth` asynchronous operations in flight for `seconds`. `issue`
// starts operation number `slot` and must call the callback it is given.
Row RunAsync(Session& c, const std::string& name, uint64_t size, int depth,
             double seconds,
             const std::function<void(int, std::function<void(Status)>)>& issue,
             Status* err) {
  Row row;
  row.test = name;
  row.size = size;
  row.depth = depth;
  auto start = Clock::now();
  auto end = start + std::chrono::duration<double>(seconds);
  bool stopping = false;
  std::vector<uint64_t> started(depth);
  std::function<void(int)> launch = [&](int slot) {
    started[slot] = NowNs();
    issue(slot, [&, slot](Status st) {
      row.latency_ns.Record(NowNs() - started[slot]);
      if (!st.ok()) {
        if (err->ok()) *err = st;
        stopping = true;
        return;
      }
      ++row.ops;
      if (!stopping) launch(slot);
    });
  };
  for (int i = 0; i < depth; ++i) launch(i);
  uint64_t polls = 0;
  while (c.in_flight() > 0) {
    c.Poll();
    if ((++polls & 63) == 0 && !stopping && Clock::now() >= end) {
      stopping = true;
    }
  }
  row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return row;
}

// A redis-server pinned as the remem server was, and a connection to it.
struct RedisUnderTest {
  std::unique_ptr<SystemServer> server;
  redisContext* c = nullptr;
  ~RedisUnderTest() {
    if (c != nullptr) redisFree(c);
  }
};
// Null, having said why (`rows`: which rows are skipped), if either fails.
std::unique_ptr<RedisUnderTest> StartRedis(const FabricOptions& o,
                                           const char* rows) {
  SystemSpec spec;
  spec.name = "redis";
  spec.kind = SystemSpec::Kind::kRedis;
  SystemServer::Options so;
  so.cpu = o.server_cpu;
  auto redis = SystemServer::Start(spec, so);
  if (!redis.ok()) {
    std::fprintf(stderr, "remem-bench: no %s: %s\n", rows,
                 redis.status().ToString().c_str());
    return nullptr;
  }
  auto r = std::make_unique<RedisUnderTest>();
  r->server = std::move(*redis);
  const std::string& addr = r->server->address();
  r->c = redisConnect("127.0.0.1", std::stoi(addr.substr(addr.rfind(':') + 1)));
  if (r->c == nullptr || r->c->err != 0) {
    std::fprintf(stderr, "remem-bench: no %s: cannot connect\n", rows);
    return nullptr;
  }
  return r;
}

// Redis's nearest thing to a mapped segment: one string of `span` bytes,
// read with GETRANGE and written with SETRANGE at the offsets `next` gives,
// synchronously (depth 1) and pipelined at o.depth, on a redis-server
// pinned as the remem server was. Prints why if it cannot run.
void RedisRangeRows(const FabricOptions& o, uint64_t span,
                    const std::function<uint64_t()>& next,
                    std::vector<Row>* rows) {
  auto r = StartRedis(o, "Redis rows");
  if (r == nullptr) return;
  SystemServer* redis = r->server.get();
  redisContext* c = r->c;
  const uint64_t size = o.size;
  const std::string payload(size, 'x');
  // The string, zeroed to its full length.
  freeReplyObject(redisCommand(c, "SETRANGE seg %llu %b",
                               static_cast<unsigned long long>(span - 1), "",
                               size_t{1}));
  auto append = [&](bool put) {
    const unsigned long long off = next();
    if (put) {
      redisAppendCommand(c, "SETRANGE seg %llu %b", off, payload.data(),
                         payload.size());
    } else {
      redisAppendCommand(c, "GETRANGE seg %llu %llu", off, off + size - 1);
    }
  };
  for (const bool put : {false, true}) {
    for (const int depth : {1, o.depth}) {
      Row row;
      row.test = put ? "redis_setrange" : "redis_getrange";
      row.transport = "tcp";
      row.size = size;
      row.depth = depth;
      auto before = redis->CpuSeconds();
      const auto start = Clock::now();
      const auto end = start + std::chrono::duration<double>(o.seconds);
      std::deque<uint64_t> sent;  // issue times of those in flight
      bool ok = true;
      for (int i = 0; i < depth; ++i) {
        sent.push_back(NowNs());
        append(put);
      }
      while (!sent.empty()) {
        void* reply = nullptr;
        if (redisGetReply(c, &reply) != REDIS_OK) {
          ok = false;
          break;
        }
        const bool bad =
            static_cast<redisReply*>(reply)->type == REDIS_REPLY_ERROR;
        freeReplyObject(reply);
        if (bad) {
          ok = false;
          break;
        }
        if (depth == 1) row.latency_ns.Record(NowNs() - sent.front());
        sent.pop_front();
        ++row.ops;
        if (Clock::now() < end) {
          sent.push_back(NowNs());
          append(put);
        }
      }
      row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      auto after = redis->CpuSeconds();
      if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
      if (!ok) {
        std::fprintf(stderr, "remem-bench: Redis failed during %s\n",
                     row.test.c_str());
        return;
      }
      rows->push_back(std::move(row));
    }
  }
}

// Redis's nearest things to an object read and a transfer transaction:
// GET of a value of `size` bytes, and WATCH a b + MGET a b, then MULTI,
// SET a, SET b, EXEC (optimistic, as remem's; each group pipelined: two
// round trips), on `keys` keys, one transaction at a time.
void RedisObjectRows(const FabricOptions& o, uint64_t size, int keys,
                     std::vector<Row>* rows) {
  auto r = StartRedis(o, "Redis object rows");
  if (r == nullptr) return;
  SystemServer* redis = r->server.get();
  redisContext* c = r->c;
  const std::string value(size, 'v');
  for (int k = 0; k < keys; ++k) {
    freeReplyObject(redisCommand(c, "SET obj%d %b", k, value.data(), size));
  }
  std::mt19937 rng(7);
  bool failed = false;
  auto command = [&](const char* fmt, auto... args) {
    auto* r = static_cast<redisReply*>(redisCommand(c, fmt, args...));
    failed = failed || r == nullptr || r->type == REDIS_REPLY_ERROR;
    if (r != nullptr) freeReplyObject(r);
  };
  auto drain = [&](int replies) {
    for (int i = 0; i < replies; ++i) {
      void* r = nullptr;
      if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) {
        failed = true;
        return;
      }
      failed = failed || static_cast<redisReply*>(r)->type == REDIS_REPLY_ERROR;
      freeReplyObject(r);
    }
  };
  for (const char* test : {"redis_get", "redis_transfer"}) {
    const bool transfer = test[6] == 't';
    auto before = redis->CpuSeconds();
    Status unused;
    Row row = RunSync(
        test, size, o.seconds,
        [&] {
          const int a = int(rng() % keys);
          const int b = (a + 1 + int(rng() % (keys - 1))) % keys;
          if (!transfer) {
            command("GET obj%d", a);
          } else {
            // Two round trips, each pipelined (Redis at its best):
            // WATCH and MGET, then MULTI, SET, SET, EXEC.
            redisAppendCommand(c, "WATCH obj%d obj%d", a, b);
            redisAppendCommand(c, "MGET obj%d obj%d", a, b);
            drain(2);
            redisAppendCommand(c, "MULTI");
            redisAppendCommand(c, "SET obj%d %b", a, value.data(), size);
            redisAppendCommand(c, "SET obj%d %b", b, value.data(), size);
            redisAppendCommand(c, "EXEC");
            drain(4);
          }
          return failed ? Status::Unavailable("Redis failed") : Status::OK();
        },
        &unused);
    auto after = redis->CpuSeconds();
    if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
    row.transport = "tcp";
    if (!unused.ok()) {
      std::fprintf(stderr, "remem-bench: Redis failed during %s\n", test);
      break;
    }
    rows->push_back(std::move(row));
  }
}

}  // namespace

int RunFabric(const FabricOptions& o) {
  if (Status st = PinThisThread(o.client_cpu); !st.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  auto started =
      ServerFor(o.server, o.server_binary, o.transport, o.server_cpu, "256M");
  if (!started.ok()) return 1;
  ServerUnderTest server = std::move(*started);
  auto client = ConnectOrReport(server.address, o.transport, o.secret);
  if (client == nullptr) return 1;
  Session& c = *client;
  const std::string tname(TransportName(o.transport));
  if (!o.json) {
    std::printf("server %s%s, transport %s (UCX chose %s), client on CPU %d\n",
                server.address.c_str(),
                (server.process ? " (started here, pinned to CPU " +
                                      std::to_string(o.server_cpu) + ")"
                                : std::string(" (external)"))
                    .c_str(),
                tname.c_str(), c.transport().c_str(), o.client_cpu);
  }
  if (c.regions().empty()) {
    std::fprintf(stderr, "remem-bench: the server exports no memory\n");
    return 1;
  }
  const RegionInfo region = c.regions().front();
  const uint64_t size = o.size;
  // The span given is what runs, or is refused: a run over other memory
  // than named would measure something else (a cache-resident span, or one
  // larger than the caches). The default fits a smaller server.
  const uint64_t span_max = region.length - 4096;
  if (o.span_given && (o.span < 4096 || o.span > span_max)) {
    std::fprintf(stderr,
                 "remem-bench: --span must be from 4 KiB to %s (the server's "
                 "first region, less 4 KiB)\n",
                 FormatSize(region.length - 4096).c_str());
    return 2;
  }
  uint64_t span = std::min(o.span, span_max);
  // Whole 1 MiB chunks of the load pattern, so the check below is aligned.
  if (span > (1u << 20)) span &= ~uint64_t{(1u << 20) - 1};
  if (size == 0 || size > span / 2) {
    std::fprintf(stderr, "remem-bench: --size must be in [1, %llu]\n",
                 static_cast<unsigned long long>(span / 2));
    return 2;
  }

  // Load: fill the working span with one-sided writes, then check it.
  std::vector<uint8_t> pattern(1 << 20);
  std::mt19937_64 rng(42);
  for (auto& b : pattern) b = static_cast<uint8_t>(rng());
  auto load_start = Clock::now();
  if (pattern.size() > span) pattern.resize(span);
  for (uint64_t off = 0; off < span; off += pattern.size()) {
    Status st = c.Write({region.id, off}, pattern.data(),
                        std::min<uint64_t>(pattern.size(), span - off));
    if (!st.ok()) {
      std::fprintf(stderr, "remem-bench: load: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  double load_s =
      std::chrono::duration<double>(Clock::now() - load_start).count();
  std::vector<uint8_t> check(pattern.size());
  if (Status st = c.Read({region.id, span - pattern.size()}, check.data(),
                         check.size());
      !st.ok() || check != pattern) {
    std::fprintf(stderr, "remem-bench: load verification failed: %s\n",
                 st.ok() ? "content differs" : st.ToString().c_str());
    return 1;
  }
  if (!o.json) {
    std::printf(
        "load: wrote and verified %s one-sided in %.3f s (%.2f GiB/s)\n",
        FormatSize(span).c_str(), load_s,
        static_cast<double>(span) / load_s / (1 << 30));
  }

  const uint64_t slots = span / size;
  std::vector<uint64_t> offsets(1 << 16);
  for (auto& off : offsets) off = (rng() % slots) * size;
  std::vector<std::vector<uint8_t>> bufs(std::max(o.depth, 1),
                                         std::vector<uint8_t>(size));
  size_t next = 0;
  auto addr = [&] {
    return RemoteAddress{region.id, offsets[next++ & (offsets.size() - 1)]};
  };
  const RemoteAddress counter{region.id,
                              (span + 7) & ~uint64_t{7}};  // past the data

  std::vector<Row> rows;
  Status err;
  auto measure = [&](Row row) {
    row.transport = tname;
    rows.push_back(std::move(row));
  };
  auto with_cpu = [&](const std::function<Row()>& fn) {
    auto before = server.CpuSeconds();
    Row r = fn();
    auto after = server.CpuSeconds();
    if (before.ok() && after.ok()) r.server_cpu_s = *after - *before;
    measure(std::move(r));
  };
  std::string payload(size, 'x');

  with_cpu([&] {
    return RunSync(
        "get", size, o.seconds,
        [&] { return c.Read(addr(), bufs[0].data(), size); }, &err);
  });
  with_cpu([&] {
    return RunAsync(
        c, "get", size, o.depth, o.seconds,
        [&](int slot, std::function<void(Status)> done) {
          c.ReadAsync(addr(), bufs[slot].data(), size, std::move(done));
        },
        &err);
  });
  with_cpu([&] {
    return RunSync(
        "put", size, o.seconds,
        [&] { return c.Write(addr(), bufs[0].data(), size); }, &err);
  });
  with_cpu([&] {
    return RunSync(
        "fetch_add", 8, o.seconds,
        [&] { return c.FetchAdd(counter, 1).status(); }, &err);
  });
  with_cpu([&] {
    return RunSync(
        "rpc_echo", size, o.seconds, [&] { return c.Echo(payload).status(); },
        &err);
  });
  with_cpu([&] {
    return RunAsync(
        c, "rpc_echo", size, o.depth, o.seconds,
        [&](int, std::function<void(Status)> done) {
          c.EchoAsync(payload,
                      [done](Result<std::string> r) { done(r.status()); });
        },
        &err);
  });
  // The same operations on a namespace's segment (remem/space.h), through
  // its Mapping: the data path of namespaces is these one-sided operations
  // plus the mapping's extent lookup.
  if (err.ok()) {
    (void)Namespace::Delete(&c, "remem-bench");
    auto ns = Namespace::Create(&c, "remem-bench");
    std::unique_ptr<Mapping> map;
    uint64_t ns_span = span;
    if (ns.ok()) {
      Result<Segment> seg = Status::OutOfMemory("");
      while (ns_span >= 2 * size && !(seg = (*ns)->Alloc(ns_span)).ok() &&
             seg.status().code() == StatusCode::kOutOfMemory) {
        ns_span /= 2;
      }
      if (seg.ok()) {
        auto m = (*ns)->Map(*seg);
        if (m.ok()) map = std::move(*m);
      }
    }
    if (map == nullptr) {
      std::fprintf(stderr, "remem-bench: no namespace rows (%s)\n",
                   ns.ok() ? "no segment could be allocated"
                           : ns.status().ToString().c_str());
    } else {
      const uint64_t ns_slots = std::max<uint64_t>(ns_span / size, 1);
      auto ns_off = [&] {
        return (offsets[next++ & (offsets.size() - 1)] / size % ns_slots) *
               size;
      };
      const uint64_t ns_counter = (ns_slots * size - 8) & ~uint64_t{7};
      with_cpu([&] {
        return RunSync(
            "ns_get", size, o.seconds,
            [&] { return map->Read(ns_off(), bufs[0].data(), size); }, &err);
      });
      with_cpu([&] {
        return RunAsync(
            c, "ns_get", size, o.depth, o.seconds,
            [&](int slot, std::function<void(Status)> done) {
              map->ReadAsync(ns_off(), bufs[slot].data(), size,
                             std::move(done));
            },
            &err);
      });
      with_cpu([&] {
        return RunSync(
            "ns_put", size, o.seconds,
            [&] { return map->Write(ns_off(), bufs[0].data(), size); }, &err);
      });
      with_cpu([&] {
        return RunAsync(
            c, "ns_put", size, o.depth, o.seconds,
            [&](int slot, std::function<void(Status)> done) {
              map->WriteAsync(ns_off(), bufs[slot].data(), size,
                              std::move(done));
            },
            &err);
      });
      with_cpu([&] {
        return RunSync(
            "ns_fetch_add", 8, o.seconds,
            [&] { return map->FetchAdd(ns_counter, 1).status(); }, &err);
      });
      map.reset();
      (void)Namespace::Delete(&c, "remem-bench");
      if (o.redis && err.ok()) {
        RedisRangeRows(o, ns_span, ns_off, &rows);
      }
    }
  }
  // Transactional objects (remem/txn.h): a one-sided read of one object,
  // a read-only transaction of two (read, then validated one-sided), and a
  // transfer (read two, write both: one commit call), on up to kObjects
  // objects of `size` bytes (at most the largest object): half as many
  // while the server's object heap cannot hold them, down to two.
  if (err.ok()) {
    constexpr int kObjects = 1024;
    auto store = ObjectStore::Open(&c);
    std::vector<ObjectId> ids;
    const uint64_t osize =
        store.ok() ? std::min<uint64_t>(size, (*store)->max_object()) : 0;
    Status made = store.status();
    for (int n = kObjects; store.ok() && n >= 2; n /= 2) {
      const std::string value(osize, 'o');
      made = (*store)->Run([&](Transaction& tx) -> Status {
        ids.clear();
        for (int i = 0; i < n; ++i) {
          auto id = tx.Alloc(value);
          if (!id.ok()) return id.status();
          ids.push_back(*id);
        }
        return Status::OK();
      });
      if (made.ok()) break;
      ids.clear();
      if (made.code() != StatusCode::kOutOfMemory) break;
    }
    if (ids.empty()) {
      std::fprintf(stderr, "remem-bench: no object rows (%s)\n",
                   made.ToString().c_str());
    } else {
      if (ids.size() < size_t(kObjects)) {
        std::fprintf(stderr,
                     "remem-bench: the object rows use %zu objects of %llu "
                     "bytes (the server's object heap holds no more)\n",
                     ids.size(), static_cast<unsigned long long>(osize));
      }
      std::mt19937 pick(11);
      auto two = [&] {
        const size_t a = pick() % ids.size();
        return std::make_pair(a,
                              (a + 1 + pick() % (ids.size() - 1)) % ids.size());
      };
      with_cpu([&] {
        return RunSync(
            "obj_read", osize, o.seconds,
            [&] { return (*store)->Read(ids[pick() % ids.size()]).status(); },
            &err);
      });
      with_cpu([&] {
        return RunSync(
            "txn_read2", osize, o.seconds,
            [&] {
              auto [a, b] = two();
              auto tx = (*store)->Begin();
              REMEM_RETURN_IF_ERROR(tx->Read(ids[a]).status());
              REMEM_RETURN_IF_ERROR(tx->Read(ids[b]).status());
              return tx->Commit();
            },
            &err);
      });
      // The same two objects read together (Transaction::ReadMany: over
      // tcp one round trip for both).
      with_cpu([&] {
        return RunSync(
            "txn_read2_many", osize, o.seconds,
            [&] {
              auto [a, b] = two();
              auto tx = (*store)->Begin();
              REMEM_RETURN_IF_ERROR(tx->ReadMany({ids[a], ids[b]}).status());
              return tx->Commit();
            },
            &err);
      });
      with_cpu([&] {
        return RunSync(
            "txn_transfer", osize, o.seconds,
            [&] {
              auto [a, b] = two();
              return (*store)->Run([&](Transaction& tx) -> Status {
                auto x = tx.Read(ids[a]);
                if (!x.ok()) return x.status();
                auto y = tx.Read(ids[b]);
                if (!y.ok()) return y.status();
                REMEM_RETURN_IF_ERROR(tx.Write(ids[a], *y));
                return tx.Write(ids[b], *x);
              });
            },
            &err);
      });
      with_cpu([&] {
        return RunSync(
            "txn_transfer_many", osize, o.seconds,
            [&] {
              auto [a, b] = two();
              return (*store)->Run([&](Transaction& tx) -> Status {
                auto xy = tx.ReadMany({ids[a], ids[b]});
                if (!xy.ok()) return xy.status();
                REMEM_RETURN_IF_ERROR(tx.Write(ids[a], (*xy)[1]));
                return tx.Write(ids[b], (*xy)[0]);
              });
            },
            &err);
      });
      (void)(*store)->Run([&](Transaction& tx) -> Status {
        for (const ObjectId& id : ids) REMEM_RETURN_IF_ERROR(tx.Free(id));
        return Status::OK();
      });
      if (o.redis && err.ok()) {
        RedisObjectRows(o, osize, int(ids.size()), &rows);
      }
    }
  }
  if (!err.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", err.ToString().c_str());
    return 1;
  }
  if (o.json) {
    PrintJson(rows, "\"workload\":\"fabric\",\"ucx_transport\":\"" +
                        c.transport() + "\",");
  } else {
    PrintTable(rows);
  }
  return 0;
}

}  // namespace remem::bench
