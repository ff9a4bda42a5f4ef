#include "durability/durability.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/log.h"

namespace remem::durability {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMetaMagic = "remem-data-2";
constexpr std::string_view kOldMetaMagic = "remem-data-1";

Result<std::optional<std::string>> ReadSmallFile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::IOError("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in && !in.eof()) return Status::IOError("cannot read " + path);
  return std::optional<std::string>(ss.str());
}

// Writes `text` to `path` so that a crash leaves the old file or the new
// one: a temporary file, fdatasynced, renamed over, the directory synced.
Status WriteSmallFile(const std::string& dir, const std::string& name,
                      const std::string& text) {
  const std::string tmp = dir + "/" + name + ".new";
  {
    auto f = CreateFile(tmp);
    if (!f.ok()) return f.status();
    size_t done = 0;
    while (done < text.size()) {
      auto n = (*f)->Write(text.data() + done, text.size() - done);
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::IOError("write " + tmp + ": no progress");
      done += *n;
    }
    REMEM_RETURN_IF_ERROR((*f)->Sync());
  }
  const std::string path = dir + "/" + name;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IOError("rename " + tmp + ": " + std::strerror(errno));
  }
  return SyncDir(dir);
}

}  // namespace

Result<std::unique_ptr<Durability>> Durability::Open(
    const DurabilityOptions& options, uint32_t partitions) {
  if (options.data_dir.empty()) {
    return Status::InvalidArgument("durability needs a data directory");
  }
  std::unique_ptr<Durability> d(new Durability(options, partitions));
  std::error_code ec;
  fs::create_directories(options.data_dir, ec);
  if (ec) return Status::IOError(options.data_dir + ": " + ec.message());
  REMEM_RETURN_IF_ERROR(d->CheckLayout());
  d->stores_.resize(partitions);
  return d;
}

Durability::~Durability() = default;

Status Durability::CheckLayout() {
  const std::string& dir = options_.data_dir;
  const std::string meta = dir + "/meta";
  auto text = ReadSmallFile(meta);
  if (!text.ok()) return text.status();
  if (!text->has_value()) {
    return WriteSmallFile(
        dir, "meta",
        fmt::format("{} partitions {}\n", kMetaMagic, partitions_));
  }
  std::istringstream in(**text);
  std::string magic;
  in >> magic;
  if (magic == kOldMetaMagic) {
    // The first layout: "remem-data-1 <partitions> <hash seed>", with the
    // hash store's partitions at the top. Move them under hash/.
    uint64_t n = 0, seed = 0;
    if (!(in >> n >> seed)) return Status::Corruption(meta + ": unreadable");
    if (n != partitions_) {
      return Status::InvalidArgument(dir + " holds " + std::to_string(n) +
                                     " partitions; start with " + "--threads " +
                                     std::to_string(n));
    }
    const std::string hash_dir = dir + "/hash";
    std::error_code ec;
    fs::create_directories(hash_dir, ec);
    if (ec) return Status::IOError(hash_dir + ": " + ec.message());
    for (uint64_t p = 0; p < n; ++p) {
      const std::string from = dir + "/p" + std::to_string(p);
      const std::string to = hash_dir + "/p" + std::to_string(p);
      if (fs::exists(from, ec) && !fs::exists(to, ec)) {
        fs::rename(from, to, ec);
        if (ec) return Status::IOError("moving " + from + ": " + ec.message());
      }
    }
    REMEM_RETURN_IF_ERROR(SyncDir(hash_dir));
    REMEM_RETURN_IF_ERROR(
        WriteSmallFile(hash_dir, "meta", fmt::format("seed {}\n", seed)));
    REMEM_RETURN_IF_ERROR(SyncDir(dir));
    log::Info("durability: migrated {} to the {} layout", dir, kMetaMagic);
    return WriteSmallFile(
        dir, "meta",
        fmt::format("{} partitions {}\n", kMetaMagic, partitions_));
  }
  std::string word;
  uint64_t n = 0;
  if (magic != kMetaMagic || !(in >> word >> n) || word != "partitions") {
    return Status::Corruption(meta + ": not a remem data directory meta file");
  }
  if (n != partitions_) {
    return Status::InvalidArgument(dir + " holds " + std::to_string(n) +
                                   " partitions; start with --threads " +
                                   std::to_string(n));
  }
  return Status::OK();
}

