// remem-bench tree: loads `records` pairs into the ordered store (and the
// same pairs into the hash store), then times, from one client thread,
// uniform random point gets and scans of 10 and 100 items on each read
// path (one-sided, RPC, auto), and the hash store's one-sided get on the
// same keys (the issue's yardstick: tree lookups at least 40% of it on
// shared memory).

#include "bench_tree.h"

#include <algorithm>
#include <random>

#include "bench_common.h"
#include "remem/hash.h"
#include "remem/session.h"
#include "remem/tree.h"

namespace remem::bench {

namespace {

// Zero-padded: keys sort as their numbers do.
std::string SortableKeyOf(uint64_t i, size_t len) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "user%012llu",
                static_cast<unsigned long long>(i));
  std::string k = buf;
  k.resize(len, '.');
  return k;
}

// A row's time and the server's CPU time since `start` (and `before`).
void EndRow(ServerUnderTest& server, const Result<double>& before,
            std::chrono::steady_clock::time_point start, Row* row) {
  row->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  auto after = server.CpuSeconds();
  if (before.ok() && after.ok()) row->server_cpu_s = *after - *before;
}

// Times `op` (one operation; false on error) for o.seconds into `row`.
template <typename Op>
Status TimeRow(const FabricOptions& o, ServerUnderTest& server, Row* row,
               Op op) {
  auto before = server.CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(o.seconds);
  Status err;
  while (std::chrono::steady_clock::now() < end && err.ok()) {
    for (int i = 0; i < 16 && err.ok(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      err = op();
      row->latency_ns.Record(
          uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - t0)
                       .count()));
      ++row->ops;
    }
  }
  EndRow(server, before, start, row);
  return err;
}

// Times `issue` (one asynchronous operation, which calls its completion
// with a status) for o.seconds into `row`, `depth` of them in flight on
// `session`; the latency is each one's, from issue to completion.
template <typename Issue>
Status TimeAsyncRow(const FabricOptions& o, ServerUnderTest& server,
                    Session* session, Row* row, int depth, Issue issue) {
  row->depth = depth;
  auto before = server.CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration<double>(o.seconds);
  Status err;
  int in_flight = 0;
  while (std::chrono::steady_clock::now() < end && err.ok()) {
    // At most `depth` a round: over tcp an issue's own one-sided reads
    // progress the session and may complete earlier ones.
    for (int i = 0; i < depth && in_flight < depth; ++i) {
      ++in_flight;
      issue([&, t0 = std::chrono::steady_clock::now()](Status st) {
        --in_flight;
        if (!st.ok() && err.ok()) err = st;
        row->latency_ns.Record(
            uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count()));
        ++row->ops;
      });
    }
    session->Poll();
  }
  if (Status st = session->WaitAll(); !st.ok() && err.ok()) err = st;
  EndRow(server, before, start, row);
  return err;
}

// A batch's first error, or OK.
template <typename T>
Status FirstError(const std::vector<Result<T>>& results) {
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
  }
  return Status::OK();
}

}  // namespace

