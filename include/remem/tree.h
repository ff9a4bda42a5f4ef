// Copyright remem authors.
//
// remem::TreeStore: the ordered store of a remem-server (a B-link tree),
// used through a Session (remem/session.h): point operations, and range
// scans in key order (ascending or descending, by range or prefix),
// returned in pages with a resume key.
//
// Reads take one of two paths, as the read path decides
// (SessionOptions::read_path, or TreeOptions): the client searches the
// tree itself with one-sided reads of the server's memory (verifying every
// node it copies, so a torn node is never used; upper levels come from a
// cache whose stale copies are detected by their fence keys), or the server
// searches (one RPC). kAuto chooses per operation from measured latencies
// (Cell's selector), with point gets and scans measured apart; over shared
// memory, asynchronous scans issued while others are in flight are split
// between the two paths so that the client's core and the server's both
// work (up to half of those in flight go by RPC, fewer when RPCs come back
// slowly or cost this client as much as the scan itself). Writes go
// through the server. A result read one-sided is returned only while the
// server's lease vouches for it (remem/session.h, "Liveness").
//
// Scans: a page holds keys in [start, end) (an empty end: no bound), at
// most `limit` of them (1 .. max_scan()), and it ends early, with at least
// one item, once its keys and values reach 1 MiB. `more` set means the
// limit or that size ended the page: the next page is Scan(page.resume, end)
// ascending, or Scan(start, page.resume) descending (it may be empty). A scan
// returns every key present for its whole duration, in order, and never one
// that was never present; each page is a consistent read of each leaf it
// crossed, not a snapshot of the whole range.
//
// Limits: keys are 1 .. max_key() bytes (64 KiB) and values 0 ..
// max_value() bytes (16 MiB), the hash store's defaults (remem-server's
// --max-key-bytes and --max-value-bytes lower the hash store's only);
// beyond that InvalidArgument. Keys of up to 64 bytes are stored in the nodes,
// longer ones out of line (a one-sided read then reads the long keys of a node
// it copies as well: on shared memory a point get only those it compares).
// Values of up to 256 bytes (with the default 1 KiB nodes) are stored in
// the leaf, larger ones out of line (a one-sided read then reads the leaf
// and the value). A full tree answers OutOfMemory, changes
// nothing and keeps every existing key. Memory that deletes free is reused
// by the same kind of allocation only: a node by a node, an out-of-line
// value or key by one of its size class (memory never changes kind, which
// one-sided readers rely on); `remem stats` shows what any allocation can
// still take (`tree_bytes_unassigned`). A write gives its pair a version
// above every version the server has issued; in a cluster a pair keeps its
// version when its range moves to another server (which then issues
// versions above the old owner's), so a version read before a move still
// serves a compare-and-put after it.
//
// Thread contract: as the Session: one thread. A TreeStore must be
// destroyed before its Session; its destructor waits for its own
// operations in flight.

#ifndef REMEM_TREE_H_
#define REMEM_TREE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remem/options.h"
#include "remem/session.h"
#include "remem/status.h"

