/* A function library (remem/ops_plugin.h) whose function 900 never returns:
 * for the test of a server that a user function keeps from stopping
 * (tests/cli_test.cc, Server.AThreadThatDoesNotStopEndsTheServerAfterTheStopTimeout).
 * The plugin ABI forbids it; nothing can interrupt it. */

#include <remem/ops_plugin.h>
#include <unistd.h>

static int never_returns(int present, const uint8_t* value, size_t value_len,
                         const uint8_t* arg, size_t arg_len, uint8_t* out,
                         size_t out_cap, size_t* out_len) {
  (void)present, (void)value, (void)value_len, (void)arg, (void)arg_len;
  (void)out, (void)out_cap, (void)out_len;
  /* What the test waits for: the server's thread is in here now. */
  static const char kEntered[] = "never_returns: entered\n";
  (void)!write(2, kEntered, sizeof kEntered - 1);
  for (volatile int forever = 1; forever;) {
  }
  return REMEM_OPS_REFUSE; /* not reached */
}

static const struct remem_ops_function kFunctions[] = {
    {900, "never_returns", never_returns},
};
static const struct remem_ops_library kLibrary = {
    REMEM_OPS_ABI_VERSION, 1, kFunctions, 0, 0};

const struct remem_ops_library* remem_ops_library_v1(void) {
  return &kLibrary;
}
