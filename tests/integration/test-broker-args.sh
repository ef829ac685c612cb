#!/bin/bash
# Bad start-up input gets a clear error, never a silent default: an empty socket path (flag or
# environment), a socket mode nobody can connect through, a policy file without rules (a warning:
# it denies everything), and a policy path that is a FIFO (refused at once, at start and on SIGHUP,
# instead of blocking the broker until someone writes to it).
set -uo pipefail

broker=${GPUIPC_BROKER:?} ctl=${GPUIPC_CTL:?}
dir=$(mktemp -d /tmp/gpuipc-args.XXXXXX)
pids=()
cleanup() {
        for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
        wait 2>/dev/null
        rm -rf "$dir"
}
trap cleanup EXIT

failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@" >/dev/null; then pass "$what"; else fail "$what"; fi; }

wait_ready() {
        for _ in $(seq 100); do
                "$ctl" --socket "$1" --timeout 100 ping >/dev/null 2>&1 && return 0
                sleep 0.05
        done
        return 1
}

# refuses WHAT PATTERN BROKER-ARGS...: the broker exits non-zero within 5 s (a broker that wrongly
# starts, or hangs, is killed by the deadline) and its output contains PATTERN.
refuses() {
        local what=$1 pattern=$2 rc
        shift 2
        timeout 5 "$@" >"$dir/out.log" 2>&1
        rc=$?
        if [[ $rc == 0 || $rc == 124 ]]; then
                fail "$what (exit status $rc: $(tail -c 300 "$dir/out.log"))"
        elif grep -q -- "$pattern" "$dir/out.log"; then
                pass "$what"
        else
                fail "$what (log: $(tail -c 300 "$dir/out.log"))"
        fi
}

# serves WHAT SOCKET BROKER-ARGS...: starts the broker in the background and waits for it to answer.
serves() {
        local what=$1 sock=$2
        shift 2
        "$@" 2>"$dir/serve.log" &
        pids+=($!)
        if wait_ready "$sock"; then pass "$what"; else fail "$what (log: $(tail -c 300 "$dir/serve.log"))"; fi
}

stop_last() { kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null; }

# ---- the socket path ----
refuses "--socket '' is an error, not the default path" "needs a path" \
        "$broker" --socket '' --seccomp off
refuses "GPUIPC_SOCKET='' is an error, not the default path" "GPUIPC_SOCKET is set but empty" \
        env GPUIPC_SOCKET= "$broker" --seccomp off

# ---- the socket mode ----
refuses "--socket-mode 0 is refused: no peer could connect" "lets no peer connect" \
        "$broker" --socket "$dir/m.sock" --socket-mode 0 --seccomp off
refuses "--socket-mode 0444 is refused: connecting needs write access" "lets no peer connect" \
        "$broker" --socket "$dir/m.sock" --socket-mode 0444 --seccomp off
refuses "--socket-mode 0999 names the bad value" "not '0999'" \
        "$broker" --socket "$dir/m.sock" --socket-mode 0999 --seccomp off
serves "--socket-mode 0600 serves" "$dir/m.sock" "$broker" --socket "$dir/m.sock" --socket-mode 0600 --seccomp off
expect "... with a 0600 socket" test "$(stat -c %a "$dir/m.sock")" == 600
stop_last

# ---- a policy file without rules ----
printf '# nothing allowed yet\n\n   \n' >"$dir/empty.conf"
serves "a policy file without rules is accepted" "$dir/e.sock" \
        "$broker" --socket "$dir/e.sock" --policy "$dir/empty.conf" --seccomp enforce
expect "... with a warning that it denies everything" grep -q "has no rules" "$dir/serve.log"
stop_last

# ---- a policy path that is a FIFO ----
mkfifo "$dir/fifo.conf"
refuses "a FIFO as the policy file is refused at once, not read forever" "not a regular file" \
        "$broker" --socket "$dir/f.sock" --policy "$dir/fifo.conf" --seccomp enforce
