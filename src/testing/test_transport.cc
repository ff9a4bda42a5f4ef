#include "testing/test_transport.h"

#include <cstdio>
#include <cstdlib>

namespace remem::testing {

Transport TestTransport() {
  const char* t = std::getenv("REMEM_TEST_TRANSPORT");
  if (t == nullptr) return Transport::kShm;
  auto parsed = ParseTransport(t);
  if (!parsed.ok()) {
    std::fprintf(stderr, "REMEM_TEST_TRANSPORT must be shm, tcp or auto: %s\n",
                 parsed.status().ToString().c_str());
    std::abort();
  }
  return *parsed;
}

}  // namespace remem::testing
