#include "txn/heap.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "hash/layout.h"  // StoreWords

namespace remem::txn {

namespace {

size_t ClassFor(uint32_t capacity) {
  size_t c = 0;
  while (c < kNumClasses && CapacityOf(c) < capacity) ++c;
  return c;
}

std::string Describe(const TxnObjectIdWire& id) {
  return std::to_string(id.address) + ":" + std::to_string(id.incarnation) +
         ":" + std::to_string(id.capacity);
}

}  // namespace

ObjectHeap::ObjectHeap(std::vector<Region> regions, uint32_t first_incarnation)
    : regions_(std::move(regions)),
      first_incarnation_(first_incarnation == 0 ? 1 : first_incarnation) {
  for (const Region& r : regions_) heap_bytes_ += r.length;
  page_class_.assign(heap_bytes_ / kPageBytes, kNoClass);
}

uint8_t* ObjectHeap::At(uint64_t offset) const {
  const Region& r = regions_[offset / kRegionBytes];
  return r.base + offset % kRegionBytes;
}

ObjectHeader ObjectHeap::HeaderOf(uint64_t offset) const {
  // The table is the heap's only writer: its own reads need no care.
  ObjectHeader h;
  std::memcpy(&h, At(offset), sizeof(h));
  return h;
}

void ObjectHeap::Lock(uint64_t offset, uint64_t odd_version) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(At(offset)))
      .store(odd_version, std::memory_order_release);
}

void ObjectHeap::Publish(uint64_t offset, ObjectHeader h,
                         std::string_view data) {
  uint8_t* slot = At(offset);
  h.checksum = DataChecksum(h, data.data(), data.size());
  h.header_check = HeaderCheck(h, CapacityOf(page_class_[offset / kPageBytes]));
  // Whole words (the slot's capacity is a multiple of 32): the last one
  // padded with zeros.
  uint8_t* bytes = slot + sizeof(ObjectHeader);
  const size_t whole = data.size() & ~size_t{7};
  hash::StoreWords(bytes, data.data(), whole);
  if (whole < data.size()) {
    uint8_t tail[8] = {};
    std::memcpy(tail, data.data() + whole, data.size() - whole);
    hash::StoreWords(bytes + whole, tail, 8);
  }
  // The header's words after the version, then the version: a reader that
  // sees the new version with older words fails header_check.
  hash::StoreWords(slot + 8, reinterpret_cast<const uint8_t*>(&h) + 8,
                   sizeof(h) - 8);
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(slot))
      .store(h.version, std::memory_order_release);
}

Result<uint64_t> ObjectHeap::SlotOf(const TxnObjectIdWire& id) const {
  if (!IsSlotShaped(id.address, id.capacity)) {
    return Status::InvalidArgument("object " + Describe(id) +
                                   " is not an object id");
  }
  if (id.address >= heap_bytes_) {
    return Status::InvalidArgument("object " + Describe(id) +
                                   " is not an object id (past the heap)");
  }
  // An id of a slot this heap does not have (yet): one of an earlier
  // incarnation of the server (it restarted), or made up.
  const uint8_t cls = page_class_[id.address / kPageBytes];
  if (cls == kNoClass || CapacityOf(cls) != id.capacity ||
      (id.address % kPageBytes) % ClassBytes(cls) != 0) {
    return Status::NotFound("no object " + Describe(id));
  }
  return id.address;
}

void ObjectHeap::ClassPage(uint64_t page, size_t cls) {
  page_class_[page] = uint8_t(cls);
  counters_.pages_used.fetch_add(1, std::memory_order_relaxed);
  for (uint64_t s = 0; s < kPageBytes / ClassBytes(cls); ++s) {
    ObjectHeader h{};
    h.incarnation = PageIncarnation();
    Publish(page * kPageBytes + s * ClassBytes(cls), h, {});
  }
}

Status ObjectHeap::NewPage(size_t cls) {
  uint64_t page = next_page_;
  if (!spare_pages_.empty()) {
    page = spare_pages_.back();
    spare_pages_.pop_back();
  } else if (next_page_ >= page_class_.size()) {
    return Status::OutOfMemory(
        "the object heap is full for objects of this size: no free slot of "
        "their class and no page left without a class (pages keep their "
        "class for good; --txn-memory " +
        std::to_string(heap_bytes_) + " bytes)");
  } else {
    ++next_page_;
  }
  ClassPage(page, cls);
  // Lowest first out of the list.
  for (uint64_t s = kPageBytes / ClassBytes(cls); s-- > 0;) {
    free_[cls].push_back(page * kPageBytes + s * ClassBytes(cls));
  }
  return Status::OK();
}

