// testing::HashStoreKv: testing::KvStore over the network: each client is a
// Session and a remem::HashStore of its own to a running remem-server.
// Writers use the RPC read path (their writes always go through the
// server); readers read one-sided, verifying what they read, and fall back
// to the server as HashStore does.
//
// Thread contract: as KvStore (kv_store.h): NewClient and Counters from any
// thread; each client on the thread that created it.

#ifndef REMEM_TESTING_HASH_STORE_KV_H_
#define REMEM_TESTING_HASH_STORE_KV_H_

#include <memory>
#include <string>

#include "remem/options.h"
#include "testing/kv_store.h"

namespace remem::testing {

class HashStoreKv : public KvStore {
 public:
  HashStoreKv(std::string address, Transport transport,
              std::string secret = "");
  Result<std::unique_ptr<KvClient>> NewClient(Role role) override;
  // Growths from the server's stats; moves are not counted there (-1).
  Result<KvStoreCounters> Counters() override;

 private:
  std::string address_;
  Transport transport_;
  std::string secret_;
};

}  // namespace remem::testing

#endif  // REMEM_TESTING_HASH_STORE_KV_H_
