"""The safety suite, short form (CTest label `safety`): one test per nemesis and one mixed, each
a workload.py run of FG_SAFETY_SECONDS (default 14; mixed 1.5 times that) against one Redis (AOF,
fsync always) and two sidecars. Every test fails on any violation found by workload.check() and
on a vacuous run: fewer than 3 faults, no write refused (STALE or LOCKLOST), no fault of the
test's own kind that bit, hardly any writes acknowledged on L or on the churn locks or bank
transfers, no
acknowledged write after the last fault (no recovery), or no
pipelined run that went as a fenced transaction (the sidecars' /metrics)."""

import os
import sys
import unittest

import workload
from workload import NetNS, Workload, schedule_for, scorecard

SECONDS = float(os.environ.get("FG_SAFETY_SECONDS", "14"))
_NETNS_WHY = []


def netns_unavailable():
    """Why a network namespace cannot be used here (None when it can); asked once."""
    if not _NETNS_WHY:
        _NETNS_WHY.append(NetNS.reason_unavailable())
    return _NETNS_WHY[0]


class Safety(unittest.TestCase):

    def run_nemesis(self, name, bite_kinds, seconds=SECONDS, netns=False, refused_on="L", **kw):
        if netns and netns_unavailable():
            sys.stderr.write("no network namespace (%s): the partition is a Redis SIGSTOP\n"
                             % netns_unavailable())
            netns = False
        out = []

        def log(s):
            out.append(s)
            sys.stderr.write(s + "\n")
            sys.stderr.flush()

        with Workload(netns=netns, log=log, hard_seconds=seconds + 200, **kw) as wl:
            res = wl.run(schedule_for(name, wl.rng, netns), seconds=seconds)
            card = scorecard(res)
            sys.stderr.write(card + "\n")
            if res["violations"]:
                for s in wl.sidecars:
                    sys.stderr.write(s.log_tail(40) + "\n")
        self.assertEqual(res["violations"], [], "violations found:\n" + card)
        self.assertEqual(res["stuck_workers"], [], "workers did not stop")
        # Non-vacuity: the faults happened, they bit, the fence refused something, and the
        # workload made progress after the last fault.
        self.assertGreaterEqual(res["faults"], 3, "too few faults injected:\n" + card)
        refused = res["refused"]
        if refused_on == "any":  # L, the churn locks' writes or the bank's transfers
            refused += sum(res[k].get(o, 0) for k in ("churn_writes", "bank_transfers")
                           for o in ("stale", "locklost"))
        self.assertGreaterEqual(refused, 1, "no write was refused: the faults never bit\n" + card)
        bit = sum(res["by_kind"].get(k, {}).get("bit", 0) for k in bite_kinds)
        self.assertGreaterEqual(bit, 1, "no %s fault bit:\n%s" % ("/".join(bite_kinds), card))
        self.assertGreaterEqual(res["acknowledged"], 50, "hardly any progress:\n" + card)
        self.assertGreaterEqual(res["churn_writes"].get("ok", 0), 50,
                                "hardly any progress on the churn locks:\n" + card)
        self.assertGreaterEqual(res["bank_transfers"].get("ok", 0), 50,
                                "hardly any bank transfers:\n" + card)
        self.assertGreaterEqual(res["acked_after_last_fault"], 1,
                                "no acknowledged write after the last fault:\n" + card)
        self.assertGreaterEqual(res["fenced_txns"], 1,
                                "no pipelined run went as a fenced transaction:\n" + card)
        if kw.get("pg"):
            self.assertGreaterEqual(res["pg"]["writes"].get("ok", 0), 50,
                                    "hardly any SQL batches committed:\n" + card)
        if kw.get("http_store"):
            self.assertGreaterEqual(res["http"]["writes"].get("ok", 0), 50,
                                    "hardly any writes through the HTTP store:\n" + card)
        if kw.get("backend") == "etcd":
            self.assertGreaterEqual(res["shared_txns"], 1,
                                    "no etcd Txn carried several acquisitions:\n" + card)
        return res

    def test_etcd_freeze_sidecar(self):
        """The freeze nemesis with etcd as the lock backend (Redis stays the store)."""
        self.run_nemesis("freeze", ["freeze"], backend="etcd")

    def test_etcd_kill_leader(self):
        """A 3-member etcd loses its leader (kill -9, restarted 0.3-1.5 s later) while locks are
        held and waited for."""
        self.run_nemesis("kill-etcd-leader", ["kill-etcd-leader"], backend="etcd", etcd_members=3)

    def test_etcd_partition(self):
        """The sidecar in a network namespace cut off from etcd (not from Redis) past its lease,
        its worker's write sent into the cut."""
        if netns_unavailable():
            self.skipTest("no network namespace: %s" % netns_unavailable())
        self.run_nemesis("partition-etcd", ["partition-etcd"], backend="etcd", netns=True)

    def test_etcd_kill_sidecar(self):
        """kill -9 a sidecar with etcd as the lock backend: its lease frees the lock."""
        self.run_nemesis("kill-sidecar", ["kill-sidecar"], backend="etcd")

    def test_rollback_locks(self):
        """The locks in a Redis of their own (no persistence), rolled back to a snapshot taken
        0.3-1.5 s earlier, as a failover to a lagging replica would: counters fall below the
        store's marks and lock keys vanish or come back. The fence must hold, by repairing
        tokens."""
        res = self.run_nemesis("rollback-locks", ["rollback-locks"], backend="redis-apart")
        self.assertGreaterEqual(res["token_repairs"], 1, "no token was repaired")

    def test_rollback_store(self):
        """The one Redis that holds locks, marks and data (the default) cut back to a point of
        its AOF 0.3-1.5 s earlier, as a failover to a lagging replica would: tokens granted since
        come again, and former holders still believe they hold their locks. Writes the store's
        lock keys no longer name must be refused LOCKLOST."""
        self.run_nemesis("rollback-store", ["rollback-store"])

    def test_etcd_rollback_store(self):
        """The same rollback of the store's Redis with the locks in etcd, which keeps them: the
        marks fence on acquire set since go back while the grants stand. A write under such a
        grant (its mark now below its token) must be refused LOCKLOST and the lock given up:
        its read may come from state the rollback took back. It bites less often than with the
        default layout: the stopped worker's write mostly ends in doubt (in one CI run all seven
        did), so the refusals come from other workers granted in the window, on any lock; the
        run is twice as long."""
        self.run_nemesis("rollback-store", ["rollback-store"], backend="etcd",
                         seconds=SECONDS * 2, refused_on="any")

    def test_pg_kill_postgres(self):
        """A PostgreSQL store with SQL workers on lock P over the HTTP API; PostgreSQL killed
        (postmaster and backends, kill -9) with a batch in flight, started again."""
        self.run_nemesis("kill-postgres", ["kill-postgres"], pg=True)

    def test_http_kill_store(self):
        """An HTTP store (ledger.py, which checks Fencing-Token itself) with ledger workers on
        lock H over the HTTP API; the ledger killed (kill -9) with a write in flight, started
        again from its file."""
        self.run_nemesis("kill-http-store", ["kill-http-store"], http_store=True)

    def test_freeze_sidecar(self):
        """SIGSTOP a sidecar past its lease while its worker is mid read-modify-write."""
        self.run_nemesis("freeze", ["freeze"])

    def test_stall_norenew_worker(self):
        """A worker holding a NORENEW lease (TTL 500) stalls past it before writing."""
        self.run_nemesis("stall", ["stall"])

    def test_kill_sidecar(self):
        """kill -9 a sidecar with a write in flight; restart it on the same ports."""
        self.run_nemesis("kill-sidecar", ["kill-sidecar"])

    def test_kill_redis(self):
        """kill -9 Redis with a write in flight; restart it with its AOF."""
        self.run_nemesis("kill-redis", ["kill-redis"])

    @unittest.skipUnless(workload.FAKETIME_LIBS, "libfaketime is not installed "
                         "(apt-get install libfaketime)")
    def test_clock_skew(self):
        """One sidecar restarted under libfaketime at x0.2..x0.3 (monotonic clock faked too);
        the other runs at "+30s x1.5" the whole time."""
        self.run_nemesis("clock", ["clock"], fast_clock_b="+30s x1.5")

    def test_partition(self):
        """A sidecar in a network namespace cut off from Redis (iptables) past its lease; Redis
        SIGSTOPped instead when namespaces are not available."""
        kinds = ["partition"] if not netns_unavailable() else ["pause-redis", "stall"]
        self.run_nemesis("partition", kinds, netns=True)

    def test_mixed(self):
        """All of the above, picked at random."""
        self.run_nemesis("mixed", list(workload.NEMESES) + ["pause-redis"],
                         seconds=SECONDS * 1.5, netns=True)


if __name__ == "__main__":
    unittest.main()
