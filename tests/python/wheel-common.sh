# What the wheel tests share (sourced by test-wheel*.sh): their scratch directory and its cleanup, a
# clean copy of the source tree, the wheel built from it with pyproject-build, the checks of its tag
# against the library it carries, pip's verdict for other Pythons, and a local package index with
# msgpack in it.
# Expects: $root (the source tree) and $scratch (the scratch directory's name prefix). Gives: $dir,
# removed at exit after the processes whose pids the test keeps in $broker and $probe are stopped;
# step() and fail().

dir=$(mktemp -d "/tmp/${scratch:?}.XXXXXX")
broker= probe=
cleanup() {
        local pid
        for pid in $probe $broker; do
                kill "$pid" 2>/dev/null
                wait "$pid" 2>/dev/null || true
        done
        rm -rf "$dir"
}
trap cleanup EXIT
step() { echo "--- $*"; }
fail() { echo "FAILED: $*"; [[ -f $dir/log ]] && tail -40 "$dir/log"; exit 1; }

export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
unset GPUIPC_LIBRARY LD_LIBRARY_PATH PYTHONPATH
# Every temporary file of the tools run here goes under $dir, which the test removes: the ensurepip
# of some CPythons (3.9 to 3.11 from pyenv) extracts pip's cacert.pem into TMPDIR and leaves it.
mkdir -p "$dir/tmp"
export TMPDIR=$dir/tmp

# clean_copy DEST: what a fresh clone holds (plus uncommitted edits), without build outputs.
clean_copy() {
        mkdir -p "$1"
        if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
                git -C "$root" ls-files -z --cached --others --exclude-standard |
                        while IFS= read -r -d '' f; do [[ -e $root/$f ]] && printf '%s\0' "$f"; done |
                        tar -C "$root" --null -T - -cf - | tar -C "$1" -xf -
        else
                tar -C "$root" --exclude='./build*' --exclude='./dist' -cf - . | tar -C "$1" -xf -
        fi
}

# build_wheel SRC OUTDIR [BACKEND-OPTION...]: pyproject-build in SRC; sets $wheel to its path.
# pyproject-build, not `python3 -m build`: run in a checkout with a ./build directory (meson's),
# `-m build` imports that directory when the interpreter lacks the build package.
build_wheel() {
        local src=$1 out=$2
        shift 2
        command -v pyproject-build >/dev/null || fail "no pyproject-build (Debian: python3-build)"
        (cd "$src" && pyproject-build --no-isolation --wheel --outdir "$out" "$@") >"$dir/log" 2>&1 ||
                fail "the wheel did not build"
        wheel=$(ls "$out"/gpuipc-*.whl)
}

# check_tag WHEEL ARCH: the file name and WHEEL say py3-none-manylinux_X_Y_ARCH, and X.Y is the
# newest GLIBC_ version the library needs (readelf's word, not the backend's), the library is for
# ARCH and needs nothing but glibc.
check_tag() {
        local wheel=$1 arch=$2 tag floor need machine
        tag=$(basename "$wheel" .whl | cut -d- -f3-)
        [[ $tag =~ ^py3-none-manylinux_([0-9]+)_([0-9]+)_${arch}$ ]] ||
                fail "$(basename "$wheel"): not tagged py3-none-manylinux_X_Y_$arch"
        floor=${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
        rm -rf "$dir/unpacked" && mkdir "$dir/unpacked"
        (cd "$dir/unpacked" && python3 -m zipfile -e "$wheel" .) || fail "cannot unpack $wheel"
        grep -qx "Tag: $tag" "$dir"/unpacked/gpuipc-*.dist-info/WHEEL || fail "WHEEL does not say Tag: $tag"
        [[ $(grep -c '^Tag:' "$dir"/unpacked/gpuipc-*.dist-info/WHEEL) == 1 ]] || fail "WHEEL has several tags"
        local lib=$dir/unpacked/gpuipc/libgpuipc.so
        need=$(readelf -V --wide "$lib" | grep -o 'GLIBC_[0-9]*\.[0-9]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
        [[ -n $need && $need == "$floor" ]] ||
                fail "the tag promises glibc $floor, the library's symbol versions need $need"
        machine=$(readelf -h "$lib" | sed -n 's/^ *Machine: *//p')
        case $arch:$machine in
        x86_64:*X86-64*|aarch64:*AArch64*) ;;
        *) fail "tagged $arch, but the library is for $machine" ;;
        esac
        while read -r so; do
                [[ $so =~ ^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-(x86-64|aarch64)\.so\.[12])$ ]] ||
                        fail "the library needs $so: manylinux allows glibc's libraries only"
        done < <(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
        echo "$(basename "$wheel"): glibc $floor = the newest GLIBC_ symbol version its $machine library needs"
}

