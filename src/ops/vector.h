// ops: vector values (typed arrays stored as hash-store values) and the
// operations on them: elementwise UPDATE, REDUCE, FILTER. Pure functions on
// bytes; the server's engine (hash/service.cc) applies them on a key's
// owner thread and the client reduces locally with the same code.
//
// A vector value is a VectorHeader followed by `count` elements of its
// type, little-endian, packed, nothing after (docs/PROTOCOL.md, "Vector
// values"). A scalar operand is 8 bytes: an int64 for int64/int32 vectors,
// an IEEE double for double/float vectors.
//
// Integer arithmetic that leaves the element type's range is OutOfRange and
// changes nothing (the whole update is computed before it is kept).
//
// Thread contract: pure functions.

#ifndef REMEM_OPS_VECTOR_H_
#define REMEM_OPS_VECTOR_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "remem/ops.h"
#include "remem/status.h"

namespace remem::ops {

inline constexpr uint32_t kVectorMagic = 0x43455652;  // "RVEC"
inline constexpr uint8_t kVectorLayout = 1;

struct VectorHeader {
  uint32_t magic;  // kVectorMagic
  uint8_t type;    // ElemType
  uint8_t layout;  // kVectorLayout
  uint16_t reserved;
  uint64_t count;  // elements that follow
};
static_assert(sizeof(VectorHeader) == 16);
static_assert(offsetof(VectorHeader, count) == 8);

// Bytes of one element; 0 for an unknown type.
size_t ElemSize(ElemType t);
// "int64", "double", "float", "int32" ("?" for an unknown type).
const char* ElemTypeName(ElemType t);
bool IsIntegerType(ElemType t);
// Whether a double rounds to a float that is not an infinity it was not
// (NaN and the infinities are floats): below float's largest value plus
// half its last place, so that 3.4028235e+38, the shortest text of the
// largest float (what `remem vec get` prints), is taken as that float.
inline bool FitsFloat(double d) {
  constexpr double kRoundsToInfinity = 0x1.fffffep127 + 0x1p103;
  return !std::isfinite(d) || std::fabs(d) < kRoundsToInfinity;
}

struct VectorView {
  ElemType type = ElemType::kInt64;
  uint64_t count = 0;
  const uint8_t* elems = nullptr;  // count * ElemSize(type) bytes
};
// InvalidArgument ("not a vector ...") unless `value` is a well-formed
// vector: magic, layout, known type, length = 16 + count * element size.
Result<VectorView> ParseVector(std::string_view value);
// A vector value of `count` elements copied from `elems`.
std::string MakeVector(ElemType type, uint64_t count, const void* elems);

// element = fn(element, operand) for every element; `operand` is a scalar
// (8 bytes) or a vector of the same type and count. Min and max of double
// and float elements are NaN if either side is (NaN propagates). On error
// `*value` is unchanged.
Status UpdateVector(std::string* value, VecFn fn, std::string_view operand);
// A one-element vector: int64 (sum, min, max of integer vectors; count) or
// double (sum, min, max of double/float vectors; min and max are NaN if an
// element is, as UpdateVector's). Min/max of an empty vector is
// InvalidArgument; an integer sum beyond int64 is OutOfRange.
Result<std::string> ReduceVector(std::string_view value, Reduction r);
// A vector of the elements `e` with `e pred operand` (same type), or with
// `indices`, an int64 vector of their positions.
Result<std::string> FilterVector(std::string_view value, Predicate p,
                                 std::string_view operand, bool indices);

// 8-byte little-endian helpers.
std::string EncodeI64(int64_t v);
std::string EncodeF64(double v);
int64_t LoadI64(const void* p);
double LoadF64(const void* p);

}  // namespace remem::ops

#endif  // REMEM_OPS_VECTOR_H_
