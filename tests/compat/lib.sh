# lib.sh — what the compat scripts share, sourced after tests/bench/lib.sh (PIDS, wait_ready,
# redis_ping, TMPDIR_BENCH, die).
# shellcheck shell=bash

# start_fencegate BIN REDIS_PORT FG_PORT FG_HTTP_PORT PROTECT: fencegate in front of the
# redis-server on REDIS_PORT (store "cache"), logging warnings to $TMPDIR_BENCH/fencegate.log;
# with PROTECT=1 a protect rule on keys the suites never use, so that every write goes through
# fencing's classification. Returns once it answers PING.
start_fencegate() {
  local bin=$1 redis_port=$2 port=$3 http_port=$4 protect=$5
  cat >"$TMPDIR_BENCH/fencegate.yaml" <<YAML
listen: { resp: "127.0.0.1:$port", http: "127.0.0.1:$http_port" }
stores:
  - { name: cache, url: "redis://127.0.0.1:$redis_port" }
YAML
  if [ "$protect" = 1 ]; then
    # shellcheck disable=SC2016  # $1 is fencegate's capture, not the shell's
    printf 'protect:\n  - { store: cache, keys: "fencegate-suite-protected:*", lock: "p:$1" }\n' \
      >>"$TMPDIR_BENCH/fencegate.yaml"
  fi
  "$bin" --config "$TMPDIR_BENCH/fencegate.yaml" --log-level warn \
    >"$TMPDIR_BENCH/fencegate.log" 2>&1 &
  PIDS+=("$!")
  wait_ready fencegate "$!" "$TMPDIR_BENCH/fencegate.log" redis_ping "$port"
}
