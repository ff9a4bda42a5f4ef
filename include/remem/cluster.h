// Copyright remem authors.
//
// remem::Cluster: the hash store of a cluster of remem-servers (started
// with --cluster ZK_HOSTS/PATH), used from one client thread.
//
// The client needs only a few server addresses (seeds), never ZooKeeper:
// it asks a seed for the cluster's configuration (which server owns which
// of the cluster's shards, at which epoch), connects to each server it
// needs when it first needs it, all on one EventLoop (one UCX worker
// progresses every server), and routes every operation to the owner of its
// key's shard. Multi-gets and multi-puts are split per server and issued to
// all of them at once. Every request carries the configuration epoch the
// client used; a server that refuses it (Moved: the key is elsewhere)
// makes the client fetch the configuration again and retry, within the
// operation's deadline (SessionOptions::timeout, counted from the first
// refusal, so an operation answered at once never reads the clock); Moved
// reaches the caller only if the configuration does not settle by then. A
// server still without a configuration (Busy: it just restarted, or the cluster
// is forming) is asked again until the deadline too.
//
// Shards move between servers while the cluster serves (a server joined,
// or was drained): a moving shard's operations are refused for a moment
// (Busy) while it is handed over, and then Moved; both are retried here
// within the deadline (Busy after a pause that grows with each refusal,
// from 200 us to 5 ms, asleep: a client waiting on a cluster that answers
// Busy for long, one forming or whose members hold no lease, uses little
// CPU), so a caller sees neither.
//
// Each operation behaves as the same operation on that server's HashStore
// (remem/hash.h): gets read one-sided or ask the server, as the read path
// decides; the same limits and errors. In a cluster without replicas a
// server that is down answers Unavailable for the keys it owns, and the
// client reconnects to it on a later operation. Over shared memory a server
// killed while sending to this client can block the client's event loop
// (remem/session.h): the client then reaches every server through a new
// loop by itself; the reads that were in flight are issued again, and the
// writes fail with Unavailable (their outcome is unknown).
//
// In a replicated cluster (remem-server --replicas f; docs/ARCHITECTURE.md,
// "Replication") every operation goes to the shard's primary, which
// answers a write once the shard's backups hold it (with
// ClusterOptions::read_from = ReadFrom::kAnyReplica, gets go to the
// shard's whole copies in turn: a weaker mode, below). A get that reads
// the primary one-sided (as the read path chooses) returns the pair only if
// the primary's serving mark vouches for it (its backups hold it, and the
// primary still leads the shard as this client's configuration says);
// otherwise it asks the primary, or fetches the configuration again. When a
// primary dies (or is paused or cut off past its lease, --cluster-lease-ms),
// the cluster fails its shards over to their backups; meanwhile its keys are
// refused (Busy, asked again; after three in a row, four for a single-key
// asynchronous operation, the configuration is fetched again), and a write that
// finds the primary unreachable (it was never sent: a single-key operation,
// synchronous or asynchronous, or a batch's keys; of the hash store or of a
// ClusterTree) fetches the configuration until one names a new owner, within
// the deadline, as reads do. A read that was in flight on a primary that died
// (a get, a scan, or a server-side operation that only reads: VecReduce,
// VecFilter) is asked again of the new owner, within its deadline. A write that
// was in flight on a primary that died fails with Unavailable, and one sent to
// a paused primary with TimedOut at its deadline (or is answered Busy and
// retried when it resumes): a failed write may or may not have taken effect
// (never half).
//
// The ordered store (remem/tree.h) of a cluster formed with split keys
// (remem-server --tree-splits) is sharded by key range: Cluster::Tree()
// gives a ClusterTree that routes each key to its range's owner and splits
// scans and batches by range (below).
//
// Thread contract: as a Session: one thread. Callbacks of asynchronous
// operations run inside Poll()/WaitAll() on that thread, or inside another
// call that waits for a server (a synchronous call; the first operation on
// a server, which connects to it), never inside the call that issued
// them. A ClusterTree is its Cluster's, used from the same thread.

#ifndef REMEM_CLUSTER_H_
#define REMEM_CLUSTER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/hash.h"
#include "remem/ops.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"
#include "remem/tree.h"

