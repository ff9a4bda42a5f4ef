// Who can reach a remem-server's shared memory (issue #10, item 6). With
// the process umask at 0, a server holding data is inspected: every
// shared-memory object it created (SysV segments whose creator is its pid,
// /dev/shm files it holds open, deleted or not, and the lease file it keeps
// in /dev/shm) is listed, and a forked child that dropped to uid/gid 65534
// tries to attach or open each one, and to read the server's memory with
// process_vm_readv (UCX's cma transport): first with no supplementary
// groups, then as a member of the server's primary group (a member of the
// group attached UCX's 0660 SysV segments before remem excluded sysv).
// Every attempt must fail with EACCES or EPERM; a client of the server's own
// user still reads what it stored.
//
// Needs root (to drop to another user); skips otherwise.

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "util/socket.h"

namespace remem {
namespace {

using testing::ConnectHashOrDie;
using testing::StartServer;

constexpr uid_t kNobody = 65534;

struct Target {
  enum Kind { kSysv, kPath } kind;
  int shmid = -1;
  std::string path;   // what the child opens
  std::string shown;  // what the object is
};

// SysV segments created by `pid` at `since` (seconds since the epoch) or
// later, from /proc/sysvipc/shm: a segment a process that died long ago
// left (nothing removes one no one attaches) names the pid that process
// had, which a server started since may have again.
std::vector<Target> SysvSegmentsOf(pid_t pid, time_t since) {
  std::vector<Target> out;
  std::ifstream in("/proc/sysvipc/shm");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    long key, shmid, perms, size, cpid, lpid, nattch, uid, gid, cuid, cgid;
    long long atime, dtime, ctime;
    // perms is printed in octal.
    if (!(f >> key >> shmid >> std::oct >> perms >> std::dec >> size >> cpid >>
          lpid >> nattch >> uid >> gid >> cuid >> cgid >> atime >> dtime >>
          ctime)) {
      continue;
    }
    if (cpid != pid || ctime < since) continue;
    Target t{Target::kSysv, int(shmid), "", ""};
    std::ostringstream s;
    s << "sysv shmid " << shmid << " perms " << std::oct << perms << std::dec
      << " size " << size;
    t.shown = s.str();
    out.push_back(t);
  }
  return out;
}

// Shared-memory files `pid` holds open: /proc/<pid>/fd links into /dev/shm
// (UCX's posix segments are unlinked at once and reached only this way).
std::vector<Target> ShmFilesOf(pid_t pid) {
  std::vector<Target> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string link = dir + "/" + e->d_name;
    char target[512];
    const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string t(target, size_t(n));
    if (t.rfind("/dev/shm/", 0) != 0) continue;
    out.push_back({Target::kPath, -1, link, t});
    // A file still linked in /dev/shm is opened by name too.
    const std::string name = t.substr(0, t.find(" (deleted)"));
    if (t.find(" (deleted)") == std::string::npos) {
      out.push_back({Target::kPath, -1, name, name});
    }
  }
  closedir(d);
  return out;
}

// What the child got for each target: 0 if it could attach or open it,
// else the errno.
struct Attempt {
  int err[64];
  int vm_read_err;
};