namespace remem {

struct TreeOptions {
  // The read path of point gets and of scans; unset: the session's
  // (SessionOptions::read_path).
  std::optional<ReadPath> read_path;
  std::optional<ReadPath> scan_path;
  // Internal nodes the client keeps copies of (about 4 KiB each: the 1 KiB
  // copy, its parsed view and its route for searches, allocated as they
  // are cached; the cache is cleared when full). On shared memory it
  // is filled when the store opens, top levels first. A search whose path
  // is all cached reads only its leaf: 1 M keys of 16 bytes have about
  // 6,600 internal nodes, 10 M about 66,000.
  size_t cache_nodes = 131072;
};

class TreeStore {
 public:
  struct Value {
    std::string value;
    uint64_t version = 0;
  };
  struct Item {
    std::string key;
    std::string value;
    uint64_t version = 0;
  };
  struct Page {
    std::vector<Item> items;
    bool more = false;   // the limit (or 1 MiB of items) ended the page
    std::string resume;  // where the next page starts (see above)
    // Not part of the page: items a shorter page left over, kept for their
    // strings' storage, so that scans into one reused page allocate only
    // for more items, or longer ones, than any page before. The library
    // fills and drains it; clear() it to give the memory back.
    std::vector<Item> spare;
  };
  enum class Order { kAscending, kDescending };
  using GetCallback = std::function<void(Result<Value>)>;
  using VersionCallback = std::function<void(Result<uint64_t>)>;
  using Callback = std::function<void(Status)>;
  using ScanCallback = std::function<void(Result<Page>)>;
  using MultiGetCallback = std::function<void(std::vector<Result<Value>>)>;
  using MultiPutCallback = std::function<void(std::vector<Result<uint64_t>>)>;

  // Attaches to `session`'s server (one call: the tree's region and
  // limits). Unsupported if the server has no ordered store.
  static Result<std::unique_ptr<TreeStore>> Open(
      Session* session, const TreeOptions& options = {});
  ~TreeStore();
  TreeStore(const TreeStore&) = delete;
  TreeStore& operator=(const TreeStore&) = delete;

  // --- synchronous
  // NotFound if absent.
  Result<Value> Get(std::string_view key);
  // As Get, into *into, whose string keeps its capacity: a loop of gets
  // into one Value allocates only for a longer value than before. On any
  // status but OK, *into's content is unspecified.
  Status Get(std::string_view key, Value* into);
  // Insert or replace; the new version.
  Result<uint64_t> Put(std::string_view key, std::string_view value);
  // AlreadyExists if present.
  Result<uint64_t> PutIfAbsent(std::string_view key, std::string_view value);
  // Replace only at version `expected`: Conflict if not, NotFound if absent.
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected);
  // NotFound if absent.
  Status Delete(std::string_view key);
  // Keys in [start, end), end empty: unbounded. InvalidArgument for a limit
  // of 0 or over max_scan(), start > end, or a bound longer than the
  // longest key plus one byte (max_key() + 1: a bound past every key of a
  // prefix); start == end is an empty page.
  Result<Page> Scan(std::string_view start, std::string_view end,
                    uint32_t limit, Order order = Order::kAscending);
  // As Scan, into *page, reusing its storage: the items' strings and the
  // vector keep their capacity (items past a shorter page wait in
  // page->spare), so a loop that scans into one page allocates only for
  // more or longer items than any page before. On an error the page is
  // empty.
  Status ScanInto(std::string_view start, std::string_view end, uint32_t limit,
                  Order order, Page* page);
  // Keys that begin with `prefix` (a page, as Scan).
  Result<Page> ScanPrefix(std::string_view prefix, uint32_t limit,
                          Order order = Order::kAscending);

  // --- asynchronous: arguments are copied; the callback runs inside a
  // later Session::Poll()/WaitAll(). Requests to the server are in flight
  // together; a one-sided read is done in the call and its callback
  // deferred to the next Poll. With kAuto, gets and scans feed the
  // selector's measurements too (a one-sided one for the time of the call,
  // one by RPC from the call to its answer), except over tcp while other
  // operations are in flight on the session's event loop (this store's,
  // or another session's on a shared loop, as a cluster client's): those
  // go by RPC, in the message the next Poll sends anyway, and are not
  // timed.
  void GetAsync(std::string_view key, GetCallback done);
  void PutAsync(std::string_view key, std::string_view value,
                VersionCallback done);
  void DeleteAsync(std::string_view key, Callback done);
  void ScanAsync(std::string_view start, std::string_view end, uint32_t limit,
                 Order order, ScanCallback done);
  // Into *page (as ScanInto), which must stay valid, and not be read, until
  // `done` has run.
  void ScanAsync(std::string_view start, std::string_view end, uint32_t limit,
                 Order order, Page* page, Callback done);

