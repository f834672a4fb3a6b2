"""Fenced writes on the RESP endpoint (DESIGN.md §1 safety model, §2 "Which writes are fenced"):
a paused former holder cannot write after a newer holder took the lock, even before the newer
holder writes; protected keys need their lock; hash tags and the one-lock rule pick the fencing
lock; MULTI/EXEC is all-or-nothing against the fence; a flushed script cache, a lost Redis and
a lost lease never let a write through unfenced."""

import random
import signal
import socket
import threading
import time
import unittest

import harness
from harness import Err, FgTestCase, encode

PROTECT = 'protect:\n  - { store: redis, keys: "wallet:*", lock: "wallet:$1" }\n'


def lock_key(name):
    return "fencegate:lock:{%s}" % name


def hwm_key(name):
    return "fencegate:hwm:{%s}" % name


def metric(fg, name):
    return fg.metrics().get(name, 0.0)


class FencingCase(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def fencegate(self, *extra, **kw):
        cfg = self.write_file("fencegate-%d.yaml" % len(self._fg_procs), PROTECT)
        return self.start_fencegate(self.redis, args=list(extra) + ["--config", cfg], **kw)

    def acquire(self, conn, name, *opts, timeout=None):
        r = conn.call("FENCE.ACQUIRE", name, *opts, timeout=timeout)
        self.assertIsInstance(r, int, "FENCE.ACQUIRE %s %s got %r" % (name, opts, r))
        return r

    def hwm(self, name):
        v = self.direct.get(hwm_key(name))
        return None if v is None else int(v)

    def assert_refused(self, reply, *prefixes):
        self.assertIsInstance(reply, Err, "expected a refusal (%s), got %r" % (
            "/".join(prefixes), reply))
        self.assertTrue(reply.startswith(tuple(p + " " for p in prefixes)),
                        "expected %s, got %r" % ("/".join(prefixes), reply))

    def monitor(self):
        """A MONITOR stream straight on Redis: returns (conn, stop) where stop() returns every
        command line Redis saw until then."""
        mon = self.raw(self.redis.port)
        self.assertEqual(mon.call("MONITOR"), "OK")
        marker = "fg-monitor-end-%d" % time.monotonic_ns()

        def stop():
            self.direct.echo(marker)
            seen = []
            deadline = time.monotonic() + 5
            while True:
                self.assertLess(time.monotonic(), deadline, "MONITOR marker never arrived")
                line = mon.read_reply(timeout=5)
                if marker in line:
                    return seen
                seen.append(str(line))
        return mon, stop


class Freeze(FencingCase):
    """The scenario fencing exists for: a holder paused past its lease."""

    def test_frozen_sidecar_resumed_after_takeover_is_refused(self):
        a = self.fencegate("--session-ttl-ms", "600")
        b = self.fencegate("--session-ttl-ms", "600")
        ca = self.raw(a.resp_port, timeout=10)
        cb = self.raw(b.resp_port, timeout=10)
        ta = self.acquire(ca, "wallet:1")
        self.assertEqual(ca.call("SET", "wallet:1", "A-1"), "OK")
        self.assertEqual(self.hwm("wallet:1"), ta)

        self.freeze(a)
        # A's client writes while A is frozen: the request waits in the socket.
        ca.cmd("SET", "wallet:1", "A-frozen")
        harness.wait_until(lambda: self.direct.exists(lock_key("wallet:1")) == 0, 5, 0.02,
                           "A's lease to run out while A is frozen")
        tb = self.acquire(cb, "wallet:1", "WAIT", 3000, timeout=6)
        self.assertGreater(tb, ta)
        self.assertEqual(self.hwm("wallet:1"), tb,
                         "fence on acquire: the mark must be raised before the token is given")

        a.signal(signal.SIGCONT)
        r1 = ca.read_reply(timeout=5)
        self.assert_refused(r1, "STALE", "LOCKLOST")
        r2 = ca.call("SET", "wallet:1", "A-after-resume")
        self.assert_refused(r2, "STALE", "LOCKLOST")
        self.assertEqual(self.direct.get("wallet:1"), b"A-1", "the former holder's write applied")
        self.assertEqual(self.hwm("wallet:1"), tb, "the stale write moved the mark")
        m = a.metrics()
        self.assertGreaterEqual(m.get("fencegate_stale_writes_refused_total", 0) +
                                m.get("fencegate_locklost_refused_total", 0), 2)

        self.assertEqual(cb.call("SET", "wallet:1", "B-1"), "OK")
        self.assertEqual(self.direct.get("wallet:1"), b"B-1")
        self.assertEqual(self.hwm("wallet:1"), tb)
        # A knows it lost the lock.
        locks = ca.call("FENCE.LOCKS")
        self.assertEqual([(x[0], x[1], x[3]) for x in locks], [(b"wallet:1", ta, b"lost")], locks)
        for r in (r1, r2):  # the refusal names the lock and A's token
            if r.startswith("LOCKLOST"):
                self.assertTrue(r.startswith("LOCKLOST lock wallet:1 (token %d)" % ta), r)
            else:
                self.assertTrue(r.startswith("STALE lock wallet:1 token %d < high-water mark %d"
                                             % (ta, tb)), r)

    def test_backend_forgets_lease_while_holder_thinks_it_holds(self):
        a = self.fencegate()
        b = self.fencegate()
        ca = self.raw(a.resp_port)
        cb = self.raw(b.resp_port)
        ta = self.acquire(ca, "wallet:2")
        self.assertEqual(ca.call("SET", "wallet:2", "A-1"), "OK")
        harness.redis_cli(self.redis.port, "DEL", lock_key("wallet:2"))
        tb = self.acquire(cb, "wallet:2", "WAIT", 0)
        self.assertGreater(tb, ta)
        self.assertEqual(ca.call("FENCE.TOKEN", "wallet:2"), ta, "A should not know yet")

        stale0 = metric(a, "fencegate_stale_writes_refused_total")
        r = ca.call("SET", "wallet:2", "A-2")
        self.assert_refused(r, "STALE")
        self.assertTrue(r.startswith("STALE lock wallet:2 token %d < high-water mark %d"
                                     % (ta, tb)), r)
        self.assertEqual(self.direct.get("wallet:2"), b"A-1")
        self.assertEqual(self.hwm("wallet:2"), tb)
        self.assertEqual(metric(a, "fencegate_stale_writes_refused_total"), stale0 + 1)
        # The refusal proved the lock B's: A's sidecar gave it up, and refuses the next writes
        # itself, multi-key ones included, without sending them.
        self.assertIsNone(ca.call("FENCE.TOKEN", "wallet:2"))
        self.assert_refused(ca.call("DEL", "wallet:2"), "LOCKLOST")
        self.assert_refused(ca.call("MSET", "wallet:2", "x", "plain:k", "y"), "LOCKLOST")
        self.assertEqual(self.direct.get("wallet:2"), b"A-1")
        self.assertEqual(self.direct.exists("plain:k"), 0, "half of a refused MSET applied")
        self.assertEqual(cb.call("SET", "wallet:2", "B-1"), "OK")
        self.assertEqual(self.direct.get("wallet:2"), b"B-1")


class WhichWrites(FencingCase):

    def setUp(self):
        super().setUp()
        self.fg = self.fencegate()
        self.c = self.raw(self.fg.resp_port)

    def test_a_key_whose_lock_name_no_lock_can_have_is_refused_saying_so(self):
        # wallet:* -> wallet:$1: a key of 600 bytes maps to a lock name over 512 bytes, a key
        # with a NUL byte to a name with one. No lock can have either name, so the NOLOCK
        # advice (FENCE.ACQUIRE it first) would lead nowhere: the refusal says what is wrong.
        c = self.c
        for key, what in ((b"wallet:" + b"x" * 600, b"(607 bytes;"),
                          (b"wallet:a\x00b", b"(10 bytes, with a NUL byte;")):
            r = c.call("SET", key, "v")
            self.assertIsInstance(r, Err, r)
            self.assertTrue(r.startswith("ERR key wallet:"), r)
            self.assertIn("maps to a lock name no lock can have " + what.decode(), r)
            self.assertEqual(self.direct.exists(key), 0)

    def test_protected_key_without_lock_is_nolock_and_never_sent(self):
        c = self.c
        nolock0 = metric(self.fg, "fencegate_nolock_refused_total")
        self.assertEqual(c.call("SET", "plain:ok", "1"), "OK")  # unprotected: a plain write
        mon, stop = self.monitor()
        r = c.call("SET", "wallet:7", "x")
        self.assert_refused(r, "NOLOCK")
        self.assertIn("wallet:7", r)
        r = c.call("MSET", "plain:m", "1", "wallet:8", "2")
        self.assert_refused(r, "NOLOCK")
        self.assertIn("wallet:8", r)
        self.assertIsNone(c.call("GET", "wallet:7"), "a read needs no lock")
        seen = stop()
        leaked = [s for s in seen if ("wallet:7" in s and '"GET"' not in s.upper())
                  or "wallet:8" in s or "plain:m" in s]
        self.assertFalse(leaked, "a refused write reached Redis: %r" % leaked)
        self.assertEqual(self.direct.exists("wallet:7", "wallet:8", "plain:m"), 0)
        self.assertEqual(metric(self.fg, "fencegate_nolock_refused_total"), nolock0 + 2)
        # Holding another wallet's lock does not help.
        self.acquire(c, "wallet:9")
        self.assert_refused(c.call("SET", "wallet:7", "x"), "NOLOCK")
        self.assertEqual(self.direct.exists("wallet:7"), 0)

    def test_hash_tag_keys_fenced_only_when_the_lock_is_held(self):
        c = self.c
        self.assertEqual(c.call("SET", "{job}x", "1"), "OK")
        self.assertEqual(self.direct.exists(hwm_key("job")), 0, "an unheld tag was fenced")
        fenced0 = metric(self.fg, "fencegate_fenced_writes_total")
        t = self.acquire(c, "job")
        self.assertEqual(c.call("SET", "{job}x", "2"), "OK")
        self.assertEqual(self.hwm("job"), t)
        self.assertEqual(metric(self.fg, "fencegate_fenced_writes_total"), fenced0 + 1)
        # Proof that the write is checked against the mark: a newer token's mark refuses it.
        self.direct.set(hwm_key("job"), t + 100)
        r = c.call("SET", "{job}x", "3")
        self.assert_refused(r, "STALE")
        self.assertEqual(self.direct.get("{job}x"), b"2")
        # Another connection without the lock still writes tagged keys freely.
        other = self.raw(self.fg.resp_port)
        self.assertEqual(other.call("SET", "{job}y", "free"), "OK")

    def test_client_reply_off_and_skip_do_not_bypass_fencing(self):
        # A client that silences its replies still gets its writes fenced: fencegate keeps the
        # reply mode itself, so Redis always answers and fencing sees every outcome.
        c = self.c
        self.direct.set("wallet:1", "orig")
        c.send(encode("CLIENT", "REPLY", "OFF") + encode("SET", "wallet:1", "stolen")
               + encode("CLIENT", "REPLY", "ON") + encode("GET", "wallet:1"))
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"orig", "NOLOCK under REPLY OFF, not sent")
        c.send(encode("CLIENT", "REPLY", "SKIP") + encode("SET", "wallet:1", "stolen")
               + encode("GET", "wallet:1"))
        self.assertEqual(c.read_reply(), b"orig", "NOLOCK under REPLY SKIP, not sent")
        # Under the lock: applied, also right after a SCRIPT FLUSH (NOSCRIPT handled unseen)...
        t = self.acquire(c, "wallet:1")
        self.direct.script_flush()
        c.send(encode("CLIENT", "REPLY", "OFF") + encode("SET", "wallet:1", "mine")
               + encode("CLIENT", "REPLY", "ON") + encode("GET", "wallet:1"))
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"mine")
        self.assertEqual(self.hwm("wallet:1"), t)
        # ... and refused at the store once a newer token's mark is there.
        self.direct.set(hwm_key("wallet:1"), t + 5)
        c.send(encode("CLIENT", "REPLY", "OFF") + encode("SET", "wallet:1", "late")
               + encode("CLIENT", "REPLY", "ON") + encode("GET", "wallet:1"))
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"mine", "STALE under REPLY OFF, not applied")
        # Replies of silenced commands never reach the client; later ones come in order.
        c.send(encode("CLIENT", "REPLY", "SKIP") + encode("ECHO", "a") + encode("ECHO", "b"))
        self.assertEqual(c.read_reply(), b"b")
        self.assertEqual(c.read_available(wait=0.2), b"")

    def test_a_held_back_block_under_client_reply_off_is_silent_too(self):
        # A MULTI held back for fencing, on a connection that WATCHes keys, goes out once its
        # check is answered; its EXEC was then answered under CLIENT REPLY OFF (found by
        # tests/compat/resp_diff.py --fenced).
        c = self.c
        self.acquire(c, "wallet:1")
        c.send(encode("WATCH", "wallet:1") + encode("CLIENT", "REPLY", "OFF") + encode("MULTI")
               + encode("INCR", "wallet:1") + encode("EXEC") + encode("CLIENT", "REPLY", "ON")
               + encode("GET", "wallet:1"))
        self.assertEqual(c.read_reply(), "OK")  # WATCH
        self.assertEqual(c.read_reply(), "OK")  # CLIENT REPLY ON
        self.assertEqual(c.read_reply(), b"1")
        self.assertEqual(c.read_available(wait=0.2), b"")

    def test_a_select_redis_refuses_leaves_fenced_writes_in_the_database_they_were_in(self):
        # SELECT 99 is refused (out of range) and the connection stays where it was; fencegate
        # took the 99 for the database and every fenced write after it failed inside its script
        # ("DB index is out of range") until the next SELECT.
        c = self.c
        self.acquire(c, "wallet:1")
        c.send(encode("SELECT", "99") + encode("SET", "wallet:1", "a") + encode("SELECT", "x")
               + encode("APPEND", "wallet:1", "b"))
        self.assertTrue(c.read_reply().startswith("ERR DB index is out of range"))
        self.assertEqual(c.read_reply(), "OK")
        self.assertIsInstance(c.read_reply(), Err)
        self.assertEqual(c.read_reply(), 2)
        self.assertEqual(self.direct.get("wallet:1"), b"ab")
        c.send(encode("SELECT", "1") + encode("SET", "wallet:1", "b"))
        self.assertEqual((c.read_reply(), c.read_reply()), ("OK", "OK"))
        self.assertEqual(self.direct.get("wallet:1"), b"ab")

    def test_a_fenced_write_with_nothing_to_pop_answers_a_null_array(self):
        # LPOP/RPOP with a count, LMPOP, ZMPOP and XREADGROUP answer "nothing" with a null
        # array; their fenced form (a script) made it a null bulk string.
        c = self.c
        self.acquire(c, "wallet:1")
        self.direct.xgroup_create("{wallet:1}s", "g", id="0", mkstream=True)
        for cmd in (("RPOP", "wallet:1", "2"), ("LPOP", "wallet:1", "2"),
                    ("LMPOP", "1", "wallet:1", "LEFT"), ("ZMPOP", "1", "{wallet:1}z", "MIN"),
                    ("XREADGROUP", "GROUP", "g", "c", "STREAMS", "{wallet:1}s", ">")):
            for via in (self.redis.port, self.fg.resp_port):
                conn = c if via == self.fg.resp_port else self.raw(via)
                conn.send(encode(*cmd))
                self.assertEqual(conn.read_available(wait=0.2), b"*-1\r\n", (cmd, via))
        self.assertEqual(c.call("RPOP", "wallet:1"), None)  # a null bulk string stays one

    def test_scripts_are_fenced_by_the_keys_they_declare(self):
        # EVAL, EVALSHA and FCALL are not flagged "write" by COMMAND, yet a script may write the
        # keys it declares. Without the lock: NOLOCK, not sent. With it: sent as a block of its
        # own behind a WATCH and a check of the marks, answered with the script's own reply.
        c = self.c
        self.direct.set("wallet:1", "100")
        decr = "return redis.call('DECRBY', KEYS[1], ARGV[1])"
        sha = self.direct.script_load(decr)
        mon, stop = self.monitor()
        for call in (("EVAL", decr, 1, "wallet:1", 66),
                     ("EVALSHA", sha, 1, "wallet:1", 66),
                     ("FCALL", "nosuchfn", 1, "wallet:1", 66)):
            self.assert_refused(c.call(*call), "NOLOCK")
        seen = stop()
        self.assertFalse([s for s in seen if "66" in s], "a refused script was sent: %r" % seen)
        self.assertEqual(self.direct.get("wallet:1"), b"100")
        t = self.acquire(c, "wallet:1")
        self.assertEqual(c.call("EVAL", decr, 1, "wallet:1", 30), 70)
        self.assertEqual(c.call("EVALSHA", sha, 1, "wallet:1", 5), 65)
        self.assertEqual(c.call("EVAL", "return {1, {'a', 2}}", 1, "wallet:1"), [1, [b"a", 2]])
        self.assertEqual(c.call("EVAL", "return redis.error_reply('MY err')", 1, "wallet:1"),
                         Err("MY err"))
        self.assert_refused(c.call("EVALSHA", "0" * 40, 1, "wallet:1"), "NOSCRIPT")
        # Pipelined behind other commands, in order.
        c.send(encode("EVALSHA", sha, 1, "wallet:1", 1) + encode("GET", "wallet:1")
               + encode("EVALSHA", sha, 1, "wallet:1", 1) + encode("PING"))
        self.assertEqual([c.read_reply() for _ in range(4)], [64, b"64", 63, "PONG"])
        # Inside MULTI it is checked with the block.
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("EVALSHA", sha, 1, "wallet:1", 3), "QUEUED")
        self.assertEqual(c.call("GET", "wallet:1"), "QUEUED")
        self.assertEqual(c.call("EXEC"), [60, b"60"])
        # A newer holder's mark: STALE, and the script never ran.
        self.direct.set(hwm_key("wallet:1"), t + 1)
        r = c.call("EVAL", decr, 1, "wallet:1", 50)
        self.assert_refused(r, "STALE")
        self.assertIn("token %d < high-water mark %d" % (t, t + 1), r)
        self.assertEqual(self.hwm("wallet:1"), t + 1)
        t = self.acquire(c, "wallet:1")  # the refusal gave the lock up
        self.direct.set(hwm_key("wallet:1"), t + 1)
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("EVALSHA", sha, 1, "wallet:1", 50), "QUEUED")
        self.assert_refused(c.call("EXEC"), "STALE")
        self.assertEqual(self.direct.get("wallet:1"), b"60")
        # While the connection WATCHes keys of its own, a script alone would consume the WATCH.
        t = self.acquire(c, "wallet:1")
        self.assertEqual(c.call("WATCH", "plain:w"), "OK")
        r = c.call("EVAL", decr, 1, "wallet:1", 1)
        self.assert_refused(r, "ERR")
        self.assertIn("WATCHes keys", r)
        self.assertEqual(c.call("UNWATCH"), "OK")
        self.assertEqual(c.call("EVAL", decr, 1, "wallet:1", 10), 50)
        # Read-only forms, and scripts on keys no rule claims from a connection without locks,
        # pass as before.
        self.assertEqual(c.call("EVAL_RO", "return redis.call('GET', KEYS[1])", 1, "wallet:1"),
                         b"50")
        other = self.raw(self.fg.resp_port)
        self.assertEqual(other.call("EVAL", "return redis.call('SET', KEYS[1], 'v')", 1,
                                    "plain:s"), "OK")
        self.assertEqual(other.call("EVAL", "return 7", 0), 7)

    def test_a_fenced_script_is_judged_by_the_marks_in_the_stores_database(self):
        # A script may not declare the mark: fencegate checks it before the script runs, in the
        # marks' database even when the connection SELECTed another, and a mark lost there (in
        # a failover, say) refuses the script and gives the lock up.
        c = self.c
        incr = "return redis.call('INCR', KEYS[1])"
        for db in (0, 3):
            t = self.acquire(c, "wallet:8")
            self.assertEqual(c.call("SELECT", db), "OK")
            self.assertEqual(c.call("EVAL", incr, 1, "wallet:8"), 1)
            self.direct.set(hwm_key("wallet:8"), t - 1)
            r = c.call("EVAL", incr, 1, "wallet:8")
            self.assert_refused(r, "LOCKLOST")
            self.assertIn("(token %d) is above its high-water mark %d" % (t, t - 1), r)
            self.assertIsNone(c.call("FENCE.TOKEN", "wallet:8"), "database %d" % db)
        self.assertEqual(self.redis.client(db=3).get("wallet:8"), b"1")
        self.assertEqual(self.direct.get("wallet:8"), b"1")
        self.assertFalse(self.redis.client(db=3).exists(hwm_key("wallet:8")))

    def test_one_lock_rule_covers_scripts_and_keyless_writes(self):
        # A connection holding one lock writes under it: scripts and keyless writes (FLUSHDB,
        # SWAPDB) are fenced, and after the lease ran out all of them are LOCKLOST, not sent.
        c = self.c
        t = self.acquire(c, "solo", "TTL", 500, "NORENEW")
        self.assertEqual(c.call("EVAL", "return redis.call('SET', 'plain:e', 'x')", 0), "OK")
        self.assertEqual(c.call("SET", "plain:a", "1"), "OK")
        self.assertEqual(c.call("SWAPDB", 0, 1), "OK")
        self.assertEqual(self.direct.exists("plain:a"), 0, "SWAPDB was not applied")
        # The swap took the lock's own key along (the locks live in this Redis): until it is
        # back, the store does not say this session holds the lock.
        self.assert_refused(c.call("SWAPDB", 0, 1), "LOCKLOST")
        self.direct.swapdb(0, 1)
        self.assertEqual(self.hwm("solo"), t)
        self.direct.set(hwm_key("solo"), t + 1)
        self.assert_refused(c.call("FLUSHDB"), "STALE")
        t = self.acquire(c, "solo", "TTL", 500, "NORENEW")  # the refusal gave the lock up
        self.direct.set(hwm_key("solo"), t + 1)
        self.assert_refused(c.call("EVAL", "return redis.call('DEL', 'plain:a')", 0), "STALE")
        self.assertEqual(self.direct.get("plain:a"), b"1", "a stale write was applied")
        self.acquire(c, "solo", "TTL", 500, "NORENEW")
        time.sleep(0.7)
        for call in (("FLUSHDB",), ("FLUSHALL",), ("SWAPDB", 0, 1), ("EVAL", "return 1", 0)):
            self.assert_refused(c.call(*call), "LOCKLOST")
        self.assertEqual(self.direct.get("plain:a"), b"1")

    def test_every_key_of_a_large_write_is_judged(self):
        # Redis's suite sends MSET with 10000 keys: beside protect rules it must pass, and a
        # protected key at its very end must still be found.
        c = self.c
        args = []
        for i in range(10000):
            args += ["plain:%d" % i, "v"]
        self.assertEqual(c.call("MSET", *args), "OK")
        self.assertEqual(self.direct.dbsize(), 10000)
        self.assert_refused(c.call("MSET", *(args + ["wallet:9999", "x"])), "NOLOCK")
        self.assertEqual(self.direct.exists("wallet:9999"), 0)

    def test_writes_with_movable_keys_are_judged_by_their_keys(self):
        # Stream consumers and the *MPOP family keep working beside protect rules: their keys
        # are found as Redis finds them, not refused wholesale.
        c = self.c
        self.direct.xadd("jobs", {"n": "1"})
        self.direct.xgroup_create("jobs", "g", id="0")
        self.direct.rpush("plain:l", "a")
        self.direct.zadd("plain:z", {"m": 1})
        r = c.call("XREADGROUP", "GROUP", "g", "w1", "COUNT", "1", "STREAMS", "jobs", ">")
        self.assertEqual(r[0][0], b"jobs")
        self.assertEqual(c.call("BLMPOP", "0.1", 2, "plain:x", "plain:l", "LEFT"),
                         [b"plain:l", [b"a"]])
        self.assertEqual(c.call("BZMPOP", "0.1", 1, "plain:z", "MIN"),
                         [b"plain:z", [[b"m", b"1"]]])
        self.direct.rpush("wallet:4", "coin")
        self.assert_refused(c.call("BLMPOP", "0.1", 2, "plain:l", "wallet:4", "LEFT"), "NOLOCK")
        self.assert_refused(c.call("XREADGROUP", "GROUP", "g", "w1", "STREAMS", "plain:s",
                                   "wallet:4", ">", ">"), "NOLOCK")
        self.assert_refused(c.call("MIGRATE", "127.0.0.1", 1, "", 0, 10, "AUTH", "keys",
                                   "KEYS", "plain:l", "wallet:4"), "NOLOCK")
        self.assertEqual(self.direct.lrange("wallet:4", 0, -1), [b"coin"])
        # Malformed ones never run in Redis: they get Redis's own errors, as without rules.
        plain = self.raw(self.redis.port)
        for call in (("LMPOP",), ("LMPOP", "a", "l", "LEFT"), ("ZMPOP", -1, "z", "MIN"),
                     ("EVAL", "return 1", "x"), ("EVAL", "return 1", 5, "a"),
                     ("XREADGROUP", "GROUP", "g", "w", "STREAMS", "jobs"),
                     ("XREADGROUP", "GROUP", "g", "w", "COUNT", 1, "jobs", ">")):
            self.assertEqual(c.call(*call), plain.call(*call), call)
        # Under the one-lock rule XREADGROUP without BLOCK goes as a fenced script; with BLOCK
        # it could wait, which a script cannot, so it is refused.
        self.direct.xadd("jobs", {"n": "2"})
        t = self.acquire(c, "worker")
        r = c.call("XREADGROUP", "GROUP", "g", "w1", "STREAMS", "jobs", ">")
        self.assertEqual(r[0][1][0][1], [b"n", b"2"])
        self.assertEqual(self.hwm("worker"), t)
        self.assert_refused(c.call("XREADGROUP", "GROUP", "g", "w1", "BLOCK", 10, "STREAMS",
                                   "jobs", ">"), "ERR")

    def test_fenced_writes_in_another_database_check_the_stores_marks(self):
        # The marks live in the store's database, where fence on acquire raises them. A write
        # from a connection that SELECTed another database is judged against those marks and
        # applied in its own database, alone and inside MULTI.
        c = self.c
        db1 = self.redis.client(db=1)
        self.addCleanup(db1.close)
        t = self.acquire(c, "wallet:1")
        self.assertEqual(c.call("SELECT", 1), "OK")
        db1.set(hwm_key("wallet:1"), t + 5)  # a mark in db 1 is nobody's: ignored
        self.assertEqual(c.call("SET", "wallet:1", "mine"), "OK")
        self.assertEqual(db1.get("wallet:1"), b"mine")
        self.assertIsNone(self.direct.get("wallet:1"), "written in the store's database")
        self.assertEqual(self.hwm("wallet:1"), t)
        self.direct.set(hwm_key("wallet:1"), t + 1)  # a newer holder fenced the store
        self.assert_refused(c.call("SET", "wallet:1", "stale"), "STALE")
        t = self.acquire(c, "wallet:1")  # the refusal gave the lock up
        self.direct.set(hwm_key("wallet:1"), t + 1)
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "wallet:1", "stale"), "QUEUED")
        self.assert_refused(c.call("EXEC"), "STALE")
        self.assertEqual(db1.get("wallet:1"), b"mine")
        self.acquire(c, "wallet:1")
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("APPEND", "wallet:1", "+tx"), "QUEUED")
        self.assertEqual(c.call("INCR", "plain:n"), "QUEUED")
        self.assertEqual(c.call("EXEC"), [7, 1])
        self.assertEqual(db1.get("wallet:1"), b"mine+tx")
        self.assertEqual(db1.get("plain:n"), b"1", "the block ran in the connection's database")
        self.assertEqual(c.call("DBSIZE"), db1.dbsize(), "still in db 1 after the block")
        self.assertEqual(c.call("EVAL", "return redis.call('APPEND', KEYS[1], '+s')", 1,
                                "wallet:1"), 9)  # a script alone: checked in db 0, run in db 1
        self.assertEqual(c.call("DBSIZE"), db1.dbsize(), "still in db 1 after the script")
        # A SELECT Redis refuses leaves the database as it was, also one fencegate reads as a
        # number (16: out of range), whose refusal puts its idea of the database back.
        for arg in ("01", "x", "-1", "16"):
            self.assert_refused(c.call("SELECT", arg), "ERR")
            r = c.call("APPEND", "wallet:1", "!")
            self.assertIsInstance(r, int, "after SELECT %s: %r" % (arg, r))
        self.assertEqual(db1.get("wallet:1"), b"mine+tx+s!!!!")
        # After a SELECT inside MULTI the database is not known: refused until SELECT again.
        self.assertEqual(c.call("SELECT", 1), "OK")
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SELECT", 2), "QUEUED")
        self.assertEqual(c.call("EXEC"), ["OK"])
        r = c.call("SET", "wallet:1", "where?")
        self.assert_refused(r, "ERR")
        self.assertIn("SELECT the database again", r)
        self.assertEqual(c.call("SELECT", 0), "OK")
        self.assertEqual(c.call("SET", "wallet:1", "home"), "OK")
        self.assertEqual(self.direct.get("wallet:1"), b"home")
        self.assertEqual(c.call("SELECT", 1), "OK")
        self.assertEqual(c.call("RESET"), "RESET")  # back in db 0, locks kept
        self.assertEqual(c.call("SET", "wallet:1", "reset"), "OK")
        self.assertEqual(self.direct.get("wallet:1"), b"reset")

    def test_one_lock_rule_fences_unprotected_keys_only_with_exactly_one_lock(self):
        c = self.c
        t = self.acquire(c, "solo")
        self.assertEqual(c.call("SET", "plain:k", "v1"), "OK")
        self.assertEqual(self.hwm("solo"), t)
        self.direct.set(hwm_key("solo"), t + 100)
        self.assert_refused(c.call("SET", "plain:k", "v2"), "STALE")
        self.assertEqual(self.direct.get("plain:k"), b"v1")
        self.acquire(c, "second")
        self.assertEqual(c.call("SET", "plain:k", "v3"), "OK",
                         "with two locks an unclaimed key is not fenced")
        self.assertEqual(self.direct.get("plain:k"), b"v3")
        self.assertEqual(self.hwm("solo"), t + 100)


