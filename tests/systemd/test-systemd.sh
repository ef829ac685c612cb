#!/bin/bash
# systemd integration for hosts without Kubernetes, as far as a machine without systemd running can
# check it:
#   - `meson install` puts the service and socket units, sysusers.d/gpuipc.conf and
#     tmpfiles.d/gpuipc.conf under the prefix, `systemd-analyze verify` accepts both units without
#     a word, `systemd-analyze security` rates the service's exposure low, and its
#     SystemCallFilter= lets through every system call of seccomp/gpuipc-broker.allow the broker
#     makes (its filter would otherwise kill the broker at start);
#   - Type=notify: with NOTIFY_SOCKET set the broker sends READY=1, and a client that tries once
#     (--timeout 0) the moment it arrives finds the broker serving; STOPPING=1 at SIGTERM; a
#     NOTIFY_SOCKET whose queue is full (its receiver never reads) costs the notifications (logged),
#     never the start nor the stop;
#   - socket activation: under systemd-socket-activate (a socket passed as a .socket unit passes
#     it, LISTEN_FDS), the first connection starts the broker, which serves the passed socket and
#     notifies; a --socket given as well is refused;
#   - systemd-sysusers (--root) creates the gpuipc user and group, 65532 when free and another id
#     when not; systemd-tmpfiles (--root) creates /run/gpuipc 0750 gpuipc:gpuipc;
#   - the README's broker command, on a "fresh machine" (a private mount namespace whose /etc/passwd,
#     /etc/group and /run have never seen gpuipc): refused before the sysusers and tmpfiles steps
#     the README gives, serving after them, as user gpuipc with a 0660 socket of group gpuipc.
set -uo pipefail

root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?} ctl=${GPUIPC_CTL:?}
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles systemd-socket-activate unshare; do
        command -v $tool >/dev/null || { echo "$tool is not installed: skipped"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "needs root (a private mount namespace): skipped"; exit 77; }

dir=$(mktemp -d /tmp/gpuipc-systemd.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$dir"' EXIT
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }

# ---- installed files ----
meson install -C "$build" --destdir "$dir/dest" --no-rebuild --quiet >/dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
        'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
unit=$dir/dest$prefix/lib/systemd/system/gpuipc-broker.service
socket_unit=$dir/dest$prefix/lib/systemd/system/gpuipc-broker.socket
sysusers=$dir/dest$prefix/lib/sysusers.d/gpuipc.conf
tmpfiles=$dir/dest$prefix/lib/tmpfiles.d/gpuipc.conf
expect "meson installs the service and socket units, sysusers.d/gpuipc.conf and tmpfiles.d/gpuipc.conf under $prefix/lib" \
        test -f "$unit" -a -f "$socket_unit" -a -f "$sysusers" -a -f "$tmpfiles"
expect "the unit runs the installed broker" grep -q "^ExecStart=$prefix/bin/gpuipc-broker " "$unit"
expect "the service is Type=notify and needs its socket unit" \
        bash -c "grep -qx 'Type=notify' '$unit' && grep -qx 'Requires=gpuipc-broker.socket' '$unit'"
expect "the socket unit listens on the socket the clients use, 0660 gpuipc" bash -c \
        "grep -qx 'ListenSequentialPacket=/run/gpuipc/gpuipc.sock' '$socket_unit' && grep -qx 'SocketMode=0660' '$socket_unit' && grep -qx 'SocketGroup=gpuipc' '$socket_unit'"
expect "socket activation: ExecStart= names no socket of its own" bash -c "! grep -q '^ExecStart=.*--socket ' '$unit'"
# verify wants ExecStart= to exist: point it at the built broker, change nothing else; and the man
# pages the units name installed (MANPATH: the staged install).
sed "s|^ExecStart=$prefix/bin/gpuipc-broker |ExecStart=$build/broker/gpuipc-broker |" "$unit" \
        >"$dir/gpuipc-broker.service"
