// txn::TxnService: transactional objects (FaRM), the server side of
// remem/txn.h. It owns --txn-memory of the server's registered memory
// (regions exported read-only: objects change only by commits), keeps the
// ObjectHeap on partition 0's thread, and answers info, alloc, release,
// commit and read. Clients read objects one-sided; kRead is their fallback
// when a copy keeps failing verification.
//
// With --data-dir the heap is durable (txn/durable.h): every commit and
// release is logged as one atomic group, replied to once durable under the
// fsync policy, and snapshotted with the other services' state; a restart
// recovers every object at its id and version. Without, objects live as
// long as the server process, and the heap's slots start at an incarnation
// drawn for that start, so that ids of an earlier run read NotFound.
//
// Thread contract: as server::Service (server/service.h); the heap is
// touched on partition 0's owner thread only.

#ifndef REMEM_TXN_SERVICE_H_
#define REMEM_TXN_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "durability/store.h"
#include "server/service.h"
#include "txn/durable.h"
#include "txn/heap.h"
#include "txn/wire.h"

namespace remem::txn {

class TxnService : public server::Service {
 public:
  proto::ServiceId id() const override { return kTxnService; }
  std::string_view name() const override { return "txn"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(TxnMethod::kCount);
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

  uint64_t memory_option_ = 0;  // 0: the default (Init)
  std::unique_ptr<ObjectHeap> heap_;
  std::unique_ptr<DurableHeap> durable_;
  durability::PartitionStore* store_ = nullptr;  // null: not durable
  std::string info_reply_;  // encoded once: the regions never change
};

}  // namespace remem::txn

#endif  // REMEM_TXN_SERVICE_H_
