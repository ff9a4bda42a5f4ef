// cluster::ClusterMember: a remem-server's membership in a named cluster,
// kept in ZooKeeper (remem-server --cluster ZK_HOSTS/PATH).
//
// Under PATH (docs/ARCHITECTURE.md, "Cluster"):
//   members/<address>   ephemeral: this server's registration (its address
//                       and capacity, EncodeMemberRecord)
//   election/n-<seq>    ephemeral sequential: the lowest is the
//                       configuration manager
//   config              the configuration (EncodeConfig), written only by
//                       the manager, only conditionally: created once
//                       (creation fails if another manager created it),
//                       then replaced at the ZooKeeper version it read, so
//                       two managers can never both install one
//   drain/<address>     a member to empty (remem cluster drain); removed
//                       once that member has left the cluster
//   handoff             the epoch whose moves are past the point of no
//                       return (see below), while they complete
// The manager installs the first configuration once `initial_size`
// servers have registered: shards split evenly over them. Every server
// watches `config` and installs each newer one into its Ownership.
//
// Moving shards (the manager, on its member's thread). When a server
// joins, or one is drained, the manager balances the shards again, at most
// `max_moves` shards per step (NextBalanceStep). A step:
//   1. Configuration e+1 names, for each moving shard, its owner A and the
//      server B it moves to. Clients keep using A, which notes every key of
//      those shards that changes from now on (hash service, Outgoing).
//   2. B drops what an earlier, unfinished step left of those shards; the
//      manager pages every pair of them from A (kShardExport, with
//      versions) into B (kShardImport), then once more the keys changed
//      meanwhile (kShardSync), then freezes them at A (writes answer Busy)
//      and sends the last changes (kShardSync with kShardFreeze).
//   3. B now holds every pair A acknowledged. The manager records
//      `handoff` = e+1, then releases the shards at A (kShardDrop with
//      kShardRelease: A refuses reads too, and deletes its copy, so a
//      one-sided reader of A finds nothing, and asks), and installs
//      configuration e+2 naming B (CompleteMoves); then removes `handoff`.
// Between the freeze and e+2 a client retries Busy within its deadline.
// A manager that dies mid-step is replaced; its successor finds e+1 in
// ZooKeeper and starts the step again from 2, or, if `handoff` says e+1,
// from the release (B already has everything; A may have deleted its
// copy). A step whose A or B is no longer registered before the handoff is
// abandoned (AbandonMoves: e+2 keeps every shard where it was). A member
// of a step that restarts (killed and back at once, still registered) is
// still part of it: a copy that had to connect to one of its members
// again starts over at 2 (the new owner may have lost the pages it took,
// the old owner the keys it noted; the copy calls every member once more
// before it freezes, so that this is seen before anything is frozen); an
// old owner back during a step starts with the moving shards frozen (its
// step may be past the freeze), released if `handoff` names the step (it
// may be past the release here), and a new owner keeps what it recovered
// of them (the purge keeps shards moving here).
// Ordered ranges (config.h, range_next) move in steps of their own (a step
// moves shards or one range, never both), by the same protocol on the
// tree service: B drops its leftovers (kRangeDrop), the manager pages the
// range from A (kRangeExport) into B (kRangeImport), sends the keys
// changed meanwhile (kRangeSync), freezes the range at A and sends the
// last changes (kRangeSync with kRangeFreeze), records the handoff,
// releases it at A (kRangeDrop with kRangeRelease) and installs e+2.
// Without replicas, a server that dies takes its shards' data with it; they
// come back with it if it restarts from --data-dir, and shards move as
// above. With replicas (the first configuration's `replicas`, from
// --replicas), shards move off drained members and to balance the members
// (below, by hand-over and copy); the manager fails over (Failover) a member
// whose lease lapsed (member_lease.h: it has not asked for `lease` +
// kLeaseMarginNs; it stopped serving by then) or that registered
// with another incarnation (it restarted): the next configuration gives
// each shard it owned to that shard's first backup still here and drops it
// from every shard's backups. A new manager has heard from nobody: it
// waits lease + kLeaseMarginNs after it took office before it fails anyone
// over, as after it refused a lease itself; then a member it has not heard
// from is judged from when it first saw it, unless that member is not
// registered in ZooKeeper either (it died with the old manager): at once. The
// manager grants leases (GrantLease) only while its ZooKeeper session is surely
// alive (a successful ZooKeeper call less than the session timeout - lease -
// kLeaseMarginNs ago), so the leases it granted have lapsed before a successor
// can be elected. Re-replication (replicated clusters, once nobody is to be
// failed over): shards short of copies get new backups, marked filling
// (PlanBackups), from the members holding a lease and registered. In a round at
// epoch e, which only the manager that wrote e runs (a successor first writes
// e+1, so a copy an earlier manager began is never mistaken for its own): each
// member being filled drops what it held of those shards (kShardDrop with
// kShardForFill), then each of their primaries copies them through its
// replication stream (kShardFill, asked again every pass for its
// progress), and once every copy is held the manager writes e+1 with
// those backups ready (CompleteFills). A configuration that changes during
// a round ends it (the primaries stop their copies); the next round starts
// over at the new epoch. Draining (replicated clusters, once nobody is to be
// failed over and no copy is under way; DrainStep): configuration e+1 moves
// each shard a drained member owns to one of its ready backups (`next`);
// the manager freezes them at the owner with kShardSync, whose answer waits
// until the owner's backups hold every write it made, and writes e+2
// (CompleteMoves: the backup owns, the old owner backs up in its place).
// When the drained member owns nothing, each of its backup copies retires
// (it stays a backup) in favour of one on another member, filling; the round
// above fills them, drops the retiring copies in the configuration that marks
// the new ones ready, and then has their members delete them (kShardDrop with
// kShardForget; a member it does not reach deletes them itself once it
// installs that configuration). A failover abandons a hand-over. Balancing (a
// member joined or returned; BalanceReplicas), once everything is whole: copies
// move the same way from the members holding the most shards to those holding
// the fewest, then primaries by hand-over. ZooKeeper stays off the data path:
// while it is unreachable the server keeps serving the configuration it has,
// and once its session is back (or replaced, after expiry) it registers again.
//
// Thread contract: Start, Stop and the destructor from one thread; the getters
// from any thread. The member runs its own thread (ZooKeeper's C client
// adds two of its own).

