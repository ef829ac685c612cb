#!/bin/bash
# tests/gpu/test-gpu-exit.py from a meson build directory: the package from the source tree (python/)
# and the built libgpuipc ($GPUIPC_LIBRARY). Exits 77 without a GPU or torch, and in sanitizer builds
# (a sanitized libgpuipc cannot be loaded into an uninstrumented Python).
set -euo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
if grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h" 2>/dev/null; then
        echo "a sanitizer build: libgpuipc cannot be loaded into Python here: skipped"
        exit 77
fi
export GPUIPC_LIBRARY=$build/client/libgpuipc.so PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export PYTORCH_NVML_BASED_CUDA_CHECK=1 PYTHONUNBUFFERED=1
exec "${GPUIPC_TEST_PYTHON:-python3}" "$root/tests/gpu/test-gpu-exit.py" --broker "$GPUIPC_BROKER" "$@"
