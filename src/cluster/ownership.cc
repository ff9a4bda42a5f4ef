#include "cluster/ownership.h"

#include <time.h>

namespace remem::cluster {

uint64_t LeaseClockNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Status Ownership::Leased() const {
  const Installed* c = current();
  return c == nullptr ? Status::OK() : LeasedUnder(*c);
}

Status Ownership::LeasedUnder(const Installed& c) const {
  if (!c.replicated || LeaseClockNs() < lease_expires_ns()) {
    return Status::OK();
  }
  // Busy (ask again): a member that just started gets its lease within
  // milliseconds; one that was cut off is failed over, and a client asking
  // again learns the new owner.
  if (!zk_connected_.load(std::memory_order_relaxed)) {
    return Status::Busy(
        "this server holds no lease from the configuration manager, and is "
        "not connected to ZooKeeper either: ZooKeeper may be down or cut "
        "off (the manager grants leases only while it is sure of its "
        "ZooKeeper session). It serves nothing of a replicated shard until "
        "it has one");
  }
  return Status::Busy(
      "this server holds no lease from the configuration manager (just "
      "started, cut off or paused): it serves nothing of a replicated shard "
      "until it has one");
}

bool Ownership::Install(Config config, bool past_handoff) {
  std::lock_guard<std::mutex> lock(mu_);
  const Installed* cur = latest();
  if (cur != nullptr && config.epoch <= cur->config.epoch) return false;
  // Readers stop trusting the old word before anything changes here.
  if (serving_published_ != 0) {
    serving_published_ = 0;
    if (serving_listener_) serving_listener_(0);
  }
  if (range_published_ != 0) {
    range_published_ = 0;
    if (range_listener_) range_listener_(0);
  }
  auto next = std::make_unique<Installed>();
  next->encoded = EncodeConfig(config);
  next->self = config.IndexOf(self_);
  next->replicated = config.replicas > 0;
  // In a replicated cluster the roles named for this address belong to the
  // incarnation the configuration names: a server that restarted has none
  // until the manager gives it some.
  if (next->replicated && next->self >= 0 &&
      config.members[next->self].incarnation != incarnation_) {
    next->prior = next->self;
    next->self = -1;
  }
  const uint32_t n = config.num_shards();
  next->owns.assign(n, 0);
  next->outgoing.assign(n, 0);
  if (next->replicated) {
    next->backs.assign(n, 0);
    next->fills.assign(n, 0);
    for (uint32_t s = 0; s < n; ++s) {
      next->backs[s] = config.IsBackup(s, next->self) ? 1 : 0;
      next->fills[s] = config.IsFilling(s, next->self) ? 1 : 0;
    }
  }
  for (uint32_t s = 0; s < n; ++s) {
    if (next->self >= 0 && config.owner[s] == uint16_t(next->self)) {
      next->owns[s] = 1;
      next->outgoing[s] = config.NextOf(s) != kNoMember;
      next->any_outgoing = next->any_outgoing || next->outgoing[s];
      ++next->owned;
    }
  }
  const uint32_t num_ranges = config.num_ranges();
  next->range_outgoing.assign(num_ranges, 0);
  for (uint32_t r = 0; r < num_ranges; ++r) {
    if (next->self >= 0 && config.range_owner[r] == uint16_t(next->self) &&
        config.RangeNextOf(r) != kNoMember) {
      next->range_outgoing[r] = 1;
      next->any_range_outgoing = true;
    }
  }
  if (range_state_ == nullptr && num_ranges > 0) {
    // As for shards (below).
    range_state_ = std::make_unique<std::atomic<uint8_t>[]>(num_ranges);
    num_range_states_ = num_ranges;
    for (uint32_t r = 0; r < num_ranges; ++r) {
      range_state_[r].store(!next->range_outgoing[r] ? kServing
                            : past_handoff           ? kReleased
                                                     : kFrozen);
    }
  }
  auto owned_ranges = [](const Installed& i) {
    std::vector<uint8_t> mine(i.config.num_ranges(), 0);
    for (uint32_t r = 0; r < mine.size(); ++r) {
      mine[r] = i.self >= 0 && i.config.range_owner[r] == uint16_t(i.self);
    }
    return mine;
  };
  if (state_ == nullptr) {
    // The first configuration of this process: a shard it names as moving
    // away was moving when this server restarted, and the step may be
    // past its freeze: it takes no write until the move ends or is
    // abandoned (the manager copies a frozen shard again if it has to).
    // Past the handoff the step may be past its release here too (the
    // deletes begun, or done): then it serves nothing of it either (the
    // manager exports a released shard again if it has to, and
    // abandoning the move serves it again).
    state_ = std::make_unique<std::atomic<uint8_t>[]>(n);
    for (uint32_t s = 0; s < n; ++s) {
      state_[s].store(!next->outgoing[s] ? kServing
                      : past_handoff     ? kReleased
                                         : kFrozen);
    }
  }
  if (cur == nullptr || config.epoch != cur->config.epoch + 1 ||
      cur->owns != next->owns) {
    primary_since_ = config.epoch;
  }
  next->config = std::move(config);
  if (cur == nullptr || next->config.epoch != cur->config.epoch + 1 ||
      owned_ranges(*cur) != owned_ranges(*next)) {
    ranges_since_ = next->config.epoch;
  }
  // A promotion (or a resync still under way): vouched for once every
  // part has sent on what it received as a backup (RequireResync).
  if (resync_parts_ > 0 && next->replicated && current() != nullptr) {
    bool gained = resyncs_left_ > 0;
    for (uint32_t s = 0; s < n && !gained; ++s) {
      gained =
          next->owns[s] != 0 && (s >= cur->owns.size() || cur->owns[s] == 0);
    }
    if (gained) {
      resyncs_left_ = resync_parts_;
      resync_epoch_ = next->config.epoch;
    }
  }
  if (purges_left_ > 0) {
    // Not served before the purges are done (they read it as pending()).
    pending_.store(next.get(), std::memory_order_release);
  } else {
    current_.store(next.get(), std::memory_order_release);
  }
  // A shard no longer moving away from here (moved, or the move
  // abandoned) is served again as the configuration says.
  for (uint32_t s = 0; s < n; ++s) {
    if (!next->outgoing[s]) state_[s].store(kServing);
  }
  for (uint32_t r = 0; r < num_ranges && r < num_range_states_; ++r) {
    if (!next->range_outgoing[r]) range_state_[r].store(kServing);
  }
  all_.push_back(std::move(next));
  PublishServing_locked();
  for (const auto& listener : install_listeners_) listener(*all_.back());
  return true;
}

uint64_t Ownership::ServingWord_locked() const {
  const Installed* c = current();
  if (c == nullptr || c->self < 0 || resyncs_left_ > 0) return 0;
  if (c->any_outgoing) {
    for (uint32_t s = 0; s < c->config.num_shards(); ++s) {
      if (StateOf(s) != kServing) return 0;
    }
  }
  return uint64_t{c->config.epoch} | uint64_t{primary_since_} << 32;
}

uint64_t Ownership::RangeServingWord_locked() const {
  const Installed* c = current();
  // Replicated, a promotion's resync holds it as it holds the shards' word
  // (a leaf read one-sided may hold a write the other backups lack; the
  // tree's mark then tells which writes its backups hold).
  if (c == nullptr || c->self < 0 || !c->config.ordered() ||
      resyncs_left_ > 0) {
    return 0;
  }
  if (c->any_range_outgoing) {
    for (uint32_t r = 0; r < c->config.num_ranges(); ++r) {
      if (RangeStateOf(r) != kServing) return 0;
    }
  }
  return uint64_t{c->config.epoch} | uint64_t{ranges_since_} << 32;
}

void Ownership::PublishServing_locked() const {
  const uint64_t word = ServingWord_locked();
  if (word != serving_published_) {
    serving_published_ = word;
    if (serving_listener_) serving_listener_(word);
  }
  const uint64_t range_word = RangeServingWord_locked();
  if (range_word != range_published_) {
    range_published_ = range_word;
    if (range_listener_) range_listener_(range_word);
  }
}

void Ownership::SetRangeServingListener(
    std::function<void(uint64_t)> listener) const {
  std::lock_guard<std::mutex> lock(mu_);
  range_listener_ = std::move(listener);
  if (range_listener_) range_listener_(range_published_);
}

uint64_t Ownership::range_serving_word() const {
  std::lock_guard<std::mutex> lock(mu_);
  return range_published_;
}

void Ownership::SetServingListener(
    std::function<void(uint64_t)> listener) const {
  std::lock_guard<std::mutex> lock(mu_);
  serving_listener_ = std::move(listener);
  if (serving_listener_) serving_listener_(serving_published_);
}

void Ownership::AddInstallListener(
    std::function<void(const Installed&)> listener) const {
  std::lock_guard<std::mutex> lock(mu_);
  install_listeners_.push_back(std::move(listener));
}

uint64_t Ownership::serving_word() const {
  std::lock_guard<std::mutex> lock(mu_);
  return serving_published_;
}

void Ownership::RequirePurge(uint32_t parts) const {
  std::lock_guard<std::mutex> lock(mu_);
  purges_left_ += parts;
}

void Ownership::RequireResync(uint32_t parts) const {
  std::lock_guard<std::mutex> lock(mu_);
  resync_parts_ += parts;
}

void Ownership::ResyncDone(uint32_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (resyncs_left_ == 0 || epoch != resync_epoch_) return;
  if (--resyncs_left_ == 0) PublishServing_locked();
}

void Ownership::PurgeDone() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (purges_left_ == 0 || --purges_left_ > 0) return;
  // The last one: the configuration installed last is served from now on.
  const Installed* p = pending_.load(std::memory_order_acquire);
  if (p == nullptr) return;
  current_.store(p, std::memory_order_release);
  pending_.store(nullptr, std::memory_order_release);
  PublishServing_locked();
}

