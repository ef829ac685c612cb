#!/bin/bash
# tests/gpu/test-gpu-legacy-ns.py against a fresh broker (under its seccomp filter), with the package
# from the source tree and the built libgpuipc. Exits 77 without a GPU or torch, and in sanitizer
# builds (a sanitized libgpuipc cannot be loaded into an uninstrumented Python).
set -euo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
if grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h" 2>/dev/null; then
        echo "a sanitizer build: libgpuipc cannot be loaded into Python here: skipped"
        exit 77
fi
dir=$(mktemp -d /tmp/gpuipc-legacy-ns.XXXXXX)
export GPUIPC_SOCKET=$dir/s.sock GPUIPC_LIBRARY=$build/client/libgpuipc.so PYTHONPATH=$root/python
export PYTORCH_NVML_BASED_CUDA_CHECK=1 PYTHONUNBUFFERED=1
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --seccomp "${GPUIPC_TEST_SECCOMP:-enforce}" --log-level warn 2>"$dir/broker.log" &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$dir"' EXIT
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null
rc=0
"${GPUIPC_TEST_PYTHON:-python3}" "$root/tests/gpu/test-gpu-legacy-ns.py" || rc=$?
if grep -q 'seccomp:' "$dir/broker.log"; then
        echo "the broker logged a system call outside its allow-list"
        rc=1
fi
[[ $rc == 0 || $rc == 77 ]] || { echo "--- broker log"; cat "$dir/broker.log"; }
exit $rc
