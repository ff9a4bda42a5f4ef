// durability::Durability: everything durable under --data-dir, for every
// service. Layout:
//
//   <data-dir>/LOCK                 held (flock) while a server uses the
//                                   directory; names its pid
//   <data-dir>/lease                the server lease's horizon (lease.h)
//   <data-dir>/meta                 "remem-data-2 partitions <N>"
//   <data-dir>/<service>/meta       the service's own settings (e.g. the
//                                   hash store's partition seed)
//   <data-dir>/<service>/p<P>/      one PartitionStore (store.h) per
//                                   partition of each durable service (its
//                                   logs, snapshots and run file)
//
// Every file goes through the Env (env.h): created 0600, directories 0700
// whatever the umask; a data directory open to others is tightened to 0700
// at Open, with a warning. A second server on the same directory is
// refused (Busy, naming the holder of LOCK).
//
// A data directory of the first layout (remem-data-1: meta holding the
// partition count and hash seed, p<P>/ at the top) is migrated in place at
// Open: its partitions move under hash/, with renames and directory syncs.
// Small files (the metas) are written to a temporary name, fdatasynced,
// renamed and the directory synced, so a crash leaves the old or the new.
//
// Thread contract: Open, ReadServiceMeta and WriteServiceMeta before the
// server threads start (one thread). OpenPartition may run in parallel for
// different partitions. OnPass(p), RetryAt(p), RequestSnapshot(p, ...) and
// Stop(p) on p's owner thread. AddStats and recovery_summary from any thread.

#ifndef REMEM_DURABILITY_DURABILITY_H_
#define REMEM_DURABILITY_DURABILITY_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "durability/env.h"
#include "durability/recoverable.h"
#include "durability/store.h"
#include "proto/codec.h"
#include "remem/status.h"

namespace remem::durability {

struct DurabilityOptions {
  std::string data_dir;
  Env* env = nullptr;  // null: Env::Posix(); must outlive the Durability
  FsyncPolicy fsync = FsyncPolicy::kEverySec;
  uint64_t snapshot_log_bytes = 64ull << 20;  // 0: only on demand
  RecoveryMode recovery = RecoveryMode::kStrict;
  // Tests: fault spec (env.h) for every store, and for the metas.
  std::string fault;
  uint64_t slow_snapshot_us = 0;  // tests: see StoreOptions
};

class Durability {
 public:
  // Creates or checks the data directory for `partitions` partitions
  // (refusing a directory made with another count, or one another server
  // holds), migrating the first layout.
  static Result<std::unique_ptr<Durability>> Open(
      const DurabilityOptions& options, uint32_t partitions);
  ~Durability();

  const DurabilityOptions& options() const { return options_; }

  // The service's meta file, or nullopt if it has none yet. Corruption if
  // it has none but the service's partitions hold data (it was removed).
  Result<std::optional<std::string>> ReadServiceMeta(std::string_view service);
  Status WriteServiceMeta(std::string_view service, const std::string& text);

  // Recovers partition p of `service` into `state` and opens its log. The
  // store lives as long as this object. A partition with neither log nor
  // snapshot while another of the service holds records had its files
  // removed: Corruption under kStrict, reported lost under kTruncate.
  Result<PartitionStore*> OpenPartition(std::string_view service, uint32_t p,
                                        Recoverable* state);

  // Group commit of every store of partition p (end of an event-loop pass).
  size_t OnPass(uint32_t p);
  // The earliest PartitionStore::retry_at of partition p's stores: when
  // its event loop must pass again to retry a failing disk. nullopt: none
  // is failing.
  std::optional<std::chrono::steady_clock::time_point> RetryAt(
      uint32_t p) const;
  // Snapshots every store of partition p; `done` gets the first error.
  void RequestSnapshot(uint32_t p, PartitionStore::Done done);
  // The server is stopping: PartitionStore::Stop on every store of
  // partition p (their snapshot waiters get Unavailable).
  void Stop(uint32_t p);
  // The server has begun its clean stop: the LOCK file says so, and a
  // server started on the directory meanwhile waits for the lock instead
  // of being refused (Env::LockFile). Any thread.
  void MarkStopping();

  // fsync_policy, log_bytes, last_snapshot_unix_ms, last_snapshot_bytes,
  // snapshots, snapshot_failures, log_write_errors, log_failing,
  // recovered_pairs, recovered_log_records, recovered_log_bytes,
  // recovery_ms, recovery_fallbacks, recovery_lost_records: summed over
  // every store (last_snapshot_unix_ms: the newest; recovery_ms: the
  // slowest partition; fsync_policy: the text).
  void AddStats(std::vector<proto::StatValue>* out) const;
  // "recovered N pairs from snapshots and M log records (B bytes) in X ms
  // (...)" (N: the snapshots' pairs kept; "; the snapshots held K more
  // pairs whose keys the log wrote or deleted since" when the log
  // superseded some), once every OpenPartition has run, with a loud "LOST"
  // clause when
  // --recovery truncate dropped records; warnings and losses were logged
  // as they came.
  std::string recovery_summary() const;

 private:
  Durability(DurabilityOptions o, uint32_t partitions)
      : options_(std::move(o)), partitions_(partitions) {}
  Status CheckLayout();
  // Whether `dir` (a service's directory) has a partition directory (p0,
  // p1, ...) with a file in it.
  Result<bool> PartitionDataIn(const std::string& dir);
  // Whether the partition directory `dir` holds a snapshot or a log file
  // (`with_records`: a snapshot, or a log file that is not empty). False if
  // it is missing or cannot be read.
  bool HoldsLogOrSnapshot(const std::string& dir, bool with_records);

  DurabilityOptions options_;
  uint32_t partitions_;
  Env* env_ = nullptr;             // the base Env of every store
  std::unique_ptr<Env> meta_env_;  // with a fault spec: over env_
  Env* files_ = nullptr;           // for the metas: meta_env_ or env_
  std::unique_ptr<FileLock> lock_;
  mutable std::mutex mu_;  // guards the members below while opening
  // Per partition: its stores, in opening order.
  std::vector<std::vector<std::unique_ptr<PartitionStore>>> stores_;
  uint64_t recovered_pairs_ = 0;
  uint64_t superseded_pairs_ = 0;  // RecoveryReport::snapshot_superseded
  uint64_t recovered_log_records_ = 0;
  uint64_t recovered_log_bytes_ = 0;
  uint64_t recovery_us_ = 0;  // the longest partition
  uint64_t fallbacks_ = 0;    // partitions that fell back a generation
  uint64_t lost_records_ = 0;
  uint64_t lossy_partitions_ = 0;
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_DURABILITY_H_
