// hash::HashService: the hash key-value store as a server::Service. One
// partition per server thread, each with its own region (a root, bucket
// arrays and slab extents, read one-sided by clients), table and, with
// persistence, durable log (DurableTable). A key's partition is
// xxh3(key, partition seed) % partitions; the seed is kept in the data
// directory so keys land where they were before a restart.
//
// Methods (hash/wire.h): Info, Get, Put, Delete route to the key's
// partition; MultiGet, MultiPut and MultiOp run on the receiving thread and fan
// out to the partitions of their keys. Writes are logged (the RESULT: key,
// value, new version) and answered once their records are written (group
// commit at the end of the pass).
//
// Thread contract: as server::Service (service.h).

#ifndef REMEM_HASH_SERVICE_H_
#define REMEM_HASH_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "durability/store.h"
#include "hash/durable.h"
#include "hash/slab.h"
#include "hash/table.h"
#include "hash/wire.h"
#include "server/service.h"

namespace remem::fabric {
class LocalRegion;
}  // namespace remem::fabric

namespace remem::hash {

struct HashServiceOptions {
  // Bytes of --memory for the hash store, split into one partition per
  // thread; 0 = half of --memory.
  uint64_t memory = 0;
  uint64_t max_key_bytes = 64 << 10;
  uint64_t max_value_bytes = 16 << 20;
  uint64_t initial_buckets = 256;  // per partition, a power of two
  // Tests: every bucket write pauses this long half done. 0 = off.
  uint64_t fault_pause_mid_write_us = 0;
};

class HashService final : public server::Service {
 public:
  explicit HashService(HashServiceOptions options = {}) : options_(options) {}
  ~HashService() override;

  proto::ServiceId id() const override { return kHashService; }
  std::string_view name() const override { return "hash"; }
  uint8_t num_methods() const override {
    return static_cast<uint8_t>(HashMethod::kCount);
  }
  void DeclareOptions(server::OptionSet* options) override;
  Status Init(server::ServiceContext* ctx) override;
  Result<server::Route> RouteCall(uint8_t method,
                                  std::string_view payload) const override;
  void Handle(server::PartitionId p, server::Call call) override;
  void Stats(server::StatsBuilder* out) const override;

  HashServiceOptions& options() { return options_; }

 private:
  struct Partition {
    fabric::LocalRegion* region = nullptr;
    std::unique_ptr<SlabAllocator> slab;
    std::unique_ptr<Table> table;
    std::unique_ptr<DurableTable> durable;
    durability::PartitionStore* store = nullptr;  // null without persistence
    // Published by the owner after each write, read by Stats.
    server::Counter pairs, growths, bytes_used;
  };
  uint32_t PartitionOf(std::string_view key) const;
  void UpdateCounters_st(Partition& part);
  void HandleSingle_st(server::PartitionId p, server::Call call);
  void HandleMulti(server::Call call);
  // Replies once partition p's records so far are durable (at once without
  // persistence).
  void AfterDurable_st(Partition& part, server::Responder responder,
                       Status status, std::string payload);

  HashServiceOptions options_;
  server::ServiceContext* ctx_ = nullptr;
  uint64_t partition_seed_ = 0;
  std::vector<std::unique_ptr<Partition>> partitions_;
  std::string info_;  // encoded once
};

}  // namespace remem::hash

#endif  // REMEM_HASH_SERVICE_H_
