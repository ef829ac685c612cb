#!/bin/bash
# The suite's last tests, beside suite-tmp-clean: no process the suite started is still running.
# ./dev.sh gives the suite GPUIPC_SUITE_ID, unique per run, and every process a test starts inherits
# it (setpriv, unshare and subprocess keep the environment), so a process whose environment holds it
# and that is not this test or one of its ancestors (meson, dev.sh) was left behind: an orphaned
# client retrying for ever, a broker a test did not stop. One that is on its way out gets a grace of
# 20 s (a loaded machine). What clears its environment (env -i) escapes. A plain `meson test` skips.
set -euo pipefail
id=${GPUIPC_SUITE_ID:-}
if [[ -z $id ]]; then
        echo "skip: run the suite through ./dev.sh test, which marks the processes of one run"
        exit 77
fi
parent() { awk '/^PPid:/ { print $2 }' "/proc/$1/status" 2>/dev/null; }
ancestors=" "
p=$$
while [[ -n $p && $p -gt 1 ]]; do # our ancestors (meson, dev.sh) carry the mark too
        p=$(parent "$p") || break
        ancestors+="$p "
done
ours() { # ours PID: this test, an ancestor, or a process this test started (its greps, its sleep)
        local p=$1
        [[ $ancestors == *" $p "* ]] && return 0
        while [[ -n $p && $p -gt 1 ]]; do
                [[ $p == "$$" ]] && return 0
                p=$(parent "$p") || return 1
        done
        return 1
}
leftovers() {
        local d pid
        for d in /proc/[0-9]*; do
                pid=${d#/proc/}
                grep -qzxF "GPUIPC_SUITE_ID=$id" "$d/environ" 2>/dev/null || continue # no pipe: see test-gst.sh
                ours "$pid" || echo "$pid"
        done
}
deadline=$((SECONDS + 20))
while left=$(leftovers) && [[ -n $left ]] && ((SECONDS < deadline)); do
        sleep 0.5
done
if [[ -n $left ]]; then
        echo "FAIL: the suite left $(wc -w <<<"$left") processes running; a test must stop what it starts:"
        for pid in $left; do
                printf '  pid %s: %s\n' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
        done
        exit 1
fi
echo "ok: no process of this suite run is left"
