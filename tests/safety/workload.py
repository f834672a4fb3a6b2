#!/usr/bin/env python3
"""workload.py — fencegate's safety workload (Jepsen's lock-set shape) with fault injection.

One redis-server (AOF, fsync always, restartable on the same port with its data), two fencegate
sidecars in front of it (both use it as upstream and lock backend, leases of 600 ms), and six
worker threads per sidecar, each with its own RESP connection. Every worker loops:

    FENCE.ACQUIRE L WAIT 2000 [TTL 500 NORENEW]  -> token T
    GET counter                                  -> v
    (a nemesis may stall the worker here, or freeze / kill / cut off / skew the sidecar)
    SET counter v+1                              fenced: by the protect rule counter* -> L on
    RPUSH counter:log "T:v+1"                    sidecar a, by the one-lock rule on sidecar b
    FENCE.RELEASE L

Worker i of a sidecar has role ROLES[i % 6]: a NORENEW lease or a renewed one, and plain writes,
MULTI / SET / RPUSH / (stall point) / EXEC, whose two writes share EXEC's outcome, or SET and RPUSH
pipelined in one send (fencegate sends such a run as one transaction). Two churn workers per
sidecar (Churn) run the same loop on locks bg0..bg3, picked at random for each turn, with the
counter c:{bgN} and the log c:{bgN}:log (fenced by the hash-tag rule): their writes meet L's on
the sidecar's shared upstream connection (scripts and transactions carrying several locks), and
with the etcd backend their acquisitions and releases share etcd Txns with L's. Each churn lock
is checked like L (1-4 below). Two bank workers per sidecar (Bank) move money between accounts
under locks k0..k3, two locks per transfer; the balances must keep their sum. Every step is
recorded with monotonic timestamps and its outcome: ok, stale, locklost, failed (an error saying
nothing was applied) or unknown (connection lost, or -UNAVAILABLE for a command in flight). The
checker then reads the final counter and log straight from Redis and checks the whole history
(check()); each violation is tagged [safety], [contract] or [liveness]:

  1. counter: acknowledged increments wrote distinct values; every value 1..final was written by
     an acknowledged or in-doubt SET; acknowledged <= final <= acknowledged + unknown
  2. log: tokens never go backwards, values strictly increase, every entry was an acknowledged or
     in-doubt RPUSH (never a refused one), every acknowledged RPUSH is there exactly once; a
     transaction's SET and RPUSH are applied both or neither
  3. tokens: unique, and a grant that started after another completed has a larger token; the
     final high-water mark is at least the largest token granted
  4. reads: a GET never returns less than a SET acknowledged before the GET was sent
  5. leases [contract]: a write sent after its NORENEW lease ran out (counted from the acquire's
     reply) is never acknowledged; a write sent into a sidecar frozen longer than its lease is
     never acknowledged
  6. liveness: no command waits CALL_TIMEOUT (15 s) for its reply
  7. rollbacks: a SET sent after a store rollback, under a grant made between the point the
     store went back to and the rollback, is never acknowledged (across_rollbacks())

Nemeses (NEMESES): freeze, stall, kill-sidecar, kill-redis, clock, partition (a network namespace
with a veth pair and iptables when running as root; otherwise Redis SIGSTOPped past the lease),
kill-etcd-leader (ETCD_NEMESES: with the etcd backend and 3 members), rollback-locks
(LOCK_REDIS_NEMESES: with --backend redis-apart, the locks in a Redis of their own, rolled back
to an older snapshot as a failover to a lagging replica would), rollback-store (STORE_NEMESES:
the store's Redis cut back to an earlier point of its AOF, as a failover to a lagging replica
would: with the default --backend redis it holds locks, marks and data, with the others marks
and data; mixed draws it only in the long form), kill-postgres (PG_NEMESES: with
--pg, a PostgreSQL store of both sidecars and SQL workers on lock P over the HTTP API, checked
like L), kill-http-store (HTTP_STORE_NEMESES: with --http-store, an HTTP store in front of
ledger.py and ledger workers on lock H, checked like L), and mixed. Used by test_safety.py
(short form, CTest label `safety`) and run_long.sh (long form):

    workload.py --nemesis mixed --faults 200      # prints a scorecard; exit 1 on a violation

Every process binds 127.0.0.1, or an address of a veth pair inside a network namespace the
workload creates and deletes. Every loop is bounded in count and time; everything is torn down in
a finally, even when a check fails.
"""

import argparse
import collections
import glob
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "integration")))
import harness  # noqa: E402  (re-executes under /usr/bin/python3 when redis-py is missing)
from harness import Err  # noqa: E402

LOCK = "L"
COUNTER = "counter"
LOG = "counter:log"
SESSION_TTL_MS = 600        # sidecar lease (renewed every 200 ms)
NORENEW_TTL_MS = 500        # fixed lease of the NORENEW workers
WAIT_MS = 2000
CALL_TIMEOUT = 15.0         # no command waits this long unless something is wedged (the longest
                            # legitimate wait: WAIT 2 s under a clock slowed x0.2 = 10 s)
PROTECT = 'protect:\n  - { store: redis, keys: "counter*", lock: "L" }\n'
REFUSED = ("stale", "locklost")
MAX_WORKER_ITERATIONS = 1000000
CHURN_LOCKS = 4             # locks bg0..bg3 of the churn workers, checked like L
CHURN_WAIT_MS = 200
CHURN_MODES = {"a": ("plain", "pipe"), "b": ("multi", "plain")}  # churn workers per sidecar
BANK_ACCOUNTS = 4           # acct:{k0}..acct:{k3}, each under its own lock k0..k3
BANK_INITIAL = 1000         # each account's balance at the start; transfers keep the sum
BANK_MODES = ("multi", "mset")  # bank workers per sidecar: how a transfer writes both balances
PG_LOCK = "P"               # with a PostgreSQL store (--pg): the lock of the SQL workers
HTTP_LOCK = "H"             # with an HTTP store (--http-store): the lock of the ledger workers
HTTP_WORKERS = 2            # SQL workers, and ledger workers, per sidecar
PG_STORE = '{ name: pg, url: "%s", pool_size: 4, timeout_ms: 5000 }'
HTTP_STORE = '{ name: svc, url: "%s" }'
PG_SCHEMA = ("CREATE TABLE fg_counter (id int PRIMARY KEY, v bigint NOT NULL); "
             "INSERT INTO fg_counter VALUES (1, 0); "
             "CREATE TABLE fg_log (seq bigserial PRIMARY KEY, entry text NOT NULL)")
# How a worker sends its SET and RPUSH: one after the other ("plain"), in MULTI/EXEC ("multi"),
# or both in one send ("pipe": a run of fenced writes, which fencegate sends as one transaction).
# (NORENEW lease, write mode) of worker i of a sidecar, cyclically.
ROLES = ((True, "plain"), (False, "pipe"), (False, "multi"), (True, "pipe"), (False, "plain"),
         (True, "multi"))

FAKETIME_LIBS = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") +
                       glob.glob("/usr/lib/faketime/libfaketime.so.1"))


def faketime_preload():
    """LD_PRELOAD for a sidecar under libfaketime. An ASan build needs its runtime first in the
    list, so it is named before libfaketime when the binary links it."""
    libs = [FAKETIME_LIBS[0]]
    try:
        out = subprocess.run(["ldd", harness.FENCEGATE_BIN], capture_output=True,
                             timeout=10).stdout.decode()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("libasan.so") and len(parts) >= 3:
            libs.insert(0, parts[2])
    return " ".join(libs)


def now():
    return time.monotonic()


def _pdeathsig_prefix():
    """setpriv(1) --pdeathsig KILL: a server started here dies with the workload even when the
    workload itself is killed (SIGKILL by a ctest timeout), instead of lingering."""
    for d in ("/usr/bin", "/bin"):
        if os.access(os.path.join(d, "setpriv"), os.X_OK):
            return [os.path.join(d, "setpriv"), "--pdeathsig", "KILL"]
    return []


DIE_WITH_US = _pdeathsig_prefix()


def spin(seconds):
    """Busy-waits (sub-millisecond delays that time.sleep() would round up)."""
    end = now() + seconds
    while now() < end:
        pass


# ---- Redis with an append-only file ---------------------------------------------------------

class AofRedis(harness.RedisServer):
    """harness.RedisServer with `--appendonly yes --appendfsync always` (an acknowledged write
    survives kill -9), optionally also bound to a veth address, restartable on its port. With
    aof=False it keeps nothing on disk but the snapshots snapshot() takes, and restore() puts
    it back to the last one."""

    def __init__(self, binds=("127.0.0.1",), aof=True):
        super().__init__()
        self.binds = list(binds)
        self.aof = aof
        self.paused = False
        self.starts = 0

    def url_for(self, host):
        return "redis://%s:%d" % (host, self.port)

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "redis already running"
        argv = [harness.REDIS_SERVER, "--save", "", "--appendonly", "yes" if self.aof else "no",
                "--appendfsync", "always", "--auto-aof-rewrite-percentage", "0",
                "--bind", " ".join(self.binds),
                "--port", str(self.port), "--dir", self.dir, "--logfile", self.log_path,
                "--daemonize", "no", "--maxmemory-policy", "noeviction"]
        argv = DIE_WITH_US + argv
        if len(self.binds) > 1:
            # The second address is the host end of a veth pair the workload created; only the
            # namespace at its other end can reach it.
            argv += ["--protected-mode", "no"]
        self.proc = subprocess.Popen(argv, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=harness.clean_env())
        self.starts += 1
        deadline = now() + 20
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("redis-server :%d exited with %s:\n%s" % (
                    self.port, self.proc.returncode, harness._tail(self.log_path, 30)))
            if harness._raw_ping(self.port):
                return self
            if now() >= deadline:
                raise AssertionError("redis-server :%d not ready in 20 s" % self.port)
            time.sleep(0.02)

    def snapshot(self):
        """SAVE, and keep the RDB aside as the state restore() goes back to."""
        c = self.client()
        try:
            c.save()
        finally:
            c.close()
        os.replace(os.path.join(self.dir, "dump.rdb"), os.path.join(self.dir, "snapshot.rdb"))

    def restore(self):
        """kill -9, then start again from the last snapshot: what a failover to a replica that
        lagged since then leaves (keys written since are gone, keys deleted since are back with
        their old expiry, and those whose expiry passed are dropped as the RDB loads)."""
        self.kill()
        shutil.copyfile(os.path.join(self.dir, "snapshot.rdb"), os.path.join(self.dir, "dump.rdb"))
        self.start()

    def aof_end(self):
        """(path, size) of the AOF's increment file now: every write acknowledged so far is in
        it (fsync always: Redis writes it before it replies). No rewrite moves it (started with
        automatic rewrites off)."""
        d = os.path.join(self.dir, "appendonlydir")
        with open(os.path.join(d, "appendonly.aof.manifest")) as f:
            incr = [ln.split()[1] for ln in f if ln.split()[-1:] == ["i"]]
        path = os.path.join(d, incr[-1])
        return path, os.path.getsize(path)

    def cut_back(self, end):
        """With Redis killed: cut its AOF back to `end` (aof_end()), so that it starts as it was
        then; a command cut in two is dropped as it loads (aof-load-truncated)."""
        assert self.proc.poll() is not None, "redis still running"
        path, size = end
        assert self.aof_end()[0] == path, "the AOF was rewritten since"
        os.truncate(path, size)

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        if self.paused and self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def cleanup(self):
        self.resume()
        super().cleanup()


# ---- network namespace ----------------------------------------------------------------------

def _run(*argv, check=True):
    p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv), p.returncode,
                                                 p.stderr.decode("utf-8", "replace").strip()))
    return p


class CrashablePostgres(harness.PostgresServer):
    """harness.PostgresServer bound to `binds`, trusting connections from `clients` too, that
    can also crash: kill -9 of the postmaster and every backend at once, as a machine losing the
    process would (harness's kill() leaves the backends to notice on their own, and a new
    postmaster will not start on shared memory they still hold)."""

    def __init__(self, binds, clients=()):
        super().__init__()
        self.listen = ",".join(binds)
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
            for host in clients:
                f.write("host all all %s/32 trust\n" % host)

    def url_for(self, host):
        return "postgresql://%s@%s:%d/postgres" % (self.user, host, self.port)

    def processes(self):
        """The postmaster and its backends: every process working in the data directory."""
        out = []
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and os.readlink("/proc/%s/cwd" % p) == self.data:
                    out.append(int(p))
            except OSError:
                pass
        return out

    def crash(self, pids):
        """kill -9 `pids` (processes() taken beforehand, so that the kill lands at once), then
        any other process of the server, until none is left."""
        deadline = now() + 10
        while pids and now() < deadline:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
            pids = self.processes()
        self.proc.wait(harness.STOP_TIMEOUT)


