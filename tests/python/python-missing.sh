#!/bin/bash
# Stands in for a Python test when no interpreter has the modules it needs: says so, skips (77).
echo "skipped: no python3 with the modules: $* (./dev.sh installs them)"
exit 77
