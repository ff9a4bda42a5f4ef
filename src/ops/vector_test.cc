#include "ops/vector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace remem::ops {
namespace {

template <typename T>
std::string Vec(ElemType t, std::vector<T> v) {
  return MakeVector(t, v.size(), v.data());
}

template <typename T>
std::vector<T> Elems(const std::string& value) {
  auto v = ParseVector(value);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  std::vector<T> out(v->count);
  std::memcpy(out.data(), v->elems, v->count * sizeof(T));
  return out;
}

int64_t Int1(const Result<std::string>& r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  auto v = ParseVector(*r);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v->type, ElemType::kInt64);
  return LoadI64(v->elems);
}
double Real1(const Result<std::string>& r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  auto v = ParseVector(*r);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(v->type, ElemType::kDouble);
  return LoadF64(v->elems);
}

TEST(VectorTest, HeaderIsSixteenBytesAndTheLengthMustMatchTheCount) {
  std::string v = Vec<int64_t>(ElemType::kInt64, {1, 2, 3});
  EXPECT_EQ(v.size(), 16u + 24u);
  EXPECT_TRUE(ParseVector(v).ok());
  EXPECT_FALSE(ParseVector(v.substr(0, v.size() - 1)).ok());
  EXPECT_FALSE(ParseVector(v + "x").ok());
  EXPECT_FALSE(ParseVector("12345678").ok());
  std::string huge = v;
  const uint64_t count = ~uint64_t{0} / 4;
  std::memcpy(huge.data() + 8, &count, 8);
  EXPECT_FALSE(ParseVector(huge).ok());
  std::string bad_type = v;
  bad_type[4] = 9;
  EXPECT_EQ(ParseVector(bad_type).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(VectorTest, ScalarAndVectorUpdatesOfEveryFunction) {
  std::string v = Vec<int64_t>(ElemType::kInt64, {1, -2, 3});
  ASSERT_TRUE(UpdateVector(&v, VecFn::kAdd, EncodeI64(10)).ok());
  EXPECT_EQ(Elems<int64_t>(v), (std::vector<int64_t>{11, 8, 13}));
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMul, EncodeI64(-2)).ok());
  EXPECT_EQ(Elems<int64_t>(v), (std::vector<int64_t>{-22, -16, -26}));
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMax, EncodeI64(-20)).ok());
  EXPECT_EQ(Elems<int64_t>(v), (std::vector<int64_t>{-20, -16, -20}));
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMin, EncodeI64(-18)).ok());
  EXPECT_EQ(Elems<int64_t>(v), (std::vector<int64_t>{-20, -18, -20}));
  ASSERT_TRUE(
      UpdateVector(&v, VecFn::kSet, Vec<int64_t>(ElemType::kInt64, {7, 8, 9}))
          .ok());
  EXPECT_EQ(Elems<int64_t>(v), (std::vector<int64_t>{7, 8, 9}));

  std::string f = Vec<float>(ElemType::kFloat, {1.5f, 2.5f});
  ASSERT_TRUE(UpdateVector(&f, VecFn::kMul, EncodeF64(2.0)).ok());
  EXPECT_EQ(Elems<float>(f), (std::vector<float>{3.0f, 5.0f}));
  std::string d = Vec<double>(ElemType::kDouble, {1.0, 2.0});
  ASSERT_TRUE(
      UpdateVector(&d, VecFn::kAdd, Vec<double>(ElemType::kDouble, {0.5, 0.25}))
          .ok());
  EXPECT_EQ(Elems<double>(d), (std::vector<double>{1.5, 2.25}));
}

TEST(VectorTest, IntegerOverflowIsOutOfRangeAndChangesNothing) {
  std::string v =
      Vec<int32_t>(ElemType::kInt32, {1, std::numeric_limits<int32_t>::max()});
  const std::string before = v;
  Status st = UpdateVector(&v, VecFn::kAdd, EncodeI64(1));
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_EQ(v, before);
  EXPECT_EQ(UpdateVector(&v, VecFn::kSet, EncodeI64(int64_t{1} << 40)).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(v, before);
  // min and max too: a result past int32's range is refused, not stored
  // cut to 32 bits (max 3000000000 stored -1294967296, found black-box).
  for (const auto& [fn, operand] :
       {std::pair{VecFn::kMax, int64_t{3000000000}},
        std::pair{VecFn::kMin, int64_t{-3000000000}}}) {
    st = UpdateVector(&v, fn, EncodeI64(operand));
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
    EXPECT_EQ(v, before);
  }
  // An operand past the range that is not the result changes nothing.
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMax, EncodeI64(-3000000000)).ok());
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMin, EncodeI64(3000000000)).ok());
  EXPECT_EQ(v, before);
  ASSERT_TRUE(UpdateVector(&v, VecFn::kMax, EncodeI64(7)).ok());
  EXPECT_EQ(Elems<int32_t>(v),
            (std::vector<int32_t>{7, std::numeric_limits<int32_t>::max()}));
  std::string w =
      Vec<int64_t>(ElemType::kInt64, {std::numeric_limits<int64_t>::max(), 1});
  EXPECT_EQ(ReduceVector(w, Reduction::kSum).status().code(),
            StatusCode::kOutOfRange);
}

