#include "util/interrupt.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "util/subprocess.h"

namespace remem {

namespace {

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

void KeepOnInterrupt(const std::string& dir) {
  std::lock_guard<std::mutex> lock(DirsMutex());
  Dirs().erase(dir);
}

void InstallInterruptCleanup(std::string program) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals, program = std::move(program)] {
    int sig = 0;
    while (sigwait(&signals, &sig) != 0) {
    }
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
