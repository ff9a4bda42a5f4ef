#include "bench_ycsb.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "bench_common.h"
#include "bench_curve.h"
#include "bench_drivers.h"
#include "fabric/context.h"
#include "util/histogram.h"
#include "util/size.h"

namespace remem::bench {

namespace {

using Clock = std::chrono::steady_clock;
using ycsb::Distribution;

// One (system, workload, value size, depth, batch) run, merged over client
// threads.
struct RunResult {
  std::string system;
  char workload = 'C';
  Distribution distribution = Distribution::kZipfian;
  size_t key_size = 0, value_size = 0;
  int threads = 1, depth = 1, batch = 1;
  double load_seconds = 0;
  uint64_t ops = 0;       // YCSB operations (a batch of N reads is N)
  uint64_t requests = 0;  // requests completed (a batch is one)
  double seconds = 0;
  Histogram latency_ns;  // per request (an RMW: its read and write)
  Histogram read_ns, write_ns;
  uint64_t reads = 0, updates = 0, inserts = 0, rmws = 0;
  uint64_t scans = 0, scanned = 0;  // scans, and the items they returned
  uint64_t checked = 0, wrong = 0, missing = 0;
  double server_cpu_s = -1;
  std::optional<ReadPathCounts> read_path;
  std::string error;
};

enum Phase { kLoad, kWarmup, kMeasure, kStop };

// The main thread runs the points in turn: for point p it sets `phase` to
// kWarmup, then `round` to p (the client threads start on seeing it), moves
// `phase` on to kMeasure and kStop, and waits until every thread has added
// its `finished` for p (each drains its window first).
struct Shared {
  const YcsbOptions* o = nullptr;
  std::vector<CurvePoint> points;
  ycsb::Workload w;
  size_t value_size = 0;
  const SystemServer* server = nullptr;
  std::atomic<int> phase{kLoad};
  std::atomic<int> round{-1};    // the point being run; points.size(): done
  std::atomic<int> finished{0};  // (thread, point) pairs done
  std::atomic<uint64_t> loaded{0};
  std::atomic<int> ready{0};             // threads done loading (or failed)
  std::atomic<uint64_t> count{0};        // keys that exist (for choosers)
  std::atomic<uint64_t> next_insert{0};  // D: next record number to insert
  // D: inserts acknowledged above `count` (YCSB's acknowledged counter):
  // `count` passes a record only once every record below it is in, so no
  // read picks a key whose insert is still in flight (with several threads,
  // or several in flight, inserts end out of order; reads of keys claimed
  // and not yet written counted as missing).
  std::mutex acked_mu;
  std::set<uint64_t> acked;

  void Acknowledge(uint64_t rec) {
    std::lock_guard<std::mutex> lock(acked_mu);
    uint64_t limit = count.load();
    if (rec != limit) {
      acked.insert(rec);
      return;
    }
    ++limit;
    while (!acked.empty() && *acked.begin() == limit) {
      acked.erase(acked.begin());
      ++limit;
    }
    count.store(limit);
  }
};

// A request slot of a client thread's window, with the operation it is part
// of (an RMW is a get then a put in the same slot).
struct Slot {
  KvRequest req;
  enum Op { kRead, kUpdate, kInsert, kRmw, kScan } op = kRead;
  bool second_half = false;   // RMW: the put after the get
  uint64_t rec = 0;           // an insert's record number
  uint64_t req_start_ns = 0;  // RequestNs() when the request was issued
};

class ClientThread {
 public:
  ClientThread(Shared* sh, int index) : sh_(sh), index_(index) {}