namespace remem {

class ClusterTree;

// Which copy of a shard a replicated cluster's gets read.
enum class ReadFrom : uint8_t {
  // The shard's primary: linearizable (the default).
  kPrimary,
  // Any whole copy, taken in turn: the primary or one of its backups
  // (ready or retiring, never one being filled), asked by RPC. A weaker
  // mode that spreads the reads of each shard over its f + 1 servers:
  // a get may return a write that is not acknowledged yet (a backup
  // applies it before the primary answers its writer) and, around a
  // reconfiguration, one older than a write already acknowledged (a
  // backup the manager has just dropped, or a server that has not
  // installed the newest configuration yet). A get that begins after a
  // write was acknowledged returns it or a later one, whichever copy
  // answers, while the configuration stands. A get a backup cannot
  // answer (it is not a backup any more, is down or holds no lease) is
  // asked of the primary as usual. Gets, single and batched (a
  // multi-get's keys are spread over the copies the same way),
  // synchronous and asynchronous; never one-sided. docs/ARCHITECTURE.md,
  // "Reads from backups".
  kAnyReplica,
};

struct ClusterOptions {
  // "host:port" of some of the cluster's servers; the first that answers
  // gives the configuration, and its cluster's name is the client's: a
  // server of a cluster of another name (a list that mixes two) is never
  // taken for one of it (its answers fail with Conflict, and the next
  // server is asked).
  std::vector<std::string> seeds;
  // For every session to a server (its `server` field is ignored);
  // `timeout` is also each operation's deadline, retries included.
  SessionOptions session;
  HashOptions hash;
  // How long Connect waits for a cluster that is still forming (its
  // servers up, the first configuration not yet installed); 0: not at all,
  // and at most kMaxTimeout (InvalidArgument otherwise).
  std::chrono::milliseconds wait_for_config{0};
  // Which copy of a shard gets read (above); without replicas, the owner.
  ReadFrom read_from = ReadFrom::kPrimary;
};

// Splits "h1:p1,h2:p2" into seeds (InvalidArgument if empty).
Result<std::vector<std::string>> ParseSeeds(std::string_view list);

class Cluster {
 public:
  using Value = HashStore::Value;
  using GetCallback = HashStore::GetCallback;
  using VersionCallback = HashStore::VersionCallback;
  using Callback = HashStore::Callback;
  using MultiGetCallback = HashStore::MultiGetCallback;

  struct Node {
    std::string address;
    uint64_t capacity = 0;  // bytes the server exports
    uint32_t shards = 0;    // shards it owns
    // Shards it backs up (replicated clusters; retiring copies included).
    uint32_t backups = 0;
    uint32_t filling = 0;  // of those, shards it is being filled with
    std::string domain;    // its failure domain ("": none declared)
    uint32_t ranges = 0;   // ordered ranges it owns
  };
  struct Info {
    std::string name;  // the cluster's name
    uint32_t epoch = 0;
    uint32_t num_shards = 0;
    std::vector<Node> nodes;
    std::vector<uint32_t> shard_owner;  // index into nodes, per shard
    // Per shard: index into nodes of the server it is moving to, or -1
    // (the cluster moves shards when a server joins or is drained).
    std::vector<int32_t> shard_next;
    uint32_t moving = 0;  // shards moving now
    // Backups per shard (0: not replicated), and per shard `replicas`
    // indexes into nodes of its backups (-1: missing, the shard runs short
    // of copies). shard_filling[s * replicas + i]: that backup is being
    // filled (it holds a whole copy only once the flag clears; the cluster
    // re-replicates shards short of copies to the other servers).
    uint32_t replicas = 0;
    std::vector<int32_t> shard_backups;
    std::vector<uint8_t> shard_filling;
    uint32_t filling = 0;  // shards with a backup being filled
    // Per shard: index into nodes of a copy on its way out (a drained
    // server's, or one moved to balance the servers), still a backup until
    // the one filled in its place is ready; -1: none.
    std::vector<int32_t> shard_retiring;
    // Shards with fewer whole backups than `replicas` (a failover left
    // them short: they are being copied, or wait for a server with room).
    // A ready backup is whole, and so is a retiring copy: a shard whose
    // retiring copy waits for the one filled in its place is getting a
    // new copy, not short of one.
    uint32_t ShortOfCopies() const;
    // The ordered store's ranges (none: the cluster has no ordered store):
    // range r holds the keys in [splits[r - 1], splits[r]) (the first from
    // the smallest key, the last unbounded); range_owner[r] indexes nodes.
    std::vector<std::string> splits;
    std::vector<uint32_t> range_owner;
    // Per range: index into nodes of the server it is moving to, or -1
    // (ranges move when a server joins or is drained).
    std::vector<int32_t> range_next;
    uint32_t moving_ranges = 0;  // ranges moving now
    // Replicated (replicas > 0): per range, the shard it rides (its owner,
    // its backups and where it moves are that shard's); empty otherwise.
    std::vector<uint32_t> range_carrier;
  };

