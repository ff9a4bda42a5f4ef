#include "server/lease.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "proto/codec.h"
#include "util/log.h"

namespace remem::server {

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

namespace {

constexpr uint64_t kHorizonMagic = 0x4E5A52484D454D52ull;  // "RMEMHRZN"

// The kernel's id of this boot: a horizon from another boot means nothing
// (CLOCK_MONOTONIC restarted, and no reader of that boot is left).
std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  id.resize(36, '\0');
  return id;
}

// Sleeps for `wait`, or until SIGINT or SIGTERM arrives, of those this
// thread blocks (remem-server blocks both, and takes them with sigwait
// once it serves): the signal's number, taken, or 0 after the whole wait.
int WaitOrStopSignal(std::chrono::nanoseconds wait) {
  sigset_t blocked, stop;
  sigemptyset(&stop);
  if (pthread_sigmask(SIG_BLOCK, nullptr, &blocked) == 0) {
    for (int sig : {SIGINT, SIGTERM}) {
      if (sigismember(&blocked, sig) == 1) sigaddset(&stop, sig);
    }
  }
  if (sigisemptyset(&stop)) {
    std::this_thread::sleep_for(wait);
    return 0;
  }
  const uint64_t until = MonotonicNs() + uint64_t(wait.count());
  for (;;) {
    const uint64_t now = MonotonicNs();
    if (now >= until) return 0;
    const uint64_t left = until - now;
    timespec ts{time_t(left / 1000000000ull), long(left % 1000000000ull)};
    const int sig = sigtimedwait(&stop, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno != EINTR && errno != EAGAIN) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(left));
      return 0;
    }
  }
}

}  // namespace

struct LeaseKeeper::Horizon {
  uint64_t magic;
  char boot_id[40];
  uint64_t expires_ns;  // 0: revoked
};

Result<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(
    uint8_t* lease_at, uint64_t incarnation, std::chrono::milliseconds lease,
    const std::string& horizon_file, std::chrono::milliseconds* waited,
    bool remake_removed, std::chrono::milliseconds max_wait) {
  std::unique_ptr<LeaseKeeper> k(new LeaseKeeper());
  k->remake_removed_ = remake_removed;
  k->lease_at_ = lease_at;
  k->incarnation_ = incarnation;
  k->lease_ns_ = uint64_t(std::chrono::nanoseconds(lease).count());
  *waited = std::chrono::milliseconds(0);
  if (!horizon_file.empty()) {
    // horizon_file_ (which the destructor revokes and removes) is set only
    // once the wait is over: a keeper that did not start must leave its
    // predecessor's horizon as it found it (a server stopped by a signal
    // while it waited removed it, and the next start waited for nothing).
    REMEM_RETURN_IF_ERROR(k->MapHorizon(horizon_file));
    Horizon& h = *k->horizon_;
    const std::string boot = BootId();
    if (h.magic == kHorizonMagic &&
        std::memcmp(h.boot_id, boot.data(), 36) == 0) {
      const uint64_t until = h.expires_ns;
      const uint64_t now = MonotonicNs();
      if (until > now) {
        // A predecessor died without revoking: readers may trust its
        // memory until `until`. Nothing of ours may be acknowledged before.
        // No server promises more than kMaxLease ahead: a horizon past
        // that was not written by one, and is not waited for.
        auto wait = std::chrono::nanoseconds(until - now);
        if (wait > max_wait) {
          log::Warn(
              "the lease file {} promises {} ms ahead, more than any lease "
              "(at most {} ms): waiting {} ms only",
              horizon_file,
              std::chrono::duration_cast<std::chrono::milliseconds>(wait)
                  .count(),
              max_wait.count(), max_wait.count());
          wait = max_wait;
        }
        log::Warn(
            "a previous server on this port or data directory stopped "
            "without revoking its lease; waiting {} ms for it to expire",
            std::chrono::duration_cast<std::chrono::milliseconds>(wait)
                .count());
        const int sig = WaitOrStopSignal(wait);
        if (sig != 0) {
          // Left pending (on this thread, which blocks it) for the
          // caller, which stops as the signal asks.
          (void)pthread_kill(pthread_self(), sig);
          k->UnmapHorizon();
          return Status::Unavailable(
              std::string("stopped by SIG") + sigabbrev_np(sig) +
              " while waiting for a previous server's lease to expire");
        }
        *waited = std::chrono::duration_cast<std::chrono::milliseconds>(wait);
      }
    }
    h.magic = kHorizonMagic;
    std::memcpy(h.boot_id, boot.data(), 36);
    h.expires_ns = 0;
    k->horizon_file_ = horizon_file;
  }
  k->Publish(MonotonicNs() + k->lease_ns_);
  k->thread_ = std::thread([raw = k.get()] { raw->Run(); });
  pthread_setname_np(k->thread_.native_handle(), "remem-lease");
  return k;
}