// A float vector's scalar operand must fit a float, as its elements must
// when written (an update of set 1e39 stored inf, silently); NaN and the
// infinities are floats, and a result past float's range is IEEE's inf.
TEST(VectorTest, AFloatOperandPastFloatsRangeIsRefusedAndChangesNothing) {
  std::string f = Vec<float>(ElemType::kFloat, {1.0f, 2.0f});
  const std::string before = f;
  for (VecFn fn : {VecFn::kSet, VecFn::kMul, VecFn::kAdd, VecFn::kMin}) {
    Status st = UpdateVector(&f, fn, EncodeF64(1e39));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("does not fit a float"), std::string::npos);
    EXPECT_EQ(UpdateVector(&f, fn, EncodeF64(-1e39)).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(f, before);
  }
  ASSERT_TRUE(UpdateVector(&f, VecFn::kMul, EncodeF64(3e38)).ok());
  EXPECT_EQ(Elems<float>(f)[0], 3e38f);
  EXPECT_TRUE(std::isinf(Elems<float>(f)[1]));  // 6e38: past float's range
  ASSERT_TRUE(UpdateVector(&f, VecFn::kSet,
                           EncodeF64(std::numeric_limits<double>::infinity()))
                  .ok());
  // The text float's largest value prints as, 3.4028235e+38, is a double
  // a little above it that rounds to it: taken as that float, by an update
  // and by a filter; a double that rounds to infinity is refused.
  EXPECT_TRUE(FitsFloat(3.4028235e+38));
  EXPECT_FALSE(FitsFloat(3.4028236e+38));
  EXPECT_TRUE(FitsFloat(-3.4028235e+38));
  std::string m = Vec<float>(ElemType::kFloat, {1.0f});
  ASSERT_TRUE(UpdateVector(&m, VecFn::kMax, EncodeF64(3.4028235e+38)).ok());
  EXPECT_EQ(Elems<float>(m)[0], std::numeric_limits<float>::max());
  auto found = FilterVector(m, Predicate::kEq, EncodeF64(3.4028235e+38),
                            /*indices=*/true);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(Elems<int64_t>(*found), (std::vector<int64_t>{0}));
  EXPECT_EQ(UpdateVector(&m, VecFn::kSet, EncodeF64(3.4028236e+38)).code(),
            StatusCode::kInvalidArgument);
  // A double vector takes any double.
  std::string d = Vec<double>(ElemType::kDouble, {1.0});
  ASSERT_TRUE(UpdateVector(&d, VecFn::kSet, EncodeF64(1e39)).ok());
  EXPECT_EQ(Elems<double>(d), (std::vector<double>{1e39}));
}

TEST(VectorTest, MismatchedOperandVectorIsRefused) {
  std::string v = Vec<int64_t>(ElemType::kInt64, {1, 2});
  const std::string before = v;
  EXPECT_EQ(
      UpdateVector(&v, VecFn::kAdd, Vec<int64_t>(ElemType::kInt64, {1, 2, 3}))
          .code(),
      StatusCode::kInvalidArgument);
  // The same length, another type: the message names both types.
  const Status st =
      UpdateVector(&v, VecFn::kAdd, Vec<int32_t>(ElemType::kInt32, {1, 2}));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(ElemTypeName(ElemType::kInt32)),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(ElemTypeName(ElemType::kInt64)),
            std::string::npos)
      << st.message();
  EXPECT_EQ(v, before);
}

TEST(VectorTest, ReductionsOfEveryType) {
  std::string v = Vec<int32_t>(ElemType::kInt32, {4, -1, 7});
  EXPECT_EQ(Int1(ReduceVector(v, Reduction::kSum)), 10);
  EXPECT_EQ(Int1(ReduceVector(v, Reduction::kMin)), -1);
  EXPECT_EQ(Int1(ReduceVector(v, Reduction::kMax)), 7);
  EXPECT_EQ(Int1(ReduceVector(v, Reduction::kCount)), 3);
  std::string d = Vec<double>(ElemType::kDouble, {0.5, 2.0, -1.5});
  EXPECT_DOUBLE_EQ(Real1(ReduceVector(d, Reduction::kSum)), 1.0);
  EXPECT_DOUBLE_EQ(Real1(ReduceVector(d, Reduction::kMin)), -1.5);
  EXPECT_EQ(Int1(ReduceVector(d, Reduction::kCount)), 3);
  std::string empty = Vec<float>(ElemType::kFloat, {});
  EXPECT_DOUBLE_EQ(Real1(ReduceVector(empty, Reduction::kSum)), 0.0);
  EXPECT_EQ(ReduceVector(empty, Reduction::kMax).status().code(),
            StatusCode::kInvalidArgument);
}

