"""The Python package's details a new user trips over, each checked against a real broker:

- publish_state_dict() of NumPy arrays goes to memfd by default (as share() chooses), not cuda-vmm;
- empty(framework='numpy') is memfd without being told (the framework chooses the kind);
- a bad argument (share(x, ''), empty(kind='bogus'), alloc(0), a negative dimension, a size past
  size_t) raises gpuipc.InvalidArgument, which `except gpuipc.Error` catches, which is still a
  ValueError, and whose .name and .code are the library's ('invalid') even when Python found it;
- a name with a NUL inside is refused wherever a name enters (C would cut it short);
- a failure's message is its own, never an earlier failure's (alloc(1 << 63) after a bad attach);
- a memfd larger than the memory available is refused by alloc, empty and a pool alike;
- a ring member whose producer closed the ring or died is told with a ring's hint, not a buffer's;
- a join_ring() timeout carries its detail and hint like every other error;
- a message says what happened once: the hint is .hint (and a note), not repeated in the message;
- Client('/etc/passwd') says "not a socket", at once, instead of "Connection refused";
- a state dict whose manifest lies (a bad dtype, shape or offset, an entry outside the data or its
  part, a part it does not list, the wrong number of fields, a key twice) is refused with
  MetadataError naming it;
- an Attached pickled through a multiprocessing queue is attached again by id in the receiving
  process (spawned: a fresh interpreter), which reads the same bytes and releases its reference;
  a Buffer or a Client refuses pickling with a TypeError that says what to do instead.

    details.py [KIND]    (KIND is ignored: everything here is memfd)   exit 0 pass, 1 fail
Needs GPUIPC_SOCKET naming a running broker.
"""
import multiprocessing
import os
import pickle
import sys
import time
import traceback

import numpy as np

import gpuipc

RUN = os.getpid()


def raises(cls, fn):
    try:
        fn()
    except cls as e:
        return e
    except Exception as e:
        raise AssertionError(f'{type(e).__name__}: {e} instead of {cls.__name__}') from None
    raise AssertionError(f'no {cls.__name__}')


def case_state_dict_numpy_memfd(c):
    """publish_state_dict of NumPy arrays: memfd by default, and back intact."""
    sd = {'w': np.arange(12, dtype=np.float32).reshape(3, 4), 'b': np.ones(5, dtype=np.int64)}
    version = c.publish_state_dict(sd, f'py/details/{RUN}/sd')
    got = c.attach_state_dict(f'py/details/{RUN}/sd', framework='numpy', timeout_ms=2000)
    try:
        kinds = {b.kind for b in c.buffers(f'py/details/{RUN}/sd')}
        assert kinds == {'memfd'}, f'published as {kinds}'
        assert all(np.array_equal(got[k], sd[k]) for k in sd), got
    finally:
        got.release()
    c.unpublish_state_dict(f'py/details/{RUN}/sd')
    return f'version {getattr(version, "version", version)} as memfd'


def lying_state_dict(c, name, entries, live=False, parts=None):
    """Publishes a memfd buffer holding `entries` as a state dict manifest (after 64 data bytes);
    a live one's parts are the buffer ids `parts`, by default one 64-byte buffer of its own under
    NAME@part.0. Returns the buffers to free."""
    import msgpack
    manifest = msgpack.packb({'format': 'gpuipc.state_dict/1', 'entries': entries}, use_bin_type=True)
    buf = c.alloc(64 + len(manifest), 'memfd')
    buf.write(manifest, 64)
    info = {'version': 1, 'manifest': [64, len(manifest)]}
    made = [buf]
    if live and parts is None:
        part = c.alloc(64, 'memfd')
        c.publish(part, f'{name}@part.0')
        made.append(part)
        parts = [part.id]
    if live:
        info['parts'] = parts
    c.publish(buf, name, meta={'state_dict': info})
    return made


def free_all(c, bufs):
    for b in bufs:
        c.retire(b)
        c.free(b)


