#include "bench_schemes.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string_view>

#include "hash/layout.h"

namespace remem::schemes {

namespace {

uint64_t FloorPow2(uint64_t n) {
  uint64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// Uniform in [0, n) without the bias of a modulo.
uint64_t Reduce(uint64_t h, uint64_t n) {
  return uint64_t((static_cast<unsigned __int128>(h) * n) >> 64);
}

std::string_view View(const Key& k) {
  return {reinterpret_cast<const char*>(k.data()), k.size()};
}

void Charge(Cost* c, uint32_t reads, uint32_t round_trips, uint64_t bytes) {
  c->reads += reads;
  c->round_trips += round_trips;
  c->bytes += bytes;
}

// Chains of fixed-size blocks (FaRM's overflow blocks, KV-Direct's chained
// buckets). Inserts only, so only a chain's last block has free slots.
class Chains {
 public:
  explicit Chains(uint32_t slots) : slots_(slots) {}
  // Appends `id` to the chain whose head link is `*head` (0: none).
  void Append(uint32_t* head, uint32_t id) {
    if (*head == 0) {
      *head = NewBlock(id);
      return;
    }
    uint32_t b = *head - 1;
    while (next_[b] != 0) b = next_[b] - 1;
    for (uint32_t s = 0; s < slots_; ++s) {
      if (ids_[b * slots_ + s] == 0) {
        ids_[b * slots_ + s] = id;
        return;
      }
    }
    const uint32_t n = NewBlock(id);
    next_[b] = n;
  }
  const uint32_t* Block(uint32_t link) const {
    return &ids_[(link - 1) * slots_];
  }
  uint32_t Next(uint32_t link) const { return next_[link - 1]; }
  uint64_t blocks() const { return next_.size(); }

 private:
  uint32_t NewBlock(uint32_t id) {
    ids_.resize(ids_.size() + slots_, 0);
    ids_[next_.size() * slots_] = id;
    next_.push_back(0);
    return uint32_t(next_.size());
  }
  uint32_t slots_;
  std::vector<uint32_t> ids_;  // 0: empty, else key id + 1
  std::vector<uint32_t> next_;
};

// Cuckoo hashing over buckets of S slots: a key lives in one of its
// candidate buckets; inserts search breadth-first for a short path of moves
// ending in a free slot (bounded like src/hash/table.cc) and move the last
// hop first, so every key stays in at least one of its buckets.
class Cuckoo : public Scheme {
 public:
  Cuckoo(const SchemeConfig& c, const std::vector<Key>* keys)
      : Scheme(c, keys),
        slots_(geo_.num_buckets * geo_.slots_per_bucket, 0),
        mask_(geo_.num_buckets - 1) {}

  bool Insert(uint32_t id) override;
  LookupResult Lookup(const Key& key) const override;
  uint64_t TableBytes() const override {
    return geo_.num_buckets * geo_.bucket_bytes;
  }

 private:
  // The key's buckets in the order a reader probes them; returns how many
  // distinct ones (2-choice: 2; 3-way: up to 3).
  int Candidates(const Key& k, uint64_t out[3]) const;
  int FreeSlot(uint64_t b) const {
    for (uint32_t i = 0; i < geo_.slots_per_bucket; ++i) {
      if (slots_[b * geo_.slots_per_bucket + i] == 0) return int(i);
    }
    return -1;
  }

  std::vector<uint32_t> slots_;  // 0: empty, else key id + 1
  uint64_t mask_;
};

int Cuckoo::Candidates(const Key& k, uint64_t out[3]) const {
  if (config_.scheme == SchemeKind::kCuckoo2) {
    // remem's own functions: the alternate comes from the tag alone.
    const hash::KeyHash kh = hash::HashKey(View(k), config_.seed);
    out[0] = hash::PrimaryBucket(kh, mask_);
    out[1] = hash::AltBucket(out[0], kh.tag, mask_);
    return out[1] == out[0] ? 1 : 2;
  }
  int n = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    const uint64_t b = Reduce(Hash(k, i + 1), geo_.num_buckets);
    if (std::find(out, out + n, b) == out + n) out[n++] = b;
  }
  return n;
}

bool Cuckoo::Insert(uint32_t id) {
  const uint32_t S = geo_.slots_per_bucket;
  uint64_t cand[3];
  const int nc = Candidates((*keys_)[id], cand);
  for (int i = 0; i < nc; ++i) {
    const int s = FreeSlot(cand[i]);
    if (s >= 0) {
      slots_[cand[i] * S + uint32_t(s)] = id + 1;
      ++size_;
      return true;
    }
  }
  struct Node {
    uint64_t bucket;
    int parent;     // -1 for roots
    uint32_t slot;  // slot of the parent whose entry moves here
  };
  std::vector<Node> nodes;
  for (int i = 0; i < nc; ++i) nodes.push_back({cand[i], -1, 0});
  for (size_t n = 0; n < nodes.size() && nodes.size() < config_.max_bfs_nodes;
       ++n) {
    for (uint32_t i = 0; i < S; ++i) {
      const uint64_t here = nodes[n].bucket;
      const uint32_t occupant = slots_[here * S + i];
      uint64_t alts[3];
      const int na = Candidates((*keys_)[occupant - 1], alts);
      for (int a = 0; a < na; ++a) {
        const uint64_t alt = alts[a];
        if (alt == here) continue;
        // No bucket twice on a path: a later hop would move whatever an
        // earlier hop put there.
        bool cycle = false;
        for (int p = int(n); p >= 0; p = nodes[size_t(p)].parent) {
          if (nodes[size_t(p)].bucket == alt) {
            cycle = true;
            break;
          }
        }
        if (cycle) continue;
        nodes.push_back({alt, int(n), i});
        const int free_slot = FreeSlot(alt);
        if (free_slot < 0) continue;
        int to = int(nodes.size()) - 1;
        uint32_t to_slot = uint32_t(free_slot);
        while (nodes[size_t(to)].parent >= 0) {
          const Node& hop = nodes[size_t(to)];
          const uint64_t from = nodes[size_t(hop.parent)].bucket;
          // Copy, then erase: the entry is in two buckets for a moment,
          // never in none.
          slots_[hop.bucket * S + to_slot] = slots_[from * S + hop.slot];
          slots_[from * S + hop.slot] = 0;
          ++moves_;
          to_slot = hop.slot;
          to = hop.parent;
        }
        slots_[nodes[size_t(to)].bucket * S + to_slot] = id + 1;
        ++size_;
        return true;
      }
    }
  }
  return false;
}

LookupResult Cuckoo::Lookup(const Key& key) const {
  const uint32_t S = geo_.slots_per_bucket;
  const uint16_t tag = Tag(key);
  uint64_t cand[3];
  const int nc = Candidates(key, cand);
  LookupResult r;
  // The parallel reader issues every candidate read in one round trip.
  Charge(&r.parallel, uint32_t(nc), 1, uint64_t(nc) * geo_.first_read_bytes);
  for (int c = 0; c < nc; ++c) {
    Charge(&r.sequential, 1, 1, geo_.first_read_bytes);
    for (uint32_t i = 0; i < S; ++i) {
      if (Check(slots_[cand[c] * S + i], key, tag, &r)) {
        r.found = true;
        return r;
      }
    }
  }
  if (config_.scheme == SchemeKind::kCuckoo2) {
    // remem's reader (src/hash/reader.cc) re-reads b1 before it reports a
    // miss: every move of the key rewrites b1, so an unchanged version
    // proves the two reads did not straddle a move.
    Charge(&r.sequential, 1, 1, geo_.first_read_bytes);
    Charge(&r.parallel, 1, 1, geo_.first_read_bytes);
  }
  return r;
}

// FaRM's chained associative hopscotch: a key lives in the `neighbourhood`
// buckets starting at its home bucket (read together in one read) or in its
// home bucket's chain of overflow blocks. Inserts probe linearly for a free
// slot up to `max_probe` buckets away and hop it back towards the home by
// moving entries that stay inside their own neighbourhoods; if that fails
// the pair goes to the overflow chain instead of resizing.
class Hopscotch : public Scheme {
 public:
  Hopscotch(const SchemeConfig& c, const std::vector<Key>* keys)
      : Scheme(c, keys),
        // Trailing buckets so the last neighbourhoods need no wrap-around
        // (a wrapped neighbourhood would be two reads).
        slots_((geo_.num_buckets + c.neighbourhood - 1) * geo_.slots_per_bucket,
               0),
        head_(geo_.num_buckets, 0),
        chains_(c.overflow_slots) {}