void ObjectHeap::Recycle(uint64_t offset, size_t cls) {
  ObjectHeader h = HeaderOf(offset);
  ObjectHeader next{};
  next.incarnation = h.incarnation + 1 == 0 ? 1 : h.incarnation + 1;
  // Past every incarnation a lost commit may have issued.
  if (next.incarnation < incarnation_floor_) {
    next.incarnation = incarnation_floor_;
  }
  Publish(offset, next, {});
  free_[cls].push_back(offset);
  if (track_changes_) changed_.push_back(offset);
}

Result<TxnObjectIdWire> ObjectHeap::Reserve(uint32_t capacity, uint64_t owner) {
  if (capacity > kMaxObjectBytes) {
    return Status::InvalidArgument("an object holds at most " +
                                   std::to_string(kMaxObjectBytes) +
                                   " bytes, not " + std::to_string(capacity));
  }
  const size_t cls = ClassFor(capacity);
  if (free_[cls].empty()) REMEM_RETURN_IF_ERROR(NewPage(cls));
  const uint64_t offset = free_[cls].back();
  free_[cls].pop_back();
  reserved_[offset] = owner;
  counters_.reserved.fetch_add(1, std::memory_order_relaxed);
  counters_.bytes_used.fetch_add(ClassBytes(cls), std::memory_order_relaxed);
  TxnObjectIdWire id{};
  id.address = offset;
  id.incarnation = HeaderOf(offset).incarnation;
  id.capacity = CapacityOf(cls);
  return id;
}

void ObjectHeap::Unreserve(uint64_t offset) {
  reserved_.erase(offset);
  const size_t cls = page_class_[offset / kPageBytes];
  counters_.reserved.fetch_sub(1, std::memory_order_relaxed);
  counters_.bytes_used.fetch_sub(ClassBytes(cls), std::memory_order_relaxed);
  // A new incarnation: the id handed out never names a later object.
  Recycle(offset, cls);
}

Status ObjectHeap::Release(const TxnObjectIdWire& id, uint64_t owner) {
  auto slot = SlotOf(id);
  if (!slot.ok()) return slot.status();
  auto it = reserved_.find(*slot);
  if (it == reserved_.end() || it->second != owner ||
      HeaderOf(*slot).incarnation != id.incarnation) {
    return Status::InvalidArgument("object " + Describe(id) +
                                   " is not reserved by this session");
  }
  Unreserve(*slot);
  return Status::OK();
}

