// remem::TreeStore: the client side of the ordered store
// (include/remem/tree.h), on a Session's core (client/session_core.h).
// One-sided searches run tree/search.h over a RemoteSource (verified copies
// of the server's nodes) with a cache of upper levels; the RPC path asks
// the service (tree/service.h).

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include "client/path_selector.h"
#include "client/session_core.h"
#include "hash/layout.h"
#include "hash/reader.h"
#include "remem/tree.h"
#include "tree/codec.h"
#include "tree/layout.h"
#include "tree/node.h"
#include "tree/search.h"
#include "util/move_function.h"

namespace remem {

using fabric::Clock;

namespace {

// Copies of a node that fail to verify before a one-sided operation gives
// up and asks the server (each failure means the server was rewriting that
// node at that moment).
constexpr int kMaxAttempts = 16;

// The server's tree as one-sided reads see it: every copy verified,
// retried with backoff when torn.
class RemoteSource : public tree::NodeSource {
  // A node read ahead (Prefetch), and its read's outcome.
  static constexpr size_t kReadAheadNodes = 16;
  struct AheadCopy {
    uint8_t bytes[tree::kNodeBytes];
    bool done = false;
    Status status;
  };
  struct Ahead {
    uint32_t index;
    int takers;     // Fetches it serves yet: one per Prefetch of it
    bool launched;  // its read started (Launch)
    std::shared_ptr<AheadCopy> copy;
  };

