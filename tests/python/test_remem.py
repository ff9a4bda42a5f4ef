# Copyright remem authors.
#
# The Python module (src/python) against a real remem-server. ctest runs it
# once per transport (REMEM_TEST_TRANSPORT=shm|tcp), with PYTHONPATH at the
# built module and REMEM_SERVER_BIN at build/remem-server. By hand:
#   cd tests/python && REMEM_TEST_TRANSPORT=shm PYTHONPATH=../../build/python \
#     REMEM_SERVER_BIN=../../build/remem-server python3 -m unittest -v test_remem

import os
import select
import subprocess
import sys
import threading
import time
import unittest

import remem

TRANSPORT = os.environ.get("REMEM_TEST_TRANSPORT", "shm")
SERVER_BIN = os.environ.get(
    "REMEM_SERVER_BIN",
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "remem-server"))
TIMEOUT_MS = 10000


class Server:
    """A remem-server on 127.0.0.1:0; its ready line gives the port."""

    def __init__(self, extra=()):
        self.proc = subprocess.Popen(
            [SERVER_BIN, "--listen", "127.0.0.1:0", "--transport", TRANSPORT,
             "--memory", "64M", "--space-memory", "4M", "--space-chunk", "4K"]
            + list(extra),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.address = None
        deadline = time.monotonic() + 30
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if not line:
                    break
                marker = b"listening on "
                at = line.find(marker)
                if at >= 0:
                    self.address = line[at + len(marker):].split()[0].decode()
                    break
            elif self.proc.poll() is not None:
                break
        if self.address is None:
            self.kill()
            raise RuntimeError("remem-server did not start: %r" % line)

    def session(self, **kw):
        kw.setdefault("transport", TRANSPORT)
        kw.setdefault("timeout_ms", TIMEOUT_MS)
        return remem.Session(self.address, **kw)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


def wait_for_stat(session, name, want, bound_s=30):
    """Polls the server's counter until it is `want` (the server applies a
    closed connection's releases on its own time); returns the last value."""
    deadline = time.monotonic() + bound_s
    value = session.stats()[name]
    while value != want and time.monotonic() < deadline:
        time.sleep(0.005)
        value = session.stats()[name]
    return value


class RememTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()

    def setUp(self):
        self.s = self.server.session()

    def tearDown(self):
        self.s.close()

    # --- the session

    def test_session_ping_stats_and_properties(self):
        rtt, transport = self.s.ping()
        self.assertGreater(rtt, 0)
        self.assertIsInstance(transport, str)
        self.assertEqual(transport, self.s.transport)
        self.assertTrue(transport)
        self.assertIsInstance(self.s.server_incarnation, int)
        stats = self.s.stats()
        self.assertIsInstance(stats, dict)
        self.assertTrue(stats)
        for name, value in stats.items():
            self.assertIsInstance(name, str)
            self.assertIsInstance(value, (int, str))
        self.assertIn("hash_pairs", stats)

    def test_context_manager_closes(self):
        with self.server.session() as s:
            h = s.hash()
            h.put("ctx", "v")
        self.assertTrue(s.closed)
        with self.assertRaises(remem.Unavailable):
            h.get("ctx")
        with self.assertRaises(remem.Unavailable):
            s.ping()

    def test_bad_transport_and_address(self):
        with self.assertRaises(remem.InvalidArgument):
            remem.Session(self.server.address, transport="carrier-pigeon")
        with self.assertRaises(remem.Error) as cm:
            remem.Session("127.0.0.1:1", transport=TRANSPORT, timeout_ms=2000)
        self.assertIsInstance(cm.exception.code, str)

    # --- the hash store

    def test_hash_roundtrips(self):
        h = self.s.hash()
        v1 = h.put("k1", "hello")
        self.assertIsInstance(v1, int)
        self.assertEqual(h.get("k1"), b"hello")
        self.assertEqual(h.get(b"k1"), b"hello")
        v2 = h.put(b"k1", b"world")
        self.assertGreater(v2, v1)
        self.assertEqual(h.get("k1"), b"world")
        binary = bytes(range(256)) + b"\x00\x00tail\x00"
        h.put(b"bin\x00key", binary)
        self.assertEqual(h.get(b"bin\x00key"), binary)
        self.assertIsNone(h.get(b"bin"))
        h.put("empty", b"")
        self.assertEqual(h.get("empty"), b"")
        h.put("unicode", "h\u00e9llo \u2603")
        self.assertEqual(h.get("unicode"), "h\u00e9llo \u2603".encode())
        big = os.urandom(1 << 20)
        h.put("big", big)
        self.assertEqual(h.get("big"), big)
        self.assertTrue(h.delete("k1"))
        self.assertIsNone(h.get("k1"))
        self.assertFalse(h.delete("k1"))
        self.assertFalse(h.delete("never-there"))
        with self.assertRaises(TypeError):
            h.put(42, "x")

    def test_versions_if_absent_and_compare_and_put(self):
        for store in (self.s.hash(), self.s.tree()):
            store.delete("cas")
            v1 = store.put_if_absent("cas", "one")
            with self.assertRaises(remem.AlreadyExists):
                store.put_if_absent("cas", "two")
            self.assertEqual(store.get("cas", with_version=True), (b"one", v1))
            v2 = store.compare_and_put("cas", "two", v1)
            self.assertGreater(v2, v1)
            with self.assertRaises(remem.Conflict):
                store.compare_and_put("cas", "stale", v1)
            self.assertEqual(store.get("cas", with_version=True), (b"two", v2))
            self.assertIsNone(store.get("nobody", with_version=True))
            with self.assertRaises(remem.NotFound):
                store.compare_and_put("nobody", "x", 1)

    def test_hash_multi(self):
        h = self.s.hash()
        pairs = [("m%03d" % i, b"v\x00%d" % i) for i in range(100)]
        versions = h.multi_put(pairs)
        self.assertEqual(len(versions), 100)
        keys = [k for k, _ in pairs] + ["m-missing"]
        got = h.multi_get(keys)
        self.assertEqual(got[:100], [v for _, v in pairs])
        self.assertIsNone(got[100])
        self.assertEqual(h.multi_get([]), [])
        # One str or bytes is not a list of one-character keys, nor a
        # pair of them; a dict's pairs are its items().
        for one in ("abc", b"abc", bytearray(b"ab")):
            with self.assertRaises(TypeError):
                h.multi_get(one)
            with self.assertRaises(TypeError):
                h.multi_put(one)
            with self.assertRaises(TypeError):
                h.multi_put([one])
        with self.assertRaises(TypeError):
            h.multi_put({"ab": "x"})
        self.assertEqual(len(h.multi_put({"ab": "x"}.items())), 1)
        self.assertEqual(h.multi_get(("ab",)), [b"x"])

    def test_hash_errors(self):
        h = self.s.hash()
        self.assertEqual(h.max_key, 64 * 1024)
        with self.assertRaises(remem.InvalidArgument) as cm:
            h.put(b"x" * (h.max_key + 1), b"v")
        self.assertEqual(cm.exception.code, "InvalidArgument")
        self.assertIsInstance(cm.exception, remem.Error)
        self.assertTrue(cm.exception.message)
        with self.assertRaises(remem.InvalidArgument):
            h.put(b"", b"v")
        with self.assertRaises(remem.InvalidArgument):
            h.get(b"x" * (h.max_key + 1))

    # --- the ordered store

    def test_tree_scan_order_and_paging(self):
        t = self.s.tree()
        keys = [b"user:%04d" % i for i in range(250)]
        for k in reversed(keys):
            t.put(k, k + b"=v")
        t.put(b"other", b"x")
        self.assertEqual(t.get(b"user:0007"), b"user:0007=v")
        self.assertIsNone(t.get(b"user:9999"))

        seen = []
        start = b"user:"
        pages = 0
        while True:
            items, more, resume = t.scan(start, b"user;", limit=64)
            pages += 1
            seen.extend(items)
            if not more:
                break
            start = resume
        self.assertGreater(pages, 3)
        self.assertEqual([k for k, _ in seen], keys)
        self.assertEqual([v for _, v in seen], [k + b"=v" for k in keys])

        items, more, _ = t.scan(b"user:", b"user;", limit=5, descending=True)
        self.assertTrue(more)
        self.assertEqual([k for k, _ in items], keys[::-1][:5])

        items, more, _ = t.scan_prefix(b"user:01", limit=1000)
        self.assertFalse(more)
        self.assertEqual([k for k, _ in items], keys[100:200])

        self.assertTrue(t.delete(b"user:0000"))
        self.assertFalse(t.delete(b"user:0000"))
        items, _, _ = t.scan(b"user:", b"user;", limit=1)
        self.assertEqual(items[0][0], b"user:0001")

        t.multi_put([(b"mp1", b"a"), (b"mp2", b"\x00")])
        self.assertEqual(t.multi_get([b"mp1", b"mp2", b"mp3"]),
                         [b"a", b"\x00", None])
        with self.assertRaises(remem.InvalidArgument):
            t.scan(b"a", b"b", limit=0)

    # --- namespaces

    def test_namespace_lifecycle(self):
        ns = remem.Namespace.create(self.s, "pyspace")
        self.assertEqual(ns.name, "pyspace")
        self.assertIn("pyspace", [i["name"] for i in remem.Namespace.list(self.s)])
        ns.reserve(64 * 1024)
        address, length = ns.alloc(10000)
        self.assertGreaterEqual(length, 10000)
        self.assertEqual(ns.segments(), [(address, length)])
        m = ns.map(address, length)
        self.assertEqual(m.length, length)
        self.assertEqual(m.read(0, 16), b"\x00" * 16)
        data = b"raw\x00bytes" * 100
        m.write(100, data)
        self.assertEqual(m.read(100, len(data)), data)
        self.assertEqual(m.fetch_add(8, 5), 0)
        self.assertEqual(m.fetch_add(8, 1), 5)
        self.assertEqual(m.compare_and_swap(8, 6, 100), 6)
        self.assertEqual(m.compare_and_swap(8, 6, 7), 100)
        self.assertEqual(int.from_bytes(m.read(8, 8), "little"), 100)
        with self.assertRaises(remem.InvalidArgument) as small:
            m.read(length - 4, 8)  # past the mapping
        # Far past it: refused the same way, before a buffer of that
        # length is made (10**10 made 10 GB; 2**62 fails to be made, so
        # that the test cannot fill the machine's memory).
        with self.assertRaises(remem.InvalidArgument) as huge:
            m.read(0, 2**62)
        self.assertIn("is outside the mapping's %d bytes" % length,
                      huge.exception.message)
        self.assertIn("is outside the mapping's %d bytes" % length,
                      small.exception.message)
        with self.assertRaises(remem.InvalidArgument):
            m.fetch_add(3, 1)  # unaligned

        # Another session sees the bytes through its own mapping.
        with self.server.session() as other:
            ns2 = remem.Namespace.open(other, "pyspace")
            self.assertEqual(ns2.id, ns.id)
            m2 = ns2.map(address, length)
            self.assertEqual(m2.read(100, len(data)), data)

        ns.free(address)
        self.assertEqual(ns.segments(), [])
        with self.assertRaises(remem.NotFound):
            ns.map(address, length)
        ns.release()
        remem.Namespace.delete(self.s, "pyspace")
        with self.assertRaises(remem.NotFound):
            remem.Namespace.open(self.s, "pyspace")
        with self.assertRaises(remem.NotFound):
            remem.Namespace.delete(self.s, "pyspace")

    def test_namespace_errors(self):
        with self.assertRaises(remem.InvalidArgument):
            remem.Namespace.create(self.s, "has space")
        with self.assertRaises(remem.InvalidArgument):
            remem.Namespace.create(self.s, "")
        remem.Namespace.create(self.s, "dup")
        try:
            with self.assertRaises(remem.AlreadyExists) as cm:
                remem.Namespace.create(self.s, "dup")
            self.assertEqual(cm.exception.code, "AlreadyExists")
            ns = remem.Namespace.open(self.s, "dup")
            with self.assertRaises(remem.OutOfMemory):
                ns.alloc(64 << 20)  # over --space-memory
        finally:
            remem.Namespace.delete(self.s, "dup")

    # --- lifetime and threads

    # --- server-side operations

    def test_ops_atomics_compare_swap_and_append(self):
        ops, h = self.s.ops(), self.s.hash()
        h.delete("ctr")
        with self.assertRaises(remem.NotFound):
            ops.fetch_add("ctr", 1)
        self.assertEqual(ops.fetch_add("ctr", 5, create=True, initial=10)[0],
                         10)
        value, version = ops.add_fetch("ctr", 2)
        self.assertEqual(value, 17)
        self.assertEqual(h.get("ctr", with_version=True),
                         ((17).to_bytes(8, "little", signed=True), version))
        self.assertEqual(ops.min("ctr", 3)[0], 3)
        self.assertEqual(ops.max("ctr", 40)[0], 40)
        ops.add_fetch("ctr", (1 << 63) - 41)
        with self.assertRaises(remem.Error) as e:
            ops.add_fetch("ctr", 1)  # past int64: nothing changes
        self.assertEqual(e.exception.code, "OutOfRange")
        with self.assertRaises(TypeError):
            ops.add_fetch("ctr", 1.5)
        h.put("word", "old")
        applied, seen, _ = ops.compare_swap("word", "nope", "new")
        self.assertEqual((applied, seen), (False, b"old"))
        applied, seen, _ = ops.compare_swap("word", "old", "new")
        self.assertEqual((applied, seen), (True, b"old"))
        self.assertEqual(h.get("word"), b"new")
        h.delete("log")
        self.assertEqual(ops.append("log", "ab", create=True)[0], 2)
        self.assertEqual(ops.append("log", b"cd")[0], 4)
        self.assertEqual(h.get("log"), b"abcd")

    def test_ops_vectors(self):
        ops = self.s.ops()
        ops.vec_put("v", [1.0, 2.5, -3.0])
        self.assertEqual(ops.vec_get("v")[:2], ([1.0, 2.5, -3.0], "double"))
        ops.vec_update("v", "mul", 2)
        ops.vec_update("v", "add", [1, 1, 1], type="double")
        self.assertEqual(ops.vec_get("v")[0], [3.0, 6.0, -5.0])
        self.assertEqual(ops.vec_reduce("v", "sum"), 4.0)
        self.assertEqual(ops.vec_reduce("v", "count"), 3)
        self.assertEqual(ops.vec_filter("v", ">", 0), [3.0, 6.0])
        self.assertEqual(ops.vec_filter("v", ">", 0, indices=True), [0, 1])
        ops.vec_put("i", [5, 1, 9])
        self.assertEqual(ops.vec_get("i")[1], "int64")
        self.assertEqual(ops.vec_reduce("i", "max"), 9)
        ops.vec_put("f", [1, 2], type="int32")
        self.assertEqual(ops.vec_get("f")[:2], ([1, 2], "int32"))
        self.assertIsNone(ops.vec_get("no vector"))
        with self.assertRaises(ValueError):
            ops.vec_put("f", [1 << 40], type="int32")
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_put("f", [1], type="int8")
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_update("v", "pow", 2)
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_reduce("v", "mean")
        # A reduction that is neither a name nor a function id says so.
        for bad, error in ((None, TypeError), (1.5, TypeError),
                           (True, TypeError), (-1, ValueError),
                           (2**32, ValueError), (2**70, ValueError)):
            with self.assertRaises(error) as e:
                ops.vec_reduce("v", bad)
            self.assertIn("reduction", str(e.exception))
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_filter("v", "=~", 1)
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_update("v", "add", [1.0, 2.0])  # not as long
        # Past float's range: refused, never stored as an infinity, in a
        # list as a single operand is.
        ops.vec_put("pf", [1.0, 2.0, 3.0], type="float")
        for bad in ([1e39, -1e300, 1.0], [1.0, 2.0, -1e39]):
            with self.assertRaises(remem.InvalidArgument) as e:
                ops.vec_put("pf", bad, type="float")
            self.assertIn("does not fit a float", e.exception.message)
            with self.assertRaises(remem.InvalidArgument) as e:
                ops.vec_update("pf", "add", bad, type="float")
            self.assertIn("does not fit a float", e.exception.message)
        with self.assertRaises(remem.InvalidArgument):
            ops.vec_update("pf", "add", 1e39)
        self.assertEqual(ops.vec_get("pf")[:2], ([1.0, 2.0, 3.0], "float"))
        # float's largest value, as printed, and the infinities are floats.
        ops.vec_put("pf", [3.4028235e+38, float("inf"), -float("inf")],
                    type="float")
        items = ops.vec_get("pf")[0]
        self.assertEqual(items[1:], [float("inf"), -float("inf")])
        self.assertLess(items[0], float("inf"))
        with self.assertRaises(remem.Error) as e:
            ops.call("v", 77, b"")  # no --ops-library
        self.assertEqual(e.exception.code, "Unsupported")

    # --- transactional objects

    def test_objects_commit_read_and_ids(self):
        objs = self.s.objects()
        self.assertGreater(objs.max_object, 60000)
        with objs.begin() as tx:
            a = tx.alloc(b"alice", capacity=100)
            b = tx.alloc("bob")
        self.assertIsInstance(a, remem.ObjectId)
        self.assertGreaterEqual(a.capacity, 100)
        self.assertEqual(objs.read(a), (b"alice", 2))
        self.assertEqual(tx.committed_versions, {a: 2, b: 2})
        # Ids as text and as 16 bytes (to store in objects), both ways.
        self.assertEqual(remem.ObjectId.parse(str(a)), a)
        self.assertEqual(remem.ObjectId.decode(a.encode()), a)
        self.assertEqual(len(a.encode()), 16)
        self.assertNotEqual(a, b)
        self.assertEqual(objs.read(str(b))[0], b"bob")
        tx = objs.begin()
        self.assertEqual(tx.read_many([a, str(b)]), [b"alice", b"bob"])
        self.assertEqual(
            tx.read_many([b, a], with_version=True), [(b"bob", 2), (b"alice", 2)]
        )
        with self.assertRaises(TypeError):
            tx.read_many([a, 5])
        with self.assertRaises(TypeError):
            tx.read_many(str(a))  # one id, not a list of them
        tx.abort()
        tx = objs.begin()
        self.assertEqual(tx.read(a, with_version=True), (b"alice", 2))
        tx.write(a, b"alice2")
        tx.free(b)
        tx.commit()
        self.assertEqual(objs.read(a), (b"alice2", 4))
        with self.assertRaises(remem.NotFound):
            objs.read(b)
        with self.assertRaises(remem.InvalidArgument):
            tx.write(a, b"over")  # the transaction is over
        # An exception in a with block aborts: nothing applied, and the
        # allocation's reservation is given back.
        with self.assertRaises(ZeroDivisionError):
            with objs.begin() as tx:
                tx.write(a, b"never")
                tx.alloc(b"never")
                1 / 0
        self.assertEqual(objs.read(a)[0], b"alice2")
        self.assertEqual(wait_for_stat(self.s, "txn_reserved", 0), 0)
        with self.assertRaises(TypeError):
            objs.read(5)
        with self.assertRaises(remem.InvalidArgument):
            objs.read("not an id")
        with self.assertRaises(remem.InvalidArgument):
            with objs.begin() as tx:
                tx.write(a, b"x" * (a.capacity + 1))

    def test_objects_conflicts_validate_and_run(self):
        def n(x):
            return x.to_bytes(8, "little")

        def v(data):
            return int.from_bytes(data, "little")

        objs = self.s.objects()
        s2 = self.server.session()
        other = s2.objects()
        with objs.begin() as tx:
            c = tx.alloc(n(0))
        tx = objs.begin()
        seen = v(tx.read(c))
        tx.validate()
        with other.begin() as t2:
            t2.write(c, n(100))
        with self.assertRaises(remem.Conflict):
            tx.validate()
        tx.write(c, n(seen + 1))
        with self.assertRaises(remem.Conflict):
            tx.commit()
        self.assertEqual(v(objs.read(c)[0]), 100)

        # run: a body that conflicts once runs again in a fresh transaction.
        calls = []

        def incr(t):
            x = v(t.read(c))
            if not calls:
                with other.begin() as t2:
                    t2.write(c, n(200))
            calls.append(x)
            t.write(c, n(x + 1))
            return x + 1

        self.assertEqual(objs.run(incr), 201)
        self.assertEqual(calls, [100, 200])
        # A body's error drawn from reads that changed meanwhile is not its
        # answer: it runs again.
        tries = []

        def checked(t):
            x = v(t.read(c))
            if not tries:
                with other.begin() as t2:
                    t2.write(c, n(300))
            tries.append(x)
            if x != 300:
                raise ValueError("stale")
            return x

        self.assertEqual(objs.run(checked), 300)
        self.assertEqual(tries, [201, 300])

        # The body's own exception is raised, nothing applied.
        def bad(t):
            t.write(c, n(7))
            raise ValueError("no")

        with self.assertRaises(ValueError):
            objs.run(bad)
        self.assertEqual(v(objs.read(c)[0]), 300)
        with self.assertRaises(remem.InvalidArgument):
            objs.run(incr, tries=0)
        # Closing a session ends its open transactions and stores.
        open_tx = other.begin()
        open_tx.alloc(b"reserved")
        s2.close()
        with self.assertRaises(remem.Unavailable):
            open_tx.read(c)
        with self.assertRaises(remem.Unavailable):
            other.read(c)
        self.assertEqual(wait_for_stat(self.s, "txn_reserved", 0), 0)

    def test_close_then_use_raises(self):
        s = self.server.session()
        h, t = s.hash(), s.tree()
        ns = remem.Namespace.create(s, "closing")
        seg = ns.alloc(4096)
        m = ns.map(*seg)
        h.put("a", "b")
        s.close()
        s.close()  # twice is fine
        for call in (lambda: h.get("a"), lambda: h.put("a", "c"),
                     lambda: t.scan(b"", b""), lambda: ns.alloc(4096),
                     lambda: m.read(0, 8), lambda: m.write(0, b"x"),
                     lambda: s.hash(), lambda: s.stats(),
                     lambda: remem.Namespace.list(s)):
            with self.assertRaises(remem.Unavailable):
                call()
        # The namespace lives on the server until deleted.
        remem.Namespace.delete(self.s, "closing")

    def test_stores_outlive_the_python_session_object(self):
        h = self.server.session().hash()  # the Session object is dropped
        h.put("orphan", "still works")
        self.assertEqual(h.get("orphan"), b"still works")
        del h  # the session goes with its last store

    def test_threads_sharing_a_session_are_serialized(self):
        h = self.s.hash()
        errors = []

        def work(n):
            try:
                for i in range(200):
                    k = "t%d-%d" % (n, i)
                    h.put(k, k)
                    if h.get(k) != k.encode():
                        errors.append(k)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])


