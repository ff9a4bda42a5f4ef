// server::LeaseKeeper: the server lease that vouches for one-sided reads
// (BRIEF.md, "Liveness of one-sided reads"; docs/ARCHITECTURE.md has the
// argument).
//
// Memory a client has mapped stays readable after its server died, so a
// value read one-sided proves nothing about the present on its own. The
// server keeps a ServerLease (proto/wire.h) at offset 0 of its root region:
// "trust what you read from me until CLOCK_MONOTONIC reaches expires_ns",
// renewed every lease/10 by a thread of its own. A reader on the same host
// (the same clock) returns a one-sided value only before that instant.
//
// A server that dies stops renewing; its successor must not acknowledge a
// write while a reader could still trust the dead one's memory. So the
// keeper also writes the promised horizon to a small file (mapped, so the
// store costs no system call and survives kill -9; its blocks allocated
// before it is mapped, so a full disk is an error at start, not a SIGBUS
// at the first store) and a starting server
// waits until any horizon a predecessor left there has passed. A clean stop
// revokes the lease (expires_ns = 0) first, so a clean restart waits for
// nothing. A server killed on a port that no server takes again leaves its
// file behind: RemoveStaleHorizons clears those that nobody can need.
//
// Thread contract: Start and the destructor on one thread; the keeper's own
// thread does the renewals.

#ifndef REMEM_SERVER_LEASE_H_
#define REMEM_SERVER_LEASE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "remem/status.h"

namespace remem::server {

// CLOCK_MONOTONIC in nanoseconds (the lease's clock).
uint64_t MonotonicNs();

class LeaseKeeper {
 public:
  // The longest lease a server may hold (--lease-ms): a successor waits
  // for no horizon further ahead than this.
  static constexpr std::chrono::milliseconds kMaxLease{60'000};
  // Waits until a predecessor's horizon recorded in `horizon_file` has
  // passed (if it recorded one on this boot; at most `max_wait`), then
  // publishes the lease at `lease_at` (64 bytes in the root region) and
  // starts renewing it. `waited` receives how long the wait took. A
  // calling thread that blocks SIGINT and SIGTERM is stopped by them while
  // it waits: Unavailable, with the signal left pending (blocked) for the
  // caller. The file must be a regular file of this user; one that is not
  // (a link, a FIFO, another user's file: the default directory is
  // writable by all) is removed and made again, or, if this user may not
  // remove it, IOError names it. A file that cannot be made, or given its
  // blocks before it is mapped (a full file system: "No space left on
  // device"), is an IOError naming it too. An empty `horizon_file`
  // keeps no horizon (a server on an ephemeral port has no successor).
  // `remake_removed`: a horizon file removed under the keeper is made
  // again at its next renewal (one in a directory RemoveStaleHorizons
  // sweeps; not a data directory's, which only its owner removes).
  static Result<std::unique_ptr<LeaseKeeper>> Start(
      uint8_t* lease_at, uint64_t incarnation, std::chrono::milliseconds lease,
      const std::string& horizon_file, std::chrono::milliseconds* waited,
      bool remake_removed = false,
      std::chrono::milliseconds max_wait = kMaxLease);
  // Revokes the lease (readers stop trusting at once), stops renewing it,
  // and removes the horizon file (a successor has nothing to wait for).
  ~LeaseKeeper();
  void Revoke();
  // Never vouches past cap() (CLOCK_MONOTONIC ns): a cluster member in a
  // replicated configuration vouches for its memory only while it holds
  // its member lease (cluster/member_lease.h). The lease is published
  // again, capped, before this returns (so call it before clients can
  // connect: a reader keeps what it read until it expires); thread-safe.
  void CapBy(std::function<uint64_t()> cap);

  // Removes the horizon files in `dir` whose names start with `prefix`
  // that no server can need: this user's regular files that no live
  // keeper holds (a keeper keeps its file locked while its process lives,
  // stopped or not), written on another boot or whose horizon passed more
  // than `grace` ago. A file being created (not yet written) or revoked is
  // left alone. A live keeper's horizon may be long past: a cluster
  // member's is capped in the past until it serves a configuration, and
  // while a replicated member is cut off from its manager. Only a server
  // that started on the file's port between this read and the unlink, and
  // was killed within a tenth of a lease, could be left with no file for
  // a successor to wait on. Errors are ignored: a file left is only a
  // file.
  static void RemoveStaleHorizons(const std::string& dir,
                                  const std::string& prefix,
                                  std::chrono::nanoseconds grace);

 private:
  struct Horizon;
  LeaseKeeper() = default;
  // Opens (creating it) and maps `path` as the horizon; records its inode.
  Status MapHorizon(const std::string& path);
  // Lets go of the horizon file's mapping and descriptor (and its lock).
  void UnmapHorizon();
  // On the keeper's thread, before each renewal: a horizon file removed
  // (by hand, or by RemoveStaleHorizons in the window it leaves) is made
  // again, so a successor still finds it.
  void KeepHorizonFile();
  void Publish(uint64_t expires_ns);
  void Run();

  uint8_t* lease_at_ = nullptr;
  uint64_t incarnation_ = 0;
  uint64_t lease_ns_ = 0;
  uint64_t version_ = 0;
  uint64_t renewals_ = 0;
  // The mapped horizon file (null without one) and its inode.
  Horizon* horizon_ = nullptr;
  int horizon_fd_ = -1;  // open, with a shared lock, while this keeper lives
  std::string horizon_file_;
  uint64_t horizon_inode_ = 0;
  bool remake_removed_ = false;
  bool horizon_warned_ = false;  // a file that cannot be made again
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::function<uint64_t()> cap_;  // under mu_
  std::thread thread_;
};

}  // namespace remem::server

#endif  // REMEM_SERVER_LEASE_H_