 public:
  RemoteSource(client::SessionCore* core, uint32_t region,
               TreeStore::ReadStats* stats)
      : core_(core), region_id_(region), stats_(stats) {}
  Status Init() {
    region_ = core_->region(region_id_);
    if (region_ == nullptr) {
      return Status::ProtocolError("the tree's region is not exported");
    }
    return Status::OK();
  }
  bool mapped() const { return region_->mapped() != nullptr; }
  // On shared memory: faults this process's mapping of the nodes allocated
  // so far in now (and the extents among their pages), as the hash store
  // does for its bucket arrays (fabric::RemoteRegion::PrefaultForReading),
  // so the first one-sided searches do not pay a page fault per node and
  // look slower than the RPC path to the selector. Called again, only the
  // nodes allocated since (Impl::ExploreWarm says when).
  void Prefault() {
    auto r = ReadRoot();
    if (!r.ok()) return;
    const uint64_t upto =
        std::min(region_->length(), tree::NodeOffset(r->node_limit));
    if (upto > prefaulted_) {
      region_->PrefaultForReading(prefaulted_, upto - prefaulted_);
      prefaulted_ = upto;
    }
  }
  Result<uint32_t> Root() override {
    auto r = ReadRoot();
    if (!r.ok()) return r.status();
    return r->root;
  }
  Status Fetch(uint32_t index, uint8_t* scratch,
               tree::NodeView* view) override {
    return FetchNode(index, scratch, view, /*lazy_leaf=*/false);
  }
  // Mapped: the node's cache lines, so that its copy (Fetch) does not wait
  // for memory line by line. Over the network: a read of the node started
  // now, for the next Fetch of it (a scan's leaves in one round trip rather
  // than one each).
  void Prefetch(uint32_t index) override {
    if (index == tree::kNoNode) return;
    const uint64_t offset = tree::NodeOffset(index);
    if (offset + tree::kNodeBytes > region_->length()) return;
    if (mapped()) {
      const uint8_t* node = region_->mapped() + offset;
      for (size_t i = 0; i < tree::kNodeBytes; i += 64) {
        __builtin_prefetch(node + i);
      }
      return;
    }
    if (const size_t i = AheadSlot(index); i < ahead_.size()) {
      ++ahead_[i].takers;  // one read serves each Fetch that asked for it
      return;
    }
    if (ahead_.size() >= kReadAheadNodes) return;
    // Read with the others asked for before the next Fetch (Launch).
    ahead_.push_back({index, 1, false, SpareCopy()});
    ++unlaunched_;
  }
  // Starts the reads Prefetch asked for since the last launch, together:
  // over tcp one request to the server for all of them.
  void Launch() {
    if (unlaunched_ == 0) return;
    std::vector<fabric::Endpoint::GetSpan> spans;
    std::vector<std::shared_ptr<AheadCopy>> copies;
    for (Ahead& a : ahead_) {
      if (a.launched) continue;
      a.launched = true;
      spans.push_back({a.copy->bytes, tree::kNodeBytes, nullptr,
                       tree::NodeOffset(a.index)});
      copies.push_back(a.copy);
    }
    unlaunched_ = 0;
    stats_->reads += spans.size();
    stats_->leaves_read_ahead += spans.size();
    // The copies are the callback's too: reads still in flight when the
    // scan ends (or gives up) land in them, not in storage reused since.
    core_->ReadMany(region_id_, std::move(spans),
                    [copies = std::move(copies)](Status st) {
                      for (const auto& c : copies) {
                        c->status = st;
                        c->done = true;
                      }
                    });
  }
  size_t read_ahead() const override { return mapped() ? 0 : kReadAheadNodes; }
  bool ReadAhead(uint32_t index) const override {
    return AheadSlot(index) < ahead_.size();
  }
  // Node `index`'s place in ahead_, or ahead_.size() if it is not there.
  size_t AheadSlot(uint32_t index) const {
    size_t i = 0;
    while (i < ahead_.size() && ahead_[i].index != index) ++i;
    return i;
  }
  void DropReadAhead() override {
    for (Ahead& a : ahead_) {
      if (a.launched) {
        ++stats_->leaves_read_ahead_unused;
      } else {
        a.copy->done = true;  // never read: free at once
      }
      Keep(std::move(a.copy));
    }
    ahead_.clear();
    unlaunched_ = 0;
  }
  // Mapped, a leaf's entries' long keys are resolved as the lookup
  // compares them, each a copy (a lookup in a leaf of 13 long keys reads
  // 4 or 5). Over tcp they are read together with the node, one round
  // trip for all (resolving them one by one would be one each).
  Status FetchForLookup(uint32_t index, uint8_t* scratch,
                        tree::NodeView* view) override {
    return FetchNode(index, scratch, view, /*lazy_leaf=*/mapped());
  }
  Status FetchNode(uint32_t index, uint8_t* scratch, tree::NodeView* view,
                   bool lazy_leaf) {
    if (index == tree::kNoNode) return Status::Corruption("no node");
    Launch();  // the reads asked for go before this one
    if (!ahead_.empty()) {
      // A copy read ahead, if it verifies; else (torn, or a long key freed
      // since) a fresh one below.
      bool taken = false;
      Status st = TakeReadAhead(index, scratch, view, lazy_leaf, &taken);
      if (taken && st.code() != StatusCode::kCorruption) return st;
    }
    const uint64_t offset = tree::NodeOffset(index);
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      REMEM_RETURN_IF_ERROR(CopyNode(offset, scratch));
      ++stats_->reads;
      if (view->Parse(scratch, index).ok()) {
        if (view->long_keys() == 0) return Status::OK();
        // Long keys: each from its key extent. One that does not verify
        // was freed since this copy: the node changed, read it again.
        Status st = lazy_leaf && view->leaf() ? view->ResolveFences(&read_key_)
                                              : ResolveKeys(view);
        if (st.ok()) return st;
        if (st.code() != StatusCode::kCorruption) return st;
      }
      ++stats_->retries;
      Backoff(attempt);
    }
    return Status::Busy("a tree node did not verify");
  }
  // Node `index`'s copy read ahead, if there is one (*taken), waited for,
  // into scratch and parsed: OK; Corruption if it does not verify or its
  // read failed (read again alone: a server that predates reading many
  // nodes in one request refuses it); or the wait's error.
  Status TakeReadAhead(uint32_t index, uint8_t* scratch, tree::NodeView* view,
                       bool lazy_leaf, bool* taken) {
    const size_t slot = AheadSlot(index);
    if (slot == ahead_.size()) return Status::OK();
    auto it = ahead_.begin() + long(slot);
    *taken = true;
    std::shared_ptr<AheadCopy> copy;
    if (--it->takers > 0) {
      copy = it->copy;
    } else {
      copy = std::move(it->copy);
      ahead_.erase(it);
    }
    Status st;
    if (!copy->done) {
      st = core_->ProgressUntil([&copy] { return copy->done; },
                                core_->Deadline());
    }
    if (st.ok() && !copy->status.ok()) {
      st = Status::Corruption("a tree node's read ahead failed: " +
                              copy->status.ToString());
    } else if (st.ok()) {
      std::memcpy(scratch, copy->bytes, tree::kNodeBytes);
      if (!view->Parse(scratch, index).ok()) {
        st = Status::Corruption("a tree node read ahead did not verify");
      } else if (view->long_keys() > 0) {
        st = lazy_leaf && view->leaf() ? view->ResolveFences(&read_key_)
                                       : ResolveKeys(view);
      }
      if (st.code() == StatusCode::kCorruption) ++stats_->retries;
    }
    if (copy->done && copy.use_count() == 1) Keep(std::move(copy));
    return st;
  }
  // A copy's storage, for the next read ahead: one whose read completed and
  // that nothing else holds.
  void Keep(std::shared_ptr<AheadCopy> copy) {
    if (spare_.size() < 2 * kReadAheadNodes) spare_.push_back(std::move(copy));
  }
  std::shared_ptr<AheadCopy> SpareCopy() {
    for (auto& c : spare_) {
      if (c.use_count() == 1 && c->done) {
        std::shared_ptr<AheadCopy> copy = std::move(c);
        c = std::move(spare_.back());
        spare_.pop_back();
        copy->done = false;
        copy->status = Status::OK();
        return copy;
      }
    }
    return std::make_shared<AheadCopy>();
  }
  // A node's bytes into scratch. Mapped, its header's line first, then
  // only the bytes in use, which are all its checksum covers (a torn
  // header's `used` is bounded here and refused by the parse); a
  // round trip reads the whole node at once.
  Status CopyNode(uint64_t offset, uint8_t* scratch) {
    if (!mapped()) {
      return core_->ReadNow(*region_, offset, scratch, tree::kNodeBytes);
    }
    constexpr size_t kFirst = 64;
    REMEM_RETURN_IF_ERROR(core_->ReadNow(*region_, offset, scratch, kFirst));
    tree::NodeHeader h;
    std::memcpy(&h, scratch, sizeof(h));
    const size_t end = tree::NodeBytesInUse(h.used);
    if (end <= kFirst) return Status::OK();
    return core_->ReadNow(*region_, offset + kFirst, scratch + kFirst,
                          end - kFirst);
  }
  // The long keys of a node copy. Mapped, each is a copy; otherwise the
  // reads of all of them are in flight together: one round trip more for
  // the node, not one per key (a leaf of 13 long keys took 13).
  Status ResolveKeys(tree::NodeView* view) {
    if (mapped() || view->long_keys() < 2) {
      return view->ResolveKeys(
          [this](const tree::KeyRef& r, char* dst) { return ReadKey(r, dst); });
    }
    std::vector<tree::KeyRef> refs;
    view->LongKeyRefs(&refs);
    for (const tree::KeyRef& r : refs) REMEM_RETURN_IF_ERROR(CheckKeyRef(r));
    // Owned by the reads' callbacks too: a read still in flight when
    // progress gives up (timeout) writes into it, not into a dead frame.
    struct Batch {
      std::vector<std::vector<uint8_t>> copies;
      size_t left = 0;
      Status failed;
    };
    auto batch = std::make_shared<Batch>();
    batch->copies.resize(refs.size());
    batch->left = refs.size();
    for (size_t i = 0; i < refs.size(); ++i) {
      std::vector<uint8_t>& copy = batch->copies[i];
      copy.resize(tree::KeyExtentReadBytes(refs[i]));
      core_->Read(region_id_, refs[i].offset, copy.data(), copy.size(),
                  [batch](Status st) {
                    if (!st.ok() && batch->failed.ok()) {
                      batch->failed = std::move(st);
                    }
                    --batch->left;
                  });
    }
    stats_->reads += refs.size();
    REMEM_RETURN_IF_ERROR(core_->ProgressUntil(
        [&batch] { return batch->left == 0; }, core_->Deadline()));
    REMEM_RETURN_IF_ERROR(batch->failed);
    size_t next = 0;
    return view->ResolveKeys([&batch, &next](const tree::KeyRef& r, char* dst) {
      return tree::VerifyKeyExtent(batch->copies[next++].data(), r, dst);
    });
  }
  Status CheckKeyRef(const tree::KeyRef& ref) const {
    const uint64_t bytes = tree::KeyExtentReadBytes(ref);
    if (ref.offset < tree::kNodesOffset || ref.offset > region_->length() ||
        bytes > region_->length() - ref.offset) {
      return Status::Corruption("a tree key's extent lies outside the tree");
    }
    return Status::OK();
  }
  // One read of a key extent (header and key), verified against the KeyRef
  // that named it.
  Status ReadKey(const tree::KeyRef& ref, char* dst) {
    REMEM_RETURN_IF_ERROR(CheckKeyRef(ref));
    const uint64_t bytes = tree::KeyExtentReadBytes(ref);
    ExtentBuffer buf(this);
    buf->resize(bytes);
    REMEM_RETURN_IF_ERROR(
        core_->ReadNow(*region_, ref.offset, buf->data(), bytes));
    ++stats_->reads;
    return tree::VerifyKeyExtent(buf->data(), ref, dst);
  }
  // One read of the extent's header, key and value (not the rest of its
  // size class), verified against the leaf entry that named it.
  Status ReadExtent(std::string_view key, uint64_t version,
                    const tree::ValueRef& ref, std::string* value) override {
    const uint64_t bytes = tree::ExtentReadBytes(key.size(), ref);
    if (ref.offset < tree::kNodesOffset || ref.offset > region_->length() ||
        bytes > region_->length() - ref.offset) {
      return Status::Corruption("a tree value's extent lies outside the tree");
    }
    ExtentBuffer buf(this);
    buf->resize(bytes);
    REMEM_RETURN_IF_ERROR(
        core_->ReadNow(*region_, ref.offset, buf->data(), bytes));
    ++stats_->reads;
    Status st = tree::VerifyExtent(buf->data(), key, version, ref, value);
    if (!st.ok()) ++stats_->retries;
    return st;
  }

