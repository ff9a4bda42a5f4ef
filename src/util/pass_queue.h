// util::PassQueue: a FIFO run one pass at a time, whose passes may nest.
// Worker::Progress keeps what it delivers (messages, completions, deferred
// calls) in these. A pass runs the entries queued before it began; entries
// queued meanwhile wait for a later pass, so a callback that issues an
// operation completing at once cannot keep a pass from ending.
//
// A pass nested in an entry's run (a callback that waits) runs, by
// default, only entries queued after every pass under way began: the
// entries those passes hold are theirs, and the nesting stays as shallow
// as the traffic allows (a synchronous call in each of a thousand
// callbacks must not nest a thousand deep). A pass that takes over
// (`take_over`) also runs the entries the passes under way still hold: a
// WaitAll inside a callback does, since what it waits for may be among
// them (it waited for ever for the other answers of its own message); the
// passes it took them from skip them.
//
// Thread contract: one thread (its worker's).

#ifndef REMEM_UTIL_PASS_QUEUE_H_
#define REMEM_UTIL_PASS_QUEUE_H_

#include <algorithm>
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
    items_.push_back(Slot{T(std::forward<Args>(args)...), false});
    ++waiting_;
  }
  bool empty() const { return waiting_ == 0; }
  // Whether a pass starting now would run an entry: one not run, and not
  // held by a pass under way unless the new pass takes over. (empty() also
  // counts the held ones, which a nested pass cannot run: a wait that
  // slept only once nothing was pending spun on them.)
  bool HasRunnable(bool take_over) const {
    if (waiting_ == 0) return false;
    const uint64_t end = base_ + items_.size();
    for (uint64_t i = take_over ? next_ : std::max(next_, held_until_); i < end;
         ++i) {
      if (!items_[i - base_].taken) return true;
    }
    return false;
  }
  // Entries queued and not yet run.
  size_t size() const { return waiting_; }

  // Runs `fn(T&&)` on the entries queued before this call that no pass has
  // run, in order (see above for the entries passes under way hold).
  // Returns the entries this call ran.
  template <typename Fn>
  size_t RunPass(Fn&& fn, bool take_over = false) {
    const uint64_t end = base_ + items_.size();
    uint64_t i = take_over ? next_ : std::max(next_, held_until_);
    const uint64_t outer_held = held_until_;
    held_until_ = std::max(held_until_, end);
    size_t ran = 0;
    for (; i < end; ++i) {
      if (i < next_) i = next_;  // a nested pass ran (and dropped) them
      if (i >= end) break;
      Slot& slot = items_[i - base_];
      if (slot.taken) continue;
      slot.taken = true;
      --waiting_;
      T item = std::move(slot.value);
      Advance();
      fn(std::move(item));
      ++ran;
    }
    held_until_ = outer_held;
    return ran;
  }

  // Whether an entry not yet run (held by a pass under way, or waiting for
  // the next) satisfies `pred(const T&)`.
  template <typename Pred>
  bool AnyWaiting(Pred&& pred) const {
    if (waiting_ == 0) return false;
    for (const Slot& slot : items_) {
      if (!slot.taken && pred(slot.value)) return true;
    }
    return false;
  }
  // Marks the entries not yet run for which `pred(const T&)` holds (their
  // owner is gone) with `drop(T&)`; they keep their places.
  template <typename Pred, typename Drop>
  void DropIf(Pred&& pred, Drop&& drop) {
    for (Slot& slot : items_) {
      if (!slot.taken && pred(static_cast<const T&>(slot.value))) {
        drop(slot.value);
      }
    }
  }

 private:
  struct Slot {
    T value;
    bool taken;  // run (or being run): value is moved from
  };
  // Moves next_ past the entries run, and drops them from the front when
  // that is cheap (entries are numbered for the queue's life, so passes
  // under way keep their places).
  void Advance() {
    while (next_ < base_ + items_.size() && items_[next_ - base_].taken) {
      ++next_;
    }
    const size_t done = next_ - base_;
    if (done == items_.size()) {
      items_.clear();  // keeps the capacity for the next pass
      base_ = next_;
    } else if (done >= 64 && done * 2 >= items_.size()) {
      items_.erase(items_.begin(), items_.begin() + long(done));
      base_ = next_;
    }
  }

  std::vector<Slot> items_;
  uint64_t base_ = 0;        // the number of items_[0]
  uint64_t next_ = 0;        // the first entry not run; all before are
  uint64_t held_until_ = 0;  // entries below: held by passes under way
  size_t waiting_ = 0;       // entries not run
};

}  // namespace remem::util

#endif  // REMEM_UTIL_PASS_QUEUE_H_
