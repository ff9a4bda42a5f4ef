// remem::OpsStore: the client side of server-side operations
// (include/remem/ops.h), on a Session's core (client/session_core.h) and
// the hash store's methods kOp / kOpBatch.

#include <cstring>

#include "client/path_selector.h"
#include "client/session_core.h"
#include "hash/codec.h"
#include "ops/apply.h"
#include "ops/vector.h"
#include "remem/ops.h"

namespace remem {

namespace {

ops::OpView ViewOf(const Op& op) {
  ops::OpView v;
  v.kind = op.kind;
  v.flags = uint8_t((op.create ? ops::kFlagCreate : 0) |
                    (op.indices ? ops::kFlagIndices : 0) |
                    (op.operand_type != 0 ? ops::kFlagTypedOperand : 0) |
                    (op.operand_type == 2 ? ops::kFlagDoubleOperand : 0));
  v.fn = op.fn;
  v.function_id = op.function_id;
  v.initial = op.initial;
  v.key = op.key;
  v.arg = op.arg;
  v.expected = op.expected;
  return v;
}

OpReply ReplyOf(hash::OpItem&& it) {
  OpReply r;
  r.value = std::move(it.data);
  r.version = it.version;
  r.applied = it.applied;
  return r;
}

std::string NumberBytes(Number n) {
  if (std::holds_alternative<int64_t>(n)) {
    return ops::EncodeI64(std::get<int64_t>(n));
  }
  return ops::EncodeF64(std::get<double>(n));
}

Op IntOp(OpKind kind, std::string key, int64_t operand, bool create,
         int64_t initial) {
  Op op;
  op.kind = kind;
  op.key = std::move(key);
  op.arg = ops::EncodeI64(operand);
  op.create = create;
  op.initial = initial;
  return op;
}

// Decoders of the typed helpers (OpsStore::Decoder).
Result<OpReply> AsReply(Result<OpReply> r) { return r; }
Result<IntReply> AsInt(Result<OpReply> r) {
  if (!r.ok()) return r.status();
  auto v = r->Int();
  if (!v.ok()) return v.status();
  return IntReply{*v, r->version};
}
Result<uint64_t> AsVersion(Result<OpReply> r) {
  if (!r.ok()) return r.status();
  return r->version;
}
Result<Number> AsNumber(Result<OpReply> r) {
  if (!r.ok()) return r.status();
  return r->AsNumber();
}
Result<VectorData> AsVector(Result<OpReply> r) {
  if (!r.ok()) return r.status();
  return DecodeVector(r->value);
}

// Splits ops into messages (hash::SplitIntoMessages).
std::vector<std::pair<size_t, size_t>> Batches(const std::vector<Op>& ops) {
  return hash::SplitIntoMessages(ops.size(), [&](size_t i) {
    return sizeof(hash::HashOpRequest) + ops[i].key.size() + ops[i].arg.size() +
           ops[i].expected.size();
  });
}

}  // namespace

// --- values

ElemType TypeOf(const VectorData& v) {
  switch (v.index()) {
    case 0:
      return ElemType::kInt64;
    case 1:
      return ElemType::kDouble;
    case 2:
      return ElemType::kFloat;
  }
  return ElemType::kInt32;
}

std::string EncodeVector(const VectorData& v) {
  return std::visit(
      [&](const auto& elems) {
        return ops::MakeVector(TypeOf(v), elems.size(), elems.data());
      },
      v);
}

Result<VectorData> DecodeVector(std::string_view value) {
  auto view = ops::ParseVector(value);
  if (!view.ok()) return view.status();
  auto fill = [&](auto vec) -> VectorData {
    vec.resize(view->count);
    if (view->count > 0) {
      std::memcpy(vec.data(), view->elems,
                  view->count * sizeof(typename decltype(vec)::value_type));
    }
    return vec;
  };
  switch (view->type) {
    case ElemType::kInt64:
      return fill(std::vector<int64_t>{});
    case ElemType::kDouble:
      return fill(std::vector<double>{});
    case ElemType::kFloat:
      return fill(std::vector<float>{});
    case ElemType::kInt32:
      break;
  }
  return fill(std::vector<int32_t>{});
}

Result<int64_t> OpReply::Int() const {
  if (value.size() != 8) {
    return Status::InvalidArgument("the reply is " +
                                   std::to_string(value.size()) +
                                   " bytes, not an 8-byte integer");
  }
  return ops::LoadI64(value.data());
}

Result<Number> OpReply::AsNumber() const {
  auto v = ops::ParseVector(value);
  if (!v.ok()) return v.status();
  if (v->count != 1) {
    return Status::InvalidArgument("a reduction's reply has one element");
  }
  if (v->type == ElemType::kInt64) return Number(ops::LoadI64(v->elems));
  if (v->type == ElemType::kDouble) return Number(ops::LoadF64(v->elems));
  return Status::InvalidArgument("a reduction answers int64 or double");
}

// --- builders

Op Op::FetchAdd(std::string key, int64_t delta, bool create, int64_t initial) {
  return IntOp(OpKind::kFetchAdd, std::move(key), delta, create, initial);
}
Op Op::AddFetch(std::string key, int64_t delta, bool create, int64_t initial) {
  return IntOp(OpKind::kAddFetch, std::move(key), delta, create, initial);
}
Op Op::Min(std::string key, int64_t operand, bool create, int64_t initial) {
  return IntOp(OpKind::kMin, std::move(key), operand, create, initial);
}
Op Op::Max(std::string key, int64_t operand, bool create, int64_t initial) {
  return IntOp(OpKind::kMax, std::move(key), operand, create, initial);
}
Op Op::CompareSwap(std::string key, std::string expected, std::string desired,
                   bool create) {
  Op op;
  op.kind = OpKind::kCompareSwap;
  op.key = std::move(key);
  op.arg = std::move(desired);
  op.expected = std::move(expected);
  op.create = create;
  return op;
}
Op Op::Append(std::string key, std::string bytes, bool create) {
  Op op;
  op.kind = OpKind::kAppend;
  op.key = std::move(key);
  op.arg = std::move(bytes);
  op.create = create;
  return op;
}
Op Op::VecUpdate(std::string key, VecFn fn, Number operand) {
  Op op;
  op.kind = OpKind::kVecUpdate;
  op.key = std::move(key);
  op.fn = uint8_t(fn);
  op.arg = NumberBytes(operand);
  op.operand_type = std::holds_alternative<int64_t>(operand) ? 1 : 2;
  return op;
}
Op Op::VecUpdate(std::string key, VecFn fn, const VectorData& operand) {
  Op op;
  op.kind = OpKind::kVecUpdate;
  op.key = std::move(key);
  op.fn = uint8_t(fn);
  op.arg = EncodeVector(operand);
  return op;
}
Op Op::VecReduce(std::string key, Reduction r) {
  Op op;
  op.kind = OpKind::kVecReduce;
  op.key = std::move(key);
  op.fn = uint8_t(r);
  return op;
}
Op Op::VecReduce(std::string key, uint32_t function_id) {
  Op op = VecReduce(std::move(key), Reduction::kUser);
  op.function_id = function_id;
  return op;
}
Op Op::VecFilter(std::string key, Predicate p, Number operand, bool indices) {
  Op op;
  op.kind = OpKind::kVecFilter;
  op.key = std::move(key);
  op.fn = uint8_t(p);
  op.arg = NumberBytes(operand);
  op.operand_type = std::holds_alternative<int64_t>(operand) ? 1 : 2;
  op.indices = indices;
  return op;
}
Op Op::Call(std::string key, uint32_t function_id, std::string arg) {
  Op op;
  op.kind = OpKind::kCall;
  op.key = std::move(key);
  op.function_id = function_id;
  op.arg = std::move(arg);
  return op;
}

// --- the store

struct OpsStore::Impl {
  client::SessionCore* core = nullptr;
  HashStore* hash = nullptr;
  ReadPath reduce_path = ReadPath::kAuto;
  std::unique_ptr<client::PathSelector> reduce_selector;
  ReduceStats reduce_stats;
  HashStore::Value reduce_value;  // the local path's copy of the vector
  size_t in_flight = 0;
  int flush_hook = 0;
  struct Queued {
    Op op;
    Callback done;
  };
  std::vector<Queued> queued;

