#include "txn/durable.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace remem::txn {

namespace {

// Walks the slots of the pages in use in heap order. The heap only grows
// (pages keep their class), so every slot present for the whole walk is
// emitted; a slot changed behind the cursor is in the log after the
// snapshot's LSN, which recovery applies over it.
class HeapScan final : public durability::SnapshotScan {
 public:
  HeapScan(const ObjectHeap* heap, const uint64_t* counter)
      : heap_(heap), counter_(counter) {}

  bool Step(durability::SnapshotSink* sink, uint64_t budget) override {
    shape_ = std::max(shape_, heap_->pages());
    for (uint64_t work = 0; work < budget; ++work) {
      const uint64_t page = offset_ / kPageBytes;
      if (page >= heap_->pages()) return true;
      const uint8_t cls = heap_->page_class(page);
      if (cls == ObjectHeap::kNoClass) {
        offset_ = (page + 1) * kPageBytes;
        continue;
      }
      if (heap_->SlotRecord(offset_, &value_)) {
        sink->Add(DurableHeap::KeyOf(offset_), value_, *counter_);
      }
      offset_ += ClassBytes(cls);
    }
    return false;
  }
  uint64_t shape() const override { return shape_; }

 private:
  const ObjectHeap* heap_;
  uint64_t shape_ = 0;
  const uint64_t* counter_;
  uint64_t offset_ = 0;
  std::string value_;
};

}  // namespace

std::string DurableHeap::KeyOf(uint64_t offset) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, offset >>= 8) key[i] = char(offset & 0xff);
  return key;
}

Status DurableHeap::Reserve(uint64_t /*pairs*/, uint64_t shape) {
  if (shape * kPageBytes <= heap_->heap_bytes()) return Status::OK();
  return Status::OutOfMemory(
      "the data directory holds objects in " + std::to_string(shape) +
      " MiB of object heap, more than this server's " +
      std::to_string(heap_->heap_bytes() >> 20) +
      " MiB: restart with --txn-memory of at least " + std::to_string(shape) +
      "M (the data directory is unchanged)");
}

Status DurableHeap::ApplyPut(std::string_view key, std::string_view value,
                             uint64_t version) {
  if (key.size() != 8) {
    return Status::Corruption("an object record with a key of " +
                              std::to_string(key.size()) + " bytes");
  }
  uint64_t offset = 0;
  for (char c : key) offset = offset << 8 | uint8_t(c);
  RaiseVersion(version);
  REMEM_RETURN_IF_ERROR(heap_->RestoreSlot(offset, value));
  restored_.emplace_back(offset, version);
  return Status::OK();
}

namespace {

// Incarnations a run's lost commits may have used past those recovered.
constexpr uint32_t kIncarnationGap = uint32_t{1} << 20;

}  // namespace

void DurableHeap::NoteDropped(std::string_view key, std::string_view value,
                              uint64_t /*version*/) {
  TxnSlotRecord rec{};
  if (key.size() != 8 || value.size() < sizeof(rec)) return;
  std::memcpy(&rec, value.data(), sizeof(rec));
  if (rec.magic != kSlotRecordMagic) return;
  dropped_incarnation_ = std::max(dropped_incarnation_, rec.incarnation);
  dropped_version_ = std::max(dropped_version_, rec.version);
}

void DurableHeap::RecoveredUncleanly(uint64_t gap) {
  // Every object recovered moves above any version a lost or dropped
  // commit gave it (versions stay even).
  const uint64_t object_gap = gap + (dropped_version_ & ~uint64_t{1});
  skips_.push_back({counter_, object_gap});
  const uint64_t most = std::max<uint64_t>(
      {heap_->MaxIncarnation(), dropped_incarnation_,
       heap_->incarnation_floor(), heap_->first_incarnation()});
  const uint64_t floor = std::min<uint64_t>(
      most + kIncarnationGap, std::numeric_limits<uint32_t>::max());
  heap_->set_incarnation_floor(uint32_t(floor));
}

void DurableHeap::EndRecovery() {
  if (!skips_.empty()) {
    // The skips come in counter order (the counter only grows): after[k]
    // is the sum of the gaps of skips k and later.
    std::vector<uint64_t> after(skips_.size() + 1, 0);
    for (size_t k = skips_.size(); k-- > 0;) {
      after[k] = after[k + 1] + skips_[k].gap;
    }
    // A slot's last restore is its state.
    std::stable_sort(
        restored_.begin(), restored_.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < restored_.size(); ++i) {
      if (i + 1 < restored_.size() &&
          restored_[i + 1].first == restored_[i].first) {
        continue;
      }
      // The skips after this record's counter.
      const auto first = std::upper_bound(
          skips_.begin(), skips_.end(), restored_[i].second,
          [](uint64_t c, const Skip& s) { return c < s.counter; });
      heap_->RaiseObjectVersion(restored_[i].first,
                                after[size_t(first - skips_.begin())]);
    }
  }
  restored_.clear();
  restored_.shrink_to_fit();
  heap_->EndRestore();
}

// The note: the incarnation floor, then each skip's counter and gap (8
// bytes each, in memory order: the file is this machine's).
std::string DurableHeap::RunNote() const {
  std::string note(8 + 16 * skips_.size(), '\0');
  const uint64_t floor = heap_->incarnation_floor();
  std::memcpy(note.data(), &floor, 8);
  for (size_t i = 0; i < skips_.size(); ++i) {
    std::memcpy(note.data() + 8 + 16 * i, &skips_[i].counter, 8);
    std::memcpy(note.data() + 16 + 16 * i, &skips_[i].gap, 8);
  }
  return note;
}

Status DurableHeap::LoadRunNote(std::string_view note) {
  if (note.empty()) return Status::OK();
  uint64_t floor = 0;
  if (note.size() >= 8) std::memcpy(&floor, note.data(), 8);
  if (note.size() < 8 || (note.size() - 8) % 16 != 0 ||
      floor > std::numeric_limits<uint32_t>::max()) {
    return Status::Corruption("the object heap's run note is malformed");
  }
  heap_->set_incarnation_floor(uint32_t(floor));
  skips_.resize((note.size() - 8) / 16);
  for (size_t i = 0; i < skips_.size(); ++i) {
    std::memcpy(&skips_[i].counter, note.data() + 8 + 16 * i, 8);
    std::memcpy(&skips_[i].gap, note.data() + 16 + 16 * i, 8);
  }
  return Status::OK();
}

Status DurableHeap::ApplyDelete(std::string_view /*key*/,
                                uint64_t /*version*/) {
  return Status::Corruption(
      "a delete record in the object heap's log (it logs none)");
}

std::unique_ptr<durability::SnapshotScan> DurableHeap::BeginSnapshot() {
  return std::make_unique<HeapScan>(heap_, &counter_);
}

bool DurableHeap::LogChanged(durability::PartitionStore* store) {
  const std::vector<uint64_t>& changed = heap_->changed();
  for (size_t i = 0; i < changed.size(); ++i) {
    heap_->EncodeSlot(changed[i], &value_);
    store->LogPut(KeyOf(changed[i]), value_, ++counter_,
                  i + 1 < changed.size());
  }
  const bool any = !changed.empty();
  heap_->ClearChanged();
  return any;
}

}  // namespace remem::txn
