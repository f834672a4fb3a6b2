"""Locks on the etcd backend (DESIGN.md §4, issue 4) against a real etcd 3.4: the token is the lock
key's create_revision; waiters are served first come, first served; try-once leaves nothing
behind; `etcdctl lock` and fencegate exclude each other; a killed sidecar's locks come free
within the session lease; a frozen holder's writes are refused at the store; a lease revoked
behind fencegate's back makes its locks lost at once, and so does a held key deleted or overwritten
(its watch, one stream for every key), also on an etcd restored from an older snapshot (whose
revisions went back, and which brings back keys released since: they are deleted); a 3-member
cluster loses its leader while locks are held and waited for, and no lock is ever granted twice."""

import json
import os
import re
import signal
import threading
import time
import unittest
import urllib.request

import harness
from etcd_harness import EtcdTestCase, make_certs
from harness import Err

PREFIX = "/fencegate/locks/"
PROTECT = 'protect:\n  - { store: redis, keys: "wallet:*", lock: "wallet:$1" }\n'


class EtcdLocks(EtcdTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)
        self.etcd = self.start_etcd(1)

    def fencegate(self, *extra, config=PROTECT, **kw):
        args = list(extra)
        if config:
            args += ["--config", self.write_file("fg-%d.yaml" % len(self._fg_procs), config)]
        return self.start_fg_etcd(self.redis, self.etcd, args=args, **kw)

    def acquire(self, conn, name, *opts, timeout=None):
        r = conn.call("FENCE.ACQUIRE", name, *opts, timeout=timeout)
        self.assertIsInstance(r, int, "FENCE.ACQUIRE %s %s got %r" % (name, opts, r))
        return r

    def test_token_is_the_keys_create_revision_under_the_session_lease(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:1")
        keys = self.etcd.keys(PREFIX + "wallet:1/")
        self.assertEqual(len(keys), 1, keys)
        key, rev, lease = keys[0]
        self.assertEqual(rev, t, "the token must be the key's create_revision")
        self.assertEqual(key, PREFIX + "wallet:1/%x" % lease, "etcd's mutex key layout")
        # The fenced write goes through and the next acquisition (after release) is larger.
        self.assertEqual(c.call("SET", "wallet:1", "a"), "OK")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:1"), 1)
        self.assertEqual(self.etcd.keys(PREFIX + "wallet:1/"), [], "release deletes the key")
        t2 = self.acquire(c, "wallet:1")
        self.assertGreater(t2, t)
        # Two locks of one connection share the session's lease: one keepalive renews both.
        self.acquire(c, "wallet:2")
        leases = {k[2] for k in self.etcd.keys(PREFIX)}
        self.assertEqual(len(leases), 1, "one lease per session: %r" % leases)

    def etcd_txns(self):
        """Txn requests etcd has answered (its own /metrics)."""
        url = "http://%s/metrics" % self.etcd.members[0].endpoint
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("grpc_server_handled_total") and '"Txn"' in line)

    @staticmethod
    def burst(conns, cmds):
        """Sends each connection its command at once (so they meet in one turn of fencegate's
        event loop, mostly), then reads every reply."""
        for c, cmd in zip(conns, cmds):
            c.send(harness.encode(*cmd))
        return [c.read_reply(timeout=10) for c in conns]

    def test_acquires_and_releases_of_different_locks_go_to_etcd_as_one_txn(self):
        fg = self.fencegate(config=None)
        n = 16
        conns = [self.raw(fg.resp_port) for _ in range(n)]
        for c in conns:
            self.assertEqual(c.call("PING"), "PONG")
        ops = shared = 0
        txns0 = self.etcd_txns()
        for rnd in range(10):
            tokens = self.burst(conns, [("FENCE.ACQUIRE", "b%d" % i) for i in range(n)])
            for i, t in enumerate(tokens):
                self.assertIsInstance(t, int, "b%d: %r" % (i, t))
            if rnd == 0:  # each token is its key's create_revision, shared or not
                revs = {k[0].split("/")[-2]: k[1] for k in self.etcd.keys(PREFIX)}
                self.assertEqual([revs["b%d" % i] for i in range(n)], tokens)
            shared += n - len(set(tokens))
            self.assertEqual(self.burst(conns, [("FENCE.RELEASE", "b%d" % i) for i in range(n)]),
                             [1] * n)
            ops += 2 * n
        self.assertEqual(self.etcd.keys(PREFIX), [])
        m = fg.metrics()
        self.assertGreater(m.get("fencegate_lock_backend_batches_total", 0), 0)
        self.assertGreater(shared, 0, "no two acquisitions shared a revision")
        self.assertLess(self.etcd_txns() - txns0, ops, "every acquire and release had a Txn")

    def test_an_etcd_that_refuses_a_txn_for_its_size_gets_smaller_ones(self):
        # etcd --max-txn-ops 8: sixteen acquisitions sent as one Txn (16 compares, 32 puts and
        # ranges) are refused whole, "too many operations"; each goes again alone, and later Txns
        # carry half as many members until etcd takes them (four acquisitions, eight releases).
        small = self.start_etcd(1, extra_args=("--max-txn-ops", "8"))
        fg = self.start_fg_etcd(self.redis, small)
        n = 16
        conns = [self.raw(fg.resp_port) for _ in range(n)]
        for c in conns:
            self.assertEqual(c.call("PING"), "PONG")
        shared = None
        for rnd in range(12):  # from round 3 on, until a burst met in one turn (a busy CI seldom)
            tokens = self.burst(conns, [("FENCE.ACQUIRE", "m%d" % i) for i in range(n)])
            for i, t in enumerate(tokens):
                self.assertIsInstance(t, int, "round %d, m%d: %r" % (rnd, i, t))
            self.assertEqual(self.burst(conns, [("FENCE.RELEASE", "m%d" % i) for i in range(n)]),
                             [1] * n)
            if rnd < 3:
                continue
            self.assertLessEqual(max(tokens.count(t) for t in tokens), 4,
                                 "more acquisitions in one Txn than etcd takes: %r" % tokens)
            if len(set(tokens)) < n:
                shared = tokens
                break
        self.assertEqual(small.keys(PREFIX), [])
        self.assertIsNotNone(shared, "after the refusals no Txn went as one")

    def test_a_burst_on_one_lock_still_grants_it_to_one_holder_at_a_time(self):
        # Txns of one lock never go as one: their keys would share a create_revision, by which
        # the mutex orders its waiters. Each round, five waiting acquisitions of "one" meet with
        # five of other locks; then the holders of "one" release in turn, and each time exactly
        # one waiter is granted, with a token above the last.
        fg = self.fencegate(config=None)
        same = [self.raw(fg.resp_port, timeout=20) for _ in range(5)]
        other = [self.raw(fg.resp_port) for _ in range(5)]
        last = 0
        for rnd in range(4):
            for c in same:
                c.send(harness.encode("FENCE.ACQUIRE", "one", "WAIT", 15000))
            for i, c in enumerate(other):
                c.send(harness.encode("FENCE.ACQUIRE", "o%d" % i))
            for c in other:
                self.assertIsInstance(c.read_reply(timeout=10), int)
            waiting = list(same)
            while waiting:
                got = {}
                deadline = time.monotonic() + 10
                while not got and time.monotonic() < deadline:
                    got = {c: c.read_available(0.01) for c in waiting}
                    got = {c: r for c, r in got.items() if r}
                for c in waiting:  # a moment more: nobody else may be granted meanwhile
                    if c not in got:
                        r = c.read_available(0.05)
                        if r:
                            got[c] = r
                self.assertEqual(len(got), 1, "round %d: granted at once: %r" % (
                    rnd, list(got.values())))
                (holder, reply), = got.items()
                self.assertTrue(reply.startswith(b":"), reply)
                token = int(reply[1:].split(b"\r\n")[0])
                self.assertGreater(token, last)
                last = token
                waiting.remove(holder)
                self.assertEqual(holder.call("FENCE.RELEASE", "one"), 1)
            for i, c in enumerate(other):
                self.assertEqual(c.call("FENCE.RELEASE", "o%d" % i), 1)
        self.assertGreater(fg.metrics().get("fencegate_lock_backend_batches_total", 0), 0)
        self.assertEqual(self.etcd.keys(PREFIX), [])

    def test_a_lock_and_one_under_its_name_never_share_a_revision(self):
        # "p/" covers the keys of p/q too, so p queues behind p/q's holders (etcd's mutex): the
        # two never go as one Txn, r goes with either.
        fg = self.fencegate(config=None)
        cp, cq, cr = (self.raw(fg.resp_port, timeout=20) for _ in range(3))
        for rnd in range(10):
            cp.send(harness.encode("FENCE.ACQUIRE", "p", "WAIT", 10000))
            cq.send(harness.encode("FENCE.ACQUIRE", "p/q", "WAIT", 10000))
            cr.send(harness.encode("FENCE.ACQUIRE", "r"))
            tq, tr = cq.read_reply(timeout=10), cr.read_reply(timeout=10)
            self.assertIsInstance(tq, int, tq)
            self.assertIsInstance(tr, int, tr)
            self.assertEqual(cq.call("FENCE.RELEASE", "p/q"), 1)
            tp = cp.read_reply(timeout=10)
            self.assertIsInstance(tp, int, "round %d: %r" % (rnd, tp))
            self.assertNotEqual(tp, tq)
            self.assertEqual(cp.call("FENCE.RELEASE", "p"), 1)
            self.assertEqual(cr.call("FENCE.RELEASE", "r"), 1)
        self.assertGreater(fg.metrics().get("fencegate_lock_backend_batches_total", 0), 0)

    def test_a_lease_gone_under_one_member_of_a_shared_txn_leaves_the_others_alone(self):
        # etcd refuses a Txn whole when one put names a lease it no longer has: each member goes
        # again alone, so only the session whose lease is gone loses its locks (and starts over
        # on a new lease); the other's Txn and its held lock are untouched.
        fg = self.fencegate("--session-ttl-ms", "30000", config=None)
        a, b = self.raw(fg.resp_port), self.raw(fg.resp_port)
        for rnd in range(20):  # until the two meet in one turn of the loop (a busy CI seldom)
            self.acquire(a, "mine%d" % rnd)
            self.acquire(b, "held%d" % rnd)
            lease_a = self.etcd.keys(PREFIX + "mine%d/" % rnd)[0][2]
            self.etcd.ctl("lease", "revoke", "%x" % lease_a)
            before = fg.metrics().get("fencegate_lock_backend_batches_total", 0)
            ta, tb = self.burst([a, b], [("FENCE.ACQUIRE", "x%d" % rnd),
                                         ("FENCE.ACQUIRE", "y%d" % rnd)])
            self.assertIsInstance(ta, int, ta)
            self.assertIsInstance(tb, int, tb)
            held = {bytes(e[0]): e[3] for e in b.call("FENCE.LOCKS")}
            self.assertEqual(held.get(b"held%d" % rnd), b"held", held)
            self.assertEqual(len(self.etcd.keys(PREFIX + "held%d/" % rnd)), 1)
            self.assertIsNone(a.call("FENCE.TOKEN", "mine%d" % rnd))
            if fg.metrics().get("fencegate_lock_backend_batches_total", 0) > before:
                break
        else:
            self.fail("the two acquires never went as one Txn")

    def test_a_txn_whose_compare_fails_in_a_shared_one_goes_again_alone(self):
        # A key of the session's lease left over under "left" fails the create's compare: the
        # shared Txn applies nothing, and each member goes again alone (the create with its
        # clean-up of the leftover). Seen from etcd: four Txns instead of three.
        fg = self.fencegate(config=None)
        a, b = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.acquire(a, "mine")
        lease = self.etcd.keys(PREFIX + "mine/")[0][2]
        via_shared = 0
        for rnd in range(20):
            self.etcd.ctl("put", "--lease=%x" % lease, PREFIX + "left/%x" % lease, "")
            planted = self.etcd.keys(PREFIX + "left/")[0][1]
            txns = self.etcd_txns()
            ta, tb = self.burst([a, b], [("FENCE.ACQUIRE", "left"), ("FENCE.ACQUIRE", "d")])
            self.assertIsInstance(ta, int, ta)
            self.assertIsInstance(tb, int, tb)
            self.assertGreater(ta, planted)
            self.assertEqual(self.etcd.keys(PREFIX + "left/"), [(PREFIX + "left/%x" % lease, ta,
                                                                 lease)])
            via_shared += self.etcd_txns() - txns == 4
            self.assertEqual(a.call("FENCE.RELEASE", "left"), 1)
            self.assertEqual(b.call("FENCE.RELEASE", "d"), 1)
            if via_shared >= 2:
                break
        self.assertGreaterEqual(via_shared, 1, "the two creates never went as one")

    def test_backend_prefix_sets_the_key_prefix(self):
        fg = self.fencegate("--backend-prefix", "/myapp/locks/")
        t = self.acquire(self.raw(fg.resp_port), "p1")
        self.assertEqual([k[1] for k in self.etcd.keys("/myapp/locks/p1/")], [t])
        self.assertEqual(self.etcd.keys(PREFIX), [])

    def test_waiters_are_served_in_arrival_order(self):
        fg = self.fencegate()
        holder = self.raw(fg.resp_port)
        t0 = self.acquire(holder, "q")
        waiters = [self.raw(fg.resp_port, timeout=20) for _ in range(4)]
        for i, w in enumerate(waiters):
            w.send(harness.encode("FENCE.ACQUIRE", "q", "WAIT", 15000))
            # Each waiter's key must exist before the next one queues.
            harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "q/")) == i + 2, 5, 0.02,
                               "waiter %d queued" % i)
        self.assertEqual(len(self.etcd.keys(PREFIX + "q/")), 5)
        self.assertEqual(holder.call("FENCE.RELEASE", "q"), 1)
        tokens = []
        for i, w in enumerate(waiters):
            r = w.read_reply(timeout=10)
            self.assertIsInstance(r, int, "waiter %d got %r" % (i, r))
            tokens.append(r)
            # Nobody else may have it meanwhile: the next waiter is still waiting.
            if i + 1 < len(waiters):
                self.assertEqual(waiters[i + 1].read_available(0.2), b"",
                                 "waiter %d was granted while %d held the lock" % (i + 1, i))
            self.assertEqual(w.call("FENCE.RELEASE", "q"), 1)
        self.assertEqual(tokens, sorted(tokens), "FIFO: tokens in arrival order")
        self.assertGreater(tokens[0], t0)

    def test_try_once_leaves_no_key_behind(self):
        fg = self.fencegate()
        a, b = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.acquire(a, "t1")
        r = b.call("FENCE.ACQUIRE", "t1", "WAIT", 0)
        self.assertIsInstance(r, Err)
        self.assertTrue(r.startswith("LOCKED"), r)
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "t1/")) == 1, 3, 0.05,
                           "the try-once key removed")
        # A short wait ends LOCKED too, and leaves nothing behind either.
        r = b.call("FENCE.ACQUIRE", "t1", "WAIT", 300, timeout=5)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "t1/")) == 1, 3, 0.05,
                           "the timed-out waiter's key removed")

    def test_etcdctl_lock_and_fencegate_exclude_each_other(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port, timeout=20)
        # etcdctl holds it: fencegate must wait.
        p = self.etcd.ctl_popen("lock", PREFIX + "x", "sleep", "2")
        self.addCleanup(lambda: p.poll() is None and p.kill())
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "x/")) == 1, 5, 0.05,
                           "etcdctl to take the lock")
        ctl_rev = self.etcd.keys(PREFIX + "x/")[0][1]
        r = c.call("FENCE.ACQUIRE", "x", "WAIT", 0)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)
        t0 = time.monotonic()
        t = self.acquire(c, "x", "WAIT", 10000, timeout=15)
        self.assertGreater(time.monotonic() - t0, 0.5, "granted while etcdctl held it")
        self.assertEqual(p.wait(10), 0)
        self.assertGreater(t, ctl_rev)
        # fencegate holds it: etcdctl must wait until it is released.
        p2 = self.etcd.ctl_popen("lock", PREFIX + "x")
        self.addCleanup(lambda: p2.poll() is None and p2.kill())
        got = []
        threading.Thread(target=lambda: got.append(p2.stdout.readline()), daemon=True).start()
        time.sleep(1.5)
        self.assertEqual(got, [], "etcdctl got the lock fencegate holds")
        self.assertEqual(c.call("FENCE.RELEASE", "x"), 1)
        harness.wait_until(lambda: got, 5, 0.05, "etcdctl to get the lock after the release")
        self.assertTrue(got[0].startswith((PREFIX + "x/").encode()), got)

    def test_killed_sidecar_frees_its_locks_within_the_session_lease(self):
        a = self.fencegate("--session-ttl-ms", "2000")
        b = self.fencegate("--session-ttl-ms", "2000")
        ca = self.raw(a.resp_port)
        t1 = self.acquire(ca, "k9")
        a.proc.kill()
        a.proc.wait(5)
        cb = self.raw(b.resp_port, timeout=15)
        t0 = time.monotonic()
        t2 = self.acquire(cb, "k9", "WAIT", 10000, timeout=15)
        waited = time.monotonic() - t0
        self.assertLess(waited, 2.0 + 1.5, "the lease (2 s) should have freed it")
        self.assertGreater(t2, t1)

    def test_frozen_holder_is_refused_at_the_store(self):
        a = self.fencegate("--session-ttl-ms", "1000")
        b = self.fencegate("--session-ttl-ms", "1000")
        ca, cb = self.raw(a.resp_port, timeout=15), self.raw(b.resp_port, timeout=15)
        t1 = self.acquire(ca, "wallet:7")
        self.assertEqual(ca.call("SET", "wallet:7", "from-a"), "OK")
        # Queue A's next write, then freeze A before it can run it.
        self.freeze(a)
        ca.send(harness.encode("SET", "wallet:7", "stale-a"))
        t2 = self.acquire(cb, "wallet:7", "WAIT", 10000, timeout=15)
        self.assertGreater(t2, t1)
        self.assertEqual(cb.call("SET", "wallet:7", "from-b"), "OK")
        a.signal(__import__("signal").SIGCONT)
        r = ca.read_reply(timeout=10)
        self.assertIsInstance(r, Err, "the frozen holder's write was accepted: %r" % (r,))
        self.assertTrue(r.startswith(("STALE", "LOCKLOST")), r)
        self.assertEqual(self.direct.get("wallet:7"), b"from-b")

    def test_a_grant_answered_after_the_lease_is_confirmed_within_the_wait(self):
        # etcd's answers are held up (dropped here, then sent again) for longer than the
        # session's lease while an acquisition with a WAIT is in flight: etcd applied it, and
        # its grant comes back with the lease last confirmed too long ago to be reported. Our
        # key heads the queue, so the sidecar has the lease confirmed and answers the token,
        # rather than -UNAVAILABLE to a caller who said it would wait.
        fg = self.fencegate("--session-ttl-ms", "1000")
        c = self.raw(fg.resp_port, timeout=15)
        self.acquire(c, "wallet:warm")  # the session's lease exists
        heal = self.cut_answers(self.etcd.members[0])
        c.send(harness.encode("FENCE.ACQUIRE", "wallet:late", "WAIT", 8000))
        time.sleep(1.2)
        heal()
        r = c.read_reply(timeout=12)
        self.assertIsInstance(r, int, r)
        state = {lk[0]: lk[3] for lk in c.call("FENCE.LOCKS")}
        self.assertEqual(state[b"wallet:late"], b"held", state)
        self.assertEqual(c.call("SET", "wallet:late", "v"), "OK")
        keys = self.etcd.keys(PREFIX + "wallet:late/")
        self.assertEqual([k[1] for k in keys], [r], "one key, the token's")

    def test_a_store_mark_lost_in_a_failover_gives_the_lock_up_and_frees_its_key(self):
        # etcd keeps the lock, the store Redis fails over to a replica that missed the raise
        # fence on acquire made: the write is refused (a former holder may have written with the
        # mark back at its token), the lock given up at once (its session lease lives on), its
        # key deleted from etcd, and acquiring again yields a new revision and a new mark.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:q")
        mark = "fencegate:hwm:{wallet:q}"
        self.assertEqual(self.direct.get(mark), str(t).encode())
        self.direct.set(mark, t - 1)
        r = c.call("SET", "wallet:q", "x")
        self.assertIsInstance(r, Err)
        self.assertTrue(r.startswith("LOCKLOST lock wallet:q (token %d) is above its high-water "
                                     "mark %d" % (t, t - 1)), r)
        self.assertIsNone(self.direct.get("wallet:q"))
        harness.wait_until(lambda: self.etcd.keys(PREFIX + "wallet:q/") == [], 3, 0.05,
                           "the given-up lock's key deleted from etcd")
        t2 = self.acquire(c, "wallet:q", "WAIT", 0)
        self.assertGreater(t2, t)
        self.assertEqual(self.direct.get(mark), str(t2).encode())
        self.assertEqual(c.call("SET", "wallet:q", "y"), "OK")

    def test_an_etcd_whose_revisions_went_back_is_refused_and_logged(self):
        # etcd started anew (its data lost) or restored from an old snapshot: its revisions are
        # below the marks the store keeps. etcd cannot raise them, so every acquisition is
        # refused, and the operator must learn why from the log (DESIGN.md: "logs it"), once per
        # 10 s, not from each application's error alone.
        fg = self.fencegate()
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:old")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:old"), 1)
        self.direct.set("fencegate:hwm:{wallet:old}", t + 1000)  # as before the wipe
        for _ in range(3):
            r = c.call("FENCE.ACQUIRE", "wallet:old")
            self.assertIsInstance(r, Err)
            self.assertTrue(r.startswith("UNAVAILABLE ") and "is not above the stores' mark %d"
                            % (t + 1000) in r, r)
        self.assertEqual(self.etcd.keys(PREFIX + "wallet:old/"), [], "a refused grant's key")
        harness.wait_until(lambda: "went back" in self.fg_log(fg), 2, 0.05, "the log line")
        lines = [ln for ln in self.fg_log(fg).splitlines() if "went back" in ln]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("lock wallet:old: token", lines[0])
        self.assertIn("warn", lines[0])
        self.assertEqual(fg.metrics().get("fencegate_token_regressions_total"), 3)

    def test_lease_revoked_behind_our_back_loses_every_lock_of_the_session(self):
        fg = self.fencegate("--session-ttl-ms", "3000")
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:a")
        self.acquire(c, "wallet:b")
        lease = self.etcd.keys(PREFIX + "wallet:a/")[0][2]
        self.etcd.ctl("lease", "revoke", "%x" % lease)
        # The next keepalive (every ttl/3 = 1 s) says the lease is gone.
        def lost():
            locks = c.call("FENCE.LOCKS")
            return all(x[3] == b"lost" for x in locks) and len(locks) == 2
        harness.wait_until(lost, 3, 0.1, "both locks reported lost")
        r = c.call("SET", "wallet:a", "x")
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKLOST"), r)
        self.assertIsNone(self.direct.get("wallet:a"))

    # ---- a held key that goes away in etcd (the session's watch on its own keys) ----

    def etcd_metric(self, name, etcd=None):
        """A gauge or counter from etcd's own /metrics (0 when absent)."""
        m = (etcd or self.etcd).members[0]
        text = urllib.request.urlopen("http://%s/metrics" % m.endpoint, timeout=5).read()
        return harness.parse_metrics(text.decode()).get(name, 0)

    def assert_lost_soon(self, c, name, within=1.0):
        """FENCE.TOKEN of name turns nil within `within` seconds, and the next fenced write
        under it is refused LOCKLOST."""
        harness.wait_until(lambda: c.call("FENCE.TOKEN", name) is None, within, 0.01,
                           "lock %s reported lost" % name)
        r = c.call("SET", name, "after")
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKLOST"), r)

    def test_a_key_deleted_behind_the_holders_back_is_lost_at_once(self):
        # The keepalive proves the lease (30 s here), not the key: the watch on the session's
        # own keys sees `etcdctl del` and reports that lock lost at once, as a failed renewal
        # does (callback, log line, metric); the session's other lock is untouched.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        ta = self.acquire(c, "wallet:a")
        tb = self.acquire(c, "wallet:b")
        self.assertEqual(c.call("SET", "wallet:a", "1"), "OK")
        key = self.etcd.keys(PREFIX + "wallet:a/")[0][0]
        self.etcd.ctl("del", key)
        self.assert_lost_soon(c, "wallet:a")
        self.assertEqual(self.direct.get("wallet:a"), b"1")
        self.assertEqual(sorted((x[0], x[3]) for x in c.call("FENCE.LOCKS")),
                         [(b"wallet:a", b"lost"), (b"wallet:b", b"held")])
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:b"), tb)
        self.assertEqual(c.call("SET", "wallet:b", "2"), "OK")
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total"), 1)
        line = [ln for ln in self.fg_log(fg).splitlines() if "lost:" in ln]
        self.assertEqual(len(line), 1, line)
        self.assertIn("lock wallet:a (token %d) lost: its key was deleted in etcd" % ta, line[0])
        # The name is free for others at once, and its next token is larger.
        other = self.raw(self.fencegate().resp_port)
        self.assertGreater(self.acquire(other, "wallet:a", "WAIT", 0), ta)

    def test_a_key_overwritten_behind_the_holders_back_is_lost_and_freed(self):
        # `etcdctl put` on the key detaches it from the session's lease: the lock is no longer
        # this session's (its lease no longer keeps or ends it), so it is lost at once, and the
        # key (its create_revision still the token) is deleted, as for any lock lost: left
        # there without a lease it would head the queue for ever.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "wallet:o")
        key, rev, lease = self.etcd.keys(PREFIX + "wallet:o/")[0]
        self.etcd.ctl("put", key, "taken")
        self.assert_lost_soon(c, "wallet:o")
        harness.wait_until(lambda: self.etcd.keys(PREFIX + "wallet:o/") == [], 3, 0.05,
                           "the overwritten key deleted")
        self.assertIn("lock wallet:o (token %d) lost: its key was overwritten" % t,
                      self.fg_log(fg))

    def test_a_key_deleted_while_its_fence_on_acquire_runs_fails_the_acquire_naming_it(self):
        # The store holds fence on acquire back (CLIENT PAUSE WRITE) while the granted key is
        # deleted in etcd; its watch (100 ms after the grant) sees it before the fence is done.
        # The acquire fails, and says what happened: the key was deleted, not that a lease of
        # 30 s ran out. Nothing is handed out, and the name is free.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port, timeout=10)
        self.direct.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        c.send(harness.encode("FENCE.ACQUIRE", "wallet:f"))
        keys = harness.wait_until(lambda: self.etcd.keys(PREFIX + "wallet:f/"), 1, 0.01,
                                  "the key granted")
        self.etcd.ctl("del", keys[0][0])
        r = c.read_reply(timeout=5)
        self.assertIsInstance(r, Err, r)
        self.assertTrue(r.startswith("UNAVAILABLE lock wallet:f was granted (token %d) but "
                                     "was lost before it could be reported: its key was deleted "
                                     "in etcd at revision " % keys[0][1]), r)
        self.assertNotIn("ran out", r)
        self.assertIsNone(c.call("FENCE.TOKEN", "wallet:f"))
        self.assertGreater(self.acquire(c, "wallet:f", "WAIT", 0), keys[0][1])

    def test_fencectl_command_is_stopped_when_its_key_is_deleted(self):
        fg = self.fencegate()
        p = harness.subprocess.Popen(
            [harness.FENCECTL_BIN, "--http", "127.0.0.1:%d" % fg.http_port, "lock", "job",
             "--ttl", "30000", "--", "sleep", "30"], stdin=harness.subprocess.DEVNULL,
            stdout=harness.subprocess.PIPE, stderr=harness.subprocess.PIPE,
            env=harness.clean_env())
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.stderr.close)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        harness.wait_until(lambda: self.etcd.keys(PREFIX + "job/") != [], 10, 0.05, "job held")
        time.sleep(0.3)  # fencectl has started its command and listens for events
        self.etcd.ctl("del", self.etcd.keys(PREFIX + "job/")[0][0])
        t0 = time.monotonic()
        _, err = p.communicate(timeout=10)
        self.assertEqual(p.returncode, 3, err)
        self.assertIn(b"lost", err)
        self.assertLess(time.monotonic() - t0, 2.0, "fencectl stopped its command late")
        st, doc = harness.http_request(fg.http_port, "GET", "/v1/locks")[::2]
        self.assertEqual([(x["name"], x["state"]) for x in json.loads(doc)["locks"]],
                         [("job", "lost")], doc)

    def fg_etcd_ports(self, fg, etcd_port):
        """The local ports of fg's connections to etcd's client port."""
        out = harness.subprocess.run(
            ["ss", "-tnpH", "state", "established", "( dport = :%d )" % etcd_port],
            capture_output=True, text=True, timeout=10).stdout
        return [int(ln.split()[2].rsplit(":", 1)[1]) for ln in out.splitlines()
                if "pid=%d," % fg.pid in ln]

    def test_a_key_deleted_and_compacted_while_the_watch_was_down_is_still_noticed(self):
        # The DELETE event never reaches the sidecar (etcd's packets to its connection are
        # dropped), etcd compacts past the watch's revision, then the connection is torn down:
        # on the new one the watch cannot resume from where it was (compacted), so the held
        # keys are looked at again, and the lock is lost. The 30 s lease is not what tells.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port)
        self.acquire(c, "wallet:k")
        tkeep = self.acquire(c, "wallet:keep")
        harness.wait_until(lambda: self.etcd_metric("etcd_debugging_mvcc_watcher_total") == 2,
                           5, 0.02, "both keys watched")
        m = self.etcd.members[0]
        ports = self.fg_etcd_ports(fg, m.client_port)
        self.assertEqual(len(ports), 1, ports)
        heal = self.drop_on_loopback(["-s", "127.0.0.1", "--sport", str(m.client_port),
                                      "--dport", str(ports[0])])
        self.etcd.ctl("del", self.etcd.keys(PREFIX + "wallet:k/")[0][0])
        for i in range(3):
            self.etcd.ctl("put", "/other/%d" % i, "x")
        rev = json.loads(self.etcd.ctl("get", "/other/0", "-w", "json"))["header"]["revision"]
        self.etcd.ctl("compact", str(rev))
        time.sleep(0.3)
        self.assertIsNotNone(c.call("FENCE.TOKEN", "wallet:k"),
                             "noticed before the connection came back")
        r = harness.subprocess.run(["ss", "-K", "-tn", "state", "established", "( sport = :%d "
                                    "and dport = :%d )" % (ports[0], m.client_port)],
                                   capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_lost_soon(c, "wallet:k", within=3.0)
        heal()
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:keep"), tkeep)
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total"), 1)

    WATCH_MSGS = ('grpc_server_msg_received_total{grpc_method="Watch",'
                  'grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"}')

    def test_a_lock_held_briefly_costs_etcd_no_watch(self):
        # A held key is watched 100 ms after its grant (from the revision after its creation,
        # so nothing is missed): a lock released sooner sends etcd no watch create or cancel.
        fg = self.fencegate(config=None)
        c = self.raw(fg.resp_port)
        before = self.etcd_metric(self.WATCH_MSGS)
        slow = 0
        for i in range(50):
            t0 = time.monotonic()
            self.acquire(c, "brief")
            self.assertEqual(c.call("FENCE.RELEASE", "brief"), 1)
            slow += time.monotonic() - t0 > 0.09  # a loaded machine may hold one longer
        self.assertLessEqual(self.etcd_metric(self.WATCH_MSGS) - before, 2 * slow)
        before = self.etcd_metric(self.WATCH_MSGS)
        self.acquire(c, "long")
        harness.wait_until(lambda: self.etcd_metric(self.WATCH_MSGS) == before + 1, 2, 0.02,
                           "the held key watched")

    def test_two_hundred_held_locks_share_one_watch_stream_and_are_never_lost_for_nothing(self):
        # 200 locks of one connection: one Watch stream (one watcher per key on it), no false
        # loss over several keepalive rounds, through a compaction and a PUT that keeps the
        # key's lease and revision; released locks stop being watched.
        fg = self.fencegate("--session-ttl-ms", "1500", config=None)
        c = self.raw(fg.resp_port, timeout=20)
        n = 200
        tokens = self.acquire_pipelined(c, ["many:%d" % i for i in range(n)])
        for t in tokens:
            self.assertIsInstance(t, int, t)
        # Each held key is watched 100 ms after its grant.
        harness.wait_until(lambda: self.etcd_metric("etcd_debugging_mvcc_watcher_total") == n,
                           5, 0.05, "one watcher per held key")
        self.assertEqual(self.etcd_metric("etcd_debugging_mvcc_watch_stream_total"), 1)
        key, _, lease = self.etcd.keys(PREFIX + "many:7/")[0]
        self.etcd.ctl("put", key, "note", "--lease=%x" % lease)
        rev = json.loads(self.etcd.ctl("get", key, "-w", "json"))["header"]["revision"]
        self.etcd.ctl("compact", str(rev))
        time.sleep(4)  # eight keepalive rounds of the 1.5 s lease
        locks = c.call("FENCE.LOCKS")
        self.assertEqual(sorted(x[3] for x in locks), [b"held"] * n)
        self.assertEqual([c.call("FENCE.TOKEN", "many:%d" % i) for i in range(n)], tokens)
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total", 0), 0)
        self.assertNotIn("lost", self.fg_log(fg))
        for i in range(0, n, 2):
            c.send(harness.encode("FENCE.RELEASE", "many:%d" % i))
        self.assertEqual([c.read_reply(timeout=10) for _ in range(0, n, 2)], [1] * (n // 2))
        harness.wait_until(
            lambda: self.etcd_metric("etcd_debugging_mvcc_watcher_total") == n // 2, 5, 0.1,
            "released locks no longer watched")
        c.close()
        harness.wait_until(lambda: self.etcd_metric("etcd_debugging_mvcc_watcher_total") == 0,
                           5, 0.1, "a closed session's locks no longer watched")
        self.assertEqual(self.etcd_metric("etcd_debugging_mvcc_watch_stream_total"), 1)

    def test_watches_ended_by_a_compaction_are_cancelled_in_etcd(self):
        # etcd compacted past the revisions the held keys' watches start from as they were
        # created: etcd ends each such watch (compact_revision) but keeps it, counted, until
        # the client cancels it. fencegate cancels it, reads the key and watches it again, so
        # etcd ends with one watcher per held key, and none once they are released.
        fg = self.fencegate("--session-ttl-ms", "3000", config=None)
        c = self.raw(fg.resp_port, timeout=20)
        n = 100
        tokens = self.acquire_pipelined(c, ["comp:%d" % i for i in range(n)])
        self.etcd.ctl("compact", str(max(tokens)))  # before most watches are created
        time.sleep(1)  # each is created 100 ms after its grant, then compacted, then again
        harness.wait_until(lambda: self.watchers() == n, 5, 0.1, "one watcher per held key")
        self.assertEqual(sorted(x[3] for x in c.call("FENCE.LOCKS")), [b"held"] * n)
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total", 0), 0)
        for i in range(n):
            c.send(harness.encode("FENCE.RELEASE", "comp:%d" % i))
        self.assertEqual([c.read_reply(timeout=10) for _ in range(n)], [1] * n)
        harness.wait_until(lambda: self.watchers() == 0, 5, 0.1,
                           "released locks no longer watched")

    def acquire_pipelined(self, c, names):
        """Sends FENCE.ACQUIRE for every name at once on c; returns the tokens, in order."""
        for name in names:
            c.send(harness.encode("FENCE.ACQUIRE", name))
        return [c.read_reply(timeout=20) for _ in names]

    def watchers(self, etcd=None):
        return self.etcd_metric("etcd_debugging_mvcc_watcher_total", etcd)

    def test_held_keys_are_watched_again_after_etcd_restarts_with_its_data(self):
        # etcd restarts with its data: the watch stream ends with the connection; on the new
        # one each held key is read again (still there: nothing lost) and watched again, so a
        # key deleted after the restart is still lost at once, the other left held.
        fg = self.fencegate("--session-ttl-ms", "30000", readyz=True)
        c = self.raw(fg.resp_port, timeout=10)
        ta, tb = self.acquire(c, "wallet:r1"), self.acquire(c, "wallet:r2")
        harness.wait_until(lambda: self.watchers() == 2, 5, 0.02, "both keys watched")
        m = self.etcd.members[0]
        m.stop()
        m.start(state="existing")
        harness.wait_until(m.healthy, 15, 0.1, "etcd back")
        harness.wait_until(lambda: self.watchers() == 2, 10, 0.05, "watched again")
        self.assertEqual([c.call("FENCE.TOKEN", n) for n in ("wallet:r1", "wallet:r2")],
                         [ta, tb])
        self.etcd.ctl("del", self.etcd.keys(PREFIX + "wallet:r1/")[0][0])
        self.assert_lost_soon(c, "wallet:r1")
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:r2"), tb)
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total"), 1)
        self.assertNotIn("went back", self.fg_log(fg), "a restart with its data is no restore")

    def test_held_keys_are_read_again_in_txns_etcd_takes_after_a_restart(self):
        # etcd --max-txn-ops 8 and twelve locks held by one session: after a restart their watch
        # has to be set up again after a read, and one Txn of twelve Ranges is refused ("too
        # many operations"). The reads go in smaller Txns, so the keys are watched again and a
        # key deleted afterwards is still lost at once; none is lost for nothing.
        small = self.start_etcd(1, extra_args=("--max-txn-ops", "8"))
        fg = self.start_fg_etcd(self.redis, small, args=[
            "--session-ttl-ms", "30000", "--config", self.write_file("fg.yaml", PROTECT)])
        c = self.raw(fg.resp_port, timeout=10)
        tokens = [self.acquire(c, "wallet:%d" % i) for i in range(12)]
        harness.wait_until(lambda: self.watchers(small) == 12, 5, 0.02, "every key watched")
        m = small.members[0]
        m.stop()
        m.start(state="existing")
        harness.wait_until(m.healthy, 15, 0.1, "etcd back")
        harness.wait_until(lambda: self.watchers(small) == 12, 10, 0.05, "watched again")
        small.ctl("del", small.keys(PREFIX + "wallet:3/")[0][0])
        self.assert_lost_soon(c, "wallet:3")
        self.assertEqual([c.call("FENCE.TOKEN", "wallet:%d" % i) for i in range(12) if i != 3],
                         [t for i, t in enumerate(tokens) if i != 3])

    def test_a_held_key_deleted_on_an_etcd_restored_from_an_older_snapshot_is_lost(self):
        # A snapshot is saved while the lock is held; etcd then moves on (other writes) and
        # restarts, so the held key is read again and watched from the revision of that read.
        # etcd is then restored from the snapshot: its revisions go back below that watch's,
        # the key is still the session's (same create_revision, the lease kept), so the lock
        # stays held and usable. The key's deletion on the restored etcd, at a revision below
        # the one the watch had reached, must still make the lock lost at once, and the log
        # must say that etcd's revisions went back.
        fg = self.fencegate("--session-ttl-ms", "30000")
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:snap")
        harness.wait_until(lambda: self.watchers() == 1, 5, 0.02, "the key watched")
        m = self.etcd.members[0]
        snap = os.path.join(m.dir, "snap.db")
        self.etcd.ctl("snapshot", "save", snap)
        for i in range(5):
            self.etcd.ctl("put", "/other/%d" % i, "x")
        m.stop()
        m.start(state="existing")
        harness.wait_until(m.healthy, 15, 0.1, "etcd back")
        harness.wait_until(lambda: self.watchers() == 1, 10, 0.05, "watched again")
        m.restore(snap).start()
        harness.wait_until(m.healthy, 15, 0.1, "etcd restored")
        harness.wait_until(lambda: self.watchers() == 1, 10, 0.05, "watched on the restored etcd")
        key, rev, _ = self.etcd.keys(PREFIX + "wallet:snap/")[0]
        self.assertEqual(rev, t)
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:snap"), t)
        self.assertEqual(c.call("SET", "wallet:snap", "1"), "OK")
        self.etcd.ctl("del", key)
        self.assert_lost_soon(c, "wallet:snap")
        self.assertEqual(self.direct.get("wallet:snap"), b"1")
        log = self.fg_log(fg)
        self.assertIn("lock wallet:snap (token %d) lost: its key was deleted in etcd" % t, log)
        went = [ln for ln in log.splitlines() if "revisions went back" in ln]
        self.assertEqual(len(went), 1, went)
        self.assertIn("warn", went[0])

    def test_keys_an_etcd_restored_from_a_snapshot_brings_back_are_deleted(self):
        # A restored etcd brings back the keys of the snapshot with their leases, and a session
        # that is still alive keeps those leases alive: a lock it released after the snapshot
        # (one session also holds another lock, one holds nothing) would then head its queue,
        # held by nobody, for as long as the session lives, and every other sidecar waits for
        # it. The sidecar sees that etcd's revisions went back and deletes the keys of its
        # leases that no session holds or is acquiring; a lock still held stays held.
        a = self.fencegate("--session-ttl-ms", "30000")
        b = self.fencegate()
        c1, c2 = self.raw(a.resp_port, timeout=10), self.raw(a.resp_port, timeout=10)
        cb = self.raw(b.resp_port, timeout=10)
        t = self.acquire(c1, "wallet:held")
        self.acquire(c1, "wallet:x")
        self.acquire(c2, "wallet:y")
        m = self.etcd.members[0]
        snap = os.path.join(m.dir, "snap.db")
        self.etcd.ctl("snapshot", "save", snap)
        self.assertEqual(c1.call("FENCE.RELEASE", "wallet:x"), 1)
        self.assertEqual(c2.call("FENCE.RELEASE", "wallet:y"), 1)
        m.restore(snap).start()
        harness.wait_until(m.healthy, 15, 0.1, "etcd restored")
        harness.wait_until(lambda: a.http("/readyz")[0] == b.http("/readyz")[0] == 200, 10, 0.05,
                           "both sidecars connected again")
        for name in ("wallet:x", "wallet:y"):
            self.assertIsInstance(cb.call("FENCE.ACQUIRE", name, "WAIT", 3000, timeout=10), int,
                                  "%s still taken in the restored etcd" % name)
        self.assertEqual(c1.call("FENCE.TOKEN", "wallet:held"), t)
        self.assertEqual(c1.call("SET", "wallet:held", "1"), "OK")
        went = [ln for ln in self.fg_log(a).splitlines() if "revisions went back" in ln]
        self.assertEqual(len(went), 1, went)

    def test_a_key_brought_back_on_another_lease_of_a_session_waiting_for_its_name_goes(self):
        # The session held the name with a TTL of its own (a lease of that length, which lives
        # as long as the session) when the snapshot was saved, released it, and now waits for
        # it again with the default TTL (another lease, so another key) behind another holder
        # (an etcdctl key on a lease of its own, so that no store's mark is above the tokens
        # the restored etcd hands out). The restored etcd brings back the old key under the
        # first lease, which the session keeps alive: nobody holds it, and it heads the name's
        # queue. Its session is acquiring the name, but not with that key: the key must still
        # be deleted, and the waiting acquisition get the lock (the other holder's key is not
        # in the snapshot). It waited out its WAIT behind its own session's key, and the key
        # stayed, keeping every other sidecar waiting for as long as the session lived.
        a = self.fencegate("--session-ttl-ms", "30000", config=None)
        c = self.raw(a.resp_port, timeout=30)
        self.acquire(c, "wallet:t", "TTL", 20000)
        m = self.etcd.members[0]
        snap = os.path.join(m.dir, "snap.db")
        self.etcd.ctl("snapshot", "save", snap)
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:t"), 1)
        lease = int(self.etcd.ctl("lease", "grant", "60").split()[1], 16)
        self.etcd.ctl("put", "--lease=%x" % lease, PREFIX + "wallet:t/%x" % lease, "")
        c.send(harness.encode("FENCE.ACQUIRE", "wallet:t", "WAIT", 15000))
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "wallet:t/")) == 2, 5, 0.02,
                           "the session waiting behind the other holder")
        m.restore(snap).start()
        harness.wait_until(m.healthy, 15, 0.1, "etcd restored")
        t = c.read_reply(timeout=25)
        self.assertIsInstance(t, int, "the waiting acquisition, behind its own session's "
                              "key that the restore brought back: %r; keys %r" % (
                                  t, self.etcd.keys(PREFIX + "wallet:t/")))
        keys = self.etcd.keys(PREFIX + "wallet:t/")
        self.assertEqual([k[1] for k in keys], [t], keys)
        went = [ln for ln in self.fg_log(a).splitlines() if "revisions went back" in ln]
        self.assertEqual(len(went), 1, went)

    def test_a_name_released_and_taken_again_at_once_is_watched_under_its_new_key(self):
        # The same session releases a name and takes it again (the same key under the same
        # lease, a new create_revision), held briefly and held past its watch's start, with
        # release and acquire pipelined in one write: the old key's DELETE and the new key's
        # PUT, late on the old watch, never make the new grant lost; the new key's own deletion
        # does, at once.
        fg = self.fencegate("--session-ttl-ms", "30000", config=None)
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "again")
        for i in range(12):
            time.sleep((0.0, 0.05, 0.09, 0.11, 0.15, 0.3)[i % 6])
            c.send(harness.encode("FENCE.RELEASE", "again") +
                   harness.encode("FENCE.ACQUIRE", "again"))
            rel, t2 = c.read_reply(timeout=10), c.read_reply(timeout=10)
            self.assertIn(rel, (1, 0), rel)
            self.assertIsInstance(t2, int, t2)
            self.assertGreater(t2, t)
            t = t2
        time.sleep(0.5)
        self.assertEqual(c.call("FENCE.TOKEN", "again"), t)
        self.assertEqual(fg.metrics().get("fencegate_locks_lost_total", 0), 0, self.fg_log(fg))
        harness.wait_until(lambda: self.watchers() == 1, 5, 0.05, "one watcher, the new key's")
        key, rev, _ = self.etcd.keys(PREFIX + "again/")[0]
        self.assertEqual(rev, t)
        self.etcd.ctl("del", key)
        self.assert_lost_soon(c, "again")

    def test_sessions_closed_and_the_sidecar_stopped_with_watches_in_flight(self):
        # Connections close while their keys are young (not watched yet), while watch creates
        # are unanswered (etcd's answers cut) and while re-reads are in flight; then the
        # sidecar stops with all of that in flight. Under ASan this is the lifecycle test of
        # the watch on held keys; here, every key ends up deleted (by the revokes, or by the
        # 3 s leases running out when the stop came before the connection was back) and the
        # sidecar exits 0.
        fg = self.fencegate("--session-ttl-ms", "3000", config=None)
        m = self.etcd.members[0]
        for delay in (0.0, 0.05, 0.1, 0.12, 0.3):
            conns = [self.raw(fg.resp_port, timeout=10) for _ in range(4)]
            for j, cc in enumerate(conns):
                for k in range(5):
                    cc.send(harness.encode("FENCE.ACQUIRE", "life:%d:%d" % (j, k)))
            for cc in conns:
                for k in range(5):
                    self.assertIsInstance(cc.read_reply(timeout=10), int)
            time.sleep(delay)
            for cc in conns:
                cc.close()
        harness.wait_until(lambda: self.etcd.keys(PREFIX + "life:") == [], 5, 0.05,
                           "closed sessions' keys deleted")
        keep = self.raw(fg.resp_port, timeout=10)
        for k in range(30):
            keep.send(harness.encode("FENCE.ACQUIRE", "life:k%d" % k))
        for k in range(30):
            self.assertIsInstance(keep.read_reply(timeout=10), int)
        heal = self.cut_answers(m)
        time.sleep(0.3)  # their creates sent, unanswered
        ports = self.fg_etcd_ports(fg, m.client_port)
        harness.subprocess.run(["ss", "-K", "-tn", "state", "established", "( sport = :%d )"
                                % ports[0]], capture_output=True, timeout=10)
        heal()
        time.sleep(0.05)  # reconnecting, re-reads in flight
        fg.stop()
        harness.wait_until(lambda: self.etcd.keys(PREFIX + "life:") == [], 10, 0.1,
                           "the stopped sidecar's keys deleted")

    def test_a_lock_lost_locally_frees_its_key(self):
        """Frozen just past its local lease (1.5 s) but not past etcd's (whole seconds: 2 s), the
        sidecar reports the lock lost when it resumes, and must free the key: its lease is kept
        alive again, so a key left there would block everyone else for as long as it runs."""
        a = self.fencegate("--session-ttl-ms", "1500")
        b = self.fencegate()
        ca = self.raw(a.resp_port)
        self.acquire(ca, "wallet:z")
        self.freeze(a)
        time.sleep(1.7)
        a.signal(__import__("signal").SIGCONT)
        harness.wait_until(lambda: ca.call("FENCE.LOCKS")[0][3] == b"lost", 3, 0.05,
                           "the lock reported lost after the freeze")
        cb = self.raw(b.resp_port, timeout=10)
        t0 = time.monotonic()
        self.acquire(cb, "wallet:z", "WAIT", 5000, timeout=10)
        self.assertLess(time.monotonic() - t0, 2.0, "the lost lock's key was left in etcd")

    def test_norenew_lock_has_its_own_lease_and_runs_out(self):
        fg = self.fencegate()
        c, d = self.raw(fg.resp_port), self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:n", "TTL", 1000, "NORENEW")
        self.acquire(c, "wallet:m")
        leases = {k[2] for k in self.etcd.keys(PREFIX)}
        self.assertEqual(len(leases), 2, "a NORENEW lock gets a lease of its own")
        t0 = time.monotonic()
        t2 = self.acquire(d, "wallet:n", "WAIT", 5000, timeout=10)
        self.assertGreater(t2, t)
        self.assertLess(time.monotonic() - t0, 3.5)
        r = c.call("SET", "wallet:n", "late")
        self.assertTrue(isinstance(r, Err) and r.startswith(("LOCKLOST", "STALE")), r)

    def test_http_locks_and_fencectl_on_etcd(self):
        fg = self.fencegate()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/locks/h1" % fg.http_port,
                                     data=b'{"ttl_ms": 3000}', method="POST")
        body = json.loads(urllib.request.urlopen(req, timeout=10).read())
        self.assertEqual(self.etcd.keys(PREFIX + "h1/")[0][1], body["token"])
        req = urllib.request.Request("http://127.0.0.1:%d/v1/locks/h1" % fg.http_port,
                                     method="DELETE")
        self.assertEqual(urllib.request.urlopen(req, timeout=10).status, 200)
        self.assertEqual(self.etcd.keys(PREFIX + "h1/"), [])
        out = harness.subprocess.run(
            [harness.FENCECTL_BIN, "--http", "127.0.0.1:%d" % fg.http_port, "lock", "h2", "--",
             "sh", "-c", "echo $FENCE_TOKEN"], capture_output=True, timeout=20)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreater(int(out.stdout), body["token"])
        self.assertEqual(self.etcd.keys(PREFIX + "h2/"), [], "fencectl released it")

    def test_http_store_marks_live_in_etcd(self):
        from test_http_store import Upstream
        up = Upstream()
        self.addCleanup(up.stop)
        cfg = ("stores:\n  - { name: blobs, url: \"http://127.0.0.1:%d\" }\n" % up.port)
        fg = self.fencegate(config=cfg)

        def put(path, token=None):
            c = harness.http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            hdr = {"Fence-Lock": "b1"}
            c.request("PUT", "/v1/stores/blobs/http/" + path, body=b"data", headers=hdr)
            r = c.getresponse()
            body = r.read()
            c.close()
            return r.status, body

        req = urllib.request.Request("http://127.0.0.1:%d/v1/locks/b1" % fg.http_port,
                                     data=b"{}", method="POST")
        t = json.loads(urllib.request.urlopen(req, timeout=10).read())["token"]
        # Fence on acquire raised the mark in etcd (a zero-padded decimal under /fencegate/marks/).
        self.assertEqual(self.etcd.ctl("get", "--print-value-only", "/fencegate/marks/blobs/b1")
                         .strip(), "%020d" % t)
        status, _ = put("obj1")
        self.assertEqual(status, 201)
        self.assertEqual(Upstream.header(up.seen()[-1], "fencing-token"), [str(t)])
        # A newer holder elsewhere raised the mark: this sidecar's request is refused, unsent.
        self.etcd.ctl("put", "/fencegate/marks/blobs/b1", "%020d" % (t + 1000))
        n = len(up.seen())
        status, body = put("obj2")
        self.assertEqual(status, 409, body)
        self.assertEqual(json.loads(body)["error"], "stale_token")
        self.assertEqual(json.loads(body)["mark"], t + 1000)
        self.assertEqual(len(up.seen()), n, "a stale request reached the store")

    def test_http_store_request_of_a_lock_lost_while_its_mark_is_raised_is_not_sent(self):
        """With etcd the mark alone decides (tokens never repeat). etcd freezes while a request
        waits for its mark; the lock's lease runs out in the sidecar meanwhile (keepalives
        unanswered). When etcd answers the mark (the token is still the newest), the request
        must not go out: the sidecar no longer holds the lock."""
        from test_http_store import Upstream
        up = Upstream()
        self.addCleanup(up.stop)
        cfg = ("stores:\n  - { name: blobs, url: \"http://127.0.0.1:%d\" }\n" % up.port)
        fg = self.fencegate("--session-ttl-ms", "900", config=cfg)
        st, _, data = harness.http_request(fg.http_port, "POST", "/v1/locks/b2", b"{}")
        self.assertEqual(st, 200, data)
        got = {}

        def put():
            got["r"] = harness.http_request(fg.http_port, "PUT", "/v1/stores/blobs/http/o",
                                            b"data", headers={"Fence-Lock": "b2"}, timeout=15)
        member = self.etcd.members[0]
        member.freeze()
        try:
            t = threading.Thread(target=put)
            t.start()
            time.sleep(1.3)  # past the 900 ms lease, inside the 2 s the mark's call may take
        finally:
            member.thaw()
        t.join(15)
        st, _, body = got["r"]
        self.assertEqual(st, 409, body)
        self.assertEqual(json.loads(body)["error"], "lock_lost", body)
        self.assertEqual(up.seen(), [], "a request under a lost lock reached the store")

    def test_a_lock_taken_again_just_after_its_lease_ran_out_does_not_wait_behind_itself(self):
        """The session's lease ran out in the sidecar (frozen here) while etcd still keeps the
        key; the same connection asks for the lock again, with another TTL (another lease),
        and that request is read before the sidecar's timer reports the loss. The old key must be
        gone with its lease, and the new one must not queue behind it."""
        fg = self.fencegate("--session-ttl-ms", "1000", config=None)
        c = self.raw(fg.resp_port)
        t = self.acquire(c, "relock")
        self.freeze(fg)
        time.sleep(1.3)  # past the sidecar's 1 s lease, inside etcd's (at least 2 s)
        c.cmd("FENCE.ACQUIRE", "relock", "TTL", "3000", "WAIT", "3000")
        fg.signal(signal.SIGCONT)  # the request is read before the expiry timer runs
        r = c.read_reply(timeout=10)
        self.assertIsInstance(r, int, r)
        self.assertGreater(r, t)
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "relock/")) == 1, 5, 0.05,
                           "only the new key left")

    def test_a_create_etcd_applies_after_its_clean_up_does_not_block_the_name(self):
        """An acquire whose Txn etcd got but did not answer within the wait (etcd frozen) has
        an unknown outcome: its name is cleaned up with an unguarded delete. etcd, thawed, may
        apply the create after that delete; the key then heads the name's queue with nobody
        holding it. The sidecar cleans the name up again later, so the key goes. (Which of the
        two etcd applies first is up to it: one attempt in four to eight leaves the key behind
        the first clean-up here, so 30 attempts. Each is as short as it can be: the clean-up is
        sent with the error reply, so 50 ms later both wait in the frozen etcd.)"""
        fg = self.fencegate(config=None)
        c = self.raw(fg.resp_port, timeout=20)
        self.acquire(c, "warm")  # the session's lease exists
        member = self.etcd.members[0]
        self.addCleanup(member.thaw)
        names = ["late%d" % i for i in range(30)]
        for name in names:
            member.freeze()
            r = c.call("FENCE.ACQUIRE", name, "WAIT", 100, timeout=10)
            time.sleep(0.05)
            member.thaw()
            self.assertIsInstance(r, Err, r)  # etcd did not answer within the wait
            time.sleep(0.2)  # the create and its clean-up meet in etcd
        other = self.raw(fg.resp_port, timeout=20)
        # The clean-ups run again 1, 2, 4 ... s after the first: within 4 s every key is gone.
        harness.wait_until(lambda: [n for n in names if self.etcd.keys(PREFIX + n + "/")] == [],
                           6, 0.2, "keys of names nobody holds are cleaned up")
        for name in names:
            self.acquire(other, name, "WAIT", 0)

    def test_sigterm_revokes_the_leases_even_without_a_grace_period(self):
        """SIGTERM with shutdown_grace_ms 0 while connections hold locks (one idle, one inside
        a MULTI): closing them releases their locks, and their lease revokes reach etcd before
        the sidecar exits, so no other sidecar waits for the leases to run out."""
        fg = self.fencegate("--shutdown-grace-ms", "0", config=None)
        idle, busy = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.acquire(idle, "bye1")
        self.acquire(busy, "bye2")
        self.assertEqual(busy.call("MULTI"), "OK")
        self.assertEqual(len(self.etcd.keys(PREFIX)), 2)
        fg.stop(expect_rc=0)
        self.assertEqual(self.etcd.keys(PREFIX), [])
        self.assertNotIn("id", self.etcd.ctl("lease", "list"))

    def test_store_down_locks_are_still_released_and_none_is_granted(self):
        fg = self.fencegate()
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:1")
        self.assertEqual(c.call("SET", "wallet:1", "a"), "OK")
        self.redis.kill()
        r = c.call("GET", "wallet:1")
        self.assertTrue(isinstance(r, Err) and r.startswith("UNAVAILABLE upstream"), r)
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:1"), t)
        r = c.call("FENCE.ACQUIRE", "wallet:2", timeout=10)
        self.assertTrue(isinstance(r, Err) and
                        r.startswith("UNAVAILABLE fence on acquire of lock wallet:2") and
                        "store 127.0.0.1:%d" % self.redis.port in r and
                        "lock wallet:2 not acquired" in r, r)
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:1"), 1)
        harness.wait_until(lambda: self.etcd.keys(PREFIX) == [], 3, 0.05,
                           "both keys gone from etcd")
        self.redis.start()
        harness.wait_until(lambda: isinstance(c.call("FENCE.ACQUIRE", "wallet:1"), int), 10, 0.2,
                           "acquired once the store is back")

    def test_etcd_down_then_back(self):
        fg = self.fencegate(readyz=True)
        c = self.raw(fg.resp_port, timeout=10)
        t = self.acquire(c, "wallet:d")
        m = self.etcd.members[0]
        m.kill()
        harness.wait_until(lambda: fg.http("/readyz")[0] == 503, 5, 0.1, "/readyz 503")
        body = fg.http("/readyz")[1].decode()
        self.assertIn("the lock backend is not ready: etcd", body)
        self.assertIn(m.endpoint, body)
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "other", "WAIT", 0, timeout=10)
        self.assertTrue(isinstance(r, Err) and r.startswith("UNAVAILABLE"), r)
        m.start(state="existing")
        harness.wait_until(lambda: fg.http("/readyz")[0] == 200, 15, 0.1, "/readyz 200 again")
        # The lease outlived the short outage (10 s session TTL): the lock is still ours.
        self.assertEqual(c.call("FENCE.TOKEN", "wallet:d"), t)
        self.assertEqual(c.call("SET", "wallet:d", "ok"), "OK")


    def test_a_stalled_lookup_of_etcd_leaves_the_sidecar_answering(self):
        # etcd's host name is looked up off the event loop: while the name service does not
        # answer, keepalives of other connections, the store's pass-through and the sidecar's
        # own endpoints go on; acquisitions fail within their wait, then work once it answers.
        dns = self.slow_dns()
        m = self.etcd.members[0]
        fg = self.fencegate("--backend", "etcd://etcd.fgtest:%d" % m.client_port, env=dns.env())
        c = self.raw(fg.resp_port, timeout=10)
        self.acquire(c, "wallet:dns")
        self.assertEqual(c.call("FENCE.RELEASE", "wallet:dns"), 1)
        self.assertEqual(c.call("SET", "k", "v"), "OK")
        # The gRPC connection breaks and etcd comes straight back; connecting again looks the
        # name up again, and the name service now takes 8 s to answer.
        dns.stall("etcd.fgtest", 8000)
        m.kill()
        m.start(state="existing")
        harness.wait_until(m.healthy, 15, 0.1, "etcd healthy again")
        conn = self.raw(fg.resp_port)
        poller = harness.PromptPoller(fg, lambda: conn.call("GET", "k") == b"v")
        poller.start()
        t0 = time.monotonic()
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "dns:x", "WAIT", 500, timeout=10)
        took = time.monotonic() - t0
        self.assertTrue(isinstance(r, Err) and r.startswith("UNAVAILABLE"), r)
        self.assertLess(took, 2.5, "the acquire took %.2f s" % took)
        poller.join()
        self.assertLess(poller.worst, 1.0, "a request waited on the stalled lookup")
        # The connect timeout (2 s) gave the lookup up, and acquisitions say so.
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "dns:x", "WAIT", 0, timeout=10)
        self.assertTrue(isinstance(r, Err) and "resolving 'etcd.fgtest' timed out" in r, r)
        dns.stall("etcd.fgtest", 0)
        harness.wait_until(lambda: fg.http("/readyz")[0] == 200, 15, 0.1, "/readyz 200 again")
        self.acquire(c, "wallet:dns")
        self.assertEqual(c.call("GET", "k"), b"v")