  void Run() {
    results_.resize(sh_->points.size());
    error_ = Setup();
    Ready();
    for (size_t p = 0; p < sh_->points.size(); ++p) {
      while (sh_->round.load() < int(p)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      r_ = &results_[p];
      // An error ends this thread's part: the connection may be unusable.
      if (error_.ok()) error_ = RunPoint(sh_->points[p]);
      if (!error_.ok()) r_->error = error_.ToString();
      sh_->finished.fetch_add(1);
    }
  }

  // Set once the thread is Ready().
  const Status& error() const { return error_; }
  RunResult& result(size_t point) { return results_[point]; }
  // Operations measured so far, all points (read by the main thread while
  // the run goes on: --interval).
  uint64_t measured_ops() const {
    return measured_ops_.load(std::memory_order_relaxed);
  }

 private:
  void Ready() { sh_->ready.fetch_add(1); }

  Status Setup() {
    REMEM_RETURN_IF_ERROR(PinThisThread(sh_->o->client_cpu));
    auto d = sh_->server->Connect(sh_->w.ordered());
    if (!d.ok()) return d.status();
    driver_ = std::move(*d);
    return Load();
  }

  Status RunPoint(CurvePoint point) {
    depth_ = std::min(point.depth, driver_->max_depth());
    batch_ = point.batch;
    const auto before = driver_->read_path_counts();
    Status st = Transactions();
    // The driver's counters are cumulative: this point's are the change.
    if (auto after = driver_->read_path_counts(); after && before) {
      r_->read_path = ReadPathCounts{
          after->onesided_gets - before->onesided_gets,
          after->rpc_gets - before->rpc_gets, after->retries - before->retries,
          after->fallbacks - before->fallbacks};
    }
    return st;
  }

  // This thread's share of records, as quiet puts through a window.
  Status Load() {
    const uint64_t n = sh_->o->records, t = uint64_t(sh_->o->threads);
    const uint64_t from = n * uint64_t(index_) / t;
    const uint64_t to = n * uint64_t(index_ + 1) / t;
    const int window = std::min(64, driver_->max_depth());
    std::vector<KvRequest> reqs(static_cast<size_t>(window));
    std::vector<KvRequest*> free_list, done;
    for (auto& r : reqs) free_list.push_back(&r);
    uint64_t next = from;
    while (next < to || driver_->in_flight() > 0) {
      while (next < to && !free_list.empty()) {
        KvRequest* r = free_list.back();
        free_list.pop_back();
        r->kind = KvRequest::Kind::kPut;
        r->quiet = true;
        r->keys.resize(1);
        ycsb::KeyName(next++, sh_->o->key_size, &r->keys[0]);
        ycsb::MakeValue(r->keys[0], 0, sh_->value_size, &r->value);
        r->status = Status::OK();
        driver_->Issue(r);
      }
      done.clear();
      REMEM_RETURN_IF_ERROR(driver_->WaitSome(&done));
      for (KvRequest* r : done) {
        if (!r->status.ok()) return r->status.WithContext("load");
        free_list.push_back(r);
      }
      sh_->loaded.fetch_add(done.size(), std::memory_order_relaxed);
    }
    return driver_->FinishLoad();
  }

  void Start(Slot* s) {
    const ycsb::Workload& w = sh_->w;
    const YcsbOptions& o = *sh_->o;
    const double u = rng_.Uniform();
    s->second_half = false;
    s->req.status = Status::OK();
    s->req.quiet = false;
    if (w.scan > 0 && u >= w.read + w.update + w.insert + w.rmw) {
      // A scan from a chosen key, of 1..max_scan keys.
      s->op = Slot::kScan;
      s->req.kind = KvRequest::Kind::kScan;
      s->req.keys.resize(1);
      ycsb::KeyName(chooser_->Next(rng_), o.key_size, &s->req.keys[0]);
      s->req.limit = 1 + uint32_t(rng_.Next() % w.max_scan);
      s->req.scanned = 0;
    } else if (u < w.read || (u >= w.read + w.update + w.insert)) {
      s->op = u < w.read ? Slot::kRead : Slot::kRmw;
      s->req.kind = KvRequest::Kind::kGet;
      const size_t n = s->op == Slot::kRead ? size_t(batch_) : 1;
      s->req.keys.resize(n);
      for (auto& k : s->req.keys) {
        ycsb::KeyName(chooser_->Next(rng_), o.key_size, &k);
      }
    } else {
      s->req.kind = KvRequest::Kind::kPut;
      s->req.keys.resize(1);
      uint64_t rec;
      if (u < w.read + w.update) {
        s->op = Slot::kUpdate;
        rec = chooser_->Next(rng_);
      } else {
        s->op = Slot::kInsert;
        rec = sh_->next_insert.fetch_add(1);
        s->rec = rec;
      }
      ycsb::KeyName(rec, o.key_size, &s->req.keys[0]);
      ycsb::MakeValue(s->req.keys[0], NextGeneration(), sh_->value_size,
                      &s->req.value);
    }
    s->req_start_ns = RequestNs();
    driver_->Issue(&s->req);
  }

  uint32_t NextGeneration() {
    // Never 0 (the load's), distinct per thread.
    return (uint32_t(index_ + 1) << 24) | (++generation_ & 0xFFFFFF);
  }

  // Returns false if the operation continues (RMW's read done).
  bool Finish(Slot* s, bool measuring) {
    KvRequest& r = s->req;
    // Never below 0, should the counter of another CPU be behind.
    const uint64_t took =
        r.done_ns > s->req_start_ns ? r.done_ns - s->req_start_ns : 0;
    if (measuring) r_->latency_ns.Record(took);
    if (r.kind == KvRequest::Kind::kScan) {
      if (measuring) r_->read_ns.Record(took);
      CheckScan(r);
    } else if (r.kind == KvRequest::Kind::kGet) {
      if (measuring) r_->read_ns.Record(took);
      for (size_t i = 0; i < r.values.size(); ++i) {
        // Checks count in every phase: a wrong value is wrong in warm-up too.
        if (!r.values[i]) {
          ++r_->missing;
          continue;
        }
        const int every = sh_->o->check_every;
        if (every > 0 && ++reads_seen_ % uint64_t(every) == 0) {
          ++r_->checked;
          if (!ycsb::CheckValue(r.keys[i], *r.values[i], sh_->value_size)) {
            ++r_->wrong;
          }
        }
      }
      if (s->op == Slot::kRmw) {
        // Modify and write back the same key.
        r.kind = KvRequest::Kind::kPut;
        ycsb::MakeValue(r.keys[0], NextGeneration(), sh_->value_size, &r.value);
        s->second_half = true;
        s->req_start_ns = RequestNs();
        driver_->Issue(&r);
        return false;
      }
    } else if (measuring) {
      r_->write_ns.Record(took);
    }
    if (s->op == Slot::kInsert) sh_->Acknowledge(s->rec);
    if (measuring) {
      switch (s->op) {
        case Slot::kRead:
          r_->reads += r.keys.size();
          r_->ops += r.keys.size();
          break;
        case Slot::kUpdate:
          ++r_->updates, ++r_->ops;
          break;
        case Slot::kInsert:
          ++r_->inserts, ++r_->ops;
          break;
        case Slot::kRmw:
          ++r_->rmws, ++r_->ops;
          break;
        case Slot::kScan:
          ++r_->scans, ++r_->ops;
          r_->scanned += r.scanned;
          break;
      }
      pass_ops_ += s->op == Slot::kRead ? r.keys.size() : 1;
    }
    return true;
  }

  // A scan's items: keys from the start key on, strictly ascending, too
  // many never, and values as written (every --check-every'th item). A
  // wrong order or range counts as a wrong value.
  void CheckScan(const KvRequest& r) {
    bool in_order = r.scanned <= r.limit;
    for (size_t i = 0; i < r.scanned; ++i) {
      const KvRequest::Item& it = r.items[i];
      if (i == 0 ? it.key < r.keys[0] : !(r.items[i - 1].key < it.key)) {
        in_order = false;
      }
      const int every = sh_->o->check_every;
      if (every > 0 && ++reads_seen_ % uint64_t(every) == 0) {
        ++r_->checked;
        if (!ycsb::CheckValue(it.key, it.value, sh_->value_size)) ++r_->wrong;
      }
    }
    if (!in_order) ++r_->wrong;
  }

  Status Transactions() {
    const YcsbOptions& o = *sh_->o;
    rng_ = ycsb::Rng(o.seed * 1000003 + uint64_t(index_));
    const Distribution dist = o.distribution.value_or(sh_->w.distribution);
    chooser_ = ycsb::MakeChooser(dist, o.records, &sh_->count);
    std::vector<Slot> slots(static_cast<size_t>(depth_));
    for (auto& s : slots) {
      s.req.context = &s;
      Start(&s);
    }
    std::vector<KvRequest*> done;
    Status first_error;
    while (driver_->in_flight() > 0) {
      done.clear();
      REMEM_RETURN_IF_ERROR(driver_->WaitSome(&done));
      const int phase = sh_->phase.load(std::memory_order_relaxed);
      const bool measuring = phase == kMeasure;
      if (measuring) r_->requests += done.size();
      for (KvRequest* r : done) {
        Slot* s = static_cast<Slot*>(r->context);
        if (!r->status.ok()) {
          if (first_error.ok()) first_error = r->status;
          continue;
        }
        if (Finish(s, measuring) && phase != kStop && first_error.ok()) {
          Start(s);
        }
      }
      // Added once a pass, not per operation: a locked add each was 1.6% of
      // the client's time in a profile of one-sided gets at depth 16.
      if (pass_ops_ > 0) {
        measured_ops_.fetch_add(pass_ops_, std::memory_order_relaxed);
        pass_ops_ = 0;
      }
    }
    return first_error;
  }

  Shared* sh_;
  int index_;
  std::unique_ptr<KvDriver> driver_;
  int depth_ = 1, batch_ = 1;  // the current point's
  ycsb::Rng rng_{0};
  std::unique_ptr<ycsb::KeyChooser> chooser_;
  uint32_t generation_ = 0;
  uint64_t reads_seen_ = 0;
  Status error_;
  std::vector<RunResult> results_;  // one per point
  std::atomic<uint64_t> measured_ops_{0};
  uint64_t pass_ops_ = 0;   // measured in this pass, not yet in measured_ops_
  RunResult* r_ = nullptr;  // the current point's
};

// Memory the store needs for `pairs` pairs, with room to spare (the table
// doubles as it grows and keeps outgrown arrays, and extents come in size
// classes).
uint64_t MemoryFor(uint64_t pairs, size_t key_size, size_t value_size) {
  const uint64_t phys =
      uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  uint64_t want = 4 * pairs * (key_size + value_size + 128);
  want = std::max<uint64_t>(want, 256ull << 20);
  return std::min(want, phys / 2);
}

void Progress(const std::string& what, uint64_t done, uint64_t total,
              double seconds, bool final) {
  if (!isatty(STDERR_FILENO)) {
    if (final) {
      std::fprintf(stderr, "%s: loaded %llu pairs in %.1f s\n", what.c_str(),
                   static_cast<unsigned long long>(total), seconds);
    }
    return;
  }
  const int width = 30;
  const int filled = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\r%s: load [%s%s] %3d%% %llu/%llu %.0f k/s%s",
               what.c_str(), std::string(size_t(filled), '#').c_str(),
               std::string(size_t(width - filled), '.').c_str(),
               total ? int(100 * done / total) : 100,
               static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total),
               seconds > 0 ? double(done) / seconds / 1e3 : 0.0,
               final ? "\n" : "");
}

// Loads `spec` once, then runs every point of `points` against it: one
// result per point, in order.
std::vector<RunResult> RunSystem(const YcsbOptions& o,
                                 const std::vector<CurvePoint>& points,
                                 const SystemSpec& spec,
                                 const ycsb::Workload& w, size_t value_size) {
  std::vector<RunResult> res(points.size());
  for (size_t p = 0; p < points.size(); ++p) {
    RunResult& r = res[p];
    r.system = spec.name;
    r.workload = w.name;
    r.distribution = o.distribution.value_or(w.distribution);
    r.key_size = o.key_size;
    r.value_size = value_size;
    r.threads = o.threads;
    r.depth = points[p].depth;
    r.batch = points[p].batch;
  }
  auto fail_all = [&res](const std::string& error) {
    for (RunResult& r : res) r.error = error;
    return res;
  };

  // Inserts (D) add at most ~5% of a generous 3 M ops/s, at every point.
  const double seconds = (o.duration + o.warmup) * double(points.size());
  const uint64_t inserts =
      w.insert > 0 ? uint64_t(w.insert * seconds * 3e6) : 0;
  const uint64_t pairs = o.records + inserts;
  SystemServer::Options so;
  so.remem_binary = o.remem_binary;
  so.remem_address = o.remem_address;
  so.remem_cluster = o.remem_cluster;
  so.read_any_replica = o.read_any_replica;
  so.server_pids = o.server_pids;
  so.secret = o.secret;
  so.cpu = o.server_cpu;
  so.memory_bytes = MemoryFor(pairs, o.key_size, value_size);
  if (w.ordered()) {
    // The ordered store's region: leaf entries (16 bytes of head) in nodes
    // filled half to whole, internal nodes, and room for the inserts.
    so.tree_bytes = std::max<uint64_t>(
        64ull << 20, pairs * (16 + o.key_size + value_size) * 3);
    so.memory_bytes = std::max(so.memory_bytes, 2 * so.tree_bytes);
  }
  auto server = SystemServer::Start(spec, so);
  if (!server.ok()) return fail_all(server.status().ToString());
  Shared sh;
  sh.o = &o;
  sh.points = points;
  sh.w = w;
  sh.value_size = value_size;
  sh.server = server->get();
  sh.count = o.records;
  sh.next_insert = o.records;
  std::vector<std::unique_ptr<ClientThread>> clients;
  std::vector<std::thread> threads;
  for (int i = 0; i < o.threads; ++i) {
    clients.push_back(std::make_unique<ClientThread>(&sh, i));
  }
  for (auto& c : clients) threads.emplace_back([&c] { c->Run(); });
  auto finish = [&] {
    sh.phase = kStop;
    sh.round = int(points.size());
    for (auto& t : threads) t.join();
  };

  const std::string what = spec.name + " " + w.name;
  const auto t0 = Clock::now();
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  // Looked at every 5 ms (load_seconds was a multiple of the 100 ms this
  // slept), the progress shown every 100 ms.
  for (int looks = 1; sh.ready.load() < o.threads; ++looks) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (looks % 20 == 0) {
      Progress(what, sh.loaded.load(), o.records, since(t0), false);
    }
  }
  const double load_seconds = since(t0);
  for (auto& c : clients) {
    if (!c->error().ok()) {
      // Not "loaded": it said so for a load that failed (no server, a
      // full store).
      if (isatty(STDERR_FILENO)) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "%s: load failed after %llu of %llu pairs\n",
                   what.c_str(),
                   static_cast<unsigned long long>(sh.loaded.load()),
                   static_cast<unsigned long long>(o.records));
      const std::string error = c->error().ToString();
      finish();
      return fail_all(error);
    }
  }
  Progress(what, sh.loaded.load(), o.records, load_seconds, true);

  for (size_t p = 0; p < points.size(); ++p) {
    if (!o.json && points.size() > 1) {
      std::fprintf(stderr, "%s: depth %d, batch %d\n", what.c_str(),
                   points[p].depth, points[p].batch);
    }
    RunResult& res_p = res[p];
    res_p.load_seconds = load_seconds;
    sh.phase = kWarmup;
    sh.round = int(p);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup));
    auto cpu0 = (*server)->CpuSeconds();
    const auto m0 = Clock::now();
    sh.phase = kMeasure;
    if (o.interval > 0) {
      // Throughput per interval, on stderr, as the run goes.
      auto ops_now = [&] {
        uint64_t n = 0;
        for (auto& c : clients) n += c->measured_ops();
        return n;
      };
      uint64_t last = ops_now();
      double at = 0;
      while (at < o.duration) {
        const double step = std::min(o.interval, o.duration - at);
        const auto t0 = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(step));
        const uint64_t now = ops_now();
        const double secs = since(t0);
        std::fprintf(stderr, "%s: %6.1f-%6.1f s: %10.0f ops/s\n", what.c_str(),
                     at, at + step, secs > 0 ? double(now - last) / secs : 0.0);
        last = now;
        at += step;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(o.duration));
    }
    sh.phase = kStop;
    res_p.seconds = since(m0);
    auto cpu1 = (*server)->CpuSeconds();
    if (cpu0.ok() && cpu1.ok()) res_p.server_cpu_s = *cpu1 - *cpu0;
    // Every thread drains its window before the next point's warm-up.
    while (sh.finished.load() < o.threads * int(p + 1)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& c : clients) {
      RunResult& r = c->result(p);
      if (res_p.error.empty()) res_p.error = r.error;
      res_p.ops += r.ops;
      res_p.requests += r.requests;
      res_p.latency_ns.Merge(r.latency_ns);
      res_p.read_ns.Merge(r.read_ns);
      res_p.write_ns.Merge(r.write_ns);
      res_p.reads += r.reads, res_p.updates += r.updates;
      res_p.inserts += r.inserts, res_p.rmws += r.rmws;
      res_p.scans += r.scans, res_p.scanned += r.scanned;
      res_p.checked += r.checked, res_p.wrong += r.wrong;
      res_p.missing += r.missing;
      if (r.read_path) {
        if (!res_p.read_path) res_p.read_path = ReadPathCounts{};
        res_p.read_path->onesided_gets += r.read_path->onesided_gets;
        res_p.read_path->rpc_gets += r.read_path->rpc_gets;
        res_p.read_path->retries += r.read_path->retries;
        res_p.read_path->fallbacks += r.read_path->fallbacks;
      }
    }
  }
  finish();
  return res;
}

