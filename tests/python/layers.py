"""python-layers: the package's modules stay layered, and its errors are mapped by code.

Read from the source (ast) alone: no library, no broker, no framework. It fails on

1. an import cycle among the package's modules (module-level imports and imports inside
   functions alike: a cycle that is only closed at call time is still one);
2. an import of a sibling module inside a function (the way such a cycle is hidden); imports of
   optional frameworks (torch, numpy, cupy, ...) inside functions are what keeps them optional and
   are not looked at;
3. a reach into another module's privates: `x._name` where `_name` is a private member of a class
   of another module of the package (or of `Client`, outside client.py), `from .mod import _name`,
   and `mod._name` on a sibling module. `self._name` and `cls._name` are the class's own. A class
   that other modules use declares its internal interface in `_INTERNAL`, a dict from each member
   they may use to a one-line reason: those members are not private to it. A declared member
   must exist, have a reason and be used by another module (the interface holds what is used,
   nothing more). A module whose name starts with an underscore (`_lib`, `_args`, `_core`) is the
   package's internal layer: its public names are the internal interface. The reach's receiver is
   not typed: `x._name` where a class of the reaching module has a private `_name` too is taken
   for its own;
4. an error told apart by its text: a comparison (`in`, `==`, ...) or a string method
   (startswith, find, ...) or a regular expression applied to an exception's `detail` or `hint`,
   to `str()` of an exception, or to what `gpuipc_errmsg` returned. Errors are mapped by their code
   or stable name (`gpuipc_err_name`), and by library queries such as `gpuipc_ring_closed`.

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

# Optional frameworks and the standard library are imported where they are needed; only the
# package's own modules are checked.
PACKAGE = 'gpuipc'

def fail(msg):
    failures.append(msg)
    print('FAIL:', msg)


def private(name):
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def sibling_targets(module, node):
    """The package's modules an import node names, as (module, imported names or None)."""
    out = []
    if isinstance(node, ast.ImportFrom):
        if node.level == 1 and node.module is None:  # from . import a, b
            out += [(a.name, None) for a in node.names if a.name in modules]
        elif node.level == 1:  # from .a import x
            out.append((node.module.split('.')[0], [a.name for a in node.names]))
        elif node.level == 0 and node.module and node.module.split('.')[0] == PACKAGE:
            parts = node.module.split('.')
            if len(parts) == 1:
                out += [(a.name, None) for a in node.names if a.name in modules]
            else:
                out.append((parts[1], [a.name for a in node.names]))
    elif isinstance(node, ast.Import):
        for a in node.names:
            parts = a.name.split('.')
            if parts[0] == PACKAGE and len(parts) > 1:
                out.append((parts[1], None))
    return [(m, names) for m, names in out if m in modules and m != module]


def type_checking_block(node):
    return isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test)