// Forks a child that drops to uid/gid kNobody, with `groups` as its
// supplementary groups, and tries every target and a process_vm_readv of
// `pid`. Only system calls in the child (this process has threads).
Attempt TryAsNobody(const std::vector<Target>& targets, pid_t pid,
                    std::vector<gid_t> groups, gid_t gid) {
  Attempt a{};
  std::vector<const char*> paths;
  for (const Target& t : targets) paths.push_back(t.path.c_str());
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  const pid_t child = fork();
  if (child == 0) {
    Attempt r{};
    for (int& e : r.err) e = -1;
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(gid) != 0 ||
        setuid(kNobody) != 0 || getuid() != kNobody) {
      _exit(2);
    }
    for (size_t i = 0; i < targets.size() && i < 64; ++i) {
      if (targets[i].kind == Target::kSysv) {
        void* p = shmat(targets[i].shmid, nullptr, SHM_RDONLY);
        r.err[i] = p == reinterpret_cast<void*>(-1) ? errno : 0;
      } else {
        const int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        r.err[i] = fd < 0 ? errno : 0;
      }
    }
    char buf[8];
    iovec local{buf, sizeof(buf)};
    // Any address: permission is checked before the address is.
    iovec remote{reinterpret_cast<void*>(0x10000), sizeof(buf)};
    r.vm_read_err =
        process_vm_readv(pid, &local, 1, &remote, 1, 0) < 0 ? errno : 0;
    (void)!write(pipefd[1], &r, sizeof(r));
    _exit(0);
  }
  close(pipefd[1]);
  EXPECT_EQ(read(pipefd[0], &a, sizeof(a)), ssize_t(sizeof(a)))
      << "the child could not drop its privileges";
  close(pipefd[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return a;
}

bool Denied(int err) { return err == EACCES || err == EPERM; }

TEST(Permissions, SharedMemoryIsTheServerUsersOnlyUnderAPermissiveUmask) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to try the server's memory as another user";
  }
  const mode_t old_umask = umask(0);
  const time_t started = time(nullptr);
  testing::ServerProcess server = StartServer();
  umask(old_umask);
  ASSERT_NE(server.process, nullptr);
  const pid_t pid = server.process->pid();

  // The server holds data, written and read back by a client of its user.
  auto client = ConnectHashOrDie(server.address);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Put("secret-key", "secret value").ok());
  auto v = client->Get("secret-key");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->value, "secret value");

  std::vector<Target> targets = SysvSegmentsOf(pid, started);
  for (const Target& t : targets) {
    ADD_FAILURE() << "remem never uses UCX's sysv transport, whose segments "
                     "are 0660: "
                  << t.shown;
  }
  const std::vector<Target> files = ShmFilesOf(pid);
  targets.insert(targets.end(), files.begin(), files.end());
  // The lease horizon of a server without a data directory (lease.h).
  {
    std::string host;
    uint16_t port = 0;
    ASSERT_TRUE(util::ParseHostPort(server.address, &host, &port).ok());
    const std::string lease = "/dev/shm/remem-lease-" +
                              std::to_string(geteuid()) + "-" +
                              std::to_string(port);
    struct stat st {};
    if (stat(lease.c_str(), &st) == 0) {
      targets.push_back({Target::kPath, -1, lease, lease});
    }
  }
  ASSERT_LE(targets.size(), 64u);
  std::string listing;
  for (const Target& t : targets) listing += "\n  " + t.shown;
  std::printf("shared-memory objects of remem-server (%s):%s\n",
              std::string(TransportName(testing::TestTransport())).c_str(),
              listing.c_str());
  if (testing::TestTransport() == Transport::kShm) {
    EXPECT_FALSE(files.empty()) << "no posix segments on a shm server?";
  }
  // Owner-only modes, whatever the umask.
  for (const Target& t : targets) {
    if (t.kind != Target::kPath) continue;
    struct stat st {};
    ASSERT_EQ(stat(t.path.c_str(), &st), 0) << t.path;
    EXPECT_EQ(st.st_mode & 077, 0u)
        << t.shown << " has mode " << std::oct << (st.st_mode & 0777);
    EXPECT_EQ(st.st_uid, geteuid()) << t.shown;
  }

  const gid_t server_gid = getegid();
  for (const bool in_group : {false, true}) {
    SCOPED_TRACE(in_group ? "uid 65534 in the server's primary group"
                          : "uid/gid 65534, no groups");
    Attempt a = in_group ? TryAsNobody(targets, pid, {server_gid}, server_gid)
                         : TryAsNobody(targets, pid, {}, kNobody);
    for (size_t i = 0; i < targets.size(); ++i) {
      EXPECT_TRUE(Denied(a.err[i]))
          << targets[i].shown << ": "
          << (a.err[i] == 0 ? "opened" : std::strerror(a.err[i]));
    }
    EXPECT_TRUE(Denied(a.vm_read_err))
        << "process_vm_readv: "
        << (a.vm_read_err == 0 ? "read" : std::strerror(a.vm_read_err));
  }

  // The server's own user is still served, one-sided reads included.
  auto again = ConnectHashOrDie(server.address);
  ASSERT_TRUE(again);
  auto w = again->Get("secret-key");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->value, "secret value");
}

// The documented way to let other users' clients share memory with a server
// (docs/SECURITY.md): UCX's sysv transport, whose segments are 0660 and take
// the creating process's effective group, with the server (and those
// clients) running with a dedicated group as their effective group. Members
// of that group attach the server's memory; other users still cannot.
TEST(Permissions, AGroupTheOperatorNamesCanAttachOthersCannot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to change groups";
  if (testing::TestTransport() != Transport::kShm) {
    GTEST_SKIP() << "a shared-memory setup";
  }
  constexpr gid_t kClients = 47011;  // a group no one else has
  SpawnOptions o;
  o.argv = {"setpriv",        "--regid=" + std::to_string(kClients),
            "--clear-groups", testing::ServerBinary(),
            "--listen",       "127.0.0.1:0",
            "--memory",       "64M",
            "--transport",    "auto",
            "--log-level",    "warn",
            "--no-pin"};
  o.env = {{"UCX_TLS", "sysv,self,tcp"}};
  const time_t started = time(nullptr);
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto line = (*p)->WaitForLine("listening on", std::chrono::seconds(30));
  ASSERT_TRUE(line.ok()) << line.status().ToString() << (*p)->output();
  const pid_t pid = (*p)->pid();
  const std::vector<Target> segments = SysvSegmentsOf(pid, started);
  ASSERT_FALSE(segments.empty());
  for (const Target& t : segments) {
    std::ifstream in("/proc/sysvipc/shm");
    std::string row;
    bool found = false;
    while (std::getline(in, row)) {
      std::istringstream f(row);
      long key, shmid, perms, size, cpid, lpid, nattch, uid, gid;
      if (!(f >> key >> shmid >> std::oct >> perms >> std::dec >> size >>
            cpid >> lpid >> nattch >> uid >> gid)) {
        continue;
      }
      if (shmid != t.shmid) continue;
      found = true;
      EXPECT_EQ(perms & 0777, 0660) << t.shown;
      EXPECT_EQ(gid_t(gid), kClients) << t.shown;
    }
    EXPECT_TRUE(found);
  }
  Attempt member = TryAsNobody(segments, pid, {}, kClients);
  Attempt stranger = TryAsNobody(segments, pid, {}, kNobody);
  for (size_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(member.err[i], 0)
        << segments[i].shown << ": " << std::strerror(member.err[i]);
    EXPECT_TRUE(Denied(stranger.err[i]))
        << segments[i].shown << ": "
        << (stranger.err[i] == 0 ? "attached" : std::strerror(stranger.err[i]));
  }
}

}  // namespace
}  // namespace remem
