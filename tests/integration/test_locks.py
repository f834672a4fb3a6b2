"""Locks on the RESP endpoint (DESIGN.md §1 "Token", "No token regression"; §2 "Lock commands"):
tokens strictly increase across holders, connections, sidecars and restarts; WAIT hands a lock
over as soon as it is free; a connection is a session; leases expire or are renewed; a lost
token counter is repaired past the store's mark; pipelined lock commands keep their order."""

import select
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


def token_key(name):
    return "fencegate:token:{%s}" % name


def hwm_key(name):
    return "fencegate:hwm:{%s}" % name


def metric(fg, name):
    return fg.metrics().get(name, 0.0)


class LockTestCase(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def fencegate(self, *extra, config=PROTECT, **kw):
        args = list(extra)
        if config:
            args += ["--config", self.write_file("fencegate-%d.yaml" % len(self._fg_procs),
                                                 config)]
        return self.start_fencegate(self.redis, args=args, **kw)

    def acquire(self, conn, name, *opts, timeout=None):
        """FENCE.ACQUIRE that must succeed: returns the token."""
        r = conn.call("FENCE.ACQUIRE", name, *opts, timeout=timeout)
        self.assertIsInstance(r, int, "FENCE.ACQUIRE %s %s got %r" % (name, opts, r))
        self.assertGreater(r, 0)
        return r


class Tokens(LockTestCase):

    def test_token_strictly_increases_over_200_cycles_and_two_connections(self):
        fg = self.fencegate()
        a = self.raw(fg.resp_port)
        b = self.raw(fg.resp_port)
        last = 0
        for i in range(200):
            c = a if i % 3 else b  # holders alternate between connections
            t = self.acquire(c, "cyc", "WAIT", 0)
            self.assertGreater(t, last, "cycle %d: token %d after %d" % (i, t, last))
            self.assertEqual(c.call("FENCE.TOKEN", "cyc"), t)
            self.assertEqual(c.call("FENCE.RELEASE", "cyc"), 1, "cycle %d" % i)
            self.assertIsNone(c.call("FENCE.TOKEN", "cyc"))
            last = t
        self.assertEqual(c.call("FENCE.RELEASE", "cyc"), 0, "released twice")
        self.assertEqual(self.direct.exists(lock_key("cyc")), 0, "lock key left after release")

    def test_token_increases_across_two_sidecars_on_one_redis(self):
        f1 = self.fencegate()
        f2 = self.fencegate()
        c1 = self.raw(f1.resp_port)
        c2 = self.raw(f2.resp_port)
        last = 0
        for i in range(30):
            c, other = (c1, c2) if i % 2 == 0 else (c2, c1)
            t = self.acquire(c, "shared", "WAIT", 2000, timeout=5)
            self.assertGreater(t, last, "round %d" % i)
            # The other sidecar sees it held.
            r = other.call("FENCE.ACQUIRE", "shared", "WAIT", 0)
            self.assertIsInstance(r, Err, "both sidecars granted 'shared' (round %d)" % i)
            self.assertTrue(r.startswith("LOCKED"), r)
            self.assertEqual(c.call("FENCE.RELEASE", "shared"), 1)
            last = t

    def test_release_reply_means_released_in_the_backend(self):
        # After FENCE.RELEASE answers 1, a holder on another sidecar must get the lock at once.
        f1 = self.fencegate()
        f2 = self.fencegate()
        c1 = self.raw(f1.resp_port)
        c2 = self.raw(f2.resp_port)
        for i in range(100):
            c, other = (c1, c2) if i % 2 == 0 else (c2, c1)
            self.acquire(c, "rel", "WAIT", 2000, timeout=5)
            self.assertEqual(c.call("FENCE.RELEASE", "rel"), 1)
            self.assertEqual(self.direct.exists(lock_key("rel")), 0,
                             "round %d: FENCE.RELEASE answered 1 while the lock key was still in "
                             "the backend" % i)
            r = other.call("FENCE.ACQUIRE", "rel", "WAIT", 0)
            self.assertIsInstance(r, int, "round %d: acquire right after a release got %r"
                                  % (i, r))
            self.assertEqual(other.call("FENCE.RELEASE", "rel"), 1)
            harness.wait_until(lambda: self.direct.exists(lock_key("rel")) == 0, 2, 0.01,
                               "the lock key to go")

    def test_a_release_of_a_lock_another_holder_took_answers_0_and_leaves_it(self):
        # The backend lost A's key (a flush, a failover) and B took the lock before A's renewal
        # noticed: A's release finds the key is not A's. It answered 1 ("released") as if A had
        # let go of it; the HTTP API answers 404 there.
        f1, f2 = self.fencegate(), self.fencegate()
        a, b = self.raw(f1.resp_port), self.raw(f2.resp_port)
        self.acquire(a, "taken")
        self.direct.delete(lock_key("taken"))
        self.acquire(b, "taken")
        self.assertEqual(a.call("FENCE.RELEASE", "taken"), 0)
        self.assertEqual(self.direct.exists(lock_key("taken")), 1, "B's key was deleted")
        self.assertEqual(b.call("FENCE.RELEASE", "taken"), 1)

    def test_token_increases_after_sidecar_kill9_and_restart(self):
        fg = self.fencegate("--session-ttl-ms", "1000")
        c = self.raw(fg.resp_port)
        t1 = self.acquire(c, "rs", "TTL", 800, "NORENEW")
        t2_probe = self.acquire(c, "rs-other")
        fg.proc.kill()  # kill -9: nothing released
        fg.wait_exit(5)
        self.assertEqual(self.direct.exists(lock_key("rs")), 1,
                         "kill -9 cannot release; the lease must still be there")

        fg2 = self.fencegate("--session-ttl-ms", "1000", resp_port=fg.resp_port,
                             http_port=fg.http_port)
        c2 = self.raw(fg2.resp_port)
        t0 = time.monotonic()
        t = self.acquire(c2, "rs", "WAIT", 5000, timeout=8)
        self.assertGreater(t, t1, "token went backwards over a sidecar restart")
        self.assertLess(time.monotonic() - t0, 3.0, "an 800 ms lease took too long to free")
        # A lock on the default session lease also comes back with a larger token.
        t2 = self.acquire(c2, "rs-other", "WAIT", 5000, timeout=8)
        self.assertGreater(t2, t2_probe)


class Reset(LockTestCase):

    def test_reset_inside_a_plain_multi_ends_it(self):
        """No rules and no lock: MULTI goes to Redis as is. RESET there ends the block at once
        (Redis runs it), so a later SELECT is known to have run, and the one-lock rule's fenced
        writes know their database."""
        fg = self.fencegate(config=None)
        c = self.raw(fg.resp_port)
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("RESET"), "RESET")
        self.assertEqual(c.call("SELECT", "0"), "OK")
        self.acquire(c, "only")
        self.assertEqual(c.call("SET", "k", "v"), "OK")
        self.assertEqual(self.direct.get("k"), b"v")