class DaemonThreadsAtExitTest(unittest.TestCase):
    # A daemon thread inside a call when the program ends is ended by
    # Python as it takes the GIL back; the module's release of the GIL let
    # that unwinding through (it aborted the process: "terminate called
    # without an active exception", exit 134, every run).
    def test_a_program_exits_cleanly_with_daemon_threads_in_calls(self):
        server = Server()
        script = (
            "import remem, sys, threading, time\n"
            "s = remem.Session(sys.argv[1], transport=sys.argv[2])\n"
            "h = s.hash(); h.put(b'k', b'v')\n"
            "def loop(f, called):\n"
            "    while True:\n"
            "        f(); called.set()\n"
            "events = []\n"
            "for f in (lambda: h.get(b'k'), s.ping):\n"
            "    events.append(threading.Event())\n"
            "    threading.Thread(target=loop, args=(f, events[-1]),"
            " daemon=True).start()\n"
            "for e in events: e.wait(30)\n"
            "print('exit')\n")
        try:
            for _ in range(3):
                run = subprocess.run(
                    [sys.executable, "-c", script, server.address, TRANSPORT],
                    capture_output=True, timeout=60,
                    env=dict(os.environ))
                self.assertEqual(run.returncode, 0, run.stderr)
                self.assertEqual(run.stdout, b"exit\n")
        finally:
            server.kill()


