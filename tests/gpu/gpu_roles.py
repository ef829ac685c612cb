"""What the GPU suite's Python scripts (test-gpu-ring.py, test-gpu-weights.py) share: a role of the
script run in a child process (optionally in a PID namespace of its own) that speaks in JSON lines
on its stdout, and the PASS/FAIL report whose failures decide the exit status. Timings are printed
MET or MISSED and never fail a run."""
import json
import os
import subprocess
import sys
import threading
import time


class Role:
    """`script --role NAME ARGS...` in a child process (optionally in a new PID namespace)."""

    def __init__(self, script, name, *args, pidns=False, env=None, label=None, step_timeout_s=120):
        cmd = [sys.executable, os.path.abspath(script), '--role', name, *args]
        if pidns:
            cmd = ['unshare', '--pid', '--fork', '--mount-proc', '--kill-child', *cmd]
        self.name = label or name
        self.step_timeout_s = step_timeout_s
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                  env=dict(os.environ, **(env or {})))

    def expect(self, word, timeout=None):
        """The JSON after the next line starting with word; other lines (a library's chatter) are
        shown and skipped. Raises after timeout seconds (the role's step timeout by default) or if
        the role exits."""
        timeout = self.step_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            out = []
            t = threading.Thread(target=lambda: out.append(self.p.stdout.readline()), daemon=True)
            t.start()
            t.join(max(0.0, deadline - time.monotonic()))
            line = out[0].strip() if out else None
            if line is None or (not line and self.p.poll() is not None):
                raise RuntimeError(f'{self.name}: no {word!r} within {timeout} s (exit status {self.p.poll()})')
            if line.startswith(word):
                rest = line[len(word):].strip()
                return json.loads(rest) if rest else None
            if line:
                print(f'  [{self.name}] {line[:300]}')

    def say(self, word):
        try:
            self.p.stdin.write(word + '\n')
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # a role that died: its expect() says so

    def stop(self, timeout=30):
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


class Report:
    def __init__(self):
        self.results = []

    def check(self, name, ok, detail=''):
        self.results.append((name, bool(ok)))
        print(f'{"PASS" if ok else "FAIL"}  {name}{": " + detail if detail else ""}', flush=True)

    def target(self, name, met, detail=''):
        """A performance target: printed MET or MISSED, never a failure (timings are measurements,
        not correctness; docs/performance.md records them)."""
        print(f'{"MET " if met else "MISSED"}  {name}{": " + detail if detail else ""}', flush=True)

    def error(self, name, exc):
        self.results.append((name, False))
        print(f'FAIL  {name}: {exc}', flush=True)

    def skip(self, name, why):
        print(f'SKIP  {name}: {why}', flush=True)
