#include "txn/durable.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "durability/store.h"

namespace remem::txn {
namespace {

// A store "killed": never destroyed (no clean stop runs), and kept
// reachable, so LeakSanitizer does not take the simulated crash for a
// leak.
void Abandon(std::unique_ptr<durability::PartitionStore> store) {
  static auto* abandoned =
      new std::vector<std::unique_ptr<durability::PartitionStore>>;
  abandoned->push_back(std::move(store));
}

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
  Server(const std::string& dir, uint64_t pages = 4,
         durability::RecoveryMode recovery = durability::RecoveryMode::kStrict)
      : memory_(pages * kPageBytes, 0xAA),
        heap_({{3, memory_.data(), pages * kPageBytes}}),
        durable_(&heap_) {
    StoreOptions o;
    o.dir = dir;
    o.fsync = durability::FsyncPolicy::kNo;
    o.snapshot_log_bytes = 0;
    o.recovery = recovery;
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
  // A commit applied in memory (and so readable, one-sided too) whose
  // records never reach the log: the process dies before its write.
  Result<std::vector<uint64_t>> CommitUnlogged(
      const std::vector<CommitEntry>& e) {
    auto v = heap_.Commit(e, kOwner);
    heap_.ClearChanged();
    return v;
  }
  TxnObjectIdWire CreateUnlogged(const std::string& data) {
    auto id = heap_.Reserve(uint32_t(data.size()), kOwner);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_TRUE(CommitUnlogged({{*id, 0, TxnOp::kCreate, data}}).ok());
    return *id;
  }
  // The process dies (kill -9): no clean stop of the store.
  void Crash() { Abandon(std::move(store_)); }
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

// Reserves `n` slots of the class of `like`, returning them (released
// after: nothing logged is left reserved).
std::vector<TxnObjectIdWire> ReserveMany(Server& s, const TxnObjectIdWire& like,
                                         int n) {
  std::vector<TxnObjectIdWire> ids;
  for (int i = 0; i < n; ++i) {
    auto id = s.heap().Reserve(like.capacity, kOwner);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (id.ok()) ids.push_back(*id);
  }
  return ids;
}

// A commit applied in memory and read (one-sided, or by RPC) whose records
// never reached the log before the process died: at the restart its
// writes are gone (as documented), but the versions it gave and the ids it
// allocated are never handed out again: a write of the object it wrote
// gets a version above the lost one (a client that read the lost value
// and checks that version gets a Conflict, never a commit against bytes
// it never saw), and its new object's id reads NotFound however many
// objects are made after. What was recovered reads under its id. A clean
// stop and restart keeps all of that (the gap is kept in the run file). (The
// versions and ids were reused: the write got the lost version again, and
// the lost id named the next object of its class.)
TEST(DurableHeap, WhatALostCommitConsumedIsNeverHandedOutAgain) {
  const std::string dir = TempDir();
  TxnObjectIdWire a, lost, freed_lost;
  uint64_t lost_version = 0, recovered_version = 0;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok()) << s.open().ToString();
    a = s.Create("a1");                                          // v2
    ASSERT_TRUE(s.Commit({{a, 2, TxnOp::kWrite, "a2"}}).ok());   // v4
    freed_lost = s.Create("freed after");                        // v2
    auto v = s.CommitUnlogged({{a, 4, TxnOp::kWrite, "lost"}});  // v6
    ASSERT_TRUE(v.ok());
    lost_version = (*v)[0];
    lost = s.CreateUnlogged("lost object");
    // A lost commit that frees an object: its slot's next id goes to
    // whoever allocates next in the lost run.
    ASSERT_TRUE(s.CommitUnlogged({{freed_lost, 2, TxnOp::kFree, {}}}).ok());
    s.Crash();
  }
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok()) << s.open().ToString();
    EXPECT_TRUE(s.report().unclean);
    std::string data;
    ASSERT_TRUE(s.Verifies(a, &data));
    EXPECT_EQ(data, "a2");  // the lost write is gone
    recovered_version = s.heap().Read(a)->first;
    EXPECT_GT(recovered_version, lost_version);
    // A client that read the lost value checks its version: Conflict.
    EXPECT_EQ(
        s.Commit({{a, lost_version, TxnOp::kWrite, "clobber"}}).status().code(),
        StatusCode::kConflict);
    auto w = s.Commit({{a, recovered_version, TxnOp::kWrite, "a3"}});
    ASSERT_TRUE(w.ok());
    EXPECT_GT((*w)[0], lost_version);
    recovered_version = (*w)[0];
    // The lost object's id names nothing, now or after many allocations.
    EXPECT_EQ(s.heap().Read(lost).status().code(), StatusCode::kNotFound);
    std::vector<TxnObjectIdWire> made;
    for (int i = 0; i < 8; ++i) made.push_back(s.Create("new"));
    // The recovered object freed by the lost commit: freed now, its slot's
    // next ids must not be the lost run's.
    ASSERT_TRUE(s.Commit({{freed_lost, 0, TxnOp::kFree, {}}}).ok());
    for (int i = 0; i < 4; ++i) made.push_back(s.Create("newer"));
    for (const TxnObjectIdWire& id : made) {
      EXPECT_FALSE(id.address == lost.address &&
                   id.incarnation == lost.incarnation);
      // The lost run's next incarnation of freed_lost's slot.
      EXPECT_FALSE(id.address == freed_lost.address &&
                   id.incarnation == freed_lost.incarnation + 1);
    }
    EXPECT_EQ(s.heap().Read(lost).status().code(), StatusCode::kNotFound);
  }
  {
    // A clean restart: nothing moves, and the gap is kept.
    Server s(dir);
    ASSERT_TRUE(s.open().ok()) << s.open().ToString();
    EXPECT_FALSE(s.report().unclean);
    std::string data;
    ASSERT_TRUE(s.Verifies(a, &data));
    EXPECT_EQ(data, "a3");
    EXPECT_EQ(s.heap().Read(a)->first, recovered_version);
    EXPECT_EQ(s.heap().Read(lost).status().code(), StatusCode::kNotFound);
    for (const TxnObjectIdWire& id : ReserveMany(s, lost, 64)) {
      EXPECT_FALSE(id.address == lost.address &&
                   id.incarnation == lost.incarnation);
    }
  }
  fs::remove_all(dir);
}

