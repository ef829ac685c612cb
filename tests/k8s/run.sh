#!/usr/bin/env bash
# Offline validation of gpuipc's Kubernetes manifests (k8s/, Dockerfile):
# checks the prerequisites, then runs validate.mjs, which renders every
# kustomization with `kubectl kustomize` and checks the result.
# Works from any directory. Exit status: 0 all checks passed, 1 a check
# failed, 77 skipped (kubectl, node or the npm dependencies are missing).
#   KUBECTL=/path/to/kubectl  to use another kubectl.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kubectl=${KUBECTL:-kubectl}

skip() {
  echo "SKIP: $*"
  exit 77
}

command -v "$kubectl" >/dev/null 2>&1 ||
  skip "kubectl not found: it renders the kustomizations (kubectl kustomize); install kubectl or set KUBECTL"
"$kubectl" kustomize --help >/dev/null 2>&1 ||
  skip "$kubectl has no 'kustomize' subcommand (needs kubectl >= 1.14)"
command -v node >/dev/null 2>&1 ||
  skip "node not found: the validator is a Node.js (>= 20) script"
major=$(node -p 'process.versions.node.split(".")[0]')
((major >= 20)) || skip "node $(node --version) is too old: the validator needs node >= 20"
for dep in kubernetes-models @kubernetes/client-node yaml @bufbuild/cel; do
  [[ -d $here/node_modules/$dep ]] ||
    skip "npm dependency $dep is missing: run 'npm ci' in tests/k8s (npm ci --prefix tests/k8s from the repository root)"
done

export KUBECTL=$kubectl
exec node "$here/validate.mjs"