def walk_imports(tree):
    """(import node, inside a function?) for every import, leaving out `if TYPE_CHECKING:` blocks."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if type_checking_block(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                        ast.Lambda)))
    yield from visit(tree, False)


# ---- 1 and 2: cycles and imports inside functions ----
edges = {m: set() for m in modules}
for module, tree in modules.items():
    for node, in_function in walk_imports(tree):
        for target, names in sibling_targets(module, node):
            if module != '__init__':
                edges[module].add(target)
            if in_function:
                fail(f'{module}.py:{node.lineno}: imports {target} inside a function')
            for name in names or ():
                if private(name):
                    fail(f'{module}.py:{node.lineno}: imports {target}.{name}, a private name of another module')

# Tarjan's strongly connected components: any with two or more modules is a cycle.
index, low, stack, on_stack, components = {}, {}, [], set(), []


def strongconnect(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            strongconnect(w)
            low[v] = min(low[v], low[w])
        elif w in on_stack:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop()
            on_stack.discard(w)
            component.append(w)
            if w == v:
                break
        components.append(sorted(component))


for v in sorted(edges):
    if v not in index:
        strongconnect(v)
for component in components:
    if len(component) > 1:
        fail(f'import cycle among {", ".join(component)}')

# ---- 3: privates of other modules ----
classes = []  # (module, ClassDef, its private members, its _INTERNAL)
for module, tree in modules.items():
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        names = set()
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and private(n.name):
                names.add(n.name)
            elif (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                  and n.value.id in ('self', 'cls') and private(n.attr)):
                names.add(n.attr)
        internal = {}
        for n in cls.body:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and private(t.id):
                    names.add(t.id)
                if isinstance(t, ast.Name) and t.id == '__slots__':
                    names |= {e.value for e in ast.walk(n.value)
                              if isinstance(e, ast.Constant) and isinstance(e.value, str) and private(e.value)}
                if isinstance(t, ast.Name) and t.id == '_INTERNAL':
                    try:
                        internal = ast.literal_eval(n.value)
                    except ValueError:
                        internal = None
                    if type(internal) is not dict or not all(
                            type(k) is str and type(v) is str and v.strip() for k, v in internal.items()):
                        fail(f'{module}.py:{n.lineno}: {cls.name}._INTERNAL is not a dict from member names '
                             f'to reasons')
                        internal = {}
        classes.append((module, cls, names, internal))

# A subclass (Attached of _Memory) has its bases' interface: the package's classes, by name.
by_name = {}
for module, cls, names, internal in classes:
    by_name.setdefault(cls.name, []).append((cls, names, internal))


def interface(cls, seen=()):
    out = {}
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        for base_cls, _, base_internal in by_name.get(base_name, []):
            if base_cls not in seen:
                out.update(interface(base_cls, seen + (cls,)))
                out.update(base_internal)
    return out


defined = {m: set() for m in modules}  # private members of each module's classes, less their interface
client_private = set()
client_internal = set()  # Client._INTERNAL: its internal interface, which every module may use
declared = []            # (module, class, member) of every class's own _INTERNAL
for module, cls, names, internal in classes:
    for name in sorted(set(internal) - names):
        fail(f'{cls.name}._INTERNAL names {name}, which {cls.name} does not have')
    declared += [(module, cls.name, name) for name in sorted(set(internal) & names)]
    private_here = names - set(internal) - set(interface(cls)) - {'_INTERNAL'}
    defined[module] |= private_here
    if module == 'client' and cls.name == 'Client':
        client_private |= private_here
        client_internal = set(internal)
owners = {}
for module, names in defined.items():
    for name in names:
        owners.setdefault(name, set()).add(module)

# A declared member that no other module uses is not part of an interface: it is private.
used_by = {}  # private attribute name -> modules that read or write it on something not self/cls
for module, tree in modules.items():
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and private(n.attr)
                and not (isinstance(n.value, ast.Name) and n.value.id in ('self', 'cls'))):
            used_by.setdefault(n.attr, set()).add(module)
for module, cls, name in declared:
    if not used_by.get(name, set()) - {module}:
        fail(f'{cls}._INTERNAL declares {name}, which no other module uses: take it off')


def others(name, module):
    """The other modules whose classes have a private member `name` (one a class declares in its
    _INTERNAL is not private)."""
    return sorted(owners.get(name, set()) - {module})


def looks_like_client(node):
    """Whether a receiver is a Client by its name (`client`, `c`, `self.client`, `x._client`): a
    class of another module may have a private member of the same name as Client's (a ring's _lib)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ''
    return name in ('client', 'c', '_client')


for module, tree in modules.items():
    aliases = {}  # local name -> sibling module
    for node, _ in walk_imports(tree):
        if isinstance(node, ast.ImportFrom):
            for target, names in sibling_targets(module, node):
                if names is None:
                    aliases.update({a.asname or a.name: a.name for a in node.names if a.name == target})
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or not private(n.attr):
            continue
        receiver = n.value.id if isinstance(n.value, ast.Name) else None
        if receiver in ('self', 'cls'):
            continue
        if n.attr in client_internal and looks_like_client(n.value):
            continue  # the client's internal interface
        if receiver in aliases and not aliases[receiver].startswith('_'):
            where = f'{aliases[receiver]}.{n.attr}, a private name of module {aliases[receiver]}'
        elif module != 'client' and n.attr in client_private and looks_like_client(n.value):
            where = f'.{n.attr}, a private member of Client'
        elif others(n.attr, module) and n.attr not in defined[module]:
            where = f'.{n.attr}, a private member of a class of {", ".join(others(n.attr, module))}'
        else:
            continue
        fail(f'{module}.py:{n.lineno}: {where}')

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

# ---- every module is installed (python/meson.build lists them, for the wheel and meson install) ----
installed = os.path.join(pkg_dir, os.pardir, 'meson.build')
if os.path.exists(installed):
    with open(installed, encoding='utf-8') as f:
        listed = f.read()
    for module in modules:
        if f"'gpuipc/{module}.py'" not in listed:
            fail(f'{module}.py is not installed: python/meson.build does not list it')

if failures:
    print(f'{len(failures)} failure(s)')
    sys.exit(1)
print(f'{len(modules)} modules: layered, no cycle, no reach into another module\'s privates, '
      'no error told by its text')
