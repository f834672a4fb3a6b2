"""harness.py — helpers for fencegate's integration tests: ports, redis-server and fencegate
processes, raw RESP sockets, HTTP probes, /proc memory readings.

Every process started here binds 127.0.0.1 on a port picked free, runs in its own temporary
directory and is stopped by a cleanup registered on the test case, even when the test fails.
Every wait is bounded by a deadline. When a test fails, the stderr of each fencegate it started
(and the tail of each redis log) is printed, so a ctest log explains itself.
"""

import atexit
import hashlib
import http.client
import os
import random
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import redis  # noqa: F401 - redis-py, Debian's python3-redis
except ImportError:
    # CMake's find_package(Python3) may pick an interpreter without redis-py (a pyenv shim, a
    # venv). Run the same command line once more under the system interpreter, which has it.
    if os.path.exists("/usr/bin/python3") and not os.environ.get("FG_ITEST_REEXEC"):
        sys.stderr.write("harness: %s has no redis module; re-running under /usr/bin/python3\n"
                         % sys.executable)
        sys.stderr.flush()
        os.environ["FG_ITEST_REEXEC"] = "1"
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.orig_argv[1:])
    raise SystemExit("harness: the redis module is missing: apt-get install python3-redis, "
                     "and run the tests with /usr/bin/python3")

HERE = os.path.dirname(os.path.abspath(__file__))

# The binary under test: $FENCEGATE_BIN (set by ctest), else the default build location.
FENCEGATE_BIN = os.environ.get("FENCEGATE_BIN") or os.path.normpath(
    os.path.join(HERE, "..", "..", "build", "bin", "fencegate"))
# fencectl is built next to fencegate.
FENCECTL_BIN = os.environ.get("FENCECTL_BIN") or os.path.join(os.path.dirname(FENCEGATE_BIN),
                                                              "fencectl")
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"

START_TIMEOUT = 10.0  # seconds any server gets to become ready
STOP_TIMEOUT = 15.0   # seconds any server gets to exit after SIGTERM


# ---- ports --------------------------------------------------------------------------------

_handed_out = set()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now and that this process has not handed
    out before. Picked below the Linux ephemeral range (32768+) so that outgoing connections of
    the servers under test cannot already occupy it."""
    for _ in range(500):
        port = random.randint(20000, 32000)
        if port in _handed_out:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            s.close()
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found on 127.0.0.1 after 500 tries")


def port_accepts(port, timeout=0.5):
    """True when a TCP connect to 127.0.0.1:port succeeds."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def recv_until_close(sock):
    """Every byte a socket receives until its peer closes (the socket's own timeout applies to
    each read)."""
    got = b""
    while True:
        d = sock.recv(65536)
        if not d:
            return got
        got += d


def wait_until(pred, timeout, interval=0.05, what="condition"):
    """Polls pred() until it returns a true value (returned) or `timeout` seconds pass
    (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - the predicate may fail while a server starts
            last_exc = e
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.1fs waiting for %s%s" % (
                timeout, what, (" (last error: %r)" % last_exc) if last_exc else ""))
        time.sleep(interval)


def clean_env(extra=None):
    """The environment for a child process: ours without any FENCEGATE_* variable (ctest sets
    FENCEGATE_BIN, and fencegate rejects unknown FENCEGATE_ names), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEGATE_")}
    if extra:
        env.update(extra)
    return env


def _raw_ping(port):
    """True when 127.0.0.1:port answers PING with +PONG within half a second."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def rss_kib(pid):
    """Resident set size of process `pid` in KiB, from /proc/PID/status."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def _tail(path, max_lines=200):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return "<cannot read %s: %s>" % (path, e)
    lines = data.decode("utf-8", "replace").splitlines()
    if len(lines) > max_lines:
        lines = ["... (%d lines cut)" % (len(lines) - max_lines)] + lines[-max_lines:]
    return "\n".join(lines)


# ---- redis-server -------------------------------------------------------------------------


def multiplexed():
    """Whether fencegates started by the harness share their upstream connection (the default;
    FG_TEST_MULTIPLEX=false turns it off for the *_dedicated suites)."""
    return os.environ.get("FG_TEST_MULTIPLEX", "true") != "false"

