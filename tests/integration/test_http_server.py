"""The HTTP endpoint's server (proxy/httpd.c): keep-alive and pipelining, request bodies by
Content-Length and chunked, Expect: 100-continue, HEAD, and bad input: each refusal is a JSON
error naming what was wrong, that connection closes, and other clients carry on."""

import http.client
import json
import resource
import socket
import time

import harness
from harness import FgTestCase

MAX_BODY = 1024 * 1024


class Reader:
    """Reads HTTP/1.1 responses from a socket, keeping what it read past one for the next."""

    def __init__(self, sock, timeout=5.0):
        self.sock = sock
        self.buf = b""
        sock.settimeout(timeout)

    def _more(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the connection closed in the middle of a response")
        self.buf += data

    def line(self):
        while b"\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\n", 1)
        return line + b"\n"

    def exact(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, head=False):
        """(status, headers dict lower-cased, body bytes). Understands Content-Length and
        chunked framing; a body with neither is read to the end of the stream; head: the
        response to a HEAD request, which has no body."""
        status = int(self.line().split()[1])
        headers = {}
        while True:
            h = self.line()
            if h in (b"\r\n", b"\n"):
                break
            k, v = h.decode("latin-1").split(":", 1)
            headers[k.strip().lower()] = v.strip()
        if head or status < 200 or status in (204, 304):
            return status, headers, b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line() not in (b"\r\n", b"\n"):
                        pass
                    return status, headers, body
                body += self.exact(size)
                self.line()
        if "content-length" in headers:
            return status, headers, self.exact(int(headers["content-length"]))
        try:
            while True:
                self._more()
        except ConnectionError:
            body, self.buf = self.buf, b""
            return status, headers, body


def read_response(sock, head=False):
    """One response on sock, which carries no pipelined response after it."""
    return Reader(sock).response(head)


