"""Redis semantics through fencegate's RESP endpoint: what an application that swaps its Redis
address for fencegate's relies on (DESIGN.md §2, "Drop-in")."""

import os
import socket
import subprocess
import time
import unittest

import harness  # first: it makes sure redis-py is importable
from harness import Err, FgTestCase, Push, Status, encode

import redis  # noqa: E402


class ProxySemantics(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis)
        self.r = self.fg.client()
        self.addCleanup(self.r.close)
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def raw(self, timeout=5.0):
        return super().raw(self.fg.resp_port, timeout)

    # -- pipelines --------------------------------------------------------------------------

    def test_pipeline_1000_mixed_commands_replies_in_order(self):
        p = self.r.pipeline(transaction=False)
        expected = []
        counter = 0
        for i in range(1000):
            kind = i % 6
            if kind == 0:
                p.set("pk:%d" % i, "v%d" % i)
                expected.append(True)
            elif kind == 1:
                p.get("pk:%d" % (i - 1))
                expected.append(b"v%d" % (i - 1))
            elif kind == 2:
                p.incr("pcounter")
                counter += 1
                expected.append(counter)
            elif kind == 3:
                p.rpush("plist", i)
                expected.append(len([j for j in range(i + 1) if j % 6 == 3]))
            elif kind == 4:
                p.echo("e%d" % i)
                expected.append(b"e%d" % i)
            else:
                p.incr("pk:%d" % (i - 5))  # not an integer: an error in the middle
                expected.append("ERR")
        got = p.execute(raise_on_error=False)
        self.assertEqual(len(got), 1000)
        for i, (g, e) in enumerate(zip(got, expected)):
            if e == "ERR":
                self.assertIsInstance(g, redis.ResponseError, "reply %d" % i)
                self.assertIn("not an integer", str(g))
            else:
                self.assertEqual(g, e, "reply %d out of order or wrong" % i)
        self.assertEqual(self.direct.llen("plist"), 1000 // 6 + (1 if 1000 % 6 > 3 else 0))

    def test_raw_pipeline_in_one_write_replies_in_order(self):
        c = self.raw()
        c.send(b"".join(encode("ECHO", "m%d" % i) for i in range(1000)))
        for i in range(1000):
            self.assertEqual(c.read_reply(), b"m%d" % i)
        self.assertEqual(c.read_available(0.2), b"", "extra bytes after the pipeline")

    def test_pipeline_split_at_every_byte(self):
        # A request that arrives one byte at a time must be handled like one arriving whole.
        c = self.raw()
        data = encode("SET", "split", "a\r\nb") + b"GET split\r\n" + encode("PING")
        for i in range(len(data)):
            c.send(data[i:i + 1])
            time.sleep(0.001)
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"a\r\nb")
        self.assertEqual(c.read_reply(), "PONG")

    # -- per-connection state ---------------------------------------------------------------

    def test_select_is_per_connection(self):
        a = self.fg.client(single_connection_client=True)
        b = self.fg.client(single_connection_client=True)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        self.assertTrue(a.execute_command("SELECT", 3))
        a.set("sel", "db3")
        self.assertIsNone(b.get("sel"), "SELECT on one connection leaked into another")
        b.set("sel", "db0")
        self.assertEqual(a.get("sel"), b"db3")
        self.assertEqual(self.redis.client(db=3).get("sel"), b"db3")
        self.assertEqual(self.direct.get("sel"), b"db0")

    def test_multi_exec_and_discard(self):
        c = self.raw()
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "tx", "1"), "QUEUED")
        self.assertEqual(c.call("INCR", "tx"), "QUEUED")
        self.assertIsNone(self.direct.get("tx"), "a queued command ran before EXEC")
        self.assertEqual(c.call("EXEC"), ["OK", 2])
        self.assertEqual(self.direct.get("tx"), b"2")

        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "tx", "discarded"), "QUEUED")
        self.assertEqual(c.call("DISCARD"), "OK")
        self.assertEqual(self.direct.get("tx"), b"2")
        self.assertEqual(c.call("EXEC"), Err("ERR EXEC without MULTI"))

        # A queuing error aborts the whole transaction, as in Redis.
        self.assertEqual(c.call("MULTI"), "OK")
        self.assertEqual(c.call("SET", "tx", "3"), "QUEUED")
        self.assertTrue(c.call("NOSUCHCMD").startswith("ERR unknown command"))
        self.assertTrue(c.call("EXEC").startswith("EXECABORT"))
        self.assertEqual(self.direct.get("tx"), b"2")

    def test_redis_py_transaction(self):
        p = self.r.pipeline(transaction=True)
        p.set("rtx", 5).incrby("rtx", 10).get("rtx")
        self.assertEqual(p.execute(), [True, 15, b"15"])

    def test_watch_aborts_when_another_connection_writes(self):
        self.direct.set("wk", "0")
        a = self.raw()
        other = self.fg.client()
        self.addCleanup(other.close)
        self.assertEqual(a.call("WATCH", "wk"), "OK")
        other.set("wk", "changed")
        self.assertEqual(a.call("MULTI"), "OK")
        self.assertEqual(a.call("SET", "wk", "mine"), "QUEUED")
        self.assertIsNone(a.call("EXEC"), "EXEC ran although a watched key changed")
        self.assertEqual(self.direct.get("wk"), b"changed")
        # Without interference the same sequence commits.
        self.assertEqual(a.call("WATCH", "wk"), "OK")
        self.assertEqual(a.call("MULTI"), "OK")
        self.assertEqual(a.call("SET", "wk", "mine"), "QUEUED")
        self.assertEqual(a.call("EXEC"), ["OK"])
        self.assertEqual(self.direct.get("wk"), b"mine")

    def test_watch_then_a_long_fenced_block_under_a_lock(self):
        # Holding a lock, the block is held back until EXEC and its marks checked first; with the
        # application's own WATCH the check goes alone, and the block after its answer. A block
        # of many commands grew the queue of pending replies while the check's reply was being
        # handled, which then went on with the queue's old memory (ASan: heap-use-after-free).
        a = self.raw()
        self.assertIsInstance(a.call("FENCE.ACQUIRE", "wl"), int)
        for rnd in range(3):
            n = 40
            self.assertEqual(a.call("WATCH", "{wl}w"), "OK")
            a.send(encode("MULTI") + b"".join(encode("SET", "{wl}w", "%d.%d" % (rnd, i))
                                              for i in range(n)) + encode("EXEC"))
            self.assertEqual(a.read_reply(), "OK")
            self.assertEqual([a.read_reply() for _ in range(n)], ["QUEUED"] * n)
            self.assertEqual(a.read_reply(), ["OK"] * n)
            self.assertEqual(self.direct.get("{wl}w"), b"%d.%d" % (rnd, n - 1))
        self.assertEqual(a.call("PING"), "PONG")

    def test_blpop_blocks_until_push_and_pipelined_reply_follows(self):
        a = self.raw()
        a.send(encode("BLPOP", "bq", "10") + encode("ECHO", "after"))
        self.assertEqual(a.read_available(0.5), b"", "BLPOP answered before anything was pushed")
        self.assertEqual(self.r.lpush("bq", "item"), 1)
        t0 = time.monotonic()
        self.assertEqual(a.read_reply(timeout=5), [b"bq", b"item"])
        self.assertLess(time.monotonic() - t0, 2.0, "BLPOP woke late")
        self.assertEqual(a.read_reply(), b"after")
        # The other connection was not blocked meanwhile.
        self.assertEqual(self.r.ping(), True)

    def test_blpop_timeout_returns_nil(self):
        a = self.raw()
        t0 = time.monotonic()
        self.assertIsNone(a.call("BLPOP", "nothing-here", "0.3", timeout=5))
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)

    # -- pub/sub ----------------------------------------------------------------------------

    def _get_message(self, p, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = p.get_message(timeout=0.2)
            if m is not None:
                return m
        self.fail("no pub/sub message within %.0fs" % timeout)

    def test_pubsub_resp2_with_redis_py(self):
        p = self.r.pubsub()
        self.addCleanup(p.close)
        p.subscribe("news")
        p.psubscribe("ev.*")
        self.assertEqual(self._get_message(p)["type"], "subscribe")
        self.assertEqual(self._get_message(p)["type"], "psubscribe")
        self.assertEqual(self.r.publish("news", "hello"), 1)
        self.assertEqual(self.r.publish("ev.one", "pat"), 1)
        self.assertEqual(self.r.publish("other", "x"), 0)
        m = self._get_message(p)
        self.assertEqual((m["type"], m["channel"], m["data"]), ("message", b"news", b"hello"))
        m = self._get_message(p)
        self.assertEqual((m["type"], m["pattern"], m["channel"], m["data"]),
                         ("pmessage", b"ev.*", b"ev.one", b"pat"))
        p.unsubscribe("news")
        p.punsubscribe("ev.*")
        self.assertEqual(self._get_message(p)["type"], "unsubscribe")
        self.assertEqual(self._get_message(p)["type"], "punsubscribe")
        self.assertEqual(self.r.publish("news", "gone"), 0)

    def test_pubsub_resp2_back_to_normal_commands_on_same_connection(self):
        c = self.raw()
        self.assertEqual(c.call("SUBSCRIBE", "c1", "c2"), [b"subscribe", b"c1", 1])
        self.assertEqual(c.read_reply(), [b"subscribe", b"c2", 2])
        # RESP2 subscribed mode refuses normal commands, exactly as Redis does.
        r = c.call("GET", "x")
        self.assertIsInstance(r, Err)
        self.assertIn("only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET", r)
        self.assertEqual(c.call("PING"), [b"pong", b""])
        self.assertEqual(self.r.publish("c2", "m"), 1)
        self.assertEqual(c.read_reply(), [b"message", b"c2", b"m"])
        c.cmd("UNSUBSCRIBE")
        got = [c.read_reply(), c.read_reply()]
        self.assertEqual(sorted(g[1] for g in got), [b"c1", b"c2"])
        self.assertEqual(got[-1][2], 0)
        self.assertEqual(c.call("SET", "x", "1"), "OK")
        self.assertEqual(c.call("GET", "x"), b"1")
        self.assertEqual(c.call("PING"), "PONG")

    def test_resp3_subscribe_push_frames(self):
        c = self.raw()
        hello = c.call("HELLO", "3")
        self.assertIsInstance(hello, dict)
        self.assertEqual(hello[b"proto"], 3)
        sub = c.call("SUBSCRIBE", "r3")
        self.assertIsInstance(sub, Push, "subscribe confirmation must be a '>' push frame")
        self.assertEqual(list(sub), [b"subscribe", b"r3", 1])
        self.assertEqual(self.r.publish("r3", "p1"), 1)
        # The push arrives with no command in flight on this connection.
        m = c.read_reply(timeout=5)
        self.assertIsInstance(m, Push)
        self.assertEqual(list(m), [b"message", b"r3", b"p1"])
        # RESP3 allows normal commands while subscribed; a message published before the command
        # comes before its reply.
        self.assertEqual(self.r.publish("r3", "p2"), 1)
        c.cmd("SET", "r3key", "v")
        m = c.read_reply()
        self.assertEqual((type(m), list(m)), (Push, [b"message", b"r3", b"p2"]))
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.call("GET", "r3key"), b"v")

    def test_resp3_subscriber_shows_as_subscribe_in_client_list_and_can_be_killed(self):
        # A RESP3 SUBSCRIBE went upstream with a PING of fencegate's own behind it, so Redis's
        # CLIENT LIST showed the subscriber's connection as cmd=ping: whoever finds subscribers
        # by cmd=subscribe to CLIENT KILL them (redis-py's suite does) missed it, and it stayed
        # subscribed (found by tests/compat/redispy_suite.sh --resp3).
        for kind in ("SUBSCRIBE", "PSUBSCRIBE"):
            c = self.raw()
            self.addCleanup(c.close)
            self.assertEqual(c.call("HELLO", "3")[b"proto"], 3)
            self.assertEqual(c.call(kind, "r3kill")[:2], [kind.lower().encode(), b"r3kill"])
            ours = [x for x in self.direct.client_list() if x["resp"] == "3"]
            self.assertEqual([x["cmd"] for x in ours], [kind.lower()])
            self.assertEqual(self.direct.execute_command("CLIENT", "KILL", "ID", ours[0]["id"]),
                             1)
            self.assertEqual(c.read_until_close(), b"")
            # A reply of fencegate's own still waits for the pushes before it, and a RESP3
            # unsubscribe leaves no trace in CLIENT LIST either.
            c = self.raw()
            self.addCleanup(c.close)
            c.send(encode("HELLO", "3") + encode(kind, "a", "b") + encode("CLIENT", "REPLY", "ON")
                   + encode(kind.replace("SUB", "UNSUB", 1), "a") + encode("ECHO", "end"))
            self.assertIsInstance(c.read_reply(), dict)
            got = [c.read_reply() for _ in range(5)]
            self.assertEqual([type(x) for x in got], [Push, Push, Status, Push, bytes], got)
            ours = [x for x in self.direct.client_list() if x["resp"] == "3"]
            self.assertEqual([x["cmd"] for x in ours], ["echo"])
            c.close()
            # A client that ends its side right after gets the pushes before the close.
            c = self.raw()
            self.addCleanup(c.close)
            c.send(encode("HELLO", "3") + encode(kind, "a", "b"))
            c.sock.shutdown(socket.SHUT_WR)
            self.assertIsInstance(c.read_reply(), dict)
            self.assertEqual([c.read_reply()[1:] for _ in range(2)], [[b"a", 1], [b"b", 2]])
            self.assertEqual(c.read_until_close(), b"")

    def test_resp3_client_tracking_invalidation_pushes(self):
        c = self.raw()
        self.assertEqual(c.call("HELLO", "3")[b"proto"], 3)
        self.assertEqual(c.call("CLIENT", "TRACKING", "on"), "OK")
        self.assertIsNone(c.call("GET", "tk1"))
        self.assertIsNone(c.call("GET", "tk2"))
        self.r.set("tk1", "x")
        # Unsolicited push while idle.
        m = c.read_reply(timeout=5)
        self.assertEqual((type(m), list(m)), (Push, [b"invalidate", [b"tk1"]]))
        # A push interleaved with normal replies keeps its place in the stream.
        self.assertEqual(c.call("GET", "tk1"), b"x")
        self.r.set("tk2", "y")
        c.send(encode("PING") + encode("GET", "tk2"))
        m = c.read_reply()
        self.assertEqual((type(m), list(m)), (Push, [b"invalidate", [b"tk2"]]))
        self.assertEqual(c.read_reply(), "PONG")
        self.assertEqual(c.read_reply(), b"y")
        self.assertEqual(c.read_available(0.2), b"")

    # -- CLIENT ... -------------------------------------------------------------------------

    def test_client_setname_getname_and_id_per_connection(self):
        a, b = self.raw(), self.raw()
        self.assertEqual(a.call("CLIENT", "SETNAME", "alpha"), "OK")
        self.assertEqual(a.call("CLIENT", "GETNAME"), b"alpha")
        self.assertIsNone(b.call("CLIENT", "GETNAME"), "client name leaked to another connection")
        ida, idb = a.call("CLIENT", "ID"), b.call("CLIENT", "ID")
        self.assertIsInstance(ida, int)
        self.assertNotEqual(ida, idb, "two client connections share one upstream connection")
        self.assertEqual(a.call("CLIENT", "ID"), ida, "CLIENT ID changed within one connection")
        names = [l for l in self.direct.client_list() if l.get("name") == "alpha"]
        self.assertEqual(len(names), 1)
        self.assertEqual(int(names[0]["id"]), ida)

    def test_client_kill_of_another_connection(self):
        victim, killer = self.raw(), self.raw()
        vid = victim.call("CLIENT", "ID")
        self.assertEqual(killer.call("CLIENT", "KILL", "ID", str(vid)), 1)
        # Redis closed the victim's upstream connection: the victim sees its connection end
        # (optionally after an -UNAVAILABLE), never a normal reply.
        try:
            victim.cmd("PING")
        except OSError:
            pass
        rest = victim.read_until_close(timeout=5)
        self.assertTrue(rest == b"" or rest.startswith(b"-UNAVAILABLE"),
                        "killed connection got %r" % rest[:100])
        self.assertEqual(killer.call("PING"), "PONG")
        ids = [int(l["id"]) for l in self.direct.client_list()]
        self.assertNotIn(vid, ids)

    def test_client_kill_of_its_own_connection_ends_it_as_redis_does(self):
        # Redis answers a CLIENT KILL that names the caller's own connection, then closes it:
        # what was pipelined behind the kill gets no reply at all (redis-rb's suite kills itself
        # by address, then lists the clients again on a new connection). fencegate answered those
        # requests -UNAVAILABLE "upstream ... is unreachable", an error no retry follows.
        fg_off = self.start_fencegate(self.redis, args=["--upstream-multiplex", "false"])
        for port in (self.redis.port, self.fg.resp_port, fg_off.resp_port):
            for form in ("addr", "ID"):  # the old form, and a filter without SKIPME's default
                c = super().raw(port)
                self.assertEqual(c.call("CLIENT", "SETNAME", "kill-self"), "OK")
                me = [l for l in self.direct.client_list() if l.get("name") == "kill-self"]
                self.assertEqual(len(me), 1, me)
                if form == "ID":
                    kill, want = ("ID", me[0]["id"], "SKIPME", "no"), b":1\r\n"
                else:
                    kill, want = (me[0]["addr"],), b"+OK\r\n"
                c.send(encode("CLIENT", "KILL", *kill) + encode("PING") + encode("GET", "k"))
                self.assertEqual(c.read_until_close(timeout=5), want,
                                 "CLIENT KILL %s of itself on port %d" % (form, port))
                harness.wait_until(
                    lambda: not [l for l in self.direct.client_list()
                                 if l.get("name") == "kill-self"],
                    5, what="the killed connection gone from CLIENT LIST")
        self.assertEqual(self.r.ping(), True)

    def test_shutdown_ends_the_connection_without_a_reply(self):
        # SHUTDOWN that succeeds is never answered: Redis closes every connection, the caller's
        # too (redis-rb's shutdown() takes the closed connection for success). fencegate
        # answered the caller -UNAVAILABLE "upstream ... is unreachable".
        for multiplex in ("true", "false"):
            victim = self.start_redis()
            fg = self.start_fencegate(victim, args=["--upstream-multiplex", multiplex])
            c = super().raw(fg.resp_port)
            c.send(encode("SHUTDOWN", "NOSAVE") + encode("PING"))
            self.assertEqual(c.read_until_close(timeout=10), b"",
                             "SHUTDOWN with upstream_multiplex %s" % multiplex)

    def test_client_reply_off_skip_on(self):
        c = self.raw()
        c.send(b"".join([
            encode("CLIENT", "REPLY", "OFF"),
            encode("SET", "ro", "1"),
            encode("PING"),
            encode("CLIENT", "REPLY", "ON"),
            encode("GET", "ro"),
            encode("CLIENT", "REPLY", "SKIP"),
            encode("SET", "rs", "2"),
            encode("ECHO", "x"),
        ]))
        expected = b"+OK\r\n$1\r\n1\r\n$1\r\nx\r\n"
        self.assertEqual(c.read_exact(len(expected)), expected)
        self.assertEqual(c.read_available(0.3), b"", "a suppressed reply was sent after all")
        # The silenced commands still ran.
        self.assertEqual(self.direct.mget("ro", "rs"), [b"1", b"2"])
        self.assertEqual(c.call("PING"), "PONG")
        # OFF then replies resume correctly across separate writes, too.
        self.assertIsNone(c.send(encode("CLIENT", "REPLY", "OFF")))
        self.assertEqual(c.read_available(0.2), b"")
        c.cmd("INCR", "roc")
        self.assertEqual(c.read_available(0.2), b"")
        self.assertEqual(c.call("CLIENT", "REPLY", "ON"), "OK")
        self.assertEqual(c.call("INCR", "roc"), 2)

    def test_monitor_sees_other_connections(self):
        m = self.raw()
        self.assertEqual(m.call("MONITOR"), "OK")
        self.r.set("monkey", "val")
        deadline = time.monotonic() + 5
        seen = []
        while time.monotonic() < deadline:
            line = m.read_reply(timeout=max(0.1, deadline - time.monotonic()))
            seen.append(line)
            if '"set" "monkey" "val"' in line.lower():
                break
        else:
            self.fail("MONITOR did not show the SET; saw %r" % seen)
        self.assertIsInstance(seen[-1], Status)

    def test_a_script_returning_a_table_that_contains_itself(self):
        # Redis answers with arrays nested as deep as Lua's stack goes (thousands of levels,
        # each the last element of its parent), then an error inside: relayed byte for byte.
        script = "local a = {}; local b = {a}; a[1] = b; return a"
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            c = harness.RawConn(port, timeout=10)
            self.addCleanup(c.close)
            c.send(encode("EVAL", script, "0") + encode("PING"))
            data = b""
            deadline = time.monotonic() + 10
            while not data.endswith(b"+PONG\r\n") and time.monotonic() < deadline:
                data += c.read_available(wait=0.2)
            got[name] = data
        self.assertGreater(got["direct"].count(b"*1\r\n"), 100)
        self.assertIn(b"-ERR reached lua stack limit", got["direct"])
        self.assertEqual(got["fencegate"], got["direct"])

    def test_resp3_types_from_scripts_are_relayed_as_is(self):
        # A script can return every RESP3 type, including what Redis never produces itself (a
        # big number with spaces in it): relayed byte for byte as Redis sends it.
        scripts = ["return {double=3.5}", "return {big_number='123\\r\\n123'}",
                   "return {big_number='-99999999999999999999999'}",
                   "return {map={a=1, b={set={x=true}}}}", "return {set={y=true}}",
                   "redis.setresp(3); return true", "redis.setresp(3); return false",
                   "return {{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{1}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}",
                   "return redis.call('hgetall', 'nothing')"]
        seq = encode("HELLO", "3") + b"".join(encode("EVAL", x, "0") for x in scripts)
        seq += encode("PING")
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            _, data = self.sent_and_read(port, seq, b"+PONG\r\n")
            got[name] = data[data.index(b"$4\r\nmode\r\n"):]  # past HELLO's connection id
        self.assertIn(b"(123  123\r\n", got["direct"])
        self.assertIn(b",3.5\r\n", got["direct"])
        self.assertEqual(got["fencegate"], got["direct"])

    def test_subscribed_in_resp3_then_back_to_resp2(self):
        # Redis's tracking suite redirects invalidations to a client that subscribed in RESP3
        # and then said HELLO 2: its messages then come as RESP2 replies, unpaired.
        c = self.raw()
        self.assertEqual(c.call("HELLO", "3")[b"proto"], 3)
        c.send(encode("SUBSCRIBE", "news"))
        self.assertEqual(c.read_reply(), Push([b"subscribe", b"news", 1]))
        c.send(encode("HELLO", "2"))
        hello = c.read_reply()
        self.assertEqual(hello[hello.index(b"proto") + 1], 2)
        self.assertEqual(self.r.publish("news", "one"), 1)
        self.assertEqual(c.read_reply(), [b"message", b"news", b"one"])
        # Still subscribed: a PING is answered the pub/sub way, and the stream goes on.
        self.assertEqual(c.call("PING"), [b"pong", b""])
        self.assertEqual(self.r.publish("news", "two"), 1)
        self.assertEqual(c.read_reply(), [b"message", b"news", b"two"])
        c.send(encode("UNSUBSCRIBE"))
        self.assertEqual(c.read_reply(), [b"unsubscribe", b"news", 0])
        self.assertEqual(c.call("SET", "after", "1"), "OK")

    def sent_and_read(self, port, seq, end, timeout=10):
        """Sends seq on a new connection to port; returns it and what came back up to `end`."""
        c = harness.RawConn(port, timeout=timeout)
        self.addCleanup(c.close)
        c.send(seq)
        data = b""
        deadline = time.monotonic() + timeout
        while not data.endswith(end) and time.monotonic() < deadline:
            data += c.read_available(wait=0.05)
        return c, data

    # -- CLIENT REPLY ---------------------------------------------------------------------------

    def test_client_reply_modes_answer_as_redis_does(self):
        seq = (encode("CLIENT", "REPLY", "OFF") + encode("SET", "cr", "1") + encode("PING")
               + encode("CLIENT", "REPLY", "SKIP") + encode("INCR", "cr")
               + encode("CLIENT", "REPLY", "ON") + encode("GET", "cr")
               + encode("CLIENT", "REPLY", "SKIP") + encode("ECHO", "a") + encode("ECHO", "b")
               + encode("CLIENT", "REPLY", "MAYBE") + encode("PING")
               + encode("CLIENT", "REPLY", "OFF") + encode("RESET") + encode("ECHO", "c")
               # RESET turns OFF off before it answers, but a SKIP still silences its answer
               + encode("CLIENT", "REPLY", "SKIP") + encode("RESET") + encode("ECHO", "d"))
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            self.direct.delete("cr")
            c = harness.RawConn(port, timeout=5)
            self.addCleanup(c.close)
            c.send(seq)
            got[name] = [c.read_reply() for _ in range(8)]
            self.assertEqual(c.read_available(wait=0.2), b"", name)
        self.assertEqual(got["fencegate"], got["direct"])
        self.assertEqual(got["direct"][:3], ["OK", b"2", b"b"])

    def test_replies_fencegate_makes_itself_follow_resp3_pushes_as_redis_sends_them(self):
        # In RESP3, SUBSCRIBE and UNSUBSCRIBE are answered with pushes only; the +OK of a CLIENT
        # REPLY ON (which fencegate answers) came before them (found by resp_diff.py). Under
        # CLIENT REPLY OFF, a protocol error is not answered (Redis leaves the connection open
        # then; fencegate closes it).
        seq = (encode("CLIENT", "REPLY", "SKIP") + encode("HELLO", "3")
               + encode("SUBSCRIBE", "ch") + encode("PUBLISH", "ch", "m") + encode("UNSUBSCRIBE")
               + encode("CLIENT", "REPLY", "ON") + encode("ECHO", "end"))
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            c, got[name] = self.sent_and_read(port, seq, b"$3\r\nend\r\n")
            c.send(encode("CLIENT", "REPLY", "OFF") + b"*1\r\n$abc\r\n")
            self.assertEqual(c.read_available(wait=0.3), b"", name)
        self.assertEqual(got["fencegate"], got["direct"])
        self.assertIn(b"+OK\r\n$3\r\nend\r\n", got["direct"])

    def test_subscriptions_and_their_messages_pass_client_reply_off(self):
        # Redis pushes pub/sub confirmations and messages whatever the reply mode (its own
        # suite checks keyspace notifications this way).
        self.direct.config_set("notify-keyspace-events", "KA")
        c = self.raw()
        c.send(encode("CLIENT", "REPLY", "OFF") + encode("PSUBSCRIBE", "*"))
        self.assertEqual(c.read_reply(), [b"psubscribe", b"*", 1])
        self.r.set("ks", "v")
        self.assertEqual(c.read_reply(), [b"pmessage", b"*", b"__keyspace@0__:ks", b"set"])

    def test_client_reply_off_silences_answers_in_pub_sub_mode_too(self):
        # Under CLIENT REPLY OFF a RESP2 subscriber got PING's answer and the error of a command
        # pub/sub mode refuses from fencegate, not from Redis, which still sends only the
        # confirmations and the messages (found by resp_diff.py --cross).
        seq = (encode("CLIENT", "REPLY", "OFF") + encode("SUBSCRIBE", "ch") + encode("PING")
               + encode("PING", "x") + encode("GET", "k") + encode("HELLO", "3")
               + encode("SUBSCRIBE", "end"))
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            c, got[name] = self.sent_and_read(port, seq, b"$3\r\nend\r\n:2\r\n")
            self.direct.publish("ch", "m")
            got[name] += c.read_available(wait=0.3)
        self.assertEqual(got["fencegate"], got["direct"])
        self.assertEqual(got["direct"], b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
                         b"*3\r\n$9\r\nsubscribe\r\n$3\r\nend\r\n:2\r\n"
                         b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n")

    def test_a_push_redis_sends_inside_a_reply_passes_through(self):
        # Redis 7.0 serving a blocked BZPOPMAX of a RESP3 client that listens to keyspace
        # events writes the "zpopmax" event inside its reply (*3, the key, the push, member and
        # score). fencegate counted the push as an element, took the score for a reply nobody
        # asked for and closed the connection (found by resp_diff.py --cross).
        self.direct.config_set("notify-keyspace-events", "KEA")
        self.addCleanup(self.direct.config_set, "notify-keyspace-events", "")
        got = {}
        for name, port in (("direct", self.redis.port), ("fencegate", self.fg.resp_port)):
            self.direct.delete("pz")
            c, _ = self.sent_and_read(port, encode("CLIENT", "REPLY", "SKIP") + encode("HELLO", "3")
                                      + encode("PSUBSCRIBE", "__keyevent@0__:*")
                                      + encode("ECHO", "sub"), b"$3\r\nsub\r\n")
            c.send(encode("BZPOPMAX", "pz", "0"))
            time.sleep(0.2)
            self.direct.zadd("pz", {"m": 1})
            got[name] = c.read_available(wait=0.3)
            c.send(encode("ECHO", "after"))
            got[name] += c.read_available(wait=0.3)
        self.assertEqual(got["fencegate"], got["direct"])
        self.assertTrue(got["direct"].endswith(b"$5\r\nafter\r\n"), got["direct"])

    # -- replication --------------------------------------------------------------------------

    def read_sync_payload(self, c):
        """Reads SYNC's answer up to the end of its RDB payload: keepalive newlines, "$N\\r\\n" and
        N bytes (no CRLF after them: not a RESP reply). Returns the payload."""
        while True:
            first = c.read_exact(1)
            if first != b"\n":
                break
        line = first
        while not line.endswith(b"\r\n"):
            line += c.read_exact(1)
        self.assertTrue(line.startswith(b"$"), line)
        return c.read_exact(int(line[1:-2]))

    def test_sync_streams_the_rdb_and_then_the_commands(self):
        self.direct.set("before:sync", "1")
        c = self.raw(timeout=20)
        # Pipelined: Redis itself would refuse this SYNC ("pending output"); fencegate sends it
        # once PONG is in, as it must after the AUTH/SELECT it sends on a new connection.
        c.send(encode("PING") + encode("SYNC"))
        self.assertEqual(c.read_reply(), "PONG")
        rdb = self.read_sync_payload(c)
        self.assertTrue(rdb.startswith(b"REDIS"), rdb[:16])
        self.assertIn(b"before:sync", rdb)
        self.assertTrue(self.r.set("after:sync", "2"))
        want = encode("SET", "after:sync", "2")
        got = b""
        deadline = time.monotonic() + 5
        while want not in got and time.monotonic() < deadline:
            got += c.read_available(wait=0.2)
        self.assertIn(want, got, "the write is propagated on the stream, byte for byte")
        # The replica's acknowledgements go up; anything else would run unanswered, unfenced.
        c.send(encode("REPLCONF", "ACK", "0"))
        c.send(encode("SET", "from:replica", "x"))
        c.read_until_close(timeout=5)
        self.assertIsNone(self.direct.get("from:replica"))
        self.assertTrue(self.r.ping())

    def test_sync_waits_for_fencegates_own_auth(self):
        # On a password-protected upstream, a new connection starts with fencegate's AUTH; SYNC
        # sent in the same write would find its reply pending and be refused.
        secured = self.start_redis()
        d = secured.client()
        self.addCleanup(d.close)
        d.config_set("requirepass", "s3cret")
        fg = self.start_fencegate("redis://:s3cret@127.0.0.1:%d" % secured.port)
        c = harness.RawConn(fg.resp_port, timeout=20)
        self.addCleanup(c.close)
        c.send(encode("SYNC"))
        self.assertTrue(self.read_sync_payload(c).startswith(b"REDIS"))

    def test_a_redis_replica_replicates_through_fencegate(self):
        self.direct.config_set("repl-diskless-sync-delay", "0")
        self.direct.set("k:before", "v0")
        replica = self.start_redis()
        rc = replica.client()
        self.addCleanup(rc.close)
        rc.replicaof("127.0.0.1", self.fg.resp_port)  # PSYNC through fencegate
        harness.wait_until(lambda: rc.info("replication")["master_link_status"] == "up", 15,
                           what="the replica in sync")
        self.assertEqual(rc.get("k:before"), b"v0")
        self.r.set("k:after", "v1")
        harness.wait_until(lambda: rc.get("k:after") == b"v1", 5, what="the write replicated")
        # Its REPLCONF ACKs reach the master through fencegate: the offset it reports moves.
        off = self.direct.info("replication")["master_repl_offset"]
        harness.wait_until(
            lambda: self.direct.info("replication").get("slave0", {}).get("offset", -1) >= off,
            5, what="the replica's ACK of offset %d" % off)

    def test_quit_replies_ok_then_closes(self):
        c = self.raw()
        c.send(encode("QUIT") + encode("PING"))
        self.assertEqual(c.read_until_close(timeout=5), b"+OK\r\n")
        self.assertEqual(self.r.ping(), True)

    def test_a_client_that_ends_its_side_gets_every_reply(self):
        # `printf ... | nc -N`: a client sends its requests, ends its side of the stream and
        # reads to the end. Redis answers every request it was sent, then closes; so must
        # fencegate, on the shared upstream connection, on a connection of the client's own, and
        # past a pipeline deep enough to move the client from the one to the other.
        def exchange(payload):
            c = self.raw()
            c.send(payload)
            c.sock.shutdown(socket.SHUT_WR)
            return c.read_until_close(timeout=5)

        cases = [
            (b"PING\r\n", b"+PONG\r\n"),
            (b"SELECT 0\r\nGET hc:none\r\n", b"+OK\r\n$-1\r\n"),
            (b"MULTI\r\nSET hc:m 1\r\nINCR hc:m\r\nEXEC\r\n",
             b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:2\r\n"),
            (b"INCR hc:n\r\n" * 3000, b"".join(b":%d\r\n" % i for i in range(1, 3001))),
            (b"SET hc:partial", b""),
        ]
        for payload, want in cases:
            for via in (self.redis.port, self.fg.resp_port):
                self.direct.delete("hc:m", "hc:n")
                c = super().raw(via)
                c.send(payload)
                c.sock.shutdown(socket.SHUT_WR)
                self.assertEqual(c.read_until_close(timeout=5), want, (via, payload[:30]))
        # A blocked command is dropped, as Redis drops it when it reads the end of the stream;
        # what came before it is answered, and no client is left blocked in Redis.
        self.assertEqual(exchange(b"PING\r\nBLPOP hc:none 0\r\nPING\r\n"), b"+PONG\r\n")
        self.assertEqual(exchange(b"SELECT 0\r\nBLPOP hc:none 0\r\nGET hc:"), b"+OK\r\n")
        harness.wait_until(lambda: b"cmd=blpop" not in self.direct.execute_command(
            "CLIENT", "LIST"), 3, 0.02, "the blocked upstream client gone")
        # One served at once is answered, and its element is not lost.
        self.direct.rpush("hc:l", "a")
        self.assertEqual(exchange(b"SELECT 0\r\nBLPOP hc:l 0\r\n"),
                         b"+OK\r\n*2\r\n$4\r\nhc:l\r\n$1\r\na\r\n")
        self.assertEqual(self.r.ping(), True)

    def test_a_client_that_ends_its_side_while_blocked_takes_nothing_pushed_later(self):
        # Behind a blocked command, a request fencegate answers itself (CLIENT REPLY ON) kept it
        # from passing the end on: the BLPOP stayed blocked in Redis after its client had gone,
        # and took the next element another client pushed (found by resp_diff.py --cross).
        for tail in (b"CLIENT REPLY ON\r\n", b"CLIENT REPLY ON\r\nPING\r\n"):
            for via in (self.redis.port, self.fg.resp_port):
                c = super().raw(via)
                c.send(b"SELECT 0\r\nBLPOP hc:q 0\r\n" + tail)
                c.sock.shutdown(socket.SHUT_WR)
                self.assertEqual(c.read_until_close(timeout=5), b"+OK\r\n", (via, tail))
                self.direct.rpush("hc:q", "x")
                time.sleep(0.2)
                self.assertEqual(self.direct.lpop("hc:q"), b"x", (via, tail))
        # Not blocked, everything is answered, fencegate's own replies in their place.
        for via in (self.redis.port, self.fg.resp_port):
            c = super().raw(via)
            c.send(b"SELECT 0\r\nGET hc:none\r\nCLIENT REPLY ON\r\nPING\r\n"
                   b"CLIENT REPLY ON\r\n")
            c.sock.shutdown(socket.SHUT_WR)
            self.assertEqual(c.read_until_close(timeout=5),
                             b"+OK\r\n$-1\r\n+OK\r\n+PONG\r\n+OK\r\n", via)

    # -- inline, binary, sizes --------------------------------------------------------------

    def test_inline_commands(self):
        c = self.raw()
        c.send(b"PING\r\n")
        self.assertEqual(c.read_reply(), "PONG")
        c.send(b"SET a b\n")
        self.assertEqual(c.read_reply(), "OK")
        c.send(b'SET k "a b"\r\nGET k\r\n')
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"a b")
        c.send(b"SET k2 \"x\\ny\\x41\"\r\nSET k3 'c d'\r\n  GET   k2  \r\n")
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"x\nyA")
        self.assertEqual(self.direct.mget("a", "k", "k3"), [b"b", b"a b", b"c d"])
        # Inline and multibulk mixed in one write.
        c.send(b"ECHO one\r\n" + encode("ECHO", "two") + b"ECHO three\n")
        self.assertEqual([c.read_reply() for _ in range(3)], [b"one", b"two", b"three"])

    def test_binary_safe_values(self):
        value = b"\x00\r\nbinary\r\n\x00\xff\xfe*3\r\n$-1\r\n"
        key = b"bin\x00key\r\n"
        self.assertTrue(self.r.set(key, value))
        self.assertEqual(self.r.get(key), value)
        self.assertEqual(self.direct.get(key), value)
        c = self.raw()
        self.assertEqual(c.call("GET", key), value)
        every = bytes(range(256)) * 4
        self.assertEqual(c.call("SET", "every", every), "OK")
        self.assertEqual(self.direct.get("every"), every)

    def test_20mb_value_intact(self):
        big = os.urandom(1024) * (20 * 1024)  # 20 MiB
        self.assertTrue(self.r.set("big20", big))
        got = self.r.get("big20")
        self.assertEqual(len(got), len(big))
        self.assertEqual(harness.sha(got), harness.sha(big))
        self.assertEqual(harness.sha(self.direct.get("big20")), harness.sha(big))

    def test_empty_line_and_zero_multibulk_get_no_reply(self):
        c = self.raw()
        c.send(b"\r\n*0\r\n\n*-1\r\nPING\r\n")
        self.assertEqual(c.read_exact(7), b"+PONG\r\n")
        self.assertEqual(c.read_available(0.3), b"", "an empty request was answered")

    # -- start ------------------------------------------------------------------------------

    def test_a_command_sent_once_the_port_accepts_is_served_not_refused(self):
        # Test harnesses and supervisors wait for the port, then send commands (Perl Redis.pm's
        # test suite: connect, then INFO). A Redis whose port accepts serves them; fencegate
        # did not until its first probe of Redis returned: they got -UNAVAILABLE ... not
        # probed yet. Redis paused for 500 ms holds that probe back.
        self.direct.execute_command("CLIENT", "PAUSE", "500", "ALL")
        fg = self.start_fencegate(self.redis, ready=False)
        harness.wait_until(lambda: harness.port_accepts(fg.resp_port), 5, 0.005,
                           "the RESP port accepting")
        c = harness.RawConn(fg.resp_port)
        self.addCleanup(c.close)
        c.send(encode("SET", "first", "v") + encode("GET", "first"))
        self.assertEqual(c.read_reply(), "OK")
        self.assertEqual(c.read_reply(), b"v")

    # -- redis-cli --------------------------------------------------------------------------

    def _cli(self, *args, input=None):
        p = subprocess.run([harness.REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.fg.resp_port)]
                           + list(args), input=input, capture_output=True, timeout=30,
                           env=harness.clean_env())
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def test_redis_cli_one_shot(self):
        self.assertEqual(self._cli("SET", "cli", "hello world")[:2], (0, "OK\n"))
        self.assertEqual(self._cli("GET", "cli")[:2], (0, "hello world\n"))
        self.assertEqual(self._cli("-n", "2", "SET", "cli", "db2")[:2], (0, "OK\n"))
        self.assertEqual(self._cli("GET", "cli")[:2], (0, "hello world\n"))
        rc, out, _ = self._cli("INFO", "server")
        self.assertEqual(rc, 0)
        self.assertIn("redis_version:", out)

    def test_redis_cli_pipe_mode(self):
        n = 20000
        data = b"".join(encode("SET", "pipe:%d" % i, "v%d" % i) for i in range(n))
        rc, out, err = self._cli("--pipe", input=data)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("errors: 0, replies: %d" % n, out)
        self.assertEqual(self.direct.dbsize(), n)
        self.assertEqual(self.direct.get("pipe:%d" % (n - 1)), b"v%d" % (n - 1))


if __name__ == "__main__":
    unittest.main()
