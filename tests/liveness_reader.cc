// A client process for the liveness test (liveness_test.cc): reads one key
// with one-sided gets in a loop, reconnecting whenever its session fails,
// and prints "FIRST <value>" the first time it returns each value. On
// SIGUSR1 it reports, for each value it returned, the latest CLOCK_MONOTONIC
// time (testing::NowNs) at which a get that returned it STARTED, and when it
// first saw Unavailable. Usage: liveness_reader ADDRESS TRANSPORT KEY

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "remem/hash.h"
#include "remem/session.h"
#include "testing/clock.h"

namespace {

std::atomic<bool> stop{false};
void OnStop(int) { stop = true; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: liveness_reader ADDRESS TRANSPORT KEY\n");
    return 2;
  }
  signal(SIGUSR1, OnStop);
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  o.read_path = remem::ReadPath::kOneSided;
  o.timeout = std::chrono::milliseconds(2000);
  const std::string key = argv[3];
  std::map<std::string, uint64_t> last_start;  // value -> latest get start
  uint64_t first_unavailable = 0, reads = 0, reconnects = 0, errors = 0;
  bool ready = false;
  while (!stop) {
    auto session = remem::Session::Connect(o);
    if (!session.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    auto hash = remem::HashStore::Open(session->get());
    if (!hash.ok()) continue;
    if (!ready) {
      std::printf("READY\n");
      std::fflush(stdout);
      ready = true;
    } else {
      ++reconnects;
    }
    while (!stop) {
      const uint64_t start = remem::testing::NowNs();
      auto g = (*hash)->Get(key);
      ++reads;
      if (g.ok()) {
        auto [it, first] = last_start.emplace(g->value, start);
        if (first) {
          std::printf("FIRST %s\n", g->value.c_str());
          std::fflush(stdout);
        } else if (start > it->second) {
          it->second = start;
        }
        continue;
      }
      if (g.status().code() == remem::StatusCode::kUnavailable) {
        if (first_unavailable == 0) first_unavailable = remem::testing::NowNs();
        break;  // reconnect
      }
      if (g.status().code() != remem::StatusCode::kNotFound) ++errors;
      if (g.status().code() == remem::StatusCode::kTimedOut) break;
    }
  }
  for (const auto& [value, at] : last_start) {
    std::printf("VALUE %s %llu\n", value.c_str(),
                static_cast<unsigned long long>(at));
  }
  std::printf(
      "SUMMARY reads=%llu reconnects=%llu errors=%llu "
      "first_unavailable=%llu\n",
      static_cast<unsigned long long>(reads),
      static_cast<unsigned long long>(reconnects),
      static_cast<unsigned long long>(errors),
      static_cast<unsigned long long>(first_unavailable));
  return 0;
}
