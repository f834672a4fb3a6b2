#!/usr/bin/env bash
# bench_proxy.sh - throughput of direct Redis vs. fencegate vs. twemproxy (nutcracker).
#
# Usage: tests/bench/bench_proxy.sh [--requests N] [--bin PATH] [--pin]
#
# Starts one redis-server, fencegate in front of it and nutcracker in front of the same
# Redis, all on 127.0.0.1 free ports inside a temp dir, then runs redis-benchmark
# (-c 50, GET and SET, unpipelined and -P 16; then SET and GET of 100 KB values from 10
# clients, with N/10 requests, and of 16 KB values -c 50 -P 16, with N/4) against each
# target. Targets are interleaved (rotating order) and every measurement is repeated 3
# times; the median is reported, with the median p50 latency of each cell and the CPU time
# each request cost the proxy and Redis (from /proc, so less noisy than ops/s). Also reports
# fencegate's idle RSS before and after the load. --pin runs redis-server and the proxies on
# CPU 0 and redis-benchmark on the other CPUs (see tests/bench/README.md, "CPU layout").
#
# Exit status: 0 when the measurement completed (even if a performance target FAILs);
# non-zero when a process fails to start, dies, or a benchmark run errors out.
# See tests/bench/README.md.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)

# 300000 requests per run -> 36 runs take about 2.5-3.5 minutes on a 2-core box
# (unpipelined runs dominate: ~40-50k ops/s each).
REQUESTS=300000
BIN="$REPO_ROOT/build/bin/fencegate"
REPS=3             # repetitions per (workload, target); the median is reported
CLIENTS=50
BIG_CLIENTS=10     # the large-value rows: BIG_CLIENTS clients, values of BIG_SIZE bytes,
BIG_SIZE=100000    # and a tenth of the requests
MID_SIZE=16384     # the pipelined large-value rows: -c CLIENTS -P PIPELINE, a quarter of the requests

PIPELINE=16
PIN=0              # --pin: servers on CPU 0, the load elsewhere (lib.sh)
RUN_TIMEOUT=180    # seconds; upper bound for a single redis-benchmark run
START_TIMEOUT=10   # seconds; upper bound for each process to become ready
IDLE_RSS_TARGET_KIB=4096
# twemproxy server_connections (see the nutcracker section below); override only to
# experiment, e.g. FG_BENCH_NC_SERVER_CONNECTIONS=50 to give it one connection per client.
NC_SERVER_CONNECTIONS=${FG_BENCH_NC_SERVER_CONNECTIONS:-1}

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --requests) [ $# -ge 2 ] || usage 2; REQUESTS=$2; shift 2 ;;
    --requests=*) REQUESTS=${1#*=}; shift ;;
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    --bin=*) BIN=${1#*=}; shift ;;
    --pin) PIN=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "bench_proxy.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "bench_proxy.sh: error: $*" >&2; exit 1; }
log() { echo "[bench] $*" >&2; }

case "$NC_SERVER_CONNECTIONS" in ''|*[!0-9]*) die "FG_BENCH_NC_SERVER_CONNECTIONS must be a positive integer" ;; esac
case "$REQUESTS" in ''|*[!0-9]*) die "--requests must be a positive integer" ;; esac
[ "$REQUESTS" -gt 0 ] || die "--requests must be a positive integer"
BIG_REQUESTS=$(( REQUESTS >= 10 ? REQUESTS / 10 : 1 ))
MID_REQUESTS=$(( REQUESTS >= 4 ? REQUESTS / 4 : 1 ))
[ -x "$BIN" ] || die "fencegate binary not found or not executable: $BIN (build it, or pass --bin PATH)"
for tool in redis-server redis-cli redis-benchmark nutcracker python3 curl timeout; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found in PATH: $tool"
done

# ---------------------------------------------------------------- processes & cleanup
TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-bench.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pin_setup

hwm_kib() {  # peak RSS (VmHWM) of a PID in KiB
  awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo "?"
}
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() {  # user + system CPU time of a PID, in clock ticks (fields 14 and 15 of stat)
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}
us_per_req() {  # us_per_req TICKS REQUESTS -> microseconds of CPU per request
  awk -v t="$1" -v hz="$CLK_TCK" -v n="$2" 'BEGIN {printf "%.2f", t * 1e6 / hz / n}'
}

