// hash::LookupOnce: the client side of a get by one-sided reads. It copies
// buckets and extents through `read` (UCX get, a memcpy of the mapping, or a
// word copy in tests) and trusts nothing it has not verified:
//   - a bucket copy must have an even version and a matching checksum;
//   - an extent copy must have a matching checksum, the incarnation its slot
//     names, and lengths that fit its size class; then its key is compared.
// Any failure is a Retry (with the reason), never a wrong answer.
//
// Absence needs one more read: a key moving from its second bucket to its
// first can be missed by a reader that reads the first bucket before the
// move and the second after it. So a miss re-reads the first bucket and
// retries if its version changed. (A move from first to second cannot be
// missed: the entry is copied before it is erased, and the first bucket is
// read first.)
//
// Thread contract: pure function of its arguments.

#ifndef REMEM_HASH_READER_H_
#define REMEM_HASH_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "hash/table.h"
#include "remem/status.h"

namespace remem::hash {

// Copies `len` bytes at `offset` of `region` into `dst`.
using ReadFn = std::function<Status(uint16_t region, uint64_t offset, void* dst,
                                    size_t len)>;

struct Lookup {
  enum Outcome { kFound, kNotFound, kRetry } outcome = kRetry;
  std::string value;
  uint64_t version = 0;
  const char* retry_reason = "";
  int reads = 0;  // one-sided reads issued
};

// A read error from `read` is returned as the Status; a verification
// failure is Lookup::kRetry.
Result<Lookup> LookupOnce(const Geometry& g, std::string_view key,
                          const ReadFn& read);

}  // namespace remem::hash

#endif  // REMEM_HASH_READER_H_
