"""The gpuipc Python package end to end on memfd (and a stand-in CUDA), two processes at a time.

Run by test-wheel.sh with the package installed from its wheel into a fresh virtual environment,
against a broker whose policy denies attaching names under py/denied/:

    suite.py [--installed-in PREFIX]      exit 0 pass, 1 fail

Cases: NumPy arrays through DLPack (every dtype, read-only views, a strided slice), metadata of
every msgpack type round-tripped exactly (also bytes a C producer writes), a state dict of 500
arrays and its versions with double buffering (memory and fds flat across 1000 updates), a dropped
Attached releasing its reference (only once its last view is gone), Client.close() releasing
everything, events, groups, the DLPack capsules themselves, each exception class raised where it
belongs, the inspection calls (checked against `gpuipcctl --json`), the library's release checked
at load, and rings: a producer and two members in processes of their own in backpressure and
latest mode (every frame checked through NumPy when taken and again before release), a member
killed while it holds a frame, one evicted (its release raises Overwritten), iteration, asyncio
through fileno(), and the ring's errors. Peers are separate processes (`suite.py role NAME ...`),
talking over pipes. $GPUIPC_TEST_FAKECUDA names the stand-in libcuda (tests/bench/fakecuda.c) for
the CUDA cases (fences among them); $GPUIPC_CTL the gpuipcctl to compare listings with. Also attach by id.
"""
import asyncio
import ctypes
import gc
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
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

# ring frames: uint32 words, frame n = RING_BASE + n (every word depends on n)
RING_SHAPE = (64, 256)
RING_BASE = (np.arange(RING_SHAPE[0] * RING_SHAPE[1], dtype=np.uint64) * 2654435761 % 2 ** 32).astype(
    np.uint32).reshape(RING_SHAPE)

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
        self._close_pipes()
        if rc != 0:
            raise AssertionError(f'{self.role}: exited with {rc}')

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self._close_pipes()

    def _close_pipes(self):
        for pipe in (self.p.stdin, self.p.stdout):
            try:
                pipe.close()
            except OSError:
                pass  # a peer that died mid-write: nothing to flush to


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
        legacy.write(b'\x5a' * 4096)
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
        if expect == 'read':
            same = a.read(0, 4096) == bytes([0x5a]) * 4096
            say(f'attached {same} pid {os.getpid()}')
            a.release()
            return
        say('attached')
        a.release()


def role_fence_peer(name, creator):
    """Creates (or opens) a fence on the stand-in GPU and signals and reads it as told over stdin:
    `signal N` (then says `signalled N`), `read` (says `value N`), `close`, `exit`."""
    with client('py-fence-' + ('creator' if creator == '1' else 'opener')) as c:
        f = c.create_fence(name) if creator == '1' else c.open_fence(name, 5000)
        say('ready')
        for line in sys.stdin:
            word, *arg = line.split()
            if word == 'signal':
                say(f'signalled {f.signal(int(arg[0]))}')
            elif word == 'read':
                say(f'value {f.value}')
            elif word == 'close':
                f.close()
                try:
                    f.signal(1)
                except gpuipc.StateError as e:
                    say(f'closed {e}')
            elif word == 'exit':
                return


def ring_frame(n):
    return RING_BASE + np.uint32(n)


def role_ring_producer(name, mode, frames, slots, members, lease_ms):
    """Creates the ring, waits for 'go' (the members joined), publishes frames 1..frames, each filled
    whole, then closes the ring on 'close'."""
    frames = int(frames)
    with client('py-ring-producer') as c:
        ring = c.ring(name, shape=RING_SHAPE, dtype='uint32', slots=int(slots), mode=mode,
                      max_members=int(members), lease_ms=int(lease_ms), meta={'run': RUN})
        say('created')
        hear('go')
        c.process()  # seats the members that joined: every frame from now on is theirs
        t0, numbers = time.monotonic(), []
        for n in range(1, frames + 1):
            with ring.acquire(TIMEOUT_S * 1000) as frame:
                frame.numpy()[...] = ring_frame(n)
            numbers.append(frame.number)
        elapsed = time.monotonic() - t0
        assert numbers == list(range(1, frames + 1)), f'publish numbered {numbers[:5]}...'
        say(f'published {elapsed:.3f}')
        hear('close')
        ring.close()
        say('closed')


