"""test_fencectl.py — fencectl against a fake sidecar: the HTTP exchange, the command's
environment and exit status, signal forwarding, and the lost-lock and unreachable paths.

The fake sidecar is a small http.server on a free 127.0.0.1 port that answers with the JSON
shapes of the sidecar's HTTP lock API (DESIGN.md §3), so these tests need no Redis or etcd.
"""

import http.server
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

from harness import FENCEGATE_BIN, clean_env, free_port, wait_until

FENCECTL = os.path.join(os.path.dirname(FENCEGATE_BIN), "fencectl")
RUN_TIMEOUT = 20.0  # seconds any fencectl run may take before the test fails


class FakeSidecar:
    """The sidecar's lock API, in memory. `post_answer` (status, body) overrides the answer to
    POST; `locks` maps a name to its entry in GET /v1/locks; every request is recorded."""

    def __init__(self, host="127.0.0.1"):
        self.host = host
        self.mu = threading.Lock()
        self.requests = []  # dicts: method, path, name, headers, body, t
        self.locks = {}
        self.next_token = 41
        self.reply_ttl = 600
        self.post_answer = None
        self.delete_answer = None
        self.remaining = None  # remaining_ms that GET /v1/locks reports (default: reply_ttl)
        self.events = True  # serve GET /v1/events?lock=NAME
        self.events_sent = []
        self.cv = threading.Condition(self.mu)
        self.raw_answer = None  # bytes sent instead of an HTTP reply
        self.chunked = False
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _record(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                name = None
                if self.path.startswith("/v1/locks/"):
                    name = urllib.parse.unquote(self.path[len("/v1/locks/"):], errors="strict")
                req = {"method": self.command, "path": self.path, "name": name,
                       "headers": dict(self.headers), "body": body, "t": time.time()}
                with fake.mu:
                    fake.requests.append(req)
                return req

            def _send(self, status, obj):
                if fake.raw_answer is not None:
                    self.wfile.write(fake.raw_answer)
                    self.close_connection = True
                    return
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if fake.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(data), 7):  # many small chunks
                        part = data[i:i + 7]
                        self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\nX-Trailer: 1\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def _stream(self, req):
                # An event stream as the sidecar's (chunked): each event fake.event() adds is
                # sent to every open stream; the stream ends when the fake stops.
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                sent = 0
                while True:
                    with fake.cv:
                        fake.cv.wait_for(lambda: fake.stopped or len(fake.events_sent) > sent,
                                         timeout=0.1)
                        if fake.stopped:
                            break
                        todo = fake.events_sent[sent:]
                        sent = len(fake.events_sent)
                    for text in todo:
                        data = text.encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                self.close_connection = True

            def do_POST(self):
                req = self._record()
                with fake.mu:
                    if fake.post_answer is not None:
                        status, obj = fake.post_answer
                    else:
                        token = fake.next_token
                        fake.next_token += 1
                        fake.locks[req["name"]] = {"name": req["name"], "token": token,
                                                   "ttl_ms": fake.reply_ttl,
                                                   "remaining_ms": fake.reply_ttl,
                                                   "state": "held"}
                        status, obj = 200, {"name": req["name"], "token": token,
                                            "ttl_ms": fake.reply_ttl}
                self._send(status, obj)

            def do_GET(self):
                req = self._record()
                if self.path.startswith("/v1/events?lock=") and fake.events:
                    self._stream(req)
                    return
                if self.path != "/v1/locks":
                    self._send(404, {"error": "not_found", "message": self.path})
                    return
                with fake.mu:
                    locks = [dict(v) for v in fake.locks.values()]
                    if fake.remaining is not None:
                        for v in locks:
                            v["remaining_ms"] = fake.remaining
                self._send(200, {"locks": locks})

            def do_DELETE(self):
                req = self._record()
                if fake.delete_answer is not None:
                    self._send(*fake.delete_answer)
                    return
                claim = req["headers"].get("Fencing-Token")
                with fake.mu:
                    held = fake.locks.get(req["name"])
                    if held is not None and (claim is None or claim == str(held["token"])):
                        del fake.locks[req["name"]]
                if held is None:
                    self._send(404, {"error": "not_held", "message": "not held"})
                elif claim is not None and claim != str(held["token"]):
                    self._send(409, {"error": "token_mismatch", "token": int(claim),
                                     "held": held["token"], "message": "token mismatch"})
                else:
                    self._send(200, {"released": True})

        class Server(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self.server = Server((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.stopped = False

    @property
    def addr(self):
        return ("[%s]:%d" if ":" in self.host else "%s:%d") % (self.host, self.port)

    def event(self, kind, **data):
        """Sends one event to the open event streams."""
        with self.cv:
            self.events_sent.append("event: %s\ndata: %s\n\n" % (kind, json.dumps(data)))
            self.cv.notify_all()

    def streams(self):
        with self.mu:
            return [r for r in self.requests if r["path"].startswith("/v1/events?")]

    def stop(self):
        if not self.stopped:
            with self.cv:
                self.stopped = True
                self.cv.notify_all()
            self.server.shutdown()
            self.server.server_close()

    def of(self, method):
        with self.mu:
            return [r for r in self.requests if r["method"] == method]

    def set_lock(self, name, **kw):
        with self.mu:
            self.locks[name].update(kw)


def running(pid):
    """True while pid exists and is not a zombie (an orphan's zombie may wait long for init)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pid(pidfile):
    with open(pidfile) as f:
        return int(f.read())


def running_kill(pidfile):
    """SIGKILLs the pid written in pidfile, if any (test cleanup)."""
    try:
        os.kill(read_pid(pidfile), signal.SIGKILL)
    except (OSError, ValueError):
        pass


class FencectlTest(unittest.TestCase):

    def setUp(self):
        if not os.access(FENCECTL, os.X_OK):
            self.fail("fencectl not found at %s (set FENCEGATE_BIN to build/bin/fencegate)"
                      % FENCECTL)
        self.fake = FakeSidecar()
        self.addCleanup(self.fake.stop)
        self.tmp = tempfile.TemporaryDirectory(prefix="fg-fencectl-")
        self.addCleanup(self.tmp.cleanup)

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def env(self, extra=None):
        return clean_env(extra)

    def run_ctl(self, args, http=True, env=None, timeout=RUN_TIMEOUT):
        argv = [FENCECTL] + (["--http", self.fake.addr] if http else []) + list(args)
        # A session of its own: no controlling terminal, as under cron or in a Kubernetes Job,
        # also when the tests run from a terminal.
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout, env=env or self.env(), cwd=self.tmp.name,
                           start_new_session=True)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def start_ctl(self, args):
        argv = [FENCECTL, "--http", self.fake.addr] + list(args)
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=self.env(), cwd=self.tmp.name,
                             start_new_session=True)

        def reap():
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)
        self.addCleanup(reap)
        return p

    def finish(self, p, timeout=RUN_TIMEOUT):
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out.decode(), err.decode()

    # ---- the command line ---------------------------------------------------------------

    def test_help_documents_behaviour_and_exit_codes(self):
        rc, out, err = self.run_ctl(["--help"], http=False)
        self.assertEqual(rc, 0, err)
        for phrase in ["lock NAME [--ttl MS] [--wait MS] -- COMMAND", "FENCE_TOKEN", "FENCE_LOCK",
                       "FENCEGATE_HTTP", "127.0.0.1:8380", "SIGTERM", "SIGKILL",
                       "sidecar's own", "released", "128+N", "127", "409", "503", "400",
                       "status 3"]:
            self.assertIn(phrase, out)
        for code in ("1 ", "2 ", "3 ", "4 ", "5 "):
            self.assertIn("\n  " + code, out)
        rc, out, _ = self.run_ctl(["--version"], http=False)
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^fencectl \S+\n$")
        self.assertEqual(self.fake.requests, [])

    def test_usage_errors_exit_2_without_asking_for_the_lock(self):
        cases = [
            [],
            ["lock"],
            ["lock", "L"],
            ["lock", "L", "--"],
            ["lock", "L", "true"],
            ["lock", "L", "--ttl", "abc", "--", "true"],
            ["lock", "L", "--ttl", "-5", "--", "true"],
            ["lock", "L", "--wait", "1.5", "--", "true"],
            ["lock", "L", "--wait", "--", "true"],
            ["lock", "L", "--bogus", "--", "true"],
            ["unlock", "L", "--", "true"],
            ["--http", "nohostport", "lock", "L", "--", "true"],
            ["--http", "127.0.0.1:99999", "lock", "L", "--", "true"],
        ]
        for args in cases:
            rc, out, err = self.run_ctl(args)
            self.assertEqual(rc, 2, "%r: %s" % (args, err))
            self.assertIn("usage: fencectl", err, args)
        rc, _, err = self.run_ctl(["lock", "L", "--", "true"], http=False,
                                  env=self.env({"FENCEGATE_HTTP": "bad"}))
        self.assertEqual(rc, 2, err)
        self.assertIn("FENCEGATE_HTTP", err)
        self.assertEqual(self.fake.requests, [])

    def test_usage_errors_name_what_was_wrong(self):
        # --http's value is read where it is given, and an option where NAME goes is a missing
        # NAME: these said "unknown subcommand or option 'L'" (--http had taken "lock") and
        # "unexpected '500'" (NAME had taken "--ttl").
        for args, want in [
                (["--http", "lock", "L", "--", "true"], "fencectl: --http 'lock' is not HOST:PORT"),
                (["--http", "127.0.0.1:1", "lock", "L", "--http=x", "--", "true"],
                 "fencectl: --http 'x' is not HOST:PORT"),
                (["lock", "--ttl", "500", "--", "true"],
                 "fencectl: lock needs a NAME before its options (got '--ttl')"),
                (["lock", "--wait=0", "--", "true"],
                 "fencectl: lock needs a NAME before its options (got '--wait=0')")]:
            rc, _, err = self.run_ctl(args, http=False)
            self.assertEqual(rc, 2, "%r: %s" % (args, err))
            self.assertIn(want + "\n", err, args)
        self.assertEqual(self.fake.requests, [])

    # ---- the request --------------------------------------------------------------------

    def test_ttl_and_wait_are_sent_in_the_body(self):
        for args, want in [
            (["--ttl", "1500", "--wait", "250"], {"ttl_ms": 1500, "wait_ms": 250}),
            (["--wait=0"], {"wait_ms": 0}),
            (["--ttl", "7000"], {"ttl_ms": 7000}),
            ([], {}),
        ]:
            with self.fake.mu:
                self.fake.requests.clear()
            rc, _, err = self.run_ctl(["lock", "job"] + args + ["--", "true"])
            self.assertEqual(rc, 0, err)
            post = self.fake.of("POST")
            self.assertEqual(len(post), 1)
            self.assertEqual(post[0]["path"], "/v1/locks/job")
            self.assertEqual(json.loads(post[0]["body"]), want)
            self.assertEqual(post[0]["headers"].get("Content-Type"), "application/json")

    def test_name_is_percent_encoded(self):
        name = "a b/c:d%e?f#\u00e9"
        out = self.path("env")
        rc, _, err = self.run_ctl(["lock", name, "--", "sh", "-c",
                                   'printf %s "$FENCE_LOCK" > "$0"; sleep 0.8', out])
        self.assertEqual(rc, 0, err)
        post = self.fake.of("POST")[0]
        self.assertEqual(post["path"], "/v1/locks/a%20b%2Fc%3Ad%25e%3Ff%23%C3%A9")
        self.assertEqual(post["name"], name)
        with open(out, encoding="utf-8") as f:
            self.assertEqual(f.read(), name)
        # The lock was found by its decoded name on every check (none reported it missing) and
        # released under the same encoded path.
        self.assertGreaterEqual(len(self.fake.of("GET")), 2)
        self.assertNotIn("lost", err)
        self.assertEqual([r["path"] for r in self.fake.of("DELETE")], [post["path"]])

    # ---- the command --------------------------------------------------------------------

    def test_exit_status_is_passed_through_and_lock_released(self):
        for script, want in [("exit 0", 0), ("exit 7", 7), ("exit 255", 255),
                             ("kill -KILL $$", 128 + signal.SIGKILL),
                             ("kill -TERM $$", 128 + signal.SIGTERM)]:
            with self.fake.mu:
                self.fake.requests.clear()
            rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c", script])
            self.assertEqual(rc, want, "%s: %s" % (script, err))
            self.assertEqual(len(self.fake.of("DELETE")), 1, script)
            self.assertEqual(self.fake.locks, {})

    def test_token_and_name_in_the_command_environment(self):
        out = self.path("env")
        rc, _, err = self.run_ctl(["lock", "wallet:7", "--", "sh", "-c",
                                   'printf "%s|%s" "$FENCE_TOKEN" "$FENCE_LOCK" > "$0"', out])
        self.assertEqual(rc, 0, err)
        with open(out) as f:
            self.assertEqual(f.read(), "41|wallet:7")

    def test_delete_is_sent_after_the_command_ends(self):
        marker = self.path("done")
        rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c",
                                   'sleep 0.3; : > "$0"', marker])
        self.assertEqual(rc, 0, err)
        deletes = self.fake.of("DELETE")
        self.assertEqual(len(deletes), 1)
        self.assertGreaterEqual(deletes[0]["t"], os.stat(marker).st_mtime - 0.01)
        self.assertEqual(deletes[0]["path"], "/v1/locks/job")
        self.assertEqual(deletes[0]["headers"].get("Fencing-Token"), "41")
        # Only one POST, and it came before the command ran.
        self.assertLess(self.fake.of("POST")[0]["t"], os.stat(marker).st_mtime)

    def _lose_before_release(self, lose):
        # ttl 30000: no check happens before the command ends, so when the lock is lost
        # meanwhile, only the DELETE notices.
        self.fake.reply_ttl = 30000

        def later():
            wait_until(lambda: self.fake.locks, 5, what="the lock to be taken")
            with self.fake.mu:
                lose()
        t = threading.Thread(target=later)
        t.start()
        rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c", "sleep 0.5; exit 0"])
        t.join()
        self.assertEqual(len(self.fake.of("DELETE")), 1)
        return rc, err

    def test_lock_found_lost_at_release_exits_3(self):
        # A cron job whose command succeeded must not report success when the lock was gone
        # by its end: part of its work may have run without the lock.
        rc, err = self._lose_before_release(self.fake.locks.clear)
        self.assertEqual(rc, 3, err)
        self.assertIn("lock job (token 41) was lost before it was released (the sidecar answered "
                      "HTTP 404: not held)", err)
        self.assertIn("sh exited with status 0; exiting 3 (lock lost)", err)

    def test_lock_taken_again_under_another_token_at_release_exits_3(self):
        # Lost, then taken by another client of the same sidecar: the DELETE carries our token,
        # the sidecar refuses it (409) and the other holder keeps the lock.
        rc, err = self._lose_before_release(lambda: self.fake.locks["job"].update(token=99))
        self.assertEqual(rc, 3, err)
        self.assertIn("HTTP 409: held under another token", err)
        self.assertEqual(self.fake.locks["job"]["token"], 99)

    def test_release_failure_is_only_a_warning(self):
        # The sidecar answers 503 (its backend was not reached): the lock was held until then.
        self.fake.delete_answer = (503, {"error": "unavailable", "message": "redis is down"})
        rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c", "exit 6"])
        self.assertEqual(rc, 6, err)
        self.assertIn("warning: releasing lock job (token 41): the sidecar answered HTTP 503", err)
        self.assertEqual(len(self.fake.of("DELETE")), 1)

    def test_command_not_executable_is_126(self):
        script = self.path("script.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(script, 0o644)
        for cmd in (script, self.tmp.name):  # a file without x, a directory
            rc, _, err = self.run_ctl(["lock", "job", "--", cmd])
            self.assertEqual(rc, 126, err)
            self.assertIn("cannot run %s: Permission denied" % cmd, err)

    def test_tokens_beyond_2_53_are_exact(self):
        # A double holds 2^53 + 1 as 2^53: the token must go through as the sidecar's digits,
        # to the command, the lock checks and the release.
        for token in (2**53 + 1, 2**63 - 1):
            with self.fake.mu:
                self.fake.requests.clear()
                self.fake.next_token = token
            out = self.path("token")
            rc, _, err = self.run_ctl(["lock", "big", "--", "sh", "-c",
                                       'printf %s "$FENCE_TOKEN" > "$0"; sleep 0.5', out])
            self.assertEqual(rc, 0, err)
            self.assertNotIn("lost", err)
            self.assertGreaterEqual(len(self.fake.of("GET")), 1)
            with open(out) as f:
                self.assertEqual(f.read(), str(token))
            self.assertEqual(self.fake.of("DELETE")[0]["headers"].get("Fencing-Token"),
                             str(token))

    def test_ipv6_address(self):
        try:
            fake6 = FakeSidecar("::1")
        except OSError as e:
            self.skipTest("no IPv6 loopback: %s" % e)
        self.addCleanup(fake6.stop)
        argv = [FENCECTL, "--http", fake6.addr, "lock", "v6", "--", "true"]
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=RUN_TIMEOUT, env=self.env(), start_new_session=True)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        self.assertEqual(fake6.of("POST")[0]["headers"].get("Host"), fake6.addr)
        self.assertEqual(len(fake6.of("DELETE")), 1)

    def test_command_not_found_is_127(self):
        rc, _, err = self.run_ctl(["lock", "job", "--", "/nonexistent/fencectl-no-such-cmd"])
        self.assertEqual(rc, 127, err)
        self.assertIn("command not found", err)
        self.assertEqual(len(self.fake.of("DELETE")), 1)
        rc, _, err = self.run_ctl(["lock", "job", "--", "fencectl-no-such-command-xyz"])
        self.assertEqual(rc, 127, err)

    def test_signals_are_forwarded_to_the_command(self):
        for sig, code in [(signal.SIGTERM, 9), (signal.SIGINT, 10)]:
            ready = self.path("ready-%d" % sig)
            got = self.path("got-%d" % sig)
            script = ('trap \'echo got > "$1"; exit %d\' TERM INT; : > "$0"; '
                      'i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 99'
                      % code)
            p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, ready, got])
            wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
            p.send_signal(sig)
            rc, _, err = self.finish(p)
            self.assertEqual(rc, code, err)
            self.assertTrue(os.path.exists(got))
            self.assertEqual(self.fake.locks, {})  # released afterwards

    def _grandchild_script(self):
        """A shell command that starts a long child, as scripts do, and waits for it. Returns
        (script, pid file, ready file); the child's pid is killed at cleanup."""
        pidfile, ready = self.path("grandchild"), self.path("ready")
        # The child's output goes elsewhere, so that fencectl's pipes close when fencectl ends.
        script = ('sleep 60 >/dev/null 2>&1 & echo $! > "$0"; : > "$1"; wait $!; '
                  'echo finished')
        self.addCleanup(running_kill, pidfile)
        return script, pidfile, ready

    def test_sigterm_reaches_what_the_command_started(self):
        # Kubernetes stops a Job's pod with SIGTERM to fencectl. The command is a shell script;
        # its children must get the signal too, or they go on working after fencectl has
        # released the lock.
        script, pidfile, ready = self._grandchild_script()
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, pidfile, ready])
        wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
        grandchild = read_pid(pidfile)
        p.send_signal(signal.SIGTERM)
        rc, out, err = self.finish(p)
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertEqual(len(self.fake.of("DELETE")), 1)
        wait_until(lambda: not running(grandchild), 2, what="the command's child to end")

    def test_fencectl_killed_stops_the_command_and_releases_the_lock(self):
        # SIGKILL (the OOM killer, kill -9) leaves fencectl no clean-up. Without its guardian the
        # command went on unwatched, and the sidecar renewed the lock for as long as it ran:
        # every other holder of the name waited for ever.
        script, pidfile, ready = self._grandchild_script()
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, pidfile, ready])
        wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
        grandchild = read_pid(pidfile)
        self.assertEqual(self.fake.of("DELETE"), [])
        p.kill()
        rc, _, err = self.finish(p)  # the pipes close when the guardian is done
        self.assertEqual(rc, -signal.SIGKILL)
        self.assertFalse(running(grandchild), "the command's child outlived fencectl")
        deletes = self.fake.of("DELETE")
        self.assertEqual(len(deletes), 1, err)
        self.assertEqual(deletes[0]["path"], "/v1/locks/job")
        self.assertEqual(deletes[0]["headers"].get("Fencing-Token"), "41")
        self.assertEqual(self.fake.locks, {})
        self.assertIn("fencectl ended without releasing lock job (token 41); stopping sh", err)

    def test_lost_lock_stops_what_the_command_started(self):
        script, pidfile, ready = self._grandchild_script()
        self.fake.reply_ttl = 600
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, pidfile, ready])
        wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
        grandchild = read_pid(pidfile)
        self.fake.set_lock("job", state="lost")
        rc, out, err = self.finish(p)
        self.assertEqual(rc, 3, err)
        self.assertNotIn("finished", out)
        # Signalled before fencectl exits; a signal takes a moment to be acted on.
        wait_until(lambda: not running(grandchild), 1,
                   what="the command's child to end after the lost lock")

    def test_lost_lock_kills_a_straggler_that_ignores_sigterm(self):
        # The command exits on SIGTERM; a child of it ignores SIGTERM. Once the command is gone,
        # what is left of its process group is killed before fencectl exits.
        pidfile, ready = self.path("grandchild"), self.path("ready")
        script = ('sh -c \'trap "" TERM; echo $$ > "$0"; exec sleep 60 >/dev/null 2>&1\' "$0" & '
                  'while [ ! -s "$0" ]; do sleep 0.01; done; : > "$1"; wait')
        self.addCleanup(running_kill, pidfile)
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, pidfile, ready])
        wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
        grandchild = read_pid(pidfile)
        self.fake.set_lock("job", state="lost")
        t0 = time.monotonic()
        rc, out, err = self.finish(p)
        self.assertEqual(rc, 3, err)
        self.assertLess(time.monotonic() - t0, 4.0)  # the command itself exited on SIGTERM
        wait_until(lambda: not running(grandchild), 1,
                   what="a child ignoring SIGTERM to end after the lost lock")

    # ---- answers of the sidecar ---------------------------------------------------------

    def test_locked_is_1(self):
        self.fake.post_answer = (409, {"error": "locked", "message": "held by another holder"})
        rc, _, err = self.run_ctl(["lock", "job", "--wait", "100", "--", "sh", "-c",
                                   ': > "$0"', self.path("ran")])
        self.assertEqual(rc, 1, err)
        self.assertIn("held by someone else", err)
        self.assertIn("held by another holder", err)
        self.assertFalse(os.path.exists(self.path("ran")))
        self.assertEqual(self.fake.of("DELETE"), [])

    def test_backend_unavailable_is_4(self):
        self.fake.post_answer = (503, {"error": "unavailable", "message": "etcd is down"})
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"])
        self.assertEqual(rc, 4, err)
        self.assertIn("etcd is down", err)

    def test_connection_refused_is_4(self):
        port = free_port()  # nothing listens there
        rc, _, err = self.run_ctl(["--http", "127.0.0.1:%d" % port, "lock", "job", "--", "true"],
                                  http=False)
        self.assertEqual(rc, 4, err)
        self.assertIn("Connection refused", err)

    def test_bad_request_is_5(self):
        self.fake.post_answer = (400, {"error": "bad_request",
                                       "message": "ttl_ms: expected a non-negative integer"})
        rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c", ': > "$0"',
                                   self.path("ran")])
        self.assertEqual(rc, 5, err)
        self.assertIn("rejected", err)
        self.assertIn("ttl_ms: expected a non-negative integer", err)
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_unexpected_answers_are_5(self):
        for answer in [(500, {"error": "internal", "message": "boom"}),
                       (200, {"name": "job"}),  # no token
                       (200, {"name": "job", "token": "41"})]:
            self.fake.post_answer = answer
            rc, _, err = self.run_ctl(["lock", "job", "--", "true"])
            self.assertEqual(rc, 5, "%r: %s" % (answer, err))
        self.fake.post_answer = None
        self.fake.raw_answer = b"SSH-2.0-OpenSSH\r\n\r\n"
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"])
        self.assertEqual(rc, 5, err)
        self.assertIn("not HTTP", err)

    def test_env_overrides_default_and_flag_overrides_env(self):
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"], http=False,
                                  env=self.env({"FENCEGATE_HTTP": self.fake.addr}))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.fake.of("POST")), 1)
        refused = "127.0.0.1:%d" % free_port()
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"], http=True,
                                  env=self.env({"FENCEGATE_HTTP": refused}))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.fake.of("POST")), 2)
        # In an injected pod the application containers have FENCEGATE_HTTP_ADDR; FENCEGATE_HTTP
        # wins over it.
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"], http=False,
                                  env=self.env({"FENCEGATE_HTTP_ADDR": self.fake.addr}))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.fake.of("POST")), 3)
        rc, _, err = self.run_ctl(["lock", "job", "--", "true"], http=False,
                                  env=self.env({"FENCEGATE_HTTP": self.fake.addr,
                                                "FENCEGATE_HTTP_ADDR": refused}))
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.fake.of("POST")), 4)

    def test_chunked_replies_are_read(self):
        self.fake.chunked = True
        rc, _, err = self.run_ctl(["lock", "job", "--", "sh", "-c", "sleep 0.7; exit 3"])
        self.assertEqual(rc, 3, err)  # the command's own 3: the lock was never lost
        self.assertNotIn("lost", err)
        self.assertGreaterEqual(len(self.fake.of("GET")), 2)
        self.assertEqual(len(self.fake.of("DELETE")), 1)

    # ---- losing the lock ----------------------------------------------------------------

    def _run_until_lost(self, lose, ignore_term=False, ttl=600, first_check=True):
        """Starts a long command under the lock, calls lose() once it runs, and returns
        (exit code, stderr, seconds from lose() to fencectl's exit, whether the command saw
        SIGTERM)."""
        self.fake.reply_ttl = ttl
        ready, got = self.path("ready"), self.path("got")
        trap = "trap '' TERM" if ignore_term else 'trap \'echo TERM > "$1"; exit 0\' TERM'
        script = (trap + '; : > "$0"; i=0; while [ $i -lt 400 ]; do sleep 0.05; '
                  'i=$((i+1)); done; exit 99')
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", script, ready, got])
        wait_until(lambda: os.path.exists(ready), 10, what="the command to start")
        if first_check:
            wait_until(lambda: any(r["path"] == "/v1/locks" for r in self.fake.of("GET")), 10,
                       what="a first lock check")
        t0 = time.monotonic()
        lose()
        rc, _, err = self.finish(p)
        return rc, err, time.monotonic() - t0, os.path.exists(got)

    def test_lost_state_stops_the_command_and_exits_3(self):
        rc, err, took, termed = self._run_until_lost(
            lambda: self.fake.set_lock("job", state="lost"))
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed, "the command did not get SIGTERM")
        self.assertLess(took, 0.6 + 1.0)  # ttl/3 per check, plus slack
        self.assertIn("fencectl: lock job (token 41) was lost; stopping sh", err)
        # A lost lock is not released: the name may belong to a newer holder by now.
        self.assertEqual(self.fake.of("DELETE"), [])

    def test_lost_event_stops_the_command_at_once(self):
        # ttl 30 s: the periodic check comes every 10 s. The sidecar's event stream says the lock
        # was lost; fencectl checks at once and stops the command within a round trip.
        def lose():
            wait_until(lambda: self.fake.streams(), 5, what="the event stream to open")
            self.fake.set_lock("job", state="lost")
            self.fake.event("lost", name="job", token=41, reason="renewal refused")
        rc, err, took, termed = self._run_until_lost(lose, ttl=30000, first_check=False)
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed)
        self.assertLess(took, 1.0)
        self.assertEqual(self.fake.streams()[0]["path"], "/v1/events?lock=job")
        self.assertIn("reports lock job (token 41) as lost", err)

    def test_events_that_are_not_a_loss_change_nothing(self):
        self.fake.reply_ttl = 30000
        ready = self.path("ready")
        p = self.start_ctl(["lock", "job", "--", "sh", "-c", ': > "$0"; sleep 1.5', ready])
        wait_until(lambda: self.fake.streams(), 10, what="the event stream to open")
        for _ in range(5):
            self.fake.event("acquired", name="other", token=7, ttl_ms=1000)
            time.sleep(0.1)
        rc, _, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("lost", err)
        # Each event made fencectl look (GET /v1/locks), but not more often than every 200 ms.
        checks = [r["t"] for r in self.fake.of("GET") if r["path"] == "/v1/locks"]
        self.assertGreaterEqual(len(checks), 2)
        self.assertTrue(all(b - a >= 0.19 for a, b in zip(checks, checks[1:])), checks)

    def test_sidecar_without_event_stream_is_not_asked_again(self):
        self.fake.events = False  # GET /v1/events answers 404, as a sidecar without it would
        self.fake.reply_ttl = 600
        rc, _, err = self.run_ctl(["lock", "job", "--", "sleep", "1"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(self.fake.streams()), 1)
        self.assertGreaterEqual(len(self.fake.of("GET")), 4)  # checks every 200 ms go on

    def test_missing_lock_counts_as_lost(self):
        def drop():
            with self.fake.mu:
                self.fake.locks.clear()
        rc, err, took, termed = self._run_until_lost(drop)
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed)
        self.assertIn("was lost", err)

    def test_other_token_counts_as_lost(self):
        rc, err, took, termed = self._run_until_lost(
            lambda: self.fake.set_lock("job", token=42))
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed)
        self.assertIn("token 42", err)

    def test_unreachable_sidecar_longer_than_ttl_counts_as_lost(self):
        rc, err, took, termed = self._run_until_lost(self.fake.stop, ttl=900)
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed)
        self.assertGreater(took, 0.9 - 0.35)  # not before the ttl has run out since the last ok
        self.assertLess(took, 0.9 + 1.5)
        self.assertIn("did not confirm lock job before the lease it last reported ran out", err)
        self.assertIn("was lost", err)

    def test_unreachable_sidecar_stops_the_command_when_the_reported_lease_ends(self):
        # The sidecar last said 700 ms of the 3000 ms lease were left (its renewal was due),
        # then froze or died: nothing renews the lease, which ends 700 ms after that check, and
        # another holder may take the lock then. The command must stop by then, not 3 s later.
        self.fake.remaining = 700
        rc, err, took, termed = self._run_until_lost(self.fake.stop, ttl=3000)
        self.assertEqual(rc, 3, err)
        self.assertTrue(termed)
        self.assertLess(took, 0.7 + 0.3)
        self.assertIn("before the lease it last reported ran out", err)

    def test_command_ignoring_sigterm_is_killed_after_5s(self):
        rc, err, took, _ = self._run_until_lost(
            lambda: self.fake.set_lock("job", state="lost"), ignore_term=True)
        self.assertEqual(rc, 3, err)
        self.assertIn("SIGKILL", err)
        self.assertGreater(took, 5.0)
        self.assertLess(took, 5.0 + 2.0)


if __name__ == "__main__":
    unittest.main()
