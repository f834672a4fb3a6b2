#!/usr/bin/env bash
# redigo_suite.sh - the test suite of redigo (Go's github.com/gomodule/redigo, Debian's
# golang-github-gomodule-redigo-dev) against redis-server, then through fencegate: every test
# that passes against Redis must pass through fencegate too.
#
# Usage: tests/compat/redigo_suite.sh [--bin PATH] [--protect] [--src DIR]
#
# Fetches the source of the archive's redigo version from Debian's archive (or uses --src DIR, a
# redigo tree with redis/test_test.go): the orig tarball, or, where the archive lacks it, the -dev
# package, which ships the tests. Builds the tests of package redis with Debian's Go in GOPATH mode
# (testify from /usr/share/gocode; no module proxy). The tests start one redis-server of their own
# (-redis-server PATH, on the port -redis-port names); the second run gives them a stand-in
# redis-server that starts the real one on another free 127.0.0.1 port and fencegate on the tests'
# port, and stops both when the tests stop it (SIGINT) or either exits. Package redisx's one test
# reaches no server and is not run; none of package redis's is skipped, and 56 of its 97 (parsing,
# URLs, TLS and ACL dialing on connections faked in memory) reach no server either. --protect gives
# fencegate a protect rule on keys the tests never use, so that every write goes through fencing's
# classification. Prints both runs' failures; exits 1 when fencegate fails a test that Redis passed,
# but for TestSlowLog: it sets slowlog-log-slower-than to 0 and expects the slow log's last entry to
# be that CONFIG SET, so it fails (a panic: its own binary here) when another client's command comes
# between, and fencegate's probe connection sends PING and INFO memory once a second (seen: the last
# entries INFO memory, PING, then the test's CONFIG SET, the first two from fencegate's probe
# address; run alone back to back it failed after 1683, 2813, 4681 and 35801 passes, and once in 60
# runs of the whole suite). About 20 seconds; needs curl, xz-utils, dpkg-deb and Debian's Go
# (apt-get install golang-go golang-github-stretchr-testify-dev redis-server curl xz-utils).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
PROTECT=0
SRC=""
# Failures through fencegate that are not Redis behaviour (see the header).
ARTEFACTS=(
  TestSlowLog # fencegate's probe (PING, INFO memory) came between CONFIG SET and SLOWLOG GET
)
PKGS="golang-go golang-github-stretchr-testify-dev redis-server curl xz-utils"

usage() {
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --src) [ $# -ge 2 ] || usage 2; SRC=$2; shift 2 ;;
    --protect) PROTECT=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "redigo_suite.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "redigo_suite.sh: error: $*" >&2; exit 1; }
for tool in redis-server redis-cli go curl xz dpkg-deb python3 apt-cache; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "required tool not found: $tool (apt-get install $PKGS)"
done
[ -d /usr/share/gocode/src/github.com/stretchr/testify/require ] ||
  die "testify missing from /usr/share/gocode (apt-get install golang-github-stretchr-testify-dev)"
[ -x "$BIN" ] || die "fencegate binary not found: $BIN (build it, or pass --bin)"
BIN=$(cd -- "$(dirname -- "$BIN")" && pwd)/$(basename -- "$BIN")

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-redigo-suite.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$REPO_ROOT/tests/bench/lib.sh"

