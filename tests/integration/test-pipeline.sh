#!/bin/bash
# The pipeline example end to end: examples/run-pipeline.sh must pass and report that no reference
# is outstanding at the end.   test-pipeline.sh BUILD_DIR
set -uo pipefail

build=${1:?usage: test-pipeline.sh BUILD_DIR}
src=${GPUIPC_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

timeout 100 bash "$src/examples/run-pipeline.sh" "$build" --frames 300 >"$out" 2>&1
rc=$?
cat "$out"
if [[ $rc != 0 ]]; then
        echo "FAIL: run-pipeline.sh exited with $rc"
        exit 1
fi
if ! grep -qx ' *references outstanding at the end: 0' "$out"; then
        echo "FAIL: the summary does not report 0 outstanding references"
        exit 1
fi
if grep -q 'frames, [1-9][0-9]* failed verification' "$out"; then
        echo "FAIL: a consumer saw frames that failed verification"
        exit 1
fi
echo "ok: pipeline example passed with 0 outstanding references"
