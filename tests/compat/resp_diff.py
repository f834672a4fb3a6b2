#!/usr/bin/python3
"""resp_diff.py - differential test of the Redis endpoint: the same random command streams sent
straight to one redis-server and through fencegate to another, and the replies compared byte for
byte.

Usage: tests/compat/resp_diff.py [--bin PATH] [--seconds S] [--steps N] [--seed N] [--conns N]
                                 [--protect | --fenced] [--concurrent | --cross]
                                 [--multiplex true|false] [--trace FILE]

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

--cross tests what connections do to each other: --conns (4) connections share keys and
channels, and each step one of them sends one command (now and then a short pipeline, which may
pin it part of the way): blocking commands (BLPOP, BLMOVE, BLMPOP, BZPOPMIN, BZMPOP, XREAD and
XREADGROUP BLOCK, with timeout 0) woken later by another connection's push, or timed out (0.05 s,
WAIT 1 50) well before the step ends; WATCH broken by another connection's write; MULTI blocks
spread over steps; SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE and their unsubscribes, PUBLISH, SPUBLISH,
PUBSUB NUMSUB/NUMPAT/SHARDNUMSUB; keyspace notifications (CONFIG SET notify-keyspace-events);
CLIENT PAUSE ... WRITE and CLIENT UNPAUSE; CLIENT NO-EVICT; OBJECT FREQ (both Redises count
accesses exactly: LFU, no log factor, no decay, and a maxmemory never reached, so that values are
not Redis's shared integers, whose count fencegate's marks would share); CLIENT ID, then CLIENT
UNBLOCK (TIMEOUT or ERROR), CLIENT KILL ID and CLIENT TRACKING ... REDIRECT from another
connection, CLIENT KILL TYPE pubsub; SCRIPT LOAD on one connection and EVALSHA on another;
CLIENT REPLY OFF, under which messages still come; RESP3 and back (HELLO, unanswered after
CLIENT REPLY SKIP: it names the id); RESET; QUIT, a plain close or the end of the connection's
side of the stream (blocked or not), after which it comes back as a new client, on the shared
upstream connection again. A step runs on Redis first, and everything every connection got is
read until Redis is quiet (0.04 s without a byte, past the step's timeouts); then on fencegate,
read until each connection has as many bytes as its twin (3 s at most); each connection's bytes
must be the same, and so must be whether it was closed. The generator knows which connections
wait from what Redis answered (nothing), sends them nothing more, and wakes them (under CLIENT
REPLY OFF, where that cannot be seen, a connection sends nothing that waits). Left out, each for
a reason:
- CLIENT LIST, INFO clients, CLIENT KILL TYPE normal: fencegate's own connections are clients
  of Redis. The lock backend gets a Redis of its own, as it keeps a subscriber connection (by
  default on the upstream) that CLIENT KILL TYPE pubsub would count.
- A command in flight on a connection CLIENT KILL closes is answered -UNAVAILABLE by fencegate
  before it closes the client too (README, "Upstream down"): those lines are not compared.
- A write of a connection still on the shared upstream connection while Redis is paused: it
  holds up everyone behind it there (README, "Upstream connections"); with multiplexing, during
  CLIENT PAUSE only connections known to be pinned write. With --protect, no writes queue in a
  MULTI block while paused: fencegate answers a held-back block's +QUEUED itself, at once, Redis
  once unpaused.
- UNSUBSCRIBE (and its kin) without arguments while two or more are subscribed: Redis answers
  in the order of its hash table, which differs between two processes.
- CLIENT REPLY inside MULTI (fencegate takes it at once, Redis at EXEC: README), and QUIT under
  CLIENT REPLY OFF (Redis 7.0 closes a connection after writing a reply, and there is none: it
  stays open; fencegate closes it, as asked).
- A client on the shared upstream connection that ends its side while its write waits for
  CLIENT UNPAUSE (README: the write runs later; Redis drops it): only reads are sent then.
- WAIT while writes are paused: the PUBLISH fencegate sends before a connection's first WAIT
  waits for the pause to end, and the WAIT with it (README); Redis answers at once.
- PSUBSCRIBE patterns that match fencegate:wait (README, WAIT) or fencegate's marks (keyevent
  channels with --fenced).
- CLIENT KILL in a pipeline: Redis drops what it queued for a connection it kills in the same
  round (the messages of a write pipelined before it); through fencegate the write may have gone
  first, on the shared connection. And CLIENT TRACKING ... REDIRECT in RESP3, whose push for a
  redirection that broke names the other connection's id.
- With --fenced: blocking commands, RESP3 and CLIENT PAUSE (fenced writes go as scripts, and
  README says what fencing refuses).
"""
import argparse
import hashlib
import os
import random
import select
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


