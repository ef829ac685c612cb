"""The gpuipc Python package end to end on memfd (and a stand-in CUDA), two processes at a time.

Run by test-wheel.sh with the package installed from its wheel into a fresh virtual environment,
against a broker whose policy denies attaching names under py/denied/:

    suite.py [--installed-in PREFIX]      exit 0 pass, 1 fail

Cases: NumPy arrays through DLPack (every dtype, read-only views, a strided slice), metadata of
every msgpack type round-tripped exactly (also bytes a C producer writes), a state dict of 500
arrays and its versions with double buffering (memory and fds flat across 1000 updates), a dropped
Attached releasing its reference (only once its last view is gone), Client.close() releasing
everything, events, groups, the DLPack capsules themselves, and each exception class raised where
it belongs. Peers are separate processes (`suite.py role NAME ...`), talking over pipes.
$GPUIPC_TEST_FAKECUDA names the stand-in libcuda (tests/bench/fakecuda.c) for the CUDA cases.
"""
import asyncio
import gc
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings

import numpy as np

import gpuipc
from gpuipc import dlpack

TIMEOUT_S = 60
FAKECUDA = os.environ.get('GPUIPC_TEST_FAKECUDA', '')
RUN = os.environ.setdefault('GPUIPC_SUITE_RUN', str(os.getpid()))  # shared with the peers

# every msgpack type, at sizes that need the longer encodings
META = {
    'float': 0.1, 'float_big': -1.5e300, 'inf': float('inf'), 'float_int': 2.0,
    'neg': -1, 'neg8': -100, 'neg16': -30000, 'neg32': -2 ** 31, 'neg64': -2 ** 63,
    'u8': 200, 'u16': 60000, 'u32': 2 ** 32 - 1, 'u64': 2 ** 64 - 1,
    'none': None, 'true': True, 'false': False,
    'bytes': bytes(range(256)), 'no_bytes': b'',
    'str': 'é' * 200, 'no_str': '',
    'list': list(range(-50, 50)),
    'map': {f'k{i}': i * 1.25 for i in range(20)},
    'nested': {'a': {'b': {'c': [1, 2.5, None, 'x', b'y', {'d': -7, 5: 'int key'}]}}},
}

DTYPES = ['float32', 'float64', 'float16', 'int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64',
          'bool', 'complex64']
SD_SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 4), (1, 129)]


# ---- helpers ----

