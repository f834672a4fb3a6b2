"""PostgreSQL stores: POST /v1/stores/{store}/sql against a real postgres (harness
PostgresServer), with the Redis lock backend."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

import harness
from harness import (FENCEGATE_BIN, PSQL, FgTestCase, PostgresServer, PromptPoller, clean_env,
                     free_port, http_request, run_fencegate, wait_until)


def libpq_mapped(pid):
    """The libpq files mapped into process pid (/proc/PID/maps)."""
    with open("/proc/%d/maps" % pid) as f:
        return sorted({line.split()[-1] for line in f if "/libpq.so" in line})


class PgStoreTest(FgTestCase):

    def setUp(self):
        self.redis = self.start_redis()
        self.pg = PostgresServer()
        self.addCleanup(self.pg.cleanup)
        self.pg.start()
        self.pg.sql("CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, "
                    "balance numeric NOT NULL DEFAULT 0)")
        self.pg.sql("INSERT INTO accounts VALUES (1, 'alice', 10), (2, 'bob', 20)")

    def fencegate(self, extra="", args=()):
        cfg = self.write_file("fg-%d.yaml" % len(self._fg_procs),
                              "stores:\n  - name: pg\n    url: %s\n%s" % (self.pg.url, extra))
        return self.start_fencegate(self.redis, args=["--config", cfg] + list(args))

    def acquire(self, fg, lock="L", ttl_ms=None):
        body = {"ttl_ms": ttl_ms} if ttl_ms else None
        st, _, data = http_request(fg.http_port, "POST", "/v1/locks/" + lock, body or b"")
        self.assertEqual(st, 200, data)
        return json.loads(data)["token"]

    def sql(self, fg, statements, lock="L", store="pg", timeout=10.0):
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/%s/sql" % store,
                                   {"lock": lock, "statements": statements}, timeout=timeout)
        return st, json.loads(data)

    def rows(self, query="SELECT id, owner, balance FROM accounts ORDER BY id"):
        return self.pg.sql(query).splitlines()

    def schema(self):
        return self.pg.sql("SELECT table_name, column_name, data_type, is_nullable FROM "
                           "information_schema.columns WHERE table_schema = 'public' AND "
                           "table_name <> 'fencegate_fence' ORDER BY 1, 2")

    def test_libpq_is_loaded_only_for_a_postgres_store(self):
        """fencegate dlopens libpq (proxy/pqlib.h) only when a PostgreSQL store is configured:
        a sidecar without one maps neither it nor what it pulls in (its idle RSS)."""
        plain = self.start_fencegate(self.redis)
        self.assertEqual(libpq_mapped(plain.pid), [])
        fg = self.fencegate()
        self.assertNotEqual(libpq_mapped(fg.pid), [])
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[1]]), body)

    # ---- the safety story ---------------------------------------------------------------

    def test_text_is_utf8_whatever_the_database_encoding(self):
        """JSON is UTF-8: the connection says so (client_encoding), so that a LATIN1 database
        stores one character for "é", and what other clients wrote comes back right."""
        self.pg.sql("CREATE DATABASE latin ENCODING 'LATIN1' TEMPLATE template0 "
                    "LC_COLLATE 'C' LC_CTYPE 'C'")
        url = self.pg.url.rsplit("/", 1)[0] + "/latin"
        cfg = self.write_file("fg-latin.yaml", "stores:\n  - name: pg\n    url: %s\n" % url)
        fg = self.start_fencegate(self.redis, args=["--config", cfg])
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "CREATE TABLE t (s text)"},
                                 {"sql": "INSERT INTO t VALUES ($1)", "params": ["\u00e9"]},
                                 {"sql": "SELECT s, length(s) FROM t"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["results"][2]["rows"], [["\u00e9", 1]])
        p = subprocess.run([PSQL, "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.pg.port),
                            "-U", self.pg.user, "-d", "latin", "-c",
                            "SELECT length(s), octet_length(s) FROM t"],
                           capture_output=True, timeout=30, env=clean_env())
        self.assertEqual(p.stdout.decode().strip(), "1|1")

    def test_a_batch_that_changes_the_client_encoding_does_not_garble_later_ones(self):
        """A session-level SET is refused, but set_config() still reaches the pooled session.
        A batch that sets client_encoding keeps it to itself: the connection is made anew after
        it. The binary before kept the connection: later batches on it stored 'caf\u00e9' as
        'caf\u00c3\u00a9' (answering 200 with the text looking right), and fence on acquire wrote
        the row of lock '\u00f6' under another name, so a former holder's batches, checking the
        row of '\u00f6', still found their own token there."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "SELECT set_config('client_encoding', 'LATIN1', false)"}])
        self.assertEqual(st, 200, body)
        st, body = self.sql(fg, [
            {"sql": "UPDATE accounts SET owner = $1 WHERE id = 1", "params": ["caf\u00e9"]},
            {"sql": "SELECT owner, 'caf\u00e9' AS lit FROM accounts WHERE id = 1"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["results"][1]["rows"], [["caf\u00e9", "caf\u00e9"]])
        self.assertEqual(self.rows()[0], "1|caf\u00e9|10")
        self.sql(fg, [{"sql": "SELECT set_config('client_encoding', 'LATIN1', false)"}])
        t = self.acquire(fg, urllib.parse.quote("\u00f6"))
        self.assertEqual(self.pg.sql("SELECT lock, token FROM fencegate_fence WHERE lock <> 'L'"),
                         "\u00f6|%d" % t)

    def test_an_application_error_that_quotes_fencegate_is_its_own(self):
        """A statement's own error is the application's (422), even when its text is the one
        fencegate's last check uses to say the batch escaped its transaction."""
        fg = self.fencegate()
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "SELECT CAST('fencegate: the batch ended the "
                                         "transaction fencegate began' AS int)"}])
        self.assertEqual((st, body["error"]), (422, "sql_error"), body)

    def test_frozen_sidecar_is_refused_and_never_writes(self):
        a = self.fencegate(args=["--session-ttl-ms", "1000"])
        b = self.fencegate(args=["--session-ttl-ms", "1000"])
        schema = self.schema()
        ta = self.acquire(a, "L")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"),
                         str(ta), "fence on acquire raised the mark to A's token")
        st, body = self.sql(a, [{"sql": "UPDATE accounts SET owner = 'A1' WHERE id = 1"}])
        self.assertEqual(st, 200, body)
        self.freeze(a)
        time.sleep(2.0)  # A's lease (1 s) runs out while it is stopped
        tb = self.acquire(b, "L")
        self.assertGreater(tb, ta)
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"),
                         str(tb), "B's grant raised the mark before B got the token")
        st, body = self.sql(b, [{"sql": "UPDATE accounts SET owner = 'B' WHERE id = 2"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["token"], tb)
        a.signal(signal.SIGCONT)
        st, body = self.sql(a, [{"sql": "UPDATE accounts SET owner = 'A2' WHERE id = 1"},
                                {"sql": "INSERT INTO accounts VALUES (3, 'A', 0)"}])
        self.assertEqual(st, 409, body)
        self.assertIn(body["error"], ("stale_token", "lock_lost"))
        if body["error"] == "stale_token":
            self.assertEqual((body["token"], body["mark"]), (ta, tb))
        self.assertEqual(self.rows(), ["1|A1|10", "2|B|20"], "A's late batch reached the table")
        self.assertEqual(self.schema(), schema, "fencegate altered the application's tables")
        # Nothing A sends later gets through either.
        st, body = self.sql(a, [{"sql": "DELETE FROM accounts"}])
        self.assertEqual(st, 409, body)
        self.assertEqual(len(self.rows()), 2)

    def test_a_large_result_does_not_stay_in_memory(self):
        # libpq keeps a connection's input buffer as large as the largest message it read, for
        # the connection's life: a 40 MB value left 40 MB resident per pooled connection after
        # it was answered. A connection that read a result that large is closed and made again.
        fg = self.fencegate("    pool_size: 2\n")
        self.acquire(fg)
        before = harness.rss_kib(fg.pid)
        for _ in range(2):
            st, body = self.sql(fg, [{"sql": "SELECT repeat('x', 40000000) AS big"}], timeout=30)
            self.assertEqual((st, body["error"]), (413, "result_too_large"), body)
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[1]]), body)
        harness.wait_until(lambda: harness.rss_kib(fg.pid) - before < 16 * 1024, 5, 0.1,
                           "RSS back within 16 MiB of before (grew %d KiB)"
                           % (harness.rss_kib(fg.pid) - before))

    def test_stale_token_rolls_back_with_both_tokens(self):
        fg = self.fencegate()
        t = self.acquire(fg)
        # Another writer fenced the row further (as a newer holder elsewhere would).
        self.pg.sql("UPDATE fencegate_fence SET token = %d WHERE lock = 'L'" % (t + 5))
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 0"}])
        self.assertEqual(st, 409, body)
        self.assertEqual(body["error"], "stale_token")
        self.assertEqual((body["token"], body["mark"]), (t, t + 5))
        self.assertEqual(self.rows(), ["1|alice|10", "2|bob|20"])
        self.assertGreaterEqual(fg.metrics()["fencegate_pg_stale_refused_total"], 1)
        # The row proves a newer grant: the lock is given up, not kept until the lease ends.
        _, _, data = http_request(fg.http_port, "GET", "/v1/locks")
        self.assertEqual([(x["name"], x["token"], x["state"])
                          for x in json.loads(data)["locks"]], [("L", t, "lost")])

    def test_fence_row_deleted_or_lowered_is_refused_and_the_lock_given_up(self):
        """Fence on acquire put exactly T in the row; a row that is gone or below T was reset
        behind fencegate's back (or lost in a failover), and the batch cannot be proven current:
        refused, nothing written, and the lock given up, so that taking it again yields a new
        token that raises the row anew."""
        fg = self.fencegate()
        t = self.acquire(fg)
        for reset in ("DELETE FROM fencegate_fence WHERE lock = 'L'",
                      "UPDATE fencegate_fence SET token = token - 1 WHERE lock = 'L'"):
            self.pg.sql(reset)
            before = self.rows()
            st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 0"}])
            self.assertEqual((st, body["error"]), (409, "lock_lost"), body)
            self.assertIn("is gone or below token %d" % t, body["message"])
            self.assertEqual(self.rows(), before)
            st, _, body = http_request(fg.http_port, "GET", "/v1/locks")
            locks = json.loads(body)["locks"]
            self.assertEqual([(x["name"], x["token"], x["state"]) for x in locks],
                             [("L", t, "lost")], body)
            t2 = self.acquire(fg)
            self.assertGreater(t2, t)
            st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 1 WHERE id = 1"}])
            self.assertEqual(st, 200, body)
            t = t2

    def test_a_dropped_fence_table_fails_closed_then_is_created_again(self):
        """DROP TABLE fencegate_fence (or of its schema's contents): batches are refused, then the
        connections that met the drop reconnect, which creates the table. Its rows are gone, so
        the lock is given up (lock_lost) and a new grant fences again. The binary before kept
        its connections and answered 503 to every batch and lock acquisition until restarted,
        while /readyz said ready."""
        fg = self.fencegate("    pool_size: 2\n")
        self.acquire(fg)
        self.pg.sql("DROP TABLE fencegate_fence")
        update = [{"sql": "UPDATE accounts SET owner = 'fenced' WHERE id = 1"}]
        st, body = self.sql(fg, update)
        self.assertEqual((st, body["error"]), (503, "store_unavailable"), body)
        self.assertIn("fencegate_fence", body["message"])
        answers = []

        def refused_lock_lost():
            answers.append(self.sql(fg, update))
            return answers[-1][0] == 409
        wait_until(refused_lock_lost, 10, interval=0.2, what="the table created again")
        self.assertEqual(answers[-1][1]["error"], "lock_lost", answers)
        self.assertTrue(all(a[0] in (503, 409) for a in answers), answers)
        self.assertEqual(self.rows()[0], "1|alice|10")
        t = self.acquire(fg)
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"), str(t))
        st, body = self.sql(fg, update)
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows()[0], "1|fenced|10")

    def test_a_batch_that_deallocates_fencegates_statements_does_not_break_the_connection(self):
        """DEALLOCATE is refused, but dynamic SQL still reaches it, and it is not transactional:
        the rolled-back batch leaves its pooled connection without fencegate's prepared
        statements. That batch is answered as fencegate's failure (503, nothing committed, not a
        422 naming a statement the batch does not have), and the connection is made anew. The
        binary before kept it: every later batch and fence on acquire on it failed ("prepared
        statement fencegate_fence_begin does not exist") until fencegate restarted, while
        /readyz said ready."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'gone' WHERE id = 1"},
                                 {"sql": "DO $$BEGIN EXECUTE 'DEALLOCATE ALL'; END$$"}])
        self.assertEqual((st, body["error"]), (503, "store_unavailable"), body)
        self.assertIn("nothing was committed", body["message"])
        self.assertEqual(self.rows()[0], "1|alice|10")
        update = [{"sql": "UPDATE accounts SET owner = 'back' WHERE id = 1"}]
        wait_until(lambda: self.sql(fg, update)[0] == 200, 10, 0.1, "a batch committed again")
        self.assertEqual(self.rows()[0], "1|back|10")
        m = self.acquire(fg, "M")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'M'"), str(m))

    def test_a_batch_cannot_leave_its_connection_in_another_role(self):
        """SET ROLE is refused, but set_config('role', ..., false) still reaches the pooled
        session: the block's last check sets the role back to the session's own. The binary
        before kept the role: later batches of every client ran as it, and with a role that may
        not read fencegate_fence, every batch and fence on acquire on that connection failed
        (503 permission denied) until fencegate restarted. SET LOCAL ROLE still holds within
        its batch."""
        self.pg.sql("CREATE ROLE other")
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "SELECT set_config('role', 'other', false)"},
                                 {"sql": "SELECT current_user"}])
        self.assertEqual((st, body["results"][1]["rows"]), (200, [["other"]]), body)
        st, body = self.sql(fg, [{"sql": "SELECT current_user"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[self.pg.user]]), body)
        m = self.acquire(fg, "M")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'M'"), str(m))
        st, body = self.sql(fg, [{"sql": "SET LOCAL ROLE other"}, {"sql": "SELECT current_user"}])
        self.assertEqual((st, body["results"][1]["rows"]), (200, [["other"]]), body)
        # A role the URL sets is the session's own: batches keep running as it.
        self.pg.sql("GRANT SELECT, INSERT, UPDATE ON fencegate_fence TO other")
        cfg = self.write_file("fg-role.yaml", "stores:\n  - name: pg\n    url: %s?options="
                              "-crole%%3Dother\n    pool_size: 1\n" % self.pg.url)
        fg2 = self.start_fencegate(self.redis, args=["--config", cfg])
        self.acquire(fg2, "R")
        for _ in range(2):
            st, body = self.sql(fg2, [{"sql": "SELECT current_user"}], lock="R")
            self.assertEqual((st, body["results"][0]["rows"]), (200, [["other"]]), body)

    def test_a_batch_that_changes_the_session_user_has_it_to_itself(self):
        """SET SESSION AUTHORIZATION is refused, but set_config() still reaches it when the URL's
        role is a superuser: the connection is made anew after such a batch. The binary before
        kept it, and every later batch and fence on acquire on it ran as that user (here one
        that may not read fencegate_fence: 503 until fencegate restarted)."""
        self.pg.sql("CREATE ROLE other")
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "SELECT set_config('session_authorization', 'other', false)"},
            {"sql": "SELECT session_user"}])
        self.assertEqual((st, body["results"][1]["rows"]), (200, [["other"]]), body)
        st, body = self.sql(fg, [{"sql": "SELECT session_user"}])
        self.assertEqual((st, body.get("results", [{}])[0].get("rows")), (200, [[self.pg.user]]),
                         body)
        m = self.acquire(fg, "M")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'M'"), str(m))

    def test_a_batch_that_changes_how_its_session_reads_text_has_it_to_itself(self):
        """Settings that change how other clients' statements read and show values (TimeZone,
        DateStyle, IntervalStyle, standard_conforming_strings), set at session level through
        set_config(): the connection is made anew after such a batch. The binary before kept
        it, and later batches of every client read '2024-01-01 10:00' as Tokyo time and the
        backslash in 'a\\b' as an escape."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        show = [{"sql": "SELECT CAST('2024-01-01 10:00+00' AS timestamptz) = "
                        "CAST('2024-01-01 10:00' AS timestamptz) AS utc, 'a\\b' AS s, "
                        "CAST(CAST('2024-01-02' AS date) AS text) AS d, "
                        "CAST(CAST('1 day' AS interval) AS text) AS i"}]
        st, body = self.sql(fg, show)
        self.assertEqual(st, 200, body)
        want = body["results"][0]["rows"]
        self.assertEqual(want, [[True, "a\\b", "2024-01-02", "1 day"]])
        for name, value in (("TimeZone", "Asia/Tokyo"), ("standard_conforming_strings", "off"),
                            ("DateStyle", "SQL, DMY"), ("IntervalStyle", "sql_standard")):
            st, body = self.sql(fg, [{"sql": "SELECT set_config($1, $2, false)",
                                      "params": [name, value]}])
            self.assertEqual(st, 200, body)
            st, body = self.sql(fg, show)
            self.assertEqual((st, body.get("results", [{}])[0].get("rows")), (200, want), name)

    def test_a_batch_cannot_leave_its_connection_listening(self):
        """LISTEN is refused, but dynamic SQL still reaches it. A pooled connection left
        listening kept every notification on its channel in libpq for the connection's life:
        20000 NOTIFYs of 7 kB grew the sidecar by about 140 MB while it was idle, and more once
        a batch made libpq parse them. The batch's block now ends with UNLISTEN *."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "DO $$BEGIN EXECUTE 'LISTEN ch'; END$$"}])
        self.assertEqual(st, 200, body)
        st, body = self.sql(fg, [{"sql": "SELECT count(*) AS n FROM pg_listening_channels()"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[0]]), body)
        before = harness.rss_kib(fg.pid)
        for _ in range(4):
            self.pg.sql("SELECT count(pg_notify('ch', i || repeat('x', 7000))) "
                        "FROM generate_series(1, 5000) i")
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one"}])
        self.assertEqual(st, 200, body)
        self.assertLess(harness.rss_kib(fg.pid) - before, 16 * 1024)

    def test_a_row_reset_while_the_batch_waits_for_its_advisory_lock_is_seen(self):
        """The batch waits for the lock's advisory lock, held by another session that deletes
        the fence row meanwhile: once it runs, its check reads the row as committed then, so it
        is refused and the lock given up. (Whether or not its client still waits: evhttp reports
        a client gone only when writing to it or after its 30 s timeout, so a test cannot make
        that happen in time.)"""
        fg = self.fencegate()
        t = self.acquire(fg)
        before = self.rows()
        holder = subprocess.Popen(
            [PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
             str(self.pg.port), "-U", self.pg.user, "-d", "postgres"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=clean_env())
        self.addCleanup(holder.kill)
        holder.stdin.write(b"BEGIN;\nSELECT pg_advisory_xact_lock(1178946883, hashtext('L'));\n"
                           b"DELETE FROM fencegate_fence WHERE lock = 'L';\n")
        holder.stdin.flush()

        def advisory(granted):
            return self.pg.sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                               "granted = %s" % granted)
        wait_until(lambda: advisory("true") == "1", 10, 0.05, "the other session's lock")
        result = {}
        batch = threading.Thread(target=lambda: result.update(
            r=self.sql(fg, [{"sql": "UPDATE accounts SET balance = 0"}], timeout=20)))
        batch.start()
        wait_until(lambda: advisory("false") == "1", 10, 0.05, "the batch waiting")
        holder.stdin.write(b"COMMIT;\n")
        holder.stdin.close()
        self.assertEqual(holder.wait(10), 0)
        batch.join(20)
        st, body = result["r"]
        self.assertEqual((st, body["error"]), (409, "lock_lost"), body)
        self.assertEqual(self.rows(), before)
        _, _, data = http_request(fg.http_port, "GET", "/v1/locks")
        self.assertEqual([(x["name"], x["token"], x["state"]) for x in json.loads(data)["locks"]],
                         [("L", t, "lost")])
        self.assertGreater(self.acquire(fg), t)

    def test_missing_lock_is_refused_before_postgres(self):
        fg = self.fencegate()
        st, body = self.sql(fg, [{"sql": "DELETE FROM accounts"}], lock="never-taken")
        self.assertEqual(st, 409, body)
        self.assertEqual(body["error"], "lock_lost")
        self.assertIn("never-taken", body["message"])
        self.assertEqual(len(self.rows()), 2)
        self.assertEqual(self.pg.sql("SELECT count(*) FROM fencegate_fence WHERE lock = "
                                     "'never-taken'"), "0")
        # Released: refused the same way.
        self.acquire(fg, "R")
        st, _, _ = http_request(fg.http_port, "DELETE", "/v1/locks/R")
        self.assertEqual(st, 200)
        st, body = self.sql(fg, [{"sql": "DELETE FROM accounts"}], lock="R")
        self.assertEqual((st, body["error"]), (409, "lock_lost"))
        self.assertEqual(len(self.rows()), 2)
        # The message names the lock as it was given (the binary before escaped it twice:
        # 'lock a\\"b\\\\c ...' once decoded).
        st, body = self.sql(fg, [{"sql": "SELECT 1"}], lock='a"b\\c\u00e9')
        self.assertEqual((st, body["error"]), (409, "lock_lost"))
        self.assertIn('lock a"b\\c\u00e9 is not held', body["message"])

    def test_a_long_lock_name_is_cut_whole_characters_in_answers(self):
        """Answers name the lock cut to a length; cut inside a character, the answer was not
        UTF-8, so not JSON a client could read (json.loads raised UnicodeDecodeError)."""
        fg = self.fencegate()
        name = "a" + "\u00e9" * 200
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/pg/sql",
                                   {"lock": name, "statements": [{"sql": "SELECT 1"}]})
        body = json.loads(data)
        self.assertEqual((st, body["error"]), (409, "lock_lost"), body)
        self.assertIn("lock a\u00e9\u00e9", body["message"])
        self.acquire(fg, urllib.parse.quote(name))
        self.pg.sql("DELETE FROM fencegate_fence")
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/pg/sql",
                                   {"lock": name, "statements": [{"sql": "SELECT 1"}]})
        body = json.loads(data)
        self.assertEqual((st, body["error"]), (409, "lock_lost"), body)
        self.assertIn("the fence row of lock a\u00e9\u00e9", body["message"])

    def test_token_claim_must_match_the_held_token(self):
        """Clients of one sidecar share its session: a client whose lock was lost and taken
        again by another client says which grant it writes under with Fencing-Token."""
        fg = self.fencegate()
        t = self.acquire(fg, "C")
        body = {"lock": "C", "statements": [{"sql": "DELETE FROM accounts"}]}
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/pg/sql", body,
                                   headers={"Fencing-Token": str(t - 1)})
        self.assertEqual(st, 409, data)
        self.assertEqual(json.loads(data)["error"], "token_mismatch")
        self.assertEqual(len(self.rows()), 2, "a mismatched claim reached the table")
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/pg/sql",
                                   {"lock": "C", "statements": [{"sql": "SELECT 1 AS one"}]},
                                   headers={"Fencing-Token": str(t)})
        self.assertEqual(st, 200, data)
        self.assertEqual(json.loads(data)["token"], t)

    # ---- transactions and results -------------------------------------------------------

    def test_batch_is_atomic(self):
        fg = self.fencegate()
        schema = self.schema()
        t = self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "UPDATE accounts SET balance = balance - 5 WHERE id = 1"},
            {"sql": "INSERT INTO accounts VALUES (1, 'dup', 0)"},
            {"sql": "UPDATE accounts SET balance = balance + 5 WHERE id = 2"}])
        self.assertEqual(st, 422, body)
        self.assertEqual(body["error"], "sql_error")
        self.assertEqual(body["sqlstate"], "23505")
        self.assertEqual(body["statement"], 1)
        self.assertIn("duplicate key", body["message"])
        self.assertEqual(self.rows(), ["1|alice|10", "2|bob|20"], "the first UPDATE survived")
        # The same transfer without the bad statement commits as a whole.
        st, body = self.sql(fg, [
            {"sql": "UPDATE accounts SET balance = balance - 5 WHERE id = 1"},
            {"sql": "UPDATE accounts SET balance = balance + 5 WHERE id = 2"}])
        self.assertEqual(st, 200, body)
        self.assertEqual([r["rows_affected"] for r in body["results"]], [1, 1])
        self.assertEqual(self.rows(), ["1|alice|5", "2|bob|25"])
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"),
                         str(t))
        self.assertEqual(self.schema(), schema)
        self.assertEqual(self.pg.sql("SELECT string_agg(table_name, ',' ORDER BY table_name) "
                                     "FROM information_schema.tables WHERE table_schema = "
                                     "'public'"), "accounts,fencegate_fence")

    def test_transaction_control_is_refused(self):
        fg = self.fencegate()
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "DELETE FROM accounts"}, {"sql": "COMMIT"},
                                 {"sql": "SELECT 1/0"}])
        self.assertEqual(st, 400, body)
        self.assertIn("statements[1].sql: COMMIT is not allowed", body["message"])
        self.assertEqual(len(self.rows()), 2)

    # ---- the batch cannot leave fencegate's transaction --------------------------------

    def test_commit_bypass_forms_commit_nothing(self):
        """Forms that slipped past the old keyword filter: each is refused (400) or fails
        inside fencegate's transaction block (422), and nothing of the batch commits."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        self.pg.sql("CREATE PROCEDURE committer() LANGUAGE plpgsql AS $$BEGIN "
                    "UPDATE accounts SET owner = 'proc' WHERE id = 2; COMMIT; END$$")
        for stmt, want in ((";COMMIT", 400), ("-- x\rCOMMIT", 400), ("/* a /* b */ */;commit", 400),
                           ("DO $$BEGIN COMMIT; END$$", 422), ("CALL committer()", 422)):
            st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'changed' WHERE id = 1"},
                                     {"sql": stmt}, {"sql": "SELECT 1/0"}])
            self.assertEqual(st, want, (stmt, body))
            if want == 400:
                self.assertIn("statements[1].sql", body["message"])
            else:
                self.assertEqual((body["error"], body["statement"], body["sqlstate"]),
                                 ("sql_error", 1, "2D000"), (stmt, body))
            self.assertEqual(self.rows(), ["1|alice|10", "2|bob|20"], stmt)
        # The connection is clean afterwards.
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'ok' WHERE id = 1"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows()[0], "1|ok|10")

    def _stale_race(self, fg, token, first):
        out = {}

        def run():
            out["r"] = self.sql(fg, first + [
                {"sql": "SELECT pg_sleep(1.5)"},
                {"sql": "UPDATE accounts SET owner = 'after' WHERE id = 1"}], timeout=15)
        th = threading.Thread(target=run)
        th.start()
        time.sleep(0.5)
        # A newer holder raises the mark meanwhile (as its fence on acquire would).
        self.pg.sql("UPDATE fencegate_fence SET token = %d WHERE lock = 'L'" % (token + 100))
        th.join(15)
        return out["r"]

    def test_stale_batch_cannot_commit_its_tail(self):
        """The reviewer's race: a batch that ends fencegate's transaction early, then sleeps
        while a newer holder raises the mark, then writes. The write must never commit."""
        fg = self.fencegate("    pool_size: 2\n")
        t = self.acquire(fg)
        st, body = self._stale_race(fg, t, [{"sql": ";COMMIT"}])
        self.assertEqual(st, 400, body)
        self.assertEqual(self.rows()[0], "1|alice|10")
        # A COMMIT from inside a DO block reaches PostgreSQL, which refuses it inside
        # fencegate's block. (Reset the mark the first round raised.)
        self.pg.sql("UPDATE fencegate_fence SET token = %d WHERE lock = 'L'" % t)
        st, body = self._stale_race(fg, t, [{"sql": "DO $$BEGIN COMMIT; END$$"}])
        self.assertEqual((st, body["error"], body["statement"]), (422, "sql_error", 0), body)
        self.assertEqual(self.rows()[0], "1|alice|10", "the stale batch's UPDATE committed")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"),
                         str(t + 100))

    def test_multiple_statements_in_one_string_are_refused(self):
        fg = self.fencegate()
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'x' WHERE id = 1; "
                                         "COMMIT; DELETE FROM accounts"}])
        self.assertEqual((st, body["error"], body["sqlstate"], body["statement"]),
                         (422, "sql_error", "42601", 0), body)
        self.assertIn("cannot insert multiple commands", body["message"])
        self.assertEqual(self.rows(), ["1|alice|10", "2|bob|20"])
        # A trailing ';' is one statement.
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one;"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[1]]), body)

    def test_session_state_statements_are_refused(self):
        fg = self.fencegate()
        self.acquire(fg)
        cases = [("COPY accounts TO STDOUT", "COPY is not allowed"),
                 ("COPY accounts FROM STDIN", "COPY is not allowed"),
                 ("LISTEN ch", "LISTEN"), ("UNLISTEN *", "LISTEN"), ("DISCARD ALL", "DISCARD"),
                 ("DEALLOCATE ALL", "DEALLOCATE"), ("RESET ALL", "RESET is not allowed"),
                 ("SET ROLE postgres", "SET ROLE"),
                 ("SET SESSION AUTHORIZATION postgres", "SET ROLE"),
                 ("SET search_path = s, public", "session-level SET"),
                 ("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "session-level SET"),
                 ("-- only a comment", "empty statement"), (";", "empty statement"),
                 ("UPDATE fencegate_fence SET token = 0", "fencegate_fence"),
                 ("CREATE TEMP TABLE FenceGate_Fence (lock text, token bigint)",
                  "fencegate_fence")]
        for sql, why in cases:
            st, body = self.sql(fg, [{"sql": "SELECT 1"}, {"sql": sql}])
            self.assertEqual((st, body["error"]), (400, "bad_request"), sql)
            self.assertIn("statements[1].sql", body["message"], sql)
            self.assertIn(why, body["message"], sql)
        st, body = self.sql(fg, [
            {"sql": "SET LOCAL statement_timeout = 1000"},
            {"sql": "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"},
            {"sql": "SET CONSTRAINTS ALL IMMEDIATE"},
            {"sql": "SELECT current_setting('statement_timeout') AS t"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["results"][3]["rows"], [["1s"]])

    def test_copy_leaves_the_sidecar_responsive(self):
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        t0 = time.monotonic()
        st, body = self.sql(fg, [{"sql": "COPY accounts TO STDOUT"}], timeout=5)
        self.assertEqual(st, 400, body)
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(fg.http("/healthz")[0], 200)
        st, body = self.sql(fg, [{"sql": "SELECT 2 AS two"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[2]]), body)

    def test_search_path_and_temp_table_cannot_redirect_the_fence(self):
        """A batch can still change its pooled session through functions (set_config, dynamic
        SQL), which no keyword filter sees. The fence names its table schema-qualified, so a
        decoy table earlier in search_path or a temporary one never stands in for it."""
        fg = self.fencegate("    pool_size: 1\n")
        t = self.acquire(fg)
        self.pg.sql("CREATE SCHEMA s; CREATE TABLE s.fencegate_fence "
                    "(lock text PRIMARY KEY, token bigint NOT NULL)")
        st, body = self.sql(fg, [
            {"sql": "SELECT set_config('search_path', 's, public', false)"},
            {"sql": "DO $$BEGIN EXECUTE 'CREATE TEMP TABLE fencegate' || '_fence (lock text "
                    "PRIMARY KEY, token bigint NOT NULL)'; END$$"}])
        self.assertEqual(st, 200, body)
        st, body = self.sql(fg, [{"sql": "SELECT current_setting('search_path') AS p"}])
        self.assertEqual(body["results"][0]["rows"], [["s, public"]], "the session kept it")
        self.pg.sql("UPDATE public.fencegate_fence SET token = %d WHERE lock = 'L'" % (t + 100))
        st, body = self.sql(fg, [{"sql": "UPDATE public.accounts SET owner = 'stale' "
                                         "WHERE id = 1"}])
        self.assertEqual((st, body["error"], body["mark"]), (409, "stale_token", t + 100), body)
        self.assertEqual(self.rows()[0], "1|alice|10")
        self.assertEqual(self.pg.sql("SELECT count(*) FROM s.fencegate_fence"), "0")

    def test_sidecars_meet_in_the_fence_table_that_exists(self):
        """The table is looked up on the role's search_path before it is created: a schema
        named after the role, created once the table exists in public ("$user" comes first on
        the default search_path), does not give later connections a table of their own, in
        which a stale holder's old token would still match."""
        a = self.fencegate()
        t = self.acquire(a)
        self.pg.sql("CREATE SCHEMA %s" % self.pg.user)
        b = self.fencegate()
        m = self.acquire(b, "M")
        self.assertEqual(self.pg.sql("SELECT to_regclass('%s.fencegate_fence') IS NULL"
                                     % self.pg.user), "t")
        self.assertEqual(self.pg.sql("SELECT lock, token FROM public.fencegate_fence "
                                     "ORDER BY lock").splitlines(), ["L|%d" % t, "M|%d" % m])

    def test_a_role_that_may_not_create_tables_uses_a_table_made_for_it(self):
        """The role in the URL has only what the application needs: no CREATE on public
        (PostgreSQL 15's default for roles that do not own it), DML on the table fencegate_fence
        an administrator made for it. The binary before ran CREATE TABLE IF NOT EXISTS on every
        connection, which PostgreSQL refuses without CREATE even when the table exists: the
        store never came up (503 "permission denied for schema public")."""
        self.pg.sql("CREATE TABLE fencegate_fence (lock text PRIMARY KEY, token bigint NOT NULL)")
        self.pg.sql("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        self.pg.sql("CREATE ROLE app LOGIN")
        self.pg.sql("GRANT SELECT, INSERT, UPDATE ON fencegate_fence, accounts TO app")
        url = self.pg.url.replace(self.pg.user + "@", "app@")
        cfg = self.write_file("fg-app.yaml", "stores:\n  - name: pg\n    url: %s\n" % url)
        fg = self.start_fencegate(self.redis, args=["--config", cfg])
        t = self.acquire(fg)
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'L'"), str(t))
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = current_user WHERE id = 1"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows()[0], "1|app|10")

    def test_session_defaults_cannot_break_batches_or_fences(self):
        """A session made READ ONLY (or SERIALIZABLE) by default: fencegate's BEGIN says READ
        WRITE, READ COMMITTED, so batches and fence on acquire still work."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "SELECT set_config('default_transaction_read_only', 'on', false)"},
            {"sql": "SELECT set_config('default_transaction_isolation', 'serializable', false)"},
            {"sql": "SELECT set_config('synchronous_commit', 'off', false)"}])
        self.assertEqual(st, 200, body)
        st, body = self.sql(fg, [
            {"sql": "UPDATE accounts SET owner = 'rw' WHERE id = 1"},
            {"sql": "SELECT current_setting('transaction_isolation') AS i, "
                    "current_setting('synchronous_commit') AS s"}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["results"][1]["rows"], [["read committed", "on"]])
        self.assertEqual(self.rows()[0], "1|rw|10")
        m = self.acquire(fg, "M")
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'M'"), str(m))

    def test_result_cap_commits_but_withholds_the_results(self):
        """COMMIT travels in the batch's one round trip, so a batch whose results pass the cap is
        committed; the answer says so and carries no results."""
        fg = self.fencegate()
        self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "UPDATE accounts SET owner = 'big' WHERE id = 1"},
            {"sql": "SELECT repeat('x', 1000) FROM generate_series(1, 20000)"}], timeout=30)
        self.assertEqual((st, body["error"]), (413, "result_too_large"), body)
        self.assertIs(body["committed"], True, body)
        self.assertNotIn("results", body)
        self.assertEqual(self.rows()[0], "1|big|10")
        st, body = self.sql(fg, [{"sql": "SELECT repeat('x', 1000) FROM generate_series(1, 10000)"}],
                            timeout=30)
        self.assertEqual(st, 200)
        self.assertEqual(len(body["results"][0]["rows"]), 10000)

    def test_connection_lost_before_commit_commits_nothing(self):
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        out = {}

        def run():
            out["r"] = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'lost' WHERE id = 1"},
                                     {"sql": "SELECT pg_sleep(3)"}], timeout=15)
        th = threading.Thread(target=run)
        th.start()
        time.sleep(0.7)
        self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name = 'fencegate' AND query LIKE '%pg_sleep%'")
        th.join(15)
        st, body = out["r"]
        self.assertEqual((st, body["error"]), (503, "store_unavailable"), body)
        self.assertIn("nothing was committed", body["message"])
        self.assertEqual(self.rows()[0], "1|alice|10")

    def test_a_batch_sent_as_its_idle_connection_is_terminated_commits_nothing_and_says_so(self):
        """pg_terminate_backend() of an idle pooled connection: PostgreSQL sends a FATAL error,
        cleans up, and only then closes the socket. A batch sent in between is answered
        store_unavailable (nothing was committed), never outcome_unknown: the error read before
        the close is its first statement's answer. The binary before answered outcome_unknown.
        Temporary tables the backend drops on its way out hold the socket open long enough to
        send the batch in between every time."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "DO $$BEGIN FOR i IN 1..2000 LOOP EXECUTE "
                                         "format('CREATE TEMP TABLE t%s (x int)', i); END LOOP; "
                                         "END$$"}], timeout=30)
        self.assertEqual(st, 200, body)
        self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                    "application_name = 'fencegate'")
        time.sleep(0.05)
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'x' WHERE id = 1"}])
        self.assertEqual((st, body.get("error")), (503, "store_unavailable"), body)
        self.assertIn("nothing was committed", body["message"])
        self.assertEqual(self.rows()[0], "1|alice|10")
        wait_until(lambda: self.sql(fg, [{"sql": "SELECT 1"}])[0] == 200, 10,
                   what="the pool's connection back")

    def test_a_batch_whose_client_left_while_queued_is_not_run(self):
        """A client that gives up while its batch waits for a connection (its own timeout) may
        send it again: the abandoned batch must not run as well. It is dropped when its turn
        comes; the binary before ran and committed it."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        out = {}

        def run():
            out["slow"] = self.sql(fg, [{"sql": "SELECT pg_sleep(1)"}], timeout=15)
        slow = threading.Thread(target=run)
        slow.start()
        time.sleep(0.3)
        body = json.dumps({"lock": "L", "statements": [
            {"sql": "UPDATE accounts SET balance = balance + 1 WHERE id = 1"}]}).encode()
        s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
        s.sendall(b"POST /v1/stores/pg/sql HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n" % len(body) + body)
        time.sleep(0.2)
        s.close()
        slow.join(15)
        self.assertEqual(out["slow"][0], 200, out)
        time.sleep(0.3)
        self.assertEqual(self.rows()[0], "1|alice|10")
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[1]]), body)

    def test_shutdown_with_batches_running_and_queued(self):
        """SIGTERM while a batch runs and another waits for a connection, their clients still
        connected: the sidecar exits 0 without answering on requests evhttp freed (the stop
        checks for sanitizer reports), and the batch that had not committed is rolled back."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        socks = []
        for statements in ([{"sql": "UPDATE accounts SET owner = 'stopped' WHERE id = 1"},
                            {"sql": "SELECT pg_sleep(5)"}],
                           [{"sql": "UPDATE accounts SET owner = 'queued' WHERE id = 2"}]):
            body = json.dumps({"lock": "L", "statements": statements}).encode()
            s = socket.create_connection(("127.0.0.1", fg.http_port), timeout=10)
            self.addCleanup(s.close)
            s.sendall(b"POST /v1/stores/pg/sql HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                      b"\r\n" % len(body) + body)
            socks.append(s)
            time.sleep(0.3)
        fg.stop(expect_rc=0)
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            self.assertNotIn(bad, fg.stderr_text)
        self.assertEqual(self.rows()[:2], ["1|alice|10", "2|bob|20"])

    def test_a_lock_released_while_the_batch_waits_for_a_connection_writes_nothing(self):
        """The lock is checked again when a queued batch gets its connection: released (or lost)
        meanwhile, the batch is answered lock_lost and nothing is sent, as for a batch that
        arrives after the release. The binary before ran and committed it."""
        fg = self.fencegate("    pool_size: 1\n")
        self.acquire(fg)
        out = {}

        def run(name, statements):
            out[name] = self.sql(fg, statements, timeout=15)
        slow = threading.Thread(target=run, args=("slow", [{"sql": "SELECT pg_sleep(1)"}]))
        slow.start()
        time.sleep(0.3)
        queued = threading.Thread(target=run, args=(
            "queued", [{"sql": "UPDATE accounts SET owner = 'after release' WHERE id = 1"}]))
        queued.start()
        time.sleep(0.3)
        st, _, data = http_request(fg.http_port, "DELETE", "/v1/locks/L")
        self.assertEqual(st, 200, data)
        slow.join(15)
        queued.join(15)
        self.assertEqual(out["slow"][0], 200, out)
        st, body = out["queued"]
        self.assertEqual((st, body.get("error")), (409, "lock_lost"), body)
        self.assertIn("nothing was sent", body["message"])
        self.assertEqual(self.rows()[0], "1|alice|10")

    def test_fence_jobs_are_not_refused_by_a_full_queue(self):
        fg = self.fencegate("    pool_size: 1\n    queue_max: 1\n")
        self.acquire(fg)
        results = {}

        def run(name, sql):
            results[name] = self.sql(fg, [{"sql": sql}], timeout=15)
        slow = threading.Thread(target=run, args=("slow", "SELECT pg_sleep(1)"))
        slow.start()
        time.sleep(0.3)
        queued = threading.Thread(target=run, args=("queued", "SELECT 2 AS two"))
        queued.start()
        time.sleep(0.3)
        st, body = self.sql(fg, [{"sql": "SELECT 3"}])
        self.assertEqual((st, body["error"]), (503, "pool_exhausted"), "the SQL queue is full")
        m = self.acquire(fg, "M")  # its fence job waits in its own reserve
        slow.join(15)
        queued.join(15)
        self.assertEqual(self.pg.sql("SELECT token FROM fencegate_fence WHERE lock = 'M'"), str(m))
        self.assertEqual((results["slow"][0], results["queued"][0]), (200, 200), results)

    def test_results_columns_and_types(self):
        fg = self.fencegate()
        t = self.acquire(fg)
        st, body = self.sql(fg, [
            {"sql": "SELECT id, owner, balance, id > 1 AS big, NULL::text AS nothing, "
                    "0.5::float8 AS half, '{\"a\": 1}'::jsonb AS doc FROM accounts ORDER BY id"},
            {"sql": "UPDATE accounts SET owner = upper(owner)"},
            {"sql": "CREATE TEMP TABLE scratch (x int)"}])
        self.assertEqual(st, 200, body)
        self.assertEqual((body["lock"], body["token"]), ("L", t))
        sel, upd, ddl = body["results"]
        self.assertEqual(sel["command"], "SELECT")
        self.assertEqual(sel["rows_affected"], 2)
        self.assertEqual(sel["columns"], ["id", "owner", "balance", "big", "nothing", "half",
                                          "doc"])
        self.assertEqual(sel["types"], ["int4", "text", "numeric", "bool", "text", "float8",
                                        "jsonb"])
        self.assertEqual(sel["rows"], [[1, "alice", 10, False, None, 0.5, '{"a": 1}'],
                                       [2, "bob", 20, True, None, 0.5, '{"a": 1}']])
        self.assertEqual((upd["command"], upd["rows_affected"], upd["rows"]), ("UPDATE", 2, []))
        self.assertEqual((ddl["command"], ddl["rows_affected"]), ("CREATE TABLE", None))

    def test_params_mapping(self):
        fg = self.fencegate()
        self.acquire(fg)
        st, body = self.sql(fg, [{
            "sql": "SELECT $1::text, $2::int, $3::numeric, $4::bool, $5::text IS NULL, "
                   "$6::jsonb ->> 'k', $7::jsonb -> 1, $8::text",
            "params": ["it's \"quoted\" \u00e9", 42, 1.25, True, None, {"k": "v"}, [1, 2],
                       False]}])
        self.assertEqual(st, 200, body)
        self.assertEqual(body["results"][0]["rows"],
                         [["it's \"quoted\" \u00e9", 42, 1.25, True, True, "v", "2", "false"]])
        # Parameters are bound, never spliced into the SQL.
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = $1 WHERE id = $2",
                                  "params": ["x'; DELETE FROM accounts; --", 1]}])
        self.assertEqual(st, 200, body)
        self.assertEqual(self.rows()[0], "1|x'; DELETE FROM accounts; --|10")
        st, body = self.sql(fg, [{"sql": "SELECT $1", "params": ["a\u0000b"]}])
        self.assertEqual(st, 400, body)
        self.assertIn("statements[0].params[0]", body["message"])

    # ---- bad requests -------------------------------------------------------------------

    def test_bad_requests_name_the_problem(self):
        fg = self.fencegate()
        self.acquire(fg)
        cases = [
            (b'{"lock":"L","statements":[', 400, "not valid JSON"),
            (b'{"lock":"L"}', 400, 'missing "statements"'),
            (b'{"lock":"L","statements":[{"sql":"SELECT 1","parms":[]}]}', 400,
             'unknown key "parms"'),
            (b'{"lock":"L","statements":[{"sql":7}]}', 400, "statements[0].sql: expected a string"),
            (b'', 400, "empty body"),
        ]
        for raw, want_st, want_msg in cases:
            st, _, data = http_request(fg.http_port, "POST", "/v1/stores/pg/sql", raw)
            body = json.loads(data)
            self.assertEqual((st, body["error"]), (want_st, "bad_request"), raw)
            self.assertIn(want_msg, body["message"], raw)
        st, _, data = http_request(fg.http_port, "POST", "/v1/stores/nope/sql",
                                   {"lock": "L", "statements": [{"sql": "SELECT 1"}]})
        self.assertEqual((st, json.loads(data)["error"]), (404, "unknown_store"))
        st, _, data = http_request(fg.http_port, "GET", "/v1/stores/pg/sql")
        self.assertEqual(st, 405, data)
        self.assertEqual(len(self.rows()), 2)
        # The sidecar carries on.
        st, body = self.sql(fg, [{"sql": "SELECT 1 AS one"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [[1]]))

    # ---- availability -------------------------------------------------------------------

    def test_postgres_restart_gives_503_then_recovers(self):
        fg = self.fencegate()
        self.acquire(fg)
        self.assertEqual(fg.http("/readyz")[0], 200)
        self.pg.stop()
        errors = []
        for i in range(5):
            st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = %d" % i}])
            errors.append((st, body.get("error")))
        self.assertTrue(all(e == (503, "store_unavailable") for e in errors), errors)
        wait_until(lambda: fg.http("/readyz")[0] == 503, 5, what="/readyz 503 while down")
        st, body = json.loads(fg.http("/readyz")[1]), None
        self.assertIn("postgresql store 'pg' is unreachable", st["message"])
        self.pg.start()
        wait_until(lambda: self.sql(fg, [{"sql": "UPDATE accounts SET balance = 99 WHERE id = 1"}])
                   [0] == 200, 15, what="SQL through fencegate after postgres came back")
        wait_until(lambda: fg.http("/readyz")[0] == 200, 10, what="/readyz 200 again")
        self.assertEqual(self.rows()[0], "1|alice|99")

    def test_pool_exhausted_queues_then_refuses(self):
        fg = self.fencegate("    pool_size: 1\n    queue_max: 1\n")
        self.acquire(fg)
        results = {}

        def run(name, sql):
            results[name] = self.sql(fg, [{"sql": sql}], timeout=15)

        slow = threading.Thread(target=run, args=("slow", "SELECT pg_sleep(1.5)"))
        slow.start()
        time.sleep(0.3)
        queued = threading.Thread(target=run, args=("queued", "SELECT 2 AS two"))
        queued.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        st, body = self.sql(fg, [{"sql": "SELECT 3"}])
        self.assertLess(time.monotonic() - t0, 1.0, "the refusal waited")
        self.assertEqual((st, body["error"]), (503, "pool_exhausted"), body)
        slow.join(15)
        queued.join(15)
        self.assertEqual(results["slow"][0], 200, results)
        self.assertEqual(results["queued"], (200, results["queued"][1]))
        self.assertEqual(results["queued"][1]["results"][0]["rows"], [[2]])
        self.assertGreaterEqual(fg.metrics()["fencegate_pg_pool_exhausted_total"], 1)

    def test_a_batch_whose_client_left_gives_its_queue_place_up(self):
        """A client sends a batch while the one connection is busy, then closes its socket: the
        batch leaves the queue at once (it held the only place of queue_max 1 until its turn, so
        the next batch was refused pool_exhausted), and it never runs."""
        fg = self.fencegate("    pool_size: 1\n    queue_max: 1\n")
        self.acquire(fg)
        slow = threading.Thread(target=self.sql, args=(fg, [{"sql": "SELECT pg_sleep(1.5)"}]),
                                kwargs={"timeout": 15})
        slow.start()
        time.sleep(0.3)
        body = json.dumps({"lock": "L", "statements": [
            {"sql": "UPDATE accounts SET owner = 'gone' WHERE id = 1"}]}).encode()
        with socket.create_connection(("127.0.0.1", fg.http_port)) as left:
            left.sendall(b"POST /v1/stores/pg/sql HTTP/1.1\r\nHost: fg\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            time.sleep(0.3)  # queued behind the sleeping batch
        time.sleep(0.2)
        st, body = self.sql(fg, [{"sql": "SELECT 3 AS three"}], timeout=15)
        self.assertEqual((st, body.get("results", [{}])[0].get("rows")), (200, [[3]]), body)
        slow.join(15)
        self.assertEqual(self.rows()[0], "1|alice|10", "the abandoned batch ran")

    def test_statement_timeout(self):
        fg = self.fencegate("    timeout_ms: 500\n")
        self.acquire(fg)
        t0 = time.monotonic()
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'slow' WHERE id = 1"},
                                 {"sql": "SELECT pg_sleep(5)"}])
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertEqual((st, body["error"], body["sqlstate"], body["statement"]),
                         (422, "sql_error", "57014", 1), body)
        self.assertEqual(self.rows()[0], "1|alice|10")
        st, body = self.sql(fg, [{"sql": "SELECT 1"}])
        self.assertEqual(st, 200, body)

    def test_a_batch_of_statements_each_within_the_timeout_runs_to_its_end(self):
        """statement_timeout bounds each statement. A batch whose statements each take less, but
        together more than timeout_ms + 2 s, commits and is answered; the binary before dropped
        the connection at timeout_ms + 2 s and answered outcome_unknown (while PostgreSQL, which
        had the whole pipeline, went on to commit it)."""
        fg = self.fencegate("    timeout_ms: 1000\n")
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET owner = 'long' WHERE id = 1"}] +
                            [{"sql": "SELECT pg_sleep(0.8)"}] * 4, timeout=20)
        self.assertEqual(st, 200, body)
        self.assertEqual(len(body["results"]), 5)
        self.assertEqual(self.rows()[0], "1|long|10")
        # A statement past the timeout is still cut off by PostgreSQL.
        st, body = self.sql(fg, [{"sql": "SELECT pg_sleep(0.5)"}, {"sql": "SELECT pg_sleep(3)"}])
        self.assertEqual((st, body.get("sqlstate"), body.get("statement")), (422, "57014", 1), body)

    def test_bad_store_config_is_refused(self):
        cfg = self.write_file("bad.yaml", "stores:\n  - name: pg\n    url: %s\n    pool_size: 0\n"
                              % self.pg.url)
        from harness import run_fencegate
        rc, _, err = run_fencegate(["--config", cfg, "--upstream", self.redis.url])
        self.assertEqual(rc, 2, err)
        self.assertIn("pool_size", err)

    def test_every_address_of_the_host_name_is_tried(self):
        """The store's host name has two addresses, and PostgreSQL listens on the second only:
        libpq gets both (the name once per address) and connects to the one that answers, as it
        did when it looked the name up itself."""
        dns = self.slow_dns()
        cfg = self.write_file("fg-two.yaml", "stores:\n  - name: pg\n    url: postgresql://%s@"
                              "two.pg.fgtest:%d/postgres\n" % (self.pg.user, self.pg.port))
        fg = self.start_fencegate(self.redis, args=["--config", cfg], env=dns.env())
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "SELECT host(inet_server_addr())"}])
        self.assertEqual((st, body.get("results", [{}])[0].get("rows")), (200, [["127.0.0.1"]]),
                         body)

    def test_a_stalled_lookup_of_the_store_host_leaves_the_sidecar_answering(self):
        """The store's host name is looked up off the event loop: while the DNS server does not
        answer, batches for that store are refused at once saying why, everything else (the
        sidecar's endpoints, a store given by address) stays prompt, and the store is back
        without a restart. libpq still gets the name as host: .pgpass is keyed by it."""
        dns = self.slow_dns()
        self.pg.sql("CREATE ROLE fg LOGIN SUPERUSER PASSWORD 'pw'")
        self.pg.sql("CREATE DATABASE other")
        hba = os.path.join(self.pg.data, "pg_hba.conf")
        with open(hba) as f:
            rules = f.read()
        with open(hba, "w") as f:  # fg must give its password over TCP
            f.write("host all fg 127.0.0.1/32 scram-sha-256\n" + rules)
        self.pg.sql("SELECT pg_reload_conf()")
        pgpass = self.write_file("pgpass", "pg.fgtest:%d:*:fg:pw\n" % self.pg.port)
        os.chmod(pgpass, 0o600)
        cfg = self.write_file(
            "fg-dns.yaml",
            "stores:\n  - name: pg\n    url: postgresql://fg@pg.fgtest:%d/postgres\n"
            "    pool_size: 2\n  - name: num\n    url: postgresql://%s@127.0.0.1:%d/other\n"
            % (self.pg.port, self.pg.user, self.pg.port))
        fg = self.start_fencegate(self.redis, args=["--config", cfg],
                                  env=dict(dns.env(), PGPASSFILE=pgpass))
        self.acquire(fg)
        st, body = self.sql(fg, [{"sql": "SELECT current_user"}])
        self.assertEqual((st, body["results"][0]["rows"]), (200, [["fg"]]), body)
        # The name service now takes 8 s to answer, and the pool's connections end: each new one
        # looks the name up again.
        dns.stall("pg.fgtest", 8000)
        self.pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'fg'")
        poller = PromptPoller(  # the other store too
            fg, lambda: self.sql(fg, [{"sql": "SELECT 1"}], store="num", timeout=5)[0] == 200)
        poller.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 1"}], timeout=15)
        self.assertEqual((st, body["error"]), (503, "store_unavailable"), body)
        self.assertLess(time.monotonic() - t0, 1.0)
        poller.join()
        self.assertLess(poller.worst, 1.0, "a request waited on the stalled lookup")
        # Each connection gives the lookup its 3 s connect deadline, and says so.
        wait_until(lambda: b"resolving 'pg.fgtest' timed out" in fg.http("/readyz")[1], 5,
                   what="/readyz naming the lookup")
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 1"}])
        self.assertEqual((st, body["error"]), (503, "store_unavailable"), body)
        self.assertIn("resolving 'pg.fgtest' timed out", body["message"])
        self.assertEqual(self.rows()[0], "1|alice|10", "nothing was committed")
        # The name service answers again: the store is back without a restart.
        dns.stall("pg.fgtest", 0)
        wait_until(lambda: self.sql(fg, [{"sql": "SELECT current_user"}])[0] == 200, 20,
                   what="the store back")
        st, body = self.sql(fg, [{"sql": "UPDATE accounts SET balance = 2 WHERE id = 1"},
                                 {"sql": "SELECT current_user"}])
        self.assertEqual((st, body["results"][1]["rows"]), (200, [["fg"]]), body)
        self.assertEqual(self.rows()[0], "1|alice|2")


