#!/usr/bin/env bash
# redis_suite.sh - Redis's own test suite (tests/test_helper.tcl, external-server mode) through
# fencegate: the strictest check that fencegate is a drop-in Redis endpoint.
#
# Usage: tests/compat/redis_suite.sh [--bin PATH] [--direct] [--protect] [--src DIR]
#                                    [-- RUNTEST-ARGS...]
#
# Fetches the source of the installed redis-server's version from Debian's archive (or uses
# --src DIR, an unpacked redis-X.Y.Z tree), starts a redis-server (DEBUG and protected CONFIG
# enabled, as the suite needs) and fencegate in front of it on free 127.0.0.1 ports, and runs
#   ./runtest --host 127.0.0.1 --port <fencegate> --skiptest <known> ... RUNTEST-ARGS
# Tests tagged external:skip are skipped by the suite itself. --direct runs the same suite
# against the redis-server (the baseline: the tests that fail there fail for the environment).
# --protect gives fencegate a protect rule on keys the suite never uses, so that every write
# goes through fencing's classification (key positions, movable keys, scripts) and must pass.
# Took 20-25 minutes on 2 CPUs in earlier runs, 5 (291 s) on 2026-11-29; needs tclsh (apt-get
# install tcl). Not part of CI: the suite would take much of CI's time budget. Exit status:
# runtest's.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
DIRECT=0
PROTECT=0
SRC=""
START_TIMEOUT=20

# Tests that fail against a plain redis-server in external mode too (suite or environment):
SKIP=(
  # 7.0's suite asks for the pid of a server it did not start
  "SRANDMEMBER with a dict containing long chain"
  # redis-cli --functions-rdb needs a server of the test's own
  "Dumping an RDB - functions only: yes"
)

# With protect rules MULTI is held in fencegate until EXEC (README, "Transactions"), so Redis
# judges the queued commands at EXEC, not as each arrives. These tests change the server's state
# (maxmemory, a busy script) between queueing and EXEC and expect the queue-time verdict (Redis
# refuses every command queued while out of memory); the block is still all or nothing.
PROTECT_SKIP=(
  "EXEC fails if there are errors while queueing commands #2"
  "DISCARD should not fail during OOM"
  "MULTI and script timeout"
  "MULTI-EXEC body and script timeout"
  "EXEC with only read commands should not be rejected when OOM"
  # a RESP3 invalidation Redis pushes while the block is queued comes at EXEC, after the
  # QUEUED fencegate answered
  "Regression test for #11715"
  # a block refused while queued (an unknown command) never reaches Redis, so MONITOR does not
  # show its MULTI and EXEC
  "MONITOR correctly handles multi-exec cases"
)

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --direct) DIRECT=1; shift ;;
    --protect) PROTECT=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "redis_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "redis_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli tclsh curl python3; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found: $tool (apt-get install tcl redis-server curl)"
done
[ "$DIRECT" = 1 ] || [ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-redis-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"
# shellcheck source=tests/compat/lib.sh
source "$SCRIPT_DIR/lib.sh"

if [ -z "$SRC" ]; then
  version=$(redis-server --version | sed -n 's/.* v=\([0-9.]*\) .*/\1/p')
  [ -n "$version" ] || die "cannot tell the redis-server version"
  url="http://deb.debian.org/debian/pool/main/r/redis/redis_${version}.orig.tar.gz"
  echo "fetching $url" >&2
  curl -fsS --max-time 300 -o "$TMPDIR_BENCH/redis.tar.gz" "$url" || die "cannot fetch $url"
  tar -xzf "$TMPDIR_BENCH/redis.tar.gz" -C "$TMPDIR_BENCH"
  SRC="$TMPDIR_BENCH/redis-$version"
else
  cp -r "$SRC" "$TMPDIR_BENCH/src" # the suite writes into its tree
  SRC="$TMPDIR_BENCH/src"
fi
[ -f "$SRC/tests/test_helper.tcl" ] || die "no Redis test suite in $SRC"
# The suite runs the tools from src/; the installed ones are the same version.
mkdir -p "$SRC/src"
for t in redis-server redis-cli redis-benchmark redis-check-aof redis-check-rdb; do
  p=$(command -v "$t" || true)
  [ -n "$p" ] && ln -sf "$p" "$SRC/src/$t"
done

read -r REDIS_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 3)"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMPDIR_BENCH" --save '' \
  --appendonly no --enable-debug-command yes --enable-protected-configs yes \
  --enable-module-command yes --daemonize no --logfile "$TMPDIR_BENCH/redis.log" &
PIDS+=("$!")
wait_ready redis-server "$!" "$TMPDIR_BENCH/redis.log" redis-cli -p "$REDIS_PORT" ping
PORT=$REDIS_PORT
if [ "$DIRECT" = 0 ]; then
  start_fencegate "$BIN" "$REDIS_PORT" "$FG_PORT" "$FG_HTTP_PORT" "$PROTECT"
  PORT=$FG_PORT
fi

args=(--host 127.0.0.1 --port "$PORT" --timeout 600 --baseport "$((20000 + RANDOM % 20000))")
for t in "${SKIP[@]}"; do args+=(--skiptest "$t"); done
if [ "$PROTECT" = 1 ]; then
  for t in "${PROTECT_SKIP[@]}"; do args+=(--skiptest "$t"); done
fi
echo "runtest ${args[*]} $*  (against $([ "$DIRECT" = 1 ] && echo redis-server || echo fencegate))" >&2
rc=0
(cd "$SRC" && ./runtest "${args[@]}" "$@") || rc=$?
if [ "$DIRECT" = 0 ]; then
  echo "---- fencegate warnings and errors ----"
  grep -v ' info ' "$TMPDIR_BENCH/fencegate.log" | tail -n 40 || true
fi
exit "$rc"
