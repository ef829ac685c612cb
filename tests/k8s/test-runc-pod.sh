#!/bin/bash
# Renders an overlay (a name under k8s/overlays, or a path under k8s/ such as examples/node-weights)
# and runs one of its Pods under runc (see runc_pod.py).
#   test-runc-pod.sh OVERLAY POD [--expect-shared-pid] [--fakecuda LIB] [--expect-distinct-pids]
#   test-runc-pod.sh OVERLAY DAEMONSET --node-broker-policy VOLUME
#   test-runc-pod.sh OVERLAY DEPLOYMENT --node-weights HOLDER_DAEMONSET
set -euo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
overlay=$1 pod=$2; shift 2
command -v kubectl >/dev/null || { echo "kubectl is not installed: skipped"; exit 77; }
command -v runc >/dev/null || { echo "runc is not installed: skipped"; exit 77; }
[[ $(id -u) == 0 ]] || { echo "runc needs root here: skipped"; exit 77; }
python=
for p in python3 /usr/bin/python3; do
        if "$p" -c 'import yaml' 2>/dev/null; then python=$p; break; fi
done
[[ -n $python ]] || { echo "no python3 with the yaml module (Debian: python3-yaml): skipped"; exit 77; }
# This test runs the shipped artefacts together: the profile, the manifests, release binaries. A
# sanitizer build's runtime cannot work under that profile (it reads its options and the process
# maps with open(2) and stops the world at exit with ptrace, wait4 and getppid, all refused, as they
# should be), so there the test is skipped; the other suites run the sanitized broker.
if grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h" 2>/dev/null; then
        echo "a sanitizer build: its runtime's own system calls are outside the shipped profile: skipped"
        exit 77
fi
manifests=$(mktemp /tmp/gpuipc-manifests.XXXXXX.yaml)
trap 'rm -f "$manifests"' EXIT
dir=$root/k8s/overlays/$overlay
[[ $overlay == */* ]] && dir=$root/k8s/$overlay
kubectl kustomize "$dir" >"$manifests"
"$python" "$root/tests/k8s/runc_pod.py" --manifests "$manifests" --pod "$pod" --bin "$build" \
        --seccomp-dir "$root/seccomp" "$@"
