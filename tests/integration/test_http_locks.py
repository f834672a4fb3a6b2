"""The HTTP lock API (DESIGN.md §3) and fencectl (§5): status codes and JSON shapes, waiting,
locks belonging to the sidecar's session (renewed while it runs, released on SIGTERM), the
backend being down, the lock metrics, and fencectl running a command under a lock."""

import http.client
import json
import os
import socket
import subprocess
import threading
import time
import unittest

import harness
from harness import Err, FgTestCase


def lock_key(name):
    return "fencegate:lock:{%s}" % name


def hwm_key(name):
    return "fencegate:hwm:{%s}" % name


class HttpCase(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def req(self, fg, method, path, body=None, timeout=10.0):
        """Returns (status, parsed JSON body)."""
        status, headers, data = harness.http_request(fg.http_port, method, path, body,
                                                     timeout=timeout)
        try:
            doc = json.loads(data)
        except ValueError:
            self.fail("%s %s -> %d with a body that is not JSON: %r" % (method, path, status,
                                                                        data[:300]))
        self.assertTrue(headers.get("content-type", "").startswith("application/json"),
                        "%s %s: content-type %r" % (method, path, headers.get("content-type")))
        return status, doc

    def assert_error(self, got, status, code=None):
        st, doc = got
        self.assertEqual(st, status, doc)
        self.assertIsInstance(doc.get("error"), str, doc)
        self.assertIsInstance(doc.get("message"), str, doc)
        if code:
            self.assertEqual(doc["error"], code, doc)


class HttpApi(HttpCase):

    def setUp(self):
        super().setUp()
        self.fg = self.start_fencegate(self.redis, args=["--session-ttl-ms", "800"])

    def test_a_waiting_client_that_leaves_leaves_no_lock_behind(self):
        """libevent does not notice a waiting client hang up; the sidecar asks the socket, so
        the wait ends, or a grant that comes after is given back, and nobody is left holding a
        lock no client knows the token of."""
        fg = self.fg
        st, doc = self.req(fg, "POST", "/v1/locks/w", {"ttl_ms": 3000})
        self.assertEqual(st, 200, doc)
        for release_first in (False, True):
            s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
            body = json.dumps({"wait_ms": 60000}).encode()
            s.sendall(b"POST /v1/locks/w HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            time.sleep(0.3)
            s.close()
            if release_first:  # B's wait is still on: it must not take the lock now
                st, doc = self.req(fg, "DELETE", "/v1/locks/w")
                self.assertEqual(st, 200, doc)
            time.sleep(0.5)
        st, doc = self.req(fg, "GET", "/v1/locks")
        self.assertEqual(doc["locks"], [], doc)
        self.assertEqual(self.direct.exists(lock_key("w")), 0)
        st, doc = self.req(fg, "POST", "/v1/locks/w", {"wait_ms": 0})
        self.assertEqual(st, 200, doc)

    def test_delete_of_a_lock_lost_in_the_backend_is_not_a_release(self):
        fg = self.fg
        st, doc = self.req(fg, "POST", "/v1/locks/x", {"ttl_ms": 3000})
        self.assertEqual(st, 200, doc)
        self.direct.set(lock_key("x"), "someone-else", px=5000)
        self.assert_error(self.req(fg, "DELETE", "/v1/locks/x"), 404, "not_held")
        self.assertEqual(self.direct.get(lock_key("x")), b"someone-else")

    def test_lock_names_come_back_whole_and_as_json(self):
        fg = self.fg
        self.assert_error(self.req(fg, "POST", "/v1/locks/%FF"), 400, "bad_request")
        name = "\x01" * 300
        st, doc = self.req(fg, "POST", "/v1/locks/" + "%01" * 300, {"ttl_ms": 3000})
        self.assertEqual((st, doc["name"]), (200, name))
        st, doc = self.req(fg, "GET", "/v1/locks")
        self.assertEqual([x["name"] for x in doc["locks"]], [name])

    def test_acquire_list_conflict_release(self):
        fg = self.fg
        st, doc = self.req(fg, "POST", "/v1/locks/job", {})
        self.assertEqual(st, 200, doc)
        self.assertEqual(set(doc), {"name", "token", "ttl_ms"}, doc)
        self.assertEqual(doc["name"], "job")
        self.assertEqual(doc["ttl_ms"], 800, "default lease is session_ttl_ms")
        t = doc["token"]
        self.assertIsInstance(t, int)
        self.assertGreater(t, 0)
        self.assertEqual(self.direct.exists(lock_key("job")), 1, "not taken in the backend")
        self.assertEqual(int(self.direct.get(hwm_key("job"))), t, "no fence on acquire")

        st, doc = self.req(fg, "GET", "/v1/locks")
        self.assertEqual(st, 200)
        self.assertEqual(list(doc), ["locks"])
        self.assertEqual(len(doc["locks"]), 1, doc)
        entry = doc["locks"][0]
        self.assertEqual(set(entry), {"name", "token", "ttl_ms", "remaining_ms", "state"})
        self.assertEqual((entry["name"], entry["token"], entry["ttl_ms"], entry["state"]),
                         ("job", t, 800, "held"))
        self.assertTrue(0 < entry["remaining_ms"] <= 800, entry)

        # A second HTTP client of the same sidecar: 409; a RESP client: LOCKED.
        self.assert_error(self.req(fg, "POST", "/v1/locks/job", {"wait_ms": 0}), 409, "locked")
        c = self.raw(fg.resp_port)
        r = c.call("FENCE.ACQUIRE", "job", "WAIT", 0)
        self.assertTrue(isinstance(r, Err) and r.startswith("LOCKED"), r)
        t0 = time.monotonic()
        self.assert_error(self.req(fg, "POST", "/v1/locks/job", {"wait_ms": 300}), 409, "locked")
        self.assertGreaterEqual(time.monotonic() - t0, 0.25, "did not wait")

        st, doc = self.req(fg, "DELETE", "/v1/locks/job")
        self.assertEqual(st, 200, doc)
        self.assertEqual(self.direct.exists(lock_key("job")), 0, "not released in the backend")
        self.assert_error(self.req(fg, "DELETE", "/v1/locks/job"), 404)
        self.assert_error(self.req(fg, "DELETE", "/v1/locks/never-taken"), 404)
        self.assertEqual(self.req(fg, "GET", "/v1/locks"), (200, {"locks": []}))

        st, doc = self.req(fg, "POST", "/v1/locks/job", {"ttl_ms": 1500, "wait_ms": 0})
        self.assertEqual(st, 200, doc)
        self.assertGreater(doc["token"], t)
        self.assertEqual(doc["ttl_ms"], 1500)
        pttl = self.direct.pttl(lock_key("job"))
        self.assertTrue(800 < pttl <= 1500, "lease PTTL %d for ttl_ms 1500" % pttl)

    def test_bad_requests_are_400(self):
        fg = self.fg
        for body in ("{", "not json", "[1]", '{"ttl_ms": -5}', '{"wait_ms": -1}',
                     '{"ttl_ms": "10"}', '{"ttl_ms": 1.5}', '{"foo": 1}',
                     '{"ttl_ms": 100, "extra": true}'):
            got = self.req(fg, "POST", "/v1/locks/bad", body)
            self.assert_error(got, 400)
            self.assertEqual(got[1]["error"], "bad_request", (body, got))
        self.assertEqual(self.direct.exists(lock_key("bad")), 0, "a bad request took the lock")
        self.assertEqual(self.req(fg, "GET", "/v1/locks"), (200, {"locks": []}))

    def test_a_refusal_names_the_lock_once(self):
        """The message of a refused acquisition names the lock once: the lock client's own
        messages already begin with "lock NAME", and the API put "lock NAME: " before them
        ("lock busy-one: lock busy-one is held by another owner ...")."""
        fg = self.fg
        c = self.raw(fg.resp_port)
        self.assertIsInstance(c.call("FENCE.ACQUIRE", "busy-one", "TTL", 5000), int)
        for body, status, code in (({"wait_ms": 0}, 409, "locked"),
                                   ({"wait_ms": 100}, 409, "locked"),
                                   ({"ttl_ms": 100}, 400, "bad_request")):
            got = self.req(fg, "POST", "/v1/locks/busy-one", body)
            self.assert_error(got, status, code)
            msg = got[1]["message"]
            self.assertEqual(msg.count("busy-one"), 1, (body, msg))
            self.assertTrue(msg.startswith("lock busy-one"), (body, msg))

    def test_a_failed_fence_on_acquire_names_the_lock_once(self):
        """The store (not the lock backend) is down: 503, and the message, "fence on acquire of
        lock L (token T) failed: store ...", is not prefixed with "lock L: " again."""
        backend = self.start_redis()
        fg = self.start_fencegate(self.redis, args=["--backend", backend.url])
        self.redis.kill()
        got = self.req(fg, "POST", "/v1/locks/fenced-one", {"wait_ms": 0})
        self.assert_error(got, 503, "unavailable")
        msg = got[1]["message"]
        self.assertTrue(msg.startswith("fence on acquire of lock fenced-one "), msg)
        self.assertEqual(msg.count("fenced-one"), 1, msg)

    def test_a_ttl_out_of_range_is_refused_with_the_range_the_backend_takes(self):
        # One range and one message, as FENCE.ACQUIRE's: ttl_ms 1..499 passed the endpoint's
        # check ("1..3600000") and was refused by the lock library with another text ("lock t:
        # ttl_ms 100 out of range (500..3600000, or 0 for the session's lease)", where 0 is
        # refused), which fencectl --ttl 100 printed, while ttl_ms 0 was refused as below 1.
        for ttl in (0, 1, 499, 3600001):
            got = self.req(self.fg, "POST", "/v1/locks/t", {"ttl_ms": ttl})
            self.assert_error(got, 400, "bad_request")
            self.assertEqual(got[1]["message"], "lock t: ttl_ms %d is out of range: expected "
                             "milliseconds in 500..3600000" % ttl)
        self.assertEqual(self.req(self.fg, "POST", "/v1/locks/t", {"ttl_ms": 500})[0], 200)

    def test_a_release_claims_one_token_in_canonical_decimal(self):
        """DELETE with Fencing-Token: a second Fencing-Token field, or a token that is not
        plain decimal (leading zero, sign, whitespace inside), is a 400 and releases nothing;
        before, the first of two fields won and 01 passed for 1."""
        fg = self.fg
        st, doc = self.req(fg, "POST", "/v1/locks/tok", {"ttl_ms": 3000})
        self.assertEqual(st, 200, doc)
        t = doc["token"]
        for tokens in ([str(t), str(t + 1)], [str(t + 1), str(t)], [str(t), str(t)],
                       ["0" + str(t)], ["+%d" % t], ["%d\t%d" % (t, t)], ["%d %d" % (t, t)],
                       [""]):
            c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            c.putrequest("DELETE", "/v1/locks/tok")
            for v in tokens:
                c.putheader("Fencing-Token", v)
            c.endheaders()
            r = c.getresponse()
            doc = json.loads(r.read())
            c.close()
            self.assertEqual((r.status, doc["error"]), (400, "bad_request"), (tokens, doc))
            self.assertIn("Fencing-Token", doc["message"], tokens)
            self.assertEqual(self.direct.exists(lock_key("tok")), 1, "released by %r" % tokens)
        for fmt in ("%d\t", " %d "):  # optional whitespace around a field value is fine
            c = http.client.HTTPConnection("127.0.0.1", fg.http_port, timeout=10)
            c.request("DELETE", "/v1/locks/tok", headers={"Fencing-Token": fmt % t})
            r = c.getresponse()
            doc = json.loads(r.read())
            c.close()
            self.assertEqual((r.status, doc.get("token")), (200, t), (fmt, doc))
            st, doc = self.req(fg, "POST", "/v1/locks/tok", {"ttl_ms": 3000})
            self.assertEqual(st, 200, doc)
            t = doc["token"]

    def test_methods_empty_names_and_allow(self):
        """POST or DELETE /v1/locks/ names no lock: 400 saying so (was 405). HEAD /v1/locks is
        GET without the body (was 405). A 405 says what is allowed in an Allow header."""
        fg = self.fg
        for m in ("POST", "DELETE"):
            got = self.req(fg, m, "/v1/locks/")
            self.assert_error(got, 400, "bad_request")
            self.assertIn("lock name", got[1]["message"])
        st, headers, data = harness.http_request(fg.http_port, "HEAD", "/v1/locks")
        self.assertEqual((st, data), (200, b""))
        self.assertEqual(int(headers["content-length"]),
                         len(harness.http_request(fg.http_port, "GET", "/v1/locks")[2]))
        for m, path, allow in (("PUT", "/v1/locks", "GET, HEAD"),
                               ("POST", "/v1/locks", "GET, HEAD"),
                               ("GET", "/v1/locks/x", "POST, DELETE"),
                               ("PUT", "/v1/locks/x", "POST, DELETE"),
                               ("POST", "/v1/events", "GET"),
                               ("POST", "/healthz", "GET, HEAD")):
            st, headers, data = harness.http_request(fg.http_port, m, path)
            self.assertEqual((st, json.loads(data)["error"]), (405, "method_not_allowed"),
                             (m, path))
            self.assertEqual(headers.get("allow"), allow, (m, path))

    def test_post_waits_and_is_granted_when_resp_holder_releases(self):
        fg = self.fg
        c = self.raw(fg.resp_port)
        t1 = c.call("FENCE.ACQUIRE", "hand")
        self.assertIsInstance(t1, int)
        out = {}

        def post():
            out["got"] = self.req(fg, "POST", "/v1/locks/hand", {"wait_ms": 3000})
            out["at"] = time.monotonic()
        th = threading.Thread(target=post, daemon=True)
        th.start()
        time.sleep(0.4)
        self.assertNotIn("got", out, "granted while held: %r" % (out.get("got"),))
        released = time.monotonic()
        self.assertEqual(c.call("FENCE.RELEASE", "hand"), 1)
        th.join(6)
        self.assertFalse(th.is_alive(), "POST still waiting")
        st, doc = out["got"]
        self.assertEqual(st, 200, doc)
        self.assertGreater(doc["token"], t1)
        self.assertLess(out["at"] - released, 1.0, "hand-over took too long")

    def test_lock_wait_histogram_counts_http_acquisitions(self):
        """fencegate_lock_wait_seconds observes an HTTP acquisition from its request to its
        answer, as it does FENCE.ACQUIRE's: one that waited 1 s for a RESP holder adds one
        observation of about 1 s (before, HTTP acquisitions were not counted at all)."""
        fg = self.fg
        c = self.raw(fg.resp_port)
        self.assertIsInstance(c.call("FENCE.ACQUIRE", "waited"), int)
        m0 = fg.metrics()
        threading.Timer(1.0, lambda: c.call("FENCE.RELEASE", "waited")).start()
        st, doc = self.req(fg, "POST", "/v1/locks/waited", {"wait_ms": 5000})
        self.assertEqual(st, 200, doc)
        m = fg.metrics()
        count = "fencegate_lock_wait_seconds_count"
        total = "fencegate_lock_wait_seconds_sum"
        self.assertEqual(m.get(count, 0) - m0.get(count, 0), 1)
        self.assertGreaterEqual(m.get(total, 0) - m0.get(total, 0), 0.9)
        self.assertEqual(m['fencegate_lock_wait_seconds_bucket{le="0.8192"}'] -
                         m0['fencegate_lock_wait_seconds_bucket{le="0.8192"}'], 0)

    def test_http_lock_is_renewed_while_the_sidecar_runs(self):
        fg = self.fg
        st, doc = self.req(fg, "POST", "/v1/locks/renewed", {})
        self.assertEqual(st, 200, doc)
        deadline = time.monotonic() + 2.6  # > 3 session TTLs
        while time.monotonic() < deadline:
            self.assertEqual(self.direct.exists(lock_key("renewed")), 1, "the lease lapsed")
            time.sleep(0.05)
        st, doc2 = self.req(fg, "GET", "/v1/locks")
        self.assertEqual([(e["name"], e["token"], e["state"]) for e in doc2["locks"]],
                         [("renewed", doc["token"], "held")])

    def test_metrics_move(self):
        fg = self.fg
        m0 = fg.metrics()
        self.assertEqual(self.req(fg, "POST", "/v1/locks/m", {})[0], 200)
        self.assertEqual(self.req(fg, "POST", "/v1/locks/m", {"wait_ms": 0})[0], 409)
        time.sleep(1.0)  # renewals of an 800 ms lease
        self.assertEqual(self.req(fg, "DELETE", "/v1/locks/m")[0], 200)
        m = fg.metrics()

        def delta(name):
            return m.get(name, 0.0) - m0.get(name, 0.0)
        self.assertEqual(delta("fencegate_locks_acquired_total"), 1)
        self.assertEqual(delta("fencegate_locks_busy_total"), 1)
        self.assertEqual(delta("fencegate_locks_released_total"), 1)
        self.assertGreaterEqual(delta("fencegate_lock_renewals_total"), 1)


class HttpSession(HttpCase):

    def test_sigterm_releases_http_locks(self):
        fg = self.start_fencegate(self.redis)
        for n in ("a", "b"):
            st, doc = self.req(fg, "POST", "/v1/locks/" + n, {})
            self.assertEqual(st, 200, doc)
        self.assertEqual(self.direct.exists(lock_key("a"), lock_key("b")), 2)
        fg.stop(expect_rc=0)
        self.assertEqual(self.direct.exists(lock_key("a"), lock_key("b")), 0,
                         "the sidecar exited and left its HTTP locks held")
        # Another sidecar takes them at once.
        fg2 = self.start_fencegate(self.redis)
        st, doc = self.req(fg2, "POST", "/v1/locks/a", {"wait_ms": 0})
        self.assertEqual(st, 200, doc)

    def test_sigterm_releases_every_lock_within_the_grace_period(self):
        """SIGTERM: HTTP and RESP locks are given back, a connection stuck in BLPOP does not hold
        the exit past --shutdown-grace-ms, and the process exits 0."""
        fg = self.start_fencegate(self.redis, args=["--shutdown-grace-ms", "1500"])
        st, doc = self.req(fg, "POST", "/v1/locks/h", {})
        self.assertEqual(st, 200, doc)
        holder = self.raw(fg.resp_port)
        self.assertIsInstance(holder.call("FENCE.ACQUIRE", "r"), int)
        stuck = self.raw(fg.resp_port)
        stuck.send(b"*3\r\n$5\r\nBLPOP\r\n$5\r\nnever\r\n$1\r\n0\r\n")
        time.sleep(0.2)
        self.assertEqual(self.direct.exists(lock_key("h"), lock_key("r")), 2)
        t0 = time.monotonic()
        fg.stop(expect_rc=0, timeout=10)
        took = time.monotonic() - t0
        self.assertLess(took, 1.5 + 1.5, "exit took %.2f s with a 1.5 s grace period" % took)
        self.assertEqual(self.direct.exists(lock_key("h"), lock_key("r")), 0,
                         "locks still held in the backend after the sidecar exited")

    def test_backend_down_is_503(self):
        fg = self.start_fencegate(self.redis)
        self.redis.kill()
        t0 = time.monotonic()
        self.assert_error(self.req(fg, "POST", "/v1/locks/down", {"wait_ms": 0}), 503,
                          "unavailable")
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertTrue(fg.alive())
        self.redis.start()

        def ok():
            return self.req(fg, "POST", "/v1/locks/down", {"wait_ms": 0})[0] == 200
        harness.wait_until(ok, 10, 0.2, "POST to succeed once Redis is back")


class Fencectl(HttpCase):

    def setUp(self):
        super().setUp()
        if not os.access(harness.FENCECTL_BIN, os.X_OK):
            self.fail("fencectl not found at %s" % harness.FENCECTL_BIN)
        self.fg = self.start_fencegate(self.redis)
        self.where = "127.0.0.1:%d" % self.fg.http_port

    def fencectl(self, *args, timeout=15):
        return subprocess.run([harness.FENCECTL_BIN, "--http", self.where] + list(args),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              env=harness.clean_env())

    def fencectl_running(self, ttl_ms):
        """fencectl holding lock "job" (lease ttl_ms) around a 20 s command that has started."""
        ready = self.write_file("ready", "")
        os.unlink(ready)
        p = subprocess.Popen([harness.FENCECTL_BIN, "--http", self.where, "lock", "job", "--ttl",
                              ttl_ms, "--", "sh", "-c", ': > "$0"; sleep 20', ready],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=harness.clean_env(),
                             start_new_session=True)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.communicate(timeout=5)))
        harness.wait_until(lambda: os.path.exists(ready), 10, 0.02, "the command to start")
        return p

    def test_runs_command_with_token_and_passes_exit_status(self):
        p = self.fencectl("lock", "job", "--ttl", "2000", "--", "sh", "-c", "echo $FENCE_TOKEN")
        self.assertEqual(p.returncode, 0, p.stderr)
        tok = p.stdout.decode().strip()
        self.assertRegex(tok, r"^[1-9][0-9]*$", p.stdout)
        self.assertEqual(int(self.direct.get(hwm_key("job"))), int(tok))
        self.assertEqual(self.direct.exists(lock_key("job")), 0, "fencectl left the lock held")
        self.assertEqual(self.req(self.fg, "GET", "/v1/locks"), (200, {"locks": []}))

        p = self.fencectl("lock", "job", "--", "sh", "-c", "exit 7")
        self.assertEqual(p.returncode, 7, p.stderr)
        p = self.fencectl("lock", "job", "--", "sh", "-c", "echo $FENCE_TOKEN")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreater(int(p.stdout.decode().strip()), int(tok))

    def test_lock_deleted_behind_the_sidecar_stops_the_command(self):
        # The sidecar's renewal finds the key gone, marks the lock lost and says so on its event
        # stream; fencectl stops the command and exits 3 without releasing.
        p = self.fencectl_running("3000")
        self.assertEqual(self.direct.delete(lock_key("job")), 1)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=15)
        self.assertEqual(p.returncode, 3, err)
        self.assertLess(time.monotonic() - t0, 2.5)  # the renewal every 1 s finds it
        self.assertIn(b"reports lock job", err)
        self.assertIn(b"as lost", err)

    def test_lock_released_by_another_client_stops_the_command_at_once(self):
        # Another client of the sidecar releases the lock by name (no Fencing-Token). With a
        # 30 s lease fencectl's own check comes every 10 s; the sidecar's event stream makes it
        # look at once.
        p = self.fencectl_running("30000")
        time.sleep(0.2)  # the stream is open by now
        self.assertEqual(self.req(self.fg, "DELETE", "/v1/locks/job")[0], 200)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=15)
        self.assertEqual(p.returncode, 3, err)
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertIn(b"the sidecar no longer lists lock job", err)

    def test_second_fencectl_with_wait0_exits_1(self):
        err_path = self.write_file("fencectl-first.err", "")
        with open(err_path, "wb") as err:
            first = subprocess.Popen([harness.FENCECTL_BIN, "--http", self.where, "lock", "job",
                                      "--", "sleep", "3"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=err,
                                     env=harness.clean_env())
        self.addCleanup(lambda: first.poll() is None and (first.kill(), first.wait(5)))

        def holding():
            if first.poll() is not None:
                with open(err_path, "rb") as f:
                    raise AssertionError("the first fencectl exited with %s before holding the "
                                         "lock: %r" % (first.returncode, f.read()[-500:]))
            return self.direct.exists(lock_key("job")) == 1
        deadline = time.monotonic() + 5
        while not holding():
            self.assertLess(time.monotonic(), deadline, "the first fencectl never held the lock")
            time.sleep(0.02)
        p = self.fencectl("lock", "job", "--wait", "0", "--", "sh", "-c", "echo ran")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn(b"ran", p.stdout, "the command ran without the lock")
        self.assertEqual(first.wait(10), 0)
        self.assertEqual(self.direct.exists(lock_key("job")), 0)


if __name__ == "__main__":
    unittest.main()
