// ops::Apply: one server-side operation (remem/ops.h, OpKind) on a key's
// current value, as a pure function of bytes. The hash service's engine
// (hash/service.cc) keeps each key's value in a working copy while it runs
// a batch of operations on it (each sees the previous one's result), then
// writes the key once.
//
// Thread contract: pure functions; a FunctionLookup is read-only after the
// server started, so Apply may run on every owner thread at once.

#ifndef REMEM_OPS_APPLY_H_
#define REMEM_OPS_APPLY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "remem/ops.h"
#include "remem/ops_plugin.h"
#include "remem/status.h"

namespace remem::ops {

// Flags of an operation on the wire (HashOpRequest::flags).
inline constexpr uint8_t kFlagCreate = 1;   // act on an absent key
inline constexpr uint8_t kFlagIndices = 2;  // filter: return indices
// A vector update's or filter's scalar operand says its type (int64, or
// with kFlagDoubleOperand a double): an int64 operand on a double or float
// vector is converted, a double one on an integer vector refused. Without
// kFlagTypedOperand the 8 bytes are read as the vector's type family.
inline constexpr uint8_t kFlagTypedOperand = 4;
inline constexpr uint8_t kFlagDoubleOperand = 8;
inline constexpr uint8_t kKnownFlags =
    kFlagCreate | kFlagIndices | kFlagTypedOperand | kFlagDoubleOperand;

// An operation as the server decodes it; the views point into the request.
struct OpView {
  OpKind kind = OpKind::kFetchAdd;
  uint8_t flags = 0;
  uint8_t fn = 0;  // VecFn, Reduction or Predicate
  uint32_t function_id = 0;
  int64_t initial = 0;
  std::string_view key;
  std::string_view arg;
  std::string_view expected;
};

// True for kinds that may change the value (the log must be writable).
bool MayWrite(OpKind kind);
// InvalidArgument unless the kind, flags, fn and argument sizes are well
// formed (what can be checked without the value).
Status Validate(const OpView& op);

struct UserFunction {
  uint32_t id = 0;
  std::string name;
  remem_ops_update_fn update = nullptr;
};
struct UserReduction {
  uint32_t id = 0;
  std::string name;
  uint32_t elem_types = 0;  // REMEM_OPS_TYPE_BIT of each accepted ElemType
  remem_ops_reduce_fn reduce = nullptr;
};
class FunctionLookup {
 public:
  virtual ~FunctionLookup() = default;
  // The update function registered under `id`, or null.
  virtual const UserFunction* Find(uint32_t id) const = 0;
  // The reduction registered under `id`, or null.
  virtual const UserReduction* FindReduction(uint32_t id) const = 0;
};

struct Outcome {
  bool wrote = false;   // *value changed (or was created): store it
  bool applied = true;  // compare-and-swap swapped
  std::string reply;    // what the client gets (OpKind says what)
};

// Applies `op` to the key's value (`*present`, `*value`). On success the
// two hold the value after the op and `out` says whether it changed; on
// error nothing changed. Errors: NotFound (absent key without kFlagCreate),
// InvalidArgument (type mismatch, malformed argument, a result beyond
// `max_value` bytes, a function that refused, a vector type a reduction does
// not accept), OutOfRange (integer overflow), Unsupported (no function of
// that kind with that id; `functions` may be null).
Status Apply(const OpView& op, uint32_t max_value,
             const FunctionLookup* functions, bool* present, std::string* value,
             Outcome* out);

}  // namespace remem::ops

#endif  // REMEM_OPS_APPLY_H_
