// server::LeaseKeeper's horizon files: which ones RemoveStaleHorizons
// removes, a keeper whose file was removed under it makes it again, and
// one on a full file system is refused with an error.

#include "server/lease.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "util/log.h"

namespace remem::server {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class LeaseFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    // The logger is made here, before any keeper's thread logs.
    ASSERT_TRUE(log::SetLevel("warn").ok());
    std::string t = ::testing::TempDir() + "/remem-lease-test-XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static void Write(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  // The file a keeper killed with -9 leaves: a copy of a live keeper's
  // (its horizon `lease` after the start). (Not a keeper in a forked child
  // that exits: ThreadSanitizer refuses threads after a fork.)
  void KilledKeeper(const std::string& file, milliseconds lease) {
    alignas(64) static uint8_t lease_at[64];
    milliseconds waited;
    const std::string live = Path("live-keeper");
    auto k = LeaseKeeper::Start(lease_at, 1, lease, live, &waited);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    Write(file, Read(live));
  }
  std::string dir_;
};

TEST_F(LeaseFiles, StaleHorizonsAreRemovedAndOthersKept) {
  const std::string prefix = "remem-lease-1-";
  // Killed, with a horizon that passes at once; killed on another boot;
  // killed with a horizon a minute away.
  KilledKeeper(Path(prefix + "1"), milliseconds(10));
  KilledKeeper(Path(prefix + "2"), milliseconds(60'000));
  std::string other_boot = Read(Path(prefix + "2"));
  std::string boot;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), boot);
  ASSERT_EQ(boot.size(), 36u);
  const size_t at = other_boot.find(boot);
  ASSERT_NE(at, std::string::npos) << "the file records the boot id";
  other_boot[at] = other_boot[at] == '0' ? '1' : '0';
  Write(Path(prefix + "2"), other_boot);
  KilledKeeper(Path(prefix + "3"), milliseconds(60'000));
  // Being made (empty, or not yet written), another prefix's, and a FIFO
  // (an open without O_NONBLOCK would block).
  Write(Path(prefix + "4"), "");
  Write(Path(prefix + "5"), std::string(64, '\0'));
  ASSERT_EQ(::mkfifo(Path(prefix + "8").c_str(), 0600), 0);
  Write(Path("other-1"), Read(Path(prefix + "1")));
  // A running keeper's (a minute ahead, whatever the scheduler does).
  alignas(64) static uint8_t lease_at[64];
  milliseconds waited;
  auto live = LeaseKeeper::Start(lease_at, 2, milliseconds(60'000),
                                 Path(prefix + "6"), &waited,
                                 /*remake_removed=*/true);
  ASSERT_TRUE(live.ok()) << live.status().ToString();

  // Until the first one's horizon has passed (10 ms after it started).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    LeaseKeeper::RemoveStaleHorizons(dir_, prefix, milliseconds(0));
  } while (fs::exists(Path(prefix + "1")) &&
           std::chrono::steady_clock::now() < deadline);
  EXPECT_FALSE(fs::exists(Path(prefix + "1"))) << "its horizon passed";
  EXPECT_FALSE(fs::exists(Path(prefix + "2"))) << "another boot wrote it";
  EXPECT_TRUE(fs::exists(Path(prefix + "3"))) << "its horizon is to come";
  EXPECT_TRUE(fs::exists(Path(prefix + "4")));
  EXPECT_TRUE(fs::exists(Path(prefix + "5")));
  EXPECT_TRUE(fs::exists(Path("other-1")));
  EXPECT_TRUE(fs::exists(Path(prefix + "6"))) << "its keeper renews it";
  EXPECT_TRUE(fs::exists(Path(prefix + "8")));
  // The grace: a horizon passed less than a minute ago is kept. (Its copy
  // under another prefix, removed without a grace, shows it passed.)
  KilledKeeper(Path(prefix + "7"), milliseconds(10));
  Write(Path("copy-7"), Read(Path(prefix + "7")));
  do {
    LeaseKeeper::RemoveStaleHorizons(dir_, "copy-", milliseconds(0));
  } while (fs::exists(Path("copy-7")) &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_FALSE(fs::exists(Path("copy-7")));
  LeaseKeeper::RemoveStaleHorizons(dir_, prefix, std::chrono::minutes(1));
  EXPECT_TRUE(fs::exists(Path(prefix + "7")));
  live->reset();
  EXPECT_FALSE(fs::exists(Path(prefix + "6"))) << "a clean stop removes it";
}

// A live keeper's file is kept whatever its horizon says: a cluster
// member's is capped in the past (CapBy) until it serves a configuration,
// and servers starting together on one host removed one another's (and
// each made its own again, with a warning).
TEST_F(LeaseFiles, ALiveKeepersFileIsKeptWhateverItsHorizon) {
  const std::string prefix = "remem-lease-1-";
  alignas(64) static uint8_t lease_at[64];
  milliseconds waited;
  auto member = LeaseKeeper::Start(lease_at, 1, milliseconds(60'000),
                                   Path(prefix + "1"), &waited,
                                   /*remake_removed=*/true);
  ASSERT_TRUE(member.ok()) << member.status().ToString();
  (*member)->CapBy([] { return uint64_t{1}; });  // vouches for nothing
  // Its bytes, in a file no keeper holds (as if it had been killed): that
  // one goes, so the horizon alone would have condemned both.
  Write(Path(prefix + "2"), Read(Path(prefix + "1")));
  LeaseKeeper::RemoveStaleHorizons(dir_, prefix, milliseconds(0));
  EXPECT_FALSE(fs::exists(Path(prefix + "2"))) << "its horizon passed";
  EXPECT_TRUE(fs::exists(Path(prefix + "1"))) << "its keeper is alive";
  member->reset();
  EXPECT_FALSE(fs::exists(Path(prefix + "1"))) << "a clean stop removes it";
}

// A keeper whose file was removed (by hand) makes it again, with its
// horizon: a successor started on it then waits.
TEST_F(LeaseFiles, AFileRemovedUnderARunningKeeperIsMadeAgain) {
  const std::string file = Path("remem-lease-1-1");
  alignas(64) static uint8_t first_at[64], second_at[64];
  milliseconds waited;
  auto first = LeaseKeeper::Start(first_at, 1, milliseconds(200), file, &waited,
                                  /*remake_removed=*/true);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(::unlink(file.c_str()), 0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(file) && std::chrono::steady_clock::now() < deadline) {
    ::usleep(1000);  // the keeper renews every 20 ms; nothing to wait on
  }
  ASSERT_TRUE(fs::exists(file)) << "not made again";
  // A data directory's is not (a test that removed the directory of a
  // running server found the file made again, and could not remove it).
  // Both renew every 20 ms: by the time the first keeper has made its
  // file again twice, the other has had its turns too.
  const std::string data_dir_file = Path("lease");
  auto durable = LeaseKeeper::Start(second_at, 3, milliseconds(200),
                                    data_dir_file, &waited);
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  ASSERT_EQ(::unlink(data_dir_file.c_str()), 0);
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(::unlink(file.c_str()), 0);
    while (!fs::exists(file) && std::chrono::steady_clock::now() < deadline) {
      ::usleep(1000);
    }
    ASSERT_TRUE(fs::exists(file));
  }
  EXPECT_FALSE(fs::exists(data_dir_file)) << "a data directory's came back";
  durable->reset();
  // Its horizon is in the file: a second keeper on it waits it out.
  auto second =
      LeaseKeeper::Start(second_at, 2, milliseconds(200), file, &waited);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_GT(waited.count(), 0) << "the made-again file had no horizon";
}

// The default directory (/dev/shm) is writable by every local user, and the
// file's name is known: what another user left there is not trusted.
TEST_F(LeaseFiles, ALinkOrAFifoInPlaceOfTheFileIsReplacedNotFollowed) {
  alignas(64) static uint8_t lease_at[64];
  milliseconds waited;
  const std::string victim = Path("victim");
  Write(victim, "precious");
  const std::string file = Path("remem-lease-1-7");
  ASSERT_EQ(::symlink(victim.c_str(), file.c_str()), 0);
  {
    auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(Read(victim), "precious") << "the link was followed";
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(file)));
  }
  ASSERT_EQ(::mkfifo(file.c_str(), 0666), 0);
  {
    auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(file)));
  }
  // A file of another user (root can make one here; others skip this).
  if (::geteuid() == 0) {
    KilledKeeper(file, std::chrono::hours(1));
    ASSERT_EQ(::chown(file.c_str(), 65534, 65534), 0);
    auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(waited.count(), 0) << "another user's horizon was waited for";
    struct stat st;
    ASSERT_EQ(::stat(file.c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 0u);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
  }
  // What cannot be removed as a file is named.
  fs::remove(file);
  fs::create_directory(file);
  fs::create_directory(file + "/inside");
  auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kIOError);
  EXPECT_NE(k.status().message().find("is a directory"), std::string::npos)
      << k.status().ToString();
  EXPECT_NE(k.status().message().find("--runtime-dir"), std::string::npos)
      << k.status().ToString();
}

