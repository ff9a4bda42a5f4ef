// testing::RunRace: the race-and-check workload, written once over
// testing::KvStore (kv_store.h).
//
// Writers rewrite a few hot keys back to back — put, put-if-absent,
// compare-and-put (with the version they last saw, or a stale one) and
// delete — with self-describing values (values.h) whose sizes switch
// between small (inline in a bucket) and large (an extent), and between
// those writes insert fresh keys (the table grows under the readers) and
// churn filler keys (inserts move entries between buckets). Readers get
// the hot keys one-sided as fast as they can. Every operation on a hot key
// is recorded with its call and return times. Then:
//   - every value read must be well formed for its key (no torn or
//     phantom value),
//   - no reader may see a key's version go down,
//   - each key's history must be linearizable (linearizability.h: no stale
//     or lost value, no write acknowledged wrongly),
//   - no operation may fail other than as the store's contract allows.
// RaceReport::Verdict says which of those failed.
//
// Thread contract: RunRace starts its own threads (one client each) and
// returns after joining them; call it from any one thread.

#ifndef REMEM_TESTING_RACE_H_
#define REMEM_TESTING_RACE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remem/status.h"
#include "testing/kv_store.h"

namespace remem::testing {

struct RaceOptions {
  int keys = 3;     // hot keys: "hot0" ..
  int writers = 1;  // writer threads
  int readers = 2;  // reader threads
  // The writers run at least `min_duration` and `min_writes` each (a slow
  // machine or a sanitizer still covers growth), at most `max_writes` each
  // (unless min_reads, below, holds them) or `max_duration`. Histories stay
  // checkable in seconds. Under REMEM_TEST_SCALE (the sanitizers) min_writes
  // and max_reads_per_reader are divided by it (testing::Scaled), never below
  // 50 and 2000.
  std::chrono::milliseconds min_duration{1500};
  uint64_t min_writes = 500;
  uint64_t max_writes = 20000;
  std::chrono::milliseconds max_duration{60000};
  // The writers also go on, past max_writes too, until the readers have
  // made `min_reads` reads in all (within max_duration): a loaded machine
  // that starves the readers still races them against writes.
  uint64_t min_reads = 0;
  // If set, the writers also go on while it returns true (e.g. until
  // something the test does meanwhile is over), within max_duration.
  // Called from the writer threads.
  std::function<bool()> keep_going;
  uint64_t max_reads_per_reader = 40000;
  // A fresh key after every `grow_every`-th hot write (0: none).
  int grow_every = 1;
  // Filler keys: `prefill` inserted first, then one of `churn_keys` put or
  // deleted after every hot write (0: none), so inserts move entries.
  int prefill = 0;
  int churn_keys = 0;
  // Sizes of hot values: one in `large_one_in` is large_min..large_max
  // bytes (an extent), the rest at most small_max (inline).
  int large_one_in = 3;
  size_t small_max = 48;
  size_t large_min = 500;
  size_t large_max = 6500;
  uint64_t seed = 17;
  // Readers get `read_batch` keys at a time with KvClient::GetBatch (1:
  // single gets). Each get of a batch is recorded as running from before
  // the batch was issued until all of it completed.
  int read_batch = 1;
  KvClient::BatchKind batch_kind = KvClient::BatchKind::kAsync;
};

struct RaceReport {
  uint64_t writes = 0;         // hot-key writes acknowledged
  uint64_t reads = 0;          // reads of hot keys
  uint64_t found = 0;          // ... that found the key
  uint64_t size_switches = 0;  // writes that moved a key small <-> large
  uint64_t malformed = 0;      // torn or phantom values read
  uint64_t backwards = 0;      // reads older than one the reader had seen
  uint64_t errors = 0;         // operations that failed unexpectedly
  std::string first_error;
  std::string first_malformed;
  KvReadCounters readers;  // the reader clients' counters, summed
  // Keys whose history is not linearizable, with the checker's
  // explanation.
  std::vector<std::string> not_linearizable;
  uint64_t states_explored = 0;  // by the checker, all keys

  // OK if every check passed; else Internal, naming each failure.
  Status Verdict() const;
  // One line: counts, retries, fallbacks.
  std::string Summary() const;
};

// Runs the race on `store` and checks it. Errors only if the workload
// could not run (a client could not be created); what the race found is in
// the report.
Result<RaceReport> RunRace(KvStore* store, const RaceOptions& options);

// The writes each writer makes at least (unless max_duration ends the
// race first): `options.min_writes` divided by REMEM_TEST_SCALE, never
// below 50 (or min_writes, if lower).
uint64_t MinWritesPerWriter(const RaceOptions& options);

}  // namespace remem::testing

#endif  // REMEM_TESTING_RACE_H_