  // Fetches the configuration from the first seed that answers. Errors:
  // InvalidArgument (no seeds), Unavailable (no seed answered), Busy (the
  // cluster has no configuration yet), Unsupported (a seed is not in a
  // cluster), and the session's connect errors.
  static Result<std::unique_ptr<Cluster>> Connect(
      const ClusterOptions& options);
  // Waits for operations in flight, then closes every session.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // --- the configuration
  const Info& info() const;
  // Fetches the configuration again: from a connected server, else a
  // member of the configuration, else a seed, each asked at most once. The
  // answer is awaited for a second (from the last server asked, for the
  // session timeout); a server without a session first gets one, within
  // a second (the last server asked: within the session timeout). If none gives
  // it, the error (with the last answer's code) names every server asked and
  // what it answered. Then every member of the configuration is asked, for at
  // most a quarter second in all (those connected at once, each other one once
  // connected, within 50 ms or passed over), and the newest configuration any
  // gave is kept: a member cut off from ZooKeeper answers with the one it was
  // cut off with.
  Status Refresh();
  // The shard of `key` and the address of the server that owns it.
  uint32_t ShardOf(std::string_view key) const;
  const std::string& OwnerOf(std::string_view key) const;

  // --- synchronous, as HashStore's
  Result<Value> Get(std::string_view key);
  Status Get(std::string_view key, Value* into);
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  Result<uint64_t> PutIfAbsent(std::string_view key, std::string_view value);
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected);
  Status Delete(std::string_view key);
  // Split per server, issued to all at once; one result per key, in order.
  std::vector<Result<Value>> MultiGet(
      const std::vector<std::string_view>& keys);
  std::vector<Result<uint64_t>> MultiPut(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs);
  // A server-side operation (remem/ops.h: fetch-add, compare-and-swap,
  // vector update, ...) on the server that owns op.key, as
  // OpsStore::Execute there.
  Result<OpReply> Execute(const Op& op);
  // Ops split per server, all servers at once (each server's part in one
  // message, as OpsStore::ExecuteBatch); one result per op, in order.
  std::vector<Result<OpReply>> ExecuteBatch(const std::vector<Op>& ops);