GOPATH_DIR="$TMPDIR_BENCH/gopath"
PKG_DIR="$GOPATH_DIR/src/github.com/gomodule/redigo"
mkdir -p "$(dirname -- "$PKG_DIR")"
if [ -z "$SRC" ]; then
  # 1:1.8.3-1 -> 1.8.3
  full=$(apt-cache show golang-github-gomodule-redigo-dev 2>/dev/null |
    sed -n 's/^Version: //p' | head -n 1)
  version=$(echo "$full" | sed 's/^[0-9]*://; s/-[^-]*$//')
  [ -n "$version" ] ||
    die "cannot tell golang-github-gomodule-redigo-dev's version (apt-get update first)"
  pool=http://deb.debian.org/debian/pool/main/g/golang-github-gomodule-redigo
  url="$pool/golang-github-gomodule-redigo_${version}.orig.tar.xz"
  echo "fetching $url" >&2
  mkdir -p "$TMPDIR_BENCH/orig"
  if curl -fsS --max-time 300 -o "$TMPDIR_BENCH/redigo.tar.xz" "$url" 2>/dev/null; then
    tar -xJf "$TMPDIR_BENCH/redigo.tar.xz" -C "$TMPDIR_BENCH/orig"
    found=$(find "$TMPDIR_BENCH/orig" -path '*/redis/test_test.go' | head -n 1)
    [ -n "$found" ] || die "no redigo tests in $url"
    mv "$(dirname -- "$(dirname -- "$found")")" "$PKG_DIR"
  else
    # The archive's -dev package holds the whole tree, tests included.
    deb=$(apt-cache show golang-github-gomodule-redigo-dev | sed -n 's/^Filename: //p' |
      head -n 1)
    url="http://deb.debian.org/debian/$deb"
    echo "no orig tarball; fetching $url" >&2
    curl -fsS --max-time 300 -o "$TMPDIR_BENCH/redigo.deb" "$url" || die "cannot fetch $url"
    dpkg-deb -x "$TMPDIR_BENCH/redigo.deb" "$TMPDIR_BENCH/orig"
    mv "$TMPDIR_BENCH/orig/usr/share/gocode/src/github.com/gomodule/redigo" "$PKG_DIR"
  fi
else
  cp -r "$SRC" "$PKG_DIR"
fi
[ -f "$PKG_DIR/redis/test_test.go" ] || die "no redigo tests in ${SRC:-the fetched source}"

# GOPATH mode: Debian's Go packages are in /usr/share/gocode, and no module proxy is reachable.
export GO111MODULE=off GOFLAGS='' GOPROXY=off GOPATH="$GOPATH_DIR:/usr/share/gocode"
export GOCACHE="$TMPDIR_BENCH/gocache"
(cd "$PKG_DIR/redis" && timeout 600 go test -c -o "$TMPDIR_BENCH/redis.test" .) \
  >"$TMPDIR_BENCH/build.log" 2>&1 ||
  { show_log "go test -c" "$TMPDIR_BENCH/build.log"; die "building redigo's tests failed"; }
"$TMPDIR_BENCH/redis.test" -test.list '^(Test|Example)' >"$TMPDIR_BENCH/tests" ||
  die "cannot list redigo's tests"

