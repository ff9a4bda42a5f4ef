#include "durability/store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include "util/log.h"

namespace remem::durability {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Work per snapshot step (the hash store: buckets scanned per pass).
constexpr uint64_t kSnapshotChunk = 512;
constexpr auto kRetryEvery = std::chrono::milliseconds(100);

// "prefix<digits>suffix" -> digits, or nullopt.
std::optional<uint64_t> NumberIn(const std::string& name,
                                 std::string_view prefix,
                                 std::string_view suffix) {
  if (name.size() <= prefix.size() + suffix.size() ||
      !name.starts_with(prefix) || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoull(digits);
}

// Is the unreadable record at the start of `rest` the torn final record of
// its file (a write cut short), rather than corruption in the middle? Torn
// if no whole, valid record follows it anywhere (a corrupted length field
// could otherwise pass a flipped record off as the tail).
bool LooksTorn(std::string_view rest) {
  const char magic[4] = {'R', 'M', 'R', 'L'};
  static_assert(kRecordMagic == 0x4C524D52);
  for (size_t at = 1; at + sizeof(RecordHeader) <= rest.size(); ++at) {
    at = rest.find(std::string_view(magic, 4), at);
    if (at == std::string_view::npos) break;
    Record r{};
    size_t n = 0;
    if (ParseRecord(rest.substr(at), &r, &n) == ParseOutcome::kOk) {
      return false;
    }
  }
  return true;
}

Status Truncate(const std::string& path, uint64_t size) {
  if (::truncate(path.c_str(), off_t(size)) != 0) {
    return Status::IOError("truncate " + path + ": " + std::strerror(errno));
  }
  return Status::OK();
}

std::string_view OutcomeName(ParseOutcome o) {
  switch (o) {
    case ParseOutcome::kShort:
      return "record runs past the end of the file";
    case ParseOutcome::kBad:
      return "bad header or checksum mismatch";
    case ParseOutcome::kUnknown:
      return "record of an unknown type (written by a newer remem?)";
    case ParseOutcome::kOk:
      break;
  }
  return "ok";
}

}  // namespace

std::string_view FsyncPolicyName(FsyncPolicy p) {
  switch (p) {
    case FsyncPolicy::kAlways:
      return "always";
    case FsyncPolicy::kEverySec:
      return "everysec";
    case FsyncPolicy::kNo:
      return "no";
  }
  return "?";
}

Result<FsyncPolicy> ParseFsyncPolicy(std::string_view s) {
  if (s == "always") return FsyncPolicy::kAlways;
  if (s == "everysec") return FsyncPolicy::kEverySec;
  if (s == "no") return FsyncPolicy::kNo;
  return Status::InvalidArgument("--fsync must be always, everysec or no");
}

Result<std::unique_ptr<PartitionStore>> PartitionStore::Open(
    const StoreOptions& options, Recoverable* state, RecoveryReport* report) {
  std::unique_ptr<PartitionStore> s(new PartitionStore(options, state));
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return Status::IOError(options.dir + ": " + ec.message());
  if (!options.fault.empty()) {
    auto f = ParseFaultSpec(options.fault);
    if (!f.ok()) return f.status();
    s->faults_ = std::make_shared<FaultState>(*f);
  }
  const auto start = Clock::now();
  REMEM_RETURN_IF_ERROR(s->Recover(report));
  report->took = std::chrono::duration_cast<std::chrono::microseconds>(
      Clock::now() - start);
  s->last_sync_ = Clock::now();
  return s;
}

PartitionStore::~PartitionStore() {
  scan_.reset();
  snap_.reset();
  if (log_ && !stats_.failing.load()) (void)log_->Flush(true);
}

Status PartitionStore::Recover(RecoveryReport* r) {
  const std::string& dir = options_.dir;
  std::vector<uint64_t> snaps, logs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (auto n = NumberIn(name, "snapshot-", ".snap")) {
      snaps.push_back(*n);
    } else if (auto m = NumberIn(name, "log-", ".rlog")) {
      logs.push_back(*m);
    } else if (name.ends_with(".tmp")) {
      fs::remove(e.path(), ec);  // an unfinished snapshot
      r->warnings.push_back("removed the unfinished snapshot " + name);
    }
  }
  if (ec) return Status::IOError(dir + ": " + ec.message());
  std::sort(snaps.begin(), snaps.end());
  std::sort(logs.begin(), logs.end());

