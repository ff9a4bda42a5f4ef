// Copyright remem authors.
//
// remem::ObjectStore and remem::Transaction: transactional objects in a
// shared address space, as in FaRM. An object is up to max_object() bytes
// at an ObjectId in the server's object heap; transactions read objects
// one-sided and commit their writes, allocations and frees atomically:
//
//   auto store = remem::ObjectStore::Open(session.get());
//   auto tx = (*store)->Begin();
//   auto a = tx->Read(from);                   // one-sided, version noted
//   auto b = tx->Read(to);
//   tx->Write(from, debit(*a));                // buffered
//   tx->Write(to, credit(*b));
//   Status st = tx->Commit();                  // OK, or Conflict: nothing
//                                              // was written; run it again
//
// or, with the retry loop written once:
//
//   Status st = (*store)->Run([&](remem::Transaction& tx) -> Status { ... });
//
// Semantics (FaRM's optimistic concurrency control): a committed
// transaction is serializable with every other. A read-write transaction
// commits by one call to the server, which checks that every object it
// read still has the version it read (and every object it writes or frees
// too) and then applies all its writes, allocations and frees as one step;
// any object changed meanwhile aborts it with Conflict and nothing is
// applied. A read-only transaction commits with no server work: it reads
// the versions of its objects again one-sided, and commits if none moved
// (FaRM's read validation); where the server performs one-sided reads
// (tcp: each is a round trip), one of two or more objects asks the server
// to check them in one call instead. Like FaRM (not FaRMv2), reads during a
// transaction are each consistent, but two of them need not be consistent
// with each other until Commit says so: code inside a transaction must
// not trust a relation between objects (a pointer from one to another)
// before Commit returns OK.
//
// One-sided reads: an object is read from server memory with no work by
// the server (over shared memory a copy; over tcp the server's connection
// thread performs it). Every object carries a version, its slot's
// incarnation and a checksum (xxh3-64) over them and its bytes: a copy
// that raced a commit, or that found the slot freed and reused, fails
// verification and is read again, and after a bound the server is asked
// (ObjectStore::Read and Transaction::Read then cost one call).
//
// Object ids: an ObjectId names a slot and its incarnation; a freed
// object's id never reads another object (NotFound). A server without
// persistence (no --data-dir, or --no-persistence) starts its slots at an
// incarnation drawn anew at each start:
// an id from before it restarted reads NotFound, not an object allocated
// since (but by a chance of about one in 2^32). Ids may be stored in
// objects (FaRM's pointers): 16 bytes, written with ObjectId::Encode.
//
// Allocation: Transaction::Alloc reserves a slot at once (one call) so
// the new id can be written into other objects in the same transaction;
// the object exists for other clients only once the transaction commits.
// A transaction that aborts, is destroyed uncommitted, or whose session
// closes (its process died) gives its reserved slots back.
//
// Capacity: the server's --txn-memory (default a sixteenth of --memory,
// or less if the other data models took more), in 1 MiB pages each cut
// into slots of one size class (64 B to 64 KiB, each with a 32-byte
// header): an object's capacity is its class's, fixed at Alloc (a Write
// may change its size up to that).
//
// Durability: with the server's --data-dir, a Commit returns OK once its
// changes are logged (written, and synced as --fsync says), as one atomic
// group: a crash keeps a commit whole or drops it whole, and a restarted
// server has every object at the same id and version (freed ids stay
// dead; reservations end with their sessions). Without --data-dir objects
// live as long as the server process; a restarted server has none, and
// calls fail NotFound. Either way calls on a session of a server that
// stopped fail Unavailable: open a new Session. A Commit that fails with
// IOError (the server's disk refused the log) may have been applied in
// memory, as a put that fails so. One server: objects live on the server of the
// session; in a cluster, open a Session to a member. FaRM's distribution of
// objects and two-phase commit over machines, and its replication, are not
// built.
//
// Errors: InvalidArgument (an object larger than max_object(), data
// larger than the object's capacity, a malformed id, a call on a
// transaction that is over), NotFound (no object at the id: freed, never
// committed, of a server that restarted without persistence, or an id
// whose capacity is another size class's than its slot's), Conflict
// (Commit: another transaction changed an object this one used; nothing was
// applied), OutOfMemory (Alloc: the heap is full), Unsupported (a server
// started with no object memory), and the session's errors (Unavailable,
// TimedOut: a Commit that fails so may or may not have been applied, as any
// write).
//
// Thread contract: as the Session they are attached to (single-threaded);
// destroy Transactions before their ObjectStore, and it before its
// Session.

#ifndef REMEM_TXN_H_
#define REMEM_TXN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remem/session.h"
#include "remem/status.h"

namespace remem {

namespace txn {
struct StoreState;
}  // namespace txn

struct ObjectId {
  uint64_t address = 0;      // the slot's offset in the server's heap
  uint32_t incarnation = 0;  // of the slot (a freed slot's next is + 1)
  uint32_t capacity = 0;     // bytes the object can hold

  static constexpr size_t kEncodedBytes = 16;
  // 16 bytes (little-endian fields), for storing an id in an object.
  std::string Encode() const;
  // InvalidArgument unless `bytes` is kEncodedBytes long.
  static Result<ObjectId> Decode(std::string_view bytes);
  // "address:incarnation:capacity", and back (for command lines).
  std::string ToString() const;
  static Result<ObjectId> Parse(std::string_view text);