def lock_round(test, fg):
    """Against test.etcd and test.redis, through fg (with PROTECT): a lock's token is its key's
    create_revision; a waiter watching its predecessor gets it, with a larger token, on release;
    the former holder's write is refused and the new holder's lands."""
    a, b = test.raw(fg.resp_port, timeout=10), test.raw(fg.resp_port, timeout=10)
    t = a.call("FENCE.ACQUIRE", "wallet:1")
    test.assertIsInstance(t, int, t)
    test.assertEqual([k[1] for k in test.etcd.keys(PREFIX + "wallet:1/")], [t])
    test.assertEqual(a.call("SET", "wallet:1", "x"), "OK")
    b.send(harness.encode("FENCE.ACQUIRE", "wallet:1", "WAIT", 8000))
    harness.wait_until(lambda: len(test.etcd.keys(PREFIX + "wallet:1/")) == 2, 5, 0.05,
                       "the waiter queued")
    test.assertEqual(a.call("FENCE.RELEASE", "wallet:1"), 1)
    t2 = b.read_reply(timeout=8)
    test.assertIsInstance(t2, int, t2)
    test.assertGreater(t2, t)
    r = a.call("SET", "wallet:1", "not mine")
    test.assertTrue(isinstance(r, Err) and r.startswith("NOLOCK"), r)
    test.assertEqual(b.call("SET", "wallet:1", "y"), "OK")
    test.assertEqual(test.redis.client().get("wallet:1"), b"y")


