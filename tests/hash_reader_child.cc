// A reader process for the hash store's cross-process race test
// (hash_test.cc, NoTornOrPhantomValue...): gets a few hot keys one-sided
// for a while and checks every value alone (see SelfDescribingValue), then
// prints one line of counts for the parent test to parse:
//   READER reads=N bad=N backwards=N retries=N fallbacks=N
//
// Usage: hash_reader_child ADDRESS TRANSPORT SECONDS KEYS

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hash_values.h"
#include "remem/client.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: hash_reader_child ADDRESS TRANSPORT SECONDS KEYS\n");
    return 2;
  }
  remem::ClientOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  o.read_path = remem::ReadPath::kOneSided;
  const double seconds = std::atof(argv[3]);
  const int keys = std::atoi(argv[4]);
  auto client = remem::Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  remem::Client& c = **client;
  std::vector<uint64_t> last(size_t(keys), 0);
  uint64_t reads = 0, bad = 0, backwards = 0;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (uint64_t n = 0; std::chrono::steady_clock::now() < end; ++n) {
    for (int i = 0; i < 64; ++i, ++n) {
      const int k = int(n % uint64_t(keys));
      const std::string key = "hot" + std::to_string(k);
      auto g = c.Get(key);
      ++reads;
      if (!g.ok()) {
        if (g.status().code() == remem::StatusCode::kNotFound) continue;
        std::fprintf(stderr, "get: %s\n", g.status().ToString().c_str());
        return 1;
      }
      if (!remem::testing::WellFormedValue(key, g->value)) ++bad;
      if (g->version < last[size_t(k)]) ++backwards;
      last[size_t(k)] = g->version;
    }
  }
  const auto& s = c.read_stats();
  std::printf(
      "READER reads=%llu bad=%llu backwards=%llu retries=%llu "
      "fallbacks=%llu\n",
      static_cast<unsigned long long>(reads),
      static_cast<unsigned long long>(bad),
      static_cast<unsigned long long>(backwards),
      static_cast<unsigned long long>(s.retries),
      static_cast<unsigned long long>(s.fallbacks));
  return 0;
}
