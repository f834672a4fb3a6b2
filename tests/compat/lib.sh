# lib.sh — what the compat scripts share, sourced after tests/bench/lib.sh (PIDS, wait_ready,
# redis_ping, TMPDIR_BENCH, die).
# shellcheck shell=bash

# fencegate_config FILE PORT HTTP_PORT REDIS_PORT PROTECT: writes the config of a fencegate on
# 127.0.0.1:PORT (HTTP on HTTP_PORT) in front of the redis-server on REDIS_PORT (store "cache");
# with PROTECT=1 a protect rule on keys the suites never use, so that every write goes through
# fencing's classification. The suites' stand-in redis-servers source this file for it too.
fencegate_config() {
  local file=$1 port=$2 http_port=$3 redis_port=$4 protect=$5
  printf 'listen: { resp: "127.0.0.1:%s", http: "127.0.0.1:%s" }\n' "$port" "$http_port" >"$file"
  printf 'stores:\n  - { name: cache, url: "redis://127.0.0.1:%s" }\n' "$redis_port" >>"$file"
  if [ "$protect" = 1 ]; then
    # shellcheck disable=SC2016  # $1 is fencegate's capture, not the shell's
    printf 'protect:\n  - { store: cache, keys: "fencegate-suite-protected:*", lock: "p:$1" }\n' \
      >>"$file"
  fi
}

# start_fencegate BIN REDIS_PORT FG_PORT FG_HTTP_PORT PROTECT: fencegate_config's fencegate,
# logging warnings to $TMPDIR_BENCH/fencegate.log. Returns once it answers PING.
start_fencegate() {
  local bin=$1 redis_port=$2 port=$3 http_port=$4 protect=$5
  fencegate_config "$TMPDIR_BENCH/fencegate.yaml" "$port" "$http_port" "$redis_port" "$protect"
  "$bin" --config "$TMPDIR_BENCH/fencegate.yaml" --log-level warn \
    >"$TMPDIR_BENCH/fencegate.log" 2>&1 &
  PIDS+=("$!")
  wait_ready fencegate "$!" "$TMPDIR_BENCH/fencegate.log" redis_ping "$port"
}