cp "$socket_unit" "$dir/gpuipc-broker.socket"
out=$(cd "$dir" && MANPATH=$dir/dest$prefix/share/man systemd-analyze verify gpuipc-broker.service gpuipc-broker.socket 2>&1)
expect "systemd-analyze verify accepts both units without a warning${out:+ ($out)}" test -z "$out"
score=$(systemd-analyze security --offline=yes "$dir/gpuipc-broker.service" 2>/dev/null |
        sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
expect "systemd-analyze security rates the unit's exposure low (${score:-?} of 10, at most 3)" \
        python3 -c "import sys; sys.exit(not (sys.argv[1] and float(sys.argv[1]) <= 3.0))" "$score"

# The unit's SystemCallFilter=, expanded the way systemd does, against the allow-list's [runtime]
# and [startup] calls (those only a container runtime makes left out).
filter=$(sed -n 's/^SystemCallFilter=//p' "$unit")
missing=$(python3 - "$root/seccomp/gpuipc-broker.allow" $filter <<'PY'
import re, subprocess, sys
allowed, seen = set(), set()
def expand(item):
    if not item.startswith('@'):
        allowed.add(item)
        return
    if item in seen:
        return
    seen.add(item)
    out = subprocess.run(['systemd-analyze', 'syscall-filter', item], capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        line = line.strip()
        if line and not line.startswith('#'):
            expand(line)
for item in sys.argv[2:]:
    expand(item)
section, need = None, []
for line in open(sys.argv[1]):
    if line.startswith('['):
        section = line.strip()
    elif line.strip() and not line.startswith('#') and section in ('[runtime]', '[startup]'):
        name, reason = re.match(r'(\w+)\S*\s+(.*)', line).groups()
        if not re.match(r"(runc's init|the container runtime)", reason):
            need.append(name)
print(' '.join(n for n in need if n not in allowed))
PY
)
expect "SystemCallFilter=$filter lets through every call the broker makes${missing:+ (not: $missing)}" \
        test -n "$filter" -a -z "$missing"

# ---- Type=notify and socket activation ----
listener() { python3 "$root/tests/systemd/notify_listener.py" "$@"; }
wait_for() { # FILE TEXT: up to 20 s
        for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
        return 1
}
listener "$dir/n1.sock" "$ctl" --socket "$dir/direct.sock" --timeout 0 ls >"$dir/n1.out" 2>&1 &
lpid=$!
wait_for "$dir/n1.out" bound
NOTIFY_SOCKET=$dir/n1.sock "$build/broker/gpuipc-broker" --socket "$dir/direct.sock" --seccomp enforce \
        --log-level warn 2>"$dir/direct.log" &
bpid=$!
wait_for "$dir/n1.out" check-exit
expect "Type=notify: READY=1 comes ($(grep NOTIFY "$dir/n1.out" | head -1))" grep -q '^NOTIFY READY=1' "$dir/n1.out"
expect "... and a client trying once the moment it comes finds the broker serving ($(grep check-exit "$dir/n1.out"))" grep -q "^check-exit=0 " "$dir/n1.out"
kill -TERM $bpid
wait $bpid
rc=$?
expect "... exit 0 on SIGTERM ($rc)" test $rc == 0
wait $lpid
expect "... and STOPPING=1 before it" grep -q '^NOTIFY STOPPING=1' "$dir/n1.out"

# A NOTIFY_SOCKET whose queue is full (its receiver never reads): READY=1 and STOPPING=1 are dropped
# (logged), never waited for; the broker serves and stops on SIGTERM as without one.
python3 "$root/tests/systemd/notify_listener.py" --full "$dir/n3.sock" >"$dir/n3.out" 2>&1 & # $!: python itself
fpid=$!
wait_for "$dir/n3.out" full
NOTIFY_SOCKET=$dir/n3.sock "$build/broker/gpuipc-broker" --socket "$dir/full.sock" --seccomp enforce \
        --log-level warn --log-format json 2>"$dir/full.log" &
bpid=$!
for _ in $(seq 200); do [[ -S $dir/full.sock ]] && break; sleep 0.05; done
out=$("$ctl" --socket "$dir/full.sock" --timeout 10000 ping 2>&1)
expect "a full NOTIFY_SOCKET ($(cat "$dir/n3.out")): the broker answers a client all the same ($out)" \
        grep -q '^ok' <<<"$out"
kill -TERM $bpid
running() { [[ -e /proc/$1 && $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) != Z ]]; }
for _ in $(seq 100); do running $bpid || break; sleep 0.1; done
if running $bpid; then stopped="still running 10 s after SIGTERM"; kill -KILL $bpid; else stopped=stopped; fi
wait $bpid
rc=$?
expect "... and stops on SIGTERM within 10 s with exit 0 ($stopped, exit $rc)" test "$stopped,$rc" == stopped,0
expect "... logging each notification it dropped" \
        bash -c "grep -q '\"message\":\"READY=1' '$dir/full.log' && grep -q '\"message\":\"STOPPING=1' '$dir/full.log'"
kill $fpid 2>/dev/null
wait $fpid 2>/dev/null

listener "$dir/n2.sock" >"$dir/n2.out" 2>&1 &
lpid=$!
wait_for "$dir/n2.out" bound
systemd-socket-activate --seqpacket -l "$dir/activated.sock" -E "NOTIFY_SOCKET=$dir/n2.sock" \
        "$build/broker/gpuipc-broker" --seccomp enforce --log-level info >"$dir/activated.log" 2>&1 &
apid=$!
for _ in $(seq 100); do [[ -S $dir/activated.sock ]] && break; sleep 0.05; done
out=$("$ctl" --socket "$dir/activated.sock" --timeout 10000 ping 2>&1)
expect "socket activation: the first connection starts the broker, which answers ($out)" grep -q '^ok' <<<"$out"
expect "... serving the socket it was passed" grep -q 'serving an inherited socket' "$dir/activated.log"
wait_for "$dir/n2.out" READY
expect "... and notifying READY=1" grep -q '^NOTIFY READY=1' "$dir/n2.out"
kill -TERM $apid
wait $apid
rc=$?
expect "... stopping on SIGTERM with exit 0 ($rc), leaving the passed socket alone" \
        bash -c "[[ $rc == 0 && -S '$dir/activated.sock' ]]"
wait $lpid
out=$(systemd-socket-activate --seqpacket -l "$dir/both.sock" "$build/broker/gpuipc-broker" --socket "$dir/other.sock" \
        --seccomp enforce 2>&1 & sleep 0.3; "$ctl" --socket "$dir/both.sock" --timeout 0 ping >/dev/null 2>&1; wait)
expect "a passed socket and --socket as well are refused ($(tail -1 <<<"$out"))" \
        grep -q 'systemd passed a listening socket and --socket' <<<"$out"

# ---- sysusers and tmpfiles in a root of their own ----
mkdir -p "$dir/r1/etc"
systemd-sysusers --root="$dir/r1" "$sysusers" 2>"$dir/sysusers.log"
expect "sysusers: user gpuipc, 65532:65532, no shell" \
        grep -qx 'gpuipc:x:65532:65532:gpuipc broker:/nonexistent:/usr/sbin/nologin' "$dir/r1/etc/passwd"
expect "sysusers: group gpuipc 65532" grep -qx 'gpuipc:x:65532:' "$dir/r1/etc/group"
systemd-tmpfiles --root="$dir/r1" --create "$tmpfiles" 2>"$dir/tmpfiles.log"
expect "tmpfiles: /run/gpuipc 0750 gpuipc:gpuipc ($(stat -c '%a %u:%g' "$dir/r1/run/gpuipc" 2>&1))" \
        test "$(stat -c '%a %u:%g' "$dir/r1/run/gpuipc")" == "750 65532:65532"
mkdir -p "$dir/r2/etc"
echo 'taken:x:65532:65532::/:/usr/sbin/nologin' >"$dir/r2/etc/passwd"
echo 'taken:x:65532:' >"$dir/r2/etc/group"
systemd-sysusers --root="$dir/r2" "$sysusers" 2>/dev/null
expect "sysusers: another id when 65532 is taken ($(grep '^gpuipc:' "$dir/r2/etc/passwd"))" \
        bash -c "grep -q '^gpuipc:x:[0-9]*:' '$dir/r2/etc/passwd' && ! grep -q '^gpuipc:x:65532:' '$dir/r2/etc/passwd'"

# ---- the README's command on a fresh machine ----
# The command as the README shows it, continuation lines joined, the optional [...] dropped.
readme_cmd=$(awk '/^gpuipc-broker --socket/ { on = 1 } on { line = $0; cont = sub(/\\$/, "", line); printf "%s ", line; if (!cont) exit }' \
        "$root/README.md" | sed 's/\[[^]]*\]//g')
expect "the README shows a broker command with --user and --socket-group gpuipc ($readme_cmd)" \
        bash -c '[[ $1 == *"--user gpuipc"* && $1 == *"--socket-group gpuipc"* ]]' _ "$readme_cmd"
if grep -q '^gpuipc:' /etc/passwd /etc/group; then
        echo "this machine already has a gpuipc user: the fresh-machine part is skipped"
else
        # $1: whether to run the README's sysusers and tmpfiles steps first.
        fresh_machine() {
                unshare --mount --propagation private bash -c '
                        set -u
                        dir=$1 sysusers=$2 tmpfiles=$3 steps=$4 ctl=$5 cmd=$6
                        export PATH=$7:$PATH # where the README expects gpuipc-broker installed
                        # A copy of /etc in its place: sysusers replaces files by rename.
                        rm -rf "$dir/etc" && cp -a /etc "$dir/etc" && mount --bind "$dir/etc" /etc
                        mount -t tmpfs -o mode=0755 tmpfs /run
                        if [[ $steps == yes ]]; then
                                systemd-sysusers "$sysusers" || exit 10
                                systemd-tmpfiles --create "$tmpfiles" || exit 11
                        else
                                mkdir -p /run/gpuipc
                        fi
                        eval "exec $cmd" 2>"$dir/broker.log" &
                        pid=$!
                        for _ in $(seq 100); do
                                "$ctl" --timeout 0 ping >/dev/null 2>&1 && break
                                kill -0 $pid 2>/dev/null || { wait $pid; echo "broker exited $?"; exit 1; }
                                sleep 0.05
                        done
                        echo "uid=$(stat -c %U /proc/$pid) socket=$(stat -c "%a %G" /run/gpuipc/gpuipc.sock)"
                        kill -TERM $pid
                        wait $pid
                        echo "exit=$?"
                ' _ "$dir" "$sysusers" "$tmpfiles" "$1" "$ctl" "$readme_cmd" "$build/broker"
        }
        out=$(fresh_machine no 2>&1)
        expect "without the README's sysusers step the command is refused ($(tail -1 "$dir/broker.log"))" \
                grep -q "unknown \(group\|user\)" "$dir/broker.log"
        out=$(fresh_machine yes 2>&1)
        # The directory is gpuipc's, as the unit and the node-broker hostPath need: a broker that
        # refuses a socket directory owned by its --user account (issue 9 item 4) fails here.
        expect "after systemd-sysusers and systemd-tmpfiles the README's command serves ($out; $(tail -1 "$dir/broker.log"))" \
                grep -q "uid=gpuipc socket=660 gpuipc" <<<"$out"
        expect "... and stops with exit status 0 on SIGTERM" grep -q "exit=0" <<<"$out"
        expect "... the host's /etc/passwd was left alone" bash -c "! grep -q '^gpuipc:' /etc/passwd"
fi

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