#ifndef REMEM_CLUSTER_MEMBER_H_
#define REMEM_CLUSTER_MEMBER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster/config.h"
#include "cluster/ownership.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"
#include "util/move_function.h"

typedef struct _zhandle zhandle_t;

namespace remem::cluster {

struct MemberOptions {
  ZkTarget target;
  Member self;                // address clients reach, capacity
  uint32_t initial_size = 1;  // servers the first configuration waits for
  uint32_t num_shards = kDefaultShards;
  // Backups per shard of a new cluster (its first configuration; the
  // configuration then says). 0: no replication.
  uint32_t replicas = 0;
  // The ordered store's split keys of a new cluster (config.h, "ordered
  // shards"); nullopt: none. A cluster already formed with other splits,
  // or without, cannot take this server (Start: Conflict); one that formed
  // while it started is followed as formed (a warning is logged).
  std::optional<std::vector<std::string>> tree_splits;
  // The member lease the manager grants (member_lease.h).
  std::chrono::milliseconds lease{500};
  std::chrono::milliseconds session_timeout{10000};  // ZooKeeper's
  // How long Start waits for the first ZooKeeper session (at least the
  // session timeout): ZooKeeper may be starting too, or slow to answer on a
  // loaded machine, and a server that exited would have to be started
  // again by hand.
  std::chrono::milliseconds first_session_wait{10000};
  // Shards moved per step of a rebalance.
  uint32_t max_moves = 64;
  // The share (percent, 1-100) of the time a step's copy may keep the
  // servers busy: after each page exported and imported, the manager waits
  // (100 - share) / share times as long as the page took, so the servers
  // keep serving clients meanwhile. 100: no wait. The writes' pause at the
  // end of a step is not paced.
  uint32_t move_share = 25;
  // Testing: the manager kills its own process (SIGKILL) right after it
  // records a step's handoff, before any release: the one point of a move
  // a successor must finish without the old owner.
  bool fault_kill_after_handoff = false;
  // Testing: the manager holds each step this long once the shards are
  // copied and their changes sent, before it freezes them: clients meet a
  // move whose new owners hold the copies while the old ones still write.
  // (Unreplicated clusters: a replicated one hands shards over to backups
  // that hold them, without copies.)
  std::chrono::milliseconds fault_move_hold{0};
  // For the manager's sessions to members, its own server included
  // (secret, transport, timeout).
  SessionOptions session;
};

class ClusterMember {
 public:
  // Connects to ZooKeeper (waiting at most the longer of the session
  // timeout and first_session_wait), creates the cluster's nodes if missing,
  // opens a session (options.session's secret) to a registered member, if
  // any answers, and starts the member's thread, which registers and
  // follows the configuration. Errors: InvalidArgument (bad options),
  // Unavailable (ZooKeeper unreachable), Conflict (the cluster at PATH was
  // formed with another shard count or other split keys), Corruption (an
  // unreadable configuration at PATH), PermissionDenied (a member refused
  // this server's shared secret: it would be given copies it can never
  // receive). Nothing is registered on an error.
  static Result<std::unique_ptr<ClusterMember>> Start(MemberOptions options,
                                                      Ownership* ownership);
  // Leaves the cluster: Stop, then closes the ZooKeeper session, so its
  // ephemeral nodes (registration, election) go at once.
  ~ClusterMember();
  // Ends the member's thread (as manager, a move in progress stops where
  // it is; a successor resumes it) and closes its sessions to members,
  // but keeps the ZooKeeper session: the member stays registered until
  // the destructor, so a stopping server has stopped serving before the
  // cluster sees it leave. Call it before the server stops serving (one
  // of those sessions is to this server, whose threads wait at shutdown
  // for their sessions to close). From the owner's thread; the destructor
  // calls it too.
  void Stop();
  ClusterMember(const ClusterMember&) = delete;
  ClusterMember& operator=(const ClusterMember&) = delete;

