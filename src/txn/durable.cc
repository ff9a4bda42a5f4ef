#include "txn/durable.h"

#include <algorithm>

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
  return heap_->RestoreSlot(offset, value);
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