def case_lying_manifest(c):
    """A manifest that lies is a MetadataError that says what is wrong, never an IndexError or a
    view outside the buffer."""
    snapshot = [('a dtype nobody has', [['w', 'float99', [4], 0]], 'float99'),
                ('a dtype NumPy would guess', [['w', None, [4], 0]], 'dtype'),
                ('too many dimensions', [['w', 'uint8', [1] * 40, 0]], 'shape'),
                ('a negative dimension', [['w', 'float32', [-4], 0]], 'shape'),
                ('a float dimension', [['w', 'float32', [4.0], 0]], 'shape'),
                ('a shape that is no list', [['w', 'float32', 4, 0]], 'shape'),
                ('a negative offset', [['w', 'float32', [4], -8]], 'offset'),
                ('an entry over the manifest', [['w', 'float32', [32], 0]], 'outside the data'),
                ('a live entry in a snapshot', [['w', 'float32', [4], 0, 0]], 'fields'),
                ('an entry that is no list', ['w'], 'fields'),
                ('a key twice', [['w', 'float32', [4], 0], ['w', 'float32', [4], 16]], 'twice')]
    live = [('a part it does not list', [['w', 'float32', [4], 0, 1]], 'parts it does not list'),
            ('an entry outside its part', [['w', 'float32', [4], 4096, 0]], 'outside part 0'),
            ('a negative part', [['w', 'float32', [4], 0, -1]], 'names part'),
            ('a snapshot entry in a live one', [['w', 'float32', [4], 0]], 'fields'),
            ('a key twice in a live one', [['w', 'float32', [4], 0, 0], ['w', 'float32', [4], 16, 0]], 'twice')]
    cases = [(w, e, s, False) for w, e, s in snapshot] + [(w, e, s, True) for w, e, s in live]
    for i, (what, entries, says, is_live) in enumerate(cases):
        name = f'py/details/{RUN}/lie{i}'
        bufs = lying_state_dict(c, name, entries, is_live)
        try:
            e = raises(gpuipc.MetadataError, lambda: c.attach_state_dict(name, framework='numpy', timeout_ms=2000))
            assert says in str(e), f'{what}: {e}'
        finally:
            free_all(c, bufs)
    return f'{len(cases)} lying manifests refused with MetadataError'


def case_live_parts_of_others(c):
    """A live state dict takes only its own producer's NAME@part.I buffers: a manifest whose parts
    name another producer's buffer (under any name, its own NAME@part.0 included), a buffer of the
    producer under another name, or the manifest itself is a MetadataError naming the part, and the
    consumer holds nothing afterwards."""
    secret = bytes(range(64))
    entries = [['w', 'uint8', [64], 0, 0]]
    with gpuipc.Client(label='py-details-victim', probe_gpus=False) as victim, \
            gpuipc.Client(label='py-details-hostile', probe_gpus=False) as hostile:
        def victims(name):
            b = victim.alloc(64, 'memfd')
            b.write(secret)
            victim.publish(b, name)
            return b
        others = victims(f'py/details/{RUN}/victim@part.0')
        squatted = victims(f'py/details/{RUN}/evil1@part.0')  # the name the hostile manifest's part has
        own = hostile.alloc(64, 'memfd')
        hostile.publish(own, f'py/details/{RUN}/evil2/other')
        cases = [('another producer\'s part of another name', 'evil0', [others.id], others),
                 ('another producer\'s buffer under NAME@part.0', 'evil1', [squatted.id], squatted),
                 ('its own buffer under another name', 'evil2', [own.id], own),
                 ('its own manifest', 'evil3', None, None)]
        for what, leaf, parts, target in cases:
            name = f'py/details/{RUN}/{leaf}'
            bufs = lying_state_dict(hostile, name, entries, True, parts if parts is not None else [])
            if parts is None:  # the manifest's own id, known once it is published: publish it again
                hostile.retire(bufs[0])
                hostile.wait_drained(bufs[0], 2000)
                lying_state_dict_again(hostile, bufs[0], name, entries)
                target = bufs[0]
            try:
                e = raises(gpuipc.MetadataError,
                           lambda: c.attach_state_dict(name, framework='numpy', timeout_ms=2000))
                assert f'buffer {target.id} ' in str(e), f'{what}: the part is not named in {e}'
                for b in (target, bufs[0]):
                    held = [h.peer for h in c.stat(buffer_id=b.id).held_by]
                    assert c.connection_info().peer not in held, f'{what}: buffer {b.id} still held after {e}'
            finally:
                free_all(hostile, bufs)
        free_all(victim, [others, squatted])
        free_all(hostile, [own])
    return f'{len(cases)} manifests naming buffers of others refused with MetadataError'


