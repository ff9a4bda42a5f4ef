// Copyright remem authors.
//
// remem::HashStore: the hash key-value store of a remem-server, used
// through a Session (remem/session.h).
//
// Gets read the server's memory one-sided and verify what they read
// (checksums and versions, so a get never returns a torn or stale-beyond-
// linearizable value while the server writes), or ask the server, as the
// read path decides (SessionOptions::read_path, or HashOptions): kOneSided,
// kRpc, or kAuto, which chooses per get from measured latencies (Cell's
// selector: on shared memory it reads directly, over tcp it mostly asks the
// server, under server overload it reads more itself; it measures both
// paths first, so over tcp a program's first batches of many keys take
// the slow one-sided path about half the time: kRpc skips that). Writes go
// through the server. A value read one-sided is returned only while the
// server's lease vouches for it (see remem/session.h, "Liveness").
//
// Limits: keys are 1 byte .. 64 KiB and values 0 .. 16 MiB (a server may
// set lower limits: max_key(), max_value()); beyond that InvalidArgument.
// A full store answers OutOfMemory and keeps every existing key. Versions
// are unique per server partition and increase with every write.
//
// Thread contract: as the Session: one thread. A HashStore must be
// destroyed before its Session; its destructor waits for its own
// operations in flight (as Session's does).

#ifndef REMEM_HASH_H_
#define REMEM_HASH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"

namespace remem {

struct HashOptions {
  // The read path of gets; unset: the session's (SessionOptions::read_path).
  std::optional<ReadPath> read_path;
  // Reads from any replica (a session to a member of a replicated cluster,
  // remem-server --replicas): gets, single and batched, ask the server
  // (the read path is RPC), and a server that holds a whole copy of the
  // key's shard as a backup answers from that copy, as the primary does
  // from its own. A weaker mode than the default's linearizable reads
  // (docs/ARCHITECTURE.md, "Reads from backups"): a backup may answer with
  // a write its primary has not acknowledged yet, or, during a
  // reconfiguration, with a value older than one already acknowledged.
  // Writes are unaffected. remem::Cluster sets it for its gets with
  // ClusterOptions::read_from.
  bool read_any_replica = false;
  // Asynchronous gets of this store are done in the order issued: a get
  // that goes to the server (sent by RPC as the read path chose, or a
  // one-sided lookup that gave up and asks the server) holds the gets
  // issued after it, which then go by RPC too, behind it, until it is
  // answered. Otherwise a one-sided get issued later may read the table
  // before an earlier RPC get is done, so a key being written can read
  // newer, then older. Costs those later gets their one-sided path while
  // an RPC get is out. (The RESP front door's reads use it.)
  bool ordered_gets = false;
};

class HashStore {
 public:
  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  using GetCallback = std::function<void(Result<Value>)>;
  using VersionCallback = std::function<void(Result<uint64_t>)>;
  using Callback = std::function<void(Status)>;
  using MultiGetCallback = std::function<void(std::vector<Result<Value>>)>;

  // Attaches to `session`'s server (the store's layout and limits; and,
  // for a session that remem::Cluster does not route, whether the server
  // is a cluster member: a member holds only its own shards, so such a
  // store's gets go by RPC, whatever `read_path` says, and a key owned
  // elsewhere is answered Moved rather than NotFound). Unsupported if the
  // server has no hash store.
  static Result<std::unique_ptr<HashStore>> Open(
      Session* session, const HashOptions& options = {});
  ~HashStore();
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  // --- synchronous
  // NotFound if absent.
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

  // --- asynchronous: key and value are copied; the callback runs inside a
  // later Session::Poll()/WaitAll() (or EventLoop::Poll()). Gets use the
  // store's read path as Get does; many may be in flight (one-sided
  // lookups step through their reads concurrently; on shared memory they
  // are queued with their first bucket prefetched, and performed together
  // at the next Poll, WaitAll or synchronous call, or once 32 are queued).
  // Gets, puts and deletes that go to the server are sent together at the
  // next Poll as one message (what Redis calls pipelining, done for the
  // application), which the server does in issue order: an RPC get queued
  // after a put of the same key sees that put. (An RPC get whose value did
  // not fit the reply, 1 MiB with the values before it, is asked again in a
  // later message, and sees the writes done by then, those issued after it
  // too.) Operations in flight
  // together are concurrent: a one-sided get reads what the server holds
  // when it runs, which may be before a put issued ahead of it was sent.
  // An operation issued after another's callback ran sees its effect.
  void GetAsync(std::string_view key, GetCallback done);
  void PutAsync(std::string_view key, std::string_view value,
                VersionCallback done);
  void DeleteAsync(std::string_view key, Callback done);