  // Asks the manager to move every shard away from the member at
  // `address` (remem cluster drain): recorded in ZooKeeper by this
  // member's thread, which then calls done with the incarnation drained
  // (the one registered at `address` then; 0 if none was), or done(error):
  // Unsupported if too few undrained servers would be left for the
  // shards' copies, the ZooKeeper error if ZooKeeper refused it (while
  // ZooKeeper is unreachable the request waits; a member that stops drops
  // it, and `done` with it). The drain
  // goes on while that incarnation is registered.
  void RequestDrain(std::string address,
                    util::MoveFunction<void(Result<uint64_t>)> done);

  // As manager: grants a member's lease (core method kClusterLease; the
  // request and reply are LeaseAsk and LeaseGrant, cluster/config.h).
  // Conflict if this member is not the manager, Unavailable while its
  // ZooKeeper session may have expired, Busy with no configuration yet or
  // while a failover is being recorded, ProtocolError for a malformed
  // request. Thread-safe.
  Result<std::string> GrantLease(std::string_view request);
  // The manager's address as this member last read it from the election
  // ("" while unknown). Thread-safe.
  std::string manager_address() const;

  bool manager() const { return manager_.load(std::memory_order_relaxed); }
  // As manager: shards moved, and the last step's duration.
  uint64_t shards_moved() const {
    return shards_moved_.load(std::memory_order_relaxed);
  }
  // As manager: ordered ranges moved, and range moves given up because
  // the new owner could not hold the range (not tried there again).
  uint64_t ranges_moved() const {
    return ranges_moved_.load(std::memory_order_relaxed);
  }
  uint64_t ranges_refused() const {
    return ranges_refused_.load(std::memory_order_relaxed);
  }
  uint64_t last_step_ms() const {
    return last_step_ms_.load(std::memory_order_relaxed);
  }
  // As manager: how long the last step's shards refused writes (from their
  // freeze to the configuration that names their new owners).
  uint64_t last_pause_ms() const {
    return last_pause_ms_.load(std::memory_order_relaxed);
  }
  // Testing (fault_move_hold): the steps this manager has begun to hold.
  uint64_t moves_held() const {
    return moves_held_.load(std::memory_order_relaxed);
  }
  // As manager: configurations written to fail members over.
  uint64_t failovers() const {
    return failovers_.load(std::memory_order_relaxed);
  }
  // As manager: backups made whole by re-replication (shard copies), and
  // how long the last round took.
  uint64_t shards_filled() const {
    return shards_filled_.load(std::memory_order_relaxed);
  }
  uint64_t last_fill_ms() const {
    return last_fill_ms_.load(std::memory_order_relaxed);
  }
  uint64_t pairs_moved() const {
    return pairs_moved_.load(std::memory_order_relaxed);
  }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  bool registered() const {
    return registered_.load(std::memory_order_relaxed);
  }
  uint32_t members_seen() const {
    return members_seen_.load(std::memory_order_relaxed);
  }
  // Why a cluster still forming has no configuration yet, as this member
  // sees it (for the Busy answer to a client): ZooKeeper not reached, this
  // server not registered, or how many of the --cluster-size servers have
  // registered. Any thread.
  std::string FormingState() const;
  uint64_t sessions() const {
    return sessions_.load(std::memory_order_relaxed);
  }

