#!/bin/sh
# Runs one libFuzzer target for a bounded time over its seed corpus (copied, so the repo stays clean).
# usage: run.sh TARGET CORPUS_DIR SECONDS
# Exits non-zero when the fuzzer does or when it leaves any artifact (crash, leak, timeout, oom);
# artifacts are copied to $FG_FUZZ_ARTIFACTS (default: ./fuzz-artifacts in the current directory).
set -eu
if [ $# -ne 3 ]; then
    echo "usage: $0 TARGET CORPUS_DIR SECONDS" >&2
    exit 2
fi
target=$1 corpus=$2 seconds=$3
name=$(basename "$target")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/corpus" "$work/artifacts"
if [ -d "$corpus" ]; then
    cp -R "$corpus"/. "$work/corpus/"
fi

# The output goes to a file, not a pipe, so the fuzzer's own exit status is kept.
status=0
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || status=$?
tail -n 20 "$work/log"

found=0
for f in "$work"/artifacts/*; do
    if [ -e "$f" ]; then
        found=1
    fi
done
if [ "$found" -eq 1 ]; then
    dest=${FG_FUZZ_ARTIFACTS:-$PWD/fuzz-artifacts}
    mkdir -p "$dest"
    cp "$work"/artifacts/* "$dest"/
    echo "fuzz: $name left artifacts; reproduce with: $target <file>, files in $dest:" >&2
    ls -1 "$work"/artifacts >&2
    if [ "$status" -eq 0 ]; then
        status=1
    fi
fi
if [ "$status" -ne 0 ]; then
    echo "fuzz: $name failed (exit status $status)" >&2
fi
exit "$status"
