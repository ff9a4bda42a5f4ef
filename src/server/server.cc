#include "server/server.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fabric/endpoint.h"
#include "fabric/listener.h"
#include "fabric/memory_region.h"
#include "fabric/worker.h"
#include "hash/slab.h"
#include "hash/table.h"
#include "proto/codec.h"
#include "util/log.h"
#include "xxhash.h"

namespace remem::server {

using fabric::AmMessage;
using fabric::Clock;
using proto::Opcode;

uint64_t PhysicalMemory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

uint64_t DefaultMemory() {
  return (PhysicalMemory() / 4) & ~((1ull << 20) - 1);
}

namespace {

// Counters of one server thread; read by Snapshot() from any thread.
struct Counters {
  std::atomic<uint64_t> connections_current{0};
  std::atomic<uint64_t> connections_total{0};
  std::atomic<uint64_t> auth_failures{0};
  std::atomic<uint64_t> rpcs_served{0};
  std::atomic<uint64_t> rpc_bytes_in{0};
  std::atomic<uint64_t> rpc_bytes_out{0};
  std::atomic<uint64_t> rpc_errors{0};
  // Of the partition this thread owns (written by this thread only).
  std::atomic<uint64_t> hash_pairs{0};
  std::atomic<uint64_t> hash_growths{0};
  std::atomic<uint64_t> hash_bytes_used{0};
  std::atomic<uint64_t> mem_requests_served{0};
  void Add(std::atomic<uint64_t>& c, uint64_t n) {
    c.fetch_add(n, std::memory_order_relaxed);
  }
};

struct Connection {
  std::unique_ptr<fabric::Endpoint> ep;
  uint64_t id = 0;
  bool authenticated = false;
  bool closing = false;
};

// The copies of served reads and writes. Like a NIC's DMA, they race by
// design with the partition owner's writes to a hash region (and with other
// connections' served writes): readers verify what they read (checksums,
// versions) and retry. tests/tsan.supp names these two functions, so keep
// them out of line and keep their names.
[[gnu::noinline]] void ServedCopyFromRegion(void* dst, const uint8_t* src,
                                            size_t len) {
  std::memcpy(dst, src, len);
}
[[gnu::noinline]] void ServedCopyToRegion(uint8_t* dst, const void* src,
                                          size_t len) {
  std::memcpy(dst, src, len);
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

struct Server::Impl {
  struct Thread {
    int index = 0;
    // Declared before the worker so they outlive it: the worker's
    // destructor may still progress, running handlers that look them up.
    std::unordered_map<ucp_ep_h, std::unique_ptr<Connection>> conns;
    std::unique_ptr<fabric::Worker> worker;
    Counters counters;
    std::thread thread;
  };

  // A hash store partition: its own region, allocator and table, written
  // only by the thread of the same index.
  struct Partition {
    fabric::LocalRegion* region = nullptr;
    std::unique_ptr<hash::SlabAllocator> slab;
    std::unique_ptr<hash::Table> table;
    // Null without persistence. Declared after the table: destroyed
    // (flushing its log) before it.
    std::unique_ptr<durability::PartitionStore> store;
  };

  // An exported region as a served memory request names it.
  struct ServedRegion {
    fabric::LocalRegion* region = nullptr;
    bool hash = false;  // hash store: served reads only
  };

  ServerConfig config;
  std::shared_ptr<fabric::Context> ctx;
  std::vector<std::unique_ptr<fabric::LocalRegion>> regions;
  // By id; built by Init, then only read (by every thread).
  std::unordered_map<uint32_t, ServedRegion> served_regions;
  std::vector<Partition> partitions;
  std::string hash_info;  // encoded once
  uint64_t partition_seed = 0;
  std::vector<std::unique_ptr<Thread>> threads;
  std::unique_ptr<fabric::Listener> listener;
  std::string address;
  std::string hello_reply;  // encoded once: regions never change
  uint64_t incarnation = 0;
  Clock::time_point started = Clock::now();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> next_conn_id{1};
  std::atomic<uint32_t> next_thread{0};
  std::vector<int> cpus;
  std::string recovery_summary;
  uint64_t recovered_pairs = 0;
  uint64_t recovered_log_records = 0;
  uint64_t recovery_ms = 0;

  Status Init();
  // Runs `reply(status)` once partition p's records so far are durable
  // (at once without persistence).
  void AfterDurable(size_t p, std::function<void(Status)> reply) {
    if (partitions[p].store) {
      partitions[p].store->AfterDurable(std::move(reply));
    } else {
      reply(Status::OK());
    }
  }
  void HandleSnapshot(Thread* t, Connection& c, uint64_t id);
  void RunThread(Thread* t);
  void OnConnRequest(ucp_conn_request_h req);
  void Accept(Thread* t, ucp_conn_request_h req);
  void Drop(Thread* t, ucp_ep_h ep);
  // The live connection `ep` names on this thread, or null.
  Connection* ConnectionOf(Thread* t, ucp_ep_h ep);
  void OnRequest(Thread* t, AmMessage&& m);
  void Reply(Thread* t, Connection& c, Opcode op, uint64_t id, Status st,
             std::string payload);
  void HandleHello(Thread* t, Connection& c, uint64_t id,
                   std::string_view payload);
  void OnMemRequest(Thread* t, AmMessage&& m);
  // Performs a decoded memory request; `value` receives an atomic's old
  // value and `out` a read's bytes.
  Status ServeMemory(const proto::MemRequest& r, const std::string& data,
                     uint64_t* value, std::string* out);
  Status InitHash(uint32_t first_region_id);
  void HandleHash(Thread* t, Connection& c, Opcode op, uint64_t id,
                  std::string payload);
  void HandleHashMulti(Thread* t, Connection& c, Opcode op, uint64_t id,
                       std::string payload);
  // After a write on partition `p` (on its owner thread): what Stats shows.
  void UpdateHashCounters(size_t p) {
    Counters& c = threads[p]->counters;
    const Partition& part = partitions[p];
    c.hash_pairs.store(part.table->size(), std::memory_order_relaxed);
    c.hash_growths.store(part.table->growths(), std::memory_order_relaxed);
    c.hash_bytes_used.store(part.slab->bytes_carved(),
                            std::memory_order_relaxed);
  }
  size_t PartitionOf(std::string_view key) const {
    return XXH3_64bits_withSeed(key.data(), key.size(), partition_seed) %
           partitions.size();
  }
  proto::StatsReply Snapshot() const;
};

Status Server::Impl::Init() {
  if (config.threads < 1 || config.threads > 256) {
    return Status::InvalidArgument("--threads must be between 1 and 256");
  }
  if (config.memory == 0) config.memory = DefaultMemory();
  const uint64_t phys = PhysicalMemory();
  if (config.memory < (1ull << 20)) {
    return Status::InvalidArgument("--memory must be at least 1 MiB");
  }
  if (phys != 0 && config.memory > phys) {
    return Status::OutOfMemory(
        "--memory " + std::to_string(config.memory) +
        " bytes is more than this machine's physical memory (" +
        std::to_string(phys) + " bytes)");
  }
  if (config.region_size < (1ull << 20)) {
    return Status::InvalidArgument("--region-size must be at least 1 MiB");
  }

  std::random_device rd;
  incarnation = (uint64_t{rd()} << 32) ^ rd() ^
                static_cast<uint64_t>(Clock::now().time_since_epoch().count());

  auto ctx_or = fabric::Context::Shared(config.transport);
  if (!ctx_or.ok()) return ctx_or.status();
  ctx = *ctx_or;

  if (config.hash_memory == 0) config.hash_memory = config.memory / 2;
  if (config.hash_memory >= config.memory) {
    return Status::InvalidArgument("--hash-memory must be less than --memory");
  }
  if (config.hash_memory / uint64_t(config.threads) < (2ull << 20)) {
    return Status::InvalidArgument(
        "the hash store needs at least 2 MiB per server thread "
        "(--hash-memory)");
  }
  uint64_t left = config.memory - config.hash_memory;
  uint32_t id = 1;
  while (left > 0) {
    uint64_t len = std::min(left, config.region_size);
    auto r = fabric::LocalRegion::Allocate(ctx, id++, len);
    if (!r.ok()) {
      return Status::OutOfMemory(
          "cannot allocate " + std::to_string(config.memory) +
          " bytes of registered memory: " + r.status().message());
    }
    regions.push_back(std::move(*r));
    left -= len;
  }
  REMEM_RETURN_IF_ERROR(InitHash(id));
  proto::HelloReplyInfo info;
  info.incarnation = incarnation;
  info.max_payload = proto::kMaxRpcPayload;
  info.server_threads = static_cast<uint32_t>(config.threads);
  for (const auto& r : regions) {
    info.regions.push_back({r->id(), reinterpret_cast<uint64_t>(r->base()),
                            r->length(), r->packed_rkey()});
    served_regions[r->id()] = {r.get(), false};
  }
  for (const Partition& p : partitions) {
    served_regions[p.region->id()].hash = true;
  }
  hello_reply = proto::EncodeHelloReply(info);

  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }

  for (int i = 0; i < config.threads; ++i) {
    auto t = std::make_unique<Thread>();
    t->index = i;
    auto w = fabric::Worker::Create(ctx, proto::kMaxRpcPayload);
    if (!w.ok()) return w.status();
    t->worker = std::move(*w);
    Thread* raw = t.get();
    REMEM_RETURN_IF_ERROR(t->worker->SetAmHandler(
        proto::kAmRequest,
        [this, raw](AmMessage&& m) { OnRequest(raw, std::move(m)); }));
    REMEM_RETURN_IF_ERROR(t->worker->SetAmHandler(
        proto::kAmMemRequest,
        [this, raw](AmMessage&& m) { OnMemRequest(raw, std::move(m)); }));
    if (durability::PartitionStore* store = partitions[size_t(i)].store.get()) {
      t->worker->SetPassHook([store] { return store->OnPass(); });
    }
    threads.push_back(std::move(t));
  }
  for (size_t p = 0; p < partitions.size(); ++p) UpdateHashCounters(p);
  auto l = fabric::Listener::Create(
      threads[0]->worker.get(), config.listen,
      [this](ucp_conn_request_h req) { OnConnRequest(req); });
  if (!l.ok()) return l.status();
  listener = std::move(*l);
  address = listener->address();

  for (auto& t : threads) {
    Thread* raw = t.get();
    t->thread = std::thread([this, raw] { RunThread(raw); });
  }
  return Status::OK();
}

Status Server::Impl::InitHash(uint32_t first_region_id) {
  std::random_device rd;
  partition_seed = (uint64_t{rd()} << 32) | rd();
  const bool durable = config.persistence && !config.data_dir.empty();
  if (durable) {
    // Keys must land in the same partitions as before the restart: the
    // partition seed and count live in data_dir/meta.
    const std::string meta = config.data_dir + "/meta";
    std::ifstream in(meta);
    if (in) {
      std::string magic;
      uint64_t n = 0, seed = 0;
      if (!(in >> magic >> n >> seed) || magic != "remem-data-1") {
        return Status::Corruption(meta + ": unreadable");
      }
      if (n != uint64_t(config.threads)) {
        return Status::InvalidArgument(
            config.data_dir + " holds " + std::to_string(n) +
            " partitions; start with --threads " + std::to_string(n));
      }
      partition_seed = seed;
    } else {
      const std::string tmp = meta + ".new";
      {
        std::ofstream out(tmp, std::ios::trunc);
        out << "remem-data-1 " << config.threads << " " << partition_seed
            << "\n";
        out.flush();
        if (!out) return Status::IOError("cannot write " + tmp);
      }
      if (std::rename(tmp.c_str(), meta.c_str()) != 0) {
        return Status::IOError("cannot rename " + tmp);
      }
      REMEM_RETURN_IF_ERROR(durability::SyncDir(config.data_dir));
    }
  }
  const uint64_t per = (config.hash_memory / uint64_t(config.threads)) &
                       ~uint64_t{hash::kExtentAlign - 1};
  proto::HashInfo info;
  hash::Limits limits;
  if (config.max_key_bytes < 1 || config.max_key_bytes > limits.max_key) {
    return Status::InvalidArgument("--max-key-bytes must be in [1, " +
                                   std::to_string(limits.max_key) + "]");
  }
  if (config.max_value_bytes > limits.max_value) {
    return Status::InvalidArgument("--max-value-bytes must be at most " +
                                   std::to_string(limits.max_value));
  }
  limits.max_key = config.max_key_bytes;
  limits.max_value = config.max_value_bytes;
  info.max_key = limits.max_key;
  info.max_value = limits.max_value;
  info.partition_seed = partition_seed;
  for (int i = 0; i < config.threads; ++i) {
    const uint32_t rid = first_region_id + uint32_t(i);
    if (rid > 0xffff) return Status::InvalidArgument("too many regions");
    auto r = fabric::LocalRegion::Allocate(ctx, rid, per);
    if (!r.ok()) {
      return Status::OutOfMemory("cannot allocate the hash store: " +
                                 r.status().message());
    }
    // The root in the first page; the rest is the arena for bucket arrays
    // (the table starts small and doubles as it fills) and extents.
    constexpr uint64_t kArenaStart = 4096;
    Partition p;
    p.region = r->get();
    p.slab = std::make_unique<hash::SlabAllocator>(
        p.region->base() + kArenaStart, per - kArenaStart, kArenaStart);
    hash::TableOptions options;
    options.seed = (uint64_t{rd()} << 32) | rd();
    options.initial_buckets = config.hash_initial_buckets;
    options.limits = limits;
    auto table = hash::Table::Create(p.region->base(), uint16_t(rid),
                                     p.slab.get(), options);
    if (!table.ok()) return table.status().WithContext("hash store");
    p.table = std::move(*table);
    if (config.fault_pause_mid_write_us > 0) {
      const auto pause =
          std::chrono::microseconds(config.fault_pause_mid_write_us);
      // Fault injection (tests): hold every bucket write half done.
      p.table->SetMidWriteHook([pause] { std::this_thread::sleep_for(pause); });
    }
    const hash::Geometry& g = p.table->geometry();
    info.partitions.push_back(
        {rid, 0, g.root_offset, g.buckets_offset, g.num_buckets, g.seed});
    regions.push_back(std::move(*r));
    partitions.push_back(std::move(p));
  }
  if (durable) {
    // Recover the partitions in parallel (each into its own table), before
    // any server thread runs.
    const auto start = Clock::now();
    std::vector<std::unique_ptr<durability::PartitionStore>> stores(
        partitions.size());
    std::vector<Status> errors(partitions.size());
    std::vector<durability::RecoveryReport> reports(partitions.size());
    std::vector<std::thread> workers;
    for (size_t i = 0; i < partitions.size(); ++i) {
      workers.emplace_back([&, i] {
        durability::StoreOptions so;
        so.dir = config.data_dir + "/p" + std::to_string(i);
        so.fsync = config.fsync;
        so.snapshot_log_bytes = config.snapshot_log_bytes;
        so.recovery = config.recovery;
        so.fault = config.fault_log_io;
        so.slow_snapshot_us = config.fault_slow_snapshot_us;
        auto store = durability::PartitionStore::Open(
            so, partitions[i].table.get(), &reports[i]);
        if (store.ok()) {
          stores[i] = std::move(*store);
        } else {
          errors[i] = store.status();
        }
      });
    }
    for (auto& w : workers) w.join();
    for (size_t i = 0; i < partitions.size(); ++i) {
      for (const auto& w : reports[i].warnings) log::Warn("recovery: {}", w);
      if (!errors[i].ok()) return errors[i];
      partitions[i].store = std::move(stores[i]);
      recovered_pairs += reports[i].snapshot_pairs;
      recovered_log_records += reports[i].log_records;
      // The table may have grown: hand out its current geometry.
      const hash::Geometry& g = partitions[i].table->geometry();
      info.partitions[i] = {
          g.region, 0, g.root_offset, g.buckets_offset, g.num_buckets, g.seed};
    }
    recovery_ms =
        uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                     Clock::now() - start)
                     .count());
  }
  hash_info = proto::EncodeHashInfo(info);
  if (durable) {
    recovery_summary = fmt::format(
        "recovered {} pairs from snapshots and {} log records in {} ms "
        "({}, fsync {})",
        recovered_pairs, recovered_log_records, recovery_ms, config.data_dir,
        durability::FsyncPolicyName(config.fsync));
    // remem-server prints it on stderr whatever the log level.
    log::Debug("{}", recovery_summary);
  }
  return Status::OK();
}