  bool Insert(uint32_t id) override;
  LookupResult Lookup(const Key& key) const override;
  uint64_t TableBytes() const override {
    return (geo_.num_buckets + config_.neighbourhood - 1) * geo_.bucket_bytes +
           chains_.blocks() * geo_.chain_block_bytes;
  }

 private:
  uint64_t Home(const Key& k) const {
    return Reduce(Hash(k, 1), geo_.num_buckets);
  }
  int FreeSlot(uint64_t b) const {
    for (uint32_t i = 0; i < geo_.slots_per_bucket; ++i) {
      if (slots_[b * geo_.slots_per_bucket + i] == 0) return int(i);
    }
    return -1;
  }

  std::vector<uint32_t> slots_;
  std::vector<uint32_t> head_;  // per home bucket: overflow chain link
  Chains chains_;
};

bool Hopscotch::Insert(uint32_t id) {
  const uint32_t S = geo_.slots_per_bucket;
  const uint64_t nh = config_.neighbourhood;
  const uint64_t total = geo_.num_buckets + nh - 1;
  const uint64_t home = Home((*keys_)[id]);
  ++size_;
  for (uint64_t b = home; b < home + nh; ++b) {
    const int s = FreeSlot(b);
    if (s >= 0) {
      slots_[b * S + uint32_t(s)] = id + 1;
      return true;
    }
  }
  const uint64_t limit = std::min<uint64_t>(total, home + config_.max_probe);
  uint64_t f = home + nh;
  int fs = -1;
  for (; f < limit; ++f) {
    fs = FreeSlot(f);
    if (fs >= 0) break;
  }
  if (fs >= 0) {
    // Plan the hops before moving anything, so a dead end moves nothing.
    struct Hop {
      uint64_t from_bucket;
      uint32_t from_slot;
      uint64_t to_bucket;
      uint32_t to_slot;
    };
    std::vector<Hop> hops;
    uint64_t to = f;
    uint32_t to_slot = uint32_t(fs);
    while (to >= home + nh) {
      bool hopped = false;
      // The earliest entry that may still live in `to` frees the slot
      // closest to home.
      for (uint64_t c = to - (nh - 1); c < to && !hopped; ++c) {
        for (uint32_t i = 0; i < S; ++i) {
          const uint32_t e = slots_[c * S + i];
          if (Home((*keys_)[e - 1]) + nh - 1 >= to) {
            hops.push_back({c, i, to, to_slot});
            to = c;
            to_slot = i;
            hopped = true;
            break;
          }
        }
      }
      if (!hopped) break;
    }
    if (to < home + nh) {
      // First hop first: it fills the free slot; each later hop fills the
      // slot the previous one vacated. Copy before erase, as in cuckoo.
      for (const Hop& h : hops) {
        slots_[h.to_bucket * S + h.to_slot] =
            slots_[h.from_bucket * S + h.from_slot];
        slots_[h.from_bucket * S + h.from_slot] = 0;
        ++moves_;
      }
      slots_[to * S + to_slot] = id + 1;
      return true;
    }
  }
  ++spilled_;
  chains_.Append(&head_[home], id + 1);
  return true;
}

LookupResult Hopscotch::Lookup(const Key& key) const {
  const uint32_t S = geo_.slots_per_bucket;
  const uint16_t tag = Tag(key);
  const uint64_t home = Home(key);
  LookupResult r;
  auto both = [&r](uint64_t bytes) {
    Charge(&r.sequential, 1, 1, bytes);
    Charge(&r.parallel, 1, 1, bytes);
  };
  both(geo_.first_read_bytes);
  for (uint64_t i = home * S; i < (home + config_.neighbourhood) * S; ++i) {
    if (Check(slots_[i], key, tag, &r)) {
      r.found = true;
      return r;
    }
  }
  for (uint32_t link = head_[home]; link != 0; link = chains_.Next(link)) {
    both(geo_.chain_block_bytes);
    const uint32_t* block = chains_.Block(link);
    for (uint32_t i = 0; i < config_.overflow_slots; ++i) {
      if (Check(block[i], key, tag, &r)) {
        r.found = true;
        return r;
      }
    }
  }
  return r;
}

// KV-Direct: one home bucket per key, then a chain of buckets of the same
// size; each chained bucket is one more dependent read. Nothing moves.
class Chained : public Scheme {
 public:
  Chained(const SchemeConfig& c, const std::vector<Key>* keys)
      : Scheme(c, keys),
        slots_(geo_.num_buckets * geo_.slots_per_bucket, 0),
        head_(geo_.num_buckets, 0),
        chains_(geo_.slots_per_bucket) {}

