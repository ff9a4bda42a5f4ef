#include "durability/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>

namespace remem::durability {

namespace {

constexpr mode_t kFileMode = 0600;
constexpr mode_t kDirMode = 0700;

Status Errno(const std::string& what, const std::string& path, int err) {
  return Status::IOError(what + " " + path + ": " + std::strerror(err));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override { ::close(fd_); }
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

class MappedData final : public FileData {
 public:
  MappedData(const char* d, size_t n) : data_(d), size_(n) {}
  ~MappedData() override {
    if (size_ > 0) ::munmap(const_cast<char*>(data_), size_);
  }
  std::string_view data() const override { return {data_, size_}; }

 private:
  const char* data_;
  size_t size_;
};

class HeapData final : public FileData {
 public:
  explicit HeapData(std::string s) : s_(std::move(s)) {}
  std::string_view data() const override { return s_; }

 private:
  std::string s_;
};

class PosixLock final : public FileLock {
 public:
  explicit PosixLock(int fd) : fd_(fd) {}
  ~PosixLock() override { ::close(fd_); }  // releases the flock
  Status Note(const std::string& holder) override {
    // Written over the old text, then cut to its length: a reader sees the
    // one or the other (the new one extends the old), never an empty file.
    if (::pwrite(fd_, holder.data(), holder.size(), 0) !=
            ssize_t(holder.size()) ||
        ::ftruncate(fd_, off_t(holder.size())) != 0) {
      return Status::IOError(std::string("noting the lock's holder: ") +
                             std::strerror(errno));
    }
    return Status::OK();
  }

 private:
  int fd_;
};

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                    kFileMode);
    if (fd < 0) return Errno("create", path, errno);
    // Whatever the umask, and whatever mode an older file had.
    if (::fchmod(fd, kFileMode) != 0) {
      const int err = errno;
      ::close(fd);
      return Errno("chmod", path, err);
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }

  Result<std::unique_ptr<FileData>> ReadFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Errno("stat", path, err);
    }
    const size_t n = size_t(st.st_size);
    const char* data = nullptr;
    if (n > 0) {
      void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return Errno("mmap", path, err);
      }
      ::madvise(p, n, MADV_SEQUENTIAL);
      data = static_cast<const char*>(p);
    }
    ::close(fd);
    return std::unique_ptr<FileData>(new MappedData(data, n));
  }

  Result<bool> FileExists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return Errno("stat", path, errno);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
    return uint64_t(st.st_size);
  }

  Result<uint64_t> FileMtimeMs(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
    return uint64_t(st.st_mtim.tv_sec) * 1000 +
           uint64_t(st.st_mtim.tv_nsec) / 1000000;
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return Errno("list", dir, errno);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(d)) {
      const std::string_view n = e->d_name;
      if (n != "." && n != "..") names.emplace_back(n);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return Errno("list", dir, err);
    return names;
  }

  Result<DirState> CreateDir(const std::string& dir) override {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return Status::IOError(dir + " exists and is not a directory");
      }
      if ((st.st_mode & 077) == 0) return DirState::kExisted;
      if (::chmod(dir.c_str(), kDirMode) != 0)
        return Errno("chmod", dir, errno);
      return DirState::kTightened;
    }
    if (errno != ENOENT) return Errno("stat", dir, errno);
    REMEM_RETURN_IF_ERROR(CreateParents(dir));
    if (::mkdir(dir.c_str(), kDirMode) != 0 && errno != EEXIST) {
      return Errno("mkdir", dir, errno);
    }
    // The umask may have taken bits away: set exactly 0700.
    if (::chmod(dir.c_str(), kDirMode) != 0) return Errno("chmod", dir, errno);
    return DirState::kCreated;
  }

  // Creates the missing directories above `path`, 0700. Existing ones are
  // left as they are: they are not the data directory (/tmp, $HOME, ...).
  static Status CreateParents(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos || slash == 0) return Status::OK();
    const std::string parent = path.substr(0, slash);
    struct stat st;
    if (::stat(parent.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return Status::IOError(parent + " exists and is not a directory");
      }
      return Status::OK();
    }
    if (errno != ENOENT) return Errno("stat", parent, errno);
    REMEM_RETURN_IF_ERROR(CreateParents(parent));
    if (::mkdir(parent.c_str(), kDirMode) != 0 && errno != EEXIST) {
      return Errno("mkdir", parent, errno);
    }
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Errno("rename", from + " to " + to, errno);
    }
    return Status::OK();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Errno("remove", path, errno);
    }
    return Status::OK();
  }

  Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Errno("open", dir, errno);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) return Errno("fsync", dir, err);
    return Status::OK();
  }

  Status TruncateFile(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), off_t(size)) != 0) {
      return Errno("truncate", path, errno);
    }
    return Status::OK();
  }

  // The pid a lock's holder wrote ("... pid N ..."), or 0.
  static long HolderPid(const std::string& holder) {
    const size_t at = holder.rfind("pid ");
    if (at == std::string::npos) return 0;
    long pid = 0;
    const char* first = holder.data() + at + 4;
    auto [end, ec] = std::from_chars(first, holder.data() + holder.size(), pid);
    return ec == std::errc() && end != first ? pid : 0;
  }

  // True if `holder` names a process that is exiting (ProcessIsExiting).
  static bool HolderIsExiting(const std::string& holder) {
    return ProcessIsExiting(HolderPid(holder));
  }

  // True if `holder` says it is stopping (Durability::MarkStopping), or
  // names a process with SIGTERM or SIGINT pending (asked to stop a moment
  // ago, it has not yet said so).
  static bool HolderIsStopping(const std::string& holder) {
    static constexpr std::string_view kStopping = " stopping";
    if (holder.size() >= kStopping.size() &&
        holder.compare(holder.size() - kStopping.size(), kStopping.size(),
                       kStopping) == 0) {
      return true;
    }
    return StatusHasStopPending(ProcStatus(HolderPid(holder)));
  }

  Result<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, kFileMode);
    if (fd < 0) return Errno("open", path, errno);
    if (::fchmod(fd, kFileMode) != 0) {
      const int err = errno;
      ::close(fd);
      return Errno("chmod", path, err);
    }
    // A holder that is exiting is waited for (a server killed with -9
    // holds its lock until its threads have torn its memory down: 160 ms
    // measured for 512 MiB, and a restart at once was refused), and so is
    // one in its clean stop, longer (remem-server's --stop-timeout-ms
    // default): `kill PID; remem-server ...` was refused or not by chance.
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::seconds(10);
    const auto stop_deadline = start + std::chrono::seconds(30);
    // A live holder is looked at once more, 100 ms on, before it is
    // refused: one sent SIGTERM this instant may have taken the signal and
    // not yet said it is stopping.
    bool looked_again = false;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[256];
      const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
      std::string who(buf, n > 0 ? size_t(n) : 0);
      while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) {
        who.pop_back();
      }
      const auto now = std::chrono::steady_clock::now();
      if (err == EWOULDBLOCK &&
          ((HolderIsExiting(who) && now < deadline) ||
           (HolderIsStopping(who) && now < stop_deadline))) {
        ::usleep(10000);
        continue;
      }
      if (err == EWOULDBLOCK && !looked_again) {
        looked_again = true;
        ::usleep(100000);
        continue;
      }
      ::close(fd);
      if (err != EWOULDBLOCK) return Errno("lock", path, err);
      return Status::Busy(path + " is locked by " +
                          (who.empty() ? std::string("another process") : who) +
                          (HolderIsExiting(who) ? " (still exiting after 10 s)"
                           : HolderIsStopping(who)
                               ? " (still stopping after 30 s)"
                               : ""));
    }
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, holder.data(), holder.size(),
                                            0) != ssize_t(holder.size())) {
      const int err = errno;
      ::close(fd);
      return Errno("write", path, err);
    }
    return std::unique_ptr<FileLock>(new PosixLock(fd));
  }
};

}  // namespace

