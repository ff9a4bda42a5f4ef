#include "proto/codec.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

namespace remem::proto {
namespace {

TEST(Codec, HeaderRoundTripAndValidation) {
  RpcHeader h = MakeHeader(7, 3, 42, 5, false, StatusCode::kOk, 9);
  auto ok = DecodeHeader(&h, sizeof(h), 5);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->request_id, 42u);
  EXPECT_EQ(ok->service, 7u);
  EXPECT_EQ(ok->method, 3u);
  EXPECT_EQ(ok->epoch, 9u);

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
  bad.flags = 0x80;
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  bad = h;
  bad.reserved = 1;
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  bad = h;
  bad.status = 1000;  // no such status code
  EXPECT_FALSE(DecodeHeader(&bad, sizeof(bad), 5).ok());
  EXPECT_FALSE(DecodeHeader(nullptr, 0, 0).ok());
}

// Large payloads travel sealed (kFlagSealed): their header carries their
// checksum. The receiver accepts exactly the payload sealed; any change to
// it, or to the seal, fails with ProtocolError; the header's length must
// say whether it is sealed.
TEST(Codec, SealedPayloads) {
  SealedRpcHeader out;
  const std::string small(kSealMin - 1, 's');
  const RpcHeader hs = MakeHeader(1, 1, 7, small.size(), true);
  ASSERT_EQ(SealHeader(hs, small, &out), sizeof(RpcHeader));
  EXPECT_EQ(out.rpc.flags & kFlagSealed, 0u);
  EXPECT_TRUE(DecodeHeader(&out, sizeof(RpcHeader), small.size()).ok());
  EXPECT_TRUE(VerifySeal(&out, sizeof(RpcHeader), small).ok());

  std::string payload;
  for (size_t i = 0; i < kSealMin + 100; ++i) payload.push_back(char(i * 7));
  const RpcHeader h = MakeHeader(1, 1, 7, payload.size(), true);
  ASSERT_EQ(SealHeader(h, payload, &out), sizeof(SealedRpcHeader));
  EXPECT_NE(out.rpc.flags & kFlagSealed, 0u);
  auto decoded = DecodeHeader(&out, sizeof(out), payload.size());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->request_id, 7u);
  EXPECT_TRUE(VerifySeal(&out, sizeof(out), payload).ok());
  // Every byte of the payload matters, and the seal.
  for (size_t i = 0; i < payload.size(); i += 97) {
    std::string changed = payload;
    changed[i] ^= 0x20;
    EXPECT_EQ(VerifySeal(&out, sizeof(out), changed).code(),
              StatusCode::kProtocolError)
        << "byte " << i;
  }
  SealedRpcHeader wrong = out;
  wrong.seal ^= 1;
  EXPECT_EQ(VerifySeal(&wrong, sizeof(wrong), payload).code(),
            StatusCode::kProtocolError);
  // A sealed header is 40 bytes, an unsealed one 32.
  EXPECT_FALSE(DecodeHeader(&out, sizeof(RpcHeader), payload.size()).ok());
  SealedRpcHeader unsealed = out;
  unsealed.rpc.flags &= uint16_t(~kFlagSealed);
  EXPECT_FALSE(DecodeHeader(&unsealed, sizeof(unsealed), payload.size()).ok());
}

TEST(Codec, ClientHello) {
  ClientHelloInfo in;
  in.secret = std::string("a\0b", 3);
  in.worker_address = std::string(145, 'w');
  const std::string enc = EncodeClientHello(in);
  auto out = DecodeClientHello(enc);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->secret, in.secret);
  EXPECT_EQ(out->worker_address, in.worker_address);
  EXPECT_EQ(out->version, kWireVersion);
  // The prefix alone says how much follows, so a server can refuse early.
  ClientHello h;
  auto body = DecodeClientHelloPrefix(enc.substr(0, sizeof(h)), &h);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(*body, 3u + 145u);
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_FALSE(DecodeClientHello(enc.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeClientHello(enc + "x").ok());
  // Oversized length prefixes are refused from the prefix.
  ClientHelloInfo big = in;
  big.secret.assign(kMaxSecretBytes + 1, 's');
  EXPECT_FALSE(
      DecodeClientHelloPrefix(EncodeClientHello(big).substr(0, sizeof(h)), &h)
          .ok());
  big = in;
  big.worker_address.clear();
  EXPECT_FALSE(DecodeClientHello(EncodeClientHello(big)).ok());
  std::string huge = enc.substr(0, sizeof(h));
  const uint32_t too_long = kMaxWorkerAddressBytes + 1;
  std::memcpy(huge.data() + offsetof(ClientHello, address_len), &too_long, 4);
  EXPECT_FALSE(DecodeClientHelloPrefix(huge, &h).ok());
  // Seventeen zero bytes (the input that aborted UCX's own listener) and
  // foreign protocols are refused by the magic.
  EXPECT_FALSE(DecodeClientHello(std::string(17, '\0')).ok());
  std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  http.resize(sizeof(h), ' ');
  auto st = DecodeClientHelloPrefix(http, &h);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("not a remem client"),
            std::string::npos);
}

