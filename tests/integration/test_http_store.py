"""HTTP stores (DESIGN.md §1, §3): ANY /v1/stores/{store}/http/{path} with Fence-Lock forwarded to
a real HTTP server of the test's own, stamped with the lock's token; hop-by-hop headers, streamed
responses, the lock backend's mark (fence on acquire and the check-and-raise before forwarding),
the freeze scenario with two sidecars, and the errors (400, 404, 409, 502, 503, 504)."""

import hashlib
import http.client
import http.server
import json
import signal
import socket
import threading
import time
import unittest

import harness
from harness import FgTestCase

BIG = 20 * 1024 * 1024


class Upstream:
    """An HTTP/1.1 server on a free loopback port, in a thread, recording every request it gets
    (method, path, query, headers, body, the client's port) and the ports of the connections that
    ended. Paths: /slow sleeps 3 s; /big sends BIG bytes with a Content-Length; /chunked answers
    with Transfer-Encoding: chunked; /close answers and closes; /tillclose sends 4 MiB that end
    with the connection; anything else echoes (the body is read by Content-Length or chunked). With
    idle_timeout, a connection idle that long is closed by the server."""

    def __init__(self, idle_timeout=None):
        self.requests = []
        self.closed = []
        self.lock = threading.Lock()
        up = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = idle_timeout

            def log_message(self, *a):
                pass

            def finish(self):
                super().finish()
                with up.lock:
                    up.closed.append(self.client_address[1])

            def read_body(self):
                """The request body (Content-Length or chunked): (length, sha256 hex, the
                bytes when under 1 MiB)."""
                h, n, keep = hashlib.sha256(), 0, []

                def take(k):
                    nonlocal n
                    while k > 0:
                        d = self.rfile.read(min(k, 1 << 16))
                        if not d:
                            raise ConnectionError("the request body was cut off")
                        h.update(d)
                        n += len(d)
                        k -= len(d)
                        if n <= 1 << 20:
                            keep.append(d)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            break
                        take(size)
                        self.rfile.readline()
                else:
                    take(int(self.headers.get("Content-Length") or 0))
                return n, h.hexdigest(), b"".join(keep) if n <= 1 << 20 else None

            def handle_any(self):
                n, sha, body = self.read_body()
                path, _, query = self.path.partition("?")
                with up.lock:
                    up.requests.append({
                        "method": self.command, "path": path, "query": query, "body": body,
                        "len": n, "sha": sha,
                        "headers": [(k.lower(), v) for k, v in self.headers.items()],
                        "port": self.client_address[1]})
                if path.endswith("/slow"):
                    time.sleep(3)
                if path.endswith("/big"):
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(BIG))
                    self.end_headers()
                    block = bytes(range(256)) * 256  # 64 KiB
                    for _ in range(BIG // len(block)):
                        self.wfile.write(block)
                    return
                if path.endswith("/tillclose"):  # no framing: the body ends with the connection
                    self.send_response(200)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    block = bytes(range(256)) * 256
                    for _ in range(64):
                        self.wfile.write(block)
                    self.close_connection = True
                    return
                if path.endswith("/cut"):
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    self.wfile.write(b"x" * 1000)
                    self.close_connection = True  # the store dies mid-body
                    return
                if path.endswith("/close"):
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(b"ok")
                    self.close_connection = True
                    return
                if path.endswith("/chunked"):
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for part in (b"alpha-", b"beta-", b"gamma"):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                out = json.dumps({"method": self.command, "path": path, "query": query,
                                  "len": n}).encode()
                self.send_response(201 if self.command == "PUT" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.send_header("X-Upstream", "yes")
                self.send_header("Connection", "X-Hop-Resp")
                self.send_header("X-Hop-Resp", "must not pass")
                self.send_header("Keep-Alive", "timeout=5")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(out)

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except ConnectionError:  # fencegate gave up on a slow answer, or its client
                    self.close_connection = True  # on its body

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = handle_any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def seen(self):
        with self.lock:
            return list(self.requests)

    @staticmethod
    def header(rec, name):
        return [v for k, v in rec["headers"] if k == name.lower()]


class RawUpstream:
    """A loopback HTTP "store" speaking raw bytes, for answers http.server will not send. Each
    connection reads one request head (and a Content-Length body), records its path, then sends
    answers[path] (bytes, or a tuple of bytes sent 0.1 s apart) and closes if that is the last
    answer on the list, else keeps reading. A path not in answers gets no answer at all: the
    connection is closed."""

    def __init__(self, answers):
        self.answers = answers
        self.paths = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.running = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self.one, args=(conn,), daemon=True).start()

    def one(self, conn):
        conn.settimeout(10)
        buf = b""
        try:
            for _ in range(8):  # requests per connection
                while b"\r\n\r\n" not in buf and len(buf) < 1 << 20:
                    d = conn.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                n = 0
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        n = int(v.strip())
                while len(buf) < n:
                    d = conn.recv(65536)
                    if not d:
                        return
                    buf += d
                buf = buf[n:]
                path = lines[0].split(" ")[1]
                self.paths.append(path)
                answer = self.answers.get(path)
                if answer is None:
                    return
                for i, piece in enumerate(answer if isinstance(answer, tuple) else (answer,)):
                    if i:
                        time.sleep(0.1)
                    conn.sendall(piece)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self):
        self.running = False
        self.thread.join(5)
        self.sock.close()


def mark_key(store, lock):
    return "fencegate:mark:{%s/%s}" % (store, lock)