  // The root, verified (retried while the server publishes it).
  Result<tree::TreeRoot> ReadRoot() {
    tree::TreeRoot r;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      REMEM_RETURN_IF_ERROR(core_->ReadNow(*region_, 0, &r, sizeof(r)));
      ++stats_->reads;
      if (tree::ParseRoot(r).ok()) return r;
      ++stats_->retries;
      Backoff(attempt);
    }
    return Status::Busy("the tree root did not verify");
  }
  static void Backoff(int attempt) {
    if (attempt >= 4) std::this_thread::yield();
  }
  uint64_t prefaulted_ = 0;  // the end of what Prefault faulted in
  client::SessionCore* core_;
  // ReadKey, for views that resolve their keys lazily.
  const tree::NodeView::KeyReader read_key_ =
      [this](const tree::KeyRef& r, char* dst) { return ReadKey(r, dst); };
  uint32_t region_id_;
  const fabric::RemoteRegion* region_ = nullptr;
  TreeStore::ReadStats* stats_;
  // The buffer an extent is copied into: the kept one, or, for a read
  // nested in another (a callback that reads while a read over the
  // network progresses the worker), one of its own, so that the outer
  // read's transfer never lands in storage the inner one reallocated.
  class ExtentBuffer {
   public:
    explicit ExtentBuffer(RemoteSource* s) : s_(s), nested_(s->extent_in_use_) {
      s_->extent_in_use_ = true;
    }
    ~ExtentBuffer() {
      if (!nested_) s_->extent_in_use_ = false;
    }
    std::vector<uint8_t>* operator->() {
      return nested_ ? &own_ : &s_->extent_;
    }

   private:
    RemoteSource* s_;
    bool nested_;
    std::vector<uint8_t> own_;
  };
  std::vector<uint8_t> extent_;  // the last extent copy, kept for capacity
  bool extent_in_use_ = false;
  // Reads ahead (Prefetch) over the network: the copies no Fetch took yet,
  // and storage for more.
  std::vector<Ahead> ahead_;
  size_t unlaunched_ = 0;  // entries of ahead_ not read yet
  std::vector<std::shared_ptr<AheadCopy>> spare_;
};

}  // namespace

struct TreeStore::Impl {
  client::SessionCore* core = nullptr;
  tree::TreeInfo info;
  ReadStats stats;
  std::unique_ptr<RemoteSource> source;
  tree::NodeCache cache;
  std::unique_ptr<client::PathSelector> get_selector, scan_selector;
  client::PathTiming get_timing, scan_timing;  // which operations are timed
  client::DepthSplit scan_split;
  size_t in_flight = 0;

  // The session's bookkeeping (Began/Ended) without its Track's wrapper:
  // one std::function fewer to allocate per operation.
  template <typename Arg, typename Fn>
  auto Track(Fn done) {
    ++in_flight;
    core->Began();
    return [this, done = std::move(done)](Arg r) mutable {
      --in_flight;
      core->Ended(r);
      if (done) done(std::move(r));
    };
  }

  // Track for a batch: its status for WaitAll is its first error other
  // than NotFound.
  template <typename T>
  auto TrackBatch(std::function<void(std::vector<Result<T>>)> done) {
    ++in_flight;
    core->Began();
    return [this, done = std::move(done)](std::vector<Result<T>> r) mutable {
      --in_flight;
      Status first;
      for (const Result<T>& x : r) {
        if (!x.ok() && x.status().code() != StatusCode::kNotFound) {
          first = x.status();
          break;
        }
      }
      core->Ended(first);
      if (done) done(std::move(r));
    };
  }

  Status CheckKey(std::string_view key) const {
    if (key.empty() || key.size() > info.max_key) {
      return Status::InvalidArgument("tree keys are 1.." +
                                     std::to_string(info.max_key) + " bytes");
    }
    return Status::OK();
  }
  Status CheckScan(std::string_view start, std::string_view end,
                   uint32_t limit) const {
    if (limit == 0 || limit > info.max_scan) {
      return Status::InvalidArgument("scan limit must be 1.." +
                                     std::to_string(info.max_scan));
    }
    if (start.size() > info.max_key + 1 || end.size() > info.max_key + 1) {
      return Status::InvalidArgument("scan bounds are at most " +
                                     std::to_string(info.max_key + 1) +
                                     " bytes");
    }
    if (!end.empty() && start > end) {
      return Status::InvalidArgument("scan range is reversed (start > end)");
    }
    return Status::OK();
  }
  void Count(const tree::SearchStats& s) {
    stats.moves_right += s.moves_right;
    stats.retries += s.stale_values;  // leaves read again
  }

  // The path of an asynchronous get or scan (its Track()ed callback
  // already counted in in_flight), and whether kAuto times it: a one-sided
  // operation over the call, an RPC from the call to its answer. Over a
  // served transport (tcp) with other operations in flight on the
  // session's loop (this store's, or, in a cluster client, any server's),
  // auto sends it by RPC, untimed: it rides in the message the next flush
  // sends anyway, where each one-sided node read would be a round trip of
  // its own during which no other answer is taken, and the latencies
  // compared would be mostly the queue both paths share (the hash store
  // does the same).
  client::Path ChooseAsync(client::PathSelector* selector,
                           client::PathTiming* timing, bool* timed,
                           Clock::time_point* start) {
    *timed = false;
    if (selector->mode() != ReadPath::kAuto) {
      return selector->Choose(timing->last_now());
    }
    if (core->served() && core->loop_in_flight() > 1) return client::Path::kRpc;
    const client::Path path = timing->Choose(selector, timed, start);
    ExploreWarm(*selector, path, timed, start);
    return path;
  }

  // Whether auto splits the next scan between the client's core and the
  // server's (client::DepthSplit): over shared memory, with other
  // operations of this store in flight, once one-sided scans have been
  // measured. Over a served transport ChooseAsync sends them by RPC. Point
  // gets are not split: an RPC costs the client about what a one-sided
  // get does (BENCHMARKS, "YCSB-E: scans split between the two cores").
  bool SplitsScan() const {
    return scan_selector->mode() == ReadPath::kAuto && !core->served() &&
           in_flight > 1 &&
           scan_selector->Samples(client::Path::kOneSided) >=
               client::PathSelectorOptions{}.min_samples;
  }

  // Before an exploration of the one-sided path, what a path taken for
  // good would have warm is made so, and the timing starts after that:
  // over shared memory the nodes allocated since the last exploration are
  // mapped (Prefault), and the cache gets the memory for the nodes the
  // exploration's searches may add (NodeCache::Reserve). While auto takes
  // the RPC path the client touches no node and caches none, so the nodes
  // a growing tree adds are not in its page table, nor the cache's copies
  // of the internal nodes the RPC path's keys pass through in its heap; an
  // exploration's scans met them with a page fault each (1.2 a scan of
  // YCSB-E with zipfian keys, 0.6 with uniform ones, where each scan
  // caches a node the cache has not seen; 25-73 us a scan against 8 forced
  // one-sided), and the selector stayed on RPC, whose scans fault nothing
  // in, at half the one-sided rate (BENCHMARKS, "YCSB-E: the selector's
  // trap"). A path taken for good maps nodes and grows the cache as it
  // reads, as forced one-sided scans do.
  void ExploreWarm(const client::PathSelector& selector, client::Path path,
                   bool* timed, Clock::time_point* start) {
    if (path != client::Path::kOneSided || !selector.exploring()) return;
    cache.Reserve(kExploreCacheRoom);
    if (source->mapped()) source->Prefault();
    if (*timed) *start = Clock::now();
  }
  // Nodes an exploration's burst (32 operations) may add to the cache: a
  // search caches the internal nodes of its descent that it did not have.
  static constexpr size_t kExploreCacheRoom = 64;

