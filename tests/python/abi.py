"""python-abi: the Python package's copies of client/gpuipc.h agree with the header.

The package talks to libgpuipc through ctypes, so it restates part of gpuipc.h by hand: the
structs in gpuipc/_lib.py (each names its C type in the first word of its docstring), the
GPUIPC_MAX_* sizes they use, and the error codes in gpuipc/errors.py. Nothing at run time notices
a skew: a struct that lost or gained a field is just read at the wrong offsets. This test

1. parses the members of every mirrored struct out of gpuipc.h, compiles a small C program that
   prints sizeof and offsetof/sizeof of each member, and compares them, and the member names in
   order, with ctypes' (a field added or removed on either side fails, even one that lands in
   padding and leaves sizeof alone);
2. checks that every ctypes Structure in _lib.py names a gpuipc_*_t it mirrors;
3. compares GPUIPC_ERRNO_MAP, as parsed and as the compiler expands it, with errors.E_* (value
   by value, both ways) and with errors._BY_NAME (every stable name has an exception class);
4. finds no bare libgpuipc code (-1001 to -1199) in the package outside errors.py.

Usage: abi.py SOURCE_ROOT CC [CC ARGS...]
"""
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

src_root, cc = sys.argv[1], sys.argv[2:]
sys.path.insert(0, os.path.join(src_root, 'python'))
from gpuipc import _lib, errors  # noqa: E402 (the path above first)

header_path = os.path.join(src_root, 'client', 'gpuipc.h')
header = open(header_path, encoding='utf-8').read()
failures = []


def fail(msg):
    failures.append(msg)
    print('FAIL:', msg)


def strip_comments(text):
    return re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)


def c_members(c_type):
    """The member names of typedef struct ... { } c_type; in declaration order."""
    m = re.search(r'typedef struct \w+ \{([^{}]*)\} ' + re.escape(c_type) + ';', strip_comments(header))
    if not m:
        return None
    names = []
    for decl in m.group(1).split(';'):
        decl = decl.strip()
        if not decl:
            continue
        # "uint64_t peer, pid, uid" and "char gpus[A][B]": the identifier before any [..] of each part
        for part in decl.split(','):
            ident = re.search(r'(\w+)\s*(?:\[[^\]]*\]\s*)*$', part.strip())
            names.append(ident.group(1))
    return names


# ---- 1 and 2: the structs ----
mirrored = {}
for name, cls in sorted(vars(_lib).items()):
    if not (isinstance(cls, type) and issubclass(cls, ctypes.Structure)) or '_fields_' not in vars(cls):
        continue
    doc = (cls.__doc__ or '').split()
    c_type = doc[0].rstrip('.') if doc else ''
    if not re.fullmatch(r'gpuipc_\w+_t', c_type):
        fail(f'_lib.{name}: its docstring does not start with the gpuipc_*_t it mirrors')
        continue
    members = c_members(c_type)
    if members is None:
        fail(f'_lib.{name}: gpuipc.h has no typedef struct ... {c_type}')
        continue
    py_names = [f[0] for f in cls._fields_]
    if py_names != members:
        fail(f'_lib.{name} has fields {py_names}, {c_type} has members {members}')
    mirrored[name] = (cls, c_type, members)

maxes = ['GPUIPC_MAX_NAME', 'GPUIPC_MAX_LABEL', 'GPUIPC_MAX_UUID', 'GPUIPC_MAX_GPUS', 'GPUIPC_MAX_PAGE',
         'GPUIPC_MAX_BUFFER_SIZE']
program = ['#include <stddef.h>', '#include <stdio.h>', '#include "gpuipc.h"', 'int main(void)', '{']
for name, (cls, c_type, members) in mirrored.items():
    program.append(f'        printf("{c_type} %zu\\n", sizeof({c_type}));')
    for m in members:
        program.append(f'        printf("{c_type}.{m} %zu %zu\\n", offsetof({c_type}, {m}), '
                       f'sizeof((({c_type} *)0)->{m}));')
for m in maxes:
    program.append(f'        printf("{m} %llu\\n", (unsigned long long){m});')
program.append('#define XX(code, value, name) printf("E_" #code " %d %s\\n", (int)(value), name);')
program += ['        GPUIPC_ERRNO_MAP(XX)', '        return 0;', '}', '']

