#!/bin/bash
# gpuipcctl is a client of libgpuipc's public API and nothing else:
#   1. cli/ includes no header of client/ but gpuipc.h, and none of proto/;
#   2. gpuipcctl needs libgpuipc.so.0 (it is linked against the shared library);
#   3. every gpuipc_* symbol it imports is exported by libgpuipc.so.0 and listed by a global
#      pattern of client/libgpuipc.sym; it imports nothing else from the library;
#   4. libgpuipc.so.0 exports exactly the functions gpuipc.h declares;
#   5. gpuipcctl defines none of the library's internal functions (no static copy of client/ or proto/).
# Usage: test-public-api.sh SOURCE_ROOT GPUIPCCTL LIBGPUIPC_SO CLIENT_STATIC_LIB PROTO_STATIC_LIB
set -euo pipefail

src=$1 ctl=$2 lib=$3 client_a=$4 proto_a=$5
failed=0
fail() {
        echo "FAIL: $*"
        failed=1
}

for tool in nm readelf; do
        command -v $tool >/dev/null || { echo "skip: $tool is missing (binutils)"; exit 77; }
done

# 1. Includes (one sed over every file: no process per line).
declare -A private
for h in "$src"/client/*.h "$src"/proto/*.h; do
        h=${h##*/}
        [[ $h == gpuipc.h ]] || private[$h]=1
done
while read -r file header; do
        [[ -n ${private[${header##*/}]:-} ]] && fail "$file includes $header, a header of client/ or proto/"
done < <(cd "$src" && grep -H '^[[:space:]]*#[[:space:]]*include' cli/*.c cli/*.h |
        sed -E 's/^([^:]+):[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^">]+)[">].*/\1 \2/')

# 2. Linked against the shared library.
readelf -d "$ctl" | grep -q 'NEEDED.*\[libgpuipc\.so\.0\]' || fail "gpuipcctl does not need libgpuipc.so.0"

# 3. Imports: gpuipc_* only, each exported and matched by the version script's global patterns.
# (every node's global names: one per line, "gpuipc_...;")
mapfile -t patterns < <(grep -oE '^[[:space:]]+gpuipc_[A-Za-z0-9_*]+;' "$src/client/libgpuipc.sym" | tr -d ' \t;')
[[ ${#patterns[@]} -gt 0 ]] || fail "no global patterns in libgpuipc.sym"
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
# Membership is looked up in associative arrays, not with a grep per symbol: hundreds of processes
# made this test take most of a minute on a loaded 2-core machine.
declare -A is_exported is_declared is_internal
while read -r sym; do is_exported[$sym]=1; done <<<"$exported"
n_imports=0
while read -r sym; do
        base=${sym%%@*}
        if [[ -n ${is_exported[$base]:-} ]]; then
                n_imports=$((n_imports + 1))
                [[ $base == gpuipc_* ]] || fail "gpuipcctl imports $base from libgpuipc: not public API"
                matched=0
                for p in "${patterns[@]}"; do
                        # shellcheck disable=SC2053 # the version script's patterns are globs
                        [[ $base == $p ]] && matched=1
                done
                [[ $matched == 1 ]] || fail "$base is not listed in libgpuipc.sym"
        elif [[ $base == gpuipc_* ]]; then
                fail "gpuipcctl needs $base, which libgpuipc.so.0 does not export"
        fi
done < <(nm -D --undefined-only "$ctl" | awk '{print $2}')
[[ $n_imports -gt 10 ]] || fail "gpuipcctl imports only $n_imports symbols from libgpuipc (expected its API)"

# 4. The library exports exactly what gpuipc.h declares (comments stripped), and the version script
#    names each of them.
declared=$(sed -e ':a' -e 's|/\*.*\*/||g' -e '/\/\*/{N;ba' -e '}' "$src/client/gpuipc.h" |
        grep -oE '\bgpuipc_[a-z0-9_]+[[:space:]]*\(' | tr -d ' (' | sort -u)
[[ -n $declared ]] || fail "found no functions in gpuipc.h"
while read -r sym; do is_declared[$sym]=1; done <<<"$declared"
while read -r sym; do
        [[ -n ${is_exported[$sym]:-} ]] || fail "gpuipc.h declares $sym but libgpuipc.so.0 does not export it (add it to libgpuipc.sym)"
done <<<"$declared"
while read -r sym; do
        [[ $sym == GPUIPC_* ]] && continue # the version node itself
        [[ -n ${is_declared[$sym]:-} ]] || fail "libgpuipc.so.0 exports $sym, which gpuipc.h does not declare"
done <<<"$exported"

# 5. No static copy of the library's internals.
internal=$(nm --defined-only "$client_a" "$proto_a" 2>/dev/null | awk '$2 ~ /^[TDRB]$/ {print $3}' |
        grep -v '^gpuipc_' | sort -u)
[[ -n $internal ]] || fail "found no internal symbols in the static libraries (wrong paths?)"
while read -r sym; do is_internal[$sym]=1; done <<<"$internal"
while read -r sym; do
        [[ -n ${is_internal[$sym]:-} ]] && fail "gpuipcctl contains $sym, an internal function of the library"
done < <(nm --defined-only "$ctl" | awk '{print $3}' | sort -u)

if [[ $failed != 0 ]]; then
        exit 1
fi
echo "ok: gpuipcctl imports $n_imports public symbols of libgpuipc.so.0 and nothing internal"