Result<std::optional<std::string>> Durability::ReadServiceMeta(
    std::string_view service) {
  return ReadSmallFile(options_.data_dir + "/" + std::string(service) +
                       "/meta");
}

Status Durability::WriteServiceMeta(std::string_view service,
                                    const std::string& text) {
  const std::string dir = options_.data_dir + "/" + std::string(service);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  REMEM_RETURN_IF_ERROR(WriteSmallFile(dir, "meta", text));
  return SyncDir(options_.data_dir);
}

Result<PartitionStore*> Durability::OpenPartition(std::string_view service,
                                                  uint32_t p,
                                                  Recoverable* state) {
  if (p >= partitions_) return Status::InvalidArgument("no such partition");
  StoreOptions so;
  so.dir =
      options_.data_dir + "/" + std::string(service) + "/p" + std::to_string(p);
  so.fsync = options_.fsync;
  so.snapshot_log_bytes = options_.snapshot_log_bytes;
  so.recovery = options_.recovery;
  so.fault = options_.fault;
  so.slow_snapshot_us = options_.slow_snapshot_us;
  RecoveryReport report;
  auto store = PartitionStore::Open(so, state, &report);
  for (const auto& w : report.warnings) {
    log::Warn("recovery of {}: {}", so.dir, w);
  }
  if (!store.ok()) return store.status();
  std::lock_guard<std::mutex> lock(mu_);
  recovered_pairs_ += report.snapshot_pairs;
  recovered_log_records_ += report.log_records;
  recovery_us_ = std::max<uint64_t>(recovery_us_, report.took.count());
  stores_[p].push_back(std::move(*store));
  return stores_[p].back().get();
}

size_t Durability::OnPass(uint32_t p) {
  size_t work = 0;
  for (auto& s : stores_[p]) work += s->OnPass();
  return work;
}

void Durability::RequestSnapshot(uint32_t p, PartitionStore::Done done) {
  auto& stores = stores_[p];
  if (stores.empty()) return done(Status::OK());
  struct Join {
    size_t left;
    Status first;
    PartitionStore::Done done;
  };
  auto join = std::make_shared<Join>(Join{stores.size(), {}, std::move(done)});
  for (auto& s : stores) {
    s->RequestSnapshot([join](Status st) {
      if (!st.ok() && join->first.ok()) join->first = st;
      if (--join->left == 0) join->done(join->first);
    });
  }
}

void Durability::AddStats(std::vector<proto::StatValue>* out) const {
  uint64_t log_bytes = 0, last_ms = 0, last_bytes = 0, snapshots = 0,
           errors = 0, failing = 0;
  for (const auto& part : stores_) {
    for (const auto& s : part) {
      const StoreStats& d = s->stats();
      log_bytes += d.log_bytes.load();
      last_ms = std::max(last_ms, d.last_snapshot_unix_ms.load());
      last_bytes += d.last_snapshot_bytes.load();
      snapshots += d.snapshots.load();
      errors += d.write_errors.load();
      failing += d.failing.load();
    }
  }
  auto num = [out](const char* name, uint64_t v) {
    out->push_back({name, proto::StatKind::kNumber, v, {}});
  };
  out->push_back({"fsync_policy", proto::StatKind::kText, 0,
                  std::string(FsyncPolicyName(options_.fsync))});
  num("log_bytes", log_bytes);
  num("last_snapshot_unix_ms", last_ms);
  num("last_snapshot_bytes", last_bytes);
  num("snapshots", snapshots);
  num("log_write_errors", errors);
  num("log_failing", failing);
  std::lock_guard<std::mutex> lock(mu_);
  num("recovered_pairs", recovered_pairs_);
  num("recovered_log_records", recovered_log_records_);
  num("recovery_ms", recovery_us_ / 1000);
}

std::string Durability::recovery_summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format(
      "recovered {} pairs from snapshots and {} log records in {} ms ({}, "
      "fsync {})",
      recovered_pairs_, recovered_log_records_, recovery_us_ / 1000,
      options_.data_dir, FsyncPolicyName(options_.fsync));
}

}  // namespace remem::durability
