#include "ops/apply.h"

#include <gtest/gtest.h>

#include <limits>

#include "ops/vector.h"

namespace remem::ops {
namespace {

OpView Int(OpKind k, std::string_view key, const std::string& arg,
           uint8_t flags = 0, int64_t initial = 0) {
  OpView op;
  op.kind = k;
  op.key = key;
  op.arg = arg;
  op.flags = flags;
  op.initial = initial;
  return op;
}

struct Cell {
  bool present = false;
  std::string value;
  Status Do(const OpView& op, Outcome* out, const FunctionLookup* f = nullptr) {
    return Apply(op, 1024, f, &present, &value, out);
  }
};

TEST(ApplyTest, FetchAddReturnsTheOldValueAndAddFetchTheNew) {
  Cell c{true, EncodeI64(40)};
  const std::string two = EncodeI64(2);
  Outcome o;
  ASSERT_TRUE(c.Do(Int(OpKind::kFetchAdd, "k", two), &o).ok());
  EXPECT_TRUE(o.wrote);
  EXPECT_EQ(LoadI64(o.reply.data()), 40);
  ASSERT_TRUE(c.Do(Int(OpKind::kAddFetch, "k", two), &o).ok());
  EXPECT_EQ(LoadI64(o.reply.data()), 44);
  EXPECT_EQ(LoadI64(c.value.data()), 44);
}

TEST(ApplyTest, AnAbsentKeyIsNotFoundUnlessCreateGivesItsStart) {
  Cell c;
  const std::string five = EncodeI64(5);
  Outcome o;
  EXPECT_EQ(c.Do(Int(OpKind::kFetchAdd, "k", five), &o).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE(c.present);
  ASSERT_TRUE(
      c.Do(Int(OpKind::kFetchAdd, "k", five, kFlagCreate, 100), &o).ok());
  EXPECT_EQ(LoadI64(o.reply.data()), 100);
  EXPECT_TRUE(c.present);
  EXPECT_EQ(LoadI64(c.value.data()), 105);
}

TEST(ApplyTest, OverflowIsOutOfRangeAndLeavesTheValue) {
  Cell c{true, EncodeI64(std::numeric_limits<int64_t>::max() - 1)};
  const std::string before = c.value;
  const std::string two = EncodeI64(2);
  Outcome o;
  Status st = c.Do(Int(OpKind::kAddFetch, "k", two), &o);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.ToString();
  EXPECT_EQ(c.value, before);
  Cell low{true, EncodeI64(std::numeric_limits<int64_t>::min())};
  EXPECT_EQ(low.Do(Int(OpKind::kFetchAdd, "k", EncodeI64(-1)), &o).code(),
            StatusCode::kOutOfRange);
}

TEST(ApplyTest, AnIntegerOpOnANonIntegerValueIsATypeMismatch) {
  Cell c{true, "hello"};
  Outcome o;
  Status st = c.Do(Int(OpKind::kFetchAdd, "k", EncodeI64(1)), &o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("8-byte integer"), std::string::npos);
  EXPECT_EQ(c.value, "hello");
  // A wrong operand size is refused before the value is looked at.
  EXPECT_EQ(c.Do(Int(OpKind::kMin, "k", "abc"), &o).code(),
            StatusCode::kInvalidArgument);
}

TEST(ApplyTest, MinAndMaxWriteOnlyWhenTheValueChanges) {
  Cell c{true, EncodeI64(10)};
  Outcome o;
  ASSERT_TRUE(c.Do(Int(OpKind::kMin, "k", EncodeI64(20)), &o).ok());
  EXPECT_FALSE(o.wrote);
  EXPECT_EQ(LoadI64(o.reply.data()), 10);
  ASSERT_TRUE(c.Do(Int(OpKind::kMax, "k", EncodeI64(20)), &o).ok());
  EXPECT_TRUE(o.wrote);
  EXPECT_EQ(LoadI64(c.value.data()), 20);
}

TEST(ApplyTest, CompareSwapSwapsOnlyOnEqualBytes) {
  Cell c{true, "old"};
  OpView op;
  op.kind = OpKind::kCompareSwap;
  op.key = "k";
  op.expected = "nope";
  op.arg = "new";
  Outcome o;
  ASSERT_TRUE(c.Do(op, &o).ok());
  EXPECT_FALSE(o.applied);
  EXPECT_FALSE(o.wrote);
  EXPECT_EQ(o.reply, "old");
  op.expected = "old";
  ASSERT_TRUE(c.Do(op, &o).ok());
  EXPECT_TRUE(o.applied);
  EXPECT_EQ(o.reply, "old");
  EXPECT_EQ(c.value, "new");
}

TEST(ApplyTest, AppendBeyondTheValueLimitIsRefused) {
  Cell c{true, std::string(1000, 'a')};
  OpView op;
  op.kind = OpKind::kAppend;
  op.key = "k";
  const std::string more(100, 'b');
  op.arg = more;
  Outcome o;
  EXPECT_EQ(c.Do(op, &o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.value.size(), 1000u);
  op.arg = std::string_view(more).substr(0, 24);
  ASSERT_TRUE(c.Do(op, &o).ok());
  EXPECT_EQ(LoadI64(o.reply.data()), 1024);
}

TEST(ApplyTest, AVectorOpOnAScalarAndAnUnknownFunctionAreRefused) {
  Cell c{true, EncodeI64(1)};
  OpView op;
  op.kind = OpKind::kVecReduce;
  op.key = "k";
  op.fn = uint8_t(Reduction::kSum);
  Outcome o;
  EXPECT_EQ(c.Do(op, &o).code(), StatusCode::kInvalidArgument);
  op.kind = OpKind::kCall;
  op.function_id = 77;
  Status st = c.Do(op, &o);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("77"), std::string::npos);
  op.kind = OpKind(42);
  EXPECT_EQ(c.Do(op, &o).code(), StatusCode::kInvalidArgument);
}

// An update function (id 5) that returns its argument's first byte as its
// code, writing "w" (or, for 'x', more bytes than it may).
int ReturnsItsArgument(int, const uint8_t*, size_t, const uint8_t* arg,
                       size_t arg_len, uint8_t* out, size_t out_cap,
                       size_t* out_len) {
  out[0] = 'w';
  *out_len = arg_len > 0 && arg[0] == 'x' ? out_cap + 1 : 1;
  if (arg_len == 0) return REMEM_OPS_WRITE;
  return arg[0] == 'x' ? REMEM_OPS_WRITE : int(int8_t(arg[0]));
}
struct OneFunction : FunctionLookup {
  UserFunction f{5, "returns_its_argument", ReturnsItsArgument};
  const UserFunction* Find(uint32_t id) const override {
    return id == 5 ? &f : nullptr;
  }
  const UserReduction* FindReduction(uint32_t) const override {
    return nullptr;
  }
};

// ops_plugin.h: KEEP on an absent key is NotFound and makes nothing; any
// code but WRITE and KEEP refuses (InvalidArgument); an output past its
// buffer is Internal. None of them writes.
TEST(ApplyTest, AnUpdateFunctionsCodesOtherThanWriteAndKeepRefuse) {
  OneFunction lookup;
  OpView op;
  op.kind = OpKind::kCall;
  op.key = "k";
  op.function_id = 5;
  Outcome o;
  Cell absent;
  const std::string keep(1, char(REMEM_OPS_KEEP));
  op.arg = keep;
  EXPECT_EQ(absent.Do(op, &o, &lookup).code(), StatusCode::kNotFound);
  EXPECT_FALSE(absent.present);
  EXPECT_FALSE(o.wrote);
  Cell c{true, "v"};
  for (int code : {REMEM_OPS_REFUSE, 2, 7, -100, 127}) {
    const std::string arg(1, char(code));
    op.arg = arg;
    Outcome refused;
    Status st = c.Do(op, &refused, &lookup);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << code;
    EXPECT_NE(st.message().find("returns_its_argument (id 5) refused"),
              std::string::npos)
        << st.ToString();
    EXPECT_FALSE(refused.wrote);
    EXPECT_EQ(c.value, "v");
  }
  const std::string past = "x";
  op.arg = past;
  EXPECT_EQ(c.Do(op, &o, &lookup).code(), StatusCode::kInternal);
  EXPECT_EQ(c.value, "v");
  op.arg = keep;
  Outcome kept;
  ASSERT_TRUE(c.Do(op, &kept, &lookup).ok());
  EXPECT_FALSE(kept.wrote);
  EXPECT_EQ(kept.reply, "v");
  op.arg = {};
  Outcome written;
  ASSERT_TRUE(c.Do(op, &written, &lookup).ok());
  EXPECT_TRUE(written.wrote);
  EXPECT_EQ(c.value, "w");
}

// One reduction (id 9, int64 vectors only) that answers the element count,
// refuses more than 3 elements and answers a bad type for exactly 3.
int CountUpTo2(uint32_t type, const void*, uint64_t count,
               remem_ops_number* out) {
  if (type != REMEM_OPS_INT64 || count > 3) return REMEM_OPS_REFUSE;
  out->type = count == 3 ? 77 : REMEM_OPS_INT64;
  out->i = int64_t(count);
  return REMEM_OPS_REDUCED;
}
struct OneReduction : FunctionLookup {
  UserReduction r{9, "count_up_to_2", REMEM_OPS_TYPE_BIT(REMEM_OPS_INT64),
                  CountUpTo2};
  const UserFunction* Find(uint32_t) const override { return nullptr; }
  const UserReduction* FindReduction(uint32_t id) const override {
    return id == 9 ? &r : nullptr;
  }
};

TEST(ApplyTest, AUserReductionIsFoundByIdAndGetsOnlyItsElementTypes) {
  OneReduction lookup;
  const int64_t two[] = {5, 6};
  Cell c{true, MakeVector(ElemType::kInt64, 2, two)};
  OpView op;
  op.kind = OpKind::kVecReduce;
  op.key = "k";
  op.fn = uint8_t(Reduction::kUser);
  op.function_id = 9;
  Outcome o;
  ASSERT_TRUE(c.Do(op, &o, &lookup).ok());
  EXPECT_FALSE(o.wrote);
  auto n = ParseVector(o.reply);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->type, ElemType::kInt64);
  EXPECT_EQ(LoadI64(n->elems), 2);
  // Unknown ids, no table at all, and id 0.
  op.function_id = 8;
  Status st = c.Do(op, &o, &lookup);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("reduction with id 8"), std::string::npos);
  op.function_id = 9;
  EXPECT_EQ(c.Do(op, &o).code(), StatusCode::kUnsupported);
  op.function_id = 0;
  EXPECT_EQ(c.Do(op, &o, &lookup).code(), StatusCode::kInvalidArgument);
  op.function_id = 9;
  // A type the function does not accept: refused before it is called.
  const double reals[] = {1.0};
  Cell d{true, MakeVector(ElemType::kDouble, 1, reals)};
  st = d.Do(op, &o, &lookup);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("does not accept double"), std::string::npos);
  // The function refuses; answers a number of no known type.
  const int64_t four[] = {1, 2, 3, 4};
  Cell e{true, MakeVector(ElemType::kInt64, 4, four)};
  st = e.Do(op, &o, &lookup);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("count_up_to_2 (id 9) refused"),
            std::string::npos);
  // (Refused as ops_plugin.h says, not an internal error.)
  Cell f{true, MakeVector(ElemType::kInt64, 3, four)};
  st = f.Do(op, &o, &lookup);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unknown type"), std::string::npos);
  // Not a vector; absent.
  Cell g{true, EncodeI64(1)};
  EXPECT_EQ(g.Do(op, &o, &lookup).code(), StatusCode::kInvalidArgument);
  Cell h;
  EXPECT_EQ(h.Do(op, &o, &lookup).code(), StatusCode::kNotFound);
  // A call of a reduction's id names what the id is.
  op.kind = OpKind::kCall;
  op.fn = 0;
  st = c.Do(op, &o, &lookup);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("is the reduction count_up_to_2"),
            std::string::npos);
}

}  // namespace
}  // namespace remem::ops