  uint64_t start_lsn = 1;  // replay log records from here on
  uint64_t max_lsn = 0;
  if (!snaps.empty()) {
    const std::string name = SnapshotName(snaps.back());
    const std::string path = dir + "/" + name;
    auto file = MappedFile::Open(path);
    if (!file.ok()) return file.status();
    const std::string_view data = (*file)->data();
    // Verify the whole file before applying any of it.
    size_t off = 0;
    Record rec{};
    bool ended = false;
    while (off < data.size() && !ended) {
      size_t n = 0;
      ParseOutcome o = ParseRecord(data.substr(off), &rec, &n);
      if (o != ParseOutcome::kOk || (rec.type != RecordType::kPut &&
                                     rec.type != RecordType::kSnapshotEnd)) {
        return Status::Corruption(
            path + ": corrupt snapshot at byte offset " + std::to_string(off) +
            " (" + std::string(OutcomeName(o)) +
            "); move the file away to recover from older state");
      }
      off += n;
      ended = rec.type == RecordType::kSnapshotEnd;
    }
    if (!ended || off != data.size()) {
      return Status::Corruption(path +
                                ": snapshot has no end record at byte "
                                "offset " +
                                std::to_string(off));
    }
    const Record end = rec;
    uint64_t count = 0, shape = 0;
    if (end.value.size() >= 8) std::memcpy(&count, end.value.data(), 8);
    if (end.value.size() >= 16) std::memcpy(&shape, end.value.data() + 8, 8);
    // Shape the state as the live server had it when the snapshot was
    // taken (the hash store: its bucket count), in one step rather than by
    // growing again and again. Never more: a store that was full must fit
    // again in the same memory. The log after the snapshot grows it as the
    // live server grew.
    if (Status st = state_->Reserve(count, shape); !st.ok()) {
      return st.WithContext("sizing the state for " + path);
    }
    // Apply, prefetching the buckets of the record kAhead records on.
    constexpr size_t kAhead = 8;
    size_t at = 0, ahead = 0, ahead_count = 0;
    auto step = [&data](size_t* pos, Record* out) {
      size_t n = 0;
      (void)ParseRecord(data.substr(*pos), out, &n);
      *pos += n;
    };
    while (ahead < data.size() && ahead_count < kAhead) {
      Record a{};
      step(&ahead, &a);
      if (a.type == RecordType::kPut) state_->Prefetch(a.key);
      ++ahead_count;
    }
    while (at < data.size()) {
      step(&at, &rec);
      if (rec.type != RecordType::kPut) break;
      if (ahead < data.size()) {
        Record a{};
        step(&ahead, &a);
        if (a.type == RecordType::kPut) state_->Prefetch(a.key);
      }
      Status st = state_->ApplyPut(rec.key, rec.value, rec.version);
      if (!st.ok()) return st.WithContext("restoring " + path);
      ++r->snapshot_pairs;
    }
    state_->RaiseVersion(end.version);
    start_lsn = end.lsn;
    max_lsn = end.lsn - 1;
    r->snapshot = name;
    last_snapshot_ = name;
    stats_.last_snapshot_bytes = data.size();
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      stats_.last_snapshot_unix_ms = uint64_t(st.st_mtim.tv_sec) * 1000 +
                                     uint64_t(st.st_mtim.tv_nsec) / 1000000;
    }
    // Older snapshots are superseded.
    for (size_t i = 0; i + 1 < snaps.size(); ++i) {
      fs::remove(dir + "/" + SnapshotName(snaps[i]), ec);
    }
  }

  for (size_t i = 0; i < logs.size(); ++i) {
    const std::string path = dir + "/" + LogName(logs[i]);
    auto file = MappedFile::Open(path);
    if (!file.ok()) return file.status();
    const std::string_view data = (*file)->data();
    ++r->log_files;
    size_t off = 0;
    bool stop_all = false;
    size_t ahead = 0;  // prefetching runs a few records ahead
    while (off < data.size()) {
      while (ahead < data.size() && ahead < off + 8 * 64) {
        Record a{};
        size_t an = 0;
        if (ParseRecord(data.substr(ahead), &a, &an) != ParseOutcome::kOk) {
          ahead = data.size();
          break;
        }
        if (a.type == RecordType::kPut) state_->Prefetch(a.key);
        ahead += an;
      }
      Record rec{};
      size_t n = 0;
      ParseOutcome o = ParseRecord(data.substr(off), &rec, &n);
      if (o == ParseOutcome::kOk && rec.type != RecordType::kSnapshotEnd) {
        if (rec.lsn >= start_lsn) {
          Status st = rec.type == RecordType::kPut
                          ? state_->ApplyPut(rec.key, rec.value, rec.version)
                          : state_->ApplyDelete(rec.key, rec.version);
          if (!st.ok()) return st.WithContext("replaying " + path);
          ++r->log_records;
        }
        max_lsn = std::max(max_lsn, rec.lsn);
        off += n;
        continue;
      }
      if (o == ParseOutcome::kOk) o = ParseOutcome::kBad;
      const bool last = i + 1 == logs.size();
      const std::string where = path + " at byte offset " + std::to_string(off);
      if (o != ParseOutcome::kUnknown && last && LooksTorn(data.substr(off))) {
        r->warnings.push_back("torn final record in " + where + " (" +
                              std::string(OutcomeName(o)) + "): truncated " +
                              std::to_string(data.size() - off) + " bytes");
      } else if (options_.recovery == RecoveryMode::kTruncate) {
        r->warnings.push_back(
            "corruption in " + where + " (" + std::string(OutcomeName(o)) +
            "): --recovery=truncate drops it and everything after it");
        for (size_t j = i + 1; j < logs.size(); ++j) {
          fs::remove(dir + "/" + LogName(logs[j]), ec);
        }
        logs.resize(i + 1);
        stop_all = true;
      } else {
        return Status::Corruption(
            "corruption in " + where + " (" + std::string(OutcomeName(o)) +
            "); refusing to start. Start with --recovery=truncate to drop "
            "this record and everything after it");
      }
      r->truncated_bytes += data.size() - off;
      (*file).reset();
      REMEM_RETURN_IF_ERROR(Truncate(path, off));
      break;
    }
    if (stop_all) break;
  }
  // Closed logs stay until a snapshot covers them; those a finished
  // snapshot already covers (a crash before their deletion) go now.
  for (uint64_t first : logs) {
    const std::string path = dir + "/" + LogName(first);
    auto size = fs::file_size(path, ec);
    if (ec) continue;
    old_logs_.push_back({first, path, uint64_t(size)});
  }
  const uint64_t next = std::max(max_lsn + 1, start_lsn);
  for (auto it = old_logs_.begin(); it != old_logs_.end();) {
    // A log wholly before the snapshot (the next file starts at or before
    // the snapshot's LSN), or one that is empty and would be reopened.
    const auto next_it = it + 1;
    const bool covered =
        next_it != old_logs_.end() && next_it->first_lsn <= start_lsn;
    if (covered || (it->bytes == 0 && it->first_lsn == next)) {
      fs::remove(it->path, ec);
      it = old_logs_.erase(it);
    } else {
      ++it;
    }
  }
  // The log since the snapshot counts toward the next one, whenever it was
  // written: a restart must not reset the trigger, or the log would grow
  // without bound across restarts (and recovery time with it).
  for (const auto& l : old_logs_) log_bytes_since_snapshot_ += l.bytes;
  REMEM_RETURN_IF_ERROR(OpenLog(next));
  UpdateLogBytes();
  return Status::OK();
}

