// hash::Lookup: the client side of a get by one-sided reads, as a sequence
// of reads the caller performs (synchronously, or asynchronously with many
// lookups in flight). It reads a bucket's header (or, over a network, the
// whole bucket in one read), then the entries the header's index names
// with the key's tag. It trusts nothing it has not verified:
//   - a header copy must have an even version and a matching checksum;
//   - an entry copy must end with the checksum of its bytes seeded with
//     that header's version (so it is the entry of that very publish), and
//     agree with its index slot;
//   - an extent copy must have a matching checksum, the incarnation its
//     entry names, and lengths that fit its size class; then its key is
//     compared.
// Any failure is a Retry (with the reason), never a wrong answer.
//
// Absence needs one more read: a key moving from its second bucket to its
// first can be missed by a reader that reads the first bucket before the
// move and the second after it. So a miss re-reads the first bucket's
// header and retries if its version changed. (A move from first to second
// cannot be missed: the entry is copied before it is erased, and the first
// bucket is read first.)
//
// A bucket that fails verification may belong to an array the table has
// outgrown (kMovedVersion); Lookup::bucket_failed tells the caller to
// re-read the root (RootRequest, then ApplyRoot) before retrying.
//
// Thread contract: a Lookup is used by one thread; the functions are pure.

#ifndef REMEM_HASH_READER_H_
#define REMEM_HASH_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hash/layout.h"
#include "remem/status.h"

namespace remem::hash {

struct ReadRequest {
  uint16_t region = 0;
  uint64_t offset = 0;
  void* dst = nullptr;
  size_t len = 0;
};

// How a lookup copies a bucket: its header, then the entries it needs (two
// or three cache lines; for memory mapped into this process, where each
// read is a copy), or the whole bucket in one read (over a network, where
// each read is a round trip).
enum class ReadMode { kHeaderThenEntries, kWholeBuckets };

class Lookup {
 public:
  enum Outcome { kPending, kFound, kNotFound, kRetry };
  // `key` must stay valid while the lookup runs. A found value is assigned
  // to *value_into when given (its capacity reused: a caller that keeps
  // the string reads without allocating), else to a string of the
  // lookup's own; value() names whichever it is. `hash`, when given, is
  // HashKey(key, g.seed), computed once by a caller that prefetched.
  Lookup(const Geometry& g, std::string_view key, ReadMode mode,
         std::string* value_into = nullptr, const KeyHash* hash = nullptr);
  Lookup(const Lookup&) = delete;
  Lookup& operator=(const Lookup&) = delete;

  // Extents (values stored out of line) are copied into *buffer instead of
  // a vector of the lookup's own: a caller that runs one lookup at a time
  // keeps the buffer's capacity from get to get, so a large value's copy is
  // not allocated, zeroed and faulted in anew for every get. Call before
  // the first Next.
  void set_extent_buffer(std::vector<uint8_t>* buffer) { extent_ = buffer; }

  // Fills `req` with the next read to perform and returns true; call again
  // once the bytes are in req->dst. Returns false when outcome() is final.
  bool Next(ReadRequest* req);

  Outcome outcome() const { return outcome_; }
  const std::string& value() const { return *value_; }
  std::string& value() { return *value_; }
  uint64_t version() const { return version_; }
  const char* retry_reason() const { return retry_reason_; }
  bool bucket_failed() const { return bucket_failed_; }
  int reads() const { return reads_; }

 private:
  enum Stage { kStart, kGotHeader, kGotEntry, kGotExtent, kGotRecheck };
  bool Scan(ReadRequest* req);
  bool CheckEntry(ReadRequest* req);
  bool Retry(const char* why) {
    outcome_ = kRetry;
    retry_reason_ = why;
    return false;
  }
  // Reads bucket b's header (the whole bucket if `whole`) into bucket_.
  bool ReadBucket(uint64_t b, bool whole, ReadRequest* req);
  bool HeaderVerifies() const;

  Geometry g_;
  std::string_view key_;
  ReadMode mode_;
  KeyHash kh_;
  uint64_t b_[2];
  int which_ = 0;            // bucket being scanned: 0 = b1, 1 = b2
  size_t slot_ = 0;          // next index slot of the current bucket to look at
  size_t entry_offset_ = 0;  // in the area, of the entry being checked
  size_t entry_bytes_ = 0;
  uint64_t first_version_ = 0;
  Stage stage_ = kStart;
  Bucket bucket_;
  std::vector<uint8_t> own_extent_;
  std::vector<uint8_t>* extent_ = &own_extent_;
  uint32_t extent_incarnation_ = 0;
  uint64_t extent_size_ = 0;
  Outcome outcome_ = kPending;
  std::string own_value_;
  std::string* value_;
  uint64_t version_ = 0;
  const char* retry_reason_ = "";
  bool bucket_failed_ = false;
  int reads_ = 0;
};

// Synchronous driver for tests and simple callers: copies `len` bytes at
// `offset` of `region` into `dst`.
using ReadFn = std::function<Status(uint16_t region, uint64_t offset, void* dst,
                                    size_t len)>;
struct LookupResult {
  Lookup::Outcome outcome = Lookup::kRetry;
  std::string value;
  uint64_t version = 0;
  const char* retry_reason = "";
  bool bucket_failed = false;
  int reads = 0;
};
// A read error from `read` is returned as the Status.
Result<LookupResult> LookupOnce(const Geometry& g, std::string_view key,
                                const ReadFn& read,
                                ReadMode mode = ReadMode::kHeaderThenEntries);

// The region offset of `key`'s first bucket under `g` (what a lookup reads
// first; a batch of lookups prefetches it).
uint64_t FirstBucketOffset(const Geometry& g, std::string_view key);
// The same for a key hashed already (HashKey(key, g.seed)).
uint64_t FirstBucketOffset(const Geometry& g, const KeyHash& hash);

// The root read request for `g`'s partition, into `root`.
ReadRequest RootRequest(const Geometry& g, Root* root);
// Applies a root copy to `g`: true if it verified (then `g` names the live
// bucket array), false if it must be read again.
bool ApplyRoot(const Root& root, Geometry* g);

// The read of partition g's ServingMark (hash/layout.h), into `mark`.
ReadRequest ServingMarkRequest(const Geometry& g, ServingMark* mark);
// What a reader that routed by configuration `epoch` may do with a pair of
// `version` it read one-sided before it copied `mark` (layout.h, "Serving
// mark"): kTrusted: return it; kTorn: the copy did not verify (read the
// mark again); kAskServer: the server vouches for nothing now, or the pair
// may not be on the backups yet, or the server has not installed `epoch`
// (ask it: it answers once the pair is replicated, or refuses); kStale:
// the shards this server leads changed after `epoch`, or `epoch` is 0
// (the reader's configuration names another incarnation of the server):
// fetch the configuration again.
enum class MarkVerdict { kTrusted, kTorn, kAskServer, kStale };
MarkVerdict JudgeServingMark(const ServingMark& mark, uint32_t epoch,
                             uint64_t version);

}  // namespace remem::hash

#endif  // REMEM_HASH_READER_H_