def lying_state_dict_again(c, buf, name, entries):
    """Publishes buf (a lying_state_dict() manifest) again, as a live one whose part is itself."""
    import msgpack
    manifest = msgpack.packb({'format': 'gpuipc.state_dict/1', 'entries': entries}, use_bin_type=True)
    c.publish(buf, name, meta={'state_dict': {'version': 2, 'manifest': [64, len(manifest)], 'parts': [buf.id]}})


def case_hostile_layout(c):
    """Unusable layout metadata (a C producer can write any map) attaches, but every framework's view
    of it raises MetadataError: numpy(), memoryview(), __dlpack__ (numpy.from_dlpack), torch() where
    torch is installed; the bytes stay reachable through view('uint8'). A usable one is viewed."""
    import msgpack
    bad = [('a negative dimension', {'dtype': 'float32', 'shape': [-4]}),
           ('two negative dimensions', {'dtype': 'float32', 'shape': [-4, -4]}),
           ('an extent past the buffer', {'dtype': 'float32', 'shape': [2048]}),
           ('an offset past the buffer', {'dtype': 'uint8', 'shape': [4], 'offset': 4094}),
           ('a negative offset', {'dtype': 'uint8', 'shape': [4], 'offset': -4}),
           ('strides past the buffer', {'dtype': 'float32', 'shape': [4], 'strides': [400]}),
           ('strides before the buffer', {'dtype': 'float32', 'shape': [4], 'strides': [-1]}),
           ('a stride per dimension missing', {'dtype': 'float32', 'shape': [4, 4], 'strides': [4]}),
           ('an unknown dtype', {'dtype': 'float99', 'shape': [4]}),
           ('a dtype that is no string', {'dtype': 7, 'shape': [4]}),
           ('a dtype NumPy would guess', {'dtype': None, 'shape': [4]}),
           ('a shape that is no list', {'dtype': 'float32', 'shape': '4'}),
           ('a float dimension', {'dtype': 'float32', 'shape': [4.0]}),
           ('a bool dimension', {'dtype': 'float32', 'shape': [True]}),
           ('an offset that is no int', {'dtype': 'uint8', 'shape': [4], 'offset': '8'}),
           ('too many dimensions', {'dtype': 'uint8', 'shape': [1] * 40}),
           ('an empty array too large for NumPy', {'dtype': 'uint8', 'shape': [1 << 62, 4, 0]})]
    try:
        import torch  # noqa: F401
        frameworks = ['torch']
    except ImportError:
        frameworks = []
    views = [('numpy()', lambda a: a.numpy()), ('memoryview()', lambda a: a.memoryview()),
             ('__dlpack__', lambda a: a.__dlpack__()), ('numpy.from_dlpack', lambda a: np.from_dlpack(a))] + [('torch()', lambda a: a.torch()) for _ in frameworks]
    buf = c.alloc(4096, 'memfd')
    buf.write(bytes(range(256)) * 16)
    wrong = []  # every case and view that did not raise MetadataError: all of them are reported
    try:
        for i, (what, m) in enumerate(bad):
            name = f'py/details/{RUN}/layout{i}'
            c._publish_raw(buf, name.encode(), msgpack.packb(m, use_bin_type=True))
            with c.attach(name, 0) as a:
                wrong += [f'{what}: {how}: {got}' for how, fn in views for got in [not_meta(fn, a)] if got]
                assert a.meta == m, f'{what}: meta {a.meta!r}'
                if bytes(a.view('uint8').memoryview()[:4]) != bytes(range(4)):
                    wrong.append(f"{what}: view('uint8') does not start at the buffer's first byte")
            c.retire(buf)
            c.wait_drained(buf, 2000)
        assert not wrong, f'{len(wrong)} views not refused with MetadataError:\n  ' + '\n  '.join(wrong)
        m = {'dtype': 'float32', 'shape': [2, 3], 'strides': [1, 2], 'offset': 16}
        c._publish_raw(buf, f'py/details/{RUN}/layout-ok'.encode(), msgpack.packb(m, use_bin_type=True))
        with c.attach(f'py/details/{RUN}/layout-ok', 0) as a:
            want = np.frombuffer(bytes(range(256)) * 16, np.float32)[4:10].reshape(3, 2).T
            for how, fn in views:
                if how == 'memoryview()':
                    continue  # strided: memoryview() refuses it, as it always did
                got = fn(a)
                got = np.from_dlpack(a) if how == '__dlpack__' else got
                got = got.cpu().numpy() if how == 'torch()' else got
                assert got.shape == (2, 3) and np.array_equal(got, want), f'{how}: {got!r}'
        c.retire(buf)
    finally:
        c.free(buf)
    return f'{len(bad)} unusable layouts refused by {", ".join(h for h, _ in views)}'


