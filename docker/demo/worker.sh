#!/bin/sh
# Demo application of docker/compose.yaml: a worker in the redis:7 image that talks only to its
# fencegate sidecar on 127.0.0.1:6380 (they share a network namespace, as in a pod). Each round
# takes lock account:42, adds to account:42 and records itself in last-writer:42, then releases.
# Bounded: ROUNDS rounds (default 600, one a second), then it exits.
set -eu
me=${WORKER:-worker}
rounds=${ROUNDS:-600}
port=${SIDECAR_PORT:-6380} # the sidecar's Redis endpoint
cli() { redis-cli -h 127.0.0.1 -p "$port" "$@"; }

tries=0
until [ "$(cli PING 2>/dev/null)" = PONG ]; do
    tries=$((tries + 1))
    if [ "$tries" -gt 120 ]; then
        echo "$me: no answer from the sidecar on 127.0.0.1:$port after 120 s" >&2
        exit 1
    fi
    sleep 1
done

echo "$me: a write to a protected key without its lock is refused by the sidecar:"
cli SET account:42 0 || true

n=0
while [ "$n" -lt "$rounds" ]; do
    n=$((n + 1))
    # One redis-cli run is one connection, and a connection is one lock session: the lock is held
    # from FENCE.ACQUIRE to FENCE.RELEASE, and both writes are fenced with its token
    # (account:42 by the protect rule, last-writer:42 by the one-lock rule).
    out=$(printf '%s\n' 'FENCE.ACQUIRE account:42 TTL 5000 WAIT 5000' 'INCRBY account:42 1' \
        "SET last-writer:42 $me" 'FENCE.RELEASE account:42' | cli 2>&1 | tr '\n' ' ')
    echo "$me round $n: token, INCRBY, SET, RELEASE -> $out"
    sleep 1
done
echo "$me: done after $rounds rounds; account:42 = $(cli GET account:42)"
