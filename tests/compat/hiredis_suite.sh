#!/usr/bin/env bash
# hiredis_suite.sh - hiredis's own test program (test.c of the installed libhiredis's version)
# against redis-server, then through fencegate: every test that passes against Redis must pass
# through fencegate too.
#
# Usage: tests/compat/hiredis_suite.sh [--bin PATH] [--protect] [--src DIR]
#
# Fetches the source of the installed libhiredis-dev's version from Debian's archive (or uses
# --src DIR, an unpacked hiredis-X.Y.Z tree), builds its `hiredis-test`, starts a redis-server
# and fencegate in front of it on free 127.0.0.1 ports, and runs the test program over TCP
# against each (its Unix-socket and inherited-descriptor parts talk to Redis's socket in both
# runs: fencegate listens on TCP only). --protect gives fencegate a protect rule on keys the
# tests never use, so that every write goes through fencing's classification. Prints both
# runs' failures; exits 1 when fencegate fails a test that Redis passed. About 20 seconds;
# needs make, cc and curl.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
PROTECT=0
SRC=""
START_TIMEOUT=20

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --protect) PROTECT=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "hiredis_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "hiredis_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli make cc curl python3 dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found: $tool (apt-get install redis-server make gcc curl)"
done
[ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-hiredis-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"
# shellcheck source=tests/compat/lib.sh
source "$SCRIPT_DIR/lib.sh"

if [ -z "$SRC" ]; then
  version=$(dpkg-query -W -f '${Version}' libhiredis-dev 2>/dev/null | sed 's/-[^-]*$//')
  [ -n "$version" ] || die "cannot tell the libhiredis-dev version (apt-get install libhiredis-dev)"
  url="http://deb.debian.org/debian/pool/main/h/hiredis/hiredis_${version}.orig.tar.gz"
  echo "fetching $url" >&2
  curl -fsS --max-time 300 -o "$TMPDIR_BENCH/hiredis.tar.gz" "$url" || die "cannot fetch $url"
  tar -xzf "$TMPDIR_BENCH/hiredis.tar.gz" -C "$TMPDIR_BENCH"
  SRC="$TMPDIR_BENCH/hiredis-$version"
else
  cp -r "$SRC" "$TMPDIR_BENCH/src"
  SRC="$TMPDIR_BENCH/src"
fi
[ -f "$SRC/test.c" ] || die "no hiredis test program in $SRC"
make -C "$SRC" hiredis-test >"$TMPDIR_BENCH/make.log" 2>&1 ||
  { show_log make "$TMPDIR_BENCH/make.log"; die "building hiredis-test failed"; }

read -r REDIS_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 3)"
SOCK="$TMPDIR_BENCH/redis.sock"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --unixsocket "$SOCK" --dir "$TMPDIR_BENCH" \
  --save '' --appendonly no --enable-debug-command yes --daemonize no \
  --logfile "$TMPDIR_BENCH/redis.log" &
PIDS+=("$!")
wait_ready redis-server "$!" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"

start_fencegate "$BIN" "$REDIS_PORT" "$FG_PORT" "$FG_HTTP_PORT" "$PROTECT"

# run NAME PORT: the names of the tests that failed, one per line, in $TMPDIR_BENCH/NAME.failed
run() {
  local rc=0
  (cd "$SRC" && timeout 300 ./hiredis-test -h 127.0.0.1 -p "$2" -s "$SOCK") \
    >"$TMPDIR_BENCH/$1.out" 2>&1 || rc=$?
  grep -a 'FAILED' "$TMPDIR_BENCH/$1.out" | grep -av 'TESTS FAILED' |
    sed 's/^#[0-9]* //; s/: .*FAILED.*$//' | sort >"$TMPDIR_BENCH/$1.failed" || true
  local passed
  passed=$(grep -ac 'PASSED' "$TMPDIR_BENCH/$1.out" || true)
  echo "$1: hiredis-test exit $rc, $passed passed, $(wc -l <"$TMPDIR_BENCH/$1.failed") failed"
  sed 's/^/  failed: /' "$TMPDIR_BENCH/$1.failed"
  grep -aq 'ALL TESTS PASSED\|TESTS FAILED' "$TMPDIR_BENCH/$1.out" ||
    { tail -n 20 "$TMPDIR_BENCH/$1.out"; die "hiredis-test did not finish against $1"; }
}

run redis "$REDIS_PORT"
run fencegate "$FG_PORT"
extra=$(comm -13 "$TMPDIR_BENCH/redis.failed" "$TMPDIR_BENCH/fencegate.failed")
if [ -n "$extra" ]; then
  echo "failed through fencegate only:"
  echo "$extra" | sed 's/^/  /'
  echo "---- fencegate warnings and errors ----"
  tail -n 40 "$TMPDIR_BENCH/fencegate.log"
  exit 1
fi
echo "every test that passed against Redis passed through fencegate"
