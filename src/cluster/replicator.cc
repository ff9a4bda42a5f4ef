#include "cluster/replicator.h"

#include <sched.h>

#include <algorithm>
#include <set>

#include "client/rpc_client.h"
#include "client/session_core.h"
#include "fabric/worker.h"
#include "util/log.h"

namespace remem::cluster {

namespace {

// The pause before asking a backup again: 1 ms, doubling to 100 ms (a
// backup that failed is dropped by the manager about a lease later; a
// backup that installs a new epoch does so within milliseconds).
std::chrono::milliseconds RetryPause(int failures) {
  return std::chrono::milliseconds(std::min(1 << std::min(failures, 7), 100));
}

}  // namespace

Result<std::unique_ptr<Replicator>> Replicator::Start(
    const Ownership* ownership, SessionOptions session,
    std::chrono::microseconds spin, std::chrono::milliseconds fault_delay,
    std::chrono::milliseconds fault_last_backup_delay) {
  std::unique_ptr<Replicator> r(new Replicator(ownership, std::move(session),
                                               spin, fault_delay,
                                               fault_last_backup_delay));
  auto loop = PeerLoop::Create(r->options_.transport);
  if (!loop.ok()) return loop.status().WithContext("replication");
  r->loop_ = std::move(*loop);
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

namespace {
Status Stopped() {
  return Status::Unavailable(
      "the server is stopping: its writes not yet replicated may or may not "
      "have taken effect");
}
}  // namespace

Replicator::~Replicator() {
  Stop();
  sessions_.clear();  // before the loop
  retired_.clear();
}

void Replicator::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stop_ = true;
  }
  loop_->Wake();
  if (thread_.joinable()) thread_.join();
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    left.swap(incoming_);
  }
  for (auto& job : active_) job->done(Stopped());
  for (auto& job : left) job->done(Stopped());
  active_.clear();
}

void Replicator::Replicate(std::string batch, std::vector<uint32_t> shards,
                           Method method, Done done) {
  auto job = std::make_shared<Job>();
  job->batch = std::move(batch);
  job->method = method;
  job->done = std::move(done);
  job->shards = std::move(shards);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      incoming_.push_back(std::move(job));
      job = nullptr;
    }
  }
  if (job != nullptr) return job->done(Stopped());
  loop_->Notify();
}

Result<Session*> Replicator::SessionTo(const std::string& address,
                                       uint64_t incarnation) {
  auto it = sessions_.find(address);
  const bool stale = stale_.erase(address) > 0;
  if (it != sessions_.end() && !stale &&
      it->second.incarnation == incarnation &&
      it->second.session->core()->connected()) {
    return it->second.session.get();
  }
  if (it != sessions_.end()) {
    if (it->second.session->core()->connected()) {
      retired_.push_back(std::move(it->second.session));
    }
    sessions_.erase(it);
  }
  SessionOptions o = options_;
  o.server = address;
  auto s = Session::Connect(o, loop_->get());
  if (!s.ok()) return s.status();
  it = sessions_.insert_or_assign(address, Peer{std::move(*s), incarnation})
           .first;
  return it->second.session.get();
}

bool Replicator::Advance(const std::shared_ptr<Job>& job) {
  const Ownership::Installed* c = ownership_->current();
  // Who must hold it now: the backups of the shards still owned here.
  std::map<std::string, uint64_t> targets;  // address, incarnation
  std::set<std::string> held_back;          // testing: last backups
  const bool hold_last = Clock::now() < job->last_backup_at;
  if (c != nullptr) {
    for (uint32_t s : job->shards) {
      if (!c->owns[s]) {
        job->lost = true;
        continue;
      }
      const std::vector<uint16_t> backups = c->config.BackupsOf(s);
      for (uint16_t b : backups) {
        const Member& m = c->config.members[b];
        targets[m.address] = m.incarnation;
      }
      if (hold_last && !backups.empty()) {
        held_back.insert(c->config.members[backups.back()].address);
      }
    }
  }
  bool waiting = false;
  for (const auto& [address, incarnation] : targets) {
    const std::string t = address + "/" + std::to_string(incarnation);
    if (job->acked[t]) continue;
    waiting = true;
    if (job->sending[t] || Clock::now() < job->retry_at ||
        held_back.count(address) != 0) {
      continue;
    }
    auto s = SessionTo(address, incarnation);
    if (!s.ok()) {
      ++job->failures;
      retries_.fetch_add(1, std::memory_order_relaxed);
      job->retry_at = Clock::now() + RetryPause(job->failures);
      continue;
    }
    job->sending[t] = true;
    client::SessionCore* core = (*s)->core();
    core->rpc()->set_epoch(c->config.epoch);
    core->Call(job->method.service, job->method.method, job->batch,
               [this, job, t, peer = address](Status st, std::string) {
                 replied_ = true;
                 job->sending[t] = false;
                 if (st.ok()) {
                   job->acked[t] = true;
                   return;
                 }
                 // Another epoch at the backup, or it is gone: asked
                 // again by the configuration installed then.
                 ++job->failures;
                 retries_.fetch_add(1, std::memory_order_relaxed);
                 job->retry_at = Clock::now() + RetryPause(job->failures);
                 // No answer at all: the next send goes on a new session.
                 if (st.code() == StatusCode::kTimedOut) stale_.insert(peer);
                 if (job->failures == 1 || job->failures % 100 == 0) {
                   log::Debug("replication to {}: {} (asked again)", t,
                              st.ToString());
                 }
               });
  }
  // A send still in flight to a member that is no longer a backup is not
  // waited for (its callback holds the job).
  if (c == nullptr || waiting) return false;
  batches_.fetch_add(1, std::memory_order_relaxed);
  job->done(job->lost ? Status::Unavailable(
                            "a shard was taken from this server before its "
                            "writes were replicated: they may or may not "
                            "have taken effect")
                      : Status::OK());
  return true;
}

