#!/usr/bin/env python3
"""http_sink.py PORT MIB - the HTTP store of bench_http_store.sh: PUT reads the body (by its
Content-Length, as curl -T sends it) and answers its size and sha256; GET answers MIB MiB of a
fixed pattern."""
import hashlib
import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body go in two writes
    blob = b""

    def log_message(self, *args):
        pass

    def read_body(self, digest):
        left = int(self.headers.get("Content-Length", "0"))
        total = left
        while left > 0:
            piece = self.rfile.read(min(1 << 20, left))
            if not piece:
                break
            digest.update(piece)
            left -= len(piece)
        return total - left

    def do_PUT(self):
        digest = hashlib.sha256()
        n = self.read_body(digest)
        body = ("%d %s" % (n, digest.hexdigest())).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(Sink.blob)))
        self.end_headers()
        self.wfile.write(Sink.blob)


if __name__ == "__main__":
    Sink.blob = bytes(range(256)) * (int(sys.argv[2]) << 12)
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
