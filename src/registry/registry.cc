#include "registry/registry.h"

#include "hash/service.h"
#include "space/service.h"
#include "tree/service.h"
#include "txn/service.h"

namespace remem::server {

std::vector<std::unique_ptr<Service>> DefaultServices() {
  std::vector<std::unique_ptr<Service>> s;
  s.push_back(std::make_unique<hash::HashService>());    // the hash store
  s.push_back(std::make_unique<tree::TreeService>());    // the ordered store
  s.push_back(std::make_unique<space::SpaceService>());  // namespaces
  s.push_back(std::make_unique<txn::TxnService>());      // objects
  return s;
}

}  // namespace remem::server
