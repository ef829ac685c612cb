#!/bin/bash
# The Python package as a user gets it on Debian or Ubuntu: its wheel built offline with
# pyproject-build from a clean copy of the source tree that holds a ./build directory, as a built
# checkout does (the copy is a git repository: the build must leave nothing untracked), tagged
# py3-none-manylinux_X_Y_x86_64 with X.Y the newest GLIBC_ version its library needs, installable
# for CPython 3.9, 3.10, 3.12 and 3.13 (pip --dry-run) and not on an older glibc. Then the three
# installs docs/python.md gives, each imported and used for real from outside the source tree,
# with no GPUIPC_LIBRARY, LD_LIBRARY_PATH or PYTHONPATH:
#   A. a venv with system site packages (msgpack, NumPy from Debian): tests/python/suite.py runs
#      there, against a fresh broker whose policy denies attaching py/denied/;
#   B. a plain venv, msgpack from a package index (a local one: no PyPI here), and the same wheel
#      with --no-deps and no msgpack, whose import must say what is missing;
#   C. `pip install --no-build-isolation .` from the checkout into a venv with system site packages.
#   test-wheel.sh PYTHON    (meson passes the interpreter that has mesonpy, build, msgpack, numpy)
set -euo pipefail
python=${1:?usage: test-wheel.sh PYTHON}
root=${GPUIPC_SOURCE_ROOT:?}
scratch=gpuipc-wheel
source "$root/tests/python/wheel-common.sh"

step "clean copy of the source tree, a git repository with a ./build directory"
clean_copy "$dir/src"
mkdir "$dir/src/build" && touch "$dir/src/build/build.ninja"
git -C "$dir/src" init -q && git -C "$dir/src" add -A >/dev/null &&
        git -C "$dir/src" -c user.name=t -c user.email=t@t commit -qm copy >/dev/null || fail "git in the copy"

step "pyproject-build --no-isolation --wheel"
t0=$SECONDS
build_wheel "$dir/src" "$dir/dist"
echo "$(basename "$wheel") in $((SECONDS - t0)) s"
left=$(git -C "$dir/src" status --porcelain --ignored=no)
[[ -z $left ]] || fail "building left files git does not ignore: $left"
"$python" -m zipfile -l "$wheel" >"$dir/contents"  # a file: grep -q in a pipe would cut zipfile short
grep -q 'gpuipc/libgpuipc.so' "$dir/contents" || fail "the wheel does not carry libgpuipc.so"
grep -q 'gpuipc/py.typed' "$dir/contents" || fail "the wheel does not carry py.typed"
check_tag "$wheel" x86_64

step "pip's verdict for other Pythons and glibcs"
"$python" -m venv "$dir/tool" >"$dir/log" 2>&1 || fail "no venv"
floor=$(basename "$wheel" .whl | sed 's/.*manylinux_\([0-9]*\)_\([0-9]*\)_.*/\1 \2/')
read -r major minor <<<"$floor"
check_pythons "$dir/tool/bin/pip" "$wheel" "manylinux_${major}_${minor}_x86_64" "manylinux_${major}_$((minor - 1))_x86_64"

step "A. venv --system-site-packages, pip install the wheel"
"$python" -m venv --system-site-packages "$dir/venv" >"$dir/log" 2>&1 || fail "no venv"
"$dir/venv/bin/pip" install -q "$wheel" >"$dir/log" 2>&1 || fail "pip install of the wheel failed"

step "B. plain venv, msgpack from an index"
msgpack_index "$dir/index" "$python"
"$python" -m venv "$dir/plain" >"$dir/log" 2>&1 || fail "no venv"
"$dir/plain/bin/pip" install -q --find-links "$dir/index" "$wheel" >"$dir/log" 2>&1 ||
        fail "pip install of the wheel with msgpack from the index failed"
"$python" -m venv "$dir/bare" >"$dir/log" 2>&1 || fail "no venv"
"$dir/bare/bin/pip" install -q --no-deps "$wheel" >"$dir/log" 2>&1 || fail "pip install --no-deps failed"
out=$(cd / && "$dir/bare/bin/python" -c 'import gpuipc' 2>&1) && fail "import gpuipc without msgpack worked?"
grep -q "gpuipc needs the msgpack package" <<<"$out" || fail "import without msgpack does not say what is missing: $out"
echo "without msgpack: $(tail -1 <<<"$out")"

step "C. venv --system-site-packages, pip install --no-build-isolation ."
"$python" -m venv --system-site-packages "$dir/venv2" >"$dir/log" 2>&1 || fail "no venv"
(cd "$dir/src" && "$dir/venv2/bin/pip" install -q --no-build-isolation .) >"$dir/log" 2>&1 ||
        fail "pip install . failed"

step "broker"
export GPUIPC_SOCKET=$dir/s.sock
printf 'deny attach any prefix=py/denied/\nallow all any\n' >"$dir/policy"
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --seccomp "${GPUIPC_TEST_SECCOMP:-enforce}" --policy "$dir/policy" \
        --log-level warn 2>"$dir/broker.log" &
broker=$!
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null

step "B and C: a round trip each"
for env in plain venv2; do
        (cd / && "$dir/$env/bin/python" -c "$ROUNDTRIP_PY") || fail "the round trip in $env failed"
done

step "A: suite.py from the venv"
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
