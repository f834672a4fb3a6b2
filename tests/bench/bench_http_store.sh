#!/usr/bin/env bash
# bench_http_store.sh - throughput of a large body through an HTTP store route against the same
# transfer straight at the store, in one run.
#
# Usage: tests/bench/bench_http_store.sh [--bin PATH] [--mib N] [--rounds R]
#
# Starts a redis-server (lock backend and RESP upstream), tests/bench/http_sink.py (the HTTP
# store) and fencegate with that store as "blobs", all on free 127.0.0.1 ports; takes lock
# "bench" over HTTP, then, R rounds interleaved, has curl PUT an N MiB file (default 64) and GET
# N MiB, straight at the store and through /v1/stores/blobs/http/ with Fence-Lock: bench. Every
# transfer is checked: the store answers the size and sha256 of what it received, and what curl
# got is hashed. One unmeasured transfer each way and side first. Prints the median seconds and
# MB/s of each, and fencegate / direct as a ratio of throughputs. No target: a measurement (exit
# 0 unless something failed).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)
BIN="$REPO_ROOT/build/bin/fencegate"
MIB=64
ROUNDS=5
# shellcheck disable=SC2034  # read by lib.sh's wait_ready
START_TIMEOUT=20

usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}
die() { echo "bench_http_store.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --mib) [ $# -ge 2 ] || usage 2; MIB=$2; shift 2 ;;
    --rounds) [ $# -ge 2 ] || usage 2; ROUNDS=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "bench_http_store.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done
case "$MIB" in ''|*[!0-9]*) die "--mib must be a positive integer" ;; esac
case "$ROUNDS" in ''|*[!0-9]*) die "--rounds must be a positive integer" ;; esac
if [ "$MIB" -lt 1 ] || [ "$MIB" -gt 1024 ]; then die "--mib must be in 1..1024"; fi
if [ "$ROUNDS" -lt 1 ] || [ "$ROUNDS" -gt 50 ]; then die "--rounds must be in 1..50"; fi
[ -x "$BIN" ] || die "fencegate binary not found or not executable: $BIN (build it, or --bin PATH)"
for tool in redis-server redis-cli curl python3 sha256sum timeout; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found: $tool (scripts/deps.sh)"
done

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-httpbench.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
read -r REDIS_PORT STORE_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 4)"

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
  --logfile "$TMPDIR_BENCH/redis.log" &
PIDS+=("$!")
wait_ready redis-server "$!" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"
python3 "$SCRIPT_DIR/http_sink.py" "$STORE_PORT" "$MIB" >"$TMPDIR_BENCH/sink.log" 2>&1 &
PIDS+=("$!")
wait_ready http_sink "$!" "$TMPDIR_BENCH/sink.log" curl -sf -o /dev/null -X PUT -d "" \
  "http://127.0.0.1:$STORE_PORT/"
cat >"$TMPDIR_BENCH/fencegate.yaml" <<YAML
listen: { resp: "127.0.0.1:$FG_PORT", http: "127.0.0.1:$FG_HTTP_PORT" }
backend: { url: "redis://127.0.0.1:$REDIS_PORT" }
stores:
  - { name: cache, url: "redis://127.0.0.1:$REDIS_PORT" }
  - { name: blobs, url: "http://127.0.0.1:$STORE_PORT" }
YAML
"$BIN" --config "$TMPDIR_BENCH/fencegate.yaml" >"$TMPDIR_BENCH/fencegate.log" 2>&1 &
FG_PID=$!
PIDS+=("$FG_PID")
wait_ready fencegate "$FG_PID" "$TMPDIR_BENCH/fencegate.log" http_ready "$FG_HTTP_PORT"
curl -sf -X POST -d '{"ttl_ms":600000}' "http://127.0.0.1:$FG_HTTP_PORT/v1/locks/bench" \
  >/dev/null || die "cannot take lock bench through fencegate"

head -c $((MIB << 20)) /dev/urandom >"$TMPDIR_BENCH/up"
UP_SUM=$(sha256sum <"$TMPDIR_BENCH/up" | cut -d' ' -f1)
DOWN_SUM=$(python3 -c "import hashlib,sys; print(hashlib.sha256(bytes(range(256)) \
* ($MIB << 12)).hexdigest())")
DIRECT="http://127.0.0.1:$STORE_PORT/bench"
VIA="http://127.0.0.1:$FG_HTTP_PORT/v1/stores/blobs/http/bench"

# xfer put|get direct|via -> seconds, after checking what arrived
xfer() {
  local url=$DIRECT out secs got
  [ "$2" = via ] && url=$VIA
  if [ "$1" = put ]; then
    out=$(timeout 120 curl -sS -f -T "$TMPDIR_BENCH/up" -H "Fence-Lock: bench" \
      -w '\n%{time_total}' "$url") || die "PUT $2 failed"
    secs=${out##*$'\n'}
    got=${out%$'\n'*}
    [ "$got" = "$((MIB << 20)) $UP_SUM" ] || die "PUT $2: the store received '$got'"
  else
    secs=$(timeout 120 curl -sS -f -H "Fence-Lock: bench" -o "$TMPDIR_BENCH/down" \
      -w '%{time_total}' "$url") || die "GET $2 failed"
    got=$(sha256sum <"$TMPDIR_BENCH/down" | cut -d' ' -f1)
    [ "$got" = "$DOWN_SUM" ] || die "GET $2: the body arrived changed"
  fi
  kill -0 "$FG_PID" 2>/dev/null || die "fencegate died"
  echo "$secs"
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }

echo "fencegate HTTP store benchmark  ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
echo "  host: nproc=$(nproc), loadavg $(cut -d' ' -f1-3 /proc/loadavg); fencegate: $BIN"
echo "  $MIB MiB per transfer, $ROUNDS rounds, direct and through fencegate interleaved"
for side in direct via; do # warm-up, not measured: first connections, page cache, the sink's
  xfer put "$side" >/dev/null
  xfer get "$side" >/dev/null
done
declare -A T
for _ in $(seq 1 "$ROUNDS"); do
  for op in put get; do
    for side in direct via; do
      T[$op/$side]+="$(xfer "$op" "$side") "
    done
  done
done
printf '  %-4s %12s %12s %12s %12s %8s\n' "" "direct s" "direct MB/s" "fencegate s" "fg MB/s" \
  "fg/dir"
for op in put get; do
  # shellcheck disable=SC2086  # the samples are space-separated on purpose
  d=$(median ${T[$op/direct]}) && v=$(median ${T[$op/via]})
  awk -v op="$op" -v d="$d" -v v="$v" -v b=$((MIB << 20)) 'BEGIN {
    printf "  %-4s %12.3f %12.0f %12.3f %12.0f %8.2f\n", toupper(op), d, b / d / 1e6,
      v, b / v / 1e6, d / v }'
done
echo "  (medians; fg/dir is the throughput through fencegate over straight at the store)"
