#include "cluster/member.h"

// The synchronous calls of ZooKeeper's C client exist in its multi-threaded
// library only, declared under THREADED.
#ifndef THREADED
#define THREADED
#endif
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <set>
#include <thread>
#include <vector>

#include "client/rpc_client.h"
#include "client/session_core.h"
#include "hash/codec.h"
#include "hash/wire.h"
#include "tree/codec.h"
#include "tree/wire.h"
#include "util/log.h"

namespace remem::cluster {

namespace {

constexpr auto kPassInterval = std::chrono::milliseconds(250);
constexpr int kMaxConfigBytes = 1 << 20;

std::string ZkError(int rc) { return zerror(rc); }

// Children of `path` (sorted), or the ZooKeeper error.
int Children(zhandle_t* zh, const std::string& path, bool watch,
             std::vector<std::string>* out) {
  String_vector v{};
  const int rc = zoo_get_children(zh, path.c_str(), watch ? 1 : 0, &v);
  if (rc != ZOK) return rc;
  out->clear();
  for (int i = 0; i < v.count; ++i) out->emplace_back(v.data[i]);
  deallocate_String_vector(&v);
  std::sort(out->begin(), out->end());
  return ZOK;
}

// The data of `path` (at most kMaxConfigBytes). Read into a small buffer
// first, and again at its size when the node's Stat says it is larger: a
// buffer of kMaxConfigBytes made and zeroed for every read cost a megabyte
// of page faults per call, several calls per member per pass (most of a
// member's CPU under ThreadSanitizer, whose shadow of it is written too).
int Get(zhandle_t* zh, const std::string& path, bool watch, std::string* out,
        ::Stat* stat = nullptr) {
  int want = 4096;
  for (;;) {
    out->resize(size_t(want));
    int len = want;
    ::Stat st{};
    const int rc =
        zoo_get(zh, path.c_str(), watch ? 1 : 0, out->data(), &len, &st);
    if (rc != ZOK) return rc;
    if (st.dataLength > want && want < kMaxConfigBytes) {
      // Larger than the buffer (it may have changed since: read again).
      want = std::min(st.dataLength, kMaxConfigBytes);
      continue;
    }
    out->resize(len < 0 ? 0 : size_t(len));
    if (stat != nullptr) *stat = st;
    return ZOK;
  }
}

// Runs `call` (a ZooKeeper call: its return code) again while it fails
// with an operation timeout or a connection loss, until `until`; the last
// return code. Either means a ZooKeeper that did not answer in time (busy,
// or starved of CPU: seen in CI) or a connection the client is making
// again within the session, not a ZooKeeper that is gone: the session's
// own expiry says that. `*calls`, if given, counts the calls made.
template <typename Call>
int WhileZooKeeperBusy(std::chrono::steady_clock::time_point until, Call call,
                       int* calls = nullptr) {
  for (int n = 1;; ++n) {
    const int rc = call();
    if (calls != nullptr) *calls = n;
    if ((rc != ZOPERATIONTIMEOUT && rc != ZCONNECTIONLOSS) ||
        std::chrono::steady_clock::now() >= until) {
      return rc;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int CreatePersistent(zhandle_t* zh, const std::string& path) {
  const int rc = zoo_create(zh, path.c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE,
                            0, nullptr, 0);
  return rc == ZNODEEXISTS ? ZOK : rc;
}

// Whether a configuration has the ordered ranges a server was started
// with (Conflict saying how they differ).
Status SameSplits(const Config& c,
                  const std::optional<std::vector<std::string>>& splits) {
  auto list = [](const std::vector<std::string>& s) {
    std::string out;
    for (const std::string& k : s) out += (out.empty() ? "" : ",") + k;
    return "'" + out + "'";
  };
  if (c.ordered() == splits.has_value() &&
      (!splits.has_value() || c.splits == *splits)) {
    return Status::OK();
  }
  return Status::Conflict(
      (c.ordered() ? "has the ordered split keys " + list(c.splits)
                   : std::string("has no ordered store")) +
      "; this server was started " +
      (splits.has_value() ? "with --tree-splits " + list(*splits)
                          : std::string("without --tree-splits")));
}

// Whether the node at `path` is a cluster's root: it has the members and
// election nodes every member makes (Start). The ZooKeeper error, or ZOK
// with *root set (false for a node that does not exist).
int IsClusterRoot(zhandle_t* zh, const std::string& path, bool* root,
                  std::vector<std::string>* children) {
  *root = false;
  const int rc = Children(zh, path, false, children);
  if (rc == ZNONODE) {
    children->clear();
    return ZOK;
  }
  if (rc != ZOK) return rc;
  *root = std::binary_search(children->begin(), children->end(), "members") &&
          std::binary_search(children->begin(), children->end(), "election");
  return ZOK;
}

// Nodes below PATH that Start looks at for another cluster, at most: a
// cluster's own tree is small, and a path holding more than this is no
// cluster's parent that anyone meant.
constexpr size_t kMaxNestingLookups = 4096;

}  // namespace

ClusterMember::ClusterMember(MemberOptions options, Ownership* ownership)
    : options_(std::move(options)), ownership_(ownership) {}

Result<std::unique_ptr<ClusterMember>> ClusterMember::Start(
    MemberOptions options, Ownership* ownership) {
  if (options.initial_size == 0 || options.initial_size > kMaxMembers) {
    return Status::InvalidArgument("--cluster-size must be 1.." +
                                   std::to_string(kMaxMembers));
  }
  if (options.num_shards == 0 || options.num_shards > kMaxShards) {
    return Status::InvalidArgument("--shards must be 1.." +
                                   std::to_string(kMaxShards));
  }
  if (options.lease + std::chrono::milliseconds(100) >
      options.session_timeout) {
    return Status::InvalidArgument(
        "--cluster-lease-ms must be at least 100 ms less than "
        "--cluster-session-ms (a manager grants leases only while its "
        "ZooKeeper session is surely alive)");
  }
  if (options.replicas > kMaxReplicas) {
    return Status::InvalidArgument("--replicas must be 0.." +
                                   std::to_string(kMaxReplicas));
  }
  if (!ValidDomain(options.self.domain)) {
    return Status::InvalidArgument(
        "a failure domain is 1 to 64 of [A-Za-z0-9_.-]");
  }
  if (options.replicas >= options.initial_size) {
    return Status::InvalidArgument("--replicas " +
                                   std::to_string(options.replicas) +
                                   " needs a --cluster-size of at least " +
                                   std::to_string(options.replicas + 1) +
                                   " (each shard on that many servers)");
  }
  if (options.self.address.empty() ||
      options.self.address.find('/') != std::string::npos) {
    return Status::InvalidArgument("bad cluster address '" +
                                   options.self.address + "'");
  }
  // The C client logs every failed reconnection attempt (tens a second
  // while ZooKeeper is down) to stderr; the member logs the transitions
  // itself instead.
  static FILE* quiet = std::fopen("/dev/null", "w");
  if (quiet != nullptr) zoo_set_log_stream(quiet);
  zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
  std::unique_ptr<ClusterMember> m(
      new ClusterMember(std::move(options), ownership));
  if (Status st = m->Connect(std::max(m->options_.session_timeout,
                                      m->options_.first_session_wait));
      !st.ok()) {
    return st;
  }
  // The cluster's nodes, created by whoever comes first. A ZooKeeper
  // that is busy (or a connection it drops for a moment: the client
  // reconnects within the session) fails an operation with a timeout or a
  // connection loss: retried until the start's wait is over, rather than
  // taken for a ZooKeeper that is not there (seen once in CI: "creating
  // .../election: operation timeout", the suite's ZooKeeper starved of CPU).
  const auto until =
      std::chrono::steady_clock::now() +
      std::max(m->options_.session_timeout, m->options_.first_session_wait);
  if (Status st = m->CheckNotNested(until); !st.ok()) return st;
  auto create = [&](const std::string& path) {
    return WhileZooKeeperBusy(until,
                              [&] { return CreatePersistent(m->zh_, path); });
  };
  const std::string& base = m->options_.target.path;
  for (size_t i = 1; i <= base.size(); ++i) {
    if (i == base.size() || base[i] == '/') {
      const int rc = create(base.substr(0, i));
      if (rc != ZOK) {
        return Status::Unavailable("ZooKeeper: creating " + base.substr(0, i) +
                                   ": " + ZkError(rc));
      }
    }
  }
  for (const char* child : {"/members", "/election", "/drain"}) {
    const int rc = create(base + child);
    if (rc != ZOK) {
      return Status::Unavailable("ZooKeeper: creating " + base + child + ": " +
                                 ZkError(rc));
    }
  }
  // A cluster formed with another shard count cannot take this server.
  std::string bytes;
  if (Get(m->zh_, base + "/config", false, &bytes) == ZOK) {
    auto c = DecodeConfig(bytes);
    if (!c.ok()) {
      return Status::Corruption("the configuration at " + base +
                                "/config: " + c.status().ToString());
    }
    if (c->num_shards() != m->options_.num_shards) {
      return Status::Conflict(
          "cluster " + base + " has " + std::to_string(c->num_shards()) +
          " shards; this server was started with --shards " +
          std::to_string(m->options_.num_shards));
    }
    if (Status st = SameSplits(*c, m->options_.tree_splits); !st.ok()) {
      return Status::Conflict("cluster " + base + " " + st.message());
    }
    m->WarnOtherReplicas(*c);
  }
  // The shard count is the cluster's from its first server on: PATH/shards
  // is made once, by whichever server comes first, and a server with
  // another --shards is refused here, before it registers. The
  // configuration alone did not say it while the cluster formed: a server
  // that started before the first configuration was written registered,
  // was counted a member, and then could only log the difference (seen in
  // CI under load).
  {
    const std::string mine = std::to_string(m->options_.num_shards);
    const std::string path = base + "/shards";
    int rc = WhileZooKeeperBusy(until, [&] {
      return zoo_create(m->zh_, path.c_str(), mine.data(), int(mine.size()),
                        &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
    });
    if (rc == ZNODEEXISTS) {
      std::string theirs;
      rc = WhileZooKeeperBusy(
          until, [&] { return Get(m->zh_, path, false, &theirs); });
      if (rc == ZOK && theirs != mine) {
        return Status::Conflict("cluster " + base + " has " + theirs +
                                " shards; this server was started with "
                                "--shards " +
                                mine);
      }
    }
    if (rc != ZOK) {
      return Status::Unavailable("ZooKeeper: creating " + path + ": " +
                                 ZkError(rc));
    }
  }
  if (Status st = m->CheckSecret(until); !st.ok()) return st;
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

Status ClusterMember::CheckNotNested(
    std::chrono::steady_clock::time_point until) {
  // A cluster made inside another's nodes (PATH/members/...) left nodes
  // that the outer one's manager read as bad member records for ever; one
  // above others (a parent of their paths) shared ZooKeeper's tree with
  // them. Neither is anything an operator means.
  const std::string& base = options_.target.path;
  std::vector<std::string> children;
  bool root = false;
  auto look = [&](const std::string& path) -> Status {
    const int rc = WhileZooKeeperBusy(
        until, [&] { return IsClusterRoot(zh_, path, &root, &children); });
    if (rc != ZOK) {
      return Status::Unavailable("ZooKeeper: reading " + path + ": " +
                                 ZkError(rc));
    }
    return Status::OK();
  };
  for (size_t i = 1; i < base.size(); ++i) {
    if (base[i] != '/') continue;
    const std::string up = base.substr(0, i);
    REMEM_RETURN_IF_ERROR(look(up));
    if (root) {
      return Status::InvalidArgument("--cluster: " + base +
                                     " lies inside the ZooKeeper nodes of the "
                                     "cluster at " +
                                     up +
                                     ": name a path outside every cluster's");
    }
  }
  // Below PATH, unless it is a cluster already (this server joins it).
  std::vector<std::string> pending = {base};
  for (size_t looked = 0; !pending.empty() && looked < kMaxNestingLookups;
       ++looked) {
    const std::string path = std::move(pending.back());
    pending.pop_back();
    REMEM_RETURN_IF_ERROR(look(path));
    if (root) {
      if (path == base) return Status::OK();
      return Status::InvalidArgument(
          "--cluster: " + base + " holds the cluster at " + path +
          " in ZooKeeper; a cluster cannot contain another: name a path "
          "beside it");
    }
    for (const std::string& c : children) pending.push_back(path + "/" + c);
  }
  return Status::OK();
}

Status ClusterMember::CheckSecret(std::chrono::steady_clock::time_point until) {
  // Checked before this server registers: a member whose secret the others
  // refuse was given backup roles and copies it could never receive (its
  // shards stayed filling for ever), and nothing named the mismatch.
  std::vector<std::string> members;
  if (WhileZooKeeperBusy(until, [&] {
        return Children(zh_, options_.target.path + "/members", false,
                        &members);
      }) != ZOK) {
    return Status::OK();  // the member's thread reads them again
  }
  for (const std::string& address : members) {
    if (address == options_.self.address) continue;  // a predecessor
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) break;
    SessionOptions so = options_.session;
    so.server = address;
    so.timeout = std::min<std::chrono::milliseconds>(
        {so.timeout, std::chrono::milliseconds(2000),
         std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
             std::chrono::milliseconds(1)});
    auto s = Session::Connect(so);
    if (s.ok()) return Status::OK();
    if (s.status().code() == StatusCode::kPermissionDenied) {
      return Status::PermissionDenied(
          "the cluster's member at " + address +
          " refused this server's session (" + s.status().message() +
          "): every member of cluster " + options_.target.path +
          " must be started with the same --auth-file secret; this server "
          "did not join");
    }
    log::Debug("cluster: checking the shared secret with {}: {}", address,
               s.status().ToString());
  }
  return Status::OK();
}

bool ClusterMember::Admissible(const Member& m, const Config* have) {
  if (m.address == options_.self.address) return true;
  if (have != nullptr) {
    const int i = have->IndexOf(m.address);
    if (i >= 0 && have->members[size_t(i)].incarnation == m.incarnation) {
      return true;  // admitted already
    }
  }
  auto it = admitted_.find(m.address);
  if (it != admitted_.end() && it->second.first == m.incarnation) {
    return it->second.second;
  }
  SessionOptions so = options_.session;
  so.server = m.address;
  // The manager's pass waits for it: at most half a lease, as a member's
  // ask for its lease.
  so.timeout = std::min(
      so.timeout, std::max(options_.lease / 2, std::chrono::milliseconds(100)));
  auto s = Session::Connect(so);
  const bool refused =
      !s.ok() && s.status().code() == StatusCode::kPermissionDenied;
  if (refused) {
    log::Warn(
        "cluster: {} is registered but refuses this manager's sessions ({}): "
        "it is given no shards or copies; start it with the --auth-file "
        "secret of the cluster's other servers",
        m.address, s.status().ToString());
  }
  admitted_[m.address] = {m.incarnation, !refused};
  return !refused;
}

ClusterMember::~ClusterMember() {
  Stop();
  if (zh_ != nullptr) zookeeper_close(zh_);
}

void ClusterMember::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  sessions_to_.clear();  // the thread's, and it has ended
  quick_sessions_.clear();
}

void ClusterMember::OnEvent(zhandle_t*, int type, int state, const char*,
                            void* ctx) {
  auto* self = static_cast<ClusterMember*>(ctx);
  if (type == ZOO_SESSION_EVENT) {
    self->state_.store(state, std::memory_order_relaxed);
    self->connected_.store(state == ZOO_CONNECTED_STATE,
                           std::memory_order_relaxed);
    self->ownership_->NoteZooKeeper(state == ZOO_CONNECTED_STATE);
  }
  self->Wake();
}

void ClusterMember::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    event_ = true;
  }
  cv_.notify_all();
}

Status ClusterMember::Connect(std::chrono::milliseconds wait) {
  if (zh_ != nullptr) {
    zookeeper_close(zh_);
    zh_ = nullptr;
  }
  state_.store(0);
  connected_.store(false);
  registered_.store(false);
  manager_.store(false);
  election_node_.clear();
  zh_ = zookeeper_init(options_.target.hosts.c_str(), &ClusterMember::OnEvent,
                       int(options_.session_timeout.count()), nullptr, this, 0);
  if (zh_ == nullptr) {
    return Status::InvalidArgument("ZooKeeper hosts '" + options_.target.hosts +
                                   "' refused by the client library");
  }
  // By default the client library resolves the host list again each time
  // its I/O thread looks at the socket (a netlink dump and file reads, tens
  // of times a second: half of an idle server's CPU, and 2% of a core per
  // server under a replicated load).
  // Resolved while connecting only, as ZooKeeper's Java client does: a
  // host's new address is found at the next reconnection.
  zoo_set_servers_resolution_delay(zh_, -1);
  std::unique_lock<std::mutex> lock(mu_);
  const bool up = cv_.wait_for(lock, wait, [&] {
    return stop_ || connected_.load(std::memory_order_relaxed);
  });
  if (!up || !connected_.load()) {
    return Status::Unavailable("ZooKeeper at " + options_.target.hosts +
                               " did not answer within " +
                               std::to_string(wait.count()) + " ms");
  }
  sessions_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

void ClusterMember::Run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
    }
    if (state_.load() == ZOO_EXPIRED_SESSION_STATE ||
        state_.load() == ZOO_AUTH_FAILED_STATE) {
      log::Warn("cluster: ZooKeeper session lost; opening a new one");
      if (Status st = Connect(options_.session_timeout); !st.ok()) {
        log::Warn("cluster: {}", st.ToString());
      }
    }
    const bool up = connected_.load();
    if (up != was_connected_) {
      if (up) {
        log::Info("cluster: connected to ZooKeeper at {}",
                  options_.target.hosts);
      } else {
        log::Warn(
            "cluster: lost ZooKeeper at {}; serving configuration "
            "epoch {} meanwhile",
            options_.target.hosts, ownership_->epoch());
      }
      was_connected_ = up;
    }
    if (up) Step();
    std::unique_lock<std::mutex> lock(mu_);
    // Replicated: leases are judged (and failovers decided) at least four
    // times a lease.
    const Ownership::Installed* c = ownership_->latest();
    const auto pass = c != nullptr && c->replicated
                          ? std::min<std::chrono::milliseconds>(
                                kPassInterval, options_.lease / 4)
                          : kPassInterval;
    cv_.wait_for(lock, pass, [&] { return stop_ || event_; });
    event_ = false;
  }
}