def not_meta(fn, a):
    """'' when fn(a) raises MetadataError, else what it did instead."""
    try:
        got = fn(a)
    except gpuipc.MetadataError:
        return ''
    except Exception as e:
        return f'{type(e).__name__}: {e}'
    return f'returned {type(got).__name__} {getattr(got, "dtype", "")}{list(getattr(got, "shape", ()))}'


def case_invalid_arguments(c):
    """Bad arguments are gpuipc.InvalidArgument: a gpuipc.Error and a ValueError, with the library's
    code and name for it ('invalid', E_INVALID) whether Python or the library found it."""
    pool = c.pool(kind='memfd')
    for what, fn in (("share(x, '')", lambda: c.share(np.zeros(4, np.uint8), '')),
                     ("empty(kind='bogus')", lambda: c.empty((2,), 'uint8', kind='bogus', framework=None)),
                     ('alloc(0)', lambda: c.alloc(0)),
                     ("empty(dtype='nonsense')", lambda: c.empty((2,), 'nonsense', kind='memfd', framework=None)),
                     ('empty((-4,))', lambda: c.empty((-4,), 'float32', framework='numpy')),
                     ('empty((2, -1))', lambda: c.empty((2, -1), 'uint8', kind='memfd', framework=None)),
                     ("empty('x')", lambda: c.empty('x', 'uint8', kind='memfd', framework=None)),
                     ('pool.empty((-4,))', lambda: pool.empty((-4,), 'float32', framework='numpy')),
                     ('ring shape (-1,)', lambda: c.ring(f'py/details/{RUN}/neg', shape=(-1,), dtype='uint8')),
                     ('ring slot_size 1 << 64', lambda: c.ring(f'py/details/{RUN}/big', slot_size=1 << 64)),
                     ('pool segment_size -1', lambda: c.pool(kind='memfd', segment_size=-1))):
        e = raises(gpuipc.Error, fn)
        assert isinstance(e, gpuipc.InvalidArgument) and isinstance(e, ValueError), f'{what}: {type(e).__name__}'
        assert (e.name, e.code) == ('invalid', gpuipc.errors.E_INVALID), f'{what}: name {e.name!r} code {e.code}'
    e = gpuipc.InvalidArgument('raised by hand')
    assert (e.name, e.code) == ('invalid', gpuipc.errors.E_INVALID), (e.name, e.code)
    assert gpuipc.StateError('x').name == 'state' and gpuipc.RingClosed('x').name == 'revoked'
    assert gpuipc.Error('x').name == '' and gpuipc.Error('x').code == 0
    pool.close()
    return 'share, empty (kind, dtype, shape), pool.empty, ring, alloc; name and code'


def case_fresh_messages(c):
    """A failure's message is its own, never an earlier failure's: after attach('bad name') fails,
    alloc(1 << 63) names the size limit, and alloc(1 << 64), which ctypes would wrap to 0, is
    refused before it reaches the library."""
    checked = []
    for size in (1 << 63, 1 << 64, 1 << 70):
        raises(gpuipc.InvalidArgument, lambda: c.attach('bad name', 0))
        e = raises(gpuipc.InvalidArgument, lambda: c.alloc(size))
        assert 'bad name' not in str(e) and 'bad name' not in e.detail, f'alloc({size}): {e}'
        assert 'more than any buffer may hold' in str(e), f'alloc({size}): {e}'
        checked.append(str(e))
    assert not c.buffers(f'py/details/{RUN}/'), 'a buffer was made'
    return checked[1]


def mem_available():
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemAvailable:'):
                return int(line.split()[1]) * 1024
    return None


def case_one_size_limit(c):
    """A memfd larger than the memory available is refused by alloc, empty and a memfd pool alike,
    at once, with the library's message (gpuipcctl publish --size meets the same limit)."""
    avail = mem_available()
    if avail is None:
        return 'skipped: no MemAvailable'
    over = 2 * avail + 4096
    pool = c.pool(kind='memfd')
    try:
        for what, fn in (('alloc', lambda: c.alloc(over)),
                         ('empty', lambda: c.empty((over,), 'uint8', framework='numpy')),
                         ('pool.empty', lambda: pool.empty((over,), 'uint8', framework='numpy'))):
            start = time.monotonic()
            e = raises(gpuipc.Error, fn)
            assert e.name == 'ENOMEM' and 'more than the' in str(e), f'{what}: {type(e).__name__}: {e}'
            assert time.monotonic() - start < 5, f'{what}: refusing took {time.monotonic() - start:.1f} s'
    finally:
        pool.close()
    return f'{over} bytes refused: {e}'


