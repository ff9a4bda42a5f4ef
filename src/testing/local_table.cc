#include "testing/local_table.h"

#include <thread>
#include <utility>

#include "hash/layout.h"

namespace remem::testing {

namespace {

size_t AlignOffset(const uint8_t* p) {
  return (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
}

}  // namespace

LocalTable::LocalTable(uint64_t arena_bytes)
    : mem_(kArenaStart + arena_bytes + 64, 0),
      offset_(AlignOffset(mem_.data())),
      slab_(mem_.data() + offset_ + kArenaStart, arena_bytes, kArenaStart) {}

Result<std::unique_ptr<LocalTable>> LocalTable::Create(uint64_t initial_buckets,
                                                       uint64_t arena_bytes,
                                                       bool grow,
                                                       uint64_t seed) {
  hash::TableOptions o;
  o.initial_buckets = initial_buckets;
  o.seed = seed;
  o.grow = grow;
  return Create(o, arena_bytes);
}

Result<std::unique_ptr<LocalTable>> LocalTable::Create(
    const hash::TableOptions& options, uint64_t arena_bytes) {
  std::unique_ptr<LocalTable> t(new LocalTable(arena_bytes));
  auto table = hash::Table::Create(t->Aligned(), kRegion, &t->slab_, options);
  if (!table.ok()) return table.status();
  t->table_ = std::move(*table);
  return t;
}

hash::ReadFn LocalTable::Reader(bool slow) {
  return [this, slow](uint16_t region, uint64_t off, void* dst, size_t len) {
    if (region != kRegion || off + len > mem_.size() - 64) {
      return Status::InvalidArgument("read outside the region");
    }
    if (slow && len >= 64) {
      // In two halves with a yield between, in either order (a one-sided
      // copy has no specified byte order): a bucket header line too.
      const size_t half = (len / 2) & ~size_t{7};
      auto* d = static_cast<uint8_t*>(dst);
      const bool back_first =
          slow_copies_.fetch_add(1, std::memory_order_relaxed) % 2 == 1;
      hash::LoadWords(back_first ? d + half : d,
                      Aligned() + off + (back_first ? half : 0),
                      back_first ? len - half : half);
      std::this_thread::yield();
      hash::LoadWords(back_first ? d : d + half,
                      Aligned() + off + (back_first ? 0 : half),
                      back_first ? half : len - half);
    } else {
      hash::LoadWords(dst, Aligned() + off, len);
    }
    return Status::OK();
  };
}

Result<hash::Geometry> LocalTable::ReadGeometry() {
  hash::Geometry g{kRegion, 0, 0, 0, 0, 0};
  hash::Root root;
  const hash::ReadFn read = Reader();
  for (int i = 0; i < 10000; ++i) {
    hash::ReadRequest req = hash::RootRequest(g, &root);
    REMEM_RETURN_IF_ERROR(read(req.region, req.offset, req.dst, req.len));
    if (hash::ApplyRoot(root, &g)) return g;
    std::this_thread::yield();
  }
  return Status::TimedOut("the root never verified");
}

Result<hash::LookupResult> LocalTable::Get(std::string_view key, int* retries,
                                           bool slow, hash::Geometry* cached,
                                           std::optional<hash::ReadMode> mode) {
  if (!mode) {
    mode = lookups_.fetch_add(1, std::memory_order_relaxed) % 2 == 0
               ? hash::ReadMode::kHeaderThenEntries
               : hash::ReadMode::kWholeBuckets;
  }
  hash::Geometry local;
  if (cached == nullptr) local = table_->geometry();
  hash::Geometry* g = cached != nullptr ? cached : &local;
  const hash::ReadFn read = Reader(slow);
  for (int i = 0; i < 10000; ++i) {
    auto r = hash::LookupOnce(*g, key, read, *mode);
    if (!r.ok()) return r.status();
    if (r->outcome != hash::Lookup::kRetry) return *r;
    if (retries != nullptr) ++*retries;
    if (r->bucket_failed) {
      auto fresh = ReadGeometry();
      if (!fresh.ok()) return fresh.status();
      *g = *fresh;
    }
    std::this_thread::yield();
  }
  return Status::TimedOut("the lookup of '" + std::string(key) +
                          "' kept retrying");
}

namespace {

class LocalWriter : public KvClient {
 public:
  LocalWriter(LocalTable* t, std::mutex* mu) : t_(t), mu_(mu) {}
  Result<KvValue> Get(std::string_view key) override {
    std::lock_guard<std::mutex> lock(*mu_);
    auto v = t_->table().Get(key);
    if (!v.ok()) return v.status();
    return KvValue{std::move(v->value), v->version};
  }
  Result<uint64_t> Put(std::string_view key, std::string_view value) override {
    std::lock_guard<std::mutex> lock(*mu_);
    return t_->table().Put(key, value);
  }
  Result<uint64_t> PutIfAbsent(std::string_view key,
                               std::string_view value) override {
    std::lock_guard<std::mutex> lock(*mu_);
    return t_->table().PutIfAbsent(key, value);
  }
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected) override {
    std::lock_guard<std::mutex> lock(*mu_);
    return t_->table().CompareAndPut(key, value, expected);
  }
  Status Delete(std::string_view key) override {
    std::lock_guard<std::mutex> lock(*mu_);
    return t_->table().Delete(key);
  }
  KvReadCounters read_counters() const override { return {}; }

 private:
  LocalTable* t_;
  std::mutex* mu_;
};

// Reads only: writes are the writers' (Unsupported here).
class LocalReader : public KvClient {
 public:
  LocalReader(LocalTable* t, hash::Geometry g, bool slow)
      : t_(t), geometry_(g), slow_(slow) {}
  Result<KvValue> Get(std::string_view key) override {
    int retries = 0;
    auto r = t_->Get(key, &retries, slow_, &geometry_);
    counters_.retries += uint64_t(retries);
    if (!r.ok()) return r.status();
    ++counters_.reads;
    if (r->outcome != hash::Lookup::kFound) return Status::NotFound("");
    return KvValue{std::move(r->value), r->version};
  }
  Result<uint64_t> Put(std::string_view, std::string_view) override {
    return Unsupported();
  }
  Result<uint64_t> PutIfAbsent(std::string_view, std::string_view) override {
    return Unsupported();
  }
  Result<uint64_t> CompareAndPut(std::string_view, std::string_view,
                                 uint64_t) override {
    return Unsupported();
  }
  Status Delete(std::string_view) override { return Unsupported(); }
  KvReadCounters read_counters() const override { return counters_; }

 private:
  static Status Unsupported() {
    return Status::Unsupported("a local reader only reads");
  }
  LocalTable* t_;
  hash::Geometry geometry_;  // this reader's own, from the root
  bool slow_;
  KvReadCounters counters_;
};

}  // namespace

Result<std::unique_ptr<KvClient>> LocalTableKv::NewClient(Role role) {
  if (role == Role::kWriter) {
    return std::unique_ptr<KvClient>(new LocalWriter(table_, &writer_mu_));
  }
  auto g = table_->ReadGeometry();
  if (!g.ok()) return g.status();
  int index;
  {
    std::lock_guard<std::mutex> lock(readers_mu_);
    index = readers_++;
  }
  return std::unique_ptr<KvClient>(new LocalReader(table_, *g, index % 2 == 0));
}

Result<KvStoreCounters> LocalTableKv::Counters() {
  std::lock_guard<std::mutex> lock(writer_mu_);
  KvStoreCounters c;
  c.growths = int64_t(table_->table().growths());
  c.moves = int64_t(table_->table().moves());
  return c;
}

}  // namespace remem::testing