SCRIPT_SHA = hashlib.sha1(SCRIPT).hexdigest().encode()


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
                # as pub/sub until its marker PING shows no subscription is left
                ver = b"3" if r.random() < 0.6 else b"2"
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


# ---- --cross: connections that act on each other ------------------------------------------

CHANS = [b"ch0", b"ch1", b"__redis__:invalidate"]  # the last: CLIENT TRACKING ... REDIRECT
SCHANS = [b"sch0", b"sch1"]
# Keyspace notifications of the generator's keys only: fencegate's marks are keys of database 0
# and notify too (with --fenced keyevent channels, whose messages name the key, are left out).
KS_PATTERNS = [b"__keyspace@0__:[slhznx]:*", b"__keyevent@0__:*"]
# What an unpinned connection may send while writes are paused on a shared upstream connection:
# a paused write there holds up everyone behind it (README, "Upstream connections").
PAUSE_READS = (b"GET", b"MGET", b"LRANGE", b"LLEN", b"HGET", b"HGETALL", b"ZRANGE", b"ZSCORE",
               b"EXISTS", b"TYPE", b"STRLEN", b"SCARD", b"XRANGE", b"XLEN", b"ECHO", b"PING")
PAUSE_STATE = (b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE",
               b"SUNSUBSCRIBE", b"RESET", b"WATCH", b"UNWATCH", b"MULTI", b"CLIENT", b"CONFIG")
PINS = (b"SELECT", b"CLIENT", b"HELLO", b"RESET", b"WAIT", b"EVAL", b"EVAL_RO", b"FCALL",
        b"SCRIPT", b"FUNCTION", b"MULTI", b"EXEC", b"DISCARD", b"WATCH", b"UNWATCH",
        b"SUBSCRIBE", b"PSUBSCRIBE", b"SSUBSCRIBE", b"UNSUBSCRIBE", b"PUNSUBSCRIBE",
        b"SUNSUBSCRIBE", b"CONFIG", b"BLPOP", b"BRPOP", b"BLMOVE", b"BRPOPLPUSH", b"BLMPOP",
        b"BZPOPMIN", b"BZPOPMAX", b"BZMPOP")
BLOCKERS = (b"BLPOP", b"BRPOP", b"BLMOVE", b"BRPOPLPUSH", b"BLMPOP", b"BZPOPMIN", b"BZPOPMAX",
            b"BZMPOP", b"WAIT")


def blocks(c):
    return c[0] in BLOCKERS or c[0] in (b"XREAD", b"XREADGROUP") and b"BLOCK" in c


class Step:
    """One step: the commands one connection sends (each argument bytes, or ("id", j): that
    side's CLIENT ID of connection j), and how the runner waits for its outcome."""

    def __init__(self, conn, cmds, min_wait=0.0, silent=False, client_id=False, solo=False,
                 shut=False):
        self.conn = conn
        self.shut = shut            # with cmds None: ends its side (shutdown), else closes
        self.cmds = cmds
        self.solo = solo            # not in a pipeline: CLIENT PAUSE after a blocked command
        #                             would wait for it, and pause Redis long after
        self.min_wait = min_wait    # a timeout that must have passed before the side is quiet
        self.silent = silent        # answers nothing by itself (CLIENT REPLY SKIP + HELLO)
        self.client_id = client_id  # CLIENT ID: the number differs by side, its shape may not

    def plain(self):
        # a blocking command ends its step, so that the connection is known to wait
        return (self.cmds and len(self.cmds) < 4 and not blocks(self.cmds[-1]) and
                not (self.min_wait or self.silent or self.client_id or self.solo))

    def data(self, ids):
        if self.cmds is None:
            return b"(ends its side)" if self.shut else b"(closes)"
        return b"".join(enc([a if isinstance(a, bytes) else b"%d" % ids[a[1]] for a in c])
                        for c in self.cmds)


