/* A function library for remem-server (remem/ops_plugin.h, ABI version 2):
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
 *
 * Reductions (remem vec reduce KEY ID; remem::Op::VecReduce(key, id)):
 * Reduction 200 "sum_of_squares": the sum of the squares of the elements of
 * any vector: an int64 for int64/int32 vectors (overflow is refused), a
 * double for double/float ones; 0 for an empty vector.
 * Reduction 201 "l2_norm": the Euclidean norm of a double or float vector
 * (a double); integer vectors are refused by the server (their type is not
 * in its elem_types).
 */

#include <math.h>
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

/* The sum of squares as a double (double and float vectors). */
static double sum_squares_f(uint32_t type, const void* elems, uint64_t count) {
  double acc = 0;
  uint64_t i;
  for (i = 0; i < count; ++i) {
    const double x = type == REMEM_OPS_DOUBLE ? ((const double*)elems)[i]
                                              : ((const float*)elems)[i];
    acc += x * x;
  }
  return acc;
}

static int sum_of_squares(uint32_t type, const void* elems, uint64_t count,
                          struct remem_ops_number* out) {
  int64_t acc = 0, sq, x;
  uint64_t i;
  if (type == REMEM_OPS_DOUBLE || type == REMEM_OPS_FLOAT) {
    out->type = REMEM_OPS_DOUBLE;
    out->d = sum_squares_f(type, elems, count);
    return REMEM_OPS_REDUCED;
  }
  for (i = 0; i < count; ++i) {
    x = type == REMEM_OPS_INT64 ? ((const int64_t*)elems)[i]
                                : ((const int32_t*)elems)[i];
    if (__builtin_mul_overflow(x, x, &sq) ||
        __builtin_add_overflow(acc, sq, &acc)) {
      return REMEM_OPS_REFUSE;
    }
  }
  out->type = REMEM_OPS_INT64;
  out->i = acc;
  return REMEM_OPS_REDUCED;
}

static int l2_norm(uint32_t type, const void* elems, uint64_t count,
                   struct remem_ops_number* out) {
  out->type = REMEM_OPS_DOUBLE;
  out->d = sqrt(sum_squares_f(type, elems, count));
  return REMEM_OPS_REDUCED;
}

static const struct remem_ops_function kFunctions[] = {
    {100, "int64_mul", int64_mul},
    {101, "bounded_add", bounded_add},
    {102, "keep_if_longer", keep_if_longer},
};
static const struct remem_ops_reduction kReductions[] = {
    {200, "sum_of_squares",
     REMEM_OPS_TYPE_BIT(REMEM_OPS_INT64) | REMEM_OPS_TYPE_BIT(REMEM_OPS_INT32) |
         REMEM_OPS_TYPE_BIT(REMEM_OPS_DOUBLE) |
         REMEM_OPS_TYPE_BIT(REMEM_OPS_FLOAT),
     sum_of_squares},
    {201, "l2_norm",
     REMEM_OPS_TYPE_BIT(REMEM_OPS_DOUBLE) | REMEM_OPS_TYPE_BIT(REMEM_OPS_FLOAT),
     l2_norm},
};
static const struct remem_ops_library kLibrary = {
    REMEM_OPS_ABI_VERSION, sizeof kFunctions / sizeof kFunctions[0],
    kFunctions, sizeof kReductions / sizeof kReductions[0], kReductions};

const struct remem_ops_library* remem_ops_library_v1(void) {
  return &kLibrary;
}
