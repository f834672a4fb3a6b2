"""The shared upstream connection: clients without connection state share one connection to
Redis; the first command that needs state of its own moves the client to a connection of its own
("pins" it), after the replies it still has due on the shared one (README, "Upstream
connections")."""

import os
import time
import unittest

import harness  # first: it makes sure redis-py is importable
from harness import Err, FgTestCase, Status, encode

PINNED = "fencegate_clients_pinned_total"


class Multiplex(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis, args=["--upstream-multiplex", "true"])
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def pinned(self):
        return self.fg.metrics().get(PINNED, 0)

    def redis_clients(self):
        return len(self.direct.client_list())

    def test_interleaved_pipelines_of_many_clients_get_their_own_replies(self):
        conns = [self.raw(self.fg.resp_port) for _ in range(40)]
        # Every client writes before any reads, so their requests interleave on one connection.
        for i, c in enumerate(conns):
            c.send(b"".join(encode("SET", "k:%d:%d" % (i, j), "v:%d:%d" % (i, j)) +
                            encode("GET", "k:%d:%d" % (i, j)) for j in range(10)) +
                   encode("ECHO", "end-%d" % i))
        for i, c in enumerate(conns):
            for j in range(10):
                self.assertEqual(c.read_reply(), Status("OK"), "client %d SET %d" % (i, j))
                self.assertEqual(c.read_reply(), b"v:%d:%d" % (i, j), "client %d GET %d" % (i, j))
            self.assertEqual(c.read_reply(), b"end-%d" % i)
        # 40 busy clients, and Redis saw one connection for them (plus fencegate's health probe
        # and lock backend, and this test's own).
        self.assertLessEqual(self.redis_clients(), 5)
        self.assertEqual(self.pinned(), 0)

    def test_select_pins_after_the_shared_replies_and_keeps_the_order(self):
        c = self.raw(self.fg.resp_port)
        c.send(encode("SET", "a", "zero") + encode("INCR", "n") + encode("SELECT", "3") +
               encode("SET", "a", "three") + encode("GET", "a") + encode("INCR", "n"))
        self.assertEqual([c.read_reply() for _ in range(6)],
                         [Status("OK"), 1, Status("OK"), Status("OK"), b"three", 1])
        self.assertEqual(self.direct.get("a"), b"zero")
        self.assertEqual(self.redis.client(db=3).get("a"), b"three")
        self.assertEqual(self.pinned(), 1)
        # Another client is still on database 0.
        other = self.raw(self.fg.resp_port)
        self.assertEqual(other.call("GET", "a"), b"zero")
        self.assertEqual(self.pinned(), 1)

    def test_which_commands_pin(self):
        self.direct.xadd("s", {"f": "v"})
        stateless = [("GET", "x"), ("SET", "x", "1"), ("PING",), ("ECHO", "e"), ("INCR", "i"),
                     ("DBSIZE",), ("XREAD", "STREAMS", "s", "0"), ("MGET", "x", "y"),
                     ("FENCE.LOCKS",)]
        for cmd in stateless:
            c = self.raw(self.fg.resp_port)
            self.assertNotIsInstance(c.call(*cmd), Err, cmd)
            self.assertEqual(self.pinned(), 0, "%s pinned its client" % (cmd,))
            c.close()
        stateful = [("SELECT", "0"), ("CLIENT", "SETNAME", "n"), ("MULTI",), ("WATCH", "x"),
                    ("BLPOP", "nolist", "0.05"), ("SUBSCRIBE", "ch"), ("EVAL", "return 1", "0"),
                    ("HELLO", "2"), ("XREAD", "BLOCK", "50", "STREAMS", "s", "$"),
                    ("CONFIG", "GET", "maxclients"), ("NOSUCHCOMMAND",)]
        for n, cmd in enumerate(stateful, 1):
            c = self.raw(self.fg.resp_port)
            c.call(*cmd)
            self.assertEqual(self.pinned(), n, "%s did not pin its client" % (cmd,))
            c.close()

    def test_client_gone_with_replies_due_leaves_others_intact(self):
        self.direct.set("big", os.urandom(100 * 1024))
        other = self.raw(self.fg.resp_port)
        for round_ in range(5):
            gone = self.raw(self.fg.resp_port)
            gone.send(encode("GET", "big") * 30)
            gone.close()  # its 30 replies are still due on the shared connection
            other.send(b"".join(encode("SET", "o%d" % j, "%d:%d" % (round_, j)) +
                                encode("GET", "o%d" % j) for j in range(12)))
            for j in range(12):
                self.assertEqual(other.read_reply(), Status("OK"))
                self.assertEqual(other.read_reply(), b"%d:%d" % (round_, j))
        self.assertTrue(self.fg.alive())
        self.assertEqual(self.pinned(), 0)

    def test_deep_pipeline_pins(self):
        c = self.raw(self.fg.resp_port)
        c.send(b"".join(encode("INCR", "deep") for _ in range(500)))
        self.assertEqual([c.read_reply() for _ in range(500)], list(range(1, 501)))
        self.assertEqual(self.pinned(), 1)

    def test_upstream_restart_keeps_unpinned_clients(self):
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("SET", "k", "v"), Status("OK"))
        self.redis.stop()
        got = c.call("GET", "k")
        self.assertIsInstance(got, Err)
        self.assertTrue(str(got).startswith("UNAVAILABLE"), got)
        self.redis.start()  # same port, empty data set

        def works():
            r = c.call("SET", "k", "again")
            return r == Status("OK")
        harness.wait_until(works, 10, 0.2, "the same connection to work after Redis restarted")
        self.assertEqual(c.call("GET", "k"), b"again")
        self.assertEqual(self.pinned(), 0)

    def test_upstream_password_and_database_on_both_kinds_of_connection(self):
        self.direct.config_set("requirepass", "s3cret")
        self.addCleanup(lambda: self.redis.client(password="s3cret").config_set("requirepass", ""))
        url = "redis://:s3cret@127.0.0.1:%d/2" % self.redis.port
        fg = self.start_fencegate(url, args=["--upstream-multiplex", "true"])
        shared, pinned = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.assertEqual(shared.call("SET", "on", "shared"), Status("OK"))
        self.assertEqual(pinned.call("CLIENT", "SETNAME", "p"), Status("OK"))
        self.assertEqual(pinned.call("SET", "on2", "pinned"), Status("OK"))
        db2 = self.redis.client(db=2, password="s3cret")
        self.addCleanup(db2.close)
        self.assertEqual(db2.mget("on", "on2"), [b"shared", b"pinned"])

        wrong = "redis://:nope@127.0.0.1:%d/2" % self.redis.port
        bad = self.start_fencegate(wrong, args=["--upstream-multiplex", "true"], readyz=False)
        got = self.raw(bad.resp_port).call("GET", "on")
        self.assertIsInstance(got, Err)
        self.assertTrue(str(got).startswith("UNAVAILABLE"), got)

    def test_dedicated_when_multiplexing_is_off(self):
        fg = self.start_fencegate(self.redis, args=["--upstream-multiplex", "false"])
        before = self.redis_clients()
        conns = [self.raw(fg.resp_port) for _ in range(10)]
        for c in conns:
            self.assertEqual(c.call("PING"), Status("PONG"))
        self.assertEqual(self.redis_clients(), before + 10)


if __name__ == "__main__":
    unittest.main()
