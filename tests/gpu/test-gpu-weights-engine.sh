#!/bin/bash
# tests/bench/weights-bench.py as a GPU test, on a small checkpoint (about 300 MB, sharded): the
# checkpoint loaded once by `gpuipcctl weights load` (cuda-vmm), engines in fresh processes that
# build a transformers model on the meta device, attach the weights and run a forward pass, sleep
# and wake; every output must equal the safetensors-loaded model's bit for bit. Its timings are
# printed and never fail the test. Exits 77 without a GPU, torch, transformers or safetensors.
set -euo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
export PYTHONUNBUFFERED=1
exec "${GPUIPC_TEST_PYTHON:-python3}" "$root/tests/bench/weights-bench.py" --build "$build" \
        --size-gb 0.3 --shard-gb 0.1 --trials 1 --engines 2