class StoreUrlsNotShownTest(FgTestCase):
    """HTTP answers that name a store by its URL show it with its passwords masked: anyone who
    can reach the endpoint may read them, no lock needed. Neither store needs to be up."""

    def test_store_passwords_are_masked_in_answers(self):
        redis = self.start_redis()
        cfg = self.write_file("urls.yaml", (
            "stores:\n  - name: pg\n    url: postgresql://fencegate:s3cretpw@127.0.0.1:%d/"
            "postgres?sslmode=disable&password=otherpw\n"
            "  - name: redis\n    url: redis://:redispw@127.0.0.1:%d\n")
            % (free_port(), free_port()))
        fg = self.start_fencegate(redis, args=["--config", cfg], readyz=False)
        for path, shown in (
                ("/v1/stores/pg/http/x", "postgresql://fencegate:***@127.0.0.1:"),
                ("/v1/stores/redis/http/x", "redis://:***@127.0.0.1:"),
                ("/v1/stores/redis/sql", "redis://:***@127.0.0.1:")):
            st, _, data = http_request(fg.http_port, "GET", path)
            doc = json.loads(data)
            self.assertEqual((st, doc["error"]), (404, "not_found"), doc)
            self.assertIn(shown, doc["message"])
            for secret in ("s3cretpw", "otherpw", "redispw"):
                self.assertNotIn(secret, data.decode(), path)
        self.assertIn("/postgres?sslmode=disable&password=***) has no endpoint",
                      json.loads(http_request(fg.http_port, "GET", "/v1/stores/pg/x")[2])
                      ["message"])


