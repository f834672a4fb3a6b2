#!/usr/bin/env bash
# bench_pg.sh - cost of fenced SQL: one UPDATE straight at PostgreSQL (pgbench) vs the same
# UPDATE through fencegate's POST /v1/stores/pg/sql (wrk) with the lock held.
#
# Usage: tests/bench/bench_pg.sh [--seconds S] [--clients C] [--bin PATH]
#
# Starts a PostgreSQL 15 (initdb in a temp dir, default settings: fsync on; as root it runs as
# the `postgres` user), a redis-server (the lock backend) and fencegate with the store `pg`
# (pool_size = C), on 127.0.0.1 free ports. Table bench(id, n) with 1000 rows; the statement is
# `UPDATE bench SET n = n + 1 WHERE id = <random 1..1000>`. Then, in this order, pgbench
# (-n -c C -j 2 -T S, simple protocol) and wrk (-t 2 -c C -d S, tests/bench/pg_post.lua),
# three interleaved rounds. Prints each round, the medians and the median round's ratio
# (target >= 0.5). Each round also runs, with pgbench straight at postgres, the transaction
# fencegate sends for a batch (pipelined): the fence's cost to PostgreSQL alone.
# Runtime about 9 * S + 15 s (S <= 40).
#
# Exit status: 0 when the measurement completed (even if the target FAILs); non-zero when a
# process fails to start or a run errors out (any non-200 reply, or rows not updated).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/../.." && pwd)

RUN_SECONDS=10
ROUNDS=3           # interleaved pgbench / wrk rounds; medians reported
CLIENTS=16
BIN="$REPO_ROOT/build/bin/fencegate"
START_TIMEOUT=20
PG_BIN=${FG_PG_BIN:-/usr/lib/postgresql/15/bin}
ROWS=1000

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) [ $# -ge 2 ] || usage 2; RUN_SECONDS=$2; shift 2 ;;
    --clients) [ $# -ge 2 ] || usage 2; CLIENTS=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || usage 2; BIN=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "bench_pg.sh: unknown argument: $1" >&2; usage 2 ;;
  esac
done

die() { echo "bench_pg.sh: error: $*" >&2; exit 1; }
log() { echo "[bench] $*" >&2; }

case "$RUN_SECONDS" in ''|*[!0-9]*) die "--seconds must be a positive integer" ;; esac
case "$CLIENTS" in ''|*[!0-9]*) die "--clients must be a positive integer" ;; esac
if [ "$RUN_SECONDS" -lt 1 ] || [ "$RUN_SECONDS" -gt 40 ]; then die "--seconds must be in 1..40"; fi
if [ "$CLIENTS" -lt 1 ] || [ "$CLIENTS" -gt 256 ]; then die "--clients must be in 1..256"; fi
[ -x "$BIN" ] || die "fencegate binary not found or not executable: $BIN (build it, or pass --bin PATH)"
for tool in redis-server redis-cli psql pgbench wrk curl python3 timeout "$PG_BIN/initdb" "$PG_BIN/postgres"; do
  command -v "$tool" >/dev/null 2>&1 || die "required tool not found: $tool (scripts/deps.sh installs it)"
done

TMPDIR_BENCH=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-pgbench.XXXXXX")
# shellcheck source=tests/bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
chmod 755 "$TMPDIR_BENCH"

AS=()
if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || die "running as root, PostgreSQL needs the 'postgres' user (apt-get install postgresql)"
  AS=(runuser -u postgres --)
  chown postgres "$TMPDIR_BENCH"
fi

read -r PG_PORT REDIS_PORT FG_PORT FG_HTTP_PORT <<<"$(free_ports 4)"
PGUSER=fencegate
PSQL=(psql -X -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U "$PGUSER" -d postgres)

# ---------------------------------------------------------------- servers
"${AS[@]}" "$PG_BIN/initdb" -D "$TMPDIR_BENCH/data" -U "$PGUSER" -A trust -E UTF8 --no-locale \
  >"$TMPDIR_BENCH/initdb.log" 2>&1 || { show_log initdb "$TMPDIR_BENCH/initdb.log"; die "initdb failed"; }
"${AS[@]}" "$PG_BIN/postgres" -D "$TMPDIR_BENCH/data" -p "$PG_PORT" -k "$TMPDIR_BENCH" \
  -c listen_addresses=127.0.0.1 -c max_connections=$((2 * CLIENTS + 20)) \
  >"$TMPDIR_BENCH/postgres.log" 2>&1 &
PG_PID=$!; PIDS+=("$PG_PID")
# shellcheck disable=SC2317  # invoked via wait_ready
pg_ready() { "${PSQL[@]}" -c 'SELECT 1' >/dev/null 2>&1; }
wait_ready postgres "$PG_PID" "$TMPDIR_BENCH/postgres.log" pg_ready

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$TMPDIR_BENCH" --save '' \
  --appendonly no --daemonize no --logfile "$TMPDIR_BENCH/redis.log" &