class Waiting(LockTestCase):

    def setUp(self):
        super().setUp()
        self.fg = self.fencegate()

    def test_wait0_while_held_is_locked_at_once(self):
        a = self.raw(self.fg.resp_port)
        b = self.raw(self.fg.resp_port)
        t = self.acquire(a, "busy")
        t0 = time.monotonic()
        r = b.call("FENCE.ACQUIRE", "busy", "WAIT", 0)
        self.assertIsInstance(r, Err, "second holder granted: %r" % (r,))
        self.assertTrue(r.startswith("LOCKED "), r)
        self.assertLess(time.monotonic() - t0, 1.0, "WAIT 0 must try once, not wait")
        self.assertIsNone(b.call("FENCE.TOKEN", "busy"))
        self.assertEqual(b.call("FENCE.RELEASE", "busy"), 0, "a non-holder released it")
        self.assertEqual(a.call("FENCE.TOKEN", "busy"), t, "the holder lost its lock")
        # Also without WAIT from a different sidecar: the default is not to wait forever.
        self.assertEqual(self.direct.exists(lock_key("busy")), 1)

    def _handover(self, free_it):
        a = self.raw(self.fg.resp_port)
        b = self.raw(self.fg.resp_port, timeout=10)
        ta = self.acquire(a, "ho")
        b.cmd("FENCE.ACQUIRE", "ho", "WAIT", 2000)
        time.sleep(0.3)
        self.assertEqual(b.read_available(0.05), b"", "granted while still held")
        t_free = time.monotonic()
        free_it(a)
        r = b.read_reply(timeout=5)
        dt = time.monotonic() - t_free
        self.assertIsInstance(r, int, "the waiter got %r" % (r,))
        self.assertGreater(r, ta)
        self.assertLess(dt, 0.8, "hand-over took %.2fs of a 2 s wait: it must be prompt" % dt)
        self.assertEqual(b.call("FENCE.TOKEN", "ho"), r)

    def test_wait_granted_soon_after_release(self):
        self._handover(lambda a: self.assertEqual(a.call("FENCE.RELEASE", "ho"), 1))

    def test_wait_granted_soon_after_holder_connection_closes(self):
        self._handover(lambda a: a.close())

    def test_wait_expires_with_locked(self):
        a = self.raw(self.fg.resp_port)
        b = self.raw(self.fg.resp_port)
        self.acquire(a, "long")
        t0 = time.monotonic()
        r = b.call("FENCE.ACQUIRE", "long", "WAIT", 500, timeout=5)
        dt = time.monotonic() - t0
        self.assertIsInstance(r, Err)
        self.assertTrue(r.startswith("LOCKED"), r)
        self.assertGreaterEqual(dt, 0.45, "gave up before WAIT ran out")
        self.assertLess(dt, 2.0, "WAIT 500 took %.2fs" % dt)

    def test_a_grant_answered_after_its_lease_ran_out_is_tried_again_within_the_wait(self):
        # Redis holds the acquire script back (CLIENT PAUSE WRITE, a long script) for longer
        # than the lease asked for: the grant comes back already expired, as the lease counts
        # from the send. With WAIT time left the sidecar asks again rather than answering
        # UNAVAILABLE to a caller who said it would wait.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.direct.execute_command("CLIENT", "PAUSE", 1200, "WRITE")
        t0 = time.monotonic()
        r = c.call("FENCE.ACQUIRE", "wallet:paused", "TTL", 500, "WAIT", 5000, timeout=10)
        self.assertIsInstance(r, int, r)
        self.assertGreater(time.monotonic() - t0, 1.0, "granted while Redis was paused")
        self.assertEqual(c.call("FENCE.LOCKS")[0][3], b"held")
        self.assertEqual(c.call("SET", "wallet:paused", "v"), "OK")
        # Without time left the answer stays what it was: the lock was not held in time.
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:paused"), 1)
        self.direct.execute_command("CLIENT", "PAUSE", 1200, "WRITE")
        r = c.call("FENCE.ACQUIRE", "wallet:paused", "TTL", 500, timeout=10)
        self.assertIsInstance(r, Err)
        self.assertIn("its lease ran out before it could be reported", r)
        harness.wait_until(lambda: self.direct.exists(lock_key("wallet:paused")) == 0, 3, 0.05,
                           "the expired grant's key freed")

    def test_backend_down_answers_within_the_wait_and_its_return_is_noticed_at_once(self):
        # With the lock backend down, an acquire waits for it no longer than its WAIT (about
        # 0.1 s for a try-once one, not the 2 s a call may take); once Redis is back, the next
        # acquire reconnects on demand instead of waiting out the reconnect backoff, which has
        # grown past a second by then.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        self.acquire(c, "down:warm")
        self.assertEqual(c.call("FENCE.RELEASE", "down:warm"), 1)
        self.redis.kill()
        time.sleep(3)
        for wait, most in ((0, 0.6), (300, 0.9)):
            conn = self.raw(fg.resp_port)
            t0 = time.monotonic()
            r = conn.call("FENCE.ACQUIRE", "down:x", "WAIT", wait, timeout=5)
            took = time.monotonic() - t0
            self.assertIsInstance(r, Err, "granted with the backend down: %r" % (r,))
            self.assertTrue(r.startswith("UNAVAILABLE ") and "not acquired" in r, r)
            self.assertLess(took, most, "WAIT %d took %.2f s with the backend down" % (wait, took))
        self.redis.start()
        conn = self.raw(fg.resp_port)
        t0 = time.monotonic()
        r = conn.call("FENCE.ACQUIRE", "down:x", "WAIT", 0, timeout=5)
        took = time.monotonic() - t0
        self.assertIsInstance(r, int, "the first acquire after the backend came back: %r" % (r,))
        self.assertLess(took, 0.5, "it waited %.2f s for a reconnect" % took)

    def test_readyz_names_a_lock_backend_that_is_down(self):
        other = self.start_redis()
        fg = self.start_fencegate(self.redis, args=["--backend", other.url])
        self.assertEqual(fg.http("/readyz")[0], 200)
        other.kill()
        harness.wait_until(lambda: fg.http("/readyz")[0] == 503, 5, 0.1, "/readyz 503")
        body = fg.http("/readyz")[1].decode()
        self.assertIn("the lock backend is not ready: redis 127.0.0.1:%d is not connected"
                      % other.port, body)

    def test_closing_a_connection_releases_all_its_locks(self):
        a = self.raw(self.fg.resp_port)
        self.acquire(a, "s1")
        self.acquire(a, "s2")
        self.assertEqual(self.direct.exists(lock_key("s1"), lock_key("s2")), 2)
        a.close()
        harness.wait_until(lambda: self.direct.exists(lock_key("s1"), lock_key("s2")) == 0,
                           1.0, 0.01, "the closed session's lock keys to go")
        c = self.raw(self.fg.resp_port)
        for n in ("s1", "s2"):
            self.acquire(c, n, "WAIT", 0)
        # A second sidecar sees the same: the release is in the backend, not only local.
        f2 = self.fencegate()
        d = self.raw(f2.resp_port)
        r = d.call("FENCE.ACQUIRE", "s1", "WAIT", 0)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)

    def test_fence_commands_inside_multi_are_errors(self):
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("MULTI"), "OK")
        r = c.call("FENCE.ACQUIRE", "inmulti")
        self.assertIsInstance(r, Err)
        self.assertEqual(c.call("SET", "plain", "1"), "QUEUED")
        r = c.call("EXEC")
        # Either EXEC aborts or it runs without the FENCE command; the lock is never taken.
        self.assertTrue(isinstance(r, Err) or r == ["OK"], r)
        self.assertEqual(self.direct.exists(lock_key("inmulti")), 0)
        self.assertIsNone(c.call("FENCE.TOKEN", "inmulti"))