  // --- batched: one result per key, in order, each with its own status.
  // On the one-sided path the lookups run in the call (each a few node
  // copies, upper levels from the cache), the leaves of the keys ahead
  // read together over tcp: the lookups of one call are not ordered with
  // each other, and a later key's may return an older value than an
  // earlier key's (the same key given twice included), each one a value
  // the key held at some moment of the call, as with the hash store's
  // MultiGet (separate calls are ordered); on the RPC path
  // the keys go in batches of up to 4096 per request (one message each,
  // four in flight at a time), and the call returns when all have
  // answered.
  // On kAuto over tcp a batch always goes by RPC.
  std::vector<Result<Value>> MultiGet(
      const std::vector<std::string_view>& keys);
  // Insert or replace each pair, in order: its new version, or its error
  // (InvalidArgument, OutOfMemory...). The pairs go in requests of up to
  // 4096 pairs and 32 MiB, four in flight at a time; the call returns when
  // all have answered (with --data-dir, once they are durable). Should a
  // request fail (TimedOut, Unavailable...), its pairs say so and may have
  // been applied, as a single Put that fails; the batch's later requests
  // are then not sent, and their pairs answer Busy (not applied). The same
  // holds for MultiGet's keys.
  std::vector<Result<uint64_t>> MultiPut(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs);
  // MultiGet and MultiPut, asynchronously: what they need of keys and
  // values is copied in the call (one-sided lookups done there too); the
  // callback runs inside a later Poll/WaitAll with one result per key or
  // pair, in order, failures as MultiPut's. Many may be in flight: each
  // has up to four requests at a time and the store sixteen, which its
  // batches take in turn; pairs of batches in flight together may be
  // applied in any order between them (each batch's own pairs in order).
  void MultiGetAsync(const std::vector<std::string_view>& keys,
                     MultiGetCallback done);
  void MultiPutAsync(
      const std::vector<std::pair<std::string_view, std::string_view>>& pairs,
      MultiPutCallback done);

  struct ReadStats {
    uint64_t onesided_gets = 0;   // gets answered by one-sided reads
    uint64_t rpc_gets = 0;        // gets answered by the server
    uint64_t onesided_scans = 0;  // scan pages read one-sided
    uint64_t rpc_scans = 0;       // scan pages the server made
    uint64_t reads = 0;           // one-sided node reads issued
    // Node copies that failed to verify, and leaves read again because a
    // key or value they named had changed since.
    uint64_t retries = 0;
    uint64_t fallbacks = 0;    // one-sided operations that asked instead
    uint64_t unvouched = 0;    // one-sided results the lease (in a cluster,
                               // the serving mark) did not cover
    uint64_t cache_hits = 0;   // upper-level nodes taken from the cache
    uint64_t moves_right = 0;  // siblings followed (splits seen late)
    // Over the network, a one-sided scan reads the leaves it will need
    // together, and a one-sided multi-get its keys' leaves, 16 at a time
    // (tree/search.h): the leaves so read (counted in reads too), and those
    // of them the scan or batch ended without.
    uint64_t leaves_read_ahead = 0;
    uint64_t leaves_read_ahead_unused = 0;
    // Of rpc_scans, those auto sent by RPC while other operations were in
    // flight over shared memory, to split the work between the client's
    // core and the server's (see "Reads take one of two paths", above).
    uint64_t split_scans = 0;
  };
  const ReadStats& read_stats() const;

  uint32_t max_key() const;
  uint32_t max_value() const;
  uint32_t max_scan() const;
  // The read paths in force.
  ReadPath read_path() const;
  ReadPath scan_path() const;
  // Operations of this store issued and not yet completed.
  size_t in_flight() const;

 private:
  struct Impl;
  explicit TreeStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remem

#endif  // REMEM_TREE_H_
