#include "proto/codec.h"

#include <gtest/gtest.h>

#include <cstring>

namespace remem::proto {
namespace {

TEST(Codec, HeaderRoundTripAndValidation) {
  RpcHeader h = MakeHeader(Opcode::kEcho, 42, 5, false);
  auto ok = DecodeHeader(&h, sizeof(h), 5);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->request_id, 42u);

  EXPECT_FALSE(DecodeHeader(&h, sizeof(h) - 1, 5).ok());
  EXPECT_FALSE(DecodeHeader(&h, sizeof(h), 6).ok());  // length mismatch
  RpcHeader bad = h;
  bad.magic ^= 1;
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  bad = h;
  bad.version = 99;
  auto v = DecodeHeader(&bad, sizeof(bad), 5);
  EXPECT_EQ(v.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(v.status().message().find("version"), std::string::npos);
  bad = h;
  bad.opcode = 0;
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  bad = h;
  bad.flags = 0x80;
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  EXPECT_FALSE(DecodeHeader(nullptr, 0, 0).ok());
}

TEST(Codec, HelloRequest) {
  Hello in;
  in.secret = std::string("a\0b", 3);
  auto out = DecodeHelloRequest(EncodeHelloRequest(in));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->secret, in.secret);
  std::string enc = EncodeHelloRequest(in);
  EXPECT_FALSE(DecodeHelloRequest(enc.substr(0, enc.size() - 1)).ok());
  EXPECT_FALSE(DecodeHelloRequest(enc + "x").ok());
  EXPECT_FALSE(DecodeHelloRequest("").ok());
  Hello big;
  big.secret.assign(kMaxSecretBytes + 1, 's');
  EXPECT_FALSE(DecodeHelloRequest(EncodeHelloRequest(big)).ok());
}

TEST(Codec, HelloReplyWithRegions) {
  HelloReplyInfo in;
  in.incarnation = 7;
  in.max_payload = 1 << 20;
  in.server_threads = 2;
  in.regions.push_back({1, 0x1000, 4096, "rkey-one"});
  in.regions.push_back({2, 0x9000, 8192, std::string(13, 'k')});
  std::string enc = EncodeHelloReply(in);
  EXPECT_EQ(enc.size() % 8, 0u);
  auto out = DecodeHelloReply(enc);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->regions.size(), 2u);
  EXPECT_EQ(out->regions[1].rkey, std::string(13, 'k'));
  EXPECT_EQ(out->regions[0].base, 0x1000u);
  // Every truncation is refused.
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_FALSE(DecodeHelloReply(enc.substr(0, n)).ok()) << n;
  }
  // Duplicate region ids are refused.
  in.regions[1].region_id = 1;
  EXPECT_FALSE(DecodeHelloReply(EncodeHelloReply(in)).ok());
  // A region that wraps the address space is refused.
  in.regions[1].region_id = 2;
  in.regions[1].base = ~uint64_t{0} - 10;
  EXPECT_FALSE(DecodeHelloReply(EncodeHelloReply(in)).ok());
}

TEST(Codec, StatsReply) {
  StatsReply s{};
  s.rpcs_served = 99;
  s.mem_requests_served = 12;
  auto out = DecodeStatsReply(EncodeStatsReply(s));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->rpcs_served, 99u);
  EXPECT_EQ(out->mem_requests_served, 12u);
  EXPECT_FALSE(DecodeStatsReply("short").ok());
  s.log_bytes = 7;
  s.fsync_policy = 3;
  out = DecodeStatsReply(EncodeStatsReply(s));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->log_bytes, 7u);
  EXPECT_EQ(out->fsync_policy, 3u);
  // Any other size is refused.
  EXPECT_FALSE(
      DecodeStatsReply(EncodeStatsReply(s).substr(0, sizeof(StatsReply) - 8))
          .ok());
}

