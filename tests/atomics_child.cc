// A client process for atomics_test.cc: fetch-adds on a few hot keys through
// one mode (sync: one call at a time; async: a window of ExecuteAsync;
// typed: a window of the typed helpers FetchAddAsync and AddFetchAsync,
// alternating; batch: ExecuteBatch of a few ops over the keys), printing one
// history
// line per acknowledged operation for the parent to check:
//   H KEY CALL_NS RETURN_NS OLD VERSION DELTA
// and then "DONE ops=N failed=M". The deltas vary (1..3) so values never repeat
// in a way that would hide a lost update. "READY" once connected.
//
// Usage: atomics_child ADDRESS TRANSPORT MODE KEYS OPS SEED

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "remem/ops.h"
#include "remem/session.h"
#include "testing/clock.h"

namespace {

struct Pending {
  std::string key;
  int64_t delta;
  uint64_t call_ns;
};

void PrintOld(const Pending& p, uint64_t ret, int64_t old, uint64_t version) {
  std::printf("H %s %llu %llu %lld %llu %lld\n", p.key.c_str(),
              static_cast<unsigned long long>(p.call_ns),
              static_cast<unsigned long long>(ret), static_cast<long long>(old),
              static_cast<unsigned long long>(version),
              static_cast<long long>(p.delta));
}

void Print(const Pending& p, uint64_t ret, const remem::OpReply& r) {
  auto old = r.Int();
  PrintOld(p, ret, old.ok() ? *old : -1, r.version);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: atomics_child ADDRESS TRANSPORT MODE KEYS OPS SEED\n");
    return 2;
  }
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  const std::string mode = argv[3];
  const int keys = std::atoi(argv[4]);
  const int ops = std::atoi(argv[5]);
  std::mt19937_64 rng(std::strtoull(argv[6], nullptr, 10));
  auto session = remem::Session::Connect(o);
  if (!session.ok()) {
    std::fprintf(stderr, "connect: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto store = remem::OpsStore::Open(session->get());
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  remem::OpsStore& s = **store;
  std::printf("READY\n");
  std::fflush(stdout);
  auto next = [&] {
    return Pending{"hot" + std::to_string(rng() % uint64_t(keys)),
                   int64_t(1 + rng() % 3), 0};
  };
  int done = 0, failed = 0;
  if (mode == "sync") {
    for (int i = 0; i < ops; ++i) {
      Pending p = next();
      p.call_ns = remem::testing::NowNs();
      auto r = s.Execute(remem::Op::FetchAdd(p.key, p.delta, true));
      const uint64_t ret = remem::testing::NowNs();
      if (!r.ok()) {
        std::fprintf(stderr, "op: %s\n", r.status().ToString().c_str());
        ++failed;
        continue;
      }
      Print(p, ret, *r);
      ++done;
    }
  } else if (mode == "async" || mode == "typed") {
    // A window of 16 in flight. `finish` records one completion: the old
    // value (AddFetch answers the new one: old = new - delta).
    constexpr int kWindow = 16;
    int issued = 0, in_flight = 0;
    auto finish = [&](const Pending& p, const remem::Status& st, int64_t old,
                      uint64_t version) {
      --in_flight;
      const uint64_t ret = remem::testing::NowNs();
      if (!st.ok()) {
        std::fprintf(stderr, "op: %s\n", st.ToString().c_str());
        ++failed;
        return;
      }
      PrintOld(p, ret, old, version);
      ++done;
    };
    while (done + failed < ops) {
      while (issued < ops && in_flight < kWindow) {
        Pending p = next();
        p.call_ns = remem::testing::NowNs();
        const bool fetch_add = issued % 2 == 0;
        ++issued;
        ++in_flight;
        auto typed = [&, p, fetch_add](remem::Result<remem::IntReply> r) {
          if (!r.ok()) return finish(p, r.status(), 0, 0);
          finish(p, r.status(), fetch_add ? r->value : r->value - p.delta,
                 r->version);
        };
        if (mode == "async") {
          s.ExecuteAsync(remem::Op::FetchAdd(p.key, p.delta, true),
                         [&, p](remem::Result<remem::OpReply> r) {
                           remem::Result<int64_t> old =
                               r.ok() ? r->Int() : r.status();
                           if (!old.ok()) return finish(p, old.status(), 0, 0);
                           finish(p, old.status(), *old, r->version);
                         });
        } else if (fetch_add) {
          s.FetchAddAsync(p.key, p.delta, typed, /*create=*/true);
        } else {
          s.AddFetchAsync(p.key, p.delta, typed, /*create=*/true);
        }
      }
      (void)(*session)->Poll();
    }
  } else {
    constexpr int kBatch = 8;
    for (int i = 0; i < ops; i += kBatch) {
      std::vector<Pending> ps;
      std::vector<remem::Op> batch;
      for (int j = 0; j < kBatch && i + j < ops; ++j) {
        ps.push_back(next());
        batch.push_back(
            remem::Op::FetchAdd(ps.back().key, ps.back().delta, true));
      }
      const uint64_t call = remem::testing::NowNs();
      auto rs = s.ExecuteBatch(batch);
      const uint64_t ret = remem::testing::NowNs();
      for (size_t j = 0; j < rs.size(); ++j) {
        if (!rs[j].ok()) {
          ++failed;
          continue;
        }
        ps[j].call_ns = call;
        Print(ps[j], ret, *rs[j]);
        ++done;
      }
    }
  }
  std::printf("DONE ops=%d failed=%d\n", done, failed);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}