class Transactions(FencingCase):

    def test_held_back_multi_answers_as_redis_does(self):
        # With protect rules MULTI is held back in the sidecar. Inside MULTI Redis runs WATCH,
        # RESET and QUIT at once: WATCH is refused without spoiling the block, RESET and QUIT
        # end it unsent. The byte streams must match Redis's own.
        fg = self.fencegate()
        script = (encode("MULTI") + encode("SET", "plain:a", "1") + encode("WATCH", "x")
                  + encode("EXEC") + encode("MULTI") + encode("SET", "plain:b", "1")
                  + encode("RESET") + encode("GET", "plain:b") + encode("MULTI")
                  + encode("SET", "plain:c", "1") + encode("QUIT"))
        # SAVE is refused inside MULTI ("no_multi") and aborts the block.
        no_multi = (encode("MULTI") + encode("SET", "plain:d", "1") + encode("SAVE")
                    + encode("EXEC") + encode("EXISTS", "plain:d"))
        got = {}
        for port in (fg.resp_port, self.redis.port):
            for s in (script, no_multi):
                conn = self.raw(port)
                conn.send(s)
                got[port, s] = conn.read_available(wait=0.5)
                self.direct.flushall()
        for s in (script, no_multi):
            self.assertEqual(got[fg.resp_port, s], got[self.redis.port, s])
        self.assertIn(b"RESET", got[fg.resp_port, script])
        self.assertIn(b"not allowed inside a transaction", got[fg.resp_port, no_multi])
        # The block goes to Redis with MULTI and EXEC as the client spelled them.
        mon, stop = self.monitor()
        conn = self.raw(fg.resp_port)
        conn.send(encode("multi") + encode("SET", "plain:e", "1") + encode("eXeC"))
        self.assertEqual(conn.read_reply(), "OK")
        self.assertEqual(conn.read_reply(), "QUEUED")
        self.assertEqual(conn.read_reply(), ["OK"])
        seen = [s for s in stop() if "PING" not in s.upper() and "INFO" not in s.upper()]
        self.assertEqual([s.split("] ", 1)[1] for s in seen[:3]],
                         ['"multi"', '"SET" "plain:e" "1"', '"eXeC"'])

    def test_held_back_multi_refused_by_server_state_says_why(self):
        # A block held back until EXEC reaches Redis whole, so Redis refuses its commands at
        # queue time; EXEC names the reason as Redis's own EXEC does for a state change.
        fg = self.fencegate()
        self.direct.set("plain:xx", 1)
        got = {}
        for port in (fg.resp_port, self.redis.port):
            conn = self.raw(port)
            self.assertEqual(conn.call("MULTI"), "OK")
            self.assertEqual(conn.call("INCR", "plain:xx"), "QUEUED")
            self.direct.config_set("min-replicas-to-write", 2)
            got[port] = conn.call("EXEC")
            self.direct.config_set("min-replicas-to-write", 0)
            self.assertEqual(conn.call("PING"), "PONG")
        self.assertEqual(got[fg.resp_port], got[self.redis.port])
        self.assertIn("NOREPLICAS", got[fg.resp_port])
        self.assertEqual(self.direct.get("plain:xx"), b"1")

    def test_multi_exec_with_current_token_gives_normal_reply(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:3")
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "wallet:3", "a"), "QUEUED")
        self.assertEqual(c.call("INCR", "plain:n"), "QUEUED")
        self.assertEqual(c.call("APPEND", "wallet:3", "b"), "QUEUED")
        self.assertEqual(c.call("GET", "wallet:3"), "QUEUED")
        self.assertEqual(c.call("EXEC"), ["OK", 1, 2, b"ab"])
        self.assertEqual(self.hwm("wallet:3"), t)
        self.assertEqual(c.call("PING"), "PONG")

    def _stale_multi(self, extra_lock):
        a = self.fencegate()
        b = self.fencegate()
        ca = self.raw(a.resp_port)
        cb = self.raw(b.resp_port)
        self.direct.set("wallet:4", "orig")
        ta = self.acquire(ca, "wallet:4")
        if extra_lock:
            # Two locks held: the one-lock rule is off, so INCR/RPUSH of plain keys are plain,
            # unfenced writes inside the same transaction.
            self.acquire(ca, "unrelated")
        self.assertEqual(ca.call("MULTI"), "OK")
        self.assertEqual(ca.call("INCR", "plain:count"), "QUEUED")
        self.assertEqual(ca.call("SET", "wallet:4", "from-A"), "QUEUED")
        self.assertEqual(ca.call("RPUSH", "plain:log", "A"), "QUEUED")
        # The lock is taken over before EXEC.
        harness.redis_cli(self.redis.port, "DEL", lock_key("wallet:4"))
        tb = self.acquire(cb, "wallet:4", "WAIT", 0)
        self.assertGreater(tb, ta)
        reply = ca.call("EXEC")

        wallet = self.direct.get("wallet:4")
        count = self.direct.get("plain:count")
        log = self.direct.lrange("plain:log", 0, -1)
        applied = (wallet == b"from-A", count == b"1", log == [b"A"])
        self.assertIn(applied, [(True, True, True), (False, False, False)],
                      "MULTI/EXEC applied partially: wallet=%r count=%r log=%r, EXEC -> %r"
                      % (wallet, count, log, reply))
        self.assertEqual(applied, (False, False, False),
                         "a stale transaction applied: EXEC -> %r" % (reply,))
        self.assert_refused(reply, "STALE")
        self.assertIn("token %d < high-water mark %d" % (ta, tb), reply)
        self.assertTrue(reply.endswith("the transaction was not applied"), reply)
        self.assertEqual(self.hwm("wallet:4"), tb)
        self.assertEqual(ca.call("PING"), "PONG", "the connection must stay usable")

    def test_multi_stale_all_or_nothing_with_unfenced_writes_in_the_block(self):
        self._stale_multi(extra_lock=True)

    def test_multi_stale_all_or_nothing_one_lock(self):
        self._stale_multi(extra_lock=False)

    def test_exec_after_the_lease_ran_out_is_locklost_and_applies_nothing(self):
        # Found by the safety suite: EXEC checked the store's mark but not the sidecar's own
        # lease, so a block queued under a lease that then ran out was applied.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:5", "TTL", "500", "NORENEW")
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "wallet:5", "x"), "QUEUED")
        self.assertEqual(c.call("RPUSH", "plain:log", "x"), "QUEUED")
        time.sleep(0.7)
        self.assert_refused(c.call("EXEC"), "LOCKLOST")
        self.assertIsNone(self.direct.get("wallet:5"))
        self.assertEqual(self.direct.llen("plain:log"), 0)
        self.assertEqual(c.call("PING"), "PONG")  # the connection carries on

    def test_replies_after_a_hidden_reply_are_not_stuck(self):
        # Found by the safety suite: after a reply fencegate swallows (UNWATCH, WATCH), replies
        # it wrote itself and queued behind it were never sent, and the connection hung.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:6")
        self.assertEqual(c.call("WATCH", "wallet:6"), "OK")
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "wallet:6", "2"), "QUEUED")
        self.assertEqual(c.call("DISCARD", timeout=5), "OK")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:6", timeout=5), 1)
        self.assertEqual(c.call("PING", timeout=5), "PONG")


