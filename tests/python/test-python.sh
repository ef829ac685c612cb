#!/bin/bash
# Runs roundtrip.py KIND (or another script of tests/python) against a fresh broker with the
# package from the source tree (python/) and the built libgpuipc ($GPUIPC_LIBRARY).
#   test-python.sh KIND [PYTHON [SCRIPT]]
set -euo pipefail
kind=${1:-memfd} python=${2:-python3} script=${3:-roundtrip.py}
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
dir=$(mktemp -d /tmp/gpuipc-python.XXXXXX)
export GPUIPC_SOCKET=$dir/s.sock GPUIPC_LIBRARY=$build/client/libgpuipc.so PYTHONPATH=$root/python
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --seccomp "${GPUIPC_TEST_SECCOMP:-enforce}" --log-level warn 2>"$dir/broker.log" &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$dir"' EXIT
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null
rc=0
"$python" "$root/tests/python/$script" "$kind" || rc=$?
# A call the broker's filter had to refuse is a missed libc path (docs/security.md): a failure.
if grep -q 'seccomp:' "$dir/broker.log"; then
        echo "the broker logged a system call outside its allow-list"
        rc=1
fi
[[ $rc == 0 || $rc == 77 ]] || { echo "--- broker log"; cat "$dir/broker.log"; }
exit $rc
