#include "ops/apply.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/vector.h"

namespace remem::ops {

namespace {

bool IsIntegerOp(OpKind k) {
  return k == OpKind::kFetchAdd || k == OpKind::kAddFetch ||
         k == OpKind::kMin || k == OpKind::kMax;
}

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::kFetchAdd:
      return "fetch-add";
    case OpKind::kAddFetch:
      return "add-fetch";
    case OpKind::kCompareSwap:
      return "compare-and-swap";
    case OpKind::kAppend:
      return "append";
    case OpKind::kMin:
      return "min";
    case OpKind::kMax:
      return "max";
    case OpKind::kVecUpdate:
      return "vector update";
    case OpKind::kVecReduce:
      return "vector reduce";
    case OpKind::kVecFilter:
      return "vector filter";
    case OpKind::kCall:
      return "function call";
  }
  return "operation";
}

Status TooLarge(uint64_t bytes, uint32_t max_value) {
  return Status::InvalidArgument(
      "the result would be " + std::to_string(bytes) +
      " bytes, beyond the value limit of " + std::to_string(max_value) +
      "; the value is unchanged");
}

Status IntegerOp(const OpView& op, bool* present, std::string* value,
                 Outcome* out) {
  int64_t old = op.initial;
  if (*present) {
    if (value->size() != 8) {
      return Status::InvalidArgument(
          std::string(KindName(op.kind)) +
          " needs an 8-byte integer value; this key holds " +
          std::to_string(value->size()) + " bytes (nothing changed)");
    }
    old = LoadI64(value->data());
  }
  const int64_t operand = LoadI64(op.arg.data());
  int64_t next = old;
  switch (op.kind) {
    case OpKind::kFetchAdd:
    case OpKind::kAddFetch:
      if (__builtin_add_overflow(old, operand, &next)) {
        return Status::OutOfRange(std::to_string(old) + " + " +
                                  std::to_string(operand) +
                                  " overflows int64; the value is unchanged");
      }
      break;
    case OpKind::kMin:
      next = operand < old ? operand : old;
      break;
    default:
      next = operand > old ? operand : old;
      break;
  }
  out->wrote = !*present || next != old;
  out->reply = EncodeI64(op.kind == OpKind::kFetchAdd ? old : next);
  if (out->wrote) {
    *present = true;
    *value = EncodeI64(next);
  }
  return Status::OK();
}

// Unsupported: no `what` with `id`, saying so if the id names a function of
// the other kind.
Status NotRegistered(const char* what, uint32_t id,
                     const FunctionLookup* functions) {
  std::string other;
  if (functions != nullptr && functions->Find(id) != nullptr) {
    other = " (id " + std::to_string(id) + " is the update function " +
            functions->Find(id)->name + ")";
  } else if (functions != nullptr && functions->FindReduction(id) != nullptr) {
    other = " (id " + std::to_string(id) + " is the reduction " +
            functions->FindReduction(id)->name + ")";
  }
  return Status::Unsupported(std::string("no ") + what + " with id " +
                             std::to_string(id) +
                             " is registered on this server (remem-server "
                             "--ops-library)" +
                             other);
}

// A user reduction (remem_ops_reduce_fn) of the vector `value`: a
// one-element int64 or double vector, as the built-in reductions answer.
Result<std::string> UserReduce(uint32_t id, const FunctionLookup* functions,
                               std::string_view value) {
  const UserReduction* f = functions ? functions->FindReduction(id) : nullptr;
  if (f == nullptr) return NotRegistered("reduction", id, functions);
  auto v = ParseVector(value);
  if (!v.ok()) return v.status();
  const std::string who =
      "reduction " + f->name + " (id " + std::to_string(id) + ")";
  if ((f->elem_types & REMEM_OPS_TYPE_BIT(uint8_t(v->type))) == 0) {
    return Status::InvalidArgument(who + " does not accept " +
                                   ElemTypeName(v->type) + " vectors");
  }
  // The contract promises 8-byte alignment; a working copy's elements are
  // usually aligned already (16 bytes into a heap buffer).
  const void* elems = v->elems;
  thread_local std::vector<uint64_t> aligned;
  if (reinterpret_cast<uintptr_t>(elems) % 8 != 0) {
    const size_t bytes = v->count * ElemSize(v->type);
    aligned.resize((bytes + 7) / 8);
    if (bytes > 0) std::memcpy(aligned.data(), elems, bytes);
    elems = aligned.data();
  }
  remem_ops_number n{};
  const int rc = f->reduce(uint8_t(v->type), elems, v->count, &n);
  if (rc != REMEM_OPS_REDUCED) {
    return Status::InvalidArgument(who + " refused the vector");
  }
  if (n.type == REMEM_OPS_INT64) return MakeVector(ElemType::kInt64, 1, &n.i);
  if (n.type == REMEM_OPS_DOUBLE) return MakeVector(ElemType::kDouble, 1, &n.d);
  // remem/ops_plugin.h: anything else is refused.
  return Status::InvalidArgument(who + " answered a number of unknown type " +
                                 std::to_string(n.type) +
                                 " (REMEM_OPS_INT64 or REMEM_OPS_DOUBLE)");
}

}  // namespace

