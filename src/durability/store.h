// durability::PartitionStore: the durable state of one partition of one
// service in --data-dir/<service>/p<N>/: its operation log
// (log-<first lsn>.rlog files) and its snapshots (snapshot-<lsn>.snap),
// recovery from them at start, group commit, the fsync policy and
// background snapshots. The service's state is seen only through
// Recoverable (recoverable.h); every file through the Env (env.h).
//
// Write path (owner thread): the service checks Writable(), applies the
// write, calls LogPut/LogDelete with the RESULT (key, value, new version),
// and hands its reply to AfterDurable. At the end of the worker's Progress
// pass, OnPass() writes every buffered record with one write() (and, under
// `always`, one fdatasync), then runs the waiting replies: OK, or the
// IOError that kept the records from disk. Under `everysec` OnPass
// fdatasyncs about once a second; under `no` only when a snapshot starts
// and at close.
//
// Snapshots are fuzzy and incremental: at start LSN L the log rotates to a
// new file beginning at L; each OnPass steps the service's SnapshotScan by
// a chunk (the state is only read, so one-sided readers see nothing). The
// snapshot file is then sealed (fdatasync), read back and verified a chunk
// per pass, and only then renamed into place. The state at the end of the
// log = the snapshot + every log record with LSN >= L (a key's last record
// in log order supersedes what the snapshot holds of it), so writes during
// the snapshot are not lost.
//
// Generations: a generation is a snapshot (or the empty state at LSN 1)
// and the log from its LSN on. Two are kept: the newest verified snapshot
// and the one before it, with every log file from the older one's LSN.
// When a new snapshot is verified, the oldest generation (its snapshot and
// the log files wholly before the next snapshot's LSN) is deleted.
//
// Recovery: the base is the newest snapshot that verifies (a newer one that
// is corrupt is reported and renamed *.corrupt, one that cannot be read is
// reported and left as it is, and the previous generation used instead); then
// every log record from the base's LSN is read and verified, with no LSN
// missing, before anything is applied; then the final state is applied
// (Recoverable: each key once). A torn final record of the last log file (a
// write cut short) is truncated with a warning, and so is an atomic group the
// end of the log cuts short (its records before the cut are not applied).
// Anything else that keeps recovery from reaching the newest record on disk (a
// corrupt record before the end, a missing log file, the newest one too: the
// log that begins at the base snapshot's LSN always exists, an empty one
// being reopened in place) refuses to start
// (kStrict), naming the files and the LSNs out of reach; kTruncate starts from
// what is reachable and reports exactly what it dropped (RecoveryReport::lost).
//
// The run file (`run`, written atomically): "remem-run running ..." from
// the end of recovery (before anything is served) until a clean stop
// rewrites it "remem-run clean lsn L ..." (L: the log's last LSN) once every
// record of the run reached the log and no write of the run failed. It also
// keeps the version counter (so a gap survives a run that logged nothing)
// and the state's RunNote. A recovery that does not find a clean run file
// naming the LSN it reached (a new partition aside), or that drops or
// truncates anything, starts unclean: RecoveryReport::unclean, the counter
// raised by kUncleanVersionGap, Recoverable::RecoveredUncleanly.
//
// Thread contract: Open on any thread before the owner thread starts;
// everything else on the owner thread, except stats(), which is readable
// from any thread. The destructor runs on any thread once the owner thread
// is done with the store; it runs no waiting `done` (they are destroyed:
// Stop answers the snapshot waiters first).

#ifndef REMEM_DURABILITY_STORE_H_
#define REMEM_DURABILITY_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "durability/env.h"
#include "durability/log.h"
#include "durability/recoverable.h"
#include "durability/snapshot.h"
#include "remem/status.h"
#include "util/move_function.h"

