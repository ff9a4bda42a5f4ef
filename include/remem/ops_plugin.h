/* Copyright remem authors.
 *
 * The C interface of a user-defined update function library: what a shared
 * library named with `remem-server --ops-library PATH` exports. The server
 * dlopens each library at start, calls remem_ops_library_v1() once, and
 * registers every function it lists under its id; clients then name a
 * function by id (remem::Op::Call, include/remem/ops.h). A library that
 * cannot be loaded, lacks the symbol, has another ABI version, or lists an
 * id that is 0 or already taken stops the server at start with a message.
 *
 * An update function runs on the server thread that owns the key, with the
 * key's current value, and computes the new one; the server writes it with
 * a new version (a one-sided reader sees the old value or the new one,
 * never a mix) and logs it like a put. examples/ops_library/ has one.
 *
 * Thread contract: an update function is called from several server threads
 * at once (one per partition), each on its own keys; it must be reentrant
 * (no unsynchronised global state) and must not block.
 */

#ifndef REMEM_OPS_PLUGIN_H_
#define REMEM_OPS_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REMEM_OPS_ABI_VERSION 1

/* Return values of an update function. */
#define REMEM_OPS_WRITE 0     /* store out[0 .. *out_len) as the new value */
#define REMEM_OPS_KEEP 1      /* leave the value (and its version) unchanged */
#define REMEM_OPS_REFUSE (-1) /* bad value or argument: InvalidArgument */

/* `present`: 0 if the key is absent (value is NULL, value_len 0).
 * `out` has room for `out_cap` bytes (the server's value limit); the
 * function sets *out_len <= out_cap when it returns REMEM_OPS_WRITE. */
typedef int (*remem_ops_update_fn)(int present, const uint8_t* value,
                                   size_t value_len, const uint8_t* arg,
                                   size_t arg_len, uint8_t* out, size_t out_cap,
                                   size_t* out_len);

struct remem_ops_function {
  uint32_t id;      /* >= 1, unique across the server's libraries */
  const char* name; /* for messages and `remem stats` */
  remem_ops_update_fn update;
};

struct remem_ops_library {
  uint32_t abi_version; /* REMEM_OPS_ABI_VERSION */
  uint32_t count;
  const struct remem_ops_function* functions;
};

/* The one symbol a library exports. */
typedef const struct remem_ops_library* (*remem_ops_library_fn)(void);
#define REMEM_OPS_LIBRARY_SYMBOL "remem_ops_library_v1"

#ifdef __cplusplus
}
#endif

#endif /* REMEM_OPS_PLUGIN_H_ */
