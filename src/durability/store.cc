#include "durability/store.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

#include "util/log.h"

namespace remem::durability {

using Clock = std::chrono::steady_clock;

namespace {

// Work per snapshot step (the hash store: buckets scanned per pass).
constexpr uint64_t kSnapshotChunk = 512;
// Bytes of a written snapshot verified per pass.
constexpr size_t kVerifyChunk = 8 << 20;
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

// Every whole, valid record in `data` found by scanning for the magic from
// `from` on: calls fn(record).
template <typename Fn>
void ResyncRecords(std::string_view data, size_t from, Fn fn) {
  const char magic[4] = {'R', 'M', 'R', 'L'};
  static_assert(kRecordMagic == 0x4C524D52);
  for (size_t at = from; at + sizeof(RecordHeader) <= data.size(); ++at) {
    at = data.find(std::string_view(magic, 4), at);
    if (at == std::string_view::npos) break;
    Record r{};
    size_t n = 0;
    if (ParseRecord(data.substr(at), &r, &n) == ParseOutcome::kOk) {
      fn(r);
      at += n - 1;
    }
  }
}

// Is the unreadable record at the start of `rest` the torn final record of
// its file (a write cut short), rather than corruption in the middle? Torn
// if no whole, valid record follows it anywhere (a corrupted length field
// could otherwise pass a flipped record off as the tail).
bool LooksTorn(std::string_view rest) {
  bool valid_after = false;
  ResyncRecords(rest, 1, [&](const Record&) { valid_after = true; });
  return !valid_after;
}

std::string Range(uint64_t from, uint64_t to) {
  if (to < from) return "LSN " + std::to_string(from) + " and after";
  return "LSN " + std::to_string(from) + ".." + std::to_string(to) + " (" +
         std::to_string(to - from + 1) + " records)";
}

constexpr std::string_view kRunFile = "run";
constexpr std::string_view kRunMagic = "remem-run";

std::string Hex(std::string_view bytes) {
  static const char* const kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    out.push_back(kDigits[uint8_t(c) >> 4]);
    out.push_back(kDigits[uint8_t(c) & 15]);
  }
  return out;
}

std::optional<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(char(hi << 4 | lo));
  }
  return out;
}

// The run file: "remem-run <clean|running> lsn L version V note HEX".
struct RunState {
  bool clean = false;
  uint64_t lsn = 0;
  uint64_t version = 0;
  std::string note;
};

std::optional<RunState> ParseRun(std::string_view text) {
  std::vector<std::string_view> words;
  while (!text.empty()) {
    const size_t sp = text.find_first_of(" \n");
    if (sp != 0) words.push_back(text.substr(0, sp));
    if (sp == std::string_view::npos) break;
    text.remove_prefix(sp + 1);
  }
  if (words.size() != 8 || words[0] != kRunMagic || words[2] != "lsn" ||
      words[4] != "version" || words[6] != "note" ||
      (words[1] != "clean" && words[1] != "running")) {
    return std::nullopt;
  }
  RunState r;
  r.clean = words[1] == "clean";
  for (auto [word, out] :
       {std::pair{words[3], &r.lsn}, std::pair{words[5], &r.version}}) {
    if (word.empty() || word.size() > 19 ||
        word.find_first_not_of("0123456789") != std::string_view::npos) {
      return std::nullopt;
    }
    *out = std::stoull(std::string(word));
  }
  auto note = Unhex(words[7] == "-" ? std::string_view() : words[7]);
  if (!note) return std::nullopt;
  r.note = std::move(*note);
  return r;
}

uint64_t UnixMs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count());
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
  s->env_ = options.env != nullptr ? options.env : Env::Posix();
  s->base_env_ = s->env_;
  if (!options.fault.empty()) {
    auto f = ParseFaultSpec(options.fault);
    if (!f.ok()) return f.status();
    s->own_env_ = std::make_unique<FaultyEnv>(s->env_, std::move(*f));
    s->env_ = s->own_env_.get();
  }
  auto dir = s->env_->CreateDir(options.dir);
  if (!dir.ok()) return dir.status();
  const auto start = Clock::now();
  REMEM_RETURN_IF_ERROR(s->Recover(report));
  report->took = std::chrono::duration_cast<std::chrono::microseconds>(
      Clock::now() - start);
  s->last_sync_ = Clock::now();
  return s;
}