read -r REDIS_PORT FG_PORT FG_HTTP_PORT NC_PORT NC_STATS_PORT <<<"$(free_ports 5)"

# ---- redis-server: no persistence, so disk I/O does not pollute the numbers.
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMPDIR_BENCH" \
  --save '' --appendonly no --daemonize no --logfile "$TMPDIR_BENCH/redis.log" &
REDIS_PID=$!; PIDS+=("$REDIS_PID")
pin_server "$REDIS_PID"
wait_ready redis-server "$REDIS_PID" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"

# ---- fencegate: transparent proxy, no protect rules. The lock backend is pointed at the
# same throw-away Redis so nothing outside the temp set-up (e.g. a Redis on 6379) is touched.
"$BIN" --resp "127.0.0.1:$FG_PORT" --http "127.0.0.1:$FG_HTTP_PORT" \
  --upstream "redis://127.0.0.1:$REDIS_PORT" --backend "redis://127.0.0.1:$REDIS_PORT" \
  >"$TMPDIR_BENCH/fencegate.log" 2>&1 &
FG_PID=$!; PIDS+=("$FG_PID")
pin_server "$FG_PID"
wait_ready fencegate "$FG_PID" "$TMPDIR_BENCH/fencegate.log" http_ready "$FG_HTTP_PORT"
# Idle RSS right after start-up: the only client so far was the one /readyz probe.
sleep 1
FG_RSS_IDLE_START=$(rss_kib "$FG_PID")
wait_ready fencegate "$FG_PID" "$TMPDIR_BENCH/fencegate.log" redis_ping "$FG_PORT"

# ---- nutcracker (twemproxy)
# Configuration chosen to be fair to twemproxy, i.e. how it is normally deployed:
#  * server_connections: 1 (the documented default). twemproxy multiplexes all client
#    requests onto its server connection(s) and pipelines them; one connection per
#    server is the standard, recommended set-up and what its published numbers use.
#  * preconnect: true, so the first measured run does not pay for connecting.
#  * no timeout / auto_eject_hosts: nothing fails here, and fencegate has neither.
#  * default mbuf size (16 KiB): plenty for 3-byte values; a smaller mbuf only saves memory.
#  * hash/distribution are irrelevant with a single server; defaults kept.
cat >"$TMPDIR_BENCH/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$NC_PORT
  redis: true
  preconnect: true
  server_connections: $NC_SERVER_CONNECTIONS
  hash: fnv1a_64
  distribution: ketama
  servers:
   - 127.0.0.1:$REDIS_PORT:1
EOF
nutcracker -t -c "$TMPDIR_BENCH/nutcracker.yml" >"$TMPDIR_BENCH/nutcracker-t.log" 2>&1 \
  || { show_log "nutcracker -t" "$TMPDIR_BENCH/nutcracker-t.log"; die "nutcracker rejected its config"; }
nutcracker -c "$TMPDIR_BENCH/nutcracker.yml" -s "$NC_STATS_PORT" -a 127.0.0.1 \
  -o "$TMPDIR_BENCH/nutcracker.log" -p "$TMPDIR_BENCH/nutcracker.pid" &
NC_PID=$!; PIDS+=("$NC_PID")
pin_server "$NC_PID"
wait_ready nutcracker "$NC_PID" "$TMPDIR_BENCH/nutcracker.log" redis_ping "$NC_PORT"

# ---------------------------------------------------------------- benchmark helpers
declare -A PORT=([direct]=$REDIS_PORT [fencegate]=$FG_PORT [twemproxy]=$NC_PORT)
declare -A PROXY_PID=([direct]="" [fencegate]=$FG_PID [twemproxy]=$NC_PID)
CHECK_FILE="$TMPDIR_BENCH/check_failures"   # bench() runs in $(...) subshells: record in a file
: >"$CHECK_FILE"

# Calls of one command as counted by Redis itself (INFO commandstats), from the
# direct connection. Used to check that every request really reached Redis, so that
# a proxy answering with errors (which redis-benchmark does not print by default)
# cannot look fast.
redis_calls() {  # redis_calls get|set
  timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" info commandstats 2>/dev/null \
    | tr -d '\r' | awk -F'[:=,]' -v c="cmdstat_$1" '$1 == c {print $3; found=1} END {if (!found) print 0}'
}