  // --- asynchronous (key and value copied; callbacks inside Poll/WaitAll).
  // A refused operation is retried after the next Poll has fetched the
  // configuration again.
  void GetAsync(std::string_view key, GetCallback done);
  void PutAsync(std::string_view key, std::string_view value,
                VersionCallback done);
  void DeleteAsync(std::string_view key, Callback done);
  // As Execute; the op is kept (copied) for a retry.
  void ExecuteAsync(Op op, OpsStore::Callback done);
  // As MultiGet (keys copied): one result per key, in order. Keys refused
  // by a server that no longer owns them are asked again of their owner
  // together, within the deadline. Many may be in flight.
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     MultiGetCallback done);
  // As HashStore::MultiGetAsync into storage the caller keeps: nothing
  // allocated per call once warm. Here the keys are not copied: the
  // strings they view, *values and *statuses must stay valid and untouched
  // until `done` runs.
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     std::vector<Value>* values, std::vector<Status>* statuses,
                     Callback done);
  // A get into storage the caller keeps, as HashStore::GetAsync(key, into,
  // done): nothing allocated per get on shared memory. Here `key` is not
  // copied: it, like *into, must stay valid and untouched until `done`
  // runs (a refused get is sent again with it).
  void GetAsync(std::string_view key, Value* into, Callback done);
  // Progresses every server's session; runs ready callbacks.
  size_t Poll();
  // Polls until every operation issued has completed; the first error
  // among them (for a multi-get, its first error other than NotFound), or OK.
  // Inside a callback, as Session::WaitAll: it returns once every operation
  // has completed but those answered together with the running one.
  Status WaitAll();
  size_t in_flight() const;
  // The event loop every server's session is on now. Replaced by a new
  // one when it stalls (remem/session.h, EventLoop::stalled): do not keep
  // it past a Poll.
  EventLoop* loop() const;

  // --- every server
  // Each server's counters, by address (a server that cannot be reached
  // gives its error).
  std::vector<std::pair<std::string, Result<ServerStats>>> Stats();
  // Runs fn with a session to each server of the configuration, in turn
  // (e.g. Ping, TakeSnapshot): each server's outcome, by address (a server
  // that cannot be reached gives the connection's error).
  std::vector<std::pair<std::string, Status>> ForEachServer(
      const std::function<Status(Session*)>& fn);
  // Asks the cluster to move every shard away from the server at `address`
  // (a member of the configuration), e.g. before taking it out. In a
  // replicated cluster its primaries are handed over to their backups and
  // its backup copies made on other members, every shard keeping f + 1
  // whole copies throughout (a drained copy stays a backup until its
  // replacement is filled). Its ordered ranges move too, one at a time.
  // With `wait` > 0, waits until it holds no shard (owned or backed up)
  // nor range and nothing is moving or filling: TimedOut if that takes
  // longer (the drain goes on). Meanwhile it asks every 250 ms who answers
  // at `address`: Conflict if a server started again there (another
  // incarnation than the one drained: a new member, not drained, which
  // takes its share again; drain it again to empty it). Errors:
  // InvalidArgument (`address` is not host:port), Unsupported (the live
  // servers left would be too few for every shard's copies: the last
  // server, or a replicated cluster too small without it), NotFound (not
  // a member), Unavailable (no server answered).
  Status Drain(const std::string& address, std::chrono::milliseconds wait);

  // The cluster's ordered store, owned by this Cluster (the same object on
  // every call; `options` count at the first call only). Unsupported if
  // the cluster was formed without --tree-splits. In a replicated cluster
  // a one-sided search returns what it read only if the range's backups
  // hold every write its leaves show (the range server's mark says so),
  // else it asks the server; over a network the gets and scans go by RPC
  // at once, whatever `options` say.
  Result<ClusterTree*> Tree(const TreeOptions& options = {});

  // Routing counters: refusals (Moved) seen and configurations fetched;
  // gets answered one-sided and by the server, and (replicated clusters)
  // one-sided results the serving mark did not cover (HashStore::ReadStats,
  // summed over this client's stores, those of servers it has left too).
  struct RouteStats {
    uint64_t moved = 0;
    uint64_t refreshes = 0;
    uint64_t connects = 0;
    uint64_t onesided_gets = 0;
    uint64_t rpc_gets = 0;
    uint64_t unreplicated = 0;
    // Times the client moved to a new event loop: a server died while
    // sending to it over shared memory and blocked its receive queue
    // (remem/session.h, EventLoop::stalled).
    uint64_t loops_replaced = 0;
    // Sessions failed because a call waited on a server that the cluster
    // had failed over meanwhile (paused, cut off): replicated clusters.
    uint64_t suspected = 0;
    // With ReadFrom::kAnyReplica: gets sent to a backup, and of those the
    // ones it could not answer (asked of the primary instead).
    uint64_t replica_gets = 0;
    uint64_t replica_refused = 0;
  };
  const RouteStats& route_stats() const;

 private:
  friend class ClusterTree;
  struct Impl;
  explicit Cluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The ordered store of a cluster: as a TreeStore (remem/tree.h) on each
// range's owner, which it opens at first use (reading one-sided or asking
// the server, as TreeOptions and the session's read path say). Ranges are
// placed when the cluster forms and move as shards do (a server that joins
// takes some, a drained one gives its own away). Without replicas a server
// that is down answers Unavailable for the keys of its ranges (the client
// reconnects on a later operation); with them (--replicas) each range
// rides a hash shard, with its backups, and fails over with it (one-sided
// searches of a replicated range return only what its backups hold, else
// ask the server, whose answers wait for them). Refusals are retried as
// the hash store's are: Busy (a member installing its configuration, a
// range being handed over) after a pause, Moved after a refresh, within
// the session timeout.
//
// Scans cross ranges in key order: a scan asks each range's owner in turn
// for the part of [start, end) in its range, until `limit` items, the end,
// or a part after which the page holds 1 MiB of items or more (each part
// ends at 1 MiB of its own, so a page may hold up to about 2 MiB, plus the
// item that ended each part); `more`
// and `resume` are as TreeStore's, so pages chain alike. A scan returns
// every key present for its whole duration, in order, and never one that
// was never present (each range's part holds that, and the parts are
// disjoint and read in order). A part that fails fails the scan (the
// items of the parts before it are not returned). Batches are split per
// owner and sent to all at once.
//
// Errors: as TreeStore's, and Unsupported if the configuration has no
// ordered ranges.
//
// Thread contract: its Cluster's thread; callbacks inside its Poll().
class ClusterTree {
 public:
  using Value = TreeStore::Value;
  using Item = TreeStore::Item;
  using Page = TreeStore::Page;
  using Order = TreeStore::Order;