PartitionStore::~PartitionStore() {
  scan_.reset();
  check_.reset();
  verify_data_.reset();
  snap_.reset();
  if (!log_) return;
  const uint64_t records = log_->pending_records();
  const Status st = log_->Flush(true);
  if (st.ok()) {
    if (stats_.failing.load(std::memory_order_relaxed) && records > 0) {
      log::Info("durability: {} took the {} buffered record(s) at the stop",
                log_->path(), records);
    }
    // A clean stop: every record of the run is in the log. Not if a write
    // of the run failed (its change may have been served before the disk
    // took its record, or never): the next start skips versions.
    // (A start that failed before its run began has no stop to mark.)
    if (running_ && stats_.write_errors.load(std::memory_order_relaxed) == 0) {
      const Status run =
          WriteRun(true, log_->next_lsn() - 1, state_->last_version());
      if (!run.ok()) {
        log::Warn(
            "durability: cannot mark the stop of {} clean ({}): the next "
            "start skips versions as after a crash",
            options_.dir, run.message());
      }
    }
    return;
  }
  if (records > 0) {
    log::Warn(
        "durability: stopping with {} log record(s) of {} that the disk did "
        "not take ({}): they are lost (their writes were answered with an "
        "error, or not at all)",
        records, options_.dir, st.message());
  } else {
    log::Warn(
        "durability: the last sync of {} failed at the stop ({}): what was "
        "written since the last sync may be lost if the OS crashes",
        log_->path(), st.message());
  }
}

Result<std::unique_ptr<FileData>> PartitionStore::ReadWhole(
    const std::string& path) {
  auto d = env_->ReadFile(path);
  if (!d.ok()) return d.status();
  // A short read would look like a torn tail, and recovery truncates torn
  // tails: never trust one.
  auto size = env_->FileSize(path);
  if (!size.ok()) return size.status();
  if ((*d)->data().size() != *size) {
    return Status::IOError("read " + path + ": got " +
                           std::to_string((*d)->data().size()) + " of " +
                           std::to_string(*size) + " bytes");
  }
  return d;
}

Status PartitionStore::KeepBytes(const std::string& path,
                                 std::string_view bytes) {
  auto f = env_->NewWritableFile(path);
  if (!f.ok()) return f.status();
  for (size_t done = 0; done < bytes.size();) {
    auto n = (*f)->Write(bytes.data() + done, bytes.size() - done);
    if (!n.ok()) return n.status();
    if (*n == 0) {
      return Status::IOError("cannot keep the bytes cut from the log in " +
                             path + ": the write made no progress");
    }
    done += *n;
  }
  return (*f)->Sync();
}

Status PartitionStore::WriteRun(bool clean, uint64_t lsn, uint64_t version) {
  const std::string note = state_->RunNote();
  return WriteFileAtomically(
      base_env_, options_.dir, std::string(kRunFile),
      std::string(kRunMagic) + (clean ? " clean" : " running") + " lsn " +
          std::to_string(lsn) + " version " + std::to_string(version) +
          " note " + (note.empty() ? std::string("-") : Hex(note)) + "\n");
}

