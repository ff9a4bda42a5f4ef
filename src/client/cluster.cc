// The cluster client (include/remem/cluster.h): routing by the
// configuration a server hands out, one HashStore per server on one
// EventLoop, refresh-and-retry on Moved.

#include "remem/cluster.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "client/rpc_client.h"
#include "client/session_core.h"
#include "cluster/config.h"
#include "ops/apply.h"
#include "proto/buffer.h"
#include "proto/wire.h"
#include "tree/codec.h"
#include "tree/layout.h"
#include "tree/search.h"
#include "util/socket.h"

namespace remem {

namespace {

using Clock = std::chrono::steady_clock;

// While Drain waits, it asks this often who answers at the drained
// server's address, each time within kDrainProbeWait (a paused server
// accepts the connection and never answers).
constexpr auto kDrainProbeEvery = std::chrono::milliseconds(250);
constexpr auto kDrainProbeWait = std::chrono::milliseconds(500);

const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

bool IsMoved(const Status& s) { return s.code() == StatusCode::kMoved; }
// A member without a configuration yet (restarted, or the cluster forming).
bool IsBusy(const Status& s) { return s.code() == StatusCode::kBusy; }
bool Retryable(const Status& s) { return IsMoved(s) || IsBusy(s); }
// The client's event loop stalled under the operation (Worker::
// receive_stalled): the server may be well.
bool LostToStall(const Status& s) {
  return s.code() == StatusCode::kUnavailable &&
         s.message().find(fabric::Worker::StalledStatus().message()) !=
             std::string::npos;
}

// A server-side operation that changes nothing (a reduction or a filter):
// asked again after a failover, as a get is.
bool ReadsOnly(const Op& op) { return !ops::MayWrite(op.kind); }

}  // namespace

Result<std::vector<std::string>> ParseSeeds(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view one = list.substr(0, comma);
    while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
    while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
    if (!one.empty()) {
      if (one.find(':') == std::string_view::npos) {
        return Status::InvalidArgument("a seed is host:port; got '" +
                                       std::string(one) + "'");
      }
      out.emplace_back(one);
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  if (out.empty()) {
    return Status::InvalidArgument("no seed servers given (host:port,...)");
  }
  return out;
}

struct Cluster::Impl {
  struct Server {
    std::unique_ptr<Session> session;
    std::unique_ptr<HashStore> store;
    // Its gets as a replica (ReadFrom::kAnyReplica), opened at first use.
    std::unique_ptr<HashStore> replica;
    std::unique_ptr<OpsStore> ops;
    std::unique_ptr<TreeStore> tree;
    bool opening_tree = false;  // TreeOf is opening it (a call that waits)
  };

  ClusterOptions options;
  std::unique_ptr<EventLoop> loop;
  cluster::Config config;
  Info info;
  // By address. Stores before sessions, sessions before the loop.
  std::map<std::string, Server> servers;
  // Per member index, its entry in `servers` once looked up (entries never
  // move): the per-operation route without a map lookup.
  std::vector<Server*> member_servers;
  // Servers a connection to failed (Unavailable, TimedOut): until when
  // Connected answers with that error without trying again.
  std::map<std::string, std::pair<Clock::time_point, Status>> unreachable;
  static constexpr auto kUnreachableFor = std::chrono::milliseconds(20);
  RouteStats stats;
  // Read counters of stores closed since (a server that went away, a read
  // path that changed): route_stats counts them too.
  RouteStats dropped;
  // The same for the ordered store (ClusterTree::read_stats).
  TreeStore::ReadStats dropped_tree;
  size_t in_flight = 0;
  Status first_error;
  bool stale = false;
  // Stale for refusals that said Busy again and again: the refresh looks
  // past answers no newer than the configuration installed (Refresh's
  // until_newer).
  bool stale_busy = false;
  // The ordered store's client (Cluster::Tree), and its options.
  std::unique_ptr<ClusterTree> tree;
  TreeOptions tree_options;
  // Operations refused with Moved, issued again at the next Poll (after a
  // refresh), and callbacks of operations that failed before being sent.
  std::vector<std::function<void()>> later;
  // Operations refused with Busy (a shard being handed over, a member
  // installing a configuration), each issued again at the first Poll after
  // its time: a growing pause, so a hand-over is not met with a storm of
  // retries.
  std::vector<std::pair<Clock::time_point, std::function<void()>>> waiting;

  ~Impl() {
    // No new session from a callback of those closing (Connected).
    closing = true;
    BuryDead();
    for (auto& [addr, s] : servers) {
      s.tree.reset();
      s.ops.reset();
      s.replica.reset();
      s.store.reset();
    }
    servers.clear();
    BuryDead();
    loop.reset();
  }
  bool closing = false;

  // Sessions of servers that went away, with their stores (Connected):
  // destroyed by BuryDead at the start of a Poll that no other call of
  // this client's encloses (`depth`: Polls and store openings under way).
  // Event loops given up (ReplaceLoop), destroyed by BuryDead after their
  // sessions (and declared before them: destroyed after them).
  std::vector<std::unique_ptr<EventLoop>> dead_loops;
  std::vector<Server> dead;
  int depth = 0;
  void BuryDead() {
    // Callbacks run here: a Poll they call must not bury what is being
    // buried.
    ++depth;
    BuryDeadNow();
    --depth;
  }
  void BuryDeadNow() {
    for (;;) {
      while (!dead.empty()) {
        // Their destructors may add more (a callback reaching Connected).
        std::vector<Server> now = std::move(dead);
        dead.clear();
        for (Server& s : now) {
          if (s.tree) AddTreeReads(*s.tree, &dropped_tree);
          s.tree.reset();
          s.ops.reset();
          s.replica.reset();
          s.store.reset();
          s.session.reset();
        }
      }
      if (dead_loops.empty()) return;
      // What the sessions' teardown completed runs on their loop, before
      // it goes (the callbacks may issue operations anew, on `loop`).
      std::vector<std::unique_ptr<EventLoop>> now = std::move(dead_loops);
      dead_loops.clear();
      for (auto& l : now) {
        while (l->Poll() > 0) {
        }
      }
    }
  }

  // The loop, and loops given up whose sessions are not destroyed yet:
  // what their teardown completes runs there.
  size_t PollLoops() {
    // A Poll from a callback run here must not destroy a loop being polled.
    ++depth;
    size_t n = loop->Poll();
    for (size_t i = 0; i < dead_loops.size(); ++i) n += dead_loops[i]->Poll();
    --depth;
    return n;
  }

  // The loop's shared-memory receive queue is blocked for good: a server
  // died while sending to it (remem/session.h, EventLoop::stalled). Every
  // server is reached again through a new loop; the sessions on the old
  // one (failed, or failing at their next look: their operations end with
  // the stall's Unavailable, reads retried) go to `dead`, and the old loop
  // after them.
  uint64_t loop_generation = 0;  // ReplaceLoops so far
  Status ReplaceLoop() {
    auto fresh = EventLoop::Create(options.session.transport);
    if (!fresh.ok()) return fresh.status();
    dead_loops.push_back(std::move(loop));
    loop = std::move(*fresh);
    ++stats.loops_replaced;
    ++loop_generation;
    for (auto& [addr, s] : servers) {
      if (!s.session) continue;
      if (s.store) AddReads(*s.store, &dropped);
      if (s.replica) AddReads(*s.replica, &dropped);
      dead.push_back(std::move(s));
      s = Server{};
    }
    return Status::OK();
  }

  // Adds a store's read counters to `to`.
  static void AddReads(const HashStore& store, RouteStats* to) {
    const HashStore::ReadStats& r = store.read_stats();
    to->onesided_gets += r.onesided_gets;
    to->rpc_gets += r.rpc_gets;
    to->unreplicated += r.unreplicated;
  }
  // Adds a TreeStore's read counters to `to`.
  static void AddTreeReads(const TreeStore& tree, TreeStore::ReadStats* to) {
    const TreeStore::ReadStats& r = tree.read_stats();
    to->onesided_gets += r.onesided_gets;
    to->rpc_gets += r.rpc_gets;
    to->onesided_scans += r.onesided_scans;
    to->rpc_scans += r.rpc_scans;
    to->split_scans += r.split_scans;
    to->reads += r.reads;
    to->retries += r.retries;
    to->fallbacks += r.fallbacks;
    to->unvouched += r.unvouched;
    to->cache_hits += r.cache_hits;
    to->moves_right += r.moves_right;
    to->leaves_read_ahead += r.leaves_read_ahead;
    to->leaves_read_ahead_unused += r.leaves_read_ahead_unused;
  }
  // Closes a server's store; its read counters stay in route_stats.
  void DropStore(Server& s) {
    if (s.replica) AddReads(*s.replica, &dropped);
    s.replica.reset();
    if (!s.store) return;
    AddReads(*s.store, &dropped);
    s.store.reset();
  }
  // The server's store for gets as a replica (opened at first use).
  Result<HashStore*> ReplicaOf(Server* server) {
    if (!server->replica) {
      HashOptions ho = options.hash;
      ho.read_any_replica = true;
      auto store = HashStore::Open(server->session.get(), ho);
      if (!store.ok()) return store.status();
      server->replica = std::move(*store);
    }
    return server->replica.get();
  }
  // ReadFrom::kAnyReplica: the member a get of `key` goes to, taking the
  // shard's whole copies (its primary, then its ready and retiring backups)
  // in turn; the owner otherwise. The turn starts anywhere: a client that
  // makes one get (a CLI command) reads a backup as often as the primary.
  uint32_t replica_turn = std::random_device{}();
  uint16_t ReadTarget(std::string_view key) {
    const uint32_t s = cluster::ShardOf(key, config.num_shards());
    const uint16_t owner = config.owner[s];
    if (options.read_from != ReadFrom::kAnyReplica || config.replicas == 0) {
      return owner;
    }
    uint16_t copies[cluster::kMaxReplicas + 2] = {owner};
    size_t n = 1;
    for (uint32_t i = 0; i < config.replicas; ++i) {
      const size_t at = size_t(s) * config.replicas + i;
      const uint16_t b = config.backups[at];
      if (b != cluster::kNoMember && !config.FillingAt(at)) copies[n++] = b;
    }
    if (config.RetiringOf(s) != cluster::kNoMember) {
      copies[n++] = config.RetiringOf(s);
    }
    return copies[replica_turn++ % n];
  }
  // A synchronous get (fn, on a store) from the copy ReadTarget picks, if
  // that is not the owner: its answer if the copy gave one (a value, or
  // NotFound), else nullopt (the caller asks the owner).
  template <typename R, typename Fn>
  std::optional<R> FromReplica(std::string_view key, Fn fn) {
    if (options.read_from != ReadFrom::kAnyReplica || config.replicas == 0) {
      return std::nullopt;
    }
    const uint16_t target = ReadTarget(key);
    if (target == OwnerIndex(key)) return std::nullopt;
    ++stats.replica_gets;
    auto server = ServerOfMember(target);
    if (server.ok()) {
      auto store = ReplicaOf(*server);
      if (store.ok()) {
        R r = fn(*store);
        const Status& st = StatusOf(r);
        if (st.ok() || st.code() == StatusCode::kNotFound) return r;
      }
    }
    ++stats.replica_refused;
    return std::nullopt;
  }

  // The members' addresses, a copy (a loop that connects to each may
  // install a new configuration on the way).
  std::vector<std::string> MemberAddresses() const {
    std::vector<std::string> out;
    for (const auto& m : config.members) out.push_back(m.address);
    return out;
  }

  void Install(cluster::Config c) {
    config = std::move(c);
    for (size_t i = 0; i < config.members.size(); ++i) {
      if (config.HoldsAnyRole(int(i))) {
        held_roles.emplace(config.members[i].address,
                           config.members[i].incarnation);
      }
    }
    // A session opened before the configuration was known (a seed's, to
    // fetch it) reads as the configuration says.
    for (auto& [addr, s] : servers) {
      if (s.session && SetReadPath(addr, s.session->core())) {
        s.ops.reset();  // opened again with the read path that goes with it
        DropStore(s);
      }
    }
    info.name = config.name;
    info.epoch = config.epoch;
    info.num_shards = config.num_shards();
    info.nodes.clear();
    for (size_t i = 0; i < config.members.size(); ++i) {
      info.nodes.push_back({config.members[i].address,
                            config.members[i].capacity, config.ShardsOf(int(i)),
                            0, 0, config.members[i].domain});
    }
    info.replicas = config.replicas;
    info.shard_backups.assign(config.backups.size(), -1);
    info.shard_filling.assign(config.backups.size(), 0);
    for (size_t i = 0; i < config.backups.size(); ++i) {
      const uint16_t b = config.backups[i];
      if (b == cluster::kNoMember) continue;
      info.shard_backups[i] = b;
      ++info.nodes[b].backups;
      if (config.FillingAt(i)) {
        info.shard_filling[i] = 1;
        ++info.nodes[b].filling;
      }
    }
    info.filling = config.filling_shards();
    info.shard_retiring.assign(config.num_shards(), -1);
    for (uint32_t s = 0; s < config.num_shards(); ++s) {
      const uint16_t r = config.RetiringOf(s);
      if (r == cluster::kNoMember) continue;
      info.shard_retiring[s] = r;
      ++info.nodes[r].backups;
    }
    info.shard_owner.assign(config.owner.begin(), config.owner.end());
    info.shard_next.assign(config.num_shards(), -1);
    for (uint32_t s = 0; s < config.num_shards(); ++s) {
      const uint16_t n = config.NextOf(s);
      if (n != cluster::kNoMember) info.shard_next[s] = n;
    }
    info.moving = config.moving();
    info.splits = config.splits;
    info.range_owner.assign(config.range_owner.begin(),
                            config.range_owner.end());
    for (uint16_t o : config.range_owner) ++info.nodes[o].ranges;
    info.range_next.assign(config.num_ranges(), -1);
    for (uint32_t r = 0; r < config.num_ranges(); ++r) {
      const uint16_t n = config.RangeNextOf(r);
      if (n != cluster::kNoMember) info.range_next[r] = n;
    }
    info.moving_ranges = config.moving_ranges();
    info.range_carrier.clear();
    if (config.replicas > 0) {
      for (uint32_t r = 0; r < config.num_ranges(); ++r) {
        info.range_carrier.push_back(config.CarrierOf(r));
      }
    }
    member_servers.assign(config.members.size(), nullptr);
    for (auto& [addr, s] : servers) {
      if (s.session) s.session->core()->rpc()->set_epoch(config.epoch);
    }
  }

  // The connected server at `addr`, connecting to it if need be (ConnectTo;
  // `limit`: the connection's deadline if sooner than the session
  // timeout); Unavailable if it could not be reached, in time or at all
  // (remembered for kUnreachableFor, unless only `limit` ran out). `addr` is a
  // copy: callers pass a member's address in `config`, which a configuration
  // fetched while connecting replaces.
  Result<Server*> Connected(
      std::string addr,
      std::optional<std::chrono::milliseconds> limit = std::nullopt) {
    if (closing) return Status::Unavailable("the cluster client is closing");
    if (loop->stalled()) REMEM_RETURN_IF_ERROR(ReplaceLoop());
    auto it = servers.find(addr);
    if (it != servers.end() && it->second.session) {
      Server& s = it->second;
      Session* was = s.session.get();
      // On a session that broke, connected() fails the operations in
      // flight, whose callbacks may come back here (for this address too).
      const bool up = was->connected();
      if (s.session.get() != was) {
        if (s.session) return &s;  // a callback connected anew meanwhile
      } else if (up) {
        return &s;
      } else {
        // The server went away: start over with a new session. The old one
        // and its stores are not destroyed here: their destructors fail
        // what is still on them, and those callbacks may issue operations
        // that come back here while a caller up the stack (the session's
        // failure handling, a store's destructor) still uses them. The
        // outermost Poll destroys them (BuryDead), outside any callback.
        if (s.store) AddReads(*s.store, &dropped);
        if (s.replica) AddReads(*s.replica, &dropped);
        dead.push_back(std::move(s));
        s = Server{};
      }
    }
    // A server that could not be reached a moment ago is not asked again
    // at once: operations retried while its shards fail over would each
    // connect to it, one after another.
    if (auto down = unreachable.find(addr); down != unreachable.end()) {
      if (Clock::now() < down->second.first) return down->second.second;
      unreachable.erase(down);
    }
    auto session = ConnectTo(addr, limit);
    if (!session.ok() && loop->stalled()) {
      // The loop stalled under the handshake (its wait ends then): once
      // more on a new one.
      REMEM_RETURN_IF_ERROR(ReplaceLoop());
      session = ConnectTo(addr, limit);
    }
    if (!session.ok()) {
      Status st = session.status();
      // Not connected in time is not reached: nothing was sent (so in a
      // replicated cluster an operation waits for the failover, within its
      // deadline, as when the connection is refused).
      const bool timed_out = st.code() == StatusCode::kTimedOut;
      if (timed_out) st = Status::Unavailable(st.message());
      // Remembered only if it had the session's whole timeout: one not
      // connected within a shorter `limit` (a Refresh's kNewestConnect) may
      // just be slow, and was only passed over.
      const bool cut_short =
          timed_out && limit && *limit < options.session.timeout;
      if (st.code() == StatusCode::kUnavailable && !cut_short) {
        unreachable[addr] = {Clock::now() + kUnreachableFor, st};
      }
      return st;
    }
    ++stats.connects;
    Server& s = servers[addr];
    s.session = std::move(*session);
    client::SessionCore* core = s.session->core();
    core->rpc()->set_epoch(config.epoch);
    core->SetSlowCallHook(kSuspectAfter,
                          [this, addr, core] { SuspectServer(addr, core); });
    SetReadPath(addr, core);
    return &s;
  }

  // A new session to `addr`, within the session timeout (or `limit`). A
  // server that is paused or cut off accepts the TCP connection and never
  // answers the handshake, so in a replicated cluster the handshake gets
  // kSuspectAfter at first, then twice as long each time: when it runs
  // out, the configuration is fetched from the servers already connected
  // (as SuspectServer does for a call), and a server that holds no role in
  // it any more (failed over) is given up (Unavailable: the operation goes
  // to the new owner); one that still does is tried again, to the
  // deadline. A server only slow to answer is connected to on a later try.
  Result<std::unique_ptr<Session>> ConnectTo(
      const std::string& addr, std::optional<std::chrono::milliseconds> limit) {
    using std::chrono::milliseconds;
    SessionOptions so = options.session;
    so.server = addr;
    const auto deadline =
        Clock::now() + (limit ? std::min(*limit, so.timeout) : so.timeout);
    milliseconds step = kSuspectAfter;
    for (;;) {
      const milliseconds left =
          std::max(milliseconds(1),
                   std::chrono::ceil<milliseconds>(deadline - Clock::now()));
      const bool suspect = config.replicas > 0 && !suspecting;
      const bool last = !suspect || step >= left;
      so.connect_timeout = last ? left : step;
      auto session = Session::Connect(so, loop.get());
      if (session.ok() || session.status().code() != StatusCode::kTimedOut ||
          last || loop->stalled()) {
        return session;
      }
      suspecting = true;
      (void)Refresh(addr);
      suspecting = false;
      const int i = config.IndexOf(addr);
      if (i < 0 || !config.HoldsAnyRole(i)) {
        ++stats.suspected;
        return Status::Unavailable(
            addr + " did not answer within " + std::to_string(step.count()) +
            " ms and holds no role in configuration epoch " +
            std::to_string(config.epoch) + " (failed over or drained)");
      }
      step *= 2;
    }
  }

  // In a replicated cluster, a call that waited kSuspectAfter on a server
  // has the configuration fetched (from the other servers this client is
  // connected to: Refresh with `skip`); if the server held a role and holds
  // none in it (failed over, or gone), its session fails, so what waited on
  // it ends now, not at its deadline: reads are asked again of the new
  // owner, writes end Unavailable (their outcome unknown). A paused or
  // cut-off server never answers, and nothing else would tell.
  static constexpr auto kSuspectAfter = std::chrono::milliseconds(250);
  bool suspecting = false;
  // Members (address, incarnation) that an installed configuration gave a
  // role: SuspectServer judges only those.
  std::set<std::pair<std::string, uint64_t>> held_roles;
  void SuspectServer(const std::string& addr, client::SessionCore* core) {
    if (config.replicas == 0 || suspecting || closing) return;
    // A member that never held a role here (a new one) answers what it is
    // sent; one that did and holds none now was failed over (or drained:
    // it answers too, but a call it kept 250 ms is given up all the same).
    if (held_roles.count({addr, core->incarnation()}) == 0) return;
    auto holds = [&] {
      const int i = config.IndexOf(addr);
      return i >= 0 &&
             config.members[size_t(i)].incarnation == core->incarnation() &&
             config.HoldsAnyRole(i);
    };
    if (holds()) {
      const uint32_t epoch = config.epoch;
      suspecting = true;
      const Status refreshed = Refresh(addr);
      suspecting = false;
      if (!refreshed.ok() || config.epoch == epoch || holds()) return;
    }
    auto it = servers.find(addr);
    if (it == servers.end() || !it->second.session ||
        it->second.session->core() != core) {
      return;
    }
    ++stats.suspected;
    core->Fail(Status::Unavailable(
        addr + " was failed over (configuration epoch " +
        std::to_string(config.epoch) +
        "): what it did not answer may or may not have taken effect"));
  }

  // How a session's stores read under the configuration: one-sided (or by
  // RPC, as their read path decides), asking the server when a key is
  // absent. A pair read one-sided is returned only if the server's serving
  // mark covers it (hash/layout.h): a member's memory holds pairs of
  // shards it does not lead under the client's configuration (a shard
  // being copied in, a copy left by an abandoned move, one it gave away
  // since), which a client routing by an old configuration must not
  // return; and in a replicated cluster a primary's memory can hold a
  // write its backups do not hold yet, which a failover would lose. The
  // server's lease bounds both reads: shared-memory readers check it
  // (Vouch), and a server that performs one-sided reads (tcp) refuses them
  // once its member lease lapsed. In a replicated cluster the marks are
  // judged by this configuration's epoch only if it names the incarnation
  // the session reached at `addr`: the roles it lists for that address are
  // that process's, not those of one restarted there since (epoch 0: the
  // mark calls the configuration stale, and it is fetched again). An
  // unreplicated member keeps its shards across a restart. True if this
  // changed how the session's stores read.
  bool SetReadPath(const std::string& addr, client::SessionCore* core) const {
    const bool replicated = config.replicas > 0;
    const int m = config.IndexOf(addr);
    core->set_serving_epoch(
        m >= 0 && (!replicated ||
                   config.members[size_t(m)].incarnation == core->incarnation())
            ? config.epoch
            : 0);
    if (core->cluster_routed() && core->serving_checked() &&
        core->serving_versions_checked() == replicated) {
      return false;
    }
    core->set_cluster_routed(true);
    core->set_serving_checked(true, replicated);
    return true;
  }

  // The server's HashStore (opened at first use), and its OpsStore.
  Result<HashStore*> StoreOf(Server* server) {
    if (!server->store) {
      auto store = HashStore::Open(server->session.get(), options.hash);
      if (!store.ok()) return store.status();
      server->store = std::move(*store);
    }
    return server->store.get();
  }
  Result<OpsStore*> OpsOf(Server* server) {
    if (!server->ops) {
      OpsOptions oo;
      oo.reduce_path = config.replicas > 0 ? std::optional(ReadPath::kRpc)
                                           : options.hash.read_path;
      auto ops = OpsStore::Open(server->session.get(), oo);
      if (!ops.ok()) return ops.status();
      server->ops = std::move(*ops);
    }
    return server->ops.get();
  }

  // The server's TreeStore (opened at first use).
  Result<TreeStore*> TreeOf(Server* server) {
    if (!server->tree) {
      // Opening waits for the server, running other operations' callbacks:
      // one that comes back here for this server waits its turn (Busy is
      // asked again).
      if (server->opening_tree) {
        return Status::Busy("the ordered store is being opened");
      }
      server->opening_tree = true;
      Session* session = server->session.get();
      const uint64_t generation = loop_generation;
      ++depth;  // the session stays, even if a callback finds it broken
      // Over a network a replicated cluster's ranges are searched by RPC: a
      // one-sided search costs the server a served read per node, and the
      // leaves a workload's writes just changed are not vouched for until
      // their batch is held, so their search asks the server after (before
      // the tree's mark had a replicated half, YCSB-E over tcp, f = 1: 9.6 k
      // scans/s one-sided against 37 k by RPC). On shared memory the
      // search is left to the read path (it costs the client only:
      // docs/BENCHMARKS.md, "Replication").
      TreeOptions options = tree_options;
      if (config.replicas > 0 && !session->reads_are_local()) {
        options.read_path = ReadPath::kRpc;
        options.scan_path = ReadPath::kRpc;
      }
      auto tree = TreeStore::Open(session, options);
      --depth;
      server->opening_tree = false;
      if (!tree.ok()) return tree.status();
      if (server->session.get() != session) {
        // A callback found the session broken meanwhile (Connected moved
        // it to `dead`, `server` being the map entry, which stays): the
        // store goes with it, destroyed before it.
        for (Server& d : dead) {
          if (d.session.get() == session && !d.tree) {
            d.tree = std::move(*tree);
            break;
          }
        }
        if (loop_generation != generation) {
          return fabric::Worker::StalledStatus();  // reads retry it
        }
        return Status::Unavailable(
            "the server went away while its ordered "
            "store was being opened");
      }
      server->tree = std::move(*tree);
    }
    return server->tree.get();
  }

  Result<HashStore*> StoreFor(const std::string& addr) {
    auto s = Connected(addr);
    if (!s.ok()) return s.status();
    return StoreOf(*s);
  }

  // The connected server of member m: through the per-member cache, else
  // Connected (which connects).
  Result<Server*> ServerOfMember(uint16_t m) {
    Server* s = member_servers[m];
    if (s != nullptr && s->session && s->session->connected()) return s;
    auto c = Connected(config.members[m].address);
    if (c.ok()) member_servers[m] = *c;
    return c;
  }
  uint16_t OwnerIndex(std::string_view key) const {
    return config.owner[cluster::ShardOf(key, config.num_shards())];
  }
  // The owner of `key` for a Store: of its ordered range for a TreeStore
  // (the configuration has ranges: ClusterTree exists only then), else of
  // its shard.
  // OK if the configuration has ordered ranges (a cluster whose ZooKeeper
  // path was made anew could hand out one without): before OwnerFor for a
  // TreeStore.
  Status Ordered() const {
    if (config.ordered()) return Status::OK();
    return Status::Unsupported("cluster " + config.name +
                               " has no ordered store (its servers were "
                               "started without --tree-splits)");
  }
  template <typename Store>
  uint16_t OwnerFor(std::string_view key) const {
    if constexpr (std::is_same_v<Store, TreeStore>) {
      return config.range_owner[config.RangeOf(key)];
    } else {
      return OwnerIndex(key);
    }
  }
  Result<HashStore*> StoreForKey(std::string_view key) {
    auto s = ServerOfMember(OwnerIndex(key));
    if (!s.ok()) return s.status();
    return StoreOf(*s);
  }

  // A member that does not answer a refresh within this long (paused, or
  // cut off) is passed over for the next one; the last is waited for.
  static constexpr auto kRefreshWait = std::chrono::milliseconds(1000);

  // `quick`: even the last server is waited for at most kRefreshWait.
  // `newer`, if given: whether the answer was a newer configuration than
  // the one installed.
  Status FetchFrom(const std::string& addr, bool last, bool quick = false,
                   bool* newer = nullptr) {
    // A server passed over if it does not answer is not waited for to
    // connect either (a paused seed accepts the connection, then is
    // silent).
    auto s = Connected(
        addr, last && !quick
                  ? std::nullopt
                  : std::optional(
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            kRefreshWait)));
    if (!s.ok()) return s.status();
    client::SessionCore* core = (*s)->session->core();
    core->Flush();
    const auto deadline =
        last && !quick
            ? core->Deadline()
            : std::min(core->Deadline(), Clock::now() + kRefreshWait);
    auto bytes = core->rpc()->CallSync(
        proto::kCoreService,
        static_cast<uint8_t>(proto::CoreMethod::kClusterConfig), {}, deadline);
    if (!bytes.ok()) return bytes.status().WithContext(addr);
    auto c = cluster::DecodeConfig(*bytes);
    if (!c.ok()) return c.status().WithContext(addr);
    if (config.epoch > 0 && c->name != config.name) {
      // A seed of another cluster (a list that mixes two): its epochs say
      // nothing about this one's, and a newer one would have moved the
      // client to that cluster for good.
      return Status::Conflict(addr + " is a server of cluster '" + c->name +
                              "', not of this client's cluster '" +
                              config.name + "'");
    }
    ++stats.refreshes;
    if (newer != nullptr) *newer = c->epoch > config.epoch;
    if (c->epoch >= config.epoch) Install(std::move(*c));
    return Status::OK();
  }

  // `skip`: a server not asked (one suspected of not answering); then only
  // the other servers already connected are asked, each for at most
  // kRefreshWait (the slow-call hook runs inside a poll: no connection
  // attempt, no wait for a whole deadline). `until_newer`: an answer no
  // newer than the configuration installed does not end the refresh; the
  // next server is asked, until one gives a newer one (a server that keeps
  // answering Busy may be one cut off from the cluster, which answers with
  // the configuration it was cut off with, while the others moved on).
  Status Refresh(const std::string& skip = {}, bool until_newer = false) {
    Status last = Status::Unavailable("no server to ask");
    // Servers already connected first, then the members, then the seeds;
    // each once (a server that does not answer costs a wait each time).
    std::vector<std::string> order;
    auto add = [&order, &skip](const std::string& addr) {
      if (addr != skip &&
          std::find(order.begin(), order.end(), addr) == order.end()) {
        order.push_back(addr);
      }
    };
    for (auto& [addr, s] : servers) {
      if (s.session && s.session->connected()) add(addr);
    }
    const bool suspecting_one = !skip.empty();
    if (!suspecting_one) {
      for (const auto& m : config.members) add(m.address);
      for (const auto& seed : options.seeds) add(seed);
    }
    // Every server's answer, for the error when none gave a configuration.
    std::string why;
    bool answered = false;
    const auto started = Clock::now();
    for (size_t i = 0; i < order.size(); ++i) {
      // Asking on for a newer one is bounded: servers that do not answer
      // cost up to kRefreshWait each.
      if (answered && Clock::now() - started > kRefreshWait) break;
      bool newer = false;
      last = FetchFrom(order[i], i + 1 == order.size(),
                       suspecting_one || until_newer, &newer);
      if (last.ok() && (!until_newer || newer)) return last;
      if (last.ok()) {
        answered = true;
        continue;
      }
      // A seed outside any cluster is a mistake to report, not to skip.
      if (last.code() == StatusCode::kUnsupported) return last;
      if (order.size() > 1) {
        const std::string& m = last.message();
        why += (why.empty() ? "" : "; ") +
               (m.rfind(order[i], 0) == 0 ? m : order[i] + ": " + m);
      }
    }
    if (answered) return Status::OK();  // nothing newer anywhere
    if (order.size() <= 1) return last;
    return Status(last.code(),
                  "no server gave the configuration (" + why + ")");
  }

  // How long Cluster::Refresh waits for the other members, and how long
  // it waits to connect to one it is not connected to.
  static constexpr auto kNewestWait = std::chrono::milliseconds(250);
  static constexpr auto kNewestConnect = std::chrono::milliseconds(50);

  // Cluster::Refresh: a first answer as Refresh() gets one, then every
  // member of the configuration installed asked, for at most kNewestWait
  // in all: those connected first, all at once, then the others, each
  // connected for at most kNewestConnect (one that is not by then is
  // passed over). The newest configuration any gave is installed. A member
  // cut off from ZooKeeper answers with the configuration it was cut off
  // with while the others moved on: asked first, it gave a refresh (and
  // `remem cluster nodes` through it) that one. The refreshes of
  // operations keep to Refresh(): they ask on only after refusals, and
  // never wait for a paused member.
  Status RefreshNewest() {
    REMEM_RETURN_IF_ERROR(Refresh());
    const auto until = Clock::now() + kNewestWait;
    struct Answer {
      bool done = false;
      std::string bytes;
    };
    std::vector<std::shared_ptr<Answer>> answers;
    // The calls end by `until` too: one left to the session's deadline
    // outlived this wait, kept a nested WaitAll waiting and made the
    // slow-call hook suspect its server.
    const auto ask = [&](Server* server) {
      auto a = std::make_shared<Answer>();
      answers.push_back(a);
      client::SessionCore* core = server->session->core();
      core->rpc()->Call(proto::kCoreService,
                        static_cast<uint8_t>(proto::CoreMethod::kClusterConfig),
                        {}, until, [a](Status st, std::string reply) {
                          a->done = true;
                          if (st.ok()) a->bytes = std::move(reply);
                        });
      core->Flush();
    };
    std::vector<std::string> others;
    for (const auto& m : config.members) {
      auto it = servers.find(m.address);
      if (it != servers.end() && it->second.session &&
          it->second.session->connected()) {
        ask(&it->second);
      } else {
        others.push_back(m.address);
      }
    }
    for (const std::string& addr : others) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - Clock::now());
      if (left <= std::chrono::milliseconds(0)) break;
      auto s = Connected(addr, std::min(left, kNewestConnect));
      if (s.ok()) ask(*s);
    }
    const auto all_done = [&answers] {
      for (const auto& a : answers) {
        if (!a->done) return false;
      }
      return true;
    };
    while (!all_done() && Clock::now() < until) {
      if (PollLoops() == 0) {
        loop->core()->worker()->Sleep(std::chrono::milliseconds(1));
      }
    }
    // The newest, installed once (each install may move stores).
    std::optional<cluster::Config> newest;
    for (const auto& a : answers) {
      if (a->bytes.empty()) continue;
      auto c = cluster::DecodeConfig(a->bytes);
      if (!c.ok() || c->epoch <= config.epoch || c->name != config.name) {
        continue;
      }
      if (!newest || c->epoch > newest->epoch) newest = std::move(*c);
    }
    if (newest) {
      ++stats.refreshes;
      Install(std::move(*newest));
    }
    return Status::OK();
  }

  const std::string& OwnerOf(std::string_view key) const {
    return config.OwnerOf(key).address;
  }

  // An operation's deadline starts at its first refusal: one that is
  // answered at once never reads the clock.
  bool InTime(Clock::time_point* deadline) const {
    const auto now = Clock::now();
    if (*deadline == Clock::time_point{}) {
      *deadline = now + options.session.timeout;
    }
    return now < *deadline;
  }

  // Runs fn on the owner's store (a HashStore, or with Ops an OpsStore),
  // refreshing and retrying on Moved until the deadline. kRead: fn only
  // reads, and is run again if the event loop stalled under it (RetryLater).
  template <typename Store = HashStore, bool kRead = false, typename Fn>
  auto Routed(std::string_view key, Fn fn) -> decltype(fn(nullptr)) {
    Clock::time_point deadline{};
    int busy = 0;  // Busy refusals so far
    for (int attempt = 0;; ++attempt) {
      if constexpr (std::is_same_v<Store, TreeStore>) {
        if (Status st = Ordered(); !st.ok()) return st;
      }
      const uint16_t owner = OwnerFor<Store>(key);
      // By address: opening the store may install a configuration that
      // numbers the members anew (the slow-call hook's refresh).
      const std::string owner_address = config.members[owner].address;
      auto store = [&]() -> Result<Store*> {
        auto s = ServerOfMember(owner);
        if (!s.ok()) return s.status();
        if constexpr (std::is_same_v<Store, OpsStore>) {
          return OpsOf(*s);
        } else if constexpr (std::is_same_v<Store, TreeStore>) {
          return TreeOf(*s);
        } else {
          return StoreOf(*s);
        }
      }();
      if (!store.ok()) {
        // Opening the store is a request too: a member that has not
        // installed the configuration yet refuses it.
        const Status& st = store.status();
        // Lost to a stalled loop: nothing was sent, so for writes too.
        if (LostToStall(st) && InTime(&deadline)) continue;
        if (Retryable(st) && InTime(&deadline)) {
          if (IsBusy(st)) {
            Pause(BusyPause(++busy), deadline);
          } else {
            Backoff(attempt + 1, deadline);
          }
          if (IsMoved(st)) {
            (void)Refresh();
          } else if (IsBusy(st) && config.replicas > 0 &&
                     attempt + 1 >= kRefreshAfterBusy) {
            // As for an operation refused Busy (below): a member with no
            // lease refuses the store's opening too.
            (void)Refresh({}, /*until_newer=*/true);
          }
          continue;
        }
        // Perhaps the shard moved off a server that left: ask once (by
        // address: a new configuration may number its members anew). In a
        // replicated cluster, ask until a configuration names a new owner
        // (the shard fails over to a backup), within the deadline.
        const bool failing_over = config.replicas > 0 &&
                                  st.code() == StatusCode::kUnavailable &&
                                  InTime(&deadline);
        if (attempt == 0 || failing_over) {
          const std::string& addr = owner_address;
          if (Refresh().ok()) {
            if constexpr (std::is_same_v<Store, TreeStore>) {
              if (!config.ordered()) continue;  // Ordered() says so, above
            }
            if (config.members[OwnerFor<Store>(key)].address != addr) continue;
          }
          if (failing_over) {
            Backoff(attempt + 1, deadline);
            continue;
          }
        }
        if (config.replicas > 0 && st.code() == StatusCode::kUnavailable) {
          // Perhaps waiting for a failover that did not come in time (a
          // manager that died must be replaced first: a ZooKeeper session).
          return st.WithContext(
              "no configuration named another owner within the deadline");
        }
        return st;
      }
      auto r = fn(*store);
      const Status& st = StatusOf(r);
      if (kRead && LostToStall(st) && InTime(&deadline)) continue;
      if (kRead && LostToFailover(st) && InTime(&deadline)) {
        // Its server died or went silent: ask where the shard went.
        Backoff(attempt + 1, deadline);
        (void)Refresh();
        continue;
      }
      if (!Retryable(st) || !InTime(&deadline)) {
        // A server that died or stopped answering with the operation in
        // flight: the next operation routes by a fresh configuration.
        if (config.replicas > 0 && (st.code() == StatusCode::kUnavailable ||
                                    st.code() == StatusCode::kTimedOut)) {
          (void)Refresh();
        }
        return r;
      }
      if (IsBusy(st)) {
        Pause(BusyPause(++busy), deadline);
        if (config.replicas > 0 && attempt + 1 >= kRefreshAfterBusy) {
          (void)Refresh({}, /*until_newer=*/true);
        }
        continue;
      }
      ++stats.moved;
      Backoff(attempt, deadline);
      if (!Refresh().ok()) return r;
    }
  }

  // After a refusal whose refresh brought nothing new (a server still
  // installing the configuration the client has): a short pause, growing.
  static std::chrono::microseconds BackoffPause(int attempt) {
    return std::chrono::microseconds(
        std::min(100 << std::min(attempt, 6), 5000));
  }
  // After the `busy`-th Busy of an operation: from 200 us, doubling to
  // 5 ms (a cluster forming, or whose members hold no lease, answers Busy
  // for seconds; a frozen shard's hand-over, for milliseconds). Asleep, a
  // pause costs no CPU whatever its length; a longer one only delays the
  // first answer after the Busy ends.
  static std::chrono::microseconds BusyPause(int busy) {
    return std::min<std::chrono::microseconds>(
        std::chrono::microseconds(int64_t{100} << std::min(busy, 10)),
        std::chrono::milliseconds(5));
  }
  void Backoff(int attempt, Clock::time_point deadline = {}) {
    if (attempt > 0) Pause(BackoffPause(attempt), deadline);
  }
  // Polls the loops for `pause`, or until `deadline` if that comes first.
  void Pause(std::chrono::microseconds pause, Clock::time_point deadline) {
    auto until = Clock::now() + pause;
    if (deadline != Clock::time_point{}) until = std::min(until, deadline);
    for (auto now = Clock::now(); now < until; now = Clock::now()) {
      if (PollLoops() > 0) continue;
      // Asleep, not spinning: a spin here took a core for as long as the
      // servers answered Busy.
      const auto left = until - now;
      if (left < std::chrono::milliseconds(1)) {
        std::this_thread::sleep_for(left);
      } else {
        loop->core()->worker()->Sleep(
            std::chrono::duration_cast<std::chrono::milliseconds>(left));
      }
    }
  }

  // An asynchronous operation refused: retried at the next Poll, after a
  // refresh if it was Moved, or, in a replicated cluster, Busy for the
  // fourth time in a row (a member that holds no lease answers Busy; if it
  // was failed over, only a newer configuration says where the key went).
  void Refused(const Status& st, int attempt) {
    if (IsMoved(st)) {
      ++stats.moved;
      stale = true;
    } else if (config.replicas > 0 && attempt >= kRefreshAfterBusy) {
      stale = stale_busy = true;
    }
  }
  static constexpr int kRefreshAfterBusy = 3;

  void Finish(const Status& st) {
    --in_flight;
    if (!st.ok() && first_error.ok()) first_error = st;
  }

  // --- asynchronous operations
  //
  // One asynchronous operation on one key, from a pool per result type:
  // once the pool is warm, issuing one allocates nothing (its strings keep
  // their capacity, and the callback given to the owner's store holds two
  // pointers, which std::function keeps inline).
  template <typename R>
  struct AsyncOp {
    std::string key;            // the operation's copy of the key, or empty
    std::string_view key_view;  // what is sent: `key`, op.key or the caller's
    std::string value;          // a put's
    Value* into = nullptr;      // a get into the caller's storage
    Op op;                      // an Execute's
    std::function<void(R)> done;
    // Sends it to `server`'s store (opening it if needed); an error if it
    // could not.
    Status (*send)(Impl*, Server*, AsyncOp*) = nullptr;
    Clock::time_point deadline{};  // from the first refusal
    int attempt = 0;
    bool counted = true;  // a caller's: in in_flight and WaitAll's error
    // A get sent to a backup (ReadFrom::kAnyReplica), and one whose
    // first issue chose its copy (a get a backup could not answer is asked
    // of the owner).
    bool to_replica = false;
    bool replica_tried = false;

    AsyncOp* CopyKey(std::string_view k) {
      key.assign(k.data(), k.size());
      key_view = key;
      return this;
    }
  };
  template <typename R>
  struct AsyncPool {
    std::deque<AsyncOp<R>> all;  // elements never move
    std::vector<AsyncOp<R>*> free;
  };
  std::tuple<AsyncPool<Result<Value>>, AsyncPool<Status>,
             AsyncPool<Result<uint64_t>>, AsyncPool<Result<OpReply>>>
      pools;

  template <typename R>
  AsyncOp<R>* NewAsync(std::function<void(R)> done,
                       Status (*send)(Impl*, Server*, AsyncOp<R>*),
                       bool counted = true) {
    auto& pool = std::get<AsyncPool<R>>(pools);
    AsyncOp<R>* op = nullptr;
    if (pool.free.empty()) {
      op = &pool.all.emplace_back();
    } else {
      op = pool.free.back();
      pool.free.pop_back();
    }
    op->done = std::move(done);
    op->send = send;
    op->counted = counted;
    if (counted) ++in_flight;
    return op;
  }
  template <typename R>
  void FreeAsync(AsyncOp<R>* op) {
    op->key.clear();
    op->value.clear();
    op->into = nullptr;
    if constexpr (std::is_same_v<R, Result<OpReply>>) op->op = Op();
    op->deadline = {};
    op->attempt = 0;
    op->to_replica = false;
    op->replica_tried = false;
    std::get<AsyncPool<R>>(pools).free.push_back(op);
  }

  // The callback an AsyncOp's send gives the owner's store.
  template <typename R>
  std::function<void(R)> Reply(AsyncOp<R>* op) {
    return [this, op](R r) { Completed(op, std::move(r)); };
  }

  // Issues `op` on the owner of its key. A failure to send (the owner
  // unreachable, its store refusing to open) completes it at the next Poll,
  // where a refusal is retried as any other.
  template <typename R>
  void Issue(AsyncOp<R>* op) {
    uint16_t target = OwnerIndex(op->key_view);
    op->to_replica = false;
    bool get = false;
    if constexpr (std::is_same_v<R, Result<Value>>) {
      get = op->send == &SendGet;
    } else if constexpr (std::is_same_v<R, Status>) {
      get = op->send == &SendGetInto;
    }
    if (get && !op->replica_tried &&
        options.read_from == ReadFrom::kAnyReplica) {
      // Its first issue only: a get a backup could not answer goes to the
      // owner, through the retries every operation has.
      op->replica_tried = true;
      const uint16_t copy = ReadTarget(op->key_view);
      if (copy != target) {
        target = copy;
        op->to_replica = true;
        ++stats.replica_gets;
      }
    }
    auto server = ServerOfMember(target);
    Status st = server.ok() ? op->send(this, *server, op) : server.status();
    if (!st.ok()) {
      // Not sent: safe to send again, a write too.
      later.push_back([this, op, st] { Completed(op, R(st), /*sent=*/false); });
    }
  }

  // An asynchronous operation refused with Moved or Busy before its
  // deadline: `again` (which issues it again) runs after the next Poll has
  // refreshed the configuration (Moved) or after a pause that grows with
  // each refusal (Busy, Backoff's). False: not retried, it is done.
  //
  // `read`: the operation only reads, and a read that failed because the
  // event loop stalled (it never reached the server, or its reply is lost)
  // is issued again too, at the next Poll (on a new loop: Connected). A
  // write's outcome is unknown then: it fails with the stall's error.
  template <typename Again>
  bool RetryLater(const Status& st, Clock::time_point* deadline, int* attempt,
                  Again again, bool read = false) {
    if (read && LostToStall(st) && InTime(deadline)) {
      ++*attempt;
      later.push_back(std::move(again));
      return true;
    }
    if (read && LostToFailover(st) && InTime(deadline)) {
      stale = true;  // the next Poll asks where the shard went
      ++*attempt;
      waiting.emplace_back(Clock::now() + BackoffPause(*attempt),
                           std::move(again));
      return true;
    }
    if (!Retryable(st) || !InTime(deadline)) return false;
    Refused(st, *attempt);
    ++*attempt;
    if (IsMoved(st)) {
      later.push_back(std::move(again));
    } else {
      waiting.emplace_back(Clock::now() + BackoffPause(*attempt),
                           std::move(again));
    }
    return true;
  }

  // In a replicated cluster a server that died is failed over to a backup
  // within about a lease: what it did not answer (Unavailable: its session
  // ended, or it could not be reached) is asked again by a fresh
  // configuration, within the operation's deadline, if that is safe (a
  // read, or anything not sent). A write that was in flight there fails:
  // its outcome is unknown. (Not TimedOut: that took the whole timeout
  // already, and the deadline starts at the first refusal.)
  bool LostToFailover(const Status& st) const {
    return config.replicas > 0 && st.code() == StatusCode::kUnavailable &&
           !LostToStall(st);
  }

  // The owner answered (or the send failed: `sent` false): retried as
  // RetryLater says, else done.
  template <typename R>
  void Completed(AsyncOp<R>* op, R r, bool sent = true) {
    const Status& st = StatusOf(r);
    constexpr bool kGet = std::is_same_v<R, Result<Value>>;
    if (op->to_replica && !st.ok() && st.code() != StatusCode::kNotFound) {
      // The backup could not answer (no longer one, down, no lease): the
      // owner is asked, at the next Poll.
      op->to_replica = false;
      ++stats.replica_refused;
      later.push_back([this, op] { Issue(op); });
      return;
    }
    // A read (a get, or a server-side operation that only reads) or
    // anything not sent may go again; a write sent may have taken effect.
    bool read = kGet || op->into != nullptr || !sent;
    if constexpr (std::is_same_v<R, Result<OpReply>>) {
      read = read || ReadsOnly(op->op);
    }
    if (RetryLater(
            st, &op->deadline, &op->attempt, [this, op] { Issue(op); }, read)) {
      return;
    }
    if (op->counted) Finish(st);
    std::function<void(R)> done = std::move(op->done);
    FreeAsync(op);
    if (done) done(std::move(r));
  }

  // The send functions, one per kind of operation.
  static Status SendGet(Impl* im, Server* s, AsyncOp<Result<Value>>* op) {
    auto store = op->to_replica ? im->ReplicaOf(s) : im->StoreOf(s);
    if (!store.ok()) return store.status();
    (*store)->GetAsync(op->key_view, im->Reply(op));
    return Status::OK();
  }
  static Status SendGetInto(Impl* im, Server* s, AsyncOp<Status>* op) {
    auto store = op->to_replica ? im->ReplicaOf(s) : im->StoreOf(s);
    if (!store.ok()) return store.status();
    (*store)->GetAsync(op->key_view, op->into, im->Reply(op));
    return Status::OK();
  }
  static Status SendPut(Impl* im, Server* s, AsyncOp<Result<uint64_t>>* op) {
    auto store = im->StoreOf(s);
    if (!store.ok()) return store.status();
    (*store)->PutAsync(op->key_view, op->value, im->Reply(op));
    return Status::OK();
  }
  static Status SendDelete(Impl* im, Server* s, AsyncOp<Status>* op) {
    auto store = im->StoreOf(s);
    if (!store.ok()) return store.status();
    (*store)->DeleteAsync(op->key_view, im->Reply(op));
    return Status::OK();
  }
  static Status SendExecute(Impl* im, Server* s, AsyncOp<Result<OpReply>>* op) {
    auto ops = im->OpsOf(s);
    if (!ops.ok()) return ops.status();
    // The store queues its own copy; ours stays for a retry.
    (*ops)->ExecuteAsync(op->op, im->Reply(op));
    return Status::OK();
  }

  // A multi-get in rounds: each round sends the keys still to do, split per
  // owner, to every owner at once; keys refused with Moved or Busy go in
  // the next round (after a refresh, or a pause), until the deadline. The
  // caller's storage receives the values (strings swapped, so capacity
  // circulates); records come from a pool, so a warm multi-get allocates
  // nothing.
  struct MultiGetOp;
  struct MultiGetPart {  // one owner's share of a round
    Impl* impl = nullptr;
    MultiGetOp* op = nullptr;
    uint16_t member = 0;  // its index in the configuration of the round
    // Keys sent to this member as a backup (ReadFrom::kAnyReplica: asked
    // through its replica store), of `idx`.
    size_t as_backup = 0;
    std::vector<size_t> idx;
    std::vector<std::string_view> keys;
    std::vector<Value> values;
    std::vector<Status> statuses;
  };
  struct MultiGetOp {
    std::vector<std::string_view> keys;  // the caller keeps the strings
    std::vector<Value>* values = nullptr;
    std::vector<Status>* statuses = nullptr;
    Callback done;
    std::vector<size_t> todo;
    std::vector<MultiGetPart> parts;  // by member index, this round
    size_t pending = 0;               // owners asked and not yet answered
    Clock::time_point deadline{};
    int attempt = 0;
    bool counted = true;
  };
  std::deque<MultiGetOp> multi_all;  // elements never move
  std::vector<MultiGetOp*> multi_free;

  void StartMultiGet(const std::vector<std::string_view>& keys,
                     std::vector<Value>* values, std::vector<Status>* statuses,
                     Callback done, bool counted) {
    MultiGetOp* m = nullptr;
    if (multi_free.empty()) {
      m = &multi_all.emplace_back();
    } else {
      m = multi_free.back();
      multi_free.pop_back();
    }
    m->keys.assign(keys.begin(), keys.end());
    m->values = values;
    m->statuses = statuses;
    values->resize(keys.size());
    statuses->assign(keys.size(), Status::OK());
    m->done = std::move(done);
    m->todo.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) m->todo[i] = i;
    m->deadline = {};
    m->attempt = 0;
    m->counted = counted;
    if (counted) ++in_flight;
    MultiGetRound(m);
  }

  // The multi-get that returns a vector of results: the same rounds, into
  // storage it keeps with its own copy of the keys.
  void StartMultiGet(const std::vector<std::string_view>& keys,
                     MultiGetCallback done, bool counted) {
    struct Held {
      std::vector<std::string> keys;
      std::vector<std::string_view> views;
      std::vector<Value> values;
      std::vector<Status> statuses;
    };
    auto h = std::make_shared<Held>();
    h->keys.assign(keys.begin(), keys.end());
    h->views.assign(h->keys.begin(), h->keys.end());
    StartMultiGet(
        h->views, &h->values, &h->statuses,
        [h, done = std::move(done)](Status) {
          std::vector<Result<Value>> out;
          out.reserve(h->statuses.size());
          for (size_t i = 0; i < h->statuses.size(); ++i) {
            if (h->statuses[i].ok()) {
              out.emplace_back(std::move(h->values[i]));
            } else {
              out.emplace_back(std::move(h->statuses[i]));
            }
          }
          if (done) done(std::move(out));
        },
        counted);
  }

  void MultiGetRound(MultiGetOp* m) {
    if (m->parts.size() < config.members.size()) {
      m->parts.resize(config.members.size());
    }
    for (MultiGetPart& p : m->parts) {
      p.idx.clear();
      p.keys.clear();
      p.as_backup = 0;
    }
    // Reads from any replica: the first round takes each key's copies in
    // turn; the keys a backup could not answer go to their owners in the
    // next rounds.
    const bool any_copy =
        m->attempt == 0 && options.read_from == ReadFrom::kAnyReplica;
    for (size_t i : m->todo) {
      const uint16_t owner = OwnerIndex(m->keys[i]);
      const uint16_t target = any_copy ? ReadTarget(m->keys[i]) : owner;
      MultiGetPart& p = m->parts[target];
      p.idx.push_back(i);
      p.keys.push_back(m->keys[i]);
      p.as_backup += target != owner ? 1 : 0;
    }
    // Counted before any is sent: a store may answer inside the call.
    size_t asked = 0;
    for (const MultiGetPart& p : m->parts) asked += p.idx.empty() ? 0 : 1;
    m->pending = asked;
    for (uint16_t owner = 0; owner < m->parts.size(); ++owner) {
      MultiGetPart& part = m->parts[owner];
      if (part.idx.empty()) continue;
      part.impl = this;
      part.member = owner;
      part.op = m;
      auto s = ServerOfMember(owner);
      auto store = !s.ok()          ? Result<HashStore*>(s.status())
                   : part.as_backup ? ReplicaOf(*s)
                                    : StoreOf(*s);
      stats.replica_gets += part.as_backup;
      if (!store.ok()) {
        for (size_t i : part.idx) (*m->statuses)[i] = store.status();
        stats.replica_refused += part.as_backup;
        --m->pending;
        continue;
      }
      if (asked == 1 && part.idx.size() == m->keys.size() &&
          part.as_backup == 0) {
        // Every key on one server, in order: straight into the caller's
        // storage.
        (*store)->MultiGetAsync(m->keys, m->values, m->statuses,
                                [this, m](Status) {
                                  if (--m->pending == 0) MultiGetRoundDone(m);
                                });
        continue;
      }
      (*store)->MultiGetAsync(part.keys, &part.values, &part.statuses,
                              [p = &part](Status) { p->impl->PartDone(p); });
    }
    // Nothing left in flight (every owner unreachable, or no key): done
    // at the next Poll, as callbacks are.
    if (asked == 0 || m->pending == 0) {
      later.push_back([this, m] { MultiGetRoundDone(m); });
    }
  }

  void PartDone(MultiGetPart* p) {
    MultiGetOp* m = p->op;
    for (size_t j = 0; j < p->idx.size(); ++j) {
      const size_t i = p->idx[j];
      const Status& st = p->statuses[j];
      if (p->as_backup > 0 && !st.ok() && st.code() != StatusCode::kNotFound &&
          OwnerIndex(m->keys[i]) != p->member) {
        ++stats.replica_refused;
      }
      (*m->statuses)[i] = std::move(p->statuses[j]);
      if ((*m->statuses)[i].ok()) std::swap((*m->values)[i], p->values[j]);
    }
    if (--m->pending == 0) MultiGetRoundDone(m);
  }

  // The next round of an asynchronous batch some of whose items were
  // refused (or lost to a stalled loop): after a refresh if any moved, else
  // after a pause that grows with each round (and, in a replicated
  // cluster, a refresh from the kRefreshAfterBusy-th on).
  void NextRound(bool moved, int attempt, std::function<void()> again) {
    if (moved) {
      ++stats.moved;
      stale = true;
      later.push_back(std::move(again));
      return;
    }
    if (config.replicas > 0 && attempt >= kRefreshAfterBusy) {
      stale = stale_busy = true;
    }
    waiting.emplace_back(Clock::now() + BackoffPause(attempt),
                         std::move(again));
  }

  void MultiGetRoundDone(MultiGetOp* m) {
    m->todo.clear();
    bool moved = false;
    for (size_t i = 0; i < m->statuses->size(); ++i) {
      const Status& st = (*m->statuses)[i];
      if (LostToFailover(st)) stale = true;
      if (!Retryable(st) && !LostToStall(st) && !LostToFailover(st)) continue;
      m->todo.push_back(i);
      moved = moved || IsMoved(st);
    }
    if (!m->todo.empty() && InTime(&m->deadline)) {
      NextRound(moved, ++m->attempt, [this, m] { MultiGetRound(m); });
      return;
    }
    Status first;  // the first error other than NotFound, as the store's
    for (const Status& st : *m->statuses) {
      if (!st.ok() && st.code() != StatusCode::kNotFound) {
        first = st;
        break;
      }
    }
    if (m->counted) Finish(first);
    Callback done = std::move(m->done);
    multi_free.push_back(m);
    if (done) done(first);
  }

  // A batch of n items, in rounds: issue(todo, out, pending, unsent) sends
  // the items in `todo` (to every server at once), counting the requests it
  // left in flight in `pending`, and marks in `unsent` the items it could
  // not send (their owner unreachable); items refused with Moved or Busy go
  // again (after a refresh if any moved) until the deadline, and with kRead
  // (a multi-get) those lost to a stalled loop too (RetryLater), as do
  // writes never sent. In a replicated cluster, reads lost to a failover
  // and writes never sent go again by a fresh configuration, as single
  // operations do (Issue).
  template <typename R, bool kRead = false, typename Issue>
  std::vector<R> Batched(size_t n, Issue issue) {
    std::vector<R> out(n, R(Status::Internal("not yet answered")));
    std::vector<size_t> todo(n);
    for (size_t i = 0; i < n; ++i) todo[i] = i;
    std::vector<uint8_t> unsent(n, 0);
    Clock::time_point deadline{};
    int busy = 0;  // rounds of nothing but Busy refusals so far
    for (int attempt = 0; !todo.empty(); ++attempt) {
      size_t pending = 0;
      for (size_t i : todo) unsent[i] = 0;
      issue(todo, out, pending, unsent);
      while (pending > 0) PollLoops();
      todo.clear();
      size_t moved = 0, failovers = 0;
      for (size_t i = 0; i < n; ++i) {
        const Status& st = StatusOf(out[i]);
        // What was never sent goes again, as a read does.
        const bool again = kRead || unsent[i] != 0;
        const bool failed_over = again && LostToFailover(st);
        if (!Retryable(st) && !(again && LostToStall(st)) && !failed_over) {
          continue;
        }
        todo.push_back(i);
        moved += IsMoved(StatusOf(out[i])) ? 1 : 0;
        failovers += failed_over ? 1 : 0;
      }
      if (todo.empty() || !InTime(&deadline)) break;
      stats.moved += moved;
      size_t refused_busy = 0;
      for (size_t i : todo) refused_busy += IsBusy(StatusOf(out[i])) ? 1 : 0;
      if (refused_busy == todo.size()) {
        Pause(BusyPause(++busy), deadline);
      } else {
        Backoff(attempt + 1, deadline);
      }
      if (moved > 0) {
        if (!Refresh().ok()) break;
      } else if (failovers > 0 ||
                 (config.replicas > 0 && attempt + 1 >= kRefreshAfterBusy)) {
        (void)Refresh();
      }
    }
    return out;
  }

  // Batched, asynchronously: issue(todo, batch) sends the items in `todo`
  // (to every server at once), counting in batch->pending each request it
  // left in flight, whose reply fills batch->out and calls BatchAnswered;
  // rounds as Batched's (the next one from a Poll), then done(out) inside
  // a Poll. Counted in in_flight, its first error (other than NotFound,
  // for reads) in WaitAll's.
  template <typename R>
  struct AsyncBatch {
    std::vector<R> out;
    std::vector<size_t> todo;
    // Items the round could not send (their owner unreachable): a write
    // goes again after a failover only if it was never sent.
    std::vector<uint8_t> unsent;
    size_t pending = 0;
    Clock::time_point deadline{};
    int attempt = 0;
    bool read = false;
    std::function<void(const std::vector<size_t>&,
                       const std::shared_ptr<AsyncBatch>&)>
        issue;
    std::function<void(std::vector<R>)> done;
  };
  template <typename R>
  void AsyncBatched(size_t n, bool read,
                    std::function<void(const std::vector<size_t>&,
                                       const std::shared_ptr<AsyncBatch<R>>&)>
                        issue,
                    std::function<void(std::vector<R>)> done) {
    ++in_flight;
    auto b = std::make_shared<AsyncBatch<R>>();
    b->out.assign(n, R(Status::Internal("not yet answered")));
    b->unsent.assign(n, 0);
    b->todo.resize(n);
    for (size_t i = 0; i < n; ++i) b->todo[i] = i;
    b->read = read;
    b->issue = std::move(issue);
    b->done = std::move(done);
    BatchRound(b);
  }
  template <typename R>
  void BatchRound(const std::shared_ptr<AsyncBatch<R>>& b) {
    // The round holds one count of its own until the next Poll: opening an
    // owner's store waits, running callbacks (an earlier owner's reply),
    // and the round must not end before every owner's part is out; and a
    // round that sent nothing (every owner unreachable) ends in a Poll, as
    // callbacks do.
    ++b->pending;
    for (size_t i : b->todo) b->unsent[i] = 0;
    b->issue(b->todo, b);
    later.push_back([this, b] { BatchAnswered(b); });
  }
  // A request of the round answered, or the round's own count went.
  template <typename R>
  void BatchAnswered(const std::shared_ptr<AsyncBatch<R>>& b) {
    if (--b->pending > 0) return;
    b->todo.clear();
    bool moved = false;
    for (size_t i = 0; i < b->out.size(); ++i) {
      const Status& st = StatusOf(b->out[i]);
      // What was never sent goes again, as a read does.
      const bool again = b->read || b->unsent[i] != 0;
      const bool failed_over = again && LostToFailover(st);
      if (failed_over) stale = true;
      if (!Retryable(st) && !(again && LostToStall(st)) && !failed_over) {
        continue;
      }
      b->todo.push_back(i);
      moved = moved || IsMoved(st);
    }
    if (!b->todo.empty() && InTime(&b->deadline)) {
      NextRound(moved, ++b->attempt, [this, b] { BatchRound(b); });
      return;
    }
    Status first;
    for (const R& r : b->out) {
      const Status& st = StatusOf(r);
      if (!st.ok() && !(b->read && st.code() == StatusCode::kNotFound)) {
        first = st;
        break;
      }
    }
    Finish(first);
    auto done = std::move(b->done);
    b->issue = nullptr;  // its copies of the keys go now
    if (done) done(std::move(b->out));
  }

  // --- asynchronous tree operations (ClusterTree)
  //
  // One operation on the owner of `key`'s range: send(tree, reply) issues
  // it there. A reply refused with Moved or Busy is sent again
  // (RetryLater), else it goes to done.
  template <typename R>
  struct TreeOp {
    std::string key;
    std::function<void(TreeStore*, std::function<void(R)>)> send;
    std::function<void(R)> done;
    Clock::time_point deadline{};
    int attempt = 0;
    bool read = false;  // a get or a scan's part (RetryLater)
  };
  template <typename R>
  void TreeIssue(std::shared_ptr<TreeOp<R>> op) {
    auto tree = [&]() -> Result<TreeStore*> {
      REMEM_RETURN_IF_ERROR(Ordered());
      auto server = ServerOfMember(OwnerFor<TreeStore>(op->key));
      if (!server.ok()) return server.status();
      return TreeOf(*server);
    };
    Result<TreeStore*> t = tree();
    if (!t.ok()) {
      // Failed before it was sent: the callback still runs inside a Poll.
      later.push_back([this, op, st = t.status()] {
        TreeCompleted(op, R(st), /*sent=*/false);
      });
      return;
    }
    op->send(*t, [this, op](R r) { TreeCompleted(op, std::move(r)); });
  }
  // As Completed: a write that was never sent goes again after a failover.
  template <typename R>
  void TreeCompleted(const std::shared_ptr<TreeOp<R>>& op, R r,
                     bool sent = true) {
    const Status& st = StatusOf(r);
    if (RetryLater(
            st, &op->deadline, &op->attempt, [this, op] { TreeIssue(op); },
            op->read || !sent)) {
      return;
    }
    std::function<void(R)> done = std::move(op->done);
    if (done) done(std::move(r));
  }
  // Starts a tree operation counted in in_flight (and first_error); `read`:
  // it only reads (TreeOp::read).
  template <typename R>
  void TreeAsync(std::string_view key,
                 std::function<void(TreeStore*, std::function<void(R)>)> send,
                 std::function<void(R)> done, bool read = false) {
    ++in_flight;
    auto op = std::make_shared<TreeOp<R>>();
    op->key.assign(key);
    op->send = std::move(send);
    op->read = read;
    op->done = [this, done = std::move(done)](R r) {
      Finish(StatusOf(r));
      if (done) done(std::move(r));
    };
    TreeIssue(std::move(op));
  }

  size_t Poll() {
    if (depth == 0) BuryDead();
    ++depth;
    const size_t n = PollOnce();
    --depth;
    return n;
  }
  // No retry waiting or due, nothing queued in a store, and nothing any
  // session still has to hear back (a nested Cluster::WaitAll's end).
  bool NothingOutstanding() {
    if (!later.empty() || !waiting.empty()) return false;
    loop->core()->Flush();
    for (auto& [addr, s] : servers) {
      if (s.session && !s.session->core()->NothingOutstanding()) return false;
    }
    for (Server& s : dead) {
      if (s.session && !s.session->core()->NothingOutstanding()) return false;
    }
    return true;
  }
  size_t PollOnce() {
    size_t n = PollLoops();
    if (!later.empty()) {
      if (stale) {
        stale = false;
        (void)Refresh({}, std::exchange(stale_busy, false));
      }
      auto run = std::move(later);
      later.clear();
      for (auto& fn : run) fn();
      n += run.size();
    }
    if (!waiting.empty()) {
      if (stale) {
        stale = false;
        (void)Refresh({}, std::exchange(stale_busy, false));
      }
      const auto now = Clock::now();
      std::vector<std::function<void()>> due;
      for (size_t i = 0; i < waiting.size();) {
        if (waiting[i].first > now) {
          ++i;
          continue;
        }
        due.push_back(std::move(waiting[i].second));
        waiting[i] = std::move(waiting.back());
        waiting.pop_back();
      }
      for (auto& fn : due) fn();
      n += due.size();
    }
    return n;
  }
};

