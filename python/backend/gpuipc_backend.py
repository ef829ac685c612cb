"""The build backend of the gpuipc wheel: meson-python builds it, then the wheel gets the tag of
what it really needs instead of the building interpreter's (cp311-cp311-linux_x86_64).

The package is pure Python; its one native file, gpuipc/libgpuipc.so, is loaded through ctypes and
needs nothing of CPython. So the wheel is `py3-none-manylinux_X_Y_ARCH`: any CPython 3 (the
metadata's Requires-Python sets the floor), any glibc from X.Y on, ARCH from the library's ELF
header (x86_64, aarch64; a cross build gets the target's). X.Y is the newest GLIBC_ symbol version
the library needs, read from its ELF version-needs table, so the tag can never promise an older
glibc than the library was linked against. The wheel is refused when the library needs a shared
library manylinux does not allow (only glibc's own), or when it holds another native file (a C
extension would need a cpXY or abi3 tag). Stdlib only: it runs in build isolation as well.
"""
import base64
import hashlib
import os
import re
import struct
import zipfile

import mesonpy
from mesonpy import build_sdist, get_requires_for_build_sdist, get_requires_for_build_wheel  # noqa: F401

LIBRARY = 'gpuipc/libgpuipc.so'
# What a manylinux wheel may leave to the system: glibc (PEP 600's libraries that matter here).
ALLOWED_NEEDED = {'libc.so.6', 'libm.so.6', 'libdl.so.2', 'libpthread.so.0', 'librt.so.1', 'libutil.so.1',
                  'ld-linux-x86-64.so.2', 'ld-linux-aarch64.so.1'}
ARCHES = {62: 'x86_64', 183: 'aarch64'}  # ELF e_machine
SHT_DYNAMIC, SHT_GNU_VERNEED, DT_NEEDED = 6, 0x6ffffffe, 1


class WheelError(Exception):
    pass


def elf_facts(data):
    """(arch, [needed libraries], {(major, minor) of each GLIBC_ version needed}) of a 64-bit
    little-endian ELF shared library."""
    if data[:4] != b'\x7fELF' or data[4] != 2 or data[5] != 1:
        raise WheelError(f'{LIBRARY} is not a 64-bit little-endian ELF file')
    machine, = struct.unpack_from('<H', data, 18)
    if machine not in ARCHES:
        raise WheelError(f'{LIBRARY} is for ELF machine {machine}, which this backend cannot tag')
    shoff, = struct.unpack_from('<Q', data, 40)
    shentsize, shnum = struct.unpack_from('<HH', data, 58)
    sections = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]

    def string(section_index, offset):
        start = sections[section_index][4] + offset
        return data[start:data.index(b'\0', start)].decode()

    needed, glibc = [], set()
    for _, kind, _, _, offset, size, link, info, _, entsize in sections:
        if kind == SHT_DYNAMIC:
            for at in range(offset, offset + size, entsize):
                tag, value = struct.unpack_from('<qQ', data, at)
                if tag == DT_NEEDED:
                    needed.append(string(link, value))
        elif kind == SHT_GNU_VERNEED:
            at = offset
            for _ in range(info):  # one entry per library, each with its versions (Vernaux)
                _, count, _, aux, next_entry = struct.unpack_from('<HHIII', data, at)
                a = at + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from('<IHHII', data, a)
                    m = re.fullmatch(r'GLIBC_(\d+)\.(\d+)(?:\.\d+)?', string(link, name))
                    if m:
                        glibc.add((int(m.group(1)), int(m.group(2))))
                    a += next_aux
                at += next_entry
    return ARCHES[machine], needed, glibc


def wheel_tag(library):
    """The tag the wheel carrying this library earns: py3-none-manylinux_X_Y_ARCH."""
    arch, needed, glibc = elf_facts(library)
    foreign = sorted(set(needed) - ALLOWED_NEEDED)
    if foreign:
        raise WheelError(f'{LIBRARY} needs {", ".join(foreign)}: a manylinux wheel may rely on glibc alone; link '
                         f'those statically')
    major, minor = max(glibc, default=(2, 17))  # 2.17: manylinux's oldest floor
    return f'py3-none-manylinux_{major}_{minor}_{arch}'


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
    return f'{name},sha256={digest},{len(data)}'


def retag(path):
    """Rewrites the wheel at path under its true tag (WHEEL's Tag lines, RECORD, the file name);
    returns the new file name."""
    directory, name = os.path.split(path)
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        native = [n for n in names if n.endswith('.so') or '.so.' in n or n.endswith('.pyd')]
        if native != [LIBRARY]:
            raise WheelError(f'the wheel holds native files {native}, not just {LIBRARY}: a C extension needs a '
                             f'cpXY or abi3 tag, not py3-none')
        tag = wheel_tag(wheel.read(LIBRARY))
        distribution, version = name.split('-')[:2]
        new_path = os.path.join(directory, f'{distribution}-{version}-{tag}.whl')
        partial = new_path + '.part'
        with zipfile.ZipFile(partial, 'w', zipfile.ZIP_DEFLATED) as out:
            record_name, lines = None, []
            for info in wheel.infolist():
                data = wheel.read(info)
                if info.filename.endswith('.dist-info/RECORD'):
                    record_name = info
                    continue
                if info.filename.endswith('.dist-info/WHEEL'):
                    kept = [line for line in data.decode().splitlines() if not line.startswith('Tag:')]
                    data = ('\n'.join(kept + [f'Tag: {tag}']) + '\n').encode()
                out.writestr(info, data)
                lines.append(_record_line(info.filename, data))
            if record_name is None:
                raise WheelError('the wheel has no RECORD')
            lines.append(f'{record_name.filename},,')
            out.writestr(record_name, '\n'.join(lines) + '\n')
    os.replace(partial, new_path)
    if new_path != path:
        os.remove(path)
    return os.path.basename(new_path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = mesonpy.build_wheel(wheel_directory, config_settings, metadata_directory)
    return retag(os.path.join(wheel_directory, name))
