#!/bin/bash
# The developer's entry point on a fresh Debian 12 machine (root or sudo):
#   ./dev.sh demo    install what is missing, build, and run the pipeline demo: a fresh broker,
#                    one producer and three consumers passing frames through memfd buffers
#   ./dev.sh test    install what is missing, build, and run every test suite; the last line
#                    reads "N passed, N failed" (skipped tests are counted apart)
#   ./dev.sh build   only install and build
# BUILD_DIR (default: build) picks the build directory.
set -euo pipefail

cd "$(dirname "$0")"
build=${BUILD_DIR:-build}

# Debian packages, by what the project needs them for.
packages=(
        gcc meson ninja-build pkg-config python3      # building
        libuv1-dev libmsgpack-dev libseccomp-dev      # the broker's and library's dependencies
        runc                                          # tests: the broker in an OCI container
        podman debootstrap                            # tests: the images built from a local Debian base and run
        nodejs npm                                    # tests: offline Kubernetes manifest validation
        jq procps psmisc python3-yaml                 # tests: reading results, processes, manifests
)

as_root() {
        if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi
}

install_packages() {
        local missing=()
        for p in "${packages[@]}"; do
                # node may come from elsewhere (e.g. NodeSource); only install Debian's if absent.
                [[ ($p == nodejs || $p == npm) && -x $(command -v "${p/nodejs/node}" 2>/dev/null) ]] && continue
                dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
        done
        if [[ ${#missing[@]} -gt 0 ]]; then
                echo "installing: ${missing[*]}"
                as_root apt-get update -qq
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        fi
        # Again whenever the lock file changed since the last install (a new dependency).
        if [[ -f tests/k8s/package-lock.json && ( ! -d tests/k8s/node_modules ||
                tests/k8s/package-lock.json -nt tests/k8s/node_modules/.package-lock.json ) ]] &&
                command -v npm >/dev/null; then
                npm ci --prefix tests/k8s --no-audit --no-fund --loglevel=error >/dev/null 2>&1 ||
                        echo "warning: npm ci in tests/k8s failed; the manifest tests will be skipped" >&2
        fi
}

build() {
        install_packages
        if [[ ! -f $build/build.ninja ]]; then
                meson setup "$build" >/dev/null
        fi
        ninja -C "$build" >/dev/null
}

summary() {
        local log=$build/meson-logs/testlog.json
        [[ -f $log ]] || { echo "0 passed, 1 failed (no test log)"; return 1; }
        jq -rs '"\(map(select(.result=="OK"))|length) passed, \(map(select(.result=="FAIL" or .result=="ERROR" or .result=="TIMEOUT" or .result=="UNEXPECTEDPASS"))|length) failed (\(map(select(.result=="SKIP"))|length) skipped)"' "$log"
        jq -rs 'map(select(.result=="FAIL" or .result=="ERROR" or .result=="TIMEOUT" or .result=="UNEXPECTEDPASS")) | length == 0' "$log" | grep -qx true
}

case ${1:-} in
demo)
        build
        examples/run-pipeline.sh "$build"
        ;;
test)
        build
        rc=0
        meson test -C "$build" --print-errorlogs --num-processes 2 || rc=$?
        summary || rc=1
        exit $rc
        ;;
build)
        build
        ;;
*)
        sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
