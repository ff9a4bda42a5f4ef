// A client process for space_test.cc, on the namespace NS's first segment
// (mapped whole). Modes:
//   hold: maps it, prints READY, and waits to be killed.
//   counter OPS: FetchAdd(0, 1) OPS times, printing for each
//     "H CALL_NS RETURN_NS OLD" (the parent checks the history
//     linearizable).
//   writer INDEX BLOCKS ROUNDS: rewrites blocks INDEX*BLOCKS ..
//     (INDEX+1)*BLOCKS-1, ROUNDS times, each under its version word (odd
//     while written: FetchAdd 1, Write, FetchAdd 1), with
//     (writer, seq, payload(writer, seq)).
//   reader TOTAL_BLOCKS MS: reads random blocks for MS milliseconds (and
//     on until 60 were stable, at most 30 s more); a
//     block whose version was even and the same before and after the read
//     must hold what its writer wrote at that version; prints "BAD ..." for
//     any that does not, then "DONE stable=N bad=N".
//   churn NS2 ROUNDS: allocs, maps, writes, reads back and frees segments
//     of NS2, so the server hands chunks out and back while the others run.
// Exits 0 when it did what it was asked (a reader also when it found BAD
// blocks: the parent looks at its lines), 1 on an error, 2 on bad usage.
//
// Usage: space_child ADDRESS TRANSPORT NS MODE ARGS...

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "remem/session.h"
#include "remem/space.h"
#include "testing/clock.h"

namespace {

// Block layout (space_test.cc uses the same numbers).
constexpr uint64_t kBlock = 1000;  // straddles 4 KiB chunks
constexpr uint64_t kBody = kBlock - 8;

uint8_t PayloadByte(uint64_t writer, uint64_t seq, uint64_t i) {
  return uint8_t(seq * 31 + i * 7 + writer * 13);
}

void Fill(uint64_t writer, uint64_t seq, uint8_t* body) {
  std::memcpy(body, &writer, 8);
  std::memcpy(body + 8, &seq, 8);
  for (uint64_t i = 16; i < kBody; ++i) body[i] = PayloadByte(writer, seq, i);
}

int Fail(const char* what, const remem::Status& st) {
  std::fprintf(stderr, "space_child: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: space_child ADDRESS TRANSPORT NS MODE ARGS...\n");
    return 2;
  }
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  const std::string mode = argv[4];
  auto session = remem::Session::Connect(o);
  if (!session.ok()) return Fail("connect", session.status());
  remem::Session* s = session->get();
  auto ns = remem::Namespace::Open(s, argv[3]);
  if (!ns.ok()) return Fail("open", ns.status());

  if (mode == "churn" && argc == 7) {
    auto other = remem::Namespace::Open(s, argv[5]);
    if (!other.ok()) return Fail("open churn namespace", other.status());
    const int rounds = std::atoi(argv[6]);
    std::mt19937_64 rng(7);
    for (int r = 0; r < rounds; ++r) {
      const uint64_t len = 1 + rng() % (3 * 4096);
      auto seg = (*other)->Alloc(len);
      if (!seg.ok()) return Fail("churn alloc", seg.status());
      auto map = (*other)->Map(*seg);
      if (!map.ok()) return Fail("churn map", map.status());
      std::vector<uint8_t> w(len, uint8_t(r)), back(len, 0xEE);
      // A new segment reads as zeros, whatever its memory held before.
      if (auto st = (*map)->Read(0, back.data(), len); !st.ok()) {
        return Fail("churn read", st);
      }
      for (uint8_t b : back) {
        if (b != 0) {
          std::printf("BAD churn segment not zeroed\n");
          return 1;
        }
      }
      if (auto st = (*map)->Write(0, w.data(), len); !st.ok()) {
        return Fail("churn write", st);
      }
      if (auto st = (*other)->Free(seg->address); !st.ok()) {
        return Fail("churn free", st);
      }
    }
    std::printf("DONE churn=%d\n", rounds);
    return 0;
  }