TEST(Codec, ServerHello) {
  ServerHelloInfo ok;
  ok.worker_address = "addr";
  ok.incarnation = 5;
  ok.session_id = 77;
  ok.server_threads = 2;
  ok.lease_ms = 1000;
  auto out = DecodeServerHello(EncodeServerHello(ok));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(out->status.ok());
  EXPECT_EQ(out->worker_address, "addr");
  EXPECT_EQ(out->session_id, 77u);
  EXPECT_EQ(out->lease_ms, 1000u);
  ServerHelloInfo refused;
  refused.status = Status::PermissionDenied("wrong secret");
  out = DecodeServerHello(EncodeServerHello(refused));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(out->status.message(), "wrong secret");
  // An OK hello must carry an address; a refusal's message is bounded.
  ok.worker_address.clear();
  EXPECT_FALSE(DecodeServerHello(EncodeServerHello(ok)).ok());
  refused.status = Status::Busy(std::string(100000, 'm'));
  out = DecodeServerHello(EncodeServerHello(refused));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status.message().size(), kMaxHandshakeMessageBytes);
}

TEST(Codec, RegionsReply) {
  RegionsInfo in;
  in.incarnation = 7;
  in.max_payload = 1 << 20;
  in.server_threads = 2;
  in.regions.push_back(
      {0, 0x1000, 4096, kCoreService, RegionAccess::kReadOnly, "rkey-one"});
  in.regions.push_back(
      {2, 0x9000, 8192, 1, RegionAccess::kReadWrite, std::string(13, 'k')});
  std::string enc = EncodeRegionsReply(in);
  EXPECT_EQ(enc.size() % 8, 0u);
  auto out = DecodeRegionsReply(enc);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->regions.size(), 2u);
  EXPECT_EQ(out->regions[1].rkey, std::string(13, 'k'));
  EXPECT_EQ(out->regions[0].base, 0x1000u);
  EXPECT_EQ(out->regions[0].access, RegionAccess::kReadOnly);
  EXPECT_EQ(out->regions[1].service, 1u);
  // Every truncation is refused.
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_FALSE(DecodeRegionsReply(enc.substr(0, n)).ok()) << n;
  }
  // Duplicate region ids are refused.
  in.regions[1].region_id = 0;
  EXPECT_FALSE(DecodeRegionsReply(EncodeRegionsReply(in)).ok());
  // A region that wraps the address space is refused.
  in.regions[1].region_id = 2;
  in.regions[1].base = ~uint64_t{0} - 10;
  EXPECT_FALSE(DecodeRegionsReply(EncodeRegionsReply(in)).ok());
}