def same(a, b):
    """Equal values of identical types, floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack('<d', a) == struct.pack('<d', b)
    return a == b


def expected_array(dtype, shape, seed):
    n = int(np.prod(shape)) if shape else 1
    base = np.arange(n, dtype=np.int64) * 7 + seed
    if dtype == 'bool':
        return (base % 3 == 0).reshape(shape)
    if dtype == 'complex64':
        return (base + 1j * (base % 11)).astype(np.complex64).reshape(shape)
    return (base % 97).astype(dtype).reshape(shape)


def sd_entry(i):
    return f'layers.{i // 10}.w{i % 10}', DTYPES[i % len(DTYPES)], SD_SHAPES[i % len(SD_SHAPES)]


def make_state_dict(n, version):
    return {key: expected_array(dtype, shape, version * 1000 + i)
            for i, (key, dtype, shape) in ((i, sd_entry(i)) for i in range(n))}


def check_state_dict(sd, n, version):
    if len(sd) != n:
        return f'{len(sd)} entries, not {n}'
    for i in range(n):
        key, dtype, shape = sd_entry(i)
        want = expected_array(dtype, shape, version * 1000 + i)
        got = sd[key]
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            return f'{key} differs in version {version} ({got.dtype}{got.shape} vs {want.dtype}{want.shape})'
    return None


def open_fds():
    return len(os.listdir('/proc/self/fd'))


def client(label):
    return gpuipc.Client(label=label, probe_gpus=bool(FAKECUDA))


class Peer:
    """Another process running `suite.py role NAME ARGS`, with line-based talk over its stdin/stdout."""

    def __init__(self, role, *args, env=None, prefix=()):
        self.role = role
        self.p = subprocess.Popen([*prefix, sys.executable, __file__, 'role', role, *map(str, args)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                  env=dict(os.environ, **(env or {})))

    def expect(self, word):
        line = _readline(self.p.stdout, TIMEOUT_S)
        if line is None or not line.startswith(word):
            raise AssertionError(f'{self.role}: expected {word!r}, got {line!r}')
        return line[len(word):].strip()

    def say(self, word):
        self.p.stdin.write(word + '\n')
        self.p.stdin.flush()

    def finish(self):
        try:
            rc = self.p.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError(f'{self.role}: did not finish in {TIMEOUT_S} s') from None
        if rc != 0:
            raise AssertionError(f'{self.role}: exited with {rc}')

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def _readline(stream, timeout):
    out = []
    t = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0].rstrip('\n') if out and out[0] else None


def say(word):
    print(word, flush=True)


def hear(word):
    line = sys.stdin.readline().strip()
    if line != word:
        raise AssertionError(f'expected {word!r} on stdin, got {line!r}')


# ---- roles (run in the peer processes) ----

def role_arrays_producer():
    with client('py-arrays-producer') as c:
        made = []
        for i, dtype in enumerate(DTYPES):
            a = c.empty((4, 6), dtype, kind='memfd', framework='numpy')
            a[...] = expected_array(dtype, (4, 6), i)
            c.publish(a, f'py/{RUN}/arrays/{dtype}', retire_after=1, meta=META)
            made.append(a)
        whole = c.empty((6, 8), 'int32', kind='memfd', framework='numpy')
        whole[...] = np.arange(48, dtype=np.int32).reshape(6, 8)
        c.publish(whole[1:5, ::3], f'py/{RUN}/arrays/slice', retire_after=1)
        made.append(whole)
        say('published')
        for a in made:
            c.wait_drained(a, TIMEOUT_S * 1000)
            c.free(a)
        say('drained')


def role_c_meta_producer():
    # Metadata as a C producer (msgpack-c) may encode it: float32, fixed-width ints, str16, bin8,
    # array16, map16; plus the layout keys.
    raw = bytearray(b'\xde\x00\x09')
    raw += b'\xa5dtype\xa7float32' + b'\xa5shape\x91\x04'
    raw += b'\xa3f32\xca' + struct.pack('>f', 1.5)
    raw += b'\xa3f64\xcb' + struct.pack('>d', -0.25)
    raw += b'\xa2i8\xd0\x80' + b'\xa3u16\xcd\x12\x34'
    raw += b'\xa5str16\xda\x01\x2c' + b'x' * 300
    raw += b'\xa3bin\xc4\x03\x00\x01\x02'
    raw += b'\xa3arr\xdc\x00\x10' + bytes(range(16))
    with client('py-c-meta') as c:
        buf = c.alloc(16, 'memfd')
        c._publish_raw(buf, f'py/{RUN}/cmeta'.encode(), bytes(raw), retire_after=1)
        say('published')
        c.wait_drained(buf, TIMEOUT_S * 1000)


def role_state_dict_producer(n, versions, small_updates):
    n, versions, small_updates = int(n), int(versions), int(small_updates)
    with client('py-sd-producer') as c:
        name = f'py/{RUN}/sd'
        fds0 = open_fds()
        for v in range(1, versions + 1):
            c.publish_state_dict(make_state_dict(n, v), name, kind='memfd', meta={'step': v}, timeout_ms=30000)
        # many updates of a small dict: no buffer, fd or memory may pile up
        small = f'py/{RUN}/sd-small'
        sd = {f'p{i}': np.zeros(64, np.float32) for i in range(8)}
        c.publish_state_dict(sd, small, kind='memfd', timeout_ms=30000)
        say('small-ready')
        fds1 = None
        for v in range(2, small_updates + 2):
            if v == 4:  # both buffers exist by now
                fds1 = open_fds()
            for t in sd.values():
                t[:] = v
            c.publish_state_dict(sd, small, kind='memfd', timeout_ms=30000)
        slots = len(c._publishers[name].slots), len(c._publishers[small].slots)
        say('stats ' + json.dumps({'fds_start': fds0, 'fds_small': fds1, 'fds_end': open_fds(), 'slots': slots}))
        hear('done')
        c.unpublish_state_dict(name)
        c.unpublish_state_dict(small)


def role_holder(name):
    # Attaches, keeps a NumPy view while dropping the Attached, then drops the view.
    with client('py-holder') as c:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            a = c.attach(name, TIMEOUT_S * 1000)
            view = np.from_dlpack(a)
            total = int(view.sum())
            del a
            gc.collect()
            say(f'holding {total}')
            hear('drop')
            del view
            gc.collect()
        warned = any(issubclass(w.category, ResourceWarning) for w in caught)
        say(f'dropped {"warned" if warned else "silent"}')
        # close() releases whatever is still attached
        b = c.attach(name + '-2', TIMEOUT_S * 1000)
        say(f'attached {b.size}')
        hear('close')
    say('closed')
    hear('exit')


def role_revoked_producer(name):
    with client('py-revoked') as c:
        a = c.empty((1024,), 'uint8', kind='memfd', framework='numpy')
        a[:] = 7
        c.publish(a, name)  # not broker-held: dies with this process
        say('published')
        time.sleep(TIMEOUT_S)


def role_name_holder(name):
    with client('py-name-holder') as c:
        buf = c.alloc(64, 'memfd')
        c.publish(buf, name)
        say('published')
        hear('exit')


def role_no_cuda():
    with client('py-no-cuda') as c:
        try:
            c.alloc(4096, 'cuda-vmm', 0)
        except gpuipc.NoCuda as e:
            say(f'NoCuda {e}')
            return
        say('no-exception')


def role_fake_cuda_producer():
    with client('py-fakecuda-producer') as c:
        legacy = c.alloc(4096, 'cuda-legacy', 0)
        c.publish(legacy, f'py/{RUN}/legacy')
        on1 = c.alloc(4096, 'cuda-vmm', 1)
        c.publish(on1, f'py/{RUN}/dev1')
        on0 = c.empty((16, 16), 'bfloat16', kind='cuda-vmm', device=0, framework=None)
        c.publish(on0, f'py/{RUN}/bf16')
        say('published')
        hear('exit')


def role_fake_cuda_consumer(name, expect):
    with client('py-fakecuda-consumer') as c:
        try:
            a = c.attach(name, 5000)
        except gpuipc.Error as e:
            say(f'{type(e).__name__} {e}')
            return
        if expect == 'dlpack':
            info = dlpack.describe(a)
            cap = a.__dlpack__()
            say(f'ok {a.__dlpack_device__()} {info.dtype} {info.shape} {a.readonly} {type(cap).__name__}')
            del cap
            a.release()
            return
        say('attached')
        a.release()


ROLES = {
    'arrays-producer': role_arrays_producer, 'c-meta-producer': role_c_meta_producer,
    'sd-producer': role_state_dict_producer, 'holder': role_holder, 'revoked-producer': role_revoked_producer,
    'name-holder': role_name_holder, 'no-cuda': role_no_cuda, 'fake-cuda-producer': role_fake_cuda_producer,
    'fake-cuda-consumer': role_fake_cuda_consumer,
}


# ---- cases (run in the main process) ----

def case_installed(prefix):
    """The package and its library come from the virtual environment, not the source tree."""
    if not prefix:
        return 'not checked (run from the source tree)'
    lib = gpuipc.library_path()
    assert gpuipc.__file__.startswith(prefix), f'gpuipc imported from {gpuipc.__file__}, not from {prefix}'
    assert lib.startswith(os.path.dirname(gpuipc.__file__)), f'libgpuipc loaded from {lib}, not from the package'
    assert 'GPUIPC_LIBRARY' not in os.environ and 'LD_LIBRARY_PATH' not in os.environ
    assert gpuipc.__version__, 'no __version__'
    return f'gpuipc {gpuipc.__version__} and {os.path.basename(lib)} from the venv'


def case_api_surface(prefix):
    """Docstrings on every public name, type hints shipped (py.typed), __version__ = the wheel's."""
    import inspect
    missing = []
    for name in gpuipc.__all__:
        obj = getattr(gpuipc, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or '').strip():
            missing.append(name)
        for attr, value in vars(obj).items() if inspect.isclass(obj) else ():
            if attr.startswith('_') and attr not in ('__dlpack__', '__dlpack_device__'):
                continue
            fn = value.fget if isinstance(value, property) else value
            if (callable(fn) or isinstance(value, property)) and not (getattr(fn, '__doc__', None) or '').strip():
                missing.append(f'{name}.{attr}')
    assert not missing, f'no docstring: {missing}'
    hints = inspect.signature(gpuipc.Client.attach).return_annotation
    assert hints is not inspect.Signature.empty, 'Client.attach has no return annotation'
    assert os.path.exists(os.path.join(os.path.dirname(gpuipc.__file__), 'py.typed')), 'no py.typed'
    if prefix:
        import importlib.metadata
        assert importlib.metadata.version('gpuipc') == gpuipc.__version__, 'wheel and __version__ differ'
        assert 'msgpack' in ' '.join(importlib.metadata.requires('gpuipc') or []), 'msgpack is not a dependency'
    return f'{len(gpuipc.__all__)} public names documented, py.typed, version {gpuipc.__version__}'


