#!/bin/bash
# The images, built for real from the Dockerfile and run the way docs/operations.md says:
#   1. a local Debian base: debootstrap (minbase, from the Debian archive) imported as debian:12 and,
#      without documentation and locales like the real one, debian:12-slim; no registry is used;
#   2. podman builds the broker image, the client target and examples/app-image/Dockerfile on a
#      python3 stand-in for the PyTorch base;
#   3. their contents: libgpuipc where the loader looks (no lib64), no development files, every
#      library the binaries need (or the exporter loads) present, no runtime package nothing needs, a client that needs libc
#      alone (and no newer glibc than Ubuntu 22.04's);
#   4. the broker container non-root, read-only root, --cap-drop ALL, no network, the shipped seccomp
#      profile with no_new_privs; a producer and a verifying consumer container of the image, and a
#      Python consumer in the app image that loads libgpuipc by its soname, all under uids other than
#      the broker's, through a shared socket volume; the exporter sidecar (metrics --listen) of the
#      image, confined, answers a scrape; the broker stops cleanly on SIGTERM.
# The debootstrap result and podman's storage stay in BUILD/image-test, so a rerun builds only what
# changed. Exit 77 (skipped), saying why, where containers cannot be built or run.
set -euo pipefail

root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
cache=$build/image-test
suite=localhost/gpuipc-test
tag=$$
containers=() volumes=()
failures=0

skip() { echo "SKIP: $*"; exit 77; }
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }

[[ $(id -u) == 0 ]] || skip "needs root: debootstrap, and podman with its storage in the build directory"
command -v podman >/dev/null || skip "podman is not installed (Debian: podman)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (Debian: debootstrap)"
command -v readelf >/dev/null || skip "readelf is not installed (Debian: binutils)"

mkdir -p "$cache"
# Containers (those of the builds' RUN steps too) get limits they can have: podman would ask for its
# maximum fds and processes, which fails where root may not raise a hard limit (no
# CAP_SYS_RESOURCE), and it runs conmon, the containers' parent, with at most 32768 processes.
limit() { local v; v=$(ulimit "$1"); [[ $v == unlimited ]] && v=$2; echo $((v < $2 ? v : $2)); }
cat >"$cache/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$(limit -Sn 1048576):$(limit -Hn 1048576)", "nproc=$(limit -Su 32768):$(limit -Hu 32768)"]
CONF
# Private storage, so the test neither uses nor changes the machine's images. cgroupfs and file
# events: no systemd or journald needed.
pm() {
        CONTAINERS_CONF=$cache/containers.conf podman --root "$cache/storage" --runroot "$cache/run" --tmpdir "$cache/tmp" --storage-driver overlay \
                --cgroup-manager cgroupfs --events-backend file "$@"
}

# Build containers of an interrupted build, and their mounts (which would keep the build
# directory from being removed).
drop_build_containers() {
        local ids
        ids=$(pm ps -a --external -q 2>/dev/null) || return 0
        [[ -z $ids ]] || pm rm -f --storage $ids >/dev/null 2>&1 || true
}
cleanup() {
        for c in "${containers[@]}"; do pm rm -f "$c" >/dev/null 2>&1 || true; done
        for v in "${volumes[@]}"; do pm volume rm -f "$v" >/dev/null 2>&1 || true; done
        pm image unmount -a >/dev/null 2>&1 || true
        drop_build_containers
}
trap cleanup EXIT
pm rm -af >/dev/null 2>&1 || true # left over by an interrupted run
drop_build_containers