void Server::Impl::HandleHash(Thread* t, Connection& c, Opcode op, uint64_t id,
                              std::string payload) {
  std::string_view key;
  if (op == Opcode::kHashPut) {
    auto put = proto::DecodeHashPut(payload);
    if (!put.ok()) return Reply(t, c, op, id, put.status(), {});
    key = put->key;
  } else {
    auto k = proto::DecodeHashKey(payload);
    if (!k.ok()) return Reply(t, c, op, id, k.status(), {});
    key = *k;
  }
  if (key.empty()) {
    return Reply(t, c, op, id, Status::InvalidArgument("empty key"), {});
  }
  const size_t p =
      XXH3_64bits_withSeed(key.data(), key.size(), partition_seed) %
      partitions.size();
  // Runs on the partition's owner; the payload travels with it.
  auto work = [this, p, op, payload = std::move(payload)]() {
    hash::Table& table = *partitions[p].table;
    std::pair<Status, std::string> out;
    if (op == Opcode::kHashGet) {
      auto v = table.Get(*proto::DecodeHashKey(payload));
      if (v.ok()) {
        out.second = proto::EncodeHashGetReply(v->version, v->value);
      } else {
        out.first = v.status();
      }
    } else if (durability::PartitionStore* store = partitions[p].store.get();
               store != nullptr && !(out.first = store->Writable()).ok()) {
      // The log cannot be written: refuse before changing anything.
    } else if (op == Opcode::kHashDelete) {
      const std::string_view key = *proto::DecodeHashKey(payload);
      out.first = table.Delete(key);
      if (out.first.ok() && store) store->LogDelete(key, table.last_version());
    } else {
      auto put = *proto::DecodeHashPut(payload);
      Result<uint64_t> v =
          put.mode == proto::PutMode::kIfAbsent
              ? table.PutIfAbsent(put.key, put.value)
          : put.mode == proto::PutMode::kIfVersion
              ? table.CompareAndPut(put.key, put.value, put.expected_version)
              : table.Put(put.key, put.value);
      if (v.ok()) {
        out.second = proto::EncodeHashPutReply(*v);
        if (store) store->LogPut(put.key, put.value, *v);
      } else {
        out.first = v.status();
      }
    }
    if (op != Opcode::kHashGet) UpdateHashCounters(p);
    return out;
  };
  if (threads[p].get() == t) {
    auto out = work();
    if (op == Opcode::kHashGet || !out.first.ok()) {
      return Reply(t, c, op, id, std::move(out.first), std::move(out.second));
    }
    // The reply waits for the log (group commit at the end of the pass).
    const ucp_ep_h h = c.ep->handle();
    const uint64_t conn_id = c.id;
    return AfterDurable(p, [this, t, h, conn_id, op, id,
                            out = std::move(out.second)](Status st) mutable {
      auto it = t->conns.find(h);
      if (it == t->conns.end() || it->second->id != conn_id) return;
      Reply(t, *it->second, op, id, std::move(st), std::move(out));
    });
  }
  // Another thread owns the partition: run there, answer from here (the
  // connection's endpoint belongs to this thread). The connection may be
  // gone by then; its id tells a reused endpoint handle apart.
  const ucp_ep_h h = c.ep->handle();
  const uint64_t conn_id = c.id;
  threads[p]->worker->Post(
      [this, t, p, h, conn_id, op, id, work = std::move(work)]() mutable {
        auto result = std::make_shared<std::pair<Status, std::string>>(work());
        auto answer = [this, t, h, conn_id, op, id, result](Status st) {
          if (!st.ok()) result->first = std::move(st);
          t->worker->Post([this, t, h, conn_id, op, id, result] {
            auto it = t->conns.find(h);
            if (it == t->conns.end() || it->second->id != conn_id) return;
            Reply(t, *it->second, op, id, std::move(result->first),
                  std::move(result->second));
          });
        };
        if (op == Opcode::kHashGet || !result->first.ok()) {
          return answer(Status::OK());
        }
        AfterDurable(p, std::move(answer));
      });
}

