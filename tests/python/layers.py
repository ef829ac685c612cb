"""python-layers: the package maps errors by code, never by their text.

Read from the source (ast) alone: no library, no broker, no framework. It fails on an error told
apart by its text: a comparison (`in`, `==`, ...) or a string method (startswith, find, ...) or a
regular expression applied to an exception's `detail` or `hint`, to `str()` of an exception, or to
what `gpuipc_errmsg` returned. Errors are mapped by their code or stable name (`gpuipc_err_name`),
and by library queries such as `gpuipc_ring_closed`.

Usage: layers.py PACKAGE_DIR
"""
import ast
import os
import sys

pkg_dir = sys.argv[1]
modules = {}
for entry in sorted(os.listdir(pkg_dir)):
    if entry.endswith('.py'):
        with open(os.path.join(pkg_dir, entry), encoding='utf-8') as f:
            modules[entry[:-3]] = ast.parse(f.read(), entry)
failures = []



def fail(msg):
    failures.append(msg)
    print('FAIL:', msg)


# ---- 4: no error told apart by its text ----
TEXT_ATTRS = {'detail', 'hint'}
STRING_METHODS = {'startswith', 'endswith', 'find', 'rfind', 'index', 'rindex', 'count', 'split', 'partition',
                  'rpartition'}


def mentions_errmsg(node):
    return any(isinstance(n, ast.Attribute) and n.attr == 'gpuipc_errmsg' for n in ast.walk(node))


for module, tree in modules.items():
    # Names bound to an error's text: `said = (lib.gpuipc_errmsg(c) or b'').decode()`, `d = e.detail`.
    tainted = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and (mentions_errmsg(n.value) or any(
                isinstance(a, ast.Attribute) and a.attr in TEXT_ATTRS for a in ast.walk(n.value))):
            tainted |= {t.id for t in n.targets if isinstance(t, ast.Name)}

    def is_text(node):
        for a in ast.walk(node):
            if isinstance(a, ast.Attribute) and a.attr in TEXT_ATTRS and isinstance(a.ctx, ast.Load):
                return True
            if isinstance(a, ast.Name) and a.id in tainted:
                return True
            if (isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id == 'str' and a.args
                    and isinstance(a.args[0], ast.Name) and a.args[0].id in ('e', 'exc', 'err', 'error')):
                return True
        return mentions_errmsg(node)

    for n in ast.walk(tree):
        if isinstance(n, ast.Compare):
            if any(isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for op in n.ops) and \
                    any(is_text(x) for x in [n.left] + n.comparators):
                fail(f'{module}.py:{n.lineno}: compares an error\'s text: {ast.unparse(n)[:80]}')
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            if n.func.attr in STRING_METHODS and is_text(n.func.value):
                fail(f'{module}.py:{n.lineno}: reads an error\'s text: {ast.unparse(n)[:80]}')
            if (isinstance(n.func.value, ast.Name) and n.func.value.id == 're'
                    and any(is_text(a) for a in n.args)):
                fail(f'{module}.py:{n.lineno}: matches an error\'s text: {ast.unparse(n)[:80]}')

if failures:
    print(f'{len(failures)} failure(s)')
    sys.exit(1)
print(f'{len(modules)} modules: no error told by its text')
