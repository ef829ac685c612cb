#!/usr/bin/env python3
"""Code-shape metrics of the C and Python trees, per directory: function body length (median, p90,
longest) and comment lines per code line; with --cases, how many test cases say in a comment what
they prove.

    tools/code-metrics.py [--root DIR] [--dirs broker,client,...] [--cases]

How it counts (so that numbers taken at different commits compare):
- a small lexer blanks comments and string and character literals first;
- a function is a file-scope '{' whose previous code token is ')', in .c and .h files alike (static
  inline functions in headers count); its body is the lines strictly between the line of that '{'
  and the line of its matching '}', which makes the count independent of brace placement;
- a code line (LOC) has a code token; a comment line has comment text; a line with code and a
  trailing comment counts as both; comment:code is comment lines / LOC;
- the Python package's files (.py under python/; elsewhere only C counts, so that the numbers of
  tests/ and examples/ stay those of their C) count the same way, read with the tokenize and ast modules: a comment line has
  a # comment or a line of a docstring (a string literal that is a statement of its own: a module's,
  class's or function's docstring, or a string standing alone as a note) with text on it; a code
  line has any other token; a function is a def, its body the lines after its def line through its
  last line (its docstring included);
- a test case is a function registered with TEST_RUN(argc, argv, fn) or H_TEST(fn) in
  tests/unit, tests/integration or tests/gpu; it "says what it proves" when a comment ends on the
  line right above its definition.
Repeated blocks (six or more lines) are not counted here: use a clone detector on the same tree.
"""
import argparse
import ast
import glob
import io
import os
import re
import statistics
import sys
import tokenize

SKIP_DIRS = ('build', 'node_modules', 'subprojects')


def lex(src):
    """(code, comment_lines): src with comments and literals blanked (newlines kept), and the
    0-based numbers of the lines that hold comment text."""
    out, comment_lines, i, n, line = [], set(), 0, len(src), 0
    while i < n:
        c = src[i]
        if c == '/' and src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            if src[i + 2:j].strip(' /'):
                comment_lines.add(line)
            out.append(' ' * (j - i))
            i = j
        elif c == '/' and src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
            for k, part in enumerate(src[i + 2:j - 2].split('\n')):
                if part.strip(' *'):
                    comment_lines.add(line + k)
            chunk = src[i:j]
            out.append(''.join('\n' if ch == '\n' else ' ' for ch in chunk))
            line += chunk.count('\n')
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c and src[j] != '\n':
                j += 2 if src[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * max(0, j - i - 2) + c)
            i = j
        else:
            line += c == '\n'
            out.append(c)
            i += 1
    return ''.join(out), comment_lines


def function_bodies(code):
    """Body lengths, in lines, of the file-scope functions in blanked code."""
    bodies, depth, prev, start, line = [], 0, '', None, 0
    for ch in code:
        if ch == '\n':
            line += 1
            continue
        if ch == '{':
            if depth == 0 and prev == ')':
                start = line
            depth += 1
        elif ch == '}':
            depth -= 1
            if depth == 0 and start is not None:
                bodies.append(max(0, line - start - 1))
                start = None
        if not ch.isspace():
            prev = ch
    return bodies


def source_files(root, d):
    exts = ('.c', '.h', '.py') if d == 'python' else ('.c', '.h')
    for dirpath, dirnames, files in os.walk(os.path.join(root, d)):
        dirnames[:] = [x for x in dirnames if x not in SKIP_DIRS and x != '__pycache__']
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(dirpath, f)


def python_lines(src):
    """(code_lines, comment_lines, function_bodies) of Python source, lines 1-based."""
    tree = ast.parse(src)
    lines = src.split('\n')
    doc = set()
    bodies = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for n in range(node.lineno, node.end_lineno + 1):
                if lines[n - 1].strip().strip('"\'rRbBuUfF').strip():
                    doc.add(n)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bodies.append(node.end_lineno - node.lineno)
    code, comment = set(), set(doc)
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER,
            tokenize.ENCODING)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            if tok.string.strip('# '):
                comment.add(tok.start[0])
        elif tok.type not in skip:
            for n in range(tok.start[0], tok.end[0] + 1):
                if n not in doc:
                    code.add(n)
    return code, comment, bodies


def measure(root, d):
    bodies, loc, comments = [], 0, 0
    for path in source_files(root, d):
        with open(path, errors='replace') as f:
            src = f.read()
        if path.endswith('.py'):
            code_lines, comment_lines, fbodies = python_lines(src)
            loc += len(code_lines)
            comments += len(comment_lines)
            bodies += fbodies
            continue
        code, comment_lines = lex(src)
        loc += sum(1 for x in code.split('\n') if x.strip())
        comments += len(comment_lines)
        bodies += function_bodies(code)
    return bodies, loc, comments


def percentile(values, p):
    v = sorted(values)
    if not v:
        return 0.0
    k = (len(v) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def row(name, bodies, loc, comments):
    return '| %s | %d | %g | %.1f | %d | %d | %d | %.2f |' % (
        name, len(bodies), statistics.median(bodies) if bodies else 0, percentile(bodies, 0.9),
        max(bodies) if bodies else 0, loc, comments, comments / loc if loc else 0)


def cases(root):
    total = commented = 0
    missing = []
    for d in ('tests/unit', 'tests/integration', 'tests/gpu'):
        for path in sorted(glob.glob(os.path.join(root, d, '*.c'))):
            with open(path, errors='replace') as f:
                lines = f.read().split('\n')
            text = '\n'.join(lines)
            names = set(re.findall(r'TEST_RUN\(\s*argc\s*,\s*argv\s*,\s*(\w+)\s*\)', text))
            names |= set(re.findall(r'H_TEST\(\s*(\w+)\s*\)', text))
            for name in sorted(names):
                for i, l in enumerate(lines):
                    if re.match(r'^(static\s+)?void\s+%s\s*\(' % name, l):
                        total += 1
                        if i and lines[i - 1].rstrip().endswith('*/'):
                            commented += 1
                        else:
                            missing.append('%s:%d: %s' % (os.path.relpath(path, root), i + 1, name))
                        break
    return total, commented, missing


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    ap.add_argument('--dirs', default='broker,client,proto,util,cli,gst,python,examples,tests')
    ap.add_argument('--cases', action='store_true', help='list test cases without a comment saying what they prove')
    a = ap.parse_args()
    product = ('broker', 'client', 'proto', 'util', 'cli', 'gst', 'python')
    all_bodies, all_loc, all_comments = [], 0, 0
    print('| dir | functions | median body | p90 body | longest | LOC | comment lines | comment:code |')
    print('|---|---|---|---|---|---|---|---|')
    for d in a.dirs.split(','):
        bodies, loc, comments = measure(a.root, d)
        print(row(d, bodies, loc, comments))
        if d in product:
            all_bodies += bodies
            all_loc += loc
            all_comments += comments
    if all_bodies:
        print(row('product (%s)' % '+'.join(x for x in a.dirs.split(',') if x in product), all_bodies, all_loc,
                  all_comments))
    if a.cases:
        total, commented, missing = cases(a.root)
        print('\ntest cases: %d, with a comment saying what they prove: %d' % (total, commented))
        for m in missing:
            print('  ' + m)
    return 0


if __name__ == '__main__':
    sys.exit(main())