  // The last epoch the serving mark called stale (RangesCovered).
  uint32_t stale_epoch = UINT32_MAX;

  // After a one-sided search in a cluster (the session routed by a
  // configuration) whose leaves' highest stamp was `stamp`: OK if the
  // tree's serving mark (tree/layout.h) says this server owned the same
  // ranges at the session's epoch and still does, so what the search read
  // is the range owner's, and (replicated) that the backups hold every
  // write those leaves show; Moved (once per epoch) if the server's ranges
  // changed after that epoch (the cluster client fetches the configuration
  // again); else Busy (ask the server: a range on its way out, an epoch
  // the server has not installed, or writes not yet held by the backups).
  Status RangesCovered(uint64_t stamp) {
    if (!core->serving_checked()) return Status::OK();
    const uint32_t epoch = core->serving_epoch();
    if (!core->serving_versions_checked()) stamp = 0;
    hash::ServingMark mark;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      REMEM_RETURN_IF_ERROR(core->ReadNow(
          info.region, tree::kTreeServingMarkOffset, &mark, sizeof(mark)));
      ++stats.reads;
      switch (hash::JudgeServingMark(mark, epoch, stamp)) {
        case hash::MarkVerdict::kTrusted:
          return Status::OK();
        case hash::MarkVerdict::kTorn:
          continue;
        case hash::MarkVerdict::kAskServer:
          return Status::Busy("the server does not vouch for its ranges now");
        case hash::MarkVerdict::kStale:
          // Once per epoch: a refresh that brought no newer configuration
          // would say Moved again, while the server answers by RPC.
          if (epoch == stale_epoch) {
            return Status::Busy("the configuration is stale; ask the server");
          }
          stale_epoch = epoch;
          return Status::Moved(
              "the server owns other ordered ranges since "
              "an epoch after " +
              std::to_string(epoch) + " (the configuration is stale)");
      }
    }
    return Status::Busy("the serving mark did not verify");
  }
  // After a one-sided search that found its answer in leaves whose
  // highest stamp was `stamp`: OK if it may be returned; Moved to return
  // instead; else gave_up (ask the server).
  Status Vouched(uint64_t stamp, bool* gave_up) {
    if (!core->Vouch().ok()) {
      ++stats.unvouched;
      *gave_up = true;
      return Status::OK();
    }
    Status c = RangesCovered(stamp);
    if (c.ok() || c.code() == StatusCode::kMoved) return c;
    ++stats.unvouched;
    *gave_up = true;
    return Status::OK();
  }

  // A one-sided attempt: OK/NotFound (vouched), or gave_up when the server
  // must be asked (nodes did not verify, the lease does not vouch, or in a
  // cluster the serving mark does not); Moved when the configuration the
  // session routed by is stale.
  Status GetOneSided(std::string_view key, Value* out, bool* gave_up) {
    tree::SearchStats s;
    const uint64_t hits = cache.hits;
    Status st =
        tree::Lookup(source.get(), &cache, key, &out->value, &out->version, &s);
    stats.cache_hits += cache.hits - hits;
    Count(s);
    if (st.ok() || st.code() == StatusCode::kNotFound) {
      Status v = Vouched(s.max_stamp, gave_up);
      return v.ok() ? st : v;
    }
    *gave_up = !ConnectionFailed(st);
    return st;
  }
  // A read that failed with the connection (it timed out, and the session
  // was torn down; or the server is gone): the answer, as the hash store
  // gives it (session.h: the one that timed out says TimedOut). Asking the
  // server instead only said Unavailable.
  static bool ConnectionFailed(const Status& st) {
    return st.code() == StatusCode::kTimedOut ||
           st.code() == StatusCode::kUnavailable;
  }
  Status ScanOneSided(std::string_view start, std::string_view end,
                      uint32_t limit, bool desc, tree::ScanPage* page,
                      bool* gave_up) {
    tree::SearchStats s;
    const uint64_t hits = cache.hits;
    Status st = tree::ScanRange(source.get(), &cache, start, end, limit, desc,
                                page, &s);
    stats.cache_hits += cache.hits - hits;
    Count(s);
    if (st.ok()) {
      Status v = Vouched(s.max_stamp, gave_up);
      if (!v.ok()) {
        tree::ClearPage(page);
        return v;
      }
    } else if (st.code() != StatusCode::kInvalidArgument &&
               !ConnectionFailed(st)) {
      *gave_up = true;
    }
    return st;
  }

  // Into *into (its string's storage reused).
  // *timed (then *start) as get_timing decides.
  Status Get(std::string_view key, Value* into, client::Path* path, bool* timed,
             Clock::time_point* start) {
    REMEM_RETURN_IF_ERROR(CheckKey(key));
    *path = get_timing.Choose(get_selector.get(), timed, start);
    ExploreWarm(*get_selector, *path, timed, start);
    if (*path == client::Path::kOneSided) {
      bool gave_up = false;
      Status st = GetOneSided(key, into, &gave_up);
      if (!gave_up) {
        ++stats.onesided_gets;
        return st;
      }
      ++stats.fallbacks;
      *timed = false;  // a fallback's time is neither path's
    }
    ++stats.rpc_gets;
    return GetByRpc(key, into);
  }
  // One get by RPC, waited for.
  Status GetByRpc(std::string_view key, Value* into) {
    auto r = core->CallSync(tree::kTreeService,
                            tree::MethodId(tree::TreeMethod::kGet),
                            tree::EncodeTreeKey(key));
    if (!r.ok()) return r.status();
    auto v = tree::DecodeTreeGetReply(*r);
    if (!v.ok()) return v.status();
    into->value = std::move(v->second);
    into->version = v->first;
    return Status::OK();
  }

  // Into *page (its storage reused); cleared on an error.
  // *timed (then *t0) as scan_timing decides.
  Status Scan(std::string_view start, std::string_view end, uint32_t limit,
              Order order, Page* page, client::Path* path, bool* timed,
              Clock::time_point* t0) {
    if (Status st = CheckScan(start, end, limit); !st.ok()) {
      tree::ClearPage(page);
      return st;
    }
    const bool desc = order == Order::kDescending;
    *path = scan_timing.Choose(scan_selector.get(), timed, t0);
    ExploreWarm(*scan_selector, *path, timed, t0);
    if (*path == client::Path::kOneSided) {
      bool gave_up = false;
      Status st = ScanOneSided(start, end, limit, desc, page, &gave_up);
      if (!gave_up) {
        ++stats.onesided_scans;
        return st;
      }
      ++stats.fallbacks;
      *timed = false;  // a fallback's time is neither path's
    }
    ++stats.rpc_scans;
    auto r = core->CallSync(tree::kTreeService,
                            tree::MethodId(tree::TreeMethod::kScan),
                            tree::EncodeTreeScan({start, end, limit, desc}));
    if (!r.ok()) {
      tree::ClearPage(page);
      return r.status();
    }
    return tree::DecodeTreeScanReply(*r, page);
  }

  // Requests of batches in flight at once: four of one batch, sixteen of
  // all the store's. Each waits for an earlier one to answer before it
  // goes: all at once, the last of a large batch would wait behind the
  // others at the server past their deadline (set when they are sent) and
  // be reported failed, a put then applied all the same.
  static constexpr size_t kWindow = 4;
  static constexpr size_t kStoreWindow = 16;

  // A batched call to the server: `count` requests, each encoded when it
  // is sent (from views of the caller's keys and values for a synchronous
  // batch, of the batch's own copy for an asynchronous one). After a
  // request fails, no further one is sent.
  struct RpcBatch {
    uint8_t method = 0;
    size_t count = 0;
    size_t next = 0;  // the first request not yet sent
    size_t in_flight = 0;
    bool queued = false;  // in Impl::waiting
    Status failed;        // the first failure among its requests
    util::MoveFunction<std::string(size_t)> encode;
    // Request i's reply (or its failure); may add requests (count).
    util::MoveFunction<void(RpcBatch&, size_t, Status, std::string)> on_reply;
    // Once every request sent has answered and none is left to send, or a
    // failure stopped them: requests [next, count) were never sent.
    util::MoveFunction<void(RpcBatch&)> on_done;

    bool CanSend() const {
      return failed.ok() && next < count && in_flight < kWindow;
    }
    bool Finished() const {
      return in_flight == 0 && (!failed.ok() || next == count);
    }
  };
  size_t batch_requests = 0;  // of all the store's batches, in flight
  // Batches with requests to send, waiting for room in kStoreWindow; they
  // send one request each in turn.
  std::deque<std::shared_ptr<RpcBatch>> waiting;

  void Issue(std::shared_ptr<RpcBatch> b) {
    b->queued = true;
    waiting.push_back(std::move(b));
    SendWaiting();
  }
  void SendWaiting() {
    while (batch_requests < kStoreWindow && !waiting.empty()) {
      std::shared_ptr<RpcBatch> b = std::move(waiting.front());
      waiting.pop_front();
      b->queued = false;
      if (!b->CanSend()) continue;  // its next answer queues it again
      const size_t i = b->next++;
      ++b->in_flight;
      ++batch_requests;
      core->Call(tree::kTreeService, b->method, b->encode(i),
                 [this, b, i](Status st, std::string payload) {
                   --b->in_flight;
                   --batch_requests;
                   if (!st.ok() && b->failed.ok()) b->failed = st;
                   b->on_reply(*b, i, std::move(st), std::move(payload));
                   if (b->CanSend() && !b->queued) {
                     b->queued = true;
                     waiting.push_back(b);
                   }
                   if (b->Finished() && b->on_done) {
                     auto done = std::move(b->on_done);
                     done(*b);
                   }
                   SendWaiting();
                 });
      if (b->CanSend()) {
        b->queued = true;
        waiting.push_back(std::move(b));
      }
    }
  }
  // The result of a request never sent.
  static Status NotSent(const Status& failed) {
    return Status::Busy("not sent: an earlier request of the batch failed (" +
                        failed.ToString() + ")");
  }

  // Waits for a synchronous batch: its requests meet their own deadlines,
  // so it ends unless the server stops answering altogether; then the
  // session's calls are failed, which ends it too.
  void WaitForBatch(const bool* finished) {
    if (*finished) return;
    Status st = core->ProgressWhileAnswered([finished] { return *finished; },
                                            core->options().timeout);
    if (!st.ok()) {
      core->Fail(st);
      (void)core->ProgressUntil([finished] { return *finished; },
                                Clock::now() + std::chrono::seconds(30));
    }
  }

  // An asynchronous batch: start(done') issues it, and `done` (tracked)
  // gets its results at a later Poll, never in the call.
  template <typename T, typename Start>
  void RunBatchAsync(std::function<void(std::vector<Result<T>>)> done,
                     Start start) {
    auto cb = TrackBatch<T>(std::move(done));
    auto in_call = std::make_shared<bool>(true);
    start([core = core, cb, in_call](std::vector<Result<T>> r) mutable {
      if (!*in_call) return cb(std::move(r));
      core->Defer([cb, r = std::move(r)]() mutable { cb(std::move(r)); });
    });
    *in_call = false;
  }

  // A synchronous batch of n: start(done) issues it, and its results are
  // waited for.
  template <typename T, typename Start>
  std::vector<Result<T>> RunBatch(size_t n, Start start) {
    // Shared: should the wait give up, a late answer still has its place.
    auto out = std::make_shared<std::pair<bool, std::vector<Result<T>>>>();
    start([out](std::vector<Result<T>> r) {
      out->second = std::move(r);
      out->first = true;
    });
    WaitForBatch(&out->first);
    if (!out->first) {  // not even failing the session ended it
      out->second.assign(n, Status::TimedOut("the batch never ended"));
    }
    return std::move(out->second);
  }

  using MultiGetDone = util::MoveFunction<void(std::vector<Result<Value>>)>;
  using MultiPutDone = util::MoveFunction<void(std::vector<Result<uint64_t>>)>;

  // Copies of what views name, into one buffer `arena` (an asynchronous
  // batch's own): the views then name the copies.
  static void CopyInto(std::string* arena,
                       std::vector<std::string_view*> views) {
    size_t bytes = 0;
    for (const std::string_view* v : views) bytes += v->size();
    arena->reserve(bytes);  // no reallocation below: the views stay valid
    for (std::string_view* v : views) {
      const size_t at = arena->size();
      arena->append(*v);
      *v = std::string_view(arena->data() + at, v->size());
    }
  }

  // A multi-get: invalid keys and (on the one-sided path) lookups are
  // answered in the call; the other keys are asked of the server, up to
  // kMaxMultiGetKeys a request; keys a full reply left unanswered (Busy:
  // its values reached the reply's bound) are asked again together, and a
  // request's first key answered Busy keeps that answer (the server
  // answers a request's first key in full, so Busy there is the tree's own,
  // and asking again could go on forever). `copy`: the keys asked are
  // copied (an asynchronous batch), else they must stay valid until `done`
  // has run. `done` gets one result per key, in the call if no key went to
  // the server. On auto over a served transport (tcp) every key goes to
  // the server: there a one-sided lookup is a round trip per node, where a
  // request is one message for thousands of keys.
  void MultiGet(const std::vector<std::string_view>& keys, bool copy,
                MultiGetDone done) {
    struct State {
      std::vector<Result<Value>> results;
      std::string arena;                   // the copied keys
      std::vector<std::string_view> keys;  // asked of the server
      std::vector<size_t> slots;           // keys[k]'s index in results
      std::vector<size_t> order;  // keys, in the order requests ask them
      std::vector<std::pair<size_t, size_t>> spans;  // request i: order[a, b)
    };
    auto s = std::make_shared<State>();
    s->results.assign(keys.size(), Status::Internal("not answered"));
    client::PathSelector& sel = *get_selector;
    const bool rpc_only = sel.mode() == ReadPath::kAuto && core->served();
    const bool onesided = !rpc_only && sel.Choose() == client::Path::kOneSided;
    // Over the network, the leaves of the next keys (as the cache routes
    // them) are read together, and each lookup takes its leaf's copy: a
    // round trip per window of keys rather than one per key. The copies
    // serve only this batch, all of whose gets are in flight while they
    // are read.
    const size_t window = onesided ? source->read_ahead() : 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (window > 0 && i % window == 0) {
        source->DropReadAhead();
        for (size_t j = i; j < std::min(keys.size(), i + window); ++j) {
          tree::Target t;
          t.key = keys[j];
          source->Prefetch(tree::CachedLeaf(&cache, t));
        }
      }
      if (Status st = CheckKey(keys[i]); !st.ok()) {
        s->results[i] = st;
        continue;
      }
      if (onesided) {
        Value v;
        bool gave_up = false;
        Status st = GetOneSided(keys[i], &v, &gave_up);
        if (!gave_up) {
          ++stats.onesided_gets;
          s->results[i] = st.ok() ? Result<Value>(std::move(v)) : st;
          continue;
        }
        ++stats.fallbacks;
      }
      s->order.push_back(s->keys.size());
      s->keys.push_back(keys[i]);
      s->slots.push_back(i);
    }
    if (window > 0) source->DropReadAhead();
    stats.rpc_gets += s->keys.size();
    if (s->keys.empty()) return done(std::move(s->results));
    if (copy) {
      std::vector<std::string_view*> views;
      for (std::string_view& k : s->keys) views.push_back(&k);
      CopyInto(&s->arena, std::move(views));
    }
    for (size_t first = 0; first < s->order.size();
         first += tree::kMaxMultiGetKeys) {
      s->spans.emplace_back(
          first, std::min(s->order.size(), first + tree::kMaxMultiGetKeys));
    }
    auto b = std::make_shared<RpcBatch>();
    b->method = tree::MethodId(tree::TreeMethod::kMultiGet);
    b->count = s->spans.size();
    b->encode = [s](size_t i) {
      std::vector<std::string_view> batch;
      for (size_t j = s->spans[i].first; j < s->spans[i].second; ++j) {
        batch.push_back(s->keys[s->order[j]]);
      }
      return tree::EncodeTreeMultiGet(batch);
    };
    b->on_reply = [s](RpcBatch& b, size_t i, Status st, std::string payload) {
      const auto [first, last] = s->spans[i];
      auto items = st.ok()
                       ? tree::DecodeTreeMultiGetReply(payload, last - first)
                       : Result<std::vector<Result<Value>>>(st);
      const size_t again = s->order.size();
      // A full reply answers the rest Busy after values it holds: those go
      // again. Busy with nothing served before it (a range being handed
      // over) is the caller's to retry.
      bool served = false;
      for (size_t j = first; j < last; ++j) {
        const size_t k = s->order[j];
        Result<Value>& slot = s->results[s->slots[k]];
        if (!items.ok()) {
          slot = items.status();
        } else if ((*items)[j - first].status().code() == StatusCode::kBusy &&
                   served) {
          s->order.push_back(k);
        } else {
          served = served || (*items)[j - first].ok();
          slot = std::move((*items)[j - first]);
        }
      }
      if (s->order.size() > again) {
        s->spans.emplace_back(again, s->order.size());
        ++b.count;
      }
    };
    b->on_done = [s, done = std::move(done)](RpcBatch& b) mutable {
      for (size_t i = b.next; i < b.count; ++i) {
        for (size_t j = s->spans[i].first; j < s->spans[i].second; ++j) {
          s->results[s->slots[s->order[j]]] = NotSent(b.failed);
        }
      }
      done(std::move(s->results));
    };
    Issue(std::move(b));
  }

  Status CheckPair(std::string_view key, std::string_view value) const {
    REMEM_RETURN_IF_ERROR(CheckKey(key));
    if (value.size() > info.max_value) {
      return Status::InvalidArgument("tree values are at most " +
                                     std::to_string(info.max_value) + " bytes");
    }
    return Status::OK();
  }

  // A multi-put: invalid pairs are refused in the call, the others go in
  // requests of up to kMaxMultiGetKeys pairs and kMultiPutBytes. `copy` as
  // MultiGet's. `done` gets one result per pair, in the call if none went
  // to the server.
  void MultiPut(const std::vector<tree::KeyValueView>& pairs, bool copy,
                MultiPutDone done) {
    struct State {
      std::vector<Result<uint64_t>> results;
      std::string arena;                      // the copied pairs
      std::vector<tree::KeyValueView> pairs;  // those sent
      std::vector<size_t> slots;              // pairs[k]'s index in results
      std::vector<std::pair<size_t, size_t>> spans;  // request i: pairs[a, b)
    };
    auto s = std::make_shared<State>();
    s->results.assign(pairs.size(), Status::Internal("not answered"));
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (Status st = CheckPair(pairs[i].first, pairs[i].second); !st.ok()) {
        s->results[i] = st;
      } else {
        s->pairs.push_back(pairs[i]);
        s->slots.push_back(i);
      }
    }
    if (s->pairs.empty()) return done(std::move(s->results));
    if (copy) {
      std::vector<std::string_view*> views;
      for (auto& [k, v] : s->pairs) {
        views.push_back(&k);
        views.push_back(&v);
      }
      CopyInto(&s->arena, std::move(views));
    }
    for (size_t first = 0; first < s->pairs.size();) {
      size_t last = first, bytes = 0;
      while (last < s->pairs.size() && last - first < tree::kMaxMultiGetKeys) {
        const auto& [k, v] = s->pairs[last];
        if (last > first &&
            bytes + k.size() + v.size() > tree::kMultiPutBytes) {
          break;
        }
        bytes += k.size() + v.size();
        ++last;
      }
      s->spans.emplace_back(first, last);
      first = last;
    }
    auto b = std::make_shared<RpcBatch>();
    b->method = tree::MethodId(tree::TreeMethod::kMultiPut);
    b->count = s->spans.size();
    b->encode = [s](size_t i) {
      return tree::EncodeTreeMultiPut(
          {s->pairs.begin() + long(s->spans[i].first),
           s->pairs.begin() + long(s->spans[i].second)});
    };
    b->on_reply = [s](RpcBatch&, size_t i, Status st, std::string payload) {
      const auto [first, last] = s->spans[i];
      auto items = st.ok()
                       ? tree::DecodeTreeMultiPutReply(payload, last - first)
                       : Result<std::vector<Result<uint64_t>>>(st);
      for (size_t j = first; j < last; ++j) {
        s->results[s->slots[j]] = items.ok() ? std::move((*items)[j - first])
                                             : Result<uint64_t>(items.status());
      }
    };
    b->on_done = [s, done = std::move(done)](RpcBatch& b) mutable {
      for (size_t i = b.next; i < b.count; ++i) {
        for (size_t j = s->spans[i].first; j < s->spans[i].second; ++j) {
          s->results[s->slots[j]] = NotSent(b.failed);
        }
      }
      done(std::move(s->results));
    };
    Issue(std::move(b));
  }

  Result<uint64_t> Put(std::string_view key, std::string_view value,
                       tree::PutMode mode, uint64_t expected) {
    REMEM_RETURN_IF_ERROR(CheckPair(key, value));
    auto r = core->CallSync(tree::kTreeService,
                            tree::MethodId(tree::TreeMethod::kPut),
                            tree::EncodePutFor(key, value, mode, expected));
    if (!r.ok()) return r.status();
    return tree::DecodeTreePutReply(*r);
  }
};