all_alive() {
  local name
  for name in redis-server:"$REDIS_PID" fencegate:"$FG_PID" nutcracker:"$NC_PID"; do
    kill -0 "${name#*:}" 2>/dev/null || die "${name%%:*} (pid ${name#*:}) died during the benchmark"
  done
}

# bench TARGET CMD PIPELINE N [CLIENTS [VALUE-BYTES]] -> prints "ops/s p50-latency-ms
# proxy-cpu-us redis-cpu-us" (CPU per request in microseconds; the proxy's is "-" for direct).
bench() {
  local target=$1 cmd=$2 pipe=$3 n=$4 clients=${5:-$CLIENTS} size=${6:-3} out before after rps p50
  local ppid=${PROXY_PID[$target]} p0=0 p1=0 r0 r1 pcpu
  local -a pargs=()
  [ "$pipe" -gt 1 ] && pargs=(-P "$pipe")
  before=$(redis_calls "$cmd")
  r0=$(cpu_ticks "$REDIS_PID")
  [ -n "$ppid" ] && p0=$(cpu_ticks "$ppid")
  if ! out=$(timeout "$RUN_TIMEOUT" "${LOAD[@]}" redis-benchmark -h 127.0.0.1 -p "${PORT[$target]}" \
        -q -t "$cmd" -c "$clients" -d "$size" -n "$n" "${pargs[@]}" --csv \
        2>"$TMPDIR_BENCH/bench.err"); then
    all_alive
    cat "$TMPDIR_BENCH/bench.err" >&2
    die "redis-benchmark against $target failed or timed out (${RUN_TIMEOUT}s)"
  fi
  all_alive
  r1=$(cpu_ticks "$REDIS_PID")
  [ -n "$ppid" ] && p1=$(cpu_ticks "$ppid")
  after=$(redis_calls "$cmd")
  # CSV: header line, then "GET","43554.01","avg","min","p50",... (ops/s, then ms)
  rps=$(printf '%s\n' "$out" | awk -F'"' -v c="${cmd^^}" '$2 == c {print $4; exit}')
  p50=$(printf '%s\n' "$out" | awk -F'"' -v c="${cmd^^}" '$2 == c {print $10; exit}')
  case "$rps$p50" in ''|*[!0-9.]*)
    printf '%s\n' "$out" >&2; die "could not parse redis-benchmark output for $target" ;;
  esac
  if [ $((after - before)) -lt "$n" ]; then
    echo "$target ${cmd^^} P=$pipe: Redis counted $((after - before)) of $n requests" >>"$CHECK_FILE"
  fi
  pcpu=-
  [ -n "$ppid" ] && pcpu=$(us_per_req $((p1 - p0)) "$n")
  printf '%s %s %s %s\n' "$rps" "$p50" "$pcpu" "$(us_per_req $((r1 - r0)) "$n")"
}

median() {  # median of the arguments (numeric)
  printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'
}

# ---------------------------------------------------------------- header
NPROC=$(nproc)
echo "fencegate proxy benchmark  ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
echo "  host:            $(uname -srm), nproc=$NPROC"
echo "  redis-server:    $(redis-server --version | head -n1)"
echo "  redis-benchmark: $(redis-benchmark --version 2>&1 | head -n1)"
echo "  nutcracker:      $(nutcracker --version 2>&1 | head -n1) (server_connections: $NC_SERVER_CONNECTIONS, preconnect: true)"
echo "  fencegate:       $BIN ($(timeout 5 "$BIN" --version 2>&1 | head -n1 || true))"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
echo "  loadavg at start: $LOAD_START$(awk -v l="${LOAD_START%% *}" -v n="$NPROC" 'BEGIN {if (l > n / 2) printf "  (WARNING: machine busy, numbers will be noisy)"}')"
echo "  load:            redis-benchmark -c $CLIENTS -n $REQUESTS [-P $PIPELINE]; -c $BIG_CLIENTS -d $BIG_SIZE -n $BIG_REQUESTS;"
echo "                   -c $CLIENTS -d $MID_SIZE -P $PIPELINE -n $MID_REQUESTS"
echo "                   $REPS runs per cell (interleaved), median shown"
echo "  CPU layout:      $(cpu_layout)"
echo "  fencegate idle RSS after start-up: ${FG_RSS_IDLE_START} KiB"
echo