def case_nul_in_names(c):
    """A NUL inside a name is refused (C would cut the name there and publish 'x' for 'x\\0y'), and
    nothing is published under the name's first part."""
    arr = np.zeros(4, np.uint8)
    base = f'py/details/{RUN}/nul'
    for what, fn in (('share', lambda: c.share(arr, base + '\0y')),
                     ('alloc + publish', lambda: c.publish(c.empty((4,), 'uint8', kind='memfd', framework='numpy'),
                                                          base + '\0y')),
                     ('ring', lambda: c.ring(base + '\0y', slots=2, slot_size=64)),
                     ('attach', lambda: c.attach(base + '\0y', 0)),
                     ('join_ring', lambda: c.join_ring(base + '\0y', timeout_ms=0)),
                     ('subscribe', lambda: c.subscribe(base + '\0')),
                     ('buffers', lambda: c.buffers(base + '\0')),
                     ('publish_state_dict', lambda: c.publish_state_dict({'w': arr}, base + '\0y')),
                     ('group_join', lambda: c.group_join(base + '\0y', 2, 0)),
                     ('Client label', lambda: gpuipc.Client(label='a\0b', probe_gpus=False)),
                     ('Client socket', lambda: gpuipc.Client(socket=os.environ['GPUIPC_SOCKET'] + '\0x',
                                                             probe_gpus=False))):
        e = raises(gpuipc.InvalidArgument, fn)
        assert 'NUL' in str(e), f'{what}: {e}'
    assert not c.buffers(base), [b.name for b in c.buffers(base)]
    return str(e)


def ring_producer(name, how):
    """A child process: makes ring `name`, publishes one frame once a member holds a seat, then
    closes the ring and exits, or dies without closing anything."""
    import subprocess
    code = (f"import gpuipc, os, time\n"
            f"c = gpuipc.Client(label='ring-producer', probe_gpus=False)\n"
            f"r = c.ring({name!r}, slots=2, slot_size=64, kind='memfd')\n"
            f"print('made', flush=True)\n"
            f"r.acquire(5000); r.publish()\n"
            f"time.sleep(0.3)\n"
            f"{'r.close(); c.close()' if how == 'close' else 'os._exit(0)'}\n")
    return subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)


def case_ring_ended_hints(c):
    """A member whose producer closed its ring gets RingClosed, and one whose producer died Revoked,
    each with a hint about rings: never the hint of a revoked buffer ('publish broker-held', which
    no ring can do)."""
    got = []
    for how, cls in (('close', gpuipc.RingClosed), ('die', gpuipc.Revoked)):
        name = f'py/details/{RUN}/ended-{how}'
        p = ring_producer(name, how)
        assert p.stdout.readline().strip() == 'made', f'{how}: the producer did not make its ring'
        with c.join_ring(name, timeout_ms=5000) as ring:
            ring.take(5000).release()
            assert p.wait(10) == 0, f'{how}: the producer exited with {p.returncode}'
            time.sleep(0.3)  # its end reaches us
            e = raises(cls, lambda: ring.take(2000))
        assert 'broker-held' not in e.hint and 'ring' in e.hint, f'{how}: hint {e.hint!r}'
        assert (how == 'close') == isinstance(e, gpuipc.RingClosed), f'{how}: {type(e).__name__}'
        got.append(f'{type(e).__name__}: {e.hint}')
    return '; '.join(got)


def case_empty_numpy_memfd(c):
    """empty(framework='numpy') (and 'memoryview') makes memfd memory without being told: the
    framework chooses the kind unless one is given."""
    a = c.empty((4,), 'float32', framework='numpy')
    a[:] = [1, 2, 3, 4]
    m = c.empty((8,), 'uint8', framework='memoryview')
    name = f'py/details/{RUN}/np-memfd'
    c.publish(a, name)
    try:
        kinds = {b.kind for b in c.buffers(name)}
        assert kinds == {'memfd'}, kinds
    finally:
        c.retire(a)
        c.free(a)
    c.free(m)
    return 'numpy and memoryview: memfd'


