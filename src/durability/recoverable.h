// durability::Recoverable: what a data model implements to be durable. The
// durability layer (store.h) owns the files, the log, group commit, fsync
// policies and snapshots of one partition of one service; it knows the
// service's state only through this interface:
//   - recovery: ApplyPut() / ApplyDelete() the final state: each pair of the
//     newest valid snapshot whose key the log after it does not write (a pair
//     the snapshot holds twice: the newer version), then the last record of
//     each key in that log, in log order (a key's versions need not grow along
//     the log: a shard that moved away and back logs its release's delete, then
//     its pairs at their older versions); for a state that AppliesInKeyOrder(),
//     those records merged by key into the snapshot's pairs instead (each
//     before the first pair above it), with Reserve() and Prefetch() as
//     bulk-load hints and EndRecovery() last. Every key is written once (twice
//     at most for a pair a fuzzy snapshot holds twice), so recovery never holds
//     more than the live state held at the end;
//   - snapshots: a SnapshotScan that walks the live state chunk by chunk,
//     between requests, only reading it (one-sided readers see nothing).
//
// Records are keyed: a put carries the key, the value and the version the
// write produced; a delete the key and the version the delete consumed.
// A service logs the RESULT of each write (never the request), so replay
// does not depend on the order of concurrent requests.
//
// Thread contract: recovery calls (LoadRunNote, Reserve, Prefetch, ApplyPut,
// ApplyDelete, NoteDropped, RaiseVersion, RecoveredUncleanly, EndRecovery,
// and AppliesInKeyOrder, shape() and RunNote() then) run on one thread
// before the partition's owner thread starts; the rest on the owner thread
// (RunNote at the clean stop: once the owner thread is done).

#ifndef REMEM_DURABILITY_RECOVERABLE_H_
#define REMEM_DURABILITY_RECOVERABLE_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "remem/status.h"

namespace remem::durability {

// Receives the pairs a snapshot scan emits.
class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;
  virtual void Add(std::string_view key, std::string_view value,
                   uint64_t version) = 0;
  // The state was reorganised under the scan (e.g. a table growth
  // renumbered its buckets): drop what was added, the scan starts over.
  virtual void Restart() = 0;
};

// A resumable, read-only walk over a partition's pairs.
class SnapshotScan {
 public:
  virtual ~SnapshotScan() = default;
  // Emits the next chunk (about `budget` units of work); returns true once
  // every pair present for the whole scan has been emitted. A pair may be
  // emitted twice (recovery keeps the newer version).
  virtual bool Step(SnapshotSink* sink, uint64_t budget) = 0;
  // A size hint stored in the snapshot and handed to Reserve at recovery
  // (the hash store: its bucket count), so recovery shapes the state as
  // the live server had it.
  virtual uint64_t shape() const = 0;
};

class Recoverable {
 public:
  virtual ~Recoverable() = default;

  // --- recovery
  // Before anything is applied, on the empty state: the `pairs` the
  // snapshot holds and the `shape` the live state had last (the largest of
  // the snapshot scan's and the log's kShape records; not called when no
  // shape is known). Must
  // not allocate more than the live state had (it may give back what the
  // empty state holds).
  virtual Status Reserve(uint64_t pairs, uint64_t shape) = 0;
  // Starts loading whatever `key` will touch into the CPU cache.
  virtual void Prefetch(std::string_view /*key*/) {}
  // True for a state that builds densest from keys in ascending (bytewise)
  // order, whose snapshot scan emits them so: recovery then applies the
  // log's records merged into the snapshot's pairs by key, not after them.
  virtual bool AppliesInKeyOrder() const { return false; }
  // Stores `key` = `value` at exactly `version`, unless the stored pair's
  // version is already >= `version`.
  virtual Status ApplyPut(std::string_view key, std::string_view value,
                          uint64_t version) = 0;
  // Removes `key` if its stored version is older than `version`.
  virtual Status ApplyDelete(std::string_view key, uint64_t version) = 0;
  // The next write's version will be above `version`.
  virtual void RaiseVersion(uint64_t version) = 0;
  // A record recovery read and then dropped (--recovery truncate, an atomic
  // group the log's end cut short): before anything is applied, and never
  // applied. What it consumed (a version, an id) must not be handed out
  // again: a client may have read it before it was lost.
  virtual void NoteDropped(std::string_view /*key*/, std::string_view /*value*/,
                           uint64_t /*version*/) {}
  // The previous run may have served writes its log lacks (it did not stop
  // cleanly, or recovery dropped records): after everything is applied and
  // the version counter was raised `gap` above everything recovered, before
  // EndRecovery. A state whose records' versions are not what its clients
  // see (the object heap) skips its own versions here.
  virtual void RecoveredUncleanly(uint64_t /*gap*/) {}
  // Every record is applied; the state is about to serve.
  virtual void EndRecovery() {}
  // What the state keeps across runs beside its log (the store's run file,
  // store.h): handed back at recovery before anything is applied (empty: no
  // run file, or none kept), and asked for after recovery and at a clean
  // stop.
  virtual Status LoadRunNote(std::string_view /*note*/) { return Status::OK(); }
  virtual std::string RunNote() const { return {}; }

  // --- logging and snapshots (owner thread)
  // The version counter: the version the last write consumed.
  virtual uint64_t last_version() const = 0;
  // The state's shape now (as SnapshotScan::shape; 0: none). The store
  // logs a kShape record before the first record after it changes.
  virtual uint64_t shape() const { return 0; }
  virtual std::unique_ptr<SnapshotScan> BeginSnapshot() = 0;
};

}  // namespace remem::durability

#endif  // REMEM_DURABILITY_RECOVERABLE_H_