void ClusterMember::RequestDrain(
    std::string address, util::MoveFunction<void(Result<uint64_t>)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drain_requests_.emplace_back(std::move(address), std::move(done));
  }
  Wake();
}

bool ClusterMember::Step() {
  // The configuration first: a server that says it is registered serves
  // the configuration of its cluster.
  FollowConfig();
  if (!registered_.load()) {
    // Not registered (yet, or again after a lost session, which waits for
    // the old registration to expire): the member lease still asks the
    // manager ZooKeeper names now, so a new manager hears from this member
    // and does not take it for dead.
    FollowManager();
    if (!Register()) return false;
  }
  std::vector<
      std::pair<std::string, util::MoveFunction<void(Result<uint64_t>)>>>
      drains;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drains.swap(drain_requests_);
  }
  for (auto& [drain_of, done] : drains) {
    const std::string& a = drain_of;  // (a lambda cannot capture a binding)
    // A ZooKeeper slow to answer does not fail the drain: its calls are
    // made again for up to a session timeout (seen in CI: "recording the
    // drain of ...: operation timeout", the suite's ZooKeeper starved of
    // CPU for a moment).
    const auto until =
        std::chrono::steady_clock::now() + options_.session_timeout;
    // The members that would be left to hold the shards: registered (alive)
    // and not drained themselves. Checked again once the drain is recorded:
    // two drains asked of two members at once each see the other then (and
    // both are refused) rather than leaving too few servers.
    auto too_few = [&]() -> Status {
      std::vector<std::string> members, drained;
      const int mrc = WhileZooKeeperBusy(until, [&] {
        return Children(zh_, options_.target.path + "/members", false,
                        &members);
      });
      const int drc = WhileZooKeeperBusy(until, [&] {
        return Children(zh_, options_.target.path + "/drain", false, &drained);
      });
      if (mrc != ZOK || (drc != ZOK && drc != ZNONODE)) {
        return Status::Unavailable("ZooKeeper: reading the members: " +
                                   ZkError(mrc != ZOK ? mrc : drc));
      }
      const Ownership::Installed* have = ownership_->latest();
      // A server that is gone (no longer registered) or holds nothing
      // (failed over) takes no copy away: a degraded cluster may still
      // retire it (it was refused until another server was started).
      if (std::find(members.begin(), members.end(), a) == members.end() ||
          (have != nullptr &&
           !have->config.HoldsAnyRole(have->config.IndexOf(a)))) {
        return Status::OK();
      }
      size_t staying = 0;
      for (const std::string& m : members) {
        if (m != a &&
            std::find(drained.begin(), drained.end(), m) == drained.end()) {
          ++staying;
        }
      }
      const uint32_t copies = have != nullptr ? have->config.replicas + 1 : 1;
      if (staying >= copies) return Status::OK();
      // Not a bad request (exit 2 in the CLI): the cluster as it stands
      // cannot do it.
      return Status::Unsupported(
          "cannot drain " + a + ": " + std::to_string(staying) +
          " live servers would be left that are not drained, and the "
          "shards' " +
          std::to_string(copies) + " cop" +
          (copies == 1 ? "y needs one" : "ies need " + std::to_string(copies)) +
          " (start another server first)");
    };
    if (Status st = too_few(); !st.ok()) {
      done(st);
      continue;
    }
    const std::string node = options_.target.path + "/drain/" + a;
    // With the incarnation it drains (ForgetStaleDrains): a server that
    // stops and starts again comes back a new member, not drained.
    std::string record, incarnation;
    uint64_t drained_incarnation = 0;
    if (WhileZooKeeperBusy(until, [&] {
          return Get(zh_, options_.target.path + "/members/" + a, false,
                     &record);
        }) == ZOK) {
      if (auto m = DecodeMemberRecord(record); m.ok()) {
        drained_incarnation = m->incarnation;
        incarnation = std::to_string(m->incarnation);
      }
    }
    int calls = 0;
    const int rc = WhileZooKeeperBusy(
        until,
        [&] {
          return zoo_create(zh_, node.c_str(),
                            incarnation.empty() ? nullptr : incarnation.data(),
                            incarnation.empty() ? -1 : int(incarnation.size()),
                            &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
        },
        &calls);
    if (rc == ZNODEEXISTS && !incarnation.empty()) {
      // Drained again: a record of an earlier incarnation at this address
      // would be stale (ForgetStaleDrains), this one is not.
      (void)WhileZooKeeperBusy(until, [&] {
        return zoo_set(zh_, node.c_str(), incarnation.data(),
                       int(incarnation.size()), -1);
      });
    }
    if (rc != ZOK && rc != ZNODEEXISTS) {
      log::Warn("cluster: recording the drain of {}: {}", a, ZkError(rc));
      done(Status::Unavailable("ZooKeeper: recording the drain of " + a + ": " +
                               ZkError(rc)));
      continue;
    }
    // Made here, or (existing) maybe by a call of ours that timed out
    // after ZooKeeper had done it: checked again either way.
    if (rc == ZOK || (rc == ZNODEEXISTS && calls > 1)) {
      if (Status st = too_few(); !st.ok()) {
        (void)zoo_delete(zh_, node.c_str(), -1);
        done(st);
        continue;
      }
    }
    log::Info("cluster: {} is to be drained", a);
    done(drained_incarnation);
  }
  ManagerDuty();
  return true;
}

