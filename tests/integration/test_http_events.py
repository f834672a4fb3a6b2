"""GET /v1/events (DESIGN.md §1, "HTTP 409 and an event"): a Server-Sent Events stream of what
happens to the locks held over HTTP, so an application learns that its lock was lost when it
happens, not at its next write. Events: acquired, released, lost, app_unhealthy, app_healthy,
shutdown; ?lock=NAME follows one lock. Limits: 64 streams, 256 KiB unread per stream."""

import http.client
import json
import signal
import socket
import threading
import time
import unittest

import harness
from harness import FgTestCase


class EventStream:
    """One GET /v1/events, read event by event."""

    def __init__(self, port, query="", timeout=10):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("GET", "/v1/events" + query)
        self.resp = self.conn.getresponse()

    def next(self):
        """The next event as (id, type, data dict); None when the stream ended. Comment lines
        (keepalives) and the retry field are skipped."""
        fields = {}
        while True:
            line = self.resp.readline()
            if not line:
                return None
            line = line.decode().rstrip("\n")
            if line == "":
                if "event" in fields:
                    return int(fields["id"]), fields["event"], json.loads(fields["data"])
                fields = {}
                continue
            if line.startswith(":"):
                continue
            k, _, v = line.partition(": ")
            fields[k] = v

    def close(self):
        self.conn.close()


class HttpEvents(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis, args=["--session-ttl-ms", "1000"])
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def stream(self, query=""):
        s = EventStream(self.fg.http_port, query)
        self.addCleanup(s.close)
        self.assertEqual(s.resp.status, 200)
        self.assertEqual(s.resp.getheader("Content-Type"), "text/event-stream")
        return s

    def call(self, method, path, body=None):
        st, _, data = harness.http_request(self.fg.http_port, method, path, body, timeout=10)
        return st, json.loads(data)

    def test_acquire_release_and_loss_arrive_in_order(self):
        s = self.stream()
        st, doc = self.call("POST", "/v1/locks/job", {"ttl_ms": 5000})
        self.assertEqual(st, 200, doc)
        i1, kind, data = s.next()
        self.assertEqual((kind, data), ("acquired", {"name": "job", "token": doc["token"],
                                                     "ttl_ms": 5000}))
        self.assertEqual(self.call("DELETE", "/v1/locks/job")[0], 200)
        i2, kind, data = s.next()
        self.assertEqual((kind, data), ("released", {"name": "job", "token": doc["token"]}))
        self.assertGreater(i2, i1)
        # Lost: the key deleted behind the sidecar's back; the next renewal finds it gone.
        st, doc = self.call("POST", "/v1/locks/job", {})
        self.assertEqual(st, 200, doc)
        self.assertEqual(s.next()[1], "acquired")
        self.direct.delete("fencegate:lock:{job}")
        t0 = time.monotonic()
        _, kind, data = s.next()
        self.assertEqual(kind, "lost")
        self.assertEqual((data["name"], data["token"]), ("job", doc["token"]))
        self.assertIn("renewal", data["reason"])
        self.assertLess(time.monotonic() - t0, 3, "told within the renewal period")

    def test_a_stream_for_one_lock_sees_only_it(self):
        one = self.stream("?lock=b%20b")
        for name in ("a", "b b"):
            self.assertEqual(self.call("POST", "/v1/locks/" + name.replace(" ", "%20"), {})[0],
                             200)
        _, kind, data = one.next()
        self.assertEqual((kind, data["name"]), ("acquired", "b b"))

    def test_the_lock_query_decodes_as_the_lock_path_does(self):
        # '+' is a plus sign in /v1/locks/a+b, so ?lock=a+b must follow the lock "a+b" too,
        # not "a b" (form decoding); %2B is the same name.
        plus, encoded = self.stream("?lock=a+b"), self.stream("?lock=a%2Bb")
        for path in ("/v1/locks/a%20b", "/v1/locks/a+b"):
            self.assertEqual(self.call("POST", path, {})[0], 200, path)
        for s in (plus, encoded):
            _, kind, data = s.next()
            self.assertEqual((kind, data["name"]), ("acquired", "a+b"))

    def test_bad_requests(self):
        for query, words in [("?lock=", "1..512"), ("?lock=a&lock=b", "twice"),
                             ("?other=1", "unknown query parameter"),
                             ("?lock=" + "x" * 513, "1..512"), ("?lock=a%00b", "NUL"),
                             ("?lock=%FF", "UTF-8")]:
            st, doc = self.call("GET", "/v1/events" + query)
            self.assertEqual(st, 400, query)
            self.assertEqual(doc["error"], "bad_request")
            self.assertIn(words, doc["message"], query)
        st, doc = self.call("POST", "/v1/events")
        self.assertEqual((st, doc["error"]), (405, "method_not_allowed"))

    def test_at_most_64_streams_and_closed_ones_are_forgotten(self):
        streams = [self.stream() for _ in range(64)]
        st, doc = self.call("GET", "/v1/events")
        self.assertEqual((st, doc["error"]), (503, "unavailable"), doc)
        self.assertIn("64", doc["message"])
        for s in streams[:10]:
            s.close()
        time.sleep(0.2)
        # A stream whose client hung up is let go at once (libevent reports the close).
        again = [self.stream() for _ in range(10)]
        st, doc = self.call("GET", "/v1/events")
        self.assertEqual(st, 503, doc)
        self.assertEqual(self.call("POST", "/v1/locks/x", {})[0], 200)
        self.assertEqual(streams[-1].next()[1], "acquired", "the others carry on")
        self.assertEqual(again[-1].next()[1], "acquired")

    def test_a_stream_nobody_reads_is_cut_and_others_carry_on(self):
        reader = self.stream()
        seen = []

        def read_all():
            try:
                seen.extend(iter(reader.next, None))
            except OSError:  # the test ended with the stream still open
                pass
        t = threading.Thread(target=read_all, daemon=True)
        t.start()
        sock = socket.create_connection(("127.0.0.1", self.fg.http_port))
        self.addCleanup(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        # Long lock names make big events (~560 bytes): 1200 of them are more than the stream's
        # socket buffers (SO_SNDBUF 64 KiB, doubled by Linux) and 256 KiB unread can hold.
        name = "n" * 500
        for i in range(1200):
            self.assertEqual(self.call("POST", "/v1/locks/%s%d" % (name, i), {})[0], 200)
        # The stalled stream was closed: its socket sees EOF once what was sent before the cut
        # is read, and that is bounded.
        sock.settimeout(5)
        got = b""
        while True:
            d = sock.recv(1 << 16)
            if not d:
                break
            got += d
        self.assertLess(len(got), 256 * 1024 + 4 * 65536 + 4096)
        self.assertTrue(self.fg.alive())
        # The stream that reads got every event, and is still open.
        harness.wait_until(lambda: len(seen) >= 1200, 10, what="all 1200 events read")
        self.assertEqual([e[1] for e in seen], ["acquired"] * 1200)
        self.assertTrue(t.is_alive())

    def test_sigterm_ends_streams_with_a_shutdown_event(self):
        s = self.stream()
        self.assertEqual(self.call("POST", "/v1/locks/k", {})[0], 200)
        self.assertEqual(s.next()[1], "acquired")
        self.fg.signal(signal.SIGTERM)
        _, kind, data = s.next()
        self.assertEqual(kind, "shutdown")
        self.assertIn("shutting down", data["reason"])
        self.assertIsNone(s.next(), "the stream ends")
        self.assertEqual(self.fg.wait_exit(15), 0)


if __name__ == "__main__":
    unittest.main()
