#!/usr/bin/env python3
"""Checks that a Grafana dashboard applies rate(), irate() and increase() to counters only: what
is a counter is read from the exporter's own `# TYPE` lines (counter families, and a histogram's
_bucket, _sum and _count series), not from a list kept here. rate() of a gauge (a ring's head, a
count of buffers) gives numbers that look plausible and mean nothing: a gauge that goes down reads
as a counter reset.

    dashboard_rates.py DASHBOARD.json EXPOSITION.txt     (prints each misuse; exit 1 if any)

Imported by tests/cli/test_cli.py (case dashboard_rates)."""
import json
import re
import sys

RATE_OF = re.compile(r"\b(rate|irate|increase)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


def series_types(exposition):
    """Series name -> its family's type, from the exposition's TYPE lines (a histogram's _bucket,
    _sum and _count series are counters)."""
    out = {}
    for line in exposition.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)$", line)
        if not m:
            continue
        name, kind = m.groups()
        if kind in ("histogram", "summary"):
            out.update({name + s: "counter" for s in ("_bucket", "_sum", "_count")})
        else:
            out[name] = kind
    return out


def counter_series(exposition):
    """The series names the exposition's TYPE lines make counters."""
    return {n for n, kind in series_types(exposition).items() if kind == "counter"}


def queries(node):
    """Every `expr` in the dashboard, wherever it sits (panels, rows, templating)."""
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for v in node.values():
            yield from queries(v)
    elif isinstance(node, list):
        for v in node:
            yield from queries(v)


def misuses(dashboard, exposition):
    """One line per rate()-like function applied to something that is not a counter."""
    types = series_types(exposition)
    out = []
    for expr in queries(dashboard):
        for fn, name in RATE_OF.findall(expr):
            if name not in types:
                out.append("%s(%s): the exposition has no TYPE line for %s (is it served?) (%s)" % (fn, name, name, expr))
            elif types[name] != "counter":
                out.append("%s(%s): %s is a %s, not a counter (%s)" % (fn, name, name, types[name], expr))
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        dashboard = json.load(f)
    with open(sys.argv[2]) as f:
        exposition = f.read()
    bad = misuses(dashboard, exposition)
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
