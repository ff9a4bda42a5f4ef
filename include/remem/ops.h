// Copyright remem authors.
//
// remem::OpsStore: server-side operations on values of the hash store
// (KV-Direct's atomics, vector operations and update functions), used
// through a Session (remem/session.h).
//
// The values are ordinary hash-store pairs: HashStore::Get reads them (one-
// sided, verified), and every operation that changes a value writes it as a
// put would (a new version; a one-sided reader sees the value before or
// after, never a mix; logged like a put when the server persists).
// Operations run on the server thread that owns the key, in arrival order
// per key. The server gathers what arrives between two passes of its event
// loop (from every client) and does each key's operations back to back,
// handing each the value the previous one produced, and writes and logs the
// key once (KV-Direct's reservation station). A key's operations are
// linearizable: each takes effect at one instant between its call and its
// reply, in the order their results show. Operations of this store issued
// together (async, batch) are done in issue order per key, but for a
// reduction or filter whose result did not fit its reply (1 MiB with the
// results before it): it is asked again in a later message and sees the
// writes done by then, those issued after it too. They are not
// ordered with HashStore writes in flight at the same time (an operation
// issued after a put's callback ran sees that put).
//
// Integers are 8-byte little-endian int64 values. Overflow is an error
// (OutOfRange) that leaves the value unchanged; an integer operation on a
// value that is not 8 bytes is InvalidArgument and changes nothing.
//
// Vectors are values with a 16-byte header (docs/PROTOCOL.md, "Vector
// values": magic, element type, count) followed by the elements,
// little-endian and packed. EncodeVector/DecodeVector convert. On double
// and float vectors NaN propagates through min and max (as numpy's; IEEE's
// fmin and fmax drop it): a min or max reduction is NaN if any element is,
// wherever it sits, and an elementwise min or max is NaN where the element
// or its operand is; the server and a one-sided reduction agree.
//
// Thread contract: as the Session: one thread. An OpsStore must be
// destroyed before its Session; its destructor waits for its own
// operations in flight.

#ifndef REMEM_OPS_H_
#define REMEM_OPS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "remem/hash.h"
#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"

namespace remem {

// Wire values (docs/PROTOCOL.md): never renumber.
enum class OpKind : uint8_t {
  kFetchAdd = 1,     // returns the old integer
  kAddFetch = 2,     // returns the new integer
  kCompareSwap = 3,  // returns the old value (applied) or the current one
  kAppend = 4,       // returns the new length (an int64, as integers are)
  kMin = 5,          // returns the new integer
  kMax = 6,          // returns the new integer
  kVecUpdate = 7,    // returns nothing (the new version)
  kVecReduce = 8,    // returns a one-element vector: int64 for integer
                     // vectors and counts, double for double/float ones
  kVecFilter = 9,    // returns a vector (elements, or int64 indices)
  kCall = 10,        // a user-defined function; returns the new value
};
enum class ElemType : uint8_t {
  kInt64 = 1,
  kDouble = 2,
  kFloat = 3,
  kInt32 = 4
};
enum class VecFn : uint8_t { kAdd = 1, kMul = 2, kSet = 3, kMin = 4, kMax = 5 };
enum class Reduction : uint8_t {
  kSum = 1,
  kMin = 2,
  kMax = 3,
  kCount = 4,
  // A reduction a --ops-library registered, named by Op::function_id: build
  // it with Op::VecReduce(key, function_id). Always done by the server.
  kUser = 5,
};
enum class Predicate : uint8_t {
  kLt = 1,
  kLe = 2,
  kGt = 3,
  kGe = 4,
  kEq = 5,
  kNe = 6
};

// A vector's elements; the alternative is its element type.
using VectorData = std::variant<std::vector<int64_t>, std::vector<double>,
                                std::vector<float>, std::vector<int32_t>>;
ElemType TypeOf(const VectorData& v);
// The value bytes of a vector (header + elements).
std::string EncodeVector(const VectorData& v);
// InvalidArgument if `value` is not a well-formed vector.
Result<VectorData> DecodeVector(std::string_view value);

// A scalar: an integer for int64/int32 vectors (and counts), a double for
// double/float vectors. On the wire: 8 bytes, int64 or IEEE double.
using Number = std::variant<int64_t, double>;

// One operation, as Execute, ExecuteAsync and ExecuteBatch take it. Build
// it with the functions below.
struct Op {
  OpKind kind = OpKind::kFetchAdd;
  std::string key;
  std::string arg;       // delta, operand, new value, bytes, number, vector
  std::string expected;  // compare-and-swap
  bool create = false;   // act on an absent key (see each builder)
  bool indices = false;  // filter: return indices, not elements
  uint8_t fn = 0;        // VecFn, Reduction or Predicate
  // A scalar vector operand's Number type, set by VecUpdate and VecFilter:
  // 0 none (an `arg` of another kind), 1 int64, 2 double.
  uint8_t operand_type = 0;
  uint32_t function_id = 0;
  int64_t initial = 0;  // integer ops with `create`: the absent key's value