  auto segs = (*ns)->Segments();
  if (!segs.ok() || segs->empty()) return Fail("segments", segs.status());
  auto map = (*ns)->Map(segs->front());
  if (!map.ok()) return Fail("map", map.status());
  remem::Mapping* m = map->get();

  if (mode == "hold") {
    std::printf("READY\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  if (mode == "counter" && argc == 6) {
    const int ops = std::atoi(argv[5]);
    std::printf("READY\n");
    std::fflush(stdout);
    for (int i = 0; i < ops; ++i) {
      const uint64_t call = remem::testing::NowNs();
      auto old = m->FetchAdd(0, 1);
      const uint64_t ret = remem::testing::NowNs();
      if (!old.ok()) return Fail("fetch-add", old.status());
      std::printf("H %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", call, ret, *old);
    }
    std::printf("DONE\n");
    return 0;
  }
  if (mode == "writer" && argc == 8) {
    const uint64_t index = std::strtoull(argv[5], nullptr, 10);
    const uint64_t blocks = std::strtoull(argv[6], nullptr, 10);
    const int rounds = std::atoi(argv[7]);
    std::printf("READY\n");
    std::fflush(stdout);
    std::vector<uint8_t> body(kBody);
    for (int r = 1; r <= rounds; ++r) {
      for (uint64_t b = index * blocks; b < (index + 1) * blocks; ++b) {
        const uint64_t at = b * kBlock;
        auto v = m->FetchAdd(at, 1);
        if (!v.ok()) return Fail("lock", v.status());
        Fill(index + 1, uint64_t(r), body.data());
        if (auto st = m->Write(at + 8, body.data(), kBody); !st.ok()) {
          return Fail("write", st);
        }
        if (auto u = m->FetchAdd(at, 1); !u.ok()) {
          return Fail("unlock", u.status());
        }
      }
    }
    std::printf("DONE\n");
    return 0;
  }
  if (mode == "reader" && argc == 7) {
    const uint64_t total = std::strtoull(argv[5], nullptr, 10);
    const uint64_t ms = std::strtoull(argv[6], nullptr, 10);
    const uint64_t blocks_per_writer = total / 2;  // space_test: 2 writers
    std::printf("READY\n");
    std::fflush(stdout);
    std::mt19937_64 rng(getpid());
    std::vector<uint8_t> body(kBody), want(kBody);
    uint64_t stable = 0, bad = 0;
    const uint64_t end = remem::testing::NowNs() + ms * 1'000'000;
    // Past MS, until 60 stable reads (a loaded machine may have held the
    // reader up), at most 30 s more.
    while (remem::testing::NowNs() < end ||
           (stable < 60 && remem::testing::NowNs() < end + 30'000'000'000)) {
      const uint64_t b = rng() % total;
      const uint64_t at = b * kBlock;
      auto v1 = m->FetchAdd(at, 0);
      if (!v1.ok()) return Fail("version", v1.status());
      if (*v1 % 2 != 0) continue;
      if (auto st = m->Read(at + 8, body.data(), kBody); !st.ok()) {
        return Fail("read", st);
      }
      auto v2 = m->FetchAdd(at, 0);
      if (!v2.ok()) return Fail("version", v2.status());
      if (*v1 != *v2) continue;
      ++stable;
      const uint64_t seq = *v1 / 2;
      if (seq == 0) {
        for (uint8_t c : body) bad += c != 0;
        if (bad != 0) std::printf("BAD block %" PRIu64 " not zero\n", b);
        continue;
      }
      Fill(b / blocks_per_writer + 1, seq, want.data());
      if (body != want) {
        ++bad;
        uint64_t w = 0, q = 0;
        std::memcpy(&w, body.data(), 8);
        std::memcpy(&q, body.data() + 8, 8);
        std::printf("BAD block %" PRIu64 " version %" PRIu64
                    " holds writer %" PRIu64 " seq %" PRIu64 "\n",
                    b, *v1, w, q);
      }
    }
    std::printf("DONE stable=%" PRIu64 " bad=%" PRIu64 "\n", stable, bad);
    return 0;
  }
  std::fprintf(stderr, "space_child: bad mode or arguments\n");
  return 2;
}