# check_pythons PIP WHEEL PLATFORM OLDER: pip (any venv's) would install the wheel for CPython
# 3.9, 3.10, 3.12 and 3.13 on PLATFORM, and not on OLDER (an older glibc).
check_pythons() {
        local pip=$1 wheel=$2 platform=$3 older=$4 v out
        for v in 3.9 3.10 3.12 3.13; do
                out=$("$pip" install --dry-run --no-deps --only-binary=:all: --python-version "$v" --platform "$platform" \
                        --target "$dir/dry" "$wheel" 2>&1) || true
                grep -q '^Would install gpuipc-' <<<"$out" || fail "pip for Python $v on $platform: $out"
        done
        out=$("$pip" install --dry-run --no-deps --only-binary=:all: --python-version 3.12 --platform "$older" \
                --target "$dir/dry" "$wheel" 2>&1) || true
        grep -q 'is not a supported wheel on this platform' <<<"$out" ||
                fail "pip would install the wheel on $older, older than its glibc floor: $out"
        echo "pip --dry-run: installs for Python 3.9, 3.10, 3.12, 3.13 on $platform; refuses $older"
}

# msgpack_index DIR PYTHON: a local package index (pip --find-links DIR) holding msgpack as a
# pure-Python wheel, repacked from the distribution's package that PYTHON imports (its fallback
# runs without the C extension): what PyPI would give a plain venv, on a machine without PyPI.
msgpack_index() {
        mkdir -p "$1"
        "$2" - "$1" <<'PY' || fail "cannot repack msgpack"
import base64, hashlib, os, sys, zipfile
import msgpack
src, version = os.path.dirname(msgpack.__file__), '.'.join(map(str, msgpack.version))
info = f'msgpack-{version}.dist-info'
files = {f'msgpack/{n}': open(os.path.join(src, n), 'rb').read() for n in sorted(os.listdir(src)) if n.endswith('.py')}
files[f'{info}/METADATA'] = f'Metadata-Version: 2.1\nName: msgpack\nVersion: {version}\n'.encode()
files[f'{info}/WHEEL'] = b'Wheel-Version: 1.0\nGenerator: gpuipc-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n'
record = [f'{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()},{len(d)}'
          for n, d in files.items()] + [f'{info}/RECORD,,']
files[f'{info}/RECORD'] = ('\n'.join(record) + '\n').encode()
with zipfile.ZipFile(os.path.join(sys.argv[1], f'msgpack-{version}-py3-none-any.whl'), 'w') as z:
    for n, d in files.items():
        z.writestr(n, d)
PY
}

# The round trip every installed package must make, with nothing but the standard library: a
# memfd buffer published and attached back through the broker at $GPUIPC_SOCKET, its bytes intact,
# the library the one inside this environment's package.
ROUNDTRIP_PY='
import sys, gpuipc
name = "wheel/py%d.%d" % sys.version_info[:2]
data = bytes(range(256)) * 16
with gpuipc.Client(probe_gpus=False) as c:
    mv = c.empty((len(data),), "uint8", kind="memfd", framework="memoryview")
    mv[:] = data
    c.publish(mv, name)
    with c.attach(name, 0) as a:
        assert bytes(a.memoryview()) == data, "the bytes differ"
    c.free(mv)
assert gpuipc.library_path().startswith(sys.prefix), gpuipc.library_path()
print("Python %s: gpuipc %s, %s" % (sys.version.split()[0], gpuipc.__version__, gpuipc.library_path()))
'