double OpsPerSec(const RunResult& r) {
  return r.seconds > 0 ? double(r.ops) / r.seconds : 0;
}

std::string Fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

// Retries and fallbacks per one-sided get, in percent; "-" for others.
std::string RateOf(const RunResult& r, bool fallbacks) {
  if (!r.read_path) return "-";
  const auto& p = *r.read_path;
  const uint64_t gets = p.onesided_gets + p.rpc_gets;
  if (gets == 0) return "0";
  return Fmt("%.3f", 100.0 * double(fallbacks ? p.fallbacks : p.retries) /
                         double(gets));
}

// The peers whose throughput the ratio columns divide by.
constexpr const char* kPeers[] = {"redis", "memcached"};

// `system`'s successful run of the same workload, value size, depth and
// batch as `like`.
const RunResult* Find(const std::vector<RunResult>& rs, const RunResult& like,
                      const std::string& system) {
  for (const auto& r : rs) {
    if (r.system == system && r.workload == like.workload &&
        r.value_size == like.value_size && r.depth == like.depth &&
        r.batch == like.batch && r.error.empty()) {
      return &r;
    }
  }
  return nullptr;
}

// ops/s over `of`'s; nullopt if `of` is missing or measured nothing.
std::optional<double> RatioTo(double ops_per_s, const RunResult* of) {
  if (of == nullptr || OpsPerSec(*of) <= 0) return std::nullopt;
  return ops_per_s / OpsPerSec(*of);
}