REDIS_PID=$!; PIDS+=("$REDIS_PID")
wait_ready redis-server "$REDIS_PID" "$TMPDIR_BENCH/redis.log" redis_ping "$REDIS_PORT"

"${PSQL[@]}" -c "CREATE TABLE bench (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)" >/dev/null
"${PSQL[@]}" -c "INSERT INTO bench SELECT g, 0 FROM generate_series(1, $ROWS) g" >/dev/null

cat >"$TMPDIR_BENCH/fg.yaml" <<EOF
stores:
  - name: pg
    url: postgresql://$PGUSER@127.0.0.1:$PG_PORT/postgres
    pool_size: $CLIENTS
EOF
"$BIN" --config "$TMPDIR_BENCH/fg.yaml" --resp "127.0.0.1:$FG_PORT" --http "127.0.0.1:$FG_HTTP_PORT" \
  --upstream "redis://127.0.0.1:$REDIS_PORT" --log-level warn >"$TMPDIR_BENCH/fencegate.log" 2>&1 &
FG_PID=$!; PIDS+=("$FG_PID")
wait_ready fencegate "$FG_PID" "$TMPDIR_BENCH/fencegate.log" http_ready "$FG_HTTP_PORT"

TTL_MS=$(( (RUN_SECONDS + 60) * 1000 ))
TOKEN=$(curl -s -m 5 -X POST -d "{\"ttl_ms\":$TTL_MS}" "http://127.0.0.1:$FG_HTTP_PORT/v1/locks/L" \
  | sed -n 's/.*"token":\([0-9]*\).*/\1/p')
[ -n "$TOKEN" ] || die "cannot acquire lock L through fencegate"

# ---------------------------------------------------------------- workloads
cat >"$TMPDIR_BENCH/update.sql" <<EOF
\\set id random(1, $ROWS)
UPDATE bench SET n = n + 1 WHERE id = :id;
EOF
# The transaction fencegate sends for one batch (pgstore.c: fencegate_fence_begin, _a, _f, the
# statement, _c, _commit), prepared and pipelined in one round trip as fencegate sends it (fencegate
# prepares its own five but not the application's statement, so this is a little less work than
# fencegate asks for): what the fence costs PostgreSQL itself, without the proxy (informational,
# like bench_locks' script column).
cat >"$TMPDIR_BENCH/fenced.sql" <<EOF
\\set id random(1, $ROWS)
\\startpipeline
BEGIN READ WRITE ISOLATION LEVEL READ COMMITTED;
SELECT set_config('fencegate.batch', 'b', true), set_config('synchronous_commit', 'on', true), set_config('statement_timeout', '30000', true), pg_advisory_xact_lock_shared(1178946883, hashtext('L'));
SELECT CASE WHEN m = $TOKEN THEN 0 ELSE CAST('stale ' || m AS int4) END FROM (SELECT (SELECT token FROM fencegate_fence WHERE lock = 'L') AS m) AS s;
UPDATE bench SET n = n + 1 WHERE id = :id;
SELECT CASE WHEN current_setting('fencegate.batch', true) = 'b' THEN 0 ELSE CAST('escaped ' || COALESCE(current_setting('fencegate.batch', true), '') AS int4) END;
COMMIT;
\\endpipeline
EOF
sed "s/@ROWS@/$ROWS/" "$SCRIPT_DIR/pg_post.lua" >"$TMPDIR_BENCH/post.lua"

total_n() { "${PSQL[@]}" -c "SELECT sum(n) FROM bench"; }

NPROC=$(nproc)
echo "fencegate PostgreSQL benchmark  ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
echo "  host:        $(uname -srm), nproc=$NPROC, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  postgres:    $("$PG_BIN/postgres" --version), default settings (fsync on)"
echo "  fencegate:   $BIN, store pg pool_size=$CLIENTS, lock L token $TOKEN"
echo "  statement:   UPDATE bench SET n = n + 1 WHERE id = random(1..$ROWS); $CLIENTS clients, ${RUN_SECONDS}s each"
echo

# One pgbench run straight at postgres: sets PG_TPS.
run_pgbench() {
  local before out tx
  before=$(total_n)
  log "pgbench straight at postgres (round $1)"
  out=$(timeout $((RUN_SECONDS + 30)) pgbench -n -f "$TMPDIR_BENCH/update.sql" -c "$CLIENTS" -j 2 \
    -T "$RUN_SECONDS" -h 127.0.0.1 -p "$PG_PORT" -U "$PGUSER" postgres 2>&1) \
    || { printf '%s\n' "$out" >&2; die "pgbench failed"; }
  PG_TPS=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)
  tx=$(printf '%s\n' "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
  [ -n "$PG_TPS" ] && [ -n "$tx" ] || { printf '%s\n' "$out" >&2; die "cannot parse pgbench output"; }
  [ $(($(total_n) - before)) -ge "$tx" ] || die "pgbench reported $tx transactions, fewer rows grew"
}