namespace remem::durability {

enum class FsyncPolicy { kAlways, kEverySec, kNo };
std::string_view FsyncPolicyName(FsyncPolicy p);
Result<FsyncPolicy> ParseFsyncPolicy(std::string_view s);

// After a run that did not stop cleanly (no clean-stop run file, see
// PartitionStore), or a recovery that dropped or truncated records, the
// version counter skips this many versions above everything recovered: a
// write applied in memory (and read) whose record never reached the log
// consumed a version that must not be handed out again.
inline constexpr uint64_t kUncleanVersionGap = uint64_t{1} << 32;

enum class RecoveryMode {
  // Start only with everything on disk: refuse otherwise, naming what is
  // out of reach.
  kStrict,
  // Start from the longest intact prefix of the history (the newest valid
  // generation up to the first unreadable or missing record), and report
  // the rest as lost.
  kTruncate,
};

struct StoreOptions {
  std::string dir;     // this partition's directory
  Env* env = nullptr;  // null: Env::Posix()
  std::string fault;   // fault spec (env.h) over `env`, tests; empty: none
  FsyncPolicy fsync = FsyncPolicy::kEverySec;
  uint64_t snapshot_log_bytes = 64ull << 20;  // 0: only on demand
  RecoveryMode recovery = RecoveryMode::kStrict;
  // Tests: > 0 makes snapshots slow (8 buckets per pass, then a pause of
  // this many microseconds), so a kill often lands inside one.
  uint64_t slow_snapshot_us = 0;
  // Start unclean whatever the files say (Durability: this partition's
  // files were removed, so what its versions reached is unknown).
  bool unclean = false;
};

struct RecoveryReport {
  std::string snapshot;         // the base snapshot's file name; empty: none
  uint64_t snapshot_pairs = 0;  // applied from it (the log's are newer)
  // Of its pairs, those not applied: their keys the log after it writes
  // (or deletes) again, which recovery takes from the log instead.
  uint64_t snapshot_superseded = 0;
  uint64_t log_records = 0;  // read from the base's LSN on
  uint64_t log_bytes = 0;    // of those records
  uint64_t log_files = 0;
  uint64_t last_lsn = 0;         // the recovered state's newest record
  uint64_t truncated_bytes = 0;  // torn tail (or, truncating, corruption)
  bool fell_back = false;        // a newer snapshot was corrupt/unreadable
  std::vector<std::string> warnings;
  // kTruncate: what was dropped (LSN ranges and files), one line each.
  std::vector<std::string> lost;
  uint64_t lost_records = 0;  // LSNs dropped, as far as the files show
  // The previous run did not stop cleanly (or recovery dropped records):
  // versions skip kUncleanVersionGap.
  bool unclean = false;
  std::chrono::microseconds took{0};
};

// Readable from any thread.
struct StoreStats {
  std::atomic<uint64_t> log_bytes{0};  // all log files of the partition
  std::atomic<uint64_t> last_snapshot_unix_ms{0};
  std::atomic<uint64_t> last_snapshot_bytes{0};
  std::atomic<uint64_t> snapshots{0};
  std::atomic<uint64_t> snapshot_failures{0};  // failed or did not verify
  std::atomic<uint64_t> write_errors{0};       // failed writes / syncs
  std::atomic<uint64_t> failing{0};            // 1 while writes are refused
};

class PartitionStore {
 public:
  // Creates the directory if needed, recovers its contents into `state`
  // (which must be empty) and opens a fresh log file. `state` must outlive
  // the store. A recovery that fails before the state is whole (corruption,
  // a refusal, a state error) has changed nothing on disk.
  static Result<std::unique_ptr<PartitionStore>> Open(
      const StoreOptions& options, Recoverable* state, RecoveryReport* report);
  // The clean stop's last write and sync of the log, failing or not: the
  // records a failing log still buffers become durable if the disk takes
  // them now; if it does not, a warning names how many are lost.
  ~PartitionStore();

