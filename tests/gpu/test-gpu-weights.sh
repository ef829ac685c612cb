#!/bin/bash
# tests/gpu/test-gpu-weights.py from a meson build directory: the package from the source tree
# (python/) and the built libgpuipc ($GPUIPC_LIBRARY: for tests and development trees only; the
# wheel carries its own). Exits 77 without a GPU, torch or transformers.
set -euo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
export GPUIPC_LIBRARY=$build/client/libgpuipc.so PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export PYTORCH_NVML_BASED_CUDA_CHECK=1 PYTHONUNBUFFERED=1
exec "${GPUIPC_TEST_PYTHON:-python3}" "$root/tests/gpu/test-gpu-weights.py" --broker "$GPUIPC_BROKER"
