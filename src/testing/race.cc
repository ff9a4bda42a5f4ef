#include "testing/race.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <latch>
#include <random>
#include <thread>

#include "testing/clock.h"
#include "testing/linearizability.h"
#include "testing/scale.h"
#include "testing/values.h"

namespace remem::testing {

namespace {

using Clock = std::chrono::steady_clock;

std::string HotKey(int k) { return "hot" + std::to_string(k); }

// What one thread saw.
struct ThreadResult {
  Status setup;                        // its client could not be created
  std::vector<std::vector<KvOp>> ops;  // per hot key
  uint64_t writes = 0, size_switches = 0;
  uint64_t reads = 0, found = 0, malformed = 0, backwards = 0;
  uint64_t errors = 0;
  std::string first_error;
  std::string first_malformed;
  KvReadCounters counters;

  void Error(const std::string& what) {
    if (errors++ == 0) first_error = what;
  }
};

// A printable prefix of a value (values can be kilobytes).
std::string Clip(const std::string& v) {
  return v.size() <= 60
             ? v
             : v.substr(0, 60) + "...(" + std::to_string(v.size()) + " bytes)";
}

void Writer(KvStore* store, const RaceOptions& o, int w, std::latch* ready,
            std::atomic<int>* writers_left,
            const std::atomic<uint64_t>* reads_done, ThreadResult* out) {
  auto client = store->NewClient(KvStore::Role::kWriter);
  ready->arrive_and_wait();
  if (!client.ok()) {
    out->setup = client.status();
    writers_left->fetch_sub(1);
    return;
  }
  KvClient& c = **client;
  std::mt19937_64 rng(o.seed + 1000 * uint64_t(w));
  auto expect_ok = [&](const Status& st, const std::string& what) {
    if (!st.ok()) out->Error(what + ": " + st.ToString());
  };
  if (w == 0) {
    for (int f = 0; f < o.prefill; ++f) {
      expect_ok(c.Put("filler" + std::to_string(f), "x").status(), "prefill");
    }
  }
  std::vector<uint64_t> last_version(size_t(o.keys), 0);
  std::vector<int> last_large(size_t(o.keys), -1);  // -1: absent
  uint64_t filler = uint64_t(w);
  // Volume, not coverage (testing::Scaled): the sanitizers' runs look for
  // races with fewer writes.
  const uint64_t min_writes = MinWritesPerWriter(o);
  const auto start = Clock::now();
  for (uint64_t i = 0;; ++i) {
    const auto now = Clock::now();
    const bool read_enough = reads_done->load() >= o.min_reads;
    if (now - start >= o.max_duration || (i >= o.max_writes && read_enough) ||
        (now - start >= o.min_duration && i >= min_writes && read_enough &&
         !(o.keep_going && o.keep_going()))) {
      break;
    }
    const int k = int(rng() % uint64_t(o.keys));
    const std::string key = HotKey(k);
    const bool large =
        o.large_one_in > 0 && rng() % uint64_t(o.large_one_in) == 0;
    const size_t len =
        large ? o.large_min + rng() % (o.large_max - o.large_min + 1)
              : rng() % (o.small_max + 1);
    // Unique per key across writers, so the checker tells writes apart.
    const uint64_t seq = i * uint64_t(o.writers) + uint64_t(w) + 1;
    KvOp op;
    op.client = -1 - w;
    op.value = SelfDescribingValue(key, seq, len);
    bool unknown = false;
    Status failure;
    op.call_ns = NowNs();
    switch (rng() % 6) {
      case 0: {
        op.kind = KvOp::kDelete;
        op.delete_reports = true;
        const Status st = c.Delete(key);
        op.succeeded = st.ok();
        if (!st.ok() && st.code() != StatusCode::kNotFound) {
          unknown = true;
          failure = st;
        }
        break;
      }
      case 1: {
        op.kind = KvOp::kCompareAndPut;
        op.expected_version = last_version[size_t(k)];
        // Now and then a version that is surely stale.
        if (rng() % 4 == 0 && op.expected_version > 0) --op.expected_version;
        auto v = c.CompareAndPut(key, op.value, op.expected_version);
        op.succeeded = v.ok();
        if (v.ok()) {
          op.version = *v;
        } else if (v.status().code() != StatusCode::kConflict &&
                   v.status().code() != StatusCode::kNotFound) {
          unknown = true;
          failure = v.status();
        }
        break;
      }
      case 2: {
        op.kind = KvOp::kPutIfAbsent;
        auto v = c.PutIfAbsent(key, op.value);
        op.succeeded = v.ok();
        if (v.ok()) {
          op.version = *v;
        } else if (v.status().code() != StatusCode::kAlreadyExists) {
          unknown = true;
          failure = v.status();
        }
        break;
      }
      default: {
        op.kind = KvOp::kPut;
        auto v = c.Put(key, op.value);
        if (v.ok()) {
          op.version = *v;
        } else {
          unknown = true;
          failure = v.status();
        }
      }
    }
    op.return_ns = NowNs();
    if (unknown) {
      op.returned = false;
      op.version.reset();
      out->Error(key + ": " + failure.ToString());
    } else if (op.kind == KvOp::kDelete) {
      if (op.succeeded) last_large[size_t(k)] = -1;
    } else if (op.kind == KvOp::kPut || op.succeeded) {
      ++out->writes;
      if (last_large[size_t(k)] >= 0 && last_large[size_t(k)] != int(large)) {
        ++out->size_switches;
      }
      last_large[size_t(k)] = int(large);
      last_version[size_t(k)] = *op.version;
    }
    out->ops[size_t(k)].push_back(std::move(op));
    if (o.grow_every > 0 && i % uint64_t(o.grow_every) == 0) {
      expect_ok(
          c.Put("grow-" + std::to_string(w) + "-" + std::to_string(i), "g")
              .status(),
          "fresh key");
    }
    if (o.churn_keys > 0) {
      const std::string f =
          "filler" + std::to_string(filler++ % uint64_t(o.churn_keys));
      if (rng() % 2) {
        expect_ok(c.Put(f, "x").status(), "filler put");
      } else {
        const Status st = c.Delete(f);
        if (st.code() != StatusCode::kNotFound) expect_ok(st, "filler delete");
      }
    }
  }
  writers_left->fetch_sub(1);
}

void Reader(KvStore* store, const RaceOptions& o, int r, std::latch* ready,
            const std::atomic<int>* writers_left,
            std::atomic<uint64_t>* reads_done, ThreadResult* out) {
  auto client = store->NewClient(KvStore::Role::kReader);
  ready->arrive_and_wait();
  if (!client.ok()) {
    out->setup = client.status();
    return;
  }
  KvClient& c = **client;
  std::mt19937_64 rng(o.seed + 100 + uint64_t(r));
  std::vector<uint64_t> last_version(size_t(o.keys), 0);
  // Past max_reads_per_reader reads are still checked alone (well formed,
  // not going back), only no longer recorded for the history. Volume, not
  // coverage (testing::Scaled): the sanitizers' runs check fewer.
  const uint64_t max_recorded =
      uint64_t(Scaled(int(o.max_reads_per_reader),
                      int(std::min<uint64_t>(o.max_reads_per_reader, 2000))));
  uint64_t recorded = 0;
  const size_t batch = size_t(std::max(o.read_batch, 1));
  std::vector<int> ks(batch);
  std::vector<std::string> keys(batch);
  std::vector<std::string_view> views(batch);
  while (writers_left->load() > 0) {
    for (size_t i = 0; i < batch; ++i) {
      ks[i] = int(rng() % uint64_t(o.keys));
      keys[i] = HotKey(ks[i]);
      views[i] = keys[i];
    }
    std::vector<uint64_t> seen = last_version;
    const uint64_t call_ns = NowNs();
    std::vector<Result<KvValue>> got;
    if (batch == 1) {
      got.push_back(c.Get(views[0]));
    } else {
      got = c.GetBatch(views, o.batch_kind);
    }
    const uint64_t return_ns = NowNs();
    for (size_t i = 0; i < batch; ++i) {
      const int k = ks[i];
      const std::string& key = keys[i];
      KvOp op;
      op.kind = KvOp::kGet;
      op.client = r;
      op.call_ns = call_ns;
      op.return_ns = return_ns;
      ++out->reads;
      reads_done->fetch_add(1, std::memory_order_relaxed);
      Result<KvValue>& g = got[i];
      if (g.ok()) {
        ++out->found;
        op.found = true;
        op.version = g->version;
        if (!WellFormedValue(key, g->value)) {
          if (out->malformed++ == 0) {
            out->first_malformed = key + ": '" + Clip(g->value) + "'";
          }
        }
        // Against what the reader saw before this batch: the gets of one
        // batch are concurrent with each other.
        if (g->version < last_version[size_t(k)]) ++out->backwards;
        seen[size_t(k)] = std::max(seen[size_t(k)], g->version);
        op.read_value = std::move(g->value);
      } else if (g.status().code() != StatusCode::kNotFound) {
        op.returned = false;  // constrains nothing
        out->Error(key + ": get: " + g.status().ToString());
      }
      if (recorded < max_recorded) {
        ++recorded;
        out->ops[size_t(k)].push_back(std::move(op));
      }
    }
    last_version = seen;
    // Once its history is full a reader gives way at every read: readers
    // that never yield starve the writers (and the server) of a small
    // machine's CPUs.
    if (recorded >= max_recorded) std::this_thread::yield();
  }
  out->counters = c.read_counters();
}

}  // namespace

Status RaceReport::Verdict() const {
  std::string failed;
  auto add = [&](const std::string& what) {
    failed += (failed.empty() ? "" : "; ") + what;
  };
  if (writes == 0) add("no write was acknowledged");
  if (reads == 0) add("no read ran");
  if (errors > 0) {
    add(std::to_string(errors) + " operations failed (first: " + first_error +
        ")");
  }
  if (malformed > 0) {
    add(std::to_string(malformed) +
        " torn or phantom values (first: " + first_malformed + ")");
  }
  if (backwards > 0) {
    add(std::to_string(backwards) + " reads went back in time");
  }
  for (const std::string& k : not_linearizable) add("not linearizable: " + k);
  if (failed.empty()) return Status::OK();
  return Status::Internal(failed);
}

std::string RaceReport::Summary() const {
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "%llu writes (%llu small<->large), %llu reads (%llu found): %llu "
      "verification retries (%.3f%%), %llu fallbacks; %llu torn or phantom, "
      "%llu backwards, %zu keys not linearizable (%llu states explored)",
      static_cast<unsigned long long>(writes),
      static_cast<unsigned long long>(size_switches),
      static_cast<unsigned long long>(reads),
      static_cast<unsigned long long>(found),
      static_cast<unsigned long long>(readers.retries),
      100.0 * double(readers.retries) / double(std::max<uint64_t>(reads, 1)),
      static_cast<unsigned long long>(readers.fallbacks),
      static_cast<unsigned long long>(malformed),
      static_cast<unsigned long long>(backwards), not_linearizable.size(),
      static_cast<unsigned long long>(states_explored));
  return buf;
}

