// A reader process for the hash store's cross-process race test
// (hash_test.cc, NoTornOrPhantomValue...): gets a few hot keys one-sided
// until SIGUSR1 and checks every value alone (see SelfDescribingValue),
// then prints one line of counts for the parent test to parse:
//   READER reads=N bad=N backwards=N retries=N fallbacks=N
// It prints "READY" once connected.
//
// Usage: hash_reader_child ADDRESS TRANSPORT KEYS

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "remem/hash.h"
#include "remem/session.h"
#include "testing/values.h"

namespace {
std::atomic<bool> stop{false};
void OnStop(int) { stop = true; }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hash_reader_child ADDRESS TRANSPORT KEYS\n");
    return 2;
  }
  signal(SIGUSR1, OnStop);
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  o.read_path = remem::ReadPath::kOneSided;
  const int keys = std::atoi(argv[3]);
  auto session = remem::Session::Connect(o);
  if (!session.ok()) {
    std::fprintf(stderr, "connect: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto hash = remem::HashStore::Open(session->get());
  if (!hash.ok()) {
    std::fprintf(stderr, "open: %s\n", hash.status().ToString().c_str());
    return 1;
  }
  remem::HashStore& c = **hash;
  std::printf("READY\n");
  std::fflush(stdout);
  std::vector<uint64_t> last(size_t(keys), 0);
  uint64_t reads = 0, bad = 0, backwards = 0;
  for (uint64_t n = 0; !stop; ++n) {
    // Let the writer (and the server) run on a machine with few cores.
    std::this_thread::yield();
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