std::string ProcStatus(long pid) {
  if (pid <= 0) return {};
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char text[4096];
  const ssize_t got = ::read(fd, text, sizeof(text));
  ::close(fd);
  return got > 0 ? std::string(text, size_t(got)) : std::string();
}

bool ProcessIsExiting(long pid) {
  if (pid <= 0) return false;
  const std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(stat_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": the state
  // follows the last ')', the flags are the sixth field after it.
  const std::string_view stat(buf, size_t(n));
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size()) {
    return false;
  }
  const char state = stat[close + 2];
  if (state == 'Z' || state == 'X') return true;
  // Killed, and not yet run since: it exits as soon as it gets a CPU.
  if (StatusHasKillPending(ProcStatus(pid))) return true;
  size_t pos = close + 2;
  for (int field = 0; field < 6 && pos != std::string_view::npos; ++field) {
    pos = stat.find(' ', pos);
    if (pos != std::string_view::npos) ++pos;
  }
  if (pos == std::string_view::npos) return false;
  unsigned long flags = 0;
  auto r = std::from_chars(stat.data() + pos, stat.data() + stat.size(), flags);
  constexpr unsigned long kPfExiting = 0x4;  // linux/sched.h
  return r.ec == std::errc() && (flags & kPfExiting) != 0;
}

namespace {

// Whether the SigPnd or ShdPnd mask of a /proc/PID/status has any of
// `signals` (signal n is bit n - 1).
bool StatusHasPending(std::string_view status, uint64_t signals) {
  for (const std::string_view field : {"SigPnd:", "ShdPnd:"}) {
    const size_t at = status.find(field);
    if (at == std::string_view::npos) continue;
    size_t pos = at + field.size();
    while (pos < status.size() && (status[pos] == ' ' || status[pos] == '\t')) {
      ++pos;
    }
    uint64_t mask = 0;
    auto r = std::from_chars(status.data() + pos, status.data() + status.size(),
                             mask, 16);
    if (r.ec == std::errc() && (mask & signals) != 0) return true;
  }
  return false;
}

constexpr uint64_t Bit(int signo) { return uint64_t{1} << (signo - 1); }

}  // namespace

bool StatusHasKillPending(std::string_view status) {
  return StatusHasPending(status, Bit(SIGKILL));
}

bool StatusHasStopPending(std::string_view status) {
  return StatusHasPending(status, Bit(SIGTERM) | Bit(SIGINT));
}

namespace {

std::string_view BaseName(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Env* Env::Posix() {
  static PosixEnv env;
  return &env;
}

Result<FaultSpec> ParseFaultSpec(std::string_view spec) {
  FaultSpec f;
  const Status usage = Status::InvalidArgument(
      "fault spec: comma-separated short-after:N, enospc-after:N, "
      "eio-after:N, read-eio:TEXT, read-short:TEXT or read-flip:TEXT");
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view term = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view()
                                           : spec.substr(comma + 1);
    const size_t colon = term.find(':');
    if (colon == std::string_view::npos || colon + 1 == term.size()) {
      return usage;
    }
    const std::string_view kind = term.substr(0, colon);
    const std::string_view arg = term.substr(colon + 1);
    if (kind == "read-eio" || kind == "read-short" || kind == "read-flip") {
      f.reads.push_back({kind == "read-eio"     ? FaultSpec::kReadEio
                         : kind == "read-short" ? FaultSpec::kReadShort
                                                : FaultSpec::kReadFlip,
                         std::string(arg)});
      continue;
    }
    if (kind == "short-after") {
      f.write = FaultSpec::kShort;
    } else if (kind == "enospc-after") {
      f.write = FaultSpec::kEnospc;
    } else if (kind == "eio-after") {
      f.write = FaultSpec::kEio;
    } else {
      return usage;
    }
    auto [end, ec] =
        std::from_chars(arg.data(), arg.data() + arg.size(), f.after);
    if (ec != std::errc() || end != arg.data() + arg.size()) {
      return Status::InvalidArgument("fault spec: N must be a number in " +
                                     std::string(term));
    }
  }
  return f;
}

class FaultyEnv::File final : public WritableFile {
 public:
  File(FaultyEnv* env, std::unique_ptr<WritableFile> f)
      : env_(env), f_(std::move(f)) {}
  Result<size_t> Write(const void* data, size_t len) override {
    auto n = env_->Admit(path(), len);
    if (!n.ok()) return n.status();
    auto wrote = f_->Write(data, *n);
    if (wrote.ok()) {
      std::lock_guard<std::mutex> lock(env_->mu_);
      env_->written_ += *wrote;
    }
    return wrote;
  }
  Status Sync() override {
    REMEM_RETURN_IF_ERROR(env_->AdmitSync(path()));
    return f_->Sync();
  }
  Status Truncate(uint64_t size) override { return f_->Truncate(size); }
  const std::string& path() const override { return f_->path(); }