int RunTree(const FabricOptions& o, uint64_t records, size_t key_len,
            size_t value_len, TreeLoadOrder load_order) {
  if (Status st = PinThisThread(o.client_cpu); !st.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  if (key_len < 16 || key_len > 1024 || value_len > (16u << 20)) {
    std::fprintf(stderr,
                 "remem-bench: tree keys are 16..1024 bytes here and values "
                 "at most 16 MiB\n");
    return 2;
  }
  // Nodes are at least half full after splits: three times the pairs'
  // bytes is room enough; the hash store gets as much again.
  const uint64_t tree_mb =
      std::max<uint64_t>(64, records * (16 + key_len + value_len) * 3 >> 20);
  Result<ServerUnderTest> started =
      o.server.empty()
          ? StartServer(o.server_binary, o.transport, o.server_cpu,
                        std::to_string(tree_mb * 4) + "M",
                        {"--tree-memory", std::to_string(tree_mb) + "M"})
          : Result<ServerUnderTest>(ServerUnderTest::External(o.server));
  if (!started.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n",
                 started.status().ToString().c_str());
    return 1;
  }
  ServerUnderTest server = std::move(*started);
  const std::string tname(TransportName(o.transport));
  std::vector<Row> rows;
  std::vector<std::string> notes;
  const std::string value(value_len, 'v');
  {
    auto session =
        ConnectOrReport(server.address, o.transport, o.secret, ReadPath::kRpc);
    if (session == nullptr) return 1;
    auto tree = TreeStore::Open(session.get());
    auto hash = OpenHashOrReport(session.get());
    if (!tree.ok() || hash == nullptr) {
      std::fprintf(stderr, "remem-bench: opening the stores failed\n");
      return 1;
    }
    // The i-th key put: i, or a shuffle's i-th (kept only when shuffled).
    std::vector<uint64_t> shuffled;
    if (load_order == TreeLoadOrder::kRandom) {
      shuffled.resize(records);
      for (uint64_t i = 0; i < records; ++i) shuffled[i] = i;
      std::mt19937_64 shuffle_rng(11);
      std::shuffle(shuffled.begin(), shuffled.end(), shuffle_rng);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status first;
    for (uint64_t i = 0; i < records; ++i) {
      (*tree)->PutAsync(
          SortableKeyOf(shuffled.empty() ? i : shuffled[i], key_len), value,
          [&first](Result<uint64_t> r) {
            if (!r.ok() && first.ok()) first = r.status();
          });
      if ((i & 255) == 255 && !session->WaitAll().ok()) break;
    }
    (void)session->WaitAll();
    if (!first.ok()) {
      std::fprintf(stderr, "remem-bench: load: %s\n", first.ToString().c_str());
      return 1;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    std::vector<std::string> keys;
    std::vector<std::pair<std::string_view, std::string_view>> batch;
    for (uint64_t i = 0; i < records; i += 256) {
      keys.clear();
      batch.clear();
      for (uint64_t j = i; j < std::min(records, i + 256); ++j) {
        keys.push_back(SortableKeyOf(j, key_len));
      }
      for (const auto& k : keys) batch.emplace_back(k, value);
      for (const auto& r : hash->MultiPut(batch)) {
        if (!r.ok()) {
          std::fprintf(stderr, "remem-bench: hash load: %s\n",
                       r.status().ToString().c_str());
          return 1;
        }
      }
    }
    if (!o.json) {
      auto stats = session->Stats();
      std::printf(
          "load: %llu pairs (%zu B keys, %zu B values) into the "
          "tree in %s order in %.2f s (%.0f puts/s, 256 in flight); %llu "
          "tree nodes\n",
          static_cast<unsigned long long>(records), key_len, value_len,
          load_order == TreeLoadOrder::kRandom ? "random" : "sorted", s,
          double(records) / s,
          static_cast<unsigned long long>(stats.ok() ? stats->Get("tree_nodes")
                                                     : 0));
    }
    hash.reset();
  }
  std::mt19937_64 rng(7);
  std::vector<std::string> keys(1 << 16);
  for (auto& k : keys) k = SortableKeyOf(rng() % records, key_len);
  for (ReadPath path : {ReadPath::kOneSided, ReadPath::kRpc, ReadPath::kAuto}) {
    auto session = ConnectOrReport(server.address, o.transport, o.secret, path);
    if (session == nullptr) return 1;
    auto opened = TreeStore::Open(session.get());
    if (!opened.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n",
                   opened.status().ToString().c_str());
      return 1;
    }
    TreeStore& t = **opened;
    const std::string pname(ReadPathName(path));
    size_t next = 0;
    Row get;
    get.test = "tree_get_" + pname;
    get.transport = tname;
    get.size = value_len;
    // Into a kept value, as the hash row below.
    TreeStore::Value into;
    Status err = TimeRow(o, server, &get, [&] {
      return t.Get(keys[next++ & (keys.size() - 1)], &into);
    });
    if (!err.ok()) {
      std::fprintf(stderr, "remem-bench: get: %s\n", err.ToString().c_str());
      return 1;
    }
    rows.push_back(std::move(get));
    for (uint32_t n : {10u, 100u}) {
      Row scan;
      scan.test = "scan" + std::to_string(n) + "_" + pname;
      scan.transport = tname;
      scan.size = n;
      TreeStore::Page page;  // kept: ScanInto reuses its storage
      err = TimeRow(o, server, &scan, [&]() -> Status {
        return t.ScanInto(keys[next++ & (keys.size() - 1)], {}, n,
                          TreeStore::Order::kAscending, &page);
      });
      if (!err.ok()) {
        std::fprintf(stderr, "remem-bench: scan: %s\n", err.ToString().c_str());
        return 1;
      }
      rows.push_back(std::move(scan));
    }
    {
      // Batches of 16 gets: one request on the RPC path.
      Row multi;
      multi.test = "multiget16_" + pname;
      multi.transport = tname;
      multi.size = 16;
      std::vector<std::string_view> batch(16);
      err = TimeRow(o, server, &multi, [&]() -> Status {
        for (auto& k : batch) k = keys[next++ & (keys.size() - 1)];
        for (auto& r : t.MultiGet(batch)) {
          if (!r.ok()) return r.status();
        }
        return Status::OK();
      });
      if (!err.ok()) {
        std::fprintf(stderr, "remem-bench: multi-get: %s\n",
                     err.ToString().c_str());
        return 1;
      }
      rows.push_back(std::move(multi));
      // The same batches, asynchronously: 16 in flight (256 keys).
      Row pipelined;
      pipelined.test = "multiget16_async_" + pname;
      pipelined.transport = tname;
      pipelined.size = 16;
      err = TimeAsyncRow(
          o, server, session.get(), &pipelined, 16, [&](auto done) {
            for (auto& k : batch) {
              k = keys[next++ & (keys.size() - 1)];
            }
            t.MultiGetAsync(batch,
                            [done](auto r) mutable { done(FirstError(r)); });
          });
      if (!err.ok()) {
        std::fprintf(stderr, "remem-bench: multi-get: %s\n",
                     err.ToString().c_str());
        return 1;
      }
      rows.push_back(std::move(pipelined));
    }
    const auto& st = t.read_stats();
    char note[400];
    std::snprintf(
        note, sizeof(note),
        "tree %-9s gets one-sided %llu / RPC %llu, scans one-sided %llu / "
        "RPC %llu, node reads %llu, cache hits %llu, retries %llu, "
        "fallbacks %llu, moves right %llu, leaves read ahead %llu (unused "
        "%llu)",
        pname.c_str(), static_cast<unsigned long long>(st.onesided_gets),
        static_cast<unsigned long long>(st.rpc_gets),
        static_cast<unsigned long long>(st.onesided_scans),
        static_cast<unsigned long long>(st.rpc_scans),
        static_cast<unsigned long long>(st.reads),
        static_cast<unsigned long long>(st.cache_hits),
        static_cast<unsigned long long>(st.retries),
        static_cast<unsigned long long>(st.fallbacks),
        static_cast<unsigned long long>(st.moves_right),
        static_cast<unsigned long long>(st.leaves_read_ahead),
        static_cast<unsigned long long>(st.leaves_read_ahead_unused));
    notes.push_back(note);
  }
  {
    // The yardstick: the hash store's one-sided get on the same keys.
    auto session = ConnectOrReport(server.address, o.transport, o.secret,
                                   ReadPath::kOneSided);
    if (session == nullptr) return 1;
    auto hash = OpenHashOrReport(session.get());
    if (hash == nullptr) return 1;
    size_t next = 0;
    Row row;
    row.test = "hash_get_onesided";
    row.transport = tname;
    row.size = value_len;
    HashStore::Value into;
    Status err = TimeRow(o, server, &row, [&] {
      return hash->Get(keys[next++ & (keys.size() - 1)], &into);
    });
    if (!err.ok()) {
      std::fprintf(stderr, "remem-bench: hash get: %s\n",
                   err.ToString().c_str());
      return 1;
    }
    rows.push_back(std::move(row));
  }
  {
    // Writes one at a time: a put, and a batch of 16 puts in one request
    // (MultiPut), rewriting existing keys with values of the same size;
    // then every pair deleted.
    auto session =
        ConnectOrReport(server.address, o.transport, o.secret, ReadPath::kRpc);
    if (session == nullptr) return 1;
    auto tree = TreeStore::Open(session.get());
    if (!tree.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n",
                   tree.status().ToString().c_str());
      return 1;
    }
    TreeStore& t = **tree;
    size_t next = 0;
    Row put;
    put.test = "put_rpc";
    put.transport = tname;
    put.size = value_len;
    Status err = TimeRow(o, server, &put, [&]() -> Status {
      return t.Put(keys[next++ & (keys.size() - 1)], value).status();
    });
    Row multi;
    multi.test = "multiput16_rpc";
    multi.transport = tname;
    multi.size = 16;
    std::vector<std::pair<std::string_view, std::string_view>> batch(16);
    if (err.ok()) {
      err = TimeRow(o, server, &multi, [&]() -> Status {
        for (auto& p : batch) p = {keys[next++ & (keys.size() - 1)], value};
        for (auto& r : t.MultiPut(batch)) {
          if (!r.ok()) return r.status();
        }
        return Status::OK();
      });
    }
    if (!err.ok()) {
      std::fprintf(stderr, "remem-bench: puts: %s\n", err.ToString().c_str());
      return 1;
    }
    // The same batches, asynchronously: 16 in flight (256 pairs).
    Row pipelined;
    pipelined.test = "multiput16_async_rpc";
    pipelined.transport = tname;
    pipelined.size = 16;
    if (err.ok()) {
      err = TimeAsyncRow(
          o, server, session.get(), &pipelined, 16, [&](auto done) {
            for (auto& p : batch) {
              p = {keys[next++ & (keys.size() - 1)], value};
            }
            t.MultiPutAsync(batch,
                            [done](auto r) mutable { done(FirstError(r)); });
          });
    }
    if (!err.ok()) {
      std::fprintf(stderr, "remem-bench: puts: %s\n", err.ToString().c_str());
      return 1;
    }
    rows.push_back(std::move(put));
    rows.push_back(std::move(multi));
    rows.push_back(std::move(pipelined));

    // Then deleting every pair, in a random order, 256 in flight: what
    // merges cost, and what they give back.
    auto before = session->Stats();
    std::vector<uint64_t> order(records);
    for (uint64_t i = 0; i < records; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    const auto t0 = std::chrono::steady_clock::now();
    Status first;
    for (uint64_t i = 0; i < records; ++i) {
      (*tree)->DeleteAsync(SortableKeyOf(order[i], key_len),
                           [&first](Status st) {
                             if (!st.ok() && first.ok()) first = st;
                           });
      if ((i & 255) == 255 && !session->WaitAll().ok()) break;
    }
    (void)session->WaitAll();
    if (!first.ok()) {
      std::fprintf(stderr, "remem-bench: delete: %s\n",
                   first.ToString().c_str());
      return 1;
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    auto after = session->Stats();
    if (before.ok() && after.ok()) {
      char note[320];
      std::snprintf(
          note, sizeof(note),
          "delete: %llu pairs in random order in %.2f s (%.0f deletes/s, "
          "256 in flight); tree nodes %llu -> %llu, %llu merges",
          static_cast<unsigned long long>(records), s, double(records) / s,
          static_cast<unsigned long long>(before->Get("tree_nodes")),
          static_cast<unsigned long long>(after->Get("tree_nodes")),
          static_cast<unsigned long long>(after->Get("tree_merges") -
                                          before->Get("tree_merges")));
      notes.push_back(note);
    }
  }
  if (o.json) {
    PrintJson(rows,
              "\"workload\":\"tree\",\"records\":" + std::to_string(records) +
                  ",\"load_order\":\"" +
                  (load_order == TreeLoadOrder::kRandom ? "random" : "sorted") +
                  "\",");
  } else {
    PrintTable(rows);
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
  }
  return 0;
}

}  // namespace remem::bench