std::string RatioText(std::optional<double> x) {
  return x ? Fmt("%.2f", *x) : "-";
}

std::string RatioJson(std::optional<double> x) {
  return x ? Fmt("%.4f", *x) : "null";
}

std::string CpuPerOp(const RunResult& r) {
  if (r.server_cpu_s < 0 || r.ops == 0) return "n/a";
  return Fmt("%.3f", r.server_cpu_s * 1e6 / double(r.ops));
}

// The runs of one (workload, value size): each system's points, as the
// curve's samples (samples[i] is *runs[i]).
struct Group {
  char workload = 'C';
  size_t value_size = 0;
  std::vector<std::string> systems;  // in the order they ran
  std::vector<const RunResult*> runs;
  std::vector<CurveSample> samples;

  const RunResult* Best(const std::string& system) const {
    auto i = BestSample(samples, system);
    return i ? runs[*i] : nullptr;
  }
  const RunResult* At(const std::string& system, CurvePoint p) const {
    auto i = SampleAt(samples, system, p);
    return i ? runs[*i] : nullptr;
  }
};

std::vector<Group> GroupRuns(const std::vector<RunResult>& rs) {
  std::vector<Group> groups;
  for (const RunResult& r : rs) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.workload == r.workload && g.value_size == r.value_size;
    });
    if (g == groups.end()) {
      groups.push_back(Group{r.workload, r.value_size, {}, {}, {}});
      g = groups.end() - 1;
    }
    if (std::find(g->systems.begin(), g->systems.end(), r.system) ==
        g->systems.end()) {
      g->systems.push_back(r.system);
    }
    g->runs.push_back(&r);
    g->samples.push_back(CurveSample{
        r.system, {r.depth, r.batch}, OpsPerSec(r), r.error.empty()});
  }
  return groups;
}

constexpr CurvePoint kLatencyPoint{1, 1};