  Result<Value> Get(std::string_view key);
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  Result<uint64_t> PutIfAbsent(std::string_view key, std::string_view value);
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected);
  Status Delete(std::string_view key);
  // As TreeStore::Scan, across ranges.
  Result<Page> Scan(std::string_view start, std::string_view end,
                    uint32_t limit, Order order = Order::kAscending);
  // As Scan, into *page, reusing its storage as TreeStore::ScanInto does
  // (the first range's part goes into it directly). On an error the page
  // is empty.
  Status ScanInto(std::string_view start, std::string_view end, uint32_t limit,
                  Order order, Page* page);
  Result<Page> ScanPrefix(std::string_view prefix, uint32_t limit,
                          Order order = Order::kAscending);
  // One result per key or pair, in order, each with its own status (as
  // TreeStore's); each owner's part in its own requests, all owners at
  // once.
  std::vector<Result<Value>> MultiGet(
      const std::vector<std::string_view>& keys);
  std::vector<Result<uint64_t>> MultiPut(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs);

  // --- asynchronous: arguments are copied; callbacks run inside the
  // Cluster's Poll()/WaitAll(), which count these among its operations in
  // flight, or inside another call of the Cluster that waits for a server
  // (a synchronous call; the first operation on a server, which connects
  // and opens its store), never inside the call that issued them. A
  // refusal (Busy, Moved) is sent again as the hash store's are, within
  // the session timeout.
  void GetAsync(std::string_view key, TreeStore::GetCallback done);
  void PutAsync(std::string_view key, std::string_view value,
                TreeStore::VersionCallback done);
  void DeleteAsync(std::string_view key, TreeStore::Callback done);
  // As Scan: each range's part once the part before it has answered.
  void ScanAsync(std::string_view start, std::string_view end, uint32_t limit,
                 Order order, TreeStore::ScanCallback done);
  // As MultiGet and MultiPut: keys and values are copied in the call; one
  // result per key or pair, in order, each owner's part sent at once (as
  // TreeStore::MultiGetAsync and MultiPutAsync), the refused items again.
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     TreeStore::MultiGetCallback done);
  void MultiPutAsync(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
      TreeStore::MultiPutCallback done);
  // Into *page (as ScanInto), which must stay valid, and not be read, until
  // `done` has run.
  void ScanAsync(std::string_view start, std::string_view end, uint32_t limit,
                 Order order, Page* page, TreeStore::Callback done);

  // The range holding `key`, and the address of its owner.
  uint32_t RangeOf(std::string_view key) const;
  const std::string& OwnerOf(std::string_view key) const;
  // The limits of the trees (the same on every server of a build).
  uint32_t max_key() const;
  uint32_t max_scan() const;
  // The read counters of every server's TreeStore, summed (those of stores
  // closed since included): how many gets and scan pages were answered
  // one-sided, and how many one-sided results were not vouched for (in a
  // replicated cluster: writes not yet held by the backups) and asked of
  // the server instead.
  TreeStore::ReadStats read_stats() const;

 private:
  friend class Cluster;
  struct ScanState;
  explicit ClusterTree(Cluster::Impl* impl);
  // InvalidArgument for a limit of 0 or over max_scan(), or start > end.
  Status CheckScan(std::string_view start, std::string_view end,
                   uint32_t limit) const;
  // Asks for the next range's part of an asynchronous scan.
  static void ScanStep(Cluster::Impl* impl, std::shared_ptr<ScanState> scan);
  // A batch's items split per owner (cluster.cc); those not sent (their
  // owner unreachable) are marked in *unsent, if given.
  template <typename R, typename KeyOf, typename Send>
  static void PerOwner(Cluster::Impl* im, const std::vector<size_t>& todo,
                       KeyOf key_of, std::vector<R>& out, Send send,
                       std::vector<uint8_t>* unsent = nullptr);
  Cluster::Impl* impl_;
};

}  // namespace remem

#endif  // REMEM_CLUSTER_H_
