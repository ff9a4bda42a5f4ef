#include "registry/registry.h"

#include "hash/service.h"

namespace remem::server {

std::vector<std::unique_ptr<Service>> DefaultServices() {
  std::vector<std::unique_ptr<Service>> s;
  s.push_back(std::make_unique<hash::HashService>());  // the hash store
  return s;
}

}  // namespace remem::server
