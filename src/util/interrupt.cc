#include "util/interrupt.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "util/subprocess.h"

namespace remem {

namespace {

// Set by the interrupt thread before it stops anything: from then on, the
// process ends by that thread's _exit, with the signal's status.
std::atomic<bool> g_interrupted{false};

// Registered with atexit: a main thread that finishes while the interrupt
// thread cleans up (its server stopped under it, it printed the error and
// returned 1) waits here for the interrupt thread's _exit instead of
// exiting first with its own status.
void AwaitInterruptExit() {
  while (g_interrupted.load()) ::pause();
}

// Never destroyed: the interrupt thread may use them while main exits.
std::mutex& DirsMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<std::string>& Dirs() {
  static auto* dirs = new std::set<std::string>();
  return *dirs;
}

}  // namespace

void RemoveOnInterrupt(const std::string& dir) {
  std::lock_guard<std::mutex> lock(DirsMutex());
  Dirs().insert(dir);
}

std::error_code RemoveNow(const std::string& dir) {
  std::lock_guard<std::mutex> lock(DirsMutex());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  Dirs().erase(dir);
  return ec;
}

void InstallInterruptCleanup(std::string program) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atexit(AwaitInterruptExit);
  std::thread([signals, program = std::move(program)] {
    int sig = 0;
    while (sigwait(&signals, &sig) != 0) {
    }
    g_interrupted.store(true);
    std::fprintf(stderr,
                 "%s: interrupted by SIG%s: stopping the servers it started "
                 "and removing its temporary directories\n",
                 program.c_str(), sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    // Servers first: one still running could write into a directory
    // being removed.
    (void)Subprocess::StopAll(std::chrono::seconds(5));
    {
      std::lock_guard<std::mutex> lock(DirsMutex());
      for (const std::string& dir : Dirs()) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        if (ec) {
          std::fprintf(stderr, "%s: could not remove %s: %s\n", program.c_str(),
                       dir.c_str(), ec.message().c_str());
        }
      }
    }
    // No flush: standard output is line-buffered, and a flush could wait
    // on a reader that stopped reading.
    _exit(128 + sig);
  }).detach();
}

}  // namespace remem
