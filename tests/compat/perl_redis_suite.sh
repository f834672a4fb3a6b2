#!/usr/bin/env bash
# perl_redis_suite.sh - the test suite of Perl's Redis client (Redis.pm, Debian's libredis-perl)
# against redis-server, then through fencegate: every test that passes against Redis must pass
# through fencegate too.
#
# Usage: tests/compat/perl_redis_suite.sh [--bin PATH] [--protect] [--src DIR]
#
# Fetches the source of the archive's libredis-perl version from Debian's archive (or uses --src
# DIR, an unpacked Redis-X.Y tree). Each test file starts a redis-server of its own (its config
# on a free port); the second run gives it a stand-in redis-server that starts the real one on
# another free 127.0.0.1 port and fencegate on the port the test asked for, and stops both when
# either exits or the test stops it (after SHUTDOWN the test expects connecting to fail). Unix
# socket tests reach Redis's own socket in both runs. --protect gives each fencegate a protect
# rule on keys the tests never use, so that every write goes through fencing's classification.
# Prints both runs' failures; exits 1 when fencegate fails a test that Redis passed, except the
# two of t/50-fork_safe.t that count connected_clients (fencegate's own connections are clients
# of Redis too). About 3 minutes; needs perl, curl and the tests' modules (apt-get install
# libio-socket-timeout-perl libtry-tiny-perl libtest-deep-perl libtest-fatal-perl
# libtest-sharedfork-perl libtest-tcp-perl libio-string-perl).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
PROTECT=0
SRC=""

# Failures through fencegate that are not Redis behaviour: "FILE NUMBER", as TAP numbers them.
ARTEFACTS=(
  "t/50-fork_safe.t 1" # connected_clients is 1
  "t/50-fork_safe.t 4" # '2 clients connected'
)

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --protect) PROTECT=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "perl_redis_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "perl_redis_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli perl curl python3 apt-cache; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found: $tool"
done
for mod in IO::Socket::Timeout Try::Tiny Test::Deep Test::Fatal Test::SharedFork Test::TCP \
  IO::String; do
  perl -M"$mod" -e1 2>/dev/null || die "perl module $mod missing (see --help for the packages)"