// min and max of double and float vectors are NaN if an element is,
// first, in the middle or last; elementwise min and max are NaN where the
// element or the operand is (numpy's rule; IEEE's fmin and fmax drop NaN).
TEST(VectorTest, NaNPropagatesThroughMinAndMaxWhereverItIs) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const float nanf = std::numeric_limits<float>::quiet_NaN();
  for (const auto& d : std::vector<std::vector<double>>{
           {nan, 1, 2}, {1, nan, 2}, {1, 2, nan}, {2, nan, 1}}) {
    for (Reduction r : {Reduction::kMin, Reduction::kMax, Reduction::kSum}) {
      EXPECT_TRUE(std::isnan(Real1(ReduceVector(Vec(ElemType::kDouble, d), r))))
          << int(r) << " of double " << d[0] << " " << d[1] << " " << d[2];
      const std::vector<float> f(d.begin(), d.end());
      EXPECT_TRUE(std::isnan(Real1(ReduceVector(Vec(ElemType::kFloat, f), r))))
          << int(r) << " of float " << d[0] << " " << d[1] << " " << d[2];
    }
  }
  EXPECT_EQ(Real1(ReduceVector(Vec<double>(ElemType::kDouble, {2, -1, 3}),
                               Reduction::kMin)),
            -1.0);
  EXPECT_EQ(Real1(ReduceVector(Vec<float>(ElemType::kFloat, {2, -1, 3}),
                               Reduction::kMax)),
            3.0);
  for (VecFn fn : {VecFn::kMin, VecFn::kMax}) {
    // A NaN element stays NaN; a NaN operand makes every element NaN.
    std::string v = Vec<double>(ElemType::kDouble, {nan, 1, 5});
    ASSERT_TRUE(UpdateVector(&v, fn, EncodeF64(3)).ok());
    std::vector<double> got = Elems<double>(v);
    EXPECT_TRUE(std::isnan(got[0])) << int(fn);
    EXPECT_EQ(got[1], fn == VecFn::kMin ? 1.0 : 3.0);
    EXPECT_EQ(got[2], fn == VecFn::kMin ? 3.0 : 5.0);
    ASSERT_TRUE(UpdateVector(&v, fn, EncodeF64(nan)).ok());
    for (double x : Elems<double>(v)) EXPECT_TRUE(std::isnan(x)) << int(fn);
    std::string f = Vec<float>(ElemType::kFloat, {1, nanf, 5});
    ASSERT_TRUE(UpdateVector(&f, fn, EncodeF64(nan)).ok());
    for (float x : Elems<float>(f)) EXPECT_TRUE(std::isnan(x)) << int(fn);
    // An operand vector: NaN where either side is.
    f = Vec<float>(ElemType::kFloat, {1, nanf, 5});
    ASSERT_TRUE(
        UpdateVector(&f, fn, Vec<float>(ElemType::kFloat, {nanf, 2, 4})).ok());
    std::vector<float> fs = Elems<float>(f);
    EXPECT_TRUE(std::isnan(fs[0])) << int(fn);
    EXPECT_TRUE(std::isnan(fs[1])) << int(fn);
    EXPECT_EQ(fs[2], fn == VecFn::kMin ? 4.0f : 5.0f);
  }
}

TEST(VectorTest, FilterReturnsElementsOrIndices) {
  std::string v = Vec<int64_t>(ElemType::kInt64, {5, 1, 9, 5, 0});
  auto ge = FilterVector(v, Predicate::kGe, EncodeI64(5), false);
  ASSERT_TRUE(ge.ok());
  EXPECT_EQ(Elems<int64_t>(*ge), (std::vector<int64_t>{5, 9, 5}));
  auto eq = FilterVector(v, Predicate::kEq, EncodeI64(5), true);
  ASSERT_TRUE(eq.ok());
  EXPECT_EQ(Elems<int64_t>(*eq), (std::vector<int64_t>{0, 3}));
  std::string f = Vec<float>(ElemType::kFloat, {0.5f, 1.5f});
  auto lt = FilterVector(f, Predicate::kLt, EncodeF64(1.0), false);
  ASSERT_TRUE(lt.ok());
  EXPECT_EQ(Elems<float>(*lt), (std::vector<float>{0.5f}));
  EXPECT_EQ(FilterVector(v, Predicate(9), EncodeI64(0), false).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(VectorTest, AScalarIsNotAVector) {
  std::string v = EncodeI64(5);
  EXPECT_EQ(UpdateVector(&v, VecFn::kAdd, EncodeI64(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ReduceVector(v, Reduction::kSum).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace remem::ops