def case_join_ring_timeout(c):
    """join_ring's Timeout has a detail and a hint."""
    e = raises(gpuipc.Timeout, lambda: c.join_ring(f'py/details/{RUN}/no-ring', timeout_ms=200))
    assert e.detail and 'within 200 ms' in e.detail, f'detail {e.detail!r}'
    assert e.hint and 'same ring name and socket' in e.hint, f'hint {e.hint!r}'
    assert e.name == 'timeout' and e.code == -1006, (e.name, e.code)
    return f'detail {e.detail!r}'


def case_message_once(c):
    """The message is what happened; the hint is not repeated in it."""
    for what, fn, cls in (('attach absent', lambda: c.attach(f'py/details/{RUN}/absent', 0), gpuipc.NotFound),
                          ('attach waiting', lambda: c.attach(f'py/details/{RUN}/absent', 100), gpuipc.Timeout),
                          ('join ring', lambda: c.join_ring(f'py/details/{RUN}/no-ring', timeout_ms=100), gpuipc.Timeout)):
        e = raises(cls, fn)
        assert e.detail and e.detail in str(e), f'{what}: the detail is not in {str(e)!r}'
        assert e.hint and e.hint not in str(e), f'{what}: the hint is repeated in {str(e)!r}'
        if sys.version_info >= (3, 11):
            assert f'hint: {e.hint}' in getattr(e, '__notes__', []), f'{what}: no hint note'
    return 'NotFound, Timeout, join_ring'


def case_not_a_socket(c):
    """Client('/etc/passwd'): not a socket, said at once."""
    start = time.monotonic()
    e = raises(gpuipc.NoBroker, lambda: gpuipc.Client('/etc/passwd', connect_timeout_ms=3000))
    took = time.monotonic() - start
    assert 'not a socket' in str(e) and 'regular file' in str(e) and 'refused' not in str(e), str(e)
    assert took < 2, f'took {took:.1f} s: it waited for a file to become a socket'
    return str(e)


def child_reads(queue, results):
    try:
        a = queue.get(timeout=30)
        results.put(('ok', a.name, bytes(a.memoryview()), a.id))
        a.release()
        results.put(('released', None, b'', 0))
    except Exception:
        results.put(('error', traceback.format_exc(), b'', 0))


def case_pickle(c):
    """An Attached through a spawned process's queue is attached again there; Buffer and Client
    refuse pickling with a TypeError that says what to do."""
    name = f'py/details/{RUN}/pickled'
    data = bytes(range(256)) * 16
    buf = c.alloc(len(data), 'memfd')
    buf.write(data)
    c.publish(buf, name)
    a = c.attach(name, 0)
    ctx = multiprocessing.get_context('spawn')
    queue, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child_reads, args=(queue, results))
    p.start()
    queue.put(a)
    status, what, got, bid = results.get(timeout=60)
    assert status == 'ok', what
    assert what == name and got == data and bid == a.id, (what, len(got), bid, a.id)
    assert results.get(timeout=30)[0] == 'released'
    p.join(30)
    assert p.exitcode == 0, p.exitcode
    holders = c.stat(name).holders
    assert holders == 1, f'{holders} holders after the child released (expected only ours)'
    a.release()
    e = raises(TypeError, lambda: pickle.dumps(a))
    assert 'released' in str(e), str(e)
    e = raises(TypeError, lambda: pickle.dumps(buf))
    assert 'publish it' in str(e), str(e)
    e = raises(TypeError, lambda: pickle.dumps(c))
    assert 'open a Client in the other process' in str(e), str(e)
    c.free(buf)
    return 'Attached re-attached by id in a spawned process; Buffer and Client: TypeError'


CASES = [case_state_dict_numpy_memfd, case_lying_manifest, case_live_parts_of_others, case_hostile_layout,
         case_invalid_arguments, case_fresh_messages, case_one_size_limit, case_nul_in_names,
         case_empty_numpy_memfd, case_ring_ended_hints, case_join_ring_timeout, case_message_once,
         case_not_a_socket, case_pickle]


def main():
    failed = 0
    with gpuipc.Client(label='py-details', probe_gpus=False) as c:
        for case in CASES:
            try:
                print(f'ok    {case.__name__[5:]}: {case(c)}', flush=True)
            except Exception:
                failed += 1
                print(f'FAIL  {case.__name__[5:]}: {case.__doc__}\n{traceback.format_exc()}', flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