class HttpStoreCase(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)
        self.up = Upstream()
        self.addCleanup(self.up.stop)

    def config(self, url, extra=""):
        return self.write_file("fg-%d.yaml" % harness.free_port(), (
            "stores:\n"
            "  - { name: cache, url: \"%s\" }\n"
            "  - { name: blobs, url: \"%s\" }\n" % (self.redis.url, url)) + extra)

    def sidecar(self, url=None, ttl_ms=10000, extra="", env=None):
        url = url or "http://127.0.0.1:%d/prefix" % self.up.port
        fg = self.start_fencegate(self.redis, args=["--config", self.config(url, extra),
                                                    "--session-ttl-ms", str(ttl_ms)], env=env)
        self.addCleanup(self.stop_clean, fg)
        return fg

    def raw_sidecar(self, answers, *locks):
        """A RawUpstream store answering as `answers` says, and a sidecar in front of it holding
        `locks`: (raw, fg)."""
        raw = RawUpstream(answers)
        self.addCleanup(raw.stop)
        fg = self.sidecar(url="http://127.0.0.1:%d" % raw.port)
        for lock in locks:
            self.acquire(fg, lock)
        return raw, fg

    def stop_clean(self, fg):
        """SIGTERM: exits 0 with no sanitizer report (leaks, use after free) on its stderr."""
        if fg.alive():
            fg.stop(expect_rc=0)
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            self.assertNotIn(bad, fg.stderr_text)

    def acquire(self, fg, name, body=None):
        st, _, data = harness.http_request(fg.http_port, "POST", "/v1/locks/" + name,
                                           body or {}, timeout=10)
        self.assertEqual(st, 200, data)
        return json.loads(data)["token"]

    def store(self, fg, method, path, lock=None, body=None, headers=None, timeout=15.0,
              name="blobs"):
        """(status, lower-cased headers, body bytes) of a request through the HTTP store."""
        h = dict(headers or {})
        if lock is not None:
            h["Fence-Lock"] = lock
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=timeout)
        try:
            c.request(method, "/v1/stores/%s/http" % name + path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data
        finally:
            c.close()

    def assert_error(self, got, status, code):
        st, headers, data = got
        self.assertEqual(st, status, data)
        doc = json.loads(data)
        self.assertEqual(doc["error"], code, doc)
        self.assertIsInstance(doc.get("message"), str, doc)
        return doc


class HttpStore(HttpStoreCase):

    def test_methods_bodies_and_queries_are_forwarded_with_the_token(self):
        fg = self.sidecar()
        token = self.acquire(fg, "job")
        # Fence on acquire: the mark is raised before the token was handed out.
        self.assertEqual(int(self.direct.get(mark_key("blobs", "job"))), token)
        cases = [("GET", None, 200), ("PUT", b"put-body" * 1000, 201),
                 ("POST", b'{"a":1}', 200), ("DELETE", b"gone", 200)]
        for i, (method, body, want) in enumerate(cases):
            st, headers, data = self.store(fg, method, "/obj/%d?x=1&y=a%%20b" % i, "job", body)
            self.assertEqual(st, want, data)
            self.assertEqual(json.loads(data)["method"], method)
            self.assertEqual(headers.get("x-upstream"), "yes")
            rec = self.up.seen()[-1]
            self.assertEqual((rec["method"], rec["path"], rec["query"]),
                             (method, "/prefix/obj/%d" % i, "x=1&y=a%20b"))
            self.assertEqual(rec["body"], body or b"")
            self.assertEqual(Upstream.header(rec, "Fencing-Token"), [str(token)])
            self.assertEqual(Upstream.header(rec, "Fence-Lock"), ["job"])
            self.assertEqual(Upstream.header(rec, "Host"), ["127.0.0.1:%d" % self.up.port])
        self.assertEqual(len(self.up.seen()), len(cases))
        self.assertEqual(int(self.direct.get(mark_key("blobs", "job"))), token)
        metrics = harness.parse_metrics(harness.http_get(fg.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_forwarded_total"), len(cases))

    def test_protect_rules_map_paths_to_locks(self):
        fg = self.sidecar(extra="protect:\n"
                                "  - { store: blobs, keys: \"reports/*\", lock: \"report:$1\" }\n")
        token = self.acquire(fg, "report:7")
        # No Fence-Lock header: the rule names the lock.
        st, _, body = self.store(fg, "PUT", "/reports/7", body=b"r7")
        self.assertEqual(st, 201, body)
        rec = self.up.seen()[-1]
        self.assertEqual(Upstream.header(rec, "Fence-Lock"), ["report:7"])
        self.assertEqual(Upstream.header(rec, "Fencing-Token"), [str(token)])
        n = len(self.up.seen())
        # A header naming another lock for a protected path is refused, unsent.
        self.acquire(fg, "other")
        st, _, body = self.store(fg, "PUT", "/reports/7", lock="other", body=b"x")
        self.assertEqual((st, json.loads(body)["error"]), (409, "wrong_lock"), body)
        # The rule's lock not held: refused, unsent.
        st, _, body = self.store(fg, "PUT", "/reports/8", body=b"x")
        self.assertEqual((st, json.loads(body)["error"]), (409, "lock_lost"), body)
        self.assertEqual(len(self.up.seen()), n)
        # Paths no rule claims still need the header.
        st, _, body = self.store(fg, "PUT", "/other/1", body=b"x")
        self.assertEqual(st, 400, body)

    def test_client_token_is_a_claim_checked_against_the_held_token(self):
        fg = self.sidecar()
        token = self.acquire(fg, "claim")
        n = len(self.up.seen())
        for sent, status, err in ((str(token + 1), 409, "token_mismatch"),
                                  ("12abc", 400, "bad_request"),
                                  ("99999999999999999999999", 400, "bad_request")):
            c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            c.request("PUT", "/v1/stores/blobs/http/c", body=b"x",
                      headers={"Fence-Lock": "claim", "Fencing-Token": sent})
            r = c.getresponse()
            body = json.loads(r.read())
            c.close()
            self.assertEqual((r.status, body["error"]), (status, err), body)
        self.assertEqual(len(self.up.seen()), n, "a refused claim reached the store")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
        c.request("PUT", "/v1/stores/blobs/http/c", body=b"x",
                  headers={"Fence-Lock": "claim", "Fencing-Token": str(token)})
        r = c.getresponse()
        r.read()
        c.close()
        self.assertEqual(r.status, 201)
        self.assertEqual(Upstream.header(self.up.seen()[-1], "Fencing-Token"), [str(token)])

    def test_a_token_claim_is_one_field_in_canonical_decimal(self):
        """Two Fencing-Token fields (the first used to win: 1 then 0 was forwarded under 1), or
        a token with a leading zero, a sign or whitespace inside, is a 400; nothing is
        forwarded, and nothing counts as a lost lock's write (it used to)."""
        fg = self.sidecar()
        token = self.acquire(fg, "claim")
        n = len(self.up.seen())
        for tokens in ([str(token), "0"], ["0", str(token)], [str(token), str(token)],
                       ["0" + str(token)], ["+" + str(token)], ["%d\t1" % token]):
            c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            c.putrequest("PUT", "/v1/stores/blobs/http/c")
            c.putheader("Fence-Lock", "claim")
            for v in tokens:
                c.putheader("Fencing-Token", v)
            c.putheader("Content-Length", "1")
            c.endheaders(b"x")
            r = c.getresponse()
            body = json.loads(r.read())
            c.close()
            self.assertEqual((r.status, body["error"]), (400, "bad_request"), (tokens, body))
            self.assertIn("Fencing-Token", body["message"], tokens)
        self.assertEqual(len(self.up.seen()), n, "a refused claim reached the store")
        self.assertEqual(fg.metrics().get("fencegate_http_store_locklost_refused_total"), 0)

    def test_headers_client_token_not_duplicated_and_hop_by_hop_dropped(self):
        fg = self.sidecar()
        token = self.acquire(fg, "hdr")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
        self.addCleanup(c.close)
        c.putrequest("POST", "/v1/stores/blobs/http/h", skip_host=True,
                     skip_accept_encoding=True)
        for k, v in [("Host", "evil.example"), ("Fence-Lock", "hdr"),
                     ("Fencing-Token", str(token)),
                     ("Connection", "keep-alive, X-Drop"), ("X-Drop", "1"),
                     ("Keep-Alive", "timeout=9"), ("TE", "trailers"), ("Upgrade", "h2c"),
                     ("Proxy-Authorization", "Basic eA=="), ("X-Keep", "yes"),
                     ("Authorization", "Bearer app"), ("Content-Length", "5")]:
            c.putheader(k, v)
        c.endheaders(b"hello")
        r = c.getresponse()
        data = r.read()
        self.assertEqual(r.status, 200, data)
        got = dict((k.lower(), v) for k, v in r.getheaders())
        self.assertEqual(got.get("x-upstream"), "yes")
        for hop in ("x-hop-resp", "keep-alive"):
            self.assertNotIn(hop, got)
        rec = self.up.seen()[-1]
        self.assertEqual(Upstream.header(rec, "Fencing-Token"), [str(token)])
        self.assertEqual(Upstream.header(rec, "Host"), ["127.0.0.1:%d" % self.up.port])
        for hop in ("X-Drop", "Keep-Alive", "TE", "Upgrade", "Proxy-Authorization"):
            self.assertEqual(Upstream.header(rec, hop), [], hop)
        self.assertEqual(Upstream.header(rec, "X-Keep"), ["yes"])
        self.assertEqual(Upstream.header(rec, "Authorization"), ["Bearer app"])
        self.assertEqual(rec["body"], b"hello")

    def forward_n(self, fg, lock, n, pause=0.0, path="/n"):
        """n PUTs under lock, each on a new client connection; returns the store-side ports."""
        for i in range(n):
            st, _, data = self.store(fg, "PUT", "%s/%d" % (path, i), lock=lock, body=b"x")
            self.assertEqual(st, 201, data)
            time.sleep(pause)
        return [r["port"] for r in self.up.seen() if r["path"].startswith("/prefix" + path)]

    def test_store_connections_are_kept_alive_then_closed_when_idle(self):
        fg = self.sidecar()
        self.acquire(fg, "ka")
        ports = self.forward_n(fg, "ka", 20)
        self.assertEqual(len(ports), 20)
        # Sequential forwards share one connection (not 20 sockets left in TIME_WAIT).
        self.assertEqual(len(set(ports)), 1, ports)
        metrics = harness.parse_metrics(harness.http_get(fg.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_connections_reused_total"), 19)
        # Idle for longer than 2 s, fencegate closes it; the next forward opens a new one.
        deadline = time.monotonic() + 6
        while ports[0] not in self.up.closed and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertIn(ports[0], self.up.closed, "the idle store connection was never closed")
        st, _, data = self.store(fg, "PUT", "/after-idle", lock="ka", body=b"y")
        self.assertEqual(st, 201, data)
        self.assertNotEqual(self.up.seen()[-1]["port"], ports[0])

    def test_store_closing_connections_costs_no_request(self):
        """A store that closes idle connections after 0.2 s, or answers Connection: close: every
        forward still goes through, each on a connection that is open."""
        self.up.stop()
        self.up = Upstream(idle_timeout=0.2)
        self.addCleanup(self.up.stop)
        fg = self.sidecar()
        self.acquire(fg, "cl")
        ports = self.forward_n(fg, "cl", 6, pause=0.5)
        self.assertEqual(len(set(ports)), 6, ports)
        for i in range(4):
            st, _, data = self.store(fg, "GET", "/x/%d/close" % i, lock="cl")
            self.assertEqual((st, data), (200, b"ok"))
        closes = [r["port"] for r in self.up.seen() if r["path"].endswith("/close")]
        self.assertEqual(len(set(closes)), 4, closes)

    def test_large_response_streams_intact(self):
        fg = self.sidecar()
        self.acquire(fg, "big")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=60)
        self.addCleanup(c.close)
        c.request("GET", "/v1/stores/blobs/http/big", headers={"Fence-Lock": "big"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Content-Length"), str(BIG))
        h, n = hashlib.sha256(), 0
        first = r.read(1024 * 1024)
        time.sleep(0.5)  # a slow reader: fencegate stops reading the store meanwhile
        rss = harness.rss_kib(fg.pid)
        h.update(first)
        n += len(first)
        while True:
            b = r.read(256 * 1024)
            if not b:
                break
            h.update(b)
            n += len(b)
        self.assertEqual(n, BIG)
        block = bytes(range(256)) * 256
        want = hashlib.sha256(block * (BIG // len(block))).hexdigest()
        self.assertEqual(h.hexdigest(), want)
        # Back-pressure: the sidecar did not buffer the whole 20 MiB for the slow reader.
        self.assertLess(rss, 200 * 1024, "RSS %d KiB" % rss)

    def peak_rss_kib(self, fg):
        with open("/proc/%d/status" % fg.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def test_large_upload_streams_intact(self):
        """A request body of 3 * BIG bytes is passed on as it arrives, with its Content-Length:
        the store gets every byte, and the sidecar's peak memory grows by well under the body's
        size (under ASan its allocator's quarantine, 16 MiB in CI, counts too)."""
        fg = self.sidecar()
        self.acquire(fg, "up")
        before = self.peak_rss_kib(fg)
        block = bytes(range(256)) * 256
        n = 3 * BIG // len(block)
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=60)
        self.addCleanup(c.close)
        c.putrequest("PUT", "/v1/stores/blobs/http/upload")
        c.putheader("Fence-Lock", "up")
        c.putheader("Content-Length", str(n * len(block)))
        c.endheaders()
        for _ in range(n):
            c.send(block)
        r = c.getresponse()
        self.assertEqual((r.status, json.loads(r.read())["len"]), (201, n * len(block)))
        rec = self.up.seen()[-1]
        self.assertEqual((rec["len"], rec["sha"]),
                         (n * len(block), hashlib.sha256(block * n).hexdigest()))
        self.assertEqual(Upstream.header(rec, "Content-Length"), [str(n * len(block))])
        grown = self.peak_rss_kib(fg) - before
        self.assertLess(grown, 24 * 1024, "peak RSS grew by %d KiB for a %d-byte body"
                        % (grown, n * len(block)))

    def test_chunked_upload_is_passed_on_chunked(self):
        fg = self.sidecar()
        self.acquire(fg, "ch")
        parts = [b"x" * 1000, b"y" * 70000, b"z"]
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=20)
        self.addCleanup(c.close)
        c.request("POST", "/v1/stores/blobs/http/chunks", body=iter(parts),
                  headers={"Fence-Lock": "ch"}, encode_chunked=True)
        r = c.getresponse()
        self.assertEqual((r.status, json.loads(r.read())["len"]), (200, 71001))
        rec = self.up.seen()[-1]
        self.assertEqual(rec["body"], b"".join(parts))
        self.assertEqual(Upstream.header(rec, "Transfer-Encoding"), ["chunked"])
        self.assertEqual(Upstream.header(rec, "Content-Length"), [])
        # The connection serves the next request (the body was read to its end).
        c.request("GET", "/v1/stores/blobs/http/after", headers={"Fence-Lock": "ch"})
        self.assertEqual(c.getresponse().status, 200)

    def test_expect_100_continue_waits_until_the_request_is_cleared(self):
        """A client that asks before sending its body hears 100 Continue only once the lock is
        checked and the store connected; a refused request gets its refusal instead, and its
        body is never sent anywhere."""
        fg = self.sidecar()
        self.acquire(fg, "e")
        head = (b"PUT /v1/stores/blobs/http/exp HTTP/1.1\r\nHost: x\r\nFence-Lock: %s\r\n"
                b"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(head % b"nobody")
        data = s.recv(65536)
        self.assertTrue(data.startswith(b"HTTP/1.1 409"), data[:100])
        self.assertNotIn(b"100 Continue", data)
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(head % b"e")
        data = s.recv(65536)
        self.assertEqual(data, b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"hello")
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        self.assertTrue(data.startswith(b"HTTP/1.1 201"), data[:100])
        self.assertEqual([r["path"] for r in self.up.seen()], ["/prefix/exp"])
        self.assertEqual(self.up.seen()[-1]["body"], b"hello")
        self.assertEqual(Upstream.header(self.up.seen()[-1], "Expect"), [])

    def test_an_upload_cut_off_does_not_reach_the_store_whole(self):
        """The client goes away halfway through its body: the store sees the connection end
        before the body did (no request is applied), and the sidecar carries on."""
        fg = self.sidecar()
        self.acquire(fg, "cut")
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        s.sendall(b"PUT /v1/stores/blobs/http/half HTTP/1.1\r\nHost: x\r\nFence-Lock: cut\r\n"
                  b"Content-Length: 100000\r\n\r\n" + b"h" * 50000)
        time.sleep(0.5)
        s.close()
        time.sleep(0.5)
        self.assertNotIn("/prefix/half", [r["path"] for r in self.up.seen()])
        self.assertEqual(self.store(fg, "PUT", "/whole", "cut", b"w")[0], 201)

    def test_a_malformed_chunked_upload_is_refused_by_name_and_not_completed(self):
        """A chunked upload whose second chunk size is not hexadecimal: the client is answered
        400 naming the chunk size (it used to get its connection closed, with no answer), the
        store never sees the request whole, and the sidecar carries on."""
        fg = self.sidecar()
        self.acquire(fg, "chunks")
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(b"PUT /v1/stores/blobs/http/broken HTTP/1.1\r\nHost: x\r\nFence-Lock: chunks\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nmore\r\n0\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}\n"):
            d = s.recv(65536)
            self.assertTrue(d, "no answer before the connection closed: %r" % got)
            got += d
        head, _, body = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400 "), got)
        doc = json.loads(body)
        self.assertEqual(doc["error"], "bad_request", doc)
        self.assertIn("chunk size 'z' is not hexadecimal", doc["message"])
        self.assertIn(b"Connection: close", head)
        time.sleep(0.5)
        self.assertNotIn("/prefix/broken", [r["path"] for r in self.up.seen()])
        self.assertEqual(self.store(fg, "PUT", "/whole", "chunks", b"w")[0], 201)

    def test_requests_that_stop_arriving_are_answered_408_at_30_s(self):
        """The HTTP endpoint's 30 s read limit, all cases at once: a request head that stops
        halfway, a lock API body that stops, and an HTTP store upload that stops (with a store
        timeout above 30 s) are each answered 408 request_timeout naming what stopped, and their
        connections closed; the store never sees the upload whole. An idle kept-alive
        connection is closed with no answer. Takes about 31 s."""
        fg = self.sidecar()
        self.acquire(fg, "slow")
        sends = {
            "head": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Half: ",
            "lock body": b"POST /v1/locks/q HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n"
                         b"\r\n{\"ttl",
            "upload": b"PUT /v1/stores/blobs/http/stalled HTTP/1.1\r\nHost: x\r\n"
                      b"Fence-Lock: slow\r\nFence-Timeout-Ms: 60000\r\nContent-Length: 100\r\n"
                      b"\r\n" + b"s" * 10,
            "idle": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        }
        socks = {}
        for name, data in sends.items():
            socks[name] = socket.create_connection(("127.0.0.1", fg.http_port), timeout=45)
            self.addCleanup(socks[name].close)
            socks[name].sendall(data)
        start = time.monotonic()
        got = {}
        for name, s in socks.items():
            got[name] = (harness.recv_until_close(s), time.monotonic() - start)
        for name, says in (("head", "the request head stopped arriving"),
                           ("lock body", "the request body stopped arriving"),
                           ("upload", "the request body stopped arriving; it was not passed on "
                                      "whole")):
            data, took = got[name]
            self.assertTrue(data.startswith(b"HTTP/1.1 408 "), (name, data))
            self.assertGreater(took, 29, name)
            doc = json.loads(data.partition(b"\r\n\r\n")[2])
            self.assertEqual((doc["error"], doc["message"]), ("request_timeout", says), name)
        data, took = got["idle"]
        self.assertTrue(data.startswith(b"HTTP/1.1 200 "), data)
        self.assertEqual(data.count(b"HTTP/1.1"), 1, data)  # the answer, then only the close
        self.assertGreater(took, 29)
        self.assertNotIn("/prefix/stalled", [r["path"] for r in self.up.seen()])
        self.assertEqual(self.store(fg, "PUT", "/whole", "slow", b"w")[0], 201)

    def test_a_client_that_stops_reading_a_download_is_cut_at_the_idle_limit(self):
        """A client that stops reading a large download is cut once it has taken nothing for the
        idle limit (Fence-Timeout-Ms, 2 s here; 20 s by default), with a log line and a store
        error counted: not up to twice the limit later, which left the default 20 s to the HTTP
        endpoint's 30 s write limit, silently."""
        fg = self.sidecar()
        self.acquire(fg, "idle")
        s = socket.socket()
        self.addCleanup(s.close)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        s.settimeout(10)
        s.connect(("127.0.0.1", fg.http_port))
        s.sendall(b"GET /v1/stores/blobs/http/big HTTP/1.1\r\nHost: x\r\nFence-Lock: idle\r\n"
                  b"Fence-Timeout-Ms: 2000\r\n\r\n")
        got = b""
        while len(got) < 1 << 20:
            d = s.recv(65536)
            self.assertTrue(d, "the download ended early")
            got += d
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
        stopped = time.monotonic()  # no more reading: the sidecar fills the socket, then waits
        harness.wait_until(lambda: fg.metrics().get("fencegate_http_store_errors_total") == 1,
                           10, what="the download to be cut")
        took = time.monotonic() - stopped
        self.assertGreater(took, 1.9)
        self.assertLess(took, 3.3)  # was 4 s: the limit counted from the last check, not read
        self.assertIn("made no progress for 2000 ms (the client stopped reading)", fg.log())

    def test_a_body_that_ends_with_the_connection_reaches_a_slow_client_whole(self):
        """A store that frames its body by closing the connection: the client (HTTP/1.1) gets
        it chunked and whole, although it reads slowly, so that the store's close arrives while
        the sidecar still holds the body's last bytes."""
        fg = self.sidecar()
        self.acquire(fg, "tc")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=30)
        self.addCleanup(c.close)
        c.request("GET", "/v1/stores/blobs/http/tillclose", headers={"Fence-Lock": "tc"})
        r = c.getresponse()
        self.assertEqual((r.status, r.getheader("Transfer-Encoding")), (200, "chunked"))
        first = r.read(64 * 1024)
        time.sleep(1.0)  # the store writes the rest, closes; the sidecar is paused meanwhile
        data = first + r.read()
        self.assertEqual(data, bytes(range(256)) * 256 * 64)

    def test_chunked_response_and_head(self):
        fg = self.sidecar()
        self.acquire(fg, "ch")
        st, headers, data = self.store(fg, "GET", "/chunked", "ch")
        self.assertEqual((st, data), (200, b"alpha-beta-gamma"))
        st, headers, data = self.store(fg, "HEAD", "/x", "ch")
        self.assertEqual((st, data), (200, b""))
        self.assertEqual(self.up.seen()[-1]["method"], "HEAD")

    def test_refusals_forward_nothing(self):
        fg = self.sidecar()
        self.assert_error(self.store(fg, "GET", "/a"), 400, "bad_request")
        self.assert_error(self.store(fg, "GET", "/a", ""), 400, "bad_request")
        doc = self.assert_error(self.store(fg, "GET", "/a", "nobody"), 409, "lock_lost")
        self.assertIn("nobody", doc["message"])
        self.acquire(fg, "mine")
        self.assert_error(self.store(fg, "GET", "/a/../../admin", "mine"), 400, "bad_request")
        self.assert_error(self.store(fg, "GET", "/a", "mine",
                                     headers={"Fence-Timeout-Ms": "soon"}), 400, "bad_request")
        st, _, data = harness.http_request(fg.http_port, "GET", "/v1/stores/nope/http/a",
                                           headers={"Fence-Lock": "mine"})
        self.assertEqual(st, 404, data)
        self.assertEqual(json.loads(data)["error"], "unknown_store")
        self.assertEqual(self.up.seen(), [])
        metrics = harness.parse_metrics(harness.http_get(fg.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_locklost_refused_total"), 1)

    def test_a_refused_upload_gets_its_answer_although_its_body_was_not_read(self):
        """A client that sends its whole body before reading (no Expect: 100-continue), refused
        before the body was read (409: no lock; 413: over the limit of a buffered body): it gets
        the JSON answer, not a broken pipe or a reset from a close with its body unread."""
        fg = self.sidecar()
        for method, path, size, status, code in (
                ("PUT", "/v1/stores/blobs/http/x", 4 << 20, 409, "lock_lost"),
                ("PUT", "/v1/stores/blobs/http/x", 16 << 20, 409, "lock_lost"),
                ("POST", "/v1/locks/big", 4 << 20, 413, "request_too_large")):
            c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            try:
                c.request(method, path, body=b"x" * size, headers={"Fence-Lock": "nobody"})
                r = c.getresponse()
                doc = json.loads(r.read())
            finally:
                c.close()
            self.assertEqual((r.status, doc["error"]), (status, code), (path, size, doc))
        self.assertEqual(self.up.seen(), [])

    def test_store_failing_mid_response_is_not_passed_off_as_whole(self):
        fg = self.sidecar()
        self.acquire(fg, "cut")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
        self.addCleanup(c.close)
        c.request("GET", "/v1/stores/blobs/http/cut", headers={"Fence-Lock": "cut"})
        # Depending on timing the client sees a cut body, or 502 outcome_unknown when the store's
        # close came before any of the answer reached it: never a whole one.
        r = c.getresponse()
        if r.status == 502:
            self.assertEqual(json.loads(r.read())["error"], "outcome_unknown")
        else:
            self.assertEqual(r.status, 200)
            with self.assertRaises(http.client.IncompleteRead):
                r.read()
        metrics = harness.parse_metrics(harness.http_get(fg.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_errors_total"), 1)

    def test_no_path_climbs_out_of_the_prefix_however_a_store_reads_it(self):
        """Stores differ: some decode %2f or %5c into a separator, split at '\\', or drop ';'
        parameters before resolving dot segments. Each such spelling of '..' is refused, and
        nothing reaches the store; dots that are not a segment pass."""
        fg = self.sidecar()
        self.acquire(fg, "d")
        for path in ("/..%2fx", "/..%2Fx", "/..%5cx", "/a\\..\\x", "/..;/x", "/x/%2e%2e;p"):
            doc = self.assert_error(self.store(fg, "GET", path, lock="d"), 400, "bad_request")
            self.assertIn("'.' or '..' segment", doc["message"])
        self.assertEqual(self.up.seen(), [])
        st, _, _ = self.store(fg, "GET", "/..a/b../.c;..", lock="d")
        self.assertEqual(st, 200)
        self.assertEqual(self.up.seen()[-1]["path"], "/prefix/..a/b../.c;..")

    def test_protect_rules_see_the_decoded_path(self):
        """The store decodes the path; the rules must see what the store will. An encoded
        letter cannot slip a protected path past its rule; an encoded '/', an encoded NUL and an
        empty segment are refused, since stores differ on what they mean."""
        fg = self.sidecar(extra="protect:\n"
                                "  - { store: blobs, keys: \"reports/*\", lock: \"report:$1\" }\n")
        self.acquire(fg, "other")
        for path in ("/r%65ports/7", "/%72eports/7", "/reports/%37"):
            doc = self.assert_error(self.store(fg, "PUT", path, lock="other", body=b"x"),
                                    409, "wrong_lock")
            self.assertIn("report:7", doc["message"])
        for path in ("/reports%2F7", "/reports%2f7", "//reports/7", "/reports//7",
                     "/reports/7%00", "/reports/%zz", "/reports/%4", "/reports/7/../8",
                     "/reports/%2e%2E/8"):
            doc = self.assert_error(self.store(fg, "PUT", path, lock="other", body=b"x"),
                                    400, "bad_request")
            self.assertIn("path", doc["message"])
        self.assertEqual(self.up.seen(), [])
        # Decoded, the path is claimed by the rule: its lock is used, and the path is passed on
        # as sent.
        token = self.acquire(fg, "report:7")
        st, _, body = self.store(fg, "PUT", "/reports/%37", body=b"r7")
        self.assertEqual(st, 201, body)
        rec = self.up.seen()[-1]
        self.assertEqual(rec["path"], "/prefix/reports/%37")
        self.assertEqual(Upstream.header(rec, "Fence-Lock"), ["report:7"])
        self.assertEqual(Upstream.header(rec, "Fencing-Token"), [str(token)])
        # Paths no rule claims work as before with Fence-Lock.
        st, _, body = self.store(fg, "PUT", "/other/a%20b", lock="other", body=b"x")
        self.assertEqual(st, 201, body)

    def test_a_protected_path_whose_lock_no_one_can_hold_is_refused(self):
        """A rule whose lock name would pass 512 bytes, or would hold a CR or LF (which the
        forwarded request's Fence-Lock header cannot carry), fences a path no lock can guard:
        refused, never forwarded under another lock the client names or holds."""
        fg = self.sidecar(extra="protect:\n"
                                "  - { store: blobs, keys: \"reports/*\", lock: \"report:$1\" }\n")
        self.acquire(fg, "other")
        long_ = "/reports/" + "a" * 600
        for lock in ("other", None):
            doc = self.assert_error(self.store(fg, "PUT", long_, lock=lock, body=b"x"),
                                    414, "uri_too_long")
            self.assertIn("longer than 512 bytes", doc["message"])
        self.acquire(fg, "report:a%0D%0Ab")  # the lock API decodes its path too
        st, _, data = harness.http_request(fg.http_port, "GET", "/v1/locks")
        self.assertIn("report:a\r\nb", [x["name"] for x in json.loads(data)["locks"]])
        doc = self.assert_error(self.store(fg, "PUT", "/reports/a%0D%0Ab", body=b"x"),
                                400, "bad_request")
        self.assertIn("CR or LF", doc["message"])
        self.assertEqual(self.up.seen(), [])

    def test_client_closing_mid_stream_and_mid_wait(self):
        """A client that reads part of a large response and closes, and one that closes while
        the store has not answered: the sidecar drops the store request, counts and logs it,
        keeps serving, and frees everything (the stop checks for sanitizer reports)."""
        fg = self.sidecar()
        self.acquire(fg, "L")
        for path, read in (("/big", 300000), ("/slow", 0), ("/big", 0)):
            s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
            s.sendall(("GET /v1/stores/blobs/http%s HTTP/1.1\r\nHost: x\r\nFence-Lock: L\r\n"
                       "\r\n" % path).encode())
            got = b""
            deadline = time.monotonic() + 10
            while len(got) < read and time.monotonic() < deadline:
                d = s.recv(65536)
                if not d:
                    break
                got += d
            if read:
                self.assertGreaterEqual(len(got), read)
                self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:100])
            else:
                time.sleep(0.3)  # the request reached the store (or is on its way)
            s.close()
            time.sleep(0.5)  # the store's next chunk arrives after the client left
            self.assertTrue(fg.alive())
        harness.wait_until(lambda: fg.metrics().get("fencegate_http_store_abandoned_total") == 3, 5,
                           what="three abandoned forwards counted")
        self.assertIn("http store blobs: the client of /prefix/slow left before the answer was "
                      "through; the store may or may not have applied the request", fg.log())
        self.assertIn("http store blobs: the client of /prefix/big left before the answer was "
                      "through; the store had answered", fg.log())
        # Still serving, streams included.
        st, _, data = self.store(fg, "GET", "/x", "L")
        self.assertEqual(st, 200, data)
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=60)
        self.addCleanup(c.close)
        c.request("GET", "/v1/stores/blobs/http/big", headers={"Fence-Lock": "L"})
        r = c.getresponse()
        self.assertEqual(len(r.read()), BIG)

    def test_outcome_unknown_is_not_store_unavailable(self):
        """A store that took the request and closed without answering, or answered with
        something that cannot be relayed, may have applied it: 502 outcome_unknown; a store that
        never took the connection: 502 store_unavailable (nothing sent). Interim answers (100,
        103) are skipped and the final one relayed."""
        big = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n"
        raw, fg = self.raw_sidecar({
            "/early": b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
                      b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            "/continue": b"HTTP/1.1 100 Continue\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            "/upgrade": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            "/gzipped": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxxxx",
            "/bighead": big}, "u")
        doc = self.assert_error(self.store(fg, "PUT", "/vanish", "u", b"v"), 502,
                                "outcome_unknown")
        self.assertIn("may or may not have been applied", doc["message"])
        self.assertIn("closed the connection", doc["message"])
        for path in ("/early", "/continue"):
            st, headers, data = self.store(fg, "GET", path, "u")
            self.assertEqual((st, data), (200, b"ok"), path)
            self.assertNotIn("link", headers)  # the interim answer's fields are not the final's
        for path, says in (("/upgrade", "101"), ("/gzipped", "gzip"),
                           ("/bighead", "65536 bytes")):
            doc = self.assert_error(self.store(fg, "GET", path, "u"), 502, "outcome_unknown")
            self.assertIn(says, doc["message"])
            self.assertIn("may or may not have been applied", doc["message"])
        self.assertEqual(raw.paths, ["/vanish", "/early", "/continue", "/upgrade", "/gzipped",
                                     "/bighead"])
        self.assertEqual(harness.http_get(fg.http_port, "/healthz")[0], 200)

    def test_content_length_with_chunked_never_reaches_the_client(self):
        """A store sending both Content-Length and Transfer-Encoding: chunked (a response
        splitting vector, RFC 9112 §6.3): the sidecar refuses to relay it, so the client gets 502
        outcome_unknown, never the store's Content-Length over a re-framed body, and its
        keep-alive connection keeps its framing. Duplicate equal Content-Lengths pass as one."""
        body = b"0123456789abcdef"
        raw, fg = self.raw_sidecar({
            "/both": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
                     b"\r\n10\r\n" + body + b"\r\n0\r\n\r\n",
            "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                        b"\r\n10\r\n" + body + b"\r\n0\r\n\r\n",
            "/twice": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            "/next": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"}, "c")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
        self.addCleanup(c.close)
        for path, status, want in (("/both", 502, None), ("/chunked", 200, body),
                                   ("/twice", 200, b"abc"), ("/next", 200, b"next")):
            c.request("GET", "/v1/stores/blobs/http" + path, headers={"Fence-Lock": "c"})
            r = c.getresponse()
            data = r.read()
            self.assertEqual(r.status, status, (path, data))
            if want is None:
                self.assertEqual(json.loads(data)["error"], "outcome_unknown")
            else:
                self.assertEqual(data, want, path)
            cls = [v for k, v in r.getheaders() if k.lower() == "content-length"]
            self.assertLessEqual(len(cls), 1, cls)
            if path == "/chunked":
                self.assertEqual(cls, [])

    def test_a_broken_chunked_body_is_a_502_until_the_client_got_some_of_it(self):
        """A store whose chunked body is malformed from its first chunk size line, read with its
        head: nothing reached the client yet, so it gets 502 outcome_unknown, not an empty reply
        (and its connection serves its next request). The same garbage once the head has gone
        out: the client's connection is closed, never a reply that looks whole."""
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Store: yes\r\n\r\n"
        raw, fg = self.raw_sidecar({
            "/first": head + b"zz\r\n",
            "/later": (head + b"2\r\nok\r\n", b"zz\r\n"),
            "/next": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"}, "k")
        c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
        self.addCleanup(c.close)
        c.request("GET", "/v1/stores/blobs/http/first", headers={"Fence-Lock": "k"})
        r = c.getresponse()
        doc = json.loads(r.read())
        self.assertEqual((r.status, doc["error"]), (502, "outcome_unknown"), doc)
        self.assertIn("chunk", doc["message"])
        self.assertIn("may or may not have been applied", doc["message"])
        self.assertIsNone(r.getheader("X-Store"))  # none of the store's answer
        c.request("GET", "/v1/stores/blobs/http/next", headers={"Fence-Lock": "k"})
        r = c.getresponse()
        self.assertEqual((r.status, r.read()), (200, b"next"))
        with self.assertRaises((http.client.IncompleteRead, http.client.RemoteDisconnected)):
            c.request("GET", "/v1/stores/blobs/http/later", headers={"Fence-Lock": "k"})
            r = c.getresponse()
            self.assertEqual(r.status, 200)
            r.read()
        metrics = harness.parse_metrics(harness.http_get(fg.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_errors_total"), 2)

    def test_a_store_connection_with_bytes_left_over_is_not_reused(self):
        """A store that sends more than its response's framing says (a HEAD answered with a
        body, bytes past the Content-Length, bytes while the connection is idle): the connection
        is closed, never handed to the next request, which would take the leftover bytes for its
        own answer (another client's, under another lock). A HEAD's answer has no body whatever
        its Content-Length says."""
        smuggled = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl"
        raw, fg = self.raw_sidecar({
            "/extra": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + smuggled,
            "/head": smuggled + smuggled,
            "/later": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", smuggled),
            "/next": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"}, "a", "b")
        for method, path, want in (("GET", "/extra", b"ok"), ("HEAD", "/head", b""),
                                   ("GET", "/later", b"ok")):
            st, headers, data = self.store(fg, method, path, "a")
            self.assertEqual((st, data), (200, want), path)
            if method == "HEAD":
                self.assertEqual(headers.get("content-length"), "6")
            time.sleep(0.3)  # /later: its extra bytes arrive while the connection is idle
            st, _, data = self.store(fg, "GET", "/next", "b")
            self.assertEqual((st, data), (200, b"next"), "after " + path)
        self.assertEqual(raw.paths, ["/extra", "/next", "/head", "/next", "/later", "/next"])

    def test_store_down_is_502(self):
        dead = harness.free_port()
        fg = self.sidecar(url="http://127.0.0.1:%d" % dead)
        self.acquire(fg, "d")
        t0 = time.monotonic()
        doc = self.assert_error(self.store(fg, "PUT", "/x", "d", b"v"), 502, "store_unavailable")
        self.assertIn("blobs", doc["message"])
        self.assertIn("nothing was sent", doc["message"])
        self.assertLess(time.monotonic() - t0, 3)
        # The sidecar carries on: the lock API and other requests still answer.
        self.assertEqual(harness.http_get(fg.http_port, "/healthz")[0], 200)

    def test_slow_store_is_504(self):
        fg = self.sidecar()
        self.acquire(fg, "s")
        t0 = time.monotonic()
        doc = self.assert_error(self.store(fg, "GET", "/slow", "s",
                                           headers={"Fence-Timeout-Ms": "500"}),
                                504, "store_timeout")
        took = time.monotonic() - t0
        self.assertGreaterEqual(took, 0.45)
        self.assertLess(took, 2.5)
        self.assertIn("500 ms", doc["message"])
        self.assertIn("may or may not have been applied", doc["message"])

    def test_backend_down_fails_closed(self):
        fg = self.sidecar()
        self.acquire(fg, "bd")
        self.redis.proc.send_signal(harness.signal.SIGSTOP)
        self.addCleanup(lambda: self.redis.proc.send_signal(harness.signal.SIGCONT))
        doc = self.assert_error(self.store(fg, "PUT", "/x", "bd", b"v"), 503, "unavailable")
        self.assertIn("nothing was forwarded", doc["message"])
        self.redis.proc.send_signal(harness.signal.SIGCONT)
        self.assertEqual(self.up.seen(), [])


    def test_a_stalled_lookup_of_the_store_host_leaves_the_sidecar_answering(self):
        """The store's host name is looked up off the event loop, for each new connection: while
        the DNS server does not answer, requests to that store fail within the connect timeout
        with nothing sent, everything else (the sidecar's endpoints, a store given by address)
        stays prompt, and the store is back without a restart. Host is still the name."""
        dns = self.slow_dns()
        fg = self.sidecar(url="http://store.fgtest:%d/prefix" % self.up.port, env=dns.env(),
                          extra="  - { name: num, url: \"http://127.0.0.1:%d/num\" }\n"
                          % self.up.port)
        self.acquire(fg, "n")
        self.assertEqual(self.store(fg, "PUT", "/a", "n", b"v")[0], 201)
        host = "store.fgtest:%d" % self.up.port
        self.assertEqual(Upstream.header(self.up.seen()[-1], "Host"), [host])
        # The name service now takes 5 s to answer (past the 3 s of the checks below, which a
        # lookup on the event loop would fail); the kept-alive connection is closed after 2 s
        # idle, so the next request connects anew and looks the name up again.
        dns.stall("store.fgtest", 5000)
        time.sleep(2.2)
        poller = harness.PromptPoller(  # the other store too
            fg, lambda: self.store(fg, "GET", "/x", "n", timeout=5, name="num")[0] == 200)
        poller.start()
        t0 = time.monotonic()
        doc = self.assert_error(self.store(fg, "PUT", "/b", "n", b"v"), 502, "store_unavailable")
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertIn("resolving 'store.fgtest'", doc["message"])
        self.assertIn("nothing was sent", doc["message"])
        poller.join()
        self.assertLess(poller.worst, 1.0, "a request waited on the stalled lookup")
        self.assertNotIn("/prefix/b", [r["path"] for r in self.up.seen()])
        # The name service answers again: the store is back without a restart.
        dns.stall("store.fgtest", 0)
        harness.wait_until(lambda: self.store(fg, "PUT", "/c", "n", b"v")[0] == 201, 15,
                           what="the store back")
        rec = self.up.seen()[-1]
        self.assertEqual((rec["path"], Upstream.header(rec, "Host")), ("/prefix/c", [host]))

    def test_a_lock_released_during_the_lookup_is_not_forwarded(self):
        """The mark is checked before the store's host name is looked up for a new connection;
        a lock released while the lookup hangs is checked again after it: 409 lock_lost, and
        nothing reaches the store."""
        dns = self.slow_dns()
        fg = self.sidecar(url="http://store.fgtest:%d/prefix" % self.up.port, env=dns.env())
        self.acquire(fg, "r")
        dns.stall("store.fgtest", 1000)
        got = []
        put = threading.Thread(target=lambda: got.append(self.store(fg, "PUT", "/r", "r", b"v")))
        put.start()
        time.sleep(0.4)
        self.assertEqual(harness.http_request(fg.http_port, "DELETE", "/v1/locks/r")[0], 200)
        put.join()
        doc = self.assert_error(got[0], 409, "lock_lost")
        self.assertIn("looked up", doc["message"])
        self.assertNotIn("/prefix/r", [r["path"] for r in self.up.seen()])


class HttpStoreShutdown(HttpStoreCase):

    def test_sigterm_lets_a_request_in_flight_finish(self):
        # SIGTERM while a request waits for a slow store (3 s): the sidecar stops accepting and
        # closes its idle HTTP connections at once, but relays the store's answer to the request
        # in flight, with "Connection: close", before it exits; it used to cut it off at once,
        # leaving the client without the outcome of a request the store had taken.
        fg = self.sidecar()
        self.acquire(fg, "W")
        idle = socket.create_connection(("127.0.0.1", fg.http_port), timeout=5)
        self.addCleanup(idle.close)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"200", idle.recv(4096).split(b"\r\n")[0])
        result = {}
        t = threading.Thread(target=lambda: result.update(r=self.store(fg, "GET", "/slow", "W")))
        t.start()
        harness.wait_until(lambda: self.up.seen(), 5, 0.02, "the request at the store")
        fg.signal(signal.SIGTERM)
        idle.settimeout(2)
        self.assertEqual(idle.recv(4096), b"", "the idle connection was not closed at once")
        harness.wait_until(lambda: not harness.port_accepts(fg.http_port, 0.2), 3, 0.05,
                           "the HTTP listener to close after SIGTERM")
        t.join(10)
        self.assertFalse(t.is_alive())
        st, headers, _ = result["r"]
        self.assertEqual(st, 200)
        self.assertEqual(headers.get("connection"), "close")
        self.assertEqual(fg.wait_exit(10), 0, fg.stderr_text)


class HttpStoreTwoSidecars(HttpStoreCase):

    def test_frozen_holder_is_refused_and_never_reaches_the_store(self):
        a = self.sidecar(ttl_ms=1000)
        b = self.sidecar(ttl_ms=1000)
        ta = self.acquire(a, "L")
        st, _, _ = self.store(a, "PUT", "/obj", "L", b"from-a-before")
        self.assertEqual(st, 201)
        self.freeze(a)
        time.sleep(1.5)  # A's lease runs out in the backend while A cannot renew it
        tb = self.acquire(b, "L", {"wait_ms": 3000})
        self.assertGreater(tb, ta)
        st, _, _ = self.store(b, "PUT", "/obj", "L", b"from-b")
        self.assertEqual(st, 201)

        # A's request is sent while A is still frozen; it is answered once A resumes.
        result = {}
        t = threading.Thread(target=lambda: result.update(
            r=self.store(a, "PUT", "/obj", "L", b"from-a-after")))
        t.start()
        time.sleep(0.3)
        a.signal(harness.signal.SIGCONT)
        t.join(15)
        self.assertFalse(t.is_alive())
        st, _, data = result["r"]
        self.assertEqual(st, 409, data)
        # A's clock says its lease ran out while it was frozen: refused locally, before even
        # the backend's mark is asked.
        self.assertEqual(json.loads(data)["error"], "lock_lost")
        bodies = [r["body"] for r in self.up.seen()]
        self.assertEqual(bodies, [b"from-a-before", b"from-b"])
        self.assertEqual([Upstream.header(r, "Fencing-Token") for r in self.up.seen()],
                         [[str(ta)], [str(tb)]])

    def test_stale_token_refused_by_the_backend_mark(self):
        """A believes it still holds L (its local lease has not run out), but the backend lost
        the lock and B took it: B's fence on acquire raised the mark, so A's request is refused
        as stale before it is sent, though the store itself never looks at the token."""
        a = self.sidecar(ttl_ms=30000)
        b = self.sidecar(ttl_ms=30000)
        ta = self.acquire(a, "W")
        self.direct.delete("fencegate:lock:{W}")
        tb = self.acquire(b, "W")
        self.assertGreater(tb, ta)
        self.assertEqual(int(self.direct.get(mark_key("blobs", "W"))), tb)
        got = self.store(a, "PUT", "/w", "W", b"late")
        doc = self.assert_error(got, 409, "stale_token")
        self.assertEqual((doc["token"], doc["mark"]), (ta, tb))
        self.assertEqual(self.up.seen(), [])
        # The mark proves a newer grant: A's sidecar gives the lock up at once, and refuses
        # A's next request itself.
        st, body = harness.http_get(a.http_port, "/v1/locks")
        self.assertEqual([(x["name"], x["state"]) for x in json.loads(body)["locks"]],
                         [("W", "lost")])
        self.assert_error(self.store(a, "PUT", "/w", "W", b"later"), 409, "lock_lost")
        st, _, _ = self.store(b, "PUT", "/w", "W", b"current")
        self.assertEqual(st, 201)
        self.assertEqual([r["body"] for r in self.up.seen()], [b"current"])
        metrics = harness.parse_metrics(harness.http_get(a.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_stale_refused_total"), 1)


    def test_former_holder_refused_although_its_token_came_again(self):
        """A failover to a replica that missed A's grant takes the lock key, the token counter
        and the store's mark (kept in the lock backend) back together, and B is granted A's very
        token. The mark cannot tell them apart; the lock key, checked in the same script, can:
        A's request is refused lock_lost before it is sent, A's sidecar finds the lock lost at
        once (its next renewal is 10 s away), and B's goes through."""
        a = self.sidecar(ttl_ms=30000)
        b = self.sidecar(ttl_ms=30000)
        ta = self.acquire(a, "R")
        st, _, _ = self.store(a, "PUT", "/r", "R", b"a-before")
        self.assertEqual(st, 201)
        self.direct.delete("fencegate:lock:{R}")
        self.direct.set("fencegate:token:{R}", ta - 1)
        self.direct.set(mark_key("blobs", "R"), ta - 1)
        self.direct.set("fencegate:hwm:{R}", ta - 1)  # the mark of the Redis store "cache"
        self.assertEqual(self.acquire(b, "R"), ta, "the lost grant's token is granted again")
        doc = self.assert_error(self.store(a, "PUT", "/r", "R", b"a-after"), 409, "lock_lost")
        self.assertIn("not held by this session", doc["message"])

        def state():
            st, _, data = harness.http_request(a.http_port, "GET", "/v1/locks", timeout=5)
            return [x.get("state") for x in json.loads(data)["locks"] if x["name"] == "R"]
        harness.wait_until(lambda: state() in ([], ["lost"]), 3, 0.05,
                           "A's sidecar to find R lost after the backend's refusal")
        st, _, _ = self.store(b, "PUT", "/r", "R", b"b")
        self.assertEqual(st, 201)
        self.assertEqual([r["body"] for r in self.up.seen()], [b"a-before", b"b"])
        self.assertEqual([Upstream.header(r, "Fencing-Token") for r in self.up.seen()],
                         [[str(ta)], [str(ta)]])
        metrics = harness.parse_metrics(harness.http_get(a.http_port, "/metrics")[1].decode())
        self.assertEqual(metrics.get("fencegate_http_store_stale_refused_total", 0), 0)


if __name__ == "__main__":
    unittest.main()
