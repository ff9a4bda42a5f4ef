// Two hosts: network namespaces joined by a veth pair, remem-server in one,
// clients in the other, over UCX tcp. The test creates and removes the
// namespaces; it skips (with the reason) where that is not permitted.
// Addresses are from 198.18.0.0/15 (the benchmarking range), inside the
// namespaces only.

#include <gtest/gtest.h>
#include <unistd.h>

#include "test_util.h"

namespace remem {
namespace {

using testing::BenchBinary;
using testing::CliBinary;
using testing::RunCommand;
using testing::ServerBinary;

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

class Netns : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(getpid() % 100000);
    a_ = "remem-a-" + id;
    b_ = "remem-b-" + id;
    veth_a_ = "rma" + id;
    veth_b_ = "rmb" + id;
    if (Sh("ip netns add " + a_ + " 2>/dev/null") != 0) {
      GTEST_SKIP() << "cannot create network namespaces here (needs root and "
                      "iproute2)";
    }
    created_ = true;
    ASSERT_EQ(Sh("ip netns add " + b_), 0);
    ASSERT_EQ(Sh("ip link add " + veth_a_ + " type veth peer name " + veth_b_),
              0);
    ASSERT_EQ(Sh("ip link set " + veth_a_ + " netns " + a_), 0);
    ASSERT_EQ(Sh("ip link set " + veth_b_ + " netns " + b_), 0);
    ASSERT_EQ(Sh("ip -n " + a_ + " addr add 198.18.0.1/30 dev " + veth_a_), 0);
    ASSERT_EQ(Sh("ip -n " + b_ + " addr add 198.18.0.2/30 dev " + veth_b_), 0);
    for (const auto& [ns, dev] :
         {std::pair{a_, veth_a_}, std::pair{b_, veth_b_}}) {
      ASSERT_EQ(Sh("ip -n " + ns + " link set " + dev + " up"), 0);
      ASSERT_EQ(Sh("ip -n " + ns + " link set lo up"), 0);
    }
  }
  void TearDown() override {
    if (!created_) return;
    Sh("ip netns del " + a_ + " 2>/dev/null");
    Sh("ip netns del " + b_ + " 2>/dev/null");
  }
  std::string a_, b_, veth_a_, veth_b_;
  bool created_ = false;
};

TEST_F(Netns, ServerAndClientOnTwoHostsOverTcp) {
  testing::ServerOptions so;
  so.binary = ServerBinary();
  so.command_prefix = {"ip", "netns", "exec", a_};
  so.listen = "198.18.0.1:0";
  so.transport = Transport::kTcp;
  // Namespaces on one host would still pick shared memory, and an extra
  // interface confuses wireup: pin UCX to the veth.
  so.env = {{"UCX_NET_DEVICES", veth_a_}};
  auto server = testing::ServerProcess::Start(so);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = server->address;
  EXPECT_EQ(address.rfind("198.18.0.1:", 0), 0u) << address;

  const std::vector<std::pair<std::string, std::string>> env = {
      {"UCX_NET_DEVICES", veth_b_}};
  auto ping =
      RunCommand({"ip", "netns", "exec", b_, CliBinary(), "--server", address,
                  "--transport", "tcp", "--json", "ping", "-c", "5"},
                 env);
  ASSERT_EQ(ping.exit_code, 0) << ping.out;
  EXPECT_NE(ping.out.find("tcp:" + veth_b_), std::string::npos) << ping.out;

  // One-sided writes verified by reads, gets, puts, atomics and RPCs from
  // the other host.
  if (BenchBinary().empty()) return;  // built without remem-bench
  auto bench =
      RunCommand({"ip", "netns", "exec", b_, BenchBinary(), "fabric",
                  "--server", address, "--transport", "tcp", "--duration",
                  "0.2", "--client-cpu", "-1", "--span", "8M"},
                 env);
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  EXPECT_NE(bench.out.find("wrote and verified"), std::string::npos)
      << bench.out;

  // A shm-only client cannot reach a server on another host.
  auto shm =
      RunCommand({"ip", "netns", "exec", b_, CliBinary(), "--server", address,
                  "--transport", "shm", "--timeout", "10", "ping"},
                 env);
  EXPECT_NE(shm.exit_code, 0) << shm.out;
}

}  // namespace
}  // namespace remem