def case_numpy_dlpack():
    """Every dtype as a NumPy array through np.from_dlpack, read-only, metadata exact; a strided slice."""
    peer = Peer('arrays-producer')
    try:
        peer.expect('published')
        with client('py-arrays-consumer') as c:
            for i, dtype in enumerate(DTYPES):
                with c.attach(f'py/{RUN}/arrays/{dtype}', TIMEOUT_S * 1000) as a:
                    assert a.__dlpack_device__() == (1, 0)
                    arr = a.numpy() if dtype in ('bool', 'complex64', 'float16') else np.from_dlpack(a)
                    want = expected_array(dtype, (4, 6), i)
                    assert arr.dtype == want.dtype and np.array_equal(arr, want), f'{dtype}: contents differ'
                    assert not arr.flags.writeable, f'{dtype}: a read-only buffer came out writable'
                    try:
                        arr[0, 0] = arr[0, 1]
                        raise AssertionError(f'{dtype}: writing a read-only view did not raise')
                    except ValueError:
                        pass
                    user = {k: v for k, v in a.meta.items() if k not in ('dtype', 'shape')}
                    assert same(user, META), f'{dtype}: metadata differs: {user!r}'
                    assert a.meta['dtype'] == dtype and a.meta['shape'] == [4, 6]
                    del arr
            with c.attach(f'py/{RUN}/arrays/slice', TIMEOUT_S * 1000) as a:
                got = np.from_dlpack(a)
                want = np.arange(48, dtype=np.int32).reshape(6, 8)[1:5, ::3]
                assert np.array_equal(got, want), f'slice differs: {got}'
                assert a.meta['offset'] == 32 and a.meta['strides'] == [8, 3], a.meta
                del got
        peer.expect('drained')
        peer.finish()
    finally:
        peer.kill()
    return f'{len(DTYPES)} dtypes, {len(META)} metadata keys, a strided slice'