bool MayWrite(OpKind kind) {
  return kind != OpKind::kVecReduce && kind != OpKind::kVecFilter;
}

Status Validate(const OpView& op) {
  const uint8_t k = uint8_t(op.kind);
  if (k < uint8_t(OpKind::kFetchAdd) || k > uint8_t(OpKind::kCall)) {
    return Status::InvalidArgument("unknown operation " + std::to_string(k));
  }
  if (op.flags & ~kKnownFlags) {
    return Status::InvalidArgument("unknown operation flags");
  }
  if (op.key.empty()) return Status::InvalidArgument("empty key");
  if (IsIntegerOp(op.kind) && op.arg.size() != 8) {
    return Status::InvalidArgument(std::string(KindName(op.kind)) +
                                   " takes an 8-byte integer operand");
  }
  if (!op.expected.empty() && op.kind != OpKind::kCompareSwap) {
    return Status::InvalidArgument(
        "only compare-and-swap has an expected value");
  }
  switch (op.kind) {
    case OpKind::kVecUpdate:
      if (op.fn < uint8_t(VecFn::kAdd) || op.fn > uint8_t(VecFn::kMax)) {
        return Status::InvalidArgument("unknown vector update function " +
                                       std::to_string(op.fn));
      }
      break;
    case OpKind::kVecReduce:
      if (op.fn < uint8_t(Reduction::kSum) ||
          op.fn > uint8_t(Reduction::kUser)) {
        return Status::InvalidArgument("unknown reduction " +
                                       std::to_string(op.fn));
      }
      if (op.fn == uint8_t(Reduction::kUser) && op.function_id == 0) {
        return Status::InvalidArgument(
            "a user reduction needs a function id (0 is never registered)");
      }
      break;
    case OpKind::kVecFilter:
      if (op.fn < uint8_t(Predicate::kLt) || op.fn > uint8_t(Predicate::kNe)) {
        return Status::InvalidArgument("unknown predicate " +
                                       std::to_string(op.fn));
      }
      if (op.arg.size() != 8) {
        return Status::InvalidArgument("a filter's operand is 8 bytes");
      }
      break;
    case OpKind::kCall:
      if (op.function_id == 0) {
        return Status::InvalidArgument("function id 0 is never registered");
      }
      break;
    default:
      break;
  }
  return Status::OK();
}

namespace {

// A typed scalar operand (kFlagTypedOperand) as the bytes the vector's
// type family reads: an int64 for an integer vector, a double for a double
// or float one. `*bytes` keeps the operand when nothing is to be done.
Status ScalarFor(const OpView& op, std::string_view value,
                 std::string_view* bytes, std::string* converted) {
  *bytes = op.arg;
  if ((op.flags & kFlagTypedOperand) == 0 || op.arg.size() != 8) {
    return Status::OK();
  }
  auto v = ParseVector(value);
  if (!v.ok()) return Status::OK();  // the operation says what is wrong
  const bool is_double = (op.flags & kFlagDoubleOperand) != 0;
  if (IsIntegerType(v->type)) {
    if (is_double) {
      return Status::InvalidArgument(std::string("a double operand for an ") +
                                     ElemTypeName(v->type) +
                                     " vector (give an integer)");
    }
    return Status::OK();
  }
  if (!is_double) {
    int64_t i = 0;
    std::memcpy(&i, op.arg.data(), 8);
    *converted = EncodeF64(double(i));
    *bytes = *converted;
  }
  return Status::OK();
}

}  // namespace