bool ClusterMember::Register() {
  const std::string& base = options_.target.path;
  const std::string me = base + "/members/" + options_.self.address;
  const std::string record = EncodeMemberRecord(options_.self);
  int rc = zoo_create(zh_, me.c_str(), record.data(), int(record.size()),
                      &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, nullptr, 0);
  if (rc == ZNODEEXISTS) {
    ::Stat st{};
    std::string held;
    rc = Get(zh_, me, true, &held, &st);
    if (rc == ZOK && st.ephemeralOwner != zoo_client_id(zh_)->client_id) {
      // A predecessor at this address (killed, its session not yet
      // expired) or another server claiming it. A predecessor that this
      // server's own address no longer reaches is replaced at once: its
      // nodes would otherwise stand for the whole session timeout, and if
      // it was the configuration manager, every step it left half done
      // (a hand-over past its point of no return: writes paused) would
      // wait that long for the next one.
      if (!ReplacePredecessor(held, st.version, st.ephemeralOwner)) {
        if (!waiting_logged_) {
          log::Warn(
              "cluster: {} is still registered by another session; waiting "
              "for it to expire",
              options_.self.address);
          waiting_logged_ = true;
        }
        return false;
      }
      rc = zoo_create(zh_, me.c_str(), record.data(), int(record.size()),
                      &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, nullptr, 0);
    }
    if (rc == ZNONODE) return false;  // gone meanwhile: retry at once
  }
  if (rc != ZOK && rc != ZNODEEXISTS) {
    log::Warn("cluster: registering {}: {}", me, ZkError(rc));
    return false;
  }
  if (election_node_.empty() && !AdoptOwnElectionNode()) return false;
  if (election_node_.empty()) {
    char created[1024];
    const std::string prefix = base + "/election/n-";
    rc = zoo_create(zh_, prefix.c_str(), options_.self.address.data(),
                    int(options_.self.address.size()), &ZOO_OPEN_ACL_UNSAFE,
                    ZOO_EPHEMERAL_SEQUENTIAL, created, sizeof(created));
    if (rc != ZOK) {
      // A timeout or a lost connection may come after ZooKeeper made the
      // node (only its answer was lost): the next pass adopts it.
      log::Warn("cluster: joining the election: {}", ZkError(rc));
      return false;
    }
    std::string node(created);
    election_node_ = node.substr(node.rfind('/') + 1);
  }
  registered_.store(true);
  waiting_logged_ = false;
  predecessor_gone_ns_ = 0;
  log::Info("cluster: {} registered in {} (election node {})",
            options_.self.address, base, election_node_);
  return true;
}

std::string ClusterMember::FormingState() const {
  if (!connected()) {
    return "this server has not reached ZooKeeper at " + options_.target.hosts;
  }
  if (!registered()) {
    return "this server is not registered in ZooKeeper yet (an earlier "
           "server at " +
           options_.self.address +
           " may hold the registration until its "
           "session expires)";
  }
  const uint32_t seen = std::max<uint32_t>(members_seen(), 1);
  if (seen < options_.initial_size) {
    return std::to_string(seen) + " of the " +
           std::to_string(options_.initial_size) +
           " servers it waits for (--cluster-size) have registered";
  }
  return "its configuration manager has not written the first "
         "configuration yet";
}

bool ClusterMember::AdoptOwnElectionNode() {
  const std::string& base = options_.target.path;
  std::vector<std::string> candidates;
  if (Children(zh_, base + "/election", false, &candidates) != ZOK) {
    return false;
  }
  const int64_t session = zoo_client_id(zh_)->client_id;
  for (const std::string& c : candidates) {  // in the election's order
    std::string address;
    ::Stat st{};
    const int rc = Get(zh_, base + "/election/" + c, false, &address, &st);
    if (rc == ZNONODE) continue;
    if (rc != ZOK) return false;
    if (st.ephemeralOwner != session) continue;
    if (election_node_.empty()) {
      election_node_ = c;
      log::Warn(
          "cluster: adopting election node {}, made by this session "
          "when ZooKeeper's answer was lost",
          c);
    } else {
      // A second node of this session's (not possible once one is
      // adopted before creating; deleted all the same).
      (void)zoo_delete(zh_, (base + "/election/" + c).c_str(), st.version);
    }
  }
  return true;
}

bool ClusterMember::ReplacePredecessor(const std::string& record,
                                       int32_t version, int64_t owner) {
  auto held = DecodeMemberRecord(record);
  if (!held.ok() || held->address != options_.self.address ||
      held->incarnation == options_.self.incarnation) {
    return false;
  }
  // Whoever answers at this address now: if it is this server, the
  // registered incarnation is not reachable there (it died, or lost its
  // listener: no client can use it as that member any more). Another
  // server answering, or none, proves nothing: wait for the node to go.
  SessionOptions so = options_.session;
  so.server = options_.self.address;
  so.timeout = std::chrono::milliseconds(500);
  auto probe = Session::Connect(so);
  if (!probe.ok() ||
      (*probe)->server_incarnation() != options_.self.incarnation) {
    return false;
  }
  // The predecessor was gone by this first answer (it no longer held the
  // address), so it asked the manager for no lease since. Replaced only
  // once the manager takes it for dead (a member lease and the margin
  // later): registered earlier, this incarnation could be judged together
  // with a predecessor whose lease still looks fresh, and a replicated
  // configuration would then name this empty process as the owner of the
  // predecessor's shards, as though it had only restarted in place.
  const uint64_t now = LeaseClockNs();
  if (predecessor_gone_ns_ == 0) predecessor_gone_ns_ = now;
  if (now - predecessor_gone_ns_ < SuspectAfterNs()) return false;
  const std::string& base = options_.target.path;
  // Only the node seen (its version): a node made since is judged again.
  const int rc =
      zoo_delete(zh_, (base + "/members/" + held->address).c_str(), version);
  if (rc != ZOK && rc != ZNONODE) return false;
  // Its election node too, so that if it was the manager the next one in
  // line takes over now.
  std::vector<std::string> candidates;
  if (Children(zh_, base + "/election", false, &candidates) == ZOK) {
    for (const std::string& c : candidates) {
      const std::string node = base + "/election/" + c;
      std::string address;
      ::Stat cs{};
      if (c == election_node_ || Get(zh_, node, false, &address, &cs) != ZOK ||
          address != options_.self.address || cs.ephemeralOwner != owner) {
        continue;
      }
      (void)zoo_delete(zh_, node.c_str(), cs.version);
    }
  }
  log::Warn(
      "cluster: {} was still registered by its previous incarnation {} "
      "(killed, its ZooKeeper session not yet expired), which no longer "
      "answers at this address: its registration is replaced now",
      options_.self.address, held->incarnation);
  return true;
}

