// The ordered store's codec (src/tree/codec.cc): round trips, and every
// malformed payload refused with ProtocolError.

#include "tree/codec.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "proto/buffer.h"
#include "tree/layout.h"

namespace remem::tree {
namespace {

TEST(TreeCodec, RoundTrips) {
  auto info = DecodeTreeInfo(EncodeTreeInfo({5, kMaxKey, kMaxValue, 100}));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->region, 5u);
  EXPECT_EQ(info->max_scan, 100u);

  // Decoded views point into the payload: keep each payload alive.
  const std::string key_msg = EncodeTreeKey("abc");
  auto key = DecodeTreeKey(key_msg);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(*key, "abc");

  const std::string put_msg = EncodePutFor("k", "vv", PutMode::kIfVersion, 9);
  auto put = DecodeTreePut(put_msg);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->key, "k");
  EXPECT_EQ(put->value, "vv");
  EXPECT_EQ(put->mode, PutMode::kIfVersion);
  EXPECT_EQ(put->expected_version, 9u);

  const std::string scan_msg = EncodeTreeScan({"a", "m", 7, true});
  auto scan = DecodeTreeScan(scan_msg);
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->start, "a");
  EXPECT_EQ(scan->end, "m");
  EXPECT_EQ(scan->limit, 7u);
  EXPECT_TRUE(scan->descending);

  ScanPage page;
  page.items.push_back({"k1", "v1", 3});
  page.items.push_back({"k2", "", 4});
  // An out-of-line value's length does not fit 16 bits.
  page.items.push_back({"k3", std::string(70000, 'x'), 5});
  page.more = true;
  page.resume = std::string("k2\0", 3);
  auto back = DecodeTreeScanReply(EncodeTreeScanReply(page));
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->items.size(), 3u);
  EXPECT_EQ(back->items[1].key, "k2");
  EXPECT_EQ(back->items[0].version, 3u);
  EXPECT_EQ(back->items[2].value, page.items[2].value);
  EXPECT_TRUE(back->more);
  EXPECT_EQ(back->resume, page.resume);
  // Into a page that held more: exactly the reply's items; a bad reply
  // leaves it empty.
  ScanPage kept;
  kept.items.assign(5, {"old-key", "old-value", 1});
  ASSERT_TRUE(DecodeTreeScanReply(EncodeTreeScanReply(page), &kept).ok());
  ASSERT_EQ(kept.items.size(), 3u);
  EXPECT_EQ(kept.items[0].key, "k1");
  EXPECT_EQ(kept.items[1].value, "");
  EXPECT_EQ(kept.items[1].version, 4u);
  EXPECT_EQ(kept.resume, page.resume);
  const std::string reply = EncodeTreeScanReply(page);
  EXPECT_FALSE(
      DecodeTreeScanReply(reply.substr(0, reply.size() - 1), &kept).ok());
  EXPECT_TRUE(kept.items.empty());
  EXPECT_FALSE(kept.more);
  EXPECT_TRUE(kept.resume.empty());

  // A batch of gets, and its reply with values and errors.
  const std::string multi_msg = EncodeTreeMultiGet({"a", "", "ccc"});
  auto multi = DecodeTreeMultiGet(multi_msg);
  ASSERT_TRUE(multi.ok()) << multi.status().ToString();
  ASSERT_EQ(multi->size(), 3u);
  EXPECT_EQ((*multi)[0], "a");
  EXPECT_EQ((*multi)[1], "");
  EXPECT_EQ((*multi)[2], "ccc");
  TreeMultiReplyWriter w(3);
  w.AddValue(7, "seven");
  w.AddError(Status::NotFound("key not found"));
  w.AddValue(9, std::string(70000, 'x'));
  auto items = DecodeTreeMultiGetReply(w.Finish(), 3);
  ASSERT_TRUE(items.ok()) << items.status().ToString();
  ASSERT_TRUE((*items)[0].ok());
  EXPECT_EQ((*items)[0]->value, "seven");
  EXPECT_EQ((*items)[0]->version, 7u);
  EXPECT_EQ((*items)[1].status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*items)[1].status().message(), "key not found");
  EXPECT_EQ((*items)[2]->value.size(), 70000u);

  // A batch of puts, and its reply with versions and errors.
  const std::string mput_msg =
      EncodeTreeMultiPut({{"a", "1"},
                          {"", ""},
                          {std::string_view("kkk"), std::string(70000, 'v')}});
  auto mput = DecodeTreeMultiPut(mput_msg);
  ASSERT_TRUE(mput.ok()) << mput.status().ToString();
  ASSERT_EQ(mput->size(), 3u);
  EXPECT_EQ((*mput)[0].first, "a");
  EXPECT_EQ((*mput)[0].second, "1");
  EXPECT_EQ((*mput)[1].first, "");
  EXPECT_EQ((*mput)[2].second.size(), 70000u);
  TreeMultiReplyWriter pw(2);
  pw.AddVersion(11);
  pw.AddError(Status::InvalidArgument("bad key"));
  auto versions = DecodeTreeMultiPutReply(pw.Finish(), 2);
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  ASSERT_TRUE((*versions)[0].ok());
  EXPECT_EQ(*(*versions)[0], 11u);
  EXPECT_EQ((*versions)[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*versions)[1].status().message(), "bad key");

  auto get = DecodeTreeGetReply(EncodeTreeGetReply(8, "val"));
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->first, 8u);
  EXPECT_EQ(get->second, "val");
  auto v = DecodeTreePutReply(EncodeTreePutReply(12));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 12u);
}