// No lease is longer than the longest a server may hold: a horizon further
// ahead is waited for that long only (a planted one promised days).
TEST_F(LeaseFiles, AHorizonPastTheLongestLeaseIsNotWaitedFor) {
  alignas(64) static uint8_t lease_at[64];
  const std::string file = Path("remem-lease-1-8");
  KilledKeeper(file, std::chrono::hours(24));
  milliseconds waited;
  auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited,
                              /*remake_removed=*/false, milliseconds(50));
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(waited, milliseconds(50));
}

// SIGINT or SIGTERM (blocked by the caller, as remem-server blocks them)
// stops the wait for a predecessor's horizon: the server stops as asked
// instead of after the wait. The signal is left pending for the caller.
TEST_F(LeaseFiles, AStopSignalEndsTheWaitForAPredecessor) {
  alignas(64) static uint8_t lease_at[64];
  const std::string file = Path("remem-lease-1-9");
  KilledKeeper(file, std::chrono::hours(1));
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  // Pending before the wait begins, as one sent during it would be.
  ASSERT_EQ(pthread_kill(pthread_self(), SIGTERM), 0);
  milliseconds waited;
  auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &waited);
  sigset_t pending;
  sigemptyset(&pending);
  ASSERT_EQ(sigpending(&pending), 0);
  const bool left_pending = sigismember(&pending, SIGTERM) == 1;
  const timespec zero{0, 0};
  if (left_pending) (void)sigtimedwait(&term, nullptr, &zero);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
  ASSERT_FALSE(k.ok()) << "it waited out the hour's horizon";
  EXPECT_EQ(k.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(k.status().message().find("SIGTERM"), std::string::npos)
      << k.status().ToString();
  EXPECT_TRUE(left_pending);
  // The predecessor's horizon is left as it was, for the next start to
  // wait out (the keeper that did not start revoked and removed it).
  milliseconds again;
  auto next = LeaseKeeper::Start(lease_at, 1, milliseconds(100), file, &again,
                                 /*remake_removed=*/false, milliseconds(50));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(again, milliseconds(50));
}