Status PartitionStore::OpenLog(uint64_t first_lsn) {
  auto f = CreateFile(options_.dir + "/" + LogName(first_lsn));
  if (!f.ok()) return f.status();
  std::unique_ptr<File> file =
      faults_ ? WithFaults(std::move(*f), faults_) : std::move(*f);
  REMEM_RETURN_IF_ERROR(SyncDir(options_.dir));
  log_ = std::make_unique<LogWriter>(std::move(file), first_lsn);
  return Status::OK();
}

void PartitionStore::UpdateLogBytes() {
  uint64_t total = log_ ? log_->bytes() : 0;
  for (const auto& l : old_logs_) total += l.bytes;
  stats_.log_bytes.store(total, std::memory_order_relaxed);
}

Status PartitionStore::FlushNow(bool sync) {
  const uint64_t before = log_->bytes();
  Status st = log_->Flush(sync);
  log_bytes_since_snapshot_ += log_->bytes() - before;
  UpdateLogBytes();
  if (!st.ok()) {
    stats_.write_errors.fetch_add(1, std::memory_order_relaxed);
    if (!stats_.failing.load(std::memory_order_relaxed)) {
      log::Error("durability: {}; writes are refused until it succeeds",
                 st.message());
    }
    stats_.failing.store(1, std::memory_order_relaxed);
    error_ =
        Status::IOError("the operation log cannot be written (" + st.message() +
                        "); writes are refused until it can, reads go on");
    last_retry_ = Clock::now();
    return error_;
  }
  if (stats_.failing.load(std::memory_order_relaxed)) {
    stats_.failing.store(0, std::memory_order_relaxed);
    log::Info("durability: {} is writable again", log_->path());
  }
  if (sync) last_sync_ = Clock::now();
  return Status::OK();
}

