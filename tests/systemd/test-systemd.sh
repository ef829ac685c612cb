#!/bin/bash
# systemd integration for hosts without Kubernetes, as far as a machine without systemd running can
# check it:
#   - `meson install` puts the unit, sysusers.d/gpuipc.conf and tmpfiles.d/gpuipc.conf under the
#     prefix, and `systemd-analyze verify` accepts the unit without a word;
#   - systemd-sysusers (--root) creates the gpuipc user and group, 65532 when free and another id
#     when not; systemd-tmpfiles (--root) creates /run/gpuipc 0750 gpuipc:gpuipc;
#   - the README's broker command, on a "fresh machine" (a private mount namespace whose /etc/passwd,
#     /etc/group and /run have never seen gpuipc): refused before the sysusers and tmpfiles steps
#     the README gives, serving after them, as user gpuipc with a 0660 socket of group gpuipc.
set -uo pipefail

root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?} ctl=${GPUIPC_CTL:?}
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles unshare; do
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
sysusers=$dir/dest$prefix/lib/sysusers.d/gpuipc.conf
tmpfiles=$dir/dest$prefix/lib/tmpfiles.d/gpuipc.conf
expect "meson installs the unit, sysusers.d/gpuipc.conf and tmpfiles.d/gpuipc.conf under $prefix/lib" \
        test -f "$unit" -a -f "$sysusers" -a -f "$tmpfiles"
expect "the unit runs the installed broker" grep -q "^ExecStart=$prefix/bin/gpuipc-broker " "$unit"
# verify wants ExecStart= to exist: point it at the built broker, change nothing else.
sed "s|^ExecStart=$prefix/bin/gpuipc-broker |ExecStart=$build/broker/gpuipc-broker |" "$unit" \
        >"$dir/gpuipc-broker.service"
out=$(systemd-analyze verify "$dir/gpuipc-broker.service" 2>&1)
expect "systemd-analyze verify accepts the unit without a warning${out:+ ($out)}" test -z "$out"
score=$(systemd-analyze security --offline=yes "$dir/gpuipc-broker.service" 2>/dev/null |
        sed -n 's/.*Overall exposure level for .*: \([0-9.]*\).*/\1/p')
expect "systemd-analyze security rates the unit's exposure low (${score:-?} of 10, at most 3)" \
        python3 -c "import sys; sys.exit(not (sys.argv[1] and float(sys.argv[1]) <= 3.0))" "$score"

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
