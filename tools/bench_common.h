// Shared pieces of remem-bench: pinning, a server started as a pinned child
// process (src/testing's launcher), the clocks (NowNs, and bench_clock.h's
// RequestNs), and result rows printed as a table or JSON.
//
// Thread contract: free functions; PinThisThread pins the calling thread.

#ifndef REMEM_TOOLS_BENCH_COMMON_H_
#define REMEM_TOOLS_BENCH_COMMON_H_

#include <memory>
#include <string>
#include <vector>

#include "bench_clock.h"
#include "remem/hash.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"
#include "testing/clock.h"
#include "testing/server_process.h"
#include "util/histogram.h"

namespace remem::bench {

using testing::NowNs;

Status PinThisThread(int cpu);

// A remem-server started for the benchmark (testing::ServerProcess), or
// none when --server names an existing one (then `process` is null).
using ServerUnderTest = testing::ServerProcess;
// Starts `binary` (one thread, pinned to `cpu`, the given transport and
// memory, `flags` added, and --shm-dir if SetServerShmDir named one and
// the transport is not tcp) and waits until it listens.
Result<ServerUnderTest> StartServer(const std::string& binary, Transport t,
                                    int cpu, const std::string& memory,
                                    const std::vector<std::string>& flags = {});
// remem-bench --shm-dir: the directory every remem-server the benchmark
// starts backs its shared-memory exports with ("" = the server's default).
// Set once, before any server starts. Not thread-safe.
void SetServerShmDir(std::string dir);
const std::string& ServerShmDir();
// The server a workload runs against: `address` if given, else one started
// from `binary` pinned to `cpu`. Prints the error and returns it on failure.
Result<ServerUnderTest> ServerFor(const std::string& address,
                                  const std::string& binary, Transport t,
                                  int cpu, const std::string& memory);

// Connects a benchmark session to `address`; prints the error and returns
// null on failure.
std::unique_ptr<Session> ConnectOrReport(const std::string& address,
                                         Transport t, const std::string& secret,
                                         ReadPath path = ReadPath::kAuto);
// Opens the hash store on `session`; prints the error and returns null on
// failure.
std::unique_ptr<HashStore> OpenHashOrReport(Session* session);

struct Row {
  std::string test;
  std::string transport;
  uint64_t size = 0;
  int depth = 1;
  uint64_t ops = 0;
  double seconds = 0;
  Histogram latency_ns;      // per-operation latency (depth 1 rows)
  double server_cpu_s = -1;  // server CPU consumed during the row
};

void PrintTable(const std::vector<Row>& rows);
void PrintJson(const std::vector<Row>& rows, const std::string& extra);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_COMMON_H_
