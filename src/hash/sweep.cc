#include "hash/sweep.h"

#include <algorithm>
#include <utility>

namespace remem::hash {

TableSweep::TableSweep(const Table* table, Filter wanted)
    : table_(table),
      wanted_(std::move(wanted)),
      generation_(table->growths()) {}

void TableSweep::OnChange(std::string_view key, uint64_t from, uint64_t to) {
  // Only a move from the unscanned part into the scanned one hides a key
  // (a write is not the sweep's to find; a move after the scan is over
  // cannot hide anything).
  if (done_ || from == Table::kNotMoved || from < cursor_ || to >= cursor_) {
    return;
  }
  if (wanted_(key)) moved_.emplace(key);
}

bool TableSweep::Step(uint64_t max_buckets, std::vector<std::string>* keys) {
  if (done_) return true;
  if (table_->growths() != generation_) {
    generation_ = table_->growths();
    cursor_ = 0;
    moved_.clear();
    ++restarts_;
  }
  cursor_ =
      table_->ScanBuckets(cursor_, std::max<uint64_t>(max_buckets, 1),
                          [&](std::string_view k, std::string_view, uint64_t) {
                            if (wanted_(k)) keys->emplace_back(k);
                          });
  if (cursor_ < table_->num_buckets()) return false;
  moved_keys_ += moved_.size();
  for (auto it = moved_.begin(); it != moved_.end();) {
    keys->push_back(std::move(moved_.extract(it++).value()));
  }
  done_ = true;
  return true;
}

}  // namespace remem::hash
