// remem-hash-schemes: measures, in one process and deterministically, what
// a one-sided reader pays per lookup in four hash table schemes (remem's
// 2-choice bucketized cuckoo, Pilaf's 3-way cuckoo, FaRM's chained
// associative hopscotch, KV-Direct's chained buckets), for inline and
// out-of-line 16 B / 32 B pairs. docs/HASH_SCHEMES.md has the results.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "bench_schemes.h"
#include "remem/version.h"

using namespace remem::schemes;

int main(int argc, char** argv) {
  CLI::App app{"Simulates hash table schemes as a one-sided reader sees them"};
  app.set_version_flag("--version",
                       std::string("remem-hash-schemes ") + remem::kVersion);
  uint64_t slots = 1 << 20;
  std::vector<uint32_t> bucket_bytes = {128, 256, 512};
  uint64_t seed = 1;
  uint64_t samples = 100000;
  bool json = false;
  RunOptions o;
  app.add_option("--slots", slots, "slots per table (rounded per geometry)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{64}, uint64_t{1} << 28));
  app.add_option("--bucket-bytes", bucket_bytes, "bucket sizes to evaluate")
      ->capture_default_str()
      ->check(CLI::Range(32u, 1u << 16));
  app.add_option("--seed", seed, "keys and hash seed")->capture_default_str();
  app.add_option("--samples", samples, "hits and misses looked up per point")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  app.add_option("--occupancy", o.occupancies,
                 "occupancies to measure at (fractions of primary slots)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) {
            // CLI11's range lets "nan" through.
            return std::isnan(std::strtod(text.c_str(), nullptr))
                       ? "'" + text + "' is not a number"
                       : std::string();
          },
          "", "NUMBER"))
      ->check(CLI::Range(0.01, 1.0));
  app.add_flag("--json", json, "print JSON instead of Markdown tables");
  CLI11_PARSE(app, argc, argv);

  std::vector<SchemeConfig> configs;
  for (PairKind pk : {PairKind::kInline, PairKind::kOutOfLine}) {
    SchemeConfig base;
    base.pairs = pk;
    base.target_slots = slots;
    base.seed = seed;
    for (SchemeKind sk : {SchemeKind::kCuckoo2, SchemeKind::kCuckoo3,
                          SchemeKind::kHopscotch, SchemeKind::kChained}) {
      base.scheme = sk;
      if (sk == SchemeKind::kCuckoo3) {  // one entry per bucket: no B
        configs.push_back(base);
        continue;
      }
      for (uint32_t b : bucket_bytes) {
        SchemeConfig c = base;
        c.bucket_bytes = b;
        configs.push_back(c);
      }
      if (sk == SchemeKind::kHopscotch) {
        // FaRM's own geometry: H = 8 slots, 4 per bucket.
        SchemeConfig c = base;
        c.slots_per_bucket = 4;
        configs.push_back(c);
      }
    }
  }
  o.samples = samples;
  std::vector<RunResult> runs;
  const auto t0 = std::chrono::steady_clock::now();
  for (const SchemeConfig& c : configs) {
    const auto t = std::chrono::steady_clock::now();
    runs.push_back(Simulate(c, o));
    std::fprintf(
        stderr, "%-24s %-11s B=%-4u %.2fs\n", SchemeName(c.scheme),
        PairName(c.pairs), runs.back().geometry.bucket_bytes,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
            .count());
  }
  std::fprintf(
      stderr, "total %.1fs\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count());
  const std::string out = json ? ToJson(runs) : ToMarkdown(runs);
  std::fwrite(out.data(), 1, out.size(), stdout);
  int bad = 0;
  for (const RunResult& r : runs) {
    for (const Point& p : r.points) {
      bad += p.hits_missing > 0 || p.misses_found > 0;
    }
  }
  if (bad) std::fprintf(stderr, "remem-hash-schemes: lookups went wrong\n");
  return bad ? 1 : 0;
}
