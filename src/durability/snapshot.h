// durability/snapshot.h: snapshot files and read-only file mapping.
//
// A snapshot of a partition is a file of kPut records (lsn 0) ending with
// one kSnapshotEnd record (its lsn = the snapshot's start LSN, its value =
// the pair count and the scan's shape, 8 bytes each; snapshots written
// before the shape existed hold only the count). It is written as
// snapshot-<lsn>.tmp, fdatasynced, then renamed to snapshot-<lsn>.snap, so a
// .snap file is whole unless the disk corrupted it. A fuzzy snapshot may hold a
// key twice (a cuckoo move carried it past the scan); loading keeps the newer
// version.
//
// Thread contract: one thread per object.

#ifndef REMEM_DURABILITY_SNAPSHOT_H_
#define REMEM_DURABILITY_SNAPSHOT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "durability/log.h"
#include "durability/recoverable.h"
#include "remem/status.h"

namespace remem::durability {

std::string SnapshotName(uint64_t lsn);  // "snapshot-<lsn 20 digits>.snap"
std::string LogName(uint64_t lsn);       // "log-<lsn 20 digits>.rlog"

class SnapshotWriter : public SnapshotSink {
 public:
  // Opens dir/snapshot-<lsn>.tmp; `faults` may be null.
  static Result<std::unique_ptr<SnapshotWriter>> Create(
      const std::string& dir, uint64_t start_lsn,
      std::shared_ptr<FaultState> faults);
  ~SnapshotWriter() override;  // removes the .tmp file unless Finish succeeded

  void Add(std::string_view key, std::string_view value,
           uint64_t version) override;
  // Starts over (the scan restarted); an error sticks, Finish returns it.
  void Restart() override;
  // Writes what is buffered when over the buffer limit. The first error
  // sticks: Finish returns it.
  Status MaybeWrite();
  // Appends the end record (with the pair count and `shape`, see
  // SnapshotScan::shape), syncs, renames to .snap and syncs the directory.
  // Returns the file's size.
  Result<uint64_t> Finish(uint64_t version_counter, uint64_t shape);

  uint64_t start_lsn() const { return start_lsn_; }
  uint64_t pairs() const { return pairs_; }

 private:
  SnapshotWriter(std::string dir, uint64_t lsn,
                 std::shared_ptr<FaultState> faults)
      : dir_(std::move(dir)), start_lsn_(lsn), faults_(std::move(faults)) {}
  Status Open();
  Status WriteOut();
  std::string dir_;
  uint64_t start_lsn_;
  std::shared_ptr<FaultState> faults_;
  std::unique_ptr<File> file_;
  std::string tmp_path_;
  std::string buf_;
  uint64_t bytes_ = 0;
  uint64_t pairs_ = 0;
  Status error_;
  bool done_ = false;
};

// A file mapped read-only (empty files map to an empty view).
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  std::string_view data() const { return {data_, size_}; }

 private:
  MappedFile(const char* d, size_t n) : data_(d), size_(n) {}
  const char* data_;
  size_t size_;
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_SNAPSHOT_H_
