// A client process for txn_test.cc. Modes (IDS: object ids as
// ADDRESS:INCARNATION:CAPACITY, each an account or counter holding an
// int64 in its first 8 bytes and filler after it):
//   transfer ROUNDS SEED IDS...: ROUNDS transactions, each moving a random
//     amount between two random accounts (read both, write both); prints
//     "FIRST" once the first has committed, and "DONE committed=N".
//   audit MS TOTAL IDS...: read-only transactions summing every account for
//     MS milliseconds (and then until one has committed), reading the
//     accounts all at once (Transaction::ReadMany) and one by one in turn;
//     prints "BAD SUM" for a committed audit whose sum is not TOTAL, and
//     "DONE audits=N bad=B together=C/T one_by_one=C/T" (committed and
//     tried, each way).
//   counter OPS ID: OPS times, either adds 1 to the counter in a
//     transaction or reads it alone (ObjectStore::Read), printing for each
//     "H KIND CALL_NS RETURN_NS OLD NEW VERSION" (KIND r: a read of NEW at
//     VERSION; KIND w: OLD replaced by NEW at VERSION) for the parent's
//     linearizability check.
//   hold: reserves an object in a transaction (Alloc), prints READY, and
//     waits to be killed.
// Output is line-buffered, so a parent can wait for a line as it comes.
// Exits 0 when it did what it was asked, 1 on an error, 2 on bad usage.
//
// Usage: txn_child ADDRESS TRANSPORT MODE ARGS...

#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "remem/session.h"
#include "remem/txn.h"
#include "testing/clock.h"