uint64_t MinWritesPerWriter(const RaceOptions& o) {
  return uint64_t(
      Scaled(int(o.min_writes), int(std::min<uint64_t>(o.min_writes, 50))));
}

Result<RaceReport> RunRace(KvStore* store, const RaceOptions& o) {
  if (o.keys < 1 || o.writers < 1 || o.readers < 0 ||
      o.large_max < o.large_min) {
    return Status::InvalidArgument("race: bad options");
  }
  const int threads = o.writers + o.readers;
  std::vector<ThreadResult> results(static_cast<size_t>(threads));
  for (ThreadResult& r : results) r.ops.resize(size_t(o.keys));
  std::latch ready(threads);
  std::atomic<int> writers_left{o.writers};
  std::atomic<uint64_t> reads_done{0};
  std::vector<std::thread> running;
  for (int w = 0; w < o.writers; ++w) {
    running.emplace_back(Writer, store, std::cref(o), w, &ready, &writers_left,
                         &reads_done, &results[size_t(w)]);
  }
  for (int r = 0; r < o.readers; ++r) {
    running.emplace_back(Reader, store, std::cref(o), r, &ready, &writers_left,
                         &reads_done, &results[size_t(o.writers + r)]);
  }
  for (std::thread& t : running) t.join();

  RaceReport report;
  std::vector<std::vector<KvOp>> history(size_t(o.keys));
  for (ThreadResult& r : results) {
    if (!r.setup.ok()) return r.setup.WithContext("race: a client");
    report.writes += r.writes;
    report.size_switches += r.size_switches;
    report.reads += r.reads;
    report.found += r.found;
    report.malformed += r.malformed;
    report.backwards += r.backwards;
    if (report.first_error.empty()) report.first_error = r.first_error;
    if (report.first_malformed.empty()) {
      report.first_malformed = r.first_malformed;
    }
    report.errors += r.errors;
    report.readers.reads += r.counters.reads;
    report.readers.retries += r.counters.retries;
    report.readers.fallbacks += r.counters.fallbacks;
    for (int k = 0; k < o.keys; ++k) {
      auto& ops = r.ops[size_t(k)];
      history[size_t(k)].insert(history[size_t(k)].end(),
                                std::make_move_iterator(ops.begin()),
                                std::make_move_iterator(ops.end()));
    }
  }
  for (int k = 0; k < o.keys; ++k) {
    const CheckResult c = CheckKeyHistory(history[size_t(k)]);
    report.states_explored += c.states_explored;
    if (!c.linearizable) {
      report.not_linearizable.push_back(HotKey(k) + ": " + c.explanation);
    }
  }
  return report;
}

}  // namespace remem::testing
