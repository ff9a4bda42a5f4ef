// txn::DurableHeap: the object heap as the durability layer sees it
// (durability::Recoverable), under --data-dir. A slot is a key (its heap
// offset, 8 bytes big-endian) whose value is its TxnSlotRecord and the
// object's bytes (txn/wire.h):
//   - logging: after each release, commit or dropped connection, the
//     slots the heap changed are logged as one atomic group, so a commit
//     cut short by a crash is recovered whole or not at all;
//   - snapshots: a walk over the pages in use, a chunk at a time between
//     requests, emitting every slot that holds an object or has been used
//     (its incarnation, so that an id of a freed object never names a later
//     one, across restarts too);
//   - recovery: each slot's last record restored into the heap's memory,
//     then its free lists rebuilt. Reservations are not kept: a slot
//     reserved when the server stopped is free again (its ids were only
//     in the sessions that ended with it).
//
// The records' versions are a counter of this state (each record takes
// the next), not the objects' versions, which are in the records' values.
//
// What a lost commit consumed stays consumed. A commit applied in memory
// (and read, one-sided too) whose records never reached the log, or records
// --recovery truncate dropped, may have given objects versions and slots
// incarnations that the recovered state does not show. So after a recovery
// the store calls unclean (durability/store.h; records dropped included):
//   - every object recovered moves up by a gap (2^32, plus the highest
//     object version a dropped record held), above any version a lost
//     commit gave it; the gap is applied to every record older than that
//     recovery again at every later recovery (the run note keeps each
//     recovery's counter and gap), since the records on disk still hold the
//     versions before it;
//   - the heap's incarnation floor rises 2^20 above every incarnation
//     recovered or dropped: free slots are lifted to it, pages start at it,
//     and a freed object's slot takes at least it, so an id a lost commit
//     handed out never names a later object (32-bit incarnations: 4095
//     unclean restarts before the floor stops rising, then incarnations
//     wrap as a slot's own reuses do).
//
// Thread contract: as Recoverable: recovery before the owner thread starts,
// everything else on partition 0's owner thread.

#ifndef REMEM_TXN_DURABLE_H_
#define REMEM_TXN_DURABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "durability/recoverable.h"
#include "durability/store.h"
#include "txn/heap.h"

namespace remem::txn {

class DurableHeap : public durability::Recoverable {
 public:
  // Turns on the heap's tracking of changed slots.
  explicit DurableHeap(ObjectHeap* heap) : heap_(heap) {
    heap_->TrackChanges();
  }

  // The shape is the pages in use: a heap smaller than that is refused
  // before anything is restored, naming the --txn-memory it needs.
  Status Reserve(uint64_t pairs, uint64_t shape) override;
  uint64_t shape() const override { return heap_->pages(); }
  Status ApplyPut(std::string_view key, std::string_view value,
                  uint64_t version) override;
  Status ApplyDelete(std::string_view key, uint64_t version) override;
  void RaiseVersion(uint64_t version) override {
    if (version > counter_) counter_ = version;
  }
  void NoteDropped(std::string_view key, std::string_view value,
                   uint64_t version) override;
  void RecoveredUncleanly(uint64_t gap) override;
  void EndRecovery() override;
  Status LoadRunNote(std::string_view note) override;
  std::string RunNote() const override;
  uint64_t last_version() const override { return counter_; }
  std::unique_ptr<durability::SnapshotScan> BeginSnapshot() override;

  // Logs the slots heap->changed() names into `store`, as one atomic
  // group, and clears them; false if there were none.
  bool LogChanged(durability::PartitionStore* store);

  // The key of the slot at `offset`.
  static std::string KeyOf(uint64_t offset);

 private:
  ObjectHeap* heap_;
  uint64_t counter_ = 0;
  std::string value_;  // reused for every record logged
  // Each unclean recovery's counter and the gap its objects moved up by:
  // an object restored from a record older than that counter moves up by
  // that gap again (the record holds the version before it).
  struct Skip {
    uint64_t counter;
    uint64_t gap;
  };
  std::vector<Skip> skips_;
  // Recovery only: each slot restored and its record's counter, in order;
  // what dropped records held.
  std::vector<std::pair<uint64_t, uint64_t>> restored_;
  uint32_t dropped_incarnation_ = 0;
  uint64_t dropped_version_ = 0;
};

}  // namespace remem::txn

#endif  // REMEM_TXN_DURABLE_H_
