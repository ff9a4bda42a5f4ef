// remem-bench hash: the hash store's get path. Loads `records` pairs with
// fixed-size keys and values with multi-puts, then times uniform random gets
// from one client thread on each read path (one-sided, RPC, auto), with the
// server's CPU time per get.

#include <algorithm>
#include <random>

#include "bench_common.h"
#include "bench_fabric.h"
#include "remem/hash.h"
#include "remem/session.h"
#include "util/size.h"

namespace remem::bench {

namespace {

std::string UserKeyOf(uint64_t i, size_t len) {
  std::string k = "user" + std::to_string(i);
  k.resize(len, '.');
  return k;
}

}  // namespace

int RunHash(const FabricOptions& o, uint64_t records, size_t key_len,
            size_t value_len) {
  if (Status st = PinThisThread(o.client_cpu); !st.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
    return 2;
  }
  if (key_len < 8 || key_len > 1024) {
    std::fprintf(stderr, "remem-bench: --key-size must be in [8, 1024]\n");
    return 2;
  }
  // Keys are "user<i>" cut or padded to key_len: the last must fit whole,
  // or keys collide (8-byte keys named 10,000 pairs of the 200,000 the
  // load reported).
  if (UserKeyOf(records - 1, 1024).find('.') > key_len) {
    std::fprintf(stderr,
                 "remem-bench: %zu-byte keys cannot name %llu records; use "
                 "longer keys\n",
                 key_len, static_cast<unsigned long long>(records));
    return 2;
  }
  auto started =
      ServerFor(o.server, o.server_binary, o.transport, o.server_cpu, "1G");
  if (!started.ok()) return 1;
  ServerUnderTest server = std::move(*started);
  const std::string tname(TransportName(o.transport));
  std::vector<Row> rows;
  std::vector<std::string> notes;
  bool loaded = false;
  for (ReadPath path : {ReadPath::kOneSided, ReadPath::kRpc, ReadPath::kAuto}) {
    auto session = ConnectOrReport(server.address, o.transport, o.secret, path);
    if (session == nullptr) return 1;
    auto hash = OpenHashOrReport(session.get());
    if (hash == nullptr) return 1;
    HashStore& c = *hash;
    if (!loaded) {
      const std::string value(value_len, 'v');
      auto t0 = std::chrono::steady_clock::now();
      // Multi-puts of 256 pairs: one message each.
      constexpr uint64_t kBatch = 256;
      std::vector<std::string> keys;
      std::vector<std::pair<std::string_view, std::string_view>> batch;
      // Each multi-put's time: a table that grows stalls the one it is in.
      Histogram batch_ns;
      for (uint64_t i = 0; i < records; i += kBatch) {
        keys.clear();
        batch.clear();
        for (uint64_t j = i; j < std::min(records, i + kBatch); ++j) {
          keys.push_back(UserKeyOf(j, key_len));
        }
        for (const auto& k : keys) batch.emplace_back(k, value);
        const auto sent = std::chrono::steady_clock::now();
        auto results = c.MultiPut(batch);
        batch_ns.Record(
            uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - sent)
                         .count()));
        for (const auto& r : results) {
          if (!r.ok()) {
            std::fprintf(stderr, "remem-bench: load: %s\n",
                         r.status().ToString().c_str());
            return 1;
          }
        }
      }
      double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      if (!o.json) {
        std::printf(
            "load: %llu pairs of %zu B keys and %zu B values in %.2f s (%.0f "
            "puts/s); each multi-put of %llu: p50 %.0f us, p99 %.0f us, max "
            "%.1f ms\n",
            static_cast<unsigned long long>(records), key_len, value_len, s,
            double(records) / s, static_cast<unsigned long long>(kBatch),
            double(batch_ns.Percentile(50)) / 1e3,
            double(batch_ns.Percentile(99)) / 1e3,
            double(batch_ns.max()) / 1e6);
      }
      loaded = true;
    }
    std::mt19937_64 rng(7);
    std::vector<std::string> keys(1 << 16);
    for (auto& k : keys) k = UserKeyOf(rng() % records, key_len);
    size_t next = 0;
    Row row;
    row.test = std::string("get_") + std::string(ReadPathName(path));
    row.transport = tname;
    row.size = value_len;
    auto before = server.CpuSeconds();
    auto start = std::chrono::steady_clock::now();
    auto end = start + std::chrono::duration<double>(o.seconds);
    Status err;
    while (std::chrono::steady_clock::now() < end && err.ok()) {
      for (int i = 0; i < 64; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        auto r = c.Get(keys[next++ & (keys.size() - 1)]);
        row.latency_ns.Record(
            uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count()));
        if (!r.ok()) {
          err = r.status();
          break;
        }
        ++row.ops;
      }
    }
    row.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    auto after = server.CpuSeconds();
    if (before.ok() && after.ok()) row.server_cpu_s = *after - *before;
    if (!err.ok()) {
      std::fprintf(stderr, "remem-bench: get: %s\n", err.ToString().c_str());
      return 1;
    }
    const auto& st = c.read_stats();
    char note[256];
    std::snprintf(
        note, sizeof(note),
        "%-13s one-sided %llu, by RPC %llu, retries %llu, fallbacks %llu, "
        "%.2f one-sided reads per one-sided get",
        row.test.c_str(), static_cast<unsigned long long>(st.onesided_gets),
        static_cast<unsigned long long>(st.rpc_gets),
        static_cast<unsigned long long>(st.retries),
        static_cast<unsigned long long>(st.fallbacks),
        st.onesided_gets ? double(st.reads) / double(st.onesided_gets) : 0.0);
    notes.push_back(note);
    rows.push_back(std::move(row));
  }
  if (o.json) {
    PrintJson(rows, "\"workload\":\"hash\",\"records\":" +
                        std::to_string(records) + ",");
  } else {
    PrintTable(rows);
    for (const auto& n : notes) std::printf("%s\n", n.c_str());
  }
  return 0;
}

}  // namespace remem::bench
