// A linearizability checker for recorded concurrent histories of one key
// (key-value linearizability composes per key, so a store's history is
// checked key by key).
//
// The model is a versioned register: absent, or (value, version). Versions
// are opaque identifiers that successful writes return; a compare-and-put
// succeeds exactly when the register holds the expected version, a
// put-if-absent exactly when the register is absent.
//
// The search is Wing & Gong's with Lowe's memoisation (cache of linearized
// set + model state): at each step, try to linearize an operation that was
// called before every not-yet-linearized operation returned.
//
// Operations whose outcome is unknown (the client died, or the call failed
// with a transport error: the server may or may not have applied it) have
// `returned = false`; they may take effect at any point after their call, or
// never.
//
// Thread contract: a History is built by one thread (record with a mutex if
// several threads produce it); Check is a pure function.

#ifndef REMEM_TESTING_LINEARIZABILITY_H_
#define REMEM_TESTING_LINEARIZABILITY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remem::testing {

struct KvOp {
  // kReadModifyWrite: a server-side operation (remem/ops.h) that found
  // the register absent (found = false) or holding `read_value`, and left
  // `value` with `version` (an atomic fetch-add, compare-and-swap, ...). Its
  // outcome must be known (returned).
  enum Kind {
    kGet,
    kPut,
    kDelete,
    kCompareAndPut,
    kPutIfAbsent,
    kReadModifyWrite
  };
  Kind kind = kGet;
  uint64_t call_ns = 0;    // when the call was issued (CLOCK_MONOTONIC)
  uint64_t return_ns = 0;  // when its result arrived; ignored if !returned
  bool returned = true;    // false: outcome unknown

  // Inputs.
  std::string value;              // put / compare-and-put / put-if-absent
  uint64_t expected_version = 0;  // compare-and-put

  // Outputs (when returned).
  bool found = false;               // get: key present
  std::string read_value;           // get: the value read
  std::optional<uint64_t> version;  // get: version read (if the API
                                    // reports one); writes: new version
  bool succeeded = true;            // compare-and-put: swapped or not;
                                    // put-if-absent: inserted or not;
                                    // delete: whether the key existed
                                    // (only checked if delete_reports)
  bool delete_reports = false;
  int client = 0;    // for messages only
  std::string note;  // for messages only (where it went, how it was read)
};

struct CheckResult {
  bool linearizable = false;
  // When not linearizable: the operations of the longest linearizable prefix
  // found and a description of the first operation that could not follow.
  std::string explanation;
  uint64_t states_explored = 0;
};

// The memory the search of one history may take (its memo of states). A
// history that is not linearizable is searched exhaustively; past this the
// search stops and reports the history as not shown linearizable (a test
// fails rather than exhausting the machine). A linearizable history is
// found with a tiny fraction of it.
inline constexpr size_t kSearchBudgetBytes = size_t{2} << 30;

// Checks a one-key history. `initial_present/value/version` describe the
// register before the first operation (absent by default). Not linearizable
// when no linearization was found within kSearchBudgetBytes (the
// explanation says so).
CheckResult CheckKeyHistory(const std::vector<KvOp>& ops,
                            bool initial_present = false,
                            const std::string& initial_value = "",
                            std::optional<uint64_t> initial_version = {});

std::string Describe(const KvOp& op);

}  // namespace remem::testing

#endif  // REMEM_TESTING_LINEARIZABILITY_H_
