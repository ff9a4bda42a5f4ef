// cluster::MemberLease: a member's lease from the configuration manager
// (issue #13; docs/ARCHITECTURE.md, "Replication"), FaRM's failure
// detector over remem's own messages instead of ZooKeeper's sessions.
//
// Every lease/4 the holder asks the manager (core method kClusterLease,
// with the epoch this member has installed and its incarnation). The
// manager's grant is good for `lease` from the moment the holder asked
// (Ownership::ExtendLease); a grant that carries a newer configuration is
// installed first, so a member never holds a lease on a configuration
// older than the manager's. In a replicated configuration a member whose
// lease lapsed serves nothing (Ownership), and the manager fails a member
// over only once it has not heard from it for lease + margin: by then the
// member has stopped serving by its own clock.
//
// One thread with its own UCX worker and a session to the manager (found
// through `manager()`, the member's reading of the election in ZooKeeper).
//
// Thread contract: Start, Stop and the destructor from one thread; the
// getters from any thread.

#ifndef REMEM_CLUSTER_MEMBER_LEASE_H_
#define REMEM_CLUSTER_MEMBER_LEASE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cluster/ownership.h"
#include "cluster/peer_loop.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"

namespace remem::cluster {

struct MemberLeaseOptions {
  std::string self;  // this member's address
  uint64_t incarnation = 0;
  std::chrono::milliseconds lease{500};
  SessionOptions session;  // secret, transport (the timeout is lease/2)
};

class MemberLease {
 public:
  // `manager()` returns the manager's address, or "" while unknown; it is
  // called from the holder's thread. `ownership` must outlive this.
  static Result<std::unique_ptr<MemberLease>> Start(
      MemberLeaseOptions options, Ownership* ownership,
      std::function<std::string()> manager);
  void Stop();
  ~MemberLease();
  MemberLease(const MemberLease&) = delete;
  MemberLease& operator=(const MemberLease&) = delete;

  // Grants received, and asks that failed (no manager, refused, no reply).
  uint64_t renewals() const {
    return renewals_.load(std::memory_order_relaxed);
  }
  uint64_t failures() const {
    return failures_.load(std::memory_order_relaxed);
  }

 private:
  MemberLease(MemberLeaseOptions o, Ownership* ownership,
              std::function<std::string()> manager)
      : options_(std::move(o)),
        ownership_(ownership),
        manager_(std::move(manager)) {}
  void Run();
  void Ask();
  // `why`: what the last ask met, for the log when the lease lapses.
  void Failed(std::string why);
  void Granted(uint64_t asked_ns, Result<std::string> reply);
  // Logs once when this member stops serving for want of a lease, and
  // once when it serves again.
  void NoteServing();

  const MemberLeaseOptions options_;
  Ownership* const ownership_;
  const std::function<std::string()> manager_;
  std::unique_ptr<PeerLoop> loop_;
  std::unique_ptr<Session> session_;  // to session_address_ (thread's)
  std::string session_address_;
  bool asking_ = false;  // a request is in flight (thread's)
  const uint64_t every_ns_ = uint64_t(options_.lease.count()) * 250000ull;
  uint64_t next_ns_ = 0;      // the next ask (thread's)
  std::string last_failure_;  // what the last failed ask met (thread's)
  // Whether this member serves under its lease (thread's): not yet (no
  // lease since it started), serving, or lapsed (logged, NoteServing).
  enum class Serving { kNotYet, kServing, kLapsed } serving_ = Serving::kNotYet;
  std::mutex mu_;
  bool stop_ = false;  // under mu_
  std::atomic<uint64_t> renewals_{0}, failures_{0};
  std::thread thread_;
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_MEMBER_LEASE_H_
