#include "durability/log.h"

#include <cstring>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "xxhash.h"

namespace remem::durability {

namespace {

uint64_t Checksum(const RecordHeader& h, std::string_view key,
                  std::string_view value) {
  RecordHeader z = h;
  z.checksum = 0;
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, &z, sizeof(z));
  XXH3_64bits_update(&st, key.data(), key.size());
  XXH3_64bits_update(&st, value.data(), value.size());
  return XXH3_64bits_digest(&st);
}

}  // namespace

void EncodeRecord(std::string* out, RecordType type, uint64_t lsn,
                  uint64_t version, std::string_view key,
                  std::string_view value, uint8_t flags) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.format = kFormatVersion;
  h.type = uint8_t(type);
  h.flags = flags;
  h.key_len = uint32_t(key.size());
  h.value_len = uint32_t(value.size());
  h.lsn = lsn;
  h.version = version;
  h.checksum = Checksum(h, key, value);
  out->append(reinterpret_cast<const char*>(&h), sizeof(h));
  out->append(key);
  out->append(value);
}

std::string_view ParseOutcomeText(ParseOutcome o) {
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

ParseOutcome ParseRecord(std::string_view data, Record* rec, size_t* size) {
  if (data.size() < sizeof(RecordHeader)) return ParseOutcome::kShort;
  RecordHeader h;
  std::memcpy(&h, data.data(), sizeof(h));
  if (h.magic != kRecordMagic || h.format != kFormatVersion ||
      (h.flags & ~kMoreInGroup) != 0 || h.key_len > kMaxRecordKey ||
      h.value_len > kMaxRecordValue) {
    return ParseOutcome::kBad;
  }
  const size_t total = sizeof(h) + size_t(h.key_len) + h.value_len;
  if (data.size() < total) return ParseOutcome::kShort;
  std::string_view key = data.substr(sizeof(h), h.key_len);
  std::string_view value = data.substr(sizeof(h) + h.key_len, h.value_len);
  if (Checksum(h, key, value) != h.checksum) return ParseOutcome::kBad;
  if (h.type < uint8_t(RecordType::kPut) ||
      h.type > uint8_t(RecordType::kShape)) {
    return ParseOutcome::kUnknown;
  }
  if (h.flags != 0 && h.type != uint8_t(RecordType::kPut) &&
      h.type != uint8_t(RecordType::kDelete)) {
    return ParseOutcome::kBad;
  }
  *rec = Record{RecordType(h.type), h.lsn, h.version, key, value, h.flags};
  *size = total;
  return ParseOutcome::kOk;
}

uint64_t LogWriter::Append(RecordType type, uint64_t version,
                           std::string_view key, std::string_view value,
                           uint8_t flags) {
  const uint64_t lsn = next_lsn_++;
  ++pending_records_;
  EncodeRecord(&buf_, type, lsn, version, key, value, flags);
  return lsn;
}

Status LogWriter::Flush(bool sync) {
  if (dirty_tail_) {
    // A failed write may have left part of the buffer behind the last
    // whole record; cut it before writing anything new.
    REMEM_RETURN_IF_ERROR(file_->Truncate(written_));
    dirty_tail_ = false;
  }
  size_t done = 0;
  while (done < buf_.size()) {
    auto n = file_->Write(buf_.data() + done, buf_.size() - done);
    if (!n.ok() || *n == 0) {
      dirty_tail_ = done > 0 || !n.ok();
      if (dirty_tail_ && file_->Truncate(written_).ok()) dirty_tail_ = false;
      return n.ok() ? Status::IOError("write " + path() + ": wrote 0 bytes")
                    : n.status();
    }
    done += *n;
  }
  if (!buf_.empty()) {
    written_ += buf_.size();
    buf_.clear();
    pending_records_ = 0;
    unsynced_ = true;
  }
  if (sync && unsynced_) {
    REMEM_RETURN_IF_ERROR(file_->Sync());
    unsynced_ = false;
  }
  return Status::OK();
}

}  // namespace remem::durability