TEST(Codec, StatsReply) {
  std::vector<StatValue> in = {{"rpcs_served", StatKind::kNumber, 99, {}},
                               {"fsync_policy", StatKind::kText, 0, "always"},
                               {"hash.pairs_2", StatKind::kNumber, 7, {}}};
  auto out = DecodeStatsReply(EncodeStatsReply(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[0].name, "rpcs_served");
  EXPECT_EQ((*out)[0].value, 99u);
  EXPECT_EQ((*out)[1].kind, StatKind::kText);
  EXPECT_EQ((*out)[1].text, "always");
  const std::string enc = EncodeStatsReply(in);
  for (size_t n = 0; n < enc.size(); ++n) {
    EXPECT_FALSE(DecodeStatsReply(enc.substr(0, n)).ok()) << n;
  }
  // Names are validated; duplicates refused.
  EXPECT_FALSE(DecodeStatsReply(
                   EncodeStatsReply({{"Bad Name", StatKind::kNumber, 1, {}}}))
                   .ok());
  EXPECT_FALSE(
      DecodeStatsReply(EncodeStatsReply({{"a", StatKind::kNumber, 1, {}},
                                         {"a", StatKind::kNumber, 2, {}}}))
          .ok());
  // A count beyond the bytes is refused before anything is allocated.
  std::string huge = enc.substr(0, sizeof(StatsReply));
  const uint32_t big = 0xffffff;
  std::memcpy(huge.data() + offsetof(StatsReply, count), &big, 4);
  EXPECT_FALSE(DecodeStatsReply(huge).ok());
}

TEST(Codec, Lease) {
  ServerLease l = MakeLease(4, 77, 123456, 3, 1000000);
  EXPECT_TRUE(LeaseVerifies(l));
  ServerLease odd = l;
  odd.version = 5;
  EXPECT_FALSE(LeaseVerifies(odd));
  ServerLease torn = l;
  torn.expires_ns += 1;  // a copy that mixed two writes
  EXPECT_FALSE(LeaseVerifies(torn));
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

// A multiple read names no region or offset of its own; its spans (1 to
// kMaxMemSpans, each within one request, reserved fields zero) add up to
// its length.
TEST(Codec, MemReadManyValidation) {
  std::vector<MemSpan> spans = {{3, 0, 4096, 1024}, {4, 0, 0, 64}};
  const std::string data = EncodeMemSpans(spans);
  ASSERT_EQ(data.size(), 2 * sizeof(MemSpan));
  MemRequest many = MakeMemRequest(MemOp::kReadMany, 0, 9, 0, 1088);
  auto ok = DecodeMemRequest(Bytes(many), data.size());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  std::vector<MemSpan> back;
  ASSERT_TRUE(DecodeMemSpans(data, 1088, &back).ok());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].region, 3u);
  EXPECT_EQ(back[0].offset, 4096u);
  EXPECT_EQ(back[1].length, 64u);
  // The header: no region or offset, whole spans, not too many, not none.
  EXPECT_FALSE(
      DecodeMemRequest(Bytes(MakeMemRequest(MemOp::kReadMany, 3, 9, 0, 1088)),
                       data.size())
          .ok());
  EXPECT_FALSE(
      DecodeMemRequest(Bytes(MakeMemRequest(MemOp::kReadMany, 0, 9, 8, 1088)),
                       data.size())
          .ok());
  EXPECT_FALSE(DecodeMemRequest(Bytes(many), 0).ok());
  EXPECT_FALSE(DecodeMemRequest(Bytes(many), data.size() - 1).ok());
  EXPECT_FALSE(
      DecodeMemRequest(Bytes(many), (kMaxMemSpans + 1) * sizeof(MemSpan)).ok());
  EXPECT_TRUE(
      DecodeMemRequest(Bytes(many), kMaxMemSpans * sizeof(MemSpan)).ok());
  // The spans: their sum, a span past one request, reserved bits, a torn
  // span, none.
  EXPECT_FALSE(DecodeMemSpans(data, 1087, &back).ok());
  EXPECT_FALSE(DecodeMemSpans(data, 1089, &back).ok());
  std::vector<MemSpan> huge = {{3, 0, 0, kMaxMemTransfer + 1}};
  EXPECT_FALSE(
      DecodeMemSpans(EncodeMemSpans(huge), kMaxMemTransfer + 1, &back).ok());
  std::vector<MemSpan> reserved = {{3, 1, 0, 8}};
  EXPECT_FALSE(DecodeMemSpans(EncodeMemSpans(reserved), 8, &back).ok());
  EXPECT_FALSE(DecodeMemSpans(data.substr(1), 1088, &back).ok());
  EXPECT_FALSE(DecodeMemSpans("", 0, &back).ok());
  // 1024 spans of 8 MiB would overflow nothing: each is checked first.
  std::vector<MemSpan> most(kMaxMemSpans, MemSpan{3, 0, 0, kMaxMemTransfer});
  EXPECT_TRUE(DecodeMemSpans(EncodeMemSpans(most),
                             kMaxMemSpans * kMaxMemTransfer, &back)
                  .ok());
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
