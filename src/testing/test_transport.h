// testing::TestTransport: the UCX transport a test program runs over, from
// REMEM_TEST_TRANSPORT (shm, tcp or auto; unset: shm). ctest runs the
// process-level suites once per transport (one UCX transport per process);
// auto is for suites that rerun themselves that way (hostile_test, in a
// network namespace).
// Anything else aborts the program with the reason: a typo must not quietly
// run the shared-memory tests a second time.
//
// Thread contract: any thread (it reads the environment).

#ifndef REMEM_TESTING_TEST_TRANSPORT_H_
#define REMEM_TESTING_TEST_TRANSPORT_H_

#include "remem/options.h"

namespace remem::testing {

Transport TestTransport();

}  // namespace remem::testing

#endif  // REMEM_TESTING_TEST_TRANSPORT_H_
