#include "cluster/member_lease.h"

#include <algorithm>

#include "client/rpc_client.h"
#include "client/session_core.h"
#include "fabric/worker.h"
#include "proto/wire.h"
#include "util/log.h"

namespace remem::cluster {

Result<std::unique_ptr<MemberLease>> MemberLease::Start(
    MemberLeaseOptions options, Ownership* ownership,
    std::function<std::string()> manager) {
  if (options.lease < std::chrono::milliseconds(20)) {
    return Status::InvalidArgument("the member lease must be at least 20 ms");
  }
  std::unique_ptr<MemberLease> m(
      new MemberLease(std::move(options), ownership, std::move(manager)));
  auto loop = PeerLoop::Create(m->options_.session.transport);
  if (!loop.ok()) return loop.status().WithContext("member lease");
  m->loop_ = std::move(*loop);
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

MemberLease::~MemberLease() {
  Stop();
  session_.reset();  // before the loop
}

void MemberLease::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  loop_->Wake();
  if (thread_.joinable()) thread_.join();
}

void MemberLease::Failed(std::string why) {
  if (failures_.fetch_add(1, std::memory_order_relaxed) % 16 == 0) {
    log::Debug("cluster: lease from {}: not granted ({} failures): {}",
               manager_(), failures_.load(std::memory_order_relaxed), why);
  }
  last_failure_ = std::move(why);
  // Asked again sooner than the renewal period.
  next_ns_ = std::min(next_ns_, LeaseClockNs() + every_ns_ / 4);
}

void MemberLease::Ask() {
  const std::string manager = manager_();
  if (manager.empty()) {
    Failed(
        "no configuration manager known (none elected, or ZooKeeper "
        "unreachable)");
    return;
  }
  if (!session_ || manager != session_address_ ||
      !session_->core()->connected()) {
    session_.reset();
    SessionOptions o = options_.session;
    o.server = manager;
    // A manager that does not answer within half a lease is no use.
    o.timeout = options_.lease / 2;
    auto s = Session::Connect(o, loop_->get());
    if (!s.ok()) {
      Failed("the manager at " + manager +
             " did not answer: " + s.status().ToString());
      return;
    }
    session_ = std::move(*s);
    session_address_ = manager;
  }
  LeaseAsk ask;
  const Ownership::Installed* have = ownership_->latest();
  ask.epoch = have == nullptr ? 0 : have->config.epoch;
  ask.incarnation = options_.incarnation;
  ask.address = options_.self;
  // The lease runs from the moment it is asked for: the manager counts
  // from when it hears the ask, which is later.
  const uint64_t asked_ns = LeaseClockNs();
  asking_ = true;
  session_->core()->Call(proto::kCoreService,
                         static_cast<uint8_t>(proto::CoreMethod::kClusterLease),
                         EncodeLeaseAsk(ask),
                         [this, asked_ns](Status st, std::string reply) {
                           asking_ = false;
                           if (!st.ok()) return Granted(asked_ns, st);
                           Granted(asked_ns, std::move(reply));
                         });
}

void MemberLease::Granted(uint64_t asked_ns, Result<std::string> reply) {
  if (!reply.ok()) {
    Failed("the manager at " + session_address_ +
           " granted none: " + reply.status().ToString());
    return;
  }
  auto grant = DecodeLeaseGrant(*reply);
  if (!grant.ok()) {
    Failed(grant.status().ToString());
    return;
  }
  if (!grant->config.empty()) {
    auto c = DecodeConfig(grant->config);
    if (c.ok()) {
      const uint32_t epoch = c->epoch;
      if (ownership_->Install(std::move(*c))) {
        log::Info("cluster: configuration epoch {} installed (from the lease)",
                  epoch);
      }
    }
  }
  // Held only on the manager's configuration (or a newer one).
  const Ownership::Installed* have = ownership_->latest();
  if (have == nullptr || have->config.epoch < grant->epoch) {
    Failed("granted on epoch " + std::to_string(grant->epoch) +
           ", newer than this server's configuration");
    return;
  }
  const uint64_t lease_ns =
      std::min<uint64_t>(grant->lease_ms, options_.lease.count()) * 1000000ull;
  ownership_->ExtendLease(asked_ns + lease_ns);
  renewals_.fetch_add(1, std::memory_order_relaxed);
}

void MemberLease::Run() {
  while (true) {
    // The manager died while answering and blocked the loop: the session
    // (failed by the stall, its ask with it) goes, and the next ask
    // connects on the new loop.
    if (loop_->ReplaceIfStalled()) session_.reset();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    uint64_t now = LeaseClockNs();
    if (!asking_ && now >= next_ns_) {
      // Renewed every quarter lease (after a failure, sooner: Failed).
      next_ns_ = now + every_ns_;
      Ask();
    }
    NoteServing();
    if (loop_->Poll() > 0) continue;
    now = LeaseClockNs();
    const uint64_t left = next_ns_ > now ? next_ns_ - now : 0;
    loop_->worker()->Sleep(std::chrono::milliseconds(
        std::max<uint64_t>(1, std::min<uint64_t>(left / 1000000, 50))));
  }
}

void MemberLease::NoteServing() {
  if (!ownership_->replicated()) return;
  const Status leased = ownership_->Leased();
  if (leased.ok()) {
    if (serving_ == Serving::kLapsed) {
      log::Info("cluster: this server holds a lease again and serves");
    }
    serving_ = Serving::kServing;
  } else if (serving_ == Serving::kServing) {
    // Once: clients are told on each refusal (Busy).
    log::Warn(
        "cluster: its lease lapsed, this server stops serving: {} (its "
        "last ask for a lease: {})",
        leased.message(),
        last_failure_.empty() ? "not answered yet" : last_failure_);
    serving_ = Serving::kLapsed;
  }
}

}  // namespace remem::cluster