Status PartitionStore::Writable() {
  if (!stats_.failing.load(std::memory_order_relaxed)) return Status::OK();
  const auto now = Clock::now();
  if (now - last_retry_ < kRetryEvery) return error_;
  last_retry_ = now;
  return FlushNow(options_.fsync != FsyncPolicy::kNo);
}

void PartitionStore::LogPut(std::string_view key, std::string_view value,
                            uint64_t version) {
  log_->Append(RecordType::kPut, version, key, value);
}

void PartitionStore::LogDelete(std::string_view key, uint64_t version) {
  log_->Append(RecordType::kDelete, version, key, {});
}

void PartitionStore::AfterDurable(Done done) {
  if (!log_->has_pending() && waiting_.empty()) return done(Status::OK());
  waiting_.push_back(std::move(done));
}

size_t PartitionStore::OnPass() {
  size_t work = 0;
  if (!waiting_.empty() || (log_->has_pending() && !stats_.failing.load())) {
    Status st = stats_.failing.load()
                    ? Writable()
                    : FlushNow(options_.fsync == FsyncPolicy::kAlways);
    std::vector<Done> waiting;
    waiting.swap(waiting_);
    for (auto& fn : waiting) fn(st);
    work += waiting.size() + 1;
  }
  if (options_.fsync == FsyncPolicy::kEverySec && log_->has_unsynced() &&
      !stats_.failing.load() &&
      Clock::now() - last_sync_ >= std::chrono::seconds(1)) {
    (void)FlushNow(true);
  }
  if (snap_) {
    StepSnapshot();
    ++work;
  } else if (options_.snapshot_log_bytes > 0 &&
             log_bytes_since_snapshot_ >= options_.snapshot_log_bytes &&
             // Also at least the last snapshot's size, so snapshots of a
             // large store do not rewrite it for every little log growth.
             log_bytes_since_snapshot_ >=
                 stats_.last_snapshot_bytes.load(std::memory_order_relaxed) &&
             !stats_.failing.load()) {
    Status st = StartSnapshot();
    if (!st.ok()) {
      stats_.write_errors.fetch_add(1, std::memory_order_relaxed);
      log::Error("durability: cannot start a snapshot: {}", st.message());
      log_bytes_since_snapshot_ = 0;  // try again after as much more log
    }
    ++work;
  }
  return work;
}