  // OK, or the IOError that makes the log refuse writes (it retries the
  // disk at most every 100 ms).
  Status Writable();
  // While the log is failing: when OnPass next retries the disk (every
  // 100 ms, writes or not: the buffered records get to disk once it takes
  // them), for the owner's event loop to wake then. nullopt otherwise.
  std::optional<std::chrono::steady_clock::time_point> retry_at() const;
  // `more_in_group`: the next record logged belongs to the same atomic
  // group as this one (log.h); recovery applies a group whole or not at
  // all. A group is logged within one call of the owner thread (a snapshot
  // never starts inside it), its last record without the flag.
  void LogPut(std::string_view key, std::string_view value, uint64_t version,
              bool more_in_group = false);
  void LogDelete(std::string_view key, uint64_t version,
                 bool more_in_group = false);
  // Runs `done(status)` once every record logged so far is written (and
  // synced under `always`): at once if none are waiting.
  using Done = util::MoveFunction<void(Status)>;
  void AfterDurable(Done done);
  // Flushes, syncs per policy, retries a failing log's disk (retry_at),
  // steps a running snapshot, starts one when the log has grown past the
  // limit. Returns work done (0 = idle).
  size_t OnPass();
  // Starts a snapshot (or joins the running one); `done` gets the result
  // once it is verified and in place. After Stop: at once, Unavailable.
  void RequestSnapshot(Done done);
  // The server is stopping (its sessions are still open): a running
  // snapshot is abandoned (its .tmp file removed, the previous snapshot
  // kept, as after a crash inside it) and every snapshot waiter gets
  // Unavailable ("the server is stopping"), as does every later
  // RequestSnapshot; no snapshot starts on its own any more. Writes and
  // their group commit go on until the store is destroyed.
  void Stop();

  const StoreStats& stats() const { return stats_; }
  FsyncPolicy policy() const { return options_.fsync; }

 private:
  PartitionStore(StoreOptions o, Recoverable* state)
      : options_(std::move(o)), state_(state) {}
  Status Recover(RecoveryReport* report);
  Result<std::unique_ptr<FileData>> ReadWhole(const std::string& path);
  // Writes `bytes` to a new file at `path` and syncs it (what recovery cuts
  // from a log, kept for a post-mortem).
  Status KeepBytes(const std::string& path, std::string_view bytes);
  Status OpenLog(uint64_t first_lsn);
  // Writes the run file: `clean` at a clean stop (lsn: the log's last).
  Status WriteRun(bool clean, uint64_t lsn, uint64_t version);
  Status FlushNow(bool sync);
  Status StartSnapshot();
  void StepSnapshot();
  void EndSnapshot(Status st, uint64_t bytes);
  void DropOldGeneration();
  void UpdateLogBytes();
  void LogShapeChange();
  std::string PathOf(const std::string& name) const {
    return options_.dir + "/" + name;
  }

  StoreOptions options_;
  Recoverable* state_;
  std::unique_ptr<Env> own_env_;  // the FaultyEnv, with a fault spec
  Env* env_ = nullptr;
  Env* base_env_ = nullptr;  // the run file's (no fault spec: it is a meta)
  std::unique_ptr<LogWriter> log_;
  struct OldLog {
    uint64_t first_lsn;
    std::string name;
    uint64_t bytes;
  };
  std::vector<OldLog> old_logs_;  // closed log files, oldest first
  bool running_ = false;          // the run file says "running": served since
  uint64_t log_bytes_since_snapshot_ = 0;
  uint64_t logged_shape_ = 0;  // the state's shape as the log knows it
  std::vector<Done> waiting_;
  Status error_;  // the last disk error while failing
  std::chrono::steady_clock::time_point last_sync_, last_retry_;

  // The generations: the newest snapshot (empty name: the empty state at
  // LSN 1) and the previous one.
  std::string snapshot_name_;
  uint64_t snapshot_lsn_ = 1;
  std::string prev_snapshot_name_;
  uint64_t prev_lsn_ = 1;
  // Files set aside by recovery (*.corrupt, *.dropped, unreadable
  // snapshots): deleted once a newer snapshot is verified.
  std::vector<std::string> aside_;

  // The running snapshot: scanning, then verifying what was written.
  std::unique_ptr<SnapshotWriter> snap_;
  std::unique_ptr<SnapshotScan> scan_;
  std::unique_ptr<FileData> verify_data_;
  std::unique_ptr<SnapshotCheck> check_;
  uint64_t sealed_bytes_ = 0;
  std::vector<Done> snap_waiting_;
  bool stopping_ = false;  // Stop has run

  StoreStats stats_;
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_STORE_H_
