// A client process for txn_test.cc. Modes (IDS: object ids as
// ADDRESS:INCARNATION:CAPACITY, each an account or counter holding an
// int64 in its first 8 bytes and filler after it):
//   transfer ROUNDS SEED IDS...: ROUNDS transactions, each moving a random
//     amount between two random accounts (read both, write both); prints
//     "FIRST" once the first has committed, and "DONE committed=N".
//   audit MS TOTAL IDS...: read-only transactions summing every account,
//     reading the accounts all at once (Transaction::ReadMany, then
//     Validate) and one by one in turn; prints "READY" once the first has
//     committed (start the transfers then), and goes on for MS
//     milliseconds and until audits committed in two states past the
//     first (at most 30 s more). Prints "BAD ..." for a committed or
//     validated audit whose sum is not TOTAL, and "DONE audits=N bad=B
//     racing=R validated=V together=C/T one_by_one=C/T": R audits committed
//     between two transfers (in a state past the first and before the last
//     one seen), V validated, and committed/tried each way.
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
#include <set>
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
    const int64_t total = std::strtoll(argv[5], nullptr, 10);
    const std::vector<remem::ObjectId> ids = ids_from(6);
    // [0]: audits reading every account at once (ReadMany), then checking
    // them (Validate) before the commit; [1]: reading them one by one.
    int tries[2] = {0, 0}, audits[2] = {0, 0}, validated = 0, bad = 0;
    // Each commit raises its objects' versions, so the sum of the versions
    // an audit read names the state it read.
    uint64_t first_state = 0;
    std::set<uint64_t> later_states;  // of committed audits, past the first
    std::vector<uint64_t> committed_states;
    bool ready = false;  // the first audit committed
    std::chrono::steady_clock::time_point until;
    for (int t = 0;; ++t) {
      const auto now = std::chrono::steady_clock::now();
      // Past MS, until audits committed in two states after the first: one
      // of them was between two transfers.
      if (ready && now >= until &&
          (later_states.size() >= 2 ||
           now >= until + std::chrono::seconds(30))) {
        break;
      }
      const int one_by_one = t % 2;
      ++tries[one_by_one];
      auto tx = (*store)->Begin();
      std::vector<std::string> values;
      std::vector<uint64_t> versions;
      if (one_by_one == 0) {
        auto v = tx->ReadMany(ids, &versions);
        if (!v.ok()) return Fail("audit read", v.status());
        values = std::move(*v);
      } else {
        for (const auto& id : ids) {
          uint64_t version = 0;
          auto v = tx->Read(id, &version);
          if (!v.ok()) return Fail("audit read", v.status());
          values.push_back(std::move(*v));
          versions.push_back(version);
        }
      }
      int64_t sum = 0;
      uint64_t state = 0;
      bool ok = true;
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string& v = values[i];
        // Each object alone is a committed state of it.
        ok = ok && v.size() == kObjectBytes && v == Account(Balance(v));
        sum += Balance(v);
        state += versions[i];
      }
      // Reads that Validate calls one state are one, whatever Commit says
      // next.
      if (one_by_one == 0 && tx->Validate().ok()) {
        ++validated;
        if (sum != total || !ok) {
          ++bad;
          std::printf("BAD validated %" PRId64 " ok=%d\n", sum, int(ok));
        }
      }
      remem::Status st = tx->Commit();
      if (st.code() == remem::StatusCode::kConflict) continue;
      if (!st.ok()) return Fail("audit commit", st);
      ++audits[one_by_one];
      if (sum != total || !ok) {
        ++bad;
        std::printf("BAD %" PRId64 " ok=%d\n", sum, int(ok));
      }
      if (!ready) {
        // Before any transfer: the parent starts them on this line.
        ready = true;
        first_state = state;
        until = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(std::atoi(argv[4]));
        std::printf("READY\n");
      } else if (state != first_state) {
        later_states.insert(state);
        committed_states.push_back(state);
      }
    }
    // Committed between two transfers: past the first state and before the
    // last one seen.
    const uint64_t last_state =
        later_states.empty() ? first_state : *later_states.rbegin();
    int racing = 0;
    for (uint64_t s : committed_states) racing += s < last_state;
    std::printf(
        "DONE audits=%d bad=%d racing=%d validated=%d together=%d/%d "
        "one_by_one=%d/%d\n",
        audits[0] + audits[1], bad, racing, validated, audits[0], tries[0],
        audits[1], tries[1]);
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
