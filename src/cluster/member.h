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
//                       (creation fails if another manager created it);
//                       never rewritten yet (moving shards, not built, is
//                       what will replace it, at the version it read)
// The manager installs the first configuration once `initial_size`
// servers have registered: shards split evenly over them. Every server
// watches `config` and installs each newer one into its Ownership.
// ZooKeeper stays off the data path: while it is unreachable the server
// keeps serving the configuration it has, and once its session is back
// (or replaced, after expiry) it registers again.
//
// Thread contract: Start and the destructor from one thread; the getters
// from any thread. The member runs its own thread (ZooKeeper's C client
// adds two of its own).

#ifndef REMEM_CLUSTER_MEMBER_H_
#define REMEM_CLUSTER_MEMBER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cluster/config.h"
#include "cluster/ownership.h"
#include "remem/status.h"

typedef struct _zhandle zhandle_t;

namespace remem::cluster {

struct MemberOptions {
  ZkTarget target;
  Member self;                // address clients reach, capacity
  uint32_t initial_size = 1;  // servers the first configuration waits for
  uint32_t num_shards = kDefaultShards;
  std::chrono::milliseconds session_timeout{10000};  // ZooKeeper's
};

class ClusterMember {
 public:
  // Connects to ZooKeeper (waiting at most the session timeout), creates
  // the cluster's nodes if missing and starts the member's thread, which
  // registers and follows the configuration. Errors: InvalidArgument (bad
  // options), Unavailable (ZooKeeper unreachable), Conflict (the cluster
  // at PATH was formed with another shard count).
  static Result<std::unique_ptr<ClusterMember>> Start(MemberOptions options,
                                                      Ownership* ownership);
  // Leaves the cluster: closes the ZooKeeper session, so its ephemeral
  // nodes (registration, election) go at once.
  ~ClusterMember();
  ClusterMember(const ClusterMember&) = delete;
  ClusterMember& operator=(const ClusterMember&) = delete;

  bool manager() const { return manager_.load(std::memory_order_relaxed); }
  bool connected() const { return connected_.load(std::memory_order_relaxed); }
  bool registered() const {
    return registered_.load(std::memory_order_relaxed);
  }
  uint32_t members_seen() const {
    return members_seen_.load(std::memory_order_relaxed);
  }
  uint64_t sessions() const {
    return sessions_.load(std::memory_order_relaxed);
  }

 private:
  ClusterMember(MemberOptions options, Ownership* ownership);
  static void OnEvent(zhandle_t* zh, int type, int state, const char* path,
                      void* ctx);
  Status Connect();  // a new ZooKeeper session; waits until connected
  void Run();
  bool Step();  // one pass; false: the session is gone
  bool Register();
  void FollowConfig();
  void ManagerDuty();
  void Wake();

  const MemberOptions options_;
  Ownership* const ownership_;
  zhandle_t* zh_ = nullptr;  // the member's thread's, after Start
  std::string election_node_;
  bool config_seen_ = false;
  bool was_connected_ = true;  // the member's thread's

  std::mutex mu_;
  std::condition_variable cv_;
  bool event_ = false;
  bool stop_ = false;
  std::atomic<int> state_{0};  // ZooKeeper's session state

  std::atomic<bool> manager_{false};
  std::atomic<bool> connected_{false};
  std::atomic<bool> registered_{false};
  std::atomic<uint32_t> members_seen_{0};
  std::atomic<uint64_t> sessions_{0};
  std::thread thread_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_MEMBER_H_