class LibpqMissingTest(FgTestCase):
    """A PostgreSQL store without a usable libpq.so.5 is a start-up error (exit 2) naming the
    store and the library, before anything connects or listens."""

    def test_missing_or_wrong_libpq_is_a_startup_error(self):
        cfg = self.write_file("pg.yaml", "stores:\n  - name: orders\n"
                              "    url: postgresql://app@127.0.0.1:%d/app\n" % free_port())
        nowhere = "redis://127.0.0.1:%d" % free_port()
        # Found first through LD_LIBRARY_PATH: a file that is no library, then a real library
        # without libpq's functions (libyaml, which fencegate links).
        ldd = subprocess.run(["ldd", FENCEGATE_BIN], capture_output=True, text=True).stdout
        yaml = [w for w in ldd.split() if "/libyaml" in w]
        self.assertTrue(yaml, ldd)
        for src, want in ((None, "PostgreSQL stores need libpq.so.5 (Debian package libpq5): "),
                          (yaml[0], "libpq.so.5 lacks PQclear")):
            d = tempfile.mkdtemp(prefix="fg-libpq-")
            self.addCleanup(shutil.rmtree, d, True)
            if src:
                shutil.copy(src, os.path.join(d, "libpq.so.5"))
            else:
                with open(os.path.join(d, "libpq.so.5"), "w") as f:
                    f.write("not a library\n")
            rc, _, err = run_fencegate(["--config", cfg, "--upstream", nowhere,
                                        "--backend", nowhere,
                                        "--resp", "127.0.0.1:%d" % free_port(),
                                        "--http", "127.0.0.1:%d" % free_port()],
                                       env={"LD_LIBRARY_PATH": d})
            self.assertEqual(rc, 2, err)
            self.assertIn("fencegate: store 'orders': " + want, err)
            self.assertNotIn(" info ", err, "it started before failing")

if __name__ == "__main__":
    unittest.main()