def case_c_meta():
    """Metadata bytes as a C producer writes them decode exactly (the reference is released)."""
    peer = Peer('c-meta-producer')
    try:
        peer.expect('published')
        with client('py-c-meta-consumer') as c:
            with c.attach(f'py/{RUN}/cmeta', TIMEOUT_S * 1000) as a:
                m = a.meta
                assert same(m['f32'], 1.5) and same(m['f64'], -0.25) and same(m['i8'], -128), m
                assert m['u16'] == 0x1234 and m['str16'] == 'x' * 300 and m['bin'] == b'\x00\x01\x02', m
                assert m['arr'] == list(range(16)) and a.shape == (4,) and a.dtype == 'float32', m
        peer.finish()
    finally:
        peer.kill()
    return 'float32, float64, int8, uint16, str16, bin8, array16, map16'


def case_state_dict():
    """A 500-array state dict, then its versions: each checked, double buffered, nothing piles up."""
    n, versions, small_updates = 500, 12, 1000
    peer = Peer('sd-producer', n, versions, small_updates)
    try:
        with client('py-sd-consumer') as c:
            name = f'py/{RUN}/sd'
            t0 = time.monotonic()
            sd = c.attach_state_dict(name, framework='numpy', timeout_ms=TIMEOUT_S * 1000)
            seen = []
            while True:
                err = check_state_dict(sd, n, sd.version)
                assert err is None, err
                assert sd.meta == {'step': sd.version}, sd.meta
                seen.append(sd.version)
                if sd.version == versions:
                    break
                nxt = c.attach_state_dict(name, framework='numpy', timeout_ms=TIMEOUT_S * 1000, after=sd)
                assert nxt.version > sd.version, (nxt.version, sd.version)
                sd.release()
                sd = nxt
            sd.release()
            elapsed = time.monotonic() - t0
            assert seen == list(range(seen[0], versions + 1)), f'versions seen out of order: {seen}'
            peer.expect('small-ready')
            small = c.attach_state_dict(f'py/{RUN}/sd-small', framework='numpy', timeout_ms=TIMEOUT_S * 1000)
            first, count = small.version, 1
            while small.version < small_updates + 1:
                nxt = c.attach_state_dict(f'py/{RUN}/sd-small', framework='numpy', timeout_ms=TIMEOUT_S * 1000,
                                          after=small)
                want = float(nxt.version)
                assert all(float(t[0]) == want and float(t[-1]) == want for t in nxt.values()), \
                    f'version {nxt.version} has the wrong contents'
                small.release()
                small = nxt
                count += 1
            small.release()
            assert count == small_updates + 2 - first, f'{count} versions seen from {first}: some were skipped'
            stats = json.loads(peer.expect('stats'))
            assert stats['slots'] == [2, 2], f'the producer used {stats["slots"]} buffers, not 2 per name'
            assert stats['fds_end'] == stats['fds_small'], f'producer fds grew: {stats}'
            assert c._manifest_cache, 'manifests were not cached'
            peer.say('done')
        peer.finish()
    finally:
        peer.kill()
    return (f'{n} arrays x versions {seen[0]}..{versions} checked in {elapsed:.2f} s; small versions {first}..'
            f'{small_updates + 1} each attached and checked; producer: 2 buffers per name, fds flat ({stats["fds_small"]} -> '
            f'{stats["fds_end"]})')


