// cluster::PeerLoop: the event loop of a member's background thread that
// talks to other members (the replicator's, the member lease's). A member
// killed while it sends to that loop over shared memory can block the
// loop's receive queue for good (remem/session.h, EventLoop::stalled;
// docs/ARCHITECTURE.md, UCX finding 20): the thread then moves to a new
// loop, and its sessions (failed by the stall) are connected again there.
//
// Thread contract: the owner thread calls everything but Wake and Notify,
// which any thread may call: they reach the current loop's worker, or one
// just replaced (kept until this object goes, so never a destroyed one).
// An owner that replaces the loop (ReplaceIfStalled) before it looks at
// the work other threads hand it, under the lock they hand it with, misses
// no wake-up: a thread that handed work after that look finds the new
// worker. The owner's sessions must be destroyed before this object.

#ifndef REMEM_CLUSTER_PEER_LOOP_H_
#define REMEM_CLUSTER_PEER_LOOP_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"

namespace remem::fabric {
class Worker;
}

namespace remem::cluster {

class PeerLoop {
 public:
  static Result<std::unique_ptr<PeerLoop>> Create(Transport transport);

  EventLoop* get() const { return loop_.get(); }
  fabric::Worker* worker() const;
  // Polls the loop, and the loops it replaced: the sessions left on them
  // fail there (their closes end, their callbacks run).
  size_t Poll();

  // If the loop stalled: every session on it has failed (its operations
  // with the stall's Unavailable; this polls it once more, so they have),
  // and the owner now connects on a new loop, which this makes current.
  // True if it did; false if the loop is well, or no new loop could be
  // made (tried again at most every 100 ms). A replaced loop is kept, and
  // polled, until this object goes: one per stall, which takes a peer
  // killed mid-send.
  bool ReplaceIfStalled();

  void Wake();
  void Notify();

 private:
  explicit PeerLoop(Transport transport) : transport_(transport) {}
  const Transport transport_;
  // Replaced loops, declared before the current one: destroyed after it.
  std::vector<std::unique_ptr<EventLoop>> old_;
  std::unique_ptr<EventLoop> loop_;
  std::chrono::steady_clock::time_point next_try_{};
  std::atomic<fabric::Worker*> waker_{nullptr};
};

}  // namespace remem::cluster

#endif  // REMEM_CLUSTER_PEER_LOOP_H_
