#!/usr/bin/env bash
# redispy_suite.sh - the test suite of redis-py (Debian's python3-redis) against redis-server,
# then through fencegate: every test that passes against Redis must pass through fencegate too.
#
# Usage: tests/compat/redispy_suite.sh [--bin PATH] [--protect] [--resp3] [--version V]
#                                      [--src DIR]
#
# Fetches the source of python-redis from Debian's archive, in the upstream version V
# (python-redis_V.orig.tar.gz), by default the installed python3-redis's version or, when the
# archive no longer has that, 6.4.0; or uses --src DIR, an unpacked redis-py tree. Its pytest
# suite (sync and asyncio clients) runs with the tree's own `redis` package on PYTHONPATH, so
# that the tests match the code, against a redis-server and then
# against fencegate in front of it, on free 127.0.0.1 ports. Left out in both runs: the tests
# of cluster, sentinel, TLS, replicas and modules (markers onlycluster, redismod, ssl, replica,
# cp_integration; test_sentinel.py, test_search.py, test_vsets.py), which need servers of their
# own, and test_credentials.py, which imports redis-entraid (no Debian package). --protect gives
# fencegate a protect rule on keys the tests never use, so that every write goes through
# fencing's classification; --resp3 has every client of the suite speak RESP3 (its --protocol 3,
# redis-py 5.0 and later). Prints both runs' failures; exits 1 when fencegate fails a test that
# Redis passed. With redis-py 6.4.0 and Redis 7.0.15, 12 tests fail in both runs: ACL GETUSER,
# ACL LOG and XINFO GROUPS replies as Redis 7.2 gives them, and tests that connect to
# localhost:6379 whatever --redis-url says. About 8 minutes; needs curl and Debian's
# python3-pytest, python3-pytest-timeout, python3-pytest-asyncio, python3-mock,
# python3-packaging and python3-async-timeout.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
PROTECT=0
PROTOCOL=()
SRC=""
VERSION=""
START_TIMEOUT=20
PY=/usr/bin/python3

usage() {
  sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --version) [ $# -ge 2 ] || usage 2; VERSION=$2; shift 2 ;;
    --protect) PROTECT=1; shift ;;
    --resp3) PROTOCOL=(--protocol=3); shift ;;
    -h|--help) usage 0 ;;
    *) echo "redispy_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "redispy_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli curl python3 dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "required tool not found: $tool (apt-get install redis-server curl)"
done
[ -x "$PY" ] || die "$PY not found (apt-get install python3)"
"$PY" -c 'import pytest, pytest_timeout, pytest_asyncio, mock, packaging, async_timeout' \
  2>/dev/null || die "python modules missing (apt-get install python3-pytest" \
  "python3-pytest-timeout python3-pytest-asyncio python3-mock python3-packaging" \
  "python3-async-timeout)"
[ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-redispy-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"
# shellcheck source=tests/compat/lib.sh
source "$SCRIPT_DIR/lib.sh"

if [ -z "$SRC" ]; then
  if [ -n "$VERSION" ]; then
    versions=("$VERSION")
  else
    # The installed python3-redis's version (4.3.4-3 -> 4.3.4), then the one the archive served
    # when this script was written (its pool no longer had 4.3.4's tarball): the tests run the
    # tree's own `redis` package, so they match their code in either.
    installed=$(dpkg-query -W -f '${Version}' python3-redis 2>/dev/null |
      sed 's/^[0-9]*://; s/-[^-]*$//')
    versions=(${installed:+"$installed"} 6.4.0)
  fi
  fetched=""
  for VERSION in "${versions[@]}"; do
    url="http://deb.debian.org/debian/pool/main/p/python-redis/python-redis_${VERSION}.orig.tar.gz"
    echo "fetching $url" >&2
    if curl -fsS --max-time 300 -o "$TMPDIR_BENCH/python-redis.tar.gz" "$url"; then
      fetched=$VERSION
      break
    fi
  done
  [ -n "$fetched" ] ||
    die "cannot fetch redis-py ${versions[*]} (a version the archive has: --version V, or an unpacked tree: --src)"
  echo "redis-py $fetched" >&2
  tar -xzf "$TMPDIR_BENCH/python-redis.tar.gz" -C "$TMPDIR_BENCH"
  SRC=$(find "$TMPDIR_BENCH" -mindepth 1 -maxdepth 1 -type d -name 'redis-py-*' | head -n 1)
  [ -n "$SRC" ] || SRC=$(find "$TMPDIR_BENCH" -mindepth 1 -maxdepth 1 -type d -name 'redis-*' |
    head -n 1)
else
  cp -r "$SRC" "$TMPDIR_BENCH/src"
  SRC="$TMPDIR_BENCH/src"
fi
if [ -z "$SRC" ] || [ ! -f "$SRC/tests/conftest.py" ] || [ ! -f "$SRC/redis/__init__.py" ]; then
  die "no redis-py tests in ${SRC:-the tarball}"
fi
lib=$(cd "$SRC" && PYTHONPATH=$SRC "$PY" -c 'import redis; print(redis.__file__)')
[ "$lib" = "$SRC/redis/__init__.py" ] || die "the tests would import $lib, not $SRC's redis"

read -r REDIS_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 3)"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMPDIR_BENCH" \
  --save '' --appendonly no --enable-debug-command yes --daemonize no \
  --logfile "$TMPDIR_BENCH/redis.log" &