// An object restored from a record older than an unclean restart moves up
// by that restart's gap at every later recovery too: its record on disk
// still holds the version before the gap, which a lost commit may have
// reused. Two unclean restarts in a row, the second run logging nothing.
TEST(DurableHeap, TheGapOfAnUncleanRestartHoldsAtEveryLaterOne) {
  const std::string dir = TempDir();
  TxnObjectIdWire a;
  uint64_t seen = 0;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok());
    a = s.Create("a1");
    s.Crash();
  }
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok());
    seen = s.heap().Read(a)->first;
    EXPECT_GT(seen, 2u);
    // Lost: written in memory, read at seen + 2, never logged.
    auto v = s.CommitUnlogged({{a, seen, TxnOp::kWrite, "lost"}});
    ASSERT_TRUE(v.ok());
    seen = (*v)[0];
    s.Crash();
  }
  Server s(dir);
  ASSERT_TRUE(s.open().ok());
  std::string data;
  ASSERT_TRUE(s.Verifies(a, &data));
  EXPECT_EQ(data, "a1");
  EXPECT_GT(s.heap().Read(a)->first, seen);
  fs::remove_all(dir);
}

// --recovery truncate that drops commits: an object whose writes were
// dropped never goes back to a version they used (later writes reach
// none of them), and an id whose allocation was dropped reads NotFound
// however many objects are made after. (Versions went back and were
// reissued with other contents; the dropped ids named new objects.)
TEST(DurableHeap, WhatTruncateDroppedIsNeverHandedOutAgain) {
  const std::string dir = TempDir();
  TxnObjectIdWire a;
  std::vector<TxnObjectIdWire> dropped_ids;
  uint64_t dropped_version = 0;
  {
    Server s(dir);
    ASSERT_TRUE(s.open().ok());
    a = s.Create("first");
    s.Snapshot();  // a at version 2 in the snapshot: the log after it goes
    auto v = s.Commit({{a, 2, TxnOp::kWrite, "second"}});
    ASSERT_TRUE(v.ok());
    v = s.Commit({{a, (*v)[0], TxnOp::kWrite, "third"}});
    ASSERT_TRUE(v.ok());
    dropped_version = (*v)[0];
    for (int i = 0; i < 8; ++i) dropped_ids.push_back(s.Create("dropped"));
  }
  {
    // Damage the log after the snapshot at its first record.
    const std::string log = LastLog(dir);
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(45);
    f.put('!');
  }
  {
    Server strict(dir);
    ASSERT_EQ(strict.open().code(), StatusCode::kCorruption);
  }
  Server s(dir, 4, durability::RecoveryMode::kTruncate);
  ASSERT_TRUE(s.open().ok()) << s.open().ToString();
  ASSERT_FALSE(s.report().lost.empty());
  std::string data;
  ASSERT_TRUE(s.Verifies(a, &data));
  EXPECT_EQ(data, "first");
  uint64_t v = s.heap().Read(a)->first;
  EXPECT_GT(v, dropped_version);
  for (int i = 0; i < 3; ++i) {
    auto w = s.Commit({{a, v, TxnOp::kWrite, "X"}});
    ASSERT_TRUE(w.ok());
    EXPECT_GT((*w)[0], dropped_version);
    v = (*w)[0];
  }
  for (int i = 0; i < 16; ++i) (void)s.Create("more");
  for (const TxnObjectIdWire& id : dropped_ids) {
    EXPECT_EQ(s.heap().Read(id).status().code(), StatusCode::kNotFound)
        << id.address << ":" << id.incarnation;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace remem::txn