void Replicator::Run() {
  const Ownership::Installed* advanced_by = nullptr;
  auto last_work = Clock::now();
  unsigned idle_polls = 0;
  while (true) {
    // Before the look at incoming_ (PeerLoop's contract). The sessions,
    // failed by the stall, are retired (closed once their calls are
    // failed: at once); the sends they failed go again on new ones.
    if (loop_->ReplaceIfStalled()) {
      for (auto& [address, peer] : sessions_) {
        retired_.push_back(std::move(peer.session));
      }
      sessions_.clear();
      replied_ = true;
    }
    bool arrived = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
      while (!incoming_.empty()) {
        if (fault_delay_.count() > 0) {
          incoming_.front()->retry_at = Clock::now() + fault_delay_;
        }
        if (fault_last_backup_delay_.count() > 0) {
          incoming_.front()->last_backup_at =
              Clock::now() + fault_delay_ + fault_last_backup_delay_;
        }
        active_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
        arrived = true;
      }
    }
    // Jobs are looked at again only when something they wait for may have
    // changed: a batch arrived, a reply came, another configuration was
    // installed, or a retry is due.
    const Ownership::Installed* c = ownership_->current();
    const auto now = Clock::now();
    if (arrived || replied_ || c != advanced_by || now >= next_retry_) {
      replied_ = false;
      last_work = now;
      advanced_by = c;
      next_retry_ = Clock::time_point::max();
      // In order: a partition's batches are handed over one at a time, so
      // order matters only within a job.
      for (size_t i = 0; i < active_.size();) {
        if (Advance(active_[i])) {
          active_.erase(active_.begin() + i);
        } else {
          if (active_[i]->retry_at > now) {
            next_retry_ = std::min(next_retry_, active_[i]->retry_at);
          }
          if (active_[i]->last_backup_at > now) {
            next_retry_ = std::min(next_retry_, active_[i]->last_backup_at);
          }
          ++i;
        }
      }
      // A retired session is closed once nothing is outstanding on it (its
      // calls answered or timed out): closing it then waits for nothing.
      std::erase_if(retired_, [](const std::unique_ptr<Session>& s) {
        return s->core()->rpc()->pending() == 0;
      });
    }
    if (loop_->Poll() > 0) {
      last_work = Clock::now();
      continue;
    }
    // Poll a little after the last work before sleeping: for the replies of
    // the batches out (a backup on this host answers within tens of
    // microseconds), and for the next batch, which a partition hands over
    // as soon as its last one is held (one in flight each). A sleeping
    // replicator costs a wake-up (a system call on each side, a context
    // switch) per batch; the yields let a backup or a partition that
    // shares this CPU run meanwhile.
    if (Clock::now() - last_work < spin_) {
      if ((++idle_polls & 15) == 0) sched_yield();
      continue;
    }
    // Idle or waiting: sleep until a reply, a new batch (Wake) or the next
    // retry. A wake-up with nothing to do starts no new spin: an idle
    // replicator, or one waiting on a slow backup, sleeps on.
    auto pause = std::chrono::milliseconds(active_.empty() ? 100 : 1);
    if (next_retry_ != Clock::time_point::max()) {
      pause = std::clamp(std::chrono::ceil<std::chrono::milliseconds>(
                             next_retry_ - Clock::now()),
                         std::chrono::milliseconds(0), pause);
    }
    loop_->worker()->Sleep(pause);
  }
}

}  // namespace remem::cluster
