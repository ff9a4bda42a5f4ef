// cluster::Replicator: a primary's side of replication (issue #13;
// docs/ARCHITECTURE.md, "Replication"). In a replicated cluster each
// shard's owner (its primary) ships the records of its writes to the
// shard's backups (cluster/config.h) and answers a write only once every
// backup holds it in memory.
//
// A service's partition hands over, once per event-loop pass, one batch:
// the records its pass wrote, encoded as the service's own replication
// method takes them (the hash store: a ShardPairs, hash/codec.h, for
// hash method kReplicate), with the shards they are of, all owned by this
// server when they were written. The replicator sends it (that method, at
// this server's configuration epoch) to every member that backs up one of
// those shards in the configuration installed now, and calls `done` once
// each of them holds it. It never reads the batch. A backup that refuses
// (it has installed another epoch, or is unreachable) is asked again,
// with a growing pause, by the configuration installed at that moment: a
// backup that the manager dropped from a shard (it failed) is no longer
// waited for, and a shard that this server no longer owns is not sent.
// `done` gets OK if this server still owned every shard of the batch when
// the last backup answered; otherwise Unavailable (the writes of a shard
// that was taken from this server may or may not have survived: the client
// must treat them as unknown).
//
// One thread with its own UCX worker and a session to each backup it
// needs (opened when first needed; opened again for a member that
// restarted, or after a send that got no answer within the session's
// timeout: a session can break without a word), so the partitions'
// threads never wait on the network. After its last work it polls for
// `spin` before it sleeps, for replies and for the next batch (a sleeping
// replicator costs a wake-up on each side per batch), and it looks at its
// batches again only when something they wait for changed: a batch handed
// over, a reply, another configuration, a retry due.
//
// Thread contract: Replicate from any thread; `done` runs on the
// replicator's thread (or, after Stop, on the caller's). Start, Stop and
// the destructor from one thread.

#ifndef REMEM_CLUSTER_REPLICATOR_H_
#define REMEM_CLUSTER_REPLICATOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster/ownership.h"
#include "cluster/peer_loop.h"
#include "proto/wire.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"
#include "util/move_function.h"

namespace remem::cluster {

class Replicator {
 public:
  // `session`: the secret, transport and timeout of the sessions to
  // backups. `ownership` must outlive the replicator. `spin`: how long the
  // thread polls after its last work before it sleeps (the server's
  // --spin-us).
  // `fault_delay` (testing): each batch waits this long before it is first
  // sent. `fault_last_backup_delay` (testing): and this long more to the
  // last backup of each of its shards (the others hold it first, as when a
  // primary dies between its sends).
  static Result<std::unique_ptr<Replicator>> Start(
      const Ownership* ownership, SessionOptions session,
      std::chrono::microseconds spin = std::chrono::microseconds(100),
      std::chrono::milliseconds fault_delay = std::chrono::milliseconds(0),
      std::chrono::milliseconds fault_last_backup_delay =
          std::chrono::milliseconds(0));
  // Stops the thread; what is left, and what comes later, fails with
  // Unavailable. The destructor calls it.
  void Stop();
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  using Done = util::MoveFunction<void(Status)>;
  // Where a batch goes at each backup: the service's method that applies
  // it.
  struct Method {
    proto::ServiceId service = 0;
    uint8_t method = 0;
  };
  // Ships `batch` to the backups of `shards` (the distinct shards of its
  // records), calling `method` there; done(status) as above.
  void Replicate(std::string batch, std::vector<uint32_t> shards, Method method,
                 Done done);

  // Batches sent and acknowledged by every backup, and sends retried.
  uint64_t batches() const { return batches_.load(std::memory_order_relaxed); }
  uint64_t retries() const { return retries_.load(std::memory_order_relaxed); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Job {
    std::string batch;
    Method method;
    Done done;
    std::vector<uint32_t> shards;  // the batch's shards (distinct)
    // By address and incarnation: true once it holds it, true while a send
    // is in flight.
    std::map<std::string, bool> acked;
    std::map<std::string, bool> sending;
    bool lost = false;  // a shard of the batch was taken from this server
    Clock::time_point retry_at{};
    int failures = 0;
    // Testing (fault_last_backup_delay): not sent to a shard's last backup
    // before this.
    Clock::time_point last_backup_at{};
  };
  Replicator(const Ownership* ownership, SessionOptions session,
             std::chrono::microseconds spin,
             std::chrono::milliseconds fault_delay,
             std::chrono::milliseconds fault_last_backup_delay)
      : ownership_(ownership),
        options_(std::move(session)),
        spin_(spin),
        fault_delay_(fault_delay),
        fault_last_backup_delay_(fault_last_backup_delay) {}
  void Run();
  // Sends what `job` still needs; true once it is finished (done called).
  bool Advance(const std::shared_ptr<Job>& job);
  // A session to the member at `address` of `incarnation`: a member that
  // restarted at the same address gets a new one (over shared memory
  // nothing tells the old one its peer died).
  Result<Session*> SessionTo(const std::string& address, uint64_t incarnation);

  const Ownership* const ownership_;
  const SessionOptions options_;
  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds fault_delay_;
  const std::chrono::milliseconds fault_last_backup_delay_;
  std::unique_ptr<PeerLoop> loop_;
  struct Peer {
    std::unique_ptr<Session> session;
    uint64_t incarnation = 0;
  };
  std::map<std::string, Peer> sessions_;  // thread's
  // Sessions replaced while calls were still out on them (to a member's
  // earlier incarnation, or one that left a batch unanswered), kept until
  // those calls are answered or time out: closing a session waits for its
  // calls, which a dead peer never answers.
  std::vector<std::unique_ptr<Session>> retired_;  // thread's
  // Addresses whose session left a batch unanswered: replaced at the next
  // send (thread's).
  std::set<std::string> stale_;
  std::vector<std::shared_ptr<Job>> active_;  // thread's
  // A reply came since the jobs were last advanced; the earliest retry due
  // (thread's).
  bool replied_ = false;
  Clock::time_point next_retry_ = Clock::time_point::max();
  std::mutex mu_;
  std::deque<std::shared_ptr<Job>> incoming_;  // under mu_
  bool stop_ = false;                          // under mu_
  bool stopped_ = false;                       // under mu_: thread ended
  std::atomic<uint64_t> batches_{0}, retries_{0};
  std::thread thread_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_REPLICATOR_H_
