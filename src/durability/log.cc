#include "durability/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace remem::durability {

namespace {

uint64_t Checksum(const RecordHeader& h, std::string_view key,
                  std::string_view value) {
  RecordHeader z = h;
  z.checksum = 0;
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, &z, sizeof(z));
  XXH3_64bits_update(&st, key.data(), key.size());
  XXH3_64bits_update(&st, value.data(), value.size());
  return XXH3_64bits_digest(&st);
}

Status Errno(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " " + path + ": " + std::strerror(err));
}

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixFile() override { ::close(fd_); }
  Result<size_t> Write(const void* data, size_t len) override {
    for (;;) {
      ssize_t n = ::write(fd_, data, len);
      if (n >= 0) return size_t(n);
      if (errno != EINTR) return Errno("write", path_, errno);
    }
  }
  Status Sync() override {
    if (::fdatasync(fd_) != 0) return Errno("fdatasync", path_, errno);
    return Status::OK();
  }
  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, off_t(size)) != 0) {
      return Errno("ftruncate", path_, errno);
    }
    if (::lseek(fd_, off_t(size), SEEK_SET) < 0) {
      return Errno("lseek", path_, errno);
    }
    return Status::OK();
  }
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
};

class FaultyFile final : public File {
 public:
  FaultyFile(std::unique_ptr<File> f, std::shared_ptr<FaultState> s)
      : f_(std::move(f)), s_(std::move(s)) {}
  Result<size_t> Write(const void* data, size_t len) override {
    FaultState& s = *s_;
    if (s.kind == FaultState::kNone || s.healed || s.written + len <= s.after) {
      auto n = f_->Write(data, len);
      if (n.ok()) s.written += *n;
      return n;
    }
    const int err = s.kind == FaultState::kEio ? EIO : ENOSPC;
    if (s.kind == FaultState::kShort && s.written < s.after) {
      auto n = f_->Write(data, size_t(s.after - s.written));
      if (n.ok()) s.written += *n;
      return n;
    }
    return Errno("write", path(), err);
  }
  Status Sync() override {
    if (s_->kind == FaultState::kEio && !s_->healed &&
        s_->written >= s_->after) {
      return Errno("fdatasync", path(), EIO);
    }
    return f_->Sync();
  }
  Status Truncate(uint64_t size) override { return f_->Truncate(size); }
  const std::string& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  std::shared_ptr<FaultState> s_;
};

}  // namespace

void EncodeRecord(std::string* out, RecordType type, uint64_t lsn,
                  uint64_t version, std::string_view key,
                  std::string_view value) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.format = kFormatVersion;
  h.type = uint8_t(type);
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.lsn = lsn;
  h.version = version;
  h.checksum = Checksum(h, key, value);
  out->append(reinterpret_cast<const char*>(&h), sizeof(h));
  out->append(key);
  out->append(value);
}

ParseOutcome ParseRecord(std::string_view data, Record* rec, size_t* size) {
  if (data.size() < sizeof(RecordHeader)) return ParseOutcome::kShort;
  RecordHeader h;
  std::memcpy(&h, data.data(), sizeof(h));
  if (h.magic != kRecordMagic || h.format != kFormatVersion || h.flags != 0 ||
      h.key_len > kMaxRecordKey || h.value_len > kMaxRecordValue) {
    return ParseOutcome::kBad;
  }
  const size_t total = sizeof(h) + size_t(h.key_len) + h.value_len;
  if (data.size() < total) return ParseOutcome::kShort;
  std::string_view key = data.substr(sizeof(h), h.key_len);
  std::string_view value = data.substr(sizeof(h) + h.key_len, h.value_len);
  if (Checksum(h, key, value) != h.checksum) return ParseOutcome::kBad;
  if (h.type < uint8_t(RecordType::kPut) ||
      h.type > uint8_t(RecordType::kSnapshotEnd)) {
    return ParseOutcome::kUnknown;
  }
  *rec = Record{RecordType(h.type), h.lsn, h.version, key, value};
  *size = total;
  return ParseOutcome::kOk;
}

Result<std::unique_ptr<File>> CreateFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", path, errno);
  return std::unique_ptr<File>(new PosixFile(fd, path));
}

Result<FaultState> ParseFaultSpec(std::string_view spec) {
  FaultState s;
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  if (kind == "short-after") {
    s.kind = FaultState::kShort;
  } else if (kind == "enospc-after") {
    s.kind = FaultState::kEnospc;
  } else if (kind == "eio-after") {
    s.kind = FaultState::kEio;
  } else {
    return Status::InvalidArgument(
        "fault spec must be short-after:N, enospc-after:N or eio-after:N");
  }
  if (colon == std::string_view::npos) {
    return Status::InvalidArgument("fault spec needs :N");
  }
  try {
    s.after = std::stoull(std::string(spec.substr(colon + 1)));
  } catch (...) {
    return Status::InvalidArgument("fault spec: N must be a number");
  }
  return s;
}

std::unique_ptr<File> WithFaults(std::unique_ptr<File> file,
                                 std::shared_ptr<FaultState> state) {
  return std::make_unique<FaultyFile>(std::move(file), std::move(state));
}

Status SyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("open", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Errno("fsync", dir, err);
  return Status::OK();
}

uint64_t LogWriter::Append(RecordType type, uint64_t version,
                           std::string_view key, std::string_view value) {
  const uint64_t lsn = next_lsn_++;
  EncodeRecord(&buf_, type, lsn, version, key, value);
  return lsn;
}

Status LogWriter::Flush(bool sync) {
  if (dirty_tail_) {
    // A failed write may have left part of the buffer behind the last
    // whole record; cut it before writing anything new.
    REMEM_RETURN_IF_ERROR(file_->Truncate(written_));
    dirty_tail_ = false;
  }
  size_t done = 0;
  while (done < buf_.size()) {
    auto n = file_->Write(buf_.data() + done, buf_.size() - done);
    if (!n.ok() || *n == 0) {
      dirty_tail_ = done > 0 || !n.ok();
      if (dirty_tail_ && file_->Truncate(written_).ok()) dirty_tail_ = false;
      return n.ok() ? Status::IOError("write " + path() + ": wrote 0 bytes")
                    : n.status();
    }
    done += *n;
  }
  if (!buf_.empty()) {
    written_ += buf_.size();
    buf_.clear();
    unsynced_ = true;
  }
  if (sync && unsynced_) {
    REMEM_RETURN_IF_ERROR(file_->Sync());
    unsynced_ = false;
  }
  return Status::OK();
}

}  // namespace remem::durability
