#!/bin/bash
# Loads the shipped Kubernetes profile's rules (translated by profile_rules.py, with the OCI
# runtimes' meaning) and checks, in test-profile-bites, what they refuse and what they allow.
#   test-profile-bites.sh PROFILE.json TEST-BINARY
set -euo pipefail
profile=$1 bin=$2
rules=$(mktemp "${TMPDIR:-/tmp}/gpuipc-profile-rules.XXXXXX")
trap 'rm -f "$rules"' EXIT
python3 "$(dirname "$0")/profile_rules.py" "$profile" >"$rules"
# Not exec: the shell must outlive the test to run its EXIT trap (the rules file would stay behind).
rc=0
"$bin" "$rules" || rc=$?
exit $rc
