#include "hash/codec.h"

#include <gtest/gtest.h>

#include <cstring>

#include "hash/layout.h"

namespace remem::hash {
namespace {

TEST(Codec, ReadFlagsTravelInGetsAndBatchesOfGets) {
  const std::string get = EncodeHashKey("key", kHashReadAnyReplica);
  EXPECT_EQ(HashReadFlags(get), kHashReadAnyReplica);
  auto key = DecodeHashKey(get);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(*key, "key");
  EXPECT_EQ(HashReadFlags(EncodeHashKey("key")), 0u);
  const std::string multi = EncodeHashMultiGet({"a", "b"}, kHashReadAnyReplica);
  EXPECT_EQ(HashReadFlags(multi), kHashReadAnyReplica);
  auto keys = DecodeHashMultiGet(multi);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->size(), 2u);
  const std::string ops = EncodeHashMultiOp(
      {{MultiOpKind::kGet, "a", {}}, {MultiOpKind::kGet, "b", {}}},
      kHashReadAnyReplica);
  EXPECT_EQ(HashReadFlags(ops), kHashReadAnyReplica);
  EXPECT_TRUE(DecodeHashMultiOp(ops).ok());
  // Too short to hold the field: 0 (its decoder refuses it).
  EXPECT_EQ(HashReadFlags(get.substr(0, 7)), 0u);
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

// A user reduction (op 8, fn 5) names its function by function_id; both
// survive a single op and a batch, and every truncation is refused.
TEST(Codec, HashOpsCarryAUserReductionsFunctionId) {
  ops::OpView user;
  user.kind = OpKind::kVecReduce;
  user.fn = uint8_t(Reduction::kUser);
  user.function_id = 0xfedcba98;
  user.key = "vec";
  ops::OpView sum = user;
  sum.fn = uint8_t(Reduction::kSum);
  sum.function_id = 0;
  const std::string one = EncodeHashOp(user);
  EXPECT_EQ(one.size(), sizeof(HashOpRequest) + 3);
  EXPECT_EQ(uint8_t(one[2]), 5);  // fn, at offset 2
  auto back = DecodeHashOp(one);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, OpKind::kVecReduce);
  EXPECT_EQ(back->fn, uint8_t(Reduction::kUser));
  EXPECT_EQ(back->function_id, 0xfedcba98u);
  EXPECT_EQ(back->key, "vec");
  for (size_t n = 0; n < one.size(); ++n) {
    EXPECT_FALSE(DecodeHashOp(one.substr(0, n)).ok()) << n;
  }
  const std::string batch = EncodeHashOpBatch({sum, user});
  auto items = DecodeHashOpBatch(batch);
  ASSERT_TRUE(items.ok()) << items.status().ToString();
  ASSERT_EQ(items->size(), 2u);
  EXPECT_EQ((*items)[0].fn, uint8_t(Reduction::kSum));
  EXPECT_EQ((*items)[0].function_id, 0u);
  EXPECT_EQ((*items)[1].fn, uint8_t(Reduction::kUser));
  EXPECT_EQ((*items)[1].function_id, 0xfedcba98u);
  for (size_t n = 0; n < batch.size(); ++n) {
    EXPECT_FALSE(DecodeHashOpBatch(batch.substr(0, n)).ok()) << n;
  }
}

TEST(Codec, HashMultiOpRoundTripsAndRefusesWhatIsMalformed) {
  const std::vector<MultiOp> ops = {{MultiOpKind::kPut, "k1", "v1"},
                                    {MultiOpKind::kGet, "k1", {}},
                                    {MultiOpKind::kDelete, "k1", {}},
                                    {MultiOpKind::kPut, "k2", ""}};
  const std::string wire = EncodeHashMultiOp(ops);
  auto back = DecodeHashMultiOp(wire);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ((*back)[i].op, ops[i].op) << i;
    EXPECT_EQ((*back)[i].key, ops[i].key) << i;
    EXPECT_EQ((*back)[i].value, ops[i].value) << i;
  }
  for (size_t n = 0; n < wire.size(); ++n) {
    EXPECT_FALSE(DecodeHashMultiOp(wire.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeHashMultiOp(wire + "x").ok());  // trailing bytes
  EXPECT_FALSE(DecodeHashMultiOp(EncodeHashMultiOp({})).ok());  // no items
  // The first item's header starts after the 8-byte request header.
  std::string bad = wire;
  bad[8] = 9;  // no such operation
  EXPECT_FALSE(DecodeHashMultiOp(bad).ok());
  bad = wire;
  bad[9] = 1;  // reserved
  EXPECT_FALSE(DecodeHashMultiOp(bad).ok());
  // A get that carries a value.
  const std::string get_with_value =
      EncodeHashMultiOp({{MultiOpKind::kGet, "k", "v"}});
  EXPECT_FALSE(DecodeHashMultiOp(get_with_value).ok());
}

TEST(Codec, ShardMessagesRoundTripAndRefuseWhatIsMalformed) {
  auto list = DecodeShardList(EncodeShardList({{3, 700, 1023}, kShardFreeze}));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->shards, (std::vector<uint32_t>{3, 700, 1023}));
  EXPECT_EQ(list->flags, kShardFreeze);
  EXPECT_FALSE(DecodeShardList(EncodeShardList({{}, 0})).ok());  // empty
  EXPECT_FALSE(DecodeShardList(EncodeShardList({{1}, 0x80})).ok());
  EXPECT_FALSE(DecodeShardList(EncodeShardList({{1, 2}, 0}) + "x").ok());

  ShardExport ex;
  ex.partition = 2;
  ex.generation = 5;
  ex.cursor = 4096;
  ex.max_bytes = 1 << 20;
  ex.shards = {9};
  auto ex2 = DecodeShardExport(EncodeShardExport(ex));
  ASSERT_TRUE(ex2.ok()) << ex2.status().ToString();
  EXPECT_EQ(ex2->partition, 2u);
  EXPECT_EQ(ex2->generation, 5u);
  EXPECT_EQ(ex2->cursor, 4096u);
  EXPECT_EQ(ex2->shards, std::vector<uint32_t>{9});
  EXPECT_TRUE(ex2->after.empty());
  const std::string ex_bytes = EncodeShardExport(ex);
  EXPECT_FALSE(DecodeShardExport(ex_bytes.substr(0, 31)).ok());
  // Resuming inside a bucket: the key after the shard numbers.
  ex.shards = {9, 3};
  ex.after = "last key sent";
  ex2 = DecodeShardExport(EncodeShardExport(ex));
  ASSERT_TRUE(ex2.ok()) << ex2.status().ToString();
  EXPECT_EQ(ex2->shards, (std::vector<uint32_t>{9, 3}));
  EXPECT_EQ(ex2->after, "last key sent");
  const std::string whole = EncodeShardExport(ex);
  // Cut inside the key, and before it (the shard numbers left are fewer
  // bytes than the key's length).
  EXPECT_FALSE(DecodeShardExport(whole.substr(0, whole.size() - 1)).ok());
  auto cut = DecodeShardExport(whole.substr(0, 32 + 8));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("resume key truncated"),
            std::string::npos)
      << cut.status().ToString();
  ex.after.assign(Limits{}.max_key + 1, 'k');
  EXPECT_FALSE(DecodeShardExport(EncodeShardExport(ex)).ok());
  ex.after.clear();
  ex.cursor = 5 | kShardCursorInBucket;  // a reply's cursor sent back as is
  EXPECT_FALSE(DecodeShardExport(EncodeShardExport(ex)).ok());