namespace {

constexpr size_t kObjectBytes = 200;  // more than one cache line

int Fail(const char* what, const remem::Status& st) {
  std::fprintf(stderr, "txn_child: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

int64_t Balance(const std::string& data) {
  int64_t v = 0;
  if (data.size() >= 8) std::memcpy(&v, data.data(), 8);
  return v;
}

std::string Account(int64_t v) {
  std::string out(kObjectBytes, '\0');
  std::memcpy(out.data(), &v, 8);
  for (size_t i = 8; i < out.size(); ++i) out[i] = char(uint8_t(v * 7 + i));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  remem::SessionOptions so;
  so.server = argv[1];
  auto transport = remem::ParseTransport(argv[2]);
  if (!transport.ok()) return 2;
  so.transport = *transport;
  so.timeout = std::chrono::seconds(30);
  auto session = remem::Session::Connect(so);
  if (!session.ok()) return Fail("connect", session.status());
  auto store = remem::ObjectStore::Open(session->get());
  if (!store.ok()) return Fail("open", store.status());
  const std::string mode = argv[3];
  auto ids_from = [&](int first) {
    std::vector<remem::ObjectId> ids;
    for (int i = first; i < argc; ++i) {
      auto id = remem::ObjectId::Parse(argv[i]);
      if (!id.ok()) std::exit(2);
      ids.push_back(*id);
    }
    return ids;
  };

  if (mode == "transfer" && argc > 6) {
    const int rounds = std::atoi(argv[4]);
    std::mt19937_64 rng(std::strtoull(argv[5], nullptr, 10));
    const std::vector<remem::ObjectId> ids = ids_from(6);
    int committed = 0;
    for (int r = 0; r < rounds; ++r) {
      const size_t a = rng() % ids.size();
      size_t b = rng() % ids.size();
      if (b == a) b = (b + 1) % ids.size();
      const int64_t amount = int64_t(rng() % 50);
      remem::Status st =
          (*store)->Run([&](remem::Transaction& tx) -> remem::Status {
            auto x = tx.Read(ids[a]);
            if (!x.ok()) return x.status();
            auto y = tx.Read(ids[b]);
            if (!y.ok()) return y.status();
            REMEM_RETURN_IF_ERROR(
                tx.Write(ids[a], Account(Balance(*x) - amount)));
            return tx.Write(ids[b], Account(Balance(*y) + amount));
          });
      if (!st.ok()) return Fail("transfer", st);
      if (++committed == 1) std::printf("FIRST\n");
    }
    std::printf("DONE committed=%d\n", committed);
    return 0;
  }

  if (mode == "audit" && argc > 6) {
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::milliseconds(std::atoi(argv[4]));
    const int64_t total = std::strtoll(argv[5], nullptr, 10);
    const std::vector<remem::ObjectId> ids = ids_from(6);
    // [0]: audits reading every account at once (ReadMany), [1]: one by one.
    int tries[2] = {0, 0}, audits[2] = {0, 0}, bad = 0;
    for (int t = 0;; ++t) {
      const auto now = std::chrono::steady_clock::now();
      // Past MS, until one has committed: a transfer process that started
      // late may still be writing then.
      if (now >= until && (audits[0] + audits[1] > 0 ||
                           now >= until + std::chrono::seconds(30))) {
        break;
      }
      const int many = t % 2;
      ++tries[many];
      auto tx = (*store)->Begin();
      std::vector<std::string> values;
      if (many == 0) {
        auto v = tx->ReadMany(ids);
        if (!v.ok()) return Fail("audit read", v.status());
        values = std::move(*v);
      } else {
        for (const auto& id : ids) {
          auto v = tx->Read(id);
          if (!v.ok()) return Fail("audit read", v.status());
          values.push_back(std::move(*v));
        }
      }
      int64_t sum = 0;
      bool ok = true;
      for (const std::string& v : values) {
        // Each object alone is a committed state of it.
        ok = ok && v.size() == kObjectBytes && v == Account(Balance(v));
        sum += Balance(v);
      }
      remem::Status st = tx->Commit();
      if (st.code() == remem::StatusCode::kConflict) continue;
      if (!st.ok()) return Fail("audit commit", st);
      ++audits[many];
      if (sum != total || !ok) {
        ++bad;
        std::printf("BAD %" PRId64 " ok=%d\n", sum, int(ok));
      }
    }
    std::printf("DONE audits=%d bad=%d together=%d/%d one_by_one=%d/%d\n",
                audits[0] + audits[1], bad, audits[0], tries[0], audits[1],
                tries[1]);
    return 0;
  }

  if (mode == "counter" && argc == 6) {
    const int ops = std::atoi(argv[4]);
    const std::vector<remem::ObjectId> ids = ids_from(5);
    std::mt19937 rng{static_cast<uint32_t>(getpid())};
    for (int i = 0; i < ops; ++i) {
      const uint64_t call = remem::testing::NowNs();
      if (rng() % 3 == 0) {
        auto got = (*store)->Read(ids[0]);
        if (!got.ok()) return Fail("read", got.status());
        const uint64_t ret = remem::testing::NowNs();
        std::printf("H r %" PRIu64 " %" PRIu64 " 0 %" PRId64 " %" PRIu64 "\n",
                    call, ret, Balance(got->data), got->version);
        continue;
      }
      auto tx = (*store)->Begin();
      auto v = tx->Read(ids[0]);
      if (!v.ok()) return Fail("counter read", v.status());
      if (!tx->Write(ids[0], Account(Balance(*v) + 1)).ok()) return 1;
      remem::Status st = tx->Commit();
      if (st.code() == remem::StatusCode::kConflict) {
        --i;  // not an operation: nothing changed
        continue;
      }
      if (!st.ok()) return Fail("counter commit", st);
      const uint64_t ret = remem::testing::NowNs();
      std::printf("H w %" PRIu64 " %" PRIu64 " %" PRId64 " %" PRId64 " %" PRIu64
                  "\n",
                  call, ret, Balance(*v), Balance(*v) + 1,
                  tx->committed_versions().at(ids[0]));
    }
    return 0;
  }

  if (mode == "hold" && argc == 4) {
    auto tx = (*store)->Begin();
    auto id = tx->Alloc("held", 100);
    if (!id.ok()) return Fail("alloc", id.status());
    std::printf("READY %s\n", id->ToString().c_str());
    std::fflush(stdout);
    pause();
    return 0;
  }
  return 2;
}