TEST(TreeCodec, RangeMovesRoundTripAndRefuseMalformedPayloads) {
  auto bad = [](const Status& st) {
    return st.code() == StatusCode::kProtocolError;
  };
  const std::string req = EncodeTreeRange({3, kRangeFirst, "resume"});
  auto r = DecodeTreeRange(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->range, 3u);
  EXPECT_EQ(r->flags, kRangeFirst);
  EXPECT_EQ(r->resume, "resume");
  for (size_t n = 0; n < req.size(); ++n) {
    EXPECT_TRUE(bad(DecodeTreeRange(req.substr(0, n)).status())) << n;
  }
  EXPECT_TRUE(bad(DecodeTreeRange(req + "x").status()));
  std::string flags = req;
  flags[offsetof(TreeRangeRequest, flags)] = 16;  // unknown
  EXPECT_TRUE(bad(DecodeTreeRange(flags).status()));

  RangePairsWriter w;
  w.Add("apple", "red", 7, false);
  w.Add("gone", {}, 9, true);
  EXPECT_EQ(w.count(), 2u);
  const std::string pairs = w.Finish("next", 12, true);
  auto p = DecodeRangePairs(pairs);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->items.size(), 2u);
  EXPECT_EQ(p->items[0].key, "apple");
  EXPECT_EQ(p->items[0].value, "red");
  EXPECT_EQ(p->items[0].version, 7u);
  EXPECT_FALSE(p->items[0].deleted);
  EXPECT_EQ(p->items[1].key, "gone");
  EXPECT_TRUE(p->items[1].deleted);
  EXPECT_EQ(p->items[1].version, 9u);
  EXPECT_EQ(p->resume, "next");
  EXPECT_EQ(p->max_version, 12u);
  EXPECT_TRUE(p->more);
  EXPECT_EQ(p->sender, 0u);  // a page of a range move
  // The writer starts over after Finish: an empty reply.
  auto empty = DecodeRangePairs(w.Finish({}, 1, false));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->items.empty());
  EXPECT_FALSE(empty->more);
  for (size_t n = 0; n < pairs.size(); ++n) {
    EXPECT_TRUE(bad(DecodeRangePairs(pairs.substr(0, n)).status())) << n;
  }
  EXPECT_TRUE(bad(DecodeRangePairs(pairs + "x").status()));
  // An empty key; a deletion with a value.
  const size_t item = sizeof(TreeRangePairs) + 4;
  std::string no_key = pairs;
  const uint32_t zero = 0;
  std::memcpy(no_key.data() + item, &zero, 4);
  EXPECT_TRUE(bad(DecodeRangePairs(no_key).status()));
  RangePairsWriter v;
  v.Add("k", "value", 3, true);
  EXPECT_TRUE(bad(DecodeRangePairs(v.Finish({}, 3, false)).status()));
  // More items than the bytes could hold.
  std::string many = pairs;
  const uint32_t lots = 1u << 30;
  std::memcpy(many.data(), &lots, 4);
  EXPECT_TRUE(bad(DecodeRangePairs(many).status()));
  // A copy's pair (replication to a backup being filled); never deleted.
  // A replication batch names its stream (the primary's incarnation).
  RangePairsWriter f;
  f.AddFill("copied", "v", 5);
  const std::string filled = f.Finish({}, 5, false, 0x1234567890abcdefu);
  auto fp = DecodeRangePairs(filled);
  ASSERT_TRUE(fp.ok()) << fp.status().ToString();
  EXPECT_EQ(fp->sender, 0x1234567890abcdefu);
  ASSERT_EQ(fp->items.size(), 1u);
  EXPECT_TRUE(fp->items[0].fill);
  EXPECT_FALSE(fp->items[0].deleted);
  std::string both = filled;
  both[sizeof(TreeRangePairs) + offsetof(TreeRangeItem, flags)] =
      kRangeItemDeleted | kRangeItemFill;
  EXPECT_TRUE(bad(DecodeRangePairs(both).status()));
  // The copy's progress.
  const std::string progress = EncodeTreeRangeFillReply({true, 42});
  auto pr = DecodeTreeRangeFillReply(progress);
  ASSERT_TRUE(pr.ok());
  EXPECT_TRUE(pr->done);
  EXPECT_EQ(pr->copied, 42u);
  for (size_t n = 0; n < progress.size(); ++n) {
    EXPECT_TRUE(bad(DecodeTreeRangeFillReply(progress.substr(0, n)).status()));
  }
  std::string two = progress;
  two[0] = 2;
  EXPECT_TRUE(bad(DecodeTreeRangeFillReply(two).status()));
}