class EtcdAuth(EtcdTestCase):
    """etcd with authentication on (as the common etcd Helm charts deploy it): fencegate logs in
    with etcd://user:password@..., as a user whose role covers only fencegate's prefix."""

    def setUp(self):
        self.redis = self.start_redis()

    def start(self, password="fg/pw@1", ttl_s=None, pw_file=False):
        self.etcd = self.start_etcd(1, extra_args=["--auth-token-ttl", str(ttl_s)]
                                    if ttl_s else ())
        self.etcd.enable_auth("rootpw", [("fg", "fg/pw@1", "/fencegate/")])
        args = ["--config", self.write_file("fg-auth.yaml", PROTECT)]
        if pw_file:  # as a mounted Secret gives it: the file's content, a newline at the end
            url = "etcd://fg@%s" % self.etcd.members[0].endpoint
            args += ["--backend-password-file", self.write_file("pw", password + "\n")]
        else:
            url = "etcd://fg:%s@%s" % (password.replace("@", "%40"),
                                        self.etcd.members[0].endpoint)
        return self.start_fencegate(self.redis, args=["--backend", url] + args,
                                    readyz=password == "fg/pw@1")

    def test_password_from_a_file(self):
        fg = self.start(pw_file=True)
        t = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "wallet:9")
        self.assertIsInstance(t, int, t)
        self.assertEqual([k[1] for k in self.etcd.keys(PREFIX + "wallet:9/")], [t])

    def test_locks_waits_and_fenced_writes_as_a_user_limited_to_the_prefix(self):
        lock_round(self, self.start())

    def test_wrong_password_fails_closed_and_says_why(self):
        fg = self.start(password="nope")
        harness.wait_until(lambda: "authentication as 'fg' failed" in self.fg_log(fg), 10, 0.1,
                           "the failure logged")
        status, body = fg.http("/readyz")[:2]
        self.assertEqual(status, 503)
        self.assertIn("the lock backend is not ready: etcd", body.decode())
        self.assertIn("authentication as 'fg' failed", body.decode())
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "wallet:1", "WAIT", 0, timeout=10)
        self.assertIsInstance(r, Err)
        self.assertIn("authentication as 'fg' failed", r)
        self.assertIn("invalid user ID or password", r)
        self.assertNotIn("nope", self.fg_log(fg) + r, "the password is never shown")
        # Retried with a backoff, logged once per 30 s: not a line per attempt.
        time.sleep(3)
        self.assertEqual(self.fg_log(fg).count("authentication as 'fg' failed"), 1, self.fg_log(fg))

    def test_expired_token_is_renewed_without_a_failed_call(self):
        """Tokens live 1 s here: each call after a pause finds its token expired, is refused,
        and must be sent again with a new one, unseen by the client."""
        fg = self.start(ttl_s=1)
        a, b = self.raw(fg.resp_port, timeout=10), self.raw(fg.resp_port, timeout=10)
        self.assertIsInstance(a.call("FENCE.ACQUIRE", "wallet:1"), int)
        b.send(harness.encode("FENCE.ACQUIRE", "wallet:1", "WAIT", 20000))
        harness.wait_until(lambda: len(self.etcd.keys(PREFIX + "wallet:1/")) == 2, 5, 0.05,
                           "the waiter queued")
        for i in range(2):
            time.sleep(2.5)
            t = a.call("FENCE.ACQUIRE", "wallet:%d" % (i + 2))
            self.assertIsInstance(t, int, "after a pause: %r" % (t,))
        time.sleep(2.5)
        self.assertEqual(a.call("FENCE.RELEASE", "wallet:1"), 1)
        t = b.read_reply(timeout=10)
        self.assertIsInstance(t, int, "the waiter, after the token expired: %r" % (t,))
        self.assertEqual(b.call("SET", "wallet:1", "b"), "OK")
        # The session's lease outlived every expiry: the locks taken first are still held.
        self.assertIsInstance(a.call("FENCE.TOKEN", "wallet:2"), int)

    def test_held_keys_deleted_after_the_watch_streams_token_expired_are_lost_at_once(self):
        # Tokens live 1 s: the watch stream keeps the token it was opened with, etcd refuses
        # creates on it once that token expired, and a new token replaces the stream. Keys held
        # across that (one watched before the expiry, one granted after it) are still watched:
        # deleted, each is lost at once; nothing is lost before.
        fg = self.start(ttl_s=1)
        c = self.raw(fg.resp_port, timeout=10)
        self.assertIsInstance(c.call("FENCE.ACQUIRE", "wallet:w1"), int)
        time.sleep(2.5)
        self.assertIsInstance(c.call("FENCE.ACQUIRE", "wallet:w2"), int)
        time.sleep(2.5)
        self.assertIsInstance(c.call("FENCE.ACQUIRE", "wallet:w3"), int)
        time.sleep(1.0)
        self.assertEqual([x[3] for x in c.call("FENCE.LOCKS")], [b"held"] * 3, self.fg_log(fg))
        for name in ("wallet:w1", "wallet:w2", "wallet:w3"):
            self.etcd.ctl("del", self.etcd.keys(PREFIX + name + "/")[0][0])
            harness.wait_until(lambda: c.call("FENCE.TOKEN", name) is None, 1.5, 0.01,
                               "lock %s reported lost" % name)

    def test_a_wait_that_ends_while_a_shared_txn_waits_for_a_new_token_sends_nothing(self):
        # A shared Txn refused for its expired token splits into its members, each waiting for
        # the new token alone: a member whose wait ends meanwhile (WAIT 20 ms; authenticating
        # takes longer) is never sent, so no key of it is left to block the lock.
        fg = self.start(ttl_s=1)
        conns = [self.raw(fg.resp_port, timeout=10) for _ in range(6)]
        for i, c in enumerate(conns):
            self.assertIsInstance(c.call("FENCE.ACQUIRE", "wallet:o%d" % i), int)
        for rnd in range(3):
            time.sleep(2.5)
            name = "wallet:x%d" % rnd
            replies = EtcdLocks.burst(conns, [("FENCE.ACQUIRE", "wallet:y%d:%d" % (rnd, i))
                                              for i in range(5)] + [("FENCE.ACQUIRE", name,
                                                                     "WAIT", 20)])
            for r in replies[:5]:
                self.assertIsInstance(r, int, r)
            if isinstance(replies[5], int):
                self.assertEqual(conns[5].call("FENCE.RELEASE", name), 1)
            time.sleep(0.3)
            self.assertEqual(self.etcd.keys(PREFIX + name + "/"), [], "round %d" % rnd)
        other = self.raw(fg.resp_port, timeout=10)
        self.assertIsInstance(other.call("FENCE.ACQUIRE", "wallet:x0", "WAIT", 2000, timeout=5),
                              int)
        self.assertGreater(fg.metrics().get("fencegate_lock_backend_batches_total", 0), 0)