  Status Check(const Op& op) const {
    if (op.key.empty()) return Status::InvalidArgument("empty key");
    if (op.key.size() > hash->max_key()) {
      return Status::InvalidArgument("key of " + std::to_string(op.key.size()) +
                                     " bytes exceeds the limit of " +
                                     std::to_string(hash->max_key()));
    }
    return Status::OK();
  }

  void Complete(const Callback& done, Result<OpReply> r) {
    core->Ended(r.status());
    --in_flight;
    if (done) done(std::move(r));
  }
  void Flush();
};

OpsStore::OpsStore(std::unique_ptr<Impl> impl, std::unique_ptr<HashStore> hash)
    : impl_(std::move(impl)), hash_(std::move(hash)) {}

OpsStore::~OpsStore() {
  Impl& s = *impl_;
  if (s.in_flight > 0 || !s.queued.empty()) {
    (void)s.core->ProgressUntil(
        [&s] {
          s.Flush();
          return s.in_flight == 0;
        },
        fabric::Clock::now() + s.core->options().timeout);
    if (s.in_flight > 0) {
      s.core->Fail(Status::Unavailable("the ops store was closed"));
      (void)s.core->worker()->ProgressUntil(
          [&s] { return s.in_flight == 0; },
          fabric::Clock::now() + std::chrono::seconds(30));
    }
  }
  s.core->RemoveFlushHook(s.flush_hook);
}

Result<std::unique_ptr<OpsStore>> OpsStore::Open(Session* session,
                                                 const OpsOptions& options) {
  auto hash = HashStore::Open(session);
  if (!hash.ok()) return hash.status().WithContext("opening the ops store");
  auto impl = std::make_unique<Impl>();
  impl->core = session->core();
  impl->hash = hash->get();
  impl->reduce_path =
      options.reduce_path.value_or(impl->core->options().read_path);
  client::PathSelectorOptions so;
  so.mode = impl->reduce_path;
  impl->reduce_selector = std::make_unique<client::PathSelector>(so);
  Impl* raw = impl.get();
  impl->flush_hook = impl->core->AddFlushHook([raw] { raw->Flush(); });
  return std::unique_ptr<OpsStore>(
      new OpsStore(std::move(impl), std::move(*hash)));
}

size_t OpsStore::in_flight() const { return impl_->in_flight; }

Result<OpReply> OpsStore::Execute(const Op& op) {
  REMEM_RETURN_IF_ERROR(impl_->Check(op));
  auto r = impl_->core->CallSync(hash::kHashService,
                                 hash::MethodId(hash::HashMethod::kOp),
                                 hash::EncodeHashOp(ViewOf(op)));
  if (!r.ok()) return r.status();
  auto it = hash::DecodeHashOpReply(*r);
  if (!it.ok()) return it.status();
  return ReplyOf(std::move(*it));
}

template <typename T>
Result<T> OpsStore::ExecuteAs(const Op& op, Decoder<T> decode) {
  return decode(Execute(op));
}

template <typename T>
void OpsStore::ExecuteAsyncAs(Op op, Decoder<T> decode, TypedCallback<T> done) {
  ExecuteAsync(std::move(op),
               [decode, done = std::move(done)](Result<OpReply> r) {
                 if (done) done(decode(std::move(r)));
               });
}

Result<IntReply> OpsStore::FetchAdd(std::string_view key, int64_t delta,
                                    bool create, int64_t initial) {
  return ExecuteAs(Op::FetchAdd(std::string(key), delta, create, initial),
                   AsInt);
}
void OpsStore::FetchAddAsync(std::string_view key, int64_t delta,
                             TypedCallback<IntReply> done, bool create,
                             int64_t initial) {
  ExecuteAsyncAs(Op::FetchAdd(std::string(key), delta, create, initial), AsInt,
                 std::move(done));
}

Result<IntReply> OpsStore::AddFetch(std::string_view key, int64_t delta,
                                    bool create, int64_t initial) {
  return ExecuteAs(Op::AddFetch(std::string(key), delta, create, initial),
                   AsInt);
}
void OpsStore::AddFetchAsync(std::string_view key, int64_t delta,
                             TypedCallback<IntReply> done, bool create,
                             int64_t initial) {
  ExecuteAsyncAs(Op::AddFetch(std::string(key), delta, create, initial), AsInt,
                 std::move(done));
}

Result<IntReply> OpsStore::Min(std::string_view key, int64_t operand,
                               bool create, int64_t initial) {
  return ExecuteAs(Op::Min(std::string(key), operand, create, initial), AsInt);
}
void OpsStore::MinAsync(std::string_view key, int64_t operand,
                        TypedCallback<IntReply> done, bool create,
                        int64_t initial) {
  ExecuteAsyncAs(Op::Min(std::string(key), operand, create, initial), AsInt,
                 std::move(done));
}

Result<IntReply> OpsStore::Max(std::string_view key, int64_t operand,
                               bool create, int64_t initial) {
  return ExecuteAs(Op::Max(std::string(key), operand, create, initial), AsInt);
}
void OpsStore::MaxAsync(std::string_view key, int64_t operand,
                        TypedCallback<IntReply> done, bool create,
                        int64_t initial) {
  ExecuteAsyncAs(Op::Max(std::string(key), operand, create, initial), AsInt,
                 std::move(done));
}

Result<OpReply> OpsStore::CompareSwap(std::string_view key,
                                      std::string_view expected,
                                      std::string_view desired, bool create) {
  return ExecuteAs(Op::CompareSwap(std::string(key), std::string(expected),
                                   std::string(desired), create),
                   AsReply);
}
void OpsStore::CompareSwapAsync(std::string_view key, std::string_view expected,
                                std::string_view desired,
                                TypedCallback<OpReply> done, bool create) {
  ExecuteAsyncAs(Op::CompareSwap(std::string(key), std::string(expected),
                                 std::string(desired), create),
                 AsReply, std::move(done));
}

Result<IntReply> OpsStore::Append(std::string_view key, std::string_view bytes,
                                  bool create) {
  return ExecuteAs(Op::Append(std::string(key), std::string(bytes), create),
                   AsInt);
}
void OpsStore::AppendAsync(std::string_view key, std::string_view bytes,
                           TypedCallback<IntReply> done, bool create) {
  ExecuteAsyncAs(Op::Append(std::string(key), std::string(bytes), create),
                 AsInt, std::move(done));
}

Result<uint64_t> OpsStore::VecUpdate(std::string_view key, VecFn fn,
                                     Number operand) {
  return ExecuteAs(Op::VecUpdate(std::string(key), fn, operand), AsVersion);
}
Result<uint64_t> OpsStore::VecUpdate(std::string_view key, VecFn fn,
                                     const VectorData& operand) {
  return ExecuteAs(Op::VecUpdate(std::string(key), fn, operand), AsVersion);
}
void OpsStore::VecUpdateAsync(std::string_view key, VecFn fn, Number operand,
                              TypedCallback<uint64_t> done) {
  ExecuteAsyncAs(Op::VecUpdate(std::string(key), fn, operand), AsVersion,
                 std::move(done));
}
void OpsStore::VecUpdateAsync(std::string_view key, VecFn fn,
                              const VectorData& operand,
                              TypedCallback<uint64_t> done) {
  ExecuteAsyncAs(Op::VecUpdate(std::string(key), fn, operand), AsVersion,
                 std::move(done));
}

Result<Number> OpsStore::VecReduce(std::string_view key, uint32_t function_id) {
  ++impl_->reduce_stats.server;
  return ExecuteAs(Op::VecReduce(std::string(key), function_id), AsNumber);
}
void OpsStore::VecReduceAsync(std::string_view key, Reduction r,
                              TypedCallback<Number> done) {
  ++impl_->reduce_stats.server;
  ExecuteAsyncAs(Op::VecReduce(std::string(key), r), AsNumber, std::move(done));
}
void OpsStore::VecReduceAsync(std::string_view key, uint32_t function_id,
                              TypedCallback<Number> done) {
  ++impl_->reduce_stats.server;
  ExecuteAsyncAs(Op::VecReduce(std::string(key), function_id), AsNumber,
                 std::move(done));
}

void OpsStore::VecFilterAsync(std::string_view key, Predicate p, Number operand,
                              TypedCallback<VectorData> done, bool indices) {
  ExecuteAsyncAs(Op::VecFilter(std::string(key), p, operand, indices), AsVector,
                 std::move(done));
}

void OpsStore::VecPutAsync(std::string_view key, const VectorData& v,
                           TypedCallback<uint64_t> done) {
  hash_->PutAsync(key, EncodeVector(v), std::move(done));
}

void OpsStore::VecGetAsync(std::string_view key,
                           TypedCallback<VectorValue> done) {
  hash_->GetAsync(key, [done = std::move(done)](Result<HashStore::Value> r) {
    if (!done) return;
    if (!r.ok()) return done(r.status());
    auto v = DecodeVector(r->value);
    if (!v.ok()) return done(v.status());
    done(VectorValue{std::move(*v), r->version});
  });
}

Result<uint64_t> OpsStore::VecPut(std::string_view key, const VectorData& v) {
  return hash_->Put(key, EncodeVector(v));
}

Result<OpsStore::VectorValue> OpsStore::VecGet(std::string_view key) {
  auto r = hash_->Get(key);
  if (!r.ok()) return r.status();
  auto v = DecodeVector(r->value);
  if (!v.ok()) return v.status();
  return VectorValue{std::move(*v), r->version};
}

Result<Number> OpsStore::VecReduce(std::string_view key, Reduction red) {
  if (red == Reduction::kUser) {
    return Status::InvalidArgument(
        "a user reduction is named by its id: VecReduce(key, function_id)");
  }
  Impl& s = *impl_;
  const auto start = fabric::Clock::now();
  const client::Path path = s.reduce_selector->Choose(start);
  Result<Number> out = Status::Internal("unset");
  bool measured = true;
  if (path == client::Path::kOneSided) {
    ++s.reduce_stats.local;
    // The hash store's read path: one-sided and verified on shared memory.
    // Into a value kept from reduction to reduction: a large vector's copy
    // is then not allocated and faulted in anew each time.
    Status r = hash_->Get(key, &s.reduce_value);
    if (!r.ok()) {
      out = r;
    } else {
      auto sum = ops::ReduceVector(s.reduce_value.value, red);
      if (!sum.ok()) {
        out = sum.status();
      } else {
        OpReply reply;
        reply.value = std::move(*sum);
        out = reply.AsNumber();
      }
    }
  } else {
    ++s.reduce_stats.server;
    out = ExecuteAs(Op::VecReduce(std::string(key), red), AsNumber);
  }
  // Only successful reductions say how long a path takes.
  measured = out.ok();
  if (measured && s.reduce_path == ReadPath::kAuto) {
    const auto end = fabric::Clock::now();
    s.reduce_selector->Record(
        path, std::chrono::duration<double, std::micro>(end - start).count(),
        end);
  }
  return out;
}

OpsStore::ReduceStats OpsStore::reduce_stats() const {
  ReduceStats r = impl_->reduce_stats;
  r.local_estimate_us =
      impl_->reduce_selector->Estimate(client::Path::kOneSided);
  r.server_estimate_us = impl_->reduce_selector->Estimate(client::Path::kRpc);
  return r;
}

Result<VectorData> OpsStore::VecFilter(std::string_view key, Predicate p,
                                       Number operand, bool indices) {
  return ExecuteAs(Op::VecFilter(std::string(key), p, operand, indices),
                   AsVector);
}

std::vector<Result<OpReply>> OpsStore::ExecuteBatch(
    const std::vector<Op>& ops) {
  std::vector<Result<OpReply>> out(ops.size(), Status::Internal("unasked"));
  std::vector<size_t> todo(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) todo[i] = i;
  // Rounds: what a full reply left out (reads only) is asked again; each
  // reply answers at least its first op.
  // Later rounds hold only reductions and filters (small ops): copied.
  std::vector<Op> deferred;
  while (!todo.empty()) {
    if (todo.size() < ops.size()) {
      deferred.clear();
      for (size_t i : todo) deferred.push_back(ops[i]);
    }
    const std::vector<Op>& round = todo.size() < ops.size() ? deferred : ops;
    std::vector<size_t> again;
    for (auto [begin, end] : Batches(round)) {
      std::vector<ops::OpView> views;
      views.reserve(end - begin);
      for (size_t i = begin; i < end; ++i) {
        views.push_back(ViewOf(round[i]));
      }
      auto r = impl_->core->CallSync(hash::kHashService,
                                     hash::MethodId(hash::HashMethod::kOpBatch),
                                     hash::EncodeHashOpBatch(views));
      auto items = r.ok() ? hash::DecodeHashOpBatchReply(*r, end - begin)
                          : Result<std::vector<hash::OpItem>>(r.status());
      for (size_t i = 0; i < end - begin; ++i) {
        Result<OpReply>& o = out[todo[begin + i]];
        if (!items.ok()) {
          o = items.status();
        } else if (hash::ReplyWasFull((*items)[i].status)) {
          again.push_back(todo[begin + i]);
        } else if (!(*items)[i].status.ok()) {
          o = (*items)[i].status;
        } else {
          o = ReplyOf(std::move((*items)[i]));
        }
      }
    }
    todo = std::move(again);
  }
  return out;
}

void OpsStore::ExecuteAsync(Op op, Callback done) {
  Impl& s = *impl_;
  s.core->Began();
  ++s.in_flight;
  Status st = s.Check(op);
  if (!st.ok()) {
    s.core->Defer(
        [&s, done = std::move(done), st]() mutable { s.Complete(done, st); });
    return;
  }
  s.queued.push_back({std::move(op), std::move(done)});
}

void OpsStore::Impl::Flush() {
  if (queued.empty()) return;
  auto all = std::make_shared<std::vector<Queued>>(std::move(queued));
  queued.clear();
  std::vector<Op> ops;
  ops.reserve(all->size());
  for (const Queued& q : *all) ops.push_back(q.op);
  for (const auto& range : Batches(ops)) {
    // Plain locals: clang before 16 cannot capture structured bindings.
    const size_t begin = range.first, end = range.second;
    std::string payload;
    hash::HashMethod method;
    if (end - begin == 1) {
      method = hash::HashMethod::kOp;
      payload = hash::EncodeHashOp(ViewOf(ops[begin]));
    } else {
      std::vector<ops::OpView> views;
      views.reserve(end - begin);
      for (size_t i = begin; i < end; ++i) views.push_back(ViewOf(ops[i]));
      method = hash::HashMethod::kOpBatch;
      payload = hash::EncodeHashOpBatch(views);
    }
    core->Call(hash::kHashService, hash::MethodId(method), std::move(payload),
               [this, all, begin, end, method](Status st, std::string reply) {
                 if (method == hash::HashMethod::kOp) {
                   Result<OpReply> r = st;
                   if (st.ok()) {
                     auto it = hash::DecodeHashOpReply(reply);
                     r = it.ok() ? Result<OpReply>(ReplyOf(std::move(*it)))
                                 : Result<OpReply>(it.status());
                   }
                   return Complete((*all)[begin].done, std::move(r));
                 }
                 auto items =
                     st.ok() ? hash::DecodeHashOpBatchReply(reply, end - begin)
                             : Result<std::vector<hash::OpItem>>(st);
                 for (size_t i = begin; i < end; ++i) {
                   Callback& done = (*all)[i].done;
                   if (!items.ok()) {
                     Complete(done, items.status());
                   } else if (hash::ReplyWasFull((*items)[i - begin].status)) {
                     // Asked again (still in flight): the next flush.
                     queued.push_back({(*all)[i].op, std::move(done)});
                   } else if (!(*items)[i - begin].status.ok()) {
                     Complete(done, (*items)[i - begin].status);
                   } else {
                     Complete(done, ReplyOf(std::move((*items)[i - begin])));
                   }
                 }
               });
  }
}

}  // namespace remem
