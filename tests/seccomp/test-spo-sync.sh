#!/bin/bash
# The Security Profiles Operator's SeccompProfile shipped in k8s/seccomp-operator/ must be exactly
# what seccomp/spo.py generates from the allow-list, as gpuipc-broker.json must be what gen.py does.
# Fix a failure with: ninja -C <build> update-seccomp-spo
set -euo pipefail
shipped=$1 built=$2
if ! diff -u "$shipped" "$built"; then
        echo "k8s/seccomp-operator/seccompprofile.yaml differs from what seccomp/spo.py generates from the" >&2
        echo "allow-list; run 'ninja -C <build> update-seccomp-spo' and commit the result" >&2
        exit 1
fi
echo "SeccompProfile in sync with the allow-list"