def role_ring_member(name, mode, style, frames, delay_ms):
    """Joins, takes frames (style 'iterate': for frame in ring; 'take': with ring.take(); 'async':
    async for, with a ticker that must keep running), checks each through NumPy when taken and again
    before it is released, says 'done' once it has frame `frames` (backpressure: all of them), and
    'ended' when the producer closed the ring."""
    frames, delay = int(frames), float(delay_ms) / 1000
    with client(f'py-ring-{style}') as c:
        ring = c.join_ring(name, TIMEOUT_S * 1000)
        assert (ring.shape, ring.dtype, ring.meta, ring.mode) == (RING_SHAPE, 'uint32', {'run': RUN}, mode), ring
        say('joined')
        seen, bad, done = [], [], []

        def check(frame):
            # NumPy's own DLPack import, or gpuipc's (which maps writable frames writable)
            a = frame.numpy() if style == 'take' else np.from_dlpack(frame)
            if a.flags.writeable or not frame.readonly or not np.array_equal(a, ring_frame(frame.number)):
                bad.append(f'{frame.number} when taken')
            if delay:
                time.sleep(delay)
            if not np.array_equal(a, ring_frame(frame.number)):
                bad.append(f'{frame.number} changed while held')
            seen.append(frame.number)
            if frame.number == frames and not done:
                done.append(1)
                say('done ' + json.dumps({'seen': len(seen), 'first': seen[0], 'last': seen[-1], 'bad': bad,
                                          'in_order': seen == sorted(set(seen)),
                                          'consecutive': seen == list(range(seen[0], seen[-1] + 1))}))

        ticks = {'before_first': None, 'all': 0}
        if style == 'iterate':
            for frame in ring:
                check(frame)
        elif style == 'take':
            while True:
                try:
                    with ring.take(TIMEOUT_S * 1000) as frame:
                        check(frame)
                except gpuipc.RingClosed:
                    break
        else:
            async def run():
                async def ticker():
                    while True:
                        await asyncio.sleep(0.005)
                        ticks['all'] += 1
                tick = asyncio.create_task(ticker())
                async for frame in ring:
                    if ticks['before_first'] is None:
                        ticks['before_first'] = ticks['all']
                    check(frame)
                tick.cancel()
            asyncio.run(run())
        ring.close()
        say('ended ' + json.dumps({'seen': len(seen), 'ticks_before_first': ticks['before_first']}))


def role_ring_holder(name, then):
    """Takes frame 1 and holds it: 'kill' waits to be killed; 'stall' waits for 'check', then releases
    (which must raise Overwritten: it was evicted meanwhile) and takes again (Revoked, not RingClosed)."""
    with client('py-ring-holder') as c:
        ring = c.join_ring(name, TIMEOUT_S * 1000)
        say('joined')
        frame = ring.take(TIMEOUT_S * 1000)
        a = np.from_dlpack(frame)
        intact = frame.number == 1 and np.array_equal(a, ring_frame(1))
        say(f'holding {intact}')
        if then == 'kill':
            time.sleep(TIMEOUT_S)
            return
        hear('check')
        rewritten = not np.array_equal(a, ring_frame(1))
        del a
        try:
            frame.release()
            released = 'no exception'
        except gpuipc.Error as e:
            released = f'{type(e).__name__} {e.name} {isinstance(e, gpuipc.Revoked)}'
        try:
            ring.take(2000)
            again = 'no exception'
        except gpuipc.Error as e:
            again = type(e).__name__
        say('result ' + json.dumps({'rewritten': rewritten, 'release': released, 'take': again}))
        ring.close()


def role_ring_doomed_producer(name):
    with client('py-ring-doomed') as c:
        ring = c.ring(name, slot_size=64, slots=2, max_members=1)
        say('created')
        hear('go')
        c.process()
        ring.put(np.arange(64, dtype=np.uint8))
        say('published')
        time.sleep(TIMEOUT_S)


STREAM_WORDS = 1024  # a stream ring's frame: uint32[1024], frame n = n * 65536 + index


def stream_frame(n):
    return (np.arange(STREAM_WORDS, dtype=np.uint32) + np.uint32(n * 65536))


class FakeStreams:
    """Streams and asynchronous copies of the stand-in libcuda (a worker thread per stream), the same
    library libgpuipc loaded through $GPUIPC_LIBCUDA."""

    def __init__(self):
        self.cu = ctypes.CDLL(FAKECUDA)
        self.cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.cu.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]

    def new(self):
        s = ctypes.c_void_p()
        assert self.cu.cuStreamCreate(ctypes.byref(s), 0) == 0
        return s.value

    def to_device(self, ptr, array, stream):
        assert self.cu.cuMemcpyHtoDAsync_v2(ptr, array.ctypes.data, array.nbytes, stream) == 0

    def to_host(self, array, ptr, stream):
        assert self.cu.cuMemcpyDtoHAsync_v2(array.ctypes.data, ptr, array.nbytes, stream) == 0

    def sync(self, stream):
        assert self.cu.cuStreamSynchronize(stream) == 0


def role_stream_producer(name, frames):
    """A stream ring: each frame written by an asynchronous copy in the producer's stream, published in
    that stream; the host never waits for a member."""
    frames = int(frames)
    fake = FakeStreams()
    with gpuipc.Client(label='py-stream-producer') as c:
        ring = c.ring(name, shape=(STREAM_WORDS,), dtype='uint32', mode='stream', slots=3, max_members=2,
                      lease_ms=30000)
        assert ring.kind == 'cuda-vmm', ring.kind
        say('created')
        hear('go')
        c.process()
        stream = fake.new()
        try:
            ring.put(stream_frame(0), stream=stream)
            raise AssertionError('put() of a NumPy array into a stream ring was accepted')
        except TypeError:
            pass  # a host copy would not wait in the stream
        sources = [stream_frame(n) for n in range(1, frames + 1)]  # alive until the stream copied them
        numbers = []
        for n in range(1, frames + 1):
            frame = ring.acquire(stream=stream)
            fake.to_device(frame.memory.ptr, sources[n - 1], stream)
            numbers.append(ring.publish())  # in the stream it was acquired in
        fake.sync(stream)
        assert numbers == list(range(1, frames + 1)), numbers[:5]
        say('published')
        hear('close')
        ring.close()
        say('closed')


