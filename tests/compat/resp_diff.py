#!/usr/bin/python3
"""resp_diff.py - differential test of the Redis endpoint: the same random command streams sent
straight to one redis-server and through fencegate to another, and the replies compared byte for
byte.

Usage: tests/compat/resp_diff.py [--bin PATH] [--seconds S] [--steps N] [--seed N] [--conns N]
                                 [--protect | --fenced] [--concurrent] [--multiplex true|false]

Starts two redis-servers and fencegate (in front of the second) on free 127.0.0.1 ports. Each
step picks one of --conns connection pairs and sends both the same batch: 1-12 commands (typed
values, wrong types, wrong arity, unknown commands, MULTI/EXEC/DISCARD/WATCH across connections,
SELECT, CLIENT REPLY OFF/SKIP, RESP3 through HELLO, scripts, inline commands, big values), in the
same pieces, then `CLIENT REPLY ON` and `PING <sentinel>`. Everything both sides answered up to
the sentinel must be the same bytes. Now and then a batch ends in a protocol error instead, and
both sides must answer it the same way and close. Commands whose replies depend on time, chance,
hash-table order or the connection's identity are not generated (TTL, SPOP, SMEMBERS of a
hashtable set, KEYS, CLIENT ID, INFO, DUMP of a stream with consumer groups, ...).
Deterministic for a seed; prints the seed, so a failure can be replayed with --seed, and on a
difference the step's batch and both answers.
--protect adds a protect rule on keys the generator never uses, so that every write goes through
fencing's classification (MULTI is then held in fencegate until EXEC, so queue-time refusals are
only generated when that makes no difference). --fenced goes further: each connection through
fencegate holds a lock of its own (FENCE.ACQUIRE, answered before the run), so the one-lock rule
fences every write it sends (Lua scripts, pipelined runs as transactions, held-back MULTI
blocks), and the replies must still be Redis's own; it leaves out what README says fencing
refuses or changes (blocking commands, RESP3, SELECT inside MULTI, FUNCTION LOAD). Exit status 0
when every step matched, 1 on a difference, 2 on a setup failure. --concurrent sends batches of
up to four connections at once, each connection on keys of its own (so that their answers do not
depend on how they interleave): fenced writes of several connections then meet on fencegate's
shared upstream connection and go as one group script.
"""
import argparse
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402

KEYS = [b"s:%d" % i for i in range(3)] + [b"l:%d" % i for i in range(2)] + \
    [b"h:%d" % i for i in range(2)] + [b"z:%d" % i for i in range(2)] + [b"x:0", b"n:0"]
VALS = [b"", b"a", b"bb", b"x y", b"\x00\xff\r\n", b"12", b"-3", b"3.5", b"1e3", b"9" * 25]
FIELDS = [b"f0", b"f1", b"f2"]
MEMBERS = [b"m0", b"m1", b"m2", b"m3"]
LIBRARY = (b"#!lua name=difflib\n"
           b"redis.register_function('fdiff', function(keys, args) "
           b"return redis.call('SET', keys[1], args[1]) end)")
SCRIPT = (b"local v = redis.call('GET', KEYS[1]) "
          b"if ARGV[1] == 'err' then return redis.error_reply('ERR boom') end "
          b"if ARGV[1] == 'tab' then return {1, {2, 'x'}, v or false, 3.7} end "
          b"redis.call('SET', KEYS[1], ARGV[1]) return v")


