#include "ops/vector.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace remem::ops {

namespace {

// Calls f(T{}) with T the element type's C++ type.
template <typename F>
auto Dispatch(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kInt64:
      return f(int64_t{});
    case ElemType::kDouble:
      return f(double{});
    case ElemType::kFloat:
      return f(float{});
    case ElemType::kInt32:
      break;
  }
  return f(int32_t{});
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// The scalar operand as the element type's computing type (int64 or
// double).
template <typename T>
using Wide = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

const char* FnName(VecFn fn) {
  switch (fn) {
    case VecFn::kAdd:
      return "add";
    case VecFn::kMul:
      return "mul";
    case VecFn::kSet:
      return "set";
    case VecFn::kMin:
      return "min";
    case VecFn::kMax:
      return "max";
  }
  return "?";
}

// One element's update; false on integer overflow.
template <typename T>
bool Combine(VecFn fn, T a, Wide<T> b, T* out) {
  if constexpr (std::is_integral_v<T>) {
    switch (fn) {
      case VecFn::kAdd:
        return !__builtin_add_overflow(a, b, out);
      case VecFn::kMul:
        return !__builtin_mul_overflow(a, b, out);
      case VecFn::kSet:
        if (b < std::numeric_limits<T>::min() ||
            b > std::numeric_limits<T>::max()) {
          return false;
        }
        *out = T(b);
        return true;
      // An int32 vector's operand is int64: one past int32's range that
      // would be the result overflows, as it does for kSet (it used to
      // be stored cut to 32 bits).
      case VecFn::kMin:
        if (b >= a) {
          *out = a;
          return true;
        }
        if (b < std::numeric_limits<T>::min()) return false;
        *out = T(b);
        return true;
      case VecFn::kMax:
        if (b <= a) {
          *out = a;
          return true;
        }
        if (b > std::numeric_limits<T>::max()) return false;
        *out = T(b);
        return true;
    }
    return false;
  } else {
    switch (fn) {
      case VecFn::kAdd:
        *out = T(a + b);
        return true;
      case VecFn::kMul:
        *out = T(a * b);
        return true;
      case VecFn::kSet:
        *out = T(b);
        return true;
      // NaN propagates: the result is NaN if either is (as numpy's
      // minimum and maximum; IEEE's fmin and fmax would drop it).
      case VecFn::kMin:
        if (std::isnan(a)) {
          *out = a;
        } else {
          *out = std::isnan(b) || b < a ? T(b) : a;
        }
        return true;
      case VecFn::kMax:
        if (std::isnan(a)) {
          *out = a;
        } else {
          *out = std::isnan(b) || b > a ? T(b) : a;
        }
        return true;
    }
    return false;
  }
}

template <typename T>
bool Matches(Predicate p, T a, Wide<T> b) {
  const Wide<T> x = a;
  switch (p) {
    case Predicate::kLt:
      return x < b;
    case Predicate::kLe:
      return x <= b;
    case Predicate::kGt:
      return x > b;
    case Predicate::kGe:
      return x >= b;
    case Predicate::kEq:
      return x == b;
    case Predicate::kNe:
      return x != b;
  }
  return false;
}

template <typename T>
Wide<T> LoadScalar(std::string_view operand) {
  return Load<Wide<T>>(reinterpret_cast<const uint8_t*>(operand.data()));
}

}  // namespace

size_t ElemSize(ElemType t) {
  switch (t) {
    case ElemType::kInt64:
    case ElemType::kDouble:
      return 8;
    case ElemType::kFloat:
    case ElemType::kInt32:
      return 4;
  }
  return 0;
}

const char* ElemTypeName(ElemType t) {
  switch (t) {
    case ElemType::kInt64:
      return "int64";
    case ElemType::kDouble:
      return "double";
    case ElemType::kFloat:
      return "float";
    case ElemType::kInt32:
      return "int32";
  }
  return "?";
}

