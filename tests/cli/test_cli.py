#!/usr/bin/env python3
"""gpuipcctl as scripts and Prometheus meet it, against a real broker on a temporary socket.

Usage: test_cli.py CASE  (meson registers each case as a test of its own; "list" prints them)
Needs GPUIPC_BROKER and GPUIPC_CTL; exit 77 = skipped. Each case says what it proves.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

BROKER = os.environ.get("GPUIPC_BROKER", "")
CTL = os.environ.get("GPUIPC_CTL", "")
SOURCE_ROOT = os.environ.get("GPUIPC_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
DASHBOARD = os.path.join(SOURCE_ROOT, "k8s", "grafana", "gpuipc-dashboard.json")
SKIP = 77


class Failure(Exception):
    pass


# Every process a case starts, so that a failing case leaves none behind.
STARTED = []


def popen(*args, **kwargs):
    p = subprocess.Popen(*args, **kwargs)
    STARTED.append(p)
    return p


def kill_leftovers():
    for p in STARTED:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def check(cond, what):
    if not cond:
        raise Failure(what)


# ---- processes ----

class Broker:
    """A broker under its own seccomp filter on a socket of its own."""

    def __init__(self, tmp, *args):
        self.sock = os.path.join(tmp, "gpuipc.sock")
        # Its log goes to a file: a pipe nobody reads while the case runs would fill and block the
        # broker (the audit trail writes a record per publish and attach whatever --log-level says).
        self.log_path = os.path.join(tmp, "broker.log")
        self.args = list(args)
        self.proc = None
        self.start()

    def start(self):
        with open(self.log_path, "a") as log:
            self.proc = popen([BROKER, "--socket", self.sock, "--seccomp", "enforce", "--log-level", "warn",
                               *self.args], stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if ctl(self.sock, "--timeout", "100", "ping").rc == 0:
                return
            if self.proc.poll() is not None:
                raise Failure("the broker exited at start: " + self.log())
            time.sleep(0.05)
        raise Failure("the broker did not answer within 10 s")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(10)
        log = self.log() if self.proc else ''
        self.proc = None
        # A call the filter had to refuse is a libc path its allow-list misses (docs/security.md).
        if 'seccomp:' in log:
            raise Failure("the broker logged a system call outside its allow-list:\n" + log)


class Result:
    def __init__(self, rc, out, err, seconds):
        self.rc, self.out, self.err, self.seconds = rc, out, err, seconds

    def __str__(self):
        return "exit %d after %.1f s\nstdout: %s\nstderr: %s" % (self.rc, self.seconds, self.out, self.err)


def ctl(sock, *args, timeout=30):
    start = time.monotonic()
    try:
        p = subprocess.run([CTL, "--socket", sock, *args], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failure("gpuipcctl %s still ran after %d s: %s" % (" ".join(args), timeout, e.stderr))
    try:
        out, err = p.stdout.decode(), p.stderr.decode()
    except UnicodeDecodeError as e:
        raise Failure("gpuipcctl %s printed bytes that are not UTF-8 (%s): %r" % (" ".join(args), e, p.stdout))
    return Result(p.returncode, out, err, time.monotonic() - start)


def spawn(sock, *args):
    return popen([CTL, "--socket", sock, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_line(proc, seconds=10):
    """The next stdout line of a running gpuipcctl, within seconds. Reads the pipe itself: a
    buffered reader could hold a second line where select() no longer sees it."""
    import selectors
    fd = proc.stdout.fileno()
    pending = getattr(proc, "pending", b"")
    deadline = time.monotonic() + seconds
    while b"\n" not in pending:
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        left = deadline - time.monotonic()
        check(left > 0 and sel.select(left), "no output within %d s" % seconds)
        chunk = os.read(fd, 65536)
        if not chunk:  # (the message reads stderr, which waits for the end: only once it ended)
            raise Failure("gpuipcctl ended early: " + proc.stderr.read())
        pending += chunk
    line, _, proc.pending = pending.partition(b"\n")
    return line.decode() + "\n"


def one_document(r, what):
    """stdout is exactly one JSON document (and one line)."""
    text = r.out.strip()
    check(text and "\n" not in text, "%s: expected one line of JSON: %s" % (what, r))
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Failure("%s: not JSON (%s): %s" % (what, e, r))


def memfd_publisher(sock, name, *extra):
    """A gpuipcctl publish holding a small buffer; returns (process, its published document)."""
    p = spawn(sock, "--json", "publish", name, "--size", "64K", "--fill", "random:3", *extra)
    doc = json.loads(read_line(p))
    check(doc.get("event") == "published" and doc.get("name") == name, "publish said: %s" % doc)
    return p, doc


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


# ---- HTTP ----

def http_get(url, timeout=15):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


class Exporter:
    def __init__(self, sock, *extra, timeout_ms=1000, listen="127.0.0.1:0"):
        self.proc = spawn(sock, "--json", "--timeout", str(timeout_ms), "metrics", "--listen", listen, *extra)
        doc = json.loads(read_line(self.proc))
        check(doc.get("event") == "listening", "the exporter said: %s" % doc)
        self.url = "http://" + doc["address"]
        self.host, port = doc["address"].rsplit(":", 1)
        self.port = int(port)

    def get(self, path, timeout=15):
        return http_get(self.url + path, timeout)

    def timed_get(self, path, timeout=30):
        """(status, body, seconds); status 0 when no answer came within timeout."""
        start = time.monotonic()
        try:
            status, _, body = http_get(self.url + path, timeout)
        except (OSError, urllib.error.URLError) as e:
            status, body = 0, "no answer: %s" % e
        return status, body, time.monotonic() - start

    def status(self):
        """/proc/PID/status as a dict."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)

    def stop(self):
        """Stops it; its log must not name a system call the filter refused."""
        rc, _, err = stop(self.proc)
        check("seccomp:" not in err, "the exporter's filter refused a call: %s" % err)
        return rc, err


