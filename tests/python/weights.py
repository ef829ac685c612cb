"""gpuipcctl weights end to end (python-weights): checkpoints written here in the safetensors format
(by hand: an 8-byte little-endian length, the JSON header, the data), loaded by `gpuipcctl weights
load` and read back through attach_state_dict() by engines in other processes, after the loader
exited, in PID namespaces of their own where unshare is permitted.

    weights.py [CASE...]     (every case without arguments)

Needs GPUIPC_BROKER, GPUIPC_CTL, GPUIPC_SOURCE_ROOT, GPUIPC_BUILD_ROOT; GPUIPC_TEST_FAKECUDA (the
stand-in libcuda) for the cuda-vmm cases, which are skipped without it. Each case starts brokers of
its own on a socket in a temporary directory, removed at the end."""
import fcntl
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time

import numpy as np

ROOT, BUILD = os.environ['GPUIPC_SOURCE_ROOT'], os.environ['GPUIPC_BUILD_ROOT']
CTL, BROKER = os.environ['GPUIPC_CTL'], os.environ['GPUIPC_BROKER']
FAKECUDA = os.environ.get('GPUIPC_TEST_FAKECUDA', '')
AS_PID_1 = ('unshare', '--pid', '--fork', '--mount-proc', '--kill-child')
TIMEOUT = 60

# Every dtype NumPy has, as safetensors names it; the others' bytes are compared raw.
NUMPY_DTYPES = {'BOOL': '?', 'U8': 'u1', 'I8': 'i1', 'I16': '<i2', 'U16': '<u2', 'I32': '<i4', 'U32': '<u4',
                'I64': '<i8', 'U64': '<u8', 'F16': '<f2', 'F32': '<f4', 'F64': '<f8', 'C64': '<c8'}
RAW_DTYPES = {'BF16': ('bfloat16', 2), 'F8_E4M3': ('float8_e4m3fn', 1), 'F8_E5M2': ('float8_e5m2', 1),
              'F8_E8M0': ('float8_e8m0fnu', 1)}

# An engine: attaches a state dict, prints what it holds (each tensor's dtype, shape and a digest
# of its bytes), then answers commands on stdin: check (read again), release, exit.
ENGINE = r'''
import hashlib, json, os, sys
import gpuipc
name, fw = sys.argv[1], (None if sys.argv[2] == 'none' else sys.argv[2])
c = gpuipc.Client(label='weights-engine')

def held(sd):
    out = {}
    for k, v in sd.items():
        if fw == 'numpy':
            out[k] = [v.dtype.str, list(v.shape), hashlib.sha256(v.tobytes()).hexdigest()]
        else:
            out[k] = [v.dtype, list(v.shape), hashlib.sha256(v.read()).hexdigest()]
    return out

try:
    sd = c.attach_state_dict(name, framework=fw, timeout_ms=int(os.environ.get('ATTACH_MS', '5000')))
except (gpuipc.UnsupportedDtype, gpuipc.NotFound, gpuipc.Timeout) as e:
    print(json.dumps({'error': type(e).__name__, 'message': str(e)}), flush=True)
    sys.exit(0)
print(json.dumps({'pid': os.getpid(), 'version': sd.version, 'generation': sd.generation, 'meta': sd.meta,
                  'tensors': held(sd)}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == 'check':
        c.ping(20000)  # after a broker restart: reconnects and reclaims first
        print(json.dumps({'tensors': held(sd), 'revoked': sd._attached.revoked}), flush=True)
    elif cmd == 'release':
        sd.release()
        c.ping()
        print(json.dumps({'released': True}), flush=True)
    else:
        break
c.close()
'''


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


