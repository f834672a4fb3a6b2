#!/usr/bin/env python3
"""The fencing story, told live: two workers, two sidecars, one Redis, one frozen sidecar.

Run by scripts/demo.sh, which starts the servers and passes their ports and pids."""
import os
import signal
import socket
import sys
import time


class Conn:
    """A tiny RESP client: enough to show every reply exactly as the application sees it."""

    def __init__(self, port, who):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.s.makefile("rb")
        self.who = who

    def call(self, *args, show=True):
        req = b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a), a) for a in (str(x).encode() for x in args))
        self.s.sendall(req)
        reply = self._read()
        if show:
            shown = reply if not isinstance(reply, Exception) else "(error) %s" % reply
            print("  %-9s %-40s -> %s" % (self.who, " ".join(str(a) for a in args), shown))
        return reply

    def _read(self):
        line = self.f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:].decode()
        if kind == b"+":
            return rest
        if kind == b"-":
            return RuntimeError(rest)
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2].decode()
        if kind == b"*":
            return [self._read() for _ in range(int(rest))]
        raise RuntimeError("unexpected reply %r" % line)


def story(title, port_a, port_b, pid_a, lease_s, fenced):
    print("\n\033[1m%s\033[0m" % title)
    a, b = Conn(port_a, "worker A"), Conn(port_b, "worker B")
    b.call("SET", "account:42", 100)
    if fenced:
        a.call("FENCE.ACQUIRE", "account:42")
    else:  # the classic Redis lock: SET NX with a lease
        a.call("SET", "lock:account:42", "A", "NX", "PX", int(lease_s * 500))
    balance = int(a.call("GET", "account:42"))
    print("  worker A read %d and will write %d ... but %s" %
          (balance, balance + 10, "its sidecar freezes (SIGSTOP)" if pid_a else "it pauses (GC)"))
    if pid_a:
        os.kill(pid_a, signal.SIGSTOP)
    time.sleep(lease_s)
    print("  %.1f s later the lease has run out; worker B takes over" % lease_s)
    if fenced:
        b.call("FENCE.ACQUIRE", "account:42", "WAIT", 5000)
    else:
        b.call("SET", "lock:account:42", "B", "NX", "PX", int(lease_s * 500))
    other = int(b.call("GET", "account:42"))
    b.call("SET", "account:42", other + 50)
    print("  %s wakes up; worker A finishes its read-modify-write" %
          ("sidecar A (SIGCONT)" if pid_a else "worker A"))
    if pid_a:
        os.kill(pid_a, signal.SIGCONT)
    late = a.call("SET", "account:42", balance + 10)
    final = int(b.call("GET", "account:42"))
    ok = final == 150
    verdict = ("correct: A's stale write was refused" if ok else
               "WRONG: B's update was lost (both workers believed they held the lock)")
    print("  final balance %d (expected 150): %s" % (final, verdict))
    return ok, late


def main():
    redis_port, port_a, port_b, pid_a, lease_ms = (int(x) for x in sys.argv[1:6])
    lease_s = lease_ms / 1000.0 * 2
    ok_plain, _ = story("1. A Redis lock without fencing (SET NX PX), straight to Redis",
                        redis_port, redis_port, 0, lease_s, False)
    ok_fenced, late = story("2. With fencegate: each worker talks to its own sidecar",
                            port_a, port_b, pid_a, lease_s, True)
    print()
    if ok_plain:
        print("note: the unfenced run was correct this time (it should have lost B's update)")
    if not ok_fenced or not isinstance(late, Exception):
        print("demo FAILED: the frozen holder's write was not refused")
        return 1
    print("The frozen holder's write was dropped before it touched the data: %s" % late)
    return 0


if __name__ == "__main__":
    sys.exit(main())