class Pipelines(FencingCase):
    """Fenced writes pipelined back to back reach Redis as one script call on the shared
    connection (README, "Fenced writes"); each must still be judged and answered on its own."""

    COMMANDS = [
        lambda k, i: ("SET", k + "s", "v%d" % i),
        lambda k, i: ("INCR", k + "n"),
        lambda k, i: ("LPUSH", k + "s", "x"),          # WRONGTYPE once {..}s is a string
        lambda k, i: ("RPUSH", k + "l", "e%d" % i),
        lambda k, i: ("HSET", k + "h", "f%d" % (i % 3), i),
        lambda k, i: ("SET", k + "nx", i, "NX", "GET"),  # nil, then the first value
        lambda k, i: ("GETDEL", k + "nx"),
        lambda k, i: ("SADD", k + "set", i % 4),
        lambda k, i: ("APPEND", k + "s", "+"),
        lambda k, i: ("EXPIRE", k + "l", 100),
        lambda k, i: ("INCRBY", k + "s", 1),           # not an integer, after SET
        lambda k, i: ("DEL", k + "missing"),
    ]

    def program(self, rng, n):
        return [(rng.randrange(len(self.COMMANDS)), i) for i in range(n)]

    def run_program(self, conn, tag, prog, pipelined):
        cmds = [self.COMMANDS[c]("{%s}" % tag, i) for c, i in prog]
        if not pipelined:
            return [conn.call(*cmd) for cmd in cmds]
        conn.send(b"".join(encode(*cmd) for cmd in cmds))
        return [conn.read_reply() for _ in cmds]

    def script_calls(self):
        stats = self.direct.info("commandstats")
        return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))

    def test_pipelined_fenced_writes_answer_as_one_at_a_time(self):
        fg = self.fencegate()
        rng = random.Random(20261126)
        progs = [self.program(rng, rng.randrange(1, 40)) for _ in range(24)]
        conns = [self.raw(fg.resp_port) for _ in progs]
        tokens = [self.acquire(c, "p%d" % i) for i, c in enumerate(conns)]
        calls = self.script_calls()
        # Every client pipelines its program before any reads: their writes meet on the way.
        for i, (c, prog) in enumerate(zip(conns, progs)):
            c.send(b"".join(encode(*self.COMMANDS[k]("{p%d}" % i, j)) for k, j in prog))
        piped = [[c.read_reply() for _ in prog] for c, prog in zip(conns, progs)]
        calls = self.script_calls() - calls
        # The same programs, one write at a time (no two ever meet), under locks of their own.
        one = self.raw(fg.resp_port)
        for i in range(len(progs)):
            self.acquire(one, "q%d" % i, "WAIT", 0)
        for i, prog in enumerate(progs):
            self.assertEqual(piped[i], self.run_program(one, "q%d" % i, prog, False),
                             "client %d" % i)
            for suffix in ("s", "n", "l", "h", "nx", "set"):
                a, b = "{p%d}%s" % (i, suffix), "{q%d}%s" % (i, suffix)
                self.assertEqual(self.direct.type(a), self.direct.type(b), a)
                if self.direct.type(a) == b"string":
                    self.assertEqual(self.direct.get(a), self.direct.get(b), a)
            self.assertEqual(self.hwm("p%d" % i), tokens[i])
        writes = sum(len(p) for p in progs)
        self.assertLess(calls, writes / 2, "pipelined fenced writes were not grouped")

    def test_a_write_the_script_cannot_run_fails_alone(self):
        # 8500 arguments are more than Lua's unpack() takes. Between writes under another lock
        # the big one goes in a script call, where it fails; the writes around it (which may
        # share its call) are applied and answered.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "a")
        self.acquire(c, "b", "WAIT", 0)
        c.send(encode("SET", "{a}1", "before") + encode("RPUSH", "{b}big", *["x"] * 8500) +
               encode("SET", "{a}2", "after"))
        self.assertEqual(c.read_reply(), "OK")
        got = c.read_reply()
        self.assertIsInstance(got, Err)
        self.assertIn("unpack", got)
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(self.direct.mget("{a}1", "{a}2"), [b"before", b"after"])
        self.assertEqual(self.direct.exists("{b}big"), 0)
        # Pipelined among writes under its own lock it goes in a transaction, natively: applied.
        c.send(encode("SET", "{b}1", "before") + encode("RPUSH", "{b}big", *["x"] * 8500) +
               encode("SET", "{b}2", "after"))
        self.assertEqual([c.read_reply() for _ in range(3)], ["OK", 8500, "OK"])
        self.assertEqual(self.direct.llen("{b}big"), 8500)

    def test_maxmemory_refuses_every_pipelined_write_as_redis_would(self):
        # Redis checks maxmemory only before a script's first write: with a limit that can refuse
        # writes, pipelined fenced writes must still be checked one by one.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:3")
        self.direct.config_set("maxmemory-policy", "noeviction")
        self.direct.config_set("maxmemory", 100000)  # far below what an empty Redis uses
        self.addCleanup(self.direct.config_set, "maxmemory", 0)
        self.assertRaises(harness.redis.exceptions.ResponseError, self.direct.set, "x", 1)
        time.sleep(1.5)  # fencegate's probe reads INFO memory once a second
        c.send(encode("DEL", "wallet:3") +
               b"".join(encode("SET", "wallet:3", i) for i in range(10)))
        self.assertEqual(c.read_reply(), 0)  # DEL frees memory: allowed
        for i in range(10):
            self.assert_refused(c.read_reply(), "OOM")
        self.assertEqual(self.direct.exists("wallet:3"), 0)

    def test_a_store_that_may_evict_marks_is_named_once_in_the_log(self):
        # An allkeys-* policy may evict a fence mark, which costs its holder the lock (the write
        # finds the mark below its token): said once, from the probe's INFO memory.
        self.direct.config_set("maxmemory", 1 << 30)
        self.direct.config_set("maxmemory-policy", "allkeys-lru")
        self.addCleanup(self.direct.config_set, "maxmemory-policy", "noeviction")
        self.addCleanup(self.direct.config_set, "maxmemory", 0)
        fg = self.fencegate()
        warning = "maxmemory-policy allkeys-lru may evict fence marks"

        def said():
            return fg.log().count(warning)
        harness.wait_until(lambda: said() == 1, 5, 0.1, "the eviction warning")
        time.sleep(2.2)  # two more probes
        self.assertEqual(said(), 1)
        self.direct.config_set("maxmemory-policy", "volatile-lru")
        time.sleep(1.2)
        self.direct.config_set("maxmemory-policy", "allkeys-lfu")
        warning = "maxmemory-policy allkeys-lfu may evict fence marks"
        harness.wait_until(lambda: said() == 1, 5, 0.1, "the warning again, for allkeys-lfu")

    def test_a_stale_write_among_current_ones_refuses_only_itself(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "cur")
        old = self.acquire(c, "old", "WAIT", 0)
        self.direct.set(hwm_key("old"), old + 1)  # a newer holder raised it meanwhile
        stale_before = metric(fg, "fencegate_stale_writes_refused_total")
        c.send(b"".join(encode("RPUSH", "{%s}l" % ("cur" if i % 2 == 0 else "old"), i)
                        for i in range(20)))
        replies = [c.read_reply() for _ in range(20)]
        for i, r in enumerate(replies):
            if i % 2 == 0:
                self.assertEqual(r, i // 2 + 1, "write %d" % i)
            else:
                self.assert_refused(r, "STALE")
        self.assertEqual(self.direct.lrange("{cur}l", 0, -1),
                         [str(i).encode() for i in range(0, 20, 2)])
        self.assertEqual(self.direct.exists("{old}l"), 0)
        self.assertEqual(self.hwm("old"), old + 1)
        self.assertEqual(metric(fg, "fencegate_stale_writes_refused_total") - stale_before, 10)


class PipelinedTransactions(FencingCase):
    """Pipelined fenced writes under the same lock go as one transaction (README, "Pipelined
    fenced writes"): WATCH the mark, a check that touches it when the token is stale, MULTI, the
    writes themselves, EXEC. On the shared upstream connection, and (PINNED) on a
    connection of the client's own."""

    PINNED = False

    def conn(self, fg):
        c = self.raw(fg.resp_port)
        if self.PINNED:  # CLIENT SETNAME is connection state: the client gets its own upstream
            self.assertEqual(c.call("CLIENT", "SETNAME", "pinned"), "OK")
        return c

    def calls(self, *names):
        stats = self.direct.info("commandstats")
        return sum(stats.get("cmdstat_" + n, {}).get("calls", 0) for n in names)

    def pipeline(self, conn, cmds):
        conn.send(b"".join(encode(*cmd) for cmd in cmds))
        return [conn.read_raw_reply() for _ in cmds]

    def test_writes_run_natively_and_answer_byte_for_byte_as_redis(self):
        fg = self.fencegate()
        c = self.conn(fg)
        token = self.acquire(c, "t")
        prog = [("SET", "%ss", "1"), ("INCR", "%ss"), ("LPUSH", "%ss", "x"),
                ("INCRBYFLOAT", "%sf", "1.5"), ("SET", "%sb", "2", "XX", "NX"),
                ("HSET", "%sh", "f", "v"), ("SET", "%snx", "1", "NX", "GET"),
                ("GETDEL", "%snx"), ("BITFIELD", "%sbf", "OVERFLOW", "FAIL", "INCRBY", "u2", "0",
                                     "5", "GET", "u2", "0"),
                ("ZADD", "%sz", "1", "a", "2", "b"), ("ZPOPMIN", "%sz", "5"), ("DEL", "%szz")]
        before = self.calls("exec", "eval", "evalsha")
        txns, writes = (metric(fg, "fencegate_fenced_transactions_total"),
                        metric(fg, "fencegate_fenced_writes_total"))
        via = self.pipeline(c, [tuple(a % "{t}" if "%s" in a else a for a in cmd)
                                for cmd in prog])
        self.assertEqual(self.calls("exec", "eval", "evalsha") - before, 2,
                         "one transaction: EXEC and the check")
        self.assertEqual(metric(fg, "fencegate_fenced_transactions_total"), txns + 1)
        self.assertEqual(metric(fg, "fencegate_fenced_writes_total"), writes + len(prog))
        straight = self.pipeline(self.raw(self.redis.port),
                                 [tuple(a % "{d}" if "%s" in a else a for a in cmd)
                                  for cmd in prog])
        self.assertEqual(via, straight)
        for key in ("s", "f", "h", "bf", "z"):
            self.assertEqual(self.direct.dump("{t}" + key), self.direct.dump("{d}" + key), key)
        self.assertEqual(self.hwm("t"), token)

    def test_turned_off_every_write_is_a_script_call(self):
        fg = self.fencegate("--fenced-transactions", "false")
        c = self.conn(fg)
        self.acquire(c, "o")
        execs, scripts = self.calls("exec"), self.calls("evalsha", "eval")
        self.assertEqual(self.pipeline(c, [("SET", "{o}%d" % i, i) for i in range(6)]),
                         [b"+OK\r\n"] * 6)
        self.assertEqual(self.calls("exec"), execs)
        self.assertGreater(self.calls("evalsha", "eval"), scripts)
        self.assertEqual(metric(fg, "fencegate_fenced_transactions_total"), 0)

    def test_stale_token_refuses_every_write_and_leaves_the_mark_as_it_was(self):
        fg = self.fencegate()
        c = self.conn(fg)
        token = self.acquire(c, "s")
        self.direct.set(hwm_key("s"), token + 1)  # a newer holder's fence on acquire
        stale = metric(fg, "fencegate_stale_writes_refused_total")
        replies = self.pipeline(c, [("RPUSH", "{s}l", i) for i in range(10)])
        want = ("-STALE lock s token %d < high-water mark %d (a newer holder exists; "
                "re-acquire)\r\n" % (token, token + 1)).encode()
        self.assertEqual(replies, [want] * 10)
        self.assertEqual(self.direct.exists("{s}l"), 0)
        self.assertEqual(self.hwm("s"), token + 1)
        self.assertEqual(self.direct.keys("fencegate:hwm:*"), [hwm_key("s").encode()])
        self.assertEqual(metric(fg, "fencegate_stale_writes_refused_total") - stale, 10)

    def test_writes_under_two_locks_are_checked_against_both_marks(self):
        fg = self.fencegate()
        c = self.conn(fg)
        ta, tb = self.acquire(c, "a2"), self.acquire(c, "b2", "WAIT", 0)
        mset = [("MSET", "{a2}k", i, "{b2}k", i) for i in range(3)]
        self.assertEqual(self.pipeline(c, mset), [b"+OK\r\n"] * 3)
        self.assertEqual((self.hwm("a2"), self.hwm("b2")), (ta, tb))
        self.direct.set(hwm_key("b2"), tb + 1)
        for r in self.pipeline(c, [("MSET", "{a2}k", "x", "{b2}k", "x")] * 3):
            self.assertTrue(r.startswith(b"-STALE lock b2 token %d < high-water mark %d"
                                         % (tb, tb + 1)), r)
        self.assertEqual(self.direct.mget("{a2}k", "{b2}k"), [b"2", b"2"])

    def test_a_mark_that_is_not_a_number_refuses_and_is_left_for_repair(self):
        fg = self.fencegate()
        c = self.conn(fg)
        self.acquire(c, "w")
        for bad in (lambda: self.direct.rpush(hwm_key("w"), "x"),
                    lambda: self.direct.set(hwm_key("w"), "seven")):
            self.direct.delete(hwm_key("w"))
            bad()
            dump = self.direct.dump(hwm_key("w"))
            for r in self.pipeline(c, [("SET", "{w}k%d" % i, "v") for i in range(4)]):
                self.assertTrue(r.startswith(b"-ERR fencegate write check: "), r)
                self.assertRegex(r, rb"WRONGTYPE .*\(delete or repair that key\)|is not a number")
            self.assertEqual(self.direct.keys("{w}*"), [])
            self.assertEqual(self.direct.dump(hwm_key("w")), dump)

    def test_a_client_that_ends_its_side_gets_its_fenced_writes_answered(self):
        # `printf ... | nc -N` under a lock: the acquire, a held-back MULTI block (sent after its
        # check) and a run of fenced writes all reach Redis and are answered before the close.
        fg = self.fencegate()
        c = self.conn(fg)
        c.send(b"FENCE.ACQUIRE wallet:hc\r\nMULTI\r\nSET wallet:hc 1\r\nINCR wallet:hc\r\n"
               b"EXEC\r\n" + b"INCR wallet:hc\r\n" * 40)
        c.sock.shutdown(socket.SHUT_WR)
        got = c.read_until_close(timeout=5)
        self.assertRegex(got, rb"^:[0-9]+\r\n\+OK\r\n\+QUEUED\r\n\+QUEUED\r\n"
                              rb"\*2\r\n\+OK\r\n:2\r\n")
        self.assertTrue(got.endswith(b"".join(b":%d\r\n" % i for i in range(3, 43))), got[-80:])
        self.assertEqual(self.direct.get("wallet:hc"), b"42")

    def test_a_lost_mark_refuses_the_run_and_gives_the_lock_up(self):
        fg = self.fencegate()
        c = self.conn(fg)
        token = self.acquire(c, "m")
        self.direct.delete(hwm_key("m"))  # e.g. a failover to a replica that missed it
        for r in self.pipeline(c, [("SET", "{m}%d" % i, i) for i in range(5)]):
            self.assertTrue(r.startswith(b"-LOCKLOST lock m (token %d) is above its high-water "
                                         b"mark 0" % token), r)
        self.assertEqual(self.direct.keys("{m}*"), [])
        self.assertIsNone(c.call("FENCE.TOKEN", "m"))
        again = self.acquire(c, "m")
        self.assertGreater(again, token)
        self.assertEqual(self.hwm("m"), again)
        self.assertEqual(self.pipeline(c, [("SET", "{m}%d" % i, i) for i in range(5)]),
                         [b"+OK\r\n"] * 5)

    def test_a_run_needs_no_script_cache(self):
        # A run's check goes with its body and its writes run natively: a SCRIPT FLUSH from
        # elsewhere between runs changes nothing, and no script is loaded for them.
        fg = self.fencegate()
        c = self.conn(fg)
        self.acquire(c, "f")
        txns = metric(fg, "fencegate_fenced_transactions_total")
        self.assertEqual(self.pipeline(c, [("SET", "{f}a", 1), ("SET", "{f}b", 2)]),
                         [b"+OK\r\n"] * 2)
        self.direct.script_flush()
        loads = self.calls("script|load")
        self.assertEqual(self.pipeline(c, [("INCR", "{f}a"), ("INCR", "{f}b")]),
                         [b":2\r\n", b":3\r\n"])
        self.assertEqual(self.calls("script|load"), loads)
        self.assertEqual(metric(fg, "fencegate_fenced_transactions_total"), txns + 2)

    def test_queue_time_refusals_answer_each_write_as_redis_does(self):
        fg = self.fencegate()
        c = self.conn(fg)
        self.acquire(c, "q")
        self.direct.config_set("min-replicas-to-write", 1)
        self.addCleanup(self.direct.config_set, "min-replicas-to-write", 0)
        cmds = [("SET", "%s1", "a"), ("INCR", "%s2"), ("DEL", "%s3")]
        via = self.pipeline(c, [(cmd[0], cmd[1] % "{q}") + cmd[2:] for cmd in cmds])
        straight = self.pipeline(self.raw(self.redis.port),
                                 [(cmd[0], cmd[1] % "{d}") + cmd[2:] for cmd in cmds])
        self.assertEqual(via, straight)
        self.assertTrue(all(r.startswith(b"-NOREPLICAS") for r in via), via)
        self.assertEqual(self.direct.keys("{q}*"), [])

    def test_a_busy_redis_refuses_the_run_and_leaves_no_transaction_open(self):
        # While a script runs past busy-reply-threshold, Redis answers -BUSY to everything but
        # WATCH and MULTI, EXEC included: the run must not leave the connection inside a MULTI
        # that would swallow the commands after it.
        fg = self.fencegate()
        c = self.conn(fg)
        other = self.raw(fg.resp_port)
        self.acquire(c, "b")
        self.assertEqual(other.call("SET", "plain", "before"), "OK")
        self.direct.config_set("busy-reply-threshold", 100)
        self.addCleanup(self.direct.config_set, "busy-reply-threshold", 5000)
        slow = self.raw(self.redis.port)
        slow.cmd("EVAL", "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] "
                 "while true do local n = redis.call('TIME') "
                 "if n[1] * 1000000 + n[2] - s > 1500000 then break end end return 1", 0)
        time.sleep(0.4)  # past the threshold: Redis answers BUSY now
        replies = self.pipeline(c, [("SET", "{b}%d" % i, i) for i in range(4)])
        for r in replies:
            self.assertTrue(r.startswith(b"-BUSY"), replies)
        self.assertEqual(slow.read_reply(timeout=10), 1)
        self.assertEqual(other.call("SET", "plain", "after"), "OK")
        self.assertEqual(other.call("GET", "plain"), b"after")
        self.assertEqual(self.pipeline(c, [("SET", "{b}%d" % i, i) for i in range(4)]),
                         [b"+OK\r\n"] * 4)
        self.assertEqual(self.direct.get("{b}3"), b"3")

    def test_a_check_that_cannot_touch_the_mark_is_noticed_and_scripts_take_over(self):
        # An upstream user denied RENAME lets a refusing check fail without touching the mark,
        # so that run is applied (README: an ACL is one of the cases the check relies on).
        # fencegate must notice it from the replies, log it, and send fenced writes and scripts
        # as script calls from then on, which refuse.
        self.direct.execute_command("ACL", "SETUSER", "fg", "on", ">pw", "~*", "&*", "+@all",
                                    "-rename")
        fg = self.start_fencegate("redis://fg:pw@127.0.0.1:%d" % self.redis.port)
        c = self.conn(fg)
        token = self.acquire(c, "n")
        self.direct.set(hwm_key("n"), token + 1)
        self.pipeline(c, [("SET", "{n}a", i) for i in range(3)])  # applied: the hazard
        self.assertIn("may have gone without the fence", fg.log())
        for r in self.pipeline(c, [("SET", "{n}b", i) for i in range(3)]):
            self.assertTrue(r.startswith(b"-STALE lock n"), r)
        token = self.acquire(c, "n")  # the refusal gave the lock up
        self.direct.set(hwm_key("n"), token + 1)
        self.assertTrue(c.call("EVAL", "return redis.call('SET', KEYS[1], 1)", 1, "{n}c")
                        .startswith("STALE lock n"))
        self.assertEqual(self.direct.exists("{n}b", "{n}c"), 0)
        # The same for a script sent alone, on a fresh sidecar.
        fg2 = self.start_fencegate("redis://fg:pw@127.0.0.1:%d" % self.redis.port)
        c2 = self.conn(fg2)
        token = self.acquire(c2, "s2")
        self.direct.set(hwm_key("s2"), token + 1)
        c2.call("EVAL", "return redis.call('SET', KEYS[1], 1)", 1, "{s2}a")  # the hazard
        with open(fg2.stderr_path, encoding="utf-8", errors="replace") as f:
            self.assertIn("a fenced script or MULTI block may have run without the fence",
                          f.read())
        self.assertTrue(c2.call("EVAL", "return redis.call('SET', KEYS[1], 1)", 1, "{s2}b")
                        .startswith("STALE lock s2"))
        self.assertEqual(self.direct.exists("{s2}b"), 0)
        # And for a MULTI block. Its fenced writes are fence scripts inside the block, which
        # still refuse one by one; the block's other commands would be applied.
        fg3 = self.start_fencegate("redis://fg:pw@127.0.0.1:%d" % self.redis.port)
        c3 = self.conn(fg3)
        token = self.acquire(c3, "m3")
        self.direct.set(hwm_key("m3"), token + 1)
        block = encode("MULTI") + encode("SET", "{m3}a", 1) + encode("EXEC")
        c3.send(block)
        replies = [c3.read_reply() for _ in range(3)]
        self.assertEqual(replies[:2], ["OK", "QUEUED"])
        self.assertEqual(len(replies[2]), 1)
        self.assert_refused(replies[2][0], "STALE")
        with open(fg3.stderr_path, encoding="utf-8", errors="replace") as f:
            self.assertIn("a fenced script or MULTI block may have run without the fence",
                          f.read())
        c3.send(block.replace(b"{m3}a", b"{m3}b"))
        replies = [c3.read_reply() for _ in range(3)]
        self.assert_refused(replies[2], "STALE")
        self.assertEqual(self.direct.exists("{m3}b"), 0)

    def test_a_newer_holder_cuts_in_and_no_older_write_lands_after_it(self):
        # The newer holder raises the mark and writes in one transaction, at a moment of its own
        # while the old holder pipelines. Every old write is either applied before the newer
        # holder's write, with an OK, or refused with STALE and absent: never after it.
        fg = self.fencegate()
        c = self.conn(fg)
        token = self.acquire(c, "r")
        newer = self.raw(self.redis.port)
        batches, per = 400, 8
        cut_in = threading.Event()

        def cut():
            wait_until = time.monotonic() + 10
            while self.direct.llen("{r}log") < 50 and time.monotonic() < wait_until:
                time.sleep(0.001)
            newer.send(encode("MULTI") + encode("SET", hwm_key("r"), token + 1) +
                       encode("RPUSH", "{r}log", "new") + encode("EXEC"))
            cut_in.set()

        t = threading.Thread(target=cut)
        t.start()
        replies = []
        for b in range(batches):
            replies += self.pipeline(c, [("RPUSH", "{r}log", "old%d" % (b * per + i))
                                         for i in range(per)])
            if cut_in.is_set() and replies[-1].startswith(b"-STALE"):
                break
        t.join()
        log = [v.decode() for v in self.direct.lrange("{r}log", 0, -1)]
        self.assertIn("new", log)
        applied = [i for i, r in enumerate(replies) if r.startswith(b":")]
        refused = [i for i, r in enumerate(replies) if r.startswith(b"-STALE")]
        self.assertEqual(len(applied) + len(refused), len(replies), replies[:3])
        self.assertTrue(applied and refused, "the newer holder never cut in mid-run")
        self.assertEqual(log, ["old%d" % i for i in applied] + ["new"])
        self.assertLess(max(applied), min(refused))


class PinnedPipelinedTransactions(PipelinedTransactions):
    PINNED = True


class ScriptCache(FencingCase):

    def test_fenced_writes_survive_script_flush(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:5")
        self.assertEqual(c.call("SET", "wallet:5", "a"), "OK")
        self.direct.script_flush()
        self.assertEqual(c.call("SET", "wallet:5", "b"), "OK")
        self.assertEqual(self.direct.get("wallet:5"), b"b")
        self.assertEqual(self.hwm("wallet:5"), t)

        # A pipeline of fenced writes right after a flush: all applied, in order.
        q = self.acquire(c, "q", "WAIT", 0)  # now two locks: {q} keys are fenced by tag
        self.direct.script_flush()
        c.send(b"".join(encode("RPUSH", "{q}list", i) for i in range(10)))
        replies = [c.read_reply() for _ in range(10)]
        self.assertEqual(replies, list(range(1, 11)))
        self.assertEqual(self.direct.lrange("{q}list", 0, -1),
                         [str(i).encode() for i in range(10)])
        self.assertEqual(self.hwm("q"), q)
        # And the fence still refuses after a flush (the script is not skipped).
        self.direct.set(hwm_key("q"), q + 1)
        self.direct.script_flush()
        self.assert_refused(c.call("RPUSH", "{q}list", "late"), "STALE")
        self.assertEqual(self.direct.llen("{q}list"), 10)

    def test_noscript_write_not_sent_again_behind_a_resp3_subscribe(self):
        # A RESP3 SUBSCRIBE after a fenced write leaves no reply to wait for: the write answered
        # NOSCRIPT must not be sent again behind it, where it would run after the subscription
        # (the subscriber would see its own write's keyspace event, and its reply would follow
        # the pushes). It is refused, not applied, as when other requests followed it.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.assertEqual(c.call("HELLO", "3")[b"proto"], 3)
        self.acquire(c, "wallet:6")
        self.assertEqual(c.call("SET", "wallet:6", "a"), "OK")
        self.direct.config_set("notify-keyspace-events", "KA")
        self.direct.script_flush()
        c.send(encode("SET", "wallet:6", "b") + encode("SUBSCRIBE", "__keyspace@0__:wallet:6"))
        got = [c.read_reply(), c.read_reply()]
        self.assertIsInstance(got[0], Err, got)
        self.assertTrue(got[0].startswith("UNAVAILABLE the fence script vanished"), got)
        self.assertEqual(got[1][:2], [b"subscribe", b"__keyspace@0__:wallet:6"], got)
        self.assertEqual(c.call("PING"), "PONG")  # no event of a write after the subscription
        self.assertEqual(self.direct.get("wallet:6"), b"a")


class RedisLost(FencingCase):

    def test_redis_killed_while_lock_held_fails_closed_then_recovers(self):
        fg = self.fencegate("--session-ttl-ms", "600")
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:6")
        self.assertEqual(c.call("SET", "wallet:6", "before"), "OK")
        self.redis.kill()

        def refused(conn):
            try:
                r = conn.call("SET", "wallet:6", "during", timeout=5)
            except (EOFError, OSError):
                return None  # the connection closed: nothing applied either
            self.assert_refused(r, "UNAVAILABLE", "LOCKLOST")
            return r
        refused(c)
        fresh = self.raw(fg.resp_port)
        r = fresh.call("FENCE.ACQUIRE", "wallet:other", "WAIT", 0, timeout=5)
        self.assert_refused(r, "UNAVAILABLE")
        time.sleep(1.5)  # well past the 600 ms lease: the lock is gone with the backend
        if not c.eof:
            refused(c)
        self.redis.start()  # same port, empty
        if not c.eof:
            # The old session's lock died with the backend: its writes stay refused, never sent
            # (the new Redis has no mark that could stop them).
            for _ in range(3):
                r = c.call("SET", "wallet:6", "old-holder", timeout=5)
                self.assertIsInstance(r, Err, "old holder's write went through: %r" % (r,))
                time.sleep(0.2)
        self.assertIsNone(self.direct.get("wallet:6"), "a write from the outage applied")

        n = self.raw(fg.resp_port)

        def acquired():
            r = n.call("FENCE.ACQUIRE", "wallet:6", "WAIT", 0)
            return r if isinstance(r, int) else None
        t2 = harness.wait_until(acquired, 10, 0.2, "FENCE.ACQUIRE to work after Redis restart")
        # The lock client reconnects on demand; the proxy's probe may still be in its backoff,
        # and a write it refuses (-UNAVAILABLE) was not sent.
        harness.wait_until(lambda: n.call("SET", "wallet:6", "after") == "OK", 10, 0.05,
                           "the fenced write to go through after Redis restart")
        self.assertEqual(self.direct.get("wallet:6"), b"after")
        self.assertEqual(self.hwm("wallet:6"), t2)
        self.assertGreater(t, 0)


class LostGrant(FencingCase):
    """A failover to a replica that missed a grant: the lock key, the token counter and the mark
    all go back to before it, so the next holder is granted the same token again. Marks cannot
    tell the two holders apart; the store's own lock key can (the locks live in the store's
    Redis, the default), and writes of the holder it no longer names are refused."""

    def rollback_grant(self, name, token):
        """What the replica holds: no lock key, the counter and the mark one grant back."""
        self.direct.delete(lock_key(name))
        self.direct.set("fencegate:token:{%s}" % name, token - 1)
        self.direct.set(hwm_key(name), token - 1)

    def test_former_holder_refused_although_its_token_came_again(self):
        # A holds four locks; one at a time, a failover loses its grant and B is granted the same
        # token. A then writes under it in one of the forms a write takes: alone, as a script, in
        # a MULTI block, in a pipeline. The store refuses each; A's session then renews at once,
        # learns that this lock is lost, and keeps the others.
        a = self.fencegate("--session-ttl-ms", "30000")  # its next renewal is 10 s away
        b = self.fencegate()
        ca = self.raw(a.resp_port)
        cb = self.raw(b.resp_port)
        names = ["wallet:8%s" % x for x in "abcd"]
        tokens = {n: self.acquire(ca, n) for n in names}
        refused0 = metric(a, "fencegate_locklost_refused_total")

        def repeat(name):
            ta = tokens[name]
            self.assertEqual(ca.call("SET", name, "A-1"), "OK")
            self.rollback_grant(name, ta)
            self.direct.delete(name)  # A's write went with the grant
            self.assertEqual(self.acquire(cb, name, "WAIT", 0), ta,
                             "the lost grant's token is granted again")
            self.assertEqual(ca.call("FENCE.TOKEN", name), ta, "A should not know yet")
            return ta

        def lost():
            return sorted(x[0].decode() for x in ca.call("FENCE.LOCKS") if x[3] == b"lost")

        t = repeat("wallet:8a")
        r = ca.call("SET", "wallet:8a", "A-2")
        self.assertTrue(r.startswith("LOCKLOST lock wallet:8a (token %d) is not held in the "
                                     "store: another holder has it" % t), r)
        harness.wait_until(lambda: lost() == ["wallet:8a"], 3, 0.05,
                           "A's session to find wallet:8a lost after the store's refusal")

        repeat("wallet:8b")
        self.assert_refused(ca.call("EVAL", "return redis.call('SET', KEYS[1], 'A-3')", 1,
                                    "wallet:8b"), "LOCKLOST")
        harness.wait_until(lambda: lost() == names[:2], 3, 0.05, "wallet:8b lost")

        repeat("wallet:8c")
        ca.cmd("MULTI")
        ca.cmd("SET", "wallet:8c", "A-4")
        ca.cmd("INCR", "{wallet:8c}n")
        ca.cmd("EXEC")
        self.assertEqual([ca.read_reply() for _ in range(3)], ["OK", "QUEUED", "QUEUED"])
        self.assert_refused(ca.read_reply(), "LOCKLOST")
        harness.wait_until(lambda: lost() == names[:3], 3, 0.05, "wallet:8c lost")

        repeat("wallet:8d")
        for i in range(5):
            ca.cmd("SET", "wallet:8d", "A-p%d" % i)
        replies = [ca.read_reply() for _ in range(5)]
        for r in replies:
            self.assert_refused(r, "LOCKLOST")
        self.assertTrue(replies[0].startswith("LOCKLOST lock wallet:8d (token %d) is not held "
                                              "in the store" % tokens["wallet:8d"]), replies)

        for n in names:
            self.assertIsNone(self.direct.get(n), "a write of the former holder applied")
        self.assertEqual(self.direct.exists("{wallet:8c}n"), 0)
        self.assertGreaterEqual(metric(a, "fencegate_locklost_refused_total"), refused0 + 8)
        for n in names:
            self.assertEqual(cb.call("SET", n, "B-1"), "OK")
            self.assertEqual(self.direct.get(n), b"B-1")
            self.assertEqual(self.hwm(n), tokens[n])

    def test_lease_gone_from_the_store_refuses_writes(self):
        # The lock key is gone and nobody took the lock: the store does not say A holds it.
        a = self.fencegate()
        ca = self.raw(a.resp_port)
        t = self.acquire(ca, "wallet:9")
        self.direct.delete(lock_key("wallet:9"))
        r = ca.call("SET", "wallet:9", "A")
        self.assertTrue(r.startswith("LOCKLOST lock wallet:9 (token %d) is not held in the "
                                     "store: its lease ran out there" % t), r)
        self.assertEqual(self.direct.exists("wallet:9"), 0)

    def test_one_redis_under_two_names_is_still_checked(self):
        # --upstream redis://localhost:P, --backend redis://127.0.0.1:P: one Redis spelled two
        # ways (one address). fencegate says so at start and checks the lock keys as when the two
        # are spelled alike: A's write under a token granted again is refused. (Taken for two
        # servers, as before, the write passed: its token equals the mark.)
        a = self.fencegate("--upstream", "redis://localhost:%d" % self.redis.port,
                           "--session-ttl-ms", "30000")
        b = self.fencegate()
        ca, cb = self.raw(a.resp_port), self.raw(b.resp_port)
        with open(a.stderr_path) as f:
            self.assertIn("are one Redis (one address): fenced writes check its lock keys",
                          f.read())
        t = self.acquire(ca, "wallet:11")
        self.assertEqual(ca.call("SET", "wallet:11", "A-1"), "OK")
        self.rollback_grant("wallet:11", t)
        self.direct.delete("wallet:11")
        self.assertEqual(self.acquire(cb, "wallet:11", "WAIT", 0), t)
        self.assert_refused(ca.call("SET", "wallet:11", "A-2"), "LOCKLOST")
        self.assertEqual(self.direct.exists("wallet:11"), 0)
        self.assertEqual(cb.call("SET", "wallet:11", "B"), "OK")

    def test_a_mark_below_the_token_refuses_every_form_of_write_and_gives_the_lock_up(self):
        # Fence on acquire set the mark to the token; writes raise nothing. A mark found below
        # the token, or gone (a failover to a replica that missed the raise, a deleted key),
        # proves nothing about who wrote since: refused, and the lock given up at once, so that
        # acquiring it again yields a new token and a new mark. Alone, as a script, in a MULTI
        # block, in a pipeline.
        fg = self.fencegate("--session-ttl-ms", "30000")  # no renewal would notice
        c = self.raw(fg.resp_port)
        refused0 = metric(fg, "fencegate_locklost_refused_total")
        lost0 = metric(fg, "fencegate_locks_lost_total")

        def write(form, key):
            if form == "alone":
                return [c.call("SET", key, "x")]
            if form == "script":
                return [c.call("EVAL", "return redis.call('SET', KEYS[1], 'x')", 1, key)]
            if form == "multi":
                for cmd in (("MULTI",), ("SET", key, "x"), ("INCR", "{%s}n" % key), ("EXEC",)):
                    c.cmd(*cmd)
                replies = [c.read_reply() for _ in range(4)]
                self.assertEqual(replies[:3], ["OK", "QUEUED", "QUEUED"])
                return replies[3:]
            for i in range(5):
                c.cmd("SET", key, "p%d" % i)
            return [c.read_reply() for _ in range(5)]

        for i, form in enumerate(("alone", "script", "multi", "pipeline")):
            name = "wallet:m%d" % i
            t = self.acquire(c, name)
            self.assertEqual(self.hwm(name), t)
            if i % 2:
                self.direct.set(hwm_key(name), t - 1)
            else:
                self.direct.delete(hwm_key(name))
            replies = write(form, name)
            self.assertTrue(replies[0].startswith(
                "LOCKLOST lock %s (token %d) is above its high-water mark %d" % (
                    name, t, t - 1 if i % 2 else 0)), (form, replies))
            for r in replies:
                self.assert_refused(r, "LOCKLOST")
            self.assertEqual(self.direct.exists(name, "{%s}n" % name), 0, form)
            locks = {x[0].decode(): (x[1], x[3]) for x in c.call("FENCE.LOCKS")}
            self.assertEqual(locks[name], (t, b"lost"), form)
            harness.wait_until(lambda: self.direct.get(lock_key(name)) is None, 3, 0.02,
                               "its key freed (an owner-checked DEL, sent from the loop)")
            again = self.acquire(c, name, "WAIT", 0)
            self.assertGreater(again, t)
            self.assertEqual(self.hwm(name), again)
            self.assertEqual(write(form, name)[-1], "OK" if form != "multi" else ["OK", 1])
        self.assertGreaterEqual(metric(fg, "fencegate_locklost_refused_total"), refused0 + 4)
        self.assertEqual(metric(fg, "fencegate_locks_lost_total"), lost0 + 4)

    def test_a_stale_refusal_gives_the_lock_up(self):
        # A's key vanished from the backend (a failover, a flush) and B was granted the lock: its
        # fence on acquire raised the mark above A's token. The store's STALE refusal proves the
        # lock is B's, and A's sidecar believes it at once instead of at its next renewal: the
        # lock shows lost, and FENCE.ACQUIRE asks the backend again instead of handing A its old
        # token while B holds the lock. B's key is left alone.
        a = self.fencegate("--session-ttl-ms", "30000")  # its next renewal is 10 s away
        b = self.fencegate()
        ca, cb = self.raw(a.resp_port), self.raw(b.resp_port)
        ta = self.acquire(ca, "wallet:st")
        self.direct.delete(lock_key("wallet:st"))
        tb = self.acquire(cb, "wallet:st")
        self.assertGreater(tb, ta)
        lost0 = metric(a, "fencegate_locks_lost_total")
        self.assert_refused(ca.call("SET", "wallet:st", "a"), "STALE")
        locks = {x[0].decode(): (x[1], x[3]) for x in ca.call("FENCE.LOCKS")}
        self.assertEqual(locks["wallet:st"], (ta, b"lost"))
        self.assertEqual(metric(a, "fencegate_locks_lost_total"), lost0 + 1)
        self.assert_refused(ca.call("FENCE.ACQUIRE", "wallet:st", "WAIT", 0), "LOCKED")
        self.assert_refused(ca.call("SET", "wallet:st", "a"), "LOCKLOST", "NOLOCK")
        time.sleep(0.3)  # time for the owner-checked release of A's grant to have been sent
        self.assertIsNotNone(self.direct.get(lock_key("wallet:st")))
        self.assertEqual(cb.call("SET", "wallet:st", "b"), "OK")
        self.assertEqual(self.direct.get("wallet:st"), b"b")

    def test_the_lock_given_up_is_the_one_refused_whatever_bytes_its_name_holds(self):
        # Redis turns CR and LF into spaces in an error reply, and a name may hold the refusal's
        # own phrase: the sidecar still gives up the very lock the store refused, and only it.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        crlf = "wallet:a\r\nb"
        t = self.acquire(c, crlf)
        self.direct.delete(hwm_key(crlf))
        r = c.call("SET", crlf, "x")
        self.assertTrue(r.startswith("LOCKLOST lock wallet:a  b (token %d) is above" % t), r)
        short = "wallet:s"
        ts = self.acquire(c, short)
        long_ = "%s (token %d) is above its high-water mark" % (short, ts)
        tl = self.acquire(c, long_)
        self.direct.delete(hwm_key(long_))
        self.assert_refused(c.call("SET", long_, "x"), "LOCKLOST")
        locks = {x[0].decode(): (x[1], x[3]) for x in c.call("FENCE.LOCKS")}
        self.assertEqual(locks[crlf], (t, b"lost"))
        self.assertEqual(locks[long_], (tl, b"lost"))
        self.assertEqual(locks[short], (ts, b"held"))
        self.assertEqual(c.call("SET", short, "y"), "OK")
        self.assertGreater(self.acquire(c, crlf, "WAIT", 0), t)
        self.assertEqual(c.call("SET", crlf, "z"), "OK")

    def test_a_lost_fence_raise_cannot_lose_an_update(self):
        # The locks in a Redis of their own, the store another. B takes over from A and fence on
        # acquire raises the store's mark to B's token; then the store fails over to a replica
        # that missed that raise (the mark back at A's token). A, not yet aware it lost the lock,
        # writes: token == mark, and the store cannot tell. B's read-modify-write, begun before
        # A's write, must not overwrite it: B's write is refused, and B, acquiring again, reads
        # A's write. (With writes passing at token >= mark, B's went through: A's update lost.)
        locks = self.start_redis()
        url = "redis://127.0.0.1:%d" % locks.port
        a = self.fencegate("--backend", url, "--session-ttl-ms", "30000")
        b = self.fencegate("--backend", url)
        ca, cb = self.raw(a.resp_port), self.raw(b.resp_port)
        self.direct.set("wallet:20", 10)
        ta = self.acquire(ca, "wallet:20")
        locks.client().delete(lock_key("wallet:20"))  # A's lease ran out there
        tb = self.acquire(cb, "wallet:20", "WAIT", 0)
        self.assertGreater(tb, ta)
        self.assertEqual(self.hwm("wallet:20"), tb)
        seen = int(cb.call("GET", "wallet:20"))  # B reads 10
        self.direct.set(hwm_key("wallet:20"), ta)  # the failover: B's raise is gone
        self.assertEqual(ca.call("INCRBY", "wallet:20", 5), 15)  # A cannot be told apart
        r = cb.call("SET", "wallet:20", seen + 1)
        self.assert_refused(r, "LOCKLOST")
        self.assertEqual(self.direct.get("wallet:20"), b"15", "A's update was lost")
        tb2 = self.acquire(cb, "wallet:20")
        self.assertGreater(tb2, tb)
        self.assertEqual(cb.call("INCRBY", "wallet:20", 1), 16)
        self.assert_refused(ca.call("INCRBY", "wallet:20", 5), "STALE")

    def test_restart_from_an_old_snapshot(self):
        # The real thing: Redis restarts from a snapshot taken before A's grant, with A frozen
        # through it and its write waiting in the socket; B takes the lock. A resumes.
        a = self.fencegate()
        b = self.fencegate()
        ca = self.raw(a.resp_port, timeout=10)
        self.assertEqual(self.direct.set("wallet:10", "before"), True)
        self.direct.save()
        ta = self.acquire(ca, "wallet:10")
        self.assertEqual(ca.call("SET", "wallet:10", "A-1"), "OK")
        self.freeze(a)
        ca.cmd("SET", "wallet:10", "A-frozen")
        self.redis.kill()
        self.redis.start()  # loads the snapshot
        self.direct.close()
        self.direct = self.redis.client()
        self.assertEqual(self.direct.get("wallet:10"), b"before")
        cb = self.raw(b.resp_port, timeout=10)
        tb = harness.wait_until(
            lambda: (lambda r: r if isinstance(r, int) else None)(
                cb.call("FENCE.ACQUIRE", "wallet:10", "WAIT", 0)),
            10, 0.1, "B to acquire after the restart")
        self.assertEqual(tb, ta, "the lost grant's token is granted again")
        a.signal(signal.SIGCONT)
        try:
            self.assert_refused(ca.read_reply(timeout=5), "LOCKLOST", "UNAVAILABLE")
        except (EOFError, OSError):
            pass  # the connection closed: nothing applied either
        self.assertEqual(self.direct.get("wallet:10"), b"before")
        # B's lock backend connection may be back before its upstream probe (its own backoff):
        # B writes once its upstream is up again.
        harness.wait_until(lambda: b.http("/readyz")[0] == 200, 10, 0.1, "B's upstream back")
        self.assertEqual(cb.call("SET", "wallet:10", "B-1"), "OK")
        self.assertEqual(self.direct.get("wallet:10"), b"B-1")


class BigTokens(FencingCase):
    """Tokens go up to 2^63 - 1; Lua's numbers are doubles, one number for 2^53 and 2^53 + 1.
    Every script that hands out, raises or checks a token compares it exactly."""

    def test_tokens_beyond_2_53_are_handed_out_and_checked_exactly(self):
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        name = "wallet:big"
        self.direct.set("fencegate:token:{%s}" % name, 2 ** 53)
        t = self.acquire(c, name)
        self.assertEqual(t, 2 ** 53 + 1)
        self.assertEqual(self.hwm(name), t)
        self.assertEqual(c.call("SET", name, "a"), "OK")
        for cmd in range(5):
            c.cmd("SET", name, "p%d" % cmd)
        self.assertEqual([c.read_reply() for _ in range(5)], ["OK"] * 5)
        self.direct.set(hwm_key(name), t + 1)  # a newer holder's mark
        c.send(b"".join(encode("SET", name, "q%d" % cmd) for cmd in range(5)))
        for r in [c.read_reply() for _ in range(5)]:
            self.assert_refused(r, "STALE")
        t = self.acquire(c, name)  # the refusal gave the lock up
        self.direct.set(hwm_key(name), t + 1)
        self.assert_refused(c.call("SET", name, "b"), "STALE")
        t = self.acquire(c, name)
        self.direct.set(hwm_key(name), t - 1)  # a mark that went back
        self.assert_refused(c.call("SET", name, "c"), "LOCKLOST")
        self.assertEqual(self.direct.get(name), b"p4")

    def test_fence_on_acquire_beyond_2_53_repairs_past_the_mark_exactly(self):
        # The locks in a Redis of their own: fence on acquire raises the store's mark with its
        # own script, and a mark at or above the new token has the counter repaired past it.
        locks = self.start_redis()
        fg = self.fencegate("--backend", "redis://127.0.0.1:%d" % locks.port)
        c = self.raw(fg.resp_port)
        name = "wallet:big2"
        locks.client().set("fencegate:token:{%s}" % name, 2 ** 53)
        self.direct.set(hwm_key(name), 2 ** 53 + 2)
        t = self.acquire(c, name)
        self.assertEqual(t, 2 ** 53 + 3)
        self.assertEqual(self.hwm(name), t)
        self.assertEqual(c.call("SET", name, "a"), "OK")



class NoWayAround(FencingCase):
    """Ways a write could reach the store without its fence, each closed: the data stays as it
    was, and the client is told why."""

    def test_quoted_inline_commands_are_refused_while_writes_are_fenced(self):
        # Redis unquotes "SET" and "\x53ET"; a table lookup of the raw token would not find
        # the command and pass it on unfenced.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.direct.set("wallet:1", "v")
        for line in (b'"SET" wallet:1 stolen\r\n', b'"\\x53ET" wallet:1 stolen\r\n',
                     b'XGROUP "CREATE" wallet:9 g $ MKSTREAM\r\n', b'"FLUSHALL"\r\n'):
            c.send(line)
            r = c.read_reply()
            self.assertIsInstance(r, Err, (line, r))
            self.assertIn("inline command with quotes", r)
        self.assertEqual(self.direct.get("wallet:1"), b"v")
        self.assertEqual(self.direct.exists("wallet:9"), 0)
        c.send(b"GET wallet:1\r\n")  # unquoted inline commands work as before
        self.assertEqual(c.read_reply(), b"v")

    def test_a_command_fencegate_does_not_know_is_refused_while_writes_are_fenced(self):
        # A command renamed in redis.conf is still listed by COMMAND under its old name.
        redis = self.start_redis(args=["--rename-command", "SET", "MYSET"])
        cfg = self.write_file("fg-renamed.yaml", PROTECT)
        fg = self.start_fencegate(redis, args=["--config", cfg])
        c = self.raw(fg.resp_port)
        r = c.call("MYSET", "wallet:1", "stolen")
        self.assertIsInstance(r, Err, r)
        self.assertTrue(r.startswith("ERR unknown command 'MYSET', with args beginning with: "
                                     "'wallet:1' 'stolen' "), r)
        self.assertIn("fencegate does not know it", r)
        self.assertIsNone(redis.client().get("wallet:1"))

    def test_reset_after_monitor_or_subscribe_leaves_writes_fenced(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.assertEqual(c.call("MONITOR"), "OK")
        c.cmd("RESET")
        self.assertEqual(c.read_reply(), "RESET")
        self.assert_refused(c.call("SET", "wallet:1", "stolen"), "NOLOCK")
        self.assertIsNone(self.direct.get("wallet:1"))
        # After SELECT 3, SUBSCRIBE, RESET the connection is in database 0 again, and its
        # fenced writes go there.
        d = self.raw(fg.resp_port)
        self.assertEqual(d.call("SELECT", "3"), "OK")
        d.cmd("SUBSCRIBE", "ch")
        d.read_reply()
        d.cmd("RESET")
        self.assertEqual(d.read_reply(), "RESET")
        t = self.acquire(d, "wallet:2")
        self.assertEqual(d.call("SET", "wallet:2", "x"), "OK")
        self.assertEqual(d.call("GET", "wallet:2"), b"x")
        self.assertEqual(self.direct.get("wallet:2"), b"x", "written in database 0")
        self.assertEqual(self.hwm("wallet:2"), t)

    def test_fencegates_own_keys_cannot_be_written_through_it(self):
        # A mark lowered by another connection would let a stale holder's write pass.
        fg = self.fencegate()
        a, b = self.raw(fg.resp_port), self.raw(fg.resp_port)
        t = self.acquire(a, "wallet:3")
        self.direct.set(hwm_key("wallet:3"), t + 5)  # a newer holder's mark
        self.assert_refused(a.call("SET", "wallet:3", "A"), "STALE")
        for cmd in (("SET", hwm_key("wallet:3"), t), ("DEL", hwm_key("wallet:3")),
                    ("SET", lock_key("wallet:3"), "x"), ("DEL", "fencegate:token:{wallet:3}"),
                    ("EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", 1,
                     hwm_key("wallet:3"), t)):
            r = b.call(*cmd)
            self.assertIsInstance(r, Err, (cmd, r))
            self.assertIn("is fencegate's own", r)
        self.assertEqual(self.hwm("wallet:3"), t + 5)
        self.assert_refused(a.call("SET", "wallet:3", "A"), "LOCKLOST")  # given up at the STALE
        self.assertEqual(b.call("GET", hwm_key("wallet:3")), str(t + 5).encode())

    def test_hello_inside_a_held_back_multi_is_refused(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:4")
        self.assertEqual(c.call("MULTI"), "OK")
        r = c.call("HELLO", "3")
        self.assertIsInstance(r, Err, r)
        self.assertIn("HELLO inside a MULTI", r)
        self.assertTrue(c.call("EXEC").startswith("EXECABORT"))
        self.assertEqual(c.call("SET", "wallet:4", "v"), "OK")
        self.assertEqual(c.call("PING"), "PONG")


if __name__ == "__main__":
    unittest.main()