void PrintTable(const std::vector<RunResult>& rs, bool ratios) {
  std::printf(
      "%-20s %2s %-8s %6s %3s %5s %5s %12s %9s %9s %9s %10s %7s %7s %7s %7s",
      "system", "wl", "dist", "value", "thr", "depth", "batch", "ops/s",
      "p50_us", "p99_us", "p999_us", "srv_us/op", "wrong", "missing", "retry%",
      "fallbk%");
  if (ratios) std::printf(" %8s %8s", "x_redis", "x_memc");
  std::printf("\n");
  for (const auto& r : rs) {
    if (!r.error.empty()) {
      std::printf("%-20s %2c %-8s %6zu %3d %5d %5d FAILED: %s\n",
                  r.system.c_str(), r.workload,
                  std::string(ycsb::DistributionName(r.distribution)).c_str(),
                  r.value_size, r.threads, r.depth, r.batch, r.error.c_str());
      continue;
    }
    const Histogram& h = r.latency_ns;
    std::printf(
        "%-20s %2c %-8s %6zu %3d %5d %5d %12.0f %9.2f %9.2f %9.2f %10s %7llu "
        "%7llu %7s %7s",
        r.system.c_str(), r.workload,
        std::string(ycsb::DistributionName(r.distribution)).c_str(),
        r.value_size, r.threads, r.depth, r.batch, OpsPerSec(r),
        double(h.Percentile(50)) / 1e3, double(h.Percentile(99)) / 1e3,
        double(h.Percentile(99.9)) / 1e3, CpuPerOp(r).c_str(),
        static_cast<unsigned long long>(r.wrong),
        static_cast<unsigned long long>(r.missing), RateOf(r, false).c_str(),
        RateOf(r, true).c_str());
    if (ratios) {
      for (const char* peer : kPeers) {
        std::printf(
            " %8s",
            RatioText(RatioTo(OpsPerSec(r), Find(rs, r, peer))).c_str());
      }
    }
    std::printf("\n");
  }
}

// With several points: each system at its best point (the headline: best
// over best), then at depth 1 batch 1 (the latency comparison).
void PrintSummary(const std::vector<RunResult>& rs, bool ratios) {
  for (const Group& g : GroupRuns(rs)) {
    std::printf(
        "\nYCSB-%c, %zu B values, each system at its best (the point with "
        "the most ops/s)%s:\n",
        g.workload, g.value_size,
        ratios ? "; x_: its best over the peer's best" : "");
    std::printf("%-20s %5s %5s %12s %9s %9s %9s %10s", "system", "depth",
                "batch", "ops/s", "p50_us", "p99_us", "p999_us", "srv_us/op");
    if (ratios) std::printf(" %8s %8s", "x_redis", "x_memc");
    std::printf("\n");
    auto row = [&](const std::string& system, const RunResult* r) {
      if (r == nullptr) {
        std::printf("%-20s no successful run\n", system.c_str());
        return false;
      }
      const Histogram& h = r->latency_ns;
      std::printf("%-20s %5d %5d %12.0f %9.2f %9.2f %9.2f %10s", system.c_str(),
                  r->depth, r->batch, OpsPerSec(*r),
                  double(h.Percentile(50)) / 1e3,
                  double(h.Percentile(99)) / 1e3,
                  double(h.Percentile(99.9)) / 1e3, CpuPerOp(*r).c_str());
      return true;
    };
    for (const std::string& s : g.systems) {
      if (!row(s, g.Best(s))) continue;
      if (ratios) {
        for (const char* peer : kPeers) {
          std::printf(" %8s", RatioText(BestRatio(g.samples, s, peer)).c_str());
        }
      }
      std::printf("\n");
    }
    if (!std::any_of(
            g.samples.begin(), g.samples.end(),
            [](const CurveSample& c) { return c.point == kLatencyPoint; })) {
      continue;
    }
    std::printf(
        "and at depth 1, batch 1 (latency)%s:\n",
        ratios ? "; x_: ops/s over the peer's at depth 1, batch 1" : "");
    for (const std::string& s : g.systems) {
      const RunResult* r = g.At(s, kLatencyPoint);
      if (!row(s, r)) continue;
      if (ratios) {
        for (const char* peer : kPeers) {
          std::printf(" %8s", RatioText(RatioTo(OpsPerSec(*r),
                                                g.At(peer, kLatencyPoint)))
                                  .c_str());
        }
      }
      std::printf("\n");
    }
  }
}