bool IsIntegerType(ElemType t) {
  return t == ElemType::kInt64 || t == ElemType::kInt32;
}

Result<VectorView> ParseVector(std::string_view value) {
  if (value.size() < sizeof(VectorHeader)) {
    return Status::InvalidArgument("not a vector: the value is " +
                                   std::to_string(value.size()) +
                                   " bytes, shorter than a vector header");
  }
  VectorHeader h;
  std::memcpy(&h, value.data(), sizeof h);
  if (h.magic != kVectorMagic || h.layout != kVectorLayout) {
    return Status::InvalidArgument("not a vector: bad magic or layout");
  }
  const ElemType t = static_cast<ElemType>(h.type);
  const size_t es = ElemSize(t);
  if (es == 0) {
    return Status::InvalidArgument("not a vector: unknown element type " +
                                   std::to_string(h.type));
  }
  const uint64_t body = value.size() - sizeof h;
  if (h.count > body / es || h.count * es != body) {
    return Status::InvalidArgument(
        "not a vector: its count does not match its length");
  }
  return VectorView{t, h.count,
                    reinterpret_cast<const uint8_t*>(value.data()) + sizeof h};
}

std::string MakeVector(ElemType type, uint64_t count, const void* elems) {
  VectorHeader h{kVectorMagic, uint8_t(type), kVectorLayout, 0, count};
  std::string out(sizeof h + count * ElemSize(type), '\0');
  std::memcpy(out.data(), &h, sizeof h);
  if (count > 0) {
    std::memcpy(out.data() + sizeof h, elems, count * ElemSize(type));
  }
  return out;
}

Status UpdateVector(std::string* value, VecFn fn, std::string_view operand) {
  auto v = ParseVector(*value);
  if (!v.ok()) return v.status();
  if (uint8_t(fn) < uint8_t(VecFn::kAdd) ||
      uint8_t(fn) > uint8_t(VecFn::kMax)) {
    return Status::InvalidArgument("unknown vector update function " +
                                   std::to_string(uint8_t(fn)));
  }
  const VectorView view = *v;
  std::optional<VectorView> other;
  if (operand.size() != 8) {
    auto o = ParseVector(operand);
    if (!o.ok()) {
      return Status::InvalidArgument(
          "a vector update's operand is an 8-byte scalar or a vector: " +
          o.status().message());
    }
    if (o->type != view.type || o->count != view.count) {
      return Status::InvalidArgument(
          std::string("the operand vector (") + ElemTypeName(o->type) + ", " +
          std::to_string(o->count) + " elements) differs from the value's (" +
          ElemTypeName(view.type) + ", " + std::to_string(view.count) +
          " elements): an operand vector has the value's type and length");
    }
    other = *o;
  }
  std::string next = *value;
  uint8_t* out = reinterpret_cast<uint8_t*>(next.data()) + sizeof(VectorHeader);
  Status st = Dispatch(view.type, [&](auto zero) -> Status {
    using T = decltype(zero);
    const Wide<T> scalar = other ? Wide<T>{} : LoadScalar<T>(operand);
    if constexpr (std::is_same_v<T, float>) {
      // As a float vector's elements are refused past float's range when
      // written (an int32 vector's operand past int32's is refused too);
      // NaN and the infinities are floats.
      if (!other && !FitsFloat(scalar)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", scalar);
        return Status::InvalidArgument(std::string("the operand ") + text +
                                       " does not fit a float; the value is "
                                       "unchanged");
      }
    }
    for (uint64_t i = 0; i < view.count; ++i) {
      const T a = Load<T>(view.elems + i * sizeof(T));
      const Wide<T> b =
          other ? Wide<T>(Load<T>(other->elems + i * sizeof(T))) : scalar;
      T r;
      if (!Combine<T>(fn, a, b, &r)) {
        return Status::OutOfRange(std::string("vector ") + FnName(fn) +
                                  " overflows the element type at index " +
                                  std::to_string(i) +
                                  "; the value is unchanged");
      }
      Store<T>(out + i * sizeof(T), r);
    }
    return Status::OK();
  });
  REMEM_RETURN_IF_ERROR(st);
  *value = std::move(next);
  return Status::OK();
}

