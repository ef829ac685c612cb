#!/bin/bash
# The suite's last test: the suite left nothing behind in its temporary directory. ./dev.sh runs
# the suite with GPUIPC_SUITE_TMP naming a directory that was empty when the suite started and that
# nothing else uses: /tmp itself, in a private mount namespace with a fresh directory over it (as
# root), else the TMPDIR it gives the suite (then what ignores TMPDIR escapes the check, and this
# says so). Other processes on the machine cannot fool it either way. A plain `meson test` skips.
set -euo pipefail
dir=${GPUIPC_SUITE_TMP:-}
if [[ -z $dir ]]; then
        echo "skip: run the suite through ./dev.sh test, which gives it a temporary directory of its own"
        exit 77
fi
[[ -d $dir ]] || { echo "FAIL: GPUIPC_SUITE_TMP=$dir is not a directory"; exit 1; }
[[ ${GPUIPC_SUITE_TMP_PRIVATE:-0} == 1 ]] || echo "note: not a private /tmp; only TMPDIR ($dir) is checked"
mapfile -t left < <(find "$dir" -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort)
if [[ ${#left[@]} -gt 0 ]]; then
        echo "FAIL: the suite left ${#left[@]} entries in $dir (first ones below); a test must remove what it creates"
        for entry in "${left[@]:0:20}"; do
                ls -ld "$dir/$entry"
        done
        exit 1
fi
echo "ok: the suite left nothing in $dir"
