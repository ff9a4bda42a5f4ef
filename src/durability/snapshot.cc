#include "durability/snapshot.h"

#include <cstdio>
#include <cstring>
#include <limits>

namespace remem::durability {

namespace {
constexpr size_t kWriteChunk = 1 << 20;

std::string Numbered(const char* prefix, uint64_t lsn, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%020llu%s", prefix,
                static_cast<unsigned long long>(lsn), suffix);
  return buf;
}

}  // namespace

std::string SnapshotName(uint64_t lsn) {
  return Numbered("snapshot-", lsn, ".snap");
}
std::string LogName(uint64_t lsn) { return Numbered("log-", lsn, ".rlog"); }
std::string SnapshotTmpName(uint64_t lsn) {
  return Numbered("snapshot-", lsn, ".tmp");
}

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Create(
    Env* env, const std::string& dir, uint64_t start_lsn) {
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter(env, dir, start_lsn));
  w->tmp_path_ = dir + "/" + SnapshotTmpName(start_lsn);
  REMEM_RETURN_IF_ERROR(w->Open());
  return w;
}

Status SnapshotWriter::Open() {
  auto f = env_->NewWritableFile(tmp_path_);
  if (!f.ok()) return f.status();
  file_ = std::move(*f);
  buf_.clear();
  bytes_ = 0;
  pairs_ = 0;
  error_ = Status::OK();
  return Status::OK();
}

SnapshotWriter::~SnapshotWriter() {
  if (!committed_) {
    file_.reset();
    (void)env_->RemoveFile(tmp_path_);
  }
}

void SnapshotWriter::Add(std::string_view key, std::string_view value,
                         uint64_t version) {
  EncodeRecord(&buf_, RecordType::kPut, 0, version, key, value);
  ++pairs_;
}

void SnapshotWriter::Restart() {
  if (!error_.ok()) return;
  file_.reset();
  Status st = Open();
  if (!st.ok()) error_ = st;
}

Status SnapshotWriter::WriteOut() {
  if (!error_.ok()) return error_;
  size_t done = 0;
  while (done < buf_.size()) {
    auto n = file_->Write(buf_.data() + done, buf_.size() - done);
    if (!n.ok() || *n == 0) {
      error_ = n.ok() ? Status::IOError("write " + tmp_path_ + ": no progress")
                      : n.status();
      return error_;
    }
    done += *n;
  }
  bytes_ += buf_.size();
  buf_.clear();
  return Status::OK();
}

Status SnapshotWriter::MaybeWrite() {
  if (buf_.size() < kWriteChunk) return error_;
  return WriteOut();
}

Result<uint64_t> SnapshotWriter::Seal(uint64_t version_counter,
                                      uint64_t shape) {
  std::string end(16, '\0');
  std::memcpy(end.data(), &pairs_, 8);
  std::memcpy(end.data() + 8, &shape, 8);
  EncodeRecord(&buf_, RecordType::kSnapshotEnd, start_lsn_, version_counter, {},
               end);
  REMEM_RETURN_IF_ERROR(WriteOut());
  REMEM_RETURN_IF_ERROR(file_->Sync());
  file_.reset();
  return bytes_;
}

Status SnapshotWriter::Commit() {
  REMEM_RETURN_IF_ERROR(
      env_->Rename(tmp_path_, dir_ + "/" + SnapshotName(start_lsn_)));
  committed_ = true;
  return env_->SyncDir(dir_);
}

bool SnapshotCheck::Step(size_t budget) {
  for (size_t checked = 0; !done_ && checked < budget;) {
    if (off_ == data_.size()) {
      status_ =
          Status::Corruption("snapshot has no end record (at byte offset " +
                             std::to_string(off_) + ")");
      done_ = true;
      break;
    }
    Record rec{};
    size_t n = 0;
    const ParseOutcome o = ParseRecord(data_.substr(off_), &rec, &n);
    if (o != ParseOutcome::kOk || (rec.type != RecordType::kPut &&
                                   rec.type != RecordType::kSnapshotEnd)) {
      status_ = Status::Corruption(
          "corrupt snapshot at byte offset " + std::to_string(off_) + " (" +
          (o == ParseOutcome::kOk ? "a log record inside a snapshot"
                                  : std::string(ParseOutcomeText(o))) +
          ")");
      done_ = true;
      break;
    }
    off_ += n;
    checked += n;
    if (rec.type == RecordType::kPut) {
      ++puts_;
      continue;
    }
    // The end record: last, and its count matches.
    done_ = true;
    end_.lsn = rec.lsn;
    end_.version = rec.version;
    if (rec.value.size() >= 8) std::memcpy(&end_.pairs, rec.value.data(), 8);
    if (rec.value.size() >= 16) {
      std::memcpy(&end_.shape, rec.value.data() + 8, 8);
    }
    if (off_ != data_.size()) {
      status_ = Status::Corruption(
          "snapshot has data after its end record (at byte offset " +
          std::to_string(off_) + ")");
    } else if (rec.value.size() >= 8 && end_.pairs != puts_) {
      status_ = Status::Corruption(
          "snapshot's end record counts " + std::to_string(end_.pairs) +
          " pairs but the file holds " + std::to_string(puts_));
    }
  }
  return done_;
}

Result<SnapshotEnd> CheckSnapshot(std::string_view data) {
  SnapshotCheck c(data);
  while (!c.Step(std::numeric_limits<size_t>::max())) {
  }
  if (!c.status().ok()) return c.status();
  return c.end();
}

}  // namespace remem::durability