Status PartitionStore::Recover(RecoveryReport* r) {
  const std::string& dir = options_.dir;
  auto names = env_->ListDir(dir);
  if (!names.ok()) return names.status();
  // The run file: how the previous run ended, its version counter, the
  // state's note.
  std::optional<RunState> run;
  bool run_present = false;
  {
    const std::string path = PathOf(std::string(kRunFile));
    auto exists = base_env_->FileExists(path);
    if (!exists.ok()) return exists.status();
    if (*exists) {
      run_present = true;
      auto d = base_env_->ReadFile(path);
      if (!d.ok()) return d.status().WithContext("reading the run file");
      run = ParseRun((*d)->data());
      if (!run) {
        r->warnings.push_back(path +
                              " is unreadable: taken as a run that did not "
                              "stop cleanly");
      } else {
        Status st = state_->LoadRunNote(run->note);
        if (!st.ok()) return st.WithContext("loading " + path);
      }
    }
  }
  std::vector<uint64_t> snaps, logs;
  std::vector<std::string> tmps;
  for (const std::string& name : *names) {
    if (auto n = NumberIn(name, "snapshot-", ".snap")) {
      snaps.push_back(*n);
    } else if (auto m = NumberIn(name, "log-", ".rlog")) {
      logs.push_back(*m);
    } else if (name.ends_with(".tmp")) {
      tmps.push_back(name);
    } else if (name.ends_with(".corrupt") || name.ends_with(".dropped") ||
               name.ends_with(".torn")) {
      aside_.push_back(name);
    }
  }
  std::sort(snaps.begin(), snaps.end());
  std::sort(logs.begin(), logs.end());

  // 1. The base: the newest snapshot that reads back whole.
  std::unique_ptr<FileData> snap_data;
  SnapshotEnd base;
  base.lsn = 1;  // no snapshot: the empty state at LSN 1
  size_t base_index = snaps.size();
  std::vector<std::string> corrupt, unreadable;
  for (size_t i = snaps.size(); i-- > 0;) {
    const std::string name = SnapshotName(snaps[i]);
    auto d = ReadWhole(PathOf(name));
    Result<SnapshotEnd> end =
        d.ok() ? CheckSnapshot((*d)->data()) : Result<SnapshotEnd>(d.status());
    if (end.ok() && end->lsn != snaps[i]) {
      end = Status::Corruption("its end record names LSN " +
                               std::to_string(end->lsn));
    }
    if (!end.ok()) {
      r->warnings.push_back(
          "snapshot " + PathOf(name) + " is unusable (" +
          end.status().message() +
          "); recovering from the generation before it instead");
      r->fell_back = true;
      (d.ok() ? corrupt : unreadable).push_back(name);
      continue;
    }
    snap_data = std::move(*d);
    base = *end;
    base_index = i;
    break;
  }

  // 2. The log from the base's LSN: read and verify all of it, no LSN
  // missing, and keep each key's last record (views into the files).
  std::vector<std::unique_ptr<FileData>> log_data(logs.size());
  std::vector<Record> finals;
  std::unordered_map<std::string_view, size_t> last_of;
  uint64_t expect = base.lsn;
  uint64_t max_version = base.version;
  uint64_t shape = base.shape;
  struct Problem {
    size_t file;
    uint64_t offset;
    std::string what;
  };
  std::optional<Problem> problem;
  // With the problem "the log begins after the base": the first LSN the
  // log holds (the writes before it were only in unusable snapshots).
  uint64_t only_in_snapshots = 0;
  std::optional<std::pair<size_t, uint64_t>> torn;  // file, offset
  // The records of an atomic group not yet closed (kMoreInGroup), and
  // where it began: it reaches `finals` only whole.
  std::vector<Record> group;
  struct GroupStart {
    size_t file;
    uint64_t offset;
    uint64_t lsn;
    uint64_t bytes;  // of its records read so far
  } group_start{};
  auto take = [&finals, &last_of](const Record& rec) {
    // The last record of a key in log order is its state: versions
    // need not grow along the log (a shard that moved away and came
    // back logs the delete that released it, with a new version,
    // then its pairs re-imported at their older versions).
    auto [it, fresh] = last_of.try_emplace(rec.key, finals.size());
    if (fresh) {
      finals.push_back(rec);
    } else {
      finals[it->second] = rec;
    }
  };
  // Files wholly before the base (the next one starts at or before its LSN)
  // hold nothing recovery needs.
  size_t first = 0;
  while (first + 1 < logs.size() && logs[first + 1] <= base.lsn) ++first;
  for (size_t i = first; i < logs.size() && !problem; ++i) {
    const std::string path = PathOf(LogName(logs[i]));
    auto d = ReadWhole(path);
    if (!d.ok()) {
      // Not corruption: a file that cannot be read (its permissions, an
      // I/O error) may read tomorrow. Neither mode drops it, nor counts as
      // lost records it could not read.
      return Status::IOError(
          "cannot read " + path + " (" + d.status().message() +
          "), which recovery needs (LSN " + std::to_string(expect) +
          " on). Refusing to start, with nothing changed on disk, under "
          "any --recovery: make it readable by this server's user, or move "
          "it away to start without its records and every later one");
    }
    ++r->log_files;
    const std::string_view data = (*d)->data();
    log_data[i] = std::move(*d);
    size_t off = 0;
    while (off < data.size()) {
      Record rec{};
      size_t n = 0;
      ParseOutcome o = ParseRecord(data.substr(off), &rec, &n);
      if (o == ParseOutcome::kOk && rec.type != RecordType::kSnapshotEnd) {
        if (rec.lsn < base.lsn) {  // before the base: not needed
          off += n;
          continue;
        }
        if (rec.lsn != expect) {
          std::string why;
          if (rec.lsn < expect) {
            why = "record LSN " + std::to_string(rec.lsn) + " is out of order";
          } else if (off == 0 && i == first &&
                     (!corrupt.empty() || !unreadable.empty())) {
            // The first log begins after the base: the writes before it
            // were only in the snapshots that did not read back.
            why = "the log begins at LSN " + std::to_string(rec.lsn) +
                  ", and the snapshots that held LSN " +
                  std::to_string(expect) + ".." + std::to_string(rec.lsn - 1) +
                  " are unusable (above)";
            only_in_snapshots = rec.lsn;
          } else {
            why = "the log jumps to LSN " + std::to_string(rec.lsn) +
                  " (a log file is missing)";
          }
          problem = Problem{i, off, why};
          break;
        }
        if (rec.type == RecordType::kShape) {
          uint64_t s = 0;
          if (rec.value.size() == 8) std::memcpy(&s, rec.value.data(), 8);
          shape = std::max(shape, s);
        } else {
          if (group.empty() && (rec.flags & kMoreInGroup) != 0) {
            group_start = GroupStart{i, off, rec.lsn, 0};
          }
          if (!group.empty() || (rec.flags & kMoreInGroup) != 0) {
            group.push_back(rec);
            group_start.bytes += n;
            if ((rec.flags & kMoreInGroup) == 0) {
              for (const Record& g : group) take(g);
              group.clear();
            }
          } else {
            take(rec);
          }
          max_version = std::max(max_version, rec.version);
        }
        ++expect;
        ++r->log_records;
        r->log_bytes += n;
        off += n;
        continue;
      }
      if (o == ParseOutcome::kOk) o = ParseOutcome::kBad;
      if (o != ParseOutcome::kUnknown && i + 1 == logs.size() &&
          LooksTorn(data.substr(off))) {
        torn = {i, off};
        r->truncated_bytes += data.size() - off;
        r->warnings.push_back(
            "torn final record in " + path + " at byte offset " +
            std::to_string(off) + " (" + std::string(ParseOutcomeText(o)) +
            "): truncated " + std::to_string(data.size() - off) +
            " bytes, kept in " + path + ".torn until the next snapshot");
      } else {
        problem = Problem{i, off, std::string(ParseOutcomeText(o))};
      }
      break;
    }
  }

  // An atomic group the log's end (or a problem) cut short: none of it is
  // applied, and the log resumes at its first LSN.
  if (!group.empty()) {
    const std::string path = PathOf(LogName(logs[group_start.file]));
    const uint64_t end = log_data[group_start.file]
                             ? log_data[group_start.file]->data().size()
                             : 0;
    r->log_records -= group.size();
    r->log_bytes -= group_start.bytes;
    expect = group_start.lsn;
    if (problem) {
      // The problem drops the group's records too.
      problem->file = group_start.file;
      problem->offset = group_start.offset;
    } else if (group_start.file + 1 == logs.size()) {
      if (torn) {
        // The torn record was the group's next: one warning says both.
        r->truncated_bytes += torn->second - group_start.offset;
        r->warnings.pop_back();
      } else {
        r->truncated_bytes += end - group_start.offset;
      }
      torn = {group_start.file, group_start.offset};
      r->warnings.push_back(
          "an atomic group cut short at the end of " + path +
          " (from byte offset " + std::to_string(group_start.offset) +
          ": its " + std::to_string(group.size()) +
          " whole records and what followed; a write cut short): none of it "
          "applied, truncated");
    } else {
      problem = Problem{group_start.file, group_start.offset,
                        "an atomic group of records runs past the end of "
                        "its file"};
    }
    // Its records are never applied; what they consumed stays consumed.
    for (const Record& g : group) {
      state_->NoteDropped(g.key, g.value, g.version);
    }
    group.clear();
  }

  // What a problem puts out of reach.
  size_t drop_from = logs.size();  // log files set aside (kTruncate)
  if (problem) {
    uint64_t newest = expect - 1;
    auto note = [this, &newest, &max_version](const Record& rec) {
      if (rec.type != RecordType::kSnapshotEnd) {
        newest = std::max(newest, rec.lsn);
      }
      if (rec.type == RecordType::kPut || rec.type == RecordType::kDelete) {
        state_->NoteDropped(rec.key, rec.value, rec.version);
      }
      // Versions the dropped writes consumed are never reused (a client
      // may hold one for compare-and-put).
      max_version = std::max(max_version, rec.version);
    };
    for (const std::string& name : corrupt) {
      auto d = ReadWhole(PathOf(name));
      if (d.ok()) ResyncRecords((*d)->data(), 0, note);
    }
    if (log_data[problem->file]) {
      ResyncRecords(log_data[problem->file]->data(), problem->offset + 1, note);
    }
    std::string files = PathOf(LogName(logs[problem->file])) +
                        " from byte offset " + std::to_string(problem->offset);
    for (size_t j = problem->file + 1; j < logs.size(); ++j) {
      files += ", " + LogName(logs[j]);
      auto d = ReadWhole(PathOf(LogName(logs[j])));
      if (d.ok()) ResyncRecords((*d)->data(), 0, note);
    }
    const std::string from = snap_data
                                 ? PathOf(SnapshotName(base.lsn))
                                 : std::string("the empty state at LSN 1");
    const std::string reach =
        expect > 1 ? "LSN " + std::to_string(expect - 1) : "no record";
    const std::string out_of_reach =
        only_in_snapshots > expect
            ? "the writes " + Range(expect, newest) + " are out of reach (" +
                  Range(only_in_snapshots, newest) + " in " + files +
                  ", the others only in those snapshots)"
            : "the log records " + Range(expect, newest) + " in " + files +
                  " are out of reach";
    const std::string what =
        problem->what + " in " + PathOf(LogName(logs[problem->file])) +
        " at byte offset " + std::to_string(problem->offset) +
        ": recovery from " + from + " reaches " + reach + "; " + out_of_reach;
    if (options_.recovery == RecoveryMode::kStrict) {
      return Status::Corruption(
          "corruption: " + what +
          ". Refusing to start. Start with --recovery=truncate to start " +
          (expect > 1 ? "from LSN " + std::to_string(expect - 1) : "empty") +
          " and drop them");
    }
    r->lost.push_back(what + ": dropped (--recovery=truncate)");
    r->lost_records += newest >= expect ? newest - expect + 1 : 0;
    drop_from = problem->file + 1;
  }

  // A snapshot's log starts at its LSN and is made before the snapshot is
  // (StartSnapshot), and recovery reopens an empty one in place, so the
  // base's log is never missing unless something removed it. A later log
  // file would show the gap above (the log jumps); the newest one does not,
  // and the records it held (how many, no file says) would be lost without
  // a word.
  if (snap_data && !problem &&
      !std::binary_search(logs.begin(), logs.end(), base.lsn)) {
    const std::string what =
        PathOf(LogName(base.lsn)) + ", the log that begins at " +
        PathOf(SnapshotName(base.lsn)) +
        ", is missing: the writes logged after that snapshot (LSN " +
        std::to_string(base.lsn) + " on) are out of reach";
    if (options_.recovery == RecoveryMode::kStrict) {
      return Status::Corruption(
          "corruption: " + what +
          ". Refusing to start. Put the file back, or start with "
          "--recovery=truncate to start from the snapshot (LSN " +
          std::to_string(base.lsn - 1) + ") and drop them");
    }
    r->lost.push_back(what + ": dropped (--recovery=truncate)");
  }

  // 3. Apply the final state: the snapshot's pairs the log does not
  // supersede, then each key's last log record. Nothing is written twice.
  // Shaped as the live state was last, in one step: never larger, so the
  // state fits the same memory (the hash store: the bucket count its table
  // had, not one grown by another order of inserts).
  if (shape > 0) {
    if (Status st = state_->Reserve(base.pairs, shape); !st.ok()) {
      return st.WithContext("sizing the state for " + dir);
    }
  }
  // Each key's last log record, applied from finals[next_final] on: after
  // the snapshot's pairs, or, for a state that builds densest from keys in
  // order (the tree), merged into the snapshot's stream (itself in key
  // order), every record before the snapshot pair it sorts below. (Applied
  // after the snapshot, a full tree's new keys split its rebuilt, full
  // leaves one by one, and the tree did not fit the region it had filled.)
  const bool in_key_order = state_->AppliesInKeyOrder();
  if (in_key_order) {
    std::sort(finals.begin(), finals.end(),
              [](const Record& a, const Record& b) { return a.key < b.key; });
  }
  size_t next_final = 0;
  // Applies the records below `bound` (all of them if `all`).
  auto apply_finals = [&](std::string_view bound, bool all) -> Status {
    for (; next_final < finals.size(); ++next_final) {
      const size_t k = next_final;
      if (!all && !(finals[k].key < bound)) break;
      if (k + 8 < finals.size() && finals[k + 8].type == RecordType::kPut) {
        state_->Prefetch(finals[k + 8].key);
      }
      const Record& rec = finals[k];
      Status st = rec.type != RecordType::kDelete
                      ? state_->ApplyPut(rec.key, rec.value, rec.version)
                      : state_->ApplyDelete(rec.key, rec.version);
      if (!st.ok()) {
        return st.WithContext("replaying the log of " + dir + " (LSN " +
                              std::to_string(rec.lsn) + ")");
      }
    }
    return Status::OK();
  };
  if (snap_data) {
    const std::string path = PathOf(SnapshotName(base.lsn));
    const std::string_view data = snap_data->data();
    constexpr size_t kAhead = 8;  // prefetch the record this far ahead
    size_t at = 0, ahead = 0;
    auto next = [&data](size_t* pos, Record* out) {
      size_t n = 0;
      (void)ParseRecord(data.substr(*pos), out, &n);  // verified above
      *pos += n;
    };
    for (size_t k = 0; k < kAhead && ahead < data.size(); ++k) {
      Record a{};
      next(&ahead, &a);
      if (a.type == RecordType::kPut) state_->Prefetch(a.key);
    }
    while (at < data.size()) {
      Record rec{};
      next(&at, &rec);
      if (rec.type != RecordType::kPut) break;
      if (ahead < data.size()) {
        Record a{};
        next(&ahead, &a);
        if (a.type == RecordType::kPut) state_->Prefetch(a.key);
      }
      if (in_key_order) {
        REMEM_RETURN_IF_ERROR(apply_finals(rec.key, false));
      }
      // A key the log after the snapshot's LSN writes ends as the log
      // says (whatever the versions).
      if (last_of.count(rec.key) != 0) {
        ++r->snapshot_superseded;
        continue;
      }
      Status st = state_->ApplyPut(rec.key, rec.value, rec.version);
      if (!st.ok()) return st.WithContext("restoring " + path);
      ++r->snapshot_pairs;
    }
    state_->RaiseVersion(base.version);
    r->snapshot = SnapshotName(base.lsn);
  }
  REMEM_RETURN_IF_ERROR(apply_finals({}, true));
  // A clean start: the previous run stopped cleanly (its run file says so,
  // naming the LSN recovery reached) and recovery dropped nothing; or a new
  // partition. Otherwise a write the previous run applied in memory, and
  // that some client read, may be missing from the log: skip versions, so
  // that none it consumed is handed out again.
  const bool fresh = snaps.empty() && logs.empty() && !run_present;
  const bool clean =
      !options_.unclean &&
      (fresh || (run && run->clean && run->lsn == expect - 1 && !problem &&
                 !torn && !r->fell_back && r->lost.empty()));
  if (run) max_version = std::max(max_version, run->version);
  if (!clean) {
    r->unclean = true;
    max_version += kUncleanVersionGap;
  }
  state_->RaiseVersion(max_version);
  if (!clean) state_->RecoveredUncleanly(kUncleanVersionGap);
  state_->EndRecovery();
  logged_shape_ = state_->shape();
  r->last_lsn = expect - 1;
  const uint64_t snap_bytes = snap_data ? snap_data->data().size() : 0;
  std::vector<std::string> problem_tail;  // what a problem drops of its file
  std::string torn_tail;                  // what a torn write's cut drops
  if (torn && log_data[torn->first]) {
    torn_tail = std::string(log_data[torn->first]->data().substr(torn->second));
  }
  if (problem && log_data[problem->file]) {
    const std::string_view d = log_data[problem->file]->data();
    problem_tail.emplace_back(d.substr(problem->offset));
  }
  last_of.clear();
  finals.clear();
  snap_data.reset();
  log_data.clear();

  // 4. The files, now that the state is whole (nothing changed on disk
  // before this point).
  for (const std::string& name : tmps) {
    REMEM_RETURN_IF_ERROR(env_->RemoveFile(PathOf(name)));
    r->warnings.push_back("removed the unfinished snapshot " + PathOf(name));
  }
  for (const std::string& name : corrupt) {
    REMEM_RETURN_IF_ERROR(
        env_->Rename(PathOf(name), PathOf(name + ".corrupt")));
    aside_.push_back(name + ".corrupt");
    r->warnings.push_back("kept " + PathOf(name + ".corrupt") +
                          " until the next snapshot is verified");
  }
  for (const std::string& name : unreadable) aside_.push_back(name);
  if (torn) {
    // The bytes cut off are kept beside the log until the next snapshot: a
    // write a crash cut short looks like this, but so does damage to the
    // log's last record, which a post-mortem can tell apart.
    const std::string path = PathOf(LogName(logs[torn->first]));
    REMEM_RETURN_IF_ERROR(KeepBytes(path + ".torn", torn_tail));
    aside_.push_back(LogName(logs[torn->first]) + ".torn");
    REMEM_RETURN_IF_ERROR(env_->TruncateFile(path, torn->second));
  }
  if (problem) {
    const std::string path = PathOf(LogName(logs[problem->file]));
    if (problem->offset == 0) {
      REMEM_RETURN_IF_ERROR(env_->Rename(path, path + ".dropped"));
    } else {
      if (!problem_tail.empty()) {
        // Keep the dropped bytes beside the log, for a post-mortem.
        REMEM_RETURN_IF_ERROR(KeepBytes(path + ".dropped", problem_tail[0]));
      }
      REMEM_RETURN_IF_ERROR(env_->TruncateFile(path, problem->offset));
      r->truncated_bytes += problem_tail.empty() ? 0 : problem_tail[0].size();
    }
    aside_.push_back(LogName(logs[problem->file]) + ".dropped");
    for (size_t j = drop_from; j < logs.size(); ++j) {
      const std::string p = PathOf(LogName(logs[j]));
      REMEM_RETURN_IF_ERROR(env_->Rename(p, p + ".dropped"));
      aside_.push_back(LogName(logs[j]) + ".dropped");
    }
    if (problem->offset == 0) drop_from = problem->file;
  }
  // Generations: the base and the one before it stay.
  if (snap_bytes > 0) {
    snapshot_name_ = SnapshotName(base.lsn);
    snapshot_lsn_ = base.lsn;
    stats_.last_snapshot_bytes = snap_bytes;
    auto mtime = env_->FileMtimeMs(PathOf(snapshot_name_));
    if (mtime.ok()) stats_.last_snapshot_unix_ms = *mtime;
  }
  if (base_index < snaps.size() && base_index > 0) {
    prev_snapshot_name_ = SnapshotName(snaps[base_index - 1]);
    prev_lsn_ = snaps[base_index - 1];
    for (size_t i = 0; i + 1 < base_index; ++i) {
      REMEM_RETURN_IF_ERROR(env_->RemoveFile(PathOf(SnapshotName(snaps[i]))));
    }
  }
  const uint64_t next_lsn = expect;
  for (size_t i = 0; i < drop_from; ++i) {
    const std::string name = LogName(logs[i]);
    const bool before_prev = i + 1 < logs.size() && logs[i + 1] <= prev_lsn_;
    auto size = env_->FileSize(PathOf(name));
    if (!size.ok()) return size.status();
    if (*size == 0 && logs[i] == next_lsn) {
      // Empty, and reopened in place below (not removed first: a crash in
      // between would leave a snapshot without its log, which recovery
      // takes for a deleted one).
      continue;
    }
    if (before_prev) {
      // Wholly before the previous generation.
      REMEM_RETURN_IF_ERROR(env_->RemoveFile(PathOf(name)));
      continue;
    }
    old_logs_.push_back({logs[i], name, *size});
    // The log since the base counts toward the next snapshot, whenever it
    // was written: a restart must not reset the trigger, or the log would
    // grow without bound across restarts (and recovery time with it).
    if (i >= first) log_bytes_since_snapshot_ += *size;
  }
  REMEM_RETURN_IF_ERROR(OpenLog(next_lsn));
  UpdateLogBytes();
  // Running: a crash from here on is not a clean stop. Durable before
  // anything is served, with the counter (a run that logs nothing keeps
  // its gap) and the state's note.
  if (Status st = WriteRun(false, next_lsn - 1, max_version); !st.ok()) {
    return st.WithContext("writing the run file of " + dir);
  }
  running_ = true;
  return Status::OK();
}

