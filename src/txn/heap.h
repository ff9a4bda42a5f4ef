// txn::ObjectHeap: the objects one server keeps (FaRM's transactional
// objects, on one machine) in the object service's regions, and the commit
// of transactions over them (txn/wire.h has the layout).
//
//   - Slots: the heap's 1 MiB pages go to size classes on first need, and a
//     page is cut into slots of its class for good; free slots are kept per
//     class. Reserve takes one for a connection (the object does not exist
//     yet: version 0); a commit's kCreate entry makes it an object, Release
//     (or the connection closing, or the commit failing) gives it back.
//   - Commit checks every entry first (versions as read, slots reserved by
//     this connection, no object twice), then applies them all: every
//     object written is first made odd (locked, in FaRM's words: readers
//     copying it retry), then written with its new bytes, checksums and an
//     even version two higher. The table runs on one thread, so commits
//     are applied one at a time: each is atomic and they are serializable
//     in the order they run.
//   - A freed object's slot (or a released reservation) gets a new
//     incarnation before it is reused, so an ObjectId of the old one never
//     names the new one; its page keeps its class, so the header stays
//     where readers look for it (type-stable memory, BRIEF's second rule).
//   - A page's slots start at the heap's first incarnation: 1 for a heap
//     whose slots are recovered from a data directory (their incarnations
//     survive a restart), a value drawn anew on every start of a server
//     without one, so that an id of its previous run (whose slots started
//     at that run's value) names no object of this one, unless the two
//     values fall within a slot's reuses of each other (a chance of about
//     one in 2^32 for a slot reused a few times).
//
// Thread contract: single-threaded (the service runs it on partition 0's
// owner thread); the counters are read from any thread.

#ifndef REMEM_TXN_HEAP_H_
#define REMEM_TXN_HEAP_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "remem/status.h"
#include "txn/codec.h"
#include "txn/wire.h"

namespace remem::txn {

class ObjectHeap {
 public:
  struct Region {
    uint32_t id;
    uint8_t* base;
    uint64_t length;  // a multiple of kPageBytes; all but the last are
                      // kRegionBytes
  };
  struct Counters {
    std::atomic<uint64_t> objects{0};
    std::atomic<uint64_t> reserved{0};
    std::atomic<uint64_t> bytes_used{0};  // slots of objects and reservations
    std::atomic<uint64_t> pages_used{0};
    std::atomic<uint64_t> commits{0};
    std::atomic<uint64_t> conflicts{0};
  };

  // `first_incarnation`: the incarnation of every slot of a page when it is
  // given to a class (0 is taken as 1: an all-zero id names nothing).
  explicit ObjectHeap(std::vector<Region> regions,
                      uint32_t first_incarnation = 1);
  ObjectHeap(const ObjectHeap&) = delete;
  ObjectHeap& operator=(const ObjectHeap&) = delete;

  uint64_t heap_bytes() const { return heap_bytes_; }
  uint32_t first_incarnation() const { return first_incarnation_; }
  const std::vector<Region>& regions() const { return regions_; }
  const Counters& counters() const { return counters_; }

  // A slot for an object of up to `capacity` bytes, reserved for `owner`.
  // InvalidArgument past kMaxObjectBytes; OutOfMemory when no slot of the
  // class is free and no page is left.
  Result<TxnObjectIdWire> Reserve(uint32_t capacity, uint64_t owner);
  // Gives back a slot `owner` reserved (InvalidArgument if it did not;
  // SlotOf's errors for an id that names no slot).
  Status Release(const TxnObjectIdWire& id, uint64_t owner);
  // Checks and applies a transaction of `owner` (see above): the committed
  // version of each kWrite and kCreate entry, in order. Conflict (an
  // object read has changed or is gone), NotFound (a blind write or free
  // of no object, or an id that names no slot), InvalidArgument (an id
  // no slot could have, an object twice, data past
  // the capacity, a kCreate of a slot `owner` did not reserve); on any
  // error nothing is applied and the commit's reserved slots are released.
  Result<std::vector<uint64_t>> Commit(const std::vector<CommitEntry>& entries,
                                       uint64_t owner);
  // The object at `id` as committed (NotFound if there is none).
  Result<std::pair<uint64_t, std::string>> Read(
      const TxnObjectIdWire& id) const;
  // Releases every slot `owner` reserved (its connection closed).
  void DropOwner(uint64_t owner);

