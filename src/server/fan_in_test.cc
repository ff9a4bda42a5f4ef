#include <gtest/gtest.h>

#include <memory>

#include "server/service.h"

namespace remem::server {
namespace {

// What the hash service's operation requests do: the request owns its
// FanIn, whose `done` holds the request. The last Done frees both (it once
// leaked every request of the operations path, ~1 KiB per batch).
TEST(FanIn, TheLastDoneReleasesWhatItsCallbackHolds) {
  struct Request {
    int replies = 0;
    std::unique_ptr<FanIn> fan;
  };
  auto req = std::make_shared<Request>();
  req->fan = std::make_unique<FanIn>(2, [req] { ++req->replies; });
  std::weak_ptr<Request> alive = req;
  Request* raw = req.get();
  req.reset();  // only the callback holds it now
  raw->fan->Done();
  ASSERT_FALSE(alive.expired());
  EXPECT_EQ(raw->replies, 0);
  raw->fan->Done();  // replies, then frees the request and the FanIn
  EXPECT_TRUE(alive.expired());
}

TEST(FanIn, RunsItsCallbackOnceAfterTheLastOfN) {
  int calls = 0;
  FanIn fan(3, [&calls] { ++calls; });
  fan.Done();
  fan.Done();
  EXPECT_EQ(calls, 0);
  fan.Done();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace remem::server
