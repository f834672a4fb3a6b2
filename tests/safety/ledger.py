#!/usr/bin/env python3
"""ledger.py — the HTTP service behind the safety workload's HTTP store (--http-store).

A counter and a log, kept in a JSON file that is replaced atomically (write, fsync, rename)
before a write is answered, so an answered write survives kill -9. It checks Fencing-Token as a
well-behaved store should, on reads too: every request raises the highest token seen, and one
whose token is below it is refused with 409 {"error": "ledger_stale"} and counted, so a run shows
how often a stale request got past fencegate's own check (the window README, "HTTP stores",
describes). Checking writes alone is not enough: a former holder's write that passed fencegate's
check and is still on its way would land after the new holder read the counter, and the new
holder's write, with the larger token, would then overwrite it (a lost update the safety
workload found, with the check on writes only, after rollbacks of the lock Redis).

    GET  <prefix>/counter                     -> 200 {"v": N} | 409 ledger_stale | 400
    POST <prefix>/write {"v": N, "entry": E}  -> 200 {"v": N} | 409 ledger_stale | 400
         header Fencing-Token: T (required); "slow": true waits 20 ms before applying

Usage: ledger.py --port P --bind ADDR[,ADDR] --state FILE [--prefix /svc]
Every address it binds is one the workload gave it (127.0.0.1 or a veth end it created).
"""

import argparse
import http.server
import json
import os
import socketserver
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--prefix", default="/svc")
    args = ap.parse_args()
    lock = threading.Lock()
    try:
        with open(args.state) as f:
            state = json.load(f)
    except FileNotFoundError:
        state = {"v": 0, "log": [], "max": 0, "stale": 0}

    def persist():
        tmp = args.state + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, args.state)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, status, doc):
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def fence(self, tok):
            """Raises the highest token seen to tok; False (counted) when tok is below it. Called
            with the lock held; persists what it changed."""
            if tok < state["max"]:
                state["stale"] += 1
                persist()
                self.reply(409, {"error": "ledger_stale", "token": tok, "max": state["max"]})
                return False
            if tok > state["max"]:
                state["max"] = tok
                persist()
            return True

        def token(self):
            try:
                return int(self.headers["Fencing-Token"])
            except (KeyError, TypeError, ValueError):
                self.reply(400, {"error": "no Fencing-Token"})
                return None

        def do_GET(self):
            if self.path != args.prefix + "/counter":
                return self.reply(404, {"error": "no such path"})
            tok = self.token()
            if tok is None:
                return
            with lock:
                if self.fence(tok):
                    self.reply(200, {"v": state["v"]})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n)
            if self.path != args.prefix + "/write":
                return self.reply(404, {"error": "no such path"})
            tok = self.token()
            if tok is None:
                return
            try:
                doc = json.loads(raw)
                v, entry = int(doc["v"]), str(doc["entry"])
            except (ValueError, KeyError, TypeError):
                return self.reply(400, {"error": "bad write"})
            if doc.get("slow"):
                time.sleep(0.02)
            with lock:
                if self.fence(tok):
                    state["v"] = v
                    state["log"].append(entry)
                    persist()
                    self.reply(200, {"v": v})

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    servers = [Server((addr, args.port), Handler) for addr in args.bind.split(",")]
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
