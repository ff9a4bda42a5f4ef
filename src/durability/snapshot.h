// durability/snapshot.h: snapshot files: writing one, and verifying one.
//
// A snapshot of a partition is a file of kPut records (lsn 0) ending with
// one kSnapshotEnd record (its lsn = the snapshot's start LSN, its version
// = the state's version counter, its value = the pair count and the scan's
// shape, 8 bytes each; snapshots written before the shape existed hold only
// the count). It is written as snapshot-<lsn>.tmp and fdatasynced (Seal),
// read back and verified record by record (SnapshotCheck), and only then
// renamed to snapshot-<lsn>.snap (Commit), so a .snap file was whole when
// written and a later mismatch is the disk's doing. A fuzzy snapshot may
// hold a key twice (a cuckoo move carried it past the scan); loading keeps
// the newer version.
//
// Thread contract: one thread per object.

#ifndef REMEM_DURABILITY_SNAPSHOT_H_
#define REMEM_DURABILITY_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "durability/env.h"
#include "durability/log.h"
#include "durability/recoverable.h"
#include "remem/status.h"

namespace remem::durability {

std::string SnapshotName(uint64_t lsn);     // "snapshot-<lsn 20 digits>.snap"
std::string LogName(uint64_t lsn);          // "log-<lsn 20 digits>.rlog"
std::string SnapshotTmpName(uint64_t lsn);  // "snapshot-<lsn>.tmp"

class SnapshotWriter : public SnapshotSink {
 public:
  // Opens dir/snapshot-<lsn>.tmp through `env` (which must outlive it).
  static Result<std::unique_ptr<SnapshotWriter>> Create(Env* env,
                                                        const std::string& dir,
                                                        uint64_t start_lsn);
  // Removes the .tmp file unless Commit succeeded.
  ~SnapshotWriter() override;

  void Add(std::string_view key, std::string_view value,
           uint64_t version) override;
  // Starts over (the scan restarted); an error sticks, Seal returns it.
  void Restart() override;
  // Writes what is buffered when over the buffer limit. The first error
  // sticks: Seal returns it.
  Status MaybeWrite();
  // Appends the end record (with the pair count and `shape`, see
  // SnapshotScan::shape), writes and fdatasyncs the .tmp file and closes
  // it. Returns the file's size.
  Result<uint64_t> Seal(uint64_t version_counter, uint64_t shape);
  // After Seal (and a verification of tmp_path()): renames the file to
  // .snap and syncs the directory.
  Status Commit();

  uint64_t start_lsn() const { return start_lsn_; }
  uint64_t pairs() const { return pairs_; }
  const std::string& tmp_path() const { return tmp_path_; }

 private:
  SnapshotWriter(Env* env, std::string dir, uint64_t lsn)
      : env_(env), dir_(std::move(dir)), start_lsn_(lsn) {}
  Status Open();
  Status WriteOut();
  Env* env_;
  std::string dir_;
  uint64_t start_lsn_;
  std::unique_ptr<WritableFile> file_;
  std::string tmp_path_;
  std::string buf_;
  uint64_t bytes_ = 0;
  uint64_t pairs_ = 0;
  Status error_;
  bool committed_ = false;
};

// What a snapshot's end record says.
struct SnapshotEnd {
  uint64_t lsn = 0;      // the snapshot's start LSN
  uint64_t version = 0;  // the state's version counter
  uint64_t pairs = 0;
  uint64_t shape = 0;  // 0 if the snapshot predates shapes
};

// Verifies a snapshot's content, every record's checksum, the end record
// last and the pair count, a step at a time (so a live server can verify a
// large file between requests).
class SnapshotCheck {
 public:
  explicit SnapshotCheck(std::string_view data) : data_(data) {}
  // Checks about `budget` more bytes; true once done (then see status()).
  bool Step(size_t budget);
  // OK, or Corruption naming the byte offset (or the pair count that does
  // not match).
  const Status& status() const { return status_; }
  // Valid once done with an OK status.
  const SnapshotEnd& end() const { return end_; }

 private:
  std::string_view data_;
  size_t off_ = 0;
  uint64_t puts_ = 0;
  bool done_ = false;
  Status status_;
  SnapshotEnd end_;
};

// Verifies all of `data` at once.
Result<SnapshotEnd> CheckSnapshot(std::string_view data);

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_SNAPSHOT_H_