class KilledServerTest(unittest.TestCase):
    def test_a_session_whose_server_died_raises_unavailable(self):
        server = Server()
        try:
            s = server.session(timeout_ms=3000)
            h = s.hash()
            h.put("k", "v")
            ns = remem.Namespace.create(s, "doomed")
            m = ns.map(*ns.alloc(4096))
        finally:
            server.kill()
        # The session notices its TCP connection closed within ~10 ms.
        deadline = time.monotonic() + 10
        while s.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(s.connected)
        with self.assertRaises(remem.Unavailable) as cm:
            h.put("k", "v2")
        self.assertEqual(cm.exception.code, "Unavailable")
        for call in (lambda: h.get("k"), lambda: m.read(0, 8),
                     lambda: m.write(0, b"x"), s.ping, s.stats,
                     lambda: remem.Namespace.list(s)):
            with self.assertRaises(remem.Unavailable):
                call()
        s.close()
        with self.assertRaises(remem.Unavailable):
            h.get("k")



ZOOKEEPER_DIR = os.environ.get("REMEM_TEST_ZOOKEEPER_DIR", "")


@unittest.skipUnless(ZOOKEEPER_DIR, "no shared ZooKeeper "
                     "(REMEM_TEST_ZOOKEEPER_DIR: ctest sets it)")