def enc(args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Gen:
    """The random stream of one run; tracks each connection's state so that batches end where
    the sentinel can be answered (no MULTI left open)."""

    def __init__(self, rnd, protect, fenced, concurrent):
        self.r = rnd
        self.protect = protect or fenced  # MULTI held back, unknown commands refused
        self.fenced = fenced
        self.concurrent = concurrent
        self.prefix = b""  # with --concurrent, each connection's keys and channel are its own
        self.resp3 = {}
        self.watching = {}
        self.subscribed3 = set()  # connections that subscribed in RESP3 (until RESET)

    def key(self, kind=None):
        ks = [k for k in KEYS if kind is None or k.startswith(kind)]
        return self.prefix + self.r.choice(ks if self.r.random() < 0.9 else KEYS)

    def chan(self):
        return self.prefix + b"ch"

    def val(self):
        if self.r.random() < 0.02:
            return bytes([self.r.randrange(256)]) * self.r.choice([5000, 70000, 300000])
        return self.r.choice(VALS)

    def num(self):
        return str(self.r.choice([-2, -1, 0, 1, 2, 3, 5, 100])).encode()

    def command(self, in_multi=False):
        r = self.r
        c = r.choice([
            lambda: [b"SET", self.key(b"s"), self.val()],
            lambda: [b"SET", self.key(b"s"), self.val(), b"NX"],
            lambda: [b"SET", self.key(b"s"), self.val(), b"XX", b"GET"],
            lambda: [b"GET", self.key(b"s")],
            lambda: [b"GETDEL", self.key(b"s")],
            lambda: [b"MSET", self.key(b"s"), self.val(), self.key(b"s"), self.val()],
            lambda: [b"MGET", self.key(), self.key(), self.key()],
            lambda: [b"INCR", self.key(b"n")],
            lambda: [b"INCRBY", self.key(b"n"), self.num()],
            lambda: [b"INCRBYFLOAT", self.key(b"n"), b"0.5"],
            lambda: [b"APPEND", self.key(b"s"), self.val()],
            lambda: [b"STRLEN", self.key(b"s")],
            lambda: [b"GETRANGE", self.key(b"s"), self.num(), self.num()],
            lambda: [b"SETRANGE", self.key(b"s"), r.choice([b"0", b"3"]), self.val()],
            lambda: [b"LPUSH", self.key(b"l"), self.val(), self.val()],
            lambda: [b"RPUSH", self.key(b"l"), self.val()],
            lambda: [b"LPOP", self.key(b"l")],
            lambda: [b"RPOP", self.key(b"l"), b"2"],
            lambda: [b"LRANGE", self.key(b"l"), b"0", b"-1"],
            lambda: [b"LLEN", self.key(b"l")],
            lambda: [b"LMOVE", self.key(b"l"), self.key(b"l"), b"LEFT", b"RIGHT"],
            lambda: [b"BLPOP", self.key(b"l"), b"0.01"],
            # small values only: a big one makes the hash a hashtable, whose order is random
            lambda: [b"HSET", self.key(b"h"), r.choice(FIELDS), r.choice(VALS)],
            lambda: [b"HGET", self.key(b"h"), r.choice(FIELDS)],
            lambda: [b"HGETALL", self.key(b"h")],
            lambda: [b"HINCRBY", self.key(b"h"), r.choice(FIELDS), self.num()],
            lambda: [b"HDEL", self.key(b"h"), r.choice(FIELDS)],
            lambda: [b"ZADD", self.key(b"z"), self.num(), r.choice(MEMBERS)],
            lambda: [b"ZADD", self.key(b"z"), b"INCR", b"1.5", r.choice(MEMBERS)],
            lambda: [b"ZRANGE", self.key(b"z"), b"0", b"-1", b"WITHSCORES"],
            lambda: [b"ZSCORE", self.key(b"z"), r.choice(MEMBERS)],
            lambda: [b"ZPOPMIN", self.key(b"z")],
            lambda: [b"SADD", self.key(b"x"), self.num(), self.num()],
            lambda: [b"SCARD", self.key(b"x")],
            lambda: [b"SISMEMBER", self.key(b"x"), self.num()],
            lambda: [b"SORT", self.key(b"x")],
            lambda: [b"XADD", self.key(b"x"), b"MAXLEN", b"5",
                     b"%d-%d" % (r.randrange(1, 4), r.randrange(9)), b"f", self.val()],
            lambda: [b"XRANGE", self.key(b"x"), b"-", b"+"],
            lambda: [b"XLEN", self.key(b"x")],
            lambda: [b"DEL", self.key(), self.key()],
            lambda: [b"EXISTS", self.key(), self.key()],
            lambda: [b"TYPE", self.key()],
            lambda: [b"OBJECT", b"ENCODING", self.key()],
            lambda: [b"EXPIRE", self.key(), b"1000"],
            lambda: [b"PERSIST", self.key()],
            lambda: [b"RENAME", self.key(), self.key()],
            lambda: [b"COPY", self.key(), self.key(), b"REPLACE"],
            lambda: [b"MOVE", self.key(), r.choice([b"1", b"2"])],
            lambda: [b"SELECT", r.choice([b"0", b"0", b"1", b"2", b"99", b"x"])],
            lambda: [b"DBSIZE"],
            lambda: [b"ECHO", self.val()],
            lambda: [b"PING"],
            lambda: [b"EVAL", SCRIPT, b"1", self.key(b"s"), r.choice([b"v", b"err", b"tab"])],
            lambda: [b"EVAL", b"return redis.call('INCR', KEYS[1])", b"1", self.key()],
            lambda: [b"EVAL_RO", b"return redis.call('GET', KEYS[1])", b"1", self.key(b"s")],
            lambda: [b"WATCH", self.key(), self.key()],
            lambda: [b"UNWATCH"],
            lambda: [b"GET"],                       # wrong arity
            lambda: [b"SET", self.key()],           # wrong arity
            lambda: [b"NOSUCHCMD", self.val()],     # unknown
            lambda: [b"get", self.key(b"s")],       # lower case
            lambda: [b"CLIENT", b"GETNAME"],
            lambda: [b"CLIENT", b"SETNAME", r.choice([b"a", b"b-2"])],
            lambda: [b"FLUSHDB"] if r.random() < 0.1 else [b"DBSIZE"],
            lambda: [b"SWAPDB", b"0", r.choice([b"1", b"2"])] if r.random() < 0.2 else [b"PING"],
            lambda: [b"GETEX", self.key(b"s"), b"PX", b"900000"],
            lambda: [b"SETEX", self.key(b"s"), b"900", self.val()],
            lambda: [b"SETBIT", self.key(b"s"), r.choice([b"1", b"9", b"100"]), b"1"],
            lambda: [b"BITCOUNT", self.key(b"s")],
            lambda: [b"BITFIELD", self.key(b"s"), b"INCRBY", b"u8", b"0", self.num()],
            lambda: [b"BITOP", b"XOR", self.key(b"s"), self.key(b"s"), self.key(b"s")],
            lambda: [b"PFADD", self.key(b"s"), r.choice(MEMBERS), r.choice(MEMBERS)],
            lambda: [b"PFCOUNT", self.key(b"s")],
            lambda: [b"LPOS", self.key(b"l"), self.val()],
            lambda: [b"LINSERT", self.key(b"l"), b"BEFORE", self.val(), self.val()],
            lambda: [b"LSET", self.key(b"l"), self.num(), self.val()],
            lambda: [b"LTRIM", self.key(b"l"), b"0", self.num()],
            lambda: [b"ZRANGESTORE", self.key(b"z"), self.key(b"z"), b"0", b"-1"],
            lambda: [b"ZUNIONSTORE", self.key(b"z"), b"2", self.key(b"z"), self.key(b"z")],
            lambda: [b"ZRANGEBYSCORE", self.key(b"z"), b"-inf", b"(2", b"LIMIT", b"0", b"2"],
            lambda: [b"ZINCRBY", self.key(b"z"), b"0.25", r.choice(MEMBERS)],
            lambda: [b"SINTERCARD", b"2", self.key(b"x"), self.key(b"x")],
            lambda: [b"SMOVE", self.key(b"x"), self.key(b"x"), self.num()],
            lambda: [b"GEOADD", self.key(b"z"), b"13.36", b"38.11", r.choice(MEMBERS)],
            lambda: [b"GEODIST", self.key(b"z"), r.choice(MEMBERS), r.choice(MEMBERS)],
            lambda: [b"SORT", self.key(b"x"), b"DESC", b"LIMIT", b"0", b"2", b"STORE",
                     self.key(b"l")],
            lambda: [b"XGROUP", b"CREATE", self.key(b"x"), b"g", b"0", b"MKSTREAM"],
            lambda: [b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"2", b"STREAMS",
                     self.key(b"x"), b">"],
            lambda: [b"XACK", self.key(b"x"), b"g", b"1-1", b"2-3"],
            lambda: [b"XPENDING", self.key(b"x"), b"g"],
            lambda: [b"XTRIM", self.key(b"x"), b"MAXLEN", b"2"],
            lambda: [b"FCALL", b"fdiff", b"1", self.key(b"s"), self.val()],
            lambda: [b"FUNCTION", b"LOAD", b"REPLACE", LIBRARY],
            lambda: [b"EXEC"],                      # without MULTI
            lambda: [b"DISCARD"],                   # without MULTI
            lambda: [b"PUBLISH", self.chan(), self.val()],
            lambda: [b"OBJECT", b"FREQ", self.key()],  # an error (no LFU policy)
            lambda: [b"WAIT", b"0", b"0"],
            lambda: [b"COMMAND", b"COUNT"],
            lambda: [b"SCRIPT", b"EXISTS", b"0" * 40],
            lambda: [r.choice([b"SCRIPT", b"FUNCTION"]), b"FLUSH"]
            if r.random() < 0.2 else [b"PING"],
        ])()
        if self.protect and c[0] == b"NOSUCHCMD":
            # while writes are fenced fencegate refuses what it does not know, saying so
            return [b"ECHO", b"unknown"]
        if self.fenced and c[0] in (b"BLPOP", b"FUNCTION", b"SCRIPT"):
            # BLPOP and FUNCTION cannot run inside a script; a SCRIPT FLUSH under pipelined
            # fenced writes makes fencegate refuse them rather than reorder (README)
            return [b"ECHO", b"not fenced"]
        if self.concurrent and c[0] in (b"SCRIPT", b"FUNCTION"):
            return [b"ECHO", b"global"]  # another connection's FCALL may come first or after
        if (self.fenced or self.concurrent) and c[0] in (b"FLUSHDB", b"SWAPDB", b"DBSIZE"):
            return [b"ECHO", b"marks"]  # the marks are keys of database 0
        if self.fenced and in_multi and c[0] == b"WATCH":
            return [b"PING"]  # after an EXEC inside the body it would watch, unseen by alone()
        if self.fenced and in_multi and c[0] == b"SELECT":
            return [b"ECHO", b"select"]  # the database is then unknown until the next SELECT
        if self.fenced and in_multi and (c[0] == b"RPOP" and len(c) == 3 or
                                         c[0] == b"XREADGROUP"):
            return [b"ECHO", b"null array"]  # README: "$-1" in a held-back block's EXEC
        return c

    def alone(self, conn):
        """A command outside MULTI. With --fenced, not a script while the connection WATCHes
        keys: fencegate refuses that (README, "Scripts")."""
        c = self.command()
        if self.fenced and self.watching.get(conn) and c[0] in (b"EVAL", b"FCALL"):
            c = [b"UNWATCH"]
        if c[0] in (b"WATCH", b"UNWATCH"):
            self.watching[conn] = c[0] == b"WATCH"
        return c

    def batch(self, conn):
        """The requests of one step (bytes) and whether it ends in a protocol error."""
        r = self.r
        out = []
        n = r.randrange(1, 13)
        i = 0
        while i < n:
            i += 1
            p = r.random()
            if p < 0.08:  # a MULTI block, closed in this batch
                body = [self.command(True) for _ in range(r.randrange(0, 5))]
                if not self.protect and r.random() < 0.2:  # an error while queueing
                    body.insert(r.randrange(len(body) + 1), [b"NOSUCHCMD"])
                if r.random() < 0.1:
                    body.insert(r.randrange(len(body) + 1),
                                r.choice([[b"MULTI"], self.command(True),
                                          [b"SELECT", b"1"] if not self.fenced else [b"PING"],
                                          [b"EXEC"] if self.protect else [b"DISCARD"]]))
                end = b"EXEC" if r.random() < 0.85 else b"DISCARD"
                out += [enc([b"MULTI"])] + [enc(c) for c in body] + [enc([end])]
                self.watching[conn] = False
            elif p < 0.12:
                out.append(enc([b"CLIENT", b"REPLY", r.choice([b"OFF", b"SKIP", b"ON"])]))
            elif p < 0.14 and not self.fenced:  # RESP3 or back; its reply names the id
                # Back in RESP2 after subscribing in RESP3, fencegate passes the stream through
                # as pub/sub until its marker PING shows no subscription is left; a PING under
                # CLIENT REPLY OFF meanwhile is answered (README, "Known edges"): kept in RESP3.
                ver = b"3" if r.random() < 0.6 or conn in self.subscribed3 else b"2"
                self.resp3[conn] = ver == b"3"
                out.append(enc([b"CLIENT", b"REPLY", b"SKIP"]) + enc([b"HELLO", ver]))
            elif p < 0.15 and self.resp3.get(conn):  # pushes and replies interleave in RESP3
                k = self.key(b"s")
                self.subscribed3.add(conn)
                out.append(r.choice([
                    enc([b"SUBSCRIBE", self.chan()]) +
                    enc([b"PUBLISH", self.chan(), self.val()]) + enc([b"UNSUBSCRIBE"]),
                    # an invalidation pushed to the connection that read the key
                    enc([b"CLIENT", b"TRACKING", b"ON"]) + enc([b"GET", k]) +
                    enc([b"SET", k, self.val()]) + enc([b"GET", k]) +
                    enc([b"CLIENT", b"TRACKING", b"OFF"])]))
            elif p < 0.155 and not self.fenced:  # back to defaults: RESP2, database 0, ...
                out.append(enc([b"RESET"]))
                self.resp3[conn] = self.watching[conn] = False
                self.subscribed3.discard(conn)
            elif p < 0.16:  # a deep pipeline: past 32 in flight a shared client gets its own
                out += [enc(self.alone(conn)) for _ in range(r.randrange(33, 120))]
            elif p < 0.17:
                cmd = self.alone(conn)
                # Redis's own limit on an inline request (64 KiB) depends on how its reads cut
                # it; fencegate's is exact: not compared.
                plain = all(a and not any(ch in a for ch in b" \r\n\x00\"'") for a in cmd)
                if plain and sum(len(a) for a in cmd) < 4096:
                    out.append(b" ".join(cmd) + b"\r\n")
                else:
                    out.append(enc(cmd))
            else:
                out.append(enc(self.alone(conn)))
        if r.random() < 0.03:
            return out, r.choice([b"*1\r\n$abc\r\n", b"*2\r\n$3\r\nGET\r\n$-5\r\n",
                                  b"*x\r\n", b"\"unbalanced\r\n", b"*1\r\n*1\r\n"])
        return out, None


class Pair:
    """One connection straight to Redis and one through fencegate."""

    def __init__(self, direct_port, fg_port, lock=None):
        self.ports = (direct_port, fg_port)
        self.socks = [None, None]
        self.lock = lock
        self.open()

    def open(self):
        for i, p in enumerate(self.ports):
            if self.socks[i]:
                self.socks[i].close()
            self.socks[i] = socket.create_connection(("127.0.0.1", p), timeout=10)
        if self.lock:  # through fencegate only: answered with the token
            s = self.socks[1]
            s.sendall(enc([b"FENCE.ACQUIRE", self.lock, b"TTL", b"60000", b"WAIT", b"10000"]))
            buf = b""
            while not buf.endswith(b"\r\n"):
                d = s.recv(100)
                if not d:
                    raise OSError("fencegate closed the connection at FENCE.ACQUIRE")
                buf += d
            if not buf.startswith(b":"):
                raise OSError("FENCE.ACQUIRE %s: %r" % (self.lock.decode(), buf))

    def send(self, pieces):
        for s in self.socks:
            for piece in pieces:
                s.sendall(piece)

    def collect(self, until, timeout=10.0):
        """Reads each side until `until` ends what it has read (None: until the peer closes).
        Returns the two byte strings, or raises on a timeout."""
        got = []
        for side, s in zip(("redis", "fencegate"), self.socks):
            buf = b""
            deadline = time.monotonic() + timeout
            while until is None or not buf.endswith(until):
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    d = s.recv(1 << 20)
                except socket.timeout:
                    raise TimeoutError("%s: no end after %.0f s; read so far: %r" % (
                        side, timeout, buf[-300:]))
                except ConnectionResetError:
                    d = b""
                if not d:
                    if until is None:
                        break
                    raise TimeoutError("%s: closed before its end; read so far: %r" % (
                        side, buf[-300:]))
                buf += d
            got.append(buf)
        return got


def split(rnd, data):
    """data in 1-3 pieces cut at random offsets (one request may straddle two writes)."""
    if len(data) < 2 or rnd.random() < 0.5:
        return [data]
    cuts = sorted(rnd.sample(range(1, len(data)), min(2, len(data) - 1)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def show(b, limit=1500):
    s = repr(b)
    return s if len(s) <= limit else s[:limit] + "...(%d bytes)" % len(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=1000000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--conns", type=int, default=3)
    ap.add_argument("--protect", action="store_true")
    ap.add_argument("--fenced", action="store_true")
    ap.add_argument("--concurrent", action="store_true")
    ap.add_argument("--trace", help="append every batch sent (connection, bytes) to this file")
    ap.add_argument("--multiplex", choices=["true", "false"], default="true")
    a = ap.parse_args()
    if a.bin:
        harness.FENCEGATE_BIN = os.path.abspath(a.bin)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print("resp_diff: seed %d, %d connections%s%s, multiplex %s" % (
        seed, a.conns, ", each holding a lock" if a.fenced else ", protect rule"
        if a.protect else "", ", concurrent" if a.concurrent else "", a.multiplex),
        flush=True)
    rnd = random.Random(seed)
    servers = []
    try:
        direct = harness.RedisServer().start()
        servers.append(direct)
        behind = harness.RedisServer().start()
        servers.append(behind)
        args = ["--upstream-multiplex", a.multiplex, "--log-level", "warn"]
        if a.fenced:  # the locks in a Redis of their own, which FLUSHALL does not reach
            locks = harness.RedisServer().start()
            servers.append(locks)
            args += ["--upstream", behind.url, "--backend", locks.url]
        elif a.protect:
            conf = os.path.join(behind.dir, "fencegate.yaml")
            with open(conf, "w") as f:
                f.write("stores:\n  - { name: cache, url: \"%s\" }\nprotect:\n"
                        "  - { store: cache, keys: \"resp-diff-protected:*\", lock: \"p:$1\" }\n"
                        % behind.url)
            args += ["--config", conf]
        fg = harness.Fencegate(args, upstream=None if a.protect or a.fenced else behind.url)
        servers.append(fg)
        fg.start()
        fg.wait_ready()
    except (AssertionError, OSError) as e:
        print("resp_diff: setup failed: %s" % e, file=sys.stderr)
        for s in reversed(servers):
            s.cleanup()
        return 2
    gen = Gen(rnd, a.protect, a.fenced, a.concurrent)
    if a.fenced:  # as its body would be refused inside the fence's script, loaded beforehand
        for port in (direct.port, fg.resp_port):
            c = harness.RawConn(port)
            c.call("FUNCTION", "LOAD", "REPLACE", LIBRARY)
            c.close()
    pairs = [Pair(direct.port, fg.resp_port, b"resp-diff-%d" % i if a.fenced else None)
             for i in range(a.conns)]
    rc, steps, closes = 0, 0, 0
    t_end = time.monotonic() + a.seconds
    try:
        while rc == 0 and steps < a.steps and time.monotonic() < t_end:
            steps += 1
            # With --concurrent several connections' batches are in flight at once (on the
            # shared upstream connection their fenced writes meet in one group script); their
            # keys are apart, so each connection's answers are still Redis's alone.
            group = rnd.sample(range(a.conns), rnd.randrange(1, min(4, a.conns) + 1)
                               if a.concurrent else 1)
            sent = []
            for ci in group:
                gen.prefix = b"c%d:" % ci if a.concurrent else b""
                reqs, bad = gen.batch(ci)
                sentinel = b"end-%d-%d-%d" % (seed, steps, ci)
                data = b"".join(reqs)
                if bad is None:
                    data += enc([b"CLIENT", b"REPLY", b"ON"]) + enc([b"PING", sentinel])
                    until = sentinel + b"\r\n"
                else:
                    # Under CLIENT REPLY OFF Redis answers a protocol error with nothing and
                    # leaves the connection open, unread, for good; fencegate closes it: not
                    # compared.
                    data += enc([b"CLIENT", b"REPLY", b"ON"]) + bad
                    until = None
                if a.trace:
                    with open(a.trace, "a") as f:
                        f.write("step %d connection %d: %r\n" % (steps, ci, data))
                pairs[ci].send(split(rnd, data))
                sent.append((ci, data, until, bad))
            for ci, data, until, bad in sent:
                try:
                    got = pairs[ci].collect(until)
                except (TimeoutError, OSError) as e:
                    print("step %d (connection %d): %s\nrequests: %s" % (steps, ci, e,
                                                                         show(data)))
                    rc = 1
                    break
                if got[0] != got[1]:
                    print("step %d (connection %d): the answers differ\nrequests:  %s\n"
                          "redis:     %s\nfencegate: %s" % (steps, ci, show(data),
                                                            show(got[0]), show(got[1])))
                    rc = 1
                    break
                if bad is not None:
                    closes += 1
                    pairs[ci].open()
                    gen.resp3[ci] = gen.watching[ci] = False
                    gen.subscribed3.discard(ci)
        if not fg.alive():
            print("fencegate exited")
            rc = 1
        elif a.fenced:  # else the mode would compare unfenced traffic and prove nothing
            fenced = fg.metrics().get("fencegate_fenced_writes_total", 0)
            print("resp_diff: %d writes went fenced" % fenced)
            if rc == 0 and steps > 20 and fenced == 0:
                print("resp_diff: no write was fenced")
                rc = 1
    finally:
        for p in pairs:
            for s in p.socks:
                s.close()
        log = ""
        try:
            fg.stop()
        except AssertionError as e:
            log = str(e)
            rc = 1
        log = log or fg.stderr_text
        for s in reversed(servers):
            s.cleanup()
    print("resp_diff: %d steps, %d protocol-error closes: %s (seed %d)" % (
        steps, closes, "all answers equal" if rc == 0 else "DIFFERENCE", seed))
    if rc and log:
        print("fencegate's log (tail):\n" + "\n".join(log.splitlines()[-20:]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