Status Ownership::Check(std::string_view key, bool write) const {
  const Installed* c = current();
  if (c == nullptr) {
    return Status::Busy(
        "this cluster member has no configuration yet (the cluster is still "
        "forming)");
  }
  const uint32_t shard = ShardOf(key, c->config.num_shards());
  REMEM_RETURN_IF_ERROR(LeasedUnder(*c));
  if (!c->owns[shard]) {
    return Status::Moved("shard " + std::to_string(shard) + " is served by " +
                         c->config.members[c->config.owner[shard]].address +
                         " in epoch " + std::to_string(c->config.epoch));
  }
  const uint8_t state = StateOf(shard);
  if (state == kServing || (state == kFrozen && !write)) return Status::OK();
  return Status::Busy("shard " + std::to_string(shard) +
                      " is being handed over to another server");
}

Status Ownership::ReplicaReadable(std::string_view key, bool* as_backup) const {
  const Installed* c = current();
  if (c != nullptr && c->replicated) {
    const uint32_t shard = ShardOf(key, c->config.num_shards());
    if (!c->owns[shard] && c->backs[shard] && !c->fills[shard]) {
      Status st = LeasedUnder(*c);
      if (as_backup != nullptr) *as_backup = st.ok();
      return st;
    }
  }
  return Check(key, false);
}