Status PartitionStore::OpenLog(uint64_t first_lsn) {
  auto f = env_->NewWritableFile(PathOf(LogName(first_lsn)));
  if (!f.ok()) return f.status();
  REMEM_RETURN_IF_ERROR(env_->SyncDir(options_.dir));
  log_ = std::make_unique<LogWriter>(std::move(*f), first_lsn);
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

std::optional<Clock::time_point> PartitionStore::retry_at() const {
  if (!stats_.failing.load(std::memory_order_relaxed)) return std::nullopt;
  return last_retry_ + kRetryEvery;
}

Status PartitionStore::Writable() {
  if (!stats_.failing.load(std::memory_order_relaxed)) return Status::OK();
  const auto now = Clock::now();
  if (now - last_retry_ < kRetryEvery) return error_;
  last_retry_ = now;
  return FlushNow(options_.fsync != FsyncPolicy::kNo);
}

void PartitionStore::LogShapeChange() {
  const uint64_t shape = state_->shape();
  if (shape == logged_shape_) return;
  std::string v(8, '\0');
  std::memcpy(v.data(), &shape, 8);
  log_->Append(RecordType::kShape, 0, {}, v);
  logged_shape_ = shape;
}

void PartitionStore::LogPut(std::string_view key, std::string_view value,
                            uint64_t version, bool more_in_group) {
  LogShapeChange();  // the write may have grown the state
  log_->Append(RecordType::kPut, version, key, value,
               more_in_group ? kMoreInGroup : 0);
}

void PartitionStore::LogDelete(std::string_view key, uint64_t version,
                               bool more_in_group) {
  LogShapeChange();
  log_->Append(RecordType::kDelete, version, key, {},
               more_in_group ? kMoreInGroup : 0);
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
  } else if (stats_.failing.load()) {
    // Nothing waits, but the failed records are buffered: the disk is
    // retried on the clock (Writable: every kRetryEvery), not only at the
    // next write, so they get there once it takes them.
    if (Writable().ok()) ++work;
  }
  if (options_.fsync == FsyncPolicy::kEverySec && log_->has_unsynced() &&
      !stats_.failing.load() &&
      Clock::now() - last_sync_ >= std::chrono::seconds(1)) {
    (void)FlushNow(true);
  }
  if (snap_) {
    StepSnapshot();
    ++work;
  } else if (!stopping_ && options_.snapshot_log_bytes > 0 &&
             log_bytes_since_snapshot_ >= options_.snapshot_log_bytes &&
             // Also at least the last snapshot's size, so snapshots of a
             // large store do not rewrite it for every little log growth.
             log_bytes_since_snapshot_ >=
                 stats_.last_snapshot_bytes.load(std::memory_order_relaxed) &&
             !stats_.failing.load()) {
    Status st = StartSnapshot();
    if (!st.ok()) {
      // Not a write error: the log holds every record still, and a clean
      // stop after it is clean (write_errors is what makes it unclean).
      stats_.snapshot_failures.fetch_add(1, std::memory_order_relaxed);
      log::Error("durability: cannot start a snapshot: {}", st.message());
      log_bytes_since_snapshot_ = 0;  // try again after as much more log
    }
    ++work;
  }
  return work;
}