TreeStore::TreeStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TreeStore::~TreeStore() {
  Impl& s = *impl_;
  // Our callbacks point into this store: let them run first. A batch may
  // take many timeouts, so the bound counts from the server's last answer;
  // a session that gives up fails the rest.
  if (s.in_flight > 0) {
    (void)s.core->ProgressWhileAnswered([&s] { return s.in_flight == 0; },
                                        s.core->options().timeout);
    if (s.in_flight > 0) {
      s.core->Fail(Status::Unavailable("the tree store was closed"));
      (void)s.core->worker()->ProgressUntil(
          [&s] { return s.in_flight == 0; },
          Clock::now() + std::chrono::seconds(30));
    }
  }
}

Result<std::unique_ptr<TreeStore>> TreeStore::Open(Session* session,
                                                   const TreeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->core = session->core();
  auto reply = impl->core->CallSync(
      tree::kTreeService, tree::MethodId(tree::TreeMethod::kInfo), {});
  if (!reply.ok()) return reply.status().WithContext("opening the tree store");
  auto info = tree::DecodeTreeInfo(*reply);
  if (!info.ok()) return info.status().WithContext("opening the tree store");
  impl->info = *info;
  bool ours = false;
  for (const proto::RegionInfoWire& r : impl->core->all_regions()) {
    ours |= r.region_id == info->region && r.service == tree::kTreeService;
  }
  if (!ours) {
    return Status::ProtocolError("the tree is in an unknown region " +
                                 std::to_string(info->region));
  }
  impl->source =
      std::make_unique<RemoteSource>(impl->core, info->region, &impl->stats);
  REMEM_RETURN_IF_ERROR(impl->source->Init());
  impl->cache = tree::NodeCache(std::max<size_t>(options.cache_nodes, 1));
  if (impl->source->mapped()) {
    // Best effort: searches fault pages in and fill the cache themselves
    // otherwise.
    impl->source->Prefault();
    std::vector<uint8_t> scratch(tree::kNodeBytes);
    (void)tree::WarmCache(impl->source.get(), &impl->cache, scratch.data());
  }
  // Explorations in bursts: a one-sided search taken once between RPCs
  // runs with the cached nodes cold in the CPU's caches and measured
  // slower than RPC at 10 M keys, where back to back it is faster.
  client::PathSelectorOptions so;
  so.explore_burst = 32;
  so.explore_interval = std::chrono::milliseconds(8);
  so.mode = options.read_path.value_or(impl->core->options().read_path);
  impl->get_selector = std::make_unique<client::PathSelector>(so);
  so.mode = options.scan_path.value_or(impl->core->options().read_path);
  impl->scan_selector = std::make_unique<client::PathSelector>(so);
  return std::unique_ptr<TreeStore>(new TreeStore(std::move(impl)));
}

