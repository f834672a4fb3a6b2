#!/usr/bin/env bash
# Installs (as root, with apt-get) or lists (otherwise) what building, testing and the demo need.
# usage: scripts/deps.sh [build|test|demo]   (default: test, which is everything)
set -euo pipefail

what=${1:-test}
build_pkgs=(build-essential cmake pkg-config libevent-dev libyaml-dev libhiredis-dev libcmocka-dev python3 libssl-dev libnghttp2-dev libpq-dev)
run_pkgs=(redis-server redis-tools curl)
test_pkgs=(python3-redis iproute2 iptables clang libclang-rt-14-dev clang-format nutcracker procps openssl nodejs libfaketime etcd-server etcd-client nghttp2-client postgresql postgresql-client wrk)

case "$what" in
build) pkgs=("${build_pkgs[@]}") ;;
demo) pkgs=("${build_pkgs[@]}" "${run_pkgs[@]}") ;;
test) pkgs=("${build_pkgs[@]}" "${run_pkgs[@]}" "${test_pkgs[@]}") ;;
*) echo "usage: $0 [build|test|demo]" >&2; exit 2 ;;
esac

# Debian's nodejs comes without npm (a separate package); NodeSource's bundles it and conflicts
# with Debian's npm. Ask for npm only when the npm command is missing.
if [ "$what" = test ] && command -v node >/dev/null 2>&1 && ! command -v npm >/dev/null 2>&1; then
    pkgs+=(npm)
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "fencegate needs these Debian packages, which are not installed:" >&2
    echo "  ${missing[*]}" >&2
    echo "install them with:  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ "$what" = test ] && ! command -v npm >/dev/null 2>&1; then
    echo "installing: npm" >&2
    apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