namespace {

Status StoppingStatus() {
  return Status::Unavailable(
      "the server is stopping: the snapshot was not taken (the previous one "
      "is kept)");
}

}  // namespace

void PartitionStore::RequestSnapshot(Done done) {
  if (stopping_) return done(StoppingStatus());
  snap_waiting_.push_back(std::move(done));
  if (snap_) return;
  Status st = stats_.failing.load() ? error_ : StartSnapshot();
  if (!st.ok()) EndSnapshot(st, 0);
}

void PartitionStore::Stop() {
  stopping_ = true;
  if (snap_) {
    log::Info(
        "durability: the server is stopping: the snapshot of {} in progress "
        "is abandoned (the previous one is kept)",
        options_.dir);
  }
  scan_.reset();
  check_.reset();
  verify_data_.reset();
  snap_.reset();  // removes the .tmp file
  UpdateLogBytes();
  std::vector<Done> waiting;
  waiting.swap(snap_waiting_);
  for (auto& fn : waiting) fn(StoppingStatus());
}

Status PartitionStore::StartSnapshot() {
  // Everything before the snapshot's LSN is on disk, synced, in closed
  // files; the log continues in a new file that starts at that LSN.
  REMEM_RETURN_IF_ERROR(FlushNow(true));
  const uint64_t lsn = log_->next_lsn();
  if (log_->first_lsn() != lsn) {
    // (An empty log already starts at the snapshot's LSN: keep it.)
    OldLog old{log_->first_lsn(), LogName(log_->first_lsn()), log_->bytes()};
    REMEM_RETURN_IF_ERROR(OpenLog(lsn));
    old_logs_.push_back(old);
  }
  auto w = SnapshotWriter::Create(env_, options_.dir, lsn);
  if (!w.ok()) return w.status();
  snap_ = std::move(*w);
  scan_ = state_->BeginSnapshot();
  log_bytes_since_snapshot_ = 0;
  return Status::OK();
}