TEST(TreeCodec, RefusesMalformedPayloads) {
  auto bad = [](const Status& st) {
    return st.code() == StatusCode::kProtocolError;
  };
  // Every truncation of every message.
  const std::string msgs[] = {EncodeTreeInfo({1, 8, 8, 8}),
                              EncodeTreeKey("key"),
                              EncodePutFor("k", "v", PutMode::kUpsert, 0),
                              EncodeTreeScan({"a", "b", 1, false}),
                              EncodeTreeGetReply(1, "v"),
                              EncodeTreePutReply(1)};
  for (size_t m = 0; m < std::size(msgs); ++m) {
    for (size_t n = 0; n < msgs[m].size(); ++n) {
      const std::string_view cut(msgs[m].data(), n);
      bool refused = false;
      switch (m) {
        case 0:
          refused = bad(DecodeTreeInfo(cut).status());
          break;
        case 1:
          refused = bad(DecodeTreeKey(cut).status());
          break;
        case 2:
          refused = bad(DecodeTreePut(cut).status());
          break;
        case 3:
          refused = bad(DecodeTreeScan(cut).status());
          break;
        case 4:
          refused = bad(DecodeTreeGetReply(cut).status());
          break;
        case 5:
          refused = bad(DecodeTreePutReply(cut).status());
          break;
      }
      EXPECT_TRUE(refused) << "message " << m << " cut at " << n;
    }
  }
  // Lengths that disagree with the payload, unknown modes and flags.
  std::string put = EncodePutFor("k", "v", PutMode::kUpsert, 0);
  put += "x";
  EXPECT_TRUE(bad(DecodeTreePut(put).status()));
  put = EncodePutFor("k", "v", PutMode::kUpsert, 0);
  put[8] = 7;  // mode
  EXPECT_TRUE(bad(DecodeTreePut(put).status()));
  std::string scan = EncodeTreeScan({"a", "b", 1, false});
  scan[12] = 2;  // flags
  EXPECT_TRUE(bad(DecodeTreeScan(scan).status()));
  std::string info = EncodeTreeInfo({1, 8, 8, 8});
  info[12] = 1;  // node size
  EXPECT_TRUE(bad(DecodeTreeInfo(info).status()));
  ScanPage page;
  page.items.push_back({"k", "v", 1});
  std::string reply = EncodeTreeScanReply(page);
  reply[0] = 2;  // count
  EXPECT_TRUE(bad(DecodeTreeScanReply(reply).status()));
  reply = EncodeTreeScanReply(page);
  reply += "z";
  EXPECT_TRUE(bad(DecodeTreeScanReply(reply).status()));
  // Multi-gets: no keys, too many, a key past the payload, trailing
  // bytes; a reply of another count, an unknown status, a short item.
  EXPECT_TRUE(bad(DecodeTreeMultiGet(EncodeTreeMultiGet({})).status()));
  EXPECT_TRUE(
      bad(DecodeTreeMultiGet(EncodeTreeMultiGet(std::vector<std::string_view>(
                                 kMaxMultiGetKeys + 1, "k")))
              .status()));
  std::string multi = EncodeTreeMultiGet({"abc"});
  EXPECT_TRUE(
      bad(DecodeTreeMultiGet(multi.substr(0, multi.size() - 1)).status()));
  EXPECT_TRUE(bad(DecodeTreeMultiGet(multi + "z").status()));
  TreeMultiReplyWriter w(1);
  w.AddValue(1, "v");
  const std::string mreply = w.Finish();
  EXPECT_TRUE(bad(DecodeTreeMultiGetReply(mreply, 2).status()));
  EXPECT_TRUE(
      bad(DecodeTreeMultiGetReply(mreply.substr(0, mreply.size() - 1), 1)
              .status()));
  std::string unknown = mreply;
  unknown[sizeof(TreeMultiReply)] = 100;  // status
  EXPECT_TRUE(bad(DecodeTreeMultiGetReply(unknown, 1).status()));
  // Multi-puts: no pairs, too many, a value past the payload, trailing
  // bytes; a reply of another count, or with a value on success.
  EXPECT_TRUE(bad(DecodeTreeMultiPut(EncodeTreeMultiPut({})).status()));
  EXPECT_TRUE(
      bad(DecodeTreeMultiPut(EncodeTreeMultiPut(std::vector<KeyValueView>(
                                 kMaxMultiGetKeys + 1, KeyValueView("k", "v"))))
              .status()));
  std::string mput = EncodeTreeMultiPut({{"abc", "value"}});
  EXPECT_TRUE(
      bad(DecodeTreeMultiPut(mput.substr(0, mput.size() - 1)).status()));
  EXPECT_TRUE(bad(DecodeTreeMultiPut(mput + "z").status()));
  EXPECT_TRUE(bad(DecodeTreeMultiPutReply(mreply, 2).status()));
  EXPECT_TRUE(bad(DecodeTreeMultiPutReply(mreply, 1).status()))
      << "a put's success carries no value";
  // A key length past max_key, a value length past max_value.
  reply = EncodeTreeScanReply(page);
  const size_t item = sizeof(TreeScanReply);
  const uint32_t long_key = kMaxKey + 1;
  std::memcpy(reply.data() + item, &long_key, 4);
  EXPECT_TRUE(bad(DecodeTreeScanReply(reply).status()));
  reply = EncodeTreeScanReply(page);
  const uint32_t huge = kMaxValue + 1;
  std::memcpy(reply.data() + item + 4, &huge, 4);
  EXPECT_TRUE(bad(DecodeTreeScanReply(reply).status()));
}

}  // namespace
}  // namespace remem::tree
