#!/usr/bin/env bash
# Runs every check CI runs: format, a -Werror build with every ctest test (unit, integration,
# safety, k8s), the unit and integration tests again under ASan+UBSan, and each fuzz target for a
# bounded time.
# usage: scripts/test.sh [--quick]   (--quick: skip the sanitizer and fuzz stages)
# env:   FG_FUZZ_SECONDS (default 30) — seconds each fuzz target runs
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc 2>/dev/null || echo 2)

"$root/scripts/deps.sh" test

stage() { printf '\n=== %s ===\n' "$*"; }

stage "format (clang-format --dry-run)"
mapfile -t sources < <(find proxy config lockclient tests -name '*.[ch]' | sort)
clang-format --dry-run --Werror "${sources[@]}"
echo "formatted: ${#sources[@]} files"

stage "build (-Werror) and test"
cmake -S . -B build -DFG_TESTS=ON -DFG_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j 2)

if [ $quick -eq 0 ]; then
    stage "ASan+UBSan build and test"
    cmake -S . -B build-asan -DFG_WERROR=ON -DFG_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-asan -j "$jobs"
    # The fault suite and the chart checks test timing and packaging, not memory: they run once.
    # So do the Redis endpoint's suites with multiplexing off ("dedicated"): a client's own
    # upstream connection is the path every pinned client takes, which the suites cover here.
    # ASan keeps freed memory in a quarantine (256 MiB by default) to catch use after free; the
    # RSS bounds of the back-pressure test need it smaller (16 MiB still catches recent frees).
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:quarantine_size_mb=16 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j 2 -LE 'safety|k8s|dedicated')

    stage "fuzz (libFuzzer, ${FG_FUZZ_SECONDS:-30}s per target)"
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFG_FUZZ=ON -DFG_SANITIZE=ON \
        -DFG_FUZZ_SECONDS="${FG_FUZZ_SECONDS:-30}" -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-fuzz -j "$jobs"
    # One target per CPU: each is single-threaded and runs for its whole time budget.
    (cd build-fuzz && ctest --output-on-failure -L fuzz -j "$jobs")
fi
stage "all checks passed"
