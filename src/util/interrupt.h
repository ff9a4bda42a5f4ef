// Interrupt cleanup for the tools that start servers and make temporary
// directories (remem-bench): Ctrl-C, `kill` or a closed terminal end them
// part way, and what they started and made must not outlive them. Without
// it, their servers died by SIGKILL (Subprocess's PR_SET_PDEATHSIG),
// leaving shared-memory files, and their data and ZooKeeper directories
// stayed in the temporary directory.
//
// Thread contract: InstallInterruptCleanup once, from main before any other
// thread starts (threads inherit the signal mask it sets); the rest from
// any thread.

#ifndef REMEM_UTIL_INTERRUPT_H_
#define REMEM_UTIL_INTERRUPT_H_

#include <string>
#include <system_error>

namespace remem {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and starts a
// thread that waits for them. On one it prints "<program>: interrupted by
// <signal>..." to standard error, stops every child started through
// Subprocess (SIGTERM, SIGKILL after 5 s), removes every directory
// registered with RemoveOnInterrupt, and exits with 128 + the signal's
// number, the shell's convention for a process a signal ended (a main
// thread that returns meanwhile, its work cut short, waits in an atexit
// handler for that exit). Children start with no signal blocked
// (Subprocess::Spawn unblocks them).
void InstallInterruptCleanup(std::string program);

// Registers `dir` to remove (with its contents) on an interrupt. Without
// InstallInterruptCleanup (the tests), the list is kept and never used.
void RemoveOnInterrupt(const std::string& dir);
// The owner's own removal of a registered `dir`: removes it now and
// forgets it, under the lock the interrupt's removal holds, so that an
// interrupt meanwhile neither skips it nor ends the process part way
// through it (an owner that forgot it first, then removed it, lost that
// race: the interrupt exited in between and the directory stayed).
std::error_code RemoveNow(const std::string& dir);

}  // namespace remem

#endif  // REMEM_UTIL_INTERRUPT_H_