class ClusterTest(unittest.TestCase):
    """Two servers forming a cluster in the ZooKeeper ctest shares, with an
    ordered store of two ranges, reached through remem.Cluster."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(ZOOKEEPER_DIR, "hosts")) as f:
            hosts = f.readline().strip()
        path = "/remem-test/python-%d-%s-%d" % (os.getpid(), TRANSPORT,
                                                 time.monotonic_ns())
        flags = ["--cluster", hosts + path, "--cluster-size", "2",
                 "--tree-splits", "m"]
        cls.servers = [Server(flags), Server(flags)]

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.kill()

    def connect(self, **kw):
        kw.setdefault("transport", TRANSPORT)
        kw.setdefault("timeout_ms", TIMEOUT_MS)
        kw.setdefault("wait_for_config_ms", 30000)
        return remem.Cluster([s.address for s in self.servers], **kw)

    def test_keys_reach_their_owners_on_both_servers(self):
        with self.connect() as c:
            info = c.info
            self.assertEqual(len(info["nodes"]), 2)
            self.assertEqual(sum(n["shards"] for n in info["nodes"]),
                             info["num_shards"])
            self.assertEqual(info["splits"], [b"m"])
            keys = ["user:%d" % i for i in range(200)]
            versions = c.multi_put([(k, k.upper()) for k in keys])
            self.assertEqual(len(versions), 200)
            self.assertEqual(c.multi_get(keys + ["nobody"]),
                             [k.upper().encode() for k in keys] + [None])
            owners = {c.owner_of(k) for k in keys}
            self.assertEqual(owners, {s.address for s in self.servers})
            # Each server holds the keys it owns, and not the others (a
            # member refuses a key it does not own, or has none of it).
            for server in self.servers:
                with server.session() as s:
                    h = s.hash()
                    for k in keys[:40]:
                        if c.owner_of(k) == server.address:
                            self.assertEqual(h.get(k), k.upper().encode())
                            continue
                        try:
                            self.assertIsNone(h.get(k))
                        except remem.Error as e:
                            self.assertEqual(e.code, "Moved")
            v = c.put("user:0", "zero")
            self.assertEqual(c.get("user:0", with_version=True), (b"zero", v))
            with self.assertRaises(remem.Conflict):
                c.compare_and_put("user:0", "stale", v - 1)
            self.assertGreater(c.compare_and_put("user:0", "new", v), v)
            with self.assertRaises(remem.AlreadyExists):
                c.put_if_absent("user:0", "again")
            self.assertTrue(c.delete("user:0"))
            self.assertFalse(c.delete("user:0"))
            self.assertIsNone(c.get("user:0"))
            c.refresh()

    def test_the_ordered_store_scans_across_ranges_in_order(self):
        c = self.connect()
        t = c.tree()
        words = ["apple", "kiwi", "lemon", "mango", "nut", "zucchini"]
        t.multi_put([(w, w[::-1]) for w in words])
        items, more, _ = t.scan(b"", b"", limit=100)
        self.assertFalse(more)
        self.assertEqual([k for k, _ in items], [w.encode() for w in words])
        items, more, resume = t.scan(b"k", b"", limit=3)
        self.assertTrue(more)
        self.assertEqual([k for k, _ in items], [b"kiwi", b"lemon", b"mango"])
        items, more, _ = t.scan(resume, b"", limit=3)
        self.assertEqual([k for k, _ in items], [b"nut", b"zucchini"])
        items, _, _ = t.scan(b"", b"", limit=2, descending=True)
        self.assertEqual([k for k, _ in items], [b"zucchini", b"nut"])
        self.assertEqual(t.get("mango"), b"ognam")
        v = t.put("mango", "m2")
        self.assertEqual(t.get("mango", with_version=True), (b"m2", v))
        self.assertEqual(t.scan_prefix("l")[0], [(b"lemon", b"nomel")])
        c.close()
        c.close()  # twice is fine
        self.assertTrue(c.closed)
        for call in (lambda: c.get("k"), lambda: t.get("k"),
                     lambda: t.scan(b"", b""), lambda: c.info):
            with self.assertRaises(remem.Unavailable):
                call()

    def test_server_side_operations_run_on_each_keys_owner(self):
        with self.connect() as c:
            ops = c.ops()
            keys = ["counter:%d" % i for i in range(40)]
            self.assertEqual({c.owner_of(k) for k in keys},
                             {s.address for s in self.servers})
            for k in keys:
                c.delete(k)
            with self.assertRaises(remem.NotFound):
                ops.fetch_add(keys[0], 1)
            for i, k in enumerate(keys):
                self.assertEqual(ops.add_fetch(k, i, create=True)[0], i)
                self.assertEqual(ops.fetch_add(k, 1)[0], i)
            # Each counter is on its owner, as the cluster's gets see it.
            for i, k in enumerate(keys):
                value, version = ops.add_fetch(k, 0)
                self.assertEqual(value, i + 1)
                self.assertEqual(c.get(k, with_version=True),
                                 ((i + 1).to_bytes(8, "little", signed=True),
                                  version))
            self.assertEqual(ops.min(keys[5], 2)[0], 2)
            self.assertEqual(ops.max(keys[5], 9)[0], 9)
            c.put("word", "old")
            self.assertEqual(ops.compare_swap("word", "nope", "new")[:2],
                             (False, b"old"))
            self.assertEqual(ops.compare_swap("word", "old", "new")[:2],
                             (True, b"old"))
            self.assertEqual(c.get("word"), b"new")
            c.delete("log")
            self.assertEqual(ops.append("log", "ab", create=True)[0], 2)
            self.assertEqual(ops.append("log", b"cd")[0], 4)
            self.assertEqual(c.get("log"), b"abcd")
            # Vectors under keys of both servers.
            names = ["scores:%d" % i for i in range(8)]
            self.assertEqual({c.owner_of(n) for n in names},
                             {s.address for s in self.servers})
            for n in names:
                v = ops.vec_put(n, [1.5, 2.5, 4.0])
                self.assertEqual(ops.vec_get(n),
                                 ([1.5, 2.5, 4.0], "double", v))
                self.assertGreater(ops.vec_update(n, "mul", 2), v)
                self.assertEqual(ops.vec_reduce(n, "sum"), 16.0)
                self.assertEqual(ops.vec_reduce(n, "count"), 3)
                self.assertEqual(ops.vec_filter(n, ">", 4), [5.0, 8.0])
                self.assertEqual(ops.vec_filter(n, ">", 4, indices=True),
                                 [1, 2])
            self.assertIsNone(ops.vec_get("no vector"))
            with self.assertRaises(remem.InvalidArgument):
                ops.vec_reduce(names[0], "mean")
            with self.assertRaises(remem.Error) as e:
                ops.call(names[0], 77, b"")  # no --ops-library
            self.assertEqual(e.exception.code, "Unsupported")
        with self.assertRaises(remem.Unavailable):
            ops.fetch_add(keys[0], 1)  # the cluster is closed
        with self.assertRaises(remem.Unavailable):
            c.ops()

    def test_stats_of_every_server(self):
        with self.connect() as c:
            stats = c.stats()
            self.assertEqual(set(stats), {s.address for s in self.servers})
            with self.servers[0].session() as s:
                names = set(s.stats())
            for counters in stats.values():
                self.assertNotIn("error", counters)
                self.assertEqual(set(counters), names)

    def test_bad_arguments(self):
        with self.assertRaises(remem.InvalidArgument):
            remem.Cluster([])
        with self.assertRaises(remem.InvalidArgument):
            self.connect(read_from="nearest")
        with self.assertRaises(remem.InvalidArgument):
            self.connect(wait_for_config_ms=-1)
        with self.assertRaises(remem.Error):
            remem.Cluster("127.0.0.1:1", transport=TRANSPORT, timeout_ms=2000)
        with self.connect() as c:
            with self.assertRaises(remem.NotFound):
                c.drain("127.0.0.1:1", wait_ms=0)  # not a member
            with self.assertRaises(remem.InvalidArgument):
                c.drain("no port", wait_ms=0)
            with self.assertRaises(remem.InvalidArgument):
                c.drain(self.servers[0].address, wait_ms=-1)


@unittest.skipUnless(ZOOKEEPER_DIR, "no shared ZooKeeper "
                     "(REMEM_TEST_ZOOKEEPER_DIR: ctest sets it)")
class ClusterDrainTest(unittest.TestCase):
    """A cluster of two servers, one drained through remem.Cluster."""

    def setUp(self):
        with open(os.path.join(ZOOKEEPER_DIR, "hosts")) as f:
            hosts = f.readline().strip()
        path = "/remem-test/python-drain-%d-%s-%d" % (
            os.getpid(), TRANSPORT, time.monotonic_ns())
        flags = ["--cluster", hosts + path, "--cluster-size", "2",
                 "--tree-splits", "m"]
        self.servers = [Server(flags), Server(flags)]

    def tearDown(self):
        for server in self.servers:
            server.kill()

    def test_a_drained_server_holds_nothing_and_can_be_stopped(self):
        with remem.Cluster([s.address for s in self.servers],
                           transport=TRANSPORT, timeout_ms=TIMEOUT_MS,
                           wait_for_config_ms=30000) as c:
            keys = ["k%d" % i for i in range(100)]
            c.multi_put([(k, k * 3) for k in keys])
            c.tree().multi_put([(w, w) for w in ("apple", "zebra")])
            c.ops().add_fetch("hits", 5, create=True)
            leaving = self.servers[1].address
            c.drain(leaving, wait_ms=60000)
            c.refresh()
            nodes = {n["address"]: n for n in c.info["nodes"]}
            left = nodes.get(leaving, {"shards": 0, "ranges": 0})
            self.assertEqual((left["shards"], left["ranges"]), (0, 0))
            self.assertEqual({c.owner_of(k) for k in keys},
                             {self.servers[0].address})
            with self.assertRaises(remem.Error) as e:
                c.drain(self.servers[0].address, wait_ms=0)  # the last one
            self.assertEqual(e.exception.code, "Unsupported")
            self.servers[1].kill()
            self.assertEqual(c.multi_get(keys), [(k * 3).encode() for k in keys])
            self.assertEqual(c.tree().scan(b"", b"")[0],
                             [(b"apple", b"apple"), (b"zebra", b"zebra")])
            self.assertEqual(c.ops().add_fetch("hits", 1)[0], 6)


if __name__ == "__main__":
    unittest.main()