namespace {

// Range r's owner in `c`, or the error a request for it gets.
Status RangeOwnedBy(const Ownership::Installed* c, uint32_t r) {
  const Config& config = c->config;
  if (c->self >= 0 && config.range_owner[r] == uint16_t(c->self)) {
    return Status::OK();
  }
  return Status::Moved("ordered range " + std::to_string(r) + " is served by " +
                       config.members[config.range_owner[r]].address +
                       " in epoch " + std::to_string(config.epoch));
}

Status NoOrderedStore(const Ownership::Installed* c) {
  if (c == nullptr) {
    return Status::Busy(
        "this cluster member has no configuration yet (the cluster is still "
        "forming)");
  }
  if (!c->config.ordered()) {
    return Status::Unsupported(
        "cluster " + c->config.name +
        " has no ordered store (its servers were started without "
        "--tree-splits)");
  }
  return Status::OK();
}

}  // namespace

Status Ownership::HasOrderedStore() const { return NoOrderedStore(current()); }

Status Ownership::CheckRange(std::string_view key, bool write) const {
  const Installed* c = current();
  REMEM_RETURN_IF_ERROR(NoOrderedStore(c));
  const uint32_t r = c->config.RangeOf(key);
  // Replicated: a member whose lease lapsed may have been failed over.
  REMEM_RETURN_IF_ERROR(LeasedUnder(*c));
  REMEM_RETURN_IF_ERROR(RangeOwnedBy(c, r));
  const uint8_t state = RangeStateOf(r);
  if (state == kServing || (state == kFrozen && !write)) return Status::OK();
  return Status::Busy("ordered range " + std::to_string(r) +
                      " is being handed over to another server");
}

Status Ownership::OwnsScan(std::string_view start, std::string_view end) const {
  const Installed* c = current();
  REMEM_RETURN_IF_ERROR(NoOrderedStore(c));
  const Config& config = c->config;
  const uint32_t r = config.RangeOf(start);
  REMEM_RETURN_IF_ERROR(CheckRange(start, false));
  if (r == config.splits.size()) return Status::OK();  // the last: unbounded
  const std::string& upper = config.splits[r];
  if (!end.empty() && end <= std::string_view(upper)) return Status::OK();
  return Status::InvalidArgument(
      "the scan goes past this server's ordered range, which ends before '" +
      upper + "' (scan a cluster through its cluster client)");
}

