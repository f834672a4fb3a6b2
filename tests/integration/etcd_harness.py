"""etcd_harness.py — real etcd servers for the integration tests: a single member or a cluster
of members on loopback ports picked free, each in its own temporary data directory, stopped (and
removed) by the test's cleanup; plus `etcdctl` for assertions made beside fencegate.
"""

import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile

import harness

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


def etcd_missing():
    """None when etcd and etcdctl are installed, else what is missing."""
    missing = [p for p in (ETCD, ETCDCTL) if not os.access(p, os.X_OK)]
    if missing:
        return "not installed: %s (apt-get install etcd-server etcd-client)" % ", ".join(missing)
    return None


class EtcdMember:
    def __init__(self, name, cluster):
        self.name = name
        self.cluster = cluster
        self.client_port = harness.free_port()
        self.peer_port = harness.free_port()
        self.dir = tempfile.mkdtemp(prefix="fg-etcd-")
        self.log_path = os.path.join(self.dir, "etcd.log")
        self.proc = None
        self.log_text = ""

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.client_port

    @property
    def client_url(self):
        return ("https://" if self.cluster.tls else "http://") + self.endpoint

    def listen_urls(self):
        """Where it takes clients: its endpoint, and the same port on the cluster's other
        client_hosts."""
        scheme = "https://" if self.cluster.tls else "http://"
        return ",".join("%s%s:%d" % (scheme, h, self.client_port)
                        for h in self.cluster.client_hosts)

    @property
    def peer_url(self):
        return "http://127.0.0.1:%d" % self.peer_port

    def start(self, state="new"):
        assert self.proc is None or self.proc.poll() is not None, "etcd already running"
        tls = self.cluster.tls
        argv = [ETCD, "--name", self.name, "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", self.listen_urls(),
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", self.cluster.initial_cluster(),
                "--initial-cluster-state", state,
                "--initial-cluster-token", self.cluster.token,
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-outputs", "stderr"] + list(self.cluster.extra_args)
        if tls:  # clients must show a certificate of the test CA
            argv += ["--cert-file", tls["server.crt"], "--key-file", tls["server.key"],
                     "--client-cert-auth", "--trusted-ca-file", tls["ca.crt"]]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, env=harness.clean_env())
        log.close()
        return self

    def healthy(self):
        try:
            tls = self.cluster.tls
            if tls:
                ctx = ssl.create_default_context(cafile=tls["ca.crt"])
                ctx.load_cert_chain(tls["client.crt"], tls["client.key"])
                c = http.client.HTTPSConnection("127.0.0.1", self.client_port, timeout=1,
                                                context=ctx)
            else:
                c = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=1)
            c.request("GET", "/health")
            r = c.getresponse()
            body = r.read()
            c.close()
            return r.status == 200 and json.loads(body).get("health") == "true"
        except (OSError, ValueError, http.client.HTTPException, ssl.SSLError):
            return False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(harness.STOP_TIMEOUT)

    def freeze(self):
        """SIGSTOPs the member and returns once it is stopped: a signal is delivered a moment
        after kill() returns, and on a loaded machine a request sent at once could be answered
        first."""
        self.proc.send_signal(signal.SIGSTOP)
        harness.wait_until(lambda: self._state() in ("T", "t", None), 2, 0.001,
                           "etcd stopped by SIGSTOP")

    def _state(self):
        """The process's state letter from /proc/PID/stat, None once it is gone."""
        try:
            with open("/proc/%d/stat" % self.proc.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None

    def thaw(self):
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        self.log_text = self.log_tail()
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(harness.STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(harness.STOP_TIMEOUT)

    def log_tail(self, n=40):
        return harness._tail(self.log_path, n)

    def restore(self, snapshot):
        """Stops the member and replaces its data with `etcdctl snapshot restore` of snapshot (a
        file `etcdctl snapshot save` wrote), as an operator recovers from a disaster: the keys,
        leases and revision of the snapshot, the same member name and peer URL; start() then
        serves it on the same port."""
        self.stop()
        data = os.path.join(self.dir, "data")
        shutil.rmtree(data)
        env = harness.clean_env({"ETCDCTL_API": "3"})
        p = subprocess.run([ETCDCTL, "snapshot", "restore", snapshot, "--data-dir", data,
                            "--name", self.name, "--initial-cluster",
                            self.cluster.initial_cluster(), "--initial-cluster-token",
                            self.cluster.token, "--initial-advertise-peer-urls", self.peer_url],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30, env=env)
        if p.returncode != 0:
            raise AssertionError("etcdctl snapshot restore failed (%d): %s" % (
                p.returncode, p.stderr.decode(errors="replace")))
        return self


def make_certs(dir):
    """A test CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and a
    second CA that signed neither, made with the openssl command in dir. Returns their paths by
    name: ca.crt, server.crt/.key, client.crt/.key, other-ca.crt."""
    def run(*args):
        p = subprocess.run(["openssl"] + list(args), cwd=dir, capture_output=True, timeout=30)
        if p.returncode != 0:
            raise AssertionError("openssl %s: %s" % (args[0], p.stderr.decode(errors="replace")))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        run("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "2",
            "-subj", "/CN=fencegate test " + ca)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                 "extendedKeyUsage=serverAuth,clientAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(dir, name + ".ext"), "w") as f:
            f.write(ext)
        run("req", "-new", *ec, "-keyout", name + ".key", "-out", name + ".csr",
            "-subj", "/CN=fencegate test " + name)
        run("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext")
    return {n: os.path.join(dir, n) for n in ("ca.crt", "server.crt", "server.key",
                                               "client.crt", "client.key", "other-ca.crt")}


class EtcdCluster:
    """n etcd members forming one cluster (n = 1 is a single node)."""

    def __init__(self, n=1, extra_args=(), tls=None, client_hosts=("127.0.0.1",)):
        self.token = "fg-%d-%d" % (os.getpid(), harness.free_port())
        self.extra_args = extra_args
        self.client_hosts = client_hosts  # addresses the members take clients on
        self.tls = tls  # make_certs(): clients over TLS with a certificate
        self.user = None  # "root:pw" for etcdctl once enable_auth() ran
        self.members = [EtcdMember("m%d" % i, self) for i in range(n)]

    def initial_cluster(self):
        return ",".join("%s=%s" % (m.name, m.peer_url) for m in self.members)

    @property
    def url(self):
        return ("etcds://" if self.tls else "etcd://") + ",".join(m.endpoint for m in self.members)

    def url_for(self, host):
        """The backend URL through another of client_hosts."""
        return ("etcds://" if self.tls else "etcd://") + ",".join(
            "%s:%d" % (host, m.client_port) for m in self.members)

    @property
    def endpoints(self):
        return ",".join(m.endpoint for m in self.members if m.alive())

    def start(self):
        for m in self.members:
            m.start()
        harness.wait_until(lambda: all(m.healthy() for m in self.members), 30, 0.1,
                           "etcd members healthy")
        return self

    def stop(self):
        for m in self.members:
            m.stop()

    def cleanup(self):
        self.stop()
        for m in self.members:
            shutil.rmtree(m.dir, ignore_errors=True)

    def ctl(self, *args, timeout=10, check=True):
        """Runs etcdctl (API v3) against the live members; returns stdout text."""
        env = harness.clean_env({"ETCDCTL_API": "3"})
        user = ["--user", self.user] if self.user else []
        if self.tls:
            user += ["--cacert", self.tls["ca.crt"], "--cert", self.tls["client.crt"],
                     "--key", self.tls["client.key"]]
        p = subprocess.run([ETCDCTL, "--endpoints", self.endpoints, "--command-timeout=5s"] +
                           user + list(args), stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout, env=env)
        if check and p.returncode != 0:
            raise AssertionError("etcdctl %s failed (%d): %s" % (
                " ".join(args), p.returncode, p.stderr.decode(errors="replace")))
        return p.stdout.decode(errors="replace")

    def enable_auth(self, root_password, users=()):
        """Turns on etcd's authentication with user root, plus each (name, password, prefix):
        a user whose role may read and write keys under prefix. etcdctl then acts as root."""
        self.ctl("user", "add", "root:" + root_password)
        for name, password, prefix in users:
            self.ctl("role", "add", name + "-role")
            self.ctl("role", "grant-permission", name + "-role", "--prefix=true", "readwrite",
                     prefix)
            self.ctl("user", "add", "%s:%s" % (name, password))
            self.ctl("user", "grant-role", name, name + "-role")
        self.ctl("auth", "enable")
        self.user = "root:" + root_password

    def ctl_popen(self, *args):
        env = harness.clean_env({"ETCDCTL_API": "3"})
        return subprocess.Popen([ETCDCTL, "--endpoints", self.endpoints] + list(args),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)

    def keys(self, prefix):
        """[(key, create_revision, lease)] under prefix, oldest first."""
        out = json.loads(self.ctl("get", "--prefix", prefix, "-w", "json"))
        import base64
        kvs = [(base64.b64decode(kv["key"]).decode(), int(kv["create_revision"]),
                int(kv.get("lease", 0))) for kv in out.get("kvs", [])]
        return sorted(kvs, key=lambda k: k[1])

    def leader(self):
        """The member that is leader now, or None."""
        for m in self.members:
            if not m.alive():
                continue
            env = harness.clean_env({"ETCDCTL_API": "3"})
            p = subprocess.run([ETCDCTL, "--endpoints", m.endpoint, "endpoint", "status",
                                "-w", "json"], capture_output=True, timeout=10, env=env)
            if p.returncode != 0:
                continue
            st = json.loads(p.stdout)[0]["Status"]
            if st["header"]["member_id"] == st["leader"]:
                return m
        return None


class EtcdTestCase(harness.FgTestCase):
    """FgTestCase with etcd clusters whose logs are printed when a test fails."""

    def run(self, result=None):
        self._etcd = []
        before = (len(result.failures) + len(result.errors)) if result is not None else 0
        out = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > before:
            import sys
            for c in self._etcd:
                for m in c.members:
                    sys.stderr.write("\n---- etcd %s log tail ----\n%s\n" % (
                        m.name, m.log_text))
        return out

    @staticmethod
    def fg_log(fg):
        """What fencegate wrote to stderr so far."""
        with open(fg.stderr_path, errors="replace") as f:
            return f.read()

    def start_etcd(self, n=1, extra_args=(), tls=None):
        missing = etcd_missing()
        if missing:
            self.fail(missing)
        c = EtcdCluster(n, extra_args, tls)
        self._etcd.append(c)
        self.addCleanup(c.cleanup)
        return c.start()

    def cut_answers(self, member):
        """Drops every packet member sends to its clients (from its client port, on loopback)
        until the heal returned is called or the test ends: requests still reach it and are
        applied, their answers are late (TCP sends them again after the heal). Skips without
        root or iptables."""
        return self.drop_on_loopback(["-s", "127.0.0.1", "--sport", str(member.client_port)])

    def start_fg_etcd(self, redis_server, etcd, args=(), **kw):
        """fencegate in front of redis_server with etcd as the lock backend."""
        return self.start_fencegate(redis_server, args=["--backend", etcd.url] + list(args), **kw)
