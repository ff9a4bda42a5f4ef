// Key-value drivers for remem-bench's YCSB workloads: remem, Redis
// (hiredis) and memcached (libmemcached) behind one interface, so the
// identical workload code (same keys, sizes, threads and requests in
// flight) runs against each. Also the launchers that start redis-server and
// memcached as pinned child processes on free ports.
//
// What "depth" (requests in flight per client thread) means per system:
//   remem      asynchronous gets and puts (HashStore::GetAsync/PutAsync),
//              depth of them in flight; those that go to the server are
//              sent together at the next Poll (one multi-get or multi-put
//              message per run), the library's own pipelining.
//   redis      hiredis pipelining: up to depth commands appended
//              (redisAppendCommandArgv) before the oldest reply is read
//              (redisGetReply); a sliding window, replies in order.
//   memcached  gets in flight are sent together as one libmemcached mget
//              over the binary protocol (one quiet GETKQ per key, then a
//              NOOP: pipelined on the wire); sets are synchronous, so a
//              write in the window is a round trip of its own.
// A batch of N (reads only) is a remem MultiGetAsync of N (one batch of
// one-sided reads, or one message; depth of them in flight), Redis MGET of
// N, memcached mget of N.
//
// Ordered drivers (YCSB-E: scans and puts; Connect(ordered = true)):
//   remem      the ordered store (TreeStore::ScanAsync/PutAsync/GetAsync),
//              depth of them in flight, as above.
//   redis      one sorted set, "ycsb", whose members are key + value with
//              score 0 (keys are all key_size bytes, so members sort by
//              key): a put is ZADD, a scan one ZRANGEBYLEX ycsb [start +
//              LIMIT 0 n, which returns the values with the keys (Redis
//              at its best; YCSB's own Redis binding keeps a hash per key
//              and an index, and reads each key of a scan apart);
//              pipelined as above. Gets are refused.
//   memcached  has no order: Connect refuses.
//
// Thread contract: a driver is one connection, used by one thread.

#ifndef REMEM_TOOLS_BENCH_DRIVERS_H_
#define REMEM_TOOLS_BENCH_DRIVERS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"
#include "remem/tree.h"
#include "util/subprocess.h"

namespace remem::bench {

// One request: a get of one or more keys, a put of one key, or a scan.
struct KvRequest {
  enum class Kind { kGet, kPut, kScan };
  Kind kind = Kind::kGet;
  // kGet: 1..batch keys; kPut: one; kScan: one, where the scan starts
  // (inclusive).
  std::vector<std::string> keys;
  std::string value;   // kPut
  uint32_t limit = 0;  // kScan: at most this many items
  bool quiet = false;  // a load put: the driver may skip per-put acks
  // Set by the driver on completion. kGet: one entry per key, nullopt if
  // the key is absent.
  std::vector<std::optional<std::string>> values;
  // kScan: items[0, scanned) are the keys from keys[0] on, ascending, with
  // their values (fewer than `limit` only at the end of the keys). Entries
  // past `scanned` are kept for their capacity. The ordered store's own
  // item type (its version unused by other drivers), so that the remem
  // driver hands its page over whole instead of copying it.
  using Item = TreeStore::Item;
  std::vector<Item> items;
  size_t scanned = 0;
  Status status;
  uint64_t done_ns = 0;     // RequestNs() when it completed
  void* context = nullptr;  // the caller's, untouched by drivers
  // A driver's own storage for this request, kept while the caller reuses
  // it (remem reads values into storage it keeps here, without allocating).
  struct Scratch {
    virtual ~Scratch() = default;
  };
  std::unique_ptr<Scratch> scratch;
};

struct ReadPathCounts {  // remem only
  uint64_t onesided_gets = 0, rpc_gets = 0, retries = 0, fallbacks = 0;
};

class KvDriver {
 public:
  virtual ~KvDriver() = default;
  // Starts `r` (which must stay valid until it completes).
  virtual void Issue(KvRequest* r) = 0;
  // Blocks until at least one issued request has completed; appends the
  // completed ones to `done`. Non-OK only if the connection is unusable.
  virtual Status WaitSome(std::vector<KvRequest*>* done) = 0;
  virtual size_t in_flight() const = 0;
  // Most requests this driver can really keep in flight.
  virtual int max_depth() const { return 1 << 20; }
  // After the last quiet put: makes sure every put has been applied.
  virtual Status FinishLoad() { return Status::OK(); }
  virtual std::optional<ReadPathCounts> read_path_counts() const {
    return std::nullopt;
  }
};

// A system under test: "remem[-TRANSPORT][-PATH]" (TRANSPORT shm|tcp|auto,
// default shm; PATH onesided|rpc|auto, default auto), "redis" or
// "memcached".
struct SystemSpec {
  // kRememResp: remem-server with its Redis front door (--resp), driven by
  // the Redis client code.
  enum class Kind { kRemem, kRedis, kMemcached, kRememResp };
  std::string name;
  Kind kind = Kind::kRemem;
  Transport transport = Transport::kShm;
  ReadPath read_path = ReadPath::kAuto;
};
Result<SystemSpec> ParseSystem(const std::string& name);

// A running server of any kind, started for one benchmark run.
class SystemServer {
 public:
  struct Options {
    std::string remem_binary;
    std::string remem_address;      // external remem-server: start none
    std::string remem_cluster;      // external cluster (seeds): start none
    bool read_any_replica = false;  // its gets: ReadFrom::kAnyReplica
    // Processes of external servers on this host, whose CPU time is the
    // server CPU of the run (empty: not measured).
    std::vector<int> server_pids;
    std::string secret;
    int cpu = 0;
    uint64_t memory_bytes = 1ull << 30;  // what the data set needs
    // remem: of memory_bytes, what the ordered store's region gets (0: the
    // server's default, an eighth).
    uint64_t tree_bytes = 0;
  };
  static Result<std::unique_ptr<SystemServer>> Start(const SystemSpec& spec,
                                                     const Options& o);
  ~SystemServer();
  // A new connection (one per client thread). `ordered`: to the system's
  // ordered keys (see above); Unsupported where it has none.
  Result<std::unique_ptr<KvDriver>> Connect(bool ordered = false) const;
  // CPU seconds the server process has used (NotFound if external and no
  // --server-pids were given).
  Result<double> CpuSeconds() const;
  const std::string& address() const { return address_; }

 private:
  SystemServer() = default;
  SystemSpec spec_;
  Options options_;
  std::string address_;  // host:port
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

// Full path of `program` on $PATH, or NotFound naming the Debian package.
Result<std::string> FindProgram(const std::string& program,
                                const std::string& package);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_DRIVERS_H_