  // --- durability (txn/durable.h)
  // With tracking on, the slots whose state Release, Commit or DropOwner
  // changed since the last ClearChanged() (an object written, created or
  // freed, a reservation given back), in order; a call changes a slot at
  // most once. Reserve changes no slot's state (a slot reserved and lost is
  // free again).
  void TrackChanges() { track_changes_ = true; }
  const std::vector<uint64_t>& changed() const { return changed_; }
  void ClearChanged() { changed_.clear(); }
  // Pages [0, pages()) may be in use; a page's class, or kNoClass.
  uint64_t pages() const { return next_page_; }
  uint8_t page_class(uint64_t page) const { return page_class_[page]; }
  static constexpr uint8_t kNoClass = 0xff;
  // Encodes the state of the slot at `offset` (of a page in use) into
  // `value` (a TxnSlotRecord and the object's bytes); false if it has none
  // worth keeping (a slot never used: free at its first incarnation).
  bool SlotRecord(uint64_t offset, std::string* value) const;
  // The same, for any slot of a page in use.
  void EncodeSlot(uint64_t offset, std::string* value) const;
  // Recovery, on a new heap, before it serves: the slot at `offset` as
  // `value` (SlotRecord's) says. OutOfMemory if the heap is too small for
  // it; Corruption if the record is malformed or its class is not its
  // page's.
  Status RestoreSlot(uint64_t offset, std::string_view value);
  // Recovery is over: free lists and page accounting from what was
  // restored; every free slot below the incarnation floor is lifted to it.
  void EndRestore();
  // The incarnation floor (0: none): no slot is handed out, nor a page's
  // slots started, at an incarnation below it, and a freed slot's next
  // incarnation is at least it. Raised past every incarnation a run that
  // may have lost commits could have issued (txn/durable.h); kept in the
  // store's run file. Recovery only.
  uint32_t incarnation_floor() const { return incarnation_floor_; }
  void set_incarnation_floor(uint32_t floor) { incarnation_floor_ = floor; }
  // The highest incarnation of any slot of a page in use.
  uint32_t MaxIncarnation() const;
  // Recovery: the object at `offset` (if the slot holds one) moves `by`
  // versions up (even), its bytes as they are.
  void RaiseObjectVersion(uint64_t offset, uint64_t by);

 private:
  uint8_t* At(uint64_t offset) const;
  // SlotRecord's encoding of the slot at `offset`, whose header is `h`.
  void Encode(uint64_t offset, const ObjectHeader& h, std::string* value) const;
  ObjectHeader HeaderOf(uint64_t offset) const;
  // Publishes `h` (and, first, `data` of h.size bytes) into the slot at
  // `offset`: the bytes and the header's other words, then its version.
  void Publish(uint64_t offset, ObjectHeader h, std::string_view data);
  // Marks the slot's header odd (a commit is writing it).
  void Lock(uint64_t offset, uint64_t odd_version);
  // The offset of the slot `id` names, if `id` is one (its capacity that of
  // its page's class): InvalidArgument if no slot could have it (past the
  // heap, misaligned, a capacity no class has), NotFound if it names no
  // slot of its page's class.
  Result<uint64_t> SlotOf(const TxnObjectIdWire& id) const;
  Status NewPage(size_t cls);
  // Gives `page` to class `cls`: every slot free at the first incarnation.
  void ClassPage(uint64_t page, size_t cls);
  // Puts a slot back on its class's free list with a new incarnation.
  void Recycle(uint64_t offset, size_t cls);
  // The incarnation a page's slots start at.
  uint32_t PageIncarnation() const {
    return std::max(first_incarnation_, incarnation_floor_);
  }
  void Unreserve(uint64_t offset);

  std::vector<Region> regions_;
  uint64_t heap_bytes_ = 0;
  uint32_t first_incarnation_;
  uint32_t incarnation_floor_ = 0;
  std::vector<uint8_t> page_class_;  // per page
  uint64_t next_page_ = 0;
  // Pages below next_page_ with no class (after a recovery), lowest last.
  std::vector<uint64_t> spare_pages_;
  bool track_changes_ = false;
  std::vector<uint64_t> changed_;
  std::array<std::vector<uint64_t>, kNumClasses> free_;
  std::unordered_map<uint64_t, uint64_t> reserved_;  // slot -> owner
  Counters counters_;
};

}  // namespace remem::txn

#endif  // REMEM_TXN_HEAP_H_