Result<TreeStore::Value> TreeStore::Get(std::string_view key) {
  Value v;
  REMEM_RETURN_IF_ERROR(Get(key, &v));
  return v;
}

Status TreeStore::Get(std::string_view key, Value* into) {
  bool timed = false;
  Clock::time_point start;
  client::Path path = client::Path::kRpc;  // set by Impl unless refused
  Status st = impl_->Get(key, into, &path, &timed, &start);
  if (timed && (st.ok() || st.code() == StatusCode::kNotFound)) {
    impl_->get_timing.Record(impl_->get_selector.get(), path, start);
  }
  return st;
}

Result<TreeStore::Page> TreeStore::Scan(std::string_view start,
                                        std::string_view end, uint32_t limit,
                                        Order order) {
  Page page;
  REMEM_RETURN_IF_ERROR(ScanInto(start, end, limit, order, &page));
  return page;
}

Status TreeStore::ScanInto(std::string_view start, std::string_view end,
                           uint32_t limit, Order order, Page* page) {
  bool timed = false;
  Clock::time_point t0;
  client::Path path = client::Path::kRpc;  // set by Impl unless refused
  Status st = impl_->Scan(start, end, limit, order, page, &path, &timed, &t0);
  if (timed && st.ok()) {
    impl_->scan_timing.Record(impl_->scan_selector.get(), path, t0);
  }
  return st;
}