 private:
  ClusterMember(MemberOptions options, Ownership* ownership);
  static void OnEvent(zhandle_t* zh, int type, int state, const char* path,
                      void* ctx);
  // A new ZooKeeper session; waits until connected, at most `wait`.
  Status Connect(std::chrono::milliseconds wait);
  void Run();
  bool Step();  // one pass; false: the session is gone
  bool Register();
  // Register's search of the election for a node this ZooKeeper session
  // made already: a create whose answer was lost (an operation timeout or
  // a lost connection after ZooKeeper made the node) leaves one, which
  // would stand before the node made next and, since it lives as long as
  // the session, keep this server from ever being the manager while no
  // other takes its place. Adopts the first (election_node_), deletes any
  // other; false if ZooKeeper could not be read (ask again next pass).
  bool AdoptOwnElectionNode();
  // Register's case of a registration at this address held by another
  // ZooKeeper session (`record`, at node version `version`, of session
  // `owner`): if it is an earlier incarnation of this server, this server's
  // address now reaches this incarnation, and a member lease and its
  // margin have passed since it first did, deletes it and its election
  // node (true); otherwise false (wait, and ask again at the next pass).
  bool ReplacePredecessor(const std::string& record, int32_t version,
                          int64_t owner);
  void FollowConfig();
  void ManagerDuty();
  // Start's check, before it makes any node, that PATH is neither inside
  // another cluster's nodes nor above one (a cluster's root is a node with
  // `members` and `election` beneath it): InvalidArgument naming that
  // cluster; Unavailable if ZooKeeper does not answer before `until`.
  // At most kMaxNestingLookups nodes below PATH are looked at.
  Status CheckNotNested(std::chrono::steady_clock::time_point until);
  // Start's check that the cluster's members take this server's secret:
  // PermissionDenied (naming --auth-file) from the first registered member
  // that refuses it; OK once one accepts it, or if none answers before
  // `until` (nobody to ask: a forming cluster, or its members down).
  Status CheckSecret(std::chrono::steady_clock::time_point until);
  // As manager: false for a member that refuses this manager's sessions
  // with PermissionDenied (another --auth-file): it is given no role, and
  // a warning says so once per incarnation. Asked once per incarnation of
  // a member that is not in the configuration `have` (nullptr: none yet);
  // any other failure to connect admits it as before (a slow member).
  bool Admissible(const Member& m, const Config* have);
  // Warns once that `c`, the cluster's configuration, has other `replicas`
  // than --replicas (if given): a cluster keeps those it formed with,
  // whoever formed it (this server's thread's, or Start's).
  void WarnOtherReplicas(const Config& c);
  // Reads the manager's address from the first election node (`first`, or
  // the first there is), for manager_address(). A first node that this
  // session made besides election_node_ is deleted instead (see
  // AdoptOwnElectionNode).
  void FollowManager(std::string first = "");
  void Wake();
  // A member whose lease was not asked for within this long is failed
  // over: the lease plus kLeaseMarginNs (for the clocks' reading and the
  // ask's way to the manager, which only makes the member's own expiry
  // earlier).
  static constexpr uint64_t kLeaseMarginNs = 50'000'000;
  uint64_t SuspectAfterNs() const;
  // The manager's share of moving shards (see above).
  void Rebalance(const std::vector<Member>& live);
  // Drain records (ZooKeeper's drain/ADDRESS) hold the incarnation of the
  // server they drain: one is stale once another incarnation is registered
  // at that address (the drained server stopped and started again before
  // a manager saw it leave; a manager that died meanwhile never did), and
  // is deleted here and taken out of `drained`: the server that came back
  // is a new member, not drained. `registered`: the members in ZooKeeper.
  void ForgetStaleDrains(std::vector<std::string>* drained,
                         const std::vector<Member>& registered);
  // The manager's duty in a replicated cluster (above); `registered`: the
  // members in ZooKeeper.
  void FailOver(const std::vector<Member>& registered);
  // Once nobody is to be failed over (replicated clusters): the hand-overs
  // under way, the drain's steps (DrainStep), else re-replication and
  // balancing (Replenish), from
  // configuration `c` at ZooKeeper version `version`; `live`: the members
  // holding leases, `registered`: those in ZooKeeper.
  void Reshape(const Config& c, int version, const std::vector<Member>& live,
               const std::vector<Member>& registered);
  // Hands the moving shards of `moving` over to the backups its `next`
  // names (a drain or balancing): freeze at each owner until its backups
  // hold all its writes, then CompleteMoves.
  Status HandOverToBackups(const Config& moving, int version);
  // Writes a drain or balancing step (`why`) over ZooKeeper version
  // `version`, logs it and follows it.
  void WriteStep(const Config& step, int version, const char* why);
  // Re-replication (above), and once no shard is short of copies a
  // balancing step (BalanceReplicas); `live`: the members holding leases
  // and registered, of which those `drained` take no copies.
  void Replenish(const Config& c, int version, const std::vector<Member>& live,
                 const std::vector<std::string>& drained);
  // Step 2 of the moves of `moving`: copy each moving shard to its next
  // owner and freeze it at its owner.
  // Waits out the rest of a copy page's time slice (move_share).
  // Unavailable if a server of the moves of `moving` is registered as
  // another incarnation meanwhile (looked at every 250 ms), or this one
  // stops.
  Status Pace(const Config& moving, std::chrono::steady_clock::duration busy);
  Status CopyMoving(const Config& moving);
  // Step 3: release at the owners, install CompleteMoves(moving).
  Status HandOver(const Config& moving, int zk_version);
  // A hash service call to `address` at configuration `epoch`, retried
  // while the member answers Busy (it has not installed `epoch` yet) or
  // cannot be reached, for at most the session timeout, or `quick` if set
  // (the calls of a replicated cluster's manager, which must keep judging
  // leases). A member that cannot be reached and is no longer registered
  // in ZooKeeper (its session ended: it died) ends the call at once.
  Result<std::string> Call(
      const std::string& address, uint32_t epoch, uint8_t method,
      std::string payload,
      std::chrono::milliseconds quick = std::chrono::milliseconds(0));
  // Call, to the ordered store's service (tree/wire.h).
  Result<std::string> CallTree(const std::string& address, uint32_t epoch,
                               uint8_t method, std::string payload);
  Result<std::string> CallService(uint8_t service, const std::string& address,
                                  uint32_t epoch, uint8_t method,
                                  std::string payload,
                                  std::chrono::milliseconds quick);
  // The configuration in ZooKeeper and its node's version, or nullopt if
  // it cannot be read or decoded.
  std::optional<Config> ReadConfig(int* version);
  // Writes `next` over the configuration at ZooKeeper version `version`.
  Status WriteConfig(const Config& next, int version);

