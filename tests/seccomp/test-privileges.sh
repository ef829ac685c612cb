#!/bin/bash
# Least privilege, checked on the running broker: started as root it becomes an unprivileged user,
# keeps no capabilities, sets no_new_privs, runs under seccomp, creates its socket 0660 with the
# requested group, and refuses socket paths an attacker could control. The policy file decides who
# may publish and attach what, and SIGHUP reloads it without dropping peers.
set -uo pipefail

broker=${GPUIPC_BROKER:?} ctl=${GPUIPC_CTL:?}
[[ $(id -u) == 0 ]] || { echo "needs root to switch users: skipped"; exit 77; }
command -v setpriv >/dev/null || { echo "setpriv (util-linux) missing: skipped"; exit 77; }
getent passwd 65534 >/dev/null || { echo "no user 65534: skipped"; exit 77; }

dir=$(mktemp -d /tmp/gpuipc-privs.XXXXXX)
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

# As an unprivileged client in the socket's group. In the background, run "${nobody[@]}" itself, not
# the function: a function in the background is a subshell, so $! would be the subshell, cleanup
# would kill that and orphan the client (which, reconnecting by default, retries for ever).
nobody=(setpriv --reuid 65534 --regid 65534 --clear-groups)
as_nobody() { "${nobody[@]}" "$@"; }

wait_ready() {
        for _ in $(seq 100); do
                "$ctl" --socket "$1" --timeout 0 ping >/dev/null 2>&1 && return 0
                sleep 0.05
        done
        return 1
}

# A /proc/PID/status field with its values separated by single spaces.
status_field() { awk -v k="$2:" '$1 == k { $1 = ""; print substr($0, 2) }' "/proc/$1/status"; }

# ---- dropping privileges ----
sock=$dir/s.sock
"$broker" --socket "$sock" --user 65534 --group 65534 --socket-group 65534 --seccomp enforce 2>"$dir/broker.log" &
bpid=$!
pids+=("$bpid")
expect "broker answers" wait_ready "$sock"
expect "uid is 65534 (real, effective, saved, fs)" test "$(status_field "$bpid" Uid)" == "65534 65534 65534 65534"
expect "gid is 65534" test "$(status_field "$bpid" Gid)" == "65534 65534 65534 65534"
expect "no supplementary groups" test -z "$(status_field "$bpid" Groups)"
expect "no effective capabilities" test "$(status_field "$bpid" CapEff)" == "0000000000000000"
expect "no permitted capabilities" test "$(status_field "$bpid" CapPrm)" == "0000000000000000"
expect "no ambient capabilities" test "$(status_field "$bpid" CapAmb)" == "0000000000000000"
expect "no_new_privs is set" test "$(status_field "$bpid" NoNewPrivs)" == "1"
expect "seccomp filter is loaded" test "$(status_field "$bpid" Seccomp)" == "2"
expect "socket mode is 0660" test "$(stat -c %a "$sock")" == "660"
expect "socket group is 65534" test "$(stat -c %g "$sock")" == "65534"
expect "an unprivileged client in the group connects" as_nobody "$ctl" --socket "$sock" ping
expect "a client outside the group is refused" \
        bash -c "! setpriv --reuid 65534 --regid 12345 --clear-groups '$ctl' --socket '$sock' --timeout 0 ping 2>/dev/null"
kill "$bpid"; wait "$bpid"
expect "broker exits 0 on SIGTERM" test $? == 0
# Unprivileged, it may not be able to remove its socket from a root-owned directory; the next
# start must then replace the stale socket.
"$broker" --socket "$sock" --seccomp enforce 2>"$dir/restart.log" &
pids+=($!)
expect "a restarted broker replaces a stale socket" wait_ready "$sock"
kill "${pids[-1]}"; wait "${pids[-1]}"
expect "a broker that may remove its socket does so at exit" test ! -e "$sock"

