// durability::PartitionStore: the durable state of one partition of one
// service in --data-dir/<service>/p<N>/: its operation log
// (log-<first lsn>.rlog files) and its snapshots (snapshot-<lsn>.snap),
// recovery from them at start, group commit, the fsync policy and
// background snapshots. The service's state is seen only through
// Recoverable (recoverable.h).
//
// Write path (owner thread): the service checks Writable(), applies the
// write, calls LogPut/LogDelete with the RESULT (key, value, new version),
// and hands its reply to AfterDurable. At the end of the
// worker's Progress pass, OnPass() writes every buffered record with one
// write() (and, under `always`, one fdatasync), then runs the waiting
// replies: OK, or the IOError that kept the records from disk. Under
// `everysec` OnPass fdatasyncs about once a second; under `no` never.
//
// Snapshots are fuzzy and incremental: at start LSN L the log rotates to a
// new file beginning at L; each OnPass steps the service's SnapshotScan by
// a chunk (the state is only read, so one-sided readers see nothing).
// Recovery = the snapshot + every log record with LSN >= L, applied by
// version (idempotent), so writes during the snapshot are not lost. When
// done, log files before L and older snapshots are deleted.
//
// Thread contract: Open on any thread before the owner thread starts;
// everything else on the owner thread, except stats(), which is readable
// from any thread.

#ifndef REMEM_DURABILITY_STORE_H_
#define REMEM_DURABILITY_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "durability/log.h"
#include "durability/recoverable.h"
#include "durability/snapshot.h"
#include "remem/status.h"
#include "util/move_function.h"

namespace remem::durability {

enum class FsyncPolicy { kAlways, kEverySec, kNo };
std::string_view FsyncPolicyName(FsyncPolicy p);
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view s);

enum class RecoveryMode {
  kStrict,    // corruption before the end of the last log: refuse to start
  kTruncate,  // drop the corrupt record and everything after it
};

struct StoreOptions {
  std::string dir;  // this partition's directory
  FsyncPolicy fsync = FsyncPolicy::kEverySec;
  uint64_t snapshot_log_bytes = 64ull << 20;  // 0: only on demand
  RecoveryMode recovery = RecoveryMode::kStrict;
  std::string fault;  // fault spec (log.h), tests only; empty: none
  // Tests: > 0 makes snapshots slow (8 buckets per pass, then a pause of
  // this many microseconds), so a kill often lands inside one.
  uint64_t slow_snapshot_us = 0;
};

struct RecoveryReport {
  std::string snapshot;  // file name, empty if none
  uint64_t snapshot_pairs = 0;
  uint64_t log_records = 0;  // applied (LSN >= the snapshot's)
  uint64_t log_files = 0;
  uint64_t truncated_bytes = 0;  // torn tail (or corruption) cut off
  std::vector<std::string> warnings;
  std::chrono::microseconds took{0};
};

// Readable from any thread.
struct StoreStats {
  std::atomic<uint64_t> log_bytes{0};  // all log files of the partition
  std::atomic<uint64_t> last_snapshot_unix_ms{0};
  std::atomic<uint64_t> last_snapshot_bytes{0};
  std::atomic<uint64_t> snapshots{0};
  std::atomic<uint64_t> write_errors{0};  // failed writes / syncs
  std::atomic<uint64_t> failing{0};       // 1 while writes are refused
};

class PartitionStore {
 public:
  // Creates the directory if needed, recovers its contents into `state`
  // (which must be empty) and opens a fresh log file. Corruption names the
  // file and byte offset. `state` must outlive the store.
  static Result<std::unique_ptr<PartitionStore>> Open(
      const StoreOptions& options, Recoverable* state, RecoveryReport* report);
  ~PartitionStore();

  // OK, or the IOError that makes the log refuse writes (it retries the
  // disk at most every 100 ms).
  Status Writable();
  void LogPut(std::string_view key, std::string_view value, uint64_t version);
  void LogDelete(std::string_view key, uint64_t version);
  // Runs `done(status)` once every record logged so far is written (and
  // synced under `always`): at once if none are waiting.
  using Done = util::MoveFunction<void(Status)>;
  void AfterDurable(Done done);
  // Flushes, syncs per policy, steps a running snapshot, starts one when
  // the log has grown past the limit. Returns work done (0 = idle).
  size_t OnPass();
  // Starts a snapshot (or joins the running one); `done` gets the result.
  void RequestSnapshot(Done done);

  const StoreStats& stats() const { return stats_; }
  FsyncPolicy policy() const { return options_.fsync; }

 private:
  PartitionStore(StoreOptions o, Recoverable* state)
      : options_(std::move(o)), state_(state) {}
  Status Recover(RecoveryReport* report);
  Status OpenLog(uint64_t first_lsn);
  Status FlushNow(bool sync);
  Status StartSnapshot();
  void StepSnapshot();
  void EndSnapshot(Status st, uint64_t bytes);
  void UpdateLogBytes();

  StoreOptions options_;
  Recoverable* state_;
  std::shared_ptr<FaultState> faults_;
  std::unique_ptr<LogWriter> log_;
  struct OldLog {
    uint64_t first_lsn;
    std::string path;
    uint64_t bytes;
  };
  std::vector<OldLog> old_logs_;  // closed log files, oldest first
  uint64_t log_bytes_since_snapshot_ = 0;
  std::vector<Done> waiting_;
  Status error_;  // the last disk error while failing
  std::chrono::steady_clock::time_point last_sync_, last_retry_;

  // The running snapshot.
  std::unique_ptr<SnapshotWriter> snap_;
  std::unique_ptr<SnapshotScan> scan_;
  std::vector<Done> snap_waiting_;
  std::string last_snapshot_;  // file name of the newest snapshot

  StoreStats stats_;
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_STORE_H_
