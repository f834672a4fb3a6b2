"""Malformed, hostile and oversized input on the RESP endpoint: answered like Redis answers it,
only the offending connection is closed, and memory stays bounded."""

import time
import unittest

import harness
from harness import FgTestCase, encode

# (name, bytes sent, exact reply). The texts are Redis 7's own; the connection is then closed.
PROTOCOL_ERRORS = [
    ("invalid bulk length", b"*1\r\n$abc\r\n", b"-ERR Protocol error: invalid bulk length\r\n"),
    ("huge bulk length", b"*1\r\n$99999999999\r\n",
     b"-ERR Protocol error: invalid bulk length\r\n"),
    ("negative bulk length", b"*2\r\n$3\r\nGET\r\n$-5\r\n",
     b"-ERR Protocol error: invalid bulk length\r\n"),
    ("invalid multibulk length", b"*abc\r\n", b"-ERR Protocol error: invalid multibulk length\r\n"),
    ("expected $", b"*1\r\nxyz\r\n", b"-ERR Protocol error: expected '$', got 'x'\r\n"),
    ("unbalanced quotes", b'SET k "abc\r\n',
     b"-ERR Protocol error: unbalanced quotes in request\r\n"),
    ("too big inline", b"A" * 70000, b"-ERR Protocol error: too big inline request\r\n"),
]


