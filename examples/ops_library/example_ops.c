/* An update function library for remem-server (remem/ops_plugin.h):
 *
 *   remem-server --ops-library build/libremem_example_ops.so
 *
 * Function 100 "int64_mul": multiplies an 8-byte int64 value by the 8-byte
 * int64 argument (an absent key is refused; overflow is refused).
 * Function 101 "bounded_add": adds the int64 argument to an int64 value (an
 * absent key counts as 0) and keeps the result in [0, 1000]: a counter with
 * a ceiling, e.g. a rate limiter's bucket.
 * Function 102 "keep_if_longer": replaces the value with the argument only if
 * the argument is longer; otherwise leaves it (and its version) alone.
 */

#include <remem/ops_plugin.h>
#include <string.h>

static int64_t load(const uint8_t* p) {
  int64_t v;
  memcpy(&v, p, 8);
  return v;
}

static int int64_mul(int present, const uint8_t* value, size_t value_len,
                     const uint8_t* arg, size_t arg_len, uint8_t* out,
                     size_t out_cap, size_t* out_len) {
  int64_t r;
  if (!present || value_len != 8 || arg_len != 8 || out_cap < 8) {
    return REMEM_OPS_REFUSE;
  }
  if (__builtin_mul_overflow(load(value), load(arg), &r)) {
    return REMEM_OPS_REFUSE;
  }
  memcpy(out, &r, 8);
  *out_len = 8;
  return REMEM_OPS_WRITE;
}

static int bounded_add(int present, const uint8_t* value, size_t value_len,
                       const uint8_t* arg, size_t arg_len, uint8_t* out,
                       size_t out_cap, size_t* out_len) {
  int64_t v = 0, r;
  if ((present && value_len != 8) || arg_len != 8 || out_cap < 8) {
    return REMEM_OPS_REFUSE;
  }
  if (present) v = load(value);
  if (__builtin_add_overflow(v, load(arg), &r)) return REMEM_OPS_REFUSE;
  if (r < 0) r = 0;
  if (r > 1000) r = 1000;
  memcpy(out, &r, 8);
  *out_len = 8;
  return REMEM_OPS_WRITE;
}

static int keep_if_longer(int present, const uint8_t* value, size_t value_len,
                          const uint8_t* arg, size_t arg_len, uint8_t* out,
                          size_t out_cap, size_t* out_len) {
  (void)value;
  if (present && value_len >= arg_len) return REMEM_OPS_KEEP;
  if (arg_len > out_cap) return REMEM_OPS_REFUSE;
  memcpy(out, arg, arg_len);
  *out_len = arg_len;
  return REMEM_OPS_WRITE;
}

static const struct remem_ops_function kFunctions[] = {
    {100, "int64_mul", int64_mul},
    {101, "bounded_add", bounded_add},
    {102, "keep_if_longer", keep_if_longer},
};
static const struct remem_ops_library kLibrary = {
    REMEM_OPS_ABI_VERSION, sizeof kFunctions / sizeof kFunctions[0],
    kFunctions};

const struct remem_ops_library* remem_ops_library_v1(void) {
  return &kLibrary;
}
