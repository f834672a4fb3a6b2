"""`fencegate injector`, the mutating admission webhook, as the Kubernetes API server meets it:
AdmissionReviews POSTed over HTTPS, JSONPatches applied to the pod and the result checked,
idempotency, bad bodies, oversized bodies, certificate reloads, flags and SIGTERM."""

import base64
import copy
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import harness
from harness import FgTestCase, Fencegate, run_fencegate

FIXTURES = os.path.join(harness.HERE, "..", "unit", "fixtures", "admission")

IMAGE = "registry.example.com/fencegate:itest"
ENV = {
    "FENCEGATE_INJECT_IMAGE": IMAGE,
    "FENCEGATE_INJECT_CPU_REQUEST": "50m",
    "FENCEGATE_INJECT_MEMORY_REQUEST": "16Mi",
    "FENCEGATE_INJECT_CPU_LIMIT": "500m",
    "FENCEGATE_INJECT_MEMORY_LIMIT": "64Mi",
    "FENCEGATE_INJECT_BACKEND": "etcd://etcd-0.etcd.fencegate:2379",
    "FENCEGATE_INJECT_UPSTREAM": "redis://redis.shop:6379",
    "FENCEGATE_INJECT_GRACE_MS": "12000",
    "FENCEGATE_INJECT_BACKEND_PREFIX": "/shop/locks/",
    "FENCEGATE_INJECT_SESSION_TTL_MS": "15000",
    "FENCEGATE_INJECT_LOG_LEVEL": "warn",
}
SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
APP_ENV = {"FENCEGATE_RESP_ADDR": "127.0.0.1:6380", "FENCEGATE_HTTP_ADDR": "127.0.0.1:8380"}