void Server::Impl::HandleHashMulti(Thread* t, Connection& c, Opcode op,
                                   uint64_t id, std::string payload) {
  // The decoded items are views into the payload, which `batch` owns and
  // keeps alive until the reply is sent.
  struct Batch {
    std::string payload;
    std::vector<std::string_view> keys;
    std::vector<proto::KeyValue> pairs;
    std::vector<proto::MultiItem> results;
    size_t owners_pending = 0;
  };
  auto batch = std::make_shared<Batch>();
  batch->payload = std::move(payload);
  const bool get = op == Opcode::kHashMultiGet;
  if (get) {
    auto keys = proto::DecodeHashMultiGet(batch->payload);
    if (!keys.ok()) return Reply(t, c, op, id, keys.status(), {});
    batch->keys = std::move(*keys);
  } else {
    auto pairs = proto::DecodeHashMultiPut(batch->payload);
    if (!pairs.ok()) return Reply(t, c, op, id, pairs.status(), {});
    batch->pairs = std::move(*pairs);
    for (const auto& kv : batch->pairs) batch->keys.push_back(kv.first);
  }
  batch->results.resize(batch->keys.size());
  // Items grouped by the thread that owns their partition.
  std::vector<std::vector<uint32_t>> by_owner(threads.size());
  for (uint32_t i = 0; i < batch->keys.size(); ++i) {
    if (batch->keys[i].empty()) {
      batch->results[i].status = Status::InvalidArgument("empty key");
      continue;
    }
    by_owner[PartitionOf(batch->keys[i])].push_back(i);
  }
  // Each owner fills only its own items' results.
  auto work = [this, batch, get](size_t owner,
                                 const std::vector<uint32_t>& items) {
    hash::Table& table = *partitions[owner].table;
    durability::PartitionStore* store = partitions[owner].store.get();
    if (!get && store) {
      if (Status w = store->Writable(); !w.ok()) {
        for (uint32_t i : items) batch->results[i].status = w;
        return;
      }
    }
    for (uint32_t i : items) {
      proto::MultiItem& out = batch->results[i];
      if (get) {
        auto v = table.Get(batch->keys[i]);
        if (v.ok()) {
          out.version = v->version;
          out.data = std::move(v->value);
        } else {
          out.status = v.status();
        }
      } else {
        auto v = table.Put(batch->pairs[i].first, batch->pairs[i].second);
        if (v.ok()) {
          out.version = *v;
          if (store) {
            store->LogPut(batch->pairs[i].first, batch->pairs[i].second, *v);
          }
        } else {
          out.status = v.status();
        }
      }
    }
    if (!get) UpdateHashCounters(owner);
  };
  auto send = [this, t, op, id](Connection& conn, Batch& b) {
    Reply(t, conn, op, id, Status::OK(),
          proto::EncodeHashMultiReply(b.results));
  };
  for (size_t owner = 0; owner < by_owner.size(); ++owner) {
    if (!by_owner[owner].empty()) ++batch->owners_pending;
  }
  if (batch->owners_pending == 0) return send(c, *batch);
  // Each owner runs its items; once they are durable (puts) it reports to
  // this thread, which answers once all have (the connection may be gone
  // by then). Runs on this thread.
  const ucp_ep_h h = c.ep->handle();
  const uint64_t conn_id = c.id;
  auto one_done = [t, h, conn_id, batch, send] {
    if (--batch->owners_pending > 0) return;
    auto it = t->conns.find(h);
    if (it == t->conns.end() || it->second->id != conn_id) return;
    send(*it->second, *batch);
  };
  // On the owner's thread, after its items ran.
  auto owner_done = [this, t, batch, get, one_done](
                        size_t owner, std::vector<uint32_t> items) {
    auto report = [t, batch, one_done, owner_is_t = threads[owner].get() == t,
                   items = std::move(items)](Status st) {
      if (!st.ok()) {
        for (uint32_t i : items) {
          if (batch->results[i].status.ok()) batch->results[i].status = st;
        }
      }
      if (owner_is_t) return one_done();
      t->worker->Post(one_done);
    };
    if (get) return report(Status::OK());
    AfterDurable(owner, std::move(report));
  };
  for (size_t owner = 0; owner < by_owner.size(); ++owner) {
    if (by_owner[owner].empty()) continue;
    if (threads[owner].get() == t) {
      work(owner, by_owner[owner]);
      owner_done(owner, std::move(by_owner[owner]));
      continue;
    }
    threads[owner]->worker->Post(
        [owner, work, owner_done, items = std::move(by_owner[owner])] {
          work(owner, items);
          owner_done(owner, items);
        });
  }
}