  const MemberOptions options_;
  Ownership* const ownership_;
  zhandle_t* zh_ = nullptr;  // the member's thread's, after Start
  std::string election_node_;
  bool config_seen_ = false;
  // The configuration's ordered ranges differ from --tree-splits (logged
  // once).
  bool splits_warned_ = false;
  // The cluster's `replicas` differ from --replicas (logged once, by
  // WarnOtherReplicas).
  bool replicas_warned_ = false;
  bool was_connected_ = true;  // the member's thread's
  // Register's wait for a predecessor's registration, logged once; and
  // when ReplacePredecessor first found this incarnation answering at its
  // address (0: not yet). The member's thread's.
  bool waiting_logged_ = false;
  uint64_t predecessor_gone_ns_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool event_ = false;
  bool stop_ = false;
  std::atomic<int> state_{0};  // ZooKeeper's session state

  std::atomic<bool> manager_{false};
  // When this member last became manager (LeaseClockNs), and when a
  // ZooKeeper call last succeeded.
  std::atomic<uint64_t> manager_since_ns_{0};
  std::atomic<uint64_t> zk_ok_ns_{0};
  // The session timeout ZooKeeper granted (zoo_recv_timeout), in ms: the
  // lease window is bounded by it (GrantLease).
  std::atomic<uint64_t> session_granted_ms_{UINT64_MAX};
  // When this manager last refused a lease (0: never).
  std::atomic<uint64_t> refused_ns_{0};
  std::atomic<uint64_t> failovers_{0};
  // As manager, under lease_mu_: when each member last asked for its lease
  // (LeaseClockNs), and with which incarnation; grants wait while a
  // failover's configuration is written (no grant on the configuration it
  // replaces).
  struct Renewal {
    uint64_t incarnation = 0;
    uint64_t at_ns = 0;
    bool asked = false;  // false: first seen in the configuration at at_ns
  };
  mutable std::mutex lease_mu_;
  std::map<std::string, Renewal> renewals_;
  uint32_t grants_from_epoch_ = 0;
  std::string manager_address_;  // under lease_mu_
  std::atomic<bool> connected_{false};
  std::atomic<bool> registered_{false};
  std::atomic<uint32_t> members_seen_{0};
  std::atomic<uint64_t> sessions_{0};
  std::atomic<uint64_t> shards_moved_{0};
  std::atomic<uint64_t> ranges_moved_{0};
  std::atomic<uint64_t> last_step_ms_{0};
  std::atomic<uint64_t> last_pause_ms_{0};
  std::atomic<uint64_t> moves_held_{0};
  std::atomic<uint64_t> pairs_moved_{0};
  // Range moves whose new owner could not hold the range: not tried
  // again by this manager while that member runs the same incarnation
  // (the member's thread).
  std::vector<RefusedMove> refused_ranges_;
  // The current step's import of a range failed with OutOfMemory (the
  // member's thread).
  bool range_import_full_ = false;
  std::atomic<uint64_t> ranges_refused_{0};
  // The current step (the member's thread): pairs copied, and when its
  // shards were frozen.
  uint64_t step_pairs_ = 0;
  std::chrono::steady_clock::time_point frozen_at_;
  // Where a step's write pause went (ms; the log line of each step).
  struct PauseParts {
    uint64_t last_changes = 0;  // the frozen shards' last changes sent
    uint64_t handoff = 0;       // the handoff recorded in ZooKeeper
    uint64_t release = 0;       // the old owners deleting their copies
    uint64_t config = 0;        // the new configuration written
  };
  PauseParts pause_parts_;
  // Under mu_.
  std::vector<
      std::pair<std::string, util::MoveFunction<void(Result<uint64_t>)>>>
      drain_requests_;
  // Member records that did not decode, warned about once each (the
  // member's thread).
  std::set<std::string> bad_records_;
  // Admissible's verdicts, by address: the incarnation asked about and
  // whether it took the manager's secret (the member's thread).
  std::map<std::string, std::pair<uint64_t, bool>> admitted_;
  // The manager's sessions, by address (the member's thread only), and
  // those of its quick calls.
  std::map<std::string, std::unique_ptr<Session>> sessions_to_;
  std::map<std::string, std::unique_ptr<Session>> quick_sessions_;
  // Sessions Call opened to each address (either map): a copy that had to
  // connect again to a member may have lost it to a restart.
  std::map<std::string, uint64_t> connects_;
  // Re-replication (the member's thread): the epoch of the configuration
  // this manager wrote last, the epoch of its round (0: none), and when the
  // round's copies started.
  uint32_t written_epoch_ = 0;
  uint32_t fill_epoch_ = 0;
  std::chrono::steady_clock::time_point fill_started_;
  std::atomic<uint64_t> shards_filled_{0};
  std::atomic<uint64_t> last_fill_ms_{0};
  std::thread thread_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_MEMBER_H_