def parse_exposition(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}} from the text format."""
    families, current = {}, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            current = families.setdefault(name, {"samples": []})
            check("help" not in current, "two HELP lines for %s" % name)
            current["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            families.setdefault(name, {"samples": []})["type"] = typ
        elif line and not line.startswith("#"):
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$', line)
            check(m, "not a sample line: %r" % line)
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            base = m.group(1)
            for suffix in ("_bucket", "_sum", "_count"):
                if base.endswith(suffix) and base[:-len(suffix)] in families:
                    base = base[:-len(suffix)]
            check(base in families, "sample %s before its HELP/TYPE" % m.group(1))
            families[base]["samples"].append((m.group(1), labels, float(m.group(3))))
    return families


def sample(families, name, **labels):
    for family in families.values():
        for n, l, v in family["samples"]:
            if n == name and all(l.get(k) == val for k, val in labels.items()):
                return v
    raise Failure("no sample %s%s" % (name, labels))


def find_promtool():
    for candidate in (os.environ.get("PROMTOOL"), shutil.which("promtool"),
                      os.path.join(SOURCE_ROOT, ".tools", "promtool")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def promtool_check(text):
    tool = find_promtool()
    if not tool:
        print("skip: no promtool (./dev.sh installs it from Debian's prometheus package)")
        sys.exit(SKIP)
    p = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True)
    check(p.returncode == 0, "promtool check metrics failed:\n%s%s" % (p.stdout, p.stderr))


# ---- cases ----

def case_help(tmp):
    """`gpuipcctl CMD --help` (and -h) works for every command `gpuipcctl --help` lists."""
    r = subprocess.run([CTL, "--help"], capture_output=True, text=True)
    check(r.returncode == 0, "gpuipcctl --help: %d" % r.returncode)
    commands = re.findall(r"^  ([a-z]+) {2,}", r.stdout.split("Commands:")[1], re.M)
    check(len(commands) >= 12, "expected the command list in --help, got %s" % commands)
    for cmd in commands:
        for flag in ("--help", "-h"):
            h = subprocess.run([CTL, cmd, flag], capture_output=True, text=True)
            check(h.returncode == 0 and h.stdout.startswith("Usage: gpuipcctl") and (" %s" % cmd) in h.stdout,
                  "gpuipcctl %s %s: exit %d: %s%s" % (cmd, flag, h.returncode, h.stdout, h.stderr))
            check("--help" in h.stdout, "gpuipcctl %s --help does not list --help itself" % cmd)


def case_version(tmp):
    """gpuipcctl --version and gpuipc-broker --version name their release."""
    for exe, name in ((CTL, "gpuipcctl"), (BROKER, "gpuipc-broker")):
        r = subprocess.run([exe, "--version"], capture_output=True, text=True)
        check(r.returncode == 0 and re.match(r"^%s \d+\.\d+\.\d+\n" % name, r.stdout),
              "%s --version: %d %r" % (name, r.returncode, r.stdout))
    r = subprocess.run([CTL, "--version"], capture_output=True, text=True)
    check(re.search(r"^libgpuipc \d+\.\d+\.\d+$", r.stdout, re.M), "no library version: %r" % r.stdout)


def case_json(tmp):
    """Every command prints exactly one JSON document with --json (watch and publish: one per line),
    failures included."""
    b = Broker(tmp)
    s = b.sock
    watch = spawn(s, "--json", "watch", "--prefix", "js/")
    time.sleep(0.3)  # subscribed
    pub, pdoc = memfd_publisher(s, "js/a")
    for key in ("buffer", "generation", "kind", "size"):
        check(key in pdoc, "publish document lacks %s: %s" % (key, pdoc))
    ev = json.loads(read_line(watch))
    check(ev["event"] == "published" and ev["name"] == "js/a", "watch said %s" % ev)

    check(one_document(ctl(s, "--json", "ping"), "ping")["ok"] is True, "ping")
    ls = one_document(ctl(s, "--json", "ls"), "ls")
    check(isinstance(ls, list) and [x["name"] for x in ls] == ["js/a"], "ls: %s" % ls)
    st = one_document(ctl(s, "--json", "stat", "js/a"), "stat")
    check(st["buffer"]["name"] == "js/a" and isinstance(st["holders"], list), "stat: %s" % st)
    peers = one_document(ctl(s, "--json", "peers"), "peers")
    check(len(peers) >= 2 and all("label" in p for p in peers), "peers: %s" % peers)
    stats = one_document(ctl(s, "--json", "stats"), "stats")
    check(stats["buffers_live"] == 1 and isinstance(stats["request_errors_total"], dict), "stats: %s" % stats)
    metrics = one_document(ctl(s, "--json", "metrics"), "metrics")
    check(any(f["name"] == "gpuipc_up" and f["samples"][0]["value"] == 1 for f in metrics), "metrics: up")
    doctor = one_document(ctl(s, "--json", "doctor"), "doctor")
    check(doctor["broker"] is True and doctor["checks"], "doctor: %s" % doctor)
    group = one_document(ctl(s, "--json", "group", "js/g", "--members", "1"), "group")
    check(group["event"] == "complete", "group: %s" % group)
    att = one_document(ctl(s, "--json", "attach", "js/a", "--verify", "random:3"), "attach")
    check(att["event"] == "attached" and att["verified"] is True, "attach: %s" % att)
    bad = ctl(s, "--json", "attach", "js/a", "--verify", "random:4")
    check(bad.rc == 1 and one_document(bad, "attach (mismatch)")["verified"] is False, "attach mismatch: %s" % bad)
    ret = one_document(ctl(s, "--json", "retire", "js/a"), "retire")
    check(ret["event"] == "retired" and ret["buffer"] == pdoc["buffer"], "retire: %s" % ret)
    check(json.loads(read_line(pub))["event"] == "drained", "publish: no drained line")
    rc, out, err = stop(pub)
    check(rc == 0 and out == "", "publish after drained: %d %r %r" % (rc, out, err))
    for line in (read_line(watch), read_line(watch)):
        check(json.loads(line)["event"] in ("retired", "drained"), "watch: %s" % line)

    # Failures are one document too: {"error": NAME, "message": TEXT}.
    for args, name in ((("stat", "nosuch"), "not-found"), (("publish", "x", "--size", "0"), "usage")):
        r = ctl(s, "--json", *args)
        doc = one_document(r, " ".join(args))
        check(r.rc != 0 and doc.get("error") == name and doc.get("message"), "%s: %s" % (args, r))
    # ... on stdout instead of stderr, whatever failed: usage, the broker, the command itself.
    for args, name, rc in ((("stat", "nosuch"), "not-found", 1), (("bogus",), "usage", 2), ((), "usage", 2),
                           (("--bogus", "--json", "ls"), "usage", 2), (("ls", "--bogus"), "usage", 2)):
        r = ctl(s, *(args if "--json" in args else ("--json",) + args))
        doc = one_document(r, " ".join(args) or "(no command)")
        check(r.rc == rc and doc.get("error") == name and r.err == "",
              "--json %s: exit %d, error %s and nothing on stderr expected: %s" % (" ".join(args), rc, name, r))
    version = one_document(ctl(s, "-V", "--json"), "-V --json")
    check(re.match(r"^\d+\.\d+\.\d+$", version.get("gpuipcctl", "")) and version.get("libgpuipc"),
          "-V --json: %s" % version)
    stop(watch)
    b.stop()
    r = ctl(s, "--json", "--timeout", "0", "ls")
    check(r.rc == 3 and one_document(r, "ls without broker")["error"] == "no-broker" and r.err == "",
          "no broker: %s" % r)


def case_doctor_no_broker(tmp):
    """Without a broker, doctor still runs the PID-namespace and GPU checks and gives each a verdict."""
    sock = os.path.join(tmp, "absent.sock")
    r = ctl(sock, "doctor")
    check(r.rc == 3, "doctor without a broker should exit 3: %s" % r)
    for check_name in ("socket", "broker", "pid-namespace", "pid", "dev-shm"):
        check(re.search(r"^\[(FAIL| ok | \?\? |warn)\] %s " % check_name, r.out, re.M), "no %s verdict: %s" % (check_name, r))
    check(re.search(r"^\[(FAIL| ok | \?\? | -- )\] (gpus|driver) ", r.out, re.M), "no GPU verdict: %s" % r)
    doc = one_document(ctl(sock, "--json", "doctor"), "doctor --json")
    names = [c["check"] for c in doc["checks"]]
    check({"socket", "broker", "pid-namespace", "pid", "dev-shm"} <= set(names) and
          ("gpus" in names or "driver" in names), "doctor --json checks: %s" % names)
    check(all(c["verdict"] in ("ok", "fail", "unknown", "none", "warn") for c in doc["checks"]), "verdicts: %s" % doc)
    # This process's own PID and /dev/shm, even without a broker.
    shm = os.stat("/dev/shm")
    check(doc["self"]["pid"] > 1 and (doc["self"]["shm_dev"], doc["self"]["shm_ino"]) == (shm.st_dev, shm.st_ino),
          "doctor --json self: %s" % doc.get("self"))


def case_doctor_no_gpu(tmp):
    """On a host where CUDA is not usable, doctor does not call the GPU check ok nor say "all checks
    passed": the check's verdict is "--" (none), the summary says no GPU was checked, and the exit
    status is still 0 (memfd works)."""
    b = Broker(tmp)
    env = dict(os.environ, GPUIPC_LIBCUDA=os.path.join(tmp, "no-libcuda.so.1"))
    p = subprocess.run([CTL, "--socket", b.sock, "doctor"], capture_output=True, text=True, timeout=60, env=env)
    check(p.returncode == 0, "doctor without CUDA: exit %d: %s%s" % (p.returncode, p.stdout, p.stderr))
    check(re.search(r"^\[ -- \] gpus +no GPU checked: CUDA is not usable here", p.stdout, re.M),
          "no '--' verdict for the GPUs: %s" % p.stdout)
    check("all checks passed" not in p.stdout and "no GPU was checked" in p.stdout.splitlines()[-1],
          "the summary claims too much: %s" % p.stdout)
    p = subprocess.run([CTL, "--socket", b.sock, "--json", "doctor"], capture_output=True, text=True, timeout=60,
                       env=env)
    doc = json.loads(p.stdout)
    gpus = [c for c in doc["checks"] if c["check"] == "gpus"]
    check(gpus and gpus[0]["verdict"] == "none" and doc["gpus_checked"] is False and doc["problems"] == 0,
          "doctor --json without CUDA: %s" % doc)
    b.stop()


def case_doctor_shm(tmp):
    """doctor (and peers --json) report this process's /dev/shm identity and name the peers that
    declared another (one in a mount namespace with a /dev/shm of its own), which IPC-event fences
    need to be the same; it is information, not a problem."""
    if not unshare_pid_usable():
        print("skip: unshare is not permitted here")
        sys.exit(SKIP)
    b = Broker(tmp)
    s = b.sock
    other = popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount -t tmpfs none /dev/shm && exec "$0" --socket %s watch' % s, CTL],
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    shm = os.stat("/dev/shm")
    deadline = time.monotonic() + 30
    while True:
        peers = one_document(ctl(s, "--json", "peers"), "peers")
        mine = [p for p in peers if (p["shm_dev"], p["shm_ino"]) == (shm.st_dev, shm.st_ino)]
        theirs = [p for p in peers if p["shm_dev"] and (p["shm_dev"], p["shm_ino"]) != (shm.st_dev, shm.st_ino)]
        if theirs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    check(len(theirs) == 1 and theirs[0]["self_pid"] == other.pid and mine,
          "peers' /dev/shm: mine %s, another %s" % (shm, peers))
    r = ctl(s, "--json", "doctor")
    doc = one_document(r, "doctor")
    checks = {c["check"]: c for c in doc["checks"]}
    check(checks["dev-shm"]["verdict"] == "ok" and doc["problems"] == 0 and r.rc == 0, "dev-shm: %s" % doc)
    check([p["peer"] for p in doc["self"]["other_shm"]] == [theirs[0]["peer"]] and
          (doc["self"]["shm_dev"], doc["self"]["shm_ino"]) == (shm.st_dev, shm.st_ino),
          "doctor's other_shm: %s" % doc["self"])
    stop(other)
    b.stop()


def case_doctor_gpu(tmp):
    """On a GPU host, doctor finds the driver and reports every visible GPU with its UUID and the
    facts the CUDA kinds need (VMM, POSIX-fd export, fences), each ok. Skipped without CUDA."""
    b = Broker(tmp)
    r = ctl(b.sock, "--json", "doctor", timeout=120)
    doc = one_document(r, "doctor --json")
    checks = {c["check"]: c for c in doc["checks"]}
    if "driver" not in checks:
        print("skip: no usable CUDA here: %s" % checks.get("gpus", {}).get("detail", "?"))
        b.stop()
        sys.exit(SKIP)
    check(checks["driver"]["verdict"] == "ok", "driver: %s" % checks["driver"])
    n = int(re.search(r"(\d+) visible device", checks["driver"]["detail"]).group(1))
    check(n > 0, "no visible device: %s" % checks["driver"])
    for i in range(n):
        check(re.search(r"\b(GPU|MIG)-", checks["gpu%d" % i]["detail"]), "gpu%d: %s" % (i, checks["gpu%d" % i]))
        for fact in ("vmm", "posix-fd", "fences"):
            c = checks["gpu%d %s" % (i, fact)]
            check(c["verdict"] == "ok", "gpu%d %s: %s" % (i, fact, c))
    check(r.rc == (0 if doc["problems"] == 0 else 1), "exit %d with %d problems" % (r.rc, doc["problems"]))
    if unshare_pid_usable():
        doctor_legacy_pid(b)
    else:
        print("unshare --pid is not permitted here: the cuda-legacy PID checks are left out")
    b.stop()


def doctor_json(argv, what):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    doc = one_document(Result(p.returncode, p.stdout, p.stderr, 0), what)
    checks = {c["check"]: c for c in doc["checks"]}
    check("pid" in checks, "%s: no pid check: %s" % (what, doc))
    return p.returncode, doc, checks["pid"]


def doctor_legacy_pid(b):
    """doctor's pid check against the cuda-legacy producers and holders the broker knows, each in a
    PID namespace of its own as in a container: PID 1 with no legacy buffer is a warning; PID 1 next
    to a producer that is PID 1 of its namespace, and to a holder that is, fails (exit 1) naming both
    with the gpuipcctl run hint; under gpuipcctl run, and in the broker's namespace, it passes."""
    s = b.sock
    rc, doc, pid = doctor_json(in_new_pidns(CTL, "--socket", s, "--json", "doctor"), "doctor as PID 1")
    check(doc["self"]["pid"] == 1 and pid["verdict"] == "warn" and "gpuipcctl run --" in pid["detail"],
          "PID 1 without legacy buffers: %s" % pid)
    check(doc["self"]["pid_collisions"] == [], "collisions without legacy buffers: %s" % doc["self"])
    # leg/p1: published by PID 1 of a namespace; leg/p2: by a process of the broker's, held by PID 1
    # of another namespace (PIDs 1 and X differ: the attach works).
    p1 = popen(in_new_pidns(CTL, "--socket", s, "--json", "publish", "leg/p1", "--size", "64K", "--kind",
                            "cuda-legacy"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check(json.loads(read_line(p1, 60))["event"] == "published", "leg/p1 not published")
    p2 = spawn(s, "--json", "publish", "leg/p2", "--size", "64K", "--kind", "cuda-legacy")
    check(json.loads(read_line(p2, 60))["event"] == "published", "leg/p2 not published")
    holder = popen(in_new_pidns(CTL, "--socket", s, "--json", "attach", "leg/p2", "--verify", "counter", "--hold",
                                "-1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    att = json.loads(read_line(holder, 60))
    check(att.get("event") == "attached" and att.get("verified") is True, "the holder of leg/p2: %s" % att)

    rc, doc, pid = doctor_json(in_new_pidns(CTL, "--socket", s, "--json", "doctor"), "doctor as PID 1")
    found = sorted((c["role"], c["name"]) for c in doc["self"]["pid_collisions"])
    check(rc == 1 and pid["verdict"] == "fail" and found == [("holder", "leg/p2"), ("producer", "leg/p1")],
          "doctor as PID 1 next to a PID-1 producer and holder: exit %d, %s, collisions %s" % (rc, pid, found))
    check("gpuipcctl run --" in pid["detail"], "no gpuipcctl run hint for PID 1: %s" % pid)
    r = subprocess.run(in_new_pidns(CTL, "--socket", s, "doctor"), capture_output=True, text=True, timeout=120)
    check(r.returncode == 1 and re.search(r"^\[FAIL\] pid +1 ", r.stdout, re.M), "doctor's text: %s" % r.stdout)
    for argv, what in ((in_new_pidns(CTL, "--socket", s, "run", "--quiet", "--", CTL, "--socket", s, "--json",
                                     "doctor"), "doctor under gpuipcctl run"),
                       ([CTL, "--socket", s, "--json", "doctor"], "doctor in the broker's namespace")):
        rc, doc, pid = doctor_json(argv, what)
        check(pid["verdict"] == "ok" and doc["self"]["pid"] != 1 and doc["self"]["pid_collisions"] == [],
              "%s: %s" % (what, pid))
    # unshare passes no SIGTERM on: SIGKILL, whose --kill-child takes the namespace's process along.
    for p in (holder, p1):
        p.kill()
        p.wait()
    stop(p2)


def unshare_pid_usable():
    """Whether this process may create PID namespaces (root, or a user namespace): skip if not."""
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def in_new_pidns(*argv, **kwargs):
    """argv as the first process (PID 1) of a new PID namespace with its own /proc, as in a container."""
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *argv]


def run_line(err):
    """The PID and target from run's line on stderr."""
    m = re.search(r"^gpuipcctl run: \S+ runs as PID (\d+) \(target (\d+), (\d+) peer PID", err, re.M)
    check(m, "no 'runs as PID' line: %r" % err)
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def case_run_pid(tmp):
    """gpuipcctl run as a container's first process (PID 1 of a new PID namespace): the command gets
    a PID that is not 1 and at least the target, 64 + (the namespace's inode mod 960), and its line
    on stderr names that PID; with --min-pid X and a peer whose own PID is X, the command does not
    get X."""
    if not unshare_pid_usable():
        print("skip: unshare --pid is not permitted here")
        sys.exit(SKIP)
    b = Broker(tmp)
    # The namespace's inode from inside it, then run (still PID 1: exec) prints the command's $$.
    p = subprocess.run(in_new_pidns("sh", "-c", 'stat -L -c %%i /proc/self/ns/pid; exec "$0" --socket %s run -- '
                                    'sh -c \'echo $$\'' % b.sock, CTL), capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "run in a new PID namespace: %d %s %s" % (p.returncode, p.stdout, p.stderr))
    ino, pid = (int(x) for x in p.stdout.split())
    target = 64 + ino % 960
    said, said_target, _ = run_line(p.stderr)
    check(pid != 1 and pid >= target and said == pid and said_target == target,
          "the command's PID %d, target %d (namespace %d), run said PID %d target %d" %
          (pid, target, ino, said, said_target))

    # A peer that is PID X of a namespace of its own (a watch, started after X-1 other processes).
    peer_out = os.path.join(tmp, "peer.pid")
    peer = popen(in_new_pidns("sh", "-c", 'i=0; while [ $i -lt 70 ]; do /bin/true; i=$((i+1)); done; '
                                          '"$0" --socket %s watch >/dev/null & echo $! >%s; wait' %
                              (b.sock, peer_out), CTL), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    x = 0
    while time.monotonic() < deadline and not x:
        if os.path.exists(peer_out) and open(peer_out).read().strip():
            x = int(open(peer_out).read())
        time.sleep(0.05)
    check(x > 2, "the peer's PID in its namespace: %r" % x)
    while time.monotonic() < deadline:
        peers = one_document(ctl(b.sock, "--json", "peers"), "peers")
        if any(q.get("self_pid") == x for q in peers):
            break
        time.sleep(0.05)
    else:
        raise Failure("no peer with self_pid %d: %s" % (x, peers))
    p = subprocess.run(in_new_pidns(CTL, "--socket", b.sock, "run", "--min-pid", str(x), "--", "sh", "-c", "echo $$"),
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "run --min-pid %d: %d %s %s" % (x, p.returncode, p.stdout, p.stderr))
    pid = int(p.stdout)
    said, said_target, avoided = run_line(p.stderr)
    check(pid != x and pid > x and said == pid and said_target == x and avoided >= 1,
          "run --min-pid %d next to a peer of PID %d gave PID %d (avoided %d): %s" % (x, x, pid, avoided, p.stderr))
    # --quiet: nothing on stderr from run itself.
    p = subprocess.run(in_new_pidns(CTL, "--socket", b.sock, "run", "--quiet", "--min-pid", "5", "--", "true"),
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and p.stderr == "", "run --quiet: %d %r" % (p.returncode, p.stderr))
    peer.kill()
    peer.wait()
    b.stop()


def case_run_status(tmp):
    """gpuipcctl run passes the command's exit status on (128 + N when signal N killed it), with or
    without a broker (it warns and still runs); it cannot be had for a PID beyond pid_max or a
    missing command (usage, 2), and reports a command that cannot run (127 not found, 126 not
    executable)."""
    sock = os.path.join(tmp, "absent.sock")
    for cmd, want in ((["sh", "-c", "exit 7"], 7), (["sh", "-c", "kill -TERM $$"], 128 + signal.SIGTERM),
                      (["sh", "-c", "kill -USR1 $$"], 128 + signal.SIGUSR1), (["true"], 0),
                      ([os.path.join(tmp, "nosuch")], 127), ([tmp], 126)):
        r = ctl(sock, "--timeout", "0", "run", "--", *cmd)
        check(r.rc == want, "run -- %s: expected exit %d: %s" % (" ".join(cmd), want, r))
        check(re.search(r"^gpuipcctl run: warning: cannot reach the broker", r.err, re.M),
              "no warning about the broker: %s" % r)
    r = ctl(sock, "--timeout", "0", "run", "--", "sh", "-c", "echo out; echo err >&2")
    check(r.rc == 0 and r.out == "out\n" and "err\n" in r.err, "the command's stdout and stderr: %s" % r)
    for args in (("run",), ("run", "--"), ("run", "--min-pid", "1", "--", "true"),
                 ("run", "--min-pid", "99999999", "--", "true")):
        r = ctl(sock, "--timeout", "0", *args)
        check(r.rc == 2, "%s: expected a usage error: %s" % (" ".join(args), r))
    # The command's own options stay its own, with or without "--".
    r = ctl(sock, "--timeout", "0", "run", "-q", "sh", "-c", "echo $0", "-q")
    check(r.rc == 0 and r.out == "-q\n", "run -q sh -c ... -q: %s" % r)
    if unshare_pid_usable():
        p = subprocess.run(in_new_pidns(CTL, "--socket", sock, "--timeout", "0", "run", "--", "sh", "-c", "exit 9"),
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 9, "as PID 1: exit %d: %s" % (p.returncode, p.stderr))


def run_pid_of(outer):
    """The PID (here) of the gpuipcctl run that unshare --fork started as its namespace's PID 1."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            kids = [int(k) for t in os.listdir("/proc/%d/task" % outer.pid)
                    for k in open("/proc/%d/task/%s/children" % (outer.pid, t)).read().split()]
        except OSError:
            kids = []
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise Failure("unshare started no child")


def case_run_signals(tmp):
    """gpuipcctl run as its namespace's PID 1 passes SIGTERM (and SIGHUP, SIGUSR1) to the command,
    whose handler decides the exit status, and reaps orphans the kernel gives it as the init."""
    if not unshare_pid_usable():
        print("skip: unshare --pid is not permitted here")
        sys.exit(SKIP)
    # A signal ignored when the command starts stays ignored through exec, and a shell cannot trap
    # it (POSIX): under nohup (SIGHUP ignored) the command would never say got-hup. The test starts
    # the command with the dispositions a container's first process has.
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    sock = os.path.join(tmp, "absent.sock")
    script = ('trap "echo got-hup" HUP; trap "echo got-usr1" USR1; trap "echo got-term; exit 5" TERM; '
              'echo ready; while :; do sleep 0.05; done')
    outer = popen(in_new_pidns(CTL, "--socket", sock, "--timeout", "0", "run", "--", "sh", "-c", script),
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check(read_line(outer, 30) == "ready\n", "the command did not start")
    run = run_pid_of(outer)
    for sig, says in ((signal.SIGHUP, "got-hup\n"), (signal.SIGUSR1, "got-usr1\n")):
        os.kill(run, sig)
        check(read_line(outer, 30) == says, "%s did not reach the command" % sig.name)
    os.kill(run, signal.SIGTERM)
    check(read_line(outer, 30) == "got-term\n", "SIGTERM did not reach the command")
    rc, _, err = stop(outer)
    check(rc == 5, "the command's handler exits 5, unshare said %d: %s" % (rc, err))

    # An orphan (its parent exited) is reaped by run, the init: /proc/ORPHAN goes away.
    script = ('(sleep 0.2 & echo $! >"$0"); o=$(cat "$0"); i=0; while [ -e /proc/$o ] && [ $i -lt 200 ]; do '
              'sleep 0.05; i=$((i+1)); done; if [ -e /proc/$o ]; then grep State /proc/$o/status; else echo reaped; fi')
    p = subprocess.run(in_new_pidns(CTL, "--socket", sock, "--timeout", "0", "run", "--", "sh", "-c", script,
                                    os.path.join(tmp, "orphan")), capture_output=True, text=True, timeout=60)
    check(p.returncode == 0 and p.stdout == "reaped\n", "the orphan was not reaped: %s %s" % (p.stdout, p.stderr))


def case_bad_values(tmp):
    """Bad values are refused with exit 2 and an error that names the option and the value."""
    b = Broker(tmp)
    cases = [
        (["publish", "v", "--size", "0"], "--size '0'"),
        (["publish", "v", "--size", "1E"], "--size '1E'"),
        (["publish", "v", "--size", "garbage"], "--size 'garbage'"),
        (["publish", "v", "--size", "-5"], "--size '-5'"),
        (["publish", "v", "--size", "1iB"], "--size '1iB'"),
        (["publish", "v", "--size", "1K", "--kind", "gpu"], "--kind 'gpu'"),
        (["publish", "v", "--size", "1K", "--fill", "stripes"], "--fill 'stripes'"),
        (["publish", "v", "--size", "1K", "--fill", "random:18446744073709551616"],
         "--fill 'random:18446744073709551616'"),
        (["publish", "v", "--size", "1K", "--fill", "random:-1"], "--fill 'random:-1'"),
        (["publish", "v", "--size", "1K", "--fill", "random: -1"], "--fill 'random: -1'"),
        (["publish", "v", "--size", "1K", "--fill", "byte:-1"], "--fill 'byte:-1'"),
        (["group", "g", "--members", "0"], "--members '0'"),
        (["group", "g", "--members", "4097"], "--members '4097'"),
        (["attach", "v", "--wait", "soon"], "--wait 'soon'"),
        (["stat", "--id", "0"], "--id '0'"),
        (["--timeout", "-5", "ping"], "--timeout '-5'"),
        (["ls", "--bogus"], "'--bogus'"),
        (["metrics", "--listen", "nonsense"], "--listen 'nonsense'"),
        (["metrics", "--listen", "127.0.0.1:99999"], "--listen '127.0.0.1:99999'"),
        (["metrics", "--no-sandbox"], "--no-sandbox"),
    ]
    for args, named in cases:
        r = ctl(b.sock, *args)
        check(r.rc == 2 and named in r.err, "%s: expected exit 2 naming %s: %s" % (args, named, r))
    # Accepted spellings stay accepted.
    for size, want in (("4096", 4096), ("64K", 65536), ("2MiB", 2 << 20), ("1KB", 1024), ("3B", 3)):
        p = spawn(b.sock, "--json", "publish", "size/" + size, "--size", size, "--retire-after", "1")
        doc = json.loads(read_line(p))
        check(doc["size"] == want, "--size %s gave %s" % (size, doc))
        stop(p)
    check(ctl(b.sock, "--json", "ls", "--prefix", "v").out.strip() == "[]", "a refused publish left a buffer")
    b.stop()


def option_letters(help_text):
    """{letter: long option} of the option lines of a --help text (not its deprecated spellings)."""
    text = help_text.split("Deprecated spellings")[0]
    return dict(re.findall(r"^  -([A-Za-z]), (--[a-z][a-z0-9-]*)", text, re.M))


def case_conventions(tmp):
    """One rule for the whole tool (gpuipcctl.1 states it): a letter means one option everywhere
    (-s is --socket, -t --timeout); what a command acts on is its NAME operand (publish, attach,
    group, stat, retire); the old spellings (--name N, publish -s/-r, attach and group --timeout)
    still work, each with a note on stderr naming the new one."""
    top = subprocess.run([CTL, "--help"], capture_output=True, text=True).stdout
    commands = re.findall(r"^  ([a-z]+) {1,}", top.split("Commands:")[1], re.M)
    meaning = {k: ("global", v) for k, v in option_letters(top.split("Commands:")[0]).items()}
    for cmd in commands:
        sub = subprocess.run([CTL, cmd, "--help"], capture_output=True, text=True).stdout
        for letter, long in option_letters(sub).items():
            if letter == "h":
                continue
            where, first = meaning.setdefault(letter, (cmd, long))
            check(first == long, "-%s means %s in %s but %s in %s" % (letter, first, where, long, cmd))
        usage = sub.splitlines()[0]
        check("--name" not in usage, "%s's synopsis still names --name: %s" % (cmd, usage))
    b = Broker(tmp)
    s = b.sock
    pub = spawn(s, "--json", "publish", "conv/a", "--size", "4K", "--retire-after", "2")
    check(json.loads(read_line(pub))["name"] == "conv/a", "publish NAME")
    r = ctl(s, "attach", "conv/a", "--wait", "1000", "--verify", "counter")
    check(r.rc == 0 and r.err == "", "attach NAME --wait: %s" % r)
    r = ctl(s, "attach", "--name", "conv/a", "--timeout", "1000")
    check(r.rc == 0 and "--name is deprecated" in r.err and "--timeout is deprecated" in r.err and
          "--wait" in r.err, "attach --name --timeout: %s" % r)
    check(json.loads(read_line(pub))["event"] == "drained", "retire-after 2 did not drain")
    stop(pub)
    old = spawn(s, "publish", "--name", "conv/b", "-s", "4K", "-r", "1")
    read_line(old)
    r = ctl(s, "attach", "conv/b")
    rc, _, err = stop(old)
    check(r.rc == 0 and "-s is deprecated" in err and "--size" in err and "-r is deprecated" in err and
          "--name is deprecated" in err, "publish --name -s -r: %s / %s" % (r, err))
    r = ctl(s, "group", "conv/g", "--members", "1", "--wait", "1000")
    check(r.rc == 0 and r.err == "", "group NAME --wait: %s" % r)
    r = ctl(s, "group", "--name", "conv/g2", "--members", "1", "-t", "1000")
    check(r.rc == 0 and "deprecated" in r.err, "group --name -t: %s" % r)
    for args, says in ((("publish", "a", "b", "--size", "1K"), "one NAME only"),
                       (("publish", "a", "--name", "b", "--size", "1K"), "the name twice"),
                       (("attach",), "NAME is required"), (("group", "--members", "2"), "NAME is required")):
        r = ctl(s, *args)
        check(r.rc == 2 and says in r.err, "%s: %s" % (" ".join(args), r))
    b.stop()


def columns_aligned(text, header_word, rows_from=1):
    """Every line of a table (header first) has its cells where the header's columns are: a
    left-aligned column's cells start under its header, a right-aligned one's end under it."""
    lines = [l for l in text.splitlines() if l.strip()]
    header = lines[0]
    check(header.lstrip().startswith(header_word), "not the table's header: %r" % header)
    for m in re.finditer(r"SLOT SIZE|\S+", header):
        start, end = m.start(), m.end()
        for line in lines[rows_from:]:
            left = line[start:start + 1] not in ("", " ") and (start == 0 or line[start - 1] == " ")
            right = line[end - 1:end] not in ("", " ") and line[end:end + 1] in ("", " ")
            check(left or right, "column %s (%d-%d) out of line in %r\n%s" % (m.group(0), start, end, line, text))


def case_columns(tmp):
    """ls, stat, peers and rings tables stay in line with 16-digit buffer ids and generations and
    names longer than any fixed column: every column is as wide as its widest cell."""
    b = Broker(tmp)
    s = b.sock
    long_name = "columns/" + "n" * 48
    pubs = [memfd_publisher(s, name)[0] for name in ("columns/a", long_name)]
    ls = ctl(s, "ls")
    check(ls.rc == 0, "ls: %s" % ls)
    ids = re.findall(r"^ *(\d+) ", ls.out, re.M)
    check(ids and max(len(i) for i in ids) >= 15, "expected ids of 15-16 digits: %s" % ls.out)
    columns_aligned(ls.out, "ID")
    st = ctl(s, "stat", long_name)
    check(st.rc == 0, "stat: %s" % st)
    columns_aligned(st.out.split("\n\n")[0], "ID")
    peers = ctl(s, "peers")
    columns_aligned(peers.out, "PEER")
    ring = HandRing(s, "columns/" + "r" * 40)
    rings = ctl(s, "rings")
    columns_aligned(rings.out, "RING")
    ring.close()
    for p in pubs:
        stop(p)
    b.stop()


def case_connect_values(tmp):
    """Where and how the library connects is never guessed: a socket path over 107 bytes, an empty
    GPUIPC_SOCKET and a GPUIPC_CACHE_MAX that is no number are refused before anything is tried,
    naming the value; good values work."""
    b = Broker(tmp)
    long_path = os.path.join(tmp, "s" * 120 + ".sock")
    r = ctl(long_path, "ping", timeout=10)
    check(r.rc == 1 and "is %d bytes long; a Unix socket path has at most 107" % len(long_path) in r.err,
          "a %d-byte socket path: %s" % (len(long_path), r))
    check(r.seconds < 5, "refusing a long socket path took %.1f s (was a truncated one tried?)" % r.seconds)
    env = dict(os.environ, GPUIPC_SOCKET="")
    p = subprocess.run([CTL, "ping"], capture_output=True, text=True, timeout=10, env=env)
    check(p.returncode == 1 and "GPUIPC_SOCKET is set but empty" in p.stderr, "GPUIPC_SOCKET='': %s" % p)
    env = dict(os.environ, GPUIPC_SOCKET=b.sock)
    p = subprocess.run([CTL, "ping"], capture_output=True, text=True, timeout=10, env=env)
    check(p.returncode == 0, "GPUIPC_SOCKET names the broker: %s" % p)
    for bad in ("garbage", "-1", "", "1000001", "12abc"):
        env = dict(os.environ, GPUIPC_CACHE_MAX=bad)
        p = subprocess.run([CTL, "--socket", b.sock, "ping"], capture_output=True, text=True, timeout=10, env=env)
        check(p.returncode == 1 and ("GPUIPC_CACHE_MAX='%s' is not a number of mappings" % bad) in p.stderr,
              "GPUIPC_CACHE_MAX=%r: %s" % (bad, p))
    for good in ("0", "64"):
        env = dict(os.environ, GPUIPC_CACHE_MAX=good)
        p = subprocess.run([CTL, "--socket", b.sock, "ping"], capture_output=True, text=True, timeout=10, env=env)
        check(p.returncode == 0, "GPUIPC_CACHE_MAX=%s: %s" % (good, p))
    b.stop()


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def case_size_over_memory(tmp):
    """A memfd size over the memory available fails at once with a clear message, without filling memory."""
    avail = mem_available()
    if avail is None:
        print("skip: no MemAvailable in /proc/meminfo")
        sys.exit(SKIP)
    b = Broker(tmp)
    size = "%dG" % (2 * avail // (1 << 30) + 1)
    r = ctl(b.sock, "publish", "big", "--size", size, timeout=10)
    check(r.rc == 1 and ("--size '%s'" % size) in r.err and "more than" in r.err, "--size %s: %s" % (size, r))
    check(r.seconds < 5, "refusing --size %s took %.1f s" % (size, r.seconds))
    check(ctl(b.sock, "--json", "ls").out.strip() == "[]", "a buffer was published")
    b.stop()


def bare_ctl(*args, timeout=30, env=None):
    """gpuipcctl with exactly these arguments (no --socket put first)."""
    start = time.monotonic()
    p = subprocess.run([CTL, *args], capture_output=True, text=True, timeout=timeout, env=env)
    return Result(p.returncode, p.stdout, p.stderr, time.monotonic() - start)


def case_global_options_after(tmp):
    """--socket, --json and --timeout are taken after the command too (gpuipcctl ls --json), their
    errors included; an option the command spells itself stays the command's, and run's command
    line keeps its own."""
    b = Broker(tmp)
    pub, _ = memfd_publisher(b.sock, "after/buf")
    r = bare_ctl("ls", "--json", "--socket", b.sock)
    docs = one_document(r, "ls --json --socket")
    check(r.rc == 0 and [d["name"] for d in docs] == ["after/buf"], "ls --json --socket: %s" % r)
    r = bare_ctl("ls", "-j", "-s", b.sock, "--prefix", "after/")
    check(r.rc == 0 and one_document(r, "ls -j -s")[0]["name"] == "after/buf", "ls -j -s: %s" % r)
    r = bare_ctl("--socket", b.sock, "stat", "after/buf", "--json")
    check(r.rc == 0 and one_document(r, "stat --json")["buffer"]["name"] == "after/buf", "stat --json: %s" % r)
    r = bare_ctl("--socket", b.sock, "stat", "nosuch", "--json")
    doc = one_document(r, "stat nosuch --json")
    check(r.rc == 1 and doc.get("error") == "not-found" and r.err == "", "stat nosuch --json: %s" % r)
    r = bare_ctl("--socket", b.sock, "ls", "--bogus", "--json")
    check(r.rc == 2 and one_document(r, "ls --bogus --json").get("error") == "usage", "ls --bogus --json: %s" % r)
    r = bare_ctl("ls", "--socket", b.sock, "--timeout", "x")
    check(r.rc == 2 and "--timeout 'x'" in r.err, "ls --timeout x: %s" % r)
    r = bare_ctl("ls", "--prefix", "--json", "--socket", b.sock)  # --json is the prefix's value here
    check(r.rc == 0 and not r.out.lstrip().startswith("["), "ls --prefix --json: %s" % r)
    # A command's own spelling wins: attach's deprecated -t is its --wait, not the connect timeout.
    r = bare_ctl("--socket", b.sock, "attach", "after/nosuch", "-t", "200")
    check(r.rc == 1 and "-t is deprecated" in r.err and "[timeout]" in r.err, "attach -t: %s" % r)
    # run's options end where its command begins: --json after it is the command's argument.
    r = bare_ctl("--socket", b.sock, "run", "--quiet", "--", "echo", "--json")
    check(r.rc == 0 and r.out.strip() == "--json", "run -- echo --json: %s" % r)
    check("--socket, --json and --timeout" in bare_ctl("--help").out, "--help does not say so")
    check("before or after the command" in bare_ctl("ls", "--help").out, "ls --help does not say so")
    stop(pub)
    b.stop()


def case_missing_socket(tmp):
    """A socket path that does not exist fails at once (exit 3, saying so and how to wait), unless
    --timeout asks for a wait: then a broker that creates it meanwhile is reached."""
    nope = os.path.join(tmp, "nope.sock")
    for args in (("--socket", nope, "ls"), ("ls", "--socket", nope), ("--socket", nope, "--json", "ping")):
        r = bare_ctl(*args)
        check(r.rc == 3 and r.seconds < 3, "%s: %s" % (" ".join(args), r))
        text = r.out + r.err
        check("No such file" in text and "--timeout" in text, "%s says: %s" % (" ".join(args), r))
    env = dict(os.environ, GPUIPC_SOCKET=nope)
    r = bare_ctl("ls", env=env)
    check(r.rc == 3 and r.seconds < 3, "GPUIPC_SOCKET missing: %s" % r)
    # Asked to wait, it waits, and a socket that appears meanwhile is used.
    late = os.path.join(tmp, "late.sock")
    p = popen([CTL, "--socket", late, "--timeout", "20000", "ping"], stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    check(p.poll() is None, "ping --timeout 20000 did not wait for the socket")
    broker = popen([BROKER, "--socket", late, "--seccomp", "enforce", "--log-level", "warn"],
                   stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=25)
        check(p.returncode == 0, "ping --timeout after the socket appeared: %s %s" % (out, err))
    finally:
        broker.terminate()
        broker.wait(10)


def case_json_device_null(tmp):
    """JSON says null for what a record lacks: a memfd buffer's device in publish, ls and stat."""
    b = Broker(tmp)
    pub, doc = memfd_publisher(b.sock, "null/dev")
    check("device" in doc and doc["device"] is None, "publish: device %r" % doc.get("device"))
    ls = one_document(ctl(b.sock, "--json", "ls"), "ls")
    check(ls[0]["device"] is None, "ls: device %r" % ls[0].get("device"))
    st = one_document(ctl(b.sock, "--json", "stat", "null/dev"), "stat")
    check(st["buffer"]["device"] is None, "stat: device %r" % st["buffer"].get("device"))
    stop(pub)
    b.stop()


def write_safetensors(path, tensors):
    """A safetensors file of tensors [(name, dtype, shape, bytes)], written by hand."""
    import struct
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    j = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(t[3] for t in tensors))


def case_weights(tmp):
    """weights load puts every byte where the state-dict layout says (tensors whose sizes are multiples
    of 256 lie back to back, so the counter pattern holds up to the manifest: attach --verify counter
    differs exactly there), memfd and, with the stand-in libcuda, cuda-vmm through 1 MiB chunks; a
    malformed file is refused naming its byte; ls and drop."""
    import array
    b = Broker(tmp)
    words = array.array("Q", range((3 << 20) // 8)).tobytes()  # the counter pattern, 3 MiB
    sizes = [(1 << 20) + 256, 256, 512, (1 << 20) - 1024, 1 << 20]
    tensors, off = [], 0
    for i, n in enumerate(sizes):
        tensors.append(("t%d" % i, "U8", (n,), words[off:off + n]))
        off += n
    path = os.path.join(tmp, "m.safetensors")
    write_safetensors(path, tensors)
    kinds = ["memfd"] + (["cuda-vmm"] if os.environ.get("GPUIPC_TEST_FAKECUDA") else [])
    for kind in kinds:
        env_before = os.environ.get("GPUIPC_LIBCUDA")
        if kind == "cuda-vmm":
            os.environ["GPUIPC_LIBCUDA"] = os.environ["GPUIPC_TEST_FAKECUDA"]
        try:
            r = ctl(b.sock, "--json", "weights", "load", "w/" + kind, path, "--kind", kind, "--chunk", "1M")
            check(r.rc == 0, "weights load --kind %s: %s" % (kind, r))
            doc = json.loads(r.out)
            check(doc["tensors"] == 5 and doc["bytes"] == 3 << 20 and doc["kind"] == kind, r.out)
            # the steps around the load: each a time, none of them counted twice
            steps = [doc[k] for k in ("connect_seconds", "alloc_seconds", "publish_seconds", "seconds")]
            check(all(isinstance(x, (int, float)) and 0 <= x < 60 for x in steps), r.out)
            r = ctl(b.sock, "--json", "attach", "w/" + kind, "--verify", "counter")
            doc = json.loads(r.out)
            check(doc.get("differs_at") == 3 << 20, "the data is not the file's: %s" % r)
        finally:
            if env_before is None:
                os.environ.pop("GPUIPC_LIBCUDA", None)
            else:
                os.environ["GPUIPC_LIBCUDA"] = env_before
    rows = json.loads(ctl(b.sock, "--json", "weights", "ls").out)
    check(sorted(x["name"] for x in rows) == sorted("w/" + k for k in kinds), rows)
    bad = os.path.join(tmp, "bad.safetensors")
    write_safetensors(bad, [("a", "F32", (3,), b"\0" * 16)])
    r = ctl(b.sock, "weights", "load", "w/bad", bad, "--kind", "memfd")
    check(r.rc == 1 and bad in r.err and re.search(r": byte \d+: ", r.err) and "make 12 bytes" in r.err, "malformed: %s" % r)
    for kind in kinds:
        check(ctl(b.sock, "weights", "drop", "w/" + kind).rc == 0, "drop")
    check(json.loads(ctl(b.sock, "--json", "weights", "ls").out) == [], "weights left after drop")
    check(ctl(b.sock, "--json", "ls").out.strip() == "[]", "buffers left after drop")
    b.stop()


def case_retire_nosuch(tmp):
    """retire of a name nobody published says retire and not-found, not an internal step's name."""
    b = Broker(tmp)
    r = ctl(b.sock, "retire", "nosuch")
    check(r.rc == 1 and "retire 'nosuch'" in r.err and "[not-found]" in r.err and "stat" not in r.err,
          "retire nosuch: %s" % r)
    r = ctl(b.sock, "retire", "--id", "12345")
    check(r.rc == 1 and "retire --id 12345" in r.err and "[not-found]" in r.err, "retire --id: %s" % r)
    b.stop()


def case_hello_timeout(tmp):
    """--timeout bounds the hello: a stopped broker (which still accepts) fails a probe in about that time."""
    b = Broker(tmp)
    b.proc.send_signal(signal.SIGSTOP)
    try:
        r = ctl(b.sock, "--timeout", "300", "ping", timeout=60)
        check(r.rc != 0 and r.seconds < 3, "ping against a stopped broker: %s" % r)
        r = ctl(b.sock, "ping", "--timeout", "300", timeout=60)
        check(r.rc != 0 and r.seconds < 3, "ping --timeout against a stopped broker: %s" % r)
    finally:
        b.proc.send_signal(signal.SIGCONT)
    check(ctl(b.sock, "ping").rc == 0, "the broker does not answer after SIGCONT")
    b.stop()


def case_exporter(tmp):
    """metrics --listen serves /metrics (text format 0.0.4, asking the broker per scrape) and /healthz,
    survives a broker restart, and stops on SIGTERM."""
    b = Broker(tmp)
    e = Exporter(b.sock)
    status, ctype, body = e.get("/metrics")
    check(status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8", "/metrics: %s %s" % (status, ctype))
    fam = parse_exposition(body)
    check(sample(fam, "gpuipc_up") == 1, "gpuipc_up is not 1")
    first = sample(fam, "gpuipc_frames_received_total")
    status, _, body = e.get("/metrics")
    time.sleep(0.3)  # a sample younger than 250 ms answers the next scrape too
    status, _, body = e.get("/metrics")
    check(sample(parse_exposition(body), "gpuipc_frames_received_total") > first,
          "frames received did not grow between scrapes: the broker is not asked per scrape")
    check(e.get("/healthz")[0] == 200, "/healthz with a broker")
    check(e.get("/nosuch")[0] == 404, "an unknown path is not 404")

    b.stop()
    # The exporter learns it within its next ping (once a second) and the --timeout it tries for.
    deadline = time.monotonic() + 10
    while e.get("/healthz")[0] != 503:
        check(time.monotonic() < deadline, "/healthz still 200 10 s after the broker stopped")
        time.sleep(0.1)
    status, _, body = e.get("/metrics")
    fam = parse_exposition(body)
    check(status == 200 and sample(fam, "gpuipc_up") == 0 and "gpuipc_peers" not in fam,
          "/metrics without a broker: %s %s" % (status, body))
    b.start()
    deadline = time.monotonic() + 10
    while sample(parse_exposition(e.get("/metrics")[2]), "gpuipc_up") != 1:
        check(time.monotonic() < deadline, "no reconnect within 10 s of the broker coming back")
        time.sleep(0.1)
    start = time.monotonic()
    e.proc.terminate()
    rc, err = e.stop()
    check(rc == 0 and time.monotonic() - start < 3, "SIGTERM: exit %s after %.1f s: %s" %
          (rc, time.monotonic() - start, err))
    b.stop()


def case_long_running_reconnect(tmp):
    """publish, attach --hold and watch come through a broker restart (SIGKILL, a new broker on the
    same socket): the publisher's buffer is published again, the holder's reference reclaimed and
    held to the end, and watch says "reconnected" and goes on with the new broker's events."""
    b = Broker(tmp, "--restart-grace-ms", "5000")
    pub, _ = memfd_publisher(b.sock, "re/held")
    att = spawn(b.sock, "--json", "attach", "re/held", "--verify", "random:3", "--hold", "8000")
    doc = json.loads(read_line(att))
    check(doc.get("event") == "attached" and doc.get("verified") is True, "attach said: %s" % doc)
    watch = spawn(b.sock, "--json", "watch", "--prefix", "re/")
    deadline = time.monotonic() + 10
    while one_document(ctl(b.sock, "--json", "stats"), "stats")["subscriptions"] < 1:
        check(time.monotonic() < deadline, "watch did not subscribe within 10 s")
        time.sleep(0.05)
    first, _ = memfd_publisher(b.sock, "re/first")
    check(json.loads(read_line(watch)).get("name") == "re/first", "watch missed re/first")
    start = time.monotonic()
    b.proc.kill()
    b.proc.wait()
    b.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        r = ctl(b.sock, "--json", "stat", "re/held")
        if r.rc == 0 and one_document(r, "stat")["buffer"]["refs"] == 1:
            break
        time.sleep(0.1)
    check(r.rc == 0 and one_document(r, "stat")["buffer"]["refs"] == 1,
          "after the restart the publisher's buffer and the holder's reference are not back: %s" % r)
    after, _ = memfd_publisher(b.sock, "re/after")
    events = []
    while not events or events[-1].get("name") != "re/after":
        events.append(json.loads(read_line(watch, 15)))
    check(events[0]["event"] == "reconnected", "watch after the restart: %s" % events)
    rc, out, err = stop(att) if att.poll() is not None else (att.wait(20), "", "")
    check(rc == 0 and time.monotonic() - start > 3, "attach --hold 8000: exit %s after %.1f s of the restart: %s" %
          (rc, time.monotonic() - start, err))
    for p in (after, first, pub, watch):
        stop(p)
    b.stop()


def case_exporter_http(tmp):
    """The exporter answers bad requests with 4xx (a path longer than it takes: 414, not a silent cut)
    and is not held up by a client that never sends. A first line without a space, which is no
    request at all, is closed without an answer (libmicrohttpd's way)."""
    b = Broker(tmp)
    e = Exporter(b.sock)
    host, port = e.url[len("http://"):].rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))  # never sends a byte
    with socket.create_connection((host, int(port)), timeout=10) as c:
        c.sendall(b"garbage\r\n\r\n")
        reply = c.recv(200)
        check(reply == b"", "b'garbage' answered %r" % reply[:60])
    for raw, want in ((b"POST /metrics HTTP/1.1\r\n\r\n", b" 405 "), (b"garbage here\r\n\r\n", b" 400 "),
                      (b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 9000 + b"\r\n\r\n", b" 431 "),
                      (b"GET /metrics" + b"x" * 2000 + b" HTTP/1.1\r\n\r\n", b" 414 "),
                      (b"GET /" + b"p" * 9000 + b" HTTP/1.1\r\n\r\n", b" 414 "),
                      (b"GET /metrics?" + b"q" * 1100 + b" HTTP/1.1\r\n\r\n", b" 414 ")):
        with socket.create_connection((host, int(port)), timeout=10) as c:
            c.sendall(raw)
            reply = c.recv(200)
            check(want in reply.split(b"\r\n")[0] + b" ", "%r... answered %r" % (raw[:20], reply[:60]))
    check(e.get("/metrics")[0] == 200, "/metrics while a client idles")
    status, _, body = http_get(e.url + "/metrics")  # HEAD-less; then HEAD through a raw request
    with socket.create_connection((host, int(port)), timeout=10) as c:
        c.sendall(b"HEAD /healthz HTTP/1.0\r\n\r\n")
        reply = c.recv(4096)
        check(reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n"), "HEAD: %r" % reply)
    idle.close()
    e.stop()
    b.stop()


def open_idle(host, port, n, source=None):
    """n connections that never send a byte (from source, an address of this host, if given)."""
    conns = []
    for _ in range(n):
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source:
            c.bind((source, 0))
        c.setblocking(False)
        c.connect_ex((host, port))
        conns.append(c)
    return conns


def case_exporter_idle_flood(tmp):
    """A scrape behind 500 idle connections (from one other address, then from the scraper's own)
    is answered, complete and fresh, within a generous deadline that 16 slots held until their
    10 s timeout could never meet; the timings are printed (the goal is under a second)."""
    b = Broker(tmp)
    e = Exporter(b.sock, timeout_ms=5000)
    report = []
    for label, source in (("from 127.0.0.2", "127.0.0.2"), ("from the scraper's address", None)):
        idle = open_idle(e.host, e.port, 500, source)
        time.sleep(0.5)  # let them all reach the exporter
        status, body, seconds = e.timed_get("/metrics", timeout=30)
        fam = parse_exposition(body) if status == 200 else {}
        check(status == 200 and sample(fam, "gpuipc_up") == 1 and "gpuipc_peers" in fam,
              "the scrape behind 500 idle connections %s: %s %s" % (label, status, body[:200]))
        check(seconds < 5, "the scrape behind 500 idle connections %s took %.2f s" % (label, seconds))
        h_status, _, h_seconds = e.timed_get("/healthz", timeout=30)
        check(h_status == 200 and h_seconds < 5, "/healthz behind them: %s after %.2f s" % (h_status, h_seconds))
        report.append("%s: scrape %.3f s, /healthz %.3f s" % (label, seconds, h_seconds))
        for c in idle:
            c.close()
    print("behind 500 idle connections: " + "; ".join(report) + " (goal: under 1 s each)")
    e.stop()
    b.stop()


def open_count(conns):
    """How many of conns the exporter still holds open (a closed one reads as the end of the stream)."""
    held = 0
    for c in conns:
        try:
            held += c.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except (BlockingIOError, InterruptedError):
            held += 1
        except OSError:
            pass
    return held


def case_exporter_per_address(tmp):
    """One address holds at most 16 of the 64 connections: a flood of idle connections from one
    address is cut down to that (its own oldest make room for its newest) and takes nothing from
    another address's idle connection, which stays open until its own head timeout (3 s). A full
    exporter (idle connections from 8 addresses) makes room for a scrape."""
    b = Broker(tmp)
    e = Exporter(b.sock)
    for attempt in range(3):  # a round the machine stalled in (past the 3 s timeout) is run again
        start = time.monotonic()
        other = open_idle(e.host, e.port, 1, "127.0.0.5")
        time.sleep(0.2)
        flood = open_idle(e.host, e.port, 100, "127.0.0.4")
        time.sleep(0.5)  # let the exporter take them all
        flood_held, other_held = open_count(flood), open_count(other)
        in_time = time.monotonic() - start < 2.5
        for c in flood + other:
            c.close()
        if in_time:
            break
        time.sleep(3.5)  # the exporter's head timeout empties its slots
    print("per address: %d of 100 idle connections from one address held, the other address's %s" %
          (flood_held, "held" if other_held else "closed"))
    check(in_time, "three rounds over 2.5 s each: the machine is too busy to tell")
    check(0 < flood_held <= 16, "%d idle connections of one address held" % flood_held)
    check(other_held == 1, "another address's idle connection was closed by the flood")
    check(e.get("/metrics")[0] == 200, "/metrics after the flood")
    # More idle connections than the exporter holds, 16 from each of 8 addresses: a full exporter
    # makes room too, and takes the next connection at once, so a scrape is answered well before the
    # idle ones' 3 s timeout could free a slot (about 0.01 s here; taking one connection per second
    # of its loop's tick, it took 2.6 to 3.5 s).
    idle = [c for a in range(10, 18) for c in open_idle(e.host, e.port, 16, "127.0.0.%d" % a)]
    time.sleep(0.5)
    status, body, seconds = e.timed_get("/metrics", timeout=30)
    for c in idle:
        c.close()
    print("behind 128 idle connections from 8 addresses: scrape %.3f s" % seconds)
    check(status == 200 and seconds < 2, "the scrape behind 128 idle connections from 8 addresses: %s after "
          "%.2f s" % (status, seconds))
    e.stop()
    b.stop()


def case_exporter_slow_broker(tmp):
    """A stopped broker (SIGSTOP: it still accepts, it never answers) holds up no request: /healthz
    says 503 at once, while a scrape waits for it; the scrape is answered by its deadline with the
    last good sample and gpuipc_up 0; after SIGCONT the answers are fresh again."""
    b = Broker(tmp)
    e = Exporter(b.sock, timeout_ms=4000)
    status, _, body = e.get("/metrics")
    check(sample(parse_exposition(body), "gpuipc_up") == 1, "no first sample")
    b.proc.send_signal(signal.SIGSTOP)
    try:
        import threading
        result = {}
        scrape = threading.Thread(target=lambda: result.update(m=e.timed_get("/metrics", timeout=30)))
        time.sleep(0.3)  # a sample younger than 250 ms would answer at once
        scrape.start()
        time.sleep(0.2)  # the scrape waits for the stopped broker now
        h_status, h_body, h_seconds = e.timed_get("/healthz", timeout=30)
        scrape.join(30)
        status, body, seconds = result["m"]
        fam = parse_exposition(body)
        print("stopped broker: /healthz %d after %.3f s; scrape %d after %.3f s (deadline 4 s)" %
              (h_status, h_seconds, status, seconds))
        check(h_seconds < 2, "/healthz waited %.2f s for a stopped broker" % h_seconds)
        check(status == 200 and sample(fam, "gpuipc_up") == 0 and "gpuipc_peers" in fam and
              sample(fam, "gpuipc_sample_timestamp_seconds") < time.time() - 0.3,
              "the scrape of a stopped broker: %s %s" % (status, body[:300]))
        check(3.5 < seconds < 8, "the scrape of a stopped broker was answered after %.2f s, not at its 4 s "
              "deadline" % seconds)
        deadline = time.monotonic() + 10
        while e.get("/healthz")[0] != 503:  # the broker has not answered for longer than --timeout now
            check(time.monotonic() < deadline, "/healthz stays 200 with the broker stopped")
            time.sleep(0.1)
    finally:
        b.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 15
    while sample(parse_exposition(e.get("/metrics")[2]), "gpuipc_up") != 1 or e.get("/healthz")[0] != 200:
        check(time.monotonic() < deadline, "no fresh answers 15 s after SIGCONT")
        time.sleep(0.2)
    e.stop()
    b.stop()


def case_exporter_slowloris(tmp):
    """Clients that trickle their request head one byte at a time, more of them than there are
    slots, are each closed within a few seconds (the head timeout, or to make room), although they
    keep sending; scrapes meanwhile are answered."""
    b = Broker(tmp)
    e = Exporter(b.sock, timeout_ms=5000)
    conns = [(c, time.monotonic()) for c in open_idle(e.host, e.port, 100, "127.0.0.3")]
    closed, scrapes, t0 = {}, [], time.monotonic()
    while len(closed) < len(conns) and time.monotonic() - t0 < 20:
        for i, (c, opened) in enumerate(conns):
            if i in closed:
                continue
            try:
                c.send(b"G")
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed[i] = time.monotonic() - opened
        if len(scrapes) < 5 and time.monotonic() - t0 > len(scrapes):
            status, body, seconds = e.timed_get("/metrics", timeout=30)
            check(status == 200 and sample(parse_exposition(body), "gpuipc_up") == 1,
                  "a scrape among slowloris clients: %s after %.1f s" % (body[:80] if not status else status,
                                                                          seconds))
            scrapes.append(seconds)
        time.sleep(0.25)
    for c, _ in conns:
        c.close()
    check(len(closed) == len(conns), "%d of %d slowloris clients still open after 20 s" %
          (len(conns) - len(closed), len(conns)))
    longest = max(closed.values())
    print("slowloris: 100 clients closed within %.1f s each (longest); 5 scrapes meanwhile took at most %.3f s" %
          (longest, max(scrapes)))
    check(longest < 10, "a slowloris client lived %.1f s" % longest)
    check(max(scrapes) < 5, "a scrape among slowloris clients took %.2f s" % max(scrapes))
    e.stop()
    b.stop()


def case_exporter_confined(tmp):
    """The exporter runs confined (no_new_privs and a seccomp filter) once it listens, serves under
    it through a broker restart, and its filter refuses nothing it needs (no log line names a call);
    --no-sandbox runs it without."""
    b = Broker(tmp)
    e = Exporter(b.sock)
    st = e.status()
    check(st.get("NoNewPrivs") == "1" and st.get("Seccomp") == "2", "not confined: NoNewPrivs %s, Seccomp %s" %
          (st.get("NoNewPrivs"), st.get("Seccomp")))
    check(sample(parse_exposition(e.get("/metrics")[2]), "gpuipc_up") == 1, "no sample under the filter")
    b.proc.kill()
    b.proc.wait()
    b.start()
    deadline = time.monotonic() + 10
    while sample(parse_exposition(e.get("/metrics")[2]), "gpuipc_up") != 1:
        check(time.monotonic() < deadline, "no sample 10 s after the broker restarted")
        time.sleep(0.2)
    e.get("/healthz")
    e.get("/nosuch")
    e.stop()
    plain = Exporter(b.sock, "--no-sandbox")
    check(plain.status().get("Seccomp") == "0", "--no-sandbox still loads a filter")
    plain.stop()
    b.stop()


def case_promtool(tmp):
    """The exposition passes `promtool check metrics`, with a distinct HELP per family, base units, the
    build info, the fd limit beside the fd count, and histograms for requests and peer cleanup."""
    b = Broker(tmp)
    pub, _ = memfd_publisher(b.sock, "prom/a")
    ctl(b.sock, "attach", "prom/a")
    stop(pub)  # a peer cleanup to record
    ring = HandRing(b.sock, "prom/r")  # the per-ring families too
    e = Exporter(b.sock)
    _, _, body = e.get("/metrics")
    e.stop()
    ring.close()
    b.stop()
    check('gpuipc_ring_slots{ring="prom/r"} 4' in body, "no ring families: %s" % body)
    promtool_check(body)
    fam = parse_exposition(body)
    helps = [f["help"] for f in fam.values()]
    check(len(helps) == len(set(helps)), "HELP texts repeat: %s" %
          sorted(h for h in helps if helps.count(h) > 1))
    for name in fam:
        check(not re.search(r"_(ms|us|ns|sec)(_|$)", name), "abbreviated unit in %s" % name)
    build = [l for n, l, v in fam["gpuipc_build_info"]["samples"]]
    check(build and build[0].get("version") and build[0].get("library"), "gpuipc_build_info: %s" % build)
    check(0 < sample(fam, "gpuipc_open_fds") < sample(fam, "gpuipc_max_fds"), "open_fds/max_fds")
    for h in ("gpuipc_request_duration_seconds", "gpuipc_peer_cleanup_duration_seconds"):
        check(fam[h]["type"] == "histogram", "%s is not a histogram" % h)
        check(sample(fam, h + "_bucket", le="+Inf") == sample(fam, h + "_count") > 0, "%s counts nothing" % h)
    # The publisher's buffer is gone; the ring's parts (control page, slots, member pages) are live
    # buffers of its producer.
    parts = 1 + ring.slots + ring.members
    check(sample(fam, "gpuipc_buffers", state="live") == parts, "buffers by state: %s, want %d live" %
          (fam["gpuipc_buffers"]["samples"], parts))


def case_metrics_help(tmp):
    """Every series the broker serves has a HELP text of its own: none falls back to the text for
    records this gpuipcctl release does not know (a broker statistic added without a description in
    cli/metrics.c's table fails here), and every family has HELP and TYPE."""
    b = Broker(tmp)
    r = ctl(b.sock, "metrics")
    b.stop()
    check(r.rc == 0, "metrics: %s" % r)
    fam = parse_exposition(r.out)
    check(len(fam) > 40, "only %d families: %s" % (len(fam), sorted(fam)))
    undescribed = sorted(n for n, f in fam.items() if "does not describe" in f.get("help", ""))
    check(not undescribed, "served without a description: %s" % ", ".join(undescribed))
    for name, f in fam.items():
        check(f.get("help") and f.get("type"), "%s has no HELP or TYPE: %s" % (name, f))
    for name in ("gpuipc_restart_grace", "gpuipc_buffers_restored", "gpuipc_claims_pending", "gpuipc_reclaims_total",
                 "gpuipc_reclaims_refused_total", "gpuipc_claims_revoked_total"):
        check(name in fam, "%s is not served" % name)


def case_quota_counted(tmp):
    """A quota refusal shows in gpuipc_request_errors_total{status="quota"}."""
    b = Broker(tmp, "--max-buffers-per-uid", "1")
    pub, _ = memfd_publisher(b.sock, "q/one")
    r = ctl(b.sock, "publish", "q/two", "--size", "4K")
    check(r.rc == 1 and "[quota]" in r.err, "the second publish was not refused by quota: %s" % r)
    fam = parse_exposition(ctl(b.sock, "metrics").out)
    check(sample(fam, "gpuipc_request_errors_total", status="quota") == 1, "quota refusals not counted")
    stop(pub)
    b.stop()


def dashboard_unit_class(expr):
    """What a query measures: 'seconds' (a latency or duration), 'per-second' (a rate) or 'count'."""
    if "histogram_quantile" in expr or "_seconds_sum" in expr or re.search(r"_seconds\{", expr):
        return "seconds"
    return "per-second" if "rate(" in expr else "count"


def case_dashboard(tmp):
    """The Grafana dashboard is valid JSON whose every query names metrics the exporter serves, and it
    covers buffers by state, references, peers, op rate and latency, cleanups, quota refusals and
    rings; every query follows the namespace, pod and broker variables; no panel puts two kinds
    of unit (seconds, rates, counts) on one axis, and each panel's unit is its queries' kind."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(dash)
    check(dash.get("title") and dash.get("panels") and exprs, "no panels or queries")
    policy = os.path.join(tmp, "policy.conf")  # a uid the policy names: the per-uid families served
    with open(policy, "w") as f:
        f.write("allow all uid=%d\n" % os.getuid())
    b = Broker(tmp, "--policy", policy)
    ring = HandRing(b.sock, "dash/r")  # a ring with a seated member: every gpuipc_ring_* family served
    member, seat, epoch = ring.join("dash-member")
    ring.set_head(5)
    ring.seat(seat, epoch, 1, 3)
    fam = parse_exposition(ctl(b.sock, "metrics").out)
    member.close()
    ring.close()
    b.stop()
    served = set()
    for name, f in fam.items():
        served.add(name)
        served.update(n for n, _, _ in f["samples"])
    used = set()
    for expr in exprs:
        for name in re.findall(r"\bgpuipc_[a-z0-9_]+", expr):
            check(name in served, "the dashboard queries %s, which the exporter does not serve (%s)" % (name, expr))
            used.add(name)
    for needed in ("gpuipc_buffers", "gpuipc_references", "gpuipc_peers", "gpuipc_attaches_total",
                   "gpuipc_request_duration_seconds_bucket", "gpuipc_peer_cleanup_duration_seconds_bucket",
                   "gpuipc_request_errors_total"):
        check(needed in used, "the dashboard does not show %s" % needed)
    check(any('status="quota"' in e for e in exprs), "no panel for quota refusals")
    for needed in ("gpuipc_ring_lag_frames", "gpuipc_ring_frames_published_total", "gpuipc_ring_seats_taken",
                   "gpuipc_ring_slots", "gpuipc_shared_bytes", "gpuipc_held_bytes"):
        check(needed in used, "the dashboard has no ring panel with %s" % needed)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for var in ("namespace", "pod", "instance"):
        check(var in variables, "no $%s variable" % var)
    for expr in exprs:
        for var in ("namespace", "pod", "instance"):
            check('%s=~"$%s"' % (var, var) in expr, "a query ignores $%s: %s" % (var, expr))
    units = {"seconds": ("s",), "per-second": ("ops", "reqps", "cps", "fps"), "count": ("short", "percentunit", "bytes")}
    for panel in dash["panels"]:
        kinds = {dashboard_unit_class(t["expr"]) for t in panel.get("targets", [])}
        check(len(kinds) == 1, "panel %r mixes %s on one axis" % (panel.get("title"), " and ".join(sorted(kinds))))
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        check(unit in units[kinds.pop()], "panel %r: unit %s for its queries" % (panel.get("title"), unit))


def served_exposition(tmp):
    """The exporter's text exposition from a broker with a ring and a seated member, so that every
    family (the per-ring ones included) has its TYPE line."""
    b = Broker(tmp)
    ring = HandRing(b.sock, "dash/r")
    member, seat, epoch = ring.join("dash-member")
    ring.set_head(5)
    ring.seat(seat, epoch, 1, 3)
    text = ctl(b.sock, "metrics").out
    member.close()
    ring.close()
    b.stop()
    return text


def case_dashboard_rates(tmp):
    """The dashboard applies rate(), irate() and increase() only to what the exporter's TYPE lines call
    counters (tests/cli/dashboard_rates.py), and the checker bites: rate() of the gauge
    gpuipc_ring_head, as the dashboard once had it, is reported, rate() of its counter is not."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dashboard_rates
    with open(DASHBOARD) as f:
        dash = json.load(f)
    text = served_exposition(tmp)
    bad = dashboard_rates.misuses(dash, text)
    check(not bad, "rate() of something that is not a counter:\n" + "\n".join(bad))
    check("gpuipc_ring_frames_published_total" in dashboard_rates.counter_series(text) and
          "gpuipc_request_duration_seconds_bucket" in dashboard_rates.counter_series(text),
          "the TYPE lines were not read")
    probe = {"panels": [{"targets": [{"expr": "sum by (ring) (rate(gpuipc_ring_head[5m]))"},
                                     {"expr": "rate(gpuipc_ring_frames_published_total[5m])"}]}]}
    found = dashboard_rates.misuses(probe, text)
    check(len(found) == 1 and "gpuipc_ring_head" in found[0], "the checker missed rate(gauge): %s" % found)


def case_bytes_metrics(tmp):
    """gpuipc_shared_bytes and gpuipc_held_bytes by kind, and per uid for the uids the policy names,
    follow a 64 KiB publish and an attach that holds it to the byte; a uid the policy names that
    has nothing reads 0; the holder's exit takes its bytes off."""
    uid = os.getuid()
    policy = os.path.join(tmp, "policy.conf")
    with open(policy, "w") as f:
        f.write("allow all uid=%d\nallow attach uid=4242 prefix=none/\n" % uid)
    b = Broker(tmp, "--policy", policy)
    pub, _ = memfd_publisher(b.sock, "bytes/a")
    att = spawn(b.sock, "--json", "attach", "bytes/a", "--verify", "random:3", "--hold", "-1")
    doc = json.loads(read_line(att))
    check(doc.get("event") == "attached", "attach said: %s" % doc)
    fam = parse_exposition(ctl(b.sock, "metrics").out)
    for name in ("gpuipc_shared_bytes", "gpuipc_held_bytes", "gpuipc_uid_shared_bytes", "gpuipc_uid_held_bytes"):
        check(name in fam and fam[name]["type"] == "gauge" and fam[name]["help"], "%s: %s" % (name, fam.get(name)))
    check(sample(fam, "gpuipc_shared_bytes", kind="memfd") == 65536, "shared: %s" % fam["gpuipc_shared_bytes"])
    check(sample(fam, "gpuipc_shared_bytes", kind="cuda-vmm") == 0, "cuda-vmm shared")
    check(sample(fam, "gpuipc_held_bytes", kind="memfd") == 65536, "held: %s" % fam["gpuipc_held_bytes"])
    check(sample(fam, "gpuipc_uid_shared_bytes", uid=str(uid)) == 65536, "uid shared: %s" %
          fam["gpuipc_uid_shared_bytes"])
    check(sample(fam, "gpuipc_uid_held_bytes", uid=str(uid)) == 65536, "uid held")
    check(sample(fam, "gpuipc_uid_held_bytes", uid="4242") == 0, "uid 4242")
    check(len(fam["gpuipc_uid_held_bytes"]["samples"]) == 2, "uids the policy does not name: %s" %
          fam["gpuipc_uid_held_bytes"]["samples"])
    stop(att)
    deadline = time.monotonic() + 10
    while sample(parse_exposition(ctl(b.sock, "metrics").out), "gpuipc_held_bytes", kind="memfd") != 0:
        check(time.monotonic() < deadline, "the holder's bytes stayed after it exited")
        time.sleep(0.05)
    stats = one_document(ctl(b.sock, "--json", "stats"), "stats")
    check(stats.get("shared_bytes", {}).get("memfd") == 65536 and stats.get("uid_held_bytes", {}).get(str(uid)) == 0,
          "stats --json: %s" % {k: v for k, v in stats.items() if "bytes" in k})
    stop(pub)
    b.stop()


# ---- the audit trail ----

def audit_records(b):
    """The audit records of a broker that logs JSON lines; every line of its log must be JSON."""
    records = []
    for line in b.log().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            raise Failure("a log line is not JSON: %r" % line)
        if doc.get("msg") == "audit":
            records.append(doc)
    return records


def wait_record(b, what, seconds=10, **fields):
    """The first audit record with these fields, waited for (a record is written when its request
    or departure is handled, which a client may not wait for)."""
    deadline = time.monotonic() + seconds
    while True:
        found = [r for r in audit_records(b) if all(r.get(k) == v for k, v in fields.items())]
        if found:
            return found[0]
        check(time.monotonic() < deadline, "no audit record of %s (%s) in %d s; records: %s" %
              (what, fields, seconds, audit_records(b)))
        time.sleep(0.05)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_who(r, uid, pid=None):
    for key in ("peer", "uid", "pid", "pidns"):
        check(is_int(r.get(key)), "%s of %s is not a number" % (key, r))
    check(r["uid"] == uid and (pid is None or r["pid"] == pid), "who in %s: uid %d pid %s" % (r, uid, pid))


def case_audit_records(tmp):
    """The audit trail, on by default and whatever --log-level says: a JSON record with numbers as
    numbers for a publish, an attach, its release, a retire, an attach the policy denies (its code:
    denied) and a holder killed with its reference (peer-gone, refs 1); the other JSON log lines write
    integers as numbers too; a listing's peer is not recorded. --audit off writes none."""
    uid = os.getuid()
    policy = os.path.join(tmp, "policy.conf")
    with open(policy, "w") as f:
        f.write("allow all uid=%d prefix=ok/\n" % uid)
    b = Broker(tmp, "--policy", policy, "--log-format", "json", "--log-level", "info")
    pub, doc = memfd_publisher(b.sock, "ok/a")
    r = wait_record(b, "the publish", event="publish", name="ok/a")
    check_who(r, uid, pub.pid)
    check(r["result"] == "ok" and r["kind"] == "memfd" and r["bytes"] == 65536 and is_int(r["buffer"]),
          "publish: %s" % r)
    buffer = r["buffer"]
    check(ctl(b.sock, "attach", "ok/a").rc == 0, "attach ok/a")
    r = wait_record(b, "the attach", event="attach", name="ok/a")
    check_who(r, uid)
    check(r["result"] == "ok" and r["kind"] == "memfd" and r["bytes"] == 65536 and r["buffer"] == buffer,
          "attach: %s" % r)
    r = wait_record(b, "the release", event="release", buffer=buffer)
    check(r["result"] == "ok" and r["name"] == "ok/a" and r["bytes"] == 65536, "release: %s" % r)
    check(ctl(b.sock, "attach", "secret/x").rc != 0, "attach secret/x was allowed")
    r = wait_record(b, "the denial", event="attach", name="secret/x")
    check_who(r, uid)
    check(r["result"] == "denied", "denial: %s" % r)
    # A listing is no sharing: its peer's departure is not recorded.
    lister = spawn(b.sock, "ls")
    lister.communicate(timeout=30)
    holder = spawn(b.sock, "--json", "attach", "ok/a", "--hold", "-1")
    check(json.loads(read_line(holder)).get("event") == "attached", "the holder did not attach")
    holder.kill()
    holder.wait()
    r = wait_record(b, "the holder's death", event="peer-gone", pid=holder.pid)
    check_who(r, uid, holder.pid)
    check(r["result"] in ("exited", "closed") and r["refs"] == 1 and r["buffers"] == 0, "peer-gone: %s" % r)
    check(not [x for x in audit_records(b) if x.get("pid") == lister.pid], "ls was recorded: %s" % audit_records(b))
    check(ctl(b.sock, "retire", "ok/a").rc == 0, "retire ok/a")
    r = wait_record(b, "the retire", event="retire", buffer=buffer)
    check(r["result"] == "ok" and r["name"] == "ok/a" and r["kind"] == "memfd", "retire: %s" % r)
    # The broker's other lines: integers are numbers, a mode with its leading zero stays a string.
    lines = [json.loads(l) for l in b.log().splitlines()]
    connected = [l for l in lines if l.get("msg") == "peer connected"]
    check(connected and all(is_int(l["peer"]) and is_int(l["uid"]) for l in connected), "peer connected: %s" %
          connected[:1])
    listening = [l for l in lines if l.get("msg") == "listening"]
    check(listening and listening[0]["mode"] == "0660", "listening: %s" % listening)
    stop(pub)
    b.stop()

    tmp_off = os.path.join(tmp, "off")
    os.mkdir(tmp_off)
    b = Broker(tmp_off, "--policy", policy, "--log-format", "json", "--audit", "off")
    pub, _ = memfd_publisher(b.sock, "ok/b")
    check(ctl(b.sock, "attach", "secret/x").rc != 0, "attach secret/x was allowed")
    stop(pub)
    check(audit_records(b) == [], "--audit off wrote: %s" % audit_records(b))
    b.stop()


def case_audit_rate(tmp):
    """A peer that floods the broker with refused requests (1000 attaches the policy denies) gets a
    bounded number of audit records (--audit-rate 8: a uid 2 a second), then one record saying how
    many were suppressed; the broker answers every request and a ping meanwhile."""
    sys.path.insert(0, os.path.join(SOURCE_ROOT, "tests", "integration"))
    import independent_client as ic
    uid, flood = os.getuid(), 1000
    policy = os.path.join(tmp, "policy.conf")
    with open(policy, "w") as f:
        f.write("allow all uid=%d prefix=ok/\n" % uid)
    b = Broker(tmp, "--policy", policy, "--log-format", "json", "--audit-rate", "8")
    c = ic.Conn(b.sock, "flood")
    ic.hello(c, "flood")
    start = time.monotonic()
    for i in range(flood):
        r = c.call("attach", name="secret/x")
        check(r.get("error") == "denied", "attach %d: %s" % (i, r))
    elapsed = time.monotonic() - start
    check(ctl(b.sock, "--timeout", "10000", "ping").rc == 0, "the broker did not answer a ping after the flood")
    denied = [r for r in audit_records(b) if r.get("event") == "attach"]
    # A uid's bucket: 2 records at once, then 2 a second (and one more for rounding).
    check(len(denied) <= 3 + 2 * elapsed, "%d records of the flood in %.1f s" % (len(denied), elapsed))
    check(all(r["result"] == "denied" for r in denied), "records: %s" % denied)
    # The next record that passes says how many were not written.
    time.sleep(1.1)
    c.close()
    r = wait_record(b, "the suppressed count", event="suppressed")
    check(is_int(r.get("count")), "suppressed: %s" % r)
    total = sum(x["count"] for x in audit_records(b) if x.get("event") == "suppressed")
    check(flood - len(denied) <= total <= flood - len(denied) + 10,
          "%d suppressed, %d of %d floods' records written" % (total, len(denied), flood))
    # Counted where an operator looks too: stats and the exporter's counter.
    stats = one_document(ctl(b.sock, "--json", "stats"), "stats")
    check(stats.get("audit_suppressed_total", 0) >= total, "stats: audit_suppressed_total %s, %d in the log" %
          (stats.get("audit_suppressed_total"), total))
    fams = parse_exposition(ctl(b.sock, "metrics").out)
    fam = fams.get("gpuipc_audit_suppressed_total")
    check(fam and fam["type"] == "counter" and fam["help"] and sample(fams, "gpuipc_audit_suppressed_total") >= total,
          "gpuipc_audit_suppressed_total: %s" % fam)
    b.stop()


def audit_columns(line):
    """A human line of gpuipcctl audit, split into its columns (names here have no spaces)."""
    cols = line.split()
    check(len(cols) >= 9, "not a record's line: %r" % line)
    return dict(zip(("ts", "event", "result", "uid", "pid", "peer", "name", "kind", "bytes"), cols))


def skipped_counts(err):
    """gpuipcctl audit's counts on stderr: (lines not JSON, lines too long)."""
    bad = re.search(r"skipped (\d+) line\(s\) that are not JSON", err)
    long = re.search(r"skipped (\d+) line\(s\) longer than", err)
    return int(bad.group(1)) if bad else 0, int(long.group(1)) if long else 0


def case_audit_ctl(tmp):
    """gpuipcctl audit reads a broker's JSON log: --event attach --result denied prints exactly the
    denial (an overlong copy of it and a line that is not JSON skipped and counted on stderr); --json
    passes the audit records through unchanged and nothing else; --uid of another uid keeps none;
    --follow prints a record written to the file after it started."""
    uid = os.getuid()
    policy = os.path.join(tmp, "policy.conf")
    with open(policy, "w") as f:
        f.write("allow all uid=%d prefix=ok/\n" % uid)
    b = Broker(tmp, "--policy", policy, "--log-format", "json", "--log-level", "info")
    pub, _ = memfd_publisher(b.sock, "ok/a")
    check(ctl(b.sock, "attach", "ok/a").rc == 0, "attach ok/a")
    check(ctl(b.sock, "attach", "secret/x").rc != 0, "attach secret/x was allowed")
    denial = wait_record(b, "the denial", event="attach", name="secret/x")
    wait_record(b, "the attach", event="attach", name="ok/a", result="ok")
    lines = b.log().splitlines()
    audit_lines = [l for l in lines if json.loads(l).get("msg") == "audit"]
    # A copy with two lines that are no records: one not JSON, one a denial padded past 64 KiB.
    padded = json.dumps(dict(denial, pad="x" * 70000))
    snapshot = os.path.join(tmp, "snapshot.log")
    with open(snapshot, "w") as f:
        f.write("\n".join(lines + ["{\"msg\":\"audit\",\"event\":\"attach\" not json", padded]) + "\n")

    r = ctl(b.sock, "audit", snapshot, "--event", "attach", "--result", "denied")
    check(r.rc == 0, "audit: %s" % r)
    out = r.out.splitlines()
    check(len(out) == 2 and out[0].split()[:3] == ["TIME", "EVENT", "RESULT"], "audit printed: %s" % r)
    got = audit_columns(out[1])
    want = {"ts": denial["ts"], "event": "attach", "result": "denied", "uid": str(uid), "pid": str(denial["pid"]),
            "peer": str(denial["peer"]), "name": "secret/x"}
    check(all(got[k] == v for k, v in want.items()), "the denial's line %r, not %s" % (out[1], want))
    check(skipped_counts(r.err) == (1, 1), "skipped counts: %s" % r)

    r = ctl(b.sock, "audit", snapshot, "--json")
    check(r.rc == 0 and r.out.splitlines() == audit_lines, "audit --json: %s\nwanted: %s" % (r, audit_lines))
    r = ctl(b.sock, "--json", "audit", snapshot, "--event", "publish", "--event", "attach", "--result", "denied")
    check(r.rc == 0 and [json.loads(l) for l in r.out.splitlines()] == [denial], "--json denied: %s" % r)
    r = ctl(b.sock, "audit", snapshot, "--uid", str(uid + 1))
    check(r.rc == 0 and r.out == "", "--uid %d: %s" % (uid + 1, r))
    check(ctl(b.sock, "audit", snapshot, "--uid", "x").rc == 2, "--uid x was taken")
    check(ctl(b.sock, "audit", os.path.join(tmp, "nosuch.log")).rc == 1, "a missing file did not fail")

    # The broker's own log, followed: the publish there already, then one made afterwards.
    follower = spawn(b.sock, "--json", "audit", b.log_path, "--follow", "--event", "publish")
    check(json.loads(read_line(follower, 30)).get("name") == "ok/a", "--follow: not the first publish")
    pub2, _ = memfd_publisher(b.sock, "ok/b")
    check(json.loads(read_line(follower, 60)).get("name") == "ok/b", "--follow: not the later publish")
    rc, _, err = stop(follower)
    check(rc == 0, "audit --follow after SIGTERM: exit %s: %s" % (rc, err))
    stop(pub2)
    stop(pub)
    b.stop()


def case_untrusted_text(tmp):
    """A peer's label with terminal escapes and bytes that are not UTF-8 stays valid JSON in --json and
    harmless in tables (gpuipcctl escapes on output; the broker may also refuse it at the door)."""
    import ctypes
    build = os.environ.get("GPUIPC_BUILD_ROOT", "")
    lib_path = os.path.join(build, "client", "libgpuipc.so.0")
    if not os.path.exists(lib_path):
        print("skip: no libgpuipc.so.0 under GPUIPC_BUILD_ROOT")
        sys.exit(SKIP)
    lib = ctypes.CDLL(lib_path)

    class Options(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("socket_path", ctypes.c_char_p), ("label", ctypes.c_char_p),
                    ("connect_timeout_ms", ctypes.c_int), ("reconnect", ctypes.c_int), ("no_gpus", ctypes.c_int)]
    lib.gpuipc_err_name.restype = ctypes.c_char_p
    b = Broker(tmp)

    def connect(label):
        conn = ctypes.c_void_p()
        opts = Options(ctypes.sizeof(Options), b.sock.encode(), label, 1000, 0, 1)
        return lib.gpuipc_connect(ctypes.byref(conn), ctypes.byref(opts)), conn

    # Bytes that are not UTF-8: refused at the door, or shown escaped.
    rc, conn = connect(b"bad\xffutf8")
    if rc < 0:
        name = lib.gpuipc_err_name(rc).decode()
        check(name in ("bad-request", "invalid"), "the broker refused the label with %s" % name)
    else:
        table = subprocess.run([CTL, "--socket", b.sock, "peers"], capture_output=True).stdout
        check(b"\xff" not in table and b"bad?utf8" in table, "not UTF-8, shown as: %r" % table)
        lib.gpuipc_close(conn)
    # UTF-8 with terminal controls: C0 (ESC, CR) and C1 (U+009B, which is CSI alone on terminals
    # that take C1). The broker keeps it as is; --json says it exactly, tables show '?' for each.
    label = "evil\x1b[31m\rrow\u009b2J"
    rc, conn = connect(label.encode())
    check(rc >= 0, "a UTF-8 label was refused: %d" % rc)
    peers = one_document(ctl(b.sock, "--json", "peers"), "peers")
    check(label in [p["label"] for p in peers], "labels: %r" % [p["label"] for p in peers])
    table = subprocess.run([CTL, "--socket", b.sock, "peers"], capture_output=True).stdout
    check(b"\x1b" not in table and b"\r" not in table and b"\xc2\x9b" not in table,
          "raw bytes in the table: %r" % table)
    check(b"evil?[31m?row?2J" in table, "the label is not shown escaped: %r" % table)
    lib.gpuipc_close(conn)
    b.stop()


# ---- a ring made by hand (proto/ring.h's layout), for what rings, ls and stat show ----

class HandRing:
    """A ring set up over the protocol by a Python producer that writes its control page and its
    members' pages itself (tests/integration/independent_client.py speaks the protocol), so the
    test knows the head and each position the broker reads."""
    MAGIC, LAYOUT = 0x474E5252, 1
    HEAD, MEMBER, MEMBER_SIZE = 32, 824, 24  # offsets in the control page (RingCtl)
    PAGE = 4096

    def __init__(self, sock, name, slots=4, members=2):
        sys.path.insert(0, os.path.join(SOURCE_ROOT, "tests", "integration"))
        import independent_client as ic
        import mmap
        import struct
        self.ic, self.struct, self.name = ic, struct, name
        self.prod = ic.Conn(sock, "ring-producer")
        ic.hello(self.prod, "ring-producer")
        r = self.prod.call("ring-create", name=name, kind="memfd", size=self.PAGE, slots=slots, members=members,
                           mode="backpressure")
        check(r.get("status") == 0, "ring-create: %s" % r)
        seal = ic.F_SEAL_SHRINK | ic.F_SEAL_GROW | ic.F_SEAL_SEAL
        ctl = struct.pack("<6IQ", self.MAGIC, self.LAYOUT, slots, members, 0, 0, self.PAGE)
        self.maps, part = [], 0
        for index in range(1 + slots + members):
            writable = index > slots
            fd = os.memfd_create("hand-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, self.PAGE)
            m = mmap.mmap(fd, self.PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if index == 0:
                m[:len(ctl)] = ctl
            self.maps.append(m)
            import fcntl
            fcntl.fcntl(fd, ic.F_ADD_SEALS, seal | (0 if writable else ic.F_SEAL_FUTURE_WRITE))
            msg, _ = self.prod.request("ring-part", fd=fd, name=name, index=index, kind="memfd", size=self.PAGE,
                                       writable=writable)
            os.close(fd)
            check(msg.get("status") == 0, "ring-part %d: %s" % (index, msg))
        self.slots, self.members = slots, members

    def join(self, label):
        c = self.ic.Conn(self.prod.sock.getpeername(), label)
        self.ic.hello(c, label)
        r = c.call("ring-join", name=self.name)
        check(r.get("status") == 0, "ring-join: %s" % r)
        return c, r["index"], r["generation"]

    def put(self, where, offset, fmt, *values):
        self.struct.pack_into(fmt, self.maps[where], offset, *values)

    def set_head(self, head):
        self.put(0, self.HEAD, "<Q", head)

    def seat(self, seat, epoch, start, released):
        """What the producer writes when it seats a member, and what the member writes then."""
        self.put(0, self.MEMBER + seat * self.MEMBER_SIZE, "<QQI", epoch, start, 1)
        self.put(1 + self.slots + seat, 0, "<QQ", epoch, released)

    def close(self):
        self.prod.close()
        for m in self.maps:
            m.close()


def case_rings(tmp):
    """rings, ls and stat show a ring, its seats and how far each lags, as tables and as JSON; a
    control page that cannot be read shows as an unknown head."""
    b = Broker(tmp)
    s = b.sock
    ring = HandRing(s, "cli/r")
    member, seat, epoch = ring.join("cli-member")
    ring.set_head(12)
    ring.seat(seat, epoch, 1, 9)

    rings = one_document(ctl(s, "--json", "rings"), "rings")
    check(len(rings) == 1, "rings: %s" % rings)
    r = rings[0]
    check(r["name"] == "cli/r" and r["mode"] == "backpressure" and r["kind"] == "memfd" and r["slots"] == 4 and
          r["members"] == 2 and r["taken"] == 1 and r["head"] == 12 and r["lag"] == 3 and r["ready"] is True and
          r["why"] == "" and r["pid"] == os.getpid(), "rings: %s" % r)
    check(r["device"] is None, "a memfd ring's device is %r, not null" % r["device"])
    table = ctl(s, "rings")
    check(table.rc == 0 and re.search(r"^cli/r +backpressure +memfd +4 +4\.0 KiB +1/2 +12 +3 ", table.out, re.M),
          "rings table: %s" % table)

    st = one_document(ctl(s, "--json", "stat", "cli/r"), "stat (ring)")
    check(st["ring"]["name"] == "cli/r" and st["ring"]["lag"] == 3, "stat: %s" % st)
    check(len(st["seats"]) == 1, "stat seats: %s" % st)
    m = st["seats"][0]
    check(m["seat"] == seat and m["epoch"] == epoch and m["state"] == "seated" and m["position"] == 9 and
          m["lag"] == 3 and m["label"] == "cli-member" and m["peer"] > 0, "seat: %s" % m)
    text = ctl(s, "stat", "--ring", "cli/r")
    check(text.rc == 0 and re.search(r"^ +0 +%d +seated .* 9 +3 cli-member$" % epoch, text.out, re.M),
          "stat table: %s" % text)

    # ls: the buffers (the ring's parts among them), then the rings; --json keeps the buffers' array.
    ls = ctl(s, "ls")
    check(ls.rc == 0 and "cli/r@ctl" in ls.out and re.search(r"\n\nRING +MODE", ls.out) and
          re.search(r"^cli/r +backpressure", ls.out, re.M), "ls: %s" % ls)
    ls = one_document(ctl(s, "--json", "ls"), "ls")
    check(isinstance(ls, list) and all("buffer" in x for x in ls) and any(x["name"] == "cli/r@ctl" for x in ls),
          "ls --json: %s" % ls)
    check(ctl(s, "ls", "--prefix", "nothing/").out.count("\n") == 1, "ls shows a ring table without rings")

    # The exporter: one series per ring in each gpuipc_ring_* family.
    fam = parse_exposition(ctl(s, "metrics").out)
    for name, want in (("gpuipc_ring_head", 12), ("gpuipc_ring_lag_frames", 3), ("gpuipc_ring_seats_taken", 1),
                       ("gpuipc_ring_slots", 4), ("gpuipc_rings", None), ("gpuipc_ring_members", None)):
        got = sample(fam, name, ring="cli/r") if want is not None else sample(fam, name)
        check(want is None or got == want, "%s: %s, expected %s" % (name, got, want))

    # A control page that does not hold the ring: head and lag unknown, and why.
    ring.put(0, 0, "<I", 0)
    r = one_document(ctl(s, "--json", "rings"), "rings")[0]
    check(r["head"] is None and r["lag"] is None and "control page" in r["why"], "unreadable: %s" % r)
    m = one_document(ctl(s, "--json", "stat", "cli/r"), "stat")["seats"][0]
    check(m["state"] == "joined" and m["position"] is None and m["lag"] is None, "unreadable seat: %s" % m)
    check(re.search(r"^cli/r +backpressure +memfd +4 +4\.0 KiB +1/2 +\? +- ", ctl(s, "rings").out, re.M),
          "unknown head in the table")
    fam = parse_exposition(ctl(s, "metrics").out)
    check(not any(l.get("ring") == "cli/r" for n, l, v in fam.get("gpuipc_ring_head", {"samples": []})["samples"]),
          "a head sample for an unreadable control page")

    for args, name in ((("stat", "--ring", "nosuch"), "not-found"), (("stat", "nosuch"), "not-found"),
                       (("stat", "--ring", "--id", "3"), "usage")):
        r = ctl(s, "--json", *args)
        doc = one_document(r, " ".join(args))
        check(r.rc != 0 and doc.get("error") == name, "%s: %s" % (args, r))
    member.close()
    ring.close()
    b.stop()


def long_options(help_text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text))


def case_man_pages(tmp):
    """The man pages name every command and every option that --help lists, and are built as roff."""
    man = os.path.join(SOURCE_ROOT, "docs", "man")
    with open(os.path.join(man, "gpuipcctl.1.scd")) as f:
        ctl_page = f.read()
    with open(os.path.join(man, "gpuipc-broker.8.scd")) as f:
        broker_page = f.read()
    top = subprocess.run([CTL, "--help"], capture_output=True, text=True).stdout
    commands = re.findall(r"^  ([a-z]+) {2,}", top.split("Commands:")[1], re.M)
    check(commands, "no commands in gpuipcctl --help")
    documented = long_options(ctl_page)
    for opt in long_options(top.split("Commands:")[0]):
        check(opt in documented, "gpuipcctl --help lists %s but gpuipcctl.1.scd does not" % opt)
    for cmd in commands:
        check(re.search(r"^\*%s\*" % cmd, ctl_page, re.M), "gpuipcctl.1.scd does not describe %s" % cmd)
        sub = subprocess.run([CTL, cmd, "--help"], capture_output=True, text=True).stdout
        for opt in long_options(sub.split("Global options")[0]):
            check(opt in documented, "gpuipcctl %s --help lists %s but gpuipcctl.1.scd does not" % (cmd, opt))
    broker_help = subprocess.run([BROKER, "--help"], capture_output=True, text=True).stdout
    for opt in long_options(broker_help):
        check(opt in long_options(broker_page), "gpuipc-broker --help lists %s but gpuipc-broker.8.scd does not" % opt)
    build = os.environ.get("GPUIPC_BUILD_ROOT", "")
    if shutil.which("scdoc") and build:
        for page in ("gpuipcctl.1", "gpuipc-broker.8"):
            with open(os.path.join(build, "docs", page)) as f:
                check(".TH" in f.read(), "%s is not roff" % page)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in CASES and sys.argv[1] != "list":
        print("usage: test_cli.py CASE|list; cases: %s" % " ".join(CASES), file=sys.stderr)
        return 2
    if sys.argv[1] == "list":
        print("\n".join(CASES))
        return 0
    if not (os.access(BROKER, os.X_OK) and os.access(CTL, os.X_OK)):
        print("skip: GPUIPC_BROKER and GPUIPC_CTL must name the broker and gpuipcctl")
        return SKIP
    fn = CASES[sys.argv[1]]
    print("case %s: %s" % (sys.argv[1], " ".join(fn.__doc__.split())))
    with tempfile.TemporaryDirectory(prefix="gpuipc-cli.") as tmp:
        try:
            fn(tmp)
        except Failure as e:
            where = traceback.extract_tb(e.__traceback__)[1:-1]  # the case's lines, not check()'s
            print("FAIL:", e)
            print("".join(traceback.format_list(where)))
            return 1
        finally:
            kill_leftovers()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
