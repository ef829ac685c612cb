#!/bin/bash
# The README as a new user follows it:
#   - its C program ("The library in a few lines") compiles as the README says, against the build
#     tree (build/meson-uninstalled) and against an install (a staged `meson install`), with
#     -Wall -Wextra -Werror too, and runs as the README runs it: the consumer reads the producer's
#     64 MiB of memfd, the producer hears drained;
#   - installed under a prefix of one's own, what the README says to set (PKG_CONFIG_PATH, an rpath,
#     PYTHONPATH and GPUIPC_LIBRARY) compiles the program, runs it, and imports the Python package
#     with the prefix's library (the staged install's /usr/local stands in for the prefix);
#   - `man -l build/docs/gpuipcctl.1` (and gpuipc-broker.8) shows the pages;
#   - what it says the sanitizer build leaves out is exactly what that build's meson leaves out,
#     and the runc tests it names as skipped there are the ones test-runc-pod.sh runs.
#   test-readme.sh     (env: GPUIPC_SOURCE_ROOT, GPUIPC_BUILD_ROOT, GPUIPC_BROKER)
set -uo pipefail
root=${GPUIPC_SOURCE_ROOT:?} build=${GPUIPC_BUILD_ROOT:?}
readme=$root/README.md
dir=$(mktemp -d /tmp/gpuipc-readme.XXXXXX)
broker=
cleanup() {
        [[ -n $broker ]] && { kill "$broker" 2>/dev/null; wait "$broker" 2>/dev/null; }
        rm -rf "$dir"
}
trap cleanup EXIT
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
expect() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
for tool in cc pkg-config meson; do
        command -v $tool >/dev/null || { echo "skipped: no $tool"; exit 77; }
done

# ---- the C program ----
awk '/^## The library in a few lines/ { on = 1 } on && /^```c$/ { grab = 1; next } grab && /^```$/ { exit } grab' \
        "$readme" >"$dir/frames.c"
expect "the README has a C program ($(wc -l <"$dir/frames.c") lines) with a main()" grep -q '^int main' "$dir/frames.c"
# The README's commands, with its paths (build/, /tmp/gpuipc.sock) pointed at this build and this test.
uninstalled=$(grep -m1 '^cc frames.c $(PKG_CONFIG_PATH=build/meson-uninstalled' "$readme" | sed 's/ *#.*//')
installed=$(grep -m1 '^cc frames.c $(pkg-config --cflags --libs gpuipc)' "$readme" | sed 's/ *#.*//')
start=$(grep -m1 '^build/broker/gpuipc-broker --socket /tmp/gpuipc.sock' "$readme" | sed 's/ *&$//')
run=$(grep -m1 '^GPUIPC_SOCKET=/tmp/gpuipc.sock ./frames produce' "$readme")
expect "the README says how to compile against the build tree and an install, and how to run it" \
        test -n "$uninstalled" -a -n "$installed" -a -n "$start" -a -n "$run"
# In the sanitizer build libgpuipc is sanitized: a program linked to it needs the sanitizers too.
sanitize=
grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h" && sanitize='-fsanitize=address,undefined '
here() {
        sed -e "s|\$PWD/build|$build|g; s|build/|$build/|g; s|/tmp/gpuipc.sock|$dir/s.sock|g" \
            -e "s|^cc frames.c|cc ${sanitize}frames.c|" <<<"$1"
}

(cd "$dir" && bash -c "$(here "$uninstalled")") >"$dir/cc.log" 2>&1
expect "compiled against the build tree: $(here "$uninstalled" | cut -c1-80)... ($(head -3 "$dir/cc.log"))" test -x "$dir/frames"
cflags=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --cflags --libs gpuipc)
expect "... without a warning (-Wall -Wextra -Werror)" \
        cc $sanitize -Wall -Wextra -Werror -std=c11 "$dir/frames.c" $cflags -o "$dir/frames-strict"

bash -c "$(here "$start") --log-level warn" 2>"$dir/broker.log" &
broker=$!
for _ in $(seq 100); do [[ -S $dir/s.sock ]] && break; sleep 0.05; done
out=$(cd "$dir" && timeout 60 bash -c "$(here "$run"); wait" 2>&1)
expect "run as the README runs it, the consumer reads the producer's memory ($out)" \
        grep -q 'attached 67108864 bytes, the first is 42' <<<"$out"
expect "... and the producer hears drained" grep -q '^drained' <<<"$out"

meson install -C "$build" --destdir "$dir/dest" --no-rebuild --quiet >/dev/null 2>&1
pc=$(find "$dir/dest" -name gpuipc.pc | head -1)
rm -f "$dir/frames"
(cd "$dir" && PKG_CONFIG_LIBDIR=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dir/dest bash -c "$(here "$installed")") >"$dir/cc2.log" 2>&1
expect "compiled against an install (staged: $(dirname "${pc#$dir/dest}")) as the README says ($(head -3 "$dir/cc2.log"))" \
        test -x "$dir/frames"
out=$(cd "$dir" && LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")") timeout 60 bash -c "$(here "$run"); wait" 2>&1)
expect "... and runs against the installed library ($out)" grep -q 'the first is 42' <<<"$out"

