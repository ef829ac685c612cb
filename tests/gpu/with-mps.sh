#!/bin/bash
# Runs a command under an NVIDIA MPS control daemon of its own, then stops the daemon:
#
#   tests/gpu/with-mps.sh meson test -C build --suite gpu
#   tests/gpu/with-mps.sh build/tests/bench/gpuipc-bench --gpu --no-mps
#
# The daemon's pipe and log directories live in a temporary directory (CUDA_MPS_PIPE_DIRECTORY and
# CUDA_MPS_LOG_DIRECTORY, exported to the command), so it neither needs nor touches a daemon of the
# system's; nothing about the GPU is changed (no compute mode, no nvidia-smi). Every CUDA process
# the command starts becomes a client of the daemon's server. At the end the script says how many
# clients the daemon's log counted (0 means the command did not run under MPS after all) and exits
# with the command's status; 77 (skipped) when nvidia-cuda-mps-control is missing or will not start.
set -uo pipefail

[[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
if ! command -v nvidia-cuda-mps-control >/dev/null; then
        echo "with-mps: skipped: nvidia-cuda-mps-control is not installed (it comes with the NVIDIA driver)"
        exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpuipc-mps.XXXXXX") || exit 1
export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"

stop() {
        echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
        # The daemon removes its control socket when it has quit (and its server with it).
        for _ in $(seq 100); do [[ -e $CUDA_MPS_PIPE_DIRECTORY/control ]] || break; sleep 0.1; done
        rm -rf "$dir"
}

if ! nvidia-cuda-mps-control -d; then
        echo "with-mps: skipped: nvidia-cuda-mps-control -d failed"
        rm -rf "$dir"
        exit 77
fi
trap stop EXIT
for _ in $(seq 100); do [[ -e $CUDA_MPS_PIPE_DIRECTORY/control ]] && break; sleep 0.1; done
echo "with-mps: MPS control daemon up (pipe directory $CUDA_MPS_PIPE_DIRECTORY)"

"$@"
status=$?
clients=$(grep -ci "new client" "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null || true)
echo "with-mps: the daemon counted ${clients:-0} client connection(s); the command exited with $status"
exit $status
