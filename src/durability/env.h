// durability::Env: the one file-system seam of the durability layer
// (leveldb's Env, cut to what remem needs). Every durable file goes through
// it: operation logs, snapshots, the data directory's and the services'
// meta files, and the data directory's LOCK. Tests swap in a FaultyEnv
// that fails writes and reads on cue.
//
// PosixEnv creates files 0600 and directories 0700 whatever the umask (a
// data directory holds every value written, and logs are plain files), and
// tightens an existing directory that is more open (CreateDir reports it).
//
// Thread contract: an Env is thread-safe (PosixEnv has no state; FaultyEnv
// guards its counters with a mutex). A WritableFile, FileData or FileLock
// belongs to one thread at a time.

#ifndef REMEM_DURABILITY_ENV_H_
#define REMEM_DURABILITY_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "remem/status.h"

namespace remem::durability {

// An append-only file. Write may be short (returns bytes written); errors
// are IOError carrying the errno text.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Result<size_t> Write(const void* data, size_t len) = 0;
  virtual Status Sync() = 0;                   // fdatasync
  virtual Status Truncate(uint64_t size) = 0;  // and append from there
  virtual const std::string& path() const = 0;
};

// The whole content of a file, read-only (mapped, or read into memory).
class FileData {
 public:
  virtual ~FileData() = default;
  virtual std::string_view data() const = 0;
};

// A held lock on a file; released when destroyed (or when the process
// dies, kill -9 included).
class FileLock {
 public:
  virtual ~FileLock() = default;
  // Replaces what the file says of its holder (LockFile's `holder`): a
  // holder that says it is stopping ("... stopping") is waited for.
  virtual Status Note(const std::string& holder) = 0;
};

// How CreateDir found the directory.
enum class DirState { kCreated, kExisted, kTightened };

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX environment.
  static Env* Posix();

  // Creates `path` (mode 0600) or truncates it, for appending.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // The file's bytes as of the open (mapped or read). A file that another
  // process changes meanwhile is not detected here: callers that must not
  // read a short file compare the size with FileSize (PartitionStore does).
  // Files under the data directory change only through this server, which
  // holds DIR/LOCK.
  virtual Result<std::unique_ptr<FileData>> ReadFile(
      const std::string& path) = 0;
  virtual Result<bool> FileExists(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;
  // Last modification, in milliseconds since the Unix epoch.
  virtual Result<uint64_t> FileMtimeMs(const std::string& path) = 0;
  // Names in `dir` (no "." or "..").
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Creates `dir` and its missing parents, 0700; an existing `dir` open to
  // group or others is made 0700 (kTightened).
  virtual Result<DirState> CreateDir(const std::string& dir) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // OK if `path` is already gone.
  virtual Status RemoveFile(const std::string& path) = 0;
  // Makes `dir`'s entries durable (after create, rename, unlink).
  virtual Status SyncDir(const std::string& dir) = 0;
  virtual Status TruncateFile(const std::string& path, uint64_t size) = 0;
  // Takes an exclusive lock on `path` (created 0600 if missing) and writes
  // `holder` into it. Busy if another process (or another FileLock) holds
  // it; the message then names what that holder wrote. A holder that wrote
  // "pid N" of a process now exiting (a server killed with -9 tearing its
  // memory down) is waited for, up to 10 s.
  virtual Result<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) = 0;
};

// True if process `pid` of this host is exiting: the kernel's PF_EXITING
// flag on its main thread (a killed process: set at once, while whichever
// thread exits last tears its memory down and the main thread may still
// run), its state Z (the main thread has exited, others still run) or X,
// or a SIGKILL pending that it has not run to act on yet (a killed process
// waiting for a CPU: 5 restarts in 10 at once after kill -9 were refused
// on a busy machine before this). False if it is gone or cannot be seen
// (another pid namespace).
bool ProcessIsExiting(long pid);
// The text of /proc/PID/status (its first 4 KiB, where the signal masks
// are), or "" if it cannot be read.
std::string ProcStatus(long pid);
// Whether the text of a /proc/PID/status names SIGKILL among the signals
// pending for the process (ShdPnd) or its main thread (SigPnd).
bool StatusHasKillPending(std::string_view status);
// The same for SIGTERM or SIGINT: a clean stop asked for and not yet begun.
bool StatusHasStopPending(std::string_view status);

// --- fault injection (tests, --fault-log-io)
//
// A spec is a comma-separated list of terms:
//   write faults (N bytes written in total through the Env, over all its
//   files, before the fault starts):
//     short-after:N   the write crossing N writes up to N, later writes fail
//                     with ENOSPC
//     enospc-after:N  writes past N fail with ENOSPC
//     eio-after:N     writes and syncs past N fail with EIO
//   read faults, for every file whose name (not directory) contains TEXT:
//     read-eio:TEXT    ReadFile fails with EIO
//     read-short:TEXT  ReadFile returns the first half of the file
//     read-flip:TEXT   ReadFile returns the file with one byte flipped (the
//                      middle one)
struct FaultSpec {
  enum WriteKind { kNone, kShort, kEnospc, kEio } write = kNone;
  uint64_t after = 0;
  enum ReadKind { kReadEio, kReadShort, kReadFlip };
  struct ReadFault {
    ReadKind kind;
    std::string match;
  };
  std::vector<ReadFault> reads;
};
Result<FaultSpec> ParseFaultSpec(std::string_view spec);

// Wraps `base` (which must outlive it) so that it fails as `spec` says.
class FaultyEnv final : public Env {
 public:
  FaultyEnv(Env* base, FaultSpec spec) : base_(base), spec_(std::move(spec)) {}

  // Tests: the disk got space again (write faults stop).
  void Heal();
  uint64_t bytes_written() const;

  Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  Result<std::unique_ptr<FileData>> ReadFile(const std::string& path) override;
  Result<bool> FileExists(const std::string& path) override {
    return base_->FileExists(path);
  }
  Result<uint64_t> FileSize(const std::string& path) override {
    return base_->FileSize(path);
  }
  Result<uint64_t> FileMtimeMs(const std::string& path) override {
    return base_->FileMtimeMs(path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  Result<DirState> CreateDir(const std::string& dir) override {
    return base_->CreateDir(dir);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status RemoveFile(const std::string& path) override {
    return base_->RemoveFile(path);
  }
  Status SyncDir(const std::string& dir) override {
    return base_->SyncDir(dir);
  }
  Status TruncateFile(const std::string& path, uint64_t size) override {
    return base_->TruncateFile(path, size);
  }
  Result<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override {
    return base_->LockFile(path, holder);
  }

 private:
  class File;
  // Bytes `len` may write now (len, fewer, or an error), counting them.
  Result<size_t> Admit(const std::string& path, size_t len);
  Status AdmitSync(const std::string& path);

  Env* base_;
  const FaultSpec spec_;
  mutable std::mutex mu_;  // guards the two below
  uint64_t written_ = 0;
  bool healed_ = false;
};

// Writes `text` to dir/name so that a crash leaves the old file or the new
// one: dir/name.new, fdatasynced, renamed over, the directory synced.
Status WriteFileAtomically(Env* env, const std::string& dir,
                           const std::string& name, std::string_view text);

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_ENV_H_
