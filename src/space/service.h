// space::SpaceService: namespaces of raw remote memory (RStore), the
// server side of remem/space.h. It owns --space-memory of the server's
// registered memory (regions exported read-write), keeps the namespaces'
// metadata in a SpaceTable on partition 0's thread, and answers the
// control path: create, open, delete, list, reserve, release, alloc, free,
// segments, map, unmap. Reads and writes of mapped memory never reach it:
// clients do them one-sided (over tcp the connection's thread performs
// them, as for raw regions).
//
// Namespaces live as long as the server process: they are not logged or
// snapshotted (clients write the memory one-sided, the server never sees
// the bytes), so a restarted server starts with none, --data-dir or not.
//
// Thread contract: as server::Service (server/service.h); the table is
// touched on partition 0's owner thread only.

#ifndef REMEM_SPACE_SERVICE_H_
#define REMEM_SPACE_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "server/service.h"
#include "space/space.h"
#include "space/wire.h"

namespace remem::space {

class SpaceService : public server::Service {
 public:
  proto::ServiceId id() const override { return kSpaceService; }
  std::string_view name() const override { return "space"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(SpaceMethod::kCount);
  }
  void DeclareOptions(server::OptionSet* options) override;
  Status Init(server::ServiceContext* ctx) override;
  Result<server::Route> RouteCall(uint8_t method,
                                  std::string_view payload) const override;
  void Handle(server::PartitionId p, server::Call call) override;
  void Stats(server::StatsBuilder* out) const override;
  void OnConnectionClosed(server::PartitionId p,
                          server::ConnectionId c) override;

 private:
  Status Run(const server::Call& call, std::string* reply);

  struct Options {
    uint64_t memory = 0;  // 0: the default (Init)
    uint64_t chunk = 0;   // 0: 64 KiB
  } options_;
  std::unique_ptr<SpaceTable> table_;
};

}  // namespace remem::space

#endif  // REMEM_SPACE_SERVICE_H_
