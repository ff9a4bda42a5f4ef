#include "bench_common.h"

#include <pthread.h>
#include <sched.h>

#include <cstdio>
#include <utility>

namespace remem::bench {

std::unique_ptr<Session> ConnectOrReport(const std::string& address,
                                         Transport t, const std::string& secret,
                                         ReadPath path) {
  SessionOptions so;
  so.server = address;
  so.transport = t;
  so.secret = secret;
  so.read_path = path;
  auto session = Session::Connect(so);
  if (!session.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n",
                 session.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*session);
}

std::unique_ptr<HashStore> OpenHashOrReport(Session* session) {
  auto h = HashStore::Open(session);
  if (!h.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", h.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*h);
}

Status PinThisThread(int cpu) {
  if (cpu < 0) return Status::OK();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
    return Status::InvalidArgument("cannot pin to CPU " + std::to_string(cpu));
  }
  return Status::OK();
}

namespace {
std::string& ShmDirSetting() {
  static auto* dir = new std::string();
  return *dir;
}
}  // namespace

void SetServerShmDir(std::string dir) { ShmDirSetting() = std::move(dir); }
const std::string& ServerShmDir() { return ShmDirSetting(); }

Result<ServerUnderTest> StartServer(const std::string& binary, Transport t,
                                    int cpu, const std::string& memory,
                                    const std::vector<std::string>& flags) {
  testing::ServerOptions o;
  o.binary = binary;
  o.transport = t;
  o.memory = memory;
  o.threads = 1;
  o.pin_threads = true;
  o.cpu = cpu;
  o.flags = flags;
  o.stop_on_destroy = true;  // it removes its lease file in /dev/shm
  if (!ServerShmDir().empty() && t != Transport::kTcp) {
    o.flags.push_back("--shm-dir");
    o.flags.push_back(ServerShmDir());
  }
  return testing::ServerProcess::Start(std::move(o));
}

Result<ServerUnderTest> ServerFor(const std::string& address,
                                  const std::string& binary, Transport t,
                                  int cpu, const std::string& memory) {
  if (!address.empty()) return ServerUnderTest::External(address);
  auto s = StartServer(binary, t, cpu, memory);
  if (!s.ok()) {
    std::fprintf(stderr, "remem-bench: %s\n", s.status().ToString().c_str());
  }
  return s;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-14s %-10s %8s %5s %10s %12s %9s %9s %9s %9s %12s\n", "test",
              "transport", "size", "depth", "ops", "ops/s", "mean_us", "p50_us",
              "p99_us", "p999_us", "srv_cpu_us/op");
  for (const Row& r : rows) {
    const Histogram& h = r.latency_ns;
    auto us = [](double ns) { return ns / 1000.0; };
    char cpu[32] = "n/a";
    if (r.server_cpu_s >= 0 && r.ops > 0) {
      std::snprintf(cpu, sizeof(cpu), "%.3f", r.server_cpu_s * 1e6 / r.ops);
    }
    // Rows with requests in flight are not timed one by one: no latency.
    char lat[4][32];
    for (auto& l : lat) std::snprintf(l, sizeof(l), "n/a");
    if (h.count() > 0) {
      std::snprintf(lat[0], sizeof(lat[0]), "%.3f", us(h.mean()));
      std::snprintf(lat[1], sizeof(lat[1]), "%.3f", us(h.Percentile(50)));
      std::snprintf(lat[2], sizeof(lat[2]), "%.3f", us(h.Percentile(99)));
      std::snprintf(lat[3], sizeof(lat[3]), "%.3f", us(h.Percentile(99.9)));
    }
    std::printf("%-14s %-10s %8llu %5d %10llu %12.0f %9s %9s %9s %9s %12s\n",
                r.test.c_str(), r.transport.c_str(),
                static_cast<unsigned long long>(r.size), r.depth,
                static_cast<unsigned long long>(r.ops), r.ops / r.seconds,
                lat[0], lat[1], lat[2], lat[3], cpu);
  }
}

void PrintJson(const std::vector<Row>& rows, const std::string& extra) {
  std::printf("{%s\"results\":[", extra.c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Histogram& h = r.latency_ns;
    // null: a row not timed one operation at a time.
    std::string lat =
        "\"mean_ns\":null,\"p50_ns\":null,\"p99_ns\":null,"
        "\"p999_ns\":null";
    if (h.count() > 0) {
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "\"mean_ns\":%.1f,\"p50_ns\":%llu,\"p99_ns\":%llu,"
                    "\"p999_ns\":%llu",
                    h.mean(), static_cast<unsigned long long>(h.Percentile(50)),
                    static_cast<unsigned long long>(h.Percentile(99)),
                    static_cast<unsigned long long>(h.Percentile(99.9)));
      lat = buf;
    }
    std::printf(
        "%s{\"test\":\"%s\",\"transport\":\"%s\",\"size\":%llu,\"depth\":%d,"
        "\"ops\":%llu,\"seconds\":%.3f,\"ops_per_s\":%.1f,%s,"
        "\"server_cpu_s\":%.4f}",
        i ? "," : "", r.test.c_str(), r.transport.c_str(),
        static_cast<unsigned long long>(r.size), r.depth,
        static_cast<unsigned long long>(r.ops), r.seconds, r.ops / r.seconds,
        lat.c_str(), r.server_cpu_s);
  }
  std::printf("]}\n");
}

}  // namespace remem::bench
