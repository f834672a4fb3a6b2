"""The application's health check (config app_health, DESIGN.md §3): locks held over HTTP belong
to the sidecar's own session, which would otherwise keep them for an application that has hung.
With app_health.url set, failure_threshold failed checks in a row give every HTTP-held lock up
(marked lost, freed in the backend at once) and refuse new ones with 503 app_unhealthy, until a
check passes again. Locks taken on the Redis endpoint belong to the application's connection and
are not affected. The application here is a small HTTP server of the test's own whose answer the
test sets: 200, 500, a close without an answer, or no answer at all."""

import http.server
import json
import socketserver
import subprocess
import threading
import time
import unittest

import harness
from etcd_harness import EtcdTestCase
from harness import FgTestCase

INTERVAL_MS = 100
THRESHOLD = 2
TIMEOUT_MS = 300


class App:
    """The application's health endpoint. mode: 'ok' (200), 'sick' (500), 'close' (closes the
    connection without a response), 'hang' (reads the request, never answers)."""

    def __init__(self):
        self.mode = "ok"
        self.checks = 0
        self.paths = set()
        self.hosts = set()  # Host headers seen
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                app.checks += 1
                app.paths.add(self.path)
                app.hosts.add(self.headers.get("Host"))
                mode = app.mode
                if mode == "close":
                    self.close_connection = True
                    return
                if mode == "hang":
                    time.sleep(2 * TIMEOUT_MS / 1000.0)
                    self.close_connection = True
                    return
                body = b"fine" if mode == "ok" else b"broken"
                self.send_response(200 if mode == "ok" else 500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/healthz" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class AppHealth(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)
        self.app = App()
        self.addCleanup(self.app.stop)

    def start_gated(self, url=None, extra=(), env=None):
        return self.start_fencegate(self.redis, env=env, args=[
            # A long session lease: a lock that goes away sooner was given up, not expired.
            "--session-ttl-ms", "60000",
            "--app-health-url", url or self.app.url,
            "--app-health-interval-ms", str(INTERVAL_MS),
            "--app-health-timeout-ms", str(TIMEOUT_MS),
            "--app-health-failure-threshold", str(THRESHOLD)] + list(extra))

    def req(self, fg, method, path, body=None):
        status, _, data = harness.http_request(fg.http_port, method, path, body, timeout=10)
        return status, json.loads(data)

    def lock_state(self, fg, name):
        _, doc = self.req(fg, "GET", "/v1/locks")
        for lk in doc["locks"]:
            if lk["name"] == name:
                return lk["state"]
        return None

    def metric(self, fg, name):
        m = fg.metrics()
        self.assertIn(name, m)
        return m[name]

    def acquire(self, fg, name):
        st, doc = self.req(fg, "POST", "/v1/locks/" + name, {"ttl_ms": 60000})
        self.assertEqual(st, 200, doc)
        return doc["token"]

    def wait_given_up(self, fg, name):
        harness.wait_until(lambda: self.lock_state(fg, name) == "lost", 5,
                           what="lock %s given up" % name)

    def test_failing_app_gives_its_locks_up_and_gets_none(self):
        fg = self.start_gated()
        t1 = self.acquire(fg, "L")
        harness.wait_until(lambda: self.app.checks >= 3, 5, what="checks while healthy")
        self.assertEqual(self.lock_state(fg, "L"), "held", "a passing app keeps its lock")
        self.assertEqual(self.app.paths, {"/healthz"})
        self.assertEqual(self.metric(fg, "fencegate_app_healthy"), 1)

        self.app.mode = "sick"
        t0 = time.monotonic()
        self.wait_given_up(fg, "L")
        # Freed in the backend at once, not when the 60 s lease runs out.
        harness.wait_until(lambda: not self.direct.exists("fencegate:lock:{L}"), 2,
                           what="the lock key deleted")
        self.assertLess(time.monotonic() - t0, 5)
        st, doc = self.req(fg, "POST", "/v1/locks/M", {"ttl_ms": 5000})
        self.assertEqual(st, 503, doc)
        self.assertEqual(doc["error"], "app_unhealthy", doc)
        self.assertIn(self.app.url, doc["message"])
        self.assertIn("HTTP status 500", doc["message"])
        self.assertEqual(self.metric(fg, "fencegate_app_healthy"), 0)
        self.assertGreaterEqual(self.metric(fg, "fencegate_app_health_check_failures_total"),
                                THRESHOLD)
        with open(fg.stderr_path) as f:
            self.assertIn("giving up every lock held over HTTP", f.read())

        # Another sidecar takes the lock at once, with a larger token.
        other = self.start_fencegate(self.redis)
        t2 = self.acquire(other, "L")
        self.assertGreater(t2, t1)
        st, doc = self.req(other, "DELETE", "/v1/locks/L")
        self.assertEqual(st, 200, doc)

        # Healthy again: locks are granted again; the lost one is reported as such.
        self.app.mode = "ok"
        harness.wait_until(lambda: self.metric(fg, "fencegate_app_healthy") == 1, 5,
                           what="healthy again")
        st, doc = self.req(fg, "DELETE", "/v1/locks/L")
        self.assertEqual(st, 404, doc)
        self.assertIn("lost", doc["message"])
        t3 = self.acquire(fg, "L")
        self.assertGreater(t3, t2)

    def test_locks_on_the_redis_endpoint_are_not_affected(self):
        fg = self.start_gated()
        c = fg.client()
        self.addCleanup(c.close)
        token = c.execute_command("FENCE.ACQUIRE", "R", "TTL", "60000")
        self.acquire(fg, "H")
        self.app.mode = "sick"
        self.wait_given_up(fg, "H")
        self.assertEqual(c.execute_command("FENCE.TOKEN", "R"), token)
        self.assertTrue(c.set("{R}:x", "1"), "a fenced write under a RESP lock still passes")
        self.assertEqual(self.direct.get("{R}:x"), b"1")

    def test_a_grant_that_arrives_while_failing_is_given_back(self):
        holder = self.start_fencegate(self.redis)
        self.acquire(holder, "W")
        fg = self.start_gated()
        result = {}

        def wait_for_lock():
            result["got"] = self.req(fg, "POST", "/v1/locks/W", {"ttl_ms": 60000,
                                                                  "wait_ms": 8000})
        waiter = threading.Thread(target=wait_for_lock)
        waiter.start()
        time.sleep(0.3)  # the request waits in the backend
        self.app.mode = "sick"
        harness.wait_until(lambda: self.metric(fg, "fencegate_app_healthy") == 0, 5,
                           what="unhealthy")
        st, doc = self.req(holder, "DELETE", "/v1/locks/W")
        self.assertEqual(st, 200, doc)
        waiter.join(15)
        self.assertFalse(waiter.is_alive())
        st, doc = result["got"]
        self.assertEqual(st, 503, doc)
        self.assertEqual(doc["error"], "app_unhealthy", doc)
        self.assertNotEqual(self.lock_state(fg, "W"), "held")
        harness.wait_until(lambda: not self.direct.exists("fencegate:lock:{W}"), 3,
                           what="the granted lock given back")

    def test_fencectl_stops_the_command_of_a_failing_app(self):
        fg = self.start_gated()
        p = subprocess.Popen([harness.FENCECTL_BIN, "--http", "127.0.0.1:%d" % fg.http_port,
                              "lock", "job", "--ttl", "3000", "--", "sleep", "30"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=harness.clean_env())
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.stderr.close)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        harness.wait_until(lambda: self.lock_state(fg, "job") == "held", 5, what="job locked")
        self.app.mode = "sick"
        # fencectl checks every third of the TTL: it stops the command within about a second.
        _, err = p.communicate(timeout=10)
        self.assertEqual(p.returncode, 3, err)
        self.assertIn(b"lost", err)

    def test_fencectl_refused_for_a_failing_app_says_so(self):
        """fencectl exits 4 when the sidecar answers 503 app_unhealthy, and says the application
        is unhealthy: it said "(lock backend unavailable)" before the sidecar's reason, with the
        backend up and answering."""
        fg = self.start_gated()
        self.app.mode = "sick"
        harness.wait_until(lambda: self.metric(fg, "fencegate_app_healthy") == 0, 5,
                           what="unhealthy")
        p = subprocess.run([harness.FENCECTL_BIN, "--http", "127.0.0.1:%d" % fg.http_port,
                            "lock", "job", "--", "true"], stdin=subprocess.DEVNULL,
                           capture_output=True, env=harness.clean_env(), timeout=10)
        self.assertEqual(p.returncode, 4, p.stderr)
        self.assertNotIn(b"backend", p.stderr)
        self.assertIn(b"health check", p.stderr)
        self.assertIn(self.app.url.encode(), p.stderr)

    def check_failure_reason(self, mode, reason, url=None):
        fg = self.start_gated(url)
        self.acquire(fg, "L")
        self.app.mode = mode
        self.wait_given_up(fg, "L")
        st, doc = self.req(fg, "POST", "/v1/locks/L", {})
        self.assertEqual((st, doc["error"]), (503, "app_unhealthy"), doc)
        self.assertIn(reason, doc["message"])

    def test_an_app_that_does_not_answer_in_time_fails(self):
        self.check_failure_reason("hang", "no answer within %d ms" % TIMEOUT_MS)

    def test_an_app_that_closes_without_answering_fails(self):
        self.check_failure_reason("close", "closed")

    def test_an_app_that_is_not_listening_fails(self):
        port = harness.free_port()
        fg = self.start_fencegate(self.redis, args=[
            "--app-health-url", "http://127.0.0.1:%d/" % port,
            "--app-health-interval-ms", "100", "--app-health-failure-threshold", "1"])
        harness.wait_until(lambda: self.metric(fg, "fencegate_app_healthy") == 0, 5,
                           what="unhealthy")
        st, doc = self.req(fg, "POST", "/v1/locks/L", {})
        self.assertEqual((st, doc["error"]), (503, "app_unhealthy"), doc)
        self.assertIn("cannot connect", doc["message"])

    def test_a_stalled_lookup_of_the_app_host_fails_the_check_not_the_sidecar(self):
        """The URL's host name is looked up off the event loop, within the check's timeout:
        while the DNS server does not answer, checks fail saying so (and the locks are given up)
        while the sidecar's endpoints stay prompt; once it answers, checks pass again. Host is
        still the name."""
        dns = self.slow_dns()
        host = "app.fgtest:%d" % self.app.port
        fg = self.start_gated("http://%s/healthz" % host, env=dns.env())
        self.acquire(fg, "L")
        self.assertEqual(self.app.hosts, {host})
        dns.stall("app.fgtest", 3000)
        poller = harness.PromptPoller(fg, seconds=2.0)
        poller.start()
        self.wait_given_up(fg, "L")
        poller.join()
        self.assertLess(poller.worst, 1.0, "a request waited on the stalled lookup")
        st, doc = self.req(fg, "POST", "/v1/locks/L", {})
        self.assertEqual((st, doc["error"]), (503, "app_unhealthy"), doc)
        self.assertIn("resolving 'app.fgtest' took longer than %d ms" % TIMEOUT_MS,
                      doc["message"])
        # The name service answers again: checks pass, locks are granted.
        dns.stall("app.fgtest", 0)
        harness.wait_until(lambda: self.req(fg, "POST", "/v1/locks/L", {"ttl_ms": 60000})[0]
                           == 200, 15, what="the app healthy again")
        self.assertEqual(self.app.hosts, {host})

    def test_without_a_check_nothing_changes(self):
        fg = self.start_fencegate(self.redis)
        self.acquire(fg, "L")
        self.assertEqual(self.metric(fg, "fencegate_app_healthy"), 1)
        self.assertEqual(self.metric(fg, "fencegate_app_health_checks_total"), 0)

    def test_bad_settings_are_refused_at_start(self):
        for args, words in [
                (["--app-health-url", "https://127.0.0.1:8080/healthz"], "https://"),
                (["--app-health-url", "redis://127.0.0.1:6379"], "http:// URL"),
                (["--app-health-url", "http://127.0.0.1:99999/"], "99999"),
                (["--app-health-interval-ms", "50"], "100..600000"),
                (["--app-health-failure-threshold", "0"], "1..1000")]:
            rc, _, err = harness.run_fencegate(args)
            self.assertEqual(rc, 2, (args, err))
            self.assertIn(words, err, args)
        rc, _, err = harness.run_fencegate(
            [], env={"FENCEGATE_APP_HEALTH_TIMEOUT_MS": "abc"})
        self.assertEqual(rc, 2, err)
        self.assertIn("FENCEGATE_APP_HEALTH_TIMEOUT_MS", err)


class AppHealthEtcd(EtcdTestCase):
    """With etcd as the backend, a lock given up is deleted from etcd at once, so the next waiter
    (here on another sidecar) owns it well before the session lease runs out."""

    def test_the_next_waiter_gets_the_lock_at_once(self):
        redis = self.start_redis()
        etcd = self.start_etcd(1)
        app = App()
        self.addCleanup(app.stop)
        fg = self.start_fg_etcd(redis, etcd, args=[
            "--session-ttl-ms", "60000", "--app-health-url", app.url,
            "--app-health-interval-ms", str(INTERVAL_MS),
            "--app-health-failure-threshold", str(THRESHOLD)])
        other = self.start_fg_etcd(redis, etcd)
        st, _, data = harness.http_request(fg.http_port, "POST", "/v1/locks/E", {})
        self.assertEqual(st, 200, data)
        t1 = json.loads(data)["token"]
        waiter = self.raw(other.resp_port, timeout=20)
        waiter.send(harness.encode("FENCE.ACQUIRE", "E", "WAIT", 15000))
        harness.wait_until(lambda: len(etcd.keys("/fencegate/locks/E/")) == 2, 5,
                           what="the waiter queued")
        t0 = time.monotonic()
        app.mode = "sick"
        t2 = waiter.read_reply()
        self.assertIsInstance(t2, int, t2)
        self.assertGreater(t2, t1)
        self.assertLess(time.monotonic() - t0, 5, "given up at once, not after the 60 s lease")
        self.assertEqual([k[1] for k in etcd.keys("/fencegate/locks/E/")], [t2])


if __name__ == "__main__":
    unittest.main()
