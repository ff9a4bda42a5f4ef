/* Copyright remem authors.
 *
 * The C interface of a library of user-defined functions: what a shared
 * library named with `remem-server --ops-library PATH` exports. The server
 * dlopens each library at start, calls remem_ops_library_v1() once, and
 * registers every function it lists under its id; clients then name a
 * function by id. Two kinds:
 *
 * - An update function (remem::Op::Call, include/remem/ops.h) runs on the
 *   server thread that owns the key, with the key's current value, and
 *   computes the new one; the server writes it with a new version (a
 *   one-sided reader sees the old value or the new one, never a mix) and
 *   logs it like a put.
 * - A reduction (ABI version 2; remem::Op::VecReduce with a function id)
 *   folds the elements of a vector value (docs/PROTOCOL.md, "Vector
 *   values") into one scalar, on the owner thread; it changes nothing. A
 *   client cannot run it, so a user reduction always runs on the server.
 *
 * Ids are one namespace: an id names one update function or one reduction
 * across all of the server's libraries. A library that cannot be loaded,
 * lacks the symbol, has an ABI version this server does not know, or lists
 * an id that is 0 or already taken, a null function or a reduction that
 * accepts no element type stops the server at start with a message.
 * examples/ops_library/ has both kinds.
 *
 * Versions: `abi_version` says which fields of remem_ops_library the
 * library filled. A server reads only those, so a library built against an
 * older header (version 1: update functions only) still loads; a library
 * built against this header sets REMEM_OPS_ABI_VERSION (2). The symbol's
 * name stays remem_ops_library_v1 in every version.
 *
 * Thread contract: every function is called from several server threads at
 * once (one per partition), each on its own keys; it must be reentrant (no
 * unsynchronised global state) and must not block. Nothing interrupts a
 * function that never returns: its thread serves nothing more (the
 * partition's keys and the connections on that thread), and a stopping
 * server exits after --stop-timeout-ms without a clean stop. Nothing
 * isolates them either: a function that crashes (a bad pointer) kills the
 * server process, and clients see it go as after kill -9.
 */

#ifndef REMEM_OPS_PLUGIN_H_
#define REMEM_OPS_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REMEM_OPS_ABI_VERSION 2

/* Return values of an update function. */
#define REMEM_OPS_WRITE 0 /* store out[0 .. *out_len) as the new value */
#define REMEM_OPS_KEEP                                                        \
  1                           /* leave the value (and its version) unchanged; \
                               * on an absent key: NotFound, nothing made */
#define REMEM_OPS_REFUSE (-1) /* bad value or argument: InvalidArgument */
/* Any other return value is taken as REMEM_OPS_REFUSE (InvalidArgument,
 * nothing written); a *out_len above out_cap with REMEM_OPS_WRITE is an
 * Internal error, nothing written. */

/* `present`: 0 if the key is absent (value is NULL, value_len 0).
 * `out` has room for `out_cap` bytes (the server's value limit); the
 * function sets *out_len <= out_cap when it returns REMEM_OPS_WRITE. */
typedef int (*remem_ops_update_fn)(int present, const uint8_t* value,
                                   size_t value_len, const uint8_t* arg,
                                   size_t arg_len, uint8_t* out, size_t out_cap,
                                   size_t* out_len);

struct remem_ops_function {
  uint32_t id;      /* >= 1, unique across the server's libraries */
  const char* name; /* for the server's messages (refusals, its log) */
  remem_ops_update_fn update;
};

/* Element types of a vector (the header's `type` byte, remem::ElemType). */
#define REMEM_OPS_INT64 1  /* int64_t */
#define REMEM_OPS_DOUBLE 2 /* double */
#define REMEM_OPS_FLOAT 3  /* float */
#define REMEM_OPS_INT32 4  /* int32_t */
/* A reduction's `elem_types`: the OR of the bits of the types it accepts. */
#define REMEM_OPS_TYPE_BIT(t) (1u << (t))

/* A reduction's result: `type` REMEM_OPS_INT64 (the client gets `i`) or
 * REMEM_OPS_DOUBLE (the client gets `d`); anything else is refused. */
struct remem_ops_number {
  uint32_t type;
  uint32_t reserved;
  int64_t i;
  double d;
};

/* Return values of a reduction. */
#define REMEM_OPS_REDUCED 0 /* *out holds the result */
/* REMEM_OPS_REFUSE, or any value but REMEM_OPS_REDUCED: the vector cannot
 * be reduced (e.g. empty, overflow): InvalidArgument. */

/* `elems`: `count` elements of `elem_type` (always one of the reduction's
 * `elem_types`), packed, host order, aligned to 8 bytes; count may be 0.
 * The server zeroes *out before the call. */
typedef int (*remem_ops_reduce_fn)(uint32_t elem_type, const void* elems,
                                   uint64_t count,
                                   struct remem_ops_number* out);

struct remem_ops_reduction {
  uint32_t id;         /* >= 1, unique across the server's libraries */
  const char* name;    /* for messages */
  uint32_t elem_types; /* REMEM_OPS_TYPE_BIT(...) | ...; another type:
                        * InvalidArgument, the function is not called */
  remem_ops_reduce_fn reduce;
};

struct remem_ops_library {
  uint32_t abi_version; /* REMEM_OPS_ABI_VERSION */
  uint32_t count;       /* update functions */
  const struct remem_ops_function* functions;
  /* ABI version 2 and later (a version 1 library ends above). */
  uint32_t reduction_count;
  const struct remem_ops_reduction* reductions;
};

/* The one symbol a library exports. */
typedef const struct remem_ops_library* (*remem_ops_library_fn)(void);
#define REMEM_OPS_LIBRARY_SYMBOL "remem_ops_library_v1"

#ifdef __cplusplus
}
#endif

#endif /* REMEM_OPS_PLUGIN_H_ */
