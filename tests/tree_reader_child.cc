// A reader process for the ordered store's cross-process race test
// (tree_test.cc, ReaderProcessesScanWhileTheServerSplits): until SIGUSR1 it
// reads the progress key (how many stable keys the writer has inserted:
// s000000 .. s<N-1>, never deleted), then scans the whole tree one-sided,
// alternating ascending and descending, in pages of 23, and gets stable
// keys one-sided. Every value must be well-formed for its key (no torn or
// phantom value), every scan in strict key order, and every stable key
// inserted before the scan began must be in it. Prints
//   READER scans=N gets=N bad=N missed=N disorder=N retries=N fallbacks=N
//          onesided=N read_ahead=N
// (read_ahead: the leaves its scans read ahead, over the network)
// and "READY" once connected. With PAD, every key has PAD after its "s"
// (a long PAD makes them long keys, stored out of line).
//
// Usage: tree_reader_child ADDRESS TRANSPORT [PAD]

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "remem/session.h"
#include "remem/tree.h"
#include "testing/values.h"

namespace {
std::atomic<bool> stop{false};
void OnStop(int) { stop = true; }

std::string pad;

std::string Stable(uint64_t i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%06llu", static_cast<unsigned long long>(i));
  return "s" + pad + buf;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: tree_reader_child ADDRESS TRANSPORT [PAD]\n");
    return 2;
  }
  if (argc == 4) pad = argv[3];
  signal(SIGUSR1, OnStop);
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  o.read_path = remem::ReadPath::kOneSided;
  auto session = remem::Session::Connect(o);
  if (!session.ok()) {
    std::fprintf(stderr, "connect: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto opened = remem::TreeStore::Open(session->get());
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  remem::TreeStore& tree = **opened;
  std::printf("READY\n");
  std::fflush(stdout);
  uint64_t scans = 0, gets = 0, bad = 0, missed = 0, disorder = 0;
  while (!stop) {
    uint64_t stable = 0;
    auto p = tree.Get("progress");
    if (p.ok()) {
      stable = std::strtoull(p->value.c_str(), nullptr, 10);
    } else if (p.status().code() != remem::StatusCode::kNotFound) {
      std::fprintf(stderr, "get: %s\n", p.status().ToString().c_str());
      return 1;
    }
    const bool desc = scans % 2 == 1;
    const auto order = desc ? remem::TreeStore::Order::kDescending
                            : remem::TreeStore::Order::kAscending;
    std::vector<std::string> seen;
    std::string start = "s", end = "t";  // the stable and churned keys
    for (;;) {
      auto page = tree.Scan(start, end, 23, order);
      if (!page.ok()) {
        std::fprintf(stderr, "scan: %s\n", page.status().ToString().c_str());
        return 1;
      }
      for (const auto& it : page->items) {
        if (!remem::testing::WellFormedValue(it.key, it.value)) ++bad;
        if (!seen.empty() &&
            (desc ? !(it.key < seen.back()) : !(seen.back() < it.key))) {
          ++disorder;
        }
        seen.push_back(it.key);
      }
      if (!page->more) break;
      (desc ? end : start) = page->resume;
    }
    if (desc) std::reverse(seen.begin(), seen.end());
    for (uint64_t i = 0; i < stable; ++i) {
      if (!std::binary_search(seen.begin(), seen.end(), Stable(i))) ++missed;
    }
    ++scans;
    for (int g = 0; g < 16 && stable > 0; ++g, ++gets) {
      const std::string k = Stable((gets * 7919) % stable);
      auto v = tree.Get(k);
      if (!v.ok()) {
        ++missed;
        continue;
      }
      if (!remem::testing::WellFormedValue(k, v->value)) ++bad;
    }
    std::this_thread::yield();
  }
  const auto& s = tree.read_stats();
  std::printf(
      "READER scans=%llu gets=%llu bad=%llu missed=%llu disorder=%llu "
      "retries=%llu fallbacks=%llu onesided=%llu read_ahead=%llu\n",
      static_cast<unsigned long long>(scans),
      static_cast<unsigned long long>(gets),
      static_cast<unsigned long long>(bad),
      static_cast<unsigned long long>(missed),
      static_cast<unsigned long long>(disorder),
      static_cast<unsigned long long>(s.retries),
      static_cast<unsigned long long>(s.fallbacks),
      static_cast<unsigned long long>(s.onesided_scans + s.onesided_gets),
      static_cast<unsigned long long>(s.leaves_read_ahead));
  return 0;
}
