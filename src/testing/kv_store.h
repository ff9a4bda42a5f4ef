// testing::KvStore: the small key-value interface the race workload
// (testing/race.h) runs against, so one workload exercises a data model
// in-process (its server-side structure and its one-sided reader in one
// address space: testing/local_table.h) and over the network (a real
// remem-server and sessions: testing/hash_store_kv.h), as masstree runs its
// workloads both ways.
//
// A store hands out clients; each client is used by the one thread that
// asked for it. Writers change the store the way the server does; readers
// read it the way clients do without the server (one-sided), so a race
// between them is the race the data model must survive.
//
// Thread contract: KvStore::NewClient and Counters may be called from any
// thread concurrently; a KvClient belongs to the thread that created it.

#ifndef REMEM_TESTING_KV_STORE_H_
#define REMEM_TESTING_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::testing {

struct KvValue {
  std::string value;
  uint64_t version = 0;
};

// What a client's reads cost (for reports).
struct KvReadCounters {
  uint64_t reads = 0;      // gets answered
  uint64_t retries = 0;    // attempts that failed verification
  uint64_t fallbacks = 0;  // gets that gave up reading and asked the server
};

class KvClient {
 public:
  virtual ~KvClient() = default;
  // NotFound if absent.
  virtual Result<KvValue> Get(std::string_view key) = 0;
  // The new version.
  virtual Result<uint64_t> Put(std::string_view key,
                               std::string_view value) = 0;
  // AlreadyExists if present.
  virtual Result<uint64_t> PutIfAbsent(std::string_view key,
                                       std::string_view value) = 0;
  // Conflict if the version is not `expected`, NotFound if absent.
  virtual Result<uint64_t> CompareAndPut(std::string_view key,
                                         std::string_view value,
                                         uint64_t expected) = 0;
  // NotFound if absent.
  virtual Status Delete(std::string_view key) = 0;
  // How GetBatch reads: one Get after another, asynchronous gets all in
  // flight together, one multi-get, or two asynchronous multi-gets in
  // flight together.
  enum class BatchKind { kSequential, kAsync, kMulti, kMultiAsync };
  // One result per key, in order. By default, Get in turn.
  virtual std::vector<Result<KvValue>> GetBatch(
      const std::vector<std::string_view>& keys, BatchKind kind) {
    (void)kind;
    std::vector<Result<KvValue>> out;
    for (std::string_view k : keys) out.push_back(Get(k));
    return out;
  }
  virtual KvReadCounters read_counters() const = 0;
};

// What the store did underneath (for coverage checks); -1: not known.
struct KvStoreCounters {
  int64_t growths = -1;  // times the table grew
  int64_t moves = -1;    // entries moved between buckets (cuckoo)
};

class KvStore {
 public:
  enum class Role {
    kWriter,  // writes as the server does (or through it)
    kReader,  // reads one-sided, verifying what it reads
  };
  virtual ~KvStore() = default;
  virtual Result<std::unique_ptr<KvClient>> NewClient(Role role) = 0;
  virtual Result<KvStoreCounters> Counters() = 0;
};

}  // namespace remem::testing

#endif  // REMEM_TESTING_KV_STORE_H_
