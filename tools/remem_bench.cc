// remem-bench: named workloads against remem-server. See --help.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string_view>

#include "bench_atomics.h"
#include "bench_common.h"
#include "bench_curve.h"
#include "bench_durability.h"
#include "bench_fabric.h"
#include "bench_failover.h"
#include "bench_tree.h"
#include "bench_ycsb.h"
#include "cli_flags.h"
#include "remem/cluster.h"
#include "remem/version.h"
#include "util/interrupt.h"
#include "util/log.h"
#include "util/size.h"
#include "util/subprocess.h"

namespace {
constexpr const char* kShmDirHelp =
    "--shm-dir for every remem-server started (shared-memory transports): "
    "a directory on a tmpfs mounted with huge=always puts their exports on "
    "2 MiB pages";
}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe: scripts read progress as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  using namespace remem;
  // Before any thread starts: every thread inherits the blocked signals.
  InstallInterruptCleanup("remem-bench");
  CLI::App app{
      "remem-bench: benchmark workloads against remem-server. Without a "
      "subcommand it runs 'fabric' then 'hash', each on a server it starts "
      "itself."};
  app.set_version_flag("--version",
                       std::string("remem-bench ") + remem::kVersion);
  // An item of a comma-separated list may not be empty: "A,,B" is a typo
  // (CLI11 would drop it silently).
  const CLI::Validator no_empty_item(
      [](std::string& item) {
        return item.empty() ? std::string("an empty item in the list")
                            : std::string();
      },
      "", "NONEMPTY");
  // CLI11's ranges let "nan" through (every comparison with it is false):
  // a duration of nan ran for ever or ran nothing, and said it was fine.
  const CLI::Validator a_number(
      [](std::string& text) {
        return std::isnan(std::strtod(text.c_str(), nullptr))
                   ? "'" + text + "' is not a number"
                   : std::string();
      },
      "", "NUMBER");
  bench::FabricOptions fo;
  fo.server_binary = SelfDirectory() + "/remem-server";
  std::string transport = "shm";
  std::string size = "64";
  std::string span = "64M";
  std::string auth_file;
  std::string shm_dir;
  const int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  fo.client_cpu = ncpu > 1 ? 1 : 0;

  uint64_t records = 100000;
  size_t key_size = 16, value_size = 32;
  auto* hash = app.add_subcommand(
      "hash",
      "the hash store: load --records pairs, then random gets from one thread "
      "on each read path (onesided, rpc, auto)");
  hash->add_option("--records", records, "pairs to load")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{100000000}));
  hash->add_option("--key-size", key_size, "bytes per key")
      ->capture_default_str();
  hash->add_option("--value-size", value_size, "bytes per value")
      ->capture_default_str()
      ->check(tools::NumberIn(size_t{0}, size_t{16} << 20));
  uint64_t tree_records = 100000;
  size_t tree_key_size = 16, tree_value_size = 32;
  auto* tree = app.add_subcommand(
      "tree",
      "the ordered store: load --records pairs, then random point gets and "
      "scans of 10 and 100 from one thread on each read path (onesided, rpc, "
      "auto), and the hash store's one-sided get on the same keys");
  tree->add_option("--records", tree_records, "pairs to load")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{100000000}));
  tree->add_option("--key-size", tree_key_size,
                   "bytes per key (16..1024; over 64 stored out of line)")
      ->capture_default_str();
  tree->add_option("--value-size", tree_value_size,
                   "bytes per value (at most 16 MiB; over 256 out of line)")
      ->capture_default_str();
  std::string tree_load_order = "sorted";
  tree->add_option("--load-order", tree_load_order,
                   "sorted (keys ascending: full leaves laid out in key "
                   "order) | random (as online inserts leave the tree: "
                   "partly full leaves, siblings anywhere)")
      ->check(CLI::IsMember({"sorted", "random"}))
      ->capture_default_str();
  bench::AtomicsOptions ao;
  bool no_redis = false, no_vectors = false;
  auto* atomics = app.add_subcommand(
      "atomics",
      "server-side operations: fetch-add on --keys counters (uniform, zipf "
      "0.99, one key; async at --depth, and one at a time) against plain "
      "puts and Redis INCRBY pipelined at the same depth; vector sums of 1K "
      "and 64K elements on the server, here after a one-sided read, and "
      "Redis GET + local sum");
  atomics->add_option("--keys", ao.keys, "counters of the uniform/zipf rows")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{10000000}));
  atomics->add_flag("--no-redis", no_redis, "skip the Redis rows");
  atomics->add_flag("--no-vectors", no_vectors, "skip the reduce rows");
  auto* fabric = app.add_subcommand(
      "fabric",
      "one-sided get/put/fetch-add and RPC echo: latency at depth 1 and "
      "throughput at --depth; then the same on a namespace's mapping, and "
      "transactional objects (reads, read-only and transfer transactions)");
  // YCSB: `ycsb` runs workloads on one system (default remem); `compare`
  // runs them on several and adds ratio columns and plots.
  bench::YcsbOptions yo_ycsb, yo_compare;
  yo_compare.workloads = {"A", "B", "C"};
  yo_compare.systems = {"remem", "redis", "memcached"};
  yo_compare.compare = true;
  std::string distribution, ycsb_auth_file;
  auto* ycsb = app.add_subcommand(
      "ycsb",
      "YCSB core workloads (A-F; E scans remem's ordered store and Redis's "
      "sorted sets) against remem, redis or memcached: load, warm up, timed "
      "run");
  auto* compare = app.add_subcommand(
      "compare",
      "YCSB workloads on several systems in turn, one side-by-side table "
      "with throughput ratios (and --plot DIR)");
  compare->add_option("--plot", yo_compare.plot_dir,
                      "write throughput-vs-value-size and latency CDF data "
                      "(with several depths or batches also throughput vs "
                      "keys in flight), a gnuplot script and (with gnuplot) "
                      "SVGs into DIR");
  // --depth, --batch and --transport of each YCSB subcommand, parsed after
  // CLI11 (lists, and a transport only remem systems take).
  struct YcsbLists {
    std::string depths = "1", batches = "1", transport;
    bool curve = false;
  } yl_ycsb, yl_compare;
  for (auto [a, yp, yl] : {std::tuple{ycsb, &yo_ycsb, &yl_ycsb},
                           {compare, &yo_compare, &yl_compare}}) {
    bench::YcsbOptions& yo = *yp;
    yo.remem_binary = fo.server_binary;
    yo.client_cpu = fo.client_cpu;
    a->add_option("--workloads,--workload", yo.workloads,
                  "YCSB workloads, e.g. A,B,C")
        ->delimiter(',')
        ->check(no_empty_item)
        ->capture_default_str();
    a->add_option("--systems,--system", yo.systems,
                  "remem[-shm|-tcp|-auto][-onesided|-rpc|-auto] (default "
                  "remem = remem-shm-auto), remem-resp (remem through its "
                  "Redis front door, driven as Redis is), redis, memcached")
        ->delimiter(',')
        ->check(no_empty_item)
        ->capture_default_str();
    a->add_option("--distribution", distribution,
                  "uniform | zipfian | latest (default: the workload's)")
        ->check(CLI::IsMember({"uniform", "zipfian", "latest"}));
    a->add_option("--records", yo.records, "pairs loaded before the run")
        ->capture_default_str()
        ->check(tools::NumberIn(uint64_t{1}, uint64_t{100000000}));
    a->add_option("--key-size", yo.key_size, "bytes per key")
        ->capture_default_str()
        ->check(tools::NumberIn(size_t{8}, size_t{1024}));
    a->add_option("--value-size,--value-sizes", yo.value_sizes,
                  "bytes per value; a list runs each (Pilaf: 16,64,256,1024,"
                  "4096)")
        ->delimiter(',')
        ->check(no_empty_item)
        ->capture_default_str()
        ->check(tools::NumberIn(size_t{0}, size_t{1} << 20));
    a->add_option("--threads", yo.threads, "client threads (on --client-cpu)")
        ->capture_default_str()
        ->check(tools::NumberIn(1, 256));
    auto* depth = a->add_option(
        "--depth,--depths", yl->depths,
        "requests in flight per client thread (remem async gets and puts, "
        "redis pipelining, memcached mget); a list, e.g. 1,4,16,64, runs "
        "each on one load per system");
    depth->capture_default_str();
    auto* batch = a->add_option(
        "--batch,--batches", yl->batches,
        "keys per read request: remem multi-get, redis MGET, memcached mget; "
        "a list runs each with every --depth");
    batch->capture_default_str();
    a->add_flag("--curve", yl->curve,
                "the whole curve: --depth 1,4,16,64 --batch 1,16, then each "
                "system at its best point")
        ->excludes(depth)
        ->excludes(batch);
    a->add_option("--transport", yl->transport,
                  "auto | shm | tcp: the transport of systems named plain "
                  "'remem' (default shm)")
        ->check(CLI::IsMember({"auto", "shm", "tcp"}));
    a->add_option("--duration", yo.duration, "measured seconds per run")
        ->capture_default_str()
        ->check(a_number)
        ->check(tools::NumberIn(0.01, 3600.0));
    a->add_option("--warmup", yo.warmup, "seconds before measuring")
        ->capture_default_str()
        ->check(a_number)
        ->check(tools::NumberIn(0.0, 3600.0));
    a->add_option("--interval", yo.interval,
                  "also print each run's throughput every this many seconds "
                  "(stderr); 0: only the run's total")
        ->capture_default_str()
        ->check(a_number)
        ->check(tools::NumberIn(0.0, 3600.0));
    a->add_option("--seed", yo.seed, "key sequence seed (same for all systems)")
        ->capture_default_str();
    a->add_option("--check-every", yo.check_every,
                  "verify every Nth value read (0: none)")
        ->capture_default_str()
        ->check(tools::NumberIn(0, 1 << 30));
    a->add_option("--server", yo.remem_address,
                  "existing remem-server host:port (default: start one)");
    a->add_option("--cluster", yo.remem_cluster,
                  "an existing cluster's seed servers (host:port,...): remem "
                  "runs through the cluster client, each key routed to its "
                  "server");
    a->add_option_function<std::string>(
         "--read-from",
         [&yo](const std::string& v) { yo.read_any_replica = v == "any"; },
         "with --cluster: primary | any (gets from any whole copy of a "
         "replicated shard, backups too: a weaker mode)")
        ->check(CLI::IsMember({"primary", "any"}));
    a->add_option("--server-pids", yo.server_pids,
                  "with --server or --cluster: the servers' process ids on "
                  "this host, whose CPU time makes srv_us/op")
        ->delimiter(',')
        ->check(no_empty_item);
    a->add_option("--server-binary", yo.remem_binary, "remem-server to start")
        ->capture_default_str();
    a->add_option("--shm-dir", shm_dir, kShmDirHelp);
    a->add_option("--server-cpu", yo.server_cpu,
                  "CPU for the started servers (-1: unpinned)")
        ->capture_default_str()
        ->check(tools::NumberIn(-1, 4095));
    a->add_option("--client-cpu", yo.client_cpu,
                  "CPU for every client thread (-1: unpinned)")
        ->capture_default_str()
        ->check(tools::NumberIn(-1, 4095));
    a->add_option("--auth-file", ycsb_auth_file, "remem shared secret file");
    a->add_flag("--json", yo.json, "print JSON instead of a table");
  }
  bench::DurabilityOptions dur;
  dur.server_binary = fo.server_binary;
  dur.client_cpu = fo.client_cpu;
  std::string dur_transport = "shm";
  auto* durability = app.add_subcommand(
      "durability",
      "write throughput per fsync policy (none, no, everysec, always), each "
      "on a server of its own with a fresh data directory: a multi-put load, "
      "then a YCSB-A-like mix; --recovery adds kill -9 and recovery time");
  durability
      ->add_option("--policies,--policy", dur.policies,
                   "fsync policies to run, e.g. none,everysec")
      ->delimiter(',')
      ->check(no_empty_item)
      ->capture_default_str();
  durability->add_option("--records", dur.records, "pairs to load")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{1000000000}));
  durability->add_option("--ops", dur.ops, "operations in the mix")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{1} << 40));
  durability
      ->add_option("--always-ops", dur.always_ops,
                   "operations in the mix under --fsync always")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1}, uint64_t{1} << 40));
  durability->add_option("--depth", dur.depth, "operations in flight")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 4096));
  durability
      ->add_option("--write-fraction", dur.write_fraction,
                   "puts in the mix (0.5 = YCSB-A)")
      ->capture_default_str()
      ->check(a_number)
      ->check(tools::NumberIn(0.0, 1.0));
  durability->add_option("--key-size", dur.key_size, "bytes per key")
      ->capture_default_str()
      ->check(tools::NumberIn(size_t{8}, size_t{1024}));
  durability->add_option("--value-size", dur.value_size, "bytes per value")
      ->capture_default_str()
      ->check(tools::NumberIn(size_t{0}, size_t{1} << 20));
  // A size as remem-server reads it, checked here: a bad one was found
  // only once the servers started.
  auto a_size = [](const std::string& text) -> std::string {
    auto n = ParseSize(text);
    if (!n.ok()) return n.status().message();
    if (*n == 0) return "must be more than 0";
    return "";
  };
  durability->add_option("--memory", dur.memory, "the servers' --memory")
      ->capture_default_str()
      ->check(a_size, "SIZE");
  durability->add_option("--hash-memory", dur.hash_memory,
                         "the servers' --hash-memory (default: theirs)");
  durability
      ->add_option("--server-threads", dur.server_threads,
                   "the servers' --threads (above 1: unpinned)")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 64));
  durability->add_flag("--recovery", dur.recovery,
                       "after the mix: kill -9, restart on the same data "
                       "directory, report the recovery");
  durability->add_option("--data-dir-parent", dur.data_dir_parent,
                         "where the temporary data directories go (default: "
                         "the system's temporary directory)");
  durability
      ->add_option("--server-binary", dur.server_binary,
                   "remem-server to start")
      ->capture_default_str();
  durability->add_option("--transport", dur_transport, "shm | tcp")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp"}));
  durability
      ->add_option("--server-cpu", dur.server_cpu,
                   "CPU for the servers (-1: unpinned)")
      ->capture_default_str()
      ->check(tools::NumberIn(-1, 4095));
  durability
      ->add_option("--client-cpu", dur.client_cpu,
                   "CPU for the client thread (-1: unpinned)")
      ->capture_default_str()
      ->check(tools::NumberIn(-1, 4095));
  durability->add_flag("--json", dur.json, "print JSON instead of a table");
  bench::FailoverOptions fov;
  auto* failover = app.add_subcommand(
      "failover",
      "replication: per trial a new cluster (its own ZooKeeper), one key "
      "written back to back, kill -9 of its primary; the time to the first "
      "write acknowledged after the kill (p50, p99)");
  failover
      ->add_option("--trials", fov.trials,
                   "kills (or drains) measured, one after another")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 10000));
  failover
      ->add_option("--servers", fov.servers,
                   "servers of the cluster the bench starts")
      ->capture_default_str()
      ->check(tools::NumberIn(2, 16));
  failover
      ->add_option("--replicas", fov.replicas,
                   "backups of each shard (remem-server's --replicas)")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 4));
  // remem-server's ranges (checked here: the bench would start ZooKeeper
  // and the servers first).
  failover
      ->add_option("--lease-ms", fov.lease_ms,
                   "the servers' lease (remem-server's --cluster-lease-ms)")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{50}, uint64_t{30'000}));
  failover
      ->add_option(
          "--session-ms", fov.session_ms,
          "their ZooKeeper session (remem-server's --cluster-session-ms)")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{1000}, uint64_t{60'000}));
  failover
      ->add_option("--warmup-ms", fov.warmup_ms,
                   "writes before each kill, in milliseconds")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{0}, uint64_t{600'000}));
  auto* kill_manager =
      failover->add_flag("--kill-manager", fov.kill_manager,
                         "kill a primary that is the configuration manager");
  auto* drain_flag = failover->add_flag(
      "--drain", fov.drain,
      "instead of the kill: drain the primary (remem cluster drain) while "
      "writing; the drain's time and the writes' latency meanwhile");
  failover
      ->add_flag("--join", fov.join,
                 "instead of the kill: start one more server; the time until "
                 "the cluster is balanced and the writes' latency meanwhile")
      ->excludes(drain_flag)
      ->excludes(kill_manager);
  drain_flag->excludes(kill_manager);
  failover
      ->add_option("--records", fov.records,
                   "pairs loaded before the kill; then measure the "
                   "re-replication of the shards short of copies")
      ->capture_default_str()
      ->check(tools::NumberIn(uint64_t{0}, uint64_t{100'000'000}));
  failover
      ->add_option("--server-binary", fo.server_binary, "remem-server to start")
      ->capture_default_str();
  failover->add_option("--transport", transport, "shm | tcp")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "tcp"}));
  failover
      ->add_option("--server-cpu", fo.server_cpu,
                   "CPU for the servers (-1: unpinned)")
      ->capture_default_str()
      ->check(tools::NumberIn(-1, 4095));
  failover
      ->add_option("--client-cpu", fo.client_cpu,
                   "CPU for the client (-1: unpinned)")
      ->capture_default_str()
      ->check(tools::NumberIn(-1, 4095));
  // The flags every server-at-a-time subcommand takes (and the default
  // run, fabric then hash, on the top level).
  for (CLI::App* a :
       {static_cast<CLI::App*>(&app), fabric, hash, atomics, tree}) {
    a->add_option("--server", fo.server,
                  "existing server host:port (default: start remem-server "
                  "pinned to --server-cpu)");
    a->add_option("--server-binary", fo.server_binary, "remem-server to start")
        ->capture_default_str();
    a->add_option("--shm-dir", shm_dir, kShmDirHelp);
    a->add_option("--transport", transport, "auto | shm | tcp")
        ->capture_default_str();
    a->add_option("--duration", fo.seconds, "seconds per row")
        ->capture_default_str()
        ->check(a_number)
        ->check(tools::NumberIn(0.01, 3600.0));
    a->add_option("--server-cpu", fo.server_cpu,
                  "CPU for a started server (-1: unpinned)")
        ->capture_default_str()
        ->check(tools::NumberIn(-1, 4095));
    a->add_option("--client-cpu", fo.client_cpu,
                  "CPU for the benchmark's client thread (-1: unpinned)")
        ->capture_default_str()
        ->check(tools::NumberIn(-1, 4095));
    a->add_option("--auth-file", auth_file, "shared secret file");
    a->add_flag("--json", fo.json, "print JSON instead of a table");
  }
  fabric->add_flag("--redis", fo.redis,
                   "also Redis GETRANGE/SETRANGE on a string as long as the "
                   "namespace rows' segment, at the same offsets, sizes and "
                   "depths, and Redis GET and WATCH/MULTI/EXEC transfers "
                   "beside the object rows (needs redis-server)");
  // The fabric rows' own (fabric's one-sided operations; the default run).
  for (CLI::App* a : {static_cast<CLI::App*>(&app), fabric}) {
    a->add_option("--size", size, "bytes per operation")->capture_default_str();
    a->add_option("--span", span,
                  "bytes of server memory the random offsets spread over "
                  "(small: cache-resident; large: every read misses)")
        ->capture_default_str();
  }
  for (CLI::App* a : {static_cast<CLI::App*>(&app), fabric, atomics}) {
    a->add_option("--depth", fo.depth,
                  "operations in flight for the async rows")
        ->capture_default_str()
        ->check(tools::NumberIn(1, 100000));
  }
  // CLI11 drops the empty items of a comma-separated list ("A,,B", a
  // trailing comma): a typo that would silently run less than asked. So the
  // list options are looked at first.
  for (int i = 1; i < argc; ++i) {
    static const std::set<std::string_view> kLists = {
        "--workloads",   "--workload",    "--systems",  "--system",
        "--value-size",  "--value-sizes", "--policies", "--policy",
        "--server-pids", "--depth",       "--depths",   "--batch",
        "--batches"};
    std::string_view name = argv[i], value;
    if (const size_t eq = name.find('=');
        name.rfind("--", 0) == 0 && eq != std::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[i + 1];
    } else {
      break;
    }
    if (kLists.count(name) == 0) continue;
    if (value.empty() || value.front() == ',' || value.back() == ',' ||
        value.find(",,") != std::string_view::npos) {
      std::fprintf(stderr,
                   "%s: an empty item in '%.*s' (items are separated by one "
                   "comma)\n",
                   std::string(name).c_str(), int(value.size()), value.data());
      return 2;
    }
  }
  // One subcommand at a time ("fabric hash" ran hash only, silently).
  app.require_subcommand(0, 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help or the error
    return code == 0 ? 0 : 2;      // every usage error exits 2
  }
  // An empty value taken as none: `--auth-file ""` connected without the
  // secret (tools/cli_flags.h).
  if (std::string empty = tools::OptionGivenEmpty(app, {}); !empty.empty()) {
    std::fprintf(stderr, "remem-bench: %s was given an empty value\n",
                 empty.c_str());
    return 2;
  }
  // The top level's options are the default run's, and fabric's, hash's,
  // atomics' and tree's (the same variables). The other subcommands have
  // their own: one given before them was taken and ignored ("--duration
  // 0.3 ycsb" ran 5 s), so it is refused; ycsb and compare honour the top
  // level's --transport.
  for (CLI::App* own : {ycsb, compare, durability, failover}) {
    if (!own->parsed()) continue;
    for (const CLI::Option* o : app.get_options()) {
      if (o->count() == 0 || o->get_name() == "--help" ||
          o->get_name() == "--version") {
        continue;
      }
      if (o->get_name() == "--transport" && own != durability &&
          own != failover) {
        continue;
      }
      std::fprintf(stderr,
                   "remem-bench: %s before '%s' is not %s's: give it after "
                   "the subcommand (remem-bench %s --help)\n",
                   o->get_name().c_str(), own->get_name().c_str(),
                   own->get_name().c_str(), own->get_name().c_str());
      return 2;
    }
  }
  // The top level's --size, --span and --depth are the fabric rows' (and
  // the default run's): hash, tree and atomics ran on without them ("--size
  // 4096 hash" measured 32-byte values), so they are refused there.
  for (const auto& [sub, unused] :
       std::vector<std::pair<CLI::App*, std::vector<std::string>>>{
           {hash, {"--size", "--span", "--depth"}},
           {tree, {"--size", "--span", "--depth"}},
           {atomics, {"--size", "--span"}}}) {
    if (!sub->parsed()) continue;
    for (const std::string& name : unused) {
      if (app.get_option(name)->count() == 0) continue;
      std::fprintf(stderr,
                   "remem-bench: %s is the fabric rows'; '%s' does not use "
                   "it (remem-bench %s --help)\n",
                   name.c_str(), sub->get_name().c_str(),
                   sub->get_name().c_str());
      return 2;
    }
  }
  (void)log::SetLevel("warn");
  if (!shm_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(shm_dir, ec)) {
      std::fprintf(stderr, "remem-bench: --shm-dir %s: not a directory\n",
                   shm_dir.c_str());
      return 2;
    }
    const bool external =
        !fo.server.empty() ||
        ((ycsb->parsed() || compare->parsed()) &&
         (!(ycsb->parsed() ? yo_ycsb : yo_compare).remem_address.empty() ||
          !(ycsb->parsed() ? yo_ycsb : yo_compare).remem_cluster.empty()));
    if (external) {
      std::fprintf(stderr,
                   "remem-bench: --shm-dir is for the servers remem-bench "
                   "starts; an existing server keeps its own (its "
                   "remem-server --shm-dir)\n");
      return 2;
    }
    bench::SetServerShmDir(shm_dir);
  }
  if (ycsb->parsed() || compare->parsed()) {
    bench::YcsbOptions& yo = ycsb->parsed() ? yo_ycsb : yo_compare;
    YcsbLists& yl = ycsb->parsed() ? yl_ycsb : yl_compare;
    if (yl.curve) {
      yo.depths.assign(std::begin(bench::kCurveDepths),
                       std::end(bench::kCurveDepths));
      yo.batches.assign(std::begin(bench::kCurveBatches),
                        std::end(bench::kCurveBatches));
    } else {
      auto d = bench::ParseCountList(yl.depths, 1, 4096, "--depth");
      auto b = bench::ParseCountList(yl.batches, 1, 4096, "--batch");
      for (const Status& st : {d.status(), b.status()}) {
        if (!st.ok()) {
          std::fprintf(stderr, "remem-bench: %s\n", st.ToString().c_str());
          return 2;
        }
      }
      yo.depths = *d;
      yo.batches = *b;
    }
    // The top-level --transport (before the subcommand) counts too: it used
    // to be taken and ignored.
    if (yl.transport.empty() && app.get_option("--transport")->count() > 0) {
      yl.transport = transport;
    }
    if (!yl.transport.empty()) {
      auto t = ParseTransport(yl.transport);
      if (!t.ok()) {
        std::fprintf(stderr, "remem-bench: %s\n",
                     t.status().ToString().c_str());
        return 2;
      }
      yo.transport = *t;
    }
    if (!distribution.empty()) {
      yo.distribution = *bench::ycsb::ParseDistribution(distribution);
    }
    if (!yo.remem_cluster.empty()) {
      auto seeds = ParseSeeds(yo.remem_cluster);
      if (!seeds.ok()) {
        std::fprintf(stderr, "remem-bench: --cluster: %s\n",
                     seeds.status().ToString().c_str());
        return 2;
      }
    }
    if (yo.read_any_replica && yo.remem_cluster.empty()) {
      std::fprintf(stderr, "remem-bench: --read-from any needs --cluster\n");
      return 2;
    }
    if (!yo.remem_address.empty() && !yo.remem_cluster.empty()) {
      std::fprintf(stderr,
                   "remem-bench: give one server (--server) or a cluster's "
                   "seeds (--cluster), not both\n");
      return 2;
    }
    if (!yo.server_pids.empty() && yo.remem_address.empty() &&
        yo.remem_cluster.empty()) {
      std::fprintf(stderr,
                   "remem-bench: --server-pids needs --server or --cluster "
                   "(the server remem-bench starts is measured already)\n");
      return 2;
    }
    for (const int pid : yo.server_pids) {
      if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) {
        std::fprintf(stderr, "remem-bench: --server-pids: no process %d\n",
                     pid);
        return 2;
      }
    }
    if (!ycsb_auth_file.empty()) {
      auto secret = ReadSecretFile(ycsb_auth_file);
      if (!secret.ok()) {
        std::fprintf(stderr, "remem-bench: %s\n",
                     secret.status().ToString().c_str());
        return 2;
      }
      yo.secret = *secret;
    }
    if (yo.server_cpu >= ncpu || yo.client_cpu >= ncpu) {
      std::fprintf(stderr, "remem-bench: this machine has CPUs 0-%d\n",
                   ncpu - 1);
      return 2;
    }
    return bench::RunYcsb(yo);
  }
  if (durability->parsed()) {
    auto t = ParseTransport(dur_transport);
    if (!t.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n", t.status().ToString().c_str());
      return 2;
    }
    dur.transport = *t;
    if (dur.server_cpu >= ncpu || dur.client_cpu >= ncpu) {
      std::fprintf(stderr, "remem-bench: this machine has CPUs 0-%d\n",
                   ncpu - 1);
      return 2;
    }
    return bench::RunDurability(dur);
  }
  auto t = ParseTransport(transport);
  if (!t.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", t.status().ToString().c_str());
    return 2;
  }
  fo.transport = *t;
  auto s = ParseSize(size);
  if (!s.ok()) {
    std::fprintf(stderr, "remem-bench: --size: %s\n",
                 s.status().ToString().c_str());
    return 2;
  }
  fo.size = *s;
  auto sp = ParseSize(span);
  if (!sp.ok()) {
    std::fprintf(stderr, "remem-bench: --span: %s\n",
                 sp.status().ToString().c_str());
    return 2;
  }
  fo.span = *sp;
  for (CLI::App* a : {static_cast<CLI::App*>(&app), fabric}) {
    if (a->get_option("--span")->count() > 0) fo.span_given = true;
  }
  if (!auth_file.empty()) {
    auto secret = ReadSecretFile(auth_file);
    if (!secret.ok()) {
      std::fprintf(stderr, "remem-bench: %s\n",
                   secret.status().ToString().c_str());
      return 2;
    }
    fo.secret = *secret;
  }
  if (fo.server_cpu >= ncpu || fo.client_cpu >= ncpu) {
    std::fprintf(stderr, "remem-bench: this machine has CPUs 0-%d\n", ncpu - 1);
    return 2;
  }
  if (hash->parsed()) return bench::RunHash(fo, records, key_size, value_size);
  if (fabric->parsed()) return bench::RunFabric(fo);
  if (tree->parsed()) {
    return bench::RunTree(fo, tree_records, tree_key_size, tree_value_size,
                          tree_load_order == "random"
                              ? bench::TreeLoadOrder::kRandom
                              : bench::TreeLoadOrder::kSorted);
  }
  if (failover->parsed()) {
    if (fov.servers <= fov.replicas) {
      std::fprintf(stderr, "remem-bench: --servers must exceed --replicas\n");
      return 2;
    }
    // A re-replication needs a server beyond the shard's copies left, and
    // a drain one to take the drained server's copies.
    if ((fov.records > 0 || fov.drain) && fov.servers <= fov.replicas + 1) {
      std::fprintf(stderr,
                   "remem-bench: %s needs --servers above --replicas + 1 (%d "
                   "servers hold %d copies of each shard: no server is left "
                   "to copy to)\n",
                   fov.drain ? "--drain" : "--records", fov.servers,
                   fov.replicas + 1);
      return 2;
    }
    if (fov.lease_ms + 100 > fov.session_ms) {
      std::fprintf(stderr,
                   "remem-bench: --lease-ms must be at least 100 less than "
                   "--session-ms (as remem-server's --cluster-lease-ms)\n");
      return 2;
    }
    return bench::RunFailover(fo, fov);
  }
  if (atomics->parsed()) {
    ao.redis = !no_redis;
    ao.vectors = !no_vectors;
    return bench::RunAtomics(fo, ao);
  }
  // No workload named: the transport layer, then the hash store. With
  // --json, one array of the two runs' objects (the headings on standard
  // error), so that the output is one JSON document.
  FILE* headings = fo.json ? stderr : stdout;
  std::fprintf(headings, "== fabric: one-sided operations and RPCs\n");
  if (fo.json) std::printf("[");
  std::fflush(stdout);
  if (int rc = bench::RunFabric(fo); rc != 0) {
    if (fo.json) std::printf("]\n");  // what was printed, still one array
    return rc;
  }
  if (fo.json) std::printf(",");
  std::fflush(stdout);
  std::fprintf(headings, "%s== hash: the key-value store on each read path\n",
               fo.json ? "" : "\n");
  const int rc = bench::RunHash(fo, records, key_size, value_size);
  if (fo.json) std::printf("]\n");
  return rc;
}
