#include "cluster/ownership.h"

namespace remem::cluster {

bool Ownership::Install(Config config) {
  std::lock_guard<std::mutex> lock(mu_);
  const Installed* cur = current();
  if (cur != nullptr && config.epoch <= cur->config.epoch) return false;
  auto next = std::make_unique<Installed>();
  next->encoded = EncodeConfig(config);
  next->self = config.IndexOf(self_);
  next->owns.assign(config.num_shards(), 0);
  for (uint32_t s = 0; s < config.num_shards(); ++s) {
    if (next->self >= 0 && config.owner[s] == uint16_t(next->self)) {
      next->owns[s] = 1;
      ++next->owned;
    }
  }
  next->config = std::move(config);
  current_.store(next.get(), std::memory_order_release);
  all_.push_back(std::move(next));
  return true;
}

Status Ownership::Owns(std::string_view key) const {
  const Installed* c = current();
  if (c == nullptr) {
    return Status::Busy(
        "this cluster member has no configuration yet (the cluster is still "
        "forming)");
  }
  const uint32_t shard = ShardOf(key, c->config.num_shards());
  if (c->owns[shard]) return Status::OK();
  return Status::Moved("shard " + std::to_string(shard) + " is served by " +
                       c->config.members[c->config.owner[shard]].address +
                       " in epoch " + std::to_string(c->config.epoch));
}

Status Ownership::Admits(uint32_t epoch) const {
  if (epoch == 0) return Status::OK();
  const uint32_t mine = this->epoch();
  if (epoch == mine) return Status::OK();
  if (epoch < mine) {
    return Status::Moved("configuration epoch " + std::to_string(epoch) +
                         " is older than this server's (" +
                         std::to_string(mine) + "): refresh the configuration");
  }
  // The client saw a configuration this server has not installed yet (it
  // follows ZooKeeper a moment behind): ask again shortly.
  return Status::Busy("this server has not installed configuration epoch " +
                      std::to_string(epoch) + " yet (it has " +
                      std::to_string(mine) + ")");
}

}  // namespace remem::cluster