Result<std::vector<uint64_t>> ObjectHeap::Commit(
    const std::vector<CommitEntry>& entries, uint64_t owner) {
  // Check everything first: the slots, that none comes twice, then each
  // entry.
  std::vector<uint64_t> slots(entries.size());
  Status st;
  for (size_t i = 0; i < entries.size() && st.ok(); ++i) {
    auto slot = SlotOf(entries[i].id);
    if (slot.ok()) {
      slots[i] = *slot;
    } else {
      st = slot.status();
    }
  }
  // A slot named twice by one id is the caller's mistake. Named by two
  // incarnations, it is an object that was freed, its slot given to an
  // object this transaction allocated or to another it read: the older id
  // is gone, and the checks below say so as for any object gone (Conflict
  // if it was read, NotFound if not), as they must for Run to retry.
  bool reused_slot = false;
  if (st.ok()) {
    std::vector<std::pair<uint64_t, uint64_t>> sorted(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      sorted[i] = {slots[i], entries[i].id.incarnation};
    }
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 1; i < sorted.size() && st.ok(); ++i) {
      if (sorted[i].first != sorted[i - 1].first) continue;
      if (sorted[i].second == sorted[i - 1].second) {
        st = Status::InvalidArgument("the object at " +
                                     std::to_string(sorted[i].first) +
                                     " appears twice in one commit");
      } else {
        reused_slot = true;
      }
    }
  }
  for (size_t i = 0; i < entries.size() && st.ok(); ++i) {
    const CommitEntry& e = entries[i];
    const ObjectHeader h = HeaderOf(slots[i]);
    const bool live = h.version != 0 && h.incarnation == e.id.incarnation;
    if ((e.op == TxnOp::kWrite || e.op == TxnOp::kCreate) &&
        e.data.size() > e.id.capacity) {
      st = Status::InvalidArgument("object " + Describe(e.id) + " holds " +
                                   std::to_string(e.id.capacity) +
                                   " bytes, not " +
                                   std::to_string(e.data.size()));
      break;
    }
    switch (e.op) {
      case TxnOp::kCheck:
        if (e.version == 0 || !live || h.version != e.version) {
          st = Status::Conflict("object " + Describe(e.id) +
                                " changed since it was read");
        }
        break;
      case TxnOp::kWrite:
      case TxnOp::kFree:
        if (e.version != 0 && (!live || h.version != e.version)) {
          st = Status::Conflict("object " + Describe(e.id) +
                                " changed since it was read");
        } else if (!live) {
          st = Status::NotFound("no object " + Describe(e.id));
        }
        break;
      case TxnOp::kCreate: {
        auto it = reserved_.find(slots[i]);
        if (it == reserved_.end() || it->second != owner ||
            h.incarnation != e.id.incarnation) {
          st = Status::InvalidArgument("object " + Describe(e.id) +
                                       " is not reserved by this session");
        }
        break;
      }
    }
  }
  if (st.ok() && reused_slot) {
    // Unreachable: at most one incarnation of a slot is its current one,
    // and every entry's check above needs it. Never write a slot twice.
    st = Status::Internal("a slot named by two incarnations passed its checks");
  }
  if (!st.ok()) {
    // Nothing applied; the commit's reservations are given back.
    for (const CommitEntry& e : entries) {
      if (e.op == TxnOp::kCreate) (void)Release(e.id, owner);
    }
    if (st.code() == StatusCode::kConflict) {
      counters_.conflicts.fetch_add(1, std::memory_order_relaxed);
    }
    return st;
  }
  // Lock every object written (odd), then write each.
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].op == TxnOp::kCheck) continue;
    Lock(slots[i], HeaderOf(slots[i]).version + 1);
  }
  std::vector<uint64_t> versions;
  for (size_t i = 0; i < entries.size(); ++i) {
    const CommitEntry& e = entries[i];
    if (e.op == TxnOp::kCheck) continue;
    ObjectHeader h = HeaderOf(slots[i]);  // odd: version + 1
    const size_t cls = page_class_[slots[i] / kPageBytes];
    if (e.op == TxnOp::kFree) {
      counters_.objects.fetch_sub(1, std::memory_order_relaxed);
      counters_.bytes_used.fetch_sub(ClassBytes(cls),
                                     std::memory_order_relaxed);
      Recycle(slots[i], cls);
      continue;
    }
    if (e.op == TxnOp::kCreate) {
      reserved_.erase(slots[i]);
      counters_.reserved.fetch_sub(1, std::memory_order_relaxed);
      counters_.objects.fetch_add(1, std::memory_order_relaxed);
    }
    ObjectHeader next{};
    next.version = h.version + 1;  // even: two past the last committed
    next.incarnation = h.incarnation;
    next.size = uint32_t(e.data.size());
    Publish(slots[i], next, e.data);
    if (track_changes_) changed_.push_back(slots[i]);
    versions.push_back(next.version);
  }
  counters_.commits.fetch_add(1, std::memory_order_relaxed);
  return versions;
}

Result<std::pair<uint64_t, std::string>> ObjectHeap::Read(
    const TxnObjectIdWire& id) const {
  auto slot = SlotOf(id);
  if (!slot.ok()) return slot.status();
  const ObjectHeader h = HeaderOf(*slot);
  if (h.version == 0 || h.incarnation != id.incarnation) {
    return Status::NotFound("no object " + Describe(id));
  }
  const auto* data = At(*slot) + sizeof(ObjectHeader);
  return std::make_pair(
      h.version, std::string(reinterpret_cast<const char*>(data), h.size));
}

void ObjectHeap::DropOwner(uint64_t owner) {
  std::vector<uint64_t> mine;
  for (const auto& [slot, who] : reserved_) {
    if (who == owner) mine.push_back(slot);
  }
  for (uint64_t slot : mine) Unreserve(slot);
}

bool ObjectHeap::SlotRecord(uint64_t offset, std::string* value) const {
  const ObjectHeader h = HeaderOf(offset);
  // (A free slot below the floor is lifted to it at recovery, as a slot
  // never used is started at it.)
  if (h.version == 0 && (h.incarnation == first_incarnation_ ||
                         h.incarnation <= incarnation_floor_)) {
    return false;
  }
  Encode(offset, h, value);
  return true;
}

void ObjectHeap::EncodeSlot(uint64_t offset, std::string* value) const {
  Encode(offset, HeaderOf(offset), value);
}

