#include "testing/linearizability.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <unordered_set>

namespace remem::testing {

namespace {

struct State {
  bool present = false;
  std::string value;
  std::optional<uint64_t> version;  // nullopt: unknown (an unknown write)
};

// The states `op` can lead to from `s` given what it returned (none if its
// result contradicts `s`). An op with an unknown outcome that may or may not
// have applied is modelled by the search, which may leave it out; here it
// always applies.
void Next(const KvOp& op, const State& s, std::vector<State>* out) {
  out->clear();
  switch (op.kind) {
    case KvOp::kGet: {
      if (op.found != s.present) return;
      State next = s;
      if (op.found) {
        if (op.read_value != s.value) return;
        if (op.version && s.version && *op.version != *s.version) return;
        // A read reveals the version of a write whose outcome was unknown:
        // from now on the register has that version.
        if (op.version && !s.version) next.version = op.version;
      }
      out->push_back(std::move(next));
      return;
    }
    case KvOp::kPut:
      out->push_back({true, op.value, op.returned ? op.version : std::nullopt});
      return;
    case KvOp::kDelete:
      if (op.returned && op.delete_reports && op.succeeded != s.present) return;
      out->push_back({});
      return;
    case KvOp::kCompareAndPut: {
      const bool may_match =
          s.present && (!s.version || *s.version == op.expected_version);
      const bool must_match = may_match && s.version.has_value();
      if (!op.returned) {
        // Unknown outcome: it swapped (if it could) or it did not.
        if (may_match) out->push_back({true, op.value, std::nullopt});
        if (!must_match) out->push_back(s);
        return;
      }
      if (op.succeeded) {
        if (may_match) out->push_back({true, op.value, op.version});
      } else if (!must_match) {
        out->push_back(s);
      }
      return;
    }
    case KvOp::kReadModifyWrite:
      if (op.found != s.present) return;
      if (op.found && op.read_value != s.value) return;
      out->push_back({true, op.value, op.version});
      return;
    case KvOp::kPutIfAbsent: {
      if (!op.returned) {
        // Unknown outcome: it inserted (if it could) or it did not.
        if (!s.present) out->push_back({true, op.value, std::nullopt});
        out->push_back(s);
        return;
      }
      if (op.succeeded != !s.present) return;
      out->push_back(op.succeeded ? State{true, op.value, op.version} : s);
      return;
    }
  }
}

bool SameState(const State& a, const State& b) {
  return a.present == b.present && a.value == b.value && a.version == b.version;
}

// A memo entry: the set of linearized operations and the model state, kept
// small (Lowe's cache, with the set stored relative to the search's
// frontier): `first` is the first operation of known outcome not yet
// linearized (every such one before it is), `marks` lists the operations of
// unknown outcome before `first` that are not linearized, then -1, then
// the non-zero words of the linearized set from `first` on, each as (word
// index, bits at or after `first`). Its size follows the concurrency
// window, not the history.
struct Key {
  uint64_t first = 0;
  std::vector<uint64_t> marks;
  State state;
  bool operator==(const Key& o) const {
    return first == o.first && marks == o.marks && SameState(state, o.state);
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<std::string>()(k.state.value) * 31 + k.state.present;
    if (k.state.version) h ^= std::hash<uint64_t>()(*k.state.version) + 0x9e37;
    h = h * 1099511628211ull ^ k.first;
    for (uint64_t w : k.marks) h = h * 1099511628211ull ^ w;
    return h;
  }
};

}  // namespace

std::string Describe(const KvOp& op) {
  std::string s = "client " + std::to_string(op.client) + " ";
  switch (op.kind) {
    case KvOp::kGet:
      s += "get -> " + (op.found ? "'" + op.read_value + "'" : "absent");
      break;
    case KvOp::kPut:
      s += "put '" + op.value + "'";
      break;
    case KvOp::kDelete:
      s += "delete";
      break;
    case KvOp::kCompareAndPut:
      s += "compare-and-put(v" + std::to_string(op.expected_version) + ", '" +
           op.value + "') -> " + (op.succeeded ? "swapped" : "refused");
      break;
    case KvOp::kPutIfAbsent:
      s += "put-if-absent('" + op.value + "') -> " +
           (op.succeeded ? "inserted" : "refused");
      break;
    case KvOp::kReadModifyWrite:
      s += "read-modify-write " +
           (op.found ? "'" + op.read_value + "'" : std::string("absent")) +
           " -> '" + op.value + "'";
      break;
  }
  if (op.version) s += " [version " + std::to_string(*op.version) + "]";
  s += " called " + std::to_string(op.call_ns);
  s += op.returned ? " returned " + std::to_string(op.return_ns)
                   : " (outcome unknown)";
  if (!op.note.empty()) s += " (" + op.note + ")";
  return s;
}

CheckResult CheckKeyHistory(const std::vector<KvOp>& input,
                            bool initial_present,
                            const std::string& initial_value,
                            std::optional<uint64_t> initial_version) {
  // A get whose result never arrived constrains nothing.
  std::vector<KvOp> ops;
  for (const KvOp& op : input) {
    if (op.kind == KvOp::kGet && !op.returned) continue;
    ops.push_back(op);
  }
  std::sort(ops.begin(), ops.end(),
            [](const KvOp& a, const KvOp& b) { return a.call_ns < b.call_ns; });
  const size_t n = ops.size();
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  auto ret = [&](size_t i) {
    return ops[i].returned ? ops[i].return_ns : kNever;
  };
  size_t must = 0;
  for (const KvOp& op : ops) must += op.returned ? 1 : 0;

  CheckResult result;
  std::vector<size_t> unknown;  // operations of unknown outcome, in order
  for (size_t i = 0; i < n; ++i) {
    if (!ops[i].returned) unknown.push_back(i);
  }
  // The search (depth first) changes one set of linearized operations,
  // linearizing an operation on the way down and undoing it on the way up.
  std::vector<uint64_t> done((n + 63) / 64, 0);
  auto is_done = [&](size_t i) { return (done[i / 64] >> (i % 64) & 1) != 0; };
  auto set_done = [&](size_t i, bool on) {
    if (on) {
      done[i / 64] |= uint64_t{1} << (i % 64);
    } else {
      done[i / 64] &= ~(uint64_t{1} << (i % 64));
    }
  };
  struct Frame {
    size_t op;     // linearized to reach this frame (n: the start)
    State state;   // the model after it
    size_t first;  // first operation of known outcome not linearized
    size_t last;   // one past the highest linearized operation
    size_t linearized_returned;
    std::vector<std::pair<size_t, State>> choices;  // untried
  };
  auto key_of = [&](const Frame& f) {
    Key k;
    k.first = f.first;
    k.state = f.state;
    for (size_t u : unknown) {
      if (u >= f.first) break;
      if (!is_done(u)) k.marks.push_back(u);
    }
    k.marks.push_back(~uint64_t{0});
    for (size_t w = f.first / 64; w * 64 < f.last; ++w) {
      uint64_t bits = done[w];
      if (w == f.first / 64) bits &= ~uint64_t{0} << (f.first % 64);
      if (bits == 0) continue;
      k.marks.push_back(w);
      k.marks.push_back(bits);
    }
    return k;
  };
  // Candidates: not-yet-linearized operations called before every such
  // operation of known outcome returned (one of unknown outcome never
  // returns). Operations are sorted by call time, and one called after the
  // running minimum return cannot lower it, so the scan from `first` stops
  // there: each step costs the width of the concurrency window. A get the
  // state admits unchanged is linearized at once, alone: placing it later
  // could only add constraints (it is called before every pending
  // operation returned, so none of those must precede it).
  std::vector<State> next;
  auto expand = [&](Frame* f) {
    f->choices.clear();
    uint64_t min_return = kNever;
    for (size_t i = f->first; i < n && ops[i].call_ns <= min_return; ++i) {
      if (!is_done(i)) min_return = std::min(min_return, ret(i));
    }
    auto consider = [&](size_t i) {
      Next(ops[i], f->state, &next);
      if (ops[i].kind == KvOp::kGet && next.size() == 1 &&
          SameState(next[0], f->state)) {
        f->choices.clear();
        f->choices.emplace_back(i, std::move(next[0]));
        return true;
      }
      for (State& st : next) f->choices.emplace_back(i, std::move(st));
      return false;
    };
    for (size_t u : unknown) {
      if (u >= f->first) break;
      if (!is_done(u) && consider(u)) return;
    }
    for (size_t i = f->first; i < n && ops[i].call_ns <= min_return; ++i) {
      if (!is_done(i) && consider(i)) return;
    }
  };

  std::unordered_set<Key, KeyHash> seen;
  std::vector<Frame> stack;
  {
    Frame start{n, {initial_present, initial_value, initial_version}, 0, 0, 0,
                {}};
    while (start.first < n && !ops[start.first].returned) ++start.first;
    seen.insert(key_of(start));
    stack.push_back(std::move(start));
    expand(&stack.back());
  }
  // The longest prefix found, for the explanation: its set is copied when
  // the search backs out of it (a copy per improvement would cost the
  // history's length each time).
  size_t best = 0;
  bool best_unsaved = false;
  std::vector<uint64_t> best_done = done;
  State best_state = stack.back().state;
  // A history that is not linearizable makes the search visit every state
  // it can reach; past the budget it stops and reports what it found.
  size_t memo_bytes = 0;
  bool gave_up = false;
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.linearized_returned == must) {
      result.linearizable = true;
      result.states_explored = seen.size();
      return result;
    }
    if (f.choices.empty()) {
      if (best_unsaved && f.linearized_returned == best) {
        best_done = done;
        best_state = f.state;
        best_unsaved = false;
      }
      if (f.op < n) set_done(f.op, false);
      stack.pop_back();
      continue;
    }
    if (memo_bytes > kSearchBudgetBytes) {
      gave_up = true;
      break;
    }
    auto [i, state] = std::move(f.choices.back());
    f.choices.pop_back();
    Frame g{i,
            std::move(state),
            f.first,
            std::max(f.last, i + 1),
            f.linearized_returned + (ops[i].returned ? 1 : 0),
            {}};
    set_done(i, true);
    while (g.first < n && (is_done(g.first) || !ops[g.first].returned)) {
      ++g.first;
    }
    Key k = key_of(g);
    const size_t bytes = sizeof(Key) + 64 + k.state.value.size() +
                         k.marks.size() * sizeof(uint64_t);
    if (!seen.insert(std::move(k)).second) {
      set_done(i, false);
      continue;
    }
    memo_bytes += bytes;
    if (g.linearized_returned > best) {
      best = g.linearized_returned;
      best_unsaved = true;
    }
    stack.push_back(std::move(g));
    expand(&stack.back());
  }
  result.states_explored = seen.size();
  if (gave_up) {
    result.explanation = "no linearization found within the search budget (" +
                         std::to_string(seen.size()) +
                         " states, the longest prefix " + std::to_string(best) +
                         " of " + std::to_string(must) +
                         " completed operations): not shown linearizable";
    return result;
  }
  // Explain: the earliest-returning operation that could not follow the
  // longest linearizable prefix found.
  size_t culprit = n;
  for (size_t i = 0; i < n; ++i) {
    if (best_done[i / 64] >> (i % 64) & 1) continue;
    if (culprit == n || ret(i) < ret(culprit)) culprit = i;
  }
  result.explanation =
      std::to_string(best) + " of " + std::to_string(must) +
      " completed operations linearize; then no order admits " +
      (culprit < n ? Describe(ops[culprit]) : std::string("the rest")) +
      " (register then " +
      (best_state.present ? "'" + best_state.value + "'"
                          : std::string("absent")) +
      ")";
  return result;
}

}  // namespace remem::testing