done
[ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"
BIN=$(cd -- "$(dirname -- "$BIN")" && pwd)/$(basename -- "$BIN")

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-perl-redis-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"

if [ -z "$SRC" ]; then
  # 2:2.000-1 -> 2.000
  version=$(apt-cache show libredis-perl 2>/dev/null | sed -n 's/^Version: //p' | head -n 1 |
    sed 's/^[0-9]*://; s/-[^-]*$//')
  [ -n "$version" ] || die "cannot tell libredis-perl's version (apt-get update first)"
  url="http://deb.debian.org/debian/pool/main/libr/libredis-perl/libredis-perl_${version}.orig.tar.gz"
  echo "fetching $url" >&2
  curl -fsS --max-time 300 -o "$TMPDIR_BENCH/redis-perl.tar.gz" "$url" || die "cannot fetch $url"
  tar -xzf "$TMPDIR_BENCH/redis-perl.tar.gz" -C "$TMPDIR_BENCH"
  SRC="$TMPDIR_BENCH/Redis-$version"
else
  cp -r "$SRC" "$TMPDIR_BENCH/src"
  SRC="$TMPDIR_BENCH/src"
fi
[ -f "$SRC/t/tlib/Test/SpawnRedisServer.pm" ] || die "no Redis.pm tests in $SRC"

# The stand-in redis-server (REDIS_SERVER_PATH): redis-server CONFIG, where CONFIG has a port
# line. Each one appends its two pids to $FG_PIDS, so that the end of this script stops them
# whatever happened to the test.
mkdir -p "$TMPDIR_BENCH/bin" "$TMPDIR_BENCH/tmp"
cat >"$TMPDIR_BENCH/bin/redis-server" <<'EOF'
#!/usr/bin/env bash
set -u
cfg=$1
port=$(awk '$1 == "port" { print $2 }' "$cfg")
read -r rport hport <<<"$(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')"
sed "s/^\( *\)port $port\$/\1port $rport/" "$cfg" >"$cfg.real"
redis-server "$cfg.real" >/dev/null 2>&1 </dev/null &
rpid=$!
echo "$rpid" >>"$FG_PIDS"
for _ in $(seq 100); do redis-cli -p "$rport" PING >/dev/null 2>&1 && break; sleep 0.05; done
yaml="$cfg.fencegate.yaml"
# shellcheck source=tests/compat/lib.sh
source "$FG_COMPAT_LIB"
fencegate_config "$yaml" "$port" "$hport" "$rport" "$FG_PROTECT"
"$FG_BIN" --config "$yaml" --log-level warn >>"$FG_LOG" 2>&1 </dev/null &
fpid=$!
echo "$fpid" >>"$FG_PIDS"
trap 'kill $fpid $rpid 2>/dev/null; wait; exit 0' TERM INT
wait -n $fpid $rpid
kill $fpid $rpid 2>/dev/null
wait
EOF
chmod +x "$TMPDIR_BENCH/bin/redis-server"

# run NAME [REDIS_SERVER_PATH]: every test file, each bounded in time; "FILE NUMBER" of each
# failed test, one per line, in $TMPDIR_BENCH/NAME.failed
run() {
  local name=$1 server=${2:-} t rc out passed=0 failed=0
  : >"$TMPDIR_BENCH/$name.failed"
  for t in "$SRC"/t/[0-9]*.t; do
    t=t/$(basename "$t")
    rc=0
    # TMPDIR: the tests' own temporary configs and sockets (and the stand-in's files beside
    # them) go where the end of this script removes them.
    (cd "$SRC" && TMPDIR="$TMPDIR_BENCH/tmp" REDIS_SERVER_PATH=$server FG_BIN=$BIN \
      FG_PROTECT=$PROTECT \
      FG_COMPAT_LIB=$SCRIPT_DIR/lib.sh \
      FG_LOG="$TMPDIR_BENCH/fencegate.log" FG_PIDS="$TMPDIR_BENCH/pids" \
      timeout -k 5 180 perl -Ilib -It/tlib "$t") \
      >"$TMPDIR_BENCH/$name.$(basename "$t").out" 2>&1 </dev/null || rc=$?
    out="$TMPDIR_BENCH/$name.$(basename "$t").out"
    grep -a '^not ok' "$out" | awk -v t="$t" '{ print t, $3 }' >>"$TMPDIR_BENCH/$name.failed" ||
      true
    passed=$((passed + $(grep -ac '^ok' "$out" || true)))
    failed=$((failed + $(grep -ac '^not ok' "$out" || true)))
    if grep -aq '^1\.\.0 # SKIP' "$out"; then
      echo "  $t skipped: $(sed -n 's/^1\.\.0 # SKIP //p' "$out" | head -c 200)"
    elif [ "$rc" != 0 ] && ! grep -aq '^not ok' "$out"; then
      echo "$t X" >>"$TMPDIR_BENCH/$name.failed" # died, or timed out, without a failed test
      echo "  $t: exit $rc"; tail -n 5 "$out" | sed 's/^/    /'
    fi
  done
  sort -o "$TMPDIR_BENCH/$name.failed" "$TMPDIR_BENCH/$name.failed"
  echo "$name: $passed passed, $failed failed"
  sed 's/^/  failed: /' "$TMPDIR_BENCH/$name.failed"
}

stop_stand_ins() {
  local pid
  [ -f "$TMPDIR_BENCH/pids" ] || return 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$TMPDIR_BENCH/pids"
}
trap 'stop_stand_ins; cleanup' EXIT

run redis
run fencegate "$TMPDIR_BENCH/bin/redis-server"
printf '%s\n' "${ARTEFACTS[@]}" | sort >"$TMPDIR_BENCH/artefacts"
extra=$(comm -13 "$TMPDIR_BENCH/redis.failed" "$TMPDIR_BENCH/fencegate.failed" |
  comm -23 - "$TMPDIR_BENCH/artefacts")
if [ -n "$extra" ]; then
  echo "failed through fencegate only:"
  echo "$extra" | sed 's/^/  /'
  echo "---- fencegate warnings and errors ----"
  tail -n 40 "$TMPDIR_BENCH/fencegate.log"
  exit 1
fi
echo "every test that passed against Redis passed through fencegate" \
  "(but for the connected_clients counts of t/50-fork_safe.t)"