# The fenced transaction straight at postgres (pgbench, prepared statements, pipelined): sets PGF_TPS.
run_pgbench_fenced() {
  local out
  log "pgbench: fencegate's transaction straight at postgres (round $1)"
  out=$(timeout $((RUN_SECONDS + 30)) pgbench -n -M prepared -f "$TMPDIR_BENCH/fenced.sql" \
    -c "$CLIENTS" -j 2 -T "$RUN_SECONDS" -h 127.0.0.1 -p "$PG_PORT" -U "$PGUSER" postgres 2>&1) \
    || { printf '%s\n' "$out" >&2; die "pgbench (fenced transaction) failed"; }
  PGF_TPS=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1)
  [ -n "$PGF_TPS" ] || { printf '%s\n' "$out" >&2; die "cannot parse pgbench output"; }
}

# One wrk run through fencegate: sets FG_RPS.
run_wrk() {
  local before out req bad
  before=$(total_n)
  log "wrk through fencegate (round $1)"
  out=$(timeout $((RUN_SECONDS + 30)) wrk -t 2 -c "$CLIENTS" -d "${RUN_SECONDS}s" -s "$TMPDIR_BENCH/post.lua" \
    "http://127.0.0.1:$FG_HTTP_PORT/v1/stores/pg/sql" 2>&1) \
    || { printf '%s\n' "$out" >&2; die "wrk failed"; }
  kill -0 "$FG_PID" 2>/dev/null || { show_log fencegate "$TMPDIR_BENCH/fencegate.log"; die "fencegate died"; }
  FG_RPS=$(printf '%s\n' "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')
  req=$(printf '%s\n' "$out" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
  bad=$(printf '%s\n' "$out" | sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p')
  [ -n "$FG_RPS" ] && [ -n "$req" ] || { printf '%s\n' "$out" >&2; die "cannot parse wrk output"; }
  [ -z "$bad" ] || { printf '%s\n' "$out" >&2; die "$bad requests through fencegate were not answered 200"; }
  # wrk may stop counting replies still in flight at the end: those updates land too.
  [ $(($(total_n) - before)) -ge "$req" ] || die "wrk reported $req requests, fewer rows grew"
}

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# Interleaved rounds (the machine's load drifts; a round measures both sides close in time).
pg_all=() fg_all=() ratio_all=() pgf_all=() ceil_all=()
for round in $(seq 1 "$ROUNDS"); do
  run_pgbench "$round"
  run_wrk "$round"
  run_pgbench_fenced "$round"
  pg_all+=("$PG_TPS") fg_all+=("$FG_RPS") pgf_all+=("$PGF_TPS")
  ratio_all+=("$(awk -v a="$FG_RPS" -v b="$PG_TPS" 'BEGIN {printf "%.3f", (b > 0 ? a / b : 0)}')")
  ceil_all+=("$(awk -v a="$PGF_TPS" -v b="$PG_TPS" 'BEGIN {printf "%.3f", (b > 0 ? a / b : 0)}')")
  echo "  round $round: pgbench $PG_TPS tps, fencegate $FG_RPS req/s, ratio ${ratio_all[-1]};" \
    "fencegate's transaction straight at postgres $PGF_TPS tps (${ceil_all[-1]} of plain)"
done
MARK=$("${PSQL[@]}" -c "SELECT token FROM fencegate_fence WHERE lock = 'L'")
[ "$MARK" = "$TOKEN" ] || die "fence mark is '$MARK', expected the token $TOKEN"

RATIO=$(median "${ratio_all[@]}")
VERDICT=$(awk -v r="$RATIO" 'BEGIN {print (r + 0 >= 0.5) ? "PASS" : "FAIL"}')
printf '  %-44s %12s\n' "pgbench, UPDATE straight at postgres (tps)" "$(median "${pg_all[@]}")"
printf '  %-44s %12s\n' "wrk, fenced POST /v1/stores/pg/sql (req/s)" "$(median "${fg_all[@]}")"
printf '  %-44s %12s   target >= 0.5: %s\n' "ratio fencegate / direct (median round)" "$RATIO" "$VERDICT"
printf '  %-44s %12s   (informational: the fence without the proxy, %s of plain)\n' \
  "pgbench, fencegate's transaction (tps)" "$(median "${pgf_all[@]}")" "$(median "${ceil_all[@]}")"
