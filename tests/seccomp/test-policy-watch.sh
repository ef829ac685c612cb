#!/bin/bash
# A policy replaced on disk takes effect without a SIGHUP, with the broker confined as in production
# (unprivileged user, Landlock, seccomp enforce):
#   - a ConfigMap volume, laid out and updated the way the kubelet does it: the data in a timestamped
#     directory, `..data` a symlink to it, `policy.conf -> ..data/policy.conf`; an update writes a new
#     directory, points `..data_tmp` at it and renames that over `..data`, then removes the old one;
#   - a plain file, rewritten in place and replaced by rename (an editor's way).
# An update that does not parse keeps the old policy, and later updates still apply.
set -uo pipefail

broker=${GPUIPC_BROKER:?} ctl=${GPUIPC_CTL:?}
[[ $(id -u) == 0 ]] || { echo "needs root to switch users: skipped"; exit 77; }
command -v setpriv >/dev/null || { echo "setpriv (util-linux) missing: skipped"; exit 77; }
getent passwd 65534 >/dev/null || { echo "no user 65534: skipped"; exit 77; }

dir=$(mktemp -d /tmp/gpuipc-policy-watch.XXXXXX)
chmod 0755 "$dir"
pids=()
cleanup() {
        for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
        wait 2>/dev/null
        rm -rf "$dir"
}
trap cleanup EXIT

failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }

NARROW='allow publish,attach uid=65534 prefix=allowed/'
WIDE='allow publish,attach uid=65534'

# What an unprivileged peer gets for attaching other/x: "denied" or, when the policy lets it wait,
# "timeout" (nothing is published under that name).
verdict() {
        local out
        out=$(setpriv --reuid 65534 --regid 65534 --clear-groups "$ctl" --socket "$1" attach other/x \
                --wait 50 2>&1)
        case $out in
        *"[denied]"*) echo denied ;;
        *timeout*) echo timeout ;;
        *) echo "other: $out" ;;
        esac
}

# Waits (up to 5 s) until the log has one more line matching $2 than $3 lines, then for the verdict.
wait_log() {
        local log=$1 pattern=$2 before=$3
        for _ in $(seq 100); do
                (($(grep -c "$pattern" "$log") > before)) && return 0
                sleep 0.05
        done
        return 1
}
count() { grep -c "$2" "$1"; }

start_broker() {
        local sock=$1 policy=$2 log=$3
        "$broker" --socket "$sock" --user 65534 --group 65534 --socket-group 65534 --policy "$policy" \
                --seccomp enforce 2>"$log" &
        pids+=($!)
        for _ in $(seq 100); do
                "$ctl" --socket "$sock" --timeout 0 ping >/dev/null 2>&1 && return 0
                sleep 0.05
        done
        return 1
}

confined() {
        local pid=$1
        [[ $(awk '$1 == "Seccomp:" { print $2 }' "/proc/$pid/status") == 2 &&
                $(awk '$1 == "Uid:" { print $2 }' "/proc/$pid/status") == 65534 ]]
}

# ---- a ConfigMap volume ----
cm=$dir/configmap
mkdir -p "$cm"
generation=0
configmap_write() {
        local old new
        old=$(readlink "$cm/..data" 2>/dev/null)
        generation=$((generation + 1))
        new=..2026_01_01_00_00_00.$generation
        mkdir "$cm/$new"
        printf '%s\n' "$1" >"$cm/$new/policy.conf"
        chmod -R a+rX "$cm/$new"
        ln -s "$new" "$cm/..data_tmp"
        mv -T "$cm/..data_tmp" "$cm/..data"
        [[ -e $cm/policy.conf ]] || ln -s ..data/policy.conf "$cm/policy.conf"
        [[ -n $old ]] && rm -rf "${cm:?}/$old"
        return 0
}
configmap_write "$NARROW"
sock=$dir/cm.sock log=$dir/cm.log
expect "broker starts with the ConfigMap's policy" start_broker "$sock" "$cm/policy.conf" "$log"
bpid=${pids[-1]}
expect "the first policy applies: other/ is denied" test "$(verdict "$sock")" == denied

n=$(count "$log" "policy reloaded")
configmap_write "$WIDE"
expect "a ConfigMap update (..data swapped) reloads the policy without SIGHUP" wait_log "$log" "policy reloaded" "$n"
expect "the reload says what triggered it" grep -q "policy reloaded rules=1 trigger=file" "$log"
expect "the new policy applies: other/ may be attached" test "$(verdict "$sock")" == timeout

n=$(count "$log" "keeping the old policy")
configmap_write "allow publish uid=65534 this-is-not-a-rule"
expect "an update that does not parse is refused" wait_log "$log" "keeping the old policy" "$n"
expect "... and the old policy stays in force" test "$(verdict "$sock")" == timeout

n=$(count "$log" "policy reloaded")
configmap_write "$NARROW"
expect "a later update still applies" wait_log "$log" "policy reloaded" "$n"
expect "... other/ is denied again" test "$(verdict "$sock")" == denied
expect "the broker is still confined (seccomp filter, uid 65534) and alive" confined "$bpid"
expect "its filter never fired" bash -c "! grep -q 'seccomp:' '$log'"

# ---- a plain file ----
plain=$dir/plain
mkdir "$plain" && chmod 0755 "$plain"
printf '%s\n' "$NARROW" >"$plain/policy.conf"
chmod 0644 "$plain/policy.conf"
sock=$dir/plain.sock log=$dir/plain.log
expect "broker starts with a plain policy file" start_broker "$sock" "$plain/policy.conf" "$log"
bpid=${pids[-1]}
n=$(count "$log" "policy reloaded")
printf '%s\n' "$WIDE" >"$plain/policy.conf"
expect "rewriting the file in place reloads it once it is closed" wait_log "$log" "policy reloaded" "$n"
expect "... and applies" test "$(verdict "$sock")" == timeout
n=$(count "$log" "policy reloaded")
printf '%s\n' "$NARROW" >"$plain/policy.conf.new"
chmod 0644 "$plain/policy.conf.new"
mv "$plain/policy.conf.new" "$plain/policy.conf"
expect "renaming a new file into place reloads it" wait_log "$log" "policy reloaded" "$n"
expect "... and applies" test "$(verdict "$sock")" == denied
n=$(count "$log" "policy reloaded")
touch "$plain/unrelated"
sleep 0.3
expect "other files in the directory do not reload it" test "$(count "$log" "policy reloaded")" == "$n"
expect "the broker is still confined and alive" confined "$bpid"

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
