// A client process for the connection-storm test (storm_test.cc): starts
// THREADS threads that wait at a barrier, then each opens a Session and a
// HashStore at the same moment and does one put and one get. Every thread
// reports one line:
//
//   RESULT ok <milliseconds to connect, open the store, put, get>
//   RESULT err <stage> <StatusCode name> <message>
//
// then the process prints DONE and keeps every session open until it is
// told to release them, so the server holds all of them at once.
//
// The barrier and the release are FIFOs the parent holds open for writing
// from before it spawns the process until it closes its end to release
// every process at once. The process opens its read end of both before it
// prints READY, while the parent's writer is certainly there; after READY
// it reads START_FIFO to its end, and after DONE RELEASE_FIFO, then closes
// its sessions and exits 0. (Opening a FIFO only after READY would race
// with the parent: a process descheduled between READY and its open() finds
// the writer already gone, and a blocking open() then waits for a writer
// forever.)
//
// STORM_CLIENT_PAUSE_MS=N in the environment makes the process sleep N ms
// right after READY and right after DONE, as a loaded machine may: the
// test of that race (storm_test.cc).
//
// Usage: storm_client ADDRESS TRANSPORT THREADS START_FIFO RELEASE_FIFO TAG

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "remem/hash.h"
#include "remem/session.h"

namespace {

// Opens the read end of the FIFO at `path` without waiting for a writer
// (O_NONBLOCK), then makes it blocking for WaitForEof. -1 on error. Call it
// while the parent's writer is open: a read end opened after the last
// writer closed sees end-of-file at once, never the close itself.
int OpenGate(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Blocks until every writer of the FIFO read through `fd` has closed it
// (at once if they all have already); closes `fd`.
bool WaitForEof(int fd) {
  char buf[64];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0 && errno != EINTR) break;
  }
  ::close(fd);
  return n == 0;
}

// STORM_CLIENT_PAUSE_MS (see the top of this file).
void PauseIfAsked() {
  const char* ms = std::getenv("STORM_CLIENT_PAUSE_MS");
  if (ms != nullptr && std::atoi(ms) > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  }
}

struct Outcome {
  bool ok = false;
  std::string stage;
  remem::Status status;
  double ms[4] = {0, 0, 0, 0};  // connect, open, put, get
  std::unique_ptr<remem::Session> session;
  std::unique_ptr<remem::HashStore> store;  // destroyed first
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: storm_client ADDRESS TRANSPORT THREADS START_FIFO "
                 "RELEASE_FIFO TAG\n");
    return 2;
  }
  remem::SessionOptions o;
  o.server = argv[1];
  auto t = remem::ParseTransport(argv[2]);
  if (!t.ok()) return 2;
  o.transport = *t;
  // Generous: a storm on a loaded 2-core machine must not turn slowness
  // into errors; what the test checks is that nothing is lost or left.
  o.timeout = std::chrono::milliseconds(60000);
  const int threads = std::atoi(argv[3]);
  const std::string tag = argv[6];
  if (threads <= 0) return 2;

  std::vector<Outcome> out(static_cast<size_t>(threads));
  std::latch go(1);
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      Outcome& r = out[size_t(i)];
      go.wait();
      auto start = std::chrono::steady_clock::now();
      auto lap = [&start](double* into) {
        const auto now = std::chrono::steady_clock::now();
        *into = std::chrono::duration<double, std::milli>(now - start).count();
        start = now;
      };
      auto session = remem::Session::Connect(o);
      if (!session.ok()) {
        r.stage = "connect";
        r.status = session.status();
        return;
      }
      r.session = std::move(*session);
      lap(&r.ms[0]);
      auto store = remem::HashStore::Open(r.session.get());
      if (!store.ok()) {
        r.stage = "open";
        r.status = store.status();
        return;
      }
      r.store = std::move(*store);
      lap(&r.ms[1]);
      const std::string key = "storm-" + tag + "-" + std::to_string(i);
      auto put = r.store->Put(key, key + "-value");
      if (!put.ok()) {
        r.stage = "put";
        r.status = put.status();
        return;
      }
      lap(&r.ms[2]);
      auto get = r.store->Get(key);
      if (!get.ok()) {
        r.stage = "get";
        r.status = get.status();
        return;
      }
      if (get->value != key + "-value") {
        r.stage = "get";
        r.status = remem::Status::Corruption("read back another value");
        return;
      }
      lap(&r.ms[3]);
      r.ok = true;
    });
  }
  // Both gates are open for reading before READY: see the top of the file.
  const int start_fd = OpenGate(argv[4]);
  const int release_fd = OpenGate(argv[5]);
  if (start_fd < 0 || release_fd < 0) {
    std::fprintf(stderr, "storm_client: cannot open %s or %s: %s\n", argv[4],
                 argv[5], std::strerror(errno));
    go.count_down();
    for (auto& w : workers) w.join();
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  PauseIfAsked();
  if (!WaitForEof(start_fd)) {
    std::fprintf(stderr, "storm_client: cannot read %s\n", argv[4]);
    ::close(release_fd);
    go.count_down();
    for (auto& w : workers) w.join();
    return 1;
  }
  go.count_down();
  for (auto& w : workers) w.join();
  for (const Outcome& r : out) {
    if (r.ok) {
      std::printf("RESULT ok %.1f %.1f %.1f %.1f\n", r.ms[0], r.ms[1], r.ms[2],
                  r.ms[3]);
    } else {
      std::printf("RESULT err %s %s %s\n", r.stage.c_str(),
                  std::string(remem::StatusCodeName(r.status.code())).c_str(),
                  r.status.message().c_str());
    }
  }
  std::printf("DONE\n");
  std::fflush(stdout);
  PauseIfAsked();
  const bool released = WaitForEof(release_fd);
  out.clear();  // closes every session
  return released ? 0 : 1;
}