void ClusterMember::FollowConfig() {
  std::string bytes;
  const uint64_t asked_ns = LeaseClockNs();
  const int rc = Get(zh_, options_.target.path + "/config", true, &bytes);
  // ZooKeeper answered: the session was alive when it was asked.
  if (rc == ZOK || rc == ZNONODE) {
    const int granted = zoo_recv_timeout(zh_);
    if (granted > 0 &&
        session_granted_ms_.exchange(uint64_t(granted)) != uint64_t(granted) &&
        granted != options_.session_timeout.count()) {
      // ZooKeeper bounds a session's timeout by its tickTime (2 to 20
      // ticks by default) and says so to no one: a killed manager is then
      // replaced after the granted time, not the asked one.
      log::Warn(
          "cluster: ZooKeeper granted a session timeout of {} ms, not the "
          "{} ms of --cluster-session-ms (it bounds them by its tickTime: "
          "minSessionTimeout, maxSessionTimeout); a configuration manager "
          "that dies is replaced after about {} ms",
          granted, options_.session_timeout.count(), granted);
    }
    zk_ok_ns_.store(asked_ns);
  }
  if (rc == ZNONODE) {
    // Watch for its creation.
    ::Stat st{};
    (void)zoo_exists(zh_, (options_.target.path + "/config").c_str(), 1, &st);
    return;
  }
  if (rc != ZOK) return;
  auto c = DecodeConfig(bytes);
  if (!c.ok()) {
    log::Error("cluster: the configuration in ZooKeeper is unreadable: {}",
               c.status().ToString());
    return;
  }
  if (c->num_shards() != options_.num_shards) {
    log::Error("cluster: the configuration has {} shards, this server {}",
               c->num_shards(), options_.num_shards);
    return;
  }
  if (Status st = SameSplits(*c, options_.tree_splits);
      !st.ok() && !splits_warned_) {
    // The cluster formed while this server started (Start checks a formed
    // one): the configuration's ranges are the cluster's, and serve.
    log::Warn("cluster: the configuration {}; the configuration's are used",
              st.message());
    splits_warned_ = true;
  }
  WarnOtherReplicas(*c);  // a cluster formed while this server started
  const uint32_t epoch = c->epoch;
  // A first configuration's moves may be past their handoff (this server
  // restarted during one, perhaps after its release here): only if
  // ZooKeeper's record says this epoch, or cannot be read.
  bool past_handoff = true;
  if (ownership_->latest() == nullptr && c->moving() + c->moving_ranges() > 0) {
    std::string handoff;
    const int hrc =
        Get(zh_, options_.target.path + "/handoff", false, &handoff);
    if (hrc == ZNONODE || (hrc == ZOK && handoff != std::to_string(epoch))) {
      past_handoff = false;
    }
  }
  if (ownership_->Install(std::move(*c), past_handoff)) {
    const auto* cur = ownership_->latest();
    log::Info(
        "cluster: configuration epoch {} installed{}: {} members, this "
        "server owns {} of {} shards",
        epoch,
        ownership_->current() == nullptr
            ? " (served once what it does not give this server is deleted)"
            : "",
        cur->config.members.size(), cur->owned, cur->config.num_shards());
  }
  config_seen_ = true;
}

void ClusterMember::WarnOtherReplicas(const Config& c) {
  // --replicas is a new cluster's: the formed one keeps its own.
  if (replicas_warned_ || options_.replicas == 0 ||
      options_.replicas == c.replicas) {
    return;
  }
  log::Warn(
      "cluster {} was formed with --replicas {}: this server's --replicas "
      "{} changes nothing (it is read only when a cluster forms)",
      options_.target.path, c.replicas, options_.replicas);
  replicas_warned_ = true;
}

void ClusterMember::FollowManager(std::string first) {
  const std::string& base = options_.target.path;
  if (first.empty()) {
    std::vector<std::string> candidates;
    if (Children(zh_, base + "/election", false, &candidates) != ZOK ||
        candidates.empty()) {
      return;
    }
    first = candidates.front();
  }
  // Where members ask for their leases.
  std::string address;
  ::Stat st{};
  if (Get(zh_, base + "/election/" + first, false, &address, &st) == ZOK) {
    if (!election_node_.empty() && first != election_node_ &&
        st.ephemeralOwner == zoo_client_id(zh_)->client_id) {
      // A node of this session's other than the one it adopted (made by a
      // create whose answer was lost, and seen only now): it would stand
      // for this server as manager while this server is not. Its deletion
      // fires the election's watch.
      log::Warn(
          "cluster: deleting election node {}, a second one of this "
          "session's",
          first);
      (void)zoo_delete(zh_, (base + "/election/" + first).c_str(), st.version);
      return;
    }
    std::lock_guard<std::mutex> lock(lease_mu_);
    manager_address_ = std::move(address);
  }
}

void ClusterMember::ManagerDuty() {
  const std::string& base = options_.target.path;
  std::vector<std::string> candidates;
  if (Children(zh_, base + "/election", true, &candidates) != ZOK) return;
  const bool lead = !candidates.empty() && candidates.front() == election_node_;
  if (lead != manager_.load()) {
    log::Info("cluster: {} the configuration manager",
              lead ? "this server is now" : "this server is no longer");
    if (lead) {
      // A new term: what members asked of an earlier term of this server
      // (before another manager's) says nothing now; each is judged from
      // when this term first sees it.
      std::lock_guard<std::mutex> lock(lease_mu_);
      renewals_.clear();
    }
    manager_since_ns_.store(LeaseClockNs());
    manager_.store(lead);
  }
  if (!candidates.empty()) FollowManager(candidates.front());
  std::vector<std::string> members;
  if (Children(zh_, base + "/members", true, &members) != ZOK) return;
  members_seen_.store(uint32_t(members.size()));
  if (!lead) return;
  if (!config_seen_ && members.size() < options_.initial_size) return;
  std::vector<Member> all;
  for (const std::string& name : members) {
    std::string bytes;
    if (Get(zh_, base + "/members/" + name, false, &bytes) != ZOK) return;
    auto m = DecodeMemberRecord(bytes);
    if (!m.ok()) {
      // Once per record: such a node (another program's, or an earlier
      // cluster's made inside this one's nodes) stays, and was warned about
      // every pass, four times a second, for ever.
      if (bad_records_.insert(name).second) {
        log::Warn("cluster: ignoring member {} (warned once): {}", name,
                  m.status().ToString());
      }
      continue;
    }
    bad_records_.erase(name);
    all.push_back(std::move(*m));
  }
  std::erase_if(bad_records_, [&](const std::string& name) {
    return !std::binary_search(members.begin(), members.end(), name);
  });
  {
    const Ownership::Installed* have = ownership_->latest();
    for (auto it = admitted_.begin(); it != admitted_.end();) {
      it = std::binary_search(members.begin(), members.end(), it->first)
               ? std::next(it)
               : admitted_.erase(it);
    }
    std::erase_if(all, [&](const Member& m) {
      return !Admissible(m, have == nullptr ? nullptr : &have->config);
    });
  }
  if (config_seen_) {
    const Ownership::Installed* have = ownership_->latest();
    if (have != nullptr && have->config.replicas > 0) return FailOver(all);
    return Rebalance(all);
  }
  if (all.size() < options_.initial_size) return;
  if (all.size() > kMaxMembers) all.resize(kMaxMembers);
  Config c = InitialConfig(options_.target.name, 1, std::move(all),
                           options_.num_shards, options_.replicas,
                           options_.tree_splits);
  const std::string bytes = EncodeConfig(c);
  if (bytes.size() > size_t(kMaxConfigBytes)) {
    log::Error(
        "cluster: the first configuration takes {} bytes, more than a "
        "ZooKeeper node holds ({}): fewer --shards or --tree-splits",
        bytes.size(), kMaxConfigBytes);
    return;
  }
  // Created once: if another manager got there first, this fails and the
  // next FollowConfig installs theirs.
  const int rc =
      zoo_create(zh_, (base + "/config").c_str(), bytes.data(),
                 int(bytes.size()), &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
  if (rc == ZOK) {
    log::Info("cluster: formed {} with {} servers and {} shards (epoch 1)",
              base, c.members.size(), c.num_shards());
  } else if (rc != ZNODEEXISTS) {
    log::Warn("cluster: writing the first configuration: {}", ZkError(rc));
  }
  FollowConfig();
}

// --- moving shards (member.h)

namespace {

bool IsLive(const std::vector<Member>& live, const std::string& address) {
  return std::any_of(live.begin(), live.end(),
                     [&](const Member& m) { return m.address == address; });
}

// Whether the configuration's member `m` is still the server registered
// at its address: one started again there (killed and back at once) is
// another incarnation, a new member, which holds nothing of what a move
// copied to or from the old one. An incarnation of 0 (unknown) matches.
bool IsLiveMember(const std::vector<Member>& live, const Member& m) {
  return std::any_of(live.begin(), live.end(), [&](const Member& l) {
    return l.address == m.address &&
           (m.incarnation == 0 || l.incarnation == 0 ||
            l.incarnation == m.incarnation);
  });
}

// Moving shards grouped by (owner, next).
std::map<std::pair<uint16_t, uint16_t>, std::vector<uint32_t>> MovesOf(
    const Config& c) {
  std::map<std::pair<uint16_t, uint16_t>, std::vector<uint32_t>> out;
  for (uint32_t s = 0; s < c.num_shards(); ++s) {
    if (c.NextOf(s) != kNoMember) out[{c.owner[s], c.next[s]}].push_back(s);
  }
  return out;
}

uint64_t MsSince(std::chrono::steady_clock::time_point t) {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t)
                      .count());
}

// Small pages: a page is built, and imported, in one go on a partition's
// thread, which serves nothing else meanwhile.
constexpr uint32_t kExportPageBytes = 256u << 10;

}  // namespace

Status ClusterMember::WriteConfig(const Config& planned, int version) {
  // Replicated ranges go where their carrier shards went (config.h).
  Config next = planned;
  next.FollowCarriers();
  const std::string bytes = EncodeConfig(next);
  const int rc = zoo_set(zh_, (options_.target.path + "/config").c_str(),
                         bytes.data(), int(bytes.size()), version);
  if (rc == ZOK) {
    written_epoch_ = next.epoch;
    return Status::OK();
  }
  if (rc == ZBADVERSION) {
    return Status::Conflict("the configuration changed meanwhile");
  }
  return Status::Unavailable("ZooKeeper: writing the configuration: " +
                             ZkError(rc));
}

std::string ClusterMember::manager_address() const {
  std::lock_guard<std::mutex> lock(lease_mu_);
  return manager_address_;
}

uint64_t ClusterMember::SuspectAfterNs() const {
  return uint64_t(options_.lease.count()) * 1000000ull + kLeaseMarginNs;
}

