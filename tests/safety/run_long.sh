#!/usr/bin/env bash
# run_long.sh — the safety suite's long form (not run by CI): the lock-set workload under the
# mixed nemesis (freeze, stall, kill -9 sidecar, kill -9 Redis, clock skew, partition; with
# --backend etcd --etcd-members 3 also kill -9 etcd's leader) until N faults were injected, then
# the checker and a scorecard.
#
#   tests/safety/run_long.sh [N] [extra workload.py options]     (N defaults to 200)
#   e.g. tests/safety/run_long.sh 500 --seed 42 --history /tmp/fg-history.jsonl
#
# Environment: FENCEGATE_BIN (default build/bin/fencegate, built here when missing),
# PYTHON (default /usr/bin/python3). Exit status: 0 no violation, 1 violations, 2 usage.
# Count on about 3 s per fault (N=200: ~10 minutes). Runs as root use a network namespace for
# the partitions; otherwise they are Redis SIGSTOPs (see README.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
n=${1:-200}
case "$n" in
'' | *[!0-9]*) echo "usage: $0 [N faults] [workload.py options]" >&2; exit 2 ;;
esac
[ $# -gt 0 ] && shift

if [ -z "${FENCEGATE_BIN:-}" ]; then
    FENCEGATE_BIN=$root/build/bin/fencegate
    if [ ! -x "$FENCEGATE_BIN" ]; then
        cmake -S "$root" -B "$root/build" -DFG_TESTS=OFF >/dev/null
        cmake --build "$root/build" -j "$(nproc)" --target fencegate >/dev/null
    fi
fi
export FENCEGATE_BIN
exec "${PYTHON:-/usr/bin/python3}" "$here/workload.py" --nemesis mixed --faults "$n" "$@"