// A lease file on a full file system is an IOError naming the file, not a
// SIGBUS at the first store through its mapping (a restart on a full disk
// died so, exit 135). Needs a tmpfs of its own (root may mount one; the
// test is skipped where the mount is refused).
TEST_F(LeaseFiles, AFullFileSystemIsAnErrorNamingTheFileNotACrash) {
  const std::string mnt = Path("full");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << mnt << ": "
                 << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{mnt};
  {
    const int fd =
        ::open((mnt + "/fill").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::string block(4096, 'x');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    const int err = errno;
    ::close(fd);
    ASSERT_EQ(err, ENOSPC) << std::strerror(err);
  }
  alignas(64) static uint8_t lease_at[64];
  const std::string file = mnt + "/remem-lease-1-10";
  milliseconds waited;
  auto k = LeaseKeeper::Start(lease_at, 1, milliseconds(1000), file, &waited,
                              /*remake_removed=*/true);
  ASSERT_FALSE(k.ok()) << "a lease on a full file system";
  EXPECT_EQ(k.status().code(), StatusCode::kIOError);
  EXPECT_NE(k.status().message().find(file), std::string::npos)
      << k.status().ToString();
  EXPECT_NE(k.status().message().find("No space left"), std::string::npos)
      << k.status().ToString();
}

}  // namespace
}  // namespace remem::server
