#!/bin/bash
# Runs the pipeline example against a fresh broker on a temporary socket and prints a summary.
#   examples/run-pipeline.sh [BUILD_DIR] [--frames N] [--consumers M] [--slots K] [--size BYTES]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
[[ $# -gt 0 && $1 != --* ]] && shift
frames=1000 consumers=3 slots=4 size=$((1 << 20))
while [[ $# -gt 0 ]]; do
        case $1 in
        --frames) frames=$2; shift 2 ;;
        --consumers) consumers=$2; shift 2 ;;
        --slots) slots=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        *) echo "usage: $0 [BUILD_DIR] [--frames N] [--consumers M] [--slots K] [--size BYTES]" >&2; exit 2 ;;
        esac
done

dir=$(mktemp -d /tmp/gpuipc-pipeline.XXXXXX)
export GPUIPC_SOCKET=$dir/gpuipc.sock
broker_pid=
cleanup() {
        [[ -n $broker_pid ]] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null || true
        rm -rf "$dir"
}
trap cleanup EXIT

"$build/broker/gpuipc-broker" --socket "$GPUIPC_SOCKET" --log-level error 2>"$dir/broker.log" &
broker_pid=$!
"$build/cli/gpuipcctl" --timeout 5000 ping >/dev/null

args=(--frames "$frames" --consumers "$consumers" --slots "$slots" --size "$size")
pids=()
for ((i = 0; i < consumers; i++)); do
        "$build/examples/pipeline-consumer" "${args[@]}" --index "$i" >"$dir/consumer-$i.log" 2>&1 &
        pids+=($!)
done
start=$(date +%s.%N)
"$build/examples/pipeline-producer" "${args[@]}" | tee "$dir/producer.log"
failed=0
for ((i = 0; i < consumers; i++)); do
        wait "${pids[$i]}" || failed=1
        cat "$dir/consumer-$i.log"
done

refs=$("$build/cli/gpuipcctl" stats | awk '$1 == "references" { print $2 }')
cached=$("$build/cli/gpuipcctl" stats | awk '$1 == "attaches_cached_total" { print $2 }')
attaches=$("$build/cli/gpuipcctl" stats | awk '$1 == "attaches_total" { print $2 }')
fps=$(sed -n 's/.*: \([0-9]*\) frames\/s$/\1/p' "$dir/producer.log")
echo
echo "summary: frames=$frames consumers=$consumers slots=$slots frame_bytes=$size frames_per_s=$fps"
echo "         attaches=$attaches of which cached=$cached (no fd, no mapping)"
echo "         references outstanding at the end: $refs"
if [[ -s $dir/broker.log ]]; then
        echo "broker log:"; cat "$dir/broker.log"
fi
[[ $failed == 0 && $refs == 0 ]] || { echo "pipeline FAILED" >&2; exit 1; }
