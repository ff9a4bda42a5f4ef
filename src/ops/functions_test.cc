#include "ops/functions.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "ops/vector.h"

namespace remem::ops {
namespace {

TEST(FunctionsTest, TheExampleLibraryRegistersItsFunctions) {
  FunctionTable t;
  ASSERT_TRUE(t.Load(REMEM_EXAMPLE_OPS_LIB).ok());
  EXPECT_EQ(t.size(), 5u);  // 3 update functions, 2 reductions
  const UserFunction* mul = t.Find(100);
  ASSERT_NE(mul, nullptr);
  EXPECT_EQ(mul->name, "int64_mul");
  EXPECT_EQ(t.Find(7), nullptr);
  EXPECT_EQ(t.Find(200), nullptr);
  const UserReduction* l2 = t.FindReduction(201);
  ASSERT_NE(l2, nullptr);
  EXPECT_EQ(l2->name, "l2_norm");
  EXPECT_EQ(l2->elem_types, REMEM_OPS_TYPE_BIT(REMEM_OPS_DOUBLE) |
                                REMEM_OPS_TYPE_BIT(REMEM_OPS_FLOAT));
  EXPECT_EQ(t.FindReduction(100), nullptr);
  EXPECT_EQ(t.Describe(),
            (std::vector<std::string>{"100:int64_mul", "101:bounded_add",
                                      "102:keep_if_longer",
                                      "200:sum_of_squares", "201:l2_norm"}));

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
  // An empty path is refused as such (dlopen("") is the program itself).
  st = t.Load("");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs a library's path"), std::string::npos)
      << st.ToString();

  // A bare name is a file in the current directory, never one found on
  // the library path (libc.so.6 is there; before, it was loaded and then
  // refused for its missing entry point).
  st = t.Load("libc.so.6");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot be loaded"), std::string::npos)
      << st.ToString();
  {
    const std::filesystem::path dir =
        std::filesystem::path(::testing::TempDir()) / "remem-ops-cwd";
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(
        REMEM_EXAMPLE_OPS_LIB, dir / "libhere.so",
        std::filesystem::copy_options::overwrite_existing);
    const std::filesystem::path before = std::filesystem::current_path();
    std::filesystem::current_path(dir);
    FunctionTable here;
    st = here.Load("libhere.so");
    std::filesystem::current_path(before);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(here.size(), 5u);
    std::filesystem::remove_all(dir);
  }

  ASSERT_TRUE(t.Load(REMEM_EXAMPLE_OPS_LIB).ok());
  st = t.Load(REMEM_EXAMPLE_OPS_LIB);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("already registered"), std::string::npos);
  EXPECT_EQ(t.size(), 5u);
}

int Twice(int present, const uint8_t* value, size_t value_len, const uint8_t*,
          size_t, uint8_t* out, size_t out_cap, size_t* out_len) {
  if (!present || value_len != 8 || out_cap < 8) return REMEM_OPS_REFUSE;
  const int64_t v = 2 * LoadI64(value);
  std::memcpy(out, &v, 8);
  *out_len = 8;
  return REMEM_OPS_WRITE;
}

int Count(uint32_t, const void*, uint64_t count, remem_ops_number* out) {
  out->type = REMEM_OPS_INT64;
  out->i = int64_t(count);
  return REMEM_OPS_REDUCED;
}

// What a library built against the version 1 header returns: the struct
// without the reduction fields.
struct LibraryV1 {
  uint32_t abi_version;
  uint32_t count;
  const remem_ops_function* functions;
};

TEST(FunctionsTest, AVersion1LibraryStillRegistersItsUpdateFunctions) {
  static const remem_ops_function kFns[] = {{7, "twice", Twice}};
  // On the heap, exactly its size: under ASan a read of the version 2
  // fields would be reported.
  auto v1 = std::make_unique<LibraryV1>(LibraryV1{1, 1, kFns});
  FunctionTable t;
  Status st =
      t.Register(reinterpret_cast<const remem_ops_library*>(v1.get()), "v1");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(t.size(), 1u);
  ASSERT_NE(t.Find(7), nullptr);
  EXPECT_EQ(t.FindReduction(7), nullptr);
  // Its function runs as any other.
  bool present = true;
  std::string value = EncodeI64(21);
  OpView op;
  op.kind = OpKind::kCall;
  op.key = "k";
  op.function_id = 7;
  Outcome o;
  ASSERT_TRUE(Apply(op, 64, &t, &present, &value, &o).ok());
  EXPECT_EQ(LoadI64(value.data()), 42);
  // Versions this server does not know are refused by number.
  v1->abi_version = 3;
  st = t.Register(reinterpret_cast<const remem_ops_library*>(v1.get()), "v3");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ABI version 3"), std::string::npos);
  v1->abi_version = 0;
  EXPECT_FALSE(
      t.Register(reinterpret_cast<const remem_ops_library*>(v1.get()), "v0")
          .ok());
}

TEST(FunctionsTest, ABadReductionRefusesItsWholeLibrary) {
  static const remem_ops_function kFns[] = {{1, "twice", Twice}};
  const uint32_t ints = REMEM_OPS_TYPE_BIT(REMEM_OPS_INT64);
  struct Case {
    remem_ops_reduction r;
    const char* why;
  };
  const Case cases[] = {
      {{0, "zero", ints, Count}, "id 0"},
      {{2, "null", ints, nullptr}, "no function"},
      {{2, "none", REMEM_OPS_TYPE_BIT(9), Count}, "no known element type"},
      {{1, "taken", ints, Count}, "already registered"},
  };
  for (const Case& c : cases) {
    FunctionTable t;
    const remem_ops_library lib{REMEM_OPS_ABI_VERSION, 1, kFns, 1, &c.r};
    Status st = t.Register(&lib, "lib");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.why;
    EXPECT_NE(st.message().find(c.why), std::string::npos) << st.ToString();
    EXPECT_EQ(t.size(), 0u) << c.why;  // the update function neither
  }
  FunctionTable t;
  const remem_ops_reduction ok{2, "count", ints, Count};
  const remem_ops_library lib{REMEM_OPS_ABI_VERSION, 1, kFns, 1, &ok};
  ASSERT_TRUE(t.Register(&lib, "lib").ok());
  // A second library may not reuse a reduction's id for an update function.
  const remem_ops_function clash[] = {{2, "clash", Twice}};
  const remem_ops_library second{REMEM_OPS_ABI_VERSION, 1, clash, 0, nullptr};
  EXPECT_EQ(t.Register(&second, "second").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.size(), 2u);
  // A null list is named for what it is.
  const remem_ops_library no_reductions{REMEM_OPS_ABI_VERSION, 0, nullptr, 2,
                                        nullptr};
  Status st = FunctionTable().Register(&no_reductions, "lib");
  EXPECT_NE(st.message().find("reduction list is null"), std::string::npos)
      << st.ToString();
  const remem_ops_library no_functions{REMEM_OPS_ABI_VERSION, 3, nullptr, 0,
                                       nullptr};
  st = FunctionTable().Register(&no_functions, "lib");
  EXPECT_NE(st.message().find("function list is null"), std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace remem::ops