  bool operator==(const ObjectId& o) const {
    return address == o.address && incarnation == o.incarnation &&
           capacity == o.capacity;
  }
  // All three fields, as operator==: an id of another capacity is another
  // id (it names no object), not the one a transaction read or wrote.
  bool operator<(const ObjectId& o) const {
    if (address != o.address) return address < o.address;
    if (incarnation != o.incarnation) return incarnation < o.incarnation;
    return capacity < o.capacity;
  }
};

class Transaction;

class ObjectStore {
 public:
  struct Object {
    std::string data;
    uint64_t version = 0;  // even, grows with every committed write
  };

  // The object service of the session's server: Unsupported if it has no
  // object memory.
  static Result<std::unique_ptr<ObjectStore>> Open(Session* session);
  ~ObjectStore();
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // The largest object (bytes of data).
  uint32_t max_object() const;

  // One object as last committed (a single consistent copy; no
  // transaction).
  Result<Object> Read(ObjectId id);

  // A new transaction on this store.
  std::unique_ptr<Transaction> Begin();

  // Runs `body` in a new transaction and commits it, again (a fresh
  // transaction each time) while the commit fails with Conflict, up to
  // `tries` times; the body's own error (not OK) aborts and is returned,
  // unless the objects it read were not one state (validation says
  // Conflict): then it runs again, counted against `tries`. Returns the
  // commit's status (Conflict once the tries are spent).
  Status Run(const std::function<Status(Transaction&)>& body, int tries = 64);

 private:
  friend class Transaction;
  explicit ObjectStore(std::unique_ptr<txn::StoreState> state);
  std::unique_ptr<txn::StoreState> state_;
};

class Transaction {
 public:
  ~Transaction();  // aborts if not committed
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // The object's bytes: this transaction's own write if it wrote it, else
  // the object as read (once; a second Read returns the same bytes).
  // `version`, if given, is set to the version read (the one Commit
  // checks), or 0 for what this transaction wrote or allocated.
  Result<std::string> Read(ObjectId id, uint64_t* version = nullptr);
  // The bytes of each of `ids` (which may repeat), as Read gives them, with
  // those not read yet read together: one-sided in one burst, and where the
  // server performs one-sided reads (tcp) one round trip for all of them
  // instead of one each (over shared memory, where a read is a copy, they
  // are copied one after another). A transaction that reads several
  // objects this way is shorter, so a concurrent commit is less likely to
  // abort it. `versions`, if given, gets each one's version as Read's. On
  // an error (an id that is malformed: InvalidArgument; one that names no
  // object or one this transaction freed: NotFound; with both, which one is
  // returned is not specified) nothing this call read counts as read.
  Result<std::vector<std::string>> ReadMany(
      const std::vector<ObjectId>& ids,
      std::vector<uint64_t>* versions = nullptr);
  // Sets the object's bytes at commit (at most its capacity). The object
  // need not have been read (a blind write still aborts if the object is
  // freed meanwhile).
  Status Write(ObjectId id, std::string_view data);
  // A new object of `data`, with room for at least `capacity` bytes and
  // for data (a capacity below data's size, 0 included, is raised to it;
  // the object then gets its size class's capacity, ObjectId::capacity).
  // It exists once this commits.
  Result<ObjectId> Alloc(std::string_view data, uint32_t capacity = 0);
  // Frees the object at commit (its id then reads NotFound).
  Status Free(ObjectId id);

  // Whether the objects read so far are one state: OK if each still has
  // the version read (all of them were current at one moment during this
  // call), Conflict if one has changed or is gone; the transaction goes on
  // either way (after a Conflict its Commit will fail too). Reads inside a
  // transaction are not checked against each other until Commit (FaRM, not
  // opacity): call this before acting on a relation between two objects
  // read (following a pointer read from one to the other, say) when acting
  // on a wrong one would do harm. One-sided over shared memory (no server
  // work).
  Status Validate();

  // Commits: OK (applied atomically, serializable); Conflict (an object
  // read changed or is gone), NotFound (an object written or freed without
  // being read is gone) or InvalidArgument (a transaction that writes,
  // frees or allocates naming more than 4096 objects, read ones counted;
  // an object twice; data over its capacity), with nothing applied. A
  // read-only transaction has no such limit. Either way the transaction is
  // over.
  Status Commit();
  // Ends it without applying anything; gives reserved slots back.
  void Abort();

  // Committed versions of the objects this transaction wrote or allocated
  // (after a successful Commit of a read-write transaction).
  const std::map<ObjectId, uint64_t>& committed_versions() const {
    return committed_;
  }

 private:
  friend class ObjectStore;
  explicit Transaction(txn::StoreState* store) : store_(store) {}
  Status Usable() const;
  // OK if every object read still has the version read (one-sided), else
  // Conflict.
  Status ValidateReads();

  struct ReadEntry {
    uint64_t version = 0;
    std::string data;
  };
  struct WriteEntry {
    std::string data;
    bool freed = false;
    bool allocated = false;  // reserved by this transaction
  };
  txn::StoreState* store_;
  std::map<ObjectId, ReadEntry> reads_;
  std::map<ObjectId, WriteEntry> writes_;
  std::map<ObjectId, uint64_t> committed_;
  bool done_ = false;
};

}  // namespace remem

#endif  // REMEM_TXN_H_