class Leases(LockTestCase):

    def test_a_ttl_out_of_range_is_refused_with_the_range_the_backend_takes(self):
        # One range, one message: TTL 1 was refused by the lock library with another text
        # ("out of range (500..3600000, or 0 ...)") than TTL 0 was by the command ("1..3600000").
        c = self.raw(self.fencegate().resp_port)
        for ttl in ("0", "1", "499", "3600001", "-5", "x"):
            self.assertEqual(c.call("FENCE.ACQUIRE", "t", "TTL", ttl),
                             Err("ERR TTL must be an integer number of milliseconds in "
                                 "500..3600000"), ttl)
        self.assertGreater(self.acquire(c, "t", "TTL", 500), 0)

    def test_norenew_lease_expires_then_write_is_locklost(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:1", "TTL", 500, "NORENEW")
        pttl = self.direct.pttl(lock_key("wallet:1"))
        self.assertTrue(0 < pttl <= 500, "lease PTTL %d for TTL 500" % pttl)
        self.assertEqual(c.call("SET", "wallet:1", "before"), "OK")
        harness.wait_until(lambda: self.direct.exists(lock_key("wallet:1")) == 0, 3.0, 0.02,
                           "the NORENEW lease to expire in the backend")
        time.sleep(0.1)
        lost_before = metric(fg, "fencegate_locklost_refused_total")
        r = c.call("SET", "wallet:1", "after")
        self.assertIsInstance(r, Err, "a write under an expired lease was accepted: %r" % (r,))
        self.assertTrue(r.startswith("LOCKLOST lock wallet:1 "), r)
        self.assertEqual(self.direct.get("wallet:1"), b"before", "the refused write applied")
        self.assertEqual(metric(fg, "fencegate_locklost_refused_total"), lost_before + 1)
        locks = c.call("FENCE.LOCKS")
        self.assertEqual([[x[0], x[1], x[3]] for x in locks], [[b"wallet:1", t, b"lost"]],
                         locks)
        # Re-acquiring gives a fresh token and writes work again.
        t2 = self.acquire(c, "wallet:1", "WAIT", 0)
        self.assertGreater(t2, t)
        self.assertEqual(c.call("SET", "wallet:1", "again"), "OK")
        self.assertEqual(self.direct.get("wallet:1"), b"again")
        self.assertTrue(r.startswith("LOCKLOST lock wallet:1 (token %d)" % t),
                        "LOCKLOST must name the lock and its token: %r" % r)

    def test_renewal_keeps_default_lease_alive_for_three_session_ttls(self):
        fg = self.fencegate("--session-ttl-ms", "600")
        c = self.raw(fg.resp_port)
        other = self.raw(fg.resp_port)
        renewals0 = metric(fg, "fencegate_lock_renewals_total")
        t = self.acquire(c, "wallet:2")
        pttl = self.direct.pttl(lock_key("wallet:2"))
        self.assertTrue(0 < pttl <= 600, "default lease PTTL %d, session_ttl 600" % pttl)
        deadline = time.monotonic() + 1.8
        while time.monotonic() < deadline:
            self.assertEqual(self.direct.exists(lock_key("wallet:2")), 1,
                             "the lease lapsed while the connection lived")
            time.sleep(0.05)
        r = other.call("FENCE.ACQUIRE", "wallet:2", "WAIT", 0)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:2"), t)
        locks = c.call("FENCE.LOCKS")
        self.assertEqual(len(locks), 1, locks)
        name, tok, remaining, state = locks[0]
        self.assertEqual((name, tok, state), (b"wallet:2", t, b"held"))
        self.assertTrue(0 < remaining <= 600, remaining)
        self.assertEqual(c.call("SET", "wallet:2", "v"), "OK")
        self.assertEqual(self.direct.get("wallet:2"), b"v")
        self.assertGreaterEqual(metric(fg, "fencegate_lock_renewals_total") - renewals0, 2)
        self.assertGreaterEqual(metric(fg, "fencegate_lock_renewal_round_trips_total"), 2)


class CounterRepair(LockTestCase):

    def test_lost_counter_is_repaired_past_the_mark(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        for _ in range(5):
            t = self.acquire(c, "wallet:rep")
            self.assertEqual(c.call("SET", "wallet:rep", "v%d" % t), "OK")
            self.assertEqual(c.call("FENCE.RELEASE", "wallet:rep"), 1)
        self.assertEqual(int(self.direct.get(hwm_key("wallet:rep"))), t)
        repairs0 = metric(fg, "fencegate_token_repairs_total")

        # The counter vanishes (a failover lost it) while the store's mark stays at t.
        harness.redis_cli(self.redis.port, "DEL", token_key("wallet:rep"))
        t2 = self.acquire(c, "wallet:rep")
        self.assertGreater(t2, t, "token regressed below the store's high-water mark")
        self.assertGreaterEqual(int(self.direct.get(token_key("wallet:rep"))), t2,
                                "the counter was not raised past the mark")
        self.assertEqual(c.call("SET", "wallet:rep", "new"), "OK")
        self.assertEqual(self.direct.get("wallet:rep"), b"new")
        self.assertEqual(metric(fg, "fencegate_token_repairs_total"), repairs0 + 1)
        self.assertIn("lock wallet:rep: the token counter was not above", fg.log())
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:rep"), 1)
        t3 = self.acquire(c, "wallet:rep")
        self.assertGreater(t3, t2)


class FenceOnAcquire(LockTestCase):
    """Before a token is handed out the store's mark is raised to it: by the acquire script itself
    when the lock backend is the store's own Redis, by a separate script otherwise."""

    def check_mark_raised(self, fg, store, backend):
        c = self.raw(fg.resp_port)
        for _ in range(3):
            t = self.acquire(c, "wallet:m")
            self.assertEqual(int(store.get(hwm_key("wallet:m"))), t)
            self.assertEqual(backend.get(lock_key("wallet:m")) is not None, True)
            self.assertEqual(c.call("FENCE.RELEASE", "wallet:m"), 1)
        # A mark that is not a number proves nothing: the acquisition fails, nothing is held.
        store.set(hwm_key("wallet:m"), "junk")
        r = c.call("FENCE.ACQUIRE", "wallet:m")
        self.assertIsInstance(r, Err)
        self.assertTrue(r.startswith("UNAVAILABLE"), r)
        self.assertIn("not a number", r)
        # Released (asynchronously, when the grant came before the failed raise).
        harness.wait_until(lambda: backend.get(lock_key("wallet:m")) is None, 5, 0.05,
                           "the failed acquisition's lock key to go")
        self.assertEqual(store.get(hwm_key("wallet:m")), b"junk")
        self.assertEqual(c.call("FENCE.LOCKS"), [])

    def test_backend_is_the_store(self):
        self.check_mark_raised(self.fencegate(), self.direct, self.direct)

    def test_backend_is_another_redis(self):
        other = self.start_redis()
        fg = self.fencegate("--backend", other.url)
        backend = other.client()
        self.addCleanup(backend.close)
        self.check_mark_raised(fg, self.direct, backend)
        self.assertIsNone(self.direct.get(lock_key("wallet:m")))

    def test_a_store_down_or_silent_fails_closed_naming_the_store(self):
        """The store (another Redis than the lock backend) killed, then frozen: the acquisition
        fails closed at once, then at the raise's 2 s deadline, each time naming the store that
        could not be fenced, and leaves no lock held; with the store back it is granted."""
        other = self.start_redis()
        fg = self.fencegate("--backend", other.url)
        backend = other.client()
        self.addCleanup(backend.close)
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:sd")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:sd"), 1)
        where = "127.0.0.1:%d" % self.redis.port
        self.redis.kill()
        r = c.call("FENCE.ACQUIRE", "wallet:sd")
        self.assertIsInstance(r, Err)
        self.assertTrue(r.startswith("UNAVAILABLE fence on acquire of lock wallet:sd"), r)
        self.assertIn("store " + where, r)
        harness.wait_until(lambda: backend.get(lock_key("wallet:sd")) is None, 3, 0.05,
                           "the unfenced grant's lock key to go")
        store = self.start_redis(port=self.redis.port)
        t = self.acquire(c, "wallet:sd")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:sd"), 1)
        store.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: store.proc.poll() is None and store.proc.send_signal(
            signal.SIGCONT))
        t0 = time.monotonic()
        r = c.call("FENCE.ACQUIRE", "wallet:sd")
        self.assertLess(time.monotonic() - t0, 3)
        self.assertIsInstance(r, Err)
        self.assertIn("store " + where, r)
        self.assertIn("2000 ms", r)
        harness.wait_until(lambda: backend.get(lock_key("wallet:sd")) is None, 3, 0.05,
                           "the unfenced grant's lock key to go")
        store.proc.send_signal(signal.SIGCONT)
        self.assertGreater(self.acquire(c, "wallet:sd"), t)

    def test_a_store_cut_off_is_fenced_again_soon_after_the_heal(self):
        """The store's port is cut (packets dropped) for 14 s: each acquisition fails closed at
        the raise's 2 s deadline. A raise that got no answer ends the marks' connection, so once
        the cut heals the next acquisitions are granted within seconds, not when TCP next
        retransmits into the old connection (backing off to tens of seconds)."""
        other = self.start_redis()
        fg = self.fencegate("--backend", other.url)
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:cut")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:cut"), 1)
        heal = self.cut(self.redis.port)
        end = time.monotonic() + 14
        while time.monotonic() < end:
            t0 = time.monotonic()
            r = c.call("FENCE.ACQUIRE", "wallet:cut")
            self.assertIsInstance(r, Err, "granted while the store was cut off")
            self.assertIn("store 127.0.0.1:%d" % self.redis.port, r)
            self.assertLess(time.monotonic() - t0, 3)
        heal()
        healed = time.monotonic()
        got = None
        while got is None and time.monotonic() - healed < 30:
            r = c.call("FENCE.ACQUIRE", "wallet:cut")
            got = r if isinstance(r, int) else None
        self.assertIsNotNone(got, "never granted after the heal")
        self.assertLess(time.monotonic() - healed, 5, "granted %.1f s after the heal"
                        % (time.monotonic() - healed))
        self.assertGreater(got, t)
        self.assertEqual(int(self.direct.get(hwm_key("wallet:cut"))), got)
        self.assertIn("fence marks connection reset: did not answer within 2000 ms",
                      fg.log())

    def test_a_store_that_refuses_select_fails_closed(self):
        """The store's URL names database 20 of a Redis that has 16: SELECT is refused on the
        marks' connection. The mark would land in database 0, where the store's fenced writes do
        not look; the acquisition fails instead, naming the refusal."""
        other = self.start_redis()
        fg = self.start_fencegate(
            "redis://127.0.0.1:%d/20" % self.redis.port, readyz=False,
            args=["--backend", other.url, "--config",
                  self.write_file("fencegate.yaml", PROTECT)])
        status, _, body = harness.http_request(fg.http_port, "POST", "/v1/locks/wallet:db",
                                               {"ttl_ms": 5000})
        self.assertEqual(status, 503, body)
        self.assertIsNone(self.direct.get(hwm_key("wallet:db")), "mark raised in database 0")
        self.assertIn("SELECT refused: ERR DB index is out of range",
                      fg.log())