void Server::Impl::RunThread(Thread* t) {
  if (config.pin_threads && !cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[static_cast<size_t>(t->index) % cpus.size()], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  t->worker->Run(stop, config.spin);
  // Close every connection so clients see the server go, not a hang.
  t->conns.clear();
  t->worker->DrainCloses(Clock::now() + std::chrono::seconds(2));
}

void Server::Impl::OnConnRequest(ucp_conn_request_h req) {
  if (stop.load()) {
    listener->Reject(req);
    return;
  }
  size_t n = next_thread.fetch_add(1) % threads.size();
  Thread* t = threads[n].get();
  t->worker->Post([this, t, req] { Accept(t, req); });
}

void Server::Impl::Accept(Thread* t, ucp_conn_request_h req) {
  if (stop.load(std::memory_order_acquire)) return;  // shutting down
  auto ep = fabric::Endpoint::Accept(t->worker.get(), req);
  if (!ep.ok()) {
    log::Warn("rejecting a connection: {}", ep.status().ToString());
    return;
  }
  auto conn = std::make_unique<Connection>();
  conn->ep = std::move(*ep);
  conn->id = next_conn_id.fetch_add(1);
  ucp_ep_h h = conn->ep->handle();
  conn->ep->SetFailureHandler([this, t, h](const Status& why) {
    log::Debug("connection closed: {}", why.ToString());
    // Not from inside the endpoint's own callback: defer the destruction.
    t->worker->Defer([this, t, h] { Drop(t, h); });
  });
  log::Debug("thread {} accepted connection {}", t->index, conn->id);
  t->conns.emplace(h, std::move(conn));
  t->counters.Add(t->counters.connections_current, 1);
  t->counters.Add(t->counters.connections_total, 1);
}

void Server::Impl::Drop(Thread* t, ucp_ep_h ep) {
  if (t->conns.erase(ep) > 0) {
    t->counters.connections_current.fetch_sub(1, std::memory_order_relaxed);
  }
}

void Server::Impl::Reply(Thread* t, Connection& c, Opcode op, uint64_t id,
                         Status st, std::string payload) {
  if (!st.ok()) {
    payload = st.message();
    t->counters.Add(t->counters.rpc_errors, 1);
  }
  proto::RpcHeader h =
      proto::MakeHeader(op, id, payload.size(), /*reply=*/true, st.code());
  t->counters.Add(t->counters.rpc_bytes_out, payload.size());
  c.ep->SendAm(proto::kAmReply, &h, sizeof(h), std::move(payload), nullptr);
}

Connection* Server::Impl::ConnectionOf(Thread* t, ucp_ep_h ep) {
  auto it = t->conns.find(ep);
  if (it == t->conns.end()) {
    // A message from an endpoint this thread does not own (or one already
    // dropped): nothing to answer on.
    t->counters.Add(t->counters.rpc_errors, 1);
    return nullptr;
  }
  return it->second->closing ? nullptr : it->second.get();
}

void Server::Impl::OnRequest(Thread* t, AmMessage&& m) {
  Connection* conn = ConnectionOf(t, m.reply_ep);
  if (conn == nullptr) return;
  Connection& c = *conn;
  const size_t data_len = m.refused_length ? m.refused_length : m.data.size();
  t->counters.Add(t->counters.rpc_bytes_in, data_len + m.header.size());
  // The request id, if the header is long enough to hold one, so that even a
  // malformed request's call fails with the reason instead of timing out.
  constexpr size_t kIdEnd = offsetof(proto::RpcHeader, request_id) + 8;
  uint64_t raw_id = 0;
  if (m.header.size() >= kIdEnd) {
    std::memcpy(&raw_id, m.header.data() + kIdEnd - 8, sizeof(raw_id));
  }
  if (m.refused_length) {
    // Refused before the data was fetched.
    if (m.header.size() < kIdEnd) {
      t->counters.Add(t->counters.rpc_errors, 1);
      return;
    }
    return Reply(t, c, Opcode::kError, raw_id,
                 Status::InvalidArgument(
                     "request payload of " + std::to_string(m.refused_length) +
                     " bytes exceeds the server's limit of " +
                     std::to_string(proto::kMaxRpcPayload)),
                 {});
  }
  auto h = proto::DecodeHeader(m.header.data(), m.header.size(), data_len);
  if (!h.ok()) {
    if (m.header.size() >= kIdEnd) {
      Reply(t, c, Opcode::kError, raw_id, h.status(), {});
    } else {
      t->counters.Add(t->counters.rpc_errors, 1);
    }
    return;
  }
  const auto op = static_cast<Opcode>(h->opcode);
  const uint64_t id = h->request_id;
  if (h->flags & proto::kFlagReply) {
    return Reply(t, c, Opcode::kError, id,
                 Status::ProtocolError("a reply sent as a request"), {});
  }
  t->counters.Add(t->counters.rpcs_served, 1);
  if (op == Opcode::kHello) return HandleHello(t, c, id, m.data);
  if (!c.authenticated) {
    return Reply(t, c, op, id,
                 Status::PermissionDenied(
                     "the connection has not completed the Hello handshake"),
                 {});
  }
  switch (op) {
    case Opcode::kPing:
      return Reply(t, c, op, id, Status::OK(), {});
    case Opcode::kEcho:
      return Reply(t, c, op, id, Status::OK(), std::move(m.data));
    case Opcode::kStats:
      return Reply(t, c, op, id, Status::OK(),
                   proto::EncodeStatsReply(Snapshot()));
    case Opcode::kRegions:
      return Reply(t, c, op, id, Status::OK(), hello_reply);
    case Opcode::kHashInfo:
      return Reply(t, c, op, id, Status::OK(), hash_info);
    case Opcode::kHashGet:
    case Opcode::kHashPut:
    case Opcode::kHashDelete:
      return HandleHash(t, c, op, id, std::move(m.data));
    case Opcode::kHashMultiGet:
    case Opcode::kHashMultiPut:
      return HandleHashMulti(t, c, op, id, std::move(m.data));
    case Opcode::kSnapshot:
      return HandleSnapshot(t, c, id);
    case Opcode::kHello:
    case Opcode::kError:
      break;
  }
  Reply(t, c, Opcode::kError, id,
        Status::ProtocolError("opcode " + std::to_string(h->opcode) +
                              " is not a request"),
        {});
}

void Server::Impl::OnMemRequest(Thread* t, AmMessage&& m) {
  Connection* conn = ConnectionOf(t, m.reply_ep);
  if (conn == nullptr) return;
  Connection& c = *conn;
  const size_t data_len = m.refused_length ? m.refused_length : m.data.size();
  auto req = proto::DecodeMemRequest(m.header, data_len);
  // Answer even a malformed request when it names an id, so its operation
  // fails with the reason instead of timing out.
  constexpr size_t kIdEnd = offsetof(proto::MemRequest, request_id) + 8;
  proto::MemRequest r{};
  Status st;
  if (req.ok()) {
    r = *req;
  } else if (m.header.size() >= kIdEnd) {
    std::memcpy(&r, m.header.data(), kIdEnd);
    if (r.op == 0 || r.op > proto::kMaxMemOp) r.op = 1;
    st = req.status();
  } else {
    t->counters.Add(t->counters.rpc_errors, 1);
    return;
  }
  if (st.ok() && !c.authenticated) {
    st = Status::PermissionDenied(
        "the connection has not completed the Hello handshake");
  }
  uint64_t value = 0;
  std::string out;
  if (st.ok()) st = ServeMemory(r, m.data, &value, &out);
  if (!st.ok()) {
    out = st.message();
    t->counters.Add(t->counters.rpc_errors, 1);
  }
  t->counters.Add(t->counters.mem_requests_served, 1);
  proto::MemReply h = proto::MakeMemReply(static_cast<proto::MemOp>(r.op),
                                          r.request_id, st.code(), value);
  // A dead client's reply fails to send; that is all (no completion).
  c.ep->SendAm(proto::kAmMemReply, &h, sizeof(h), std::move(out), nullptr);
}

Status Server::Impl::ServeMemory(const proto::MemRequest& r,
                                 const std::string& data, uint64_t* value,
                                 std::string* out) {
  auto it = served_regions.find(r.region);
  if (it == served_regions.end()) {
    return Status::InvalidArgument("no region " + std::to_string(r.region) +
                                   " on this server");
  }
  const fabric::LocalRegion& region = *it->second.region;
  if (r.offset > region.length() || r.length > region.length() - r.offset) {
    return Status::InvalidArgument("range [" + std::to_string(r.offset) +
                                   ", +" + std::to_string(r.length) +
                                   ") is outside region " +
                                   std::to_string(r.region) + " of " +
                                   std::to_string(region.length()) + " bytes");
  }
  const auto op = static_cast<proto::MemOp>(r.op);
  if (op != proto::MemOp::kRead && it->second.hash) {
    return Status::InvalidArgument("region " + std::to_string(r.region) +
                                   " holds the hash store; raw access to it "
                                   "is refused");
  }
  uint8_t* p = region.base() + r.offset;
  switch (op) {
    case proto::MemOp::kRead:
      out->resize(r.length);
      ServedCopyFromRegion(out->data(), p, r.length);
      return Status::OK();
    case proto::MemOp::kWrite:
      ServedCopyToRegion(p, data.data(), data.size());
      return Status::OK();
    case proto::MemOp::kCompareSwap:
    case proto::MemOp::kFetchAdd:
      break;
  }
  if (r.offset % 8 != 0) {
    return Status::InvalidArgument(
        "atomic operations need an 8-byte aligned offset");
  }
  // Region bases are page-aligned, so the word is too. CPU atomics, as a
  // shared-memory client's atomics on its mapping of the same region are.
  std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
  if (op == proto::MemOp::kFetchAdd) {
    *value = word.fetch_add(r.operand);
  } else {
    uint64_t expected = r.operand;
    word.compare_exchange_strong(expected, r.operand2);
    *value = expected;  // the old value whether or not it swapped
  }
  return Status::OK();
}

void Server::Impl::HandleSnapshot(Thread* t, Connection& c, uint64_t id) {
  if (partitions.empty() || !partitions[0].store) {
    return Reply(t, c, Opcode::kSnapshot, id,
                 Status::Unsupported("this server runs without persistence "
                                     "(no --data-dir, or --no-persistence)"),
                 {});
  }
  struct Pending {
    size_t left;
    Status first_error;
  };
  auto pending = std::make_shared<Pending>(Pending{partitions.size(), {}});
  const ucp_ep_h h = c.ep->handle();
  const uint64_t conn_id = c.id;
  for (size_t p = 0; p < partitions.size(); ++p) {
    threads[p]->worker->Post([this, t, p, h, conn_id, id, pending] {
      partitions[p].store->RequestSnapshot(
          [this, t, h, conn_id, id, pending](Status st) {
            t->worker->Post([this, t, h, conn_id, id, pending, st] {
              if (!st.ok() && pending->first_error.ok())
                pending->first_error = st;
              if (--pending->left > 0) return;
              auto it = t->conns.find(h);
              if (it == t->conns.end() || it->second->id != conn_id) return;
              Reply(t, *it->second, Opcode::kSnapshot, id, pending->first_error,
                    {});
            });
          });
    });
  }
}

void Server::Impl::HandleHello(Thread* t, Connection& c, uint64_t id,
                               std::string_view payload) {
  auto hello = proto::DecodeHelloRequest(payload);
  if (!hello.ok()) return Reply(t, c, Opcode::kHello, id, hello.status(), {});
  if (hello->version != proto::kWireVersion) {
    return Reply(t, c, Opcode::kHello, id,
                 Status::ProtocolError("client speaks wire version " +
                                       std::to_string(hello->version) +
                                       ", server speaks " +
                                       std::to_string(proto::kWireVersion)),
                 {});
  }
  if (!config.secret.empty() &&
      !ConstantTimeEqual(hello->secret, config.secret)) {
    t->counters.Add(t->counters.auth_failures, 1);
    log::Warn("connection {}: authentication failed", c.id);
    Reply(t, c, Opcode::kHello, id,
          Status::PermissionDenied(
              hello->secret.empty()
                  ? "this server requires a shared secret (--auth-file)"
                  : "authentication failed: wrong shared secret"),
          {});
    // Close after the refusal: dropping the endpoint closes it in flush mode,
    // so the reply still goes out first. The client keeps no keys.
    c.closing = true;
    ucp_ep_h h = c.ep->handle();
    t->worker->Defer([this, t, h] { Drop(t, h); });
    return;
  }
  c.authenticated = true;
  Reply(t, c, Opcode::kHello, id, Status::OK(), hello_reply);
}

proto::StatsReply Server::Impl::Snapshot() const {
  proto::StatsReply s{};
  for (const auto& t : threads) {
    const Counters& c = t->counters;
    s.connections_current += c.connections_current.load();
    s.connections_total += c.connections_total.load();
    s.auth_failures += c.auth_failures.load();
    s.rpcs_served += c.rpcs_served.load();
    s.rpc_bytes_in += c.rpc_bytes_in.load();
    s.rpc_bytes_out += c.rpc_bytes_out.load();
    s.rpc_errors += c.rpc_errors.load();
    s.hash_pairs += c.hash_pairs.load();
    s.hash_growths += c.hash_growths.load();
    s.hash_bytes_used += c.hash_bytes_used.load();
    s.mem_requests_served += c.mem_requests_served.load();
  }
  for (const Partition& p : partitions) {
    s.hash_bytes_total += p.region->length();
  }
  s.uptime_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                            started)
          .count());
  for (const auto& r : regions) s.memory_registered += r->length();
  s.regions = regions.size();
  s.server_threads = threads.size();
  s.incarnation = incarnation;
  if (!partitions.empty() && partitions[0].store) {
    s.fsync_policy = config.fsync == durability::FsyncPolicy::kNo         ? 1
                     : config.fsync == durability::FsyncPolicy::kEverySec ? 2
                                                                          : 3;
    for (const Partition& p : partitions) {
      const durability::StoreStats& d = p.store->stats();
      s.log_bytes += d.log_bytes.load();
      s.last_snapshot_unix_ms =
          std::max(s.last_snapshot_unix_ms, d.last_snapshot_unix_ms.load());
      s.last_snapshot_bytes += d.last_snapshot_bytes.load();
      s.snapshots += d.snapshots.load();
      s.log_write_errors += d.write_errors.load();
      s.log_failing += d.failing.load();
    }
    s.recovered_pairs = recovered_pairs;
    s.recovered_log_records = recovered_log_records;
    s.recovery_ms = recovery_ms;
  }
  return s;
}

Result<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  Status st = impl->Init();
  if (!st.ok()) {
    impl->stop = true;
    for (auto& t : impl->threads) {
      t->worker->Wake();
      if (t->thread.joinable()) t->thread.join();
    }
    return st;
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Stop();
  Wait();
}

const std::string& Server::address() const { return impl_->address; }

void Server::Stop() {
  impl_->stop.store(true, std::memory_order_release);
  for (auto& t : impl_->threads) t->worker->Wake();
}

void Server::Wait() {
  for (auto& t : impl_->threads) {
    if (t->thread.joinable()) t->thread.join();
  }
}

proto::StatsReply Server::Snapshot() const { return impl_->Snapshot(); }

const std::string& Server::recovery_summary() const {
  return impl_->recovery_summary;
}

}  // namespace remem::server