Result<std::string> ClusterMember::GrantLease(std::string_view request) {
  auto ask = DecodeLeaseAsk(request);
  if (!ask.ok()) return ask.status();
  if (!manager_.load()) {
    return Status::Conflict("this server is not the configuration manager");
  }
  // Only while this manager's ZooKeeper session is surely alive: every
  // lease it grants lapses before the session could have expired (and a
  // successor been elected).
  const uint64_t now = LeaseClockNs();
  // The session's timeout as ZooKeeper granted it (it bounds what a client
  // asks for by its tick), not as asked.
  const uint64_t session_ns =
      std::min<uint64_t>(uint64_t(options_.session_timeout.count()),
                         session_granted_ms_.load()) *
      1000000ull;
  const uint64_t zk_ok = zk_ok_ns_.load();
  const uint64_t since_zk = now > zk_ok ? now - zk_ok : 0;
  // (Not merely while connected: the client library reconnects within the
  // session, and a replicated cluster must not stop at a ZooKeeper blip.)
  if (since_zk + SuspectAfterNs() >= session_ns) {
    refused_ns_.store(now);
    return Status::Unavailable(
        "the configuration manager has lost ZooKeeper: no lease granted");
  }
  const Ownership::Installed* c = ownership_->latest();
  if (c == nullptr) return Status::Busy("no configuration yet");
  LeaseGrant grant;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    if (c->config.epoch < grants_from_epoch_) {
      refused_ns_.store(now);
      return Status::Busy("a failover is being recorded");
    }
    renewals_[ask->address] = {ask->incarnation, now, true};
  }
  grant.epoch = c->config.epoch;
  grant.lease_ms = uint32_t(options_.lease.count());
  if (ask->epoch < c->config.epoch) grant.config = c->encoded;
  return EncodeLeaseGrant(grant);
}

void ClusterMember::FailOver(const std::vector<Member>& registered) {
  const uint64_t now = LeaseClockNs();
  // A new manager has heard from nobody: it waits until any lease granted
  // before it took office has lapsed.
  if (now - manager_since_ns_.load() < SuspectAfterNs()) return;
  // Nor does it judge members it refused a lease to itself (it had lost
  // ZooKeeper, or was recording a failover) until they had the time to
  // ask again.
  const uint64_t refused = refused_ns_.load();
  if (refused != 0 && (refused >= now || now - refused < SuspectAfterNs())) {
    return;
  }
  int version = 0;
  std::optional<Config> c = ReadConfig(&version);
  if (!c) return;
  // Live: a member of the configuration that asked for its lease (with its
  // incarnation) within lease + margin; a registered member with another
  // incarnation (restarted: Failover treats it as new); a registered member
  // that is not in the configuration (new).
  std::vector<Member> live;
  for (const Member& r : registered) {
    const int i = c->IndexOf(r.address);
    if (i < 0 || c->members[size_t(i)].incarnation != r.incarnation) {
      live.push_back(r);
    }
  }
  std::optional<Config> next;
  {
    // Judged and closed in one go: a member granted a lease after this
    // judgement would hold it on the configuration being replaced, so no
    // grant is made on it from now on (grants_from_epoch_).
    std::lock_guard<std::mutex> lock(lease_mu_);
    const uint64_t judged_ns = LeaseClockNs();
    for (const Member& m : c->members) {
      // A member this manager has not heard from yet (it joined, or was
      // slow to find the manager) is judged from when it was first seen
      // here; what an earlier manager granted has lapsed by then (above).
      // One that is not registered in ZooKeeper either (its session is
      // gone: it died with the previous manager) holds no lease and is
      // not coming: judged at once.
      auto it =
          renewals_
              .try_emplace(m.address, Renewal{m.incarnation, judged_ns, false})
              .first;
      const bool registered_now =
          std::any_of(registered.begin(), registered.end(),
                      [&](const Member& r) { return r.address == m.address; });
      if (it->second.incarnation == m.incarnation &&
          (it->second.asked || registered_now) &&
          LeaseClockNs() - it->second.at_ns < SuspectAfterNs()) {
        live.push_back(m);
      }
    }
    next = Failover(*c, live);
    if (next) grants_from_epoch_ = next->epoch;
  }
  if (!next) return Reshape(*c, version, live, registered);
  std::string gone;
  for (size_t i = 0; i < c->members.size(); ++i) {
    if (next->members[i].incarnation != c->members[i].incarnation ||
        (c->ShardsOf(int(i)) > 0 && next->ShardsOf(int(i)) == 0)) {
      gone += (gone.empty() ? "" : ", ") + c->members[i].address;
    }
  }
  if (Status w = WriteConfig(*next, version); !w.ok()) {
    log::Warn("cluster: failing over at epoch {}: {}", next->epoch,
              w.ToString());
    std::lock_guard<std::mutex> lock(lease_mu_);
    grants_from_epoch_ = 0;
    return;
  }
  if (gone.empty()) {
    log::Info("cluster: epoch {}: {} members listed", next->epoch,
              next->members.size());
  } else {
    failovers_.fetch_add(1, std::memory_order_relaxed);
    log::Warn(
        "cluster: epoch {} fails over from {} (shards to their backups; "
        "members that left back up nothing)",
        next->epoch, gone);
  }
  FollowConfig();
}

void ClusterMember::Reshape(const Config& c, int version,
                            const std::vector<Member>& live,
                            const std::vector<Member>& registered) {
  const std::string& base = options_.target.path;
  std::vector<std::string> drained;
  if (Children(zh_, base + "/drain", true, &drained) != ZOK) drained.clear();
  ForgetStaleDrains(&drained, registered);
  // Drained members that stopped leave the configuration once they hold
  // nothing, so clients stop trying them, and their drain records go; only
  // between steps (a new epoch would start a copy over).
  if (c.moving() == 0 && c.filling_shards() == 0) {
    std::vector<std::string> leaving;
    for (const std::string& a : drained) {
      if (c.IndexOf(a) >= 0 && !IsLive(registered, a)) leaving.push_back(a);
    }
    if (std::optional<Config> pruned = DropLeftMembers(c, leaving)) {
      if (Status w = WriteConfig(*pruned, version); !w.ok()) {
        log::Warn("cluster: dropping drained members at epoch {}: {}",
                  pruned->epoch, w.ToString());
        return;
      }
      log::Info("cluster: epoch {}: {} drained members that stopped leave",
                pruned->epoch, c.members.size() - pruned->members.size());
      // Done with: one that comes back is a new member, not drained.
      for (const std::string& a : leaving) {
        if (pruned->IndexOf(a) < 0) {
          (void)zoo_delete(zh_, (base + "/drain/" + a).c_str(), -1);
        }
      }
      return FollowConfig();
    }
  }
  // A drained member that left and holds nothing is done with. (In a
  // replicated cluster one still listed keeps its record until the block
  // above drops it, between steps: deleted during a step, while the
  // others balance their copies, it was never dropped.)
  for (auto it = drained.begin(); it != drained.end();) {
    const int i = c.IndexOf(*it);
    bool holds = i >= 0 && c.ShardsOf(i) > 0;
    for (uint32_t s = 0; i >= 0 && s < c.num_shards() && !holds; ++s) {
      holds = c.IsBackup(s, i);
    }
    if (c.replicas > 0 && i >= 0) holds = true;
    if (!IsLive(registered, *it) && !holds) {
      (void)zoo_delete(zh_, (base + "/drain/" + *it).c_str(), -1);
      it = drained.erase(it);
    } else {
      ++it;
    }
  }
  // New roles go only to members that hold a lease and are registered in
  // ZooKeeper: one that stopped is unregistered at once, while its lease
  // runs a little longer.
  std::vector<Member> staying;
  for (const Member& m : live) {
    if (IsLive(registered, m.address)) staying.push_back(m);
  }
  if (c.moving() > 0) {
    if (Status h = HandOverToBackups(c, version); !h.ok()) {
      log::Debug("cluster: handing shards over at epoch {}: {} (again)",
                 c.epoch, h.ToString());
    }
    return;
  }
  if (!drained.empty()) {
    if (std::optional<Config> step = DrainStep(c, staying, drained)) {
      return WriteStep(*step, version, "draining");
    }
  }
  Replenish(c, version, staying, drained);
}

void ClusterMember::ForgetStaleDrains(std::vector<std::string>* drained,
                                      const std::vector<Member>& registered) {
  const std::string& base = options_.target.path;
  for (auto it = drained->begin(); it != drained->end();) {
    std::string bytes;
    uint64_t drained_incarnation = 0;
    if (Get(zh_, base + "/drain/" + *it, false, &bytes) == ZOK) {
      // No number (a record of an older server): never stale.
      (void)std::from_chars(bytes.data(), bytes.data() + bytes.size(),
                            drained_incarnation);
    }
    const std::string& a = *it;
    const bool stale =
        drained_incarnation != 0 &&
        std::any_of(registered.begin(), registered.end(), [&](const Member& m) {
          return m.address == a && m.incarnation != drained_incarnation;
        });
    if (!stale) {
      ++it;
      continue;
    }
    log::Info(
        "cluster: {} started again after its drain: a new member, not "
        "drained",
        a);
    (void)zoo_delete(zh_, (base + "/drain/" + a).c_str(), -1);
    it = drained->erase(it);
  }
}

void ClusterMember::WriteStep(const Config& step, int version,
                              const char* why) {
  if (Status w = WriteConfig(step, version); !w.ok()) {
    log::Warn("cluster: {} at epoch {}: {}", why, step.epoch, w.ToString());
    return;
  }
  if (step.moving() > 0) {
    log::Info(
        "cluster: epoch {}: {}, {} shards to be handed over to their "
        "backups",
        step.epoch, why, step.moving());
  } else {
    log::Info(
        "cluster: epoch {}: {}, {} shards get a new copy (filling) in "
        "place of one that retires",
        step.epoch, why, step.filling_shards());
  }
  FollowConfig();
  Wake();  // the hand-over or the copies at once
}

