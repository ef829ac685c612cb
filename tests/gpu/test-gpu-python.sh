#!/bin/bash
# The Python module round-trips a torch tensor of KIND (cuda-vmm or cuda-legacy) between two
# processes: tests/python/roundtrip.py against a fresh broker, through tests/python/test-python.sh.
# Exits 77 (skipped) without torch or a GPU, and in sanitizer builds.
#
# roundtrip.py asks torch whether CUDA works and then forks its consumer. torch's default answer
# initializes the CUDA driver in the parent, and a forked child of such a process cannot use CUDA;
# the NVML-based check answers without initializing it.
set -euo pipefail
kind=${1:?usage: test-gpu-python.sh cuda-vmm|cuda-legacy}
root=${GPUIPC_SOURCE_ROOT:?}
# A sanitized libgpuipc cannot be loaded into an uninstrumented Python (the sanitizer runtime must
# come first): in a sanitizer build this test is skipped, as the memfd one is not even built.
if grep -q 'define GPUIPC_SANITIZED 1' "${GPUIPC_BUILD_ROOT:?}/config.h" 2>/dev/null; then
        echo "a sanitizer build: libgpuipc cannot be loaded into Python here: skipped"
        exit 77
fi
export PYTORCH_NVML_BASED_CUDA_CHECK=1 PYTHONUNBUFFERED=1
exec bash "$root/tests/python/test-python.sh" "$kind"