namespace {

// Opens (or makes) the horizon file at `path` as a regular file of this
// user, never through a link: its directory (/dev/shm by default) is
// writable by every local user, who could leave a link there to a file of
// ours (a server run as root then wrote over it), a FIFO, a directory, or a
// file of their own with a horizon far ahead. What is not ours is removed
// and made again when this user may remove it (root may, in a sticky
// directory too); else the server says what is in the way.
Result<int> OpenOwnHorizon(const std::string& path) {
  const uid_t uid = ::geteuid();
  // Opened without O_CREAT first: in a sticky directory the kernel's
  // protected_regular and protected_fifos (1 under systemd) refuse
  // O_CREAT on another user's file or FIFO, even to root, with EACCES,
  // before this could look at it.
  constexpr int kFlags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd = ::open(path.c_str(), kFlags);
    if (fd < 0 && errno == ENOENT) {
      fd = ::open(path.c_str(), kFlags | O_CREAT | O_EXCL, 0600);
      if (fd < 0 && errno == EEXIST) continue;  // made meanwhile: look again
    }
    std::string what;
    if (fd >= 0) {
      struct stat st;
      if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        return Status::IOError("cannot stat the lease file " + path + ": " +
                               std::strerror(err));
      }
      if (S_ISREG(st.st_mode) && st.st_uid == uid && st.st_nlink == 1) {
        if ((st.st_mode & 07777) != 0600) (void)::fchmod(fd, 0600);
        return fd;
      }
      ::close(fd);
      what = !S_ISREG(st.st_mode) ? "is not a regular file"
             : st.st_uid != uid ? "belongs to user " + std::to_string(st.st_uid)
                                : "has other names (hard links)";
    } else if (errno == ELOOP) {
      what = "is a symbolic link";
    } else if (errno == EISDIR) {
      what = "is a directory";
    } else if (errno == EACCES || errno == EPERM) {
      what = "cannot be opened by this user (another user's file?)";
    } else {
      return Status::IOError("cannot open the lease file " + path + ": " +
                             std::strerror(errno));
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::IOError(
          "the lease file " + path + " " + what +
          ", and this user cannot remove it (someone else put it there): "
          "remove it, or start with --runtime-dir naming a directory only "
          "this user can write");
    }
    log::Warn("the lease file {} {}: removed, and made again", path, what);
  }
  return Status::IOError("the lease file " + path +
                         " was put back by someone else after each removal");
}

}  // namespace

Status LeaseKeeper::MapHorizon(const std::string& path) {
  auto opened = OpenOwnHorizon(path);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st;
  if (::fstat(fd, &st) != 0 || ::ftruncate(fd, sizeof(Horizon)) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError("cannot size " + path + ": " + std::strerror(err));
  }
  // The file's blocks are allocated before it is mapped: a store through
  // the map to a block the file system cannot give (a full disk or tmpfs)
  // is a SIGBUS, not an error (a restart on a full disk died of it).
  if (const int err = ::posix_fallocate(fd, 0, sizeof(Horizon)); err != 0) {
    ::close(fd);
    return Status::IOError("cannot allocate the lease file " + path + " (" +
                           std::to_string(sizeof(Horizon)) +
                           " bytes): " + std::strerror(err));
  }
  void* p = ::mmap(nullptr, sizeof(Horizon), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return Status::IOError("cannot map " + path + ": " + std::strerror(err));
  }
  // Held while this keeper lives (the kernel drops it when the process
  // dies): RemoveStaleHorizons leaves a locked file alone, whatever its
  // horizon says (a cluster member's is capped in the past until it serves
  // a configuration) and however long the holder has been stopped.
  (void)::flock(fd, LOCK_SH);
  horizon_ = static_cast<Horizon*>(p);
  horizon_inode_ = uint64_t(st.st_ino);
  horizon_fd_ = fd;
  return Status::OK();
}