  ShardPairsWriter w;
  w.Add("k1", "value one", 17, false);
  w.Add("gone", "ignored", 0, true);
  w.Add("k3", "", 4, false);
  w.AddFill("k4", "copied", 12);
  const std::string bytes = w.Finish(7, kShardCursorDone, 4, 99);
  auto pairs = DecodeShardPairs(bytes);
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  EXPECT_EQ(pairs->generation, 7u);
  EXPECT_EQ(pairs->cursor, kShardCursorDone);
  EXPECT_EQ(pairs->num_partitions, 4u);
  EXPECT_EQ(pairs->max_version, 99u);
  ASSERT_EQ(pairs->pairs.size(), 4u);
  EXPECT_EQ(pairs->pairs[0].key, "k1");
  EXPECT_EQ(pairs->pairs[0].value, "value one");
  EXPECT_EQ(pairs->pairs[0].version, 17u);
  EXPECT_TRUE(pairs->pairs[1].deleted);
  EXPECT_EQ(pairs->pairs[1].value, "");
  EXPECT_EQ(pairs->pairs[2].value, "");
  EXPECT_FALSE(pairs->pairs[2].fill);
  EXPECT_TRUE(pairs->pairs[3].fill);
  EXPECT_FALSE(pairs->pairs[3].deleted);
  EXPECT_EQ(pairs->pairs[3].value, "copied");
  EXPECT_EQ(pairs->pairs[3].version, 12u);
  // The writer starts over after Finish.
  EXPECT_EQ(w.count(), 0u);
  EXPECT_EQ(DecodeShardPairs(w.Finish(0, 0, 0, 0))->pairs.size(), 0u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeShardPairs(bytes.substr(0, n)).ok()) << n;
  }
  std::string bad = bytes;
  bad[sizeof(ShardPairsHeader) + 16] = 3;  // kind
  EXPECT_FALSE(DecodeShardPairs(bad).ok());
  const uint32_t huge = 1u << 30;
  bad = bytes;
  std::memcpy(bad.data() + 16, &huge, sizeof(huge));  // count
  EXPECT_FALSE(DecodeShardPairs(bad).ok());

  const std::string fill = EncodeShardFillReply({true, 10, 10});
  auto progress = DecodeShardFillReply(fill);
  ASSERT_TRUE(progress.ok()) << progress.status().ToString();
  EXPECT_TRUE(progress->done);
  EXPECT_EQ(progress->pairs_total, 10u);
  EXPECT_FALSE(DecodeShardFillReply(fill.substr(0, 23)).ok());
  EXPECT_FALSE(DecodeShardFillReply(EncodeShardFillReply({false, 3, 4})).ok());
}

}  // namespace
}  // namespace remem::hash