# ---- 1. the Debian base images ----
# debootstrap's minbase is Debian's own base set; the real images are built from the same packages.
make_bases() {
        local tmp=$cache/rootfs.tmp
        rm -rf "$tmp"
        if ! debootstrap --variant=minbase bookworm "$tmp" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1; then
                rm -rf "$tmp"
                grep -q "Failed getting release file\|Temporary failure resolving\|Could not connect" \
                        "$cache/debootstrap.log" && skip "the Debian archive is not reachable: $(tail -1 "$cache/debootstrap.log")"
                cat "$cache/debootstrap.log"
                echo "FAIL debootstrap"
                exit 1
        fi
        # The archive's suites as the real image lists them; no package lists or caches in the image.
        rm -f "$tmp/etc/apt/sources.list"
        cat >"$tmp/etc/apt/sources.list.d/debian.sources" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
        rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb
        tar -C "$tmp" --numeric-owner -cf "$cache/debian-12.tar.tmp" .
        # slim: what Docker's debian:12-slim leaves out, and tells dpkg to leave out from then on.
        cat >"$tmp/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
DPKG
        find "$tmp/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
        rm -rf "$tmp"/usr/share/man/* "$tmp"/usr/share/groff/* "$tmp"/usr/share/info/* \
                "$tmp"/usr/share/locale/* "$tmp"/usr/share/lintian/*
        tar -C "$tmp" --numeric-owner -cf "$cache/debian-12-slim.tar.tmp" .
        rm -rf "$tmp"
        mv "$cache/debian-12.tar.tmp" "$cache/debian-12.tar"
        mv "$cache/debian-12-slim.tar.tmp" "$cache/debian-12-slim.tar"
}
if [[ ! -f $cache/debian-12.tar || ! -f $cache/debian-12-slim.tar ]]; then
        echo "# debootstrap bookworm (minbase), once per build directory"
        make_bases
fi
# Tagged as Docker Hub names them, so that FROM debian:12 resolves to them (and --pull=never makes
# sure nothing is fetched).
for base in debian-12 debian-12-slim; do
        ref=docker.io/library/${base/-12/:12}
        pm image exists "$ref" || pm import --quiet --change 'CMD ["bash"]' "$cache/$base.tar" "$ref" >/dev/null
done

# Can this machine run a container at all? (Not our code: the plain base image.)
if ! out=$(pm run --rm --network none docker.io/library/debian:12-slim true 2>&1); then
        skip "podman cannot run a container here: $out"
fi

# ---- 2. the builds ----
# The build stages need the Debian archive (apt-get), hence the host's network; nothing else does.
build_image() {
        local what=$1 log=$cache/build-$2.log
        shift 2
        if pm build --pull=never --network host --layers "$@" >"$log" 2>&1; then
                pass "builds: $what"
        else
                fail "builds: $what"
                tail -40 "$log"
                exit 1
        fi
}
# The build context is the source tree as .dockerignore trims it; a build directory inside it that
# .dockerignore does not name (any but build*/) is left out too, podman's storage with it.
ignore=$cache/dockerignore
cp "$root/.dockerignore" "$ignore"
real_root=$(realpath "$root") real_build=$(realpath "$build")
[[ $real_build == "$real_root"/* ]] && echo "${real_build#"$real_root"/}" >>"$ignore"
echo "# building (logs in $cache/build-*.log)"
build_image "the broker image (default target)" broker -t "$suite/gpuipc" -f "$root/Dockerfile" \
        --ignorefile "$ignore" "$root"
build_image "the client image (--target client)" client -t "$suite/gpuipc-client" --target client \
        -f "$root/Dockerfile" --ignorefile "$ignore" "$root"
build_image "the python3 stand-in for the PyTorch base" python-base -t "$suite/python-base" \
        -f "$root/tests/image/python-base.Dockerfile" "$root/tests/image"
build_image "examples/app-image on it" app -t "$suite/app" --build-arg "GPUIPC_CLIENT=$suite/gpuipc-client" \
        --build-arg "APP_BASE=$suite/python-base" -f "$root/examples/app-image/Dockerfile" "$root/examples/app-image"

# ---- 3. what the images hold ----
echo "# contents"
broker_fs=$(pm image mount "$suite/gpuipc")
client_fs=$(pm image mount "$suite/gpuipc-client")
slim_fs=$(pm image mount docker.io/library/debian:12-slim)
multiarch=$(gcc -print-multiarch)
needed() { readelf -d "$@" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u; }
# What the exporter (gpuipcctl metrics --listen) loads when it starts instead of linking it
# (libseccomp, libmicrohttpd): the broker image, which runs the exporter sidecar, needs them too.
exporter_loads=$(grep -ho 'dlopen("lib[^"]*"' "$root"/cli/*.c | sed 's/dlopen("\(.*\)"/\1/' | sort -u | tr '\n' ' ')

expect "broker image: gpuipc-broker and gpuipcctl in /usr/bin" test -x "$broker_fs/usr/bin/gpuipc-broker" -a \
        -x "$broker_fs/usr/bin/gpuipcctl"
expect "broker image: the seccomp profile in /usr/share/gpuipc/seccomp" \
        cmp -s "$root/seccomp/gpuipc-broker.json" "$broker_fs/usr/share/gpuipc/seccomp/gpuipc-broker.json"
dev_files=$(cd "$broker_fs" && find usr/include usr/lib64 usr/lib -name 'gpuipc*.h' -o -name '*.pc' -o -name '*.a' \
        -o -name 'libgpuipc.so' -o -path 'usr/lib64/libgpuipc*' 2>/dev/null || true)
expect "broker image: no headers, pkg-config files, archives or lib64 (${dev_files:-none})" test -z "$dev_files"
expect "broker image: no Python module without a Python" test -z "$(find "$broker_fs/usr" -name 'gpuipc.py')"
missing=
for lib in $(needed "$broker_fs/usr/bin/gpuipc-broker" "$broker_fs/usr/bin/gpuipcctl") $exporter_loads; do
        [[ -e $broker_fs/usr/lib/$multiarch/$lib || -e $broker_fs/lib/$multiarch/$lib || $lib == ld-linux* ]] ||
                missing+=" $lib"
done
expect "broker image: every library the binaries need or the exporter loads ($exporter_loads) is there (missing:${missing:- none})" test -z "$missing"
# Each package the Dockerfile adds to debian:12-slim must provide a library a gpuipc binary needs
# or the exporter loads (or be pulled in by one that does).
extra=$(python3 - "$slim_fs" "$broker_fs" "$(dpkg --print-architecture)" $(needed "$broker_fs/usr/bin/gpuipc-broker" \
        "$broker_fs/usr/bin/gpuipcctl") $exporter_loads <<'PY'
import os, re, sys
slim, image, arch, needed = sys.argv[1], sys.argv[2], sys.argv[3], set(sys.argv[4:])
def packages(fs):
    out = {}
    for block in open(os.path.join(fs, 'var/lib/dpkg/status')).read().split('\n\n'):
        f = dict(re.findall(r'^([A-Za-z-]+): (.*)$', block, re.M))
        if 'installed' in f.get('Status', '').split():
            deps = re.findall(r'(?:^|, |\| )([a-z0-9][a-z0-9+.-]+)', f.get('Depends', '') + ', ' + f.get('Pre-Depends', ''))
            out[f['Package']] = set(deps)
    return out
base, mine = packages(slim), packages(image)
added = set(mine) - set(base)
def libs(p):
    for name in (f'{p}:{arch}.list', f'{p}.list'):
        path = os.path.join(image, 'var/lib/dpkg/info', name)
        if os.path.exists(path):
            return {os.path.basename(l.strip()) for l in open(path) if '.so' in l}
    return set()
wanted = {p for p in added if libs(p) & needed}
grew = True
while grew:
    more = {d for p in wanted for d in mine[p] if d in added} - wanted
    wanted |= more
    grew = bool(more)
print(' '.join(sorted(added - wanted)) or '', end='')
print('|' + ' '.join(sorted(added)), end='')
PY
)
expect "broker image: each added package is needed by a binary (added: ${extra#*|}; unneeded: ${extra%%|*})" \
        test -z "${extra%%|*}"
client_files=$(cd "$client_fs" && find . -not -type d -not -path './usr/share/gpuipc/python/*' | sort | tr '\n' ' ')
expect "client image: gpuipcctl and libgpuipc.so.0, nothing else outside the Python module ($client_files)" test \
        "$client_files" == "./usr/bin/gpuipcctl ./usr/lib/$multiarch/libgpuipc.so.0 ./usr/lib/$multiarch/libgpuipc.so.0.1.0 "
expect "client image: the Python module as meson installs it ($(ls "$client_fs/usr/share/gpuipc/python" | tr '\n' ' '))" \
        test -e "$client_fs/usr/share/gpuipc/python/gpuipc.py" -o -e "$client_fs/usr/share/gpuipc/python/gpuipc/__init__.py"
client_needs=$(needed "$client_fs/usr/bin/gpuipcctl" "$client_fs/usr/lib/$multiarch/libgpuipc.so.0.1.0" | tr '\n' ' ')
expect "client image: needs libc alone, besides the libgpuipc.so.0 it ships ($client_needs)" \
        test "$client_needs" == "ld-linux-x86-64.so.2 libc.so.6 libgpuipc.so.0 "
newest=$(objdump -T "$client_fs/usr/bin/gpuipcctl" "$client_fs/usr/lib/$multiarch/libgpuipc.so.0.1.0" |
        grep -o 'GLIBC_2\.[0-9]*' | sort -V | tail -1)
expect "client image: runs on glibc 2.35 (Ubuntu 22.04) and newer (needs $newest)" \
        test "$(printf '%s\nGLIBC_2.35\n' "$newest" | sort -V | tail -1)" == GLIBC_2.35
pm image unmount -a >/dev/null

# ---- 4. running them ----
echo "# running: broker, producer, consumer, Python consumer"
vol=gpuipc-test-sock-$tag
pm volume create "$vol" >/dev/null
volumes+=("$vol")
# What every container gets; clients also join the socket's group 65532 (fsGroup in Kubernetes),
# under their own uids, and mount the socket directory read-only.
hardened=(--network none --read-only --cap-drop ALL --security-opt no-new-privileges)
client() { local uid=$1; shift; echo --user "$uid:$uid" --group-add 65532 -v "$vol:/run/gpuipc:ro"; }

broker=gpuipc-test-broker-$tag
containers+=("$broker")
pm run -d --name "$broker" "${hardened[@]}" --security-opt "seccomp=$root/seccomp/gpuipc-broker.json" \
        -v "$vol:/run/gpuipc" "$suite/gpuipc" >/dev/null
ready=false
for _ in $(seq 50); do
        # As the kubelet's startupProbe does: inside the broker's container, under its profile.
        if pm exec "$broker" gpuipcctl ping --timeout 1000 >/dev/null 2>&1; then ready=true; break; fi
        sleep 0.2
done
expect "the broker answers gpuipcctl ping inside its container" $ready
if ! $ready; then
        pm logs "$broker"
        exit 1
fi
pid=$(pm inspect --format '{{.State.Pid}}' "$broker")
field() { awk -v k="$1:" '$1 == k { $1 = ""; print substr($0, 2) }' "/proc/$pid/status"; }
expect "broker: uid and gid 65532, not root" test "$(field Uid) $(field Gid)" == \
        "65532 65532 65532 65532 65532 65532 65532 65532"
expect "broker: no capabilities at all (bounding set included)" test "$(field CapEff)$(field CapPrm)$(field CapBnd)" \
        == 000000000000000000000000000000000000000000000000
expect "broker: no_new_privs" test "$(field NoNewPrivs)" == 1
expect "broker: the runtime's profile and its own filter are loaded ($(field Seccomp_filters) filters)" \
        test "$(field Seccomp)" == 2 -a "$(field Seccomp_filters)" -ge 2
expect "broker: read-only root" bash -c "awk '\$5 == \"/\" { print \$6 }' /proc/$pid/mountinfo | grep -q '^ro'"
expect "broker: no network but loopback" test "$(ls "/proc/$pid/root/sys/class/net" 2>/dev/null | tr '\n' ' ')" == "lo "
expect "socket: mode 0660, group 65532, in a 0750 directory of 65532" test \
        "$(stat -c '%a %g' "/proc/$pid/root/run/gpuipc/gpuipc.sock") $(stat -c '%a %u:%g' "/proc/$pid/root/run/gpuipc")" \
        == "660 65532 750 65532:65532"

# The exporter sidecar as k8s/base/pod.yaml runs it: gpuipcctl metrics --listen from this image,
# confined by its own filter once it listens (libmicrohttpd loaded before); scraped from the
# container's own network namespace, the only one it listens in.
exporter=gpuipc-test-exporter-$tag
containers+=("$exporter")
# shellcheck disable=SC2046
pm run -d --name "$exporter" "${hardened[@]}" $(client 10004) --entrypoint gpuipcctl "$suite/gpuipc" \
        metrics --listen 127.0.0.1:9470 >/dev/null
scrape=
for _ in $(seq 50); do
        epid=$(pm inspect --format '{{.State.Pid}}' "$exporter" 2>/dev/null) || epid=0
        if [[ $epid != 0 ]] && scrape=$(nsenter --net="/proc/$epid/ns/net" python3 -c '
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:9470/metrics", timeout=10).read().decode())' 2>/dev/null); then
                break
        fi
        sleep 0.2
done
expect "exporter container: a scrape says gpuipc_up 1" grep -q "^gpuipc_up 1$" <<<"$scrape"
expect "exporter container: confined (seccomp filter, no_new_privs)" \
        grep -q "^Seccomp:.2" "/proc/$epid/status"
pm stop --time 10 "$exporter" >/dev/null
logs=$(pm logs "$exporter" 2>&1)
expect "exporter container: served, stopped with exit 0, its filter never fired" bash -c \
        '[[ $1 == *"serving /metrics"* && $1 != *"seccomp:"* && $2 == 0 ]]' _ "$logs" \
        "$(pm inspect --format '{{.State.ExitCode}}' "$exporter")"

# The profile holds only together with no_new_privs (allowPrivilegeEscalation: false): without it
# the runtime has to load the filter before it drops privileges, and its own remaining steps are
# not on the allow-list.
nnp=gpuipc-test-no-nnp-$tag
containers+=("$nnp")
out=$(pm run -d --name "$nnp" --network none --read-only --cap-drop ALL \
        --security-opt "seccomp=$root/seccomp/gpuipc-broker.json" -v "$vol:/run/gpuipc" "$suite/gpuipc" 2>&1) || true
# (Where the runtime stops depends on which of its last steps the profile refuses: chdir, or exec.)
expect "without no_new_privs the profile does not let the runtime start the broker (${out##*: })" \
        grep -q "operation not permitted" <<<"$out"

producer=gpuipc-test-producer-$tag
containers+=("$producer")
# Retires itself once two consumers have attached it, and exits when they have released it.
# shellcheck disable=SC2046
pm run -d --name "$producer" "${hardened[@]}" $(client 10001) --entrypoint gpuipcctl "$suite/gpuipc" \
        publish frames/test --size 1M --kind memfd --fill counter --retire-after 2 >/dev/null
# shellcheck disable=SC2046
out=$(pm run --rm "${hardened[@]}" $(client 10002) --entrypoint gpuipcctl "$suite/gpuipc" \
        attach frames/test --verify counter --wait 30000 2>&1) || true
expect "consumer container: attaches and verifies every word ($out)" grep -q "verified 1048576 bytes" <<<"$out"

# By soname through the loader cache, as the module does when GPUIPC_LIBRARY is not set.
py='
import ctypes, struct, sys
lib = ctypes.CDLL("libgpuipc.so.0")
import gpuipc
with gpuipc.Client(label="python-consumer") as c:
    a = c.attach("frames/test", timeout_ms=30000)
    words = struct.unpack("<%dQ" % (a.size // 8), a.memoryview())
    bad = [i for i, w in enumerate(words) if w != i]
    print("loaded", lib._name, "from", gpuipc.__file__, "words", len(words), "bad", len(bad))
    a.release()
    sys.exit(1 if bad else 0)
'
# shellcheck disable=SC2046
out=$(pm run --rm "${hardened[@]}" $(client 10003) "$suite/app" python3 -c "$py" 2>&1) || true
expect "Python consumer in the app image: libgpuipc.so.0 by soname, every word verified ($out)" \
        grep -q "loaded libgpuipc.so.0 .* words 131072 bad 0" <<<"$out"

status=$(pm wait "$producer" 2>&1 || true)
expect "producer container: exits 0 once both consumers released its buffer (exit $status)" test "$status" == 0
expect "producer container: said drained" grep -q "^drained" <(pm logs "$producer" 2>&1)

pm stop --time 10 "$broker" >/dev/null
expect "broker: exits 0 on SIGTERM" test "$(pm inspect --format '{{.State.ExitCode}}' "$broker")" == 0
logs=$(pm logs "$broker" 2>&1)
expect "broker: logged a clean stop, and its filter never fired" \
        bash -c '[[ $1 == *"\"msg\":\"stopped\""* && $1 != *"seccomp:"* ]]' _ "$logs"
[[ $failures == 0 ]] || { echo "--- broker log"; echo "$logs"; }

# ---- 5. k8s/node-setup's init containers, as its DaemonSet declares them ----
# Each host directory becomes a fresh one here, owned and moded as the kubelet creates a missing
# hostPath (root, 0755); every container runs twice, as after a pod's recreation.
echo "# k8s/node-setup's init containers on this image"
host=$(mktemp -d /tmp/gpuipc-node-setup.XXXXXX)
trap 'cleanup; rm -rf "$host"' EXIT
runs=$(python3 - "$root/k8s/node-setup/daemonset.yaml" "$host" <<'PY'
import shlex, sys, yaml
ds = yaml.safe_load(open(sys.argv[1]))
spec = ds['spec']['template']['spec']
paths = {v['name']: v['hostPath']['path'] for v in spec['volumes']}
for c in spec['initContainers']:
    sc = c['securityContext']
    argv = ['--user', f"{sc['runAsUser']}:{sc['runAsGroup']}", '--cap-drop', 'ALL']
    for cap in sc['capabilities'].get('add', []):
        argv += ['--cap-add', cap]
    if sc.get('readOnlyRootFilesystem'):
        argv.append('--read-only')
    if sc.get('allowPrivilegeEscalation') is False:
        argv += ['--security-opt', 'no-new-privileges']
    for m in c['volumeMounts']:
        argv += ['-v', f"{sys.argv[2]}{paths[m['name']]}:{m['mountPath']}"]
    argv += ['--entrypoint', c['command'][0], 'IMAGE'] + c['command'][1:] + c.get('args', [])
    print(shlex.join(argv))
PY
)
install -d -m 0755 "$host/var/lib/kubelet/seccomp" "$host/run/gpuipc"
for round in 1 2; do
        while read -r line; do
                eval "args=($line)"
                args=("${args[@]/#IMAGE/$suite/gpuipc}")
                out=$(pm run --rm --network none "${args[@]}" 2>&1) ||
                        fail "node-setup round $round: ${args[*]}: $out"
        done <<<"$runs"
done
expect "node-setup: the image's profile installed as gpuipc/gpuipc-broker.json, mode 0644" bash -c \
        "cmp -s '$root/seccomp/gpuipc-broker.json' '$host/var/lib/kubelet/seccomp/gpuipc/gpuipc-broker.json' &&
         test \"\$(stat -c %a '$host/var/lib/kubelet/seccomp/gpuipc/gpuipc-broker.json')\" == 644"
expect "node-setup: no temporary file left" test -z "$(find "$host/var/lib/kubelet/seccomp" -name '.*')"
expect "node-setup: /run/gpuipc 0750, owned 65532:65532, after both rounds" \
        test "$(stat -c '%a %u:%g' "$host/run/gpuipc")" == "750 65532:65532"

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