Result<TreeStore::Page> TreeStore::ScanPrefix(std::string_view prefix,
                                              uint32_t limit, Order order) {
  const std::string end = tree::PrefixEnd(prefix);
  if (!prefix.empty() && end.empty() && order == Order::kAscending) {
    return Scan(prefix, {}, limit, order);  // a prefix of 0xff bytes
  }
  return Scan(prefix, end, limit, order);
}

Result<uint64_t> TreeStore::Put(std::string_view key, std::string_view value) {
  return impl_->Put(key, value, tree::PutMode::kUpsert, 0);
}

Result<uint64_t> TreeStore::PutIfAbsent(std::string_view key,
                                        std::string_view value) {
  return impl_->Put(key, value, tree::PutMode::kIfAbsent, 0);
}

Result<uint64_t> TreeStore::CompareAndPut(std::string_view key,
                                          std::string_view value,
                                          uint64_t expected) {
  return impl_->Put(key, value, tree::PutMode::kIfVersion, expected);
}

Status TreeStore::Delete(std::string_view key) {
  REMEM_RETURN_IF_ERROR(impl_->CheckKey(key));
  return impl_->core
      ->CallSync(tree::kTreeService, tree::MethodId(tree::TreeMethod::kDelete),
                 tree::EncodeTreeKey(key))
      .status();
}

std::vector<Result<TreeStore::Value>> TreeStore::MultiGet(
    const std::vector<std::string_view>& keys) {
  return impl_->RunBatch<Value>(keys.size(), [&](auto done) {
    impl_->MultiGet(keys, /*copy=*/false, std::move(done));
  });
}

std::vector<Result<uint64_t>> TreeStore::MultiPut(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs) {
  return impl_->RunBatch<uint64_t>(pairs.size(), [&](auto done) {
    impl_->MultiPut(pairs, /*copy=*/false, std::move(done));
  });
}

void TreeStore::MultiGetAsync(const std::vector<std::string_view>& keys,
                              MultiGetCallback done) {
  impl_->RunBatchAsync<Value>(std::move(done), [&](auto deliver) {
    impl_->MultiGet(keys, /*copy=*/true, std::move(deliver));
  });
}

void TreeStore::MultiPutAsync(
    const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
    MultiPutCallback done) {
  impl_->RunBatchAsync<uint64_t>(std::move(done), [&](auto deliver) {
    impl_->MultiPut(pairs, /*copy=*/true, std::move(deliver));
  });
}

// --- asynchronous