# ---- no process of the broker's uid may take its fds ----
# The Kubernetes manifests start the broker directly as its uid (no --user switch, which would
# make it non-dumpable by itself). A process of the same uid without capabilities, here even the
# broker's own parent (which Yama's ptrace_scope=1 would let through), must not be able to copy the
# broker's fds with pidfd_getfd() nor list them in /proc/PID/fd.
mkdir "$dir/same-uid" && chown 65534:65534 "$dir/same-uid"
# The system's Python: one in root's home (pyenv and the like) is out of reach for uid 65534.
system_python=$(command -v /usr/bin/python3 || command -v python3)
thief_out=$(as_nobody "$system_python" - "$broker" "$dir/same-uid/s.sock" "$ctl" 2>&1 <<'PY'
import ctypes, errno, os, subprocess, sys, time
broker, sock, ctl = sys.argv[1:4]
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_open, SYS_pidfd_getfd = 434, 438
p = subprocess.Popen([broker, "--socket", sock, "--seccomp", "enforce", "--log-level", "warn"])
try:
    for _ in range(100):
        if subprocess.run([ctl, "--socket", sock, "--timeout", "100", "ping"], capture_output=True).returncode == 0:
            break
        time.sleep(0.05)
    else:
        sys.exit("the broker did not start")
    print("proc-fd-owner", os.stat("/proc/%d/fd" % p.pid).st_uid)
    pidfd = libc.syscall(SYS_pidfd_open, p.pid, 0)
    if pidfd < 0:
        sys.exit("pidfd_open: %s" % os.strerror(ctypes.get_errno()))
    results = set()
    for target in range(3, 16):
        fd = libc.syscall(SYS_pidfd_getfd, pidfd, target, 0)
        if fd >= 0:
            results.add("stolen")
            os.close(fd)
        else:
            results.add(errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())))
    print("pidfd_getfd", ",".join(sorted(results)))
finally:
    p.terminate()
    p.wait()
PY
)
echo "$thief_out" | sed 's/^/     /'
expect "a same-uid process without capabilities gets EPERM from pidfd_getfd" \
        grep -qx "pidfd_getfd EPERM" <<<"$thief_out"
expect "the broker's /proc/PID/fd belongs to root (non-dumpable), not to its uid" \
        grep -qx "proc-fd-owner 0" <<<"$thief_out"

# ---- socket paths it refuses ----
refuses() {
        local what=$1 path=$2 pattern=$3
        # A broker that wrongly starts would serve forever: it gets a deadline.
        if timeout 10 "$broker" --socket "$path" --seccomp enforce 2>"$dir/refuse.log"; then
                fail "$what (broker started)"
        elif grep -q "$pattern" "$dir/refuse.log"; then
                pass "$what"
        else
                fail "$what (log: $(cat "$dir/refuse.log"))"
        fi
}
ln -s "$dir/elsewhere.sock" "$dir/link.sock"
refuses "refuses a socket path that is a symlink" "$dir/link.sock" "symlink"
mkdir "$dir/theirs" && chown 65534 "$dir/theirs"
refuses "refuses a directory owned by another user" "$dir/theirs/s.sock" "owned by another user"
mkdir "$dir/open" && chmod 0777 "$dir/open"
"$broker" --socket "$dir/open/s.sock" --seccomp enforce 2>"$dir/open.log" &
pids+=($!)
wait_ready "$dir/open/s.sock"
expect "warns about a world-writable directory (as Kubernetes makes emptyDirs) but serves" \
        grep -q "world-writable" "$dir/open.log"
kill "${pids[-1]}"; wait "${pids[-1]}"
touch "$dir/file.sock"
refuses "refuses to replace a file that is not a socket" "$dir/file.sock" "not a socket"
"$broker" --socket "$sock" --seccomp enforce 2>"$dir/first.log" &
pids+=($!)
wait_ready "$sock"
refuses "refuses a socket another broker listens on" "$sock" "another broker"
kill "${pids[-1]}"; wait "${pids[-1]}"
# Only a refused connection makes a socket stale. A live broker of another uid whose socket this
# one may not connect to (EACCES) and a live listener of another socket type (EPROTOTYPE) stay.
mkdir "$dir/shared" && chmod 0777 "$dir/shared"
"$broker" --socket "$dir/shared/s.sock" --socket-mode 0600 --seccomp enforce 2>"$dir/owner.log" &
pids+=($!)
wait_ready "$dir/shared/s.sock"
if as_nobody timeout 10 "$broker" --socket "$dir/shared/s.sock" --seccomp enforce 2>"$dir/intruder.log"; then
        fail "a broker of another uid refuses a live socket it may not connect to (it started)"
