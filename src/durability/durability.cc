#include "durability/durability.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "util/log.h"

namespace remem::durability {

namespace {

constexpr std::string_view kMetaMagic = "remem-data-2";
constexpr std::string_view kOldMetaMagic = "remem-data-1";

Result<std::optional<std::string>> ReadSmallFile(Env* env,
                                                 const std::string& path) {
  auto exists = env->FileExists(path);
  if (!exists.ok()) return exists.status();
  if (!*exists) return std::optional<std::string>();
  auto d = env->ReadFile(path);
  if (!d.ok()) return d.status();
  return std::optional<std::string>(std::string((*d)->data()));
}

}  // namespace

Result<std::unique_ptr<Durability>> Durability::Open(
    const DurabilityOptions& options, uint32_t partitions) {
  if (options.data_dir.empty()) {
    return Status::InvalidArgument("durability needs a data directory");
  }
  std::unique_ptr<Durability> d(new Durability(options, partitions));
  d->env_ = options.env != nullptr ? options.env : Env::Posix();
  d->files_ = d->env_;
  if (!options.fault.empty()) {
    auto f = ParseFaultSpec(options.fault);
    if (!f.ok()) return f.status();
    d->meta_env_ = std::make_unique<FaultyEnv>(d->env_, std::move(*f));
    d->files_ = d->meta_env_.get();
  }
  const std::string& dir = options.data_dir;
  auto state = d->files_->CreateDir(dir);
  if (!state.ok()) return state.status();
  if (*state == DirState::kTightened) {
    log::Warn(
        "durability: {} was readable by other users; its mode is now 0700 "
        "(files written before may still be open to them: check them)",
        dir);
  }
  auto lock = d->files_->LockFile(
      dir + "/LOCK", fmt::format("remem-server pid {}\n", ::getpid()));
  if (!lock.ok()) {
    if (lock.status().code() == StatusCode::kBusy) {
      return Status::Busy(
          "the data directory " + dir +
          " is in use by another server: " + lock.status().message());
    }
    return lock.status();
  }
  d->lock_ = std::move(*lock);
  REMEM_RETURN_IF_ERROR(d->CheckLayout());
  d->stores_.resize(partitions);
  return d;
}

Durability::~Durability() = default;

void Durability::MarkStopping() {
  if (lock_ == nullptr) return;
  const Status st =
      lock_->Note(fmt::format("remem-server pid {} stopping\n", ::getpid()));
  if (!st.ok()) log::Warn("durability: {}", st.message());
}

Status Durability::CheckLayout() {
  const std::string& dir = options_.data_dir;
  const std::string meta = dir + "/meta";
  auto text = ReadSmallFile(files_, meta);
  if (!text.ok()) return text.status();
  if (!text->has_value()) {
    // A new directory, unless a service's data is already there: then the
    // meta was removed, and a fresh one would guess the partition count
    // (keys recovered into the wrong partitions are not found).
    auto names = files_->ListDir(dir);
    if (!names.ok()) return names.status();
    // The first layout keeps the hash store's partitions at the top.
    auto held_at_top = PartitionDataIn(dir);
    if (!held_at_top.ok()) return held_at_top.status();
    if (*held_at_top) {
      return Status::Corruption(
          meta + " is missing, but " + dir +
          " holds partitions of the first data layout: without it their "
          "count and the hash seed are unknown. Put it back (\"" +
          std::string(kOldMetaMagic) +
          " N SEED\") or start on an empty directory");
    }
    for (const std::string& name : *names) {
      auto held = PartitionDataIn(dir + "/" + name);
      if (!held.ok()) return held.status();
      if (*held) {
        return Status::Corruption(
            meta + " is missing, but " + dir + "/" + name +
            " holds data: without it the partitions its keys belong to are "
            "unknown. Put it back (\"" +
            std::string(kMetaMagic) +
            " partitions N\", N the --threads the data was written with) "
            "or start on an empty directory");
      }
    }
    return WriteFileAtomically(
        files_, dir, "meta",
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
    auto made = files_->CreateDir(hash_dir);
    if (!made.ok()) return made.status();
    for (uint64_t p = 0; p < n; ++p) {
      const std::string from = dir + "/p" + std::to_string(p);
      const std::string to = hash_dir + "/p" + std::to_string(p);
      auto from_exists = files_->FileExists(from);
      auto to_exists = files_->FileExists(to);
      if (!from_exists.ok()) return from_exists.status();
      if (!to_exists.ok()) return to_exists.status();
      if (*from_exists && !*to_exists) {
        REMEM_RETURN_IF_ERROR(files_->Rename(from, to));
      }
    }
    REMEM_RETURN_IF_ERROR(files_->SyncDir(hash_dir));
    REMEM_RETURN_IF_ERROR(WriteFileAtomically(files_, hash_dir, "meta",
                                              fmt::format("seed {}\n", seed)));
    REMEM_RETURN_IF_ERROR(files_->SyncDir(dir));
    log::Info("durability: migrated {} to the {} layout", dir, kMetaMagic);
    return WriteFileAtomically(
        files_, dir, "meta",
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
  const std::string dir = options_.data_dir + "/" + std::string(service);
  auto text = ReadSmallFile(files_, dir + "/meta");
  if (!text.ok() || text->has_value()) return text;
  auto held = PartitionDataIn(dir);
  if (!held.ok()) return held.status();
  if (*held) {
    return Status::Corruption(
        dir + "/meta is missing, but " + dir +
        " holds data: without it the partitions its keys belong to are "
        "unknown. Put it back or start on an empty directory");
  }
  return text;
}

Result<bool> Durability::PartitionDataIn(const std::string& dir) {
  // Missing, or a file (LOCK, meta): no service's partitions. One that
  // cannot be listed fails its recovery later, with its own error.
  auto names = files_->ListDir(dir);
  if (!names.ok()) return false;
  for (const std::string& name : *names) {
    if (name.size() < 2 || name[0] != 'p' ||
        name.find_first_not_of("0123456789", 1) != std::string::npos) {
      continue;
    }
    auto files = files_->ListDir(dir + "/" + name);
    if (!files.ok()) return files.status();
    if (!files->empty()) return true;
  }
  return false;
}

bool Durability::HoldsLogOrSnapshot(const std::string& dir, bool with_records) {
  auto names = env_->ListDir(dir);
  if (!names.ok()) return false;
  for (const std::string& name : *names) {
    if (name.starts_with("snapshot-") && name.ends_with(".snap")) return true;
    if (name.starts_with("log-") && name.ends_with(".rlog")) {
      if (!with_records) return true;
      // A sibling recovering meanwhile may have removed it: not counted.
      auto size = env_->FileSize(dir + "/" + name);
      if (size.ok() && *size > 0) return true;
    }
  }
  return false;
}

Status Durability::WriteServiceMeta(std::string_view service,
                                    const std::string& text) {
  const std::string dir = options_.data_dir + "/" + std::string(service);
  auto made = files_->CreateDir(dir);
  if (!made.ok()) return made.status();
  REMEM_RETURN_IF_ERROR(WriteFileAtomically(files_, dir, "meta", text));
  return files_->SyncDir(options_.data_dir);
}

Result<PartitionStore*> Durability::OpenPartition(std::string_view service,
                                                  uint32_t p,
                                                  Recoverable* state) {
  if (p >= partitions_) return Status::InvalidArgument("no such partition");
  StoreOptions so;
  so.dir =
      options_.data_dir + "/" + std::string(service) + "/p" + std::to_string(p);
  so.env = env_;
  so.fsync = options_.fsync;
  so.snapshot_log_bytes = options_.snapshot_log_bytes;
  so.recovery = options_.recovery;
  so.fault = options_.fault;
  so.slow_snapshot_us = options_.slow_snapshot_us;
  // Partitions are made together, and each gets its log file before any
  // of them takes a write, so one with neither log nor snapshot beside a
  // partition that holds records had its files removed: its pairs are
  // lost, and starting it empty would say nothing.
  std::optional<std::string> gone;
  if (partitions_ > 1 && !HoldsLogOrSnapshot(so.dir, false)) {
    const std::string service_dir =
        options_.data_dir + "/" + std::string(service);
    for (uint32_t q = 0; q < partitions_ && !gone; ++q) {
      const std::string other = service_dir + "/p" + std::to_string(q);
      if (q != p && HoldsLogOrSnapshot(other, true)) {
        gone = so.dir + " holds no log file or snapshot, but " + other +
               " holds records: this partition's files were removed, and "
               "the pairs it held are out of reach";
      }
    }
  }
  if (gone && options_.recovery == RecoveryMode::kStrict) {
    return Status::Corruption(
        "corruption: " + *gone +
        ". Refusing to start. Put them back, or start with "
        "--recovery=truncate to start this partition empty");
  }
  RecoveryReport report;
  so.unclean = gone.has_value();
  auto store = PartitionStore::Open(so, state, &report);
  if (gone) {
    report.lost.push_back(*gone + ": started empty (--recovery=truncate)");
  }
  for (const auto& w : report.warnings) {
    log::Warn("recovery of {}: {}", so.dir, w);
  }
  for (const auto& l : report.lost) {
    log::Error("recovery of {}: LOST {}", so.dir, l);
  }
  if (!store.ok()) return store.status();
  if (report.unclean) {
    log::Info(
        "recovery of {}: the previous run did not stop cleanly (or records "
        "were dropped): versions skip {} so that none a lost write consumed "
        "is handed out again",
        so.dir, kUncleanVersionGap);
  }
  std::lock_guard<std::mutex> lock(mu_);
  recovered_pairs_ += report.snapshot_pairs;
  superseded_pairs_ += report.snapshot_superseded;
  recovered_log_records_ += report.log_records;
  recovered_log_bytes_ += report.log_bytes;
  recovery_us_ = std::max<uint64_t>(recovery_us_, report.took.count());
  fallbacks_ += report.fell_back ? 1 : 0;
  lost_records_ += report.lost_records;
  lossy_partitions_ += report.lost.empty() ? 0 : 1;
  stores_[p].push_back(std::move(*store));
  return stores_[p].back().get();
}

size_t Durability::OnPass(uint32_t p) {
  size_t work = 0;
  for (auto& s : stores_[p]) work += s->OnPass();
  return work;
}

std::optional<std::chrono::steady_clock::time_point> Durability::RetryAt(
    uint32_t p) const {
  std::optional<std::chrono::steady_clock::time_point> at;
  for (const auto& s : stores_[p]) {
    if (auto t = s->retry_at(); t && (!at || *t < *at)) at = t;
  }
  return at;
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

void Durability::Stop(uint32_t p) {
  for (auto& s : stores_[p]) s->Stop();
}

void Durability::AddStats(std::vector<proto::StatValue>* out) const {
  uint64_t log_bytes = 0, last_ms = 0, last_bytes = 0, snapshots = 0,
           snapshot_failures = 0, errors = 0, failing = 0;
  for (const auto& part : stores_) {
    for (const auto& s : part) {
      const StoreStats& d = s->stats();
      log_bytes += d.log_bytes.load();
      last_ms = std::max(last_ms, d.last_snapshot_unix_ms.load());
      last_bytes += d.last_snapshot_bytes.load();
      snapshots += d.snapshots.load();
      snapshot_failures += d.snapshot_failures.load();
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
  num("snapshot_failures", snapshot_failures);
  num("log_write_errors", errors);
  num("log_failing", failing);
  std::lock_guard<std::mutex> lock(mu_);
  num("recovered_pairs", recovered_pairs_);
  num("recovered_log_records", recovered_log_records_);
  num("recovered_log_bytes", recovered_log_bytes_);
  num("recovery_ms", recovery_us_ / 1000);
  num("recovery_fallbacks", fallbacks_);
  num("recovery_lost_records", lost_records_);
}

std::string Durability::recovery_summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s = fmt::format(
      "recovered {} pairs from snapshots and {} log records ({} bytes) in {} "
      "ms ({}, fsync {})",
      recovered_pairs_, recovered_log_records_, recovered_log_bytes_,
      recovery_us_ / 1000, options_.data_dir, FsyncPolicyName(options_.fsync));
  if (superseded_pairs_ > 0) {
    // Else a snapshot of 10 pairs, 5 of them deleted since, reads as 5.
    s += fmt::format(
        "; the snapshots held {} more pairs whose keys the log wrote or "
        "deleted since",
        superseded_pairs_);
  }
  if (fallbacks_ > 0) {
    s += fmt::format(
        "; {} partition(s) recovered from the generation before a corrupt "
        "snapshot",
        fallbacks_);
  }
  if (lossy_partitions_ > 0) {
    s += fmt::format(
        "; LOST: --recovery truncate dropped {} acknowledged log record(s) in "
        "{} partition(s), listed above",
        lost_records_, lossy_partitions_);
  }
  return s;
}

}  // namespace remem::durability
