#include "durability/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Create(
    const std::string& dir, uint64_t start_lsn,
    std::shared_ptr<FaultState> faults) {
  std::unique_ptr<SnapshotWriter> w(
      new SnapshotWriter(dir, start_lsn, std::move(faults)));
  w->tmp_path_ = dir + "/" + Numbered("snapshot-", start_lsn, ".tmp");
  REMEM_RETURN_IF_ERROR(w->Open());
  return w;
}

Status SnapshotWriter::Open() {
  auto f = CreateFile(tmp_path_);
  if (!f.ok()) return f.status();
  file_ = faults_ ? WithFaults(std::move(*f), faults_) : std::move(*f);
  buf_.clear();
  bytes_ = 0;
  pairs_ = 0;
  error_ = Status::OK();
  return Status::OK();
}

SnapshotWriter::~SnapshotWriter() {
  if (!done_) {
    file_.reset();
    ::unlink(tmp_path_.c_str());
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

Result<uint64_t> SnapshotWriter::Finish(uint64_t version_counter,
                                        uint64_t shape) {
  std::string end(16, '\0');
  std::memcpy(end.data(), &pairs_, 8);
  std::memcpy(end.data() + 8, &shape, 8);
  EncodeRecord(&buf_, RecordType::kSnapshotEnd, start_lsn_, version_counter, {},
               end);
  REMEM_RETURN_IF_ERROR(WriteOut());
  REMEM_RETURN_IF_ERROR(file_->Sync());
  file_.reset();
  const std::string final_path = dir_ + "/" + SnapshotName(start_lsn_);
  if (::rename(tmp_path_.c_str(), final_path.c_str()) != 0) {
    return Status::IOError("rename " + tmp_path_ + ": " + std::strerror(errno));
  }
  done_ = true;
  REMEM_RETURN_IF_ERROR(SyncDir(dir_));
  return bytes_;
}

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::IOError("open " + path + ": " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError("stat " + path + ": " + std::strerror(err));
  }
  const size_t n = size_t(st.st_size);
  const char* data = nullptr;
  if (n > 0) {
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::IOError("mmap " + path + ": " + std::strerror(err));
    }
    ::madvise(p, n, MADV_SEQUENTIAL);
    data = static_cast<const char*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(data, n));
}

MappedFile::~MappedFile() {
  if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
}

}  // namespace remem::durability