# ---- a prefix of one's own ----
# The README's lines, run with PREFIX and LIBDIR pointed at the staged install (its pkg-config file
# says /usr/local: PKG_CONFIG_SYSROOT_DIR maps that into the stage).
custom=$(awk '/^Installed under a prefix of your own/ { on = 1 } on && /^```sh$/ { grab = 1; next } grab && /^```$/ { exit } grab' "$readme")
expect "the README says how to use an install under a prefix of one's own" \
        grep -q 'PKG_CONFIG_PATH=\$LIBDIR/pkgconfig' <<<"$custom"
libdir=$(dirname "$(dirname "$pc")") prefix=$dir/dest/usr/local
custom=$(sed -e "s|^PREFIX=.*|PREFIX=$prefix LIBDIR=$libdir|" <<<"$custom")
rm -f "$dir/frames"
# python3 as the README runs it: the first one here that has msgpack (the package needs it).
mkdir -p "$dir/pybin"
for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null && "$py" -c 'import msgpack' 2>/dev/null; then
                ln -sf "$(command -v "$py")" "$dir/pybin/python3"
                break
        fi
done
out=$(cd "$dir" && PATH=$dir/pybin:$PATH PKG_CONFIG_SYSROOT_DIR=$dir/dest PKG_CONFIG_LIBDIR= HOME=$dir/nohome \
        bash -c "set -e; $(sed "s|^cc frames.c|cc ${sanitize}frames.c|" <<<"$custom")" 2>&1)
expect "... which compiles the program (with an rpath) ($(head -c 300 <<<"$out"))" test -x "$dir/frames"
out2=$(cd "$dir" && timeout 60 bash -c "$(here "$run"); wait" 2>&1)
expect "... which runs without LD_LIBRARY_PATH ($out2)" grep -q 'the first is 42' <<<"$out2"
if grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h"; then
        echo "skip the Python lines: a sanitized libgpuipc cannot be loaded into Python"
elif [[ ! -e $dir/pybin/python3 ]]; then
        echo "skip the Python lines: no python3 with msgpack"
elif compgen -G "$prefix/lib/python3*/*-packages/gpuipc" >/dev/null; then
        expect "... and Python imports the package with the prefix's library ($(tail -1 <<<"$out"))" \
                test "$(tail -1 <<<"$out")" == "$libdir/libgpuipc.so.0"
else
        echo "skip the Python lines: meson installed no Python package (no Python with msgpack at setup)"
fi

# ---- man -l ----
if command -v man >/dev/null; then
        for page in gpuipcctl.1 gpuipc-broker.8; do
                grep -q "man -l build/docs/$page" "$readme" || fail "the README does not say man -l build/docs/$page"
                [[ -f $build/docs/$page ]] || { echo "skip man -l $page: not built (no scdoc)"; continue; }
                expect "man -l build/docs/$page shows the page" \
                        bash -c "MANPAGER=cat MANWIDTH=80 man -l '$build/docs/$page' 2>/dev/null | grep -q '^NAME'"
        done
else
        echo "skip man -l: no man (Debian: man-db)"
fi

# ---- what the sanitizer build runs ----
if grep -q 'define GPUIPC_SANITIZED 1' "$build/config.h"; then
        echo "skip the sanitizer suite's list: this is the sanitizer build"
else
        meson setup "$dir/san" "$root" -Db_sanitize=address,undefined >"$dir/san.log" 2>&1 || fail "cannot configure a sanitizer build"
        names() { meson introspect "$1" --tests | python3 -c 'import json, sys; print("\n".join(sorted(t["name"] for t in json.load(sys.stdin))))'; }
        left=$(comm -23 <(names "$build") <(names "$dir/san") | tr '\n' ' ')
        said=$(tr '\n' ' ' <"$readme" | grep -o 'leaves out [^(]*(' | grep -o '`[a-z0-9-]*`' | tr -d '`' | sort | tr '\n' ' ')
        expect "the README's list of what the sanitizer build leaves out ($said) is meson's ($left)" \
                test -n "$said" -a "$said" == "$left"
        runc=$(meson introspect "$build" --tests | python3 -c 'import json, sys; print(" ".join(sorted(t["name"] for t in json.load(sys.stdin) if any("test-runc-pod.sh" in a for a in t["cmd"]))))')
        said=$(tr '\n' ' ' <"$readme" | grep -o 'the [a-z]* runc tests ([^)]*)' | grep -o '`[a-z0-9-]*`' | tr -d '`' | sort | tr '\n' ' ')
        expect "the runc tests it names as skipped there ($said) are test-runc-pod.sh's ($runc)" test "$said" == "$runc "
fi

[[ $failures == 0 ]] && echo "all checks passed" || echo "$failures checks failed"
[[ $failures == 0 ]]
