#include "ops/functions.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "ops/vector.h"

namespace remem::ops {
namespace {

TEST(FunctionsTest, TheExampleLibraryRegistersItsFunctions) {
  FunctionTable t;
  ASSERT_TRUE(t.Load(REMEM_EXAMPLE_OPS_LIB).ok());
  EXPECT_EQ(t.size(), 3u);
  const UserFunction* mul = t.Find(100);
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->name, "int64_mul");
  EXPECT_EQ(t.Find(7), nullptr);

  bool present = true;
  std::string value = EncodeI64(6);
  const std::string arg = EncodeI64(7);
  OpView op;
  op.kind = OpKind::kCall;
  op.key = "k";
  op.function_id = 100;
  op.arg = arg;
  Outcome o;
  ASSERT_TRUE(Apply(op, 1024, &t, &present, &value, &o).ok());
  EXPECT_EQ(LoadI64(value.data()), 42);
  EXPECT_TRUE(o.wrote);
  // The function refuses an absent key: a clear error, nothing created.
  present = false;
  value.clear();
  Status st = Apply(op, 1024, &t, &present, &value, &o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("int64_mul"), std::string::npos);
  EXPECT_FALSE(present);
}

TEST(FunctionsTest, ALibraryThatCannotLoadOrCollidesIsRefusedByName) {
  FunctionTable t;
  Status st = t.Load("/nonexistent/libnothing.so");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("/nonexistent/libnothing.so"), std::string::npos);
  const std::string text = ::testing::TempDir() + "not_a_library.so";
  std::ofstream(text) << "plain text";
  st = t.Load(text);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot be loaded"), std::string::npos);
  std::remove(text.c_str());

  ASSERT_TRUE(t.Load(REMEM_EXAMPLE_OPS_LIB).ok());
  st = t.Load(REMEM_EXAMPLE_OPS_LIB);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("already registered"), std::string::npos);
  EXPECT_EQ(t.size(), 3u);
}

}  // namespace
}  // namespace remem::ops
