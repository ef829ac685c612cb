#!/usr/bin/env python3
"""Pools with PyTorch (and CuPy) on a GPU; prints one PASS/FAIL line per check. Exit status: 0 all
passed, 1 a check failed, 77 no GPU or no torch.

    GPUIPC_LIBRARY=build/client/libgpuipc.so PYTHONPATH=python \\
        python3 tests/gpu/test-gpu-pool.py --broker build/broker/gpuipc-broker

A producer and a consumer in sibling PID namespaces (as two containers) talk over a Unix socket; the
producer runs the cases and the consumer reads what it is told to. Checks: torch's allocations inside
``with pool:`` land in the pool; a pooled tensor published without a copy (the consumer's second tensor
of the same segment is a view of the mapping it has: one segment id); a tensor deleted while published
keeps its memory for the holder (torch hands it out again only after it drained); 100 plain-tensor
share()s through one staging segment (drained copies reused: one export); a live state dict (the
consumer sees a later in-place write); a snapshot ordered by a fence (it goes out before the GPU ran
its copies, and the consumer's stream waits for them); a CUDA graph captured into the pool (its output published);
CuPy's allocator hook; empty_cache giving the segments back; and the typed errors (NotContiguous,
UnsupportedDtype, PoolClosed).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import gpu_roles

SKIP = 77
T = 60000


def setup():
    import torch
    torch.cuda.set_device(0)
    torch.zeros(1, device='cuda').item()
    return torch


# ---- the consumer: does what the producer asks ----

def role_reader(sock_path, broker_sock):
    setup()
    import gpuipc
    from multiprocessing.connection import Client
    conn = Client(sock_path, 'AF_UNIX')
    c = gpuipc.Client(socket=broker_sock, label='pool-reader')
    held = {}
    while True:
        try:
            cmd = conn.recv()
        except EOFError:
            break
        op, name = cmd[0], cmd[1]
        try:
            if op == 'read':  # attach, report the first value, the sum and the segment; release
                with c.attach(name, timeout_ms=T) as a:
                    t = a.torch()
                    conn.send({'first': float(t.view(-1)[0].item()), 'sum': float(t.double().sum().item()),
                               'segment': a.segment, 'numel': t.numel()})
                    del t
            elif op == 'hold':
                a = held[name] = c.attach(name, timeout_ms=T)
                conn.send({'first': float(a.torch().view(-1)[0].item()), 'segment': a.segment})
            elif op == 'peek':
                conn.send({'first': float(held[name].torch().view(-1)[0].item())})
            elif op == 'let-go':
                held.pop(name).release()
                conn.send({})
            elif op == 'sd':  # attach a state dict (keep it), report w[0]
                sd = held[name] = c.attach_state_dict(name, timeout_ms=T)
                conn.send({'w0': float(sd['w'].view(-1)[0].item()), 'live': sd.live, 'n': len(sd)})
            elif op == 'sd-peek':
                conn.send({'w0': float(held[name]['w'].view(-1)[0].item())})
            elif op == 'sd-release':
                held.pop(name).release()
                conn.send({})
        except Exception as e:
            conn.send({'error': f'{type(e).__name__}: {e}'})
    for h in held.values():
        h.release()
    c.close()


# ---- the producer: the cases ----

class Checks:
    def __init__(self):
        self.results = []

    def check(self, name, ok, detail=''):
        self.results.append((name, bool(ok), str(detail)))
        print(f'CHECK {"PASS" if ok else "FAIL"} {name}: {detail}', flush=True)


def case(checks, name, fn):
    try:
        fn()
    except Exception as e:
        traceback.print_exc()
        checks.check(name, False, f'{type(e).__name__}: {e}')


def role_owner(sock_path, broker_sock):
    torch = setup()
    import gpuipc
    from multiprocessing.connection import Listener
    c = gpuipc.Client(socket=broker_sock, label='pool-owner')
    listener = Listener(sock_path, 'AF_UNIX')
    print('listening', flush=True)
    conn = listener.accept()
    ch = Checks()

    def ask(*cmd):
        conn.send(cmd)
        r = conn.recv()
        if 'error' in r:
            raise RuntimeError(f'consumer: {r["error"]}')
        return r

    pool = c.pool(device=0)

    def zero_copy():
        with pool:
            a = torch.arange(1 << 20, dtype=torch.float32, device='cuda')
            b = torch.full((1 << 20,), 2.0, device='cuda')
        ch.check('torch allocations inside "with pool:" lie in the pool', pool.holds(a) and pool.holds(b),
                 f'{pool.stats()}')
        outside = torch.empty(16, device='cuda')
        ch.check('allocations outside the block do not', not pool.holds(outside))
        exports = pool.stats().exports
        c.publish(a, 'gp/a', retire_after=1)
        c.publish(b, 'gp/b', retire_after=1)
        ra, rb = ask('read', 'gp/a'), ask('read', 'gp/b')
        ch.check('a pooled tensor is read by a consumer in another PID namespace',
                 ra['first'] == 0 and ra['sum'] == float(sum(range(1 << 20))) and rb['first'] == 2.0, (ra, rb))
        ch.check('two tensors of one segment: one mapping in the consumer (same segment id)',
                 ra['segment'] == rb['segment'] != 0, (ra['segment'], rb['segment']))
        ch.check('publishing made no export', pool.stats().exports == exports, pool.stats())
        c.wait_drained(a, T)
        c.wait_drained(b, T)

    def freed_while_published():
        with pool:
            t = torch.full((1 << 20,), 7.0, device='cuda')
        ptr = t.data_ptr()
        c.publish(t, 'gp/held')
        got = ask('hold', 'gp/held')
        del t  # only the publication keeps it now
        with pool:
            other = torch.full((1 << 20,), 9.0, device='cuda')
        torch.cuda.synchronize()
        ch.check('a tensor deleted while published is not handed out again', other.data_ptr() != ptr,
                 f'{other.data_ptr():#x} vs {ptr:#x}')
        ch.check('its holder still reads its bytes', got['first'] == 7.0 and ask('peek', 'gp/held')['first'] == 7.0)
        c.free(_At(ptr, 1 << 20))  # unpublish: retired, let go once drained
        ask('let-go', 'gp/held')
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pool._reap()
            if not pool._live:
                break
            time.sleep(0.01)
        with pool:
            again = torch.empty(1 << 20, device='cuda')
        ch.check('after it drained, torch hands the memory out again', again.data_ptr() == ptr,
                 f'{again.data_ptr():#x} vs {ptr:#x}')
        del other, again

    def plain_share():
        src = torch.empty(1 << 20, device='cuda')
        staging = None
        for i in range(100):
            src.fill_(float(i))
            copy = c.share(src, f'gp/share/{i}', retire_after=1)
            staging = staging or c._staging[('cuda-vmm', 0)]
            r = ask('read', f'gp/share/{i}')
            if r['first'] != float(i):
                raise RuntimeError(f'share {i}: read {r["first"]}')
            c.wait_drained(copy, T)
            del copy
        st = staging.stats()
        ch.check('100 share()s of a plain tensor: one staging segment, one export (drained copies reused)',
                 st.segments == 1 and st.exports == 1, st)

    def live_state_dict():
        with pool:
            sd = {'w': torch.full((4096,), 3.0, device='cuda'), 'b': torch.ones(16, device='cuda')}
        c.publish_state_dict(sd, 'gp/live', copy=False)
        r = ask('sd', 'gp/live')
        ch.check('a live state dict attaches', r['live'] and r['w0'] == 3.0 and r['n'] == 2, r)
        sd['w'][0] = 5.0
        torch.cuda.synchronize()
        ch.check('the consumer sees a later write (no copy)', ask('sd-peek', 'gp/live')['w0'] == 5.0)
        ask('sd-release', 'gp/live')
        c.unpublish_state_dict('gp/live')

    def fenced_snapshot():
        fence = c.create_fence('gp/fence', device=0)
        sd = {'w': torch.zeros(1 << 20, device='cuda'), 'b': torch.ones(16, device='cuda')}
        c.reserve_state_dict('gp/fsnap', sd)
        torch.cuda.synchronize()
        torch.cuda._sleep(1 << 29)  # about 0.3 s of GPU time in the current stream, then the write
        sd['w'].fill_(7.0)
        c.publish_state_dict(sd, 'gp/fsnap', fence=fence)
        signalled = fence.value
        ch.check('a snapshot with a fence goes out before the GPU reached its copies', signalled == 0,
                 f'fence already at {signalled}')
        r = ask('sd', 'gp/fsnap')
        ch.check("its consumer's stream waits for the fence: it reads the write queued before the copies",
                 r.get('w0') == 7.0 and r.get('n') == 2, r)
        ask('sd-release', 'gp/fsnap')
        c.unpublish_state_dict('gp/fsnap')
        fence.close()

    def graph():
        gpool = c.pool(device=0, reserve=64 << 20)
        x = torch.arange(1 << 16, dtype=torch.float32, device='cuda')
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                x * 2 + 1  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=gpool.torch_pool.id):
            y = x * 2 + 1
        x.add_(1)
        g.replay()
        torch.cuda.synchronize()
        ch.check('a CUDA graph captured with pool=pool.torch_pool.id allocates in the pool', gpool.holds(y),
                 gpool.stats())
        c.publish(y, 'gp/graph', retire_after=1)
        r = ask('read', 'gp/graph')
        ch.check('its output, published, reads as replayed', r['first'] == 3.0, r)
        c.wait_drained(y, T)
        del y, g

    def cupy_hook():
        try:
            import cupy
        except ImportError:
            print('SKIP cupy: not installed')
            return
        cupy.cuda.set_allocator(pool.cupy_malloc)
        try:
            a = cupy.arange(1000, dtype=cupy.float32)
            ch.check("CuPy's allocations through pool.cupy_malloc lie in the pool", pool.holds(a))
            c.publish(a, 'gp/cupy', retire_after=1)
            r = ask('read', 'gp/cupy')
            ch.check('a CuPy array of the pool is read by a torch consumer', r['sum'] == float(sum(range(1000))), r)
            c.wait_drained(a, T)
            del a
        finally:
            cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)

    def errors():
        with pool:
            m = torch.ones(64, 32, device='cuda')
            z = torch.zeros(8, dtype=torch.complex32, device='cuda')
        try:
            c.publish_state_dict({'m': m.t()}, 'gp/nc', copy=False)
            ch.check('a non-contiguous entry of a live state dict: NotContiguous', False, 'no error')
        except gpuipc.NotContiguous as e:
            ch.check('a non-contiguous entry of a live state dict: NotContiguous', True, e)
        try:
            c.publish(z, 'gp/c32')
            ch.check('a dtype DLPack cannot carry: UnsupportedDtype', False, 'no error')
        except gpuipc.UnsupportedDtype as e:
            ch.check('a dtype DLPack cannot carry: UnsupportedDtype', True, e)
        p2 = c.pool(device=0)
        with p2:
            t = torch.ones(16, device='cuda')
        p2.close(force=True)
        try:
            c.publish(t, 'gp/closed')
            ch.check('a tensor of a closed pool: PoolClosed', False, 'no error')
        except gpuipc.PoolClosed as e:
            ch.check('a tensor of a closed pool: PoolClosed', True, e)
        del m, z

    def empty_cache():
        before = pool.stats()
        pool.empty_cache()
        st = pool.stats()
        # torch keeps a live MemPool's cached blocks through torch.cuda.empty_cache(): what it keeps
        # stays allocated in the pool (printed); the pool's own idle views must be gone.
        ch.check('empty_cache frees the idle views', st.views == 0 and st.allocated <= before.allocated,
                 f'before {before}, after {st}')

    for name, fn in (('zero copy', zero_copy), ('freed while published', freed_while_published),
                     ('plain share', plain_share), ('live state dict', live_state_dict),
                     ('fenced snapshot', fenced_snapshot), ('graph', graph),
                     ('cupy', cupy_hook), ('errors', errors), ('empty_cache', empty_cache)):
        case(ch, name, fn)
    conn.close()
    c.close()
    print('done', flush=True)


class _At:
    """Names a publication whose tensor the producer dropped: the bytes at ptr."""

    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    def _gpuipc_info(self):
        from gpuipc import dlpack
        return dlpack.Info(self.ptr, (dlpack.KDL_CUDA, 0), 'float32', (self.n,), None, False)


ROLES = {'owner': role_owner, 'reader': role_reader}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'build/broker/gpuipc-broker'))
    ap.add_argument('--role')
    ap.add_argument('args', nargs='*')
    opts = ap.parse_args()
    if opts.role:
        ROLES[opts.role](*opts.args)
        return 0
    os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')
    try:
        import torch
    except ImportError:
        print('skipped: torch is not installed')
        return SKIP
    if not torch.cuda.is_available():
        print('skipped: no CUDA device')
        return SKIP
    tmp = tempfile.mkdtemp(prefix='gpuipc-gpu-pool.')
    sock = os.path.join(tmp, 'gpuipc.sock')
    broker = subprocess.Popen([opts.broker, '--socket', sock, '--seccomp', 'enforce', '--log-level', 'warn'],
                              stderr=open(os.path.join(tmp, 'broker.log'), 'w'))
    can_unshare = shutil.which('unshare') is not None and subprocess.run(
        ['unshare', '--pid', '--fork', '--mount-proc', 'true'], capture_output=True).returncode == 0
    results, owner, reader = [], None, None
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        link = os.path.join(tmp, 'link.sock')
        owner = gpu_roles.Role(__file__, 'owner', link, sock, pidns=can_unshare, step_timeout_s=240)
        owner.expect('listening')
        reader = gpu_roles.Role(__file__, 'reader', link, sock, pidns=can_unshare, step_timeout_s=240)
        while True:
            line = owner.p.stdout.readline()
            if not line:
                break
            line = line.rstrip()
            print(line, flush=True)
            if line.startswith('CHECK '):
                results.append(line.split()[1] == 'PASS')
            if line == 'done':
                break
        if not can_unshare:
            print('note: unshare --pid is not permitted here: producer and consumer shared a PID namespace')
    except Exception as e:
        traceback.print_exc()
        results.append(False)
        print(f'FAIL the run: {e}')
    finally:
        for r in (reader, owner):
            if r is not None:
                r.stop()
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(results)
    print(f'{passed} passed, {len(results) - passed} failed')
    return 0 if results and passed == len(results) else 1


if __name__ == '__main__':
    sys.exit(main())
