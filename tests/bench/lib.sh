# lib.sh — what the benchmark scripts share: process cleanup, free ports, readiness waits, RSS.
# Sourced after TMPDIR_BENCH is set; uses the caller's die() and START_TIMEOUT.
# shellcheck shell=bash
PIDS=()            # every process we started, stopped by cleanup()

# shellcheck disable=SC2317  # invoked via trap
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    # bounded wait (2 s), then SIGKILL
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf -- "$TMPDIR_BENCH"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# N distinct free TCP ports on 127.0.0.1 (all held open until all are chosen).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

show_log() {  # show_log NAME FILE
  echo "---- last lines of $1 log ($2) ----" >&2
  tail -n 20 "$2" >&2 2>/dev/null || true
}

# wait_ready NAME PID LOG CMD...  : poll CMD until it succeeds; fail if PID dies or time runs out.
wait_ready() {
  local name=$1 pid=$2 logf=$3; shift 3
  local deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      show_log "$name" "$logf"; die "$name exited during start-up"
    fi
    if "$@" >/dev/null 2>&1; then return 0; fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      show_log "$name" "$logf"; die "$name not ready after ${START_TIMEOUT}s"
    fi
    sleep 0.1
  done
}

# shellcheck disable=SC2317  # invoked via wait_ready
redis_ping() { [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ]; }
# shellcheck disable=SC2317  # invoked via wait_ready
http_ready() { [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/readyz")" = "200" ]; }

rss_kib() {  # VmRSS of a PID in KiB ("?" once it has gone)
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo "?"
}

# --pin: the servers under test (redis-server and the proxies, every thread of them) run on
# CPU 0 and the load generator on the other CPUs, so that the load generator never takes CPU
# time from what it measures. Unpinned, the scheduler decides which two of the three processes
# share a CPU, and a proxy's ratio to direct swings with that choice (tests/bench/README.md,
# "CPU layout"). The caller sets PIN (0, or 1 for --pin) before sourcing this; LOAD prefixes
# load-generator commands, LOAD_CPUS names their CPUs.
LOAD=()
LOAD_CPUS=
pin_setup() {
  local n
  [ "$PIN" = 1 ] || return 0
  n=$(nproc)
  [ "$n" -ge 2 ] || die "--pin needs at least 2 CPUs (this machine has $n)"
  command -v taskset >/dev/null 2>&1 || die "--pin needs taskset (Debian: util-linux)"
  LOAD_CPUS="1-$((n - 1))"
  # shellcheck disable=SC2034  # used by the scripts that source this
  LOAD=(taskset -c "$LOAD_CPUS")
}
pin_server() {  # pin_server PID: all its threads, and those it starts later, on CPU 0
  [ "$PIN" = 1 ] || return 0
  taskset -a -p -c 0 "$1" >/dev/null || die "cannot pin PID $1 to CPU 0"
}
cpu_layout() {  # one line saying where the processes run
  if [ "$PIN" = 1 ]; then
    echo "redis-server and the proxies on CPU 0, the load generator on CPUs $LOAD_CPUS (--pin)"
  else
    echo "redis-server, the proxies and the load generator all share $(nproc) CPU(s) (unpinned)"
  fi
}
