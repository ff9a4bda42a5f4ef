// Copyright remem authors.
//
// remem::Client: a connection from this thread to one remem-server.
//
// On Connect the client performs the Hello handshake (protocol version and
// the optional shared secret) and receives the server's exported regions
// with their remote keys; from then on it can
//   - read and write server memory one-sided (Read, Write, CompareAndSwap,
//     FetchAdd): over shared memory these are copies and CPU atomics done
//     by this process, with no work by the server; over tcp the server
//     performs them on request (served one-sided operations);
//   - make calls to the server (Ping, Stats, Echo).
// Later data models (hash store, ordered store, ...) add their calls in the
// same two styles:
//   - synchronous: returns when done, or with TimedOut after
//     ClientOptions::timeout;
//   - asynchronous (*Async): returns at once; the callback runs on this
//     thread inside a later Poll()/WaitAll() call. Any number of operations
//     may be in flight; buffers passed to an async call must stay valid until
//     its callback runs.
//
// Raw remote memory: regions() lists the server's raw regions, free for
// the application (RStore-style raw remote memory). The hash store's
// regions are not listed there; raw access to them is refused.
//
// Failure: if the server stops or the connection breaks, every outstanding
// and later operation completes with Unavailable (never a hang). Each RPC
// has its own deadline (ClientOptions::timeout) and times out alone. A
// one-sided operation cannot be cancelled, so it has no deadline of its own:
// a synchronous one that times out, or a WaitAll() that waits more than
// twice the timeout, tears the connection down (completing everything
// outstanding with an error); reconnect with a new Client.
//
// Thread contract: a Client is single-threaded: call it from one thread
// (any one, but one at a time, and callbacks run on the caller of Poll()).
// Use one Client per thread for parallelism.

#ifndef REMEM_CLIENT_H_
#define REMEM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/options.h"
#include "remem/status.h"

namespace remem {

// A server region, as exported.
struct RegionInfo {
  uint32_t id = 0;
  uint64_t length = 0;
};

// A location in a server's memory: region id + byte offset. Region ids are
// stable names, so an address stays meaningful whatever the region's virtual
// address on the server.
struct RemoteAddress {
  uint32_t region = 0;
  uint64_t offset = 0;
};

struct PingResult {
  double rtt_us = 0;      // one RPC round trip
  std::string transport;  // what UCX chose, e.g. "shm (sysv) + net (tcp:lo)"
};

struct ServerStats {
  uint64_t uptime_ms = 0;
  uint64_t connections_current = 0;
  uint64_t connections_total = 0;
  uint64_t auth_failures = 0;
  uint64_t rpcs_served = 0;
  uint64_t rpc_bytes_in = 0;
  uint64_t rpc_bytes_out = 0;
  uint64_t rpc_errors = 0;
  uint64_t memory_registered = 0;
  uint64_t regions = 0;
  uint64_t server_threads = 0;
  uint64_t incarnation = 0;
  // Hash store: pairs stored, table doublings so far, bytes of its memory
  // carved into bucket arrays and slab pages, and its whole memory.
  uint64_t hash_pairs = 0;
  uint64_t hash_growths = 0;
  uint64_t hash_bytes_used = 0;
  uint64_t hash_bytes_total = 0;
  // One-sided operations the server performed for clients whose transport
  // has no real RMA (tcp); 0 when every client reads shared memory.
  uint64_t mem_requests_served = 0;
  // Durability (zero without persistence): fsync policy ("none" without
  // persistence, "no", "everysec", "always"), operation log bytes on disk,
  // newest snapshot (Unix ms, 0 = none) and the snapshots' total size,
  // snapshots taken since start, failed log writes/syncs, partitions
  // refusing writes now, and what recovery restored at start.
  std::string fsync_policy = "none";
  uint64_t log_bytes = 0;
  uint64_t last_snapshot_unix_ms = 0;
  uint64_t last_snapshot_bytes = 0;
  uint64_t snapshots = 0;
  uint64_t log_write_errors = 0;
  uint64_t log_failing = 0;
  uint64_t recovered_pairs = 0;
  uint64_t recovered_log_records = 0;
  uint64_t recovery_ms = 0;
};

class Client {
 public:
  using Callback = std::function<void(Status)>;
  using ValueCallback = std::function<void(Result<uint64_t>)>;
  using ReplyCallback = std::function<void(Result<std::string>)>;