  bool Insert(uint32_t id) override {
    const uint32_t S = geo_.slots_per_bucket;
    const uint64_t home = Reduce(Hash((*keys_)[id], 1), geo_.num_buckets);
    ++size_;
    for (uint32_t i = 0; i < S; ++i) {
      if (slots_[home * S + i] == 0) {
        slots_[home * S + i] = id + 1;
        return true;
      }
    }
    ++spilled_;
    chains_.Append(&head_[home], id + 1);
    return true;
  }

  LookupResult Lookup(const Key& key) const override {
    const uint32_t S = geo_.slots_per_bucket;
    const uint16_t tag = Tag(key);
    const uint64_t home = Reduce(Hash(key, 1), geo_.num_buckets);
    LookupResult r;
    const uint32_t* bucket = &slots_[home * S];
    for (uint32_t link = 0;;) {
      Charge(&r.sequential, 1, 1, geo_.bucket_bytes);
      Charge(&r.parallel, 1, 1, geo_.bucket_bytes);
      for (uint32_t i = 0; i < S; ++i) {
        if (Check(bucket[i], key, tag, &r)) {
          r.found = true;
          return r;
        }
      }
      link = link == 0 ? head_[home] : chains_.Next(link);
      if (link == 0) return r;
      bucket = chains_.Block(link);
    }
  }

