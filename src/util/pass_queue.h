// util::PassQueue: a FIFO run one pass at a time, from which a run may be
// entered again. Worker::Progress keeps what it delivers (messages,
// completions, deferred calls) in these: a pass runs the entries queued
// before it, and entries queued meanwhile wait for a later pass, so a
// callback that issues an operation completing at once cannot keep a pass
// from ending. A callback that polls or waits (inside it, a nested pass)
// runs the entries after its own, instead of leaving them to the pass it
// is part of: they were ready, and a wait for them would never end (a
// WaitAll inside a callback did, for the other answers of its message).
//
// Thread contract: one thread (its worker's).

#ifndef REMEM_UTIL_PASS_QUEUE_H_
#define REMEM_UTIL_PASS_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace remem::util {

template <typename T>
class PassQueue {
 public:
  template <typename... Args>
  void Emplace(Args&&... args) {
    items_.emplace_back(std::forward<Args>(args)...);
  }
  bool empty() const { return next_ == base_ + items_.size(); }
  // Entries queued and not yet taken by a pass.
  size_t size() const { return base_ + items_.size() - next_; }

  // Runs `fn(T&&)` on each entry queued before this call, in order; a
  // nested RunPass (from inside `fn`) takes the next ones, and this pass
  // then skips what it took. Returns the entries this call ran.
  template <typename Fn>
  size_t RunPass(Fn&& fn) {
    const uint64_t end = base_ + items_.size();
    size_t ran = 0;
    while (next_ < end) {
      T item = std::move(items_[next_ - base_]);
      ++next_;
      Compact();
      fn(std::move(item));
      ++ran;
    }
    return ran;
  }

  // Drops the entries not yet taken for which `pred(const T&)` holds
  // (their owner is gone). Entries keep their places, so passes under way
  // are undisturbed: `drop(T&)` empties each instead.
  template <typename Pred, typename Drop>
  void DropIf(Pred&& pred, Drop&& drop) {
    for (size_t i = next_ - base_; i < items_.size(); ++i) {
      if (pred(static_cast<const T&>(items_[i]))) drop(items_[i]);
    }
  }

 private:
  // Entries are numbered from 0 for the queue's life: a pass remembers
  // where it ends by number, which compaction does not change.
  void Compact() {
    const size_t taken = next_ - base_;
    if (taken == items_.size()) {
      items_.clear();  // keeps the capacity for the next pass
      base_ = next_;
    } else if (taken >= 64 && taken * 2 >= items_.size()) {
      items_.erase(items_.begin(), items_.begin() + long(taken));
      base_ = next_;
    }
  }

  std::vector<T> items_;
  uint64_t base_ = 0;  // the number of items_[0]
  uint64_t next_ = 0;  // the number of the next entry to run
};

}  // namespace remem::util

#endif  // REMEM_UTIL_PASS_QUEUE_H_