void PartitionStore::StepSnapshot() {
  if (check_) {
    // Verifying what was written, a chunk per pass.
    if (!check_->Step(kVerifyChunk)) return;
    Status st = check_->status();
    if (st.ok() && (check_->end().lsn != snap_->start_lsn() ||
                    check_->end().pairs != snap_->pairs())) {
      st = Status::Corruption(
          "its end record does not match what was "
          "written");
    }
    check_.reset();
    verify_data_.reset();
    if (!st.ok()) {
      return EndSnapshot(
          st.WithContext("verifying " + snap_->tmp_path() + " after writing"),
          0);
    }
    st = snap_->Commit();
    return EndSnapshot(st, st.ok() ? sealed_bytes_ : 0);
  }
  if (options_.slow_snapshot_us > 0) {
    std::this_thread::sleep_for(
        std::chrono::microseconds(options_.slow_snapshot_us));
  }
  const bool done = scan_->Step(
      snap_.get(), options_.slow_snapshot_us > 0 ? 8 : kSnapshotChunk);
  Status st = snap_->MaybeWrite();
  if (!st.ok()) return EndSnapshot(st, 0);
  if (!done) return;
  auto bytes = snap_->Seal(state_->last_version(), scan_->shape());
  scan_.reset();
  if (!bytes.ok()) return EndSnapshot(bytes.status(), 0);
  sealed_bytes_ = *bytes;
  // Read it back before it replaces anything.
  auto data = ReadWhole(snap_->tmp_path());
  if (!data.ok()) return EndSnapshot(data.status(), 0);
  verify_data_ = std::move(*data);
  check_ = std::make_unique<SnapshotCheck>(verify_data_->data());
}