class EtcdTLS(EtcdTestCase):
    """etcds://: etcd serving TLS only and asking every client for a certificate of its CA."""

    def setUp(self):
        self.redis = self.start_redis()
        self.certs = make_certs(os.path.dirname(self.write_file("certs", "")))
        self.etcd = self.start_etcd(1, tls=self.certs)

    def start(self, ca="ca.crt", client=True, ready=True, extra=()):
        args = ["--backend", self.etcd.url, "--backend-tls-ca-file", self.certs[ca]]
        if client:
            args += ["--backend-tls-cert-file", self.certs["client.crt"],
                     "--backend-tls-key-file", self.certs["client.key"]]
        return self.start_fencegate(self.redis, args=args + list(extra), readyz=ready)

    def test_locks_waits_and_fenced_writes_over_mutual_tls(self):
        lock_round(self, self.start(extra=["--config", self.write_file("fg-tls.yaml", PROTECT)]))

    def test_server_certificate_of_another_ca_is_refused(self):
        fg = self.start(ca="other-ca.crt", ready=False)
        harness.wait_until(lambda: "certificate verify failed" in self.fg_log(fg), 10, 0.1,
                           "the TLS failure logged")
        self.assertEqual(fg.http("/readyz")[0], 503)
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "x", "WAIT", 0, timeout=10)
        self.assertIsInstance(r, Err)
        self.assertIn("certificate verify failed", r)
        self.assertEqual(self.etcd.keys(PREFIX), [], "nothing reached etcd")

    def test_the_name_checked_is_the_server_name_when_given(self):
        # The certificate names localhost and 127.0.0.1: a DNS name checks too, another fails.
        fg = self.start(extra=["--backend-tls-server-name", "localhost"])
        self.assertIsInstance(self.raw(fg.resp_port).call("FENCE.ACQUIRE", "n1"), int)
        bad = self.start(ready=False, extra=["--backend-tls-server-name", "etcd.example"])
        harness.wait_until(lambda: "hostname mismatch" in self.fg_log(bad), 10, 0.1,
                           "the name mismatch logged")
        self.assertEqual(bad.http("/readyz")[0], 503)

    def test_no_client_certificate_is_refused_by_etcd(self):
        fg = self.start(client=False, ready=False)
        # etcd's alert: "bad certificate" (TLS 1.2) or "certificate required" (TLS 1.3).
        def refused():
            return re.search(r"TLS[a-z ]* failed: .*alert (bad certificate|certificate required)",
                             self.fg_log(fg))
        harness.wait_until(refused, 10, 0.1, "the refusal logged")
        self.assertEqual(fg.http("/readyz")[0], 503)
        r = self.raw(fg.resp_port).call("FENCE.ACQUIRE", "x", "WAIT", 0, timeout=10)
        self.assertTrue(isinstance(r, Err) and "alert" in r, r)

    def test_a_closed_port_is_reported_as_refused(self):
        port = harness.free_port()
        fg = self.start_fencegate(self.redis, readyz=False, args=[
            "--backend", "etcds://127.0.0.1:%d" % port,
            "--backend-tls-ca-file", self.certs["ca.crt"]])
        harness.wait_until(lambda: "Connection refused" in self.fg_log(fg), 10, 0.1,
                           "the refused connection logged as such")

    def test_unusable_tls_files_stop_the_start(self):
        fg = self.start_fencegate(self.redis, args=[
            "--backend", self.etcd.url, "--backend-tls-ca-file", "/dev/null"], ready=False)
        self.assertEqual(fg.wait_exit(10), 2)
        self.assertIn("cannot load CA file '/dev/null'", self.fg_log(fg))
        fg = self.start_fencegate(self.redis, args=[
            "--backend", self.etcd.url, "--backend-tls-cert-file", self.certs["client.crt"],
            "--backend-tls-key-file", self.certs["server.key"]], ready=False)
        self.assertEqual(fg.wait_exit(10), 2)
        self.assertIn("cannot use key file", self.fg_log(fg))