void ObjectHeap::Encode(uint64_t offset, const ObjectHeader& h,
                        std::string* value) const {
  TxnSlotRecord rec{};
  rec.magic = kSlotRecordMagic;
  rec.capacity = CapacityOf(page_class_[offset / kPageBytes]);
  rec.version = h.version;  // even: only commits write, and they end even
  rec.incarnation = h.incarnation;
  rec.size = h.version == 0 ? 0 : h.size;
  value->assign(reinterpret_cast<const char*>(&rec), sizeof(rec));
  value->append(
      reinterpret_cast<const char*>(At(offset)) + sizeof(ObjectHeader),
      rec.size);
}

Status ObjectHeap::RestoreSlot(uint64_t offset, std::string_view value) {
  TxnSlotRecord rec{};
  if (value.size() < sizeof(rec)) {
    return Status::Corruption("an object record of " +
                              std::to_string(value.size()) + " bytes");
  }
  std::memcpy(&rec, value.data(), sizeof(rec));
  const std::string_view data = value.substr(sizeof(rec));
  if (rec.magic != kSlotRecordMagic || !IsCapacity(rec.capacity) ||
      rec.size != data.size() || rec.size > rec.capacity ||
      rec.version % 2 != 0 || rec.incarnation == 0 ||
      (rec.version == 0 && rec.size != 0)) {
    return Status::Corruption("a malformed object record for heap offset " +
                              std::to_string(offset));
  }
  const size_t cls = ClassFor(rec.capacity);
  if (offset >= heap_bytes_) {
    const uint64_t need = (offset / kPageBytes + 1) * kPageBytes;
    return Status::OutOfMemory(
        "the data directory holds an object at heap offset " +
        std::to_string(offset) + ", past this server's object heap of " +
        std::to_string(heap_bytes_) + " bytes: restart with --txn-memory " +
        "of at least " + std::to_string(need >> 20) +
        "M (the data directory is unchanged)");
  }
  const uint64_t page = offset / kPageBytes;
  if (offset % kPageBytes % ClassBytes(cls) != 0 ||
      (page_class_[page] != kNoClass && page_class_[page] != cls)) {
    return Status::Corruption("the object record for heap offset " +
                              std::to_string(offset) +
                              " is not a slot of its page's class");
  }
  if (page_class_[page] == kNoClass) ClassPage(page, cls);
  ObjectHeader h{};
  h.version = rec.version;
  h.incarnation = rec.incarnation;
  h.size = rec.size;
  Publish(offset, h, data);
  if (rec.version != 0) {
    counters_.objects.fetch_add(1, std::memory_order_relaxed);
    counters_.bytes_used.fetch_add(ClassBytes(cls), std::memory_order_relaxed);
  }
  return Status::OK();
}

void ObjectHeap::EndRestore() {
  next_page_ = 0;
  for (uint64_t p = 0; p < page_class_.size(); ++p) {
    if (page_class_[p] != kNoClass) next_page_ = p + 1;
  }
  // Lowest first out of every list.
  for (uint64_t p = next_page_; p-- > 0;) {
    const uint8_t cls = page_class_[p];
    if (cls == kNoClass) {
      spare_pages_.push_back(p);
      continue;
    }
    for (uint64_t s = kPageBytes / ClassBytes(cls); s-- > 0;) {
      const uint64_t offset = p * kPageBytes + s * ClassBytes(cls);
      const ObjectHeader h = HeaderOf(offset);
      if (h.version != 0) continue;
      if (h.incarnation < incarnation_floor_) {
        ObjectHeader lifted{};
        lifted.incarnation = incarnation_floor_;
        Publish(offset, lifted, {});
      }
      free_[cls].push_back(offset);
    }
  }
}

uint32_t ObjectHeap::MaxIncarnation() const {
  uint32_t most = 0;
  for (uint64_t p = 0; p < page_class_.size(); ++p) {
    const uint8_t cls = page_class_[p];
    if (cls == kNoClass) continue;
    for (uint64_t s = 0; s < kPageBytes / ClassBytes(cls); ++s) {
      most = std::max(
          most, HeaderOf(p * kPageBytes + s * ClassBytes(cls)).incarnation);
    }
  }
  return most;
}

void ObjectHeap::RaiseObjectVersion(uint64_t offset, uint64_t by) {
  ObjectHeader h = HeaderOf(offset);
  if (h.version == 0 || by == 0) return;
  const auto* bytes = At(offset) + sizeof(ObjectHeader);
  const std::string data(reinterpret_cast<const char*>(bytes), h.size);
  h.version += by;
  Publish(offset, h, data);
}

}  // namespace remem::txn