def closed_by_peer(sock, timeout=3.0):
    """True when the peer closes sock (end of stream or reset) within timeout."""
    sock.settimeout(timeout)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class HttpServer(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis)

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.fg.http_port), timeout=5)
        self.addCleanup(s.close)
        return s

    def assert_refused(self, raw, status, code, words):
        """Sends raw bytes on a new connection: the answer is status with a JSON error `code`
        whose message contains each of words, and the connection is closed after it."""
        s = self.connect()
        s.sendall(raw)
        st, headers, body = read_response(s)
        doc = json.loads(body)
        self.assertEqual((st, doc.get("error")), (status, code), doc)
        for w in words:
            self.assertIn(w, doc["message"], doc)
        self.assertTrue(headers.get("content-type", "").startswith("application/json"))
        self.assertTrue(closed_by_peer(s), "the connection stayed open after %r" % raw[:60])
        self.assertEqual(harness.http_get(self.fg.http_port, "/healthz")[0], 200)

    def test_keep_alive_serves_many_requests_on_one_connection(self):
        c = http.client.HTTPConnection("127.0.0.1", self.fg.http_port, timeout=5)
        self.addCleanup(c.close)
        for i in range(20):
            c.request("POST" if i % 2 else "GET", "/v1/locks/k%d" % i if i % 2 else "/healthz",
                      body=b"{}" if i % 2 else None)
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200, i)
        local = c.sock.getsockname()
        c.request("GET", "/v1/locks")
        r = c.getresponse()
        names = {lk["name"] for lk in json.loads(r.read())["locks"]}
        self.assertEqual(names, {"k%d" % i for i in range(1, 20, 2)})
        self.assertEqual(c.sock.getsockname(), local, "a new connection was opened")

    def test_pipelined_requests_are_answered_in_order(self):
        s = self.connect()
        reqs = b"".join(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % p
                        for p in (b"/healthz", b"/nope", b"/v1/locks", b"/readyz"))
        s.sendall(reqs)
        r = Reader(s)
        got = [r.response()[0] for _ in range(4)]
        self.assertEqual(got, [200, 404, 200, 200])

    def test_http10_closes_unless_keep_alive_is_asked(self):
        s = self.connect()
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        st, headers, _ = read_response(s)
        self.assertEqual(st, 200)
        self.assertTrue(closed_by_peer(s))
        s = self.connect()
        s.sendall(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        r = Reader(s)
        st, headers, _ = r.response()
        self.assertEqual((st, headers.get("connection", "").lower()), (200, "keep-alive"))
        s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        self.assertEqual(r.response()[0], 200)
        self.assertTrue(closed_by_peer(s))

    def test_a_client_that_half_closes_after_its_requests_gets_every_answer(self):
        """A client may shut its sending side once its requests are out (nc -N, some HTTP/1.0
        clients): the requests already sent are answered, in order, then the connection
        closes; a refusal is delivered too."""
        for _ in range(20):  # the end of stream arrives with the requests, before or after
            s = self.connect()
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
                      b"GET /v1/locks HTTP/1.1\r\nHost: x\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            r = Reader(s)
            self.assertEqual([r.response()[0] for _ in range(3)], [200, 404, 200])
            self.assertTrue(closed_by_peer(s))
            s = self.connect()
            s.sendall(b"GET /healthz HTTP/9.9\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            st, _, body = read_response(s)
            self.assertEqual((st, json.loads(body)["error"]), (505, "version_not_supported"))

    def test_a_large_answer_to_a_half_closed_connection_goes_out_whole(self):
        """GET /v1/locks answering about 1.3 MB to a client that shut its sending side and
        reads only later: the whole body arrives (it was cut at the first 16 KiB)."""
        c = http.client.HTTPConnection("127.0.0.1", self.fg.http_port, timeout=10)
        self.addCleanup(c.close)
        for i in range(3000):
            c.request("POST", "/v1/locks/n%05d%s" % (i, "x" * 400), body=b"{}")
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
        s = self.connect()
        s.sendall(b"GET /v1/locks HTTP/1.1\r\nHost: x\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        time.sleep(1.0)
        st, headers, body = read_response(s)
        self.assertEqual((st, len(body)), (200, int(headers["content-length"])))
        self.assertEqual(len(json.loads(body)["locks"]), 3000)

    def test_connection_close_is_honoured(self):
        s = self.connect()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        st, headers, _ = read_response(s)
        self.assertEqual((st, headers.get("connection")), (200, "close"))
        self.assertTrue(closed_by_peer(s), "a request after Connection: close was served")

    def test_chunked_request_body(self):
        s = self.connect()
        body = json.dumps({"ttl_ms": 5000}).encode()
        chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + 3]), body[i:i + 3])
                          for i in range(0, len(body), 3))
        s.sendall(b"POST /v1/locks/chunky HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"\r\n" + chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
        st, _, data = read_response(s)
        doc = json.loads(data)
        self.assertEqual((st, doc["name"], doc["ttl_ms"]), (200, "chunky", 5000), doc)

    def test_expect_100_continue(self):
        s = self.connect()
        s.sendall(b"POST /v1/locks/cont HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        r = Reader(s)
        st, _, _ = r.response()
        self.assertEqual(st, 100)
        s.sendall(b"{}")
        st, _, data = r.response()
        self.assertEqual((st, json.loads(data)["name"]), (200, "cont"))
        # Too large: refused at once, before the client sends the body.
        s = self.connect()
        s.sendall(b"POST /v1/locks/cont HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"Expect: 100-continue\r\n\r\n" % (MAX_BODY + 1))
        st, _, data = read_response(s)
        self.assertEqual((st, json.loads(data)["error"]), (413, "request_too_large"))

    def test_lock_api_bodies_over_64_kib_are_413_before_they_are_read(self):
        """The lock API takes bodies of at most 64 KiB: a Content-Length above that is refused
        413 from the head, without "100 Continue" and without reading the body (before, the
        client was told to go on, sent all of it and got 400); a chunked one once it is read."""
        lim = 64 * 1024
        s = self.connect()
        s.sendall(b"POST /v1/locks/big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        st, _, data = read_response(s)
        doc = json.loads(data)
        self.assertEqual((st, doc["error"]), (413, "request_too_large"), doc)
        self.assertIn("65536", doc["message"])
        self.assertTrue(closed_by_peer(s), "the connection stayed open with its body unsent")
        # Without Expect, a client that sends its body first still gets the answer.
        s = self.connect()
        s.sendall(b"POST /v1/locks/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                  % (lim + 1) + b" " * 1000)
        st, _, data = read_response(s)
        self.assertEqual((st, json.loads(data)["error"]), (413, "request_too_large"))
        s = self.connect()
        s.sendall(b"POST /v1/locks/big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (lim + 1, b" " * (lim + 1)))
        st, _, data = read_response(s)
        self.assertEqual((st, json.loads(data)["error"]), (413, "request_too_large"))
        # At the limit, the body is read.
        st, _, data = harness.http_request(self.fg.http_port, "POST", "/v1/locks/big",
                                           b"{}" + b" " * (lim - 2))
        self.assertEqual(st, 200, data)

    def test_head_has_the_headers_and_no_body(self):
        s = self.connect()
        s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        r = Reader(s)
        st, headers, body = r.response(head=True)
        self.assertEqual(st, 200)
        self.assertGreater(int(headers["content-length"]), 0)
        st, _, body = r.response()  # the next response starts right after the head
        self.assertEqual((st, json.loads(body)), (200, {"status": "ok"}))

    def test_bodies_over_the_limit_are_refused_and_nothing_is_done(self):
        self.assert_refused(b"POST /v1/locks/big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                            % (MAX_BODY + 1), 413, "request_too_large", ["over the limit"])
        s = self.connect()
        s.sendall(b"POST /v1/locks/big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"x" * 65536
        try:
            for _ in range(MAX_BODY // len(block) + 2):
                s.sendall(b"%x\r\n%s\r\n" % (len(block), block))
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, _, data = read_response(s)
        self.assertEqual((st, json.loads(data)["error"]), (413, "request_too_large"))
        st, doc = harness.http_get(self.fg.http_port, "/v1/locks")
        self.assertEqual(json.loads(doc)["locks"], [])

    def test_malformed_requests_are_refused_by_name(self):
        cases = [
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n", 400, "bad_request", []),
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\n folded: x\r\n\r\n", 400, "bad_request", []),
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "bad_request",
             ["Content-Length"]),
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n"
             b"\r\n", 400, "bad_request", ["Content-Length"]),
            (b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n", 400, "bad_request", []),
            (b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
             "not_implemented", ["gzip"]),
            (b"GET /healthz HTTP/2.0\r\n\r\n", 505, "version_not_supported", []),
            (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "version_not_supported", []),
            (b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 501, "not_implemented", ["BREW"]),
            (b"GET /healthz\r\n\r\n", 400, "bad_request", []),
            (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", 400, "bad_request", []),
            (b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
             400, "bad_request", []),
            # RFC 9112 §3.2: HTTP/1.1 needs exactly one Host (HTTP/1.0 none: test_http10_...)
            (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request", ["Host"]),
            (b"GET /healthz HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400, "bad_request",
             ["more than one Host"]),
        ]
        for raw, status, code, words in cases:
            with self.subTest(raw=raw):
                self.assert_refused(raw, status, code, words)

    def test_oversized_head_is_431(self):
        self.assert_refused(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000
                            + b"\r\n\r\n", 431, "headers_too_large", [])
        many = b"".join(b"X-%d: 1\r\n" % i for i in range(150))
        self.assert_refused(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n", 431,
                            "headers_too_large", [])

    def test_a_slow_or_silent_client_does_not_hold_up_others(self):
        stuck = [self.connect() for _ in range(20)]
        for i, s in enumerate(stuck):
            s.sendall(b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                      b"\r\n"[:10 + i])
        t0 = time.monotonic()
        for _ in range(20):
            self.assertEqual(harness.http_get(self.fg.http_port, "/healthz")[0], 200)
        self.assertLess(time.monotonic() - t0, 2.0)

    def test_a_client_that_pipelines_without_reading_holds_bounded_memory(self):
        # Pipelined requests for /metrics (about 20 KB of answer each) whose answers are never
        # read: fencegate stops taking requests once HTTPD_MAX_UNSENT bytes of answers wait,
        # instead of queueing an answer per request (it grew by hundreds of MB), and serves
        # other clients meanwhile. When the client reads, the answers arrive.
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", self.fg.http_port))
        self.addCleanup(s.close)
        req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        bound = 40 * 1024  # KiB; with ASan's quarantine of freed memory (16 MiB) included
        before = harness.rss_kib(self.fg.pid)
        s.setblocking(False)
        data, sent, deadline = req * (16 * 1024 * 1024 // len(req)), 0, time.monotonic() + 10
        progress = time.monotonic()
        while sent < len(data) and time.monotonic() < deadline:
            try:
                sent += s.send(data[sent:sent + 65536])
                progress = time.monotonic()
            except BlockingIOError:
                if time.monotonic() - progress > 0.5:
                    break  # fencegate stopped reading
                if harness.rss_kib(self.fg.pid) - before > bound:
                    break
                time.sleep(0.02)
        grown = harness.rss_kib(self.fg.pid) - before
        self.assertLess(grown, bound, "RSS grew by %d KiB" % grown)
        self.assertLess(sent, len(data), "all of it was read: nothing held it back")
        self.assertEqual(harness.http_get(self.fg.http_port, "/healthz")[0], 200)
        s.setblocking(True)
        got = Reader(s, timeout=10)
        for i in range(50):
            self.assertEqual(got.response()[0], 200, "answer %d" % i)

    def test_open_connections_are_counted(self):
        socks = [self.connect() for _ in range(3)]
        for s in socks:  # each served once: accepted, not just queued in the backlog
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(Reader(s).response()[0], 200)
        # Theirs and the one that asks.
        self.assertEqual(self.fg.metrics()["fencegate_http_connections_open"], 4)
        for s in socks:
            s.close()
        harness.wait_until(lambda: self.fg.metrics()["fencegate_http_connections_open"] == 1, 5,
                           0.05, "the closed connections no longer counted")

    def test_connections_past_the_cap_are_answered_503_and_others_carry_on(self):
        # HTTPD_MAX_CONNS (1024) connections open: one more is answered 503 and closed, instead
        # of being held until the process runs out of descriptors (which would stop the RESP
        # endpoint accepting too). Once some close, new ones are served.
        # Both ends need more than 1024 descriptors, a login shell's usual soft limit (fresh
        # Debian's), so both are raised: fencegate's too, which started with the test's limit.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 2200 and hard >= 2200:
            resource.setrlimit(resource.RLIMIT_NOFILE, (2200, hard))
        elif soft < 2200:
            self.skipTest("needs 2200 descriptors, the limit is %d" % hard)
        fg_soft, fg_hard = resource.prlimit(self.fg.pid, resource.RLIMIT_NOFILE)
        if fg_soft < 2200:
            resource.prlimit(self.fg.pid, resource.RLIMIT_NOFILE, (2200, fg_hard))
        idle = []
        for _ in range(1024):
            s = socket.create_connection(("127.0.0.1", self.fg.http_port), timeout=5)
            self.addCleanup(s.close)
            idle.append(s)
        extra = self.connect()
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        st, _, body = read_response(extra)
        self.assertEqual((st, json.loads(body)["error"]), (503, "too_many_connections"), body)
        self.assertTrue(closed_by_peer(extra))
        for s in idle[:10]:
            s.close()
        harness.wait_until(lambda: harness.http_get(self.fg.http_port, "/healthz")[0] == 200,
                           5, 0.05, "a connection served once some closed")

    def test_many_connections_declaring_huge_bodies_use_no_memory(self):
        before = harness.rss_kib(self.fg.pid)
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", self.fg.http_port), timeout=5)
            self.addCleanup(s.close)
            s.sendall(b"POST /v1/locks/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
                      + b"x" * 100)
            socks.append(s)
        self.assertEqual(harness.http_get(self.fg.http_port, "/healthz")[0], 200)
        grown = harness.rss_kib(self.fg.pid) - before
        self.assertLess(grown, 32 * 1024, "RSS grew by %d KiB" % grown)