def fixture(name):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        return f.read()


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def openssl(*args, cwd):
    p = subprocess.run(["openssl"] + list(args), cwd=cwd, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("openssl %s failed: %s" % (" ".join(args),
                                                        p.stderr.decode(errors="replace")))


def make_pki(d, prefix):
    """A CA and a server certificate it signed for localhost/127.0.0.1 and the in-cluster
    service name, as cert-manager would issue for the webhook. Returns (ca, cert, key) paths."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca, ca_key = prefix + "ca.crt", prefix + "ca.key"
    crt, key, csr = prefix + "tls.crt", prefix + "tls.key", prefix + "tls.csr"
    ext = os.path.join(d, prefix + "ext.cnf")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1,"
                "DNS:fencegate-injector.fencegate.svc\n")
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2",
            "-subj", "/CN=fencegate test CA " + prefix, cwd=d)
    openssl("req", *ec, "-keyout", key, "-out", csr,
            "-subj", "/CN=fencegate-injector.fencegate.svc", cwd=d)
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", crt, "-days", "2", "-extfile", ext, cwd=d)
    return tuple(os.path.join(d, p) for p in (ca, crt, key))


# ---- JSONPatch (RFC 6902 "add", the only operation the injector emits) ----------------------

def _pointer(path):
    if not path.startswith("/"):
        raise ValueError("JSON Pointer %r does not start with '/'" % path)
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_patch(doc, ops):
    """Applies RFC 6902 "add" operations to a copy of doc, strictly: the parent must exist, "-"
    appends to an existing array, an array index must be in range. Raises ValueError."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if set(op) != {"op", "path", "value"} or op["op"] != "add":
            raise ValueError("unexpected operation %r" % op)
        tokens = _pointer(op["path"])
        parent = doc
        for t in tokens[:-1]:
            if isinstance(parent, list):
                parent = parent[int(t)]
            elif isinstance(parent, dict):
                if t not in parent:
                    raise ValueError("%s: %r does not exist" % (op["path"], t))
                parent = parent[t]
            else:
                raise ValueError("%s: cannot descend into %r" % (op["path"], parent))
        last, value = tokens[-1], copy.deepcopy(op["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                i = int(last)
                if i > len(parent):
                    raise ValueError("%s: index out of range" % op["path"])
                parent.insert(i, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise ValueError("%s: parent is %r" % (op["path"], parent))
    return doc


class Injector(FgTestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fg-injector-")
        cls.ca, cls.crt, cls.key = make_pki(cls.dir, "a-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def start_injector(self, env=None, cert=None, key=None, args=()):
        port = harness.free_port()
        e = dict(ENV)
        e.update(env or {})
        fg = Fencegate(args=["injector", "--listen", "127.0.0.1:%d" % port,
                             "--cert", cert or self.crt, "--key", key or self.key,
                             "--log-level", "debug"] + list(args), with_ports=False, env=e)
        fg.port = port
        self._fg_procs.append(fg)
        self.addCleanup(fg.cleanup)
        fg.start()
        deadline = time.monotonic() + harness.START_TIMEOUT
        while True:
            if not fg.alive():
                fg._collect()
                self.fail("injector exited with %s: %s" % (fg.returncode, fg.stderr_text))
            try:
                if self.request(fg, "GET", "/healthz")[0] == 200:
                    return fg
            except (OSError, ssl.SSLError, http.client.HTTPException):
                pass
            if time.monotonic() >= deadline:
                self.fail("injector not answering /healthz within %.0fs" % harness.START_TIMEOUT)
            time.sleep(0.05)

    def context(self, ca=None):
        return ssl.create_default_context(cafile=ca or self.ca)

    def request(self, fg, method, path, body=None, ctype="application/json", ca=None,
                timeout=10.0):
        """One HTTPS request, verifying the server against the test CA. Returns (status,
        lower-cased headers, body bytes)."""
        c = http.client.HTTPSConnection("127.0.0.1", fg.port, timeout=timeout,
                                        context=self.context(ca))
        try:
            headers = {"Content-Type": ctype} if body is not None else {}
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def mutate(self, fg, body):
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        return self.request(fg, "POST", "/mutate?timeout=10s", body)

    def review_ok(self, fg, review):
        """POSTs review and checks the answer's envelope; returns its response object."""
        status, headers, data = self.mutate(fg, review)
        self.assertEqual(status, 200, data)
        self.assertEqual(headers.get("content-type"), "application/json")
        out = json.loads(data)
        self.assertEqual(out["apiVersion"], "admission.k8s.io/v1")
        self.assertEqual(out["kind"], "AdmissionReview")
        resp = out["response"]
        self.assertEqual(resp["uid"], review["request"]["uid"])
        self.assertIs(resp["allowed"], True)
        return resp

    # ---- pods that get the sidecar -------------------------------------------------------

    def check_injected(self, original, pod, config=None, app_health=None):
        """Validates a patched pod against the one it came from. app_health: the sidecar's
        FENCEGATE_APP_HEALTH_URL expected from fencegate.io/app-health-url (None: not set)."""
        init = pod["spec"]["initContainers"]
        sidecars = [c for c in init if c["name"] == "fencegate"]
        self.assertEqual(len(sidecars), 1, init)
        # Existing init containers run first (they may set up the network); the sidecar last.
        self.assertEqual(init[:-1], original["spec"].get("initContainers", []))
        s = init[-1]
        self.assertEqual(s["name"], "fencegate")
        self.assertEqual(s["image"], IMAGE)
        self.assertEqual(s["restartPolicy"], "Always")
        self.assertEqual(s["startupProbe"], {"httpGet": {"path": "/readyz", "port": 8380},
                                             "periodSeconds": 1, "failureThreshold": 60})
        self.assertEqual(s["readinessProbe"]["httpGet"], {"path": "/readyz", "port": 8380})
        self.assertEqual(s["livenessProbe"]["httpGet"], {"path": "/healthz", "port": 8380})
        self.assertEqual(s["securityContext"], SECURITY_CONTEXT)
        self.assertEqual(s["resources"], {"requests": {"cpu": "50m", "memory": "16Mi"},
                                          "limits": {"cpu": "500m", "memory": "64Mi"}})
        self.assertEqual(sorted((p["containerPort"], p["protocol"]) for p in s["ports"]),
                         [(6380, "TCP"), (8380, "TCP")])
        env = {e["name"]: e["value"] for e in s["env"]}
        self.assertEqual(len(env), len(s["env"]), "duplicate variables in %r" % s["env"])
        if app_health is None:
            self.assertNotIn("FENCEGATE_APP_HEALTH_URL", env)
        else:
            self.assertEqual(env.pop("FENCEGATE_APP_HEALTH_URL"), app_health)
        if config is None:
            self.assertNotIn("args", s)
            self.assertNotIn("volumeMounts", s)
            self.assertEqual(env, {"FENCEGATE_LISTEN_HTTP": "0.0.0.0:8380",
                                   "FENCEGATE_BACKEND": ENV["FENCEGATE_INJECT_BACKEND"],
                                   "FENCEGATE_UPSTREAM": ENV["FENCEGATE_INJECT_UPSTREAM"],
                                   "FENCEGATE_SHUTDOWN_GRACE_MS": "12000",
                                   "FENCEGATE_BACKEND_PREFIX": "/shop/locks/",
                                   "FENCEGATE_SESSION_TTL_MS": "15000",
                                   "FENCEGATE_LOG_LEVEL": "warn"})
            self.assertEqual(pod["spec"].get("volumes"), original["spec"].get("volumes"))
        else:
            self.assertEqual(s["args"], ["--config", "/etc/fencegate/config.yaml"])
            self.assertEqual(s["volumeMounts"], [{"name": "fencegate-config",
                                                  "mountPath": "/etc/fencegate",
                                                  "readOnly": True}])
            self.assertEqual(env, {"FENCEGATE_LISTEN_HTTP": "0.0.0.0:8380"})
            self.assertEqual(pod["spec"]["volumes"],
                             original["spec"].get("volumes", []) +
                             [{"name": "fencegate-config", "configMap": {"name": config}}])

        # Every app container: its own variables first, unchanged, then the two addresses
        # unless it set them itself.
        self.assertEqual(len(pod["spec"]["containers"]), len(original["spec"]["containers"]))
        for before, after in zip(original["spec"]["containers"], pod["spec"]["containers"]):
            own = before.get("env", [])
            self.assertEqual(after["env"][:len(own)], own)
            names = [e["name"] for e in after["env"]]
            for k, v in APP_ENV.items():
                self.assertEqual(names.count(k), 1, (after["name"], names))
                if k not in [e["name"] for e in own]:
                    self.assertIn({"name": k, "value": v}, after["env"])
            rest = {k: v for k, v in after.items() if k != "env"}
            self.assertEqual(rest, {k: v for k, v in before.items() if k != "env"})

        ann = dict(original["metadata"]["annotations"])
        ann["fencegate.io/status"] = "injected"
        self.assertEqual(pod["metadata"]["annotations"], ann)

        # Nothing else changed.
        a, b = copy.deepcopy(original), copy.deepcopy(pod)
        for p in (a, b):
            p["spec"].pop("initContainers", None)
            p["spec"].pop("volumes", None)
            p["spec"].pop("containers")
            p["metadata"].pop("annotations")
        self.assertEqual(a, b)

    def test_fixtures_injected_and_idempotent(self):
        fg = self.start_injector()
        cases = [("annotated.json", None), ("annotated_config.json", "orders-fencegate"),
                 ("existing_env_init.json", None)]
        for name, config in cases:
            with self.subTest(name):
                review = json.loads(fixture(name))
                resp = self.review_ok(fg, review)
                self.assertEqual(resp["patchType"], "JSONPatch")
                ops = json.loads(base64.b64decode(resp["patch"], validate=True))
                original = review["request"]["object"]
                pod = apply_patch(original, ops)
                self.check_injected(original, pod, config)

                # The API server may call again (reinvocation, retries): no second sidecar.
                again = copy.deepcopy(review)
                again["request"]["uid"] = "11111111-2222-4333-8444-555555555555"
                again["request"]["object"] = pod
                resp2 = self.review_ok(fg, again)
                self.assertNotIn("patch", resp2)
                self.assertNotIn("patchType", resp2)

    def test_app_health_url_annotation(self):
        """fencegate.io/app-health-url: the sidecar gets FENCEGATE_APP_HEALTH_URL with exactly
        that value, with or without a ConfigMap (the pod's annotation overrides the file's
        app_health.url); "" is no health gate; a value the sidecar could not use is answered as
        a bad fencegate.io/config is: allowed, no sidecar, a warning naming the annotation."""
        fg = self.start_injector()
        url = "http://127.0.0.1:8080/healthz/ready"
        cases = [("annotated.json", None), ("annotated_config.json", "orders-fencegate"),
                 ("existing_env_init.json", None)]
        for name, config in cases:
            for value, want in [(url, url), ("", None)]:
                with self.subTest(name=name, value=value):
                    review = json.loads(fixture(name))
                    review["request"]["object"]["metadata"]["annotations"][
                        "fencegate.io/app-health-url"] = value
                    resp = self.review_ok(fg, review)
                    self.assertEqual(resp["patchType"], "JSONPatch")
                    self.assertNotIn("warnings", resp)
                    ops = json.loads(base64.b64decode(resp["patch"], validate=True))
                    original = review["request"]["object"]
                    pod = apply_patch(original, ops)
                    self.check_injected(original, pod, config, app_health=want)
                    sidecar = pod["spec"]["initContainers"][-1]
                    if want is not None:
                        # Last of the sidecar's variables, after the cluster-wide ones.
                        self.assertEqual(sidecar["env"][-1],
                                         {"name": "FENCEGATE_APP_HEALTH_URL", "value": want})
                    # The application's containers do not get it.
                    for c in pod["spec"]["containers"]:
                        self.assertNotIn("FENCEGATE_APP_HEALTH_URL",
                                         [e["name"] for e in c["env"]])
                    # Called again with the patched pod: nothing more.
                    again = copy.deepcopy(review)
                    again["request"]["uid"] = "22222222-2222-4333-8444-555555555555"
                    again["request"]["object"] = pod
                    self.assertNotIn("patch", self.review_ok(fg, again))

        longest = "http://app.shop.svc:8080/" + "h" * (1023 - 25)
        review = json.loads(fixture("annotated.json"))
        review["request"]["object"]["metadata"]["annotations"][
            "fencegate.io/app-health-url"] = longest
        resp = self.review_ok(fg, review)
        pod = apply_patch(review["request"]["object"],
                          json.loads(base64.b64decode(resp["patch"], validate=True)))
        self.check_injected(review["request"]["object"], pod, app_health=longest)

        bad = [
            ("https://127.0.0.1:8443/healthz",
             '"https://127.0.0.1:8443/healthz": not an http:// URL'),
            ("healthz", '"healthz": not an http:// URL'),
            ("http://app/health check", '"http://app/health check": byte 17 is 0x20'),
            ("http://app/\nx", '"http://app/\\x0Ax": byte 11 is 0x0A'),
            ("http://", '"http://": no host'),
            ("http://app/healthz?full=1",
             '"http://app/healthz?full=1": query strings and fragments are not supported'),
            ("http://probe@app/healthz",
             '"http://probe@app/healthz": user info (USER@) is not supported'),
            (longest + "h", '"(too long)": longer than 1023 bytes'),
        ]
        for value, message in bad:
            with self.subTest(value=value[:40]):
                review = json.loads(fixture("annotated.json"))
                review["request"]["object"]["metadata"]["annotations"][
                    "fencegate.io/app-health-url"] = value
                resp = self.review_ok(fg, review)
                self.assertNotIn("patch", resp)
                self.assertNotIn("patchType", resp)
                text = resp["status"]["message"]
                self.assertIn("annotation fencegate.io/app-health-url is " + message, text)
                self.assertIn("no sidecar injected", text)
                self.assertEqual(resp["warnings"], [text])
        self.assertTrue(fg.alive())

    def test_keep_alive_and_many_reviews(self):
        """The API server keeps its connection: 50 reviews on one TLS connection."""
        fg = self.start_injector()
        body = fixture("existing_env_init.json")
        c = http.client.HTTPSConnection("127.0.0.1", fg.port, timeout=10,
                                        context=self.context())
        self.addCleanup(c.close)
        for i in range(50):
            c.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            out = json.loads(r.read())
            self.assertEqual(r.status, 200)
            self.assertIn("patch", out["response"])

    # ---- reviews answered without a patch ------------------------------------------------

    def test_left_alone(self):
        fg = self.start_injector()
        cases = [
            ("unannotated.json", None),
            ("annotated_false.json", None),
            ("already_injected.json", None),
            ("named_fencegate.json", "spec.containers[1] is named fencegate"),
            ("delete.json", None),
            ("annotated_yes.json", 'fencegate.io/inject is "yes"'),
            ("deployment.json", "only Pods are injected"),
            ("object_missing.json", "request.object is missing"),
        ]
        for name, message in cases:
            with self.subTest(name):
                resp = self.review_ok(fg, json.loads(fixture(name)))
                self.assertNotIn("patch", resp)
                if message is None:
                    self.assertNotIn("status", resp)
                else:
                    self.assertIn(message, resp["status"]["message"])
                    self.assertEqual(resp["warnings"], [resp["status"]["message"]])

    # ---- bad requests --------------------------------------------------------------------

    def test_bad_requests_never_hurt_the_server(self):
        fg = self.start_injector()
        for name, want in [("garbage.txt", "invalid JSON"), ("truncated.json", "invalid JSON"),
                           ("no_uid.json", "request.uid: missing")]:
            with self.subTest(name):
                status, headers, data = self.mutate(fg, fixture(name))
                self.assertEqual(status, 400)
                self.assertEqual(headers.get("content-type"), "application/json")
                self.assertIn(want, json.loads(data)["error"])
        status, _, data = self.mutate(fg, b"")
        self.assertEqual(status, 400)
        self.assertIn("empty document", json.loads(data)["error"])

        status, _, _ = self.request(fg, "POST", "/mutate", fixture("annotated.json"),
                                    ctype="text/plain")
        self.assertEqual(status, 415)
        status, headers, _ = self.request(fg, "GET", "/mutate")
        self.assertEqual((status, headers.get("allow")), (405, "POST"))
        status, headers, _ = self.request(fg, "PUT", "/healthz", b"{}")
        self.assertEqual((status, headers.get("allow")), (405, "GET, HEAD"))
        self.assertEqual(self.request(fg, "GET", "/nope")[0], 404)

        # Not TLS at all, and a TLS client that hangs up mid-handshake.
        with socket.create_connection(("127.0.0.1", fg.port), timeout=5) as s:
            s.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            try:
                s.recv(100)
            except OSError:
                pass
        with socket.create_connection(("127.0.0.1", fg.port), timeout=5) as s:
            s.sendall(b"\x16\x03\x01\x00\xff\x01")
        self.assertTrue(fg.alive())
        self.assertEqual(self.request(fg, "GET", "/healthz")[0], 200)
        self.assertEqual(self.review_ok(fg, json.loads(fixture("annotated.json")))["patchType"],
                         "JSONPatch")

    def test_oversized_body_413(self):
        fg = self.start_injector()
        status, _, _ = self.mutate(fg, b" " * (5 * 1024 * 1024))
        self.assertEqual(status, 413)
        self.assertTrue(fg.alive())
        self.assertEqual(self.request(fg, "GET", "/healthz")[0], 200)
        # Just under the limit is read: a review padded with whitespace to 4 MiB.
        body = fixture("annotated.json")
        body += b" " * (4 * 1024 * 1024 - len(body))
        self.assertEqual(len(body), 4 * 1024 * 1024)
        status, _, data = self.mutate(fg, body)
        self.assertEqual(status, 200, data)
        self.assertEqual(json.loads(data)["response"]["uid"],
                         json.loads(body)["request"]["uid"])

    # ---- certificates, flags, signals ----------------------------------------------------

    def test_certificate_reload_on_sighup(self):
        d = tempfile.mkdtemp(prefix="fg-injector-rot-")
        self.addCleanup(shutil.rmtree, d, True)
        crt, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        shutil.copy(self.crt, crt)
        shutil.copy(self.key, key)
        fg = self.start_injector(cert=crt, key=key)
        ca2, crt2, key2 = make_pki(self.dir, "b-")
        # A new certificate beside the old key first: refused, the old pair keeps serving.
        shutil.copy(crt2, crt)
        fg.signal(signal.SIGHUP)
        harness.wait_until(lambda: "keeping the current certificate" in read_text(fg.stderr_path),
                           5, what="the mismatched pair to be refused")
        self.assertEqual(self.request(fg, "GET", "/healthz")[0], 200)
        # Then the key: the new pair is taken.
        shutil.copy(key2, key)
        fg.signal(signal.SIGHUP)
        harness.wait_until(lambda: self.request(fg, "GET", "/healthz", ca=ca2)[0] == 200, 5,
                           what="the new certificate to be served")
        with self.assertRaises(ssl.SSLError):
            self.request(fg, "GET", "/healthz")  # the old CA no longer verifies it
        fg.stop(expect_rc=0)

    def test_sigterm_exits_zero(self):
        fg = self.start_injector()
        self.review_ok(fg, json.loads(fixture("annotated.json")))
        self.assertEqual(fg.stop(expect_rc=0), 0)
        self.assertIn("SIGTERM received", fg.stderr_text)

    def test_sigterm_keeps_serving_for_the_shutdown_delay(self):
        """A terminating injector pod stays in the Service's endpoints, and in the API
        server's kept-alive connections, for a moment after SIGTERM: with failurePolicy Fail a
        review sent then and refused fails a pod's creation. With --shutdown-delay the injector
        answers for that long (replies say Connection: close, so the API server reconnects to
        another replica), then exits 0; a second signal exits at once."""
        fg = self.start_injector(args=["--shutdown-delay", "2"])
        review = json.loads(fixture("annotated.json"))
        body = json.dumps(review)
        c = http.client.HTTPSConnection("127.0.0.1", fg.port, timeout=10,
                                        context=self.context())
        self.addCleanup(c.close)
        c.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        self.assertEqual(r.status, 200)
        self.assertNotEqual((r.getheader("Connection") or "").lower(), "close")
        t0 = time.monotonic()
        fg.signal(signal.SIGTERM)
        harness.wait_until(lambda: "SIGTERM received" in read_text(fg.stderr_path), 5,
                           what="the SIGTERM to be logged")
        # The kept-alive connection and a new one are both still answered.
        c.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertIn("patch", json.loads(r.read())["response"])
        self.assertEqual((r.getheader("Connection") or "").lower(), "close")
        self.assertEqual(self.review_ok(fg, review)["patchType"], "JSONPatch")
        self.assertTrue(fg.alive())
        self.assertEqual(fg.wait_exit(10), 0)
        self.assertGreaterEqual(time.monotonic() - t0, 1.8)

        fg = self.start_injector(args=["--shutdown-delay", "30"])
        fg.signal(signal.SIGTERM)
        harness.wait_until(lambda: "SIGTERM received" in read_text(fg.stderr_path), 5,
                           what="the SIGTERM to be logged")
        fg.signal(signal.SIGTERM)
        self.assertEqual(fg.wait_exit(5), 0)

    def test_flag_and_file_errors(self):
        port = "127.0.0.1:%d" % harness.free_port()
        cases = [
            ([], "flag --listen is required"),
            (["--listen", port, "--cert", self.crt], "flag --key is required"),
            (["--listen", "127.0.0.1:99999", "--cert", self.crt, "--key", self.key],
             "flag --listen: bad address '127.0.0.1:99999'"),
            (["--listen", port, "--cert", self.crt, "--key", self.key, "--bogus"],
             "unknown flag '--bogus'"),
            (["--listen", port, "--cert", self.crt, "--key"], "flag --key needs a value"),
            (["--listen", port, "--cert", "/nonexistent/tls.crt", "--key", self.key],
             "cannot read certificate file '/nonexistent/tls.crt'"),
            (["--listen", port, "--cert", self.key, "--key", self.key],
             "cannot load certificate file '%s'" % self.key),
            (["--listen", port, "--cert", self.crt, "--key", self.ca],
             "cannot load key file '%s'" % self.ca),
            (["--listen", port, "--cert", self.crt, "--key", self.key, "--log-level", "loud"],
             "flag --log-level: 'loud'"),
            (["--listen", port, "--cert", self.crt, "--key", self.key, "--shutdown-delay", "5s"],
             "flag --shutdown-delay: '5s' is not a number of seconds in 0..300"),
            (["--listen", port, "--cert", self.crt, "--key", self.key, "--shutdown-delay",
              "301"], "flag --shutdown-delay: '301' is not a number of seconds in 0..300"),
        ]
        for args, want in cases:
            with self.subTest(want):
                rc, out, err = run_fencegate(["injector"] + args)
                self.assertEqual(rc, 2, err)
                self.assertIn(want, err)
        rc, _, err = run_fencegate(["injector", "--listen", port, "--cert", self.crt,
                                    "--key", self.key], env={"FENCEGATE_INJECT_GRACE_MS": "-5"})
        self.assertEqual(rc, 2)
        self.assertIn("FENCEGATE_INJECT_GRACE_MS", err)
        rc, _, err = run_fencegate(["injector", "--listen", port, "--cert", self.crt,
                                    "--key", self.key], env={"FENCEGATE_INJECT_IMAGE": "a b"})
        self.assertEqual(rc, 2)
        self.assertIn("FENCEGATE_INJECT_IMAGE: byte 1 is 0x20", err)
        rc, out, _ = run_fencegate(["injector", "--help"])
        self.assertEqual(rc, 0)
        self.assertIn("fencegate injector --listen HOST:PORT --cert FILE --key FILE", out)
        rc, out, _ = run_fencegate(["--help"])
        self.assertEqual(rc, 0)
        self.assertIn("fencegate injector --listen HOST:PORT --cert FILE --key FILE", out)


if __name__ == "__main__":
    unittest.main()
