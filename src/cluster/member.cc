#include "cluster/member.h"

// The synchronous calls of ZooKeeper's C client exist in its multi-threaded
// library only, declared under THREADED.
#ifndef THREADED
#define THREADED
#endif
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <cstdio>
#include <vector>

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

int Get(zhandle_t* zh, const std::string& path, bool watch, std::string* out,
        Stat* stat = nullptr) {
  out->resize(kMaxConfigBytes);
  int len = kMaxConfigBytes;
  Stat st{};
  const int rc =
      zoo_get(zh, path.c_str(), watch ? 1 : 0, out->data(), &len, &st);
  if (rc != ZOK) return rc;
  out->resize(len < 0 ? 0 : size_t(len));
  if (stat != nullptr) *stat = st;
  return ZOK;
}

int CreatePersistent(zhandle_t* zh, const std::string& path) {
  const int rc = zoo_create(zh, path.c_str(), nullptr, -1, &ZOO_OPEN_ACL_UNSAFE,
                            0, nullptr, 0);
  return rc == ZNODEEXISTS ? ZOK : rc;
}

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
  if (Status st = m->Connect(); !st.ok()) return st;
  // The cluster's nodes, created by whoever comes first.
  const std::string& base = m->options_.target.path;
  for (size_t i = 1; i <= base.size(); ++i) {
    if (i == base.size() || base[i] == '/') {
      const int rc = CreatePersistent(m->zh_, base.substr(0, i));
      if (rc != ZOK) {
        return Status::Unavailable("ZooKeeper: creating " + base.substr(0, i) +
                                   ": " + ZkError(rc));
      }
    }
  }
  for (const char* child : {"/members", "/election"}) {
    const int rc = CreatePersistent(m->zh_, base + child);
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
  }
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

ClusterMember::~ClusterMember() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (zh_ != nullptr) zookeeper_close(zh_);
}

void ClusterMember::OnEvent(zhandle_t*, int type, int state, const char*,
                            void* ctx) {
  auto* self = static_cast<ClusterMember*>(ctx);
  if (type == ZOO_SESSION_EVENT) {
    self->state_.store(state, std::memory_order_relaxed);
    self->connected_.store(state == ZOO_CONNECTED_STATE,
                           std::memory_order_relaxed);
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

Status ClusterMember::Connect() {
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
  std::unique_lock<std::mutex> lock(mu_);
  const bool up = cv_.wait_for(lock, options_.session_timeout, [&] {
    return stop_ || connected_.load(std::memory_order_relaxed);
  });
  if (!up || !connected_.load()) {
    return Status::Unavailable(
        "ZooKeeper at " + options_.target.hosts + " did not answer within " +
        std::to_string(options_.session_timeout.count()) + " ms");
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
      if (Status st = Connect(); !st.ok()) {
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
    cv_.wait_for(lock, kPassInterval, [&] { return stop_ || event_; });
    event_ = false;
  }
}

bool ClusterMember::Step() {
  // The configuration first: a server that says it is registered serves
  // the configuration of its cluster.
  FollowConfig();
  if (!registered_.load() && !Register()) return false;
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
    Stat st{};
    rc = zoo_exists(zh_, me.c_str(), 1, &st);
    if (rc == ZOK && st.ephemeralOwner != zoo_client_id(zh_)->client_id) {
      // A predecessor at this address (killed, its session not yet
      // expired) or another server claiming it: wait for the node to go.
      log::Warn(
          "cluster: {} is still registered by another session; waiting "
          "for it to expire",
          options_.self.address);
      return false;
    }
    if (rc == ZNONODE) return false;  // gone meanwhile: retry at once
  }
  if (rc != ZOK && rc != ZNODEEXISTS) {
    log::Warn("cluster: registering {}: {}", me, ZkError(rc));
    return false;
  }
  if (election_node_.empty()) {
    char created[1024];
    const std::string prefix = base + "/election/n-";
    rc = zoo_create(zh_, prefix.c_str(), options_.self.address.data(),
                    int(options_.self.address.size()), &ZOO_OPEN_ACL_UNSAFE,
                    ZOO_EPHEMERAL_SEQUENTIAL, created, sizeof(created));
    if (rc != ZOK) {
      log::Warn("cluster: joining the election: {}", ZkError(rc));
      return false;
    }
    std::string node(created);
    election_node_ = node.substr(node.rfind('/') + 1);
  }
  registered_.store(true);
  log::Info("cluster: {} registered in {} (election node {})",
            options_.self.address, base, election_node_);
  return true;
}

void ClusterMember::FollowConfig() {
  std::string bytes;
  const int rc = Get(zh_, options_.target.path + "/config", true, &bytes);
  if (rc == ZNONODE) {
    // Watch for its creation.
    Stat st{};
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
  const uint32_t epoch = c->epoch;
  if (ownership_->Install(std::move(*c))) {
    const auto* cur = ownership_->current();
    log::Info(
        "cluster: configuration epoch {} installed: {} members, this "
        "server owns {} of {} shards",
        epoch, cur->config.members.size(), cur->owned,
        cur->config.num_shards());
  }
  config_seen_ = true;
}

void ClusterMember::ManagerDuty() {
  const std::string& base = options_.target.path;
  std::vector<std::string> candidates;
  if (Children(zh_, base + "/election", true, &candidates) != ZOK) return;
  const bool lead = !candidates.empty() && candidates.front() == election_node_;
  if (lead != manager_.load()) {
    log::Info("cluster: {} the configuration manager",
              lead ? "this server is now" : "this server is no longer");
    manager_.store(lead);
  }
  std::vector<std::string> members;
  if (Children(zh_, base + "/members", true, &members) != ZOK) return;
  members_seen_.store(uint32_t(members.size()));
  if (!lead || config_seen_) return;
  if (members.size() < options_.initial_size) return;
  std::vector<Member> all;
  for (const std::string& name : members) {
    std::string bytes;
    if (Get(zh_, base + "/members/" + name, false, &bytes) != ZOK) return;
    auto m = DecodeMemberRecord(bytes);
    if (!m.ok()) {
      log::Warn("cluster: ignoring member {}: {}", name, m.status().ToString());
      continue;
    }
    all.push_back(std::move(*m));
  }
  if (all.size() < options_.initial_size) return;
  if (all.size() > kMaxMembers) all.resize(kMaxMembers);
  Config c = InitialConfig(options_.target.name, 1, std::move(all),
                           options_.num_shards);
  const std::string bytes = EncodeConfig(c);
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

}  // namespace remem::cluster
