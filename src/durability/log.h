// durability/log.h: the on-disk record format shared by operation logs and
// snapshots, and the append-only log writer of one partition (its file
// comes from the Env, env.h).
//
// Record: a fixed 40-byte RecordHeader, then `key_len` bytes of key and
// `value_len` bytes of value. The checksum is xxh3-64 over the header (with
// the checksum field zero) and the payload, so a torn or corrupted record
// never verifies. Every record carries the pair's version, so replay is
// idempotent (see store.h). A put or delete may carry kMoreInGroup: it and
// the records after it up to the first without the flag are one atomic
// group (a transaction's writes), which recovery applies whole or not at
// all. New record types may be added; a reader that
// meets a type it does not know refuses (newer format) rather than skip it.
//
// Thread contract: a LogWriter belongs to one thread (the partition's
// owner); the free functions are pure.

#ifndef REMEM_DURABILITY_LOG_H_
#define REMEM_DURABILITY_LOG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "durability/env.h"
#include "remem/status.h"

namespace remem::durability {

inline constexpr uint32_t kRecordMagic = 0x4C524D52;  // "RMRL" in memory
inline constexpr uint16_t kFormatVersion = 1;

enum class RecordType : uint8_t {
  kPut = 1,     // key, value, the version the write produced
  kDelete = 2,  // key, the version the delete consumed
  // Snapshot files only: the last record. lsn = the snapshot's start LSN,
  // version = the state's version counter, value = 8-byte pair count, then
  // (since the services seam) the 8-byte shape of the scan.
  kSnapshotEnd = 3,
  // Log files only: the state's shape changed (the hash store: its table
  // grew); value = the new 8-byte shape (Recoverable::shape). Recovery
  // sizes the state to the largest one up front.
  kShape = 4,
};

// RecordHeader::flags.
inline constexpr uint8_t kMoreInGroup = 1;  // kPut, kDelete: see above

struct RecordHeader {
  uint32_t magic;   // kRecordMagic
  uint16_t format;  // kFormatVersion
  uint8_t type;     // RecordType
  uint8_t flags;    // kMoreInGroup or zero
  uint32_t key_len;
  uint32_t value_len;
  uint64_t lsn;       // log sequence number, per partition, from 1
  uint64_t version;   // the pair's version (see RecordType)
  uint64_t checksum;  // xxh3-64 of the header (this field 0) and payload
};
static_assert(sizeof(RecordHeader) == 40);

// Sanity bounds a reader applies before trusting lengths.
inline constexpr uint32_t kMaxRecordKey = 1u << 20;
inline constexpr uint32_t kMaxRecordValue = 1u << 28;

// Appends one encoded record to `out`.
void EncodeRecord(std::string* out, RecordType type, uint64_t lsn,
                  uint64_t version, std::string_view key,
                  std::string_view value, uint8_t flags = 0);

struct Record {
  RecordType type;
  uint64_t lsn;
  uint64_t version;
  std::string_view key;
  std::string_view value;
  uint8_t flags = 0;
};

enum class ParseOutcome {
  kOk,
  kShort,    // fewer bytes left than the record claims (or than a header)
  kBad,      // magic, format, lengths or checksum wrong
  kUnknown,  // verifies, but of a type this build does not know
};
// Parses the record at the start of `data`; on kOk sets `*rec` (views into
// `data`) and `*size`.
ParseOutcome ParseRecord(std::string_view data, Record* rec, size_t* size);
// What went wrong, for error messages ("ok" for kOk).
std::string_view ParseOutcomeText(ParseOutcome o);

// --- the log writer

// Records are buffered in memory by Append and written by Flush with one
// write (group commit). A failed write leaves the file truncated back to
// the last whole record and keeps the buffer, so the next Flush retries it;
// records already on disk are never touched.
class LogWriter {
 public:
  LogWriter(std::unique_ptr<WritableFile> file, uint64_t first_lsn)
      : file_(std::move(file)), first_lsn_(first_lsn), next_lsn_(first_lsn) {}

  // Buffers a record; returns its LSN.
  uint64_t Append(RecordType type, uint64_t version, std::string_view key,
                  std::string_view value, uint8_t flags = 0);
  // Writes the buffer; with `sync`, also fdatasyncs (even if the buffer was
  // empty but earlier writes are unsynced).
  Status Flush(bool sync);

  bool has_pending() const { return !buf_.empty(); }
  // Records appended and not yet written.
  uint64_t pending_records() const { return pending_records_; }
  bool has_unsynced() const { return unsynced_; }
  uint64_t first_lsn() const { return first_lsn_; }
  uint64_t next_lsn() const { return next_lsn_; }
  uint64_t bytes() const { return written_; }  // on disk in this file
  const std::string& path() const { return file_->path(); }

 private:
  std::unique_ptr<WritableFile> file_;
  uint64_t first_lsn_;
  uint64_t next_lsn_;
  std::string buf_;
  uint64_t pending_records_ = 0;  // in buf_
  uint64_t written_ = 0;          // bytes of whole records in the file
  bool unsynced_ = false;
  bool dirty_tail_ = false;  // a failed write may have left a partial tail
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_LOG_H_