void TreeStore::GetAsync(std::string_view key, GetCallback done) {
  auto cb = impl_->Track<Result<Value>>(std::move(done));
  if (Status st = impl_->CheckKey(key); !st.ok()) {
    return impl_->core->Defer([cb = std::move(cb), st]() mutable { cb(st); });
  }
  client::PathSelector* selector = impl_->get_selector.get();
  client::PathTiming* timing = &impl_->get_timing;
  bool timed = false;
  Clock::time_point start;
  const client::Path path =
      impl_->ChooseAsync(selector, timing, &timed, &start);
  if (path == client::Path::kOneSided) {
    Value v;
    bool gave_up = false;
    Status st = impl_->GetOneSided(key, &v, &gave_up);
    if (!gave_up) {
      ++impl_->stats.onesided_gets;
      if (timed) timing->Record(selector, path, start);
      Result<Value> r = st.ok() ? Result<Value>(std::move(v)) : st;
      return impl_->core->Defer(
          [cb = std::move(cb), r = std::move(r)]() mutable {
            cb(std::move(r));
          });
    }
    ++impl_->stats.fallbacks;
    timed = false;  // a fallback's time is neither path's
  }
  ++impl_->stats.rpc_gets;
  impl_->core->Call(
      tree::kTreeService, tree::MethodId(tree::TreeMethod::kGet),
      tree::EncodeTreeKey(key),
      [cb = std::move(cb), timed, start, selector, timing](
          Status st, std::string payload) mutable {
        if (!st.ok()) return cb(st);
        auto v = tree::DecodeTreeGetReply(payload);
        if (timed && (v.ok() || v.status().code() == StatusCode::kNotFound)) {
          timing->Record(selector, client::Path::kRpc, start);
        }
        if (!v.ok()) return cb(v.status());
        cb(Value{std::move(v->second), v->first});
      });
}

void TreeStore::PutAsync(std::string_view key, std::string_view value,
                         VersionCallback done) {
  auto cb = impl_->Track<Result<uint64_t>>(std::move(done));
  Status st = impl_->CheckKey(key);
  if (st.ok() && value.size() > impl_->info.max_value) {
    st = Status::InvalidArgument("tree values are at most " +
                                 std::to_string(impl_->info.max_value) +
                                 " bytes");
  }
  if (!st.ok()) {
    return impl_->core->Defer([cb = std::move(cb), st]() mutable { cb(st); });
  }
  impl_->core->Call(
      tree::kTreeService, tree::MethodId(tree::TreeMethod::kPut),
      tree::EncodePutFor(key, value, tree::PutMode::kUpsert, 0),
      [cb = std::move(cb)](Status st, std::string payload) mutable {
        if (!st.ok()) return cb(st);
        cb(tree::DecodeTreePutReply(payload));
      });
}

void TreeStore::DeleteAsync(std::string_view key, Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  if (Status st = impl_->CheckKey(key); !st.ok()) {
    return impl_->core->Defer([cb = std::move(cb), st]() mutable { cb(st); });
  }
  impl_->core->Call(
      tree::kTreeService, tree::MethodId(tree::TreeMethod::kDelete),
      tree::EncodeTreeKey(key),
      [cb = std::move(cb)](Status st, std::string) mutable { cb(st); });
}

void TreeStore::ScanAsync(std::string_view start, std::string_view end,
                          uint32_t limit, Order order, ScanCallback done) {
  auto page = std::make_shared<Page>();
  ScanAsync(start, end, limit, order, page.get(),
            [page, done = std::move(done)](Status st) mutable {
              if (!done) return;
              if (!st.ok()) return done(st);
              done(std::move(*page));
            });
}

void TreeStore::ScanAsync(std::string_view start, std::string_view end,
                          uint32_t limit, Order order, Page* page,
                          Callback done) {
  auto cb = impl_->Track<Status>(std::move(done));
  if (Status st = impl_->CheckScan(start, end, limit); !st.ok()) {
    tree::ClearPage(page);
    return impl_->core->Defer([cb = std::move(cb), st]() mutable { cb(st); });
  }
  const bool desc = order == Order::kDescending;
  client::PathSelector* selector = impl_->scan_selector.get();
  client::PathTiming* timing = &impl_->scan_timing;
  bool timed = false;
  Clock::time_point t0;
  client::Path path;
  bool split = false;
  if (impl_->SplitsScan()) {
    split = impl_->scan_split.TakeRpc(
        impl_->in_flight, selector->Estimate(client::Path::kOneSided));
    path = split ? client::Path::kRpc : client::Path::kOneSided;
    timed = !split && timing->Sample(*selector, path);
    if (timed) t0 = Clock::now();
  } else {
    path = impl_->ChooseAsync(selector, timing, &timed, &t0);
  }
  if (path == client::Path::kOneSided) {
    bool gave_up = false;
    Status st = impl_->ScanOneSided(start, end, limit, desc, page, &gave_up);
    if (!gave_up) {
      ++impl_->stats.onesided_scans;
      if (timed && st.ok()) timing->Record(selector, path, t0);
      return impl_->core->Defer([cb = std::move(cb), st]() mutable { cb(st); });
    }
    ++impl_->stats.fallbacks;
    timed = false;  // a fallback's time is neither path's
  }
  ++impl_->stats.rpc_scans;
  // A split RPC measures the client's own time on it (the send, and taking
  // the answer) for the split; a timed one its latency for the selector.
  client::DepthSplit* depth_split = split ? &impl_->scan_split : nullptr;
  if (split) {
    ++impl_->stats.split_scans;
    depth_split->Sent();
    t0 = Clock::now();
  }
  impl_->core->Call(
      tree::kTreeService, tree::MethodId(tree::TreeMethod::kScan),
      tree::EncodeTreeScan({start, end, limit, desc}),
      [cb = std::move(cb), timed, t0, selector, timing, depth_split, page](
          Status st, std::string payload) mutable {
        if (!st.ok()) {
          if (depth_split != nullptr) depth_split->Dropped();
          tree::ClearPage(page);
          return cb(st);
        }
        const Clock::time_point answered =
            depth_split != nullptr ? Clock::now() : Clock::time_point{};
        st = tree::DecodeTreeScanReply(payload, page);
        if (depth_split != nullptr) {
          const Clock::time_point taken = Clock::now();
          depth_split->Answered(
              std::chrono::duration<double, std::micro>(taken - t0).count(),
              std::chrono::duration<double, std::micro>(taken - answered)
                  .count());
        } else if (timed && st.ok()) {
          timing->Record(selector, client::Path::kRpc, t0);
        }
        cb(st);
      });
  if (split) {
    depth_split->SendTook(
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
}

const TreeStore::ReadStats& TreeStore::read_stats() const {
  return impl_->stats;
}
uint32_t TreeStore::max_key() const { return impl_->info.max_key; }
uint32_t TreeStore::max_value() const { return impl_->info.max_value; }
uint32_t TreeStore::max_scan() const { return impl_->info.max_scan; }
ReadPath TreeStore::read_path() const { return impl_->get_selector->mode(); }
ReadPath TreeStore::scan_path() const { return impl_->scan_selector->mode(); }
size_t TreeStore::in_flight() const { return impl_->in_flight; }

}  // namespace remem
