#!/bin/bash
# The aarch64 wheel: cross-compiled on this x86_64 machine (gcc-aarch64-linux-gnu, multiarch's
# libmsgpack-dev:arm64, python/cross-aarch64.ini), tagged py3-none-manylinux_X_Y_aarch64 with X.Y
# the newest GLIBC_ version its library needs, pip would install it for CPython 3.9, 3.10, 3.12
# and 3.13 on aarch64 (not on an older glibc), and its library works: an aarch64 program
# (tests/python/wheel-probe.c) loads it as ctypes would, under qemu-user, and publishes a buffer
# that gpuipcctl on x86_64 attaches and verifies byte for byte through the broker.
# Without the cross compiler, qemu-user or the arm64 msgpack headers: skipped, naming what is
# missing (./dev.sh installs them).
#   test-wheel-aarch64.sh PYTHON
set -euo pipefail
python=${1:?usage: test-wheel-aarch64.sh PYTHON}
root=${GPUIPC_SOURCE_ROOT:?}
for tool in aarch64-linux-gnu-gcc qemu-aarch64 readelf pyproject-build; do
        command -v $tool >/dev/null || {
                echo "skipped: no $tool (Debian: gcc-aarch64-linux-gnu, qemu-user, binutils, python3-build)"
                exit 77
        }
done
PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig pkg-config --exists msgpack || {
        echo "skipped: no msgpack for arm64 (Debian: dpkg --add-architecture arm64; apt install libmsgpack-dev:arm64)"
        exit 77
}
scratch=gpuipc-aarch64
source "$root/tests/python/wheel-common.sh"

step "pyproject-build --wheel, cross-compiled for aarch64"
clean_copy "$dir/src"
t0=$SECONDS
build_wheel "$dir/src" "$dir/dist" "-Csetup-args=--cross-file=$dir/src/python/cross-aarch64.ini"
echo "$(basename "$wheel") in $((SECONDS - t0)) s"
check_tag "$wheel" aarch64

step "pip's verdict for other Pythons and glibcs on aarch64"
"$python" -m venv "$dir/tool" >"$dir/log" 2>&1 || fail "no venv"
read -r major minor < <(basename "$wheel" .whl | sed 's/.*manylinux_\([0-9]*\)_\([0-9]*\)_.*/\1 \2/')
check_pythons "$dir/tool/bin/pip" "$wheel" "manylinux_${major}_${minor}_aarch64" "manylinux_${major}_$((minor - 1))_aarch64"

step "the library at work: an aarch64 process under qemu-user publishes, gpuipcctl attaches"
aarch64-linux-gnu-gcc -std=gnu11 -Wall -Werror -I"$root/client" "$root/tests/python/wheel-probe.c" -o "$dir/probe" \
        -ldl >"$dir/log" 2>&1 || fail "the probe does not build for aarch64"
sysroot=$(dirname "$(dirname "$(aarch64-linux-gnu-gcc -print-file-name=libc.so.6)")")
export GPUIPC_SOCKET=$dir/s.sock
"$GPUIPC_BROKER" --socket "$GPUIPC_SOCKET" --log-level warn 2>"$dir/broker.log" &
broker=$!
"$GPUIPC_CTL" --timeout 5000 ping >/dev/null || fail "the broker does not answer"
qemu-aarch64 -L "$sysroot" "$dir/probe" "$dir/unpacked/gpuipc/libgpuipc.so" "$GPUIPC_SOCKET" wheel/aarch64 \
        >"$dir/probe.out" 2>&1 &
probe=$!
out=$("$GPUIPC_CTL" attach wheel/aarch64 --verify byte:0x5a --wait 30000 2>&1) ||
        fail "gpuipcctl attach of the aarch64 buffer: $out; probe: $(cat "$dir/probe.out")"
grep -q "verified 4096 bytes" <<<"$out" || fail "not verified: $out"
wait "$probe" || fail "the probe failed: $(cat "$dir/probe.out")"
probe=
grep -q '^drained$' "$dir/probe.out" || fail "the aarch64 producer did not see drained: $(cat "$dir/probe.out")"
echo "aarch64 $(head -1 "$dir/probe.out") (qemu-user) published, x86_64 gpuipcctl verified 4096 bytes, drained"