else
        expect "a broker of another uid refuses a live socket it may not connect to (EACCES)" \
                grep -q "cannot tell whether something listens" "$dir/intruder.log"
fi
expect "... and the live broker's socket is still there and answers" \
        "$ctl" --socket "$dir/shared/s.sock" --timeout 1000 ping
kill "${pids[-1]}"; wait "${pids[-1]}"
"$system_python" -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(8)
print("listening", flush=True)
time.sleep(60)' "$dir/stream.sock" >"$dir/stream.out" &
pids+=($!)
for _ in $(seq 100); do grep -q listening "$dir/stream.out" && break; sleep 0.05; done
refuses "refuses a live listener of another socket type (EPROTOTYPE)" "$dir/stream.sock" "another socket type"
expect "... and leaves its socket alone" test -S "$dir/stream.sock"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
# The directory may belong to the account --user names: the check is made for the uid the broker
# will run as, not for root, which it still is while it binds.
mkdir "$dir/users" && chown 65534:65534 "$dir/users"
"$broker" --socket "$dir/users/s.sock" --user 65534 --group 65534 --seccomp enforce 2>"$dir/users.log" &
pids+=($!)
expect "accepts a socket directory owned by the --user account" wait_ready "$dir/users/s.sock"
kill "${pids[-1]}"; wait "${pids[-1]}"

# ---- policy, and reloading it ----
cat >"$dir/policy.conf" <<'POLICY'
# uid 65534 may publish and attach under allowed/ only
allow publish,attach uid=65534 prefix=allowed/
POLICY
"$broker" --socket "$sock" --user 65534 --group 65534 --socket-group 65534 --policy "$dir/policy.conf" \
        --seccomp enforce 2>"$dir/policy.log" &
bpid=$!
pids+=("$bpid")
wait_ready "$sock"
"${nobody[@]}" "$ctl" --socket "$sock" watch >/dev/null 2>&1 &
pids+=($!)
expect "publishing outside the allowed prefix is denied" \
        bash -c "setpriv --reuid 65534 --regid 65534 --clear-groups '$ctl' --socket '$sock' publish other/x --size 4096 2>&1 | grep -q '\\[denied\\]'"
"${nobody[@]}" "$ctl" --socket "$sock" publish allowed/x --size 4096 --retire-after 1 >"$dir/pub.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q published "$dir/pub.out" && break; sleep 0.05; done
expect "publishing inside the allowed prefix works" grep -q published "$dir/pub.out"
peers_before=$("$ctl" --socket "$sock" --json stats | jq .peers)
cat >"$dir/policy.conf" <<'POLICY'
allow publish,attach uid=65534
POLICY
kill -HUP "$bpid"
for _ in $(seq 100); do grep -q "policy reloaded" "$dir/policy.log" && break; sleep 0.05; done
expect "SIGHUP reloads the policy" grep -q "policy reloaded" "$dir/policy.log"
expect "after the reload the other prefix may be attached (waits, then times out: not denied)" \
        bash -c "setpriv --reuid 65534 --regid 65534 --clear-groups '$ctl' --socket '$sock' attach other/y --wait 100 2>&1 | grep -q timeout"
peers_after=$("$ctl" --socket "$sock" --json stats | jq .peers)
expect "peers stay connected across the reload ($peers_before before, $peers_after after)" test "$peers_before" == "$peers_after"
echo 'allow publish uid=65534 this-is-not-a-rule' >"$dir/policy.conf"
kill -HUP "$bpid"
for _ in $(seq 100); do grep -q "keeping the old policy" "$dir/policy.log" && break; sleep 0.05; done
expect "an invalid policy is refused on reload and the old one kept" grep -q "keeping the old policy" "$dir/policy.log"
expect "the broker still serves after a bad reload" as_nobody "$ctl" --socket "$sock" ping

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