Status ClusterMember::HandOverToBackups(const Config& moving, int version) {
  const auto start = std::chrono::steady_clock::now();
  const auto quick = std::max<std::chrono::milliseconds>(
      options_.lease, std::chrono::milliseconds(100));
  std::map<uint16_t, std::vector<uint32_t>> by_owner;
  for (uint32_t s = 0; s < moving.num_shards(); ++s) {
    if (moving.NextOf(s) != kNoMember) by_owner[moving.owner[s]].push_back(s);
  }
  // Each owner freezes its shards (writes answer Busy) and answers once
  // its backups hold every write it made: the backup taking over then has
  // every write the owner acknowledged, and the owner holds no write the
  // backup lacks, so it stays a ready backup. The keys noted meanwhile are
  // not needed (paged out only to be forgotten).
  for (const auto& [owner, shards] : by_owner) {
    const std::string& from = moving.members[owner].address;
    bool more = true;
    while (more) {
      auto r =
          Call(from, moving.epoch, hash::MethodId(hash::HashMethod::kShardSync),
               hash::EncodeShardList({shards, hash::kShardFreeze}), quick);
      if (!r.ok()) return r.status().WithContext(from);
      auto pairs = hash::DecodeShardPairs(*r);
      if (!pairs.ok()) return pairs.status().WithContext(from);
      more = pairs->cursor != hash::kShardCursorDone;
    }
  }
  // The ordered ranges their carriers take along (config.h), the same way.
  for (uint32_t r = 0; r < moving.num_ranges(); ++r) {
    if (moving.RangeNextOf(r) == kNoMember) continue;
    const std::string& from = moving.members[moving.range_owner[r]].address;
    bool more = true;
    while (more) {
      auto t = CallService(tree::kTreeService, from, moving.epoch,
                           tree::MethodId(tree::TreeMethod::kRangeSync),
                           tree::EncodeTreeRange({r, tree::kRangeFreeze, {}}),
                           quick);
      if (!t.ok()) return t.status().WithContext(from);
      auto pairs = tree::DecodeRangePairs(*t);
      if (!pairs.ok()) return pairs.status().WithContext(from);
      more = pairs->more;
    }
  }
  const Config done = CompleteMoves(moving);
  REMEM_RETURN_IF_ERROR(WriteConfig(done, version));
  shards_moved_.fetch_add(moving.moving(), std::memory_order_relaxed);
  const uint64_t ms = MsSince(start);
  last_pause_ms_.store(ms, std::memory_order_relaxed);
  log::Info(
      "cluster: epoch {}: {} shards handed over to their backups (writes "
      "paused {} ms)",
      done.epoch, moving.moving(), ms);
  FollowConfig();
  return Status::OK();
}

void ClusterMember::Replenish(const Config& c, int version,
                              const std::vector<Member>& live,
                              const std::vector<std::string>& drained) {
  if (c.filling_shards() == 0) {
    fill_epoch_ = 0;
    // Never a drained member for new copies.
    std::optional<Config> plan = PlanBackups(c, live, kMaxShards, drained);
    if (!plan) {
      // Whole: balanced next (a member joined or returned).
      std::optional<Config> step =
          BalanceReplicas(c, live, drained, options_.max_moves);
      if (step) WriteStep(*step, version, "balancing");
      return;
    }
    if (Status w = WriteConfig(*plan, version); !w.ok()) {
      log::Warn("cluster: planning backups at epoch {}: {}", plan->epoch,
                w.ToString());
      return;
    }
    log::Info("cluster: epoch {} gives {} shards short of copies new backups",
              plan->epoch, plan->filling_shards());
    return FollowConfig();
  }
  // Calls short enough that the leases are still judged every pass or two.
  const auto quick = std::max<std::chrono::milliseconds>(
      options_.lease, std::chrono::milliseconds(100));
  // The shards being filled, by the member filled and by their primary.
  std::map<uint16_t, std::vector<uint32_t>> by_backup, by_primary;
  for (uint32_t s = 0; s < c.num_shards(); ++s) {
    bool any = false;
    for (uint32_t i = 0; i < c.replicas; ++i) {
      const size_t at = size_t(s) * c.replicas + i;
      if (!c.FillingAt(at)) continue;
      by_backup[c.backups[at]].push_back(s);
      any = true;
    }
    if (any) by_primary[c.owner[s]].push_back(s);
  }
  // Ordered ranges ride their carrier shards (config.h): a shard's copy is
  // whole once the ranges it carries are copied too.
  auto carried = [&c](const std::vector<uint32_t>& shards) {
    std::vector<uint32_t> ranges;
    for (uint32_t r = 0; r < c.num_ranges(); ++r) {
      if (std::binary_search(shards.begin(), shards.end(), c.CarrierOf(r))) {
        ranges.push_back(r);
      }
    }
    return ranges;
  };
  if (fill_epoch_ != c.epoch) {
    if (written_epoch_ != c.epoch) {
      // Another manager may have started copies at this epoch: a round of
      // this manager's own starts at the next.
      Config again = c;
      again.epoch = c.epoch + 1;
      if (Status w = WriteConfig(again, version); !w.ok()) {
        log::Warn("cluster: restarting the copies at epoch {}: {}", again.epoch,
                  w.ToString());
        return;
      }
      return FollowConfig();
    }
    for (const auto& [b, shards] : by_backup) {
      auto r =
          Call(c.members[b].address, c.epoch,
               hash::MethodId(hash::HashMethod::kShardDrop),
               hash::EncodeShardList({shards, hash::kShardForFill}), quick);
      if (!r.ok()) {
        log::Debug("cluster: emptying {} for its copies: {}",
                   c.members[b].address, r.status().ToString());
        return;  // again at the next pass
      }
      for (uint32_t range : carried(shards)) {
        auto d = CallService(
            tree::kTreeService, c.members[b].address, c.epoch,
            tree::MethodId(tree::TreeMethod::kRangeDrop),
            tree::EncodeTreeRange({range, tree::kRangeForFill, {}}), quick);
        if (!d.ok()) {
          log::Debug("cluster: emptying {} of ordered range {}: {}",
                     c.members[b].address, range, d.status().ToString());
          return;
        }
      }
    }
    fill_epoch_ = c.epoch;
    fill_started_ = std::chrono::steady_clock::now();
  }
  std::vector<uint32_t> filled;
  uint64_t pairs = 0;
  bool all = true;
  for (const auto& [p, shards] : by_primary) {
    auto r = Call(c.members[p].address, c.epoch,
                  hash::MethodId(hash::HashMethod::kShardFill),
                  hash::EncodeShardList({shards, 0}), quick);
    auto progress = r.ok() ? hash::DecodeShardFillReply(*r)
                           : Result<hash::ShardFillProgress>(r.status());
    if (!progress.ok()) {
      log::Debug("cluster: copying shards from {}: {}", c.members[p].address,
                 progress.status().ToString());
      all = false;
      continue;
    }
    pairs += progress->pairs_total;
    log::Debug("cluster: copying {} shards from {}: {} of {} pairs sent{}",
               shards.size(), c.members[p].address, progress->pairs_copied,
               progress->pairs_total, progress->done ? ", all held" : "");
    // The ranges' copies start with the shards' (a first call starts one).
    bool ranges_done = true;
    for (uint32_t range : carried(shards)) {
      auto t = CallService(tree::kTreeService, c.members[p].address, c.epoch,
                           tree::MethodId(tree::TreeMethod::kRangeFill),
                           tree::EncodeTreeRange({range, 0, {}}), quick);
      auto tp = t.ok() ? tree::DecodeTreeRangeFillReply(*t)
                       : Result<tree::TreeRangeFillProgress>(t.status());
      if (!tp.ok()) {
        log::Debug("cluster: copying ordered range {} from {}: {}", range,
                   c.members[p].address, tp.status().ToString());
        ranges_done = false;
        continue;
      }
      pairs += tp->copied;
      ranges_done = ranges_done && tp->done;
    }
    if (!progress->done || !ranges_done) {
      all = false;
      continue;
    }
    filled.insert(filled.end(), shards.begin(), shards.end());
  }
  if (!all) return;
  const Config done = CompleteFills(c, filled);
  if (Status w = WriteConfig(done, version); !w.ok()) {
    log::Warn("cluster: completing the copies at epoch {}: {}", done.epoch,
              w.ToString());
    return;
  }
  fill_epoch_ = 0;
  const uint64_t ms = MsSince(fill_started_);
  shards_filled_.fetch_add(filled.size(), std::memory_order_relaxed);
  last_fill_ms_.store(ms, std::memory_order_relaxed);
  log::Info(
      "cluster: epoch {}: {} shards have all their copies again ({} pairs "
      "copied in {} ms)",
      done.epoch, filled.size(), pairs, ms);
  FollowConfig();
  // The retired copies are deleted where they were (a member that no longer
  // holds a shard only keeps its pairs as garbage; one that cannot be
  // reached now deletes them when it installs `done`: the hash store's
  // SettleShards_st).
  std::map<uint16_t, std::vector<uint32_t>> retired;
  for (uint32_t s : filled) {
    if (c.RetiringOf(s) != kNoMember) retired[c.RetiringOf(s)].push_back(s);
  }
  for (const auto& [m, shards] : retired) {
    auto r = Call(c.members[m].address, done.epoch,
                  hash::MethodId(hash::HashMethod::kShardDrop),
                  hash::EncodeShardList({shards, hash::kShardForget}), quick);
    if (!r.ok()) {
      log::Debug("cluster: deleting the retired copies at {}: {}",
                 c.members[m].address, r.status().ToString());
    }
  }
}

Result<std::string> ClusterMember::Call(const std::string& address,
                                        uint32_t epoch, uint8_t method,
                                        std::string payload,
                                        std::chrono::milliseconds quick) {
  return CallService(hash::kHashService, address, epoch, method,
                     std::move(payload), quick);
}

Result<std::string> ClusterMember::CallTree(const std::string& address,
                                            uint32_t epoch, uint8_t method,
                                            std::string payload) {
  return CallService(tree::kTreeService, address, epoch, method,
                     std::move(payload), std::chrono::milliseconds(0));
}

