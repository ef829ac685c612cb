#!/usr/bin/env python3
"""Checks the mechanical part of the C style (.editorconfig's [*.{c,h}] section) in every C file of
the tree: indentation with spaces (no tab characters), no trailing whitespace, LF line ends, a final
newline, at most 120 columns. The rest of the style (systemd's and dbus-broker's: 8-space indents,
braces, aligned trailing comments and designated initializers) is kept by review: no formatter
available on Debian 12 reproduces it without rewriting thousands of lines for the worse.

    tools/check-style.py [SOURCE_ROOT]      exit 0: clean; 1: the offending lines are listed
"""
import os
import subprocess
import sys

MAX_COLUMNS = 120


def c_files(root):
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z', '--cached', '--others', '--exclude-standard',
                              '*.c', '*.h'], check=True, capture_output=True).stdout
        names = [n for n in out.decode().split('\0') if n]
    except (OSError, subprocess.CalledProcessError):  # a tarball: no git
        names = []
        for d, subdirs, files in os.walk(root):
            subdirs[:] = [s for s in subdirs if not s.startswith(('.', 'build')) and s != 'node_modules']
            names += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(('.c', '.h'))]
    return sorted(n for n in names if os.path.isfile(os.path.join(root, n)))


def problems(path):
    with open(path, 'rb') as f:
        data = f.read()
    if data and not data.endswith(b'\n'):
        yield 0, 'no newline at the end of the file'
    for n, raw in enumerate(data.split(b'\n'), 1):
        line = raw.decode('utf-8', errors='replace')
        if line.endswith('\r'):
            yield n, 'a CR LF line end'
            line = line[:-1]
        if '\t' in line:
            yield n, 'a tab character (indent with 8 spaces)'
        if line != line.rstrip():
            yield n, 'trailing whitespace'
        if len(line) > MAX_COLUMNS:
            yield n, f'{len(line)} columns (at most {MAX_COLUMNS})'


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    files = c_files(root)
    bad = 0
    for name in files:
        for n, what in problems(os.path.join(root, name)):
            print(f'{name}:{n}: {what}')
            bad += 1
    if not files:
        print('check-style: no C files found under', root)
        return 1
    if bad:
        print(f'check-style: {bad} problem(s) in {len(files)} C files')
        return 1
    print(f'check-style: {len(files)} C files clean')
    return 0


if __name__ == '__main__':
    sys.exit(main())