def role_stream_member(name, frames, hold_every):
    """Takes every frame in its own stream, copies it out when taken and again after the host paused
    (the frame is still held in stream order: the producer's stream must wait), releases it in the
    stream; checks every copy once at the end."""
    frames, hold_every = int(frames), int(hold_every)
    fake = FakeStreams()
    with gpuipc.Client(label='py-stream-member') as c:
        ring = c.join_ring(name, TIMEOUT_S * 1000)
        assert (ring.mode, ring.shape, ring.dtype) == ('stream', (STREAM_WORDS,), 'uint32'), ring
        say('joined')
        stream = fake.new()
        at_take = np.zeros((frames, STREAM_WORDS), np.uint32)
        after_hold = np.zeros_like(at_take)
        numbers, notes = [], []
        for i in range(frames):
            frame = ring.take(TIMEOUT_S * 1000, stream=stream)
            numbers.append(frame.number)
            if i == 0:
                notes.append(f'device {frame.__dlpack_device__()}')
                frame.__dlpack__(stream=stream)  # the frame's own stream: nothing to order
                try:
                    frame.__dlpack__(stream=fake.new())
                    notes.append('another stream accepted without torch or CuPy')
                except BufferError:
                    pass
            fake.to_host(at_take[i], frame.memory.ptr, stream)
            if hold_every and i % hold_every == 0:
                time.sleep(0.002)
            fake.to_host(after_hold[i], frame.memory.ptr, stream)
            frame.release()
        fake.sync(stream)
        bad = [n for n, a, b in zip(numbers, at_take, after_hold)
               if not (np.array_equal(a, stream_frame(n)) and np.array_equal(b, stream_frame(n)))]
        say('result ' + json.dumps({'in_order': numbers == list(range(1, frames + 1)), 'bad': bad[:10],
                                    'notes': notes}))
        hear('exit')
        ring.close()


def role_gpus_peer():
    with gpuipc.Client(label='py-gpus-peer', probe_gpus=True) as c:
        info = c.connection_info()
        say('peer ' + json.dumps({'peer': info.peer, 'gpus': list(info.gpus)}))
        hear('exit')


