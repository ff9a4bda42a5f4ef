#include "hash/table.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "util/size.h"

namespace remem::hash {

size_t AreaUsed(const Bucket& b) {
  EntryCursor c(b.entries);
  while (c.Next()) {
  }
  return c.end();
}

void AppendEntry(Bucket* b, const uint8_t* entry, size_t bytes) {
  const size_t end = AreaUsed(*b);
  std::memcpy(b->entries + end, entry, bytes);
}

void EraseEntry(Bucket* b, size_t offset, size_t bytes) {
  const size_t end = AreaUsed(*b);
  std::memmove(b->entries + offset, b->entries + offset + bytes,
               end - offset - bytes);
  std::memset(b->entries + end - bytes, 0, bytes);
}

void SealBucket(Bucket* b) {
  std::memset(b->index, 0, sizeof(b->index));
  EntryCursor c(b->entries);
  size_t n = 0;
  // Entries take at least kMinEntryBytes, so at most kIndexSlots fit.
  while (c.Next() && n < kIndexSlots) {
    uint8_t* entry = b->entries + c.offset();
    const uint64_t sum = EntryChecksum(entry, c.bytes(), b->version);
    std::memcpy(entry + c.bytes() - kEntryChecksumBytes, &sum, 8);
    b->index[n++] = {c.head().tag, uint8_t(c.offset() / 8),
                     uint8_t(c.bytes() / 8)};
  }
  b->checksum = HeaderChecksum(*b);
}

namespace {

void MakeInlineEntry(uint16_t tag, std::string_view key, std::string_view value,
                     uint64_t version, uint8_t* out) {
  const size_t bytes = InlineEntryBytes(key.size(), value.size());
  std::memset(out, 0, bytes);
  EntryHead h{tag, kInline, uint8_t(bytes / 8),
              uint32_t(key.size()) | uint32_t(value.size()) << 16};
  std::memcpy(out, &h, sizeof(h));
  std::memcpy(out + 8, &version, 8);
  std::memcpy(out + kInlineOverhead, key.data(), key.size());
  std::memcpy(out + kInlineOverhead + key.size(), value.data(), value.size());
}

void MakeExtentEntry(uint16_t tag, uint32_t incarnation, uint64_t ref,
                     uint8_t* out) {
  std::memset(out, 0, kExtentEntryBytes);
  EntryHead h{tag, kExtent, uint8_t(kExtentEntryBytes / 8), incarnation};
  std::memcpy(out, &h, sizeof(h));
  std::memcpy(out + 8, &ref, 8);
}

}  // namespace

Result<std::unique_ptr<Table>> Table::Create(uint8_t* region_base,
                                             uint16_t region,
                                             SlabAllocator* slab,
                                             const TableOptions& options) {
  const uint64_t n = options.initial_buckets;
  if (n < 2 || (n & (n - 1)) != 0) {
    return Status::InvalidArgument("initial_buckets must be a power of two");
  }
  std::unique_ptr<Table> t(new Table(region_base, slab, options));
  auto offset = slab->Carve(n * kBucketBytes);
  if (!offset.ok()) return offset.status();
  t->array_bytes_ = slab->CarveSize(n * kBucketBytes);
  t->geo_ = Geometry{region, 0, 0, *offset, n, options.seed};
  t->mask_ = n - 1;
  t->FormatBuckets(*offset, n);
  t->used_.assign(n, 0);
  t->PublishRoot();
  return t;
}

Bucket* Table::At(uint64_t i) const {
  return reinterpret_cast<Bucket*>(base_ + geo_.buckets_offset +
                                   i * kBucketBytes);
}

void Table::FormatBuckets(uint64_t offset, uint64_t n) {
  // Every bucket verifies from the start (zeroed memory would not: its
  // checksum field is 0, not the checksum of an empty header).
  Bucket empty{};
  SealBucket(&empty);
  for (uint64_t i = 0; i < n; ++i) {
    StoreWords(base_ + offset + i * kBucketBytes, &empty, sizeof(empty));
  }
}

void Table::PublishRoot() {
  auto* live = reinterpret_cast<Root*>(base_ + geo_.root_offset);
  std::atomic_ref<uint64_t>(live->version)
      .store(root_version_ + 1, std::memory_order_release);
  root_version_ += 2;
  Root r{};
  r.version = root_version_;
  r.magic = kRootMagic;
  r.layout_version = kLayoutVersion;
  r.generation = geo_.generation;
  r.buckets_offset = geo_.buckets_offset;
  r.num_buckets = geo_.num_buckets;
  r.seed = geo_.seed;
  r.checksum = RootChecksum(r);
  StoreWords(reinterpret_cast<uint8_t*>(live) + 8,
             reinterpret_cast<uint8_t*>(&r) + 8, sizeof(r) - 8);
  std::atomic_ref<uint64_t>(live->version)
      .store(root_version_, std::memory_order_release);
}

void Table::Publish(uint64_t i, const Bucket& next) {
  Bucket* live = At(i);
  // This thread is the only writer, so it may read its own words plainly.
  const uint64_t v = live->version;
  std::atomic_ref<uint64_t>(live->version)
      .store(v + 1, std::memory_order_release);
  Bucket b = next;
  b.version = v + 2;
  SealBucket(&b);
  used_[i] = uint16_t(AreaUsed(b));
  // The header after the version (index and checksum), then the entries.
  StoreWords(reinterpret_cast<uint8_t*>(live) + 8,
             reinterpret_cast<const uint8_t*>(&b) + 8, kBucketHeaderBytes - 8);
  constexpr size_t kHalf = kEntryAreaBytes / 2;
  StoreWords(live->entries, b.entries, kHalf);
  if (mid_write_ && !rehashing_) mid_write_();
  StoreWords(live->entries + kHalf, b.entries + kHalf, kEntryAreaBytes - kHalf);
  std::atomic_ref<uint64_t>(live->version)
      .store(v + 2, std::memory_order_release);
}

std::string_view Table::KeyOf(const uint8_t* entry) const {
  EntryHead h;
  std::memcpy(&h, entry, sizeof(h));
  if (h.kind == kInline) {
    return {reinterpret_cast<const char*>(entry + kInlineOverhead),
            h.meta & 0xffff};
  }
  uint64_t ref;
  std::memcpy(&ref, entry + 8, 8);
  const uint8_t* e = slab_->At(RefOffset(ref));
  const auto* eh = reinterpret_cast<const ExtentHeader*>(e);
  return {reinterpret_cast<const char*>(e + sizeof(ExtentHeader)), eh->key_len};
}

std::optional<Table::Found> Table::Find(std::string_view key,
                                        const KeyHash& kh) const {
  const uint64_t b1 = PrimaryBucket(kh, mask_);
  const uint64_t b2 = AltBucket(b1, kh.tag, mask_);
  for (uint64_t b : {b1, b2}) {
    const Bucket* bucket = At(b);
    EntryCursor c(bucket->entries);
    while (c.Next()) {
      if (c.head().tag != kh.tag) continue;
      const uint8_t* entry = bucket->entries + c.offset();
      if (KeyOf(entry) != key) continue;
      Found f{b, c.offset(), c.bytes(), c.head().kind == kInline, 0, 0};
      if (f.is_inline) {
        f.version = c.word1();
      } else {
        f.ref = c.word1();
        f.version =
            reinterpret_cast<const ExtentHeader*>(slab_->At(RefOffset(f.ref)))
                ->version;
      }
      return f;
    }
    if (b1 == b2) break;
  }
  return std::nullopt;
}

std::optional<uint64_t> Table::BucketOf(std::string_view key) const {
  auto f = Find(key, HashKey(key, geo_.seed));
  if (!f) return std::nullopt;
  return f->bucket;
}

Status Table::CheckSizes(std::string_view key, std::string_view value) const {
  if (key.empty()) return Status::InvalidArgument("empty key");
  if (key.size() > options_.limits.max_key) {
    return Status::InvalidArgument("key of " + std::to_string(key.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(options_.limits.max_key));
  }
  if (value.size() > options_.limits.max_value) {
    return Status::InvalidArgument("value of " + std::to_string(value.size()) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(options_.limits.max_value));
  }
  return Status::OK();
}

Status Table::NeverFits(std::string_view key, std::string_view value) const {
  const uint64_t bytes = sizeof(ExtentHeader) + key.size() + value.size();
  if (slab_->CouldEverHold(bytes)) return Status::OK();
  return Status::OutOfMemory(
      "a pair of " + FormatSize(bytes) +
      " does not fit in a partition of the hash store, which holds " +
      FormatSize(slab_->capacity() - slab_->withheld()) +
      " in all (the store's memory is split equally among the server's "
      "threads: fewer --threads or more --hash-memory)");
}

Result<uint64_t> Table::WriteExtent(std::string_view key,
                                    std::string_view value, uint64_t version,
                                    uint32_t* incarnation) {
  std::vector<uint8_t> image;
  auto ext = slab_->Store(key, value, version, &image);
  if (ext.status().code() == StatusCode::kOutOfMemory) {
    REMEM_RETURN_IF_ERROR(NeverFits(key, value));
  }
  if (!ext.ok()) return ext.status();
  *incarnation = ext->incarnation;
  return MakeRef(geo_.region, uint8_t(ext->size_class), ext->offset);
}

std::optional<uint64_t> Table::MakeRoom(uint64_t b1, uint64_t b2, size_t need,
                                        size_t max_nodes, bool dedupe) {
  for (uint64_t b : {b1, b2}) {
    if (kEntryAreaBytes - used_[b] >= need) return b;
  }
  // Breadth-first search for a short cuckoo path: each hop moves one entry
  // of a bucket to its other bucket, freeing what the previous hop needs.
  struct Node {
    uint64_t bucket;
    int parent;           // index in `nodes`, -1 for roots
    size_t entry_offset;  // in the parent bucket: the entry that moves here
    size_t entry_bytes;   // = what this bucket must have free
  };
  std::vector<Node> nodes{{b1, -1, 0, need}, {b2, -1, 0, need}};
  // With `dedupe`, a bucket is explored once per size it must free, so the
  // search reaches far more of the table for the same number of nodes.
  std::unordered_set<uint64_t> seen;
  for (size_t n = 0; n < nodes.size() && nodes.size() < max_nodes; ++n) {
    const Bucket* bk = At(nodes[n].bucket);
    const size_t free_here = kEntryAreaBytes - used_[nodes[n].bucket];
    // What bucket n must free: its own parent's entry (or the new pair).
    const size_t must_free = nodes[n].entry_bytes;
    EntryCursor c(bk->entries);
    while (c.Next()) {
      if (free_here + c.bytes() < must_free) continue;
      const uint64_t alt = AltBucket(nodes[n].bucket, c.head().tag, mask_);
      // A path must not visit a bucket twice: a later hop would move
      // whatever an earlier hop put there, into a bucket not one of its two.
      bool cycle = false;
      for (int a = int(n); a >= 0; a = nodes[size_t(a)].parent) {
        if (nodes[size_t(a)].bucket == alt) {
          cycle = true;
          break;
        }
      }
      if (cycle) continue;
      if (dedupe && !seen.insert(alt * 16 + c.bytes() / 8).second) continue;
      nodes.push_back({alt, int(n), c.offset(), c.bytes()});
      if (kEntryAreaBytes - used_[alt] < c.bytes()) continue;
      // Move entries along the path, last hop first: each entry is copied
      // into its other bucket before it is erased from where it was.
      int to = int(nodes.size()) - 1;
      while (nodes[size_t(to)].parent >= 0) {
        const Node& hop = nodes[size_t(to)];
        const uint64_t from = nodes[size_t(hop.parent)].bucket;
        Bucket src = *At(from);
        Bucket dst = *At(hop.bucket);
        AppendEntry(&dst, src.entries + hop.entry_offset, hop.entry_bytes);
        Publish(hop.bucket, dst);
        EraseEntry(&src, hop.entry_offset, hop.entry_bytes);
        Publish(from, src);
        ++moves_;
        // A rehash fills an array no reader or scan has seen yet.
        if (!rehashing_ && (move_hook_ || change_hook_ || growth_)) {
          const Bucket* d = At(hop.bucket);
          // The moved entry was appended last.
          const std::string_view moved =
              KeyOf(d->entries + used_[hop.bucket] - hop.entry_bytes);
          if (move_hook_) move_hook_(from, hop.bucket, moved);
          if (change_hook_) change_hook_(moved, from, hop.bucket);
          // It may have crossed a growth's scan cursor.
          if (growth_) Mirror(moved);
        }
        to = hop.parent;
      }
      return nodes[size_t(to)].bucket;
    }
  }
  return std::nullopt;
}

bool Table::WithinFill(size_t add, size_t remove) const {
  return (area_used_ + add - remove) * 100 <=
         geo_.num_buckets * kEntryAreaBytes * kMaxFillPercent;
}

Result<uint64_t> Table::RestoreRoom(const KeyHash& kh, size_t inline_bytes,
                                    bool* as_extent) {
  // Inline only within the live limit, as a live write would store it; the
  // table stays as dense as the live one, whatever the order.
  if (inline_bytes > 0 && !WithinFill(inline_bytes, 0)) inline_bytes = 0;
  const size_t need = inline_bytes > 0 ? inline_bytes : kExtentEntryBytes;
  *as_extent = inline_bytes == 0;
  auto b1 = [&] { return PrimaryBucket(kh, mask_); };
  auto b2 = [&] { return AltBucket(PrimaryBucket(kh, mask_), kh.tag, mask_); };
  // As a live write would, then a search that reaches further.
  if (auto r = MakeRoom(b1(), b2(), need)) return *r;
  if (auto r = MakeRoom(b1(), b2(), need, kRestoreSearchNodes, true)) return *r;
  // Without Reserve, the live table's size is unknown: grow as it did, if
  // the memory holds a larger table (with Reserve, the table is that size).
  if (!reserved_ && options_.grow && Grow().ok()) {
    if (auto r = MakeRoom(b1(), b2(), need)) return *r;
  }
  // A small pair as an extent (as a live overwrite stores one that no
  // longer fits its bucket).
  if (inline_bytes > 0) {
    if (auto r = MakeRoom(b1(), b2(), kExtentEntryBytes, kRestoreSearchNodes,
                          true)) {
      *as_extent = true;
      return *r;
    }
  }
  // Turn the largest inline entries of the pair's two buckets into
  // extents until it fits: buckets then hold what the live table held as
  // references, at the cost of extents (the headroom EndRestore keeps).
  for (int i = 0; i < 16; ++i) {
    Status d = Demote(b1());
    if (d.code() == StatusCode::kNotFound) d = Demote(b2());
    if (d.code() == StatusCode::kNotFound) break;
    REMEM_RETURN_IF_ERROR(d);
    if (auto r = MakeRoom(b1(), b2(), need)) {
      *as_extent = inline_bytes == 0;
      return *r;
    }
    if (auto r = MakeRoom(b1(), b2(), kExtentEntryBytes)) {
      *as_extent = true;
      return *r;
    }
  }
  return Status::OutOfMemory(
      "recovery found no room for a pair in the "
      "hash table (" +
      std::to_string(size_) + " keys)");
}

Status Table::Demote(uint64_t b) {
  const Bucket* live = At(b);
  EntryCursor c(live->entries);
  size_t best_off = 0, best_bytes = 0;
  while (c.Next()) {
    if (c.head().kind == kInline && c.bytes() > best_bytes) {
      best_off = c.offset();
      best_bytes = c.bytes();
    }
  }
  if (best_bytes <= kExtentEntryBytes) return Status::NotFound("no inline");
  EntryHead h;
  std::memcpy(&h, live->entries + best_off, sizeof(h));
  uint64_t version;
  std::memcpy(&version, live->entries + best_off + 8, 8);
  const char* k =
      reinterpret_cast<const char*>(live->entries + best_off + kInlineOverhead);
  const std::string_view key(k, h.meta & 0xffff);
  const std::string_view value(k + key.size(), h.meta >> 16);
  uint32_t incarnation = 0;
  auto ref = WriteExtent(key, value, version, &incarnation);
  if (!ref.ok()) return ref.status();
  uint8_t entry[kExtentEntryBytes];
  MakeExtentEntry(h.tag, incarnation, *ref, entry);
  Bucket next = *live;
  EraseEntry(&next, best_off, best_bytes);
  AppendEntry(&next, entry, kExtentEntryBytes);
  const std::string moved_key(key);  // `key` is in the bucket published
  Publish(b, next);
  area_used_ -= best_bytes - kExtentEntryBytes;
  --inline_;
  if (growth_) Mirror(moved_key);
  return Status::OK();
}

Status Table::Grow() {
  // The growth in steps, run to its end at once. A larger array that cannot
  // take every entry is given back and the next size tried: the same seed
  // with more bits of the hash spreads the entries that crowded two
  // buckets. A growth in steps under way is finished first (and if that one
  // succeeds, that is the growth).
  const uint64_t generation = geo_.generation;
  auto finish = [&] {
    while (growth_) GrowStep(~uint64_t{0});
    return geo_.generation != generation;
  };
  if (growth_ && finish()) return Status::OK();
  for (uint64_t factor = 2; factor <= kMaxGrowthFactor; factor *= 2) {
    REMEM_RETURN_IF_ERROR(StartGrowth(geo_.num_buckets * factor));
    if (finish()) return Status::OK();
  }
  return Status::OutOfMemory(
      "could not rehash into a larger table (tried up to " +
      std::to_string(kMaxGrowthFactor) + "x the buckets)");
}

void Table::AfterWrite(std::string_view key, bool may_start) {
  if (growth_) {
    Mirror(key);
    if (!growth_ || options_.grow_pacing == 0) return;
    const Growth& g = *growth_;
    const uint64_t taken =
        area_used_ > g.area_at_start ? area_used_ - g.area_at_start : 0;
    // 128-bit: steps and bytes each reach 2^40 in a large arena.
    const auto due = uint64_t(std::min<unsigned __int128>(
        g.steps, (unsigned __int128)g.steps * taken * options_.grow_pacing /
                     std::max<uint64_t>(g.room_at_start, 1)));
    if (due > g.steps_done) GrowStep(due - g.steps_done);
  } else if (may_start) {
    MaybeStartGrowth();
  }
}

void Table::MaybeStartGrowth() {
  if (!options_.grow || !options_.grow_in_steps ||
      geo_.num_buckets == no_growth_in_steps_at_ ||
      area_used_ * 100 <
          geo_.num_buckets * kEntryAreaBytes * kGrowStartPercent) {
    return;
  }
  if (!StartGrowth(geo_.num_buckets * 2).ok()) {
    // Filled on to kMaxFillPercent; the growth then (if the arena has room
    // by then) is done at once.
    no_growth_in_steps_at_ = geo_.num_buckets;
  }
}

Status Table::StartGrowth(uint64_t n) {
  auto offset = slab_->Carve(n * kBucketBytes);
  if (!offset.ok()) {
    return offset.status().WithContext("a bucket array of " +
                                       std::to_string(n) + " buckets");
  }
  Growth g;
  g.geo = geo_;
  g.geo.buckets_offset = *offset;
  g.geo.num_buckets = n;
  g.used.assign(n, 0);
  g.mirrored.assign(n, 0);
  g.carve_bytes = slab_->CarveSize(n * kBucketBytes);
  g.steps = 2 * n + 2 * geo_.num_buckets;
  g.area_at_start = area_used_;
  const uint64_t limit =
      geo_.num_buckets * kEntryAreaBytes * kMaxFillPercent / 100;
  g.room_at_start = limit > area_used_ ? limit - area_used_ : 0;
  growth_ = std::move(g);
  return Status::OK();
}

template <typename Fn>
bool Table::InNewArray(Fn&& fn) {
  Growth& g = *growth_;
  std::swap(geo_, g.geo);
  used_.swap(g.used);
  mask_ = geo_.num_buckets - 1;
  const uint64_t moves_before = moves_;
  rehashing_ = true;
  const bool ok = fn();
  rehashing_ = false;
  moves_ = moves_before;  // rehash placement is not a cuckoo move
  std::swap(geo_, g.geo);
  used_.swap(g.used);
  mask_ = geo_.num_buckets - 1;
  return ok;
}

bool Table::PlaceInNew(std::string_view key, const uint8_t* entry, size_t bytes,
                       bool mirror) {
  Growth& g = *growth_;
  // A bucket the sealing has passed is published as a reader would need
  // it; the others are sealed later, so plain stores will do.
  auto sealed = [&](uint64_t b) {
    return g.phase == Growth::kSeal && b < g.cursor;
  };
  const KeyHash kh = HashKey(key, geo_.seed);
  const uint64_t b1 = PrimaryBucket(kh, mask_);
  const uint64_t b2 = AltBucket(b1, kh.tag, mask_);
  // The scan meets a key twice only if it moved in the old array (from a
  // bucket scanned to one not scanned yet, or from the other pass's size
  // class to this one's), and every such change is mirrored: a key a
  // mirror placed or rewrote has one of its two buckets marked (a cuckoo
  // move here keeps it within those two). Other keys are placed without a
  // search.
  std::optional<Found> f;
  if (mirror || g.mirrored[b1] != 0 || g.mirrored[b2] != 0) f = Find(key, kh);
  if (f) {
    Bucket image = *At(f->bucket);
    if (entry != nullptr && f->entry_bytes == bytes) {
      std::memcpy(image.entries + f->entry_offset, entry, bytes);
      // Marked as any key a mirror places: the scan may meet it again.
      if (mirror) g.mirrored[f->bucket] = 1;
    } else {
      EraseEntry(&image, f->entry_offset, f->entry_bytes);
    }
    if (sealed(f->bucket)) {
      Publish(f->bucket, image);
    } else {
      StoreWords(reinterpret_cast<uint8_t*>(At(f->bucket)) + 8,
                 reinterpret_cast<const uint8_t*>(&image) + 8,
                 kBucketBytes - 8);
      used_[f->bucket] = uint16_t(AreaUsed(image));
    }
    if (entry == nullptr || f->entry_bytes == bytes) return true;
  }
  if (entry == nullptr) return true;
  if (rehash_hook_ && !rehash_hook_(geo_.num_buckets)) return false;
  const std::optional<uint64_t> to = MakeRoom(b1, b2, bytes);
  if (!to) return false;
  if (sealed(*to)) {
    Bucket image = *At(*to);
    AppendEntry(&image, entry, bytes);
    Publish(*to, image);
  } else {
    StoreWords(At(*to)->entries + used_[*to], entry, bytes);
    used_[*to] = uint16_t(used_[*to] + bytes);
  }
  if (mirror) g.mirrored[*to] = 1;
  return true;
}

void Table::Mirror(std::string_view key) {
  // Until the scans start, the new array takes nothing: they will read it.
  if (growth_->phase == Growth::kFormat) return;
  uint8_t entry[std::max(kMaxInlineEntryBytes, kExtentEntryBytes)];
  size_t bytes = 0;
  if (std::optional<Found> f = Find(key, HashKey(key, geo_.seed))) {
    bytes = f->entry_bytes;
    std::memcpy(entry, At(f->bucket)->entries + f->entry_offset, bytes);
  }
  if (!InNewArray([&] {
        return PlaceInNew(key, bytes > 0 ? entry : nullptr, bytes,
                          /*mirror=*/true);
      })) {
    AbandonGrowth();
  }
}

uint64_t Table::GrowStep(uint64_t buckets) {
  uint64_t done = 0;
  while (growth_ && done < buckets) {
    Growth& g = *growth_;
    switch (g.phase) {
      case Growth::kFormat: {
        // In runs, so that a step formats as many buckets as it may.
        const uint64_t n =
            std::min(g.geo.num_buckets - g.cursor, buckets - done);
        FormatBuckets(g.geo.buckets_offset + g.cursor * kBucketBytes, n);
        g.cursor += n;
        g.steps_done += n;
        done += n;
        if (g.cursor == g.geo.num_buckets) {
          g.phase = Growth::kScanLarge;
          g.cursor = 0;
        }
        break;
      }
      case Growth::kScanLarge:
      case Growth::kScanSmall: {
        ++done;
        // Placing entries in the new array leaves this one as it is.
        const Bucket* old = At(g.cursor);
        const bool large = g.phase == Growth::kScanLarge;
        const bool placed = InNewArray([&] {
          for (EntryCursor c(old->entries); c.Next();) {
            if ((c.bytes() > kExtentEntryBytes) != large) continue;
            const uint8_t* e = old->entries + c.offset();
            if (!PlaceInNew(KeyOf(e), e, c.bytes(), /*mirror=*/false)) {
              return false;
            }
          }
          return true;
        });
        if (!placed) {
          AbandonGrowth();
          break;
        }
        ++g.steps_done;
        if (++g.cursor == geo_.num_buckets) {
          g.phase = large ? Growth::kScanSmall : Growth::kSeal;
          g.cursor = 0;
        }
        break;
      }
      case Growth::kSeal: {
        ++done;
        auto* b = reinterpret_cast<Bucket*>(base_ + g.geo.buckets_offset +
                                            g.cursor * kBucketBytes);
        Bucket sealed = *b;  // our own writes: plain
        SealBucket(&sealed);
        StoreWords(reinterpret_cast<uint8_t*>(b) + 8,
                   reinterpret_cast<const uint8_t*>(&sealed) + 8,
                   kBucketBytes - 8);
        ++g.steps_done;
        if (++g.cursor == g.geo.num_buckets) CompleteGrowth();
        break;
      }
    }
  }
  return done;
}

void Table::AbandonGrowth() {
  const uint64_t carved = slab_->bytes_carved();
  slab_->Uncarve(growth_->geo.buckets_offset, growth_->carve_bytes);
  // Carved for good if anything was carved after it (an extent's slab).
  if (slab_->bytes_carved() == carved) array_bytes_ += growth_->carve_bytes;
  no_growth_in_steps_at_ = geo_.num_buckets;
  growth_.reset();
}

void Table::CompleteGrowth() {
  Growth g = std::move(*growth_);
  growth_.reset();
  const Geometry old = geo_;
  geo_ = g.geo;
  used_ = std::move(g.used);
  mask_ = geo_.num_buckets - 1;
  array_bytes_ += g.carve_bytes;
  SwitchTo(old);
}

bool Table::FillRecordMatches() const {
  for (uint64_t i = 0; i < geo_.num_buckets; ++i) {
    if (used_[i] != AreaUsed(*At(i))) return false;
  }
  if (growth_ && growth_->phase != Growth::kFormat) {
    for (uint64_t i = 0; i < growth_->geo.num_buckets; ++i) {
      const auto* b = reinterpret_cast<const Bucket*>(
          base_ + growth_->geo.buckets_offset + i * kBucketBytes);
      if (growth_->used[i] != AreaUsed(*b)) return false;
    }
  }
  return true;
}

void Table::SwitchTo(const Geometry& old) {
  geo_.generation = old.generation + 1;
  PublishRoot();
  // Every old bucket now sends its readers back to the root. Only after
  // this may a write change the new array (writes run on this thread).
  for (uint64_t i = 0; i < old.num_buckets; ++i) {
    auto* b = reinterpret_cast<Bucket*>(base_ + old.buckets_offset +
                                        i * kBucketBytes);
    std::atomic_ref<uint64_t>(b->version)
        .store(kMovedVersion, std::memory_order_release);
  }
}

Result<uint64_t> Table::Write(std::string_view key, std::string_view value,
                              Mode mode, uint64_t expected) {
  REMEM_RETURN_IF_ERROR(CheckSizes(key, value));
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (mode == Mode::kIfAbsent && found) {
    return Status::AlreadyExists("key exists");
  }
  if (mode == Mode::kIfVersion) {
    if (!found) return Status::NotFound("key not found");
    if (found->version != expected) {
      return Status::Conflict("version is " + std::to_string(found->version) +
                              ", not " + std::to_string(expected));
    }
  }
  const bool given = mode == Mode::kRestore || mode == Mode::kImport;
  if (given && found && found->version >= expected) {
    return found->version;  // replay, or copy, of an older pair
  }
  const uint64_t version = given ? expected : next_version_;
  const bool small = FitsInline(key.size(), value.size());
  // Said as such, full table or not (a full one said it was full).
  if (!small) REMEM_RETURN_IF_ERROR(NeverFits(key, value));
  const size_t inline_bytes = InlineEntryBytes(key.size(), value.size());
  uint8_t entry[kMaxInlineEntryBytes];
  size_t entry_bytes = 0;
  uint64_t bucket = 0;
  if (found) {
    bucket = found->bucket;
    // In place: inline if it fits in this bucket, else an extent reference,
    // which is never larger than the entry it replaces.
    const size_t free_after =
        kEntryAreaBytes - used_[bucket] + found->entry_bytes;
    if (small && inline_bytes <= free_after &&
        WithinFill(inline_bytes, found->entry_bytes)) {
      entry_bytes = inline_bytes;
    }
  } else {
    bool as_extent = !small;
    if (mode == Mode::kRestore) {
      auto room = RestoreRoom(kh, small ? inline_bytes : 0, &as_extent);
      if (!room.ok()) return room.status();
      bucket = *room;
    } else {
      std::optional<uint64_t> room;
      const uint64_t b1 = PrimaryBucket(kh, mask_);
      const size_t need = small ? inline_bytes : kExtentEntryBytes;
      if (WithinFill(need, 0)) {
        room = MakeRoom(b1, AltBucket(b1, kh.tag, mask_), need);
      }
      Status grown;  // why the table could not grow, if it could not
      while (!room && options_.grow) {
        grown = Grow();
        if (!grown.ok()) break;
        const uint64_t nb1 = PrimaryBucket(kh, mask_);
        room = MakeRoom(nb1, AltBucket(nb1, kh.tag, mask_), need);
      }
      if (!room) {
        return Status::OutOfMemory(
            "the hash table is full (" + std::to_string(size_) + " keys, " +
            std::to_string(geo_.num_buckets) + " buckets" +
            (grown.ok() ? std::string() : ": " + grown.message()) + ")");
      }
      bucket = *room;
    }
    if (!as_extent) entry_bytes = inline_bytes;
  }
  if (entry_bytes > 0) {
    MakeInlineEntry(kh.tag, key, value, version, entry);
  } else {
    uint32_t incarnation = 0;
    auto ref = WriteExtent(key, value, version, &incarnation);
    if (!ref.ok()) return ref.status();
    MakeExtentEntry(kh.tag, incarnation, *ref, entry);
    entry_bytes = kExtentEntryBytes;
  }
  next_version_ = std::max(next_version_, version + 1);
  Bucket next = *At(bucket);
  if (found && found->is_inline && entry_bytes == found->entry_bytes) {
    // An inline pair rewritten at the same size (a counter, a value of
    // fixed width) keeps its place: no erase and append of the entries
    // after it. The bucket is published as any other (each entry's
    // checksum is seeded with the bucket's version).
    std::memcpy(next.entries + found->entry_offset, entry, entry_bytes);
    Publish(bucket, next);
    if (change_hook_) change_hook_(key, kNotMoved, kNotMoved);
    AfterWrite(key, /*may_start=*/mode != Mode::kRestore);
    return version;
  }
  if (found) {
    EraseEntry(&next, found->entry_offset, found->entry_bytes);
    area_used_ -= found->entry_bytes;
    if (found->is_inline) --inline_;
  }
  AppendEntry(&next, entry, entry_bytes);
  area_used_ += entry_bytes;
  EntryHead h;
  std::memcpy(&h, entry, sizeof(h));
  if (h.kind == kInline) ++inline_;
  Publish(bucket, next);
  if (found && !found->is_inline) {
    slab_->Free(RefOffset(found->ref), RefClass(found->ref));
  }
  if (!found) ++size_;
  if (change_hook_) change_hook_(key, kNotMoved, kNotMoved);
  AfterWrite(key, /*may_start=*/mode != Mode::kRestore);
  return version;
}

Result<uint64_t> Table::Import(std::string_view key, std::string_view value,
                               uint64_t version) {
  return Write(key, value, Mode::kImport, version);
}

Result<uint64_t> Table::Put(std::string_view key, std::string_view value) {
  return Write(key, value, Mode::kUpsert, 0);
}

Result<uint64_t> Table::CompareAndPut(std::string_view key,
                                      std::string_view value,
                                      uint64_t expected) {
  return Write(key, value, Mode::kIfVersion, expected);
}

Result<uint64_t> Table::PutIfAbsent(std::string_view key,
                                    std::string_view value) {
  return Write(key, value, Mode::kIfAbsent, 0);
}

Status Table::Delete(std::string_view key) {
  if (key.empty() || key.size() > options_.limits.max_key) {
    return Status::InvalidArgument("bad key size");
  }
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (!found) return Status::NotFound("key not found");
  Bucket next = *At(found->bucket);
  EraseEntry(&next, found->entry_offset, found->entry_bytes);
  Publish(found->bucket, next);
  area_used_ -= found->entry_bytes;
  if (found->is_inline) {
    --inline_;
  } else {
    slab_->Free(RefOffset(found->ref), RefClass(found->ref));
  }
  --size_;
  ++next_version_;  // a delete is a write too
  if (change_hook_) change_hook_(key, kNotMoved, kNotMoved);
  AfterWrite(key, /*may_start=*/false);
  return Status::OK();
}

Status Table::Reserve(uint64_t buckets) {
  if (size_ != 0) return Status::OK();
  if (growth_) {
    AbandonGrowth();
    no_growth_in_steps_at_ = 0;  // an empty table: nothing went wrong
  }
  reserved_ = true;
  if (buckets <= geo_.num_buckets) return Status::OK();
  const uint64_t n = std::bit_ceil(buckets);
  const Geometry old = geo_;
  // Nothing but bucket arrays in the arena: no reader has seen this table
  // yet (recovery runs before the server serves), so the arena starts over
  // and the new array is all it holds.
  const bool fresh = slab_->bytes_in_use() == 0 &&
                     slab_->bytes_carved() == array_bytes_ && !restored_;
  if (fresh) slab_->Reset();
  auto offset = slab_->Carve(n * kBucketBytes);
  if (!offset.ok()) return offset.status();
  FormatBuckets(*offset, n);
  geo_.buckets_offset = *offset;
  geo_.num_buckets = n;
  mask_ = n - 1;
  used_.assign(n, 0);
  if (fresh) {
    array_bytes_ = slab_->CarveSize(n * kBucketBytes);
    geo_.generation = old.generation + 1;
    PublishRoot();
  } else {
    array_bytes_ += slab_->CarveSize(n * kBucketBytes);
    SwitchTo(old);  // as after a growth
  }
  return Status::OK();
}

void Table::EndRestore() {
  restored_ = true;
  // What a table that grew from initial_buckets to its size would have
  // carved: every array on the way (old arrays are never reused). A live
  // table that skipped a size (Grow) carved less: this errs on the side of
  // headroom.
  uint64_t grown = 0;
  for (uint64_t n = options_.initial_buckets; n <= geo_.num_buckets; n *= 2) {
    grown += slab_->CarveSize(n * kBucketBytes);
  }
  slab_->Withhold(grown > array_bytes_ ? grown - array_bytes_ : 0);
}

void Table::Prefetch(std::string_view key) const {
  const KeyHash kh = HashKey(key, geo_.seed);
  const uint64_t b1 = PrimaryBucket(kh, mask_);
  const uint64_t b2 = AltBucket(b1, kh.tag, mask_);
  for (uint64_t b : {b1, b2}) {
    const auto* p = reinterpret_cast<const char*>(At(b));
    for (size_t off = 0; off < kBucketBytes; off += 64) {
      __builtin_prefetch(p + off);
    }
  }
}

Status Table::Restore(std::string_view key, std::string_view value,
                      uint64_t version) {
  auto v = Write(key, value, Mode::kRestore, version);
  return v.ok() ? Status::OK() : v.status();
}

void Table::RestoreDelete(std::string_view key, uint64_t version) {
  next_version_ = std::max(next_version_, version + 1);
  if (key.empty() || key.size() > options_.limits.max_key) return;
  std::optional<Found> found = Find(key, HashKey(key, geo_.seed));
  if (!found || found->version >= version) return;
  const uint64_t keep = next_version_;
  (void)Delete(key);
  next_version_ = keep;
}

uint64_t Table::ScanBuckets(uint64_t start, uint64_t count,
                            const PairFn& fn) const {
  const uint64_t end = std::min(geo_.num_buckets, start + count);
  for (uint64_t i = start; i < end; ++i) {
    const Bucket* b = At(i);
    EntryCursor c(b->entries);
    while (c.Next()) {
      const uint8_t* entry = b->entries + c.offset();
      if (c.head().kind == kInline) {
        const uint32_t meta = c.head().meta;
        const char* k = reinterpret_cast<const char*>(entry + kInlineOverhead);
        fn({k, meta & 0xffff}, {k + (meta & 0xffff), meta >> 16}, c.word1());
      } else {
        const uint8_t* e = slab_->At(RefOffset(c.word1()));
        const auto* h = reinterpret_cast<const ExtentHeader*>(e);
        const char* k = reinterpret_cast<const char*>(e + sizeof(ExtentHeader));
        fn({k, h->key_len}, {k + h->key_len, h->value_len}, h->version);
      }
    }
  }
  return end;
}

Result<Table::Value> Table::Get(std::string_view key) const {
  if (key.empty() || key.size() > options_.limits.max_key) {
    return Status::InvalidArgument("bad key size");
  }
  const KeyHash kh = HashKey(key, geo_.seed);
  std::optional<Found> found = Find(key, kh);
  if (!found) return Status::NotFound("key not found");
  Value v;
  v.version = found->version;
  const uint8_t* entry = At(found->bucket)->entries + found->entry_offset;
  if (found->is_inline) {
    EntryHead h;
    std::memcpy(&h, entry, sizeof(h));
    v.value.assign(reinterpret_cast<const char*>(entry + kInlineOverhead) +
                       (h.meta & 0xffff),
                   h.meta >> 16);
    return v;
  }
  const uint8_t* e = slab_->At(RefOffset(found->ref));
  const auto* h = reinterpret_cast<const ExtentHeader*>(e);
  v.value.assign(
      reinterpret_cast<const char*>(e) + sizeof(ExtentHeader) + h->key_len,
      h->value_len);
  return v;
}

}  // namespace remem::hash
