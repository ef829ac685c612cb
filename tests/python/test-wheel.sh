#!/bin/bash
# The Python package as a user gets it: its wheel built offline from a clean copy of the source
# tree, installed into a fresh virtual environment (system site packages only for NumPy and
# msgpack), then tests/python/suite.py run from that environment, outside the source tree, with no
# GPUIPC_LIBRARY, LD_LIBRARY_PATH or PYTHONPATH, against a fresh broker whose policy denies
# attaching py/denied/. `pip install .` into a second environment is checked too.
#   test-wheel.sh PYTHON    (meson passes the interpreter that has mesonpy, build, msgpack, numpy)
set -euo pipefail
python=${1:?usage: test-wheel.sh PYTHON}
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
dir=$(mktemp -d /tmp/gpuipc-wheel.XXXXXX)
broker=
cleanup() {
        [[ -n $broker ]] && { kill "$broker" 2>/dev/null; wait "$broker" 2>/dev/null || true; }
        rm -rf "$dir"
}
trap cleanup EXIT
step() { echo "--- $*"; }
fail() { echo "FAILED: $*"; [[ -f $dir/log ]] && tail -40 "$dir/log"; exit 1; }

# Offline: nothing may be downloaded (no build isolation, no index).
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
unset GPUIPC_LIBRARY LD_LIBRARY_PATH PYTHONPATH

step "clean copy of the source tree"
mkdir "$dir/src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        # What a fresh clone holds (plus uncommitted edits), without build outputs or ignored files.
        git -C "$root" ls-files -z --cached --others --exclude-standard |
                while IFS= read -r -d '' f; do [[ -e $root/$f ]] && printf '%s\0' "$f"; done |
                tar -C "$root" --null -T - -cf - | tar -C "$dir/src" -xf -
else
        tar -C "$root" --exclude='./build*' --exclude='./dist' -cf - . | tar -C "$dir/src" -xf -
fi

step "python3 -m build --no-isolation --wheel"
t0=$SECONDS
(cd "$dir/src" && "$python" -m build --no-isolation --wheel --outdir "$dir/dist") >"$dir/log" 2>&1 ||
        fail "the wheel did not build"
wheel=$(ls "$dir"/dist/gpuipc-*.whl)
echo "$(basename "$wheel") in $((SECONDS - t0)) s"
"$python" -m zipfile -l "$wheel" >"$dir/contents"  # a file: grep -q in a pipe would cut zipfile short
grep -q 'gpuipc/libgpuipc.so' "$dir/contents" || fail "the wheel does not carry libgpuipc.so"
grep -q 'gpuipc/py.typed' "$dir/contents" || fail "the wheel does not carry py.typed"

step "fresh venv, pip install the wheel"
"$python" -m venv --system-site-packages "$dir/venv" >"$dir/log" 2>&1 || fail "no venv"
"$dir/venv/bin/pip" install -q "$wheel" >"$dir/log" 2>&1 || fail "pip install of the wheel failed"

step "second venv, pip install --no-build-isolation ."
"$python" -m venv --system-site-packages "$dir/venv2" >"$dir/log" 2>&1 || fail "no venv"
(cd "$dir/src" && "$dir/venv2/bin/pip" install -q --no-build-isolation .) >"$dir/log" 2>&1 ||
        fail "pip install . failed"
(cd / && "$dir/venv2/bin/python" -c 'import gpuipc, sys; p = gpuipc.library_path(); print(p); sys.exit(not p.startswith(sys.prefix))') ||
        fail "pip install . gave a package that does not load its own libgpuipc"

step "broker"
export GPUIPC_SOCKET=$dir/s.sock
printf 'deny attach any prefix=py/denied/\nallow all any\n' >"$dir/policy"
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --seccomp "${GPUIPC_TEST_SECCOMP:-enforce}" --policy "$dir/policy" \
        --log-level warn 2>"$dir/broker.log" &
broker=$!
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null

step "suite.py from the venv"
rc=0
(cd "$dir" && "$dir/venv/bin/python" "$root/tests/python/suite.py" \
        --installed-in "$dir/venv") || rc=$?
# A call the broker's filter had to refuse is a missed libc path (docs/security.md): a failure.
if grep -q 'seccomp:' "$dir/broker.log"; then
        echo "the broker logged a system call outside its allow-list"
        rc=1
fi
if [[ $rc != 0 ]]; then
        echo "--- broker log"
        cat "$dir/broker.log"
fi
exit $rc