# Warm-up (not measured): creates the benchmark key so GETs hit, opens connections,
# and faults in the proxies' buffers once.
log "warm-up"
for t in direct fencegate twemproxy; do
  bench "$t" set 1 "$(( REQUESTS < 20000 ? REQUESTS : 20000 ))" >/dev/null
  bench "$t" get "$PIPELINE" "$(( REQUESTS < 20000 ? REQUESTS : 20000 ))" >/dev/null
done

# ---------------------------------------------------------------- measurements
# "CMD PIPELINE CLIENTS VALUE-BYTES REQUESTS"; the targets are about the first four rows, the
# large values (BIG_SIZE bytes from BIG_CLIENTS clients; MID_SIZE bytes pipelined) have none.
WORKLOADS=("get 1 $CLIENTS 3 $REQUESTS" "set 1 $CLIENTS 3 $REQUESTS"
  "get $PIPELINE $CLIENTS 3 $REQUESTS" "set $PIPELINE $CLIENTS 3 $REQUESTS"
  "set 1 $BIG_CLIENTS $BIG_SIZE $BIG_REQUESTS" "get 1 $BIG_CLIENTS $BIG_SIZE $BIG_REQUESTS"
  "set $PIPELINE $CLIENTS $MID_SIZE $MID_REQUESTS" "get $PIPELINE $CLIENTS $MID_SIZE $MID_REQUESTS")
