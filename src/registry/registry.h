// The data models remem-server runs. Adding one is a new folder under src/
// (see docs/ARCHITECTURE.md, "Adding a data model") and one line in
// src/registry/registry.cc (the only place that names them all).
//
// Thread contract: a plain function.

#ifndef REMEM_REGISTRY_REGISTRY_H_
#define REMEM_REGISTRY_REGISTRY_H_

#include <memory>
#include <vector>

#include "server/service.h"

namespace remem::server {

// A fresh instance of every registered service, with default options.
std::vector<std::unique_ptr<Service>> DefaultServices();

}  // namespace remem::server

#endif  // REMEM_REGISTRY_REGISTRY_H_