Result<std::string> ReduceVector(std::string_view value, Reduction r) {
  auto v = ParseVector(value);
  if (!v.ok()) return v.status();
  const VectorView view = *v;
  if (r == Reduction::kCount) {
    const int64_t n = int64_t(view.count);
    return MakeVector(ElemType::kInt64, 1, &n);
  }
  if (r != Reduction::kSum && r != Reduction::kMin && r != Reduction::kMax) {
    return Status::InvalidArgument("unknown reduction " +
                                   std::to_string(uint8_t(r)));
  }
  if (view.count == 0 && r != Reduction::kSum) {
    return Status::InvalidArgument("an empty vector has no min or max");
  }
  return Dispatch(view.type, [&](auto zero) -> Result<std::string> {
    using T = decltype(zero);
    Wide<T> acc =
        r == Reduction::kSum ? Wide<T>{} : Wide<T>(Load<T>(view.elems));
    for (uint64_t i = 0; i < view.count; ++i) {
      const Wide<T> x = Load<T>(view.elems + i * sizeof(T));
      if (r == Reduction::kSum) {
        if constexpr (std::is_integral_v<T>) {
          if (__builtin_add_overflow(acc, x, &acc)) {
            return Status::OutOfRange("the vector's sum overflows int64");
          }
        } else {
          acc += x;
        }
      } else if constexpr (!std::is_integral_v<T>) {
        // NaN propagates, wherever it is (see Combine).
        if (std::isnan(x)) {
          acc = x;
          break;
        }
        if (r == Reduction::kMin ? x < acc : x > acc) acc = x;
      } else if (r == Reduction::kMin ? x < acc : x > acc) {
        acc = x;
      }
    }
    const ElemType out =
        std::is_integral_v<T> ? ElemType::kInt64 : ElemType::kDouble;
    return MakeVector(out, 1, &acc);
  });
}

Result<std::string> FilterVector(std::string_view value, Predicate p,
                                 std::string_view operand, bool indices) {
  auto v = ParseVector(value);
  if (!v.ok()) return v.status();
  if (operand.size() != 8) {
    return Status::InvalidArgument("a filter's operand is an 8-byte scalar");
  }
  if (uint8_t(p) < uint8_t(Predicate::kLt) ||
      uint8_t(p) > uint8_t(Predicate::kNe)) {
    return Status::InvalidArgument("unknown predicate " +
                                   std::to_string(uint8_t(p)));
  }
  const VectorView view = *v;
  return Dispatch(view.type, [&](auto zero) -> Result<std::string> {
    using T = decltype(zero);
    Wide<T> b = LoadScalar<T>(operand);
    // A float vector's operand is rounded to float first, as an element
    // stored from it is: `eq 0.1` finds the 0.1 a put stored (0.1f, which
    // is not the double 0.1). Past float's range it compares as it is (as
    // infinity would).
    if constexpr (std::is_same_v<T, float>) {
      if (FitsFloat(b)) {
        b = Wide<T>(static_cast<float>(b));
      }
    }
    std::vector<T> elems;
    std::vector<int64_t> where;
    for (uint64_t i = 0; i < view.count; ++i) {
      const T a = Load<T>(view.elems + i * sizeof(T));
      if (!Matches<T>(p, a, b)) continue;
      if (indices) {
        where.push_back(int64_t(i));
      } else {
        elems.push_back(a);
      }
    }
    if (indices)
      return MakeVector(ElemType::kInt64, where.size(), where.data());
    return MakeVector(view.type, elems.size(), elems.data());
  });
}

std::string EncodeI64(int64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
std::string EncodeF64(double v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}
int64_t LoadI64(const void* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
double LoadF64(const void* p) {
  double v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace remem::ops
