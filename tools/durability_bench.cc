// remem-durability-bench: write throughput against a running remem-server,
// to compare fsync policies (docs/BENCHMARKS.md, "Durability"). Loads
// `--records` pairs with multi-puts, then runs a YCSB-A-like mix (uniform
// keys, --write-fraction updates, the rest gets) with --depth operations
// in flight. Stands in until `remem-bench ycsb` exists.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "remem/client.h"

namespace {

std::string KeyOf(uint64_t i, size_t len) {
  std::string k = "k" + std::to_string(i);
  k.resize(len, '.');
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace remem;
  CLI::App app{"remem-durability-bench: load and mixed-write throughput"};
  std::string server = "127.0.0.1:7400";
  std::string transport = "auto";
  uint64_t records = 100000, ops = 200000;
  size_t key_size = 16, value_size = 32;
  int depth = 16;
  double write_fraction = 0.5;
  app.add_option("--server", server, "host:port")->capture_default_str();
  app.add_option("--transport", transport, "auto | shm | tcp");
  app.add_option("--records", records, "pairs to load")->capture_default_str();
  app.add_option("--ops", ops, "operations in the mix")->capture_default_str();
  app.add_option("--key-size", key_size)->capture_default_str();
  app.add_option("--value-size", value_size)->capture_default_str();
  app.add_option("--depth", depth, "operations in flight")
      ->capture_default_str();
  app.add_option("--write-fraction", write_fraction, "0.5 = YCSB-A")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto t = ParseTransport(transport);
  if (!t.ok()) return 2;
  ClientOptions co;
  co.server = server;
  co.transport = *t;
  co.timeout = std::chrono::seconds(60);
  auto client = Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  Client& c = **client;
  const std::string value(value_size, 'v');
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::vector<std::string> keys;
  std::vector<std::pair<std::string_view, std::string_view>> batch;
  for (uint64_t i = 0; i < records; i += 256) {
    keys.clear();
    batch.clear();
    for (uint64_t j = i; j < std::min(records, i + 256); ++j) {
      keys.push_back(KeyOf(j, key_size));
    }
    for (const auto& k : keys) batch.emplace_back(k, value);
    for (const auto& r : c.MultiPut(batch)) {
      if (!r.ok()) {
        std::fprintf(stderr, "load: %s\n", r.status().ToString().c_str());
        return 1;
      }
    }
  }
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "load: %llu pairs (%zu B keys, %zu B values) in %.2f s: %.0f "
      "puts/s\n",
      (unsigned long long)records, key_size, value_size, s,
      double(records) / s);
  std::mt19937_64 rng(7);
  uint64_t issued = 0, done = 0, errors = 0;
  int in_flight = 0;
  t0 = Clock::now();
  std::uniform_real_distribution<double> coin(0, 1);
  while (done < ops) {
    while (in_flight < depth && issued < ops) {
      const std::string k = KeyOf(rng() % records, key_size);
      ++in_flight;
      ++issued;
      if (coin(rng) < write_fraction) {
        c.PutAsync(k, value, [&](Result<uint64_t> r) {
          --in_flight;
          ++done;
          if (!r.ok()) ++errors;
        });
      } else {
        c.GetAsync(k, [&](Result<Client::Value> r) {
          --in_flight;
          ++done;
          if (!r.ok()) ++errors;
        });
      }
    }
    c.Poll();
  }
  s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "mix: %llu ops (%.0f%% writes, depth %d) in %.2f s: %.0f ops/s, "
      "%llu errors\n",
      (unsigned long long)ops, write_fraction * 100, depth, s, double(ops) / s,
      (unsigned long long)errors);
  return errors == 0 ? 0 : 1;
}
