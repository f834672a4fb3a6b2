#!/usr/bin/env bash
# Copies the shared libraries ELF executables load, as ldd resolves them, into a root file
# system tree, so the executables run in an image that has no package manager.
#
# usage: docker/copy-libs.sh [--skip-glibc] ROOT EXECUTABLE|LIBRARY...
#
# A LIBRARY argument (a path whose name starts with "lib" and has ".so") is one an executable
# loads with dlopen, which ldd cannot see: fencegate's libpq.so.5. It is copied itself, under the
# name given (so give the soname path, e.g. /usr/lib/x86_64-linux-gnu/libpq.so.5, not the file a
# symlink resolves to), with the libraries it loads.
#
# Libraries land in ROOT at their canonical directory (/usr/lib/<multiarch>/ on Debian 12),
# under the name the executable asks for (the soname), as regular files. The dynamic loader keeps
# the exact path written in the executable (PT_INTERP, e.g. /lib64/ld-linux-x86-64.so.2), because
# the kernel opens that path before any search happens.
#
# --skip-glibc leaves out glibc's own files (the loader, libc, libm, ...): for a base image that
# already has the same glibc (gcr.io/distroless/base-debian12). Without it the tree is complete
# and runs FROM scratch.
set -euo pipefail

skip_glibc=0
if [ "${1:-}" = --skip-glibc ]; then
    skip_glibc=1
    shift
fi
if [ $# -lt 2 ]; then
    echo "usage: $0 [--skip-glibc] ROOT EXECUTABLE|LIBRARY..." >&2
    exit 2
fi
root=$1
shift
command -v ldd >/dev/null || { echo "copy-libs: ldd not found (Debian package libc-bin)" >&2; exit 1; }

is_glibc() {
    case "$1" in
    ld-linux*.so* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | \
        librt.so.* | libresolv.so.* | libutil.so.* | libanl.so.* | libnss_*.so.* | \
        libBrokenLocale.so.* | libc_malloc_debug.so.*) return 0 ;;
    *) return 1 ;;
    esac
}

# ldd prints "soname => /path (0x...)" for libraries, "/path (0x...)" for the loader and
# "soname => not found" for a library it cannot resolve; linux-vdso has no file.
ldd_out=
for exe in "$@"; do
    case "$(basename "$exe")" in
    lib*.so*)
        [ -f "$exe" ] || { echo "copy-libs: $exe is not a file" >&2; exit 1; }
        # The library itself, in ldd's own form, ahead of what it loads.
        ldd_out+="$(basename "$exe") => $exe (0)"$'\n'
        ;;
    *) [ -x "$exe" ] || { echo "copy-libs: $exe is not an executable file" >&2; exit 1; } ;;
    esac
    out=$(ldd "$exe") || { echo "copy-libs: ldd failed on $exe (not dynamic?)" >&2; exit 1; }
    if grep -q 'not found' <<<"$out"; then
        echo "copy-libs: $exe needs libraries that are not installed:" >&2
        grep 'not found' <<<"$out" >&2
        exit 1
    fi
    ldd_out+=$out$'\n'
done

n=0
declare -A done_paths=()
while read -r a b c _; do
    if [ "$b" = "=>" ]; then
        name=$a path=$c
    elif [ "${a#/}" != "$a" ]; then
        name=$(basename "$a") path=$a
    else
        continue # linux-vdso.so.1
    fi
    [ -e "$path" ] || continue
    if [ $skip_glibc -eq 1 ] && is_glibc "$name"; then
        continue
    fi
    if [ "$b" = "=>" ]; then
        dir=$(cd "$(dirname "$path")" && pwd -P) # /lib -> /usr/lib on a merged-/usr system
    else
        dir=$(dirname "$path") # the loader: the path the executable names
    fi
    [ -z "${done_paths[$dir/$name]:-}" ] || continue
    done_paths[$dir/$name]=1
    mkdir -p "$root$dir"
    cp -L "$path" "$root$dir/$name"
    chmod 0755 "$root$dir/$name"
    echo "  $dir/$name"
    n=$((n + 1))
done <<<"$ldd_out"
echo "copy-libs: $n files copied into $root"
