#!/usr/bin/env bash
# phpredis_suite.sh - phpredis's own test suite (tests/TestRedis.php --class Redis of the
# installed php-redis's version) against redis-server, then through fencegate: every test that
# passes against Redis must pass through fencegate too.
#
# Usage: tests/compat/phpredis_suite.sh [--bin PATH] [--protect] [--src DIR]
#
# Fetches the source of the installed php-redis's version from Debian's archive (or uses --src
# DIR, an unpacked redis-X.Y.Z tree), starts a redis-server and fencegate in front of it on free
# 127.0.0.1 ports, and runs the tests with the installed extension against each. Two lines of
# the tests are changed first: the session tests' save path names the port under test (it was
# 6379 whatever --port said), and testConnectException, which connects to a host on the
# internet, is skipped. --protect gives fencegate a protect rule on keys the tests never use,
# so that every write goes through fencing's classification. Prints both runs' failures; exits
# 1 when fencegate fails a test that Redis passed. About 2 minutes; needs php-cli, php-redis,
# curl and xz-utils (apt-get install php-cli php-redis).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
PROTECT=0
SRC=""
START_TIMEOUT=20

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --protect) PROTECT=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "phpredis_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "phpredis_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli php curl xz python3 dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "required tool not found: $tool (apt-get install redis-server php-cli php-redis curl xz-utils)"
done
php -m | grep -qx redis || die "php has no redis extension (apt-get install php-redis)"
[ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-phpredis-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"
# shellcheck source=tests/compat/lib.sh
source "$SCRIPT_DIR/lib.sh"

if [ -z "$SRC" ]; then
  # 5.3.7+4.3.0-3: the source package carries php-redis 5.3.7 (for PHP 7+ and 8) and 4.3.0
  version=$(dpkg-query -W -f '${Version}' php-redis 2>/dev/null | sed 's/^[0-9]*://; s/-[^-]*$//')
  [ -n "$version" ] || die "cannot tell the php-redis version (apt-get install php-redis)"
  url="http://deb.debian.org/debian/pool/main/p/php-redis/php-redis_${version}.orig.tar.xz"
  echo "fetching $url" >&2
  curl -fsS --max-time 300 -o "$TMPDIR_BENCH/php-redis.tar.xz" "$url" || die "cannot fetch $url"
  tar -xJf "$TMPDIR_BENCH/php-redis.tar.xz" -C "$TMPDIR_BENCH"
  SRC="$TMPDIR_BENCH/redis-$(php -r 'echo phpversion("redis");')"
else
  cp -r "$SRC" "$TMPDIR_BENCH/src"
  SRC="$TMPDIR_BENCH/src"
fi
[ -f "$SRC/tests/TestRedis.php" ] || die "no phpredis tests in $SRC (is it the installed version?)"
sed -i -e "s/\$host . ':6379');/\$host . ':' . \$this->getPort());/" \
  -e "s/\$host = 'github.com';/\$host = 'github.invalid';/" "$SRC/tests/RedisTest.php"

read -r REDIS_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 3)"
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMPDIR_BENCH" \
  --save '' --appendonly no --enable-debug-command yes --daemonize no \
  --logfile "$TMPDIR_BENCH/redis.log" &
PIDS+=("$!")
wait_ready redis-server "$!" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"

start_fencegate "$BIN" "$REDIS_PORT" "$FG_PORT" "$FG_HTTP_PORT" "$PROTECT"

# run NAME PORT: the names of the tests that failed, one per line, in $TMPDIR_BENCH/NAME.failed.
# The session tests run PHP again for each session; TEST_PHP_ARGS makes that PHP load the
# installed extension (without it, the suite looks for one built in the source tree).
run() {
  local rc=0
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  (cd "$SRC" && TEST_PHP_ARGS='-d memory_limit=256M' timeout 600 \
    php tests/TestRedis.php --class Redis --host 127.0.0.1 --port "$2" --nocolors) \
    >"$TMPDIR_BENCH/$1.out" 2>&1 || rc=$?
  # "Assertion failed: FILE:LINE (testName)", "Uncaught exception '...' (testName)"
  grep -a '^Assertion failed\|^Uncaught exception' "$TMPDIR_BENCH/$1.out" |
    sed -n 's/.*(\(test[A-Za-z0-9_]*\))$/\1/p' | sort -u >"$TMPDIR_BENCH/$1.failed" || true
  local passed
  passed=$(grep -ac '\[PASSED\]' "$TMPDIR_BENCH/$1.out" || true)
  echo "$1: TestRedis.php exit $rc, $passed passed, $(wc -l <"$TMPDIR_BENCH/$1.failed") failed"
  sed 's/^/  failed: /' "$TMPDIR_BENCH/$1.failed"
  grep -aq 'All tests passed\|Assertion failed\|Uncaught exception' "$TMPDIR_BENCH/$1.out" ||
    { tail -n 20 "$TMPDIR_BENCH/$1.out"; die "TestRedis.php did not finish against $1"; }
}

run redis "$REDIS_PORT"
run fencegate "$FG_PORT"
extra=$(comm -13 "$TMPDIR_BENCH/redis.failed" "$TMPDIR_BENCH/fencegate.failed")
if [ -n "$extra" ]; then
  echo "failed through fencegate only:"
  echo "$extra" | sed 's/^/  /'
  grep -a 'Assertion failed\|Uncaught exception' "$TMPDIR_BENCH/fencegate.out" | head -n 40
  echo "---- fencegate warnings and errors ----"
  tail -n 40 "$TMPDIR_BENCH/fencegate.log"
  exit 1
fi
echo "every test that passed against Redis passed through fencegate"