class RedisServer:
    """A redis-server on 127.0.0.1 in a temporary directory; can be stopped, killed and started
    again on the same port."""

    def __init__(self, port=None, args=()):
        self.port = port or free_port()
        self.args = list(args)  # more redis-server options, e.g. ["--rename-command", "SET", "X"]
        self.dir = tempfile.mkdtemp(prefix="fg-redis-")
        self.proc = None
        self.log_path = os.path.join(self.dir, "redis.log")
        self.log_text = ""

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "redis already running"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
             "--port", str(self.port), "--dir", self.dir, "--logfile", self.log_path,
             "--daemonize", "no"] + self.args,
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=clean_env())
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("redis-server on port %d exited with %s:\n%s" % (
                    self.port, self.proc.returncode, _tail(self.log_path, 30)))
            if _raw_ping(self.port):
                return self
            if time.monotonic() >= deadline:
                raise AssertionError("redis-server on port %d not ready in %.0fs" % (
                    self.port, START_TIMEOUT))
            time.sleep(0.02)

    def client(self, **kw):
        """A redis-py client connected straight to this Redis (not through fencegate)."""
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)

    def kill(self):
        """SIGKILL: the abrupt loss of the upstream."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        self.log_text = _tail(self.log_path, 40)

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- postgres -------------------------------------------------------------------------------

PG_BIN = os.environ.get("FG_PG_BIN") or "/usr/lib/postgresql/15/bin"
PSQL = shutil.which("psql") or "/usr/bin/psql"
_pg_template = None  # PostgresServer._initdb()'s cluster, copied for each server


class PostgresServer:
    """A PostgreSQL 15 server (initdb + postgres) on 127.0.0.1 in a temporary data directory,
    with a Unix socket in that directory too; can be stopped, killed and started again on the
    same port. PostgreSQL refuses to run as root, so as root it runs as the `postgres` user
    (Debian's postgresql package creates it) through runuser."""

    def __init__(self, port=None, fsync=False):
        self.port = port or free_port()
        self.fsync = fsync
        self.dir = tempfile.mkdtemp(prefix="fg-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "postgres.log")
        self.proc = None
        self.log_text = ""
        self.user = "fencegate"
        self.listen = "127.0.0.1"   # listen_addresses
        self._as = []
        if os.geteuid() == 0:
            try:
                import pwd
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise AssertionError("running as root, PostgreSQL needs a non-root user: no "
                                     "'postgres' user exists (apt-get install postgresql)")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._initdb()

    @property
    def url(self):
        return "postgresql://%s@127.0.0.1:%d/postgres" % (self.user, self.port)

    def _initdb(self):
        """A fresh cluster in self.data: a copy of one initdb made once per test process (initdb
        takes about 1.5 s and most of a CPU; a copy 0.1 s), made for the user running postgres."""
        global _pg_template
        if _pg_template is None:
            tdir = tempfile.mkdtemp(prefix="fg-pg-template-")
            atexit.register(shutil.rmtree, tdir, True)
            if self._as:
                shutil.chown(tdir, "postgres", "postgres")
            tdata = os.path.join(tdir, "data")
            p = subprocess.run(self._as + [os.path.join(PG_BIN, "initdb"), "-D", tdata, "-U",
                                           self.user, "-A", "trust", "-E", "UTF8",
                                           "--no-locale"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                               env=clean_env())
            if p.returncode != 0:
                raise AssertionError("initdb failed (%d): %s" % (
                    p.returncode, p.stderr.decode("utf-8", "replace")))
            _pg_template = tdata
        p = subprocess.run(["cp", "-a", _pg_template, self.data], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError("copying the initdb template failed (%d): %s" % (
                p.returncode, p.stderr.decode("utf-8", "replace")))

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "postgres already running"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self._as + [os.path.join(PG_BIN, "postgres"), "-D", self.data, "-p", str(self.port),
                        "-c", "listen_addresses=" + self.listen, "-k", self.dir,
                        "-c", "fsync=%s" % ("on" if self.fsync else "off"),
                        "-c", "max_connections=200"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=clean_env())
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("postgres on port %d exited with %s:\n%s" % (
                    self.port, self.proc.returncode, _tail(self.log_path, 30)))
            r = subprocess.run([PSQL, "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
                                "-U", self.user, "-d", "postgres", "-c", "SELECT 1"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                               env=clean_env())
            if r.returncode == 0:
                return self
            if time.monotonic() >= deadline:
                raise AssertionError("postgres on port %d not ready in %.0fs:\n%s" % (
                    self.port, START_TIMEOUT, _tail(self.log_path, 30)))
            time.sleep(0.1)

    def sql(self, text, check=True):
        """Runs SQL with psql straight at this server (not through fencegate); returns the
        unaligned, tuples-only output (rows on lines, columns separated by '|')."""
        p = subprocess.run([PSQL, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
                            "-p", str(self.port), "-U", self.user, "-d", "postgres", "-c", text],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                           env=clean_env())
        if check and p.returncode != 0:
            raise AssertionError("psql %r exited %d: %s" % (
                text, p.returncode, p.stderr.decode("utf-8", "replace")))
        return p.stdout.decode("utf-8", "replace").rstrip("\n")

    def _signal(self, sig):
        # The server runs as another user: signal it through our child (runuser forwards
        # SIGTERM; SIGKILL goes to the postgres process, found by its pid file).
        pid = None
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                pid = int(f.readline().strip())
        except (OSError, ValueError):
            pass
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        """SIGKILL the postmaster (its backends exit on their own)."""
        if self.proc and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)

    def stop(self):
        """Fast shutdown (SIGINT): open connections are closed, the port is freed."""
        if self.proc and self.proc.poll() is None:
            self._signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT)
        self.log_text = _tail(self.log_path, 40)

    def restart(self):
        self.stop()
        return self.start()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- fencegate ----------------------------------------------------------------------------

class Fencegate:
    """A fencegate process. Ports default to free ones; stderr and stdout go to files in a
    temporary directory."""

    def __init__(self, args=(), upstream=None, resp_port=None, http_port=None, env=None,
                 with_ports=True):
        self.resp_port = resp_port or free_port()
        self.http_port = http_port or free_port()
        self.dir = tempfile.mkdtemp(prefix="fg-fencegate-")
        self.stderr_path = os.path.join(self.dir, "stderr.log")
        self.stdout_path = os.path.join(self.dir, "stdout.log")
        argv = [FENCEGATE_BIN]
        if with_ports:
            argv += ["--resp", "127.0.0.1:%d" % self.resp_port,
                     "--http", "127.0.0.1:%d" % self.http_port]
        if upstream:
            # The lock backend also defaults to 127.0.0.1:6379: point it at the test's Redis so
            # that nothing outside the test is touched.
            argv += ["--upstream", upstream, "--backend", upstream]
        argv += list(args)
        # FG_TEST_MULTIPLEX=false runs a suite with every client on its own upstream connection
        # (the ctest *_dedicated entries), so both paths of server.c are tested.
        mux = os.environ.get("FG_TEST_MULTIPLEX")
        if mux and with_ports and not any(a.startswith("--upstream-multiplex") for a in argv):
            argv += ["--upstream-multiplex", mux]
        self.argv = argv
        self.env = clean_env(env)
        self.proc = None
        self.returncode = None
        self.stderr_text = ""

    def start(self):
        if not os.access(FENCEGATE_BIN, os.X_OK):
            raise AssertionError("fencegate binary not found at %s (set FENCEGATE_BIN)" %
                                 FENCEGATE_BIN)
        self._err = open(self.stderr_path, "wb")
        self._out = open(self.stdout_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=self._out, stderr=self._err, env=self.env)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, readyz=True, timeout=START_TIMEOUT):
        """Waits until both ports accept connections (fencegate binds them one after the
        other) and, with readyz, GET /readyz answers 200 (the upstream answered). Fails early if
        the process exits."""
        def ready():
            if not self.alive():
                raise _Exited()
            if not port_accepts(self.resp_port) or not port_accepts(self.http_port):
                return False
            if readyz:
                return http_get(self.http_port, "/readyz", timeout=1)[0] == 200
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return self
            except _Exited:
                self._collect()
                raise AssertionError("fencegate exited with %s before it was ready; stderr:\n%s"
                                     % (self.returncode, self.stderr_text))
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise AssertionError("fencegate not ready within %.0fs (readyz=%s); stderr:\n%s"
                                     % (timeout, readyz, _tail(self.stderr_path, 60)))
            time.sleep(0.03)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        """Waits for the process to exit; returns its exit code (negative = killed by a
        signal). Raises AssertionError on timeout (the process is left running)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("fencegate did not exit within %.1fs" % timeout) from None
        self._collect()
        return self.returncode

    def log(self):
        """What it has written to stderr so far."""
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def stop(self, expect_rc=0, timeout=STOP_TIMEOUT):
        """SIGTERM, wait, and assert the exit code (None: do not check). Kills it when it does
        not exit in time, then fails."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
                self._collect()
                raise AssertionError("fencegate ignored SIGTERM for %.0fs (killed)" % timeout)
        self._collect()
        if expect_rc is not None and self.returncode != expect_rc:
            raise AssertionError("fencegate exited with %s, expected %s; stderr:\n%s" % (
                self.returncode, expect_rc, self.stderr_text))
        return self.returncode

    def _collect(self):
        if self.proc is not None and self.proc.poll() is not None:
            self.returncode = self.proc.returncode
        for f in (getattr(self, "_err", None), getattr(self, "_out", None)):
            if f and not f.closed:
                f.close()
        self.stderr_text = _tail(self.stderr_path)

    def stdout_text(self):
        with open(self.stdout_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def cleanup(self):
        """For addCleanup: never raises; kills a process that ignores SIGTERM."""
        try:
            if self.alive():
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(STOP_TIMEOUT)
            self._collect()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, **kw):
        """A redis-py client to fencegate's RESP endpoint."""
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(host="127.0.0.1", port=self.resp_port, **kw)

    def raw(self, timeout=5.0):
        return RawConn(self.resp_port, timeout)

    def http(self, path, timeout=5.0):
        return http_get(self.http_port, path, timeout)

    def metrics(self):
        status, body = self.http("/metrics")
        if status != 200:
            raise AssertionError("/metrics answered %d" % status)
        return parse_metrics(body.decode())


class PromptPoller(threading.Thread):
    """Beside a stalled lookup, checks that fencegate goes on answering everything else: for
    `seconds`, rounds of its /healthz, GET /v1/locks and the `extra` checks (callables that return
    True when answered right). `worst` is the longest round in seconds, 99 when a check failed or
    timed out. Start it, do the test's part, join it, then assert on `worst`."""

    def __init__(self, fg, *extra, seconds=3.0):
        super().__init__(daemon=True)
        self.checks = (lambda: fg.http("/healthz", timeout=5)[0] == 200,
                       lambda: http_request(fg.http_port, "GET", "/v1/locks")[0] == 200) + extra
        self.seconds = seconds
        self.worst = None

    def run(self):
        worst, end = 0.0, time.monotonic() + self.seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                ok = all(check() for check in self.checks)
            except OSError:  # a timeout
                ok = False
            worst = max(worst, time.monotonic() - t0 if ok else 99.0)
            time.sleep(0.05)
        self.worst = worst


class SlowDns:
    """A name service that can stall, for a fencegate started with env=dns.env(): libslowdns.so
    (tests/integration/slowdns.c, built next to fencegate) is preloaded, every name ending in
    ".fgtest" resolves to 127.0.0.1, and stall(name, ms) makes each lookup of that name wait ms
    first, as a DNS server that does not answer does."""

    LIB = os.path.join(os.path.dirname(FENCEGATE_BIN), "libslowdns.so")

    def __init__(self):
        if not os.path.exists(self.LIB):
            raise AssertionError("%s not built (it is built with the tests)" % self.LIB)
        self.dir = tempfile.mkdtemp(prefix="fg-slowdns-")
        self.path = os.path.join(self.dir, "stalls")
        self.stalls = {}
        self._write()

    def _write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines("%s %d\n" % kv for kv in self.stalls.items())
        os.replace(tmp, self.path)  # a lookup reads the old file or the new, never half of one

    def stall(self, name, ms):
        self.stalls[name] = ms
        self._write()

    def env(self):
        # A preloaded library comes before a sanitizer's runtime: tell ASan that is meant.
        asan = os.environ.get("ASAN_OPTIONS", "")
        return {"LD_PRELOAD": self.LIB, "SLOWDNS_FILE": self.path,
                "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}

    def cleanup(self):
        shutil.rmtree(self.dir, True)


class _Exited(Exception):
    pass


def run_fencegate(args, timeout=10.0, env=None):
    """Runs fencegate to completion (for --help, --version, bad configurations). Returns
    (exit code, stdout text, stderr text)."""
    try:
        p = subprocess.run([FENCEGATE_BIN] + list(args), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=timeout, env=clean_env(env))
    except subprocess.TimeoutExpired as e:
        # It started serving instead of refusing its configuration (run() killed it).
        err = (e.stderr or b"").decode("utf-8", "replace")
        return None, (e.stdout or b"").decode("utf-8", "replace"), (
            "<still running after %.0fs, killed>\n" % timeout) + err
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


# ---- test case base -----------------------------------------------------------------------

class FgTestCase(unittest.TestCase):
    """Starts servers whose cleanup is registered on the test, and prints their logs when the
    test fails."""

    def run(self, result=None):
        self._fg_procs = []
        self._redis_procs = []
        before = (len(result.failures) + len(result.errors)) if result is not None else 0
        out = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > before:
            for fg in self._fg_procs:
                sys.stderr.write("\n---- fencegate %s (exit %s) stderr ----\n%s\n" % (
                    " ".join(fg.argv[1:]), fg.returncode, fg.stderr_text))
            for r in self._redis_procs:
                sys.stderr.write("\n---- redis-server :%d log tail ----\n%s\n" % (
                    r.port, r.log_text))
            sys.stderr.flush()
        return out

    def start_redis(self, port=None, args=()):
        r = RedisServer(port, args)
        self._redis_procs.append(r)
        self.addCleanup(r.cleanup)
        r.start()
        return r

    def make_redis(self, port=None):
        """A RedisServer registered for cleanup but not started."""
        r = RedisServer(port)
        self._redis_procs.append(r)
        self.addCleanup(r.cleanup)
        return r

    def start_fencegate(self, redis_server=None, args=(), ready=True, readyz=True, **kw):
        """Starts fencegate in front of redis_server (a RedisServer, or a URL string) and waits
        until it is ready. The cleanup only kills it; tests that check the exit code call
        fg.stop()."""
        upstream = redis_server.url if isinstance(redis_server, RedisServer) else redis_server
        fg = Fencegate(args=args, upstream=upstream, **kw)
        self._fg_procs.append(fg)
        self.addCleanup(fg.cleanup)
        fg.start()
        if ready:
            fg.wait_ready(readyz=readyz)
        return fg

    def cut(self, port):
        """Drops every packet sent to 127.0.0.1:port from now until the test ends or the heal
        returned is called (iptables, this test's own port on loopback only); skips without root
        or iptables. Dropped on arrival, as a network loses them: the sender's TCP backs off as
        it would (a packet dropped on its way out is reported to the sender at once)."""
        return self.drop_on_loopback(["-d", "127.0.0.1", "--dport", str(port)])

    def drop_on_loopback(self, match):
        """Drops the TCP packets arriving on loopback that match (iptables arguments) until the
        test ends or the heal returned is called; skips without root or iptables."""
        if os.geteuid() != 0 or not shutil.which("iptables"):
            self.skipTest("needs root and iptables (scripts/deps.sh test installs it)")
        rule = (["INPUT", "-i", "lo", "-p", "tcp"] + match +
                ["-m", "comment", "--comment", "fencegate-test", "-j", "DROP"])
        r = subprocess.run(["iptables", "-w", "-I"] + rule, capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("iptables refused the rule: %s" % r.stderr.strip())
        heal = lambda: subprocess.run(["iptables", "-w", "-D"] + rule, capture_output=True)
        self.addCleanup(heal)
        return heal

    def slow_dns(self):
        """A SlowDns removed after the test."""
        dns = SlowDns()
        self.addCleanup(dns.cleanup)
        return dns

    def raw(self, port, timeout=5.0):
        c = RawConn(port, timeout)
        self.addCleanup(c.close)
        return c

    def write_file(self, name, text):
        """Writes `text` into a file in a temporary directory removed after the test; returns
        its path (for --config files and the like)."""
        d = getattr(self, "_fg_tmpdir", None)
        if d is None:
            d = self._fg_tmpdir = tempfile.mkdtemp(prefix="fg-test-")
            self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def freeze(self, fg):
        """SIGSTOPs a fencegate; a cleanup resumes it (so that its own cleanup's SIGTERM works)
        even when the test fails while it is stopped."""
        fg.signal(signal.SIGSTOP)
        self.addCleanup(lambda: fg.alive() and fg.signal(signal.SIGCONT))


# ---- raw RESP connection ------------------------------------------------------------------

class Err(str):
    """An error reply (the text after '-' or the '!' blob)."""


class Status(str):
    """A simple-string reply (the text after '+')."""


class Push(list):
    """A RESP3 push frame ('>')."""


class Verbatim(str):
    pass


class RawConn:
    """A plain TCP connection speaking RESP by hand, so that tests see exact bytes."""

    def __init__(self, port, timeout=5.0):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.eof = False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data):
        self.sock.sendall(data)

    def cmd(self, *args):
        """Sends one command in multibulk form."""
        self.send(encode(*args))

    def call(self, *args, timeout=None):
        self.cmd(*args)
        return self.read_reply(timeout)

    def _fill(self, deadline):
        """Reads more bytes into buf. Raises socket.timeout at the deadline and EOFError at end
        of stream."""
        if self.eof:
            raise EOFError("connection closed by peer")
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        self.sock.settimeout(left)
        try:
            d = self.sock.recv(1 << 20)
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof = True
            raise EOFError("connection closed by peer")
        self.buf += d

    def read_exact(self, n, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while len(self.buf) < n:
            self._fill(deadline)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self, deadline):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill(deadline)

    def read_reply(self, timeout=None):
        """Reads one whole RESP2/RESP3 reply and returns it decoded: bulk -> bytes, simple ->
        Status, error -> Err, integer -> int, nil -> None, array/set -> list, map -> dict (or a
        list of pairs when a key is unhashable), push -> Push. Raises socket.timeout / EOFError."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        return self._read(deadline)

    def read_raw_reply(self, timeout=None):
        """Like read_reply() but returns the exact bytes of the reply."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        return _Recorder(self, deadline).read()

    def _read(self, deadline):
        line = self._line(deadline)
        if not line:
            raise ValueError("empty reply line")
        t, rest = line[:1], line[1:]
        if t == b"+":
            return Status(rest.decode("utf-8", "replace"))
        if t == b"-":
            return Err(rest.decode("utf-8", "replace"))
        if t == b":":
            return int(rest)
        if t == b"(":
            return int(rest)
        if t == b",":
            return float(rest)
        if t == b"#":
            return rest == b"t"
        if t == b"_":
            return None
        if t in (b"$", b"=", b"!"):
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill(deadline)
            data = bytes(self.buf[:n])
            del self.buf[:n + 2]
            if t == b"!":
                return Err(data.decode("utf-8", "replace"))
            if t == b"=":
                return Verbatim(data[4:].decode("utf-8", "replace"))
            return data
        if t in (b"*", b"~", b">"):
            n = int(rest)
            if n < 0:
                return None
            items = [self._read(deadline) for _ in range(n)]
            return Push(items) if t == b">" else items
        if t == b"%":
            n = int(rest)
            pairs = [(self._read(deadline), self._read(deadline)) for _ in range(n)]
            try:
                return dict(pairs)
            except TypeError:
                return pairs
        if t == b"|":
            n = int(rest)
            for _ in range(2 * n):  # attributes are skipped; the reply follows
                self._read(deadline)
            return self._read(deadline)
        raise ValueError("unexpected RESP type byte %r in line %r" % (t, line[:80]))

    def read_available(self, wait=0.3):
        """Returns the bytes that arrive within `wait` seconds (b"" if none), keeping nothing
        in the buffer. Does not raise on EOF (check .eof)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self._fill(deadline)
            except (socket.timeout, EOFError):
                break
        out = bytes(self.buf)
        self.buf.clear()
        return out

    def read_until_close(self, timeout=None):
        """Returns every byte until the peer closes. Raises AssertionError if it stays open for
        `timeout` seconds."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            try:
                self._fill(deadline)
            except EOFError:
                out = bytes(self.buf)
                self.buf.clear()
                return out
            except socket.timeout:
                raise AssertionError("connection still open after %.1fs; got %r" % (
                    timeout if timeout is not None else self.timeout,
                    bytes(self.buf[:200]))) from None
            except OSError:
                out = bytes(self.buf)
                self.buf.clear()
                self.eof = True
                return out


class _Recorder:
    """Parses one reply from a RawConn while recording the exact bytes consumed."""

    def __init__(self, conn, deadline):
        self.conn = conn
        self.deadline = deadline

    def read(self):
        c = self.conn
        # Find the total length of one reply by walking headers; bulk payloads are skipped.
        pos = 0
        pending = 1
        while pending > 0:
            while True:
                i = c.buf.find(b"\r\n", pos)
                if i >= 0:
                    break
                c._fill(self.deadline)
            line = bytes(c.buf[pos:i])
            pos = i + 2
            pending -= 1
            t, rest = line[:1], line[1:]
            if t in (b"$", b"=", b"!"):
                n = int(rest)
                if n >= 0:
                    while len(c.buf) < pos + n + 2:
                        c._fill(self.deadline)
                    pos += n + 2
            elif t in (b"*", b"~", b">", b"%", b"|"):
                n = int(rest)
                if n > 0:
                    pending += n * (2 if t in (b"%", b"|") else 1)
                if t == b"|":
                    pending += 1  # the attributed reply itself
        out = bytes(c.buf[:pos])
        del c.buf[:pos]
        return out


def encode(*args):
    """Encodes one command as a RESP multibulk request."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            a = str(a).encode()
        elif isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


# ---- HTTP and metrics ---------------------------------------------------------------------

def http_get(port, path, timeout=5.0):
    """GET http://127.0.0.1:port/path; returns (status, body bytes). Content type is in
    http_get.last_headers."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        http_get.last_headers = dict((k.lower(), v) for k, v in r.getheaders())
        return r.status, body
    finally:
        c.close()


http_get.last_headers = {}


def parse_metrics(text):
    """Prometheus text format -> {'name{labels}': float}; comment lines are kept in
    the '#' entry as a list."""
    out = {"#": []}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            out["#"].append(line)
            continue
        # name{labels} value [timestamp]
        if "}" in line:
            key, _, rest = line.rpartition("}")
            key += "}"
            parts = rest.split()
        else:
            parts = line.split()
            key, parts = (parts[0], parts[1:]) if parts else ("", [])
        if not key or not parts:
            raise ValueError("malformed Prometheus line %r" % line[:200])
        out[key] = float(parts[0])
    return out


def sha(b):
    return hashlib.sha256(b).hexdigest()


def http_request(port, method, path, body=None, timeout=5.0, headers=None):
    """Any HTTP request to 127.0.0.1:port; body may be bytes, str or a JSON-able object.
    Returns (status, lower-cased headers dict, body bytes)."""
    import json as _json
    if body is not None and not isinstance(body, (bytes, str)):
        body = _json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data
    finally:
        c.close()


def redis_cli(port, *args, timeout=10.0):
    """Runs redis-cli against 127.0.0.1:port (straight to a Redis, or to fencegate); returns its
    stdout without the trailing newline. Fails on a non-zero exit."""
    p = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(port)] + [str(a) for a in args],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                       env=clean_env())
    if p.returncode != 0:
        raise AssertionError("redis-cli %s exited %d: %s" % (
            " ".join(str(a) for a in args), p.returncode, p.stderr.decode("utf-8", "replace")))
    return p.stdout.decode("utf-8", "replace").rstrip("\n")