 private:
  FaultyEnv* env_;
  std::unique_ptr<WritableFile> f_;
};

void FaultyEnv::Heal() {
  std::lock_guard<std::mutex> lock(mu_);
  healed_ = true;
}

uint64_t FaultyEnv::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

Result<size_t> FaultyEnv::Admit(const std::string& path, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  if (spec_.write == FaultSpec::kNone || healed_ ||
      written_ + len <= spec_.after) {
    return len;
  }
  if (spec_.write == FaultSpec::kShort && written_ < spec_.after) {
    return size_t(spec_.after - written_);
  }
  return Errno("write", path, spec_.write == FaultSpec::kEio ? EIO : ENOSPC);
}

Status FaultyEnv::AdmitSync(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  if (spec_.write == FaultSpec::kEio && !healed_ && written_ >= spec_.after) {
    return Errno("fdatasync", path, EIO);
  }
  return Status::OK();
}

Result<std::unique_ptr<WritableFile>> FaultyEnv::NewWritableFile(
    const std::string& path) {
  auto f = base_->NewWritableFile(path);
  if (!f.ok()) return f.status();
  return std::unique_ptr<WritableFile>(new File(this, std::move(*f)));
}

Result<std::unique_ptr<FileData>> FaultyEnv::ReadFile(const std::string& path) {
  const FaultSpec::ReadFault* fault = nullptr;
  for (const auto& r : spec_.reads) {
    if (BaseName(path).find(r.match) != std::string_view::npos) {
      fault = &r;
      break;
    }
  }
  if (fault != nullptr && fault->kind == FaultSpec::kReadEio) {
    return Errno("read", path, EIO);
  }
  auto d = base_->ReadFile(path);
  if (!d.ok() || fault == nullptr) return d;
  std::string copy((*d)->data());
  if (fault->kind == FaultSpec::kReadShort) {
    copy.resize(copy.size() / 2);
  } else if (!copy.empty()) {
    copy[copy.size() / 2] = char(~copy[copy.size() / 2]);
  }
  return std::unique_ptr<FileData>(new HeapData(std::move(copy)));
}

Status WriteFileAtomically(Env* env, const std::string& dir,
                           const std::string& name, std::string_view text) {
  const std::string tmp = dir + "/" + name + ".new";
  {
    auto f = env->NewWritableFile(tmp);
    if (!f.ok()) return f.status();
    size_t done = 0;
    while (done < text.size()) {
      auto n = (*f)->Write(text.data() + done, text.size() - done);
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::IOError("write " + tmp + ": no progress");
      done += *n;
    }
    REMEM_RETURN_IF_ERROR((*f)->Sync());
  }
  REMEM_RETURN_IF_ERROR(env->Rename(tmp, dir + "/" + name));
  return env->SyncDir(dir);
}

}  // namespace remem::durability
