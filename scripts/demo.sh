#!/usr/bin/env bash
# The main job: builds fencegate, starts a private redis-server and fencegate in front of it on
# free loopback ports, and shows application traffic going through. Everything stops on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" demo
cmake -S "$root" -B "$root/build" -DFG_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build" -j "$(nproc)" --target fencegate >/dev/null

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

redis_port=$(free_port) resp_port=$(free_port) http_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
pids+=($!)
wait_port "$redis_port"
"$root/build/bin/fencegate" --resp "127.0.0.1:$resp_port" --http "127.0.0.1:$http_port" \
    --upstream "redis://127.0.0.1:$redis_port" 2>"$work/fencegate.log" &
pids+=($!)
wait_port "$resp_port"
for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null && break
    sleep 0.1
done

say "redis-server on 127.0.0.1:$redis_port; fencegate in front of it on 127.0.0.1:$resp_port (HTTP :$http_port)"
say "The application talks to fencegate exactly as it would talk to Redis:"
run redis-cli -p "$resp_port" SET greeting "hello through fencegate"
run redis-cli -p "$resp_port" GET greeting
say "A pipeline, a transaction and a database switch keep Redis's semantics:"
printf 'SELECT 3\r\nSET n 1\r\nMULTI\r\nINCR n\r\nINCR n\r\nEXEC\r\nGET n\r\n' |
    run redis-cli -p "$resp_port"
say "Malformed input is answered like Redis answers it, and only that connection closes:"
echo "\$ printf '*1\\r\\n\$99999999999\\r\\n' > /dev/tcp/127.0.0.1/$resp_port"
exec 3<>"/dev/tcp/127.0.0.1/$resp_port"
printf '*1\r\n$99999999999\r\n' >&3
timeout 2 cat <&3 || true
exec 3<&-
run redis-cli -p "$resp_port" PING
say "Health and metrics on the HTTP endpoint:"
run curl -s "http://127.0.0.1:$http_port/readyz"
curl -s "http://127.0.0.1:$http_port/metrics" | grep -E '^fencegate_(connections_accepted|commands_forwarded|protocol_errors)_total '
say "fencegate's log:"
cat "$work/fencegate.log"