Status Apply(const OpView& op, uint32_t max_value,
             const FunctionLookup* functions, bool* present, std::string* value,
             Outcome* out) {
  REMEM_RETURN_IF_ERROR(Validate(op));
  *out = Outcome{};
  const bool create = (op.flags & kFlagCreate) != 0;
  if (!*present && !(create && op.kind <= OpKind::kMax) &&
      op.kind != OpKind::kCall) {
    return Status::NotFound("no such key");
  }
  if (IsIntegerOp(op.kind)) return IntegerOp(op, present, value, out);
  switch (op.kind) {
    case OpKind::kCompareSwap: {
      if (op.arg.size() > max_value) return TooLarge(op.arg.size(), max_value);
      const bool match = *present ? std::string_view(*value) == op.expected
                                  : true;  // absent with kFlagCreate
      out->reply = *present ? *value : std::string();
      out->applied = match;
      if (match) {
        *present = true;
        *value = std::string(op.arg);
        out->wrote = true;
      }
      return Status::OK();
    }
    case OpKind::kAppend: {
      const uint64_t bytes = (*present ? value->size() : 0) + op.arg.size();
      if (bytes > max_value) return TooLarge(bytes, max_value);
      if (!*present) value->clear();
      value->append(op.arg);
      *present = true;
      out->wrote = true;
      out->reply = EncodeI64(int64_t(bytes));
      return Status::OK();
    }
    case OpKind::kVecUpdate: {
      std::string_view operand;
      std::string converted;
      REMEM_RETURN_IF_ERROR(ScalarFor(op, *value, &operand, &converted));
      REMEM_RETURN_IF_ERROR(UpdateVector(value, VecFn(op.fn), operand));
      out->wrote = true;
      return Status::OK();
    }
    case OpKind::kVecReduce: {
      if (op.fn == uint8_t(Reduction::kUser)) {
        auto r = UserReduce(op.function_id, functions, *value);
        if (!r.ok()) return r.status();
        out->reply = std::move(*r);
        return Status::OK();
      }
      auto r = ReduceVector(*value, Reduction(op.fn));
      if (!r.ok()) return r.status();
      out->reply = std::move(*r);
      return Status::OK();
    }
    case OpKind::kVecFilter: {
      std::string_view operand;
      std::string converted;
      REMEM_RETURN_IF_ERROR(ScalarFor(op, *value, &operand, &converted));
      auto r = FilterVector(*value, Predicate(op.fn), operand,
                            (op.flags & kFlagIndices) != 0);
      if (!r.ok()) return r.status();
      out->reply = std::move(*r);
      return Status::OK();
    }
    case OpKind::kCall: {
      const UserFunction* f =
          functions ? functions->Find(op.function_id) : nullptr;
      if (f == nullptr) {
        return NotRegistered("update function", op.function_id, functions);
      }
      // One output buffer per server thread, as large as a value may be.
      thread_local std::string buf;
      if (buf.size() < max_value) buf.resize(max_value);
      size_t len = 0;
      const int rc = f->update(
          *present ? 1 : 0,
          *present ? reinterpret_cast<const uint8_t*>(value->data()) : nullptr,
          *present ? value->size() : 0,
          reinterpret_cast<const uint8_t*>(op.arg.data()), op.arg.size(),
          reinterpret_cast<uint8_t*>(buf.data()), max_value, &len);
      if (rc == REMEM_OPS_KEEP) {
        if (!*present) return Status::NotFound("no such key");
        out->reply = *value;
        return Status::OK();
      }
      if (rc != REMEM_OPS_WRITE) {
        return Status::InvalidArgument("update function " + f->name + " (id " +
                                       std::to_string(f->id) +
                                       ") refused the value or argument");
      }
      if (len > max_value) {
        return Status::Internal("update function " + f->name +
                                " wrote past its output buffer");
      }
      value->assign(buf.data(), len);
      *present = true;
      out->wrote = true;
      out->reply = *value;
      return Status::OK();
    }
    default:
      break;
  }
  return Status::Internal("unhandled operation");
}

}  // namespace remem::ops