class CrossGen:
    """The steps of --cross: one connection and one command at a time, on keys and channels all
    connections share. Tracks each connection's state in command order (MULTI, subscriptions,
    RESP3, CLIENT ID, pinned for sure) and, from what Redis answered, which are stalled (sent a
    command Redis has not answered: blocked, or paused)."""

    def __init__(self, rnd, n, gen, fenced, multiplex):
        self.r = rnd
        self.n = n
        self.gen = gen  # Gen's commands, on the shared keys
        self.fenced = fenced
        self.multiplex = multiplex
        self.paused = 0  # steps left before CLIENT UNPAUSE; 0: not paused
        self.pending = None  # a step picked for a pipeline it could not join: sent next
        for i in range(n):
            self.reset(i)

    def reset(self, i, reopened=True):
        if reopened:
            if not hasattr(self, "st"):
                self.st = {}
            self.st[i] = {"pinned": not self.multiplex, "id": False, "stalled": [],
                          "multi": False, "subs": set(), "resp3": False, "off": False,
                          "redir": False}
        else:  # RESET: a fresh connection's state, still pinned, its CLIENT ID unchanged
            s = self.st[i]
            s.update(multi=False, subs=set(), resp3=False, off=False, redir=False)

    def sub_mode(self, i):
        s = self.st[i]
        return s["subs"] and not s["resp3"]

    def waker(self, keys):
        k = self.r.choice(keys)
        if k.startswith(b"l:"):
            return [b"RPUSH", k, self.gen.val(), self.gen.val()]
        if k.startswith(b"z:"):
            return [b"ZADD", k, self.gen.num(), self.r.choice(MEMBERS)]
        return [b"XADD", k, b"%d-%d" % (self.r.randrange(4, 9), self.r.randrange(9)), b"f",
                self.gen.val()]

    def blocking(self):
        r = self.r
        if self.fenced:  # README: fencing refuses blocking commands
            return None
        l0, l1 = r.choice(KEYS[3:5]), r.choice(KEYS[3:5])
        return r.choice([
            lambda: ([b"BLPOP", l0, l1, b"0"], [l0, l1]),
            lambda: ([b"BRPOP", l0, b"0"], [l0]),
            lambda: ([b"BLMOVE", l0, l1, b"LEFT", b"RIGHT", b"0"], [l0]),
            lambda: ([b"BRPOPLPUSH", l0, l1, b"0"], [l0]),
            lambda: ([b"BLMPOP", b"0", b"2", l0, l1, b"RIGHT", b"COUNT", b"2"], [l0, l1]),
            lambda: ([b"BZPOPMIN", b"z:0", b"z:1", b"0"], [b"z:0", b"z:1"]),
            lambda: ([b"BZPOPMAX", b"z:1", b"0"], [b"z:1"]),
            lambda: ([b"BZMPOP", b"0", b"1", b"z:0", b"MIN"], [b"z:0"]),
            lambda: ([b"XREAD", b"COUNT", b"2", b"BLOCK", b"0", b"STREAMS", b"x:0", b"$"],
                     [b"x:0"]),
            lambda: ([b"XREADGROUP", b"GROUP", b"g", b"c%d" % r.randrange(2), b"BLOCK", b"0",
                      b"STREAMS", b"x:0", b">"], [b"x:0"]),
        ])()[0]

    def pubsub(self, i):
        r, s = self.r, self.st[i]
        p = r.random()
        if p < 0.25:
            c = r.choice(CHANS)
            s["subs"].add((b"c", c))
            return [b"SUBSCRIBE", c]
        if p < 0.55:  # keyspace notifications mostly (Redis sends them from the start: KEA)
            pats = [b"ch*"] + KS_PATTERNS[:1 if self.fenced else 2] * 2
            c = r.choice(pats)
            s["subs"].add((b"p", c))
            return [b"PSUBSCRIBE", c]
        if p < 0.7:
            c = r.choice(SCHANS)
            s["subs"].add((b"s", c))
            return [b"SSUBSCRIBE", c]
        kind, name = r.choice([(b"c", b"UNSUBSCRIBE"), (b"p", b"PUNSUBSCRIBE"),
                               (b"s", b"SUNSUBSCRIBE")])
        have = sorted(n for k, n in s["subs"] if k == kind)
        # without arguments, the order of the answers is that of Redis's hash table
        if len(have) > 1 or have and r.random() < 0.6:
            c = r.choice(have)
            s["subs"].discard((kind, c))
            return [name, c]
        s["subs"] = {x for x in s["subs"] if x[0] != kind}
        return [name]

    def tracking(self, i):
        """Client-side caching, its invalidations sent to this connection (RESP3) or to another
        one by its CLIENT ID (subscribed to __redis__:invalidate in RESP2)."""
        r = self.r
        s = self.st[i]
        if r.random() < 0.2:
            s["redir"] = False
            return [b"CLIENT", b"TRACKING", b"OFF"]
        ids = [j for j in range(self.n) if self.st[j]["id"] and j != i]
        cmd = [b"CLIENT", b"TRACKING", b"ON"]
        # in RESP3 only: the push that says the redirection broke names the id, which differs
        # by side; so a connection that redirects stays in RESP2
        if ids and not s["resp3"] and r.random() < 0.7:
            s["redir"] = True
            cmd += [b"REDIRECT", ("id", r.choice(ids))]
        if r.random() < 0.3:
            cmd += [b"BCAST", b"PREFIX", r.choice([b"s:", b"l:", b"z:"])]
        if r.random() < 0.3:
            cmd += [b"NOLOOP"]
        return cmd

    def other(self):
        r = self.r
        return r.choice([
            lambda: [b"SCRIPT", b"LOAD", SCRIPT],
            lambda: [b"EVALSHA", SCRIPT_SHA, b"1", self.gen.key(b"s"), r.choice([b"v", b"tab"])],
            lambda: [b"PUBLISH", r.choice(CHANS), self.gen.val()],
            lambda: [b"SPUBLISH", r.choice(SCHANS), self.gen.val()],
            lambda: [b"PUBSUB", b"NUMSUB"] + CHANS,
            lambda: [b"PUBSUB", b"NUMPAT"],
            lambda: [b"PUBSUB", b"SHARDNUMSUB"] + SCHANS,
            lambda: [b"CONFIG", b"SET", b"notify-keyspace-events",
                     r.choice([b"", b"KEA", b"Kg$lzt", b"E$l"])],
            lambda: [b"CLIENT", b"NO-EVICT", r.choice([b"on", b"off"])],
            lambda: [b"OBJECT", b"FREQ", self.gen.key()],
            lambda: [b"WATCH", self.gen.key(), self.gen.key()],
            lambda: [b"UNWATCH"],
            lambda: [b"WAIT", b"0", b"0"],
        ])()

    def step(self):
        r = self.r
        if self.pending is not None:  # (what it changed in the state model holds)
            st, self.pending = self.pending, None
            if not self.st[st.conn]["stalled"]:
                return st
        free = [i for i in range(self.n) if not self.st[i]["stalled"]]
        if not free:  # every one waits (one blocked where it pipelined more): one goes
            i = r.randrange(self.n)
            self.reset(i)
            return Step(i, None, min_wait=0.15, shut=r.random() < 0.5)
        last = len(free) == 1  # it must not wait too, so that the others can be woken
        if self.paused:
            self.paused -= 1
            if self.paused == 0 or last:
                self.paused = 0
                i = r.choice(free)
                s = self.st[i]
                s["pinned"] = True
                pre = []
                if s["multi"]:  # else queued
                    pre, s["multi"] = [[b"DISCARD"]], False
                    self.gen.watching[i] = False
                if self.sub_mode(i):  # else refused
                    pre = [[b"RESET"]]
                    self.reset(i, reopened=False)
                return Step(i, pre + [[b"CLIENT", b"UNPAUSE"]], silent=s["off"])
        if r.random() < 0.025:
            # a client that goes (QUIT; or it closes, or ends its side, blocked or not) and comes
            # back as a new one, on the shared upstream connection again; what it waited for is
            # not served (under CLIENT REPLY OFF Redis 7.0 leaves the connection open after QUIT,
            # as it closes once a reply is written; fencegate closes it)
            i = r.randrange(self.n)
            s = self.st[i]
            how = r.choice([b"quit", b"close", b"shut"] if not s["stalled"] and not s["off"] else
                           [b"close", b"shut"])
            self.reset(i)
            if how == b"quit":
                return Step(i, [[b"QUIT"]])
            return Step(i, None, min_wait=0.15, shut=how == b"shut")
        i = r.choice(free)
        st = self.pick(i, last)
        # a pipeline: it may pin part of the way (not while paused: a write in it that waits
        # would hold up the rest, unseen)
        while st.plain() and not self.paused and r.random() < 0.2:
            more = self.pick(i, last)
            if not more.plain():
                self.pending = more
                break
            st.cmds += more.cmds
        return st

    def pick(self, i, last):
        """One step of connection i. Under CLIENT REPLY OFF it answers nothing (pub/sub
        messages still come), so the runner cannot tell that it waits: nothing that blocks."""
        s = self.st[i]
        if not s["off"]:
            return self.pick_one(i, last)
        # (inside MULTI fencegate takes CLIENT REPLY at once, Redis at EXEC: README)
        if self.r.random() < 0.1 and not self.sub_mode(i) and not s["multi"]:
            s["off"] = False
            return Step(i, [[b"CLIENT", b"REPLY", b"ON"]])
        st = self.pick_one(i, last)
        if st.client_id or st.solo or st.min_wait or blocks(st.cmds[-1]):
            self.gen.watching[i] = False
            st = Step(i, [[b"UNWATCH"]])
        st.silent = True
        return st

    def pick_one(self, i, last):
        r = self.r
        s = self.st[i]
        was_multi = s["multi"]
        stalled = [k for j in range(self.n) for k in self.st[j]["stalled"]]
        p = r.random()
        if last and p >= 0.3:
            p = 0.83 + 0.17 * r.random()  # Gen's commands, none of which blocks
        if self.sub_mode(i):
            cmd = self.pubsub(i) if p < 0.55 else [b"RESET"] if p < 0.58 else r.choice(
                [[b"PING"], [b"PING", b"x"], self.gen.command()])
        elif s["multi"]:
            if p < 0.2:
                cmd = [r.choice([b"EXEC", b"EXEC", b"DISCARD"])]
                s["multi"] = False
            elif p < 0.25 and not self.fenced:
                cmd = self.blocking() or [b"PING"]  # runs at once inside MULTI
            else:
                cmd = self.gen.command(True)
                if cmd[0] in (b"EXEC", b"DISCARD"):
                    s["multi"] = False
                elif cmd[0] in (b"WATCH", b"SELECT", b"MULTI"):
                    cmd = [b"PING"]
        elif stalled and p < 0.3:
            cmd = self.waker(stalled)
        elif p < 0.42 and not self.paused:
            cmd = self.blocking() or [b"MULTI"]
        elif p < 0.47 and not self.paused and not self.fenced:
            # timed out well before the runner calls the side quiet (Redis checks ~10 times a s)
            return Step(i, [r.choice([[b"BLPOP", b"l:0", b"l:1", b"0.05"],
                                      [b"BZPOPMIN", b"z:1", b"0.05"],
                                      [b"WAIT", b"1", b"50"]])], min_wait=0.4)
        elif p < 0.52:
            cmd = [b"MULTI"]
        elif p < 0.59:
            cmd = self.pubsub(i)
        elif p < 0.65:  # to a channel someone listens to, mostly
            subs = sorted(x for j in range(self.n) for x in self.st[j]["subs"] if x[0] != b"p")
            kind, ch = r.choice(subs) if subs and r.random() < 0.8 else (b"c", b"ch0")
            cmd = [b"SPUBLISH" if kind == b"s" else b"PUBLISH", ch, self.gen.val()]
        elif p < 0.675:
            cmd = self.tracking(i)
        elif p < 0.72:
            cmd = self.other()
        elif p < 0.74 and not self.paused and not self.fenced:
            s["pinned"] = True
            self.paused = r.randrange(1, 7)
            return Step(i, [[b"CLIENT", b"PAUSE", b"60000", b"WRITE"]], solo=True)
        elif p < 0.77 and not s["id"]:
            s["id"] = s["pinned"] = True
            return Step(i, [[b"CLIENT", b"ID"]], client_id=True)
        elif p < 0.8:
            ids = [j for j in range(self.n) if self.st[j]["id"]]
            if ids:
                j = r.choice(ids)
                cmd = r.choice([[b"CLIENT", b"UNBLOCK", ("id", j)],
                                [b"CLIENT", b"UNBLOCK", ("id", j), b"ERROR"],
                                [b"CLIENT", b"KILL", b"ID", ("id", j)],
                                [b"CLIENT", b"KILL", b"TYPE", b"pubsub"]])
            else:
                cmd = [b"CLIENT", b"KILL", b"TYPE", b"pubsub"]
        elif p < 0.82 and not self.fenced:
            ver = r.choice([b"2", b"3"]) if not s["redir"] else b"2"
            s["resp3"] = ver == b"3"
            s["pinned"] = True
            return Step(i, [[b"CLIENT", b"REPLY", b"SKIP"], [b"HELLO", ver]], silent=True)
        elif p < 0.83 and not self.fenced:
            cmd = [b"RESET"]
        elif p < 0.86 and not last and not s["multi"]:
            s["off"] = True
            return Step(i, [[b"CLIENT", b"REPLY", b"OFF"]], silent=True)
        else:
            cmd = self.gen.alone(i)
            if cmd[0] in (b"EXEC", b"DISCARD", b"SELECT", b"MULTI", b"BLPOP"):
                cmd = [b"PING"]
        if self.gen.fenced and self.gen.watching.get(i) and cmd[0] in (b"EVAL", b"FCALL"):
            cmd = [b"UNWATCH"]  # README, "Scripts": refused while the connection WATCHes
        if self.paused and (
                not s["pinned"] and cmd[0] not in PAUSE_READS + PINS or
                # under CLIENT REPLY OFF a write that waits would not be seen to (what is not a
                # write passes, so that the state model stays true)
                s["off"] and cmd[0] not in PAUSE_READS + PAUSE_STATE or
                # a held-back MULTI's +QUEUED comes from fencegate, at once; Redis's, for a
                # write while paused, once unpaused: the same bytes, sooner
                was_multi and self.gen.protect and cmd[0] not in PAUSE_READS):
            cmd = [b"GET", self.gen.key()]
            s["multi"] = was_multi
        if self.paused and cmd[0] == b"WAIT" and not s["multi"]:
            cmd = [b"PING"]  # README: fencegate's PUBLISH before it waits for the pause to end
        if cmd[0] in (b"WATCH", b"UNWATCH") and not s["multi"]:
            self.gen.watching[i] = cmd[0] == b"WATCH"
        if cmd[0] in (b"EXEC", b"DISCARD", b"RESET"):
            self.gen.watching[i] = False
        if cmd[0] == b"MULTI":
            s["multi"] = True
        if cmd[0] in PINS:
            s["pinned"] = True
        if cmd[0] == b"RESET":
            self.reset(i, reopened=False)
        # CLIENT KILL alone: after a pipelined write, Redis would drop the messages it queued for
        # a connection it kills in the same round; through fencegate the write may go first
        return Step(i, [cmd], solo=cmd[:2] == [b"CLIENT", b"KILL"])