def case_dropped_attached():
    """An Attached dropped unreleased is released once its last view is gone; close() releases all."""
    name = f'py/{RUN}/held'
    with client('py-held-producer') as c:
        a = c.empty((256,), 'int64', kind='memfd', framework='numpy')
        a[:] = np.arange(256)
        b = c.empty((8,), 'uint8', kind='memfd', framework='numpy')
        c.publish(a, name)
        c.publish(b, name + '-2')
        peer = Peer('holder', name)
        try:
            total = peer.expect('holding')
            assert int(total) == int(np.arange(256).sum()), total
            c.retire(a)
            time.sleep(0.3)
            assert not c.drained(a), 'released while a view of it was still alive'
            peer.say('drop')
            how = peer.expect('dropped')
            c.wait_drained(a, 10000)
            assert how == 'warned', 'no ResourceWarning for the dropped Attached'
            peer.expect('attached')
            c.retire(b)
            assert not c.drained(b)
            peer.say('close')
            peer.expect('closed')
            c.wait_drained(b, 10000)
            peer.say('exit')
            peer.finish()
        finally:
            peer.kill()
    return 'held by its view, released with a ResourceWarning when the view went; close() released the rest'


def case_dlpack_capsules():
    """The capsules: legacy and versioned, read-only flag, bfloat16 code, no leak of managed tensors."""
    with client('py-dlpack') as c:
        before = dlpack.live_count()
        buf = c.empty((3, 4), 'bfloat16', kind='memfd', framework=None)
        info = dlpack.describe(buf)
        assert info.dtype == 'bfloat16' and info.shape == (3, 4) and info.device == (1, 0), info
        legacy, versioned = buf.__dlpack__(), buf.__dlpack__(max_version=(1, 0))
        assert 'dltensor' in repr(legacy) and 'dltensor_versioned' in repr(versioned)
        del legacy, versioned
        try:
            buf.__dlpack__(copy=True)
            raise AssertionError('copy=True was accepted')
        except BufferError:
            pass
        try:
            buf.__dlpack__(dl_device=(2, 0))
            raise AssertionError('a foreign dl_device was accepted')
        except BufferError:
            pass
        v = buf.view('uint16').numpy()
        v[...] = 0x3f80  # 1.0 in bfloat16
        assert dlpack.live_count() == before, f'{dlpack.live_count() - before} managed tensors leaked'
        del v
        c.free(buf)
    return 'legacy and versioned capsules, bfloat16 = (4, 16), copy and device refused, nothing leaked'