class Ledger:
    """ledger.py, the HTTP service behind the HTTP store: a counter and a log in a JSON file it
    replaces atomically before answering a write; it refuses a token below the highest it has
    applied. kill() is kill -9; start() again carries on from the file."""

    def __init__(self, binds, tmp):
        self.port = harness.free_port()
        self.binds = list(binds)
        self.state_path = os.path.join(tmp, "ledger.json")
        self.proc = None

    def url_for(self, host):
        return "http://%s:%d/svc" % (host, self.port)

    def start(self):
        self.proc = subprocess.Popen(
            DIE_WITH_US + [sys.executable, os.path.join(HERE, "ledger.py"), "--port",
                           str(self.port), "--bind", ",".join(self.binds), "--state",
                           self.state_path],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if self.proc.stdout.readline().strip() != b"ready":   # bound, or exited
            raise AssertionError("ledger.py on port %d did not start (exit %s)" % (
                self.port, self.proc.poll()))
        return self

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait(10)
            self.proc.stdout.close()

    def state(self):
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {"v": 0, "log": [], "max": 0, "stale": 0}

    def cleanup(self):
        self.kill()


class NetNS:
    """A network namespace joined to the host by a veth pair on a private /30 picked at random in
    10.213.0.0/16 (checked unused). The sidecar inside reaches Redis (and etcd) at host_ip; cut()
    drops the traffic to and from the given ports inside the namespace only (the workers'
    connections to the sidecar stay up), heal() removes the rules. destroy() deletes the pair and
    the namespace."""

    _seq = 0

    def __init__(self):
        NetNS._seq += 1
        self.name = "fgsafe-%d-%d" % (os.getpid(), NetNS._seq)
        tag = "%x%x" % (os.getpid() & 0xfffff, NetNS._seq)
        self.veth_host = ("fsh" + tag)[:15]
        self.veth_ns = ("fsn" + tag)[:15]
        self.created = False
        self.cut_port = None

    @staticmethod
    def reason_unavailable():
        """None when network namespaces can be used here, else why not."""
        if os.geteuid() != 0:
            return "not root"
        for tool in ("ip", "iptables"):
            if not any(os.access(os.path.join(d, tool), os.X_OK)
                       for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
                return "%s not found" % tool
        probe = NetNS()
        try:
            probe.create()
            probe.cut(1)
            probe.heal()
        except Exception as e:  # noqa: BLE001 - any failure means: fall back
            return "cannot set up a network namespace: %s" % e
        finally:
            probe.destroy()
        return None

    @staticmethod
    def remove_stale():
        """Deletes namespaces an earlier, killed workload left behind (ours: fgsafe-PID-N with
        PID no longer running)."""
        p = _run("ip", "netns", "list", check=False)
        for line in p.stdout.decode().splitlines():
            name = line.split()[0] if line.split() else ""
            parts = name.split("-")
            if len(parts) == 3 and parts[0] == "fgsafe" and parts[1].isdigit():
                if not os.path.exists("/proc/%s" % parts[1]):
                    _run("ip", "netns", "del", name, check=False)

    def create(self):
        NetNS.remove_stale()
        used = _run("ip", "-o", "-4", "addr", check=False).stdout.decode()
        rng = random.Random()
        for _ in range(100):
            b, c = rng.randrange(0, 256), rng.randrange(0, 64) * 4
            host_ip, ns_ip = "10.213.%d.%d" % (b, c + 1), "10.213.%d.%d" % (b, c + 2)
            if (" %s/" % host_ip) not in used and (" %s/" % ns_ip) not in used:
                break
        else:
            raise RuntimeError("no free /30 in 10.213.0.0/16")
        self.host_ip, self.ns_ip = host_ip, ns_ip
        _run("ip", "netns", "add", self.name)
        self.created = True
        _run("ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_ns)
        _run("ip", "link", "set", self.veth_ns, "netns", self.name)
        _run("ip", "addr", "add", host_ip + "/30", "dev", self.veth_host)
        _run("ip", "link", "set", self.veth_host, "up")
        _run("ip", "-n", self.name, "addr", "add", ns_ip + "/30", "dev", self.veth_ns)
        _run("ip", "-n", self.name, "link", "set", self.veth_ns, "up")
        _run("ip", "-n", self.name, "link", "set", "lo", "up")
        return self

    def exec_prefix(self):
        return ["ip", "netns", "exec", self.name]

    def cut(self, *ports):
        ipt = self.exec_prefix() + ["iptables", "-w", "5"]
        for port in ports:
            _run(*(ipt + ["-A", "OUTPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"]))
            _run(*(ipt + ["-A", "INPUT", "-p", "tcp", "--sport", str(port), "-j", "DROP"]))
        self.cut_port = ports

    def heal(self):
        if self.created:
            _run(*(self.exec_prefix() + ["iptables", "-w", "5", "-F"]), check=False)
        self.cut_port = None

    def destroy(self):
        if not self.created:
            return
        self.heal()
        _run("ip", "link", "del", self.veth_host, check=False)
        _run("ip", "netns", "del", self.name, check=False)
        self.created = False


# ---- sidecars -------------------------------------------------------------------------------

class HttpConn(http.client.HTTPConnection):
    """A keep-alive HTTP connection to a sidecar's HTTP endpoint, JSON in and out."""

    def __init__(self, host, port, timeout):  # noqa: D107
        super().__init__(host, port, timeout=timeout)
        self.connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def json(self, method, path, body=None, token=None, on_sent=None, headers=None):
        """-> (status, the JSON body as a dict); raises on a broken connection. on_sent runs
        once the request is written."""
        headers = dict(headers or {}, **{"Content-Type": "application/json"})
        if token is not None:
            headers["Fencing-Token"] = str(token)
        self.request(method, path, body=None if body is None else json.dumps(body).encode(),
                     headers=headers)
        if on_sent is not None:
            on_sent()
        r = self.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, {"error": "not_json", "message": raw[:200].decode("latin-1")}

    def abort(self):
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


CONN_ERRORS = (OSError, EOFError, ValueError, http.client.HTTPException)


class Conn(harness.RawConn):
    """harness.RawConn to any host (the sidecar in a namespace listens on its veth address)."""

    def __init__(self, host, port, timeout):  # noqa: D107 - same fields as RawConn
        self.port = port
        self.sock = socket.create_connection((host, port), timeout=min(timeout, 2.0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.eof = False

    def abort(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Sidecar:
    """One fencegate on fixed ports, started again on the same ports after a kill; optionally
    inside a network namespace, under libfaketime, with a protect-rule config."""

    def __init__(self, wl, name, config=None, netns=None):
        self.wl = wl
        self.name = name
        self.netns = netns
        self.host = netns.ns_ip if netns else "127.0.0.1"
        self.redis_host = netns.host_ip if netns else "127.0.0.1"
        self.resp_port = harness.free_port()
        self.http_port = harness.free_port()
        self.config = config
        self.fg = None
        self.incarnations = []
        self.frozen = False
        self.faketime = None   # FAKETIME spec of the running incarnation, or None

    def start(self, faketime=None):
        args = ["--resp", "%s:%d" % (self.host, self.resp_port),
                "--http", "%s:%d" % (self.host, self.http_port),
                "--session-ttl-ms", str(SESSION_TTL_MS), "--shutdown-grace-ms", "2000"]
        if self.config:
            args += ["--config", self.config]
        backend = self.wl.etcd or self.wl.lock_redis
        if backend:  # after the upstream's: this one wins
            args += ["--backend", backend.url_for(self.redis_host)]
        env = None
        if faketime:
            # CLOCK_MONOTONIC is faked too (FAKETIME_DONT_FAKE_MONOTONIC unset): leases and
            # libevent timers follow the skewed clock.
            env = {"LD_PRELOAD": faketime_preload(), "FAKETIME": faketime,
                   "FAKETIME_NO_CACHE": "1"}
        fg = harness.Fencegate(args=args, upstream=self.wl.redis.url_for(self.redis_host),
                               resp_port=self.resp_port, http_port=self.http_port, env=env,
                               with_ports=False)
        # Neither `ip netns exec` nor setpriv may run under libfaketime (or an ASan preload): the
        # variables are set by env(1), right before fencegate. Each program execs the next, so
        # the pid is fencegate's.
        pre = ["env"] + ["%s=%s" % kv for kv in sorted((env or {}).items())] if env else []
        for k in env or {}:
            fg.env.pop(k, None)
        fg.argv = (self.netns.exec_prefix() if self.netns else []) + DIE_WITH_US + pre + fg.argv
        fg.start()
        self.fg = fg
        self.incarnations.append(fg)
        self.faketime = faketime
        self.frozen = False
        return self

    def ready(self):
        try:
            with socket.create_connection((self.host, self.resp_port), timeout=0.5):
                pass
            c = http.client.HTTPConnection(self.host, self.http_port, timeout=1)
            try:
                c.request("GET", "/readyz")
                return c.getresponse().status == 200
            finally:
                c.close()
        except OSError:
            return False

    def wait_ready(self, timeout=15.0):
        deadline = now() + timeout
        while not self.ready():
            if not self.fg.alive():
                self.fg._collect()
                raise AssertionError("sidecar %s exited with %s:\n%s" % (
                    self.name, self.fg.returncode, self.fg.stderr_text))
            if now() >= deadline:
                raise AssertionError("sidecar %s not ready in %.0f s:\n%s" % (
                    self.name, timeout, harness._tail(self.fg.stderr_path, 40)))
            time.sleep(0.03)
        return self

    def freeze(self):
        self.fg.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self):
        if self.frozen and self.fg.alive():
            self.fg.signal(signal.SIGCONT)
        self.frozen = False

    def kill(self):
        self.thaw()
        if self.fg.alive():
            self.fg.proc.kill()
            self.fg.proc.wait(15)
        self.fg._collect()

    def metric(self, name):
        """One counter of the running incarnation's /metrics (0 when it cannot be read)."""
        c = http.client.HTTPConnection(self.host, self.http_port, timeout=5)
        try:
            c.request("GET", "/metrics")
            return harness.parse_metrics(c.getresponse().read().decode()).get(name, 0)
        except (OSError, http.client.HTTPException):
            return 0
        finally:
            c.close()

    def stop(self):
        """SIGTERM and wait (SIGKILL after 15 s). Returns the exit code."""
        self.thaw()
        try:
            return self.fg.stop(expect_rc=None)
        except AssertionError:
            return None

    def metrics(self):
        c = http.client.HTTPConnection(self.host, self.http_port, timeout=3)
        try:
            c.request("GET", "/metrics")
            return harness.parse_metrics(c.getresponse().read().decode())
        finally:
            c.close()

    def cleanup(self):
        self.thaw()
        for fg in self.incarnations:
            fg.cleanup()

    def log_tail(self, lines=60):
        out = []
        for i, fg in enumerate(self.incarnations[-3:]):
            fg._collect()
            out.append("-- sidecar %s incarnation %d (%s) --\n%s" % (
                self.name, len(self.incarnations) - min(3, len(self.incarnations)) + i,
                " ".join(fg.argv), harness._tail(fg.stderr_path, lines)))
        return "\n".join(out)


# ---- history --------------------------------------------------------------------------------

def classify(reply):
    """A reply (or an exception) -> outcome of a write or an acquire."""
    if isinstance(reply, BaseException):
        return "unknown"
    if isinstance(reply, Err):
        if reply.startswith("STALE"):
            return "stale"
        if reply.startswith("LOCKLOST"):
            return "locklost"
        if reply.startswith("NOLOCK"):
            return "nolock"
        if reply.startswith("LOCKED"):
            return "locked"
        if reply.startswith("UNAVAILABLE"):
            # In-flight commands of a broken upstream connection may have been applied: unknown.
            # The replies that say the command never reached the store are failures.
            if any(s in reply for s in ("not applied", "not acquired", "has not read")):
                return "failed"
            return "unknown"
        return "error"
    return "ok"


class Arm:
    """A request from a nemesis to the next worker of `sidecar` that holds the lock and has read
    the counter: 'sleep' (stall `seconds`) or 'rendezvous' (signal `reached`, wait for `go`)."""

    def __init__(self, kind, sidecar, seconds=0.0, norenew=None):
        self.kind = kind
        self.sidecar = sidecar
        self.seconds = seconds
        self.norenew = norenew      # None: any worker; True/False: only that kind of worker
        self.only = None            # or only this worker
        self.reached = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()
        self.sent = threading.Event()
        self.on_sent = None         # run by the worker right after it sent the write
        self.worker = None
        self.token = None
        self.set_outcome = None
        self.set_event = None


class Worker(threading.Thread):

    def __init__(self, wl, wid, sidecar, norenew, mode):
        super().__init__(name="worker-%s" % wid, daemon=True)
        self.lock, self.counter, self.log_key, self.wait_ms = LOCK, COUNTER, LOG, WAIT_MS
        self.wl = wl
        self.wid = wid
        self.sidecar = sidecar
        self.norenew = norenew
        self.mode = mode
        self.conn = None
        self.arm = None
        self.iterations = 0
        self.parked = False
        self.rng = random.Random(wl.seed * 1000 + sum(map(ord, wid)))

    def rec(self, **ev):
        ev["w"] = self.wid
        ev["sc"] = self.sidecar.name
        ev["lock"] = self.lock
        self.wl.history.append(ev)
        return ev

    def drop(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def call(self, *args):
        return self.conn.call(*args, timeout=CALL_TIMEOUT)

    def run(self):
        deadline = self.wl.hard_deadline
        while not self.wl.stop.is_set() and self.iterations < MAX_WORKER_ITERATIONS \
                and now() < deadline:
            if self.conn is None:
                try:
                    self.conn = self.connect()
                except OSError:
                    time.sleep(0.05)
                    continue
            self.iterations += 1
            try:
                self.iteration()
            except CONN_ERRORS:
                self.drop()
            finally:
                if self.arm is not None:
                    self.arm.done.set()
                    self.arm = None
        self.drop()

    def connect(self):
        return Conn(self.sidecar.host, self.sidecar.resp_port, CALL_TIMEOUT)

    def pick_lock(self):
        """The lock of the next turn (L for the workers; Churn picks one of its own)."""

    def iteration(self):
        opts = ["TTL", NORENEW_TTL_MS, "NORENEW"] if self.norenew else []
        self.pick_lock()
        if self.wl.solo is not None and self.wl.solo is not self and self.lock == LOCK:
            self.parked = True
            try:
                self.wl.gate.wait(15)
            finally:
                self.parked = False
        t0 = now()
        try:
            r = self.call("FENCE.ACQUIRE", self.lock, "WAIT", self.wait_ms, *opts)
        except (OSError, EOFError, ValueError) as e:
            self.rec(op="acquire", t0=t0, t1=now(), out="unknown", msg=repr(e),
                     norenew=self.norenew)
            raise
        t1 = now()
        out = "ok" if isinstance(r, int) else classify(r)
        self.rec(op="acquire", t0=t0, t1=t1, out=out, token=r if out == "ok" else None,
                 msg=None if out == "ok" else str(r)[:200], norenew=self.norenew)
        if out != "ok":
            if out != "locked":
                time.sleep(0.05)
            if out == "unknown":
                self.drop()
            return
        token = r
        t0 = now()
        try:
            r = self.call("GET", self.counter)
        except (OSError, EOFError, ValueError) as e:
            self.rec(op="get", t0=t0, t1=now(), token=token, out="unknown", msg=repr(e))
            raise
        t1 = now()
        if isinstance(r, Err):
            self.rec(op="get", t0=t0, t1=t1, token=token, out=classify(r), msg=str(r)[:200])
            self.drop()   # the sidecar closes a connection whose upstream broke
            return
        v = int(r) if r is not None else 0
        self.rec(op="get", t0=t0, t1=t1, token=token, out="ok", value=v)
        if self.mode == "multi":
            if not self.transaction(token, v + 1):
                return
        elif self.mode == "pipe":
            if not self.pipelined(token, v + 1):
                return
        else:
            self.stall_point(token)
            if not self.write("set", token, v + 1, "SET", self.counter, str(v + 1)):
                return
            if not self.write("rpush", token, v + 1, "RPUSH", self.log_key,
                              "%d:%d" % (token, v + 1)):
                return
        t0 = now()
        try:
            r = self.call("FENCE.RELEASE", self.lock)
        except (OSError, EOFError, ValueError) as e:
            self.rec(op="release", t0=t0, t1=now(), token=token, out="unknown", msg=repr(e))
            raise
        self.rec(op="release", t0=t0, t1=now(), token=token, out="ok" if r in (0, 1) else
                 classify(r), value=r if isinstance(r, int) else None)
        if self.wl.think_ms:
            time.sleep(self.rng.uniform(0, self.wl.think_ms) / 1000.0)

    def write(self, kind, token, value, *cmd):
        """Sends one write; records it; returns False when the connection is gone."""
        t0 = now()
        try:
            if kind == "set" and self.arm is not None:
                self.conn.cmd(*cmd)
                self.write_sent()
                r = self.conn.read_reply(CALL_TIMEOUT)
            else:
                r = self.call(*cmd)
        except (OSError, EOFError, ValueError) as e:
            ev = self.rec(op=kind, t0=t0, t1=now(), token=token, value=value, out="unknown",
                          msg=repr(e)[:200])
            self.note_arm(kind, ev)
            self.drop()
            return False
        out = classify(r)
        ev = self.rec(op=kind, t0=t0, t1=now(), token=token, value=value, out=out,
                      msg=None if out == "ok" else str(r)[:200])
        self.note_arm(kind, ev)
        if out == "unknown":
            self.drop()
            return False
        return True

    def pipelined(self, token, value):
        """SET and RPUSH in one send, after the stall point; each is recorded with its own reply.
        Returns False when the connection is gone."""
        writes = (("set", "SET", self.counter, str(value)),
                  ("rpush", "RPUSH", self.log_key, "%d:%d" % (token, value)))
        self.stall_point(token)
        t0 = now()
        replies = []
        try:
            self.conn.send(b"".join(harness.encode(*w[1:]) for w in writes))
            if self.arm is not None:
                self.write_sent()   # both writes are in flight
            for _ in writes:
                replies.append((self.conn.read_reply(CALL_TIMEOUT), now()))
        except (OSError, EOFError, ValueError) as e:
            replies += [(e, now())] * (len(writes) - len(replies))
        gone = False
        for w, (r, t1) in zip(writes, replies):
            out = classify(r)
            ev = self.rec(op=w[0], t0=t0, t1=t1, token=token, value=value, out=out,
                          msg=None if out == "ok" else repr(r)[:200], pipe=True)
            self.note_arm(w[0], ev)
            gone = gone or out == "unknown"
        if gone:
            self.drop()
            return False
        return True

    def transaction(self, token, value):
        """MULTI, SET, RPUSH (queued in the sidecar), then the stall point, then EXEC: both writes
        are recorded with EXEC's send time and outcome. Returns False when the connection is
        gone."""
        push = "%d:%d" % (token, value)
        queued = []
        for cmd in (("MULTI",), ("SET", self.counter, str(value)),
                    ("RPUSH", self.log_key, push)):
            t0 = now()
            try:
                queued.append(self.call(*cmd))
            except (OSError, EOFError, ValueError) as e:
                self.rec(op="queue", t0=t0, t1=now(), token=token, out="unknown",
                         msg="%s: %r" % (cmd[0], e))
                raise
        self.stall_point(token)
        t0 = now()
        try:
            self.conn.cmd("EXEC")
            if self.arm is not None:
                self.write_sent()
            r = self.conn.read_reply(CALL_TIMEOUT)
        except (OSError, EOFError, ValueError) as e:
            r = e
        t1 = now()
        if isinstance(r, list) and len(r) == 2:
            outs = [classify(x) for x in r]
        elif isinstance(r, Err) and r.startswith("EXECABORT"):
            why = [classify(q) for q in queued[1:] if isinstance(q, Err)]
            o = next((x for x in why if x in REFUSED), "failed")
            outs = [o, o]
        elif r is None:
            outs = ["failed", "failed"]   # aborted by a WATCH (the workers never WATCH)
        else:
            o = classify(r)
            outs = [o, o]
        msg = None if outs == ["ok", "ok"] else repr(r)[:200]
        evs = []
        for (kind, out) in (("set", outs[0]), ("rpush", outs[1])):
            evs.append(self.rec(op=kind, t0=t0, t1=t1, token=token, value=value, out=out,
                                msg=msg, txn=True, queued=[str(q)[:80] for q in queued]))
        self.note_arm("set", evs[0])
        if "unknown" in outs:
            self.drop()
            return False
        return True

    def write_sent(self):
        """The armed write is in flight: the nemesis may strike now. Its on_sent runs here, on
        this thread, so that a kill lands within the intended fraction of a millisecond instead of
        whenever the nemesis thread gets the interpreter back."""
        if self.arm.on_sent is not None:
            self.arm.on_sent()
        self.arm.sent.set()

    def note_arm(self, kind, ev):
        if kind == "set" and self.arm is not None:
            self.arm.set_outcome = ev["out"]
            self.arm.set_event = ev
            ev["arm"] = self.arm.kind

    def stall_point(self, token):
        if self.lock not in (LOCK, PG_LOCK, HTTP_LOCK):
            return
        a = self.wl.take_arm(self)
        if a is None:
            return
        self.arm = a
        a.worker = self
        a.token = token
        if a.kind == "sleep":
            time.sleep(a.seconds)
        else:
            a.reached.set()
            a.go.wait(15)


class Churn(Worker):
    """A worker on the churn locks: each turn takes one of bg0..bg3 at random (WAIT 200, a
    renewed lease) and runs the read-modify-write on that lock's own counter and log, which the
    hash-tag rule fences. No nemesis arms it; it runs through every fault."""

    def __init__(self, wl, wid, sidecar, mode):
        super().__init__(wl, wid, sidecar, norenew=False, mode=mode)
        self.name = "churn-" + wid
        self.wait_ms = CHURN_WAIT_MS

    def pick_lock(self):
        self.lock = "bg%d" % self.rng.randrange(CHURN_LOCKS)
        self.counter, self.log_key = churn_keys(self.lock)


class HttpWorker(Worker):
    """The same turn on a lock of its own through the HTTP API and a store behind the sidecar:
    POST /v1/locks/<lock> (WAIT 200), read the counter through the store, then write the counter
    and the log entry "T:v+1" in one request (both or neither, checked like MULTI), every request
    with Fencing-Token: T; DELETE /v1/locks/<lock>. Checked like L from the store's final state.
    Between the read and the write is a stall point like L's: the nemeses that stop a worker there
    (all but stall) take one of these when it gets there first. A slow worker's write takes 20 ms
    more in the store: a window for the nemesis that kills the store. Subclasses say how to read
    and write their store and how its answers read as outcomes."""

    def __init__(self, wl, wid, sidecar, lock, slow):
        super().__init__(wl, wid, sidecar, norenew=False, mode="http")
        self.lock = lock
        self.slow = slow
        self.writing = False   # a write is in flight (the store-killing nemeses wait for one)

    def connect(self):
        return HttpConn(self.sidecar.host, self.sidecar.http_port, CALL_TIMEOUT)

    def iteration(self):
        t0 = now()
        try:
            st, doc = self.conn.json("POST", "/v1/locks/" + self.lock, {"wait_ms": CHURN_WAIT_MS})
        except CONN_ERRORS as e:
            self.rec(op="acquire", t0=t0, t1=now(), out="unknown", msg=repr(e), norenew=False)
            raise
        out = "ok" if st == 200 else "locked" if st == 409 else "failed"
        token = doc.get("token") if out == "ok" else None
        self.rec(op="acquire", t0=t0, t1=now(), out=out, token=token, norenew=False,
                 msg=None if out == "ok" else "%d %s" % (st, doc))
        if out != "ok":
            if out != "locked":
                time.sleep(0.05)
            return
        try:
            self.turn(token)
        finally:
            self.release(token)

    def release(self, token):
        """DELETE under this grant's token, on a new connection when this one broke: a grant
        left in the sidecar's HTTP session would be renewed for as long as the sidecar runs."""
        for again in (False, True):
            t0 = now()
            try:
                if again:
                    self.drop()
                    self.conn = self.connect()
                st, doc = self.conn.json("DELETE", "/v1/locks/" + self.lock, token=token)
            except CONN_ERRORS as e:
                if again:
                    self.rec(op="release", t0=t0, t1=now(), token=token, out="unknown",
                             msg=repr(e))
                    raise
                continue
            self.rec(op="release", t0=t0, t1=now(), token=token, out="ok" if st in (200, 404, 409)
                     else "error", value=1 if st == 200 else 0)
            return

    def turn(self, token):
        t0 = now()
        try:
            st, doc, v = self.read(token)
        except CONN_ERRORS as e:
            self.rec(op="get", t0=t0, t1=now(), token=token, out="unknown", msg=repr(e))
            raise
        if st != 200:
            self.rec(op="get", t0=t0, t1=now(), token=token, out=self.outcome(st, doc),
                     msg="%d %s" % (st, doc))
            return
        self.rec(op="get", t0=t0, t1=now(), token=token, out="ok", value=v)
        self.stall_point(token)
        t0 = now()
        broken = None
        self.writing = True
        try:
            st, doc = self.write(token, v + 1, self.write_sent if self.arm is not None else None)
            out, msg = self.outcome(st, doc), "%d %s" % (st, doc)
        except CONN_ERRORS as e:
            broken, out, msg = e, "unknown", repr(e)
        finally:
            self.writing = False
        for kind in ("set", "rpush"):
            ev = self.rec(op=kind, t0=t0, t1=now(), token=token, value=v + 1, out=out, txn=True,
                          msg=None if out == "ok" else msg[:200])
            self.note_arm(kind, ev)
        if broken is not None:
            raise broken


class SqlWorker(HttpWorker):
    """HttpWorker on lock P and the PostgreSQL store (--pg): the counter is a row of fg_counter,
    the log the table fg_log (by seq), read and written with POST /v1/stores/pg/sql; the write is
    one batch (one transaction) of an UPDATE and an INSERT, and a slow worker's batch ends with
    SELECT pg_sleep(0.02), after its COMMIT was sent."""

    def __init__(self, wl, wid, sidecar, slow):
        super().__init__(wl, wid, sidecar, PG_LOCK, slow)

    def sql(self, token, *statements, on_sent=None):
        return self.conn.json("POST", "/v1/stores/pg/sql", {
            "lock": self.lock, "statements": [{"sql": q, "params": p} for q, p in statements]},
            token, on_sent)

    def read(self, token):
        st, doc = self.sql(token, ("SELECT v FROM fg_counter WHERE id = 1", []))
        return st, doc, int(doc["results"][0]["rows"][0][0]) if st == 200 else None

    def write(self, token, v, on_sent):
        return self.sql(token, ("UPDATE fg_counter SET v = $1 WHERE id = 1", [v]),
                        ("INSERT INTO fg_log (entry) VALUES ($1)", ["%d:%d" % (token, v)]),
                        *([("SELECT pg_sleep(0.02)", [])] if self.slow else []), on_sent=on_sent)

    @staticmethod
    def outcome(status, doc):
        """An answer of the SQL endpoint -> an outcome (README, "PostgreSQL stores")."""
        err = doc.get("error")
        if status == 200:
            return "ok"
        if status == 409:
            return {"stale_token": "stale", "lock_lost": "locklost"}.get(err, "failed")
        if status == 503:
            return "unknown" if err == "outcome_unknown" else "failed"
        if status in (400, 422):
            return "failed"   # rolled back, or refused before PostgreSQL
        return "error"


class LedgerWorker(HttpWorker):
    """HttpWorker on lock H and the HTTP store "svc" (--http-store), ledger.py behind it: GET
    /v1/stores/svc/http/counter reads, POST /v1/stores/svc/http/write {"v", "entry"} writes both
    at once; the ledger itself refuses a token below the highest it applied."""

    def __init__(self, wl, wid, sidecar, slow):
        super().__init__(wl, wid, sidecar, HTTP_LOCK, slow)

    def read(self, token):
        st, doc = self.conn.json("GET", "/v1/stores/svc/http/counter", token=token,
                                 headers={"Fence-Lock": self.lock})
        return st, doc, int(doc["v"]) if st == 200 else None

    def write(self, token, v, on_sent):
        return self.conn.json("POST", "/v1/stores/svc/http/write",
                              {"v": v, "entry": "%d:%d" % (token, v), "slow": self.slow}, token,
                              on_sent, headers={"Fence-Lock": self.lock})

    @staticmethod
    def outcome(status, doc):
        """An answer through the HTTP store -> an outcome (README, "HTTP stores"): fencegate's
        refusals say nothing was forwarded; 502 store_unavailable that nothing was sent; 502
        outcome_unknown and 504 that the store may have applied it; 409 ledger_stale is the
        ledger's own refusal."""
        err = doc.get("error")
        if status == 200:
            return "ok"
        if status == 409:
            return {"stale_token": "stale", "ledger_stale": "stale",
                    "lock_lost": "locklost"}.get(err, "failed")
        if status == 502:
            return "failed" if err == "store_unavailable" else "unknown"
        if status == 504:
            return "unknown"
        if status in (400, 503):
            return "failed"
        return "error"


class Bank(threading.Thread):
    """A bank worker: each turn takes the locks of two accounts (lower first, WAIT 200), reads
    both balances, moves a random amount from one to the other (MULTI / SET / SET / EXEC, or one
    MSET whose keys are under both locks) and releases. Whatever fails or stays unknown, every
    transfer is applied whole or not at all and needs both locks, so the balances always sum to
    BANK_ACCOUNTS * BANK_INITIAL: a transfer applied on balances another holder changed since they
    were read (two holders at once, or a stale write let through) breaks the sum."""

    def __init__(self, wl, wid, sidecar, mode):
        super().__init__(name="bank-" + wid, daemon=True)
        self.wl = wl
        self.wid = wid
        self.sidecar = sidecar
        self.mode = mode
        self.conn = None
        self.rng = random.Random(wl.seed * 1000 + 11 + sum(map(ord, wid)))

    def rec(self, **ev):
        ev.update(w=self.wid, sc=self.sidecar.name)
        self.wl.history.append(ev)

    def call(self, *args):
        return self.conn.call(*args, timeout=CALL_TIMEOUT)

    def run(self):
        wl = self.wl
        while not wl.stop.is_set() and now() < wl.hard_deadline:
            try:
                if self.conn is None:
                    self.conn = Conn(self.sidecar.host, self.sidecar.resp_port, CALL_TIMEOUT)
                self.transfer()
            except (OSError, EOFError, ValueError) as e:  # the connection is gone
                self.rec(op="bank-conn", lock="bank", t0=now(), t1=now(), out="unknown",
                         msg=repr(e)[:200])
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                time.sleep(0.05)
        if self.conn is not None:
            self.conn.close()

    def transfer(self):
        i, j = sorted(self.rng.sample(range(BANK_ACCOUNTS), 2))
        held = []
        try:
            for n in (i, j):
                t0 = now()
                r = self.call("FENCE.ACQUIRE", "k%d" % n, "WAIT", CHURN_WAIT_MS)
                out = "ok" if isinstance(r, int) else classify(r)
                self.rec(op="acquire", lock="k%d" % n, t0=t0, t1=now(), out=out,
                         token=r if out == "ok" else None, norenew=False,
                         msg=None if out == "ok" else str(r)[:200])
                if out != "ok":
                    return
                held.append(n)
            r = self.call("MGET", bank_key(i), bank_key(j))
            if not (isinstance(r, list) and len(r) == 2 and None not in r):
                self.rec(op="bank-read", lock="bank", t0=now(), t1=now(), out=classify(r),
                         msg=repr(r)[:200])
                return
            a, b = int(r[0]), int(r[1])
            x = self.rng.randint(1, 50)
            t0 = now()
            queued = []
            if self.mode == "multi":
                for cmd in (("MULTI",), ("SET", bank_key(i), a - x), ("SET", bank_key(j), b + x)):
                    queued.append(self.call(*cmd))
                r = self.call("EXEC")
            else:
                r = self.call("MSET", bank_key(i), a - x, bank_key(j), b + x)
            if isinstance(r, Err) and r.startswith("EXECABORT"):  # say which SET was refused
                r = next((q for q in queued if isinstance(q, Err)), r)
            out = "ok" if r in ("OK", ["OK", "OK"]) else classify(r) if isinstance(r, Err) \
                else "failed" if r is None else "error"
            self.rec(op="bank", lock="bank", t0=t0, t1=now(), out=out, accounts=[i, j], amount=x,
                     msg=None if out == "ok" else repr(r)[:200])
        finally:
            for n in reversed(held):
                self.call("FENCE.RELEASE", "k%d" % n)


def bank_key(n):
    """Account n's balance: the hash tag names its lock."""
    return "acct:{k%d}" % n


def churn_keys(lock):
    """A churn lock's counter and log: the hash tag names the lock."""
    return "c:{%s}" % lock, "c:{%s}:log" % lock


# ---- the workload ---------------------------------------------------------------------------

def kill_on_sent(a, proc, delay):
    """Arms a to SIGKILL proc `delay` seconds after its worker sent the write."""
    def strike():
        spin(delay)
        proc.kill()
    a.on_sent = strike


def must_refuse(f, a, why):
    """The write of arm a had to be refused, for `why`: marked so for the checker ([contract]);
    fault f bit when it was. Returns f."""
    if a.set_event is not None:
        a.set_event["must_refuse"] = why
    f.bit = a.set_outcome in REFUSED
    return f


class Fault:
    def __init__(self, kind, target=None):
        self.kind = kind
        self.target = target
        self.t0 = now()
        self.t1 = None
        self.bit = False
        self.missed = False
        self.detail = {}

    def as_dict(self):
        return dict(kind=self.kind, target=self.target, t0=self.t0, t1=self.t1, bit=self.bit,
                    missed=self.missed, **self.detail)


class Workload:
    """The cluster, its workers, its nemeses and its history. Use as a context manager:
    __exit__ tears everything down even when a check failed."""

    def __init__(self, workers_per_sidecar=6, netns=False, seed=None, think_ms=0,
                 log=None, hard_seconds=3600, fast_clock_b=None, backend="redis",
                 etcd_members=1, pg=False, http_store=False):
        self.seed = seed if seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed)
        self.workers_per_sidecar = workers_per_sidecar
        self.want_netns = netns
        self.think_ms = think_ms
        self.history = []
        self.faults = []
        self.rollbacks = []          # (AOF end noted, Redis dead) of each rollback-store fault
        self.stop = threading.Event()
        self.hard_deadline = now() + hard_seconds
        self.arms = []
        self.arm_lock = threading.Lock()
        self.solo = None             # when set, every other worker parks before its acquire
        self.gate = threading.Event()
        self.gate.set()
        self.log = log or (lambda s: None)
        self.fast_clock_b = fast_clock_b
        self.netns = None
        self.redis = None
        # "redis" (the store is also the lock backend), "redis-apart" (a Redis of its own for
        # the locks, without persistence: the rollback-locks nemesis) or "etcd"
        self.backend = backend
        self.lock_redis = None
        self.want_pg = pg       # a PostgreSQL store and SQL workers on lock P
        self.pg = None
        self.want_ledger = http_store   # an HTTP store (ledger.py) and ledger workers on lock H
        self.ledger = None
        self.etcd_members = etcd_members  # 3: the kill-etcd-leader nemesis has a leader to kill
        self.etcd = None
        self.sidecars = []
        self.workers = []
        self.churners = []
        self.tmp = tempfile.mkdtemp(prefix="fg-safety-")
        self.final = None

    # -- set-up and tear-down --

    def __enter__(self):
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def setup(self):
        binds = ["127.0.0.1"]
        if self.want_netns:
            self.netns = NetNS().create()
            binds.append(self.netns.host_ip)
        self.redis = AofRedis(binds)
        self.redis.start()
        c = self.redis.client()
        try:
            c.mset({bank_key(n): BANK_INITIAL for n in range(BANK_ACCOUNTS)})
        finally:
            c.close()
        if self.backend == "redis-apart":
            self.lock_redis = AofRedis(binds, aof=False)
            self.lock_redis.start()
        if self.backend == "etcd":
            from etcd_harness import EtcdCluster
            self.etcd = EtcdCluster(self.etcd_members, client_hosts=binds)
            self.etcd.start()
        if self.want_pg:
            self.pg = CrashablePostgres(binds, [self.netns.ns_ip] if self.netns else [])
            self.pg.start()
            self.pg.sql(PG_SCHEMA)
        if self.want_ledger:
            self.ledger = Ledger(binds, self.tmp).start()
        cfgs = []
        for name, text in (("a", PROTECT), ("b", "")):
            host = self.netns.host_ip if self.netns and name == "a" else "127.0.0.1"
            stores = ([PG_STORE % self.pg.url_for(host)] if self.pg else []) + \
                ([HTTP_STORE % self.ledger.url_for(host)] if self.ledger else [])
            if stores:
                text += "stores:\n" + "".join("  - %s\n" % x for x in stores)
            cfgs.append(os.path.join(self.tmp, name + ".yaml") if text else None)
            if text:
                with open(cfgs[-1], "w") as f:
                    f.write(text)
        # a: protect rule counter* -> L (in the namespace when there is one); b: one-lock rule.
        a = Sidecar(self, "a", config=cfgs[0], netns=self.netns)
        b = Sidecar(self, "b", config=cfgs[1])
        self.sidecars = [a, b]
        a.start()
        b.start(faketime=self.fast_clock_b)
        for s in self.sidecars:
            s.wait_ready()
        for s in self.sidecars:
            for i in range(self.workers_per_sidecar):
                norenew, mode = ROLES[i % len(ROLES)]
                tag = {"multi": "t", "pipe": "p"}.get(mode, "")
                self.workers.append(Worker(self, "%s%d%s%s" % (s.name, i, "n" if norenew else "",
                                                             tag), s, norenew=norenew, mode=mode))
            for i, mode in enumerate(CHURN_MODES[s.name]):
                tag = {"multi": "t", "pipe": "p"}.get(mode, "")
                self.churners.append(Churn(self, "%sc%d%s" % (s.name, i, tag), s, mode))
            for mode in BANK_MODES:
                self.churners.append(Bank(self, "%s-bank-%s" % (s.name, mode), s, mode))
            for i in range(HTTP_WORKERS if self.pg else 0):
                self.churners.append(SqlWorker(self, "%ssql%d" % (s.name, i), s, slow=i == 1))
            for i in range(HTTP_WORKERS if self.ledger else 0):
                self.churners.append(LedgerWorker(self, "%shttp%d" % (s.name, i), s, slow=i == 1))

    def start_workers(self):
        for w in self.workers + self.churners:
            w.start()

    def heal_all(self):
        if self.netns:
            self.netns.heal()
        if self.redis:
            self.redis.resume()
        for s in self.sidecars:
            s.thaw()

    def teardown(self):
        self.stop.set()
        with self.arm_lock:
            for a in self.arms:
                a.go.set()
            self.arms = []
        try:
            self.heal_all()
        except Exception:  # noqa: BLE001 - keep tearing down
            pass
        for w in self.workers + self.churners:
            if w.is_alive():
                w.join(3)
            if w.is_alive() and w.conn is not None:
                w.conn.abort()
                w.join(5)
        for s in self.sidecars:
            try:
                s.cleanup()
            except Exception:  # noqa: BLE001
                pass
        for r in (self.redis, self.lock_redis, self.pg, self.ledger):
            if r:
                r.cleanup()
        if self.etcd:
            self.etcd.cleanup()
        if self.netns:
            self.netns.destroy()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self):
        """Stops the workers and the sidecars (SIGTERM: replies drain), then reads the final
        state straight from Redis."""
        self.stop.set()
        self.heal_all()
        for w in self.workers + self.churners:
            w.join(CALL_TIMEOUT + 5)
            if w.is_alive() and w.conn is not None:
                w.conn.abort()
                w.join(5)
        stuck = [w.wid for w in self.workers + self.churners if w.is_alive()]
        txns = sum(s.metric("fencegate_fenced_transactions_total") for s in self.sidecars)
        shared = sum(s.metric("fencegate_lock_backend_batches_total") for s in self.sidecars)
        for s in self.sidecars:
            s.stop()
        time.sleep(0.2)
        c = self.redis.client()

        def state(lock, counter, log):
            return dict(counter=int(c.get(counter) or 0),
                        log=[x.decode() for x in c.lrange(log, 0, -1)],
                        hwm=int(c.get("fencegate:hwm:{%s}" % lock) or 0))
        try:
            self.final = state(LOCK, COUNTER, LOG)
            self.final["churn"] = {
                name: state(name, *churn_keys(name))
                for name in ("bg%d" % i for i in range(CHURN_LOCKS))}
            self.final["bank"] = [int(v or 0) for v in
                                  c.mget([bank_key(n) for n in range(BANK_ACCOUNTS)])]
            self.final["bank_marks"] = {
                "k%d" % n: int(c.get("fencegate:hwm:{k%d}" % n) or 0)
                for n in range(BANK_ACCOUNTS)}
        finally:
            c.close()
        c = (self.lock_redis or self.redis).client()
        try:
            tok = c.get("fencegate:token:{%s}" % LOCK)
            # an HTTP store's mark lives in the lock backend (in etcd: not read here)
            http_mark = None if self.etcd else int(c.get("fencegate:mark:{svc/%s}" % HTTP_LOCK)
                                                   or 0)
        finally:
            c.close()
        if self.ledger:
            st = self.ledger.state()
            self.final["http"] = dict(counter=st["v"], log=st["log"], hwm=http_mark,
                                      ledger_stale=st["stale"])
        if self.pg:
            fence = self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = '%s'" % PG_LOCK)
            self.final["pg"] = dict(
                counter=int(self.pg.sql("SELECT v FROM fg_counter WHERE id = 1")),
                log=self.pg.sql("SELECT entry FROM fg_log ORDER BY seq").split(),
                hwm=int(fence or 0))
        self.final.update(token_counter=int(tok or 0), stuck_workers=stuck,
                          fenced_txns=int(txns), shared_txns=int(shared))
        return self.final

    # -- arms --

    def post_arm(self, arm):
        with self.arm_lock:
            self.arms.append(arm)

    def take_arm(self, worker):
        with self.arm_lock:
            for i, a in enumerate(self.arms):
                if a.sidecar is worker.sidecar and (a.norenew is None or
                                                    a.norenew == worker.norenew) and \
                        (a.only is None or a.only is worker):
                    return self.arms.pop(i)
        return None

    def cancel_arm(self, arm):
        """True when the arm was still waiting (now withdrawn); False when a worker took it."""
        with self.arm_lock:
            if arm in self.arms:
                self.arms.remove(arm)
                return True
        return False

    def wait_reached(self, arm, timeout=8.0):
        if arm.reached.wait(timeout):
            return True
        if self.cancel_arm(arm):
            return False
        return arm.reached.wait(5.0)

    def aim_at_http(self, a):
        """In 30% of the faults, when there are any, arm `a` for one HTTP worker (SQL or ledger)
        of its sidecar only: they make far fewer turns than L's workers and would seldom get to
        a stall point first."""
        http = [w for w in self.churners if isinstance(w, HttpWorker) and w.sidecar is a.sidecar]
        if http and self.rng.random() < 0.3:
            a.only = self.rng.choice(http)

    def rendezvous(self, f, target):
        """Posts an arm for a worker of `target` to stop at its stall point (between GET and SET,
        or before EXEC); returns it once one has, else None with f marked missed."""
        a = Arm("rendezvous", target)
        self.aim_at_http(a)
        self.post_arm(a)
        if self.wait_reached(a):
            return a
        f.missed = True
        return None

    def ended_since(self, t):
        """The events that ended at t or later. The history is appended as steps end, by many
        threads, so it is walked back until well before t (no step takes CALL_TIMEOUT + 5 s)."""
        out = []
        for e in reversed(self.history):
            if e["t1"] < t - CALL_TIMEOUT - 5:
                break
            if e["t1"] >= t:
                out.append(e)
        return out

    def acked_since(self, t):
        return sum(1 for e in self.history if e["op"] == "set" and e["out"] == "ok"
                   and e["t0"] >= t and e["lock"] == LOCK)

    # -- nemeses --

    def nem_freeze(self, target):
        """SIGSTOP the sidecar while its worker is between GET and SET (or before EXEC), let the
        worker send its SET (EXEC) into the frozen sidecar, keep it frozen 2-3 leases, SIGCONT.
        The write must be refused: the lease ran out while frozen. In 30% of the faults every
        other worker is parked, so no one takes the lock meanwhile and the mark does not move."""
        f = Fault("freeze", target.name)
        a = Arm("rendezvous", target)
        solo = self.rng.random() < 0.3
        try:
            if solo:
                self.go_solo(a, [w for w in self.workers if w.sidecar is target])
            else:
                self.aim_at_http(a)
            self.post_arm(a)
            if not self.wait_reached(a):
                f.missed = True
                return f
            target.freeze()
            t_frozen = now()
            a.go.set()
            dur = self.rng.uniform(2.0, 3.0) * SESSION_TTL_MS / 1000.0
            time.sleep(dur)
            target.thaw()
            a.done.wait(CALL_TIMEOUT + 5)
        finally:
            a.go.set()
            self.end_solo()
        f.detail.update(frozen_s=round(now() - t_frozen, 3), set=a.set_outcome, solo=solo,
                        worker=a.worker.wid if a.worker else None)
        return must_refuse(f, a, "sent into a sidecar frozen %.2f s (lease %d ms)" % (
            dur, SESSION_TTL_MS))

    def nem_stall(self, target):
        """A NORENEW worker (TTL 500) stalls before its write (between GET and SET, or between
        queueing MULTI ... and EXEC) for 450..650 ms (near the lease's end, where the backend
        may not have handed the lock to anyone yet) or 500..900 ms (surely past it)."""
        f = Fault("stall", target.name)
        if self.rng.random() < 0.5:
            ms = self.rng.uniform(NORENEW_TTL_MS - 50, NORENEW_TTL_MS + 150)
        else:
            ms = self.rng.uniform(NORENEW_TTL_MS, NORENEW_TTL_MS + 400)
        a = Arm("sleep", target, seconds=ms / 1000.0, norenew=True)
        solo = self.rng.random() < 0.4
        if solo:
            self.go_solo(a, [w for w in self.workers if w.sidecar is target and w.norenew])
        try:
            self.post_arm(a)
            ok = self.wait_reached_done(a)
        finally:
            self.end_solo()
        if not ok:
            f.missed = True
            return f
        f.detail.update(stall_s=round(a.seconds, 3), set=a.set_outcome, solo=solo,
                        worker=a.worker.wid if a.worker else None)
        f.bit = a.set_outcome in REFUSED
        return f

    def go_solo(self, arm, candidates):
        """Parks every worker but one (picked from candidates) before its next acquire, so that
        nobody contends for the lock: when the lease ends the backend hands the lock to no one,
        and only the sidecar's own lease accounting can refuse the late write."""
        arm.only = self.rng.choice(candidates)
        self.solo = arm.only
        self.gate.clear()
        others = [w for w in self.workers if w is not arm.only]
        deadline = now() + WAIT_MS / 1000.0 + 3
        while now() < deadline and not all(w.parked or not w.is_alive() for w in others):
            time.sleep(0.02)

    def end_solo(self):
        self.solo = None
        self.gate.set()

    def wait_reached_done(self, a, timeout=8.0):
        deadline = now() + timeout
        while not a.done.is_set():
            if a.worker is None and now() >= deadline:
                if self.cancel_arm(a):
                    return False
            if now() >= deadline + CALL_TIMEOUT + 5:
                return False
            a.done.wait(0.05)
        return True

    def nem_kill_sidecar(self, target):
        """kill -9 the sidecar right after its worker sent the SET, then start it again on the
        same ports. Half the time at once, so the write is surely in flight (a SET's round trip
        on loopback can be 0.1 ms); else 0..1.5 ms later: before, inside or after Redis."""
        f = Fault("kill-sidecar", target.name)
        a = self.rendezvous(f, target)
        if a is None:
            return f
        delay = 0.0 if self.rng.random() < 0.5 else self.rng.uniform(0, 0.0015)
        kill_on_sent(a, target.fg.proc, delay)
        a.go.set()
        a.sent.wait(5)
        target.kill()
        t_kill = now()
        time.sleep(self.rng.uniform(0.05, 0.4))
        target.start(faketime=target.faketime)
        target.wait_ready()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(set=a.set_outcome, down_s=round(now() - t_kill, 3))
        # It bit when the kill caught the write in flight: the worker cannot know its outcome.
        f.bit = a.set_outcome in ("unknown", "failed")
        return f

    def nem_kill_redis(self, target=None):
        """kill -9 Redis right after a worker sent its SET, restart it on the same port 0.2..1 s
        later (AOF with fsync always: acknowledged writes, tokens and marks survive)."""
        f = Fault("kill-redis", "redis")
        sc = target or self.rng.choice(self.sidecars)
        a = self.rendezvous(f, sc)
        if a is None:
            return f
        kill_on_sent(a, self.redis.proc, self.rng.uniform(0, 0.0015))
        a.go.set()
        a.sent.wait(5)
        self.redis.kill()
        t_kill = now()
        time.sleep(self.rng.uniform(0.2, 1.0))
        self.redis.start()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(set=a.set_outcome, down_s=round(now() - t_kill, 3))
        bad = [e for e in self.ended_since(t_kill) if
               e["out"] in ("unknown", "failed")]
        f.bit = bool(bad) or a.set_outcome in ("unknown", "failed")
        f.detail["failed_or_unknown_during_outage"] = len(bad)
        return f

    def nem_kill_etcd_leader(self, target):
        """With a 3-member etcd: kill -9 its leader right after a worker of `target` sent its SET
        (locks held, others waiting, sessions keeping their leases alive), restart it on its data
        0.3..1.5 s later; the other two elect a leader meanwhile and the sidecars fail over to
        them. Bites when an acquisition, write or release of L in the outage failed, was unknown
        or found its lock lost, or a release stalled (over 300 ms): the outage was felt."""
        f = Fault("kill-etcd-leader", "etcd")
        leader = self.etcd.leader() if self.etcd and len(self.etcd.members) >= 3 else None
        if leader is None:
            f.missed = True
            return f
        a = self.rendezvous(f, target)
        if a is None:
            return f
        a.go.set()
        a.sent.wait(5)
        leader.kill()
        t_kill = now()
        time.sleep(self.rng.uniform(0.3, 1.5))
        leader.start()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(set=a.set_outcome, down_s=round(now() - t_kill, 3), member=leader.name)
        felt = [e for e in self.ended_since(t_kill) if
                (e["out"] in ("unknown", "failed", "locklost") or
                 (e["op"] == "release" and e["t1"] - e["t0"] > 0.3))]
        f.bit = bool(felt)
        f.detail["failed_lost_or_stalled_after_kill"] = len(felt)
        return f

    def nem_rollback_locks(self, target):
        """With the lock backend a Redis of its own (--backend redis-apart): snapshot it, let the
        workload run 0.3..1.5 s, stop a worker of `target` between GET and SET, then kill -9 the
        lock Redis and start it from the snapshot at once: what a failover to a replica that
        lagged that long leaves. Token counters go back below the store's marks, lock keys taken
        since vanish (their holders still believe they hold them) and keys released since come
        back with their old owners. The worker writes 1..2 leases later, or, in half the faults,
        50..300 ms later: while its sidecar may still believe it holds the lock and another may
        already have taken it with a repaired token, so the store's mark is what refuses it.
        Bites when a token had to be repaired (the sidecars' fencegate_token_repairs_total moved)
        or the write was refused."""
        f = Fault("rollback-locks", "lock-redis")
        if not self.lock_redis:
            f.missed = True
            return f
        a, repaired = self.roll_back(f, target, self.lock_redis.snapshot,
                                     lambda t_noted: self.lock_redis.restore(),
                                     "fencegate_token_repairs_total")
        f.detail["repairs"] = int(repaired)
        f.bit = a is not None and (repaired > 0 or a.set_outcome in REFUSED)
        return f

    def roll_back(self, f, target, note, restore, metric):
        """What the rollback nemeses share: note() the state to go back to, let the workload run
        0.3..1.5 s, stop a worker of `target` between GET and SET, restore(t_noted) (kill -9 and
        start from what note() kept), and let the worker write 1..2 leases later or, in half the
        faults, 50..300 ms later. Returns the rendezvous's arm (None: missed, nothing rolled
        back) and how far the sidecars' `metric` moved from the rendezvous on."""
        t_noted = now()
        note()
        time.sleep(self.rng.uniform(0.3, 1.5))
        a = self.rendezvous(f, target)
        if a is None:
            return None, 0
        before = sum(s.metric(metric) for s in self.sidecars)
        restore(t_noted)
        t_back = now()
        early = self.rng.random() < 0.5
        try:
            time.sleep(self.rng.uniform(0.05, 0.3) if early else
                       self.rng.uniform(1.0, 2.0) * SESSION_TTL_MS / 1000.0)
        finally:
            a.go.set()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(behind_s=round(t_back - t_noted, 3), early=early, set=a.set_outcome)
        return a, sum(s.metric(metric) for s in self.sidecars) - before

    def nem_rollback_store(self, target):
        """Note where the store Redis's AOF ends, let the workload run 0.3..1.5 s, stop a worker
        of `target` between GET and SET, then kill -9 Redis, cut its AOF back to that point and
        start it: what a failover to a replica that lagged that long leaves. With the locks in
        that Redis (the default layout) lock keys, token counters, marks and data go back
        together: a token granted since is granted again, and holders whose grants were lost
        still believe they hold their locks, with tokens the marks cannot tell from the new
        holders'; only the lock key, which every fenced write's script checks, names the holder.
        With the locks elsewhere (etcd, redis-apart) the grants stand and their marks go back:
        a write finds its mark below its token and is refused LOCKLOST. The worker writes
        1..2 leases later or, in half the faults, 50..300 ms later. Writes acknowledged since the
        AOF's end was noted are lost by design; the checker knows (Workload.rollbacks). Bites
        when a write was refused LOCKLOST (fencegate_locklost_refused_total moved: by the store,
        or by a sidecar that found its lock lost) or the worker's write was refused."""
        f = Fault("rollback-store", "redis")
        end = []

        def restore(t_noted):
            self.redis.kill()
            self.rollbacks.append((t_noted, now()))
            self.redis.cut_back(end[0])
            self.redis.start()
        a, refused = self.roll_back(f, target, lambda: end.append(self.redis.aof_end()), restore,
                                    "fencegate_locklost_refused_total")
        f.detail["locklost_refused"] = int(refused)
        f.bit = a is not None and (refused > 0 or a.set_outcome in REFUSED)
        return f

    def kill_store_in_write(self, f, cls, lock, kill, start):
        """1..10 ms into a write of a slow `cls` worker (inside the 20 ms its store takes over
        it), kill(), then start() 0.2..1 s later. Bites when a read or write of `lock` failed or
        had an unknown outcome in the outage."""
        slow = [w for w in self.churners if isinstance(w, cls) and w.slow]
        deadline = now() + 3
        while not any(w.writing for w in slow) and now() < deadline:
            time.sleep(0.0005)
        time.sleep(self.rng.uniform(0.001, 0.01))
        t_kill = now()
        kill()
        time.sleep(self.rng.uniform(0.2, 1.0))
        start()
        time.sleep(0.3)
        felt = [e for e in self.ended_since(t_kill) if e["lock"] == lock and
                e["op"] in ("get", "set") and e["out"] in ("unknown", "failed")]
        f.detail.update(down_s=round(now() - t_kill, 3), felt=len(felt),
                        unknown=sum(1 for e in felt if e["out"] == "unknown"))
        f.bit = bool(felt)
        return f

    def nem_kill_postgres(self, target=None):
        """With a PostgreSQL store (--pg): kill -9 PostgreSQL (postmaster and backends at once)
        inside a slow SQL worker's batch (in its pg_sleep, sent with its COMMIT, which has not
        run yet), start it again (kill_store_in_write()); crash recovery replays the WAL, so
        every commit that was acknowledged survives. Meanwhile every acquisition fails: fence on
        acquire cannot raise the store's fence row (fail closed)."""
        f = Fault("kill-postgres", "postgres")
        if not self.pg:
            f.missed = True
            return f
        pids = self.pg.processes()   # beforehand, so that the kill lands at once
        return self.kill_store_in_write(f, SqlWorker, PG_LOCK, lambda: self.pg.crash(pids),
                                        self.pg.start)

    def nem_kill_http_store(self, target=None):
        """With an HTTP store (--http-store): kill -9 the ledger inside a slow ledger worker's
        write (the ledger waits 20 ms before applying it), start it again from its file
        (kill_store_in_write())."""
        f = Fault("kill-http-store", "ledger")
        if not self.ledger:
            f.missed = True
            return f
        return self.kill_store_in_write(f, LedgerWorker, HTTP_LOCK, self.ledger.kill,
                                        self.ledger.start)

    def nem_partition_etcd(self, target=None):
        """With the etcd backend: cut the namespaced sidecar off from etcd (every member's client
        port, both ways) while its worker sits between GET and SET, keep it cut 2.5..4 leases, let
        the worker send its SET (Redis is still reachable), then heal. Its session's lease cannot
        be kept alive, so the write must be refused: LOCKLOST by the sidecar's own count, or STALE
        at the store once another holder's fence on acquire raised the mark."""
        target = target or self.sidecars[0]
        f = Fault("partition-etcd", target.name)
        if not self.netns or target.netns is None or not self.etcd:
            f.missed = True
            return f
        a = self.rendezvous(f, target)
        if a is None:
            return f
        self.netns.cut(*(m.client_port for m in self.etcd.members))
        t_cut = now()
        dur = self.rng.uniform(2.5, 4.0) * SESSION_TTL_MS / 1000.0
        try:
            time.sleep(dur)
            a.go.set()
            a.done.wait(CALL_TIMEOUT + 5)
        finally:
            a.go.set()
            self.netns.heal()
        f.detail.update(cut_s=round(now() - t_cut, 3), set=a.set_outcome,
                        worker=a.worker.wid if a.worker else None)
        return must_refuse(f, a, "sent %.2f s into a cut from etcd (lease %d ms)" % (
            dur, SESSION_TTL_MS))

    def nem_partition(self, target=None):
        """Cut the namespaced sidecar off from Redis (iptables DROP on Redis's port, both ways;
        the lock Redis's, PostgreSQL's and the ledger's too, when there are) right after its
        worker got to the SET, for 2.5..4 leases, then heal. The SET is sent into the cut link
        and reaches Redis by TCP retransmission after the heal, when another holder has the
        lock: it must be refused."""
        target = target or self.sidecars[0]
        if not self.netns or target.netns is None:
            return self.nem_pause_redis(target)
        f = Fault("partition", target.name)
        a = self.rendezvous(f, target)
        if a is None:
            return f
        self.netns.cut(*(r.port for r in (self.redis, self.lock_redis, self.pg, self.ledger) if r))
        a.go.set()
        dur = self.rng.uniform(2.5, 4.0) * SESSION_TTL_MS / 1000.0
        time.sleep(dur)
        self.netns.heal()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(cut_s=round(dur, 3), set=a.set_outcome)
        f.bit = a.set_outcome in REFUSED
        return f

    def nem_pause_redis(self, target=None):
        """The fallback partition without a network namespace: SIGSTOP Redis for 2.5..4 leases
        while a worker's SET is in flight. Nobody can take the lock while Redis is stopped, so this
        bites only when another holder's acquire gets in before the SET once Redis resumes."""
        f = Fault("pause-redis", "redis")
        sc = target or self.rng.choice(self.sidecars)
        a = self.rendezvous(f, sc)
        if a is None:
            return f
        self.redis.pause()
        a.go.set()
        dur = self.rng.uniform(2.5, 4.0) * SESSION_TTL_MS / 1000.0
        time.sleep(dur)
        self.redis.resume()
        a.done.wait(CALL_TIMEOUT + 5)
        f.detail.update(paused_s=round(dur, 3), set=a.set_outcome)
        f.bit = a.set_outcome in REFUSED
        return f

    def nem_clock(self, target=None):
        """Restart a sidecar under libfaketime with its clock slowed to x0.2..x0.3 and shifted by
        -60..+60 s (CLOCK_MONOTONIC faked too), let one of its renewing workers take 0.6..1.2 s
        between GET and SET, then restart it with the real clock. At that rate renewals come
        every ~0.8 s for a 0.6 s lease while the sidecar believes its lease is still valid, so the
        other sidecar takes the lock and the slow write must be refused by the fence."""
        target = target or self.sidecars[0]
        f = Fault("clock", target.name)
        if not FAKETIME_LIBS:
            f.missed = True
            f.detail["why"] = "libfaketime not installed"
            return f
        rate = self.rng.uniform(0.2, 0.3)
        spec = "%+ds x%.2f" % (self.rng.randint(-60, 60), rate)
        keep = target.faketime
        target.stop()
        target.start(faketime=spec)
        target.wait_ready()
        a = Arm("sleep", target, seconds=self.rng.uniform(0.6, 1.2), norenew=False)
        self.post_arm(a)
        ok = self.wait_reached_done(a)
        target.stop()
        target.start(faketime=keep)
        target.wait_ready()
        f.detail.update(faketime=spec, work_s=round(a.seconds, 3), set=a.set_outcome)
        if not ok:
            f.missed = True
            return f
        f.bit = a.set_outcome in REFUSED
        return f

    def inject(self, kind):
        """Runs one fault of `kind` (a NEMESES key) against a sidecar picked at random."""
        target = self.rng.choice(self.sidecars)
        if kind == "freeze":
            f = self.nem_freeze(target)
        elif kind == "stall":
            f = self.nem_stall(target)
        elif kind == "kill-sidecar":
            f = self.nem_kill_sidecar(target)
        elif kind == "kill-redis":
            f = self.nem_kill_redis()
        elif kind == "partition":
            f = self.nem_partition()
        elif kind == "clock":
            f = self.nem_clock(target)
        elif kind == "kill-etcd-leader":
            f = self.nem_kill_etcd_leader(target)
        elif kind == "partition-etcd":
            f = self.nem_partition_etcd()
        elif kind == "rollback-locks":
            f = self.nem_rollback_locks(target)
        elif kind == "rollback-store":
            f = self.nem_rollback_store(target)
        elif kind == "kill-postgres":
            f = self.nem_kill_postgres()
        elif kind == "kill-http-store":
            f = self.nem_kill_http_store()
        else:
            raise ValueError("unknown nemesis %r" % kind)
        f.t1 = now()
        self.faults.append(f)
        self.log("fault %-12s %-5s bit=%-5s %s" % (f.kind, f.target, f.bit, f.detail
                                                    if not f.missed else "MISSED"))
        return f

    def run(self, schedule, seconds=None, faults=None, settle=1.5):
        """Starts the workers and injects faults from `schedule` (a function i -> kind) until
        `seconds` pass or `faults` were injected, with 0.2..0.8 s of quiet between two. Then lets
        the workload run `settle` seconds without faults (recovery), and finishes."""
        self.start_workers()
        t_end = now() + seconds if seconds else self.hard_deadline
        time.sleep(0.5)
        i = 0
        while now() < t_end and now() < self.hard_deadline and (faults is None or i < faults):
            self.inject(schedule(i))
            i += 1
            time.sleep(self.rng.uniform(0.2, 0.8))
        self.t_quiet = now()
        deadline = now() + settle + 10
        time.sleep(settle)
        while self.acked_since(self.t_quiet) == 0 and now() < deadline:
            time.sleep(0.1)
        self.finish()
        return check(self)


NEMESES = ("freeze", "stall", "kill-sidecar", "kill-redis", "clock", "partition")
# With the etcd backend: partition-etcd needs a network namespace, kill-etcd-leader 3 members.
ETCD_NEMESES = ("partition-etcd", "kill-etcd-leader")
# With --backend redis-apart (the locks in a Redis of their own).
LOCK_REDIS_NEMESES = ("rollback-locks",)
# With any backend: the store's Redis rolled back (with the default one, the locks go back too).
STORE_NEMESES = ("rollback-store",)
# With --pg (a PostgreSQL store and SQL workers), with --http-store (ledger.py and its workers).
PG_NEMESES = ("kill-postgres",)
HTTP_STORE_NEMESES = ("kill-http-store",)


def schedule_for(name, rng, netns=True, etcd=False, etcd3=False, lock_redis=False, pg=False,
                 http_store=False, store_rollback=False):
    """i -> nemesis kind. Kill nemeses alternate with a worker stall: a killed sidecar or Redis
    takes the connection of the writer with it, so nothing stale is left to send, and a killed
    etcd leader seldom costs a lease; the stalls keep the fence exercised in those runs too. So
    does the partition without a network namespace (a Redis SIGSTOP, which seldom lets another
    holder in before the stopped write). "mixed" draws from ETCD_NEMESES too, those the set-up
    allows (etcd: the etcd backend; etcd3: with 3 members), and LOCK_REDIS_NEMESES with
    lock_redis (the locks in a Redis of their own), STORE_NEMESES with store_rollback (the long
    form: any backend), PG_NEMESES with pg, HTTP_STORE_NEMESES with http_store."""
    if name == "mixed":
        kinds = NEMESES + (("partition-etcd",) if etcd and netns else ()) + \
            (("kill-etcd-leader",) if etcd3 else ()) + \
            (LOCK_REDIS_NEMESES if lock_redis else ()) + \
            (STORE_NEMESES if store_rollback else ()) + (PG_NEMESES if pg else ()) + \
            (HTTP_STORE_NEMESES if http_store else ())
        return lambda i: rng.choice(kinds)
    if name in ("kill-sidecar", "kill-redis", "kill-etcd-leader", "kill-postgres",
                "kill-http-store") or \
            (name == "partition" and not netns):
        return lambda i: name if i % 2 == 0 else "stall"
    return lambda i: name


# ---- the checker ----------------------------------------------------------------------------

def token_order(grants):
    """(grant, earlier) pairs where a grant that started after `earlier` completed carries a
    token not above it: a lock's tokens must grow with real time."""
    out = []
    by_end = sorted(grants, key=lambda e: e["t1"])
    j, best = 0, None
    for g in sorted(grants, key=lambda e: e["t0"]):
        while j < len(by_end) and by_end[j]["t1"] < g["t0"]:
            if best is None or by_end[j]["token"] > best["token"]:
                best = by_end[j]
            j += 1
        if best is not None and g["token"] <= best["token"]:
            out.append((g, best))
    return out


def rolled_back(windows):
    """e -> True when a store rollback (windows: Workload.rollbacks) may have taken e back: it
    ended after the AOF's end was noted and began before Redis died."""
    return lambda e: any(e["t1"] > t_end and e["t0"] < t_dead for t_end, t_dead in windows)


def across_rollbacks(H, windows):
    """Writes applied under a grant a store rollback forgot: the turn's grant began after the
    rollback's AOF end was noted and ended before Redis died, so the fence raise made for it
    (and, with the locks in the store, its lock key) went back with the store, and its GET may
    have read state that went back too; its SET was sent after Redis died. Applied, that SET's
    value would not follow from the surviving history (the store's own surviving data loses an
    update), so it must be refused. Returns the violations."""
    V = []
    turns = collections.defaultdict(list)
    for e in H:
        turns[e["w"]].append(e)
    for evs in turns.values():
        grant = None
        for e in sorted(evs, key=lambda e: e["t0"]):
            if e["op"] == "acquire":
                grant = e if e["out"] == "ok" else None
            elif e["op"] == "set" and e["out"] == "ok" and grant is not None:
                for t_end, t_dead in windows:
                    if t_end < grant["t0"] and grant["t1"] < t_dead < e["t0"]:
                        V.append("[safety] %s's SET %d under token %d was applied after a store "
                                 "rollback took its grant's fence back (granted at %.3f, AOF end "
                                 "%.3f, Redis dead %.3f, SET at %.3f)" % (
                                     e["w"], e["value"], grant["token"], grant["t0"], t_end,
                                     t_dead, e["t0"]))
    return V


def check_lock(H, fin, lost=lambda e: False):
    """Checks 1-4 for one lock: H is the history of its turns, fin its final counter, log and
    mark. With store rollbacks, lost(e) tells the steps they may have taken back: such an
    acknowledged write may be missing and its value written again, such a grant's token granted
    again. What survived must still be one holder at a time: the log's values and tokens never
    go back, no refused write is in it, and every step that survived counts as before. Returns
    the violations."""
    V = []
    sets = [e for e in H if e["op"] == "set"]
    pushes = [e for e in H if e["op"] == "rpush"]
    grants = [e for e in H if e["op"] == "acquire" and e["out"] == "ok" and not lost(e)]

    # 1. counter
    F = fin["counter"]
    ack_vals = collections.Counter(e["value"] for e in sets if e["out"] == "ok" and not lost(e))
    unk_vals = set(e["value"] for e in sets if e["out"] in ("unknown", "error") or
                   (e["out"] == "ok" and lost(e)))
    n_ack = sum(ack_vals.values())
    n_unk = sum(1 for e in sets if e["out"] in ("unknown", "error") or
                (e["out"] == "ok" and lost(e)))
    for v, n in ack_vals.items():
        if n > 1:
            V.append("[safety] lost update: %d acknowledged SETs wrote counter=%d" % (n, v))
        if v > F:
            V.append("[safety] acknowledged SET counter=%d is above the final counter %d" % (v, F))
    missing = [v for v in range(1, F + 1) if v not in ack_vals and v not in unk_vals]
    if missing:
        V.append("[safety] counter values written by no acknowledged or in-doubt SET (a "
                 "refused write applied?): %s" % missing[:20])
    if not (n_ack <= F <= n_ack + n_unk):
        V.append("[safety] final counter %d outside [acknowledged %d, acknowledged + unknown "
                 "%d]" % (F, n_ack, n_ack + n_unk))

    # 2. log
    attempts = {}
    for e in pushes:
        attempts.setdefault("%d:%d" % (e["token"], e["value"]), []).append(e["out"])
    seen = collections.Counter(fin["log"])
    prev_t = prev_v = -1
    for i, entry in enumerate(fin["log"]):
        try:
            t, v = (int(x) for x in entry.split(":"))
        except ValueError:
            V.append("[safety] log entry %d is not token:value: %r" % (i, entry))
            continue
        if t < prev_t:
            V.append("[safety] log goes backwards at %d: token %d after %d" % (i, t, prev_t))
        if v <= prev_v:
            V.append("[safety] log values not increasing at %d: %d after %d" % (i, v, prev_v))
        prev_t, prev_v = max(prev_t, t), max(prev_v, v)
        outs = attempts.get(entry)
        if outs is None:
            V.append("[safety] log entry %r was never pushed (phantom)" % entry)
        elif not any(o in ("ok", "unknown", "error") for o in outs):
            V.append("[safety] log entry %r is in Redis although its RPUSH was refused (%s)" % (
                entry, ",".join(outs)))
    for entry, n in seen.items():
        if n > 1:
            V.append("[safety] log entry %r appears %d times" % (entry, n))
    p_ack = sum(1 for e in pushes if e["out"] == "ok" and not lost(e))
    p_unk = sum(1 for e in pushes if e["out"] in ("unknown", "error") or
                (e["out"] == "ok" and lost(e)))
    for e in pushes:
        if e["out"] == "ok" and not lost(e) and "%d:%d" % (e["token"], e["value"]) not in seen:
            V.append("[safety] acknowledged RPUSH %d:%d is missing from the log" % (e["token"],
                                                                           e["value"]))
    if not (p_ack <= len(fin["log"]) <= p_ack + p_unk):
        V.append("[safety] log length %d outside [acknowledged %d, acknowledged + unknown %d]" % (
            len(fin["log"]), p_ack, p_ack + p_unk))

    # 2b. a transaction's SET and RPUSH are applied together or not at all
    writers = collections.defaultdict(list)   # value -> SETs that may have written it
    for e in sets:
        if e["out"] in ("ok", "unknown", "error"):
            writers[e["value"]].append(e)
    for e in sets:
        if not e.get("txn") or e["out"] not in ("unknown", "error"):
            continue
        pushed = "%d:%d" % (e["token"], e["value"]) in seen
        others = [x for x in writers[e["value"]] if x is not e]
        if not pushed and e["value"] <= F and not others:
            V.append("[safety] transaction %d:%d half applied: counter=%d written, its RPUSH "
                     "missing" % (e["token"], e["value"], e["value"]))
        if pushed and e["value"] > F:
            V.append("[safety] transaction %d:%d half applied: RPUSH in the log, counter %d "
                     "below it" % (e["token"], e["value"], F))

    # 3. tokens
    toks = collections.Counter(e["token"] for e in grants)
    for t, n in toks.items():
        if n > 1:
            V.append("[safety] token %d granted %d times" % (t, n))
    for g, best in token_order(grants):
        V.append("[safety] token order: %s got %d at %.3f after %s got %d (completed %.3f)" % (
            g["w"], g["token"], g["t0"], best["w"], best["token"], best["t1"]))
    if grants and fin["hwm"] is not None and fin["hwm"] < max(toks):
        V.append("[safety] final high-water mark %d below the largest token granted %d" % (
            fin["hwm"], max(toks)))

    # 4. reads never go below an acknowledged write
    acked = sorted((e for e in sets if e["out"] == "ok" and not lost(e)), key=lambda e: e["t1"])
    j, hi = 0, 0
    for g in sorted((e for e in H if e["op"] == "get" and e["out"] == "ok"),
                    key=lambda e: e["t0"]):
        while j < len(acked) and acked[j]["t1"] < g["t0"]:
            hi = max(hi, acked[j]["value"])
            j += 1
        if g["value"] < hi:
            V.append("[safety] %s read counter=%d at %.3f after SET %d was acknowledged" % (
                g["w"], g["value"], g["t0"], hi))
    return V


def check(wl):
    """Checks the history against the final state; returns a result dict with 'violations' (a
    list of strings, empty when every property holds) and the scorecard figures. The figures
    are L's, but for the churn ones."""
    fin = wl.final
    by_lock = collections.defaultdict(list)
    for e in wl.history:
        by_lock[e["lock"]].append(e)
    H = by_lock[LOCK]
    lost = rolled_back(wl.rollbacks)
    V = check_lock(H, fin, lost) + across_rollbacks(H, wl.rollbacks)
    for name, state in sorted(fin["churn"].items()):
        V += [v.replace("] ", "] lock %s: " % name, 1)
              for v in check_lock(by_lock[name], state, lost) +
              across_rollbacks(by_lock[name], wl.rollbacks)]
    for key, lock, what in (("pg", PG_LOCK, "PostgreSQL"), ("http", HTTP_LOCK, "HTTP store")):
        if key in fin:
            V += [v.replace("] ", "] lock %s (%s): " % (lock, what), 1)
                  for v in check_lock(by_lock[lock], fin[key], lost)]
    bank = by_lock["bank"]
    total = sum(fin["bank"])
    if total != BANK_ACCOUNTS * BANK_INITIAL:
        V.append("[safety] bank: the balances %s sum to %d, not %d: a transfer was applied on "
                 "balances changed since they were read" % (fin["bank"], total,
                                                            BANK_ACCOUNTS * BANK_INITIAL))
    for n in range(BANK_ACCOUNTS):
        name = "k%d" % n
        g = [e for e in by_lock[name] if e["op"] == "acquire" and e["out"] == "ok" and
             not lost(e)]
        toks = collections.Counter(e["token"] for e in g)
        V += ["[safety] bank lock %s: token %d granted %d times" % (name, t, c)
              for t, c in toks.items() if c > 1]
        V += ["[safety] bank lock %s: token order: %s got %d at %.3f after %s got %d (completed "
              "%.3f)" % (name, x["w"], x["token"], x["t0"], y["w"], y["token"], y["t1"])
              for x, y in token_order(g)]
        if g and fin["bank_marks"][name] < max(toks):
            V.append("[safety] bank lock %s: final mark %d below the largest token %d" % (
                name, fin["bank_marks"][name], max(toks)))
    writes = [e for e in H if e["op"] in ("set", "rpush")]
    grants = [e for e in H if e["op"] == "acquire" and e["out"] == "ok"]
    churn = [e for e in wl.history if e["lock"].startswith("bg")]
    churn_outs = collections.Counter(e["out"] for e in churn if e["op"] in ("set", "rpush"))

    # 5. leases
    last_grant = {}
    for e in sorted(wl.history, key=lambda e: e["t0"]):
        if e["op"] == "acquire" and e["out"] == "ok":
            last_grant[e["w"]] = e
        elif e["op"] in ("set", "rpush") and e["out"] == "ok":
            g = last_grant.get(e["w"])
            if g and g["norenew"] and g["token"] == e["token"] and \
                    e["t0"] > g["t1"] + NORENEW_TTL_MS / 1000.0 + 0.005:
                V.append("[contract] %s %s (token %d) sent %.0f ms after its NORENEW %d ms lease "
                         "was granted, and acknowledged" % (e["w"], e["op"], e["token"],
                                                        (e["t0"] - g["t1"]) * 1000,
                                                        NORENEW_TTL_MS))
            if e.get("must_refuse"):
                V.append("[contract] %s %s (token %d) acknowledged although %s" % (
                    e["w"], e["op"], e["token"], e["must_refuse"]))

    # 6. liveness: nothing legitimately waits CALL_TIMEOUT for a reply
    for e in wl.history:  # the connection's own timeout, not an error reply that mentions one
        if e.get("msg") and e["msg"].startswith(("TimeoutError(", "timeout(")):
            V.append("[liveness] %s %s (token %s) got no reply within %.0f s (sent at %.3f)" % (
                e["w"], e["op"], e.get("token"), CALL_TIMEOUT, e["t0"]))

    outs = collections.Counter(e["out"] for e in writes)
    faults = [f for f in wl.faults if not f.missed]
    by_kind = collections.defaultdict(lambda: [0, 0, 0])
    for f in wl.faults:
        k = by_kind[f.kind]
        k[0 if not f.missed else 2] += 1
        k[1] += 1 if f.bit else 0
    res = dict(
        seed=wl.seed,
        faults=len(faults),
        faults_missed=len(wl.faults) - len(faults),
        by_kind={k: dict(injected=v[0], bit=v[1], missed=v[2]) for k, v in by_kind.items()},
        grants=len(grants),
        acquire_outcomes=dict(collections.Counter(e["out"] for e in H if e["op"] == "acquire")),
        writes_attempted=len(writes),
        acknowledged=outs["ok"],
        refused=outs["stale"] + outs["locklost"],
        stale=outs["stale"],
        locklost=outs["locklost"],
        unknown=outs["unknown"] + outs["error"],
        failed=outs["failed"] + outs["nolock"],
        unexpected_errors=sorted(set(e["msg"] for e in writes if e["out"] == "error"))[:5],
        final_counter=fin["counter"],
        log_length=len(fin["log"]),
        hwm=fin["hwm"],
        redis_starts=wl.redis.starts,
        sidecar_starts={s.name: len(s.incarnations) for s in wl.sidecars},
        stuck_workers=fin["stuck_workers"],
        fenced_txns=fin["fenced_txns"],
        shared_txns=fin["shared_txns"],
        churn_grants=sum(1 for e in churn if e["op"] == "acquire" and e["out"] == "ok"),
        churn_writes=dict(churn_outs),
        bank_transfers=dict(collections.Counter(e["out"] for e in bank if e["op"] == "bank")),
        bank_balances=fin["bank"],
        acked_after_last_fault=wl.acked_since(getattr(wl, "t_quiet", now())),
        token_repairs=sum(f.detail.get("repairs", 0) for f in wl.faults),
        **{key: dict(grants=sum(1 for e in by_lock[lock] if e["op"] == "acquire" and
                                e["out"] == "ok"),
                     writes=dict(collections.Counter(e["out"] for e in by_lock[lock]
                                                     if e["op"] == "set")),
                     counter=fin[key]["counter"], log=len(fin[key]["log"]),
                     ledger_stale=fin[key].get("ledger_stale")) if key in fin else None
           for key, lock in (("pg", PG_LOCK), ("http", HTTP_LOCK))},
        violations=V,
    )
    return res


def scorecard(res):
    lines = [
        "fencegate safety scorecard (seed %d)" % res["seed"],
        "  faults injected      %d (missed %d)" % (res["faults"], res["faults_missed"]),
    ]
    for k, v in sorted(res["by_kind"].items()):
        lines.append("    %-18s %4d injected, %4d bit, %d missed" % (k, v["injected"], v["bit"],
                                                                      v["missed"]))
    lines += [
        "  locks granted        %d  %s" % (res["grants"], res["acquire_outcomes"]),
        "  writes attempted     %d" % res["writes_attempted"],
        "    acknowledged       %d" % res["acknowledged"],
        "    refused            %d (STALE %d, LOCKLOST %d)" % (res["refused"], res["stale"],
                                                              res["locklost"]),
        "    unknown            %d" % res["unknown"],
        "    failed (not sent)  %d" % res["failed"],
        "  final counter %d, log length %d, high-water mark %d; redis started %d times, "
        "sidecars %s" % (res["final_counter"], res["log_length"], res["hwm"],
                         res["redis_starts"], res["sidecar_starts"]),
        "  acknowledged after the last fault: %d" % res["acked_after_last_fault"],
        "  pipelined runs sent as transactions: %d (the sidecars' last incarnations)"
        % res["fenced_txns"],
        "  churn locks bg0..bg%d: %d grants, writes %s" % (CHURN_LOCKS - 1, res["churn_grants"],
                                                         res["churn_writes"]),
        "  bank on k0..k%d: transfers %s, balances %s (sum %d)" % (
            BANK_ACCOUNTS - 1, res["bank_transfers"], res["bank_balances"],
            sum(res["bank_balances"])),
        "  etcd Txns shared by several acquisitions/releases: %d (last incarnations)"
        % res["shared_txns"],
        "  tokens repaired after a rollback of the lock Redis: %d" % res["token_repairs"],
    ]
    if res["pg"]:
        lines.append("  PostgreSQL lock %s: %d grants, batches %s, final counter %d, log %d"
                     % (PG_LOCK, res["pg"]["grants"], res["pg"]["writes"], res["pg"]["counter"],
                        res["pg"]["log"]))
    if res["http"]:
        lines.append("  HTTP store lock %s: %d grants, writes %s, final counter %d, log %d; "
                     "stale writes that reached the ledger (and it refused): %d"
                     % (HTTP_LOCK, res["http"]["grants"], res["http"]["writes"],
                        res["http"]["counter"], res["http"]["log"], res["http"]["ledger_stale"]))
    lines += [
        "  violations           %d" % len(res["violations"]),
    ]
    for v in res["violations"][:30]:
        lines.append("    ! " + v)
    if res["unexpected_errors"]:
        lines.append("  unexpected error replies: %s" % res["unexpected_errors"])
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="fencegate safety workload")
    ap.add_argument("--nemesis", default="mixed",
                    choices=list(NEMESES) + list(ETCD_NEMESES) + list(LOCK_REDIS_NEMESES) +
                    list(STORE_NEMESES) + list(PG_NEMESES) + list(HTTP_STORE_NEMESES) +
                    ["mixed"])
    ap.add_argument("--faults", type=int, default=200, help="stop after this many faults")
    ap.add_argument("--seconds", type=float, default=None, help="or after this many seconds")
    ap.add_argument("--workers", type=int, default=6, help="workers per sidecar")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--backend", default="redis", choices=["redis", "redis-apart", "etcd"],
                    help="lock backend: the store's Redis, a Redis of its own without "
                    "persistence (mixed also rolls it back to an older snapshot), or an etcd "
                    "started for the run")
    ap.add_argument("--etcd-members", type=int, default=1, choices=[1, 3],
                    help="members of that etcd; with 3, mixed also kills its leader")
    ap.add_argument("--pg", action="store_true",
                    help="a PostgreSQL store too, with SQL workers on lock P over the HTTP API "
                    "(mixed also kills PostgreSQL)")
    ap.add_argument("--http-store", action="store_true",
                    help="an HTTP store too (ledger.py), with ledger workers on lock H over the "
                    "HTTP API (mixed also kills the ledger)")
    ap.add_argument("--no-netns", action="store_true",
                    help="do not use a network namespace (partition = SIGSTOP Redis)")
    ap.add_argument("--history", help="write the history (JSON lines) and result here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like ^C, so the finally blocks stop every server and delete the namespace.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    netns_why = None if args.no_netns else NetNS.reason_unavailable()
    use_netns = not args.no_netns and netns_why is None
    if not args.no_netns and netns_why:
        print("no network namespace (%s): partitions are Redis SIGSTOPs" % netns_why)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    cap = args.seconds or max(600, args.faults * 20)
    rng = random.Random(args.seed)
    if (args.etcd_members == 3 or args.nemesis in ETCD_NEMESES) and args.backend != "etcd":
        ap.error("--etcd-members 3 and kill-etcd-leader need --backend etcd")
    if args.nemesis in PG_NEMESES and not args.pg:
        ap.error("kill-postgres needs --pg")
    if args.nemesis in HTTP_STORE_NEMESES and not args.http_store:
        ap.error("kill-http-store needs --http-store")
    if args.nemesis in LOCK_REDIS_NEMESES and args.backend != "redis-apart":
        ap.error("rollback-locks needs --backend redis-apart")
    if args.nemesis == "kill-etcd-leader" and args.etcd_members != 3:
        ap.error("kill-etcd-leader needs --etcd-members 3")
    if args.nemesis == "partition-etcd" and not use_netns:
        ap.error("partition-etcd needs a network namespace (%s)" % (netns_why or "--no-netns"))
    with Workload(workers_per_sidecar=args.workers, netns=use_netns, seed=args.seed, log=log,
                  hard_seconds=cap + 120, backend=args.backend,
                  etcd_members=args.etcd_members, pg=args.pg,
                  http_store=args.http_store) as wl:
        res = wl.run(schedule_for(args.nemesis, rng, use_netns, etcd=args.backend == "etcd",
                                  etcd3=args.etcd_members == 3,
                                  lock_redis=args.backend == "redis-apart", pg=args.pg,
                                  http_store=args.http_store,
                                  store_rollback=True),
                     seconds=cap, faults=args.faults)
        if args.history:
            with open(args.history, "w") as f:
                for e in wl.history:
                    f.write(json.dumps(e) + "\n")
                f.write(json.dumps(dict(result=res, faults=[x.as_dict() for x in wl.faults],
                                        final=wl.final)) + "\n")
        if res["violations"]:
            for s in wl.sidecars:
                print(s.log_tail(40))
    print(scorecard(res))
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