class EtcdCluster3(EtcdTestCase):

    def test_leader_killed_while_locks_are_held_and_waited_for(self):
        redis = self.start_redis()
        etcd = self.start_etcd(3)
        fg = self.start_fg_etcd(redis, etcd, args=["--session-ttl-ms", "3000"])
        holder = self.raw(fg.resp_port, timeout=20)
        grants = []  # (token, granted_at, released_at)
        t0 = self.acquire_ok(holder, "L")
        waiters = [self.raw(fg.resp_port, timeout=30) for _ in range(3)]
        for w in waiters:
            w.send(harness.encode("FENCE.ACQUIRE", "L", "WAIT", 25000))
            time.sleep(0.2)
        leader = etcd.leader()
        self.assertIsNotNone(leader)
        leader.kill()
        time.sleep(1.0)
        r = holder.call("FENCE.TOKEN", "L")
        # Either still held with the same token, or reported lost: never another token.
        self.assertIn(r, (t0, None), "FENCE.TOKEN after the leader died: %r" % (r,))
        holder.call("FENCE.RELEASE", "L", timeout=10)
        grants.append((t0, 0, time.monotonic()))
        for i, w in enumerate(waiters):
            r = w.read_reply(timeout=25)
            now = time.monotonic()
            if isinstance(r, Err):
                # Allowed: the backend was unavailable; never a double grant.
                self.assertTrue(r.startswith(("UNAVAILABLE", "LOCKED")), r)
                continue
            self.assertIsInstance(r, int)
            for j, w2 in enumerate(waiters[i + 1:]):
                self.assertEqual(w2.read_available(0.05), b"",
                                 "a second waiter was granted while %d held it" % i)
            grants.append((r, now, None))
            w.call("FENCE.RELEASE", "L", timeout=10)
        tokens = [g[0] for g in grants]
        self.assertEqual(tokens, sorted(set(tokens)), "tokens never go backwards: %r" % tokens)
        self.assertGreaterEqual(len(tokens), 2, "at least one waiter got the lock after failover")

    def test_frozen_member_is_left_for_another_endpoint(self):
        redis = self.start_redis()
        etcd = self.start_etcd(3)
        fg = self.start_fg_etcd(redis, etcd)
        c = self.raw(fg.resp_port, timeout=20)
        self.acquire_ok(c, "f1")
        # fencegate talks to the first endpoint; freeze it (no answers at all).
        first = etcd.members[0]
        first.freeze()
        self.addCleanup(first.thaw)
        deadline = time.monotonic() + 20
        while True:
            r = c.call("FENCE.ACQUIRE", "f2", "WAIT", 0, timeout=10)
            if isinstance(r, int):
                break
            self.assertLess(time.monotonic(), deadline, "never failed over: %r" % (r,))
            time.sleep(0.3)
        self.assertEqual(c.call("FENCE.TOKEN", "f1") is not None, True)

    def test_leader_killed_under_contended_acquires_that_go_as_one_txn(self):
        # Twelve connections cycle acquire/release on four locks (three contenders each), so
        # acquires and releases of different locks share Txns, while the leader is killed. Per
        # lock: tokens grow in grant order, and no grant comes before the previous holder sent
        # its release, unless that holder had lost the lock (its release answered 0).
        redis = self.start_redis()
        etcd = self.start_etcd(3)
        fg = self.start_fg_etcd(redis, etcd, args=["--session-ttl-ms", "3000"])
        stop = time.monotonic() + 6.0
        history = []  # (lock, token, granted_at, release_sent_at, release_reply)
        errors = []

        def worker(i):
            c = self.raw(fg.resp_port, timeout=30)
            lock = "k%d" % (i % 4)
            while time.monotonic() < stop:
                r = c.call("FENCE.ACQUIRE", lock, "WAIT", 5000, timeout=30)
                if not isinstance(r, int):
                    if not r.startswith(("UNAVAILABLE", "LOCKED")):
                        errors.append(r)
                    time.sleep(0.05)
                    continue
                granted = time.monotonic()
                time.sleep(0.002)
                sent = time.monotonic()
                rel = c.call("FENCE.RELEASE", lock, timeout=30)
                history.append((lock, r, granted, sent, rel))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        leader = etcd.leader()
        self.assertIsNotNone(leader)
        leader.kill()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertGreater(fg.metrics().get("fencegate_lock_backend_batches_total", 0), 0)
        for lock in ("k0", "k1", "k2", "k3"):
            grants = sorted((h for h in history if h[0] == lock), key=lambda h: h[2])
            self.assertGreater(len(grants), 5, lock)
            for a, b in zip(grants, grants[1:]):
                self.assertGreater(b[1], a[1],
                                   "%s: token went backwards: %r then %r" % (lock, a, b))
                if a[4] == 1:
                    self.assertGreater(b[2], a[3], "%s: granted to two holders: %r and %r" % (
                        lock, a, b))
        after = [h for h in history if h[2] > stop - 2.0]
        self.assertTrue(after, "no grant after the failover")

    def test_held_keys_are_watched_on_the_member_failed_over_to(self):
        # The member fencegate talks to is killed: it moves on to the next endpoint, reads its
        # held keys again there and watches them there; a key deleted afterwards is lost at
        # once, the other stays held with its token.
        redis = self.start_redis()
        etcd = self.start_etcd(3)
        fg = self.start_fg_etcd(redis, etcd, args=["--session-ttl-ms", "30000"])
        c = self.raw(fg.resp_port, timeout=20)
        ta, tb = self.acquire_ok(c, "fo:a"), self.acquire_ok(c, "fo:b")
        time.sleep(0.3)
        etcd.members[0].kill()
        time.sleep(3.0)
        self.assertEqual([c.call("FENCE.TOKEN", "fo:a"), c.call("FENCE.TOKEN", "fo:b")],
                         [ta, tb])
        key = etcd.keys(PREFIX + "fo:a/")[0][0]
        etcd.ctl("del", key)
        harness.wait_until(lambda: c.call("FENCE.TOKEN", "fo:a") is None, 1.5, 0.01,
                           "fo:a reported lost")
        self.assertEqual(c.call("FENCE.TOKEN", "fo:b"), tb)
        self.assertNotIn("went back", self.fg_log(fg), "a failover is no restore")

    def acquire_ok(self, conn, name):
        r = conn.call("FENCE.ACQUIRE", name, timeout=10)
        self.assertIsInstance(r, int, r)
        return r


if __name__ == "__main__":
    unittest.main()