# The stand-in redis-server, called as test_test.go's NewServer does: --port P --bind A --save
# '' --appendonly no. The tests wait for Redis's 'Ready to accept connections' on its standard
# output and stop it with SIGINT. Each one appends its two pids to $FG_PIDS, so that the end of
# this script stops them whatever happened to the tests.
mkdir -p "$TMPDIR_BENCH/bin"
cat >"$TMPDIR_BENCH/bin/redis-server" <<'EOF'
#!/usr/bin/env bash
set -u
args=("$@")
port=""
pi=-1
for ((i = 0; i < ${#args[@]} - 1; i++)); do
  [ "${args[i]}" = --port ] && pi=$((i + 1)) && port=${args[pi]}
done
[ -n "$port" ] || { echo "stand-in redis-server: no --port"; exit 1; }
read -r rport hport <<<"$(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')"
args[pi]=$rport
redis-server "${args[@]}" >>"$FG_DIR/redis.log" 2>&1 </dev/null &
rpid=$!
echo "$rpid" >>"$FG_PIDS"
ping() { [ "$(timeout 2 redis-cli -p "$1" PING 2>/dev/null)" = PONG ]; }
for _ in $(seq 200); do ping "$rport" && break; sleep 0.05; done
ping "$rport" || { echo "stand-in redis-server: Redis on $rport did not start"; exit 1; }
yaml="$FG_DIR/fencegate.$port.yaml"
# shellcheck source=tests/compat/lib.sh
source "$FG_COMPAT_LIB"
fencegate_config "$yaml" "$port" "$hport" "$rport" "$FG_PROTECT"
"$FG_BIN" --config "$yaml" --log-level warn >>"$FG_DIR/fencegate.log" 2>&1 </dev/null &
fpid=$!
echo "$fpid" >>"$FG_PIDS"
trap 'kill $fpid $rpid 2>/dev/null; wait; exit 0' TERM INT
for _ in $(seq 200); do ping "$port" && break; sleep 0.05; done
{ ping "$port" && kill -0 $fpid; } 2>/dev/null ||
  { echo "stand-in redis-server: fencegate on $port did not start"; exit 1; }
echo "$$:M * Ready to accept connections (fencegate on $port, Redis on $rport)"
wait -n $fpid $rpid
kill $fpid $rpid 2>/dev/null
wait
EOF
chmod +x "$TMPDIR_BENCH/bin/redis-server"

# run1 OUT RUN REDIS_SERVER_PATH: the tests whose names match RUN, with a server of their own,
# bounded in time; the names of the failed ones added to OUT.failed. A test binary that stopped
# without a failed test (a panic, a timeout) adds "X".
run1() {
  local out=$1 pattern=$2 server=$3 port rc=0
  port=$(free_ports 1)
  (cd "$PKG_DIR/redis" && FG_BIN=$BIN FG_PROTECT=$PROTECT FG_COMPAT_LIB=$SCRIPT_DIR/lib.sh \
    FG_DIR=$TMPDIR_BENCH FG_PIDS="$TMPDIR_BENCH/pids" timeout -k 5 300 "$TMPDIR_BENCH/redis.test" -test.v \
    -test.count=1 -test.timeout 240s -test.run "$pattern" -redis-server "$server" \
    -redis-address 127.0.0.1 -redis-port "$port") >"$out.part" 2>&1 </dev/null || rc=$?
  if [ "$rc" != 0 ] && ! grep -aq -- '--- FAIL: ' "$out.part"; then
    echo "X" >>"$out.failed"
    echo "  the tests ($pattern) stopped with exit $rc:"; tail -n 20 "$out.part" | sed 's/^/    /'
  fi
  sed -n 's/^ *--- FAIL: \([^ ]*\).*/\1/p' "$out.part" >>"$out.failed"
  cat "$out.part" >>"$out.out"
}

# run NAME REDIS_SERVER_PATH: every test; the name of each failed test, one per line, in
# $TMPDIR_BENCH/NAME.failed. TestSlowLog runs in a binary of its own: when the slow log's last
# entry is not its own command it fails with a panic, which would end the other tests too.
run() {
  local name=$1 server=$2 out="$TMPDIR_BENCH/$1" rest
  : >"$out.out"
  : >"$out.failed"
  rest=$(grep -v '^TestSlowLog$' "$TMPDIR_BENCH/tests" | paste -sd '|')
  run1 "$out" "^($rest)\$" "$server"
  run1 "$out" '^TestSlowLog$' "$server"
  sort -u -o "$out.failed" "$out.failed"
  echo "$name: $(grep -ac '^ *--- PASS: ' "$out.out" || true) passed," \
    "$(wc -l <"$out.failed") failed, $(grep -ac '^ *--- SKIP: ' "$out.out" || true) skipped"
  sed 's/^/  failed: /' "$out.failed"
}

stop_stand_ins() {
  local pid
  [ -f "$TMPDIR_BENCH/pids" ] || return 0
  while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$TMPDIR_BENCH/pids"
}
trap 'stop_stand_ins; cleanup' EXIT

run redis "$(command -v redis-server)"
run fencegate "$TMPDIR_BENCH/bin/redis-server"
printf '%s\n' "${ARTEFACTS[@]}" | sort >"$TMPDIR_BENCH/artefacts"
extra=$(comm -13 "$TMPDIR_BENCH/redis.failed" "$TMPDIR_BENCH/fencegate.failed" |
  comm -23 - "$TMPDIR_BENCH/artefacts")
if [ -n "$extra" ]; then
  echo "failed through fencegate only:"
  echo "$extra" | sed 's/^/  /'
  echo "---- the tests' output through fencegate ----"
  grep -a -B2 -A8 -- '--- FAIL' "$TMPDIR_BENCH/fencegate.out" | head -n 80 || true
  echo "---- fencegate warnings and errors ----"
  tail -n 40 "$TMPDIR_BENCH/fencegate.log" 2>/dev/null || true
  exit 1
fi
echo "every test that passed against Redis passed through fencegate" \
  "(but for TestSlowLog, if it failed: see the header)"