Result<std::string> ClusterMember::CallService(
    uint8_t service, const std::string& address, uint32_t epoch, uint8_t method,
    std::string payload, std::chrono::milliseconds quick) {
  const bool is_quick = quick.count() > 0;
  auto& sessions = is_quick ? quick_sessions_ : sessions_to_;
  const auto deadline = std::chrono::steady_clock::now() +
                        (is_quick ? quick : options_.session.timeout);
  auto pause = std::chrono::milliseconds(5);
  while (true) {
    Status failure;
    auto it = sessions.find(address);
    if (it == sessions.end() || !it->second->connected()) {
      SessionOptions so = options_.session;
      so.server = address;
      if (is_quick) so.timeout = quick;
      auto s = Session::Connect(so);
      if (s.ok()) {
        it = sessions.insert_or_assign(address, std::move(*s)).first;
        ++connects_[address];
      } else {
        failure = s.status();
      }
    }
    if (failure.ok()) {
      client::SessionCore* core = it->second->core();
      core->rpc()->set_epoch(epoch);
      auto r = core->CallSync(service, method, payload);
      if (!r.ok() && r.status().code() == StatusCode::kTimedOut) {
        // No call is left on it (CallSync expired them); the member may have
        // restarted at the same address, which over shared memory nothing
        // tells this session: the next call connects again.
        sessions.erase(it);
      }
      if (r.ok() || r.status().code() != StatusCode::kBusy) return r;
      failure = r.status();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return Status::Unavailable("the server is stopping");
    }
    if (failure.code() != StatusCode::kBusy) {
      // Not reachable: a member whose registration is gone is not coming
      // back as this one (the step that needs it is then abandoned or
      // finished without it), so waiting out the deadline only delays
      // that.
      ::Stat st{};
      const std::string node = options_.target.path + "/members/" + address;
      if (zoo_exists(zh_, node.c_str(), 0, &st) == ZNONODE) {
        return failure.WithContext("moving shards: " + address +
                                   " (no longer registered)");
      }
    }
    if (std::chrono::steady_clock::now() + pause > deadline) {
      return failure.WithContext("moving shards: " + address);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

std::optional<Config> ClusterMember::ReadConfig(int* version) {
  std::string bytes;
  ::Stat st{};
  if (Get(zh_, options_.target.path + "/config", false, &bytes, &st) != ZOK) {
    return std::nullopt;
  }
  auto c = DecodeConfig(bytes);
  if (!c.ok()) return std::nullopt;
  *version = st.version;
  return std::move(*c);
}

void ClusterMember::Rebalance(const std::vector<Member>& live) {
  const std::string& base = options_.target.path;
  int version = 0;
  std::optional<Config> c = ReadConfig(&version);
  if (!c) return;
  std::vector<std::string> drained;
  if (Children(zh_, base + "/drain", true, &drained) != ZOK) return;
  ForgetStaleDrains(&drained, live);
  // A drained member that left and owns nothing is done with.
  for (auto it = drained.begin(); it != drained.end();) {
    const int i = c->IndexOf(*it);
    if (!IsLive(live, *it) &&
        (i < 0 || (c->ShardsOf(i) == 0 && c->RangesOf(i) == 0))) {
      (void)zoo_delete(zh_, (base + "/drain/" + *it).c_str(), -1);
      it = drained.erase(it);
    } else {
      ++it;
    }
  }
  if (c->moving() > 0 || c->moving_ranges() > 0) {
    std::string handoff;
    const bool past = Get(zh_, base + "/handoff", false, &handoff) == ZOK &&
                      handoff == std::to_string(c->epoch);
    if (!past) {
      bool reachable = true;
      for (uint32_t s = 0; s < c->num_shards(); ++s) {
        if (c->NextOf(s) == kNoMember) continue;
        reachable = reachable && IsLiveMember(live, c->members[c->owner[s]]) &&
                    IsLiveMember(live, c->members[c->next[s]]);
      }
      for (uint32_t r = 0; r < c->num_ranges(); ++r) {
        if (c->RangeNextOf(r) == kNoMember) continue;
        reachable = reachable &&
                    IsLiveMember(live, c->members[c->range_owner[r]]) &&
                    IsLiveMember(live, c->members[c->range_next[r]]);
      }
      if (!reachable) {
        log::Warn(
            "cluster: a server of the moves of epoch {} left (or was started "
            "again: a new member); the moves are abandoned",
            c->epoch);
        if (WriteConfig(AbandonMoves(*c), version).ok()) FollowConfig();
        return;
      }
      const auto start = std::chrono::steady_clock::now();
      if (Status copy = CopyMoving(*c); !copy.ok()) {
        if (range_import_full_) {
          // The new owner cannot hold the range (its --tree-memory): the
          // move is abandoned (its copy there is deleted as the
          // configuration that abandons it is installed) and not tried
          // again by this manager while that member runs on.
          for (uint32_t r = 0; r < c->num_ranges(); ++r) {
            if (c->RangeNextOf(r) == kNoMember) continue;
            const std::string& to = c->members[c->range_next[r]].address;
            uint64_t incarnation = 0;
            for (const Member& m : live) {
              if (m.address == to) incarnation = m.incarnation;
            }
            refused_ranges_.push_back({r, to, incarnation});
            ranges_refused_.fetch_add(1, std::memory_order_relaxed);
          }
          log::Error(
              "cluster: the ordered range moving in epoch {} does not fit its "
              "new owner ({}); the move is abandoned",
              c->epoch, copy.ToString());
          if (WriteConfig(AbandonMoves(*c), version).ok()) FollowConfig();
          return;
        }
        log::Warn("cluster: copying the shards of epoch {}: {} (retried)",
                  c->epoch, copy.ToString());
        return;
      }
      // The point of no return: the new owners hold everything.
      const std::string e = std::to_string(c->epoch);
      const auto handoff_start = std::chrono::steady_clock::now();
      int rc = zoo_create(zh_, (base + "/handoff").c_str(), e.data(),
                          int(e.size()), &ZOO_OPEN_ACL_UNSAFE, 0, nullptr, 0);
      if (rc == ZNODEEXISTS) {
        rc = zoo_set(zh_, (base + "/handoff").c_str(), e.data(), int(e.size()),
                     -1);
      }
      if (rc != ZOK) {
        log::Warn("cluster: recording the handoff of epoch {}: {}", c->epoch,
                  ZkError(rc));
        return;
      }
      pause_parts_.handoff = MsSince(handoff_start);
      if (options_.fault_kill_after_handoff) {
        log::Warn("cluster: fault injection: killed after the handoff of {}",
                  c->epoch);
        ::raise(SIGKILL);
      }
      last_step_ms_.store(MsSince(start));
    }
    if (Status h = HandOver(*c, version); !h.ok()) {
      log::Warn("cluster: handing over the shards of epoch {}: {} (retried)",
                c->epoch, h.ToString());
    }
    Wake();  // the next step at once
    return;
  }
  auto next =
      NextBalanceStep(*c, live, drained, options_.max_moves, refused_ranges_);
  if (!next) return;
  if (Status w = WriteConfig(*next, version); !w.ok()) {
    log::Warn("cluster: starting to move shards: {}", w.ToString());
    return;
  }
  if (next->moving() > 0) {
    log::Info("cluster: epoch {}: moving {} shards", next->epoch,
              next->moving());
  } else if (next->moving_ranges() > 0) {
    log::Info("cluster: epoch {}: moving {} ordered ranges", next->epoch,
              next->moving_ranges());
  } else {
    log::Info("cluster: epoch {}: {} members", next->epoch,
              next->members.size());
  }
  FollowConfig();
  Wake();
}

Status ClusterMember::Pace(const Config& moving,
                           std::chrono::steady_clock::duration busy) {
  const uint32_t share = std::clamp<uint32_t>(options_.move_share, 1, 100);
  if (share == 100) return Status::OK();
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::milliseconds>(
                         busy * (100 - share) / share);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Woken early only to stop.
      cv_.wait_until(lock,
                     std::min(until, std::chrono::steady_clock::now() +
                                         std::chrono::milliseconds(250)),
                     [this] { return stop_; });
      if (stop_) return Status::Unavailable("the server is stopping");
    }
    // A page whose calls waited on a server that died makes a long pause
    // (99 times the wait at --move-share 1): one of the moves' servers
    // started again meanwhile ends it (Rebalance then abandons the moves).
    std::set<uint16_t> servers;
    for (uint32_t sh = 0; sh < moving.num_shards(); ++sh) {
      if (moving.NextOf(sh) == kNoMember) continue;
      servers.insert({moving.owner[sh], moving.next[sh]});
    }
    for (uint32_t r = 0; r < moving.num_ranges(); ++r) {
      if (moving.RangeNextOf(r) == kNoMember) continue;
      servers.insert({moving.range_owner[r], moving.range_next[r]});
    }
    for (uint16_t i : servers) {
      const Member& m = moving.members[i];
      std::string bytes;
      if (Get(zh_, options_.target.path + "/members/" + m.address, false,
              &bytes) != ZOK) {
        continue;
      }
      auto now = DecodeMemberRecord(bytes);
      if (now.ok() && m.incarnation != 0 && now->incarnation != 0 &&
          now->incarnation != m.incarnation) {
        return Status::Unavailable(m.address +
                                   " started again during the copy");
      }
    }
    if (std::chrono::steady_clock::now() >= until) return Status::OK();
  }
}

Status ClusterMember::CopyMoving(const Config& moving) {
  step_pairs_ = 0;
  range_import_full_ = false;
  const auto moves = MovesOf(moving);
  // The sessions opened so far to each member the copy has called: one
  // opened since means it may have restarted in between (killed and back
  // at once, its ZooKeeper registration still there), and then a new
  // owner may have lost the pages it took (without a data directory) and
  // an old owner the keys it noted as changed: the copy is not whole, and
  // starts over at the next pass (its first drop clears what it left).
  std::map<std::string, uint64_t> connects;
  auto note = [&](const std::string& address) {
    connects.emplace(address, connects_[address]);
  };
  auto reconnected = [&]() -> Status {
    for (const auto& [address, before] : connects) {
      if (connects_[address] != before) {
        return Status::Busy("connected to " + address +
                            " again during the copy (it may have "
                            "restarted): copying again");
      }
    }
    return Status::OK();
  };
  // Sends the reply of a ShardExport or ShardSync (a ShardPairs message)
  // to `to` as a ShardImport.
  auto forward = [&](const std::string& to, std::string pairs) {
    Status st =
        Call(to, moving.epoch, hash::MethodId(hash::HashMethod::kShardImport),
             std::move(pairs))
            .status();
    if (st.ok()) note(to);
    return st;
  };
  // One reply of changes (about 32 MiB at most) unfrozen: what is left
  // goes in a later round. Frozen: every change, in as many replies as it
  // takes (no write adds any meanwhile).
  auto sync = [&](const std::string& from, const std::string& to,
                  const std::vector<uint32_t>& shards,
                  uint8_t flags) -> Status {
    bool more = true;
    while (more) {
      auto changed =
          Call(from, moving.epoch, hash::MethodId(hash::HashMethod::kShardSync),
               hash::EncodeShardList({shards, flags}));
      if (!changed.ok()) return changed.status();
      note(from);
      auto pairs = hash::DecodeShardPairs(*changed);
      if (!pairs.ok()) return pairs.status();
      step_pairs_ += pairs->pairs.size();
      more = (flags & hash::kShardFreeze) != 0 &&
             pairs->cursor != hash::kShardCursorDone;
      // Sent even empty: it carries the highest version A issued, which
      // B's next versions must exceed.
      REMEM_RETURN_IF_ERROR(forward(to, std::move(*changed)));
    }
    return Status::OK();
  };
  for (const auto& [pair, shards] : moves) {
    const std::string& from = moving.members[pair.first].address;
    const std::string& to = moving.members[pair.second].address;
    // What an earlier, unfinished copy left at the new owner.
    REMEM_RETURN_IF_ERROR(Call(to, moving.epoch,
                               hash::MethodId(hash::HashMethod::kShardDrop),
                               hash::EncodeShardList({shards, 0}))
                              .status());
    note(to);
    uint32_t partitions = 1;
    for (uint32_t p = 0; p < partitions; ++p) {
      hash::ShardExport req;
      req.partition = p;
      req.max_bytes = kExportPageBytes;
      req.shards = shards;
      do {
        const auto page_start = std::chrono::steady_clock::now();
        auto page = Call(from, moving.epoch,
                         hash::MethodId(hash::HashMethod::kShardExport),
                         hash::EncodeShardExport(req));
        if (!page.ok()) return page.status();
        note(from);
        auto pairs = hash::DecodeShardPairs(*page);
        if (!pairs.ok()) return pairs.status();
        partitions = pairs->num_partitions;
        req.generation = pairs->generation;
        req.cursor = pairs->cursor;
        req.after.clear();
        if (req.cursor != hash::kShardCursorDone &&
            (req.cursor & hash::kShardCursorInBucket) != 0) {
          // The page ended inside a bucket: the rest of it from the page's
          // last key on (it holds at least one pair).
          if (pairs->pairs.empty()) {
            return Status::Corruption(from +
                                      ": an export page cut inside a "
                                      "bucket holds no pair");
          }
          req.cursor &= ~hash::kShardCursorInBucket;
          req.after.assign(pairs->pairs.back().key);
        }
        step_pairs_ += pairs->pairs.size();
        if (!pairs->pairs.empty()) {
          REMEM_RETURN_IF_ERROR(forward(to, std::move(*page)));
        }
        REMEM_RETURN_IF_ERROR(
            Pace(moving, std::chrono::steady_clock::now() - page_start));
      } while (req.cursor != hash::kShardCursorDone);
    }
    // The keys changed during the copy.
    REMEM_RETURN_IF_ERROR(sync(from, to, shards, 0));
  }
  // Ordered ranges, one by one, the same way on the tree service.
  std::vector<uint32_t> ranges;
  for (uint32_t r = 0; r < moving.num_ranges(); ++r) {
    if (moving.RangeNextOf(r) != kNoMember) ranges.push_back(r);
  }
  auto range_from = [&](uint32_t r) -> const std::string& {
    return moving.members[moving.range_owner[r]].address;
  };
  auto range_to = [&](uint32_t r) -> const std::string& {
    return moving.members[moving.range_next[r]].address;
  };
  auto tree_call = [&](const std::string& address, tree::TreeMethod m,
                       std::string payload) {
    auto r =
        CallTree(address, moving.epoch, tree::MethodId(m), std::move(payload));
    if (r.ok()) note(address);
    if (m == tree::TreeMethod::kRangeImport &&
        r.status().code() == StatusCode::kOutOfMemory) {
      range_import_full_ = true;
    }
    return r;
  };
  // As sync, for range r.
  auto range_sync = [&](uint32_t r, uint8_t flags) -> Status {
    bool more = true;
    while (more) {
      auto changed = tree_call(range_from(r), tree::TreeMethod::kRangeSync,
                               tree::EncodeTreeRange({r, flags, {}}));
      if (!changed.ok()) return changed.status();
      auto pairs = tree::DecodeRangePairs(*changed);
      if (!pairs.ok()) return pairs.status();
      step_pairs_ += pairs->items.size();
      more = (flags & tree::kRangeFreeze) != 0 && pairs->more;
      // Sent even empty: it carries the highest version A issued.
      REMEM_RETURN_IF_ERROR(tree_call(range_to(r),
                                      tree::TreeMethod::kRangeImport,
                                      std::move(*changed))
                                .status());
    }
    return Status::OK();
  };
  for (uint32_t r : ranges) {
    REMEM_RETURN_IF_ERROR(tree_call(range_to(r), tree::TreeMethod::kRangeDrop,
                                    tree::EncodeTreeRange({r, 0, {}}))
                              .status());
    std::string resume;
    uint8_t flags = tree::kRangeFirst;
    while (true) {
      const auto page_start = std::chrono::steady_clock::now();
      auto page = tree_call(range_from(r), tree::TreeMethod::kRangeExport,
                            tree::EncodeTreeRange({r, flags, resume}));
      if (!page.ok()) return page.status();
      auto pairs = tree::DecodeRangePairs(*page);
      if (!pairs.ok()) return pairs.status();
      flags = 0;
      step_pairs_ += pairs->items.size();
      const bool more = pairs->more;
      resume = std::string(pairs->resume);
      if (!pairs->items.empty() || !more) {
        REMEM_RETURN_IF_ERROR(tree_call(range_to(r),
                                        tree::TreeMethod::kRangeImport,
                                        std::move(*page))
                                  .status());
      }
      REMEM_RETURN_IF_ERROR(
          Pace(moving, std::chrono::steady_clock::now() - page_start));
      if (!more) break;
    }
    REMEM_RETURN_IF_ERROR(range_sync(r, 0));
  }
  if (options_.fault_move_hold.count() > 0) {
    log::Warn("testing: holding the move for {} ms before the freeze",
              options_.fault_move_hold.count());
    moves_held_.fetch_add(1, std::memory_order_relaxed);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, options_.fault_move_hold, [this] { return stop_; });
  }
  // The keys changed while the other shards copied, still unfrozen: what
  // is left for the pause is only what changes during this round. Every
  // member of the copy is called again here, so that one that restarted
  // since its last call is seen before anything is frozen.
  for (const auto& [pair, shards] : moves) {
    REMEM_RETURN_IF_ERROR(sync(moving.members[pair.first].address,
                               moving.members[pair.second].address, shards, 0));
  }
  for (uint32_t r : ranges) REMEM_RETURN_IF_ERROR(range_sync(r, 0));
  REMEM_RETURN_IF_ERROR(reconnected());
  // Only now, every copy done, the writes of every moving shard pause:
  // frozen, and the last of their changes sent.
  frozen_at_ = std::chrono::steady_clock::now();
  pause_parts_ = {};
  for (const auto& [pair, shards] : moves) {
    REMEM_RETURN_IF_ERROR(sync(moving.members[pair.first].address,
                               moving.members[pair.second].address, shards,
                               hash::kShardFreeze));
  }
  for (uint32_t r : ranges) {
    REMEM_RETURN_IF_ERROR(range_sync(r, tree::kRangeFreeze));
  }
  pause_parts_.last_changes = MsSince(frozen_at_);
  return reconnected();
}