class Pipelining(LockTestCase):

    def test_pipelined_acquire_then_fenced_writes_in_order(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        c.send(encode("FENCE.ACQUIRE", "wallet:p") + encode("SET", "wallet:p", "a") +
               encode("APPEND", "wallet:p", "b") + encode("FENCE.TOKEN", "wallet:p") +
               encode("GET", "wallet:p") + encode("INCR", "plain:n") +
               encode("FENCE.RELEASE", "wallet:p") + encode("SET", "wallet:p", "z") +
               encode("PING"))
        replies = [c.read_reply() for _ in range(9)]
        t = replies[0]
        self.assertIsInstance(t, int, replies)
        self.assertEqual(replies[1:7], ["OK", 2, t, b"ab", 1, 1], replies)
        self.assertIsInstance(replies[7], Err, replies)
        self.assertTrue(replies[7].startswith("NOLOCK"), replies[7])
        self.assertEqual(replies[8], "PONG")
        self.assertEqual(self.direct.get("wallet:p"), b"ab")
        self.assertEqual(int(self.direct.get(hwm_key("wallet:p"))), t)

    def test_metrics_count_acquired_busy_released(self):
        fg = self.fencegate()
        m0 = fg.metrics()
        a = self.raw(fg.resp_port)
        b = self.raw(fg.resp_port)
        self.acquire(a, "m1")
        self.acquire(a, "m2")
        r = b.call("FENCE.ACQUIRE", "m1", "WAIT", 0)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)
        self.assertEqual(a.call("FENCE.RELEASE", "m1"), 1)
        a.close()  # releases m2
        harness.wait_until(lambda: self.direct.exists(lock_key("m2")) == 0, 2, 0.02, "m2 freed")

        def delta(name):
            return fg.metrics().get(name, 0.0) - m0.get(name, 0.0)
        self.assertEqual(delta("fencegate_locks_acquired_total"), 2)
        self.assertEqual(delta("fencegate_locks_busy_total"), 1)
        harness.wait_until(lambda: delta("fencegate_locks_released_total") == 2, 2, 0.05,
                           "locks_released_total +2")
        m = fg.metrics()
        self.assertGreaterEqual(m.get("fencegate_lock_wait_seconds_count", 0) -
                                m0.get("fencegate_lock_wait_seconds_count", 0), 2)
        self.assertGreaterEqual(m.get("fencegate_lock_hold_seconds_count", 0) -
                                m0.get("fencegate_lock_hold_seconds_count", 0), 2)