PIDS+=("$!")
wait_ready redis-server "$!" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"

start_fencegate "$BIN" "$REDIS_PORT" "$FG_PORT" "$FG_HTTP_PORT" "$PROTECT"

# Test files that need what is not here: servers of their own, or a module Debian lacks.
IGNORE=()
for f in test_sentinel.py test_search.py test_vsets.py test_credentials.py; do
  for d in tests tests/test_asyncio; do
    if [ -f "$SRC/$d/$f" ]; then IGNORE+=("--ignore=$d/$f"); fi
  done
done
MARKS='not onlycluster and not redismod and not ssl and not replica and not cp_integration'

# run NAME PORT: the ids of the tests that failed (or errored), one per line, in
# $TMPDIR_BENCH/NAME.failed; counts from pytest's JUnit XML. filterwarnings is reset because the
# suite's own names a warning class of python3-coverage, which the tests do not need; each test
# has 60 s (the suite's own limit is 30) on a machine that runs both servers and the tests.
run() {
  local rc=0
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  (cd "$SRC" && PYTHONPATH=$SRC timeout -k 10 1200 "$PY" -m pytest -p no:cacheprovider \
    -o filterwarnings=always -o timeout=60 -q -rfE --junitxml="$TMPDIR_BENCH/$1.xml" \
    --redis-url="redis://127.0.0.1:$2/0" "${PROTOCOL[@]}" -m "$MARKS" "${IGNORE[@]}" tests) \
    >"$TMPDIR_BENCH/$1.out" 2>&1 </dev/null || rc=$?
  # A test timed out with pytest-timeout's thread method (the suite's TestPubSubAutoReconnect
  # asks for it) ends pytest at once, with no report: its stack dump is the evidence.
  if [ ! -s "$TMPDIR_BENCH/$1.xml" ]; then
    grep -a -B 2 -A 60 '^+* Timeout +*$' "$TMPDIR_BENCH/$1.out" | head -n 150 ||
      tail -n 40 "$TMPDIR_BENCH/$1.out"
    die "pytest did not finish against $1 (exit $rc)"
  fi
  local counts
  counts=$("$PY" - "$TMPDIR_BENCH/$1.xml" "$TMPDIR_BENCH/$1.failed" <<'EOF'
import sys
import xml.etree.ElementTree as ET

passed, failed, skipped, names = 0, 0, 0, []
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    tags = {child.tag for child in case}
    name = case.get("classname", "") + "::" + case.get("name", "")
    if tags & {"failure", "error"}:
        failed += 1
        names.append(name)
    elif "skipped" in tags:
        skipped += 1
    else:
        passed += 1
with open(sys.argv[2], "w") as out:
    out.writelines(n + "\n" for n in sorted(set(names)))
print(f"{passed} passed, {failed} failed, {skipped} skipped")
EOF
  )
  echo "$1: pytest exit $rc, $counts"
  sed 's/^/  failed: /' "$TMPDIR_BENCH/$1.failed"
}

run redis "$REDIS_PORT"
run fencegate "$FG_PORT"
extra=$(comm -13 "$TMPDIR_BENCH/redis.failed" "$TMPDIR_BENCH/fencegate.failed")
if [ -n "$extra" ]; then
  echo "failed through fencegate only:"
  echo "$extra" | sed 's/^/  /'
  grep -a -A 30 '^____* .* ____*$' "$TMPDIR_BENCH/fencegate.out" | head -n 200
  echo "---- fencegate warnings and errors ----"
  tail -n 40 "$TMPDIR_BENCH/fencegate.log"
  exit 1
fi
echo "every test that passed against Redis passed through fencegate"