with tempfile.TemporaryDirectory(prefix='gpuipc-abi-') as tmp:
    c_file, exe = os.path.join(tmp, 'abi.c'), os.path.join(tmp, 'abi')
    with open(c_file, 'w') as f:
        f.write('\n'.join(program))
    r = subprocess.run(cc + ['-std=gnu11', '-I', os.path.dirname(header_path), c_file, '-o', exe],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        sys.exit('FAIL: the layout program does not compile (a Python field gpuipc.h lacks?)')
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout

c = {}
for line in out.splitlines():
    key, *vals = line.split()
    c[key] = vals

for name, (cls, c_type, members) in mirrored.items():
    if int(c[c_type][0]) != ctypes.sizeof(cls):
        fail(f'sizeof({c_type}) is {c[c_type][0]}, ctypes.sizeof(_lib.{name}) is {ctypes.sizeof(cls)}')
    for m in members:
        if not hasattr(cls, m):
            continue  # reported above
        off, size = (int(v) for v in c[f'{c_type}.{m}'])
        field = getattr(cls, m)
        if (field.offset, field.size) != (off, size):
            fail(f'{c_type}.{m}: C offset {off} size {size}, ctypes offset {field.offset} size {field.size}')

py_max = {'GPUIPC_MAX_NAME': _lib._MAX_NAME, 'GPUIPC_MAX_LABEL': _lib._MAX_LABEL, 'GPUIPC_MAX_UUID': _lib._MAX_UUID,
          'GPUIPC_MAX_GPUS': _lib._MAX_GPUS, 'GPUIPC_MAX_PAGE': _lib.MAX_PAGE,
          'GPUIPC_MAX_BUFFER_SIZE': _lib.MAX_BUFFER_SIZE}
for m in maxes:
    if int(c[m][0]) != py_max[m]:
        fail(f'{m} is {c[m][0]} in gpuipc.h, {py_max[m]} in _lib.py')

# ---- 3: the error codes ----
body = re.search(r'#define GPUIPC_ERRNO_MAP\(XX\)(.*?)\n\n', header, re.S)
parsed = re.findall(r'XX\((\w+),\s*(-?\d+),\s*"([^"]+)"\)', body.group(1) if body else '')
expanded = [(k[2:], int(v[0]), v[1]) for k, v in c.items() if k.startswith('E_')]
if not parsed or [(a, int(b), n) for a, b, n in parsed] != expanded:
    fail(f'GPUIPC_ERRNO_MAP as parsed ({len(parsed)} entries) differs from its expansion ({len(expanded)})')
py_codes = {k[2:]: v for k, v in vars(errors).items() if re.fullmatch(r'E_[A-Z_]+', k) and isinstance(v, int)}
for code, value, stable in expanded:
    if code not in py_codes:
        fail(f'errors.py lacks E_{code} ({value}, "{stable}")')
    elif py_codes[code] != value:
        fail(f'E_{code} is {value} in gpuipc.h, {py_codes[code]} in errors.py')
    if stable not in errors._BY_NAME:
        fail(f'errors._BY_NAME has no class for "{stable}" (GPUIPC_E_{code})')
for code in sorted(set(py_codes) - {e[0] for e in expanded}):
    fail(f'errors.py has E_{code}, which GPUIPC_ERRNO_MAP lacks')
# The names exceptions raised in Python carry (errors._CODE_NAMES) are the header's.
header_names = {value: stable for _, value, stable in expanded}
for value, stable in errors._CODE_NAMES.items():
    if header_names.get(value) != stable:
        fail(f'errors._CODE_NAMES names {value} "{stable}", gpuipc.h "{header_names.get(value)}"')

# ---- 4: no bare codes elsewhere ----
for path in sorted(glob.glob(os.path.join(src_root, 'python', 'gpuipc', '*.py'))):
    if os.path.basename(path) == 'errors.py':
        continue
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        if re.search(r'(?<![\w.])-1[01]\d\d\b', line.split('#')[0]):
            fail(f'{os.path.relpath(path, src_root)}:{n}: a bare libgpuipc code (use errors.E_*): {line.strip()}')

print(f'{len(mirrored)} structs, {len(expanded)} error codes, {len(maxes)} sizes compared')
if failures:
    sys.exit(f'{len(failures)} mismatches')