label() {  # label CMD PIPELINE CLIENTS VALUE-BYTES
  local l="${1^^} -c$3"
  [ "$4" != 3 ] && l+=" -d $4"
  if [ "$2" -gt 1 ]; then l+=" -P $2"; else l+=" unpipelined"; fi
  printf '%s' "$l"
}
TARGETS=(direct fencegate twemproxy)
declare -A MED LAT PCPU RCPU
start_time=$SECONDS
for w in "${WORKLOADS[@]}"; do
  read -r cmd pipe clients size n <<<"$w"
  declare -A samples=([direct]="" [fencegate]="" [twemproxy]="") lats=() pcpus=() rcpus=()
  for ((r = 0; r < REPS; r++)); do
    # rotate the order each repetition so slow drift (thermal, page cache, other
    # tenants) does not always hit the same target
    for ((i = 0; i < ${#TARGETS[@]}; i++)); do
      t=${TARGETS[$(( (i + r) % ${#TARGETS[@]} ))]}
      read -r v l pc rc <<<"$(bench "$t" "$cmd" "$pipe" "$n" "$clients" "$size")"
      log "$(printf '%s run %d/%d %-9s %12s ops/s  p50 %s ms  CPU/req proxy %s us, redis %s us' \
        "$(label "$cmd" "$pipe" "$clients" "$size")" $((r + 1)) "$REPS" "$t" "$v" "$l" "$pc" "$rc")"
      samples[$t]+="$v "
      lats[$t]+="$l "
      pcpus[$t]+="$pc "
      rcpus[$t]+="$rc "
    done
  done
  for t in "${TARGETS[@]}"; do
    # shellcheck disable=SC2086
    MED["$w/$t"]=$(median ${samples[$t]})
    # shellcheck disable=SC2086
    LAT["$w/$t"]=$(median ${lats[$t]})
    # shellcheck disable=SC2086
    RCPU["$w/$t"]=$(median ${rcpus[$t]})
    # shellcheck disable=SC2086
    [ "$t" = direct ] || PCPU["$w/$t"]=$(median ${pcpus[$t]})
  done
  unset samples lats pcpus rcpus
done
elapsed=$((SECONDS - start_time))

# Idle RSS after the load, once every benchmark client has disconnected and fencegate's
# one-second idle tick has handed freed memory back (proxy/heap.c).
sleep 2
FG_RSS_IDLE_END=$(rss_kib "$FG_PID")
FG_HWM=$(hwm_kib "$FG_PID")
NC_RSS_END=$(rss_kib "$NC_PID")

# ---------------------------------------------------------------- report
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.3f", a / b; else print "n/a"}'; }
ge()    { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a >= b)}'; }

printf '%-30s | %12s | %15s | %8s | %15s | %8s | %s\n' \
  "workload" "direct ops/s" "fencegate ops/s" "fg/dir" "twemproxy ops/s" "tw/dir" "fg >= tw?"
printf '%s\n' "-------------------------------+--------------+-----------------+----------+-----------------+----------+----------"
pass_unpiped=PASS; pass_piped=PASS; pass_tw=PASS
for w in "${WORKLOADS[@]}"; do
  read -r cmd pipe clients size n <<<"$w"
  d=${MED["$w/direct"]}; f=${MED["$w/fencegate"]}; n=${MED["$w/twemproxy"]}
  rf=$(ratio "$f" "$d"); rn=$(ratio "$n" "$d")
  if ge "$f" "$n"; then beat=yes; else beat=no; fi
  if [ "$size" = 3 ]; then
    [ "$beat" = yes ] || pass_tw=FAIL
    if [ "$pipe" -gt 1 ]; then ge "$rf" 0.75 || pass_piped=FAIL; else ge "$rf" 0.90 || pass_unpiped=FAIL; fi
  fi
  printf '%-30s | %12.0f | %15.0f | %8s | %15.0f | %8s | %s\n' \
    "$(label "$cmd" "$pipe" "$clients" "$size")" "$d" "$f" "$rf" "$n" "$rn" "$beat"
done
echo
echo "p50 latency in ms (median of the runs' p50s; informational, no target):"
for w in "${WORKLOADS[@]}"; do
  read -r cmd pipe clients size n <<<"$w"
  label=$(label "$cmd" "$pipe" "$clients" "$size")
  printf '  %-30s direct %6s   fencegate %6s   twemproxy %6s\n' "$label" \
    "${LAT["$w/direct"]}" "${LAT["$w/fencegate"]}" "${LAT["$w/twemproxy"]}"
done
echo
echo "CPU per request in us (median of the runs; informational: the proxies' own cost, less"
echo "subject to scheduling than ops/s; Redis's share shows what the proxy's batching saves it):"
for w in "${WORKLOADS[@]}"; do
  read -r cmd pipe clients size n <<<"$w"
  label=$(label "$cmd" "$pipe" "$clients" "$size")
  printf '  %-30s fencegate %6s  twemproxy %6s   redis behind: direct %s  fencegate %s  twemproxy %s\n' \
    "$label" "${PCPU["$w/fencegate"]}" "${PCPU["$w/twemproxy"]}" \
    "${RCPU["$w/direct"]}" "${RCPU["$w/fencegate"]}" "${RCPU["$w/twemproxy"]}"
done
echo
echo "targets:"
echo "  GET/SET -c$CLIENTS unpipelined: fencegate/direct >= 0.90   $pass_unpiped"
echo "  GET/SET -c$CLIENTS with -P $PIPELINE:  fencegate/direct >= 0.75   $pass_piped"
echo "  fencegate >= twemproxy on each of those rows    $pass_tw"
rss_status() { if [ "$1" != "?" ] && [ "$1" -le "$IDLE_RSS_TARGET_KIB" ]; then echo PASS; else echo FAIL; fi; }
printf '  fencegate idle RSS after start-up:  %6s KiB (%s MiB) <= 4 MiB   %s\n' \
  "$FG_RSS_IDLE_START" "$(awk -v k="$FG_RSS_IDLE_START" 'BEGIN {printf "%.2f", k/1024}')" "$(rss_status "$FG_RSS_IDLE_START")"
printf '  fencegate idle RSS after the load:  %6s KiB (%s MiB) <= 4 MiB   %s\n' \
  "$FG_RSS_IDLE_END" "$(awk -v k="$FG_RSS_IDLE_END" 'BEGIN {printf "%.2f", k/1024}')" "$(rss_status "$FG_RSS_IDLE_END")"
echo "  (info) fencegate peak RSS (VmHWM): $FG_HWM KiB; nutcracker RSS after the load: $NC_RSS_END KiB"
echo
if [ ! -s "$CHECK_FILE" ]; then
  echo "request check: every run's requests were counted by Redis (INFO commandstats)"
else
  echo "request check: WARNING - some runs did not reach Redis in full; their ops/s are not trustworthy:"
  sed 's/^/  /' "$CHECK_FILE"
fi
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "measured in ${elapsed}s; $(cpu_layout)"
exit 0