  // Integers. Absent key: NotFound, or with `create` the op starts from
  // `initial` (INCRBY's behaviour is create=true, initial=0).
  static Op FetchAdd(std::string key, int64_t delta, bool create = false,
                     int64_t initial = 0);
  static Op AddFetch(std::string key, int64_t delta, bool create = false,
                     int64_t initial = 0);
  static Op Min(std::string key, int64_t operand, bool create = false,
                int64_t initial = 0);
  static Op Max(std::string key, int64_t operand, bool create = false,
                int64_t initial = 0);
  // Stores `desired` if the value's bytes equal `expected` (applied), else
  // changes nothing (not applied); returns the value it compared. Absent
  // key: NotFound, or with `create` the key is inserted (applied, empty
  // old value).
  static Op CompareSwap(std::string key, std::string expected,
                        std::string desired, bool create = false);
  // Appends `bytes`; absent key: NotFound, or with `create` starts empty.
  static Op Append(std::string key, std::string bytes, bool create = false);
  // Elementwise: element = fn(element, operand), operand a Number or a
  // vector of the same type and length. An integer Number on a double or
  // float vector is converted; a double one on an integer vector is
  // refused (InvalidArgument), as it is by VecFilter.
  static Op VecUpdate(std::string key, VecFn fn, Number operand);
  static Op VecUpdate(std::string key, VecFn fn, const VectorData& operand);
  static Op VecReduce(std::string key, Reduction r);
  // A reduction a --ops-library registered (remem/ops_plugin.h), by id; its
  // reply is a one-element int64 or double vector as the function chose.
  // Unsupported if the server has no reduction with that id (also when the
  // id names an update function); InvalidArgument if the value is not a
  // vector, the function does not accept its element type, or refuses it.
  static Op VecReduce(std::string key, uint32_t function_id);
  // The elements e (or their indices) with `e p operand`. On a float
  // vector the operand is first rounded to float, as a stored element
  // would be (`kEq, 0.1` finds an element put as 0.1).
  static Op VecFilter(std::string key, Predicate p, Number operand,
                      bool indices = false);
  // A function a --ops-library registered (remem/ops_plugin.h); Unsupported
  // if the server has none with that id.
  static Op Call(std::string key, uint32_t function_id, std::string arg);
};

struct OpReply {
  std::string value;     // see OpKind
  uint64_t version = 0;  // of the value after the op (unchanged if it
                         // did not write)
  bool applied = true;   // compare-and-swap: swapped
  // The value as an integer (8 bytes); InvalidArgument otherwise.
  Result<int64_t> Int() const;
  // The reply of kVecReduce as a Number.
  Result<Number> AsNumber() const;
};

struct IntReply {
  int64_t value = 0;
  uint64_t version = 0;
};

struct OpsOptions {
  // Where reductions run: kRpc on the server; kOneSided reads the vector
  // (HashStore::Get, one-sided and verified) and reduces here; kAuto (or
  // unset: the session's read path) chooses per reduction from measured
  // latencies (the selector of gets, Cell's: moving averages, outlier
  // rejection, 1% exploration at most once a millisecond), so it reduces
  // here where that is faster (small vectors on shared memory) and asks
  // the server elsewhere. One selector per store: a store that reduces
  // vectors of very different sizes gets the path that is faster on
  // average. A user reduction (Reduction::kUser) always runs on the
  // server: the client does not have the function.
  std::optional<ReadPath> reduce_path;
};

class OpsStore {
 public:
  using Callback = std::function<void(Result<OpReply>)>;
  template <typename T>
  using TypedCallback = std::function<void(Result<T>)>;

  // Attaches to `session`'s server (opens a HashStore on it). Unsupported if
  // the server has no hash store.
  static Result<std::unique_ptr<OpsStore>> Open(Session* session,
                                                const OpsOptions& options = {});
  ~OpsStore();
  OpsStore(const OpsStore&) = delete;
  OpsStore& operator=(const OpsStore&) = delete;

  // --- synchronous: one round trip. The typed helpers build the Op (see
  // its builders for each one's meaning and errors) and decode the reply.
  Result<OpReply> Execute(const Op& op);
  Result<IntReply> FetchAdd(std::string_view key, int64_t delta,
                            bool create = false, int64_t initial = 0);
  Result<IntReply> AddFetch(std::string_view key, int64_t delta,
                            bool create = false, int64_t initial = 0);
  // The value after: the smaller (Min) or larger (Max) of it and `operand`.
  Result<IntReply> Min(std::string_view key, int64_t operand,
                       bool create = false, int64_t initial = 0);
  Result<IntReply> Max(std::string_view key, int64_t operand,
                       bool create = false, int64_t initial = 0);
  // OpReply: `applied`, the value compared, the version after.
  Result<OpReply> CompareSwap(std::string_view key, std::string_view expected,
                              std::string_view desired, bool create = false);
  // The new length and the version.
  Result<IntReply> Append(std::string_view key, std::string_view bytes,
                          bool create = false);
  // The new version.
  Result<uint64_t> VecUpdate(std::string_view key, VecFn fn, Number operand);
  Result<uint64_t> VecUpdate(std::string_view key, VecFn fn,
                             const VectorData& operand);
  // Stores a vector (a put); returns its version.
  Result<uint64_t> VecPut(std::string_view key, const VectorData& v);
  struct VectorValue {
    VectorData data;
    uint64_t version = 0;
  };
  // Reads a vector through the hash store's read path (one-sided when it
  // chooses so).
  Result<VectorValue> VecGet(std::string_view key);
  // Reduces on the server or here (OpsOptions::reduce_path).
  Result<Number> VecReduce(std::string_view key, Reduction r);
  // A user reduction (Op::VecReduce(key, function_id)): always on the server,
  // whatever OpsOptions::reduce_path says (the function is not in the
  // client); counted in reduce_stats().server.
  Result<Number> VecReduce(std::string_view key, uint32_t function_id);
  Result<VectorData> VecFilter(std::string_view key, Predicate p,
                               Number operand, bool indices = false);