class Forwarder:
    """A TCP address in front of a Redis, as a virtual IP or a Kubernetes Service is in front of
    whichever server is primary: each new connection goes to the port `target` names when it is
    accepted; connections already made stay with their server, as connection tracking keeps
    them. Stopped by the test's cleanup."""

    def __init__(self, target):
        self.target = target
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.done = threading.Event()
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.done.is_set():
            if not select.select([self.lsock], [], [], 0.1)[0]:
                continue
            try:
                c, _ = self.lsock.accept()
                u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                continue
            self.socks += [c, u]
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()

    def _pipe(self, a, b):
        while not self.done.is_set():
            try:
                ready = select.select([a, b], [], [], 0.1)[0]
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    (b if s is a else a).sendall(data)
            except OSError:
                break
        for s in (a, b):
            s.close()

    def close(self):
        self.done.set()
        self.lsock.close()


class Failover(LockTestCase):
    """The lock Redis fails over behind one address (a virtual IP, a Service): the old primary,
    now a replica, answers -READONLY on the connection the sidecar still has to it."""

    def test_a_backend_that_became_a_replica_is_left_for_the_address_new_primary(self):
        old, new = self.start_redis(), self.start_redis()
        vip = Forwarder(old.port)
        self.addCleanup(vip.close)
        fg = self.fencegate("--backend", "redis://127.0.0.1:%d" % vip.port)
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:f1")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:f1"), 1)
        h = self.raw(fg.resp_port)
        self.acquire(h, "wallet:held")  # a lease of 10 s, renewed every 3.3 s
        # The failover: the old primary follows the new one (which never had the lock: its
        # replica lagged), and the address leads there.
        old.client().execute_command("REPLICAOF", "127.0.0.1", str(new.port))
        vip.target = new.port
        # An acquisition that meets the old primary is refused saying why, or waits for the
        # new one; soon every acquisition is granted there (before: -READONLY for as long as
        # the sidecar's connection to the old primary lasted).
        r = c.call("FENCE.ACQUIRE", "wallet:f2", "WAIT", 3000, timeout=10)
        self.assertTrue(isinstance(r, int) or "READONLY" in r, r)

        def granted():
            r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "wallet:f3", "WAIT", 0)
            return isinstance(r, int) and r > 0
        harness.wait_until(granted, 5, 0.2, "an acquisition on the new primary")
        self.assertEqual(new.client().exists(lock_key("wallet:f3")), 1)
        # The lock held across it is reported lost by its next renewal, made on the new primary
        # (before: held until its lease ran out, renewals refused -READONLY on the old one).
        harness.wait_until(lambda: h.call("FENCE.LOCKS")[0][3] == b"lost", 5, 0.1,
                           "wallet:held reported lost")