  // Connects and authenticates. Errors: InvalidArgument (bad address),
  // Unavailable (no server there, or not reachable over the forced
  // transport), PermissionDenied (secret refused), TimedOut.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Lets outstanding operations finish (at most ClientOptions::timeout; the
  // rest then fail with Unavailable), runs their callbacks, and closes the
  // connection.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // --- hash key-value store (synchronous). Keys are 1 byte .. 64 KiB and
  // values 0 .. 16 MiB; beyond that InvalidArgument. A full store answers
  // OutOfMemory and keeps every existing key. Versions are unique per
  // server partition and increase with every write.
  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  // NotFound if absent. Uses ClientOptions::read_path.
  Result<Value> Get(std::string_view key);
  // Insert or replace; returns the new version.
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  // AlreadyExists if present.
  Result<uint64_t> PutIfAbsent(std::string_view key, std::string_view value);
  // Replace only if the current version is `expected`: Conflict if not,
  // NotFound if absent.
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected);
  // NotFound if absent.
  Status Delete(std::string_view key);

  // --- hash store, asynchronous: key and value are copied; the callback
  // runs inside a later Poll()/WaitAll(). Gets use ClientOptions::read_path
  // as Get does; many may be in flight (one-sided lookups step through
  // their reads concurrently).
  using GetCallback = std::function<void(Result<Value>)>;
  void GetAsync(std::string_view key, GetCallback done);
  void PutAsync(std::string_view key, std::string_view value,
                ValueCallback done);
  void DeleteAsync(std::string_view key, Callback done);

  // --- hash store, batched: one result per key, in order, each with its
  // own status (NotFound, InvalidArgument, OutOfMemory, ...). MultiGet
  // issues one batch of one-sided reads (all lookups in flight at once) or
  // one message, as the read path decides; MultiPut (insert or replace) is
  // one message. Very large batches are split into messages of at most
  // 65536 items and 32 MiB.
  std::vector<Result<Value>> MultiGet(
      const std::vector<std::string_view>& keys);
  std::vector<Result<uint64_t>> MultiPut(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs);

  struct ReadStats {
    uint64_t onesided_gets = 0;  // answered by one-sided reads
    uint64_t rpc_gets = 0;       // answered by the server
    uint64_t retries = 0;        // one-sided attempts that failed to verify
    uint64_t fallbacks = 0;      // one-sided gets that gave up and asked
    uint64_t reads = 0;          // one-sided reads issued by gets
    // The read-path selector's current estimates of a get's latency on
    // each path (microseconds; 0 before the path has been measured, and
    // always 0 with a forced read path, which measures nothing).
    double onesided_estimate_us = 0;
    double rpc_estimate_us = 0;
  };
  const ReadStats& read_stats() const;

  // --- server calls (synchronous)
  Result<PingResult> Ping();
  Result<ServerStats> Stats();
  // Asks the server to snapshot every hash partition; returns once they
  // are on disk. Unsupported when the server runs without persistence.
  Status Snapshot();
  Result<std::string> Echo(std::string_view payload);

  // --- one-sided operations on server memory (synchronous). `len` may be
  // anything inside the region; atomics need 8-byte aligned offsets.
  Status Read(RemoteAddress addr, void* dst, size_t len);
  // Returns when the data is in the server's memory.
  Status Write(RemoteAddress addr, const void* src, size_t len);
  // Atomically: old = *addr; if (old == expected) *addr = desired. Returns old.
  Result<uint64_t> CompareAndSwap(RemoteAddress addr, uint64_t expected,
                                  uint64_t desired);
  // Atomically: old = *addr; *addr += delta. Returns old.
  Result<uint64_t> FetchAdd(RemoteAddress addr, uint64_t delta);

  // --- asynchronous versions
  void ReadAsync(RemoteAddress addr, void* dst, size_t len, Callback done);
  void WriteAsync(RemoteAddress addr, const void* src, size_t len,
                  Callback done);
  void CompareAndSwapAsync(RemoteAddress addr, uint64_t expected,
                           uint64_t desired, ValueCallback done);
  void FetchAddAsync(RemoteAddress addr, uint64_t delta, ValueCallback done);
  void EchoAsync(std::string payload, ReplyCallback done);

  // Progresses the connection and runs ready callbacks; returns how many
  // events were handled. Never blocks.
  size_t Poll();
  // Polls until every operation issued so far has completed. Returns the
  // first error seen among them since the last WaitAll, or OK.
  Status WaitAll();
  // Number of operations issued and not yet completed.
  size_t in_flight() const;

  // --- what the handshake told us
  const std::vector<RegionInfo>& regions() const;
  // Random per server start: a different value means the server restarted.
  uint64_t server_incarnation() const;
  // What UCX chose for this connection.
  std::string transport() const;
  // True if one-sided reads land directly in this process's mapping of the
  // server's memory (shared memory).
  bool reads_are_local() const;
  // False once the connection has failed.
  bool connected() const;

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remem

#endif  // REMEM_CLIENT_H_
