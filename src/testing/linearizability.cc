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

struct Key {
  std::vector<uint64_t> done;
  State state;
  bool operator==(const Key& o) const {
    return done == o.done && state.present == o.state.present &&
           state.value == o.state.value && state.version == o.state.version;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<std::string>()(k.state.value) * 31 + k.state.present;
    if (k.state.version) h ^= std::hash<uint64_t>()(*k.state.version) + 0x9e37;
    for (uint64_t w : k.done) h = h * 1099511628211ull ^ w;
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
  std::unordered_set<Key, KeyHash> seen;
  // Depth-first search over (set of linearized ops, model state).
  struct Frame {
    Key key;
    size_t linearized_returned;
    std::vector<std::pair<size_t, State>> choices;  // untried
  };
  auto is_done = [](const Key& k, size_t i) {
    return (k.done[i / 64] >> (i % 64) & 1) != 0;
  };
  // Candidates: not-yet-linearized ops called before every such op
  // returned. Ops are sorted by call time, and an op called after the
  // running minimum return cannot lower it, so the scan stops there: each
  // step costs the width of the concurrency window, not the history.
  auto expand = [&](const Key& k,
                    std::vector<std::pair<size_t, State>>* choices) {
    choices->clear();
    size_t first = 0;
    while (first < k.done.size() * 64 && first < n && is_done(k, first)) {
      if ((first % 64) == 0 && k.done[first / 64] == ~uint64_t{0}) {
        first += 64;
      } else {
        ++first;
      }
    }
    uint64_t min_return = kNever;
    for (size_t i = first; i < n && ops[i].call_ns <= min_return; ++i) {
      if (!is_done(k, i)) min_return = std::min(min_return, ret(i));
    }
    std::vector<State> next;
    for (size_t i = first; i < n && ops[i].call_ns <= min_return; ++i) {
      if (is_done(k, i)) continue;
      Next(ops[i], k.state, &next);
      for (State& s : next) choices->emplace_back(i, std::move(s));
    }
  };

  Key start{std::vector<uint64_t>((n + 63) / 64, 0),
            {initial_present, initial_value, initial_version}};
  std::vector<Frame> stack;
  stack.push_back({start, 0, {}});
  expand(stack.back().key, &stack.back().choices);
  seen.insert(start);
  size_t best = 0;
  Key best_key = start;
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.linearized_returned == must) {
      result.linearizable = true;
      result.states_explored = seen.size();
      return result;
    }
    if (f.choices.empty()) {
      stack.pop_back();
      continue;
    }
    auto [i, state] = std::move(f.choices.back());
    f.choices.pop_back();
    Key k{f.key.done, std::move(state)};
    k.done[i / 64] |= uint64_t{1} << (i % 64);
    if (!seen.insert(k).second) continue;
    size_t lin = f.linearized_returned + (ops[i].returned ? 1 : 0);
    if (lin > best) {
      best = lin;
      best_key = k;
    }
    stack.push_back({std::move(k), lin, {}});
    expand(stack.back().key, &stack.back().choices);
  }
  result.states_explored = seen.size();
  // Explain: the earliest-returning operation that could not follow the
  // longest linearizable prefix found.
  size_t culprit = n;
  for (size_t i = 0; i < n; ++i) {
    if (best_key.done[i / 64] >> (i % 64) & 1) continue;
    if (culprit == n || ret(i) < ret(culprit)) culprit = i;
  }
  result.explanation =
      std::to_string(best) + " of " + std::to_string(must) +
      " completed operations linearize; then no order admits " +
      (culprit < n ? Describe(ops[culprit]) : std::string("the rest")) +
      " (register then " +
      (best_key.state.present ? "'" + best_key.state.value + "'"
                              : std::string("absent")) +
      ")";
  return result;
}

}  // namespace remem::testing