class Env:
    """A temporary directory, a broker on a socket in it, and the environment for our processes."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix='gpuipc-weights.')
        self.sock = os.path.join(self.dir, 's.sock')
        self.env = dict(os.environ, GPUIPC_SOCKET=self.sock, GPUIPC_LIBRARY=os.path.join(BUILD, 'client', 'libgpuipc.so'),
                        PYTHONPATH=os.path.join(ROOT, 'python'))
        self.env.pop('GPUIPC_LIBCUDA', None)
        self.engine_py = os.path.join(self.dir, "engine.py")
        with open(self.engine_py, "w") as f:
            f.write(ENGINE)
        self.broker, self.procs, self.logs = None, [], []
        self.namespaces = subprocess.run([*AS_PID_1, 'true'], capture_output=True).returncode == 0

    def start_broker(self, grace_ms=3000, extra=()):
        log = open(os.path.join(self.dir, f'broker{len(self.logs)}.log'), 'w')
        self.logs.append(log.name)
        self.broker = subprocess.Popen([BROKER, '--socket', self.sock, '--log-level', 'warn',
                                        '--restart-grace-ms', str(grace_ms), *extra], stderr=log, env=self.env)
        log.close()
        self.ctl('--timeout', '10000', 'ping')

    def kill_broker(self, sig=signal.SIGKILL):
        self.broker.send_signal(sig)
        self.broker.wait(TIMEOUT)

    def ctl(self, *args, ok=True, env=None, stdin=None):
        r = subprocess.run([CTL, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env or self.env,
                           stdin=stdin)
        if ok and r.returncode != 0:
            raise Failure(f'gpuipcctl {" ".join(args)}: exit {r.returncode}: {r.stderr.strip()}')
        return r

    def ctl_json(self, *args):
        return json.loads(self.ctl('--json', *args).stdout)

    def engine_proc(self, name, framework='numpy', pidns=True, env=None):
        prefix = AS_PID_1 if pidns and self.namespaces else ()
        p = subprocess.Popen([*prefix, sys.executable, self.engine_py, name, framework], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=dict(self.env, **(env or {})))
        self.procs.append(p)
        return p

    def engine(self, name, framework='numpy', **kw):
        """An engine holding name: (its process, what it first printed)."""
        p = self.engine_proc(name, framework, **kw)
        return p, self.answer(p)

    def answer(self, p):
        line = p.stdout.readline()
        check(line, f'engine exited ({p.poll()}) without an answer')
        return json.loads(line)

    def say(self, p, cmd):
        p.stdin.write(cmd + '\n')
        p.stdin.flush()
        return self.answer(p)

    def read_once(self, name, framework='numpy', **kw):
        """What a fresh engine (a PID namespace of its own) reads of name, then it exits."""
        p, got = self.engine(name, framework, **kw)
        p.stdin.close()
        check(p.wait(TIMEOUT) == 0, f'engine exited {p.returncode}')
        return got

    def weights(self):
        return self.ctl_json('weights', 'ls')

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.broker and self.broker.poll() is None:
            self.kill_broker(signal.SIGTERM)
        refused = [log for log in self.logs if 'seccomp:' in open(log).read()]
        shutil.rmtree(self.dir)
        check(not refused, 'the broker logged a system call outside its allow-list')


def safetensors_bytes(tensors, meta=None):
    """A safetensors file's bytes: tensors [(name, dtype, shape, raw bytes)] in this order."""
    header, blobs, off = {'__metadata__': meta or {'format': 'pt'}}, [], 0
    for name, dtype, shape, raw in tensors:
        header[name] = {'dtype': dtype, 'shape': list(shape), 'data_offsets': [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    j = json.dumps(header).encode()
    j += b' ' * (-len(j) % 8)  # as the safetensors library pads it
    return struct.pack('<Q', len(j)) + j + b''.join(blobs)


def write(path, tensors, **kw):
    with open(path, 'wb') as f:
        f.write(safetensors_bytes(tensors, **kw))
    return path


def numpy_tensors(seed, prefix=''):
    """One tensor of every dtype NumPy has, of odd shapes, random values."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (st, np_dt) in enumerate(NUMPY_DTYPES.items()):
        shape = (3, 5, 7) if i % 2 else (17,)
        if st == 'BOOL':
            a = rng.integers(0, 2, size=shape).astype('?')
        elif st.startswith(('I', 'U')):
            info = np.iinfo(np.dtype(np_dt))
            a = rng.integers(info.min, info.max, size=shape, dtype=np.dtype(np_dt).newbyteorder('='))
        elif st == 'C64':
            a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np_dt)
        else:
            a = rng.standard_normal(shape).astype(np_dt)
        out.append((f'{prefix}t.{st.lower()}', st, shape, np.ascontiguousarray(a, dtype=np_dt).tobytes()))
    return out


def digest(raw):
    return hashlib.sha256(raw).hexdigest()


def expect_numpy(got, tensors):
    """got (an engine's numpy view) holds exactly tensors."""
    check('tensors' in got, f'the engine attached nothing: {got}')
    held = got['tensors']
    check(set(held) == {t[0] for t in tensors}, f'keys {sorted(held)}')
    for name, st, shape, raw in tensors:
        dt, shp, d = held[name]
        check(np.dtype(dt) == np.dtype(NUMPY_DTYPES[st]), f'{name}: dtype {dt}, not {NUMPY_DTYPES[st]}')
        check(shp == list(shape), f'{name}: shape {shp}, not {list(shape)}')
        check(d == digest(raw), f'{name}: other bytes')


def load(e, name, *files, ok=True, kind='memfd', extra=(), env=None, stdin=None):
    r = e.ctl('weights', 'load', name, *files, '--kind', kind, *extra, ok=ok, env=env, stdin=stdin)
    return r


def nothing_registered(e):
    check(e.ctl_json('ls') == [], f'buffers left: {e.ctl_json("ls")}')


# ---- cases ----

def case_every_dtype(e):
    """Every dtype NumPy has, read back exactly with framework='numpy' in another PID namespace after
    the loader exited; bf16 and the float8s byte for byte (framework=None), and a numpy consumer of
    those refused with UnsupportedDtype naming the tensor."""
    tensors = numpy_tensors(1)
    path = write(os.path.join(e.dir, 'a.safetensors'), tensors)
    r = load(e, 'w/numpy', path)
    check('loaded w/numpy: 13 tensors from 1 file' in r.stdout, r.stdout)
    expect_numpy(e.read_once('w/numpy'), tensors)
    rng = np.random.default_rng(2)
    raw = [(f'r.{st.lower()}', st, (4, 6), rng.integers(0, 256, 24 * size, dtype=np.uint8).tobytes())
           for st, (_, size) in RAW_DTYPES.items()]
    raw.append(('r.f4', 'F4', (3, 8), rng.integers(0, 256, 12, dtype=np.uint8).tobytes()))
    raw.append(('r.f32', 'F32', (5,), np.arange(5, dtype='<f4').tobytes()))
    path = write(os.path.join(e.dir, 'b.safetensors'), raw)
    load(e, 'w/raw', path)
    got = e.read_once('w/raw', 'none')
    held = got['tensors']
    for name, st, shape, data in raw:
        check(held[name][2] == digest(data), f'{name}: other bytes')
    check(held['r.bf16'][:2] == ['bfloat16', [4, 6]], held['r.bf16'])
    check(held['r.f8_e8m0'][0] == 'float8_e8m0fnu', held['r.f8_e8m0'])
    check(held['r.f4'][:2] == ['float4_e2m1fn_x2', [3, 4]], held['r.f4'])
    check(held['r.f32'][:2] == ['float32', [5]], held['r.f32'])
    try:
        import ml_dtypes  # noqa: F401  NumPy views bfloat16 then, and the refusal below does not happen
        return 'ml_dtypes present: numpy refusal not checked'
    except ImportError:
        got = e.read_once('w/raw', 'numpy')
        check(got.get('error') == 'UnsupportedDtype' and "'r.bf16'" in got['message'], got)
    meta = e.read_once('w/numpy')['meta']
    check(meta.get('weights') == {'files': 1, 'tensors': 13, 'bytes': sum(len(t[3]) for t in tensors)}, meta)


def case_sharded(e):
    """A sharded checkpoint through its index: every tensor of both shards, exact; an index that puts
    a tensor in the wrong shard, or names a path, is refused and nothing is published."""
    a, b = numpy_tensors(3, 'a.'), numpy_tensors(4, 'b.')
    write(os.path.join(e.dir, 'model-00001-of-00002.safetensors'), a)
    write(os.path.join(e.dir, 'model-00002-of-00002.safetensors'), b)
    index = {'metadata': {'total_size': 1}, 'weight_map': {
        **{t[0]: 'model-00001-of-00002.safetensors' for t in a},
        **{t[0]: 'model-00002-of-00002.safetensors' for t in b}}}
    path = os.path.join(e.dir, 'model.safetensors.index.json')
    with open(path, 'w') as f:
        json.dump(index, f)
    r = load(e, 'w/sharded', path)
    check('26 tensors from 2 files' in r.stdout, r.stdout)
    expect_numpy(e.read_once('w/sharded'), a + b)
    e.ctl('weights', 'drop', 'w/sharded')
    wrong = dict(index, weight_map=dict(index['weight_map'], **{a[0][0]: 'model-00002-of-00002.safetensors'}))
    with open(path, 'w') as f:
        json.dump(wrong, f)
    r = load(e, 'w/wrong', path, ok=False)
    check(r.returncode == 1 and f"puts tensor '{a[0][0]}' in model-00002-of-00002.safetensors" in r.stderr, r.stderr)
    with open(path, 'w') as f:
        json.dump({'weight_map': {'x': '../x.safetensors'}}, f)
    r = load(e, 'w/escape', path, ok=False)
    check(r.returncode == 1 and 'not a file name in the index' in r.stderr, r.stderr)
    nothing_registered(e)


def case_several_files_and_pipe(e):
    """Several files given one by one, and a file read from standard input (a pipe): exact; a
    tensor name in two files is refused."""
    a, b = numpy_tensors(5, 'x.'), numpy_tensors(6, 'y.')
    pa = write(os.path.join(e.dir, 'x.safetensors'), a)
    pb = write(os.path.join(e.dir, 'y.safetensors'), b)
    load(e, 'w/two', pa, pb)
    expect_numpy(e.read_once('w/two'), a + b)
    with open(pa, 'rb') as f:
        cat = subprocess.Popen(['cat'], stdin=f, stdout=subprocess.PIPE)
        load(e, 'w/pipe', '-', stdin=cat.stdout)
        cat.stdout.close()
        cat.wait()
    expect_numpy(e.read_once('w/pipe'), a)
    r = load(e, 'w/dup', pa, pa, ok=False)
    check(r.returncode == 1 and "tensor 'x.t.bool' is in both" in r.stderr, r.stderr)


def case_malformed(e):
    """Files a loader must refuse, each with the file and the byte named, leaving nothing published."""
    good = [('w', 'F32', (4,), np.arange(4, dtype='<f4').tobytes()), ('b', 'F32', (2,), b'\0' * 8)]
    data = safetensors_bytes(good)
    hlen = struct.unpack('<Q', data[:8])[0]
    cases = {
        'truncated': (data[:-4], 'go past the data'),
        'short-header': (data[:8 + hlen // 2], 'byte 0: the header length'),
        'huge-length': (struct.pack('<Q', 1 << 40) + data[8:], 'over the format\'s limit'),
        'overlap': (safetensors_bytes([('w', 'F32', (4,), b'\0' * 16)]).replace(b'"data_offsets": [0, 16]',
                                                                                  b'"data_offsets": [0, 16]}, "v": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]'),
                    'overlap'),
        'bad-json': (struct.pack('<Q', 8) + b'{"w": {]', 'byte 15'),
        'size-mismatch': (safetensors_bytes([('w', 'F32', (3,), b'\0' * 16)]), 'make 12 bytes'),
        'unknown-dtype': (safetensors_bytes([('w', 'F12', (4,), b'\0' * 16)]), "unknown dtype 'F12'"),
        'f6': (safetensors_bytes([('w', 'F6_E2M3', (4,), b'\0' * 3)]), 'no framework has a dtype for'),
    }
    for what, (raw, want) in cases.items():
        path = os.path.join(e.dir, f'{what}.safetensors')
        with open(path, 'wb') as f:
            f.write(raw)
        r = load(e, f'w/{what}', path, ok=False)
        check(r.returncode == 1, f'{what}: exit {r.returncode}')
        check(path in r.stderr and want in r.stderr, f'{what}: {r.stderr.strip()!r} does not name the file and {want!r}')
        check('byte' in r.stderr or what == 'f6', f'{what}: no byte named: {r.stderr}')
    # cut short in a pipe: found only while reading the data, after the buffer was made
    with open(os.path.join(e.dir, 'cut'), 'wb') as f:
        f.write(data[:-6])
    with open(os.path.join(e.dir, 'cut'), 'rb') as f:
        r = load(e, 'w/cut', '-', ok=False, stdin=f)
    check(r.returncode == 1 and 'ends at byte' in r.stderr, r.stderr)
    nothing_registered(e)


def stat(e, name):
    """One of the broker's statistics, as its text."""
    values = dict(line.split()[:2] for line in e.ctl('stats').stdout.splitlines() if len(line.split()) >= 2)
    check(name in values, f'no statistic {name}')
    return values[name]


def case_killed_mid_load(e):
    """A loader killed (SIGKILL) in the middle of its data publishes nothing and leaves the broker
    as before it came: no buffer, no peer, the memory budget back where it was."""
    tensors = [(f't{i}', 'U8', (1 << 20,), bytes([i]) * (1 << 20)) for i in range(4)]
    data = safetensors_bytes(tensors)
    fifo = os.path.join(e.dir, 'fifo')
    os.mkfifo(fifo)
    before = stat(e, 'memory_held_bytes')
    loader = subprocess.Popen([CTL, 'weights', 'load', 'w/killed', fifo, '--kind', 'memfd', '--chunk', '1M'],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e.env)
    e.procs.append(loader)
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(fd, data[:len(data) // 2])  # the header and half the data: then the loader waits for more
        deadline = time.monotonic() + TIMEOUT
        while True:  # until it took all of it from the pipe: it is inside the load
            left = struct.unpack('i', fcntl.ioctl(fd, termios.FIONREAD, b'\0' * 4))[0]
            if left == 0:
                break
            check(time.monotonic() < deadline, 'the loader does not read')
            time.sleep(0.05)
        peers = e.ctl_json('peers')
        check(any(p['pid'] == loader.pid for p in peers), f'the loader is not connected: {peers}')
        check(e.weights() == [], 'something was published before the data was read')
        loader.kill()
        loader.wait(TIMEOUT)
    finally:
        os.close(fd)
    deadline = time.monotonic() + TIMEOUT
    while any(p['pid'] == loader.pid for p in e.ctl_json('peers')):
        check(time.monotonic() < deadline, 'the broker still lists the killed loader')
        time.sleep(0.05)
    nothing_registered(e)
    check(stat(e, 'memory_held_bytes') == before, f'held {stat(e, "memory_held_bytes")} bytes, {before} before')


def case_versions_and_drop(e):
    """Loading NAME again: new attaches get the new version, an engine holding the old one keeps
    reading it until it releases, `weights ls` shows both meanwhile; drop: attaches fail at once, the
    holder keeps its memory, and nothing is left once it released."""
    v1, v2 = numpy_tensors(7), numpy_tensors(8)
    p1 = write(os.path.join(e.dir, 'v1.safetensors'), v1)
    p2 = write(os.path.join(e.dir, 'v2.safetensors'), v2)
    load(e, 'w/model', p1)
    old, got = e.engine('w/model')
    expect_numpy(got, v1)
    load(e, 'w/model', p2)
    expect_numpy(e.read_once('w/model'), v2)
    expect_numpy(e.say(old, 'check'), v1)
    rows = e.weights()
    check(sorted(r['state'] for r in rows) == ['draining', 'live'], rows)
    check([r['holders'] for r in rows if r['state'] == 'draining'] == [1], rows)
    check(all(r['orphaned'] for r in rows), rows)
    e.say(old, 'release')
    deadline = time.monotonic() + TIMEOUT
    while len(e.weights()) != 1:
        check(time.monotonic() < deadline, f'the old version did not go: {e.weights()}')
        time.sleep(0.05)
    holder, got = e.engine('w/model')
    expect_numpy(got, v2)
    r = e.ctl('weights', 'drop', 'w/model')
    check('freed once its 1 holder released it' in r.stdout, r.stdout)
    check(e.ctl('attach', 'w/model', ok=False).returncode == 1, 'attach after drop')
    expect_numpy(e.say(holder, 'check'), v2)
    e.say(holder, 'release')
    deadline = time.monotonic() + TIMEOUT
    while e.weights():
        check(time.monotonic() < deadline, f'dropped weights stay: {e.weights()}')
        time.sleep(0.05)
    nothing_registered(e)


def case_broker_restart(e):
    """Without a holder, a broker SIGKILL loses loaded weights (the control case); with `weights serve`
    holding, nothing is lost: an engine that held them keeps them (reclaimed, not revoked) and a new
    engine reads the same bytes; stopped, serve leaves them broker-held."""
    tensors = numpy_tensors(9)
    path = write(os.path.join(e.dir, 'm.safetensors'), tensors)
    load(e, 'w/lost', path)
    e.kill_broker()
    e.start_broker()
    check(e.weights() == [], 'weights without a holder came back')
    serve = subprocess.Popen([CTL, 'weights', 'serve', 'w/served', path, '--kind', 'memfd'], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=e.env)
    e.procs.append(serve)
    check(serve.stdout.readline().startswith('loaded w/served'), 'serve did not load')
    check(serve.stdout.readline().startswith('published name=w/served'), 'serve did not publish')
    rows = e.weights()
    check(len(rows) == 1 and not rows[0]['orphaned'] and rows[0]['pid'] == serve.pid, rows)
    engine, got = e.engine('w/served')
    expect_numpy(got, tensors)
    e.kill_broker()
    e.start_broker()
    check(serve.stdout.readline().startswith('reconnected'), 'serve did not reconnect')
    after = e.say(engine, 'check')
    check(not after['revoked'], 'the engine lost its weights in the restart')
    expect_numpy(after, tensors)
    expect_numpy(e.read_once('w/served'), tensors)
    rows = e.weights()
    check(len(rows) == 1 and rows[0]['holders'] == 1, rows)
    serve.send_signal(signal.SIGTERM)
    check(serve.wait(TIMEOUT) == 0, f'serve exited {serve.returncode}')
    rows = e.weights()
    check(len(rows) == 1 and rows[0]['orphaned'] and rows[0]['state'] == 'live', rows)
    expect_numpy(e.say(engine, 'check'), tensors)
    e.say(engine, 'release')


def case_broker_drops_reconnects(e):
    """While the broker restarts, something on its socket accepts connections and drops them at once
    (a broker being killed does that for a moment; here a stand-in does it for a second and a half):
    `weights serve` keeps trying, as it does while nothing listens, and registers the weights with the
    broker that then comes, under the same buffer and generation."""
    import socket
    import threading
    path = write(os.path.join(e.dir, 'm.safetensors'), numpy_tensors(10))
    serve = subprocess.Popen([CTL, 'weights', 'serve', 'w/flap', path, '--kind', 'memfd'], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=e.env)
    e.procs.append(serve)
    check(serve.stdout.readline().startswith('loaded w/flap'), 'serve did not load')
    check(serve.stdout.readline().startswith('published name=w/flap'), 'serve did not publish')
    before = e.weights()
    e.kill_broker()
    os.unlink(e.sock)
    drop = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    drop.bind(e.sock)
    drop.listen(16)
    stop = time.monotonic() + 1.5
    accepted = 0

    def dropper():
        nonlocal accepted
        drop.settimeout(0.1)
        while time.monotonic() < stop:
            try:
                conn, _ = drop.accept()
            except socket.timeout:
                continue
            accepted += 1
            conn.close()

    t = threading.Thread(target=dropper)
    t.start()
    t.join()
    drop.close()
    os.unlink(e.sock)
    check(accepted > 0, 'serve never tried to reconnect while the stand-in listened')
    check(serve.poll() is None, f'serve gave up while the broker restarted (exit {serve.poll()}): '
          f'{serve.stderr.read().strip() if serve.poll() is not None else ""}')
    e.start_broker()
    check(serve.stdout.readline().startswith('reconnected'), 'serve did not reconnect')
    after = e.weights()
    check(len(after) == 1 and (after[0]['buffer'], after[0]['generation']) ==
          (before[0]['buffer'], before[0]['generation']), f'{before} -> {after}')
    serve.send_signal(signal.SIGTERM)
    check(serve.wait(TIMEOUT) == 0, f'serve exited {serve.returncode}')


def case_quota(e):
    """--max-held-memory-per-uid: a checkpoint that would take its uid past it is refused (quota, naming
    the flag) and leaves nothing; one within it loads, broker_held_bytes counts it, and drop gives it back."""
    e.kill_broker(signal.SIGTERM)
    e.start_broker(extra=('--max-held-memory-per-uid', '1M'))
    big = write(os.path.join(e.dir, 'big.safetensors'), [('w', 'U8', (2 << 20,), b'\1' * (2 << 20))])
    r = load(e, 'w/big', big, ok=False)
    check(r.returncode == 1 and '[quota]' in r.stderr and '--max-held-memory-per-uid' in r.stderr, r.stderr)
    nothing_registered(e)
    check(stat(e, 'broker_held_bytes') == '0', stat(e, 'broker_held_bytes'))
    small = write(os.path.join(e.dir, 'small.safetensors'), [('w', 'U8', (1 << 19,), b'\2' * (1 << 19))])
    load(e, 'w/small', small)
    rows = e.weights()
    check(len(rows) == 1 and stat(e, 'broker_held_bytes') == str(rows[0]['size']), (rows, stat(e, 'broker_held_bytes')))
    e.ctl('weights', 'drop', 'w/small')
    check(stat(e, 'broker_held_bytes') == '0', stat(e, 'broker_held_bytes'))


def case_cuda_vmm(e):
    """cuda-vmm on the stand-in libcuda: through two 1 MiB page-locked chunks, tensors crossing chunk
    boundaries and 300 small ones in one chunk, exact; a checkpoint larger than the device's free
    memory refused before allocating, with the numbers."""
    if not FAKECUDA:
        return 'skipped: no stand-in libcuda'
    fake = {'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '1'}
    env = dict(e.env, **fake)
    rng = np.random.default_rng(10)
    tensors = [(f'big{i}', 'F32', (300000 + i,), rng.standard_normal(300000 + i).astype('<f4').tobytes())
               for i in range(3)]
    tensors += [(f'small{i}', 'BF16', (7, 3), rng.integers(0, 256, 42, dtype=np.uint8).tobytes()) for i in range(300)]
    path = write(os.path.join(e.dir, 'gpu.safetensors'), tensors)
    r = load(e, 'w/gpu', path, kind='cuda-vmm', extra=('--chunk', '1M'), env=env)
    check('303 tensors' in r.stdout and 'kind=cuda-vmm' in r.stdout, r.stdout)
    got = e.read_once('w/gpu', 'none', env=fake)
    for name, _, _, raw in tensors:
        check(got['tensors'][name][2] == digest(raw), f'{name}: other bytes')
    size = len(safetensors_bytes(tensors))
    r = load(e, 'w/huge', path, kind='cuda-vmm', ok=False, env=dict(env, FAKECUDA_MEM_FREE='1048576'))
    check(r.returncode == 1 and 'on device 0, which has 1048576 bytes (1.0 MiB) free' in r.stderr, r.stderr)
    check('w/huge' not in json.dumps(e.weights()), 'a refused checkpoint was published')
    return f'{size} bytes through 1 MiB chunks'


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith('case_')}


def main():
    names = sys.argv[1:] or list(CASES)
    failed = 0
    for name in names:
        e = Env()
        try:
            e.start_broker()
            note = CASES[name](e)
            if not e.namespaces:
                note = (note + '; ' if note else '') + 'engines in this PID namespace: unshare --pid is not permitted here'
            print(f'ok {name}' + (f' ({note})' if note else ''), flush=True)
        except Failure as f:
            failed += 1
            print(f'FAIL {name}: {f}', flush=True)
            for log in e.logs:
                print(f'--- {os.path.basename(log)}\n' + open(log).read(), flush=True)
        finally:
            e.close()
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