  uint64_t TableBytes() const override {
    return (geo_.num_buckets + chains_.blocks()) * geo_.bucket_bytes;
  }

 private:
  std::vector<uint32_t> slots_;
  std::vector<uint32_t> head_;
  Chains chains_;
};

}  // namespace

const char* SchemeName(SchemeKind s) {
  switch (s) {
    case SchemeKind::kCuckoo2:
      return "remem 2-choice cuckoo";
    case SchemeKind::kCuckoo3:
      return "Pilaf 3-way cuckoo";
    case SchemeKind::kHopscotch:
      return "FaRM hopscotch";
    case SchemeKind::kChained:
      return "KV-Direct chained";
  }
  return "?";
}

const char* PairName(PairKind p) {
  return p == PairKind::kInline ? "inline" : "out-of-line";
}

Geometry GeometryFor(const SchemeConfig& c) {
  Geometry g;
  g.slot_bytes =
      c.pairs == PairKind::kInline ? kInlineSlotBytes : kPointerSlotBytes;
  // Chained schemes keep a next pointer in each bucket besides the header.
  const bool chained =
      c.scheme == SchemeKind::kHopscotch || c.scheme == SchemeKind::kChained;
  const uint32_t overhead = kHeaderBytes + (chained ? kNextBytes : 0);
  if (c.scheme == SchemeKind::kCuckoo3) {
    g.slots_per_bucket = 1;
  } else if (c.slots_per_bucket != 0) {
    g.slots_per_bucket = c.slots_per_bucket;
  } else {
    g.slots_per_bucket = c.bucket_bytes > overhead
                             ? (c.bucket_bytes - overhead) / g.slot_bytes
                             : 0;
  }
  if (g.slots_per_bucket == 0) return g;
  g.bucket_bytes = c.scheme == SchemeKind::kCuckoo3 || c.slots_per_bucket != 0
                       ? overhead + g.slots_per_bucket * g.slot_bytes
                       : c.bucket_bytes;
  const uint64_t buckets =
      std::max<uint64_t>(2, c.target_slots / g.slots_per_bucket);
  // Cuckoo tables index with a mask (remem's AltBucket needs one).
  g.num_buckets = chained ? buckets : FloorPow2(buckets);
  g.primary_slots = g.num_buckets * g.slots_per_bucket;
  g.first_read_bytes = g.bucket_bytes;
  if (c.scheme == SchemeKind::kHopscotch) {
    g.first_read_bytes = c.neighbourhood * g.bucket_bytes;
    g.chain_block_bytes = overhead + c.overflow_slots * g.slot_bytes;
  } else if (c.scheme == SchemeKind::kChained) {
    g.chain_block_bytes = g.bucket_bytes;
  }
  return g;
}

Scheme::Scheme(const SchemeConfig& c, const std::vector<Key>* keys)
    : config_(c), geo_(GeometryFor(c)), keys_(keys) {}

uint64_t Scheme::ExtentBytes() const {
  return Inline() ? 0 : size_ * kExtentBytes;
}

uint64_t Scheme::Hash(const Key& k, uint32_t i) const {
  return XXH3_64bits_withSeed(k.data(), k.size(),
                              config_.seed * 0x9e3779b97f4a7c15ull + i);
}

uint16_t Scheme::Tag(const Key& k) const {
  return hash::HashKey(View(k), config_.seed).tag;
}

bool Scheme::Check(uint32_t id, const Key& key, uint16_t tag,
                   LookupResult* r) const {
  if (id == 0) return false;
  const Key& k = (*keys_)[id - 1];
  if (Inline()) return k == key;  // the key is in the bytes already read
  if (Tag(k) != tag) return false;
  Charge(&r->sequential, 1, 1, kExtentBytes);
  Charge(&r->parallel, 1, 1, kExtentBytes);
  return k == key;
}

std::unique_ptr<Scheme> MakeScheme(const SchemeConfig& c,
                                   const std::vector<Key>* keys) {
  switch (c.scheme) {
    case SchemeKind::kCuckoo2:
    case SchemeKind::kCuckoo3:
      return std::make_unique<Cuckoo>(c, keys);
    case SchemeKind::kHopscotch:
      return std::make_unique<Hopscotch>(c, keys);
    case SchemeKind::kChained:
      return std::make_unique<Chained>(c, keys);
  }
  return nullptr;
}

std::vector<Key> RandomKeys(uint64_t n, uint64_t seed, uint64_t stream) {
  // mt19937_64's output sequence is fixed by the standard (distributions
  // are not), so raw outputs keep runs identical across libraries.
  std::mt19937_64 rng(seed * 0x2545f4914f6cdd1dull + stream);
  std::vector<Key> keys(n);
  for (Key& k : keys) {
    for (int w = 0; w < 2; ++w) {
      const uint64_t x = rng();
      std::memcpy(k.data() + 8 * w, &x, 8);
    }
  }
  return keys;
}

namespace {

struct Sums {
  double reads = 0, round_trips = 0, bytes = 0;
  double par_reads = 0, par_round_trips = 0, par_bytes = 0;
  void Add(const LookupResult& r) {
    reads += r.sequential.reads;
    round_trips += r.sequential.round_trips;
    bytes += double(r.sequential.bytes);
    par_reads += r.parallel.reads;
    par_round_trips += r.parallel.round_trips;
    par_bytes += double(r.parallel.bytes);
  }
};

void Measure(const Scheme& s, const std::vector<Key>& keys,
             const std::vector<Key>& misses, uint64_t samples, Point* p) {
  Sums hit, miss;
  const uint64_t n = s.size();
  const uint64_t m = std::min(samples, n);
  // Evenly spaced over insertion order: old and new keys alike.
  for (uint64_t j = 0; j < m; ++j) {
    const LookupResult r = s.Lookup(keys[j * n / m]);
    if (!r.found) ++p->hits_missing;
    hit.Add(r);
  }
  for (const Key& k : misses) {
    const LookupResult r = s.Lookup(k);
    if (r.found) ++p->misses_found;
    miss.Add(r);
  }
  const double hm = double(std::max<uint64_t>(m, 1));
  const double mm = double(std::max<size_t>(misses.size(), 1));
  p->reached = true;
  p->hit_reads = hit.reads / hm;
  p->hit_round_trips = hit.round_trips / hm;
  p->hit_bytes = hit.bytes / hm;
  p->hit_par_reads = hit.par_reads / hm;
  p->hit_par_round_trips = hit.par_round_trips / hm;
  p->hit_par_bytes = hit.par_bytes / hm;
  p->miss_reads = miss.reads / mm;
  p->miss_round_trips = miss.round_trips / mm;
  p->miss_bytes = miss.bytes / mm;
  p->miss_par_reads = miss.par_reads / mm;
  p->miss_par_round_trips = miss.par_round_trips / mm;
  p->miss_par_bytes = miss.par_bytes / mm;
  p->utilization =
      double(n) * kPayloadBytes / double(s.TableBytes() + s.ExtentBytes());
  p->moves_per_insert = double(s.moves()) / double(std::max<uint64_t>(n, 1));
  p->spilled = double(s.spilled()) / double(std::max<uint64_t>(n, 1));
}

}  // namespace

RunResult Simulate(const SchemeConfig& c, const RunOptions& o) {
  RunResult res;
  res.config = c;
  res.geometry = GeometryFor(c);
  if (res.geometry.slots_per_bucket == 0) return res;
  const uint64_t cap = res.geometry.primary_slots;
  const std::vector<Key> keys = RandomKeys(cap, c.seed, 0);
  const std::vector<Key> misses = RandomKeys(o.samples, c.seed, 1);
  std::unique_ptr<Scheme> s = MakeScheme(c, &keys);
  std::vector<double> targets = o.occupancies;
  std::sort(targets.begin(), targets.end());
  for (double t : targets) {
    Point p;
    p.occupancy = t;
    res.points.push_back(p);
  }
  size_t next = 0;
  uint64_t last_moves = 0, last_size = 0;
  for (uint64_t id = 0; id < cap; ++id) {
    if (!s->Insert(uint32_t(id))) {
      res.failed = true;
      break;
    }
    if (!res.spilled && s->spilled() > 0) {
      res.spilled = true;
      res.first_spill = s->Occupancy();
    }
    while (next < res.points.size() &&
           double(s->size()) >= res.points[next].occupancy * double(cap)) {
      Point& p = res.points[next++];
      Measure(*s, keys, misses, o.samples, &p);
      p.interval_moves = double(s->moves() - last_moves) /
                         double(std::max<uint64_t>(s->size() - last_size, 1));
      last_moves = s->moves();
      last_size = s->size();
    }
  }
  res.max_load = s->Occupancy();
  return res;
}

namespace {

std::string Format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

std::string Label(const RunResult& r) {
  std::string l = SchemeName(r.config.scheme);
  if (r.config.scheme == SchemeKind::kHopscotch) {
    l += Format(" H=%u", r.config.neighbourhood * r.geometry.slots_per_bucket);
  }
  return l;
}

}  // namespace

std::string ToMarkdown(const std::vector<RunResult>& runs) {
  std::string out;
  for (PairKind pk : {PairKind::kInline, PairKind::kOutOfLine}) {
    out +=
        Format("\n### %s pairs (%u B key + %u B value, slot %u B%s)\n\n",
               PairName(pk), kKeyBytes, kValueBytes,
               pk == PairKind::kInline ? kInlineSlotBytes : kPointerSlotBytes,
               pk == PairKind::kInline ? "" : ", extent 128 B");
    out +=
        "| scheme | bucket B | slots/bucket | first read B | primary slots "
        "| max load | first chained at |\n"
        "|---|---|---|---|---|---|---|\n";
    for (const RunResult& r : runs) {
      if (r.config.pairs != pk || r.geometry.slots_per_bucket == 0) continue;
      const Geometry& g = r.geometry;
      out += Format(
          "| %s | %u | %u | %u | %llu | %s | %s |\n", Label(r).c_str(),
          g.bucket_bytes, g.slots_per_bucket, g.first_read_bytes,
          (unsigned long long)g.primary_slots,
          r.failed ? Format("%.3f", r.max_load).c_str() : "no failure (chains)",
          r.spilled ? Format("%.3f", r.first_spill).c_str() : "-");
    }
    out +=
        "\n| scheme | bucket B | occ | hit reads seq/par | hit RTs seq/par "
        "| hit bytes seq/par | miss reads seq/par | miss RTs seq/par "
        "| miss bytes seq/par | util | moves/insert cum (interval) "
        "| chained |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const RunResult& r : runs) {
      if (r.config.pairs != pk || r.geometry.slots_per_bucket == 0) continue;
      for (const Point& p : r.points) {
        if (!p.reached) {
          out += Format("| %s | %u | %.0f%% | full at %.3f | | | | | | | | |\n",
                        Label(r).c_str(), r.geometry.bucket_bytes,
                        100 * p.occupancy, r.max_load);
          continue;
        }
        out += Format(
            "| %s | %u | %.0f%% | %.3f / %.3f | %.3f / %.3f | %.0f / %.0f "
            "| %.3f / %.3f | %.3f / %.3f | %.0f / %.0f | %.1f%% "
            "| %.3f (%.3f) | %.2f%% |\n",
            Label(r).c_str(), r.geometry.bucket_bytes, 100 * p.occupancy,
            p.hit_reads, p.hit_par_reads, p.hit_round_trips,
            p.hit_par_round_trips, p.hit_bytes, p.hit_par_bytes, p.miss_reads,
            p.miss_par_reads, p.miss_round_trips, p.miss_par_round_trips,
            p.miss_bytes, p.miss_par_bytes, 100 * p.utilization,
            p.moves_per_insert, p.interval_moves, 100 * p.spilled);
      }
    }
  }
  return out;
}