void LeaseKeeper::KeepHorizonFile() {
  if (horizon_ == nullptr || !remake_removed_) return;
  struct stat st;
  if (::stat(horizon_file_.c_str(), &st) == 0 &&
      uint64_t(st.st_ino) == horizon_inode_) {
    return;
  }
  // Made whole under another name, then renamed into place: a successor
  // (or RemoveStaleHorizons) never finds it empty.
  const std::string fresh = horizon_file_ + ".new";
  ::unlink(fresh.c_str());
  Horizon* old = horizon_;
  const uint64_t old_inode = horizon_inode_;
  const int old_fd = horizon_fd_;
  Status made = MapHorizon(fresh);
  if (made.ok()) {
    std::memcpy(horizon_, old, sizeof(Horizon));
    if (::rename(fresh.c_str(), horizon_file_.c_str()) != 0) {
      made = Status::IOError("cannot rename " + fresh + ": " +
                             std::strerror(errno));
      ::munmap(horizon_, sizeof(Horizon));
      ::close(horizon_fd_);
      ::unlink(fresh.c_str());
    }
  }
  if (!made.ok()) {
    horizon_ = old;  // keep writing the old one
    horizon_inode_ = old_inode;
    horizon_fd_ = old_fd;
    if (!horizon_warned_) {
      log::Warn("the lease horizon file is gone and cannot be made again: {}",
                made.ToString());
      horizon_warned_ = true;
    }
    return;
  }
  ::munmap(old, sizeof(Horizon));
  ::close(old_fd);
  log::Warn("the lease horizon file {} was removed; made it again",
            horizon_file_);
}

void LeaseKeeper::RemoveStaleHorizons(const std::string& dir,
                                      const std::string& prefix,
                                      std::chrono::nanoseconds grace) {
  std::error_code ec;
  const std::string boot = BootId();
  const uint64_t now = MonotonicNs();
  const uid_t uid = ::getuid();
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // Only this user's regular files: whoever may write the directory may
    // put a FIFO there (an open would block) or a link.
    const int fd = ::open(it->path().c_str(),
                          O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    // A keeper holds its file locked while its process lives.
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    struct stat st;
    Horizon h{};
    const bool whole = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                       st.st_uid == uid &&
                       ::pread(fd, &h, sizeof(h), 0) == ssize_t(sizeof(h));
    if (!whole || h.magic != kHorizonMagic) {
      ::close(fd);
      continue;
    }
    const bool other_boot = std::memcmp(h.boot_id, boot.data(), 36) != 0;
    if (other_boot ||
        (h.expires_ns != 0 && h.expires_ns + uint64_t(grace.count()) < now)) {
      ::unlink(it->path().c_str());
    }
    ::close(fd);  // the lock with it, once the file is gone
  }
}

LeaseKeeper::~LeaseKeeper() {
  Revoke();
  UnmapHorizon();
}

void LeaseKeeper::UnmapHorizon() {
  if (horizon_ != nullptr) ::munmap(horizon_, sizeof(Horizon));
  horizon_ = nullptr;
  if (horizon_fd_ >= 0) ::close(horizon_fd_);
  horizon_fd_ = -1;
}

void LeaseKeeper::Revoke() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Publish(0);
  if (!horizon_file_.empty()) ::unlink(horizon_file_.c_str());
}

void LeaseKeeper::Publish(uint64_t expires_ns) {
  // The horizon first: it must never be below what a reader may trust.
  if (horizon_ != nullptr) {
    std::atomic_ref<uint64_t>(horizon_->expires_ns)
        .store(expires_ns, std::memory_order_release);
  }
  // Seqlock write of the lease; readers verify version and checksum.
  auto* words = reinterpret_cast<uint64_t*>(lease_at_);
  const uint64_t odd = ++version_ * 2 - 1;
  std::atomic_ref<uint64_t>(words[0]).store(odd, std::memory_order_release);
  const proto::ServerLease l = proto::MakeLease(
      odd + 1, incarnation_, expires_ns, ++renewals_, lease_ns_);
  uint64_t image[sizeof(l) / 8];
  std::memcpy(image, &l, sizeof(l));
  for (size_t i = 1; i < sizeof(l) / 8; ++i) {
    std::atomic_ref<uint64_t>(words[i]).store(image[i],
                                              std::memory_order_release);
  }
  std::atomic_ref<uint64_t>(words[0]).store(image[0],
                                            std::memory_order_release);
}

void LeaseKeeper::CapBy(std::function<uint64_t()> cap) {
  std::lock_guard<std::mutex> lock(mu_);
  cap_ = std::move(cap);
  if (stop_) return;
  Publish(std::max<uint64_t>(1, std::min(MonotonicNs() + lease_ns_, cap_())));
}

void LeaseKeeper::Run() {
  const auto every = std::chrono::nanoseconds(lease_ns_ / 10);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (cv_.wait_for(lock, every, [this] { return stop_; })) break;
    uint64_t expires = MonotonicNs() + lease_ns_;
    // Capped, never to 0, which says "revoked: the server is stopping".
    if (cap_) expires = std::max<uint64_t>(1, std::min(expires, cap_()));
    KeepHorizonFile();
    Publish(expires);
  }
}

}  // namespace remem::server