TEST(Codec, HashMultiGetPutAndReply) {
  const std::string keys_store[] = {"a", std::string(300, 'k'), "z"};
  std::vector<std::string_view> keys(std::begin(keys_store),
                                     std::end(keys_store));
  const std::string get = EncodeHashMultiGet(keys);
  auto got = DecodeHashMultiGet(get);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, keys);
  // Every truncation is refused, never read past.
  for (size_t n = 0; n < get.size(); ++n) {
    EXPECT_FALSE(DecodeHashMultiGet(get.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeHashMultiGet(get + "x").ok());
  EXPECT_FALSE(DecodeHashMultiGet(EncodeHashMultiGet({})).ok());

  std::vector<KeyValue> pairs = {{"k1", "v1"}, {"k2", ""}};
  const std::string put = EncodeHashMultiPut(pairs);
  auto decoded = DecodeHashMultiPut(put);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, pairs);
  for (size_t n = 0; n < put.size(); ++n) {
    EXPECT_FALSE(DecodeHashMultiPut(put.substr(0, n)).ok()) << n;
  }

  std::vector<MultiItem> items(2);
  items[0].version = 9;
  items[0].data = "value";
  items[1].status = Status::NotFound("key not found");
  const std::string reply = EncodeHashMultiReply(items);
  auto back = DecodeHashMultiReply(reply, 2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)[0].data, "value");
  EXPECT_EQ((*back)[0].version, 9u);
  EXPECT_EQ((*back)[1].status.code(), StatusCode::kNotFound);
  EXPECT_EQ((*back)[1].status.message(), "key not found");
  EXPECT_FALSE(DecodeHashMultiReply(reply, 3).ok());  // not what was asked
  for (size_t n = 0; n < reply.size(); ++n) {
    EXPECT_FALSE(DecodeHashMultiReply(reply.substr(0, n), 2).ok()) << n;
  }
  // A count far beyond the bytes is refused before anything is allocated.
  std::string huge = reply.substr(0, 8);
  const uint32_t big = 0xffffff;
  std::memcpy(huge.data(), &big, 4);
  EXPECT_FALSE(DecodeHashMultiReply(huge, big).ok());
}

std::string Bytes(const MemRequest& r) {
  return std::string(reinterpret_cast<const char*>(&r), sizeof(r));
}

TEST(Codec, MemRequestValidation) {
  MemRequest read = MakeMemRequest(MemOp::kRead, 3, 77, 4096, 64);
  auto ok = DecodeMemRequest(Bytes(read), 0);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->request_id, 77u);
  EXPECT_EQ(ok->region, 3u);
  EXPECT_EQ(ok->offset, 4096u);
  // A read carries no data; a write carries exactly `length` bytes.
  EXPECT_FALSE(DecodeMemRequest(Bytes(read), 1).ok());
  MemRequest write = MakeMemRequest(MemOp::kWrite, 3, 1, 0, 10);
  EXPECT_TRUE(DecodeMemRequest(Bytes(write), 10).ok());
  EXPECT_FALSE(DecodeMemRequest(Bytes(write), 9).ok());
  // Atomics are 8 bytes.
  MemRequest cas = MakeMemRequest(MemOp::kCompareSwap, 3, 1, 8, 8, 1, 2);
  auto c = DecodeMemRequest(Bytes(cas), 0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->operand, 1u);
  EXPECT_EQ(c->operand2, 2u);
  EXPECT_FALSE(
      DecodeMemRequest(Bytes(MakeMemRequest(MemOp::kFetchAdd, 3, 1, 8, 4)), 0)
          .ok());
  // Oversized transfers, unknown ops, bad magic/version, reserved bits,
  // wrong header size.
  EXPECT_FALSE(
      DecodeMemRequest(
          Bytes(MakeMemRequest(MemOp::kRead, 3, 1, 0, kMaxMemTransfer + 1)), 0)
          .ok());
  MemRequest bad = read;
  bad.op = kMaxMemOp + 1;
  EXPECT_FALSE(DecodeMemRequest(Bytes(bad), 0).ok());
  bad = read;
  bad.magic ^= 1;
  EXPECT_FALSE(DecodeMemRequest(Bytes(bad), 0).ok());
  bad = read;
  bad.version = 1;
  EXPECT_FALSE(DecodeMemRequest(Bytes(bad), 0).ok());
  bad = read;
  bad.reserved2 = 1;
  EXPECT_FALSE(DecodeMemRequest(Bytes(bad), 0).ok());
  EXPECT_FALSE(DecodeMemRequest(Bytes(read).substr(1), 0).ok());
}

TEST(Codec, MemReply) {
  MemReply r = MakeMemReply(MemOp::kFetchAdd, 5, StatusCode::kOk, 41);
  std::string b(reinterpret_cast<const char*>(&r), sizeof(r));
  auto out = DecodeMemReply(b);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->request_id, 5u);
  EXPECT_EQ(out->value, 41u);
  EXPECT_EQ(out->op, uint8_t(MemOp::kFetchAdd));
  EXPECT_FALSE(DecodeMemReply(b.substr(0, 31)).ok());
  r.op = 0;
  EXPECT_FALSE(
      DecodeMemReply(std::string(reinterpret_cast<const char*>(&r), sizeof(r)))
          .ok());
}

}  // namespace
}  // namespace remem::proto
