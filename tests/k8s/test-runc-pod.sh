#!/bin/bash
# Renders an overlay and runs one of its Pods under runc (see runc_pod.py).
#   test-runc-pod.sh OVERLAY POD [--expect-shared-pid]
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
manifests=$(mktemp /tmp/gpuipc-manifests.XXXXXX.yaml)
trap 'rm -f "$manifests"' EXIT
kubectl kustomize "$root/k8s/overlays/$overlay" >"$manifests"
"$python" "$root/tests/k8s/runc_pod.py" --manifests "$manifests" --pod "$pod" --bin "$build" \
        --seccomp-dir "$root/seccomp" "$@"
