#!/bin/sh
# valgrind.sh — runs integration test modules with every fencegate they start running under
# valgrind memcheck, then summarises what valgrind reported. See docs/valgrind.md.
#
#   tests/safety/valgrind.sh [MODULE[.Class[.test]] ...]
#       default modules: test_proxy_semantics test_locks test_fencing
#
# Environment:
#   FENCEGATE_REAL  the fencegate binary to check (default: build/bin/fencegate); build it with
#                   debug info and without sanitizers, e.g. -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   VG_OUT          directory for the valgrind logs (default: a new directory under /tmp; kept)
#   VG_EXTRA        extra valgrind options (e.g. "--track-origins=yes")
#   PYTHON          interpreter with redis-py (default /usr/bin/python3)
#
# Exit status: 0 tests passed and valgrind found nothing; 1 some test failed (valgrind clean);
# 99 valgrind reported an error or a definite/indirect leak in some fencegate process; 2 usage.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
real=${FENCEGATE_REAL:-$root/build/bin/fencegate}
python=${PYTHON:-/usr/bin/python3}

case "$real" in /*) ;; *) real=$(pwd)/$real ;; esac
if [ ! -x "$real" ]; then
    echo "valgrind.sh: no fencegate binary at $real (set FENCEGATE_REAL)" >&2
    exit 2
fi
if ! command -v valgrind >/dev/null 2>&1; then
    echo "valgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2
    exit 2
fi
if [ $# -eq 0 ]; then
    set -- test_proxy_semantics test_locks test_fencing
fi

out=${VG_OUT:-$(mktemp -d /tmp/fg-valgrind.XXXXXX)}
mkdir -p "$out/bin"
# The harness starts $FENCEGATE_BIN with a clean FENCEGATE_-free environment, so the wrapper
# carries the real path and the log directory in its text. exec keeps the PID: signals the tests
# send (SIGTERM, SIGSTOP, SIGKILL) reach the process valgrind runs.
cat >"$out/bin/fencegate" <<EOF
#!/bin/sh
exec valgrind --leak-check=full --show-leak-kinds=definite,indirect \\
    --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --num-callers=30 \\
    --log-file="$out/vg.%p.log" ${VG_EXTRA:-} "$real" "\$@"
EOF
chmod +x "$out/bin/fencegate"
# test_fencectl looks for fencectl next to $FENCEGATE_BIN: it runs natively (not under valgrind).
ln -sf "$(dirname "$real")/fencectl" "$out/bin/fencectl"

echo "valgrind.sh: $real under valgrind; logs in $out"
status=0
for m in "$@"; do
    echo "=== $m"
    if ! (cd "$root/tests/integration" &&
          FENCEGATE_BIN="$out/bin/fencegate" FENCECTL_BIN="$(dirname "$real")/fencectl" \
          PYTHONDONTWRITEBYTECODE=1 "$python" -m unittest -v "$m" >"$out/$m.log" 2>&1); then
        status=1
    fi
    tail -n 4 "$out/$m.log"
done

# One log per fencegate process. A log without "ERROR SUMMARY" comes from a process that did
# not exit normally (killed by SIGKILL, or still running): valgrind had no chance to check leaks.
logs=0 dirty=0 unfinished=0
for f in "$out"/vg.*.log; do
    [ -e "$f" ] || continue
    logs=$((logs + 1))
    if grep -q "ERROR SUMMARY: [1-9]" "$f" ||
       grep -Eq "(definitely|indirectly) lost: [1-9]" "$f" ||
       grep -Eq "^==[0-9]+== (Invalid|Conditional|Syscall param|Mismatched|Source and destination)" "$f"; then
        dirty=$((dirty + 1))
        echo "--- valgrind reported a problem: $f"
        head -n 80 "$f"
    fi
    if ! grep -q "ERROR SUMMARY" "$f"; then
        # Killed (SIGKILL, or a test's kill -9 on purpose) or exec'd another program: valgrind
        # checked memory accesses until then but could not check leaks.
        unfinished=$((unfinished + 1))
        echo "--- no summary (process killed before exit): $f"
    fi
done
echo "valgrind.sh: $logs fencegate processes, $dirty with errors or leaks," \
     "$unfinished ended without a summary; logs in $out"
if [ "$dirty" -gt 0 ]; then
    exit 99
fi
exit $status