  // --- asynchronous: the op is queued; at the next Session::Poll (or
  // WaitAll, or synchronous call) everything queued goes to the server in
  // one message, and `done` runs inside a later Poll/WaitAll. Ops of one
  // key are done in issue order, but for a reduction or filter whose result
  // did not fit the reply (above).
  void ExecuteAsync(Op op, Callback done);
  // The typed helpers, asynchronously: each queues its Op as ExecuteAsync
  // does and hands `done` what the synchronous twin returns. An async
  // reduction always runs on the server (it travels with the other queued
  // ops; OpsOptions::reduce_path is for the synchronous VecReduce).
  // VecPutAsync and VecGetAsync are the hash store's PutAsync and GetAsync.
  void FetchAddAsync(std::string_view key, int64_t delta,
                     TypedCallback<IntReply> done, bool create = false,
                     int64_t initial = 0);
  void AddFetchAsync(std::string_view key, int64_t delta,
                     TypedCallback<IntReply> done, bool create = false,
                     int64_t initial = 0);
  void MinAsync(std::string_view key, int64_t operand,
                TypedCallback<IntReply> done, bool create = false,
                int64_t initial = 0);
  void MaxAsync(std::string_view key, int64_t operand,
                TypedCallback<IntReply> done, bool create = false,
                int64_t initial = 0);
  void CompareSwapAsync(std::string_view key, std::string_view expected,
                        std::string_view desired, TypedCallback<OpReply> done,
                        bool create = false);
  void AppendAsync(std::string_view key, std::string_view bytes,
                   TypedCallback<IntReply> done, bool create = false);
  void VecUpdateAsync(std::string_view key, VecFn fn, Number operand,
                      TypedCallback<uint64_t> done);
  void VecUpdateAsync(std::string_view key, VecFn fn, const VectorData& operand,
                      TypedCallback<uint64_t> done);
  void VecPutAsync(std::string_view key, const VectorData& v,
                   TypedCallback<uint64_t> done);
  void VecGetAsync(std::string_view key, TypedCallback<VectorValue> done);
  void VecReduceAsync(std::string_view key, Reduction r,
                      TypedCallback<Number> done);
  void VecReduceAsync(std::string_view key, uint32_t function_id,
                      TypedCallback<Number> done);
  void VecFilterAsync(std::string_view key, Predicate p, Number operand,
                      TypedCallback<VectorData> done, bool indices = false);

  // --- batched: one message (split beyond 65536 ops or 32 MiB), one result
  // per op, in order, each with its own status. Reductions and filters
  // whose results would make the reply pass 1 MiB are asked again in a
  // later message (they change nothing, so only their order among the
  // batch's writes may differ).
  std::vector<Result<OpReply>> ExecuteBatch(const std::vector<Op>& ops);

  struct ReduceStats {
    uint64_t local = 0;   // read one-sided and reduced here
    uint64_t server = 0;  // reduced by the server
    // The selector's estimates of a reduction on each path (microseconds;
    // 0 before measured, and always 0 with a forced path).
    double local_estimate_us = 0;
    double server_estimate_us = 0;
  };
  ReduceStats reduce_stats() const;

  HashStore* hash() { return hash_.get(); }
  // Ops of this store issued and not yet completed.
  size_t in_flight() const;

 private:
  struct Impl;
  OpsStore(std::unique_ptr<Impl> impl, std::unique_ptr<HashStore> hash);
  // What a typed helper makes of an op's reply.
  template <typename T>
  using Decoder = Result<T> (*)(Result<OpReply>);
  // Execute / ExecuteAsync, then `decode`: every typed helper is one of
  // these two (defined and instantiated in src/ops/store_client.cc only).
  template <typename T>
  Result<T> ExecuteAs(const Op& op, Decoder<T> decode);
  template <typename T>
  void ExecuteAsyncAs(Op op, Decoder<T> decode, TypedCallback<T> done);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<HashStore> hash_;
};

}  // namespace remem

#endif  // REMEM_OPS_H_
