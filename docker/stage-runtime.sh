#!/usr/bin/env bash
# Builds fencegate and fencegate-injector (Release), stages them with the shared libraries they
# load into docker/.stage/, and packages that with `podman build -f docker/Containerfile.runtime`
# (FROM scratch, COPY only), then prints the image size. The size target is FG_IMAGE_MAX_MB (default 20) megabytes.
#
# usage: docker/stage-runtime.sh [--no-image]    (--no-image: stage only, skip podman)
#
# Needs the build packages of scripts/deps.sh (installed with apt-get when run as root) and
# podman (likewise installed with apt-get when missing and run as root; otherwise the image step
# is skipped with a message and the staged tree is still checked).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
stage=$root/docker/.stage
build=$root/build-runtime
tag=${FG_IMAGE_TAG:-fencegate:runtime}
max_mb=${FG_IMAGE_MAX_MB:-20}
make_image=1
[ "${1:-}" = --no-image ] && make_image=0

"$root/scripts/deps.sh" build
# The injector's TLS listener links OpenSSL (libevent_openssl comes with libevent-dev).
if ! dpkg-query -W -f='${Status}' libssl-dev 2>/dev/null | grep -q 'install ok installed'; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "stage-runtime: needs libssl-dev: sudo apt-get install -y libssl-dev" >&2
        exit 1
    fi
    echo "stage-runtime: installing libssl-dev with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libssl-dev >/dev/null
fi
cmake -S "$root" -B "$build" -DFG_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target fencegate fencegate-injector >/dev/null

if [ -d "$stage" ]; then chmod -R u+w "$stage"; fi
rm -rf "$stage"
mkdir -p "$stage/rootfs/etc"
# `fencegate injector` runs /fencegate-injector, the webhook server, which alone links OpenSSL.
for exe in fencegate fencegate-injector; do
    install -m 0755 "$build/bin/$exe" "$stage/rootfs/$exe"
    strip --strip-unneeded "$stage/rootfs/$exe"
done
echo "staging the libraries they load:"
# fencegate dlopens libpq.so.5 for PostgreSQL stores, and libssl.so.3 with
# libevent_openssl-2.1.so.7 for etcds:// backends, so ldd does not list them; named here.
"$root/docker/copy-libs.sh" "$stage/rootfs" "$stage/rootfs/fencegate" "$stage/rootfs/fencegate-injector" \
    "$(pkg-config --variable=libdir libpq)/libpq.so.5" \
    "$(pkg-config --variable=libdir libssl)/libssl.so.3" \
    "$(pkg-config --variable=libdir libevent_openssl)/libevent_openssl-2.1.so.7"
# glibc's resolver reads these; the container runtime mounts /etc/hosts and /etc/resolv.conf.
printf 'hosts: files dns\n' >"$stage/rootfs/etc/nsswitch.conf"
printf 'root:x:0:0:root:/:/nonexistent\nnonroot:x:65532:65532:nonroot:/:/nonexistent\n' \
    >"$stage/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$stage/rootfs/etc/group"
# Files are read-only for everyone: the image needs no writable path.
find "$stage/rootfs" -type d -exec chmod 0555 {} +
find "$stage/rootfs" -type f -name '*.so*' -exec chmod 0555 {} +
chmod 0444 "$stage/rootfs/etc/"*

# The staged tree must run on its own: a chroot is the same test a FROM scratch image makes.
if [ "$(id -u)" -eq 0 ]; then
    if ! out=$(chroot --userspec=65532:65532 "$stage/rootfs" /fencegate --version 2>&1); then
        echo "stage-runtime: the staged tree does not run on its own: $out" >&2
        exit 1
    fi
    # (`fencegate injector` finds it through /proc/self/exe, which a chroot lacks: run it directly.)
    if ! help=$(chroot --userspec=65532:65532 "$stage/rootfs" /fencegate-injector --help 2>&1) ||
        ! grep -q -- --cert <<<"$help"; then
        echo "stage-runtime: fencegate-injector does not run in the staged tree: $help" >&2
        exit 1
    fi
    echo "chroot check: fencegate and fencegate-injector run as uid 65532 with only the staged files"
fi
tree_kb=$(du -sk "$stage/rootfs" | cut -f1)
echo "staged tree: $((tree_kb / 1024)).$(((tree_kb % 1024) * 10 / 1024)) MiB in $stage/rootfs"

[ $make_image -eq 1 ] || exit 0
if ! command -v podman >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "stage-runtime: podman is not installed; staged only. Install it with:" >&2
        echo "  sudo apt-get install -y podman" >&2
        exit 0
    fi
    echo "stage-runtime: podman is not installed; installing it with apt-get (Debian package podman)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends podman >/dev/null
fi
podman build --quiet -f "$root/docker/Containerfile.runtime" -t "$tag" "$stage" >/dev/null
bytes=$(podman image inspect --format '{{.Size}}' "$tag")
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1000000 }')
echo "image $tag: $bytes bytes ($mb MB); target <= $max_mb MB"
if [ "$bytes" -gt $((max_mb * 1000000)) ]; then
    echo "stage-runtime: image $tag is larger than $max_mb MB" >&2
    exit 1
fi
