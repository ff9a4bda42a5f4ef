#include "frontdoor/resp.h"

#include <gtest/gtest.h>

namespace remem::frontdoor {
namespace {

using namespace std::string_literals;

struct Out {
  Decoded d;
  std::vector<std::string> args;
  size_t used = 0;
  std::string error;
};

Out Decode(std::string_view in, size_t max_bulk = 1 << 20) {
  Out o;
  o.d = DecodeRequest(in, max_bulk, &o.args, &o.used, &o.error);
  return o;
}

TEST(RespDecode, AMultibulkRequestIsItsArgumentsBinarySafe) {
  const std::string in =
      "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\0b\r\n*1\r\n"s;
  Out o = Decode(in);
  ASSERT_EQ(o.d, Decoded::kCommand) << o.error;
  EXPECT_EQ(o.args, (std::vector<std::string>{"SET", "k", "a\r\0b"s}));
  EXPECT_EQ(o.used, in.size() - 4);  // the next request is left
}

TEST(RespDecode, EveryPrefixOfARequestNeedsMore) {
  const std::string in = "*2\r\n$3\r\nGET\r\n$10\r\n0123456789\r\n";
  for (size_t n = 0; n < in.size(); ++n) {
    Out o = Decode(std::string_view(in).substr(0, n));
    EXPECT_EQ(o.d, Decoded::kNeedMore) << n;
    EXPECT_EQ(o.used, 0u);
  }
  EXPECT_EQ(Decode(in).d, Decoded::kCommand);
}

TEST(RespDecode, InlineCommandsSplitOnSpacesAndQuotes) {
  Out o = Decode("SET  k \"a b\\x41\\n\" 'it\\'s'\r\nGET k\n");
  ASSERT_EQ(o.d, Decoded::kCommand) << o.error;
  EXPECT_EQ(o.args, (std::vector<std::string>{"SET", "k", "a bA\n", "it's"}));
  EXPECT_EQ(Decode("\r\n").d, Decoded::kEmpty);
  EXPECT_EQ(Decode("*0\r\n").d, Decoded::kEmpty);
  EXPECT_EQ(Decode("*-1\r\n").d, Decoded::kEmpty);
  EXPECT_EQ(Decode("GET k").d, Decoded::kNeedMore);
}

TEST(RespDecode, MalformedRequestsAreProtocolErrors) {
  const char* bad[] = {
      "*x\r\n",              // not a count
      "*2\r\n+GET\r\n",      // not a bulk string
      "*1\r\n$-5\r\n",       // negative length
      "*1\r\n$3\r\nGETxx",   // no CRLF after the bytes
      "*1\r\n$01\r\nG\r\n",  // a leading zero
      "*99999999999\r\n",    // too many arguments
      "GET \"k\r\n",         // unbalanced quotes
      "GET \"k\"x\r\n",      // a quote closed inside a word
  };
  for (const char* b : bad) {
    Out o = Decode(b);
    EXPECT_EQ(o.d, Decoded::kError) << b;
    EXPECT_NE(o.error.find("Protocol error"), std::string::npos) << b;
  }
}

TEST(RespDecode, LimitsAreEnforcedBeforeTheBytesArrive) {
  // A bulk over the caller's limit is refused from its header alone.
  Out o = Decode("*2\r\n$3\r\nSET\r\n$2000\r\n", 1000);
  EXPECT_EQ(o.d, Decoded::kError);
  EXPECT_NE(o.error.find("1000"), std::string::npos) << o.error;
  // A bulk at the limit is accepted.
  const std::string at = "*1\r\n$1000\r\n" + std::string(1000, 'v') + "\r\n";
  EXPECT_EQ(Decode(at, 1000).d, Decoded::kCommand);
  // An inline line without its end, past 64 KiB.
  EXPECT_EQ(Decode(std::string(kMaxInlineBytes + 1, 'a')).d, Decoded::kError);
  EXPECT_EQ(Decode(std::string(kMaxInlineBytes - 1, 'a')).d,
            Decoded::kNeedMore);
}

TEST(RespEncode, RepliesAreRedisFraming) {
  std::string out;
  AppendSimple(&out, "OK");
  AppendError(&out, "ERR two\r\nlines");
  AppendInteger(&out, -7);
  AppendBulk(&out, "a\0b"s);
  AppendNil(&out);
  AppendArrayHeader(&out, 2);
  EXPECT_EQ(out,
            "+OK\r\n-ERR two  lines\r\n:-7\r\n$3\r\na\0b\r\n$-1\r\n*2\r\n"s);
}

TEST(RespDecode, IntegersAreRedisDecimal) {
  int64_t v = 0;
  EXPECT_TRUE(ParseInt64("-9223372036854775808", &v));
  EXPECT_EQ(v, INT64_MIN);
  EXPECT_TRUE(ParseInt64("0", &v));
  for (const char* bad :
       {"", "-", "+1", " 1", "01", "-0", "1.5", "9223372036854775808", "1e3"}) {
    EXPECT_FALSE(ParseInt64(bad, &v)) << bad;
  }
}

}  // namespace
}  // namespace remem::frontdoor
