#include "txn/durable.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "durability/store.h"

namespace remem::txn {
namespace {

namespace fs = std::filesystem;
using durability::PartitionStore;
using durability::RecoveryReport;
using durability::StoreOptions;

constexpr uint64_t kOwner = 7;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "remem-txn-XXXXXX").string();
  EXPECT_NE(::mkdtemp(t.data()), nullptr);
  return t;
}

// A heap in plain memory with its durable state in `dir`, driven as the
// service drives it: each change logged as a group, then a pass.
class Server {
 public:
  Server(const std::string& dir, uint64_t pages = 4)
      : memory_(pages * kPageBytes, 0xAA),
        heap_({{3, memory_.data(), pages * kPageBytes}}),
        durable_(&heap_) {
    StoreOptions o;
    o.dir = dir;
    o.fsync = durability::FsyncPolicy::kNo;
    o.snapshot_log_bytes = 0;
    auto s = PartitionStore::Open(o, &durable_, &report_);
    open_ = s.status();
    if (s.ok()) store_ = std::move(*s);
  }

  const Status& open() const { return open_; }
  const RecoveryReport& report() const { return report_; }
  ObjectHeap& heap() { return heap_; }

  Result<std::vector<uint64_t>> Commit(const std::vector<CommitEntry>& e) {
    auto v = heap_.Commit(e, kOwner);
    Logged();
    return v;
  }
  TxnObjectIdWire Create(const std::string& data) {
    auto id = heap_.Reserve(uint32_t(data.size()), kOwner);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_TRUE(Commit({{*id, 0, TxnOp::kCreate, data}}).ok());
    return *id;
  }
  void Release(const TxnObjectIdWire& id) {
    EXPECT_TRUE(heap_.Release(id, kOwner).ok());
    Logged();
  }
  void Snapshot() {
    bool done = false;
    store_->RequestSnapshot([&](Status st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      done = true;
    });
    while (!done) store_->OnPass();
  }
  // The object as a one-sided reader would verify it from the memory.
  bool Verifies(const TxnObjectIdWire& id, std::string* data) {
    ObjectHeader h;
    std::memcpy(&h, memory_.data() + id.address, sizeof(h));
    if (HeaderCheck(h, id.capacity) != h.header_check ||
        h.incarnation != id.incarnation || h.version == 0 ||
        h.version % 2 != 0) {
      return false;
    }
    const uint8_t* p = memory_.data() + id.address + sizeof(h);
    if (DataChecksum(h, p, h.size) != h.checksum) return false;
    data->assign(reinterpret_cast<const char*>(p), h.size);
    return true;
  }

 private:
  void Logged() {
    durable_.LogChanged(store_.get());
    store_->OnPass();
  }

  std::vector<uint8_t> memory_;
  ObjectHeap heap_;
  DurableHeap durable_;
  RecoveryReport report_;
  Status open_;
  std::unique_ptr<PartitionStore> store_;  // before the heap goes
};

std::string LastLog(const std::string& dir) {
  std::string last;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().string();
    if (n.ends_with(".rlog") && fs::file_size(n) > 0 && n > last) last = n;
  }
  return last;
}