  // --- batched: one result per key, in order, each with its own status
  // (NotFound, InvalidArgument, OutOfMemory, ...). MultiGet issues one
  // batch of one-sided reads (all lookups in flight at once) or one
  // message, as the read path decides; MultiPut (insert or replace) is one
  // message. Very large batches are split into messages of at most 65536
  // items and 32 MiB; a reply takes values up to 1 MiB (so that no batch
  // holds the server's thread for long), and the keys whose values did not
  // fit are asked again in a later message (a get batched with writes may then
  // see a write issued after it in the same batch).
  std::vector<Result<Value>> MultiGet(
      const std::vector<std::string_view>& keys);
  // MultiGet, asynchronously (keys are copied where needed; the callback
  // runs inside a later Poll/WaitAll, with one result per key). Many may
  // be in flight. What goes to the server joins the store's queue and goes
  // out at the next Poll in one message with everything else queued (other
  // batches, single gets, puts, deletes), in issue order. On shared memory
  // its one-sided reads are done in the call. Over a network (tcp), with the
  // auto read path and anything else in flight or queued, it goes by RPC in
  // that message, as a single get does (so it sees the writes queued ahead
  // of it); alone, the read path chooses.
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     MultiGetCallback done);
  std::vector<Result<uint64_t>> MultiPut(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs);

  // --- gets into storage the caller keeps. The same operations as above,
  // but a found value is assigned into a Value the caller owns (its string
  // keeps its capacity), so a caller that reuses its Values reads without
  // allocating: on shared memory, a one-sided get then allocates nothing.
  // A Value is changed only when its key is found (NotFound leaves it as
  // it was). Storage passed to an asynchronous call must stay valid, and
  // untouched, until its callback runs.
  //
  // OK, NotFound or another error, as Get.
  Status Get(std::string_view key, Value* into);
  // `done` gets what Get(key, into) would return.
  void GetAsync(std::string_view key, Value* into, Callback done);
  // Resizes *values and *statuses to keys.size(); each key's outcome goes
  // to (*statuses)[i] and, when OK, its value to (*values)[i]. `done` gets
  // OK, or the first status that is neither OK nor NotFound.
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     std::vector<Value>* values, std::vector<Status>* statuses,
                     Callback done);

  struct ReadStats {
    uint64_t onesided_gets = 0;  // answered by one-sided reads
    uint64_t rpc_gets = 0;       // answered by the server
    uint64_t retries = 0;        // one-sided attempts that failed to verify
    uint64_t fallbacks = 0;      // one-sided gets that gave up and asked
    uint64_t reads = 0;          // one-sided reads issued by gets
    uint64_t unvouched = 0;      // one-sided results the lease did not cover
    // In a cluster: one-sided results the server's serving mark did not
    // cover (a configuration change, a hand-over, a shard the server does
    // not lead under the client's configuration; in a replicated cluster,
    // not on the backups yet), asked again of the server or after a
    // refresh. (The name is older than the check in unreplicated clusters.)
    uint64_t unreplicated = 0;
    // The read-path selector's current estimates of a single get's latency
    // on each path (microseconds; 0 before the path has been measured, and
    // always 0 with a forced read path, which measures nothing). Batches
    // (MultiGet, MultiGetAsync) have a selector of their own, per key of a
    // batch; like every selector it first alternates between the paths
    // (about its first twenty batches) before it follows the faster one.
    double onesided_estimate_us = 0;
    double rpc_estimate_us = 0;
  };
  const ReadStats& read_stats() const;

  uint32_t max_key() const;
  uint32_t max_value() const;
  // The read path in force.
  ReadPath read_path() const;
  // Operations of this store issued and not yet completed.
  size_t in_flight() const;

 private:
  struct Impl;
  explicit HashStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remem

#endif  // REMEM_HASH_H_