Cluster::Cluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cluster::~Cluster() {
  if (impl_) (void)WaitAll();
}

Result<std::unique_ptr<Cluster>> Cluster::Connect(
    const ClusterOptions& options) {
  if (options.seeds.empty()) {
    return Status::InvalidArgument("no seed servers given");
  }
  REMEM_RETURN_IF_ERROR(client::CheckTimeouts(options.session));
  if (options.wait_for_config.count() < 0 ||
      options.wait_for_config > kMaxTimeout) {
    return Status::InvalidArgument(
        "ClusterOptions::wait_for_config is " +
        std::to_string(options.wait_for_config.count()) +
        " ms; it must be at least 0 and at most " +
        std::to_string(kMaxTimeout.count()) + " ms (a year)");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto loop = EventLoop::Create(options.session.transport);
  if (!loop.ok()) return loop.status();
  impl->loop = std::move(*loop);
  const auto until = Clock::now() + options.wait_for_config;
  Status st;
  for (int busy = 1;; ++busy) {
    for (size_t i = 0; i < options.seeds.size(); ++i) {
      st = impl->FetchFrom(options.seeds[i], i + 1 == options.seeds.size());
      if (st.ok() || st.code() == StatusCode::kUnsupported) break;
    }
    // Only a cluster still forming is worth waiting for.
    if (st.ok() || !IsBusy(st) || Clock::now() >= until) {
      break;
    }
    impl->Pause(Impl::BusyPause(busy), until);
  }
  if (!st.ok()) return st;
  return std::unique_ptr<Cluster>(new Cluster(std::move(impl)));
}

const Cluster::Info& Cluster::info() const { return impl_->info; }
Status Cluster::Refresh() { return impl_->RefreshNewest(); }
uint32_t Cluster::ShardOf(std::string_view key) const {
  return cluster::ShardOf(key, impl_->config.num_shards());
}
const std::string& Cluster::OwnerOf(std::string_view key) const {
  return impl_->OwnerOf(key);
}
const Cluster::RouteStats& Cluster::route_stats() const {
  RouteStats& st = impl_->stats;
  st.onesided_gets = impl_->dropped.onesided_gets;
  st.rpc_gets = impl_->dropped.rpc_gets;
  st.unreplicated = impl_->dropped.unreplicated;
  for (const auto& [addr, s] : impl_->servers) {
    if (s.store) Impl::AddReads(*s.store, &st);
    if (s.replica) Impl::AddReads(*s.replica, &st);
  }
  return st;
}

Status Cluster::Drain(const std::string& address,
                      std::chrono::milliseconds wait) {
  std::string host;
  uint16_t port = 0;
  if (Status st = util::ParseHostPort(address, &host, &port);
      !st.ok() || port == 0) {
    return Status::InvalidArgument(
        "a server to drain is named host:port, as the cluster lists it: " +
        (st.ok() ? "port 0 in '" + address + "'" : st.message()));
  }
  Impl& im = *impl_;
  Status asked = Status::Unavailable("no server to ask");
  // The incarnation the drain recorded (0: none registered then, or a
  // server too old to say).
  uint64_t drained = 0;
  std::vector<std::string> order;
  for (const auto& m : im.config.members) order.push_back(m.address);
  for (const std::string& addr : order) {
    auto s = im.Connected(addr);
    if (!s.ok()) {
      asked = s.status();
      continue;
    }
    auto r = (*s)->session->core()->CallSync(
        proto::kCoreService,
        static_cast<uint8_t>(proto::CoreMethod::kClusterDrain), address);
    asked = r.status();
    if (r.ok()) (void)proto::Reader(*r).Read(&drained);
    // Busy: that member has no configuration yet; ask another.
    if (r.ok() || !IsBusy(asked)) break;
  }
  if (!asked.ok()) return asked.WithContext("draining " + address);
  const auto until = Clock::now() + wait;
  // A server killed and started again at `address` is a new member, not
  // drained (the manager forgets the drain), and takes its share again:
  // asked who answers there now, the drain is over for this caller.
  std::unique_ptr<Session> probe;
  // The last probe found no server answering at `address`.
  bool silent = false;
  auto restarted = [&]() -> Status {
    if (drained == 0) return Status::OK();
    if (probe &&
        (!probe->connected() ||
         !probe->core()
              ->CallSyncUntil(proto::kCoreService,
                              static_cast<uint8_t>(proto::CoreMethod::kPing),
                              {}, Clock::now() + kDrainProbeWait)
              .ok())) {
      probe.reset();
    }
    if (!probe) {
      SessionOptions so = im.options.session;
      so.server = address;
      so.connect_timeout = kDrainProbeWait;
      // None there (or not answering): nothing says it restarted.
      if (auto s = Session::Connect(so, im.loop.get()); s.ok()) {
        probe = std::move(*s);
      }
    }
    silent = probe == nullptr;
    if (!probe || probe->server_incarnation() == drained) return Status::OK();
    return Status::Conflict(
        address +
        " was started again during its drain: the server there now is a new "
        "member, not drained, and takes its share of the shards (drain it "
        "again to empty it)");
  };
  if (wait.count() <= 0) return Status::OK();
  auto last_probe = Clock::now();
  REMEM_RETURN_IF_ERROR(restarted());
  for (;;) {
    REMEM_RETURN_IF_ERROR(im.Refresh());
    const int i = im.config.IndexOf(address);
    // Replicated: its backup copies too have been made elsewhere.
    const uint32_t backups = i < 0 ? 0 : im.info.nodes[size_t(i)].backups;
    if (i < 0 ||
        (im.config.ShardsOf(i) == 0 && backups == 0 &&
         im.config.RangesOf(i) == 0 && im.config.moving() == 0 &&
         im.config.moving_ranges() == 0 && im.config.filling_shards() == 0)) {
      // (A server failed over holds nothing either: one started again at
      // its address is not drained.)
      return restarted();
    }
    if (Clock::now() >= until) {
      return Status::TimedOut(
          address + " still owns " + std::to_string(im.config.ShardsOf(i)) +
          " shards" +
          (im.config.ordered()
               ? " and " + std::to_string(im.config.RangesOf(i)) + " ranges"
               : std::string()) +
          (im.config.replicas > 0 ? " and backs up " + std::to_string(backups)
                                  : std::string()) +
          (im.config.ordered()
               ? " (the drain goes on; a range that no other server can hold "
                 "stays: the manager's cluster_ranges_refused counts those)"
               : " (the drain goes on)") +
          (silent && im.config.replicas == 0
               ? "; it does not answer: a server that is down keeps its "
                 "shards until it returns"
               : std::string()));
    }
    if (Clock::now() - last_probe >= kDrainProbeEvery) {
      REMEM_RETURN_IF_ERROR(restarted());
      last_probe = Clock::now();
    }
    // A drain takes a copy's time: look again in a while, not in a spin.
    im.PollLoops();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}
size_t Cluster::in_flight() const { return impl_->in_flight; }
EventLoop* Cluster::loop() const { return impl_->loop.get(); }

uint32_t Cluster::Info::ShortOfCopies() const {
  uint32_t n = 0;
  for (uint32_t sh = 0; sh < num_shards && replicas > 0; ++sh) {
    uint32_t whole = 0;
    for (uint32_t i = 0; i < replicas; ++i) {
      const size_t at = size_t(sh) * replicas + i;
      if (at < shard_backups.size() && shard_backups[at] >= 0 &&
          (at >= shard_filling.size() || shard_filling[at] == 0)) {
        ++whole;
      }
    }
    if (sh < shard_retiring.size() && shard_retiring[sh] >= 0) ++whole;
    n += whole < replicas ? 1 : 0;
  }
  return n;
}

Result<Cluster::Value> Cluster::Get(std::string_view key) {
  auto get = [&](HashStore* s) { return s->Get(key); };
  if (auto r = impl_->FromReplica<Result<Value>>(key, get)) {
    return std::move(*r);
  }
  return impl_->Routed<HashStore, true>(key, get);
}

Status Cluster::Get(std::string_view key, Value* into) {
  auto get = [&](HashStore* s) { return s->Get(key, into); };
  if (auto r = impl_->FromReplica<Status>(key, get)) return std::move(*r);
  return impl_->Routed<HashStore, true>(key, get);
}

Result<uint64_t> Cluster::Put(std::string_view key, std::string_view value) {
  return impl_->Routed(key, [&](HashStore* s) { return s->Put(key, value); });
}

Result<uint64_t> Cluster::PutIfAbsent(std::string_view key,
                                      std::string_view value) {
  return impl_->Routed(
      key, [&](HashStore* s) { return s->PutIfAbsent(key, value); });
}

Result<uint64_t> Cluster::CompareAndPut(std::string_view key,
                                        std::string_view value,
                                        uint64_t expected) {
  return impl_->Routed(key, [&](HashStore* s) {
    return s->CompareAndPut(key, value, expected);
  });
}

Status Cluster::Delete(std::string_view key) {
  return impl_->Routed(key, [&](HashStore* s) { return s->Delete(key); });
}

Result<OpReply> Cluster::Execute(const Op& op) {
  auto execute = [&](OpsStore* s) { return s->Execute(op); };
  // One that only reads is asked again where a get would be.
  if (ReadsOnly(op)) return impl_->Routed<OpsStore, true>(op.key, execute);
  return impl_->Routed<OpsStore>(op.key, execute);
}

std::vector<Result<Cluster::Value>> Cluster::MultiGet(
    const std::vector<std::string_view>& keys) {
  std::vector<Result<Value>> out;
  bool finished = false;
  impl_->StartMultiGet(
      keys,
      [&out, &finished](std::vector<Result<Value>> r) {
        out = std::move(r);
        finished = true;
      },
      /*counted=*/false);
  while (!finished) impl_->Poll();
  return out;
}

std::vector<Result<uint64_t>> Cluster::MultiPut(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  return impl_->Batched<Result<uint64_t>>(
      pairs.size(),
      [&](const std::vector<size_t>& todo, std::vector<Result<uint64_t>>& out,
          size_t& pending, std::vector<uint8_t>& unsent) {
        // Puts queued on each server's store go out at the next poll as one
        // message per server, all servers at once.
        for (size_t i : todo) {
          auto store = impl_->StoreForKey(pairs[i].first);
          if (!store.ok()) {
            out[i] = store.status();
            unsent[i] = 1;
            continue;
          }
          ++pending;
          (*store)->PutAsync(pairs[i].first, pairs[i].second,
                             [&out, &pending, i](Result<uint64_t> r) {
                               out[i] = std::move(r);
                               --pending;
                             });
        }
      });
}

void Cluster::GetAsync(std::string_view key, GetCallback done) {
  impl_->Issue(impl_->NewAsync(std::move(done), &Impl::SendGet)->CopyKey(key));
}

void Cluster::GetAsync(std::string_view key, Value* into, Callback done) {
  auto* op = impl_->NewAsync(std::move(done), &Impl::SendGetInto);
  op->key_view = key;  // the caller keeps it
  op->into = into;
  impl_->Issue(op);
}

void Cluster::PutAsync(std::string_view key, std::string_view value,
                       VersionCallback done) {
  auto* op = impl_->NewAsync(std::move(done), &Impl::SendPut)->CopyKey(key);
  op->value.assign(value.data(), value.size());
  impl_->Issue(op);
}

void Cluster::DeleteAsync(std::string_view key, Callback done) {
  impl_->Issue(
      impl_->NewAsync(std::move(done), &Impl::SendDelete)->CopyKey(key));
}

void Cluster::ExecuteAsync(Op op, OpsStore::Callback done) {
  auto* a = impl_->NewAsync(std::move(done), &Impl::SendExecute);
  a->op = std::move(op);
  a->key_view = a->op.key;
  impl_->Issue(a);
}

std::vector<Result<OpReply>> Cluster::ExecuteBatch(const std::vector<Op>& ops) {
  // Each op asynchronously: what is queued for one server goes out at the
  // next poll as one message, to every server at once.
  std::vector<Result<OpReply>> out(ops.size(),
                                   Status::Internal("not yet answered"));
  size_t pending = ops.size();
  for (size_t i = 0; i < ops.size(); ++i) {
    auto* a = impl_->NewAsync<Result<OpReply>>(
        [&out, &pending, i](Result<OpReply> r) {
          out[i] = std::move(r);
          --pending;
        },
        &Impl::SendExecute, /*counted=*/false);
    a->op = ops[i];
    a->key_view = a->op.key;
    impl_->Issue(a);
  }
  while (pending > 0) impl_->Poll();
  return out;
}

void Cluster::MultiGetAsync(const std::vector<std::string_view>& keys,
                            MultiGetCallback done) {
  impl_->StartMultiGet(keys, std::move(done), /*counted=*/true);
}

void Cluster::MultiGetAsync(const std::vector<std::string_view>& keys,
                            std::vector<Value>* values,
                            std::vector<Status>* statuses, Callback done) {
  impl_->StartMultiGet(keys, values, statuses, std::move(done),
                       /*counted=*/true);
}

size_t Cluster::Poll() { return impl_->Poll(); }

Status Cluster::WaitAll() {
  Impl& im = *impl_;
  // Inside a callback (a Poll under way), the operations answered with the
  // running one complete only once it returns (Session::WaitAll): the wait
  // ends once nothing else can arrive. Polled first, so that what the
  // callback issued has gone out.
  // (Also a callback run by a synchronous cluster call's wait, which is
  // no Poll: the loop's worker says so.)
  const bool nested = im.depth > 0 || im.loop->core()->worker()->in_progress();
  while (im.in_flight > 0) {
    fabric::Worker* w = im.loop->core()->worker();
    const bool took_over = w->take_over();
    if (nested) w->set_take_over(true);  // as Session::WaitAll
    const size_t n = im.Poll();
    w->set_take_over(took_over);
    if (n == 0) std::this_thread::yield();
    if (nested && im.NothingOutstanding()) break;
  }
  Status st = std::move(impl_->first_error);
  impl_->first_error = Status::OK();
  return st;
}

std::vector<std::pair<std::string, Status>> Cluster::ForEachServer(
    const std::function<Status(Session*)>& fn) {
  std::vector<std::pair<std::string, Status>> out;
  // Copied first: connecting may install a new configuration (a member
  // that does not answer has the client fetch it again).
  for (const std::string& address : impl_->MemberAddresses()) {
    auto s = impl_->Connected(address);
    out.emplace_back(address, s.ok() ? fn((*s)->session.get()) : s.status());
  }
  return out;
}

std::vector<std::pair<std::string, Result<ServerStats>>> Cluster::Stats() {
  std::vector<std::pair<std::string, Result<ServerStats>>> out;
  for (const std::string& address : impl_->MemberAddresses()) {  // as above
    auto s = impl_->Connected(address);
    if (!s.ok()) {
      out.emplace_back(address, s.status());
      continue;
    }
    out.emplace_back(address, (*s)->session->Stats());
  }
  return out;
}

// --- the ordered store

Result<ClusterTree*> Cluster::Tree(const TreeOptions& options) {
  if (impl_->tree) return impl_->tree.get();
  if (!impl_->config.ordered()) {
    return Status::Unsupported(
        "cluster " + impl_->config.name +
        " has no ordered store (its servers were started without "
        "--tree-splits)");
  }
  impl_->tree_options = options;
  impl_->tree.reset(new ClusterTree(impl_.get()));
  return impl_->tree.get();
}

ClusterTree::ClusterTree(Cluster::Impl* impl) : impl_(impl) {}

uint32_t ClusterTree::RangeOf(std::string_view key) const {
  return impl_->config.RangeOf(key);
}

const std::string& ClusterTree::OwnerOf(std::string_view key) const {
  static const std::string kNone;
  const cluster::Config& c = impl_->config;
  if (!c.ordered()) return kNone;
  return c.members[c.range_owner[c.RangeOf(key)]].address;
}

TreeStore::ReadStats ClusterTree::read_stats() const {
  const Cluster::Impl& im = *impl_;
  TreeStore::ReadStats st = im.dropped_tree;
  for (const auto& [addr, s] : im.servers) {
    if (s.tree) Cluster::Impl::AddTreeReads(*s.tree, &st);
  }
  for (const auto& s : im.dead) {
    if (s.tree) Cluster::Impl::AddTreeReads(*s.tree, &st);
  }
  return st;
}

uint32_t ClusterTree::max_key() const { return tree::kMaxKey; }
uint32_t ClusterTree::max_scan() const { return tree::kMaxScanLimit; }

Result<ClusterTree::Value> ClusterTree::Get(std::string_view key) {
  return impl_->Routed<TreeStore, true>(
      key, [&](TreeStore* t) { return t->Get(key); });
}

Result<uint64_t> ClusterTree::Put(std::string_view key,
                                  std::string_view value) {
  return impl_->Routed<TreeStore>(
      key, [&](TreeStore* t) { return t->Put(key, value); });
}

Result<uint64_t> ClusterTree::PutIfAbsent(std::string_view key,
                                          std::string_view value) {
  return impl_->Routed<TreeStore>(
      key, [&](TreeStore* t) { return t->PutIfAbsent(key, value); });
}

Result<uint64_t> ClusterTree::CompareAndPut(std::string_view key,
                                            std::string_view value,
                                            uint64_t expected) {
  return impl_->Routed<TreeStore>(key, [&](TreeStore* t) {
    return t->CompareAndPut(key, value, expected);
  });
}

Status ClusterTree::Delete(std::string_view key) {
  return impl_->Routed<TreeStore>(key,
                                  [&](TreeStore* t) { return t->Delete(key); });
}

namespace {

// A scan of [start, end) across the ordered ranges, one range's part at a
// time, into *out: Next() says which part to ask of which range's owner,
// PartPage() where to scan it (the first part into *out itself, reusing
// its storage as TreeStore::ScanInto does; the others into a scratch page
// whose items are then moved over), Add() takes it and says whether the
// page is complete.
class RangeWalk {
 public:
  using Page = TreeStore::Page;
  RangeWalk(std::string_view start, std::string_view end, uint32_t limit,
            TreeStore::Order order, Page* out)
      : up_(order == TreeStore::Order::kAscending),
        from_(start),
        to_(end),
        limit_(limit),
        out_(out) {}

  // The part of range r still to scan: [part_from, part_to) (part_to
  // empty: unbounded). part_from is in range r (part_to may be r's upper
  // split: the next range's first key), so it routes the part.
  void Next(const cluster::Config& c) {
    uint32_t r;
    if (up_) {
      r = c.RangeOf(from_);
    } else if (to_.empty()) {
      r = c.num_ranges() - 1;
    } else {
      // The range of the keys just below `to`.
      r = c.RangeOf(to_);
      if (r > 0 && c.RangeLow(r) == to_) --r;
    }
    lo_ = c.RangeLow(r);
    hi_ = c.RangeHigh(r);
    part_from_ = up_ || from_ >= lo_ ? from_ : lo_;
    part_to_ = !up_ || hi_.empty() || (!to_.empty() && to_ <= hi_) ? to_ : hi_;
  }
  const std::string& part_from() const { return part_from_; }
  const std::string& part_to() const { return part_to_; }
  // Items still wanted in the page.
  uint32_t want() const {
    return limit_ - (first_ ? 0 : uint32_t(out_->items.size()));
  }
  Page* PartPage() { return first_ ? out_ : &scratch_; }

  // Takes the part scanned into PartPage(); true once the page is
  // complete: the part's limit or size ended it (more), it reached the
  // scan's end, or the page holds 1 MiB after a range's end. (A part that
  // answers fewer items than it was asked for, without more, left the page
  // short of `limit`.)
  bool Add() {
    Page* part = PartPage();
    for (const TreeStore::Item& it : part->items) {
      bytes_ += it.key.size() + it.value.size();
    }
    if (part != out_) {
      // Into items the page already has, or takes back from its spare
      // (pushing new ones grew the spare of a reused page by every part
      // after the first); swapped, so both pages keep their strings.
      const size_t at = out_->items.size();
      tree::ResizePage(out_, at + part->items.size());
      for (size_t i = 0; i < part->items.size(); ++i) {
        std::swap(out_->items[at + i], part->items[i]);
      }
    }
    first_ = false;
    if (part->more) {
      out_->more = true;
      if (part != out_) out_->resume = std::move(part->resume);
      return true;
    }
    // This range's part is done: the whole scan too, if it was the last.
    if (up_ ? part_to_ == to_ : part_from_ == from_) return true;
    (up_ ? from_ : to_) = up_ ? hi_ : lo_;
    if (bytes_ >= tree::kScanPageBytes) {
      // The next page starts at the next range (ascending: its first key;
      // descending: below this range's lowest key, an exclusive end).
      out_->more = true;
      out_->resume = up_ ? from_ : to_;
      return true;
    }
    return false;
  }
  // After a part failed: the page is empty, as TreeStore's.
  void Fail() { tree::ClearPage(out_); }

 private:
  const bool up_;
  std::string from_, to_;  // what is left of [start, end)
  const uint32_t limit_;
  Page* const out_;
  bool first_ = true;  // no part taken yet
  std::string lo_, hi_, part_from_, part_to_;
  Page scratch_;
  size_t bytes_ = 0;
};

}  // namespace

Status ClusterTree::CheckScan(std::string_view start, std::string_view end,
                              uint32_t limit) const {
  if (limit == 0 || limit > max_scan()) {
    return Status::InvalidArgument("scan limit must be 1.." +
                                   std::to_string(max_scan()));
  }
  if (!end.empty() && start > end) {
    return Status::InvalidArgument("scan start is after its end");
  }
  return Status::OK();
}

Result<ClusterTree::Page> ClusterTree::Scan(std::string_view start,
                                            std::string_view end,
                                            uint32_t limit, Order order) {
  Page page;
  REMEM_RETURN_IF_ERROR(ScanInto(start, end, limit, order, &page));
  return page;
}

Status ClusterTree::ScanInto(std::string_view start, std::string_view end,
                             uint32_t limit, Order order, Page* page) {
  RangeWalk walk(start, end, limit, order, page);
  Status st = CheckScan(start, end, limit);
  while (st.ok()) {
    st = impl_->Ordered();
    if (!st.ok()) break;
    walk.Next(impl_->config);
    st = impl_->Routed<TreeStore, true>(walk.part_from(), [&](TreeStore* t) {
      return t->ScanInto(walk.part_from(), walk.part_to(), walk.want(), order,
                         walk.PartPage());
    });
    if (st.ok() && walk.Add()) return st;
  }
  walk.Fail();
  return st;
}

void ClusterTree::GetAsync(std::string_view key, TreeStore::GetCallback done) {
  impl_->TreeAsync<Result<Value>>(
      key,
      [key = std::string(key)](TreeStore* t,
                               std::function<void(Result<Value>)> reply) {
        t->GetAsync(key, std::move(reply));
      },
      std::move(done), /*read=*/true);
}

void ClusterTree::PutAsync(std::string_view key, std::string_view value,
                           TreeStore::VersionCallback done) {
  impl_->TreeAsync<Result<uint64_t>>(
      key,
      [key = std::string(key), value = std::string(value)](
          TreeStore* t, std::function<void(Result<uint64_t>)> reply) {
        t->PutAsync(key, value, std::move(reply));
      },
      std::move(done));
}

void ClusterTree::DeleteAsync(std::string_view key, TreeStore::Callback done) {
  impl_->TreeAsync<Status>(
      key,
      [key = std::string(key)](TreeStore* t,
                               std::function<void(Status)> reply) {
        t->DeleteAsync(key, std::move(reply));
      },
      std::move(done));
}

struct ClusterTree::ScanState {
  ScanState(std::string_view start, std::string_view end, uint32_t limit,
            Order order, Page* page)
      : walk(start, end, limit, order, page), order(order) {}
  RangeWalk walk;
  const Order order;
  std::function<void(Status)> done;  // counted in in_flight
};

void ClusterTree::ScanAsync(std::string_view start, std::string_view end,
                            uint32_t limit, Order order,
                            TreeStore::ScanCallback done) {
  auto page = std::make_shared<Page>();
  ScanAsync(start, end, limit, order, page.get(),
            [page, done = std::move(done)](Status st) {
              if (!done) return;
              if (!st.ok()) return done(st);
              done(std::move(*page));
            });
}

void ClusterTree::ScanAsync(std::string_view start, std::string_view end,
                            uint32_t limit, Order order, Page* page,
                            TreeStore::Callback done) {
  Cluster::Impl* im = impl_;
  ++im->in_flight;
  auto scan = std::make_shared<ScanState>(start, end, limit, order, page);
  scan->done = [im, scan_state = scan.get(),
                done = std::move(done)](Status st) {
    if (!st.ok()) scan_state->walk.Fail();
    im->Finish(st);
    if (done) done(st);
  };
  if (Status st = CheckScan(start, end, limit); !st.ok()) {
    im->later.push_back([scan, st] { scan->done(st); });
    return;
  }
  ScanStep(im, std::move(scan));
}

void ClusterTree::ScanStep(Cluster::Impl* im, std::shared_ptr<ScanState> scan) {
  if (Status st = im->Ordered(); !st.ok()) {
    im->later.push_back([scan, st] { scan->done(st); });
    return;
  }
  scan->walk.Next(im->config);
  auto op = std::make_shared<Cluster::Impl::TreeOp<Status>>();
  op->key = scan->walk.part_from();
  op->read = true;
  op->send = [scan](TreeStore* t, std::function<void(Status)> reply) {
    RangeWalk& w = scan->walk;
    t->ScanAsync(w.part_from(), w.part_to(), w.want(), scan->order,
                 w.PartPage(), std::move(reply));
  };
  op->done = [im, scan](Status st) {
    if (!st.ok()) return scan->done(st);
    if (scan->walk.Add()) return scan->done(Status::OK());
    // The next range's part from the next Poll, not from inside the
    // callback that ended this one (which may run inside another call).
    im->later.push_back([im, scan] { ScanStep(im, scan); });
  };
  im->TreeIssue(std::move(op));
}

Result<ClusterTree::Page> ClusterTree::ScanPrefix(std::string_view prefix,
                                                  uint32_t limit, Order order) {
  // PrefixEnd is empty for a prefix of 0xff bytes (or none): unbounded.
  return Scan(prefix, tree::PrefixEnd(prefix), limit, order);
}

// Splits `todo` by the owner of each item's key (key_of(i)) and hands each
// owner's items to send(tree, items), its TreeStore opened; the items of
// an owner that cannot be reached get its error in `out` and are marked in
// *unsent (a write never sent goes again once the range is failed over).
template <typename R, typename KeyOf, typename Send>
void ClusterTree::PerOwner(Cluster::Impl* im, const std::vector<size_t>& todo,
                           KeyOf key_of, std::vector<R>& out, Send send,
                           std::vector<uint8_t>* unsent) {
  if (Status st = im->Ordered(); !st.ok()) {
    for (size_t i : todo) out[i] = st;
    return;
  }
  // Each owner's items in one batch, all owners at once.
  std::map<uint16_t, std::vector<size_t>> per_owner;
  for (size_t i : todo) {
    per_owner[im->OwnerFor<TreeStore>(key_of(i))].push_back(i);
  }
  for (auto& [owner, items] : per_owner) {
    auto server = im->ServerOfMember(owner);
    Result<TreeStore*> t = server.ok() ? im->TreeOf(*server) : server.status();
    if (!t.ok()) {
      for (size_t i : items) {
        out[i] = t.status();
        if (unsent != nullptr) (*unsent)[i] = 1;
      }
      continue;
    }
    send(*t, std::move(items));
  }
}

std::vector<Result<ClusterTree::Value>> ClusterTree::MultiGet(
    const std::vector<std::string_view>& keys) {
  Cluster::Impl* im = impl_;
  return im->Batched<Result<Value>, true>(
      keys.size(),
      [&](const std::vector<size_t>& todo, std::vector<Result<Value>>& out,
          size_t& pending, std::vector<uint8_t>&) {
        PerOwner(
            im, todo, [&](size_t i) { return keys[i]; }, out,
            [&](TreeStore* t, std::vector<size_t> items) {
              std::vector<std::string_view> batch;
              for (size_t i : items) batch.push_back(keys[i]);
              ++pending;
              t->MultiGetAsync(
                  batch, [&out, &pending, items = std::move(items)](
                             std::vector<Result<Value>> r) {
                    for (size_t j = 0; j < items.size() && j < r.size(); ++j) {
                      out[items[j]] = std::move(r[j]);
                    }
                    --pending;
                  });
            });
      });
}

std::vector<Result<uint64_t>> ClusterTree::MultiPut(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  Cluster::Impl* im = impl_;
  return im->Batched<Result<uint64_t>>(
      pairs.size(),
      [&](const std::vector<size_t>& todo, std::vector<Result<uint64_t>>& out,
          size_t& pending, std::vector<uint8_t>& unsent) {
        // Pairs whose owner cannot be reached are unsent: in a replicated
        // cluster they go again once their range is failed over.
        PerOwner(
            im, todo, [&](size_t i) { return pairs[i].first; }, out,
            [&](TreeStore* t, std::vector<size_t> items) {
              std::vector<std::pair<std::string_view, std::string_view>> batch;
              for (size_t i : items) batch.push_back(pairs[i]);
              ++pending;
              t->MultiPutAsync(
                  batch, [&out, &pending, items = std::move(items)](
                             std::vector<Result<uint64_t>> r) {
                    for (size_t j = 0; j < items.size() && j < r.size(); ++j) {
                      out[items[j]] = std::move(r[j]);
                    }
                    --pending;
                  });
            },
            &unsent);
      });
}

void ClusterTree::MultiGetAsync(const std::vector<std::string_view>& keys,
                                TreeStore::MultiGetCallback done) {
  Cluster::Impl* im = impl_;
  using Batch = Cluster::Impl::AsyncBatch<Result<Value>>;
  auto owned =
      std::make_shared<std::vector<std::string>>(keys.begin(), keys.end());
  im->AsyncBatched<Result<Value>>(
      owned->size(), /*read=*/true,
      [im, owned](const std::vector<size_t>& todo,
                  const std::shared_ptr<Batch>& b) {
        PerOwner(
            im, todo, [&](size_t i) { return std::string_view((*owned)[i]); },
            b->out,
            [&](TreeStore* t, std::vector<size_t> items) {
              std::vector<std::string_view> batch;
              for (size_t i : items) batch.push_back((*owned)[i]);
              ++b->pending;
              t->MultiGetAsync(batch, [im, b, items = std::move(items)](
                                          std::vector<Result<Value>> r) {
                for (size_t j = 0; j < items.size() && j < r.size(); ++j) {
                  b->out[items[j]] = std::move(r[j]);
                }
                im->BatchAnswered(b);
              });
            });
      },
      std::move(done));
}

void ClusterTree::MultiPutAsync(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
    TreeStore::MultiPutCallback done) {
  Cluster::Impl* im = impl_;
  using Batch = Cluster::Impl::AsyncBatch<Result<uint64_t>>;
  auto owned =
      std::make_shared<std::vector<std::pair<std::string, std::string>>>();
  owned->reserve(pairs.size());
  for (const auto& [k, v] : pairs) owned->emplace_back(k, v);
  im->AsyncBatched<Result<uint64_t>>(
      owned->size(), /*read=*/false,
      [im, owned](const std::vector<size_t>& todo,
                  const std::shared_ptr<Batch>& b) {
        PerOwner(
            im, todo,
            [&](size_t i) { return std::string_view((*owned)[i].first); },
            b->out,
            [&](TreeStore* t, std::vector<size_t> items) {
              std::vector<std::pair<std::string_view, std::string_view>> batch;
              for (size_t i : items) {
                batch.emplace_back((*owned)[i].first, (*owned)[i].second);
              }
              ++b->pending;
              t->MultiPutAsync(batch, [im, b, items = std::move(items)](
                                          std::vector<Result<uint64_t>> r) {
                for (size_t j = 0; j < items.size() && j < r.size(); ++j) {
                  b->out[items[j]] = std::move(r[j]);
                }
                im->BatchAnswered(b);
              });
            },
            &b->unsent);
      },
      std::move(done));
}

}  // namespace remem