class BadInput(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis)
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def raw(self, timeout=5.0):
        return super().raw(self.fg.resp_port, timeout)

    @staticmethod
    def _send_tolerant(conn, data):
        """Sends data; the server may close before it has read everything."""
        try:
            conn.send(data)
        except OSError:
            pass

    def test_protocol_errors_exact_text_then_close(self):
        for name, data, reply in PROTOCOL_ERRORS:
            with self.subTest(name):
                good = self.raw()
                self.assertEqual(good.call("SELECT", "1"), "OK")
                self.assertEqual(good.call("SET", "state", name), "OK")
                bad = self.raw()
                self._send_tolerant(bad, data)
                self.assertEqual(bad.read_until_close(timeout=5), reply)
                # The connection opened before the bad one carries on, with its state.
                self.assertEqual(good.call("GET", "state"), name.encode())
                self.assertEqual(good.call("PING"), "PONG")
        # ... and new connections are served.
        self.assertTrue(self.fg.client().ping())

    def test_max_args_bounds_inline_and_multibulk_commands(self):
        fg = self.start_fencegate(self.redis, args=["--max-args", "10"])
        ok = self.raw_to(fg)
        self.assertEqual(ok.call("RPUSH", "a", *range(8)), 8)  # 10 arguments
        for name, data, reply in [
                ("multibulk", encode("RPUSH", "b", *range(9)),
                 b"-ERR Protocol error: invalid multibulk length\r\n"),
                ("inline", b"RPUSH c " + b" ".join(b"%d" % i for i in range(20)) + b"\r\n",
                 b"-ERR Protocol error: too many arguments in inline request\r\n")]:
            with self.subTest(name):
                bad = self.raw_to(fg)
                self._send_tolerant(bad, data)
                self.assertEqual(bad.read_until_close(timeout=5), reply)
        self.assertEqual(self.direct.exists("b", "c"), 0, "nothing past the limit reached Redis")
        self.assertEqual(ok.call("PING", "x"), b"x")

    def raw_to(self, fg):
        return super().raw(fg.resp_port, 5.0)

    def test_protocol_error_after_valid_commands_keeps_order(self):
        # Redis answers the commands before the bad bytes, then the error, then closes.
        bad = self.raw()
        bad.send(encode("SET", "before", "1") + b"PING\r\n*1\r\n$abc\r\n"
                 + encode("SET", "after", "1"))
        self.assertEqual(bad.read_until_close(timeout=5),
                         b"+OK\r\n+PONG\r\n-ERR Protocol error: invalid bulk length\r\n")
        self.assertEqual(self.direct.get("before"), b"1")
        self.assertIsNone(self.direct.get("after"), "a command after the protocol error ran")

    def test_protocol_error_split_across_writes(self):
        bad = self.raw()
        bad.send(b"*2\r\n$3\r\nGET\r\n")
        time.sleep(0.1)
        bad.send(b"$1")
        time.sleep(0.1)
        bad.send(b"x\r\n")
        self.assertEqual(bad.read_until_close(timeout=5),
                         b"-ERR Protocol error: invalid bulk length\r\n")

    def test_unknown_command_gets_redis_own_error(self):
        for req in (encode("FOOBAR", "a", "b"), b"nosuch x y z\r\n", encode("GET")):
            with self.subTest(req=req):
                want = harness.RawConn(self.redis.port)
                self.addCleanup(want.close)
                want.send(req)
                expected = want.read_raw_reply()
                c = self.raw()
                c.send(req + encode("PING"))
                self.assertEqual(c.read_raw_reply(), expected)
                self.assertEqual(c.read_reply(), "PONG", "connection unusable after an error reply")

    def test_huge_declared_multibulk_does_not_allocate(self):
        # 200 connections each declare 2^31-1 arguments and send one. Memory must follow the
        # bytes received, not the counts declared.
        warm = self.fg.client()
        self.addCleanup(warm.close)
        for _ in range(50):
            warm.ping()
        before = harness.rss_kib(self.fg.pid)
        conns = []
        for i in range(200):
            c = self.raw(timeout=5)
            conns.append(c)
            self._send_tolerant(c, b"*2147483647\r\n$3\r\nSET\r\n")
        time.sleep(1.0)
        self.assertTrue(self.fg.alive(), "fencegate died")
        peak = before
        for _ in range(5):
            peak = max(peak, harness.rss_kib(self.fg.pid))
            time.sleep(0.05)
        self.assertLess(peak - before, 40 * 1024,
                        "RSS grew from %d KiB to %d KiB for 200 tiny requests" % (before, peak))
        # Each is either still waiting for more arguments or was refused as Redis-style
        # protocol error; nothing else.
        for c in conns:
            got = c.read_available(0.01)
            self.assertTrue(got == b"" or got.startswith(b"-ERR Protocol error"),
                            "unexpected reply %r" % got[:100])
        self.assertEqual(warm.set("still", "works"), True)
        self.assertEqual(warm.get("still"), b"works")
        fresh = self.raw()
        self.assertEqual(fresh.call("PING"), "PONG")

    def test_request_above_max_request_bytes_is_refused_and_closed(self):
        fg = self.start_fencegate(self.redis, args=["--max-request-bytes", "65536"])
        ok = harness.RawConn(fg.resp_port)
        self.addCleanup(ok.close)
        small = b"s" * 60000
        self.assertEqual(ok.call("SET", "small", small), "OK")
        self.assertEqual(self.direct.get("small"), small)

        bad = harness.RawConn(fg.resp_port)
        self.addCleanup(bad.close)
        self._send_tolerant(bad, encode("SET", "huge", b"h" * 100000))
        got = bad.read_until_close(timeout=5)
        self.assertTrue(got.startswith(b"-ERR") and got.endswith(b"\r\n")
                        and got.count(b"\r\n") == 1,
                        "expected one -ERR reply then close, got %r" % got[:200])
        self.assertIsNone(self.direct.get("huge"), "the oversized request reached Redis")
        self.assertEqual(ok.call("PING"), "PONG")

    def test_max_clients(self):
        fg = self.start_fencegate(self.redis, args=["--max-clients", "3"])
        held = []
        for i in range(3):
            c = harness.RawConn(fg.resp_port)
            self.addCleanup(c.close)
            self.assertEqual(c.call("PING"), "PONG", "connection %d of 3 refused" % (i + 1))
            held.append(c)
        extra = harness.RawConn(fg.resp_port)
        self.addCleanup(extra.close)
        self._send_tolerant(extra, encode("PING"))
        self.assertEqual(extra.read_until_close(timeout=5),
                         b"-ERR max number of clients reached\r\n")
        for c in held:
            self.assertEqual(c.call("PING"), "PONG")
        # A slot freed is a slot reusable (fencegate may need a moment to see the close).
        held.pop().close()

        def admitted():
            c = harness.RawConn(fg.resp_port)
            try:
                return c.call("PING") == "PONG"
            except (EOFError, OSError):
                return False
            finally:
                c.close()
        harness.wait_until(admitted, 5, 0.1, "a new connection after one was closed")


if __name__ == "__main__":
    unittest.main()