void PartitionStore::DropOldGeneration() {
  const uint64_t lsn = snap_->start_lsn();
  std::vector<std::string> remove;
  if (lsn != snapshot_lsn_ || snapshot_name_.empty()) {
    // The newest generation becomes the previous one; the previous one
    // goes: its snapshot, and the log files wholly before the new previous
    // snapshot's LSN.
    if (!prev_snapshot_name_.empty()) remove.push_back(prev_snapshot_name_);
    prev_snapshot_name_ = snapshot_name_;
    prev_lsn_ = snapshot_lsn_;
    snapshot_name_ = SnapshotName(lsn);
    snapshot_lsn_ = lsn;
    std::vector<OldLog> keep;
    for (size_t j = 0; j < old_logs_.size(); ++j) {
      const uint64_t next_first = j + 1 < old_logs_.size()
                                      ? old_logs_[j + 1].first_lsn
                                      : log_->first_lsn();
      if (next_first <= prev_lsn_) {
        remove.push_back(old_logs_[j].name);
      } else {
        keep.push_back(old_logs_[j]);
      }
    }
    old_logs_.swap(keep);
  }
  // (The same LSN: the new file replaced the old one, same state.)
  for (const std::string& name : aside_) remove.push_back(name);
  aside_.clear();
  for (const std::string& name : remove) {
    if (Status st = env_->RemoveFile(PathOf(name)); !st.ok()) {
      log::Warn("durability: {}", st.message());
    }
  }
  if (Status st = env_->SyncDir(options_.dir); !st.ok()) {
    log::Warn("durability: {}", st.message());
  }
}

void PartitionStore::EndSnapshot(Status st, uint64_t bytes) {
  scan_.reset();
  check_.reset();
  verify_data_.reset();
  if (st.ok() && snap_) {
    DropOldGeneration();
    stats_.last_snapshot_bytes.store(bytes);
    stats_.last_snapshot_unix_ms.store(UnixMs());
    stats_.snapshots.fetch_add(1);
    log::Info("durability: snapshot {} of {} pairs, {} bytes, verified",
              PathOf(snapshot_name_), snap_->pairs(), bytes);
  } else if (!st.ok()) {
    stats_.snapshot_failures.fetch_add(1, std::memory_order_relaxed);
    log::Error(
        "durability: snapshot failed (the log and any earlier snapshot are "
        "kept: nothing is lost): {}",
        st.message());
  }
  snap_.reset();  // removes the .tmp file unless committed
  UpdateLogBytes();
  std::vector<Done> waiting;
  waiting.swap(snap_waiting_);
  for (auto& fn : waiting) fn(st);
}

}  // namespace remem::durability
