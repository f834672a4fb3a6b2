"""fencegate with the two most used Node.js Redis clients, ioredis and node-redis v4 (DESIGN.md §2
"Drop-in"): node/clients.js runs the same scenarios through fencegate and straight against Redis
and compares them; this test starts the servers, restarts Redis when the script asks (the
"reconnect" scenario), and turns each scenario's JSON line into a subTest.

The npm packages are installed from node/package-lock.json with `npm ci` when node/node_modules
is missing. Without node or npm the test fails and says which one to install."""

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

import harness
from harness import FgTestCase

NODE_DIR = os.path.join(harness.HERE, "node")
SCRIPT = os.path.join(NODE_DIR, "clients.js")
NPM_CI_TIMEOUT = 300   # seconds `npm ci` may take
RUN_TIMEOUT = 110      # seconds clients.js may take in all (it stops itself at 100)
RESTART_TIMEOUT = 20   # seconds to restart Redis when asked

# Every scenario clients.js must report, per library: a missing line is a failure too.
COMMON = ["connect_ping", "binary_buffers", "pipeline_500", "multi_exec", "watch_conflict",
          "select_db_option", "pubsub", "blpop_wakeup", "scan_2000", "eval_lua", "client_name",
          "fenced_multi", "fence_lock", "reconnect"]
EXPECTED = {
    "ioredis": COMMON + ["auto_pipelining_1000"],
    "node-redis": COMMON + ["resp2_defaults"],
}

_npm_lock = threading.Lock()


def ensure_node_modules():
    """Installs the pinned packages with `npm ci` unless node_modules is there. Returns the path
    of node; raises AssertionError naming what is missing or what npm said."""
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        raise AssertionError("node is not installed: install the Debian packages nodejs and npm "
                             "(scripts/deps.sh test lists them)")
    with _npm_lock:
        if os.path.isdir(os.path.join(NODE_DIR, "node_modules", "ioredis")) and os.path.isdir(
                os.path.join(NODE_DIR, "node_modules", "redis")):
            return node
        npm = shutil.which("npm")
        if not npm:
            raise AssertionError("npm is not installed, and %s/node_modules is missing: install "
                                 "the Debian package npm, or run `npm ci` in %s" % (NODE_DIR,
                                                                                    NODE_DIR))
        try:
            p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                               stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=NPM_CI_TIMEOUT, env=harness.clean_env())
        except subprocess.TimeoutExpired:
            raise AssertionError("`npm ci` in %s did not finish within %d s (is the npm registry "
                                 "reachable?)" % (NODE_DIR, NPM_CI_TIMEOUT)) from None
        if p.returncode != 0:
            raise AssertionError("`npm ci` in %s failed with exit code %d (is the npm registry "
                                 "reachable?):\n%s" % (NODE_DIR, p.returncode, (
                                     p.stdout + p.stderr).decode("utf-8", "replace")[-3000:]))
    return node


class NodeClients(FgTestCase):

    def test_ioredis_and_node_redis_through_fencegate_match_redis(self):
        node = ensure_node_modules()
        redis_server = self.start_redis()
        fg = self.start_fencegate(redis_server)

        stderr_path = os.path.join(fg.dir, "clients.stderr")
        err = open(stderr_path, "wb")
        self.addCleanup(err.close)
        proc = subprocess.Popen(
            [node, SCRIPT, "--port", str(fg.resp_port), "--direct-port", str(redis_server.port),
             "--restart-via-stdio", "--timeout", "100"],
            cwd=NODE_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            env=harness.clean_env())

        def stop_node():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            proc.stdin.close()
            proc.stdout.close()
        self.addCleanup(stop_node)

        lines = queue.Queue()

        def reader():
            for raw in proc.stdout:
                lines.put(raw.decode("utf-8", "replace"))
            lines.put(None)
        threading.Thread(target=reader, daemon=True).start()

        results = []
        restarts = 0
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail("clients.js did not finish within %d s; results so far: %r" % (
                    RUN_TIMEOUT, results))
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                break
            line = line.strip()
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self.fail("clients.js printed a line that is not JSON: %r" % line[:500])
            if msg.get("control") == "restart-redis":
                # Redis goes away under connected clients and comes back on the same port.
                restarts += 1
                redis_server.stop()
                redis_server.start()
                proc.stdin.write(b"restarted\n")
                proc.stdin.flush()
                continue
            results.append(msg)
        rc = proc.wait(10)
        err.flush()
        with open(stderr_path, "rb") as f:
            node_stderr = f.read().decode("utf-8", "replace")[-4000:]

        for r in results:
            sys.stderr.write("  %-10s %-22s %s  %s\n" % (r.get("lib"), r.get("scenario"),
                                                         "ok  " if r.get("ok") else "FAIL",
                                                         str(r.get("detail"))[:150]))
        self.assertEqual(restarts, 1, "clients.js did not ask for the Redis restart")
        seen = {}
        for r in results:
            with self.subTest(lib=r.get("lib"), scenario=r.get("scenario")):
                self.assertTrue(r.get("ok"), "%s %s: %s" % (r.get("lib"), r.get("scenario"),
                                                            r.get("detail")))
            seen.setdefault(r.get("lib"), set()).add(r.get("scenario"))
        for lib, scenarios in EXPECTED.items():
            missing = sorted(set(scenarios) - seen.get(lib, set()))
            with self.subTest(lib=lib, scenario="(all reported)"):
                self.assertEqual(missing, [], "clients.js reported nothing for %s %s; its stderr:"
                                 "\n%s" % (lib, missing, node_stderr))
        self.assertEqual(rc, 0 if all(r.get("ok") for r in results) else 1,
                         "clients.js exit code; its stderr:\n%s" % node_stderr)
        self.assertTrue(fg.alive(), "fencegate died during the run")


if __name__ == "__main__":
    import unittest
    unittest.main()
