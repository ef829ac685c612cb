#!/bin/bash
# One wheel for every Python: the x86_64 wheel installed for real, into a fresh venv (no system
# site packages, msgpack from a local package index), imported and used (a memfd round trip
# through a broker) by every CPython 3 this machine has: every python3.N in every PATH directory
# and, where pyenv is installed, each of its versions. CPythons older than the wheel's
# Requires-Python (3.9) must be refused by their pip (by Requires-Python, or by the tag for a pip
# too old to know manylinux_X_Y). At least two Pythons >= 3.9 must be found, else the test is
# skipped, saying so (one Python proves nothing about "every Python").
#   test-wheel-pythons.sh PYTHON   (meson passes the interpreter that has mesonpy, build, msgpack)
set -uo pipefail
python=${1:?usage: test-wheel-pythons.sh PYTHON}
root=${GPUIPC_SOURCE_ROOT:?}
scratch=gpuipc-pythons
source "$root/tests/python/wheel-common.sh"

# Every CPython 3 interpreter that runs, once each (by its real executable).
pythons() {
        local candidates=() p
        # every python3.N in every directory of PATH (a pyenv shim may hide the system's)
        for name in $(compgen -c python3. | grep -xE 'python3\.[0-9]+' | sort -u); do
                while read -r p; do candidates+=("$p"); done < <(type -ap "$name")
        done
        if command -v pyenv >/dev/null; then
                for v in $(pyenv versions --bare 2>/dev/null); do
                        candidates+=("$(pyenv prefix "$v" 2>/dev/null)/bin/python3")
                done
        fi
        for p in "${candidates[@]}"; do
                "$p" -c 'import sys; sys.exit(sys.implementation.name != "cpython")' 2>/dev/null || continue
                "$p" -c 'import os, sys; print(os.path.realpath(sys.executable))'
        done | sort -u
}

step "the wheel"
clean_copy "$dir/src"
build_wheel "$dir/src" "$dir/dist"
echo "$(basename "$wheel")"
msgpack_index "$dir/index" "$python"

step "a broker"
export GPUIPC_SOCKET=$dir/s.sock
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --log-level warn 2>"$dir/broker.log" &
broker=$!
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null || fail "the broker does not answer"

installed=0 failures=0 n=0
# (each venv's own pip: the one this machine's Debian ships cannot run in Python 3.12 and later;
# PIP_NO_CACHE_DIR=1 crashes the pip of Python 3.6, --no-cache-dir does not)
unset PIP_NO_CACHE_DIR
while read -r py; do
        version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        n=$((n + 1)) venv=$dir/venv-$n
        step "Python $version ($py)"
        if ! "$py" -m venv "$venv" >"$dir/log" 2>&1; then
                echo "skip: Python $version cannot make a venv (no venv or ensurepip module)"
                continue
        fi
        out=$("$venv/bin/pip" install -q --no-cache-dir --find-links "$dir/index" "$wheel" 2>&1)
        rc=$?
        if [[ $version =~ ^3\.[0-8]$ ]]; then
                # pip refuses it by Requires-Python, or (pip before PEP 600) by its manylinux tag
                if [[ $rc != 0 ]] && grep -qE "requires a different Python: $version|is not a supported wheel" <<<"$out"; then
                        echo "refused, as it must be: $(grep -oE "requires a different Python.*|is not a supported wheel.*" <<<"$out" | head -1)"
                else
                        echo "FAIL: pip installed the wheel in Python $version, below Requires-Python: $out"
                        failures=$((failures + 1))
                fi
                continue
        fi
        if [[ $rc != 0 ]]; then
                echo "FAIL: pip install in Python $version: $out"
                failures=$((failures + 1))
                continue
        fi
        if (cd / && "$venv/bin/python" -c "$ROUNDTRIP_PY"); then
                installed=$((installed + 1))
        else
                echo "FAIL: the round trip in Python $version"
                failures=$((failures + 1))
        fi
done < <(pythons)

echo "installed and used in $installed Pythons >= 3.9; $failures failures"
[[ $failures == 0 ]] || exit 1
if [[ $installed -lt 2 ]]; then
        echo "skipped: only $installed CPython >= 3.9 on this machine (install more, e.g. with pyenv, to test 'every Python')"
        exit 77
fi