def case_events_and_groups():
    """Subscriptions and events (iterator and asyncio), own drained events, a two-member group."""
    prefix = f'py/{RUN}/ev/'
    with client('py-events') as c, client('py-events-2') as d:
        with c.subscribe(prefix) as sub:
            buf = d.alloc(32, 'memfd')
            d.publish(buf, prefix + 'x')
            ev = c.next_event(5000)
            assert ev and ev.type == 'published' and ev.name == prefix + 'x' and sub.matches(ev), ev
            d.retire(buf)
            ev = asyncio.run(asyncio.wait_for(c.next_event_async(), 5))
            assert ev.type == 'retired' and ev.buffer == buf.id, ev
            own = d.next_event(5000)
            assert own and own.type == 'drained' and own.subscription == 0, own
            rest = list(c.events(200))
            assert all(e.type == 'drained' and e.buffer == buf.id for e in rest), rest
        # A state dict wait takes events internally: the caller's own must still reach it, in
        # order, and none of the wait's own may.
        with c.subscribe(prefix + 'u/'):
            d.publish_state_dict({'w': np.zeros(4)}, prefix + 'sd', kind='memfd')
            sd1 = c.attach_state_dict(prefix + 'sd', framework='numpy')

            def later():
                time.sleep(0.2)
                d.publish(d.alloc(8, 'memfd'), prefix + 'u/x')
                d.publish_state_dict({'w': np.ones(4)}, prefix + 'sd', kind='memfd')
            t = threading.Thread(target=later)
            t.start()
            sd2 = c.attach_state_dict(prefix + 'sd', framework='numpy', after=sd1, timeout_ms=5000)
            t.join()
            assert float(sd2['w'][0]) == 1.0
            sd1.release()
            sd2.release()
            got = [(e.type, e.name) for e in c.events(300)]
            assert got == [('published', prefix + 'u/x')], got
        joined = []
        t = threading.Thread(target=lambda: (d.group_join(prefix + 'g', 2, 5000), joined.append(1)))
        t.start()
        c.group_join(prefix + 'g', 2, 5000)
        t.join(10)
        assert joined, 'the other member did not return'
    return 'published/retired/drained events, asyncio, a state dict wait leaves the caller\'s events alone, a group of 2'


def expect_raise(cls, fn, what):
    try:
        fn()
    except cls as e:
        assert type(e) is cls, f'{what}: {type(e).__name__} instead of {cls.__name__}'
        assert str(e), f'{what}: empty message'
        return e
    except gpuipc.Error as e:
        raise AssertionError(f'{what}: {type(e).__name__} ({e}) instead of {cls.__name__}') from None
    raise AssertionError(f'{what}: no {cls.__name__} raised')