ROLES = {
    'ring-producer': role_ring_producer, 'ring-member': role_ring_member, 'ring-holder': role_ring_holder,
    'ring-doomed-producer': role_ring_doomed_producer, 'gpus-peer': role_gpus_peer,
    'stream-producer': role_stream_producer, 'stream-member': role_stream_member,
    'arrays-producer': role_arrays_producer, 'c-meta-producer': role_c_meta_producer,
    'sd-producer': role_state_dict_producer, 'holder': role_holder, 'revoked-producer': role_revoked_producer,
    'name-holder': role_name_holder, 'no-cuda': role_no_cuda, 'fake-cuda-producer': role_fake_cuda_producer,
    'fake-cuda-consumer': role_fake_cuda_consumer, 'fence-peer': role_fence_peer,
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
            assert c._sd_caches.manifests, 'manifests were not cached'
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
        skipped.append('SamePid, Device (no stand-in libcuda)')
    return ', '.join(done) + (f'; skipped: {"; ".join(skipped)}' if skipped else '')


# A process as the first of a PID namespace of its own (a container's main process), and as the
# second (the first is a shell that waits for it: "$@" is not the shell's last command, so it forks).
AS_PID_1 = ('unshare', '--pid', '--fork', '--mount-proc', '--kill-child')
AS_PID_2 = AS_PID_1 + ('sh', '-c', '"$@"; exit $?', 'sh')


def fake_cuda_exceptions(skipped):
    """SamePid, Device and a kDLCUDA bfloat16 capsule with the stand-in libcuda (which opens legacy
    handles as the driver was measured to: across PID namespaces, unless the PIDs are equal)."""
    env2 = {'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '2'}
    done = []
    namespaces = subprocess.run([*AS_PID_1, 'true'], capture_output=True).returncode == 0
    producer = Peer('fake-cuda-producer', env=env2, prefix=AS_PID_1 if namespaces else ())
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
        if not namespaces:
            skipped.append('SamePid (unshare --pid is not permitted here)')
        else:
            # Both PID 1 of their namespaces: refused before CUDA runs, naming the PID.
            both_one = Peer('fake-cuda-consumer', f'py/{RUN}/legacy', 'error', env=env2, prefix=AS_PID_1)
            msg = both_one.expect('SamePid')
            assert 'both PID 1' in msg and 'gpuipcctl run' in msg, msg
            both_one.finish()
            done.append('SamePid')
            # PID 2 of another namespace: the handle opens and the bytes are the producer's.
            pid_two = Peer('fake-cuda-consumer', f'py/{RUN}/legacy', 'read', env=env2, prefix=AS_PID_2)
            got = pid_two.expect('attached')
            assert got == 'True pid 2', got
            pid_two.finish()
            done.append('cuda-legacy between PID 1 and PID 2 of sibling namespaces')
        producer.say('exit')
        producer.finish()
    finally:
        producer.kill()
    return done


def case_attach_id():
    """A buffer attached by the id its producer passed along (as pipelines do), the same memory as
    by name; an id nobody registered is NotFound, and a released handle is closed."""
    data = np.arange(4096, dtype=np.uint8)
    with client('py-by-id-producer') as p, client('py-by-id-consumer') as c:
        b = p.empty((4096,), 'uint8', kind='memfd', framework=None)
        b.write(data)
        p.publish(b, f'py/{RUN}/by-id')
        a = c.attach_id(b.id)
        assert a.id == b.id and a.name == f'py/{RUN}/by-id', (a.id, b.id, a.name)
        assert (a.numpy() == data).all(), 'attach_id mapped other bytes'
        by_name = c.attach(f'py/{RUN}/by-id', 5000)
        assert by_name.id == a.id
        by_name.release()
        a.release()
        expect_raise(gpuipc.NotFound, lambda: c.attach_id(b.id + 1000003), 'an id nobody registered')
        expect_raise(gpuipc.NotFound, lambda: c.attach_id(0), 'id 0')
    return 'attached by id and by name alike; unknown ids are NotFound'


def case_fences():
    """A fence between two processes on the stand-in libcuda: the creator's signal is what the
    opener reads, the opener's signal what the creator reads, values only grow, and a closed fence
    refuses to be used."""
    if not FAKECUDA:
        return 'skipped: no stand-in libcuda'
    env = {'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '1'}
    name = f'py/{RUN}/fence'
    creator = Peer('fence-peer', name, 1, env=env)
    opener = None
    try:
        creator.expect('ready')
        opener = Peer('fence-peer', name, 0, env=env)
        opener.expect('ready')

        def value_of(peer, want):
            for _ in range(200):
                peer.say('read')
                got = int(peer.expect('value'))
                if got == want:
                    return got
                time.sleep(0.01)
            raise AssertionError(f'{peer.role}: the fence reads {got}, not {want}')

        creator.say('signal 5')
        assert creator.expect('signalled') == '5'
        value_of(opener, 5)
        opener.say('signal 9')
        assert opener.expect('signalled') == '9'
        value_of(creator, 9)
        opener.say('close')
        assert 'closed' in opener.expect('closed')
        for peer in (opener, creator):
            peer.say('exit')
            peer.finish()
    finally:
        for peer in (creator, opener):
            if peer:
                peer.kill()
    return 'signals read across processes both ways (5, then 9); a closed fence raises StateError'


def ring_members_done(members):
    """Each member's 'done' report, then its 'ended' report once the producer closed the ring."""
    return [json.loads(m.expect('done')) for m in members]


def run_ring(mode, frames, slots, member_specs, lease_ms=20000):
    """A producer and members (style, delay_ms) in processes of their own: returns (the producer's
    publish time, each member's 'done' report, each member's 'ended' report)."""
    name = f'py/{RUN}/ring/{mode}'
    producer = Peer('ring-producer', name, mode, frames, slots, len(member_specs), lease_ms)
    members = []
    try:
        producer.expect('created')
        members = [Peer('ring-member', name, mode, style, frames, delay) for style, delay in member_specs]
        for m in members:
            m.expect('joined')
        time.sleep(0.2)  # members wait for frames meanwhile (the async one must keep its loop running)
        producer.say('go')
        done = ring_members_done(members)
        elapsed = float(producer.expect('published'))
        producer.say('close')
        producer.expect('closed')
        ended = [json.loads(m.expect('ended')) for m in members]
        for peer in [producer] + members:
            peer.finish()
        return elapsed, done, ended
    finally:
        for peer in [producer] + members:
            peer.kill()


def case_ring_backpressure():
    """Backpressure: two members (iterating; async for through fileno()) each get every frame, in
    order, intact when taken and unchanged until released; the ring's close ends both loops."""
    frames = 600
    elapsed, done, ended = run_ring('backpressure', frames, 4, [('iterate', 0), ('async', 0)])
    for style, d, e in zip(('iterate', 'async'), done, ended):
        assert d['bad'] == [], f'{style}: frames wrong: {d["bad"][:5]}'
        assert d['seen'] == frames and d['first'] == 1 and d['consecutive'], f'{style}: {d}'
        assert e['seen'] == frames, f'{style}: took {e["seen"]} frames in all, not {frames}'
    assert ended[1]['ticks_before_first'] >= 5, f'the asyncio loop was blocked while waiting: {ended[1]}'
    return (f'{frames} frames of {RING_BASE.nbytes // 1024} KiB to 2 members ({frames / elapsed:.0f} frames/s), '
            f'every frame checked twice; asyncio loop ticked {ended[1]["ticks_before_first"]} times while waiting')


def case_ring_latest():
    """Latest: the producer never waits; a slow member skips frames, a fast one may; both see only
    newer frames, intact, and the last one."""
    frames = 300
    elapsed, done, ended = run_ring('latest', frames, 4, [('take', 3), ('iterate', 0)])
    for style, d in zip(('take (slow)', 'iterate'), done):
        assert d['bad'] == [], f'{style}: frames wrong: {d["bad"][:5]}'
        assert d['in_order'] and d['last'] == frames, f'{style}: {d}'
    slow = done[0]
    assert slow['seen'] < frames, f'the slow member skipped nothing: {slow}'
    return (f'{frames} frames published in {elapsed * 1000:.0f} ms; the slow member took {slow["seen"]}, the fast '
            f'one {done[1]["seen"]}, each in order, intact, the last included')


def case_ring_member_killed():
    """A member killed while it holds a frame frees its seat at once (well within the lease): the
    producer goes on and the other member still gets every frame."""
    name, frames, lease_ms = f'py/{RUN}/ring/killed', 20, 10000
    producer = Peer('ring-producer', name, 'backpressure', frames, 2, 2, lease_ms)
    peers = [producer]
    try:
        producer.expect('created')
        holder = Peer('ring-holder', name, 'kill')
        member = Peer('ring-member', name, 'backpressure', 'iterate', frames, 0)
        peers += [holder, member]
        holder.expect('joined')
        member.expect('joined')
        producer.say('go')
        assert holder.expect('holding') == 'True', 'the holder got a wrong frame 1'
        t0 = time.monotonic()
        holder.p.send_signal(signal.SIGKILL)
        holder.p.wait()
        producer.expect('published')
        freed_s = time.monotonic() - t0
        d = json.loads(member.expect('done'))
        assert d['bad'] == [] and d['seen'] == frames and d['consecutive'], d
        assert freed_s < lease_ms / 2000, f'the producer waited {freed_s:.1f} s: the seat was not freed at the death'
        producer.say('close')
        producer.expect('closed')
        member.expect('ended')
        producer.finish()
        member.finish()
    finally:
        for peer in peers:
            peer.kill()
    return f'the producer went on {freed_s * 1000:.0f} ms after the kill (lease {lease_ms} ms); {frames} frames intact'


def case_ring_evicted():
    """A member that holds a backpressure ring up past the lease is evicted: its frame is rewritten,
    and its release says so (Overwritten, a Revoked), its next take too (Revoked)."""
    name, lease_ms = f'py/{RUN}/ring/evicted', 300
    producer = Peer('ring-producer', name, 'backpressure', 4, 2, 1, lease_ms)
    peers = [producer]
    try:
        producer.expect('created')
        holder = Peer('ring-holder', name, 'stall')
        peers.append(holder)
        holder.expect('joined')
        producer.say('go')
        assert holder.expect('holding') == 'True'
        waited = float(producer.expect('published'))
        holder.say('check')
        result = json.loads(holder.expect('result'))
        assert result == {'rewritten': True, 'release': 'Overwritten revoked True', 'take': 'Revoked'}, result
        assert waited >= lease_ms / 1000 * 0.9, f'the producer did not wait for the lease: {waited:.3f} s'
        producer.say('close')
        producer.expect('closed')
        holder.finish()
        producer.finish()
    finally:
        for peer in peers:
            peer.kill()
    return f'evicted after the {lease_ms} ms lease (the producer waited {waited * 1000:.0f} ms); Overwritten, then Revoked'


def case_ring_errors():
    """The ring's errors, each as its class: no such ring, a taken name, no free seat, a bad geometry,
    a frame held twice, a side's call on the other side, a stream on a host ring, a frame used after
    release, the producer killed."""
    done = []
    base = f'py/{RUN}/ring/err'
    with client('py-ring-err-a') as a, client('py-ring-err-b') as b, client('py-ring-err-c') as c3:
        e = expect_raise(gpuipc.NotFound, lambda: b.join_ring(base + '/absent', 0), 'join an absent ring')
        assert e.name == 'not-found', e.name
        expect_raise(gpuipc.Timeout, lambda: b.join_ring(base + '/absent', 300), 'join an absent ring, waiting')
        done.append('NotFound/Timeout')
        ring = a.ring(base + '/x', slot_size=256, slots=2, max_members=1)
        expect_raise(gpuipc.NameTaken, lambda: b.ring(base + '/x', slot_size=256), 'a second producer')
        done.append('NameTaken')
        member = b.join_ring(base + '/x', 2000)
        expect_raise(gpuipc.Quota, lambda: c3.join_ring(base + '/x', 2000), 'every seat taken')
        done.append('Quota')
        expect_raise(gpuipc.InvalidArgument, lambda: a.ring(base + '/y', slot_size=8, slots=2, mode='latest'),
                     'latest with slots < members + 2')
        for bad in (dict(), dict(slot_size=0), dict(shape=(4,), slot_size=3), dict(slot_size=8, mode='fast'),
                    dict(slot_size=8, kind='cuda-legacy'), dict(slot_size=8, slots=0)):
            try:
                a.ring(base + '/z', **bad)
                raise AssertionError(f'ring({bad}) was accepted')
            except ValueError:
                pass
        assert not [x for x in a.buffers(base + '/y') + a.buffers(base + '/z')], 'a refused ring left buffers'
        done.append('InvalidArgument/ValueError')
        for fn, what in ((lambda: member.acquire(0), 'acquire on a member'), (lambda: ring.take(0), 'take on a producer'),
                         (lambda: ring.fileno(), 'fileno on a producer')):
            try:
                fn()
                raise AssertionError(f'{what} was accepted')
            except TypeError:
                pass
        done.append('TypeError')
        try:
            ring.acquire(0, stream=0)
            raise AssertionError('a stream on a host ring was accepted')
        except ValueError:
            pass
        a.process()
        ring.put(np.full(256, 7, np.uint8))
        ring.put(np.full(256, 8, np.uint8))
        frame = member.take(2000)
        assert frame.number == 1 and frame.read(0, 4) == b'\x07' * 4, frame
        expect_raise(gpuipc.StateError, lambda: member.take(0), 'take while holding')
        frame.release()
        expect_raise(gpuipc.StateError, lambda: np.from_dlpack(frame), 'a frame used after release')
        frame.release()  # idempotent
        done.append('StateError')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            frame = member.take(2000)
            assert frame.number == 2, frame
            del frame  # dropped while held: released by the garbage collector
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught), 'no ResourceWarning for a dropped frame'
        ring.put(np.full(256, 9, np.uint8))
        with member.take(2000) as frame:
            assert frame.number == 3 and frame.read(0, 1) == b'\x09', frame
        assert list(member.frames(timeout_ms=100)) == [], 'frames() did not stop after a quiet spell'
        done.append('a dropped frame released (ResourceWarning)')
        if not gpuipc._lib.has('gpuipc_ring_stream_acquire'):
            expect_raise(gpuipc.KindError, lambda: a.ring(base + '/s', slot_size=8, mode='stream'),
                         'a stream ring without the stream calls')
            done.append('KindError (no stream rings in this libgpuipc)')
        member.close()
        ring.close()
        assert ring.closed and member.closed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            dropped = a.ring(base + '/dropped', slot_size=8, slots=2, max_members=1)
            del dropped
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught), 'no ResourceWarning for a dropped ring'
        again = b.ring(base + '/dropped', slot_size=8, slots=2, max_members=1)  # the name is free again
        again.close()
        expect_raise(gpuipc.StateError, lambda: ring.put(b'x'), 'a closed ring')
        left = [x.name for x in a.buffers(base + '/x') if x.state == 'live']
        assert not left, f'a closed ring left live buffers: {left}'
    name = base + '/doomed'
    producer = Peer('ring-doomed-producer', name)
    try:
        producer.expect('created')
        with client('py-ring-err-d') as d:
            ring = d.join_ring(name, 2000)
            assert ring.shape is None and ring.dtype == 'uint8' and ring.slot_size == 64, ring
            producer.say('go')
            producer.expect('published')
            with ring.take(2000) as frame:
                assert np.array_equal(frame.numpy(), np.arange(64, dtype=np.uint8))
            producer.p.send_signal(signal.SIGKILL)
            producer.p.wait()
            e = expect_raise(gpuipc.Revoked, lambda: ring.take(5000), 'take after the producer died')
            ring.close()
    finally:
        producer.kill()
    done.append('Revoked')
    return ', '.join(done)


def case_c_ring():
    """A ring made without gpuipc's metadata (as a C producer makes it) gives frames of bytes; a
    NAME@meta of someone else's is refused."""
    name = f'py/{RUN}/ring/c'
    with client('py-cring-a') as a, client('py-cring-b') as b, client('py-cring-c') as c3:
        h = ctypes.c_void_p()
        opts = gpuipc._lib.RingOptions(ctypes.sizeof(gpuipc._lib.RingOptions), 1, 100, 2, 2, 0, 0, 0)
        with a._locked():
            a._check(a._lib.gpuipc_ring_create(a._c, name.encode(), ctypes.byref(opts), ctypes.byref(h)), 'create')
        try:
            ring = b.join_ring(name, 2000)
            assert (ring.shape, ring.dtype, ring.mode, ring.slot_size, ring.meta) == (None, 'uint8', None, None, {})
            a.process()
            slot = ctypes.c_void_p()
            with a._locked():
                a._check(a._lib.gpuipc_ring_acquire(h, 1000, ctypes.byref(slot)), 'acquire')
                ctypes.memmove(a._lib.gpuipc_buffer_ptr(slot), bytes(range(100)), 100)
                a._check(a._lib.gpuipc_ring_publish(h, None), 'publish')
            with ring.take(2000) as frame:
                assert frame.shape == (100,) and bytes(frame.numpy()) == bytes(range(100)), frame
            assert ring.slot_size == 100 and ring.kind == 'memfd'
            ring.close()
            impostor = c3.alloc(1, 'memfd')
            c3._publish_raw(impostor, (name + '@meta').encode(),
                            gpuipc.meta.pack({}, {'dtype': 'float64', 'shape': [1000], 'ring': {'mode': 'latest'}}))
            e = expect_raise(gpuipc.MetadataError, lambda: b.join_ring(name, 2000), 'a NAME@meta of another peer')
            assert 'not its producer' in str(e), e
            c3.free(impostor)
            # the refused join gave its seat back: both seats are free again once the producer has
            # given the seats new pages (at its next call: here an idle producer reads its events)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                a.process()
                try:
                    rings = [b.join_ring(name, 0)]
                    break
                except (gpuipc.Timeout, gpuipc.NotFound):
                    time.sleep(0.01)
            rings.append(c3.join_ring(name, 2000))
            for r in rings:
                r.close()
        finally:
            with a._locked():
                a._lib.gpuipc_ring_close(h)
    return 'frames of the slot\'s bytes without NAME@meta; an impostor NAME@meta refused, the seat given back'


def case_stream_ring():
    """The stream-ordered ring through the stand-in libcuda (streams are worker threads there): a
    producer and two members (one pausing while it holds frames) in processes of their own, every
    frame copied out in the member's stream when taken and again before release, and checked."""
    if not gpuipc._lib.has('gpuipc_ring_stream_acquire'):
        return f'skipped: libgpuipc {gpuipc.library_version()} has no stream-ordered rings'
    if not FAKECUDA:
        return 'skipped: no stand-in libcuda'
    name, frames = f'py/{RUN}/ring/stream', 200
    env = {'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '1'}
    producer = Peer('stream-producer', name, frames, env=env)
    members = []
    try:
        producer.expect('created')
        members = [Peer('stream-member', name, frames, hold, env=env) for hold in (0, 10)]
        for m in members:
            m.expect('joined')
        producer.say('go')
        results = [json.loads(m.expect('result')) for m in members]
        producer.expect('published')
        for i, r in enumerate(results):
            assert r['in_order'] and not r['bad'], f'member {i}: {r}'
            assert r['notes'] == ['device (2, 0)'], f'member {i}: {r["notes"]}'
        for m in members:
            m.say('exit')
            m.finish()
        producer.say('close')
        producer.expect('closed')
        producer.finish()
    finally:
        for peer in [producer] + members:
            peer.kill()
    return f'{frames} frames to 2 members in stream order, each checked when taken and after being held'


def start_broker(sock, log):
    broker = subprocess.Popen([os.environ['GPUIPC_BROKER'], '--socket', sock, '--log-level', 'warn',
                               '--restart-grace-ms', '2000'], stderr=log)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.02)
    return broker


def case_ring_broker_restart():
    """A ring through a broker restart (SIGKILL, a new broker on the same socket), reconnect on:
    frames keep flowing, and a member that joins afterwards still reads NAME@meta as the ring's."""
    if not os.environ.get('GPUIPC_BROKER'):
        return 'skipped (no GPUIPC_BROKER)'
    name = f'py/{RUN}/ring/restart'
    with tempfile.TemporaryDirectory() as tmp:
        sock, log = os.path.join(tmp, 's.sock'), open(os.path.join(tmp, 'broker.log'), 'w')
        broker = start_broker(sock, log)
        try:
            opts = dict(socket=sock, reconnect=True, probe_gpus=False)
            with gpuipc.Client(label='py-restart-p', **opts) as p, gpuipc.Client(label='py-restart-m', **opts) as m, \
                    gpuipc.Client(label='py-restart-late', **opts) as late:
                ring = p.ring(name, shape=(512,), dtype='int64', slots=4, max_members=2, meta={'v': 1})
                member = m.join_ring(name, 2000)
                p.process()

                def flow(first, last, members):
                    for n in range(first, last + 1):
                        ring.put(np.arange(512, dtype=np.int64) * n)
                        for r in members:
                            with r.take(5000) as frame:
                                assert frame.number == n and np.array_equal(frame.numpy(), np.arange(512) * n), n
                flow(1, 10, [member])
                epoch = p.connection_info().epoch
                broker.kill()
                broker.wait()
                flow(11, 20, [member])  # shared memory alone: the broker is not needed for frames
                broker = start_broker(sock, log)
                p.ping(10000)  # reconnects: registers the ring, its parts and NAME@meta again
                assert p.connection_info().epoch != epoch, 'no new broker instance'
                flow(21, 30, [member])
                joined = late.join_ring(name, 5000)  # NAME@meta and the control page: the same owner
                assert (joined.shape, joined.dtype, joined.meta) == ((512,), 'int64', {'v': 1}), joined
                p.process()
                flow(31, 40, [member, joined])
                joined.close()
                member.close()
                ring.close()
        finally:
            broker.kill()
            broker.wait()
            log.close()
    return '40 frames, 10 of them while no broker ran; a member joined after the restart read NAME@meta'


def case_reconnect_default():
    """A Client made without reconnect= survives a broker restart (its buffer is published again,
    a holder's reference reclaimed, its mapping unchanged); Client(reconnect=False) raises
    Disconnected instead."""
    if not os.environ.get('GPUIPC_BROKER'):
        return 'skipped (no GPUIPC_BROKER)'
    name = f'py/{RUN}/reconnect/default'
    with tempfile.TemporaryDirectory() as tmp:
        sock, log = os.path.join(tmp, 's.sock'), open(os.path.join(tmp, 'broker.log'), 'w')
        broker = start_broker(sock, log)
        try:
            with gpuipc.Client(socket=sock, label='py-default-p', probe_gpus=False) as p, \
                    gpuipc.Client(socket=sock, label='py-default-c', probe_gpus=False) as c, \
                    gpuipc.Client(socket=sock, label='py-plain', probe_gpus=False, reconnect=False) as plain:
                buf = p.alloc(4096, 'memfd')
                buf.write(b'\x07' * 4096)
                p.publish(buf, name)
                held = c.attach(name)
                broker.kill()
                broker.wait()
                broker = start_broker(sock, log)
                p.ping(10000)
                c.ping(10000)
                assert [b.name for b in c.buffers(name)] == [name], 'the buffer was not published again'
                assert c.stat(name).refs == 1, 'the reference was not reclaimed'
                assert held.read() == b'\x07' * 4096, 'the mapping changed'
                try:
                    plain.ping(1000)
                    raise AssertionError('a Client(reconnect=False) reconnected')
                except gpuipc.Disconnected:
                    pass
                held.release()
        finally:
            broker.kill()
            broker.wait()
            log.close()
    return 'a default Client came through a broker SIGKILL; reconnect=False raised Disconnected'


def ctl_json(*args):
    out = subprocess.run([os.environ['GPUIPC_CTL'], '--json', *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f'gpuipcctl {" ".join(args)}: {out.stderr}'
    return json.loads(out.stdout)


def case_inspection():
    """buffers(), stat() with holders, peers(), stats(), retire_id(), connection_info(): the same
    records gpuipcctl --json prints (it reads them through the same C calls); error names."""
    if not os.environ.get('GPUIPC_CTL'):
        return 'skipped (no GPUIPC_CTL)'
    prefix = f'py/{RUN}/insp/'
    with client('py-insp-a') as a, client('py-insp-b') as b:
        bufs = []
        for i in range(3):
            buf = a.alloc(1000 + i, 'memfd')
            a.publish(buf, f'{prefix}{i}', writable=bool(i % 2))
            bufs.append(buf)
        held = b.attach(prefix + '1')
        listed = a.buffers(prefix)
        assert [x.name for x in listed] == [f'{prefix}{i}' for i in range(3)], 'not in the order registered'
        assert [x.id for x in listed] == [x['buffer'] for x in ctl_json('ls', '--prefix', prefix)]
        me, other = a.connection_info(), b.connection_info()
        assert me.peer != other.peer and me.connected and me.socket_path == os.environ['GPUIPC_SOCKET'], me
        for x in listed:
            want = ctl_json('stat', x.name)['buffer']
            got = {'buffer': x.id, 'name': x.name, 'generation': x.generation, 'kind': x.kind, 'size': x.size,
                   'state': x.state, 'refs': x.refs, 'holders': x.holders, 'owner': x.owner, 'uid': x.uid,
                   'pid': x.pid, 'device': x.device, 'writable': x.writable, 'broker_held': x.broker_held}
            assert got == want, f'{x.name}: {got} != gpuipcctl {want}'
            assert x.owner == me.peer and x.pid == os.getpid()
        st = a.stat(prefix + '1')
        assert st.refs == 1 and st.holders == 1 and st.held_by == (gpuipc.HolderInfo(other.peer, os.getpid(),
                                                                                     os.getuid(), 1),), st
        assert a.stat(buffer_id=st.id).name == st.name
        expect_raise(gpuipc.NotFound, lambda: a.stat(prefix + 'absent'), 'stat an absent name')
        peers = {p.peer: p for p in a.peers()}
        want = {p['peer']: p for p in ctl_json('peers')}
        for p in (me.peer, other.peer):
            got = dataclass_dict(peers[p])
            assert got == want[p], f'peer {p}: {got} != gpuipcctl {want[p]}'
        assert peers[me.peer].label == 'py-insp-a' and peers[me.peer].buffers >= 3
        stats = a.stats()
        names = {x.name for x in stats}
        ctl_stats = ctl_json('stats')
        scalar = {k for k, v in ctl_stats.items() if isinstance(v, int)}
        assert scalar <= names, f'stats missing {scalar - names}'
        assert any(x.name.endswith('_bucket') and x.le_us for x in stats), 'no histogram buckets'
        a.retire_id(bufs[2].id)
        assert a.stat(buffer_id=bufs[2].id).state in ('retired', 'idle')
        b.retire_id(bufs[1].id)  # another peer's: the policy's `allow all` makes b an administrator
        assert a.stat(buffer_id=bufs[1].id).state == 'retired', 'retired while held: not drained yet'
        e = expect_raise(gpuipc.NotFound, lambda: b.retire_id(2 ** 52 + 12345), 'retire an unknown id')
        assert e.name == 'not-found' and e.code == -1005, (e.name, e.code)
        held.release()
        gpus = 'not checked (no stand-in libcuda)'
        if FAKECUDA:
            peer = Peer('gpus-peer', env={'GPUIPC_LIBCUDA': FAKECUDA, 'FAKECUDA_DEVICES': '2'})
            try:
                info = json.loads(peer.expect('peer'))
                got = {p.peer: p for p in a.peers()}[info['peer']]
                assert len(info['gpus']) == 2 and list(got.gpus) == info['gpus'], (got, info)
                assert {p['peer']: p for p in ctl_json('peers')}[info['peer']] == dataclass_dict(got)
                peer.say('exit')
                peer.finish()
            finally:
                peer.kill()
            gpus = f'{len(info["gpus"])} declared GPUs read back'
    return f'{len(listed)} buffers, 2 peers and {len(scalar)} counters as gpuipcctl shows them; holders; {gpus}'


def dataclass_dict(peer):
    import dataclasses
    d = dataclasses.asdict(peer)
    d['gpus'] = list(d['gpus'])
    return d


def case_library_release():
    """A libgpuipc of another release is refused at load, naming both versions."""
    assert gpuipc._lib.compatible('0.1.7', '0.1.0') and not gpuipc._lib.compatible('0.2.0', '0.1.0')
    assert gpuipc.library_version() == gpuipc.__version__
    cc = shutil.which('cc') or shutil.which('gcc')
    if not cc:
        return 'compatible() only (no C compiler for a stand-in library)'
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, 'old.c')
        with open(src, 'w') as f:
            f.write('const char *gpuipc_version(void) { return "0.0.9"; }\n')
        lib = os.path.join(tmp, 'libold.so')
        subprocess.run([cc, '-shared', '-fPIC', '-o', lib, src], check=True)
        out = subprocess.run([sys.executable, '-c', 'import gpuipc; gpuipc.Client()'], capture_output=True, text=True,
                             env=dict(os.environ, GPUIPC_LIBRARY=lib), timeout=60)
    assert out.returncode != 0 and 'libgpuipc 0.0.9' in out.stderr and gpuipc.__version__ in out.stderr, out.stderr
    return 'a 0.0.9 stand-in refused: ' + out.stderr.strip().splitlines()[-1][:90] + '...'


CASES = [case_numpy_dlpack, case_c_meta, case_state_dict, case_dropped_attached, case_dlpack_capsules,
         case_events_and_groups, case_exceptions, case_inspection, case_library_release, case_ring_backpressure,
         case_ring_latest, case_ring_member_killed, case_ring_evicted, case_ring_errors, case_c_ring,
         case_ring_broker_restart, case_stream_ring, case_attach_id, case_fences, case_reconnect_default]


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
