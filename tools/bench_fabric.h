#ifndef REMEM_TOOLS_BENCH_FABRIC_H_
#define REMEM_TOOLS_BENCH_FABRIC_H_

#include <string>

#include "remem/options.h"

namespace remem::bench {

struct FabricOptions {
  std::string server;  // empty: start one
  std::string server_binary;
  std::string secret;
  Transport transport = Transport::kShm;
  uint64_t size = 64;
  uint64_t span = 64ull << 20;  // bytes the random offsets spread over
  // Whether --span was given: else a server's smaller region bounds it.
  bool span_given = false;
  int depth = 16;
  double seconds = 1.0;
  int server_cpu = 0;
  int client_cpu = 1;
  bool json = false;
  // fabric: also Redis GETRANGE / SETRANGE on one string as long as the
  // namespace rows' segment, the nearest peer of a mapped segment (needs
  // redis-server).
  bool redis = false;
};

int RunFabric(const FabricOptions& o);
// The hash store's gets on each read path.
int RunHash(const FabricOptions& o, uint64_t records, size_t key_len,
            size_t value_len);

}  // namespace remem::bench

#endif  // REMEM_TOOLS_BENCH_FABRIC_H_
