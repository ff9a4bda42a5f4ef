// remem-bench compare's curve (tools/bench_curve): --depth/--batch lists,
// the depth x batch points, and each system's best point and the ratio of
// bests that heads the summary.

#include "bench_curve.h"

#include <gtest/gtest.h>

#include <vector>

namespace remem::bench {
namespace {

TEST(BenchCurve, ParsesOneValueOrAList) {
  auto one = ParseCountList("16", 1, 4096, "--depth");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one, std::vector<int>{16});
  auto many = ParseCountList("1,4,16,64", 1, 4096, "--depth");
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  EXPECT_EQ(*many, (std::vector<int>{1, 4, 16, 64}));
  // The order given is the order run.
  EXPECT_EQ(*ParseCountList("16,1", 1, 4096, "--batch"),
            (std::vector<int>{16, 1}));
}

TEST(BenchCurve, RejectsBadLists) {
  for (const char* text : {"", ",", "1,", ",1", "1,,4", "x", "1,x", "4k", "-1",
                           "0", "4097", "1,4,1", " 1", "99999999999"}) {
    auto r = ParseCountList(text, 1, 4096, "--depth");
    EXPECT_FALSE(r.ok()) << "'" << text << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("--depth"), std::string::npos);
    }
  }
}

TEST(BenchCurve, ExpandsDepthMajor) {
  const std::vector<CurvePoint> want = {{1, 1}, {1, 16}, {4, 1}, {4, 16}};
  EXPECT_EQ(ExpandPoints({1, 4}, {1, 16}), want);
  EXPECT_EQ(ExpandPoints({8}, {1}), (std::vector<CurvePoint>{{8, 1}}));
  EXPECT_TRUE(ExpandPoints({}, {1}).empty());
  const std::vector<int> d(std::begin(kCurveDepths), std::end(kCurveDepths));
  const std::vector<int> b(std::begin(kCurveBatches), std::end(kCurveBatches));
  auto curve = ExpandPoints(d, b);
  ASSERT_EQ(curve.size(), 8u);
  EXPECT_EQ(curve.front(), (CurvePoint{1, 1}));
  EXPECT_EQ(curve.back(), (CurvePoint{64, 16}));
  EXPECT_EQ(curve.back().in_flight(), 1024);
}

std::vector<CurveSample> Samples() {
  return {
      {"remem", {1, 1}, 1.5e6, true},   {"remem", {16, 1}, 1.4e6, true},
      {"remem", {1, 16}, 2.1e6, true},  {"remem", {64, 16}, 9e6, false},
      {"redis", {1, 1}, 28e3, true},    {"redis", {16, 1}, 290e3, true},
      {"redis", {16, 16}, 640e3, true}, {"memcached", {1, 1}, 0, false},
  };
}

TEST(BenchCurve, BestIsTheFastestSuccessfulPoint) {
  auto s = Samples();
  // remem's (64,16) failed: never its best, however fast it looked.
  ASSERT_TRUE(BestSample(s, "remem"));
  EXPECT_EQ(s[*BestSample(s, "remem")].point, (CurvePoint{1, 16}));
  ASSERT_TRUE(BestSample(s, "redis"));
  EXPECT_EQ(s[*BestSample(s, "redis")].point, (CurvePoint{16, 16}));
  EXPECT_FALSE(BestSample(s, "memcached"));
  EXPECT_FALSE(BestSample(s, "nobody"));
}

TEST(BenchCurve, EqualThroughputPrefersFewerInFlight) {
  std::vector<CurveSample> s = {{"x", {16, 1}, 100, true},
                                {"x", {4, 1}, 100, true},
                                {"x", {1, 16}, 100, true}};
  EXPECT_EQ(BestSample(s, "x"), 1u);
}

TEST(BenchCurve, RatioIsBestOverBestEachAtItsOwnPoint) {
  auto s = Samples();
  auto r = BestRatio(s, "remem", "redis");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(*r, 2.1e6 / 640e3);
  EXPECT_FALSE(BestRatio(s, "remem", "memcached"));  // no successful run
  EXPECT_FALSE(BestRatio(s, "memcached", "redis"));
  s.push_back({"zero", {1, 1}, 0, true});
  EXPECT_FALSE(BestRatio(s, "remem", "zero"));  // no division by zero
}

TEST(BenchCurve, SampleAtFindsTheLatencyRow) {
  auto s = Samples();
  EXPECT_EQ(SampleAt(s, "redis", {1, 1}), 4u);
  EXPECT_FALSE(SampleAt(s, "redis", {4, 1}));
  EXPECT_FALSE(SampleAt(s, "remem", {64, 16}));  // failed
  EXPECT_FALSE(SampleAt(s, "memcached", {1, 1}));
}

}  // namespace
}  // namespace remem::bench