std::string JsonEscape(const std::string& s) {
  std::string e;
  for (char c : s) {
    if (c == '"' || c == '\\') e += '\\';
    e += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return e;
}

// A summary entry: the run's point and figures, and ratios to the peers.
void PrintJsonPoint(const std::string& system, const Group& g,
                    const RunResult& r, const std::optional<double> (&x)[2]) {
  std::printf(
      "{\"system\":\"%s\",\"workload\":\"%c\",\"value_size\":%zu,"
      "\"depth\":%d,\"batch\":%d,\"ops_per_s\":%.1f,\"p50_ns\":%llu,"
      "\"p99_ns\":%llu,\"p999_ns\":%llu,\"server_cpu_s\":%.4f,"
      "\"x_redis\":%s,\"x_memcached\":%s}",
      JsonEscape(system).c_str(), g.workload, g.value_size, r.depth, r.batch,
      OpsPerSec(r),
      static_cast<unsigned long long>(r.latency_ns.Percentile(50)),
      static_cast<unsigned long long>(r.latency_ns.Percentile(99)),
      static_cast<unsigned long long>(r.latency_ns.Percentile(99.9)),
      r.server_cpu_s, RatioJson(x[0]).c_str(), RatioJson(x[1]).c_str());
}

void PrintJson(const std::vector<RunResult>& rs, bool ratios, bool summary) {
  std::printf("{\"benchmark\":\"ycsb\",\"results\":[");
  for (size_t i = 0; i < rs.size(); ++i) {
    const RunResult& r = rs[i];
    auto pct = [](const Histogram& h, double p) {
      return static_cast<unsigned long long>(h.Percentile(p));
    };
    std::printf(
        "%s{\"system\":\"%s\",\"workload\":\"%c\",\"distribution\":\"%s\","
        "\"key_size\":%zu,\"value_size\":%zu,\"threads\":%d,\"depth\":%d,"
        "\"batch\":%d,\"load_seconds\":%.3f,\"seconds\":%.3f,\"ops\":%llu,"
        "\"requests\":%llu,\"ops_per_s\":%.1f,\"p50_ns\":%llu,\"p99_ns\":%llu,"
        "\"p999_ns\":%llu,\"read_p99_ns\":%llu,\"write_p99_ns\":%llu,"
        "\"reads\":%llu,\"updates\":%llu,\"inserts\":%llu,\"rmws\":%llu,"
        "\"scans\":%llu,\"scanned\":%llu,"
        "\"checked\":%llu,\"wrong\":%llu,\"missing\":%llu,"
        "\"server_cpu_s\":%.4f",
        i ? "," : "", JsonEscape(r.system).c_str(), r.workload,
        std::string(ycsb::DistributionName(r.distribution)).c_str(), r.key_size,
        r.value_size, r.threads, r.depth, r.batch, r.load_seconds, r.seconds,
        static_cast<unsigned long long>(r.ops),
        static_cast<unsigned long long>(r.requests), OpsPerSec(r),
        pct(r.latency_ns, 50), pct(r.latency_ns, 99), pct(r.latency_ns, 99.9),
        pct(r.read_ns, 99), pct(r.write_ns, 99),
        static_cast<unsigned long long>(r.reads),
        static_cast<unsigned long long>(r.updates),
        static_cast<unsigned long long>(r.inserts),
        static_cast<unsigned long long>(r.rmws),
        static_cast<unsigned long long>(r.scans),
        static_cast<unsigned long long>(r.scanned),
        static_cast<unsigned long long>(r.checked),
        static_cast<unsigned long long>(r.wrong),
        static_cast<unsigned long long>(r.missing), r.server_cpu_s);
    if (r.read_path) {
      std::printf(
          ",\"onesided_gets\":%llu,\"rpc_gets\":%llu,\"retries\":%llu,"
          "\"fallbacks\":%llu",
          static_cast<unsigned long long>(r.read_path->onesided_gets),
          static_cast<unsigned long long>(r.read_path->rpc_gets),
          static_cast<unsigned long long>(r.read_path->retries),
          static_cast<unsigned long long>(r.read_path->fallbacks));
    }
    if (ratios && r.error.empty()) {
      std::printf(
          ",\"x_redis\":%s,\"x_memcached\":%s",
          RatioJson(RatioTo(OpsPerSec(r), Find(rs, r, kPeers[0]))).c_str(),
          RatioJson(RatioTo(OpsPerSec(r), Find(rs, r, kPeers[1]))).c_str());
    }
    if (!r.error.empty()) {
      std::printf(",\"error\":\"%s\"", JsonEscape(r.error).c_str());
    }
    std::printf("}");
  }
  std::printf("]");
  if (summary) {
    // "best": each system at its best point, x_ its best over the peer's
    // best; "depth1_batch1": the latency comparison, x_ at that point.
    const auto groups = GroupRuns(rs);
    const char* sep = "";
    std::printf(",\"best\":[");
    for (const Group& g : groups) {
      for (const std::string& s : g.systems) {
        const RunResult* b = g.Best(s);
        if (b == nullptr) continue;
        std::optional<double> x[2];
        for (int k = 0; k < 2 && ratios; ++k) {
          x[k] = BestRatio(g.samples, s, kPeers[k]);
        }
        std::printf("%s", sep);
        PrintJsonPoint(s, g, *b, x);
        sep = ",";
      }
    }
    sep = "";
    std::printf("],\"depth1_batch1\":[");
    for (const Group& g : groups) {
      for (const std::string& s : g.systems) {
        const RunResult* r = g.At(s, kLatencyPoint);
        if (r == nullptr) continue;
        std::optional<double> x[2];
        for (int k = 0; k < 2 && ratios; ++k) {
          x[k] = RatioTo(OpsPerSec(*r), g.At(kPeers[k], kLatencyPoint));
        }
        std::printf("%s", sep);
        PrintJsonPoint(s, g, *r, x);
        sep = ",";
      }
    }
    std::printf("]");
  }
  std::printf("}\n");
}

// Pilaf's figures 10 (throughput vs value size) and 11 (latency CDF), and
// with several points the curve (throughput vs keys in flight, one line per
// system and batch): .dat files and plots.gp; runs gnuplot if installed.
// With several points, the value-size plot takes each system's best point
// and the CDF its depth 1 batch 1 run (else its first point).
// The curve of one (workload, value size): curve_<wl>.dat holds a block per
// (system, batch), the depths in order, and `gp` plots each block as a line
// of throughput against keys in flight (depth x batch).
void WriteCurve(const std::string& dir, const Group& g, std::ostream* gp) {
  const std::string name = "curve_" + std::string(1, g.workload);
  std::ofstream dat(dir + "/" + name + ".dat");
  dat << "# YCSB-" << g.workload << ", " << g.value_size
      << " B values: a block per system and batch (gnuplot index)\n";
  std::vector<std::string> titles;
  for (const std::string& s : g.systems) {
    std::vector<int> batches;
    for (const CurveSample& c : g.samples) {
      if (c.system == s && c.ok &&
          std::find(batches.begin(), batches.end(), c.point.batch) ==
              batches.end()) {
        batches.push_back(c.point.batch);
      }
    }
    for (int b : batches) {
      dat << (titles.empty() ? "" : "\n\n") << "# " << s << ", batch " << b
          << "\n# in_flight depth batch ops_per_s p99_us\n";
      for (size_t i = 0; i < g.samples.size(); ++i) {
        const CurveSample& c = g.samples[i];
        if (c.system != s || !c.ok || c.point.batch != b) continue;
        dat << c.point.in_flight() << " " << c.point.depth << " " << b << " "
            << c.ops_per_s << " "
            << double(g.runs[i]->latency_ns.Percentile(99)) / 1e3 << "\n";
      }
      titles.push_back(s + ", batch " + std::to_string(b));
    }
  }
  if (titles.empty()) return;  // nothing ran: gnuplot rejects an empty plot
  *gp << "\nset output '" << name << ".svg'\n"
      << "set title 'YCSB-" << g.workload << ", " << g.value_size
      << " B values: throughput vs keys in flight (depth x batch)'\n"
      << "set xlabel 'keys in flight per client thread (depth x batch)'\n"
      << "set ylabel 'operations/s'\n"
      << "set logscale x 2\nset logscale y 10\nset key left top\nplot ";
  for (size_t i = 0; i < titles.size(); ++i) {
    *gp << (i ? ", " : "") << "'" << name << ".dat' index " << i
        << " using 1:4 with linespoints title '" << titles[i] << "'";
  }
  *gp << "\n";
}

Status WritePlots(const std::string& dir, const YcsbOptions& o,
                  const std::vector<CurvePoint>& points,
                  const std::vector<RunResult>& rs) {
  mkdir(dir.c_str(), 0755);
  std::ofstream gp(dir + "/plots.gp");
  if (!gp) return Status::IOError("cannot write " + dir + "/plots.gp");
  gp << "# remem-bench compare: throughput vs value size, latency CDFs"
     << (points.size() > 1 ? " and throughput vs keys in flight" : "") << ".\n"
     << "set terminal svg size 800,500 dynamic noenhanced\n"
     << "set grid\nset key left top\n";
  const auto groups = GroupRuns(rs);
  auto group = [&](char wl, size_t v) -> const Group* {
    for (const Group& g : groups) {
      if (g.workload == wl && g.value_size == v) return &g;
    }
    return nullptr;
  };
  const CurvePoint cdf_point =
      std::find(points.begin(), points.end(), kLatencyPoint) != points.end()
          ? kLatencyPoint
          : points[0];
  for (const auto& wname : o.workloads) {
    const char wl = char(std::toupper(static_cast<unsigned char>(wname[0])));
    // Throughput vs value size: one file, a column per system.
    const std::string tp = "throughput_" + std::string(1, wl);
    std::ofstream dat(dir + "/" + tp + ".dat");
    dat << "# value_size";
    for (const auto& s : o.systems) dat << " " << s;
    dat << "  (ops/s; YCSB-" << wl << ")\n";
    for (size_t v : o.value_sizes) {
      dat << v;
      const Group* g = group(wl, v);
      for (const auto& s : o.systems) {
        const RunResult* best = g ? g->Best(s) : nullptr;
        dat << " " << (best ? OpsPerSec(*best) : 0.0);
      }
      dat << "\n";
    }
    gp << "\nset output '" << tp << ".svg'\n"
       << "set title 'YCSB-" << wl << ": throughput vs value size"
       << (points.size() > 1 ? " (each system at its best point)" : "") << "'\n"
       << "set xlabel 'value size (bytes)'\nset ylabel 'operations/s'\n"
       << "set logscale x 2\nset logscale y 10\nplot ";
    for (size_t i = 0; i < o.systems.size(); ++i) {
      gp << (i ? ", " : "") << "'" << tp << ".dat' using 1:" << (i + 2)
         << " with linespoints title '" << o.systems[i] << "'";
    }
    gp << "\n";
    // Latency CDF at the first value size.
    const std::string cdf = "cdf_" + std::string(1, wl);
    std::vector<std::string> plotted;
    const Group* first = group(wl, o.value_sizes[0]);
    for (const auto& s : o.systems) {
      if (const RunResult* run = first ? first->At(s, cdf_point) : nullptr) {
        const RunResult& r = *run;
        std::ofstream c(dir + "/" + cdf + "_" + s + ".dat");
        c << "# latency_us fraction  (" << s << ", YCSB-" << wl << ", "
          << r.value_size << " B values)\n";
        for (double p = 0; p < 99.99; p += (p < 90 ? 1 : p < 99 ? 0.1 : 0.01)) {
          c << double(r.latency_ns.Percentile(p)) / 1e3 << " " << p / 100
            << "\n";
        }
        c << double(r.latency_ns.Percentile(99.99)) / 1e3 << " 0.9999\n";
        c << double(r.latency_ns.max()) / 1e3 << " 1\n";
        plotted.push_back(s);
      }
    }
    gp << "\nset output '" << cdf << ".svg'\n"
       << "set title 'YCSB-" << wl << ": latency CDF (" << o.value_sizes[0]
       << " B values, depth " << cdf_point.depth << ", batch "
       << cdf_point.batch << ")'\n"
       << "set xlabel 'latency (us)'\nset ylabel 'fraction of requests'\n"
       << "set logscale x 10\nunset logscale y\nset key right bottom\nplot ";
    for (size_t i = 0; i < plotted.size(); ++i) {
      gp << (i ? ", " : "") << "'" << cdf << "_" << plotted[i]
         << ".dat' using 1:2 with lines title '" << plotted[i] << "'";
    }
    gp << "\nset key left top\n";
    if (points.size() > 1 && first != nullptr) {
      WriteCurve(dir, *first, &gp);
    }
  }
  gp.close();
  auto gnuplot = FindProgram("gnuplot", "gnuplot-nox");
  if (!gnuplot.ok()) {
    std::fprintf(stderr,
                 "remem-bench: wrote %s/*.dat and plots.gp; %s, then run: cd "
                 "%s && gnuplot plots.gp\n",
                 dir.c_str(), gnuplot.status().message().c_str(), dir.c_str());
    return Status::OK();
  }
  SpawnOptions so;
  so.argv = {"/bin/sh", "-c",
             "cd '" + dir + "' && '" + *gnuplot + "' plots.gp"};
  so.merge_stderr = true;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return p.status();
  (void)(*p)->ReadToEnd(std::chrono::seconds(60));
  auto rc = (*p)->Wait(std::chrono::seconds(60));
  if (!rc.ok() || *rc != 0) {
    return Status::Internal("gnuplot failed: " + (*p)->output());
  }
  std::fprintf(stderr, "remem-bench: plots in %s (*.svg, from plots.gp)\n",
               dir.c_str());
  return Status::OK();
}

}  // namespace