Status ClusterMember::HandOver(const Config& moving, int zk_version) {
  const std::string& base = options_.target.path;
  std::map<uint16_t, std::vector<uint32_t>> by_owner;
  for (uint32_t s = 0; s < moving.num_shards(); ++s) {
    if (moving.NextOf(s) != kNoMember) by_owner[moving.owner[s]].push_back(s);
  }
  const auto release_start = std::chrono::steady_clock::now();
  // An owner that is gone from ZooKeeper (its session expired, long after
  // its lease) vouches for nothing any more: no release is asked of it (a
  // successor manager that took over from a dead old owner would
  // otherwise retry it for a whole session timeout, the shards
  // unwritable meanwhile).
  auto gone = [&](const std::string& address) {
    std::vector<std::string> members;
    return Children(zh_, base + "/members", false, &members) == ZOK &&
           std::find(members.begin(), members.end(), address) == members.end();
  };
  for (const auto& [owner, shards] : by_owner) {
    const std::string& from = moving.members[owner].address;
    if (gone(from)) continue;
    auto r =
        Call(from, moving.epoch, hash::MethodId(hash::HashMethod::kShardDrop),
             hash::EncodeShardList({shards, hash::kShardRelease}));
    if (!r.ok() && !gone(from)) return r.status();
  }
  for (uint32_t rg = 0; rg < moving.num_ranges(); ++rg) {
    if (moving.RangeNextOf(rg) == kNoMember) continue;
    const std::string& from = moving.members[moving.range_owner[rg]].address;
    if (gone(from)) continue;
    auto r = CallTree(from, moving.epoch,
                      tree::MethodId(tree::TreeMethod::kRangeDrop),
                      tree::EncodeTreeRange({rg, tree::kRangeRelease, {}}));
    if (!r.ok() && !gone(from)) return r.status();
  }
  pause_parts_.release = MsSince(release_start);
  const Config done = CompleteMoves(moving);
  const auto config_start = std::chrono::steady_clock::now();
  REMEM_RETURN_IF_ERROR(WriteConfig(done, zk_version));
  pause_parts_.config = MsSince(config_start);
  (void)zoo_delete(zh_, (base + "/handoff").c_str(), -1);
  shards_moved_.fetch_add(moving.moving(), std::memory_order_relaxed);
  ranges_moved_.fetch_add(moving.moving_ranges(), std::memory_order_relaxed);
  pairs_moved_.fetch_add(step_pairs_, std::memory_order_relaxed);
  // Known only when this manager froze the shards itself (not after a
  // takeover).
  const uint64_t pause = frozen_at_ == std::chrono::steady_clock::time_point{}
                             ? 0
                             : MsSince(frozen_at_);
  last_pause_ms_.store(pause, std::memory_order_relaxed);
  frozen_at_ = {};
  log::Info(
      "cluster: epoch {}: {} shards and {} ordered ranges moved ({} pairs "
      "sent, copy {} ms, writes paused {} ms: last changes {} ms, handoff {} "
      "ms, release {} ms, configuration {} ms)",
      done.epoch, moving.moving(), moving.moving_ranges(), step_pairs_,
      last_step_ms_.load(), pause, pause_parts_.last_changes,
      pause_parts_.handoff, pause_parts_.release, pause_parts_.config);
  step_pairs_ = 0;
  FollowConfig();
  return Status::OK();
}

}  // namespace remem::cluster