def case_exceptions():
    """Each exception class, raised where it belongs, with the broker's message."""
    done = []
    with client('py-errors') as c:
        e = expect_raise(gpuipc.NotFound, lambda: c.attach(f'py/{RUN}/absent', 0), 'attach absent')
        assert "absent" in e.detail and e.code == -1005, e.detail
        done.append('NotFound')
        e = expect_raise(gpuipc.Timeout, lambda: c.attach(f'py/{RUN}/absent', 300), 'attach absent, waiting')
        assert isinstance(e, TimeoutError)
        done.append('Timeout')
        denied = 'py/denied/' + RUN
        buf = c.alloc(16, 'memfd')
        c.publish(buf, denied)
        e = expect_raise(gpuipc.Denied, lambda: c.attach(denied, 0), 'attach a denied name')
        assert isinstance(e, PermissionError) and e.detail, e
        done.append('Denied')
        expect_raise(gpuipc.NoBroker, lambda: gpuipc.Client(socket='/nonexistent/gpuipc.sock', connect_timeout_ms=0),
                     'connect to nothing')
        done.append('NoBroker')
        expect_raise(gpuipc.InvalidArgument, lambda: c.publish(c.alloc(8, 'memfd'), 'a/../b'), 'a bad name')
        done.append('InvalidArgument')
        expect_raise(gpuipc.StateError, lambda: c.publish(buf, denied + 'x'), 'publish a live buffer again')
        done.append('StateError')
        expect_raise(gpuipc.MetadataError, lambda: c.publish(c.alloc(8, 'memfd'), f'py/{RUN}/big',
                                                             meta={'x': b'0' * 5000}), 'metadata over 4 KiB')
        done.append('MetadataError')
        taken = f'py/{RUN}/taken'
        peer = Peer('name-holder', taken)
        try:
            peer.expect('published')
            expect_raise(gpuipc.NameTaken, lambda: c.publish(c.alloc(8, 'memfd'), taken), 'publish a taken name')
            peer.say('exit')
            peer.finish()
        finally:
            peer.kill()
        done.append('NameTaken')
        revoked = f'py/{RUN}/revoked'
        peer = Peer('revoked-producer', revoked)
        try:
            peer.expect('published')
            a = c.attach(revoked, 5000)
            assert a.read(0, 4) == b'\x07' * 4
            peer.p.send_signal(signal.SIGKILL)
            peer.p.wait()
            deadline = time.monotonic() + 10
            while not a.revoked and time.monotonic() < deadline:
                time.sleep(0.02)
            expect_raise(gpuipc.Revoked, lambda: a.read(0, 4), 'read a revoked buffer')
            a.release()
        finally:
            peer.kill()
        done.append('Revoked')
    peer = Peer('no-cuda', env={'GPUIPC_LIBCUDA': '/nonexistent/gpuipc-test/libcuda.so.1'})
    try:
        assert peer.expect('NoCuda'), 'no message'
        peer.finish()
    finally:
        peer.kill()
    done.append('NoCuda')
    skipped = []
    if FAKECUDA:
        done += fake_cuda_exceptions(skipped)
    else:
        skipped.append('PidNamespace, Device (no stand-in libcuda)')
    return ', '.join(done) + (f'; skipped: {"; ".join(skipped)}' if skipped else '')


def fake_cuda_exceptions(skipped):
    """PidNamespace and Device with the stand-in libcuda, and a kDLCUDA bfloat16 capsule."""
    env2 = {'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '2'}
    done = []
    producer = Peer('fake-cuda-producer', env=env2)
    try:
        producer.expect('published')
        one_gpu = Peer('fake-cuda-consumer', f'py/{RUN}/dev1', 'error', env={**env2, 'FAKECUDA_DEVICES': '1'})
        assert one_gpu.expect('Device'), 'no message'
        one_gpu.finish()
        done.append('Device')
        dl = Peer('fake-cuda-consumer', f'py/{RUN}/bf16', 'dlpack', env=env2)
        got = dl.expect('ok')
        assert got == "(2, 0) bfloat16 (16, 16) True PyCapsule", got
        dl.finish()
        done.append('kDLCUDA capsule')
        if subprocess.run(['unshare', '--pid', '--fork', '--mount-proc', 'true'], capture_output=True).returncode:
            skipped.append('PidNamespace (unshare --pid is not permitted here)')
        else:
            other_ns = Peer('fake-cuda-consumer', f'py/{RUN}/legacy', 'error', env=env2,
                            prefix=('unshare', '--pid', '--fork', '--mount-proc', '--kill-child'))
            msg = other_ns.expect('PidNamespace')
            assert 'PID namespace' in msg, msg
            other_ns.finish()
            done.append('PidNamespace')
        producer.say('exit')
        producer.finish()
    finally:
        producer.kill()
    return done


CASES = [case_numpy_dlpack, case_c_meta, case_state_dict, case_dropped_attached, case_dlpack_capsules,
         case_events_and_groups, case_exceptions]


def main(argv):
    if len(argv) > 2 and argv[1] == 'role':
        ROLES[argv[2]](*argv[3:])
        return 0
    prefix = argv[argv.index('--installed-in') + 1] if '--installed-in' in argv else ''
    failed = 0
    t_all = time.monotonic()
    cases = [('installed', lambda: case_installed(prefix)), ('api_surface', lambda: case_api_surface(prefix))]
    for label, case in cases + [(case.__name__[len('case_'):], case) for case in CASES]:
        t0 = time.monotonic()
        try:
            note = case()
            print(f'ok    {label} ({time.monotonic() - t0:.1f} s): {note}', flush=True)
        except Exception:
            failed += 1
            print(f'FAIL  {label}:\n{traceback.format_exc()}', flush=True)
    print(f'python suite: {"passed" if not failed else f"{failed} FAILED"} in {time.monotonic() - t_all:.1f} s')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