echo 'allow all any' >"$dir/policy.conf"
serves "a broker with a regular policy file serves" "$dir/f.sock" \
        "$broker" --socket "$dir/f.sock" --policy "$dir/policy.conf" --seccomp enforce
bpid=${pids[-1]}
rm "$dir/policy.conf" && mkfifo "$dir/policy.conf"
kill -HUP "$bpid"
for _ in $(seq 100); do grep -q "keeping the old policy" "$dir/serve.log" && break; sleep 0.05; done
expect "SIGHUP with the policy path turned into a FIFO keeps the old policy at once" \
        grep -q "keeping the old policy" "$dir/serve.log"
expect "... saying why" grep -q "not a regular file" "$dir/serve.log"
expect "... and the broker still answers" "$ctl" --socket "$dir/f.sock" --timeout 1000 ping
stop_last

# ---- the fd limit: the soft one is raised to the hard one at start ----
if command -v prlimit >/dev/null; then
        serves "a broker started with a soft fd limit of 256 (hard 4096) serves" "$dir/l.sock" \
                prlimit --nofile=256:4096 "$broker" --socket "$dir/l.sock" --seccomp enforce
        lpid=${pids[-1]}
        expect "... with its soft fd limit raised to the hard one" \
                grep -Eq '^Max open files +4096 +4096' "/proc/$lpid/limits"
        stop_last
else
        echo "skip the fd limit checks: no prlimit"
fi

# ---- the memory budget ----
refuses "--memory-budget 0 is refused" "at least 1M" "$broker" --socket "$dir/b.sock" --memory-budget 0 --seccomp off
refuses "--memory-budget below 1M is refused" "at least 1M" \
        "$broker" --socket "$dir/b.sock" --memory-budget 1023K --seccomp off
refuses "--memory-budget 8MB names the bad value" "not '8MB'" \
        "$broker" --socket "$dir/b.sock" --memory-budget 8MB --seccomp off
refuses "--memory-budget-per-uid -1 is refused" "at least 1M" \
        "$broker" --socket "$dir/b.sock" --memory-budget-per-uid -1 --seccomp off
serves "--memory-budget 8M serves" "$dir/b.sock" "$broker" --socket "$dir/b.sock" --memory-budget 8M --seccomp enforce
stats=$("$ctl" --socket "$dir/b.sock" stats)
expect "... with a budget of 8 MiB" grep -Eq '^memory_budget_bytes +8388608$' <<<"$stats"
expect "... a quarter of it for each uid" grep -Eq '^memory_uid_share_bytes +2097152$' <<<"$stats"
stop_last
serves "a per-uid share above the budget serves" "$dir/b.sock" \
        "$broker" --socket "$dir/b.sock" --memory-budget 2M --memory-budget-per-uid 4M --seccomp off
expect "... warning that it is the budget" grep -q "larger than the budget" "$dir/serve.log"
expect "... and using the budget" grep -Eq '^memory_uid_share_bytes +2097152$' <<<"$("$ctl" --socket "$dir/b.sock" stats)"
stop_last
# Without the flag: half the lowest memory.max from the broker's cgroup up, else a quarter of RAM.
serves "a broker without --memory-budget serves" "$dir/b.sock" "$broker" --socket "$dir/b.sock" --seccomp enforce
cg=$(sed -n 's/^0:://p' "/proc/${pids[-1]}/cgroup") limit=
while [[ -n $cg ]]; do
        f=/sys/fs/cgroup${cg%/}/memory.max
        if [[ -r $f && $(<"$f") != max ]] && [[ -z $limit || $(<"$f") -lt $limit ]]; then limit=$(<"$f"); fi
        [[ $cg == / ]] && break
        cg=${cg%/*}; cg=${cg:-/}
done
if [[ -n $limit ]]; then want=$((limit / 2)); else want=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 / 4)); fi
expect "... with half the cgroup's memory.max (${limit:-none}) or a quarter of RAM: $want" \
        grep -Eq "^memory_budget_bytes +$want\$" <<<"$("$ctl" --socket "$dir/b.sock" stats)"
stop_last

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