Result<const Ownership::Installed*> Ownership::AdmitsReplication(
    uint32_t epoch) const {
  const Installed* c = current();
  if (c == nullptr) return Status::Busy("no configuration yet");
  if (epoch != c->config.epoch) {
    // Newer: the dispatcher has answered Busy already. Older: the sender
    // has not seen that the shards' roles may have changed.
    return Status::Conflict("replication at epoch " + std::to_string(epoch) +
                            "; this backup is at epoch " +
                            std::to_string(c->config.epoch));
  }
  return c;
}

bool Ownership::Outgoing(std::string_view key) const {
  const Installed* c = current();
  // Every write asks: no hashing while nothing moves away.
  if (c == nullptr || !c->any_outgoing) return false;
  return c->outgoing[ShardOf(key, c->config.num_shards())] != 0;
}

bool Ownership::RangeOutgoing(std::string_view key) const {
  const Installed* c = current();
  if (c == nullptr || !c->any_range_outgoing) return false;
  return c->range_outgoing[c->config.RangeOf(key)] != 0;
}

bool Ownership::RangeMovingAway(uint32_t r) const {
  const Installed* c = current();
  return c != nullptr && r < c->range_outgoing.size() &&
         c->range_outgoing[r] != 0;
}

bool Ownership::RangeIncoming(uint32_t r) const {
  const Installed* c = current();
  return c != nullptr && c->self >= 0 && r < c->config.num_ranges() &&
         c->config.RangeNextOf(r) == uint16_t(c->self);
}

bool Ownership::RangeGone(uint32_t r) const {
  const Installed* c = current();
  if (c == nullptr || r >= c->config.num_ranges() || RangeIncoming(r)) {
    return false;
  }
  return RangeStateOf(r) == kReleased || !MayKeepRange(*c, r);
}

bool Ownership::MovingAway(uint32_t shard) const {
  const Installed* c = current();
  return c != nullptr && shard < c->config.num_shards() &&
         c->outgoing[shard] != 0;
}

bool Ownership::Incoming(uint32_t shard) const {
  const Installed* c = current();
  return c != nullptr && c->self >= 0 && shard < c->config.num_shards() &&
         c->config.NextOf(shard) == uint16_t(c->self);
}

Status Ownership::SetState(const std::vector<uint32_t>& shards,
                           uint8_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Installed* c = current();
  if (c == nullptr) return Status::Busy("no configuration yet");
  for (uint32_t s : shards) {
    if (s >= c->config.num_shards() || !c->outgoing[s]) {
      return Status::Conflict("shard " + std::to_string(s) +
                              " is not moving away from this server in epoch " +
                              std::to_string(c->config.epoch));
    }
  }
  for (uint32_t s : shards) {
    // Never back: a released shard stays released until the configuration
    // says otherwise.
    if (state_[s].load() < state) state_[s].store(state);
  }
  PublishServing_locked();
  return Status::OK();
}

Status Ownership::SetRangeState(const std::vector<uint32_t>& ranges,
                                uint8_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Installed* c = current();
  if (c == nullptr) return Status::Busy("no configuration yet");
  for (uint32_t r : ranges) {
    if (r >= c->range_outgoing.size() || !c->range_outgoing[r]) {
      return Status::Conflict("ordered range " + std::to_string(r) +
                              " is not moving away from this server in epoch " +
                              std::to_string(c->config.epoch));
    }
  }
  for (uint32_t r : ranges) {
    if (range_state_[r].load() < state) range_state_[r].store(state);
  }
  PublishServing_locked();
  return Status::OK();
}

Status Ownership::FreezeRanges(const std::vector<uint32_t>& ranges) const {
  return SetRangeState(ranges, kFrozen);
}

Status Ownership::ReleaseRanges(const std::vector<uint32_t>& ranges) const {
  return SetRangeState(ranges, kReleased);
}

Status Ownership::Freeze(const std::vector<uint32_t>& shards) const {
  return SetState(shards, kFrozen);
}

Status Ownership::Release(const std::vector<uint32_t>& shards) const {
  return SetState(shards, kReleased);
}

Status Ownership::Admits(uint32_t epoch) const {
  const uint32_t mine = this->epoch();
  if (epoch <= mine) return Status::OK();
  // The client saw a configuration this server has not installed yet (it
  // follows ZooKeeper a moment behind): ask again shortly.
  return Status::Busy("this server has not installed configuration epoch " +
                      std::to_string(epoch) + " yet (it has " +
                      std::to_string(mine) + ")");
}

}  // namespace remem::cluster