class Side:
    """The connections of one side, and every byte each has answered so far."""

    def __init__(self, name, socks):
        self.name = name
        self.socks = socks
        self.got = [b"" for _ in socks]
        self.eof = [False for _ in socks]

    def read(self, i, limit=1 << 20):
        """Reads what connection i has (at most limit bytes), without waiting."""
        try:
            d = self.socks[i].recv(limit, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except ConnectionResetError:
            d = b""
        if not d:
            self.eof[i] = True
            return 0
        self.got[i] += d
        return len(d)

    def poll(self, timeout):
        """Waits up to timeout for a readable connection and reads every one that is; returns
        how many bytes came."""
        idx = [i for i in range(len(self.socks)) if not self.eof[i]]
        if not idx:
            return 0
        ready, _, _ = select.select([self.socks[i] for i in idx], [], [], max(0.0, timeout))
        return sum(self.read(i) for i in idx if self.socks[i] in ready)

    def readable(self, i):
        return not self.eof[i] and bool(select.select([self.socks[i]], [], [], 0)[0])

    def match(self, ref, deadline):
        """Reads until each connection has as many bytes as ref's twin, and is closed if that
        is, or until the deadline; never reads past what ref has (a byte more if ref closed)."""
        while time.monotonic() < deadline:
            need = {}
            for i in range(len(self.socks)):
                if self.eof[i]:
                    continue
                if len(self.got[i]) < len(ref.got[i]):
                    need[i] = len(ref.got[i]) - len(self.got[i])
                elif ref.eof[i]:
                    need[i] = 1
            if not need:
                return
            ready, _, _ = select.select([self.socks[i] for i in need], [], [],
                                        max(0.0, min(0.05, deadline - time.monotonic())))
            for i in need:
                if self.socks[i] in ready:
                    self.read(i, need[i])


def run_cross(a, seed, rnd, gen, direct_port, fg_port):
    """--cross: see the header. Returns the exit status."""
    n = a.conns
    pairs = [Pair(direct_port, fg_port, b"resp-diff-%d" % i if a.fenced else None)
             for i in range(n)]
    sides = [Side("redis", [p.socks[0] for p in pairs]),
             Side("fencegate", [p.socks[1] for p in pairs])]
    for p in pairs:
        for s in p.socks:
            s.setblocking(True)
    cg = CrossGen(rnd, n, gen, a.fenced, a.multiplex == "true")
    ids = [[0] * n, [0] * n]  # each side's CLIENT ID of each connection
    quiet, bound = 0.04, 3.0
    rc, steps, kills, woken = 0, 0, 0, 0
    t_start = time.monotonic()
    t_end = t_start + a.seconds

    def differs():
        return [i for i in range(n) if sides[0].got[i] != sides[1].got[i] or
                sides[0].eof[i] != sides[1].eof[i]]

    try:
        while rc == 0 and steps < a.steps and time.monotonic() < t_end:
            st = cg.step()
            steps += 1
            before = [list(map(len, sides[0].got)), list(map(len, sides[1].got))]
            if a.trace:
                with open(a.trace, "a") as f:
                    f.write("step %d connection %d (at %.2f s): %r\n" % (
                        steps, st.conn, time.monotonic() - t_start, st.data(ids[0])))
            for k, side in enumerate(sides):
                if st.cmds is None and st.shut:  # answered up to here, then closed
                    side.socks[st.conn].shutdown(socket.SHUT_WR)
                elif st.cmds is None:
                    side.socks[st.conn].close()
                    side.eof[st.conn] = True
                    if k == 1:  # fencegate, and then Redis, see the end
                        time.sleep(st.min_wait)
                else:
                    side.socks[st.conn].sendall(st.data(ids[k]))
                t0 = time.monotonic()
                if st.client_id:  # a reply of its own length on each side: read it whole
                    while (not side.got[st.conn][before[k][st.conn]:].endswith(b"\r\n") and
                           time.monotonic() - t0 < bound):
                        side.poll(0.05)
                    reply = side.got[st.conn][before[k][st.conn]:]
                    if reply[:1] == b":" and reply.endswith(b"\r\n"):
                        ids[k][st.conn] = int(reply[1:-2])
                        side.got[st.conn] = side.got[st.conn][:before[k][st.conn]] + b":ID\r\n"
                    continue
                if k == 0:  # Redis: until quiet, and past the step's timeouts
                    last = t0
                    while time.monotonic() - t0 < bound:
                        now = time.monotonic()
                        if now - last >= quiet and now - t0 >= st.min_wait:
                            break
                        if side.poll(quiet / 2):
                            last = time.monotonic()
                    continue
                side.match(sides[0], t0 + bound)  # fencegate: what its Redis twin has
            # bytes fencegate has beyond Redis's: late on Redis's side, or a difference
            for _ in range(3):
                if not any(sides[1].readable(i) for i in range(n)):
                    break
                t0 = time.monotonic()
                while time.monotonic() - t0 < 0.3:
                    sides[0].poll(0.05)
                sides[1].match(sides[0], time.monotonic() + bound)
            for i in range(n):
                if sides[1].readable(i):
                    sides[1].read(i)
            for i in range(n):
                # a pinned connection that Redis closed (CLIENT KILL) answers its commands in
                # flight -UNAVAILABLE before it closes too (README, "Upstream down")
                b = sides[1].got[i]
                while sides[0].eof[i] and sides[1].eof[i] and len(b) > len(sides[0].got[i]):
                    j = b.rfind(b"-UNAVAILABLE upstream ", len(sides[0].got[i]))
                    if j < 0 or not b.endswith(b"\r\n") or b"\r\n" in b[j:-2]:
                        break
                    b = sides[1].got[i] = b[:j]
            bad = differs()
            if bad:
                print("step %d (connection %d sent %s): the answers differ" % (
                    steps, st.conn, show(st.data(ids[0]))))
                for i in bad:
                    print("connection %d\n  redis:     %s%s\n  fencegate: %s%s" % (
                        i, show(sides[0].got[i][before[0][i]:]),
                        " (closed)" if sides[0].eof[i] else "",
                        show(sides[1].got[i][before[1][i]:]),
                        " (closed)" if sides[1].eof[i] else ""))
                rc = 1
                break
            woken += any(len(sides[0].got[i]) > before[0][i] for i in range(n) if i != st.conn)
            for i in range(n):
                s = cg.st[i]
                new = sides[0].got[i][before[0][i]:]
                if new and not (s["resp3"] and new.startswith(b">")):  # not just a push
                    s["stalled"] = []
                if (i == st.conn and len(sides[0].got[i]) == before[0][i] and st.cmds and
                        not st.silent):
                    c = st.cmds[-1]
                    s["stalled"] = [x for x in c[1:] if isinstance(x, bytes) and
                                    x[:2] in (b"l:", b"z:", b"x:")] or [b"l:0"]
                if sides[0].eof[i]:  # killed (CLIENT KILL, QUIT): a new pair
                    kills += 1
                    pairs[i].open()
                    for k in (0, 1):
                        sides[k].socks[i] = pairs[i].socks[k]
                        sides[k].got[i], sides[k].eof[i] = b"", False
                    cg.reset(i)
        if rc == 0:  # the last pushes, late or extra
            for side in sides:
                side.poll(0.2)
            if differs():
                print("after the last step: the answers differ: %s" % ", ".join(
                    "connection %d: redis %s, fencegate %s" % (
                        i, show(sides[0].got[i][-300:]), show(sides[1].got[i][-300:]))
                    for i in differs()))
                rc = 1
    except OSError as e:
        print("step %d: %s" % (steps, e))
        rc = 1
    finally:
        for p in pairs:
            for s in p.socks:
                s.close()
    print("resp_diff: %d steps had answers or messages for another connection than the one that"
          " sent" % woken)
    return rc, steps, kills


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--steps", type=int, default=1000000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--conns", type=int, default=None)
    ap.add_argument("--protect", action="store_true")
    ap.add_argument("--fenced", action="store_true")
    ap.add_argument("--concurrent", action="store_true")
    ap.add_argument("--cross", action="store_true")
    ap.add_argument("--trace", help="append every batch sent (connection, bytes) to this file")
    ap.add_argument("--multiplex", choices=["true", "false"], default="true")
    a = ap.parse_args()
    if a.bin:
        harness.FENCEGATE_BIN = os.path.abspath(a.bin)
    if a.conns is None:
        a.conns = 4 if a.cross else 3
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print("resp_diff: seed %d, %d connections%s%s, multiplex %s" % (
        seed, a.conns, ", each holding a lock" if a.fenced else ", protect rule"
        if a.protect else "", ", concurrent" if a.concurrent else ", cross" if a.cross else "",
        a.multiplex),
        flush=True)
    rnd = random.Random(seed)
    servers = []
    try:
        direct = harness.RedisServer().start()
        servers.append(direct)
        behind = harness.RedisServer().start()
        servers.append(behind)
        args = ["--upstream-multiplex", a.multiplex, "--log-level", "warn"]
        if a.fenced or a.cross:
            # the locks in a Redis of their own, which FLUSHALL does not reach; and the lock
            # backend's subscriber connection is then not a client of the Redis compared
            locks = harness.RedisServer().start()
            servers.append(locks)
            args += ["--backend", locks.url]
        if a.fenced:
            args += ["--upstream", behind.url]
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
    if a.cross:
        # OBJECT FREQ counts every access (LFU with no log factor, no decay): a command that
        # reached Redis twice, or a key fencegate read, shows. With a maxmemory (never reached)
        # values are not Redis's shared integers, whose count fencegate's marks would share.
        for port in (direct.port, behind.port):
            c = harness.RawConn(port)
            c.call("CONFIG", "SET", "maxmemory-policy", "allkeys-lfu", "lfu-log-factor", "0",
                   "lfu-decay-time", "0", "maxmemory", "1gb", "notify-keyspace-events", "KEA")
            c.close()
        rc, steps, closes = 1, 0, 0
        try:
            rc, steps, closes = run_cross(a, seed, rnd, gen, direct.port, fg.resp_port)
            if not fg.alive():
                print("fencegate exited")
                rc = 1
        finally:
            rc = finish(fg, servers, rc)
        return report(rc, steps, "%d connections killed and made anew" % closes, seed, fg)
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
        rc = finish(fg, servers, rc)
    return report(rc, steps, "%d protocol-error closes" % closes, seed, fg)


def finish(fg, servers, rc):
    """Stops fencegate (a failure to stop cleanly fails the run) and the servers; returns rc,
    or 1 when fencegate did not stop cleanly, keeping why in fg.stop_error."""
    fg.stop_error = ""
    try:
        fg.stop()
    except AssertionError as e:
        fg.stop_error = str(e)
        rc = 1
    for s in reversed(servers):
        s.cleanup()
    return rc


def report(rc, steps, what, seed, fg):
    print("resp_diff: %d steps, %s: %s (seed %d)" % (
        steps, what, "all answers equal" if rc == 0 else "DIFFERENCE", seed))
    log = fg.stop_error or fg.stderr_text
    if rc and log:
        print("fencegate's log (tail):\n" + "\n".join(log.splitlines()[-20:]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