class BackendLog(LockTestCase):
    """An operator learns from the log that the lock Redis is gone, and why, as with etcd: at
    once, then once per 30 s while it lasts, not from each application's error alone."""

    def test_a_lock_redis_that_goes_away_is_logged_once_with_the_reason(self):
        locks = self.start_redis()
        fg = self.fencegate("--backend", locks.url)
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:d1")
        locks.kill()
        where = "lock backend: redis 127.0.0.1:%d" % locks.port

        def lines():
            return [ln for ln in fg.log().splitlines() if where in ln]
        harness.wait_until(lambda: lines(), 3, 0.05, "a log line naming the lock Redis")
        time.sleep(2.5)  # reconnects fail every 0.1..1.6 s meanwhile
        got = lines()
        self.assertEqual(len(got), 1, got)
        self.assertIn("warn", got[0])
        self.assertRegex(got[0], "connection closed|connect failed", got[0])
        locks.start()

        def granted():
            r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "wallet:d2", "WAIT", 0)
            return isinstance(r, int)
        harness.wait_until(granted, 10, 0.2, "an acquisition once the lock Redis is back")


class SlowNameService(LockTestCase):
    """The lock Redis' host name is looked up off the event loop: a DNS server that stops
    answering fails acquisitions, saying why, but never stalls the store's pass-through."""

    def test_a_stalled_lookup_of_the_lock_redis_leaves_the_sidecar_answering(self):
        locks = self.start_redis()
        dns = self.slow_dns()
        fg = self.fencegate("--backend", "redis://locks.fgtest:%d" % locks.port, env=dns.env())
        c = self.raw(fg.resp_port)
        self.acquire(c, "dns:warm")
        self.assertEqual(c.call("FENCE.RELEASE", "dns:warm"), 1)
        self.assertEqual(c.call("SET", "k", "v"), "OK")
        # The lock connection and the subscriber end; both connect again, looking the name up
        # again, and the name service now takes 8 s to answer.
        dns.stall("locks.fgtest", 8000)
        admin = locks.client()
        self.addCleanup(admin.close)
        admin.client_kill_filter(_type="normal")
        admin.client_kill_filter(_type="pubsub")
        conn = self.raw(fg.resp_port)
        poller = harness.PromptPoller(fg, lambda: conn.call("GET", "k") == b"v")
        poller.start()
        # An acquisition fails within its deadline (op_timeout 2 s at most), naming the backend.
        t0 = time.monotonic()
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "dns:x", "WAIT", 500, timeout=10)
        took = time.monotonic() - t0
        self.assertIsInstance(r, Err, "granted during the stall: %r" % (r,))
        self.assertTrue(r.startswith("UNAVAILABLE ") and "locks.fgtest" in r, r)
        self.assertLess(took, 2.5, "the acquire took %.2f s" % took)
        poller.join()
        self.assertLess(poller.worst, 1.0, "a request waited on the stalled lookup")
        # Once a lookup gave up, the acquisitions say so.
        time.sleep(1.0)
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "dns:x", "WAIT", 0, timeout=10)
        self.assertTrue(isinstance(r, Err) and "resolving 'locks.fgtest' timed out" in r, r)
        # The name service answers again: the backend is back without a restart.
        dns.stall("locks.fgtest", 0)

        def granted():
            r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "dns:x", "WAIT", 0, timeout=10)
            return isinstance(r, int) and r > 0
        harness.wait_until(granted, 15, 0.2, "an acquisition after the stall")
        self.assertEqual(c.call("GET", "k"), b"v")


if __name__ == "__main__":
    unittest.main()
