#!/bin/bash
# The developer's entry point on a fresh Debian 12 machine (root or sudo):
#   ./dev.sh demo    install what is missing, build, and run the pipeline demo: a fresh broker,
#                    one producer and three consumers passing frames through memfd buffers
#   ./dev.sh test    install what is missing, build, and run every test suite (in a /tmp of its own,
#                    which must be empty at the end); the last line reads "N passed, N failed"
#   ./dev.sh test-sanitize   the same with AddressSanitizer, UBSan and LeakSanitizer (a build of
#                    its own); any report fails its test
#   ./dev.sh ci      both, one after the other (what .ci/run runs); the last line reads
#                    "N passed, N failed" and covers both runs
#   ./dev.sh build   only install and build
# BUILD_DIR (default: build) and SANITIZE_BUILD_DIR (default: build-sanitize) pick the build
# directories.
set -euo pipefail

cd "$(dirname "$0")"
build=${BUILD_DIR:-build}
sanitize_build=${SANITIZE_BUILD_DIR:-build-sanitize}

# Debian packages, by what the project needs them for.
packages=(
        gcc meson ninja-build pkg-config python3      # building
        libuv1-dev libmsgpack-dev libseccomp-dev      # the broker's and library's dependencies
        libmicrohttpd-dev                             # the metrics exporter's HTTP server
        runc                                          # tests: the broker in an OCI container
        podman debootstrap                            # tests: the images built from a local Debian base and run
        nodejs npm                                    # tests: offline Kubernetes manifest validation
        jq procps psmisc python3-yaml                 # tests: reading results, processes, manifests
        python3-msgpack python3-numpy                 # the Python package and its tests
        python3-mesonpy python3-build python3-venv patchelf  # tests: building and installing its wheel
        gcc-aarch64-linux-gnu libmsgpack-dev:arm64 qemu-user # tests: the aarch64 wheel, cross-built and run
        scdoc                                         # the man pages (docs/man/*.scd)
        zsh fish                                      # tests: gpuipcctl's zsh and fish completions
        libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev  # the GStreamer plugin (gst/)
        gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good  # tests: its pipelines
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
                # arm64 packages (the aarch64 wheel's headers) come from Debian's multiarch.
                if [[ " ${missing[*]}" == *:arm64* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
                        as_root dpkg --add-architecture arm64
                fi
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

# promtool (tests: `promtool check metrics` on the exporter's output) comes from Debian's prometheus
# package, unpacked into .tools/ rather than installed: installing it would also set up, and on a
# machine with systemd start, a Prometheus server.
install_promtool() {
        local dest=.tools/promtool tmp
        if command -v promtool >/dev/null || [[ -x $dest ]]; then
                return 0
        fi
        tmp=$(mktemp -d)
        if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
                as_root apt-get update -qq
                (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || true
        fi
        if compgen -G "$tmp/prometheus_*.deb" >/dev/null; then
                mkdir -p .tools
                dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool >"$dest.part" &&
                        chmod +x "$dest.part" && mv "$dest.part" "$dest"
        fi
        rm -rf "$tmp" "$dest.part"
        [[ -x $dest ]] || echo "warning: could not unpack promtool from Debian's prometheus package; the metrics lint test will be skipped" >&2
}

# build DIR [MESON-OPTIONS...]: configures DIR once (with the options), then builds it.
build() {
        local dir=$1
        shift
        install_packages
        install_promtool
        if [[ ! -f $dir/build.ninja ]]; then
                meson setup "$dir" "$@" >/dev/null
        fi
        ninja -C "$dir" >/dev/null
}

# counts DIR: "PASSED FAILED SKIPPED" from DIR's test log (no log: one failure).
counts() {
        local log=$1/meson-logs/testlog.json
        [[ -f $log ]] || { echo "0 1 0"; return; }
        jq -rs '[(map(select(.result=="OK"))|length), (map(select(.result=="FAIL" or .result=="ERROR" or .result=="TIMEOUT" or .result=="UNEXPECTEDPASS"))|length), (map(select(.result=="SKIP"))|length)] | map(tostring) | join(" ")' "$log" || echo "0 1 0"
}

# summary DIR...: the closing "N passed, N failed (N skipped)" line over the test logs of every DIR;
# fails when any test failed.
summary() {
        local passed=0 failed=0 skipped=0 p f k
        for dir in "$@"; do
                read -r p f k < <(counts "$dir")
                # A log that cannot be read counts as a failure, never as a pass.
                [[ $p =~ ^[0-9]+$ && $f =~ ^[0-9]+$ && $k =~ ^[0-9]+$ ]] || { p=0 f=1 k=0; }
                passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + k))
        done
        echo "$passed passed, $failed failed ($skipped skipped)"
        [[ $failed == 0 ]]
}

# run_suite DIR: every test of DIR's build; 0 when all passed. The suite gets a temporary directory
# of its own, empty at the start, which its last test (suite-tmp-clean) checks is empty again: as
# root, a fresh directory mounted over /tmp in a private mount namespace (what hard-codes /tmp is
# caught too, and other processes on the machine neither see it nor disturb the check), else TMPDIR.
# A checkout or build directory inside /tmp would vanish under the fresh /tmp: TMPDIR then too.
# GPUIPC_SUITE_ID marks every process of the run for suite-no-leftovers.
run_suite() {
        local rc=0 tmp run_id
        tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpuipc-suite.XXXXXX")
        run_id=${tmp##*/} # unique to this run: suite-no-leftovers finds the processes that carry it
        chmod 1777 "$tmp" # like /tmp: tests that drop privileges create files there too
        if [[ $(id -u) == 0 && $(realpath "$PWD")/ != /tmp/* && $(realpath "$1")/ != /tmp/* ]] &&
                unshare --mount true 2>/dev/null; then
                unshare --mount --propagation private -- bash -c 'mount --bind "$1" /tmp && shift && exec "$@"' _ \
                        "$tmp" env TMPDIR=/tmp GPUIPC_SUITE_TMP=/tmp GPUIPC_SUITE_TMP_PRIVATE=1 GPUIPC_SUITE_ID="$run_id" \
                        meson test -C "$1" --print-errorlogs --num-processes 2 || rc=$?
        else
                TMPDIR=$tmp GPUIPC_SUITE_TMP=$tmp GPUIPC_SUITE_ID=$run_id meson test -C "$1" --print-errorlogs \
                        --num-processes 2 || rc=$?
        fi
        rm -rf "$tmp"
        return $rc
}

# The sanitizer build: AddressSanitizer and UBSan, LeakSanitizer at every exit (ASan's default on
# Linux). Its broker lets the sanitizers' own system calls through its filter (the [sanitizer]
# section of seccomp/gpuipc-broker.allow); meson test makes every report fatal (halt_on_error).
build_sanitize() {
        build "$sanitize_build" -Db_sanitize=address,undefined
}

case ${1:-} in
demo)
        build "$build"
        examples/run-pipeline.sh "$build"
        ;;
test)
        build "$build"
        rc=0
        run_suite "$build" || rc=$?
        summary "$build" || rc=1
        exit $rc
        ;;
test-sanitize)
        build_sanitize
        rc=0
        run_suite "$sanitize_build" || rc=$?
        summary "$sanitize_build" || rc=1
        exit $rc
        ;;
ci)
        # The ordinary suite, then the sanitizer suite; each prints its own summary, and the last
        # line sums both.
        rc=0
        build "$build"
        run_suite "$build" || rc=1
        echo "ordinary suite: $(summary "$build")"
        build_sanitize
        run_suite "$sanitize_build" || rc=1
        echo "sanitizer suite: $(summary "$sanitize_build")"
        summary "$build" "$sanitize_build" || rc=1
        exit $rc
        ;;
build)
        build "$build"
        ;;
*)
        sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