// Objects come back at their ids, versions and bytes, from a snapshot and
// the log after it; freed and released ids stay dead; the heap's
// accounting is as it was.
TEST(DurableHeap, ARestartRecoversEveryObjectAndEveryDeadId) {
  const std::string dir = TempDir();
  TxnObjectIdWire kept, written, freed, released, big, after;
  uint64_t objects = 0, bytes_used = 0, pages_used = 0;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok()) << s.open().ToString();
    kept = s.Create("kept");
    written = s.Create("first");
    freed = s.Create("freed");
    big = s.Create(std::string(5000, 'b'));
    ASSERT_TRUE(s.Commit({{written, 2, TxnOp::kWrite, "second"}}).ok());
    s.Snapshot();
    ASSERT_TRUE(s.Commit({{written, 4, TxnOp::kWrite, "third"},
                          {freed, 2, TxnOp::kFree, {}}})
                    .ok());
    auto r = s.heap().Reserve(10, kOwner);
    ASSERT_TRUE(r.ok());
    released = *r;
    s.Release(released);
    after = s.Create("after the snapshot");
    // Reserved and never committed when the server stops.
    ASSERT_TRUE(s.heap().Reserve(10, kOwner).ok());
    objects = s.heap().counters().objects;
    bytes_used = s.heap().counters().bytes_used - ClassBytes(0);
    pages_used = s.heap().counters().pages_used;
  }
  Server s(dir);
  ASSERT_TRUE(s.open().ok()) << s.open().ToString();
  EXPECT_FALSE(s.report().snapshot.empty());
  std::string data;
  ASSERT_TRUE(s.Verifies(kept, &data));
  EXPECT_EQ(data, "kept");
  ASSERT_TRUE(s.Verifies(written, &data));
  EXPECT_EQ(data, "third");
  EXPECT_EQ(s.heap().Read(written)->first, 6u);
  ASSERT_TRUE(s.Verifies(big, &data));
  EXPECT_EQ(data, std::string(5000, 'b'));
  ASSERT_TRUE(s.Verifies(after, &data));
  EXPECT_EQ(data, "after the snapshot");
  EXPECT_EQ(s.heap().Read(freed).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.heap().Read(released).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.heap().counters().objects, objects);
  EXPECT_EQ(s.heap().counters().bytes_used, bytes_used);
  EXPECT_EQ(s.heap().counters().pages_used, pages_used);
  EXPECT_EQ(s.heap().counters().reserved, 0u);
  // Every slot of class 0 not holding an object is free again, each at an
  // incarnation no id handed out before names: the freed and the released
  // slots come back with new ones.
  std::vector<TxnObjectIdWire> fresh;
  for (int i = 0; i < 4; ++i) {
    auto id = s.heap().Reserve(10, kOwner);
    ASSERT_TRUE(id.ok());
    fresh.push_back(*id);
  }
  for (const TxnObjectIdWire& id : fresh) {
    if (id.address == freed.address) {
      EXPECT_NE(id.incarnation, freed.incarnation);
    }
    if (id.address == released.address) {
      EXPECT_NE(id.incarnation, released.incarnation);
    }
    for (const TxnObjectIdWire& live : {kept, written, after}) {
      EXPECT_NE(id.address, live.address);
    }
  }
  fs::remove_all(dir);
}

// A commit is one atomic group: cut short by a crash inside its write,
// none of its objects is recovered.
TEST(DurableHeap, ACommitCutShortIsRecoveredNotAtAll) {
  const std::string dir = TempDir();
  TxnObjectIdWire a, b;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok());
    a = s.Create("a1");
    b = s.Create("b1");
    ASSERT_TRUE(
        s.Commit({{a, 2, TxnOp::kWrite, "a2"}, {b, 2, TxnOp::kWrite, "b2"}})
            .ok());
  }
  const std::string log = LastLog(dir);
  fs::resize_file(log, fs::file_size(log) - 1);  // b's record cut short
  Server s(dir);
  ASSERT_TRUE(s.open().ok()) << s.open().ToString();
  std::string data;
  ASSERT_TRUE(s.Verifies(a, &data));
  EXPECT_EQ(data, "a1");  // not "a2": the commit is gone whole
  ASSERT_TRUE(s.Verifies(b, &data));
  EXPECT_EQ(data, "b1");
  fs::remove_all(dir);
}

// A server restarted with less object memory than its objects need
// refuses to start, naming the flag, and loses nothing.
TEST(DurableHeap, AHeapTooSmallForTheDataRefusesAndKeepsIt) {
  const std::string dir = TempDir();
  TxnObjectIdWire far;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok());
    for (size_t c = 0; c < 3; ++c) {  // a page per class
      far = s.Create(std::string(CapacityOf(c), 'x'));
    }
  }
  {
    Server s(dir, 1);
    EXPECT_EQ(s.open().code(), StatusCode::kOutOfMemory);
    EXPECT_NE(s.open().message().find("--txn-memory of at least 3M"),
              std::string::npos)
        << s.open().ToString();
  }
  Server s(dir);
  ASSERT_TRUE(s.open().ok()) << s.open().ToString();
  std::string data;
  ASSERT_TRUE(s.Verifies(far, &data));
  EXPECT_EQ(data, std::string(CapacityOf(2), 'x'));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem::txn
