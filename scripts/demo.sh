#!/usr/bin/env bash
# The main job: the fencing story, live. Builds fencegate, starts a private redis-server and two
# sidecars on free loopback ports, freezes one sidecar past its lease while its worker holds a
# lock, and shows the stale write refused while the data stays correct. Everything stops on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" demo
cmake -S "$root" -B "$root/build" -DFG_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build" -j "$(nproc)" --target fencegate fencectl >/dev/null

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "nothing listens on 127.0.0.1:$1" >&2
    return 1
}
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

redis_port=$(free_port) resp_a=$(free_port) http_a=$(free_port) resp_b=$(free_port) http_b=$(free_port)
lease_ms=1000
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
pids+=($!)
wait_port "$redis_port"
start_sidecar() { # name resp http
    "$root/build/bin/fencegate" --resp "127.0.0.1:$2" --http "127.0.0.1:$3" \
        --upstream "redis://127.0.0.1:$redis_port" --backend "redis://127.0.0.1:$redis_port" \
        --session-ttl-ms "$lease_ms" 2>"$work/fencegate-$1.log" &
    pids+=($!)
    wait_port "$2"
    for _ in $(seq 1 50); do
        curl -sf "http://127.0.0.1:$3/readyz" >/dev/null && return 0
        sleep 0.1
    done
}
start_sidecar a "$resp_a" "$http_a"
pid_a=${pids[-1]}
start_sidecar b "$resp_b" "$http_b"

say "redis-server on :$redis_port; sidecar A on :$resp_a and sidecar B on :$resp_b (leases of $lease_ms ms)"
echo "Two workers do a read-modify-write of account:42 under a lock: A adds 10, B adds 50."
echo "Worker A stalls past its lease, so B takes over; when A wakes, it still writes."
status=0
python3 "$root/scripts/demo_story.py" "$redis_port" "$resp_a" "$resp_b" "$pid_a" "$lease_ms" || status=$?

say "What the sidecars counted (GET /metrics):"
for side in a b; do
    port=$http_a
    [ $side = b ] && port=$http_b
    echo "sidecar $side:"
    curl -s "http://127.0.0.1:$port/metrics" |
        grep -E '^fencegate_(locks_acquired|fenced_writes|stale_writes_refused|locklost_refused|locks_lost)_total ' |
        sed 's/^/  /'
done
say "The same lock over HTTP, for applications that do not speak Redis:"
run curl -s -X POST "http://127.0.0.1:$http_b/v1/locks/report" -d '{"ttl_ms":5000}'
run curl -s "http://127.0.0.1:$http_b/v1/locks"
run curl -s -X DELETE "http://127.0.0.1:$http_b/v1/locks/report"
exit $status
