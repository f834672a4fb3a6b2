"""The shared upstream connection: clients without connection state share one connection to
Redis; the first command that needs state of its own moves the client to a connection of its own
("pins" it), after the replies it still has due on the shared one (README, "Upstream
connections")."""

import os
import random
import signal
import time
import unittest

import harness  # first: it makes sure redis-py is importable
from harness import Err, FgTestCase, Status, encode

PINNED = "fencegate_clients_pinned_total"


class Multiplex(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.fg = self.start_fencegate(self.redis, args=["--upstream-multiplex", "true"])
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def pinned(self):
        return self.fg.metrics().get(PINNED, 0)

    def redis_clients(self):
        return len(self.direct.client_list())

    def test_interleaved_pipelines_of_many_clients_get_their_own_replies(self):
        conns = [self.raw(self.fg.resp_port) for _ in range(40)]
        # Every client writes before any reads, so their requests interleave on one connection.
        for i, c in enumerate(conns):
            c.send(b"".join(encode("SET", "k:%d:%d" % (i, j), "v:%d:%d" % (i, j)) +
                            encode("GET", "k:%d:%d" % (i, j)) for j in range(10)) +
                   encode("ECHO", "end-%d" % i))
        for i, c in enumerate(conns):
            for j in range(10):
                self.assertEqual(c.read_reply(), Status("OK"), "client %d SET %d" % (i, j))
                self.assertEqual(c.read_reply(), b"v:%d:%d" % (i, j), "client %d GET %d" % (i, j))
            self.assertEqual(c.read_reply(), b"end-%d" % i)
        # 40 busy clients, and Redis saw one connection for them (plus fencegate's health probe
        # and lock backend, and this test's own).
        self.assertLessEqual(self.redis_clients(), 5)
        self.assertEqual(self.pinned(), 0)

    def test_select_pins_after_the_shared_replies_and_keeps_the_order(self):
        c = self.raw(self.fg.resp_port)
        c.send(encode("SET", "a", "zero") + encode("INCR", "n") + encode("SELECT", "3") +
               encode("SET", "a", "three") + encode("GET", "a") + encode("INCR", "n"))
        self.assertEqual([c.read_reply() for _ in range(6)],
                         [Status("OK"), 1, Status("OK"), Status("OK"), b"three", 1])
        self.assertEqual(self.direct.get("a"), b"zero")
        self.assertEqual(self.redis.client(db=3).get("a"), b"three")
        self.assertEqual(self.pinned(), 1)
        # Another client is still on database 0.
        other = self.raw(self.fg.resp_port)
        self.assertEqual(other.call("GET", "a"), b"zero")
        self.assertEqual(self.pinned(), 1)

    def test_which_commands_pin(self):
        self.direct.xadd("s", {"f": "v"})
        stateless = [("GET", "x"), ("SET", "x", "1"), ("PING",), ("ECHO", "e"), ("INCR", "i"),
                     ("DBSIZE",), ("XREAD", "STREAMS", "s", "0"), ("MGET", "x", "y"),
                     ("FENCE.LOCKS",), ("PUBLISH", "ch", "m")]
        for cmd in stateless:
            c = self.raw(self.fg.resp_port)
            self.assertNotIsInstance(c.call(*cmd), Err, cmd)
            self.assertEqual(self.pinned(), 0, "%s pinned its client" % (cmd,))
            c.close()
        if self.raw(self.redis.port).call("COMMAND", "INFO", "CLIENT|SETINFO") == [None]:
            # Before Redis 7.2 CLIENT SETINFO (node-redis and ioredis send it on connect) only
            # earns an error: no state, so no connection of its own.
            got = self.raw(self.fg.resp_port).call("CLIENT", "SETINFO", "LIB-NAME", "x")
            self.assertTrue(str(got).startswith("ERR unknown subcommand"), got)
            self.assertEqual(self.pinned(), 0)
        stateful = [("SELECT", "0"), ("CLIENT", "SETNAME", "n"), ("MULTI",), ("WATCH", "x"),
                    ("BLPOP", "nolist", "0.05"), ("SUBSCRIBE", "ch"), ("EVAL", "return 1", "0"),
                    ("HELLO", "2"), ("XREAD", "BLOCK", "50", "STREAMS", "s", "$"),
                    ("CONFIG", "GET", "maxclients"), ("NOSUCHCOMMAND",)]
        for n, cmd in enumerate(stateful, 1):
            c = self.raw(self.fg.resp_port)
            c.call(*cmd)
            self.assertEqual(self.pinned(), n, "%s did not pin its client" % (cmd,))
            c.close()

    def test_client_gone_with_replies_due_leaves_others_intact(self):
        self.direct.set("big", os.urandom(100 * 1024))
        other = self.raw(self.fg.resp_port)
        for round_ in range(5):
            gone = self.raw(self.fg.resp_port)
            gone.send(encode("GET", "big") * 30)
            gone.close()  # its 30 replies are still due on the shared connection
            other.send(b"".join(encode("SET", "o%d" % j, "%d:%d" % (round_, j)) +
                                encode("GET", "o%d" % j) for j in range(12)))
            for j in range(12):
                self.assertEqual(other.read_reply(), Status("OK"))
                self.assertEqual(other.read_reply(), b"%d:%d" % (round_, j))
        self.assertTrue(self.fg.alive())
        self.assertEqual(self.pinned(), 0)

    def test_request_completed_while_the_shared_connection_is_full_is_sent_later(self):
        # A client's request arrives in two parts; between them the shared connection's queue
        # passes max_pending_bytes (Redis is stopped, other clients' big SETs pile up), so the
        # second part is read while no client may add to the queue. Once Redis reads again, the
        # request must go: it used to wait in fencegate for ever, and its client with it.
        value = b"v" * (900 * 1024)  # under max_pending_bytes (1 MiB): stays shared
        x = self.raw(self.fg.resp_port, timeout=20)
        req = encode("SET", "x", value)
        x.send(req[:len(req) // 2])
        time.sleep(0.2)
        self.redis.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(self.redis.proc.send_signal, signal.SIGCONT)
        fillers = [self.raw(self.fg.resp_port, timeout=20) for _ in range(24)]
        for i, f in enumerate(fillers):
            f.send(encode("SET", "fill:%d" % i, value))
        time.sleep(1.0)  # fencegate reads them until its queue for Redis is full
        x.send(req[len(req) // 2:])
        time.sleep(0.3)
        self.redis.proc.send_signal(signal.SIGCONT)
        for i, f in enumerate(fillers):
            self.assertEqual(f.read_reply(), Status("OK"), "filler %d" % i)
        self.assertEqual(x.read_reply(), Status("OK"))
        self.assertEqual(self.direct.strlen("x"), len(value))
        self.assertEqual(self.pinned(), 0)

    def test_large_replies_due_on_the_shared_connection_are_bounded(self):
        # Redis builds every reply to what one read brought before it writes any: 40 clients'
        # 16 pipelined GETs of 64 KB sent at once made it build 40 MB on the shared connection,
        # and run at a fifth of the rate. fencegate now lets only about 1 MiB of replies (by
        # their recent mean size) be due there, and holds the other clients' requests back
        # until replies come; every client still gets all its replies, in order.
        value = b"v" * (64 * 1024)
        self.direct.set("big", value)
        warm = self.raw(self.fg.resp_port, timeout=20)
        for _ in range(32):  # the mean reply size the budget follows
            self.assertEqual(warm.call("GET", "big"), value)
        clients = [self.raw(self.fg.resp_port, timeout=30) for _ in range(40)]
        before = self.fg.metrics().get("fencegate_commands_forwarded_total", 0)
        self.redis.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(self.redis.proc.send_signal, signal.SIGCONT)
        for i, c in enumerate(clients):
            c.send(b"".join(encode("GET", "big") if j % 4 else encode("ECHO", "%d.%d" % (i, j))
                            for j in range(16)))
        time.sleep(1.0)  # fencegate reads every request it may
        sent = self.fg.metrics().get("fencegate_commands_forwarded_total", 0) - before
        self.redis.proc.send_signal(signal.SIGCONT)
        self.assertGreaterEqual(sent, 16)
        self.assertLessEqual(sent, 32)  # 640 before the budget
        for i, c in enumerate(clients):
            for j in range(16):
                want = value if j % 4 else ("%d.%d" % (i, j)).encode()
                self.assertEqual(c.read_reply(), want, "client %d reply %d" % (i, j))
        self.assertEqual(self.pinned(), 0)

    def test_deep_pipeline_pins(self):
        c = self.raw(self.fg.resp_port)
        c.send(b"".join(encode("INCR", "deep") for _ in range(500)))
        self.assertEqual([c.read_reply() for _ in range(500)], list(range(1, 501)))
        self.assertEqual(self.pinned(), 1)

    def test_upstream_restart_keeps_unpinned_clients(self):
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("SET", "k", "v"), Status("OK"))
        self.redis.stop()
        got = c.call("GET", "k")
        self.assertIsInstance(got, Err)
        self.assertTrue(str(got).startswith("UNAVAILABLE"), got)
        self.redis.start()  # same port, empty data set

        def works():
            r = c.call("SET", "k", "again")
            return r == Status("OK")
        harness.wait_until(works, 10, 0.2, "the same connection to work after Redis restarted")
        self.assertEqual(c.call("GET", "k"), b"again")
        self.assertEqual(self.pinned(), 0)

    def shared_link_id(self, last_cmd):
        """Redis' CLIENT ID of the shared connection (the connection whose last command was
        last_cmd, which only the test sent)."""
        ids = [int(c["id"]) for c in self.direct.client_list() if c.get("cmd") == last_cmd]
        self.assertEqual(len(ids), 1, self.direct.client_list())
        return ids[0]

    def test_link_loss_keeps_a_waiting_acquire_ahead_of_the_write_behind_it(self):
        holder = self.raw(self.fg.resp_port)
        self.assertIsInstance(holder.call("FENCE.ACQUIRE", "L"), int)
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("APPEND", "marker", "x"), 1)
        link = self.shared_link_id("append")
        c.send(encode("FENCE.ACQUIRE", "L", "WAIT", "5000") + encode("SET", "k", "from-c"))
        time.sleep(0.3)
        self.direct.execute_command("CLIENT", "KILL", "ID", str(link))
        time.sleep(0.5)
        self.assertIsNone(self.direct.get("k"), "the write ran while another client held L")
        self.assertEqual(holder.call("FENCE.RELEASE", "L"), 1)
        self.assertIsInstance(c.read_reply(), int)  # now c holds L ...
        self.assertEqual(c.read_reply(), Status("OK"))  # ... and its write went out fenced
        self.assertEqual(self.direct.get("k"), b"from-c")

    def test_connections_killed_under_grouped_fenced_writes(self):
        # Fenced writes travel grouped on the shared connection (16 in flight per client: deeper
        # pipelines pin); Redis drops its connections in the middle of the stream. Each write
        # must get its own reply, -UNAVAILABLE (outcome unknown) or -LOCKLOST (never sent), in
        # order, and the data must agree.
        conns = [self.raw(self.fg.resp_port, timeout=20) for _ in range(20)]
        for i, c in enumerate(conns):
            self.assertIsInstance(c.call("FENCE.ACQUIRE", "g%d" % i), int)
        sent = [[] for _ in conns]
        replies = [[] for _ in conns]
        unavailable = 0
        for rnd in range(12):
            for i, c in enumerate(conns):
                vals = ["%d.%d" % (rnd, j) for j in range(16)]
                sent[i] += vals
                c.send(b"".join(encode("RPUSH", "{g%d}l" % i, v) for v in vals))
            if rnd % 3 == 0:
                self.direct.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            for i, c in enumerate(conns):
                for _ in range(16):
                    r = c.read_reply(timeout=20)
                    replies[i].append(r)
                    unavailable += isinstance(r, Err) and r.startswith("UNAVAILABLE")
            for i, c in enumerate(conns):  # a lock lost with its connection: take it again
                if c.call("FENCE.TOKEN", "g%d" % i) is None:
                    harness.wait_until(
                        lambda: isinstance(c.call("FENCE.ACQUIRE", "g%d" % i), int), 10, 0.2,
                        "lock g%d to be taken again" % i)
        self.assertGreater(unavailable, 0, "no write was in flight when the links were killed")
        self.assertEqual(self.pinned(), 0)
        for i in range(len(conns)):
            outcome = list(zip(sent[i], replies[i]))
            for v, r in outcome:
                self.assertTrue(isinstance(r, int) or (isinstance(r, Err) and r.startswith(
                    ("UNAVAILABLE", "LOCKLOST"))), "client %d write %s got %r" % (i, v, r))
            stored = [v.decode() for v in self.direct.lrange("{g%d}l" % i, 0, -1)]
            ok = {v for v, r in outcome if isinstance(r, int)}
            maybe = ok | {v for v, r in outcome if isinstance(r, Err) and r.startswith("UNAVAIL")}
            self.assertTrue(ok <= set(stored), "client %d: an acknowledged write is gone" % i)
            self.assertTrue(set(stored) <= maybe, "client %d: a refused write was applied" % i)
            self.assertEqual(stored, [v for v in sent[i] if v in set(stored)],
                             "client %d: writes applied out of order" % i)
            lengths = [r for r in replies[i] if isinstance(r, int)]
            self.assertEqual(lengths, sorted(lengths), "client %d: replies out of order" % i)

    def test_pinned_connections_killed_under_pipelined_fenced_transactions(self):
        # Pinned clients (CLIENT SETNAME) send their fenced writes under one lock to Redis as
        # transactions of up to 64. Redis kills those connections mid-stream: a pinned client
        # then gets -UNAVAILABLE for what was in flight and loses its connection (as with Redis
        # itself). What each client read must agree with the data: every acknowledged write
        # stored, nothing stored that was refused, in order.
        sent, acked, unknown = {}, {}, {}
        disrupted = 0
        def named(i):
            """A connection named p<i>, or None: a CLIENT SETNAME refused while fencegate finds
            the upstream down ends the connection (it is tried again on a new one)."""
            c = self.raw(self.fg.resp_port, timeout=20)
            try:
                if c.call("CLIENT", "SETNAME", "p%d" % i) == "OK":
                    return c
            except (OSError, EOFError):
                pass
            c.close()
            return None

        def exec_calls():
            return self.direct.info("commandstats").get("cmdstat_exec", {}).get("calls", 0)

        for rnd in range(6):
            execs0 = exec_calls()
            # The kill also cut fencegate's own connections (probe, lock backend): the lock of
            # the last round may still be held until its lease ends, hence a new name.
            conns = [harness.wait_until(lambda: named(i), 10, 0.1, "the upstream back")
                     for i in range(8)]
            for i, c in enumerate(conns):
                harness.wait_until(
                    lambda: isinstance(c.call("FENCE.ACQUIRE", "p%d.%d" % (i, rnd)), int), 10,
                    0.1, "lock p%d.%d" % (i, rnd))
            for i, c in enumerate(conns):
                vals = ["%d.%d" % (rnd, j) for j in range(200)]
                sent.setdefault(i, []).extend(vals)
                c.send(b"".join(encode("RPUSH", "{p%d.%d}l" % (i, rnd), v) for v in vals))
            if rnd % 2:
                # Every other round the kill waits for a transaction to have run, so that some
                # surely did (a slow build, under ASan, could otherwise lose every race).
                harness.wait_until(lambda: exec_calls() > execs0, 10, 0.002, "a transaction")
            self.direct.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            for i, c in enumerate(conns):
                for j in range(200):
                    v = "%d.%d" % (rnd, j)
                    try:
                        r = c.read_reply(timeout=20)
                    except EOFError:
                        disrupted += 1
                        unknown.setdefault(i, set()).update(
                            "%d.%d" % (rnd, x) for x in range(j, 200))
                        break
                    if isinstance(r, int):
                        acked.setdefault(i, set()).add(v)
                    else:
                        self.assertTrue(r.startswith(("UNAVAILABLE", "LOCKLOST")), r)
                        disrupted += 1
                        unknown.setdefault(i, set()).add(v)
                c.close()
        self.assertGreater(disrupted, 0, "no connection was killed with writes in flight")
        self.assertGreater(exec_calls(), 0, "no transaction")
        for i in sent:
            stored = [v.decode() for rnd in range(6)
                      for v in self.direct.lrange("{p%d.%d}l" % (i, rnd), 0, -1)]
            ok, maybe = acked.get(i, set()), acked.get(i, set()) | unknown.get(i, set())
            self.assertTrue(ok <= set(stored), "client %d: an acknowledged write is gone" % i)
            self.assertTrue(set(stored) <= maybe, "client %d: a refused write was applied" % i)
            self.assertEqual(stored, [v for v in sent[i] if v in set(stored)],
                             "client %d: writes applied out of order" % i)
        self.assertTrue(self.fg.alive())

    def test_a_request_redis_refuses_ends_only_its_senders_connection(self):
        # Redis closes a connection that sends a bulk over proto-max-bulk-len. Requests over
        # max_pending_bytes (1 MiB) pin, so the shared connection is not the one closed.
        self.direct.config_set("proto-max-bulk-len", "1mb")
        self.addCleanup(lambda: self.direct.config_set("proto-max-bulk-len", "512mb"))
        self.direct.set("small", "v")
        victim, bad = self.raw(self.fg.resp_port), self.raw(self.fg.resp_port)
        self.assertEqual(victim.call("PING"), Status("PONG"))
        bad.send(encode("SET", "huge", "y" * (2 * 1024 * 1024)))
        victim.send(b"".join(encode("GET", "small") for _ in range(20)))
        self.assertEqual([victim.read_reply() for _ in range(20)], [b"v"] * 20)
        got = bad.read_reply()
        self.assertIsInstance(got, Err)
        # Redis' own error, or, when its reset beats the rest of the 2 MB, the lost connection.
        self.assertTrue("Protocol error" in got or got.startswith("UNAVAILABLE"), got)
        self.assertEqual(self.pinned(), 1)

    def test_upstream_password_and_database_on_both_kinds_of_connection(self):
        # A generated secret may hold '/', '+', '@' or '#': the URL's user info ends at its last
        # '@', for the upstream and the lock backend alike.
        pw = "s3/cr@t+#"
        self.direct.config_set("requirepass", pw)
        self.addCleanup(lambda: self.redis.client(password=pw).config_set("requirepass", ""))
        url = "redis://:%s@127.0.0.1:%d/2" % (pw, self.redis.port)
        fg = self.start_fencegate(url, args=["--upstream-multiplex", "true"])
        shared, pinned = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.assertEqual(shared.call("SET", "on", "shared"), Status("OK"))
        self.assertEqual(pinned.call("CLIENT", "SETNAME", "p"), Status("OK"))
        self.assertEqual(pinned.call("SET", "on2", "pinned"), Status("OK"))
        db2 = self.redis.client(db=2, password=pw)
        self.addCleanup(db2.close)
        self.assertEqual(db2.mget("on", "on2"), [b"shared", b"pinned"])

        # The lock backend's password may come from a file instead (a mounted Secret).
        fg2 = self.start_fencegate(url, args=[
            "--backend", "redis://127.0.0.1:%d/2" % self.redis.port,
            "--backend-password-file", self.write_file("pw", pw + "\n")])
        self.assertIsInstance(self.raw(fg2.resp_port).call("FENCE.ACQUIRE", "pwf"), int)

        wrong = "redis://:nope@127.0.0.1:%d/2" % self.redis.port
        bad = self.start_fencegate(wrong, args=["--upstream-multiplex", "true"], readyz=False)
        got = self.raw(bad.resp_port).call("GET", "on")
        self.assertIsInstance(got, Err)
        self.assertTrue(str(got).startswith("UNAVAILABLE"), got)

    def test_the_shared_connection_is_excluded_from_client_eviction(self):
        """Redis 7 evicts the clients using the most memory past maxmemory-clients; the shared
        connection carries many clients' bytes, so it asks to be left out (CLIENT NO-EVICT).
        A user who may not send CLIENT still gets a working shared connection."""
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("SET", "ne", "1"), Status("OK"))
        flagged = [cl for cl in self.direct.client_list() if "e" in cl["flags"]]
        self.assertEqual(len(flagged), 1, self.direct.client_list())
        self.direct.execute_command("ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*",
                                    "+@all", "-client")
        url = "redis://noclient:pw@127.0.0.1:%d" % self.redis.port
        fg = self.start_fencegate(url, args=["--upstream-multiplex", "true",
                                             "--backend", self.redis.url])
        c2, c3 = self.raw(fg.resp_port), self.raw(fg.resp_port)
        self.assertEqual(c2.call("SET", "ne2", "2"), Status("OK"))
        self.assertEqual(c3.call("GET", "ne2"), b"2")
        self.assertEqual(self.pinned(), 0)

    def test_random_programs_answer_as_direct_redis(self):
        """16 clients run random programs (plain commands, errors, SELECT, MULTI/EXEC, WATCH,
        BLPOP with a timeout, CLIENT SETNAME, unknown commands, QUIT) through fencegate, their
        pipelines interleaved; each client's replies must be byte for byte what the same program
        gets from a Redis of its own. Half the programs pin, half stay on the shared one."""
        seed = int(os.environ.get("FG_TEST_SEED", random.randrange(1 << 30)))
        rng = random.Random(seed)
        programs = [self.program(rng, i) for i in range(16)]
        other = self.start_redis()
        want = []
        for prog in programs:
            d = self.raw(other.port)
            want.append(self.run_chunks(d, [sum(prog, [])]))
            d.close()
        conns = [self.raw(self.fg.resp_port) for _ in programs]
        chunked = [self.chunks(rng, prog) for prog in programs]
        got = [[] for _ in programs]
        for turn in range(max(len(c) for c in chunked)):
            live = [i for i in range(len(conns)) if turn < len(chunked[i])]
            for i in live:  # every client writes its chunk, then all read: interleaved
                conns[i].send(b"".join(encode(*cmd) for cmd in chunked[i][turn]))
            for i in live:
                got[i] += [conns[i].read_raw_reply(timeout=10) for _ in chunked[i][turn]]
        for i in range(len(programs)):
            self.assertEqual(got[i], want[i], "client %d (FG_TEST_SEED=%d)" % (i, seed))
        self.assertEqual(self.pinned(), len(programs) // 2, "FG_TEST_SEED=%d" % seed)

    @staticmethod
    def run_chunks(conn, chunks):
        out = []
        for chunk in chunks:
            conn.send(b"".join(encode(*cmd) for cmd in chunk))
            out += [conn.read_raw_reply(timeout=10) for _ in chunk]
        return out

    @staticmethod
    def chunks(rng, prog):
        """The program's steps (a step is one command or a MULTI..EXEC block) in pipelines of
        up to 8 commands."""
        out, cur = [], []
        for step in prog:
            cur += step
            if len(cur) >= rng.randint(1, 8):
                out.append(cur)
                cur = []
        if cur:
            out.append(cur)
        return out

    @staticmethod
    def program(rng, i):
        k, n, lst, h = "p%d:k" % i, "p%d:n" % i, "p%d:l" % i, "p%d:h" % i
        plain = [
            lambda: [("SET", k, "v%d" % rng.randint(0, 99))],
            lambda: [("GET", k)],
            lambda: [("INCR", n)],
            lambda: [("INCR", k)],  # an error while k holds "v.."
            lambda: [("APPEND", k, "x")],
            lambda: [("LPUSH", lst, str(rng.randint(0, 9)))],
            lambda: [("LRANGE", lst, "0", "-1")],
            lambda: [("HSET", h, "f%d" % rng.randint(0, 3), "x")],
            lambda: [("HGETALL", h)],
            lambda: [("MGET", k, n, lst)],
            lambda: [("DEL", k)],
            lambda: [("PING",)],
            lambda: [("ECHO", "e%d" % i)],
        ]
        stateful = [
            lambda: [("SELECT", str(rng.randint(0, 3)))],
            lambda: [("MULTI",), ("INCR", n), ("GET", k), ("EXEC",)],
            lambda: [("WATCH", k), ("MULTI",), ("SET", k, "w"), ("EXEC",)],
            lambda: [("BLPOP", "p%d:empty" % i, "0.01")],
            lambda: [("CLIENT", "SETNAME", "c%d" % i), ("CLIENT", "GETNAME")],
            lambda: [("NOSUCHCMD", k)],  # unknown: pins, then Redis' error
        ]
        prog = [rng.choice(plain)() for _ in range(rng.randint(5, 40))]
        if i % 2:  # half the clients pin somewhere along the way
            for _ in range(rng.randint(1, 3)):
                prog.insert(rng.randint(0, len(prog)), rng.choice(stateful)())
        if rng.random() < 0.3:
            prog.append([("QUIT",)])
        return prog

    def test_wait_counts_the_writes_made_on_the_shared_connection(self):
        # WAIT answers how many replicas acknowledged the writes of *its* connection. A client's
        # writes went on the shared connection; WAIT pins it to a new one, where Redis knows of
        # no write: it would answer at once that every replica has them, though none does.
        replica = self.start_redis(args=["--replicaof", "127.0.0.1", str(self.redis.port)])
        harness.wait_until(
            lambda: self.direct.info("replication").get("connected_slaves") == 1 and
            replica.client().info("replication").get("master_link_status") == "up",
            10, 0.05, "the replica to attach")
        c = self.raw(self.fg.resp_port)
        self.assertEqual(c.call("SET", "w", "1"), Status("OK"))
        self.assertEqual(c.call("WAIT", "1", "5000"), 1)  # the replica has it
        self.assertEqual(self.pinned(), 1)
        fresh = self.raw(self.fg.resp_port)
        self.assertEqual(fresh.call("SET", "w", "2"), Status("OK"))
        self.assertEqual(fresh.call("WAIT", "1", "5000"), 1)
        replica.proc.send_signal(signal.SIGSTOP)  # it stops acknowledging
        self.addCleanup(lambda: replica.proc.poll() is None and
                        replica.proc.send_signal(signal.SIGCONT))
        late = self.raw(self.fg.resp_port)
        self.assertEqual(late.call("SET", "w", "3"), Status("OK"))
        self.assertEqual(late.call("WAIT", "1", "300"), 0, "WAIT claimed a replica has the write")
        replica.proc.send_signal(signal.SIGCONT)
        self.assertEqual(late.call("WAIT", "1", "5000"), 1)

    def test_dedicated_when_multiplexing_is_off(self):
        fg = self.start_fencegate(self.redis, args=["--upstream-multiplex", "false"])
        before = self.redis_clients()
        conns = [self.raw(fg.resp_port) for _ in range(10)]
        for c in conns:
            self.assertEqual(c.call("PING"), Status("PONG"))
        self.assertEqual(self.redis_clients(), before + 10)


if __name__ == "__main__":
    unittest.main()