int RunYcsb(const YcsbOptions& options) {
  // The options with each system under the name it runs as.
  YcsbOptions o = options;
  std::vector<ycsb::Workload> workloads;
  for (const auto& name : o.workloads) {
    auto w = ycsb::WorkloadByName(name);
    if (!w.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n", w.status().ToString().c_str());
      return 2;
    }
    for (const ycsb::Workload& earlier : workloads) {
      if (earlier.name == w->name) {
        std::fprintf(stderr, "remem-bench: workload %c is named twice\n",
                     w->name);
        return 2;
      }
    }
    workloads.push_back(*w);
  }
  std::vector<SystemSpec> systems;
  for (auto& name : o.systems) {
    if (name == "remem" && o.transport) {
      name += "-" + std::string(TransportName(*o.transport));
    }
    auto s = ParseSystem(name);
    if (!s.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n", s.status().ToString().c_str());
      return 2;
    }
    for (const SystemSpec& earlier : systems) {
      if (earlier.name == s->name) {
        std::fprintf(stderr, "remem-bench: system %s is named twice\n",
                     s->name.c_str());
        return 2;
      }
    }
    systems.push_back(*s);
  }
  const std::vector<CurvePoint> points = ExpandPoints(o.depths, o.batches);
  if (points.empty()) {
    std::fprintf(stderr, "remem-bench: no depth or no batch to run\n");
    return 2;
  }
  if (o.key_size < 8 || o.key_size > 1024) {
    std::fprintf(stderr, "remem-bench: --key-size must be in [8, 1024]\n");
    return 2;
  }
  if (o.records + 100'000'000ull > ycsb::KeyCapacity(o.key_size)) {
    std::fprintf(stderr,
                 "remem-bench: %zu-byte keys cannot name %llu records (and "
                 "inserts); use longer keys\n",
                 o.key_size, static_cast<unsigned long long>(o.records));
    return 2;
  }
  // The plots' directory is made and tried now, not after a run that may
  // take hours.
  if (!o.plot_dir.empty()) {
    mkdir(o.plot_dir.c_str(), 0755);
    const std::string probe = o.plot_dir + "/plots.gp";
    std::ofstream gp(probe, std::ios::app);
    if (!gp) {
      std::fprintf(stderr, "remem-bench: --plot %s: cannot write %s\n",
                   o.plot_dir.c_str(), probe.c_str());
      return 2;
    }
  }
  std::vector<RunResult> results;
  bool failed = false;
  for (size_t v : o.value_sizes) {
    for (const auto& w : workloads) {
      for (const auto& s : systems) {
        if (w.ordered() && (s.kind == SystemSpec::Kind::kMemcached ||
                            s.kind == SystemSpec::Kind::kRememResp)) {
          // Not a failure: the system has no such operation.
          std::fprintf(stderr,
                       "== %s YCSB-%c: skipped (%s, so it has no scans)\n",
                       s.name.c_str(), w.name,
                       s.kind == SystemSpec::Kind::kMemcached
                           ? "memcached keeps no key order"
                           : "remem's Redis front door has no sorted sets");
          continue;
        }
        if (!o.json) {
          std::fprintf(stderr, "== %s YCSB-%c, %zu B keys, %zu B values\n",
                       s.name.c_str(), w.name, o.key_size, v);
        }
        for (RunResult& r : RunSystem(o, points, s, w, v)) {
          if (!r.error.empty()) {
            std::fprintf(
                stderr, "remem-bench: %s YCSB-%c depth %d batch %d: %s\n",
                s.name.c_str(), w.name, r.depth, r.batch, r.error.c_str());
            failed = true;
          } else if (r.wrong > 0) {
            std::fprintf(stderr,
                         "remem-bench: %s YCSB-%c depth %d batch %d: %llu of "
                         "%llu values read were wrong\n",
                         s.name.c_str(), w.name, r.depth, r.batch,
                         static_cast<unsigned long long>(r.wrong),
                         static_cast<unsigned long long>(r.checked));
            failed = true;
          }
          results.push_back(std::move(r));
        }
      }
    }
  }
  if (o.json) {
    PrintJson(results, o.compare, points.size() > 1);
  } else {
    PrintTable(results, o.compare);
    if (points.size() > 1) PrintSummary(results, o.compare);
    std::printf(
        "ops/s counts YCSB operations (a batch of N reads is N, a scan is "
        "one); latencies are per request; srv_us/op is server CPU time per "
        "operation; retry%%/fallbk%% are per remem get (or scan page).\n");
    // An existing server's own --shm-dir decides (stat shm_page_bytes).
    const bool started_shm =
        o.remem_address.empty() && o.remem_cluster.empty() &&
        std::any_of(results.begin(), results.end(), [](const RunResult& r) {
          return r.system.rfind("remem", 0) == 0 &&
                 r.system.find("-tcp") == std::string::npos;
        });
    if (started_shm) {
      const fabric::ShmPages pages = fabric::ShmPagesOf(ServerShmDir());
      std::printf(
          "remem's started servers back shared memory with %s pages: %s\n",
          FormatSize(pages.page_bytes).c_str(), pages.mount.c_str());
    }
    for (const RunResult& r : results) {
      if (r.scans == 0) continue;
      // remem's reads by path: with scans in flight over shared memory,
      // auto sends some by RPC to give the server's core a share.
      std::string paths;
      if (r.read_path) {
        const uint64_t reads =
            r.read_path->onesided_gets + r.read_path->rpc_gets;
        if (reads > 0) {
          paths = fmt::format(
              ", {:.0f}% of reads by RPC",
              100.0 * double(r.read_path->rpc_gets) / double(reads));
        }
      }
      std::printf(
          "%s YCSB-%c depth %d batch %d: %llu scans returned %.1f "
          "items each on average (%.0f items/s)%s\n",
          r.system.c_str(), r.workload, r.depth, r.batch,
          static_cast<unsigned long long>(r.scans),
          double(r.scanned) / double(r.scans),
          r.seconds > 0 ? double(r.scanned) / r.seconds : 0.0, paths.c_str());
    }
    for (const auto& s : systems) {
      if (s.kind == SystemSpec::Kind::kRemem && o.threads > 1 &&
          o.client_cpu >= 0) {
        std::printf(
            "note: %s's client threads busy-poll while they wait; %d of them "
            "sharing CPU %d mostly wait for each other's time slices.\n",
            s.name.c_str(), o.threads, o.client_cpu);
      }
    }
  }
  if (!o.plot_dir.empty()) {
    if (Status st = WritePlots(o.plot_dir, o, points, results); !st.ok()) {
      std::fprintf(stderr, "remem-bench: plots: %s\n", st.ToString().c_str());
      failed = true;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace remem::bench