void PartitionStore::RequestSnapshot(Done done) {
  snap_waiting_.push_back(std::move(done));
  if (snap_) return;
  Status st = stats_.failing.load() ? error_ : StartSnapshot();
  if (!st.ok()) EndSnapshot(st, 0);
}

Status PartitionStore::StartSnapshot() {
  // Everything before the snapshot's LSN is on disk, synced, in closed
  // files; the log continues in a new file that starts at that LSN.
  REMEM_RETURN_IF_ERROR(FlushNow(true));
  const uint64_t lsn = log_->next_lsn();
  if (log_->first_lsn() != lsn) {
    // (An empty log already starts at the snapshot's LSN: keep it, or the
    // snapshot's clean-up would delete the live file.)
    OldLog old{log_->first_lsn(), log_->path(), log_->bytes()};
    REMEM_RETURN_IF_ERROR(OpenLog(lsn));
    old_logs_.push_back(old);
  }
  auto w = SnapshotWriter::Create(options_.dir, lsn, faults_);
  if (!w.ok()) return w.status();
  snap_ = std::move(*w);
  scan_ = state_->BeginSnapshot();
  log_bytes_since_snapshot_ = 0;
  return Status::OK();
}

void PartitionStore::StepSnapshot() {
  if (options_.slow_snapshot_us > 0) {
    std::this_thread::sleep_for(
        std::chrono::microseconds(options_.slow_snapshot_us));
  }
  const bool done = scan_->Step(
      snap_.get(), options_.slow_snapshot_us > 0 ? 8 : kSnapshotChunk);
  Status st = snap_->MaybeWrite();
  if (!st.ok()) return EndSnapshot(st, 0);
  if (!done) return;
  auto bytes = snap_->Finish(state_->last_version(), scan_->shape());
  EndSnapshot(bytes.ok() ? Status::OK() : bytes.status(),
              bytes.ok() ? *bytes : 0);
}

void PartitionStore::EndSnapshot(Status st, uint64_t bytes) {
  scan_.reset();
  if (st.ok() && snap_) {
    const uint64_t lsn = snap_->start_lsn();
    const std::string name = SnapshotName(lsn);
    std::error_code ec;
    if (!last_snapshot_.empty() && last_snapshot_ != name) {
      fs::remove(options_.dir + "/" + last_snapshot_, ec);
    }
    last_snapshot_ = name;
    // Every closed log lies wholly before the snapshot's LSN.
    for (const auto& l : old_logs_) fs::remove(l.path, ec);
    old_logs_.clear();
    (void)SyncDir(options_.dir);
    stats_.last_snapshot_bytes.store(bytes);
    stats_.last_snapshot_unix_ms.store(
        uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()));
    stats_.snapshots.fetch_add(1);
    log::Info("durability: snapshot {} of {} pairs, {} bytes", name,
              snap_->pairs(), bytes);
  } else if (!st.ok()) {
    stats_.write_errors.fetch_add(1, std::memory_order_relaxed);
    log::Error("durability: snapshot failed: {}", st.message());
  }
  snap_.reset();
  UpdateLogBytes();
  std::vector<Done> waiting;
  waiting.swap(snap_waiting_);
  for (auto& fn : waiting) fn(st);
}

}  // namespace remem::durability
