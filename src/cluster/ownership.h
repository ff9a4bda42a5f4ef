// cluster::Ownership: what a cluster member's data path consults before it
// runs a request: the configuration installed last, and which shards it
// makes this server own. The ZooKeeper side (member.h) installs
// configurations; services ask Owns(key) and the dispatcher asks epoch().
//
// Before the first configuration is installed the server owns nothing and
// refuses data requests with Busy (try again). A configuration that does not
// name this server leaves it owning nothing (a server that joined after
// the cluster formed waits for shards to be moved to it).
//
// Thread contract: Install from one thread at a time (the member's);
// everything else from any thread, lock-free on the data path. Installed
// configurations are kept until the Ownership is destroyed, so a pointer
// returned by current() stays valid (configurations change rarely).

#ifndef REMEM_CLUSTER_OWNERSHIP_H_
#define REMEM_CLUSTER_OWNERSHIP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/config.h"
#include "remem/status.h"

namespace remem::cluster {

class Ownership {
 public:
  // `self`: this server's address as it registers it (--advertise).
  explicit Ownership(std::string self) : self_(std::move(self)) {}
  Ownership(const Ownership&) = delete;
  Ownership& operator=(const Ownership&) = delete;

  struct Installed {
    Config config;
    std::string encoded;        // EncodeConfig(config), served to clients
    int self = -1;              // index of this server in config.members
    std::vector<uint8_t> owns;  // per shard
    uint32_t owned = 0;
  };

  // Installs `config` if its epoch is newer than the current one; returns
  // whether it did.
  bool Install(Config config);
  // Null before the first configuration.
  const Installed* current() const {
    return current_.load(std::memory_order_acquire);
  }
  // 0 before the first configuration.
  uint32_t epoch() const {
    const Installed* c = current();
    return c == nullptr ? 0 : c->config.epoch;
  }
  // OK if this server owns `key`'s shard now; else Moved naming the owner
  // (or Busy before the first configuration: try again).
  Status Owns(std::string_view key) const;
  // OK if a request sent with configuration `epoch` may run here: 0 (a
  // client outside the cluster, routed by key ownership alone) or the
  // current epoch. An older epoch: Moved (the client must refresh); a newer
  // one: Busy (this server is about to install it: try again).
  Status Admits(uint32_t epoch) const;
  const std::string& self() const { return self_; }

 private:
  const std::string self_;
  std::atomic<const Installed*> current_{nullptr};
  std::mutex mu_;  // Install
  std::vector<std::unique_ptr<Installed>> all_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_OWNERSHIP_H_
