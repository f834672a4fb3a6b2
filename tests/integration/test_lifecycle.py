"""The process as an operator meets it: command line, configuration sources and their
precedence, SIGTERM draining, the HTTP health and metrics endpoints, and many concurrent
clients (DESIGN.md §3 health endpoints, §5 configuration)."""

import os
import re
import resource
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from harness import FgTestCase, Fencegate, encode, run_fencegate

METRIC_NAMES = [
    "fencegate_connections_accepted_total",
    "fencegate_commands_forwarded_total",
    "fencegate_bytes_from_clients_total",
    "fencegate_bytes_to_clients_total",
    "fencegate_upstream_connect_errors_total",
    "fencegate_connections_open",
    "fencegate_upstream_up",
]


def msum(m, name):
    """Sum of every series of metric `name` (with or without labels); None if absent."""
    vals = [v for k, v in m.items() if k == name or k.startswith(name + "{")]
    return sum(vals) if vals else None


class CommandLine(unittest.TestCase):
    """Runs that end by themselves: no servers needed."""

    def ports(self):
        return ["--resp", "127.0.0.1:%d" % harness.free_port(),
                "--http", "127.0.0.1:%d" % harness.free_port()]

    def test_help(self):
        rc, out, err = run_fencegate(["--help"])
        self.assertEqual(rc, 0, err)
        self.assertIn("--resp", out, "--help must print usage on stdout")
        self.assertIn("--upstream", out)

    def test_version(self):
        rc, out, err = run_fencegate(["--version"])
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, r"\d+\.\d+\.\d+")

    def test_bad_flags_exit_2_naming_the_flag(self):
        cases = [
            (["--no-such-flag"], ["--no-such-flag"]),
            (["--resp"], ["--resp"]),  # missing value
            (["--resp", "127.0.0.1:99999"], ["--resp", "99999"]),
            (["--max-clients", "abc"], ["--max-clients", "abc"]),
            (["--max-pending-bytes", "-5"], ["--max-pending-bytes"]),
            (["--log-level", "loud"], ["--log-level", "loud"]),
            (["--upstream", "http://127.0.0.1:1"], ["--upstream"]),
        ]
        for extra, needles in cases:
            with self.subTest(args=extra):
                # Valid listen addresses come first: a binary that ignored the bad flag would
                # start serving and be killed by run_fencegate's timeout instead of exiting 2.
                rc, out, err = run_fencegate(self.ports() + extra)
                self.assertEqual(rc, 2, "stderr: %s" % err)
                for n in needles:
                    self.assertIn(n, err)

    def test_unknown_environment_variable_exit_2(self):
        rc, _, err = run_fencegate(self.ports(), env={"FENCEGATE_NO_SUCH_THING": "1"})
        self.assertEqual(rc, 2, err)
        self.assertIn("FENCEGATE_NO_SUCH_THING", err)

    def _tmpdir(self):
        d = tempfile.TemporaryDirectory(prefix="fg-cfg-")
        self.addCleanup(d.cleanup)
        return d.name

    def _write(self, text):
        path = os.path.join(self._tmpdir(), "fencegate.yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_bad_config_file_names_file_line_column(self):
        rp, hp = harness.free_port(), harness.free_port()
        cases = [
            ("unknown top-level key",
             "listen:\n  resp: 127.0.0.1:%d\nbogus_key: 1\n" % rp, 3, 1, "bogus_key"),
            ("unknown nested key",
             "listen:\n  resp: 127.0.0.1:%d\n  htpp: 127.0.0.1:%d\n" % (rp, hp), 3, 3, "htpp"),
            ("bad port",
             "listen:\n  resp: 127.0.0.1:%d\n  http: 127.0.0.1:99999\n" % rp, 3, 9, "99999"),
            ("wrong type",
             "listen: [1, 2]\n", 1, 9, "listen"),
        ]
        for name, text, line, col, needle in cases:
            with self.subTest(name):
                path = self._write(text)
                rc, _, err = run_fencegate(["--config", path])
                self.assertEqual(rc, 2, err)
                m = re.search(re.escape(path) + r":(\d+):(\d+)", err)
                self.assertIsNotNone(m, "no %s:LINE:COL in %r" % (path, err))
                self.assertEqual(int(m.group(1)), line, err)
                if name != "wrong type":  # where a mapping "starts" is fair to differ on
                    self.assertEqual(int(m.group(2)), col, err)
                self.assertIn(needle, err)

    def test_missing_config_file(self):
        path = os.path.join(self._tmpdir(), "absent.yaml")
        rc, _, err = run_fencegate(self.ports() + ["--config", path])
        self.assertEqual(rc, 2, err)
        self.assertIn(path, err)


    def test_config_from_a_pipe_is_read(self):
        # `--config <(envsubst < tmpl.yaml)` or a FIFO: the file's size says 0, its content
        # still counts (it was ignored, and the sidecar ran on the defaults).
        path = os.path.join(self._tmpdir(), "fifo.yaml")
        os.mkfifo(path, 0o600)
        text = "# from a pipe\nlisten:\n  resp: 127.0.0.1:99999\n"

        def feed():
            with open(path, "w") as f:
                f.write(text)
        threading.Thread(target=feed, daemon=True).start()
        rc, _, err = run_fencegate(self.ports() + ["--config", path], timeout=5.0)
        self.assertEqual(rc, 2, err)
        self.assertIn(path + ":3:9: listen.resp: bad address '127.0.0.1:99999'", err)

    def test_config_that_is_a_directory(self):
        d = self._tmpdir()
        rc, _, err = run_fencegate(self.ports() + ["--config", d])
        self.assertEqual(rc, 2, err)
        self.assertIn(d, err)

    def test_an_address_in_use_leaves_nothing_listening(self):
        # Both addresses are bound before either listens. The HTTP address's name takes 0.8 s
        # to look up, and its port is taken: meanwhile the RESP port must not accept (the RESP
        # listener used to listen before the HTTP address was tried), and start-up then fails
        # naming the address.
        dns = harness.SlowDns()
        self.addCleanup(dns.cleanup)
        dns.stall("web.fgtest", 800)
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        hport, rport = taken.getsockname()[1], harness.free_port()
        nowhere = "redis://127.0.0.1:1"
        p = subprocess.Popen([harness.FENCEGATE_BIN, "--resp", "127.0.0.1:%d" % rport,
                              "--http", "web.fgtest:%d" % hport, "--upstream", nowhere,
                              "--backend", nowhere],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=harness.clean_env(dns.env()))
        self.addCleanup(lambda: p.poll() is None and p.kill())
        accepted, deadline = False, time.monotonic() + 5
        while p.poll() is None and time.monotonic() < deadline:
            accepted = accepted or harness.port_accepts(rport, timeout=0.2)
            time.sleep(0.05)
        err = p.communicate(timeout=5)[1].decode("utf-8", "replace")
        self.assertFalse(accepted, "the RESP port accepted a connection: " + err)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("fencegate: flag --http: HTTP listener: cannot listen on web.fgtest:%d: "
                      "Address already in use" % hport, err)

    def test_two_names_of_one_address_are_refused_naming_both(self):
        # The configuration refuses resp and http on one port when they are spelled alike or
        # one is unspecified; two names of one address (a name for 127.0.0.1, and 127.0.0.1)
        # are only found by binding. Both are bound before either listens, and Linux lets two
        # SO_REUSEADDR sockets bind one address while neither listens: the RESP listener then
        # listened, and the HTTP one failed with "Address already in use", naming no flag and
        # not saying that the address in use was the sidecar's own RESP listener. The name is
        # the test name service's, not localhost: a name is bound at its first address, and
        # Debian's stock /etc/hosts makes that ::1 for localhost (then nothing overlaps).
        dns = harness.SlowDns()
        self.addCleanup(dns.cleanup)
        port = harness.free_port()
        rc, _, err = run_fencegate(["--upstream", "redis://127.0.0.1:1", "--backend",
                                    "redis://127.0.0.1:1", "--resp", "web.fgtest:%d" % port,
                                    "--http", "127.0.0.1:%d" % port], timeout=3.0,
                                   env=dns.env())
        self.assertEqual(rc, 1, err)
        self.assertIn("fencegate: flag --http: HTTP listener: cannot listen on 127.0.0.1:%d: "
                      "the RESP listener (web.fgtest:%d) is bound to that address; give them "
                      "different ports" % (port, port), err)

    def test_errors_found_after_parsing_name_their_source(self):
        # A password file read at start and a listen address: the message names the flag, the
        # variable or the file's line and column that set them (it named only the YAML key, or
        # nothing).
        empty = self._write("")
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = "127.0.0.1:%d" % taken.getsockname()[1]
        pw = "backend.password_file: '%s' must hold a password" % empty
        cases = [
            (["--backend-password-file", empty], None,
             "fencegate: flag --backend-password-file: " + pw),
            ([], {"FENCEGATE_BACKEND_PASSWORD_FILE": empty},
             "fencegate: environment FENCEGATE_BACKEND_PASSWORD_FILE: " + pw),
            (["--config", self._write("backend:\n  password_file: %s\n" % empty)], None,
             ":2:18: " + pw),
            (["--resp", busy], None,
             "fencegate: flag --resp: RESP listener: cannot listen on %s: Address already in use"
             % busy),
        ]
        nowhere = ["--upstream", "redis://127.0.0.1:1", "--backend", "redis://127.0.0.1:1"]
        for args, env, needle in cases:
            with self.subTest(args=args, env=env):
                rc, _, err = run_fencegate(self.ports() + nowhere + args, env=env, timeout=3.0)
                self.assertIn(rc, (1, 2), err)
                self.assertIn(needle, err)

    def test_postgresql_url_libpq_cannot_read_exit_2(self):
        # libpq reads the URL only when it connects: such a store used to start, /readyz said
        # 503 and every SQL request failed. Its parser now looks at it before anything starts.
        # Where it quotes a password, only the reason is shown.
        up = ["--upstream", "redis://127.0.0.1:1", "--backend", "redis://127.0.0.1:1"]
        cases = [
            ("postgresql://app@127.0.0.1:1/db?sslmod=require",
             "stores[0].url: bad URL 'postgresql://app@127.0.0.1:1/db?sslmod=require': "
             "invalid URI query parameter: \"sslmod\""),
            ("postgresql://app:s3cr%zzet@127.0.0.1:1/db",
             "stores[0].url: bad URL 'postgresql://app:***@127.0.0.1:1/db': "
             "invalid percent-encoded token\n"),
        ]
        for url, needle in cases:
            with self.subTest(url=url):
                path = self._write("stores:\n  - name: pg\n    url: \"%s\"\n" % url)
                rc, _, err = run_fencegate(self.ports() + up + ["--config", path], timeout=3.0)
                self.assertEqual(rc, 2, err)
                self.assertIn("fencegate: %s:3:10: %s" % (path, needle), err)
                self.assertNotIn("s3cr", err)

    def test_protect_rule_on_a_store_that_is_not_the_upstream_exit_2(self):
        # The file's rule names store "cache"; --upstream sends the Redis endpoint's writes
        # elsewhere, so the rule would guard nothing. It used to start, and the keys it names
        # were written without their lock.
        path = self._write("stores:\n  - { name: cache, url: \"redis://127.0.0.1:6379\" }\n"
                           "protect:\n  - { store: cache, keys: \"w:*\", lock: \"w:$1\" }\n")
        rc, _, err = run_fencegate(self.ports() + ["--config", path,
                                                   "--upstream", "redis://127.0.0.1:1"],
                                   timeout=3.0)
        self.assertEqual(rc, 2, err)
        self.assertIn(path + ":4:14: protect[0].store: 'cache' (redis://127.0.0.1:6379) is not "
                      "the Redis endpoint's upstream redis://127.0.0.1:1 (flag --upstream)", err)


class Configuration(FgTestCase):
    """Which port it listens on shows which source won: file < environment < flag."""

    def setUp(self):
        self.redis = self.start_redis()
        self.a, self.b, self.c = harness.free_port(), harness.free_port(), harness.free_port()
        self.http = harness.free_port()
        d = self._tmp()
        self.path = os.path.join(d, "fencegate.yaml")
        with open(self.path, "w") as f:
            f.write(
                "# written by test_lifecycle\n"
                "listen: { resp: 127.0.0.1:%d, http: 127.0.0.1:%d }\n"
                "backend: { url: \"redis://127.0.0.1:%d\" }\n"
                "stores:\n"
                "  - { name: cache, url: \"redis://127.0.0.1:%d\" }\n"
                % (self.a, self.http, self.redis.port, self.redis.port))

    def _tmp(self):
        d = tempfile.TemporaryDirectory(prefix="fg-cfg-")
        self.addCleanup(d.cleanup)
        return d.name

    def _start(self, args, env, expect_port):
        fg = Fencegate(args=args, env=env, resp_port=expect_port, http_port=self.http,
                       with_ports=False)
        self._fg_procs.append(fg)
        self.addCleanup(fg.cleanup)
        fg.start().wait_ready()
        cl = fg.client()
        self.addCleanup(cl.close)
        self.assertTrue(cl.set("via", str(expect_port)))
        self.assertEqual(self.redis.client().get("via"), str(expect_port).encode(),
                         "the file's first redis:// store must be the upstream")
        for p in (self.a, self.b, self.c):
            if p != expect_port:
                self.assertFalse(harness.port_accepts(p), "also listening on %d" % p)
        cl.close()
        fg.stop(expect_rc=0)

    def test_file_only(self):
        self._start(["--config", self.path], None, self.a)

    def test_file_from_environment(self):
        self._start([], {"FENCEGATE_CONFIG": self.path}, self.a)

    def test_environment_overrides_file(self):
        self._start(["--config", self.path],
                    {"FENCEGATE_LISTEN_RESP": "127.0.0.1:%d" % self.b}, self.b)

    def test_flag_overrides_environment_and_file(self):
        self._start(["--config", self.path, "--resp", "127.0.0.1:%d" % self.c],
                    {"FENCEGATE_LISTEN_RESP": "127.0.0.1:%d" % self.b}, self.c)

    def test_protect_rule_on_the_upstream_written_in_another_case(self):
        # Host names are case-insensitive: the store is the upstream, and its rule applies to
        # the Redis endpoint (the config took them for one store, the endpoint for two, and
        # dropped the rule: writes to w:* went through without the lock).
        path = os.path.join(self._tmp(), "case.yaml")
        with open(path, "w") as f:
            f.write("stores:\n  - { name: cache, url: \"redis://localhost:%d\" }\n"
                    "protect:\n  - { store: cache, keys: \"w:*\", lock: \"w:$1\" }\n"
                    % self.redis.port)
        up = "redis://LOCALHOST:%d" % self.redis.port
        fg = Fencegate(args=["--config", path, "--upstream", up, "--backend", up])
        self._fg_procs.append(fg)
        self.addCleanup(fg.cleanup)
        fg.start().wait_ready()
        r = self.raw(fg.resp_port).call("SET", "w:1", "x")
        self.assertIsInstance(r, harness.Err, r)
        self.assertTrue(str(r).startswith("NOLOCK key w:1 is protected by lock w:1"), r)
        self.assertEqual(self.redis.client().exists("w:1"), 0)

    def test_environment_only(self):
        other = self.start_redis()
        env = {"FENCEGATE_LISTEN_RESP": "127.0.0.1:%d" % self.b,
               "FENCEGATE_LISTEN_HTTP": "127.0.0.1:%d" % self.http,
               "FENCEGATE_UPSTREAM": other.url}
        fg = Fencegate(args=["--backend", other.url], env=env, resp_port=self.b,
                       http_port=self.http, with_ports=False)
        self._fg_procs.append(fg)
        self.addCleanup(fg.cleanup)
        fg.start().wait_ready()
        cl = fg.client()
        self.addCleanup(cl.close)
        cl.set("envonly", "1")
        self.assertEqual(other.client().get("envonly"), b"1")
        cl.close()
        fg.stop(expect_rc=0)


class Lifecycle(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()

    def test_a_low_descriptor_limit_is_raised_toward_what_max_clients_needs(self):
        # A login shell's soft limit of 1024 ran out at about 500 clients, far below the default
        # max_clients of 10000: fencegate raises it, up to the hard limit, as Redis does.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 2 * 10000 + 1024 + 128
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # fencegate inherits it
        try:
            fg = self.start_fencegate(self.redis)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        got = resource.prlimit(fg.pid, resource.RLIMIT_NOFILE)
        self.assertEqual(got, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
        self.assertIn("descriptor limit raised from 256 to %d" % got[0], fg.log())
        self.assertEqual(self.raw(fg.resp_port).call("PING"), "PONG")

    def test_sighup_is_ignored_and_logged(self):
        # Its default action ended the sidecar at once, without releasing its locks: a closed
        # terminal, or a habit from daemons that reload on SIGHUP, took it down. Redis ignores it.
        fg = self.start_fencegate(self.redis)
        c = self.raw(fg.resp_port)
        tok = c.call("FENCE.ACQUIRE", "hup-lock")
        self.assertIsInstance(tok, int)
        fg.signal(signal.SIGHUP)
        harness.wait_until(lambda: "SIGHUP received and ignored" in fg.log(), 5, 0.05,
                           "the SIGHUP to be logged")
        self.assertTrue(fg.alive(), fg.stderr_text)
        self.assertEqual(c.call("FENCE.TOKEN", "hup-lock"), tok)
        self.assertEqual(c.call("SET", "{hup-lock}:k", "v"), "OK")
        fg.signal(signal.SIGTERM)
        self.assertEqual(fg.wait_exit(10), 0, fg.stderr_text)

    def test_sigterm_drains_in_flight_pipeline_and_exits_0(self):
        fg = self.start_fencegate(self.redis, args=["--shutdown-grace-ms", "10000"])
        big = os.urandom(1 << 20)
        self.redis.client().set("big", big)
        c = self.raw(fg.resp_port, timeout=20)
        n = 40
        c.send(encode("GET", "big") * n + encode("ECHO", "last"))
        time.sleep(0.3)  # let the pipeline reach fencegate; the client has read nothing
        fg.signal(signal.SIGTERM)
        # It stops accepting new connections at once ...
        harness.wait_until(lambda: not harness.port_accepts(fg.resp_port, 0.2), 3, 0.05,
                           "the RESP listener to close after SIGTERM")
        self.assertTrue(fg.alive(), "exited without draining the in-flight replies")
        # ... while the replies already asked for are still delivered, intact and in order.
        for i in range(n):
            self.assertTrue(c.read_reply(timeout=20) == big, "reply %d" % i)
        self.assertEqual(c.read_reply(), b"last")
        self.assertEqual(c.read_until_close(timeout=10), b"")
        self.assertEqual(fg.wait_exit(10), 0, fg.stderr_text)
        self.assertEqual(fg.stdout_text(), "", "logs must go to stderr, not stdout")

    def test_sigterm_grace_bounds_a_client_that_never_reads(self):
        fg = self.start_fencegate(self.redis, args=["--shutdown-grace-ms", "1000"])
        self.redis.client().set("big", os.urandom(1 << 20))
        idle = self.raw(fg.resp_port)
        self.assertEqual(idle.call("PING"), "PONG")
        stuck = self.raw(fg.resp_port)
        stuck.send(encode("GET", "big") * 30)
        time.sleep(0.3)
        t0 = time.monotonic()
        fg.signal(signal.SIGTERM)
        self.assertEqual(fg.wait_exit(8), 0, fg.stderr_text)
        self.assertLess(time.monotonic() - t0, 6, "--shutdown-grace-ms 1000 was not honoured")

    def test_sigterm_with_only_idle_connections_exits_promptly(self):
        # Nothing is in flight, so there is nothing to drain: the grace period is a ceiling,
        # not a delay (a rolling update must not stall on idle pooled connections).
        fg = self.start_fencegate(self.redis, args=["--shutdown-grace-ms", "20000"])
        idle = [self.raw(fg.resp_port) for _ in range(3)]
        for c in idle:
            self.assertEqual(c.call("PING"), "PONG")
        # Idle after a command that held the pipeline back (a lock acquisition, HELLO): nothing
        # is left to answer there either.
        self.assertIsInstance(idle[1].call("FENCE.ACQUIRE", "idle-lock"), int)
        self.assertEqual(idle[1].call("FENCE.RELEASE", "idle-lock"), 1)
        self.assertIsInstance(idle[2].call("HELLO", "2"), list)
        t0 = time.monotonic()
        fg.signal(signal.SIGTERM)
        self.assertEqual(fg.wait_exit(25), 0, fg.stderr_text)
        self.assertLess(time.monotonic() - t0, 3.0,
                        "waited for idle connections instead of exiting")
        for c in idle:
            self.assertEqual(c.read_until_close(timeout=2), b"")

    def test_sigterm_answers_an_http_request_whose_head_is_half_sent(self):
        # A client caught halfway through its request head by SIGTERM is told to send it again
        # elsewhere (it used to see its connection closed with no answer); the exit is not held
        # up by it.
        fg = self.start_fencegate(self.redis, args=["--shutdown-grace-ms", "10000"])
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        self.addCleanup(s.close)
        s.sendall(b"POST /v1/locks/half HTTP/1.1\r\nHost: x\r\nContent-Le")
        time.sleep(0.3)
        t0 = time.monotonic()
        fg.signal(signal.SIGTERM)
        got = harness.recv_until_close(s)
        head, _, body = got.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 503 "), got)
        self.assertIn(b'"error":"unavailable"', body)
        self.assertIn(b"shutting down", body)
        self.assertEqual(fg.wait_exit(10), 0, fg.stderr_text)
        self.assertLess(time.monotonic() - t0, 3.0)

    def test_health_ready_and_metrics(self):
        fg = self.start_fencegate(self.redis)
        self.assertEqual(fg.http("/healthz")[0], 200)
        self.assertEqual(fg.http("/readyz")[0], 200)
        status, body = fg.http("/metrics")
        self.assertEqual(status, 200)
        self.assertTrue(harness.http_get.last_headers.get("content-type", "").startswith(
            "text/plain"), harness.http_get.last_headers)
        m0 = harness.parse_metrics(body.decode())
        for name in METRIC_NAMES:
            self.assertIsNotNone(msum(m0, name), "metric %s missing" % name)
        text = body.decode()
        self.assertRegex(text, r"(?m)^# TYPE fencegate_command_latency_seconds histogram$")
        self.assertRegex(text, r"(?m)^# TYPE fencegate_connections_accepted_total counter$")
        self.assertRegex(text, r"(?m)^# TYPE fencegate_connections_open gauge$")
        self.assertEqual(msum(m0, "fencegate_upstream_up"), 1)

        harness.wait_until(lambda: msum(fg.metrics(), "fencegate_connections_open") == 0,
                           5, 0.05, "connections_open to settle at 0")
        m0 = fg.metrics()
        conns = [self.raw(fg.resp_port) for _ in range(3)]
        sent = 0
        for i, c in enumerate(conns):
            for j in range(10):
                req = encode("SET", "m:%d:%d" % (i, j), "v")
                sent += len(req)
                c.send(req)
            for j in range(10):
                self.assertEqual(c.read_reply(), "OK")
        harness.wait_until(lambda: msum(fg.metrics(), "fencegate_connections_open") == 3,
                           5, 0.05, "connections_open == 3")
        m1 = fg.metrics()

        def grew(name, at_least):
            d = msum(m1, name) - msum(m0, name)
            self.assertGreaterEqual(d, at_least, "%s grew by %s, expected >= %s"
                                    % (name, d, at_least))
        grew("fencegate_connections_accepted_total", 3)
        grew("fencegate_commands_forwarded_total", 30)
        grew("fencegate_bytes_from_clients_total", sent)
        grew("fencegate_bytes_to_clients_total", 30 * len(b"+OK\r\n"))
        grew("fencegate_command_latency_seconds_count", 30)
        self.assertEqual(msum(m1, "fencegate_upstream_connect_errors_total"),
                         msum(m0, "fencegate_upstream_connect_errors_total"))

        # Histogram shape: cumulative buckets ending in +Inf == _count.
        buckets = sorted(
            ((float("inf") if k.split('le="')[1].split('"')[0] == "+Inf"
              else float(k.split('le="')[1].split('"')[0])), v)
            for k, v in m1.items() if k.startswith("fencegate_command_latency_seconds_bucket{"))
        self.assertGreaterEqual(len(buckets), 2)
        self.assertEqual(buckets[-1][0], float("inf"))
        counts = [v for _, v in buckets]
        self.assertEqual(counts, sorted(counts), "histogram buckets are not cumulative")
        count = msum(m1, "fencegate_command_latency_seconds_count")
        total = msum(m1, "fencegate_command_latency_seconds_sum")
        self.assertEqual(counts[-1], count)
        self.assertGreater(total, 0)
        self.assertLess(total / count, 1.0,
                        "mean latency over 1 s: units are not seconds")

        for c in conns:
            c.close()
        harness.wait_until(lambda: msum(fg.metrics(), "fencegate_connections_open") == 0,
                           5, 0.05, "connections_open back to 0 after closing")
        fg.stop(expect_rc=0)

    def test_many_threads_with_redis_py(self):
        import redis
        fg = self.start_fencegate(self.redis)
        pool = redis.ConnectionPool(host="127.0.0.1", port=fg.resp_port, max_connections=64,
                                    socket_timeout=10)
        self.addCleanup(pool.disconnect)
        threads_n, ops = 50, 200
        errors = []

        def work(t):
            r = redis.Redis(connection_pool=pool)
            try:
                for i in range(ops // 4):
                    key = "t%d:%d" % (t, i)
                    val = os.urandom(16).hex() + "\r\n\0"
                    if r.set(key, val) is not True:
                        errors.append("SET %s" % key)
                    if r.get(key) != val.encode():
                        errors.append("GET %s wrong" % key)
                    r.incr("shared")
                    if r.rpush("list:%d" % t, i) != i + 1:
                        errors.append("RPUSH list:%d" % t)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append("thread %d: %r" % (t, e))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(0.1, 90 - (time.monotonic() - t0)))
        self.assertFalse(any(th.is_alive() for th in threads), "threads still running after 90 s")
        self.assertEqual(errors[:10], [])
        direct = self.redis.client()
        self.assertEqual(direct.get("shared"), str(threads_n * ops // 4).encode())
        self.assertEqual(direct.llen("list:7"), ops // 4)
        pool.disconnect()
        fg.stop(expect_rc=0)


if __name__ == "__main__":
    unittest.main()
