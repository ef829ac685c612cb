#!/bin/bash
# The Kubernetes profile shipped in seccomp/ must be exactly what the build generates from the
# allow-list: the one list has two artefacts, and this test keeps them from drifting apart.
# Fix a failure with: ninja -C <build> update-seccomp-profile
set -euo pipefail
shipped=$1 built=$2
if ! diff -u "$shipped" "$built"; then
        echo "seccomp/gpuipc-broker.json differs from what seccomp/gen.py generates from the allow-list;" >&2
        echo "run 'ninja -C <build> update-seccomp-profile' and commit the result" >&2
        exit 1
fi
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["defaultAction"] == "SCMP_ACT_ERRNO"; assert d["syscalls"]' "$shipped"
echo "profile in sync: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(len(s["names"]) for s in d["syscalls"]))' "$shipped") rules"
