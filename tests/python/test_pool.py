"""The Python pool without PyTorch: memfd pools (every CI run) and a cuda-vmm pool on the stand-in
libcuda ($GPUIPC_TEST_FAKECUDA, when built). Starts its own broker ($GPUIPC_BROKER); consumers are
processes of their own (`test_pool.py role NAME ...`), talking over pipes.

    test_pool.py       exit 0 pass, 1 fail

Cases: a pooled array published without a copy (the consumer's second array of the same segment is a
view of the mapping it has), an array deleted while published keeps its memory for the consumer and is
reused only after it drained, 100 versions with flat fds, mappings and exports, a snapshot state dict
into buffers reserved ahead (no export at publish), a live state dict (no copy: the consumer sees later
writes; a new version keeps its parts), and the typed errors: PoolClosed, SpansSegments, NotContiguous,
UnsupportedDtype, NoVmm, and an array outside every pool.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

import gpuipc

TIMEOUT_MS = 30000
FAKECUDA = os.environ.get('GPUIPC_TEST_FAKECUDA', '')


def open_fds():
    return len(os.listdir('/proc/self/fd'))


def mappings():
    with open('/proc/self/maps') as f:
        return sum(1 for _ in f)


def say(obj):
    print(json.dumps(obj), flush=True)


# ---- consumer roles ----

def role_read(name, n):
    """Attaches name, checks it holds arange(n) as float32, reports its segment, releases."""
    with gpuipc.Client(label='reader') as c:
        with c.attach(name, timeout_ms=TIMEOUT_MS) as a:
            x = a.numpy()
            say({'ok': bool(np.array_equal(x, np.arange(int(n), dtype=np.float32))), 'segment': a.segment})


def role_hold(name):
    """Attaches name and holds it until told (a line on stdin), reporting its first value before
    and after."""
    with gpuipc.Client(label='holder') as c:
        a = c.attach(name, timeout_ms=TIMEOUT_MS)
        say({'first': float(a.numpy()[0])})
        sys.stdin.readline()
        say({'first': float(a.numpy()[0])})
        a.release()


def role_follow(prefix, versions):
    """Attaches prefix/0 .. prefix/N-1 (version v holds v everywhere), reporting fds and mappings."""
    with gpuipc.Client(label='follower') as c:
        seen, fds1, maps1, segs = [], 0, 0, set()
        for v in range(int(versions)):
            with c.attach(f'{prefix}/{v}', timeout_ms=TIMEOUT_MS) as a:
                x = a.numpy()
                seen.append(bool((x == v).all()))
                segs.add(a.segment)
            if v == 1:
                fds1, maps1 = open_fds(), mappings()
            say({'v': v})
        say({'all': all(seen), 'fds': [fds1, open_fds()], 'maps': [maps1, mappings()], 'segments': len(segs)})


def role_live(name):
    """Attaches the live state dict, reports w[0], waits for a line, reports w[0] again (the
    producer wrote meanwhile), then attaches the next version and reports its parts."""
    with gpuipc.Client(label='live') as c:
        sd = c.attach_state_dict(name, framework='numpy', timeout_ms=TIMEOUT_MS)
        say({'live': sd.live, 'w0': float(sd['w'][0]), 'b': sd['b'].tolist(), 'parts': [p.id for p in sd._parts]})
        sys.stdin.readline()
        say({'w0': float(sd['w'][0])})
        nxt = c.attach_state_dict(name, framework='numpy', timeout_ms=TIMEOUT_MS, after=sd)
        say({'version': nxt.version, 'parts': [p.id for p in nxt._parts], 'w0': float(nxt['w'][0])})
        sd.release()
        nxt.release()


ROLES = {'read': role_read, 'hold': role_hold, 'follow': role_follow, 'live': role_live}


class Peer:
    def __init__(self, *args, env=None):
        self.p = subprocess.Popen([sys.executable, __file__, 'role', *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))

    def hear(self):
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f'peer {self.p.args[3]} exited (status {self.p.wait()})')
        return json.loads(line)

    def tell(self):
        self.p.stdin.write('go\n')
        self.p.stdin.flush()

    def done(self):
        assert self.p.wait(timeout=TIMEOUT_MS / 1000) == 0, f'peer {self.p.args[3]} failed'


# ---- cases ----

def case_zero_copy(c):
    pool = c.pool(kind='memfd')
    a = pool.empty(1000, 'float32', framework='numpy')
    b = pool.empty(1000, 'float32', framework='numpy')
    a[...] = np.arange(1000, dtype=np.float32)
    b[...] = np.arange(1000, dtype=np.float32)
    c.publish(a, 'pool/a', retire_after=1)
    c.publish(b, 'pool/b', retire_after=1)
    ra, rb = Peer('read', 'pool/a', '1000'), None
    got_a = ra.hear()
    ra.done()
    rb = Peer('read', 'pool/b', '1000')
    got_b = rb.hear()
    rb.done()
    assert got_a['ok'] and got_b['ok'], (got_a, got_b)
    assert got_a['segment'] == got_b['segment'] != 0, 'two arrays of one segment: one segment id'
    st = pool.stats()
    assert st.segments == 1 and st.exports == 1, st
    c.wait_drained(a, TIMEOUT_MS)
    assert c.drained(b) or c.wait_drained(b, TIMEOUT_MS) is None
    pool.close(force=True)


def case_freed_while_published(c):
    pool = c.pool(kind='memfd')
    a = pool.empty(4096, 'float32', framework='numpy')
    a[...] = 7
    ptr = a.__array_interface__['data'][0]
    c.publish(a, 'pool/held')
    h = Peer('hold', 'pool/held')
    assert h.hear()['first'] == 7
    del a  # the producer lets go: the publication keeps the memory for the holder
    other = pool.empty(4096, 'float32', framework='numpy')
    assert other.__array_interface__['data'][0] != ptr, 'memory still published was handed out again'
    other[...] = 9
    h.tell()
    assert h.hear()['first'] == 7, 'the holder saw its memory change'
    h.done()
    gone = np.zeros(1)  # anything: what matters is that the publication is retired and drains
    c.retire(_array_at(pool, ptr, 4096))
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while pool.stats().allocated > 4096 * 4 and time.monotonic() < deadline:
        pool._reap()
        time.sleep(0.01)
    again = pool.empty(4096, 'float32', framework='numpy')
    assert again.__array_interface__['data'][0] == ptr, 'the drained range was not reused'
    del other, again, gone
    pool.close()


def _array_at(pool, ptr, n):
    """An object describing n float32 at ptr (to name a publication whose array the caller dropped)."""
    class At:
        def _gpuipc_info(self):
            from gpuipc import dlpack
            return dlpack.Info(ptr, (dlpack.KDL_CPU, 0), 'float32', (n,), None, False)
    return At()


def case_versions_flat(c):
    pool = c.pool(kind='memfd')
    f = Peer('follow', 'pool/v', '100')
    for v in range(100):
        x = pool.empty(1 << 16, 'float32', framework='numpy')
        x[...] = v
        c.publish(x, f'pool/v/{v}', retire_after=1)
        f.hear()
        c.wait_drained(x, TIMEOUT_MS)
        del x
    got = f.hear()
    f.done()
    assert got['all'], got
    assert got['segments'] == 1, got
    assert got['fds'][1] == got['fds'][0], f'consumer fds grew: {got["fds"]}'
    assert got['maps'][1] <= got['maps'][0] + 2, f'consumer mappings grew: {got["maps"]}'
    st = pool.stats()
    assert st.segments == 1 and st.exports == 1, st
    assert st.views <= 2, st
    pool.close()


def case_reserved_state_dict(c):
    sd = {'w': np.arange(1000, dtype=np.float32), 'b': np.ones(10, dtype=np.float16)}
    c.reserve_state_dict('pool/sd', sd, kind='memfd')
    pub = c._publishers['pool/sd']
    exports = sum(p.stats().exports for p in pub.pools.values())
    assert len(pub.slots) == 2 and exports >= 1, (len(pub.slots), exports)  # small buffers share a segment
    for v in range(3):
        sd['w'][0] = v
        c.publish_state_dict(sd, 'pool/sd', kind='memfd')
    assert sum(p.stats().exports for p in pub.pools.values()) == exports, 'a reserved publish exported again'
    got = c.attach_state_dict('pool/sd', framework='numpy', timeout_ms=TIMEOUT_MS)
    assert got.version == 3 and got['w'][0] == 2 and np.array_equal(got['b'], sd['b']), got
    got.release()
    c.unpublish_state_dict('pool/sd')


def case_live_state_dict(c):
    pool = c.pool(kind='memfd')
    w = pool.empty(1000, 'float32', framework='numpy')
    b = pool.empty(4, 'int64', framework='numpy')
    w[...] = 3
    b[...] = [1, 2, 3, 4]
    v1 = c.publish_state_dict({'w': w, 'b': b}, 'pool/live', copy=False)
    peer = Peer('live', 'pool/live')
    first = peer.hear()
    assert first['live'] and first['w0'] == 3 and first['b'] == [1, 2, 3, 4], first
    assert len(first['parts']) == 1, first  # one segment: one part
    w[0] = 5  # no copy: the consumer sees it
    peer.tell()
    assert peer.hear()['w0'] == 5
    v2 = c.publish_state_dict({'w': w, 'b': b}, 'pool/live', copy=False)
    nxt = peer.hear()
    assert nxt['version'] == v2.version == v1.version + 1 and nxt['parts'] == first['parts'], nxt
    peer.done()
    c.unpublish_state_dict('pool/live')
    del w, b
    pool.close()


def expect(exc, fn, what):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f'{what}: no {exc.__name__}')


def case_errors(c):
    pool = c.pool(kind='memfd', segment_size=2 << 20)
    a = pool.empty(1 << 19, 'float32', framework='numpy')  # fills the first 2 MiB segment
    pool.empty(1 << 19, 'float32', framework='numpy')      # and a second one
    base = a.__array_interface__['data'][0]

    class Across:
        def _gpuipc_info(self):
            from gpuipc import dlpack
            return dlpack.Info(base + (2 << 20) - 16, (dlpack.KDL_CPU, 0), 'uint8', (64,), None, False)
    e = expect(gpuipc.SpansSegments, lambda: c.publish(Across(), 'pool/x'), 'an array across two segments')
    assert 'spans two segments' in str(e), e
    expect(gpuipc.NotContiguous, lambda: c.publish_state_dict({'s': a[::2]}, 'pool/nc', copy=False),
           'a strided entry of a live state dict')
    expect(gpuipc.UnsupportedDtype, lambda: pool.empty(4, 'complex32'), 'an unknown dtype')
    e = expect(gpuipc.InvalidArgument, lambda: c.publish_state_dict({'z': np.zeros(3)}, 'pool/out', copy=False),
               'an entry outside every pool')
    assert 'does not lie in a pool' in str(e), e
    pool.close(force=True)
    expect(gpuipc.PoolClosed, lambda: pool.empty(4), 'allocating in a closed pool')
    p2 = c.pool(kind='memfd')
    x = p2.empty(16, 'float32', framework='numpy')
    p2.close(force=True)
    e = expect(gpuipc.PoolClosed, lambda: c.publish(x, 'pool/closed'), 'publishing an array of a closed pool')
    assert 'closed' in str(e), e


def case_fakecuda(c):
    """A cuda-vmm pool on the stand-in: made, allocated, published; and a device without VMM refused."""
    pool = c.pool(kind='cuda-vmm', device=0)
    v = pool.empty(256, 'float32', framework=None)
    c.publish(v, 'pool/dev', retire_after=1)
    with gpuipc.Client(label='dev-consumer') as d:
        with d.attach('pool/dev', timeout_ms=TIMEOUT_MS) as got:
            assert got.kind == 'cuda-vmm' and got.segment != 0 and got.size == 1024, got
    c.wait_drained(v, TIMEOUT_MS)
    assert pool.stats().exports == 1
    del v
    pool.close()
    env = dict(os.environ, FAKECUDA_NO_VMM='1')
    out = subprocess.run([sys.executable, '-c', 'import gpuipc, sys\n'
                          'c = gpuipc.Client()\n'
                          'try:\n    c.pool(kind="cuda-vmm", device=0)\nexcept gpuipc.NoVmm as e:\n'
                          '    print("NoVmm:", e); sys.exit(0)\nsys.exit(1)'], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and 'virtual memory management' in out.stdout, (out.stdout, out.stderr)


def case_fakecuda_batch_copy(c):
    """gpuipc_buffer_copy_in (a state dict snapshot's device copies) on the stand-in: 300 copies, some
    empty, go out in two cuMemcpyBatchAsync calls (256 at most each; the stand-in refuses the legacy
    default stream and empty copies as the driver does), land where they belong, and a copy outside
    the buffer is refused before anything is queued."""
    import ctypes
    from gpuipc import _lib
    fake = ctypes.CDLL(FAKECUDA)  # the library loaded it already: the same instance
    fake.fakecuda_batch_calls.restype = ctypes.c_ulong
    pool = c.pool(kind='cuda-vmm', device=0)
    src = pool.empty(300 * 64, 'uint8', framework=None)
    base = src.memory.ptr + src.offset
    ctypes.memmove(base, bytes(i % 251 for i in range(300 * 64)), 300 * 64)
    dst = c.empty((300 * 128,), 'uint8', kind='cuda-vmm', device=0, framework=None)
    items = (_lib.Copy * 300)()
    for i, item in enumerate(items):
        item.src, item.offset, item.len = base + i * 64, i * 128, 0 if i % 7 == 3 else 64
    before = fake.fakecuda_batch_calls()
    assert c._lib.gpuipc_buffer_copy_in(dst.memory._handle, items, 300, None) == 0, c._lib.gpuipc_errmsg(c._c)
    calls = fake.fakecuda_batch_calls() - before
    assert calls == 2, f'{calls} batched calls for 300 copies'
    got = ctypes.string_at(dst.memory.ptr, 300 * 128)
    for i in range(300):
        want = bytes((i * 64 + j) % 251 for j in range(64)) if i % 7 != 3 else bytes(64)
        assert got[i * 128:i * 128 + 64] == want, f'copy {i}'
    items[299].offset = 300 * 128 - 32  # its last 32 bytes lie outside
    before = fake.fakecuda_batch_calls()
    assert c._lib.gpuipc_buffer_copy_in(dst.memory._handle, items, 300, None) == gpuipc.errors.E_INVALID
    assert b'outside' in c._lib.gpuipc_errmsg(c._c) and fake.fakecuda_batch_calls() == before
    c.free(dst)
    del src
    pool.close()


def case_fakecuda_fenced_state_dict(c):
    """A snapshot published with a fence on the stand-in (cuda-vmm): the version carries the fence,
    the consumer's attach queues the wait (its fence is opened once and kept), the bytes arrive; and
    the refusals: a fence for a live or memfd state dict, a stream without a fence."""
    import ctypes
    sd = {'w': np.arange(64, dtype=np.float32), 'b': np.full(8, 3, dtype=np.int64)}
    fence = c.create_fence('pool/sd-fence', device=0)
    with gpuipc.Client(label='fenced-consumer') as d:
        for v in range(3):
            sd['w'][0] = v
            c.publish_state_dict(sd, 'pool/fsd', kind='cuda-vmm', device=0, fence=fence)
            got = d.attach_state_dict('pool/fsd', framework=None, timeout_ms=TIMEOUT_MS)
            try:
                assert got._fence == ('pool/sd-fence', v + 1), got._fence
                w = got['w']
                raw = ctypes.string_at(w.memory.ptr + w.offset, w.nbytes)
                assert np.array_equal(np.frombuffer(raw, np.float32), sd['w']), v
            finally:
                got.release()
        assert list(d._waited_fences) == ['pool/sd-fence'], d._waited_fences
    expect(gpuipc.InvalidArgument, lambda: c.publish_state_dict(sd, 'pool/fsd-host', kind='memfd', fence=fence),
           'a fence for a memfd state dict')
    expect(gpuipc.InvalidArgument, lambda: c.publish_state_dict(sd, 'pool/fsd-live', copy=False, fence=fence),
           'a fence for a live state dict')
    expect(gpuipc.InvalidArgument, lambda: c.publish_state_dict(sd, 'pool/fsd', kind='cuda-vmm', stream=0),
           'a stream without a fence')
    c.unpublish_state_dict('pool/fsd')
    fence.close()


CASES = [case_zero_copy, case_freed_while_published, case_versions_flat, case_reserved_state_dict,
         case_live_state_dict, case_errors]


def main():
    if len(sys.argv) > 2 and sys.argv[1] == 'role':
        ROLES[sys.argv[2]](*sys.argv[3:])
        return 0
    tmp = tempfile.mkdtemp(prefix='gpuipc-pool.')
    os.environ['GPUIPC_SOCKET'] = os.path.join(tmp, 's.sock')
    cases = list(CASES)
    if FAKECUDA:
        os.environ.update(GPUIPC_LIBCUDA=FAKECUDA, FAKECUDA_DEVICES='1')
        cases += [case_fakecuda, case_fakecuda_batch_copy, case_fakecuda_fenced_state_dict]
    broker = subprocess.Popen([os.environ['GPUIPC_BROKER'], '--socket', os.environ['GPUIPC_SOCKET'],
                               '--log-level', 'warn'], stderr=open(os.path.join(tmp, 'broker.log'), 'w'))
    failed = 0
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(os.environ['GPUIPC_SOCKET']) and time.monotonic() < deadline:
            time.sleep(0.02)
        for case in cases:
            c = gpuipc.Client(label=case.__name__, probe_gpus=bool(FAKECUDA))
            try:
                case(c)
                print(f'ok   {case.__name__}')
            except Exception:
                failed += 1
                print(f'FAIL {case.__name__}')
                traceback.print_exc()
            finally:
                c.close()
    finally:
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'{len(cases) - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