std::string ToJson(const std::vector<RunResult>& runs) {
  std::string out = "[\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = runs[i];
    const Geometry& g = r.geometry;
    out += Format(
        "  {\"scheme\": \"%s\", \"pairs\": \"%s\", \"bucket_bytes\": %u, "
        "\"slots_per_bucket\": %u, \"num_buckets\": %llu, "
        "\"primary_slots\": %llu, \"first_read_bytes\": %u, "
        "\"chain_block_bytes\": %u, \"neighbourhood\": %u, \"failed\": %s, "
        "\"max_load\": %.4f, \"first_chained\": %.4f, \"points\": [",
        Label(r).c_str(), PairName(r.config.pairs), g.bucket_bytes,
        g.slots_per_bucket, (unsigned long long)g.num_buckets,
        (unsigned long long)g.primary_slots, g.first_read_bytes,
        g.chain_block_bytes, r.config.neighbourhood,
        r.failed ? "true" : "false", r.max_load,
        r.spilled ? r.first_spill : 0.0);
    for (size_t j = 0; j < r.points.size(); ++j) {
      const Point& p = r.points[j];
      out += Format(
          "%s\n    {\"occupancy\": %.2f, \"reached\": %s, "
          "\"hit\": {\"reads\": %.4f, \"round_trips\": %.4f, \"bytes\": %.1f, "
          "\"par_reads\": %.4f, \"par_round_trips\": %.4f, "
          "\"par_bytes\": %.1f}, ",
          j ? "," : "", p.occupancy, p.reached ? "true" : "false", p.hit_reads,
          p.hit_round_trips, p.hit_bytes, p.hit_par_reads,
          p.hit_par_round_trips, p.hit_par_bytes);
      out += Format(
          "\"miss\": {\"reads\": %.4f, \"round_trips\": %.4f, \"bytes\": "
          "%.1f, \"par_reads\": %.4f, \"par_round_trips\": %.4f, "
          "\"par_bytes\": %.1f}, \"utilization\": %.4f, "
          "\"moves_per_insert\": %.4f, \"interval_moves_per_insert\": %.4f, "
          "\"chained_fraction\": %.5f, \"hits_missing\": %llu, "
          "\"misses_found\": %llu}",
          p.miss_reads, p.miss_round_trips, p.miss_bytes, p.miss_par_reads,
          p.miss_par_round_trips, p.miss_par_bytes, p.utilization,
          p.moves_per_insert, p.interval_moves, p.spilled,
          (unsigned long long)p.hits_missing,
          (unsigned long long)p.misses_found);
    }
    out += Format("]}%s\n", i + 1 < runs.size() ? "," : "");
  }
  out += "]\n";
  return out;
}

}  // namespace remem::schemes
