#!/usr/bin/env python3
"""Where a ring frame waits: a timeline of both sides of a GPU ring, host and GPU, on one machine.

    PYTHONPATH=python GPUIPC_LIBRARY=build/client/libgpuipc.so \\
        python3 tests/bench/ring_trace.py --broker build/broker/gpuipc-broker --mode stream --consumers 1

A producer and N consumer processes pass frames through a ring of 8 cuda-vmm slots of 16 MiB, as
torch_compare.py's ring rows do (the producer fills each slot with torch, each consumer checks the
frame's first element on the GPU). Every process records, per frame, when each host call entered
and left (CLOCK_MONOTONIC) and, through a one-thread kernel that stores the GPU's %globaltimer into
a buffer of its own queued right after each call in the same stream, when the GPU got past it. The
GPU clock is the same for every process on the GPU, so cross-process hand-overs are timed on it
directly; each process also maps it onto CLOCK_MONOTONIC (the tightest of 20 launches bracketed by
host clocks) to say how far its host runs ahead of its stream.

--api python uses the gpuipc package as a user would (ring.acquire/publish/take/release,
frame.torch()); --api raw calls libgpuipc through ctypes and fills and reads with the driver's
cuMemsetD32Async and cuMemcpyDtoDAsync (about gpu-ring.c's C loop, plus ctypes). --mode host uses
the host doorbells (publish synchronizes the producer's device; a consumer synchronizes its stream
before it releases). A second run of the same loop without the stamp kernels gives the undisturbed
time per frame. Prints a summary; --out DIR keeps every process's records as JSON.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_compare  # noqa: E402  (Broker, fill_value)

SLOTS = 8
POINTS = ('acquire', 'fill', 'publish', 'take', 'ops', 'release')  # stamp points: producer 0-2, consumer 3-5
N_CAL = 20

# stores %globaltimer (ns) into out[idx]
STAMP_PTX = rb'''
.version 7.0
.target sm_75
.address_size 64
.visible .entry gpuipc_stamp(.param .u64 out, .param .u32 idx)
{
        .reg .b64 %rd<5>;
        .reg .b32 %r<2>;
        ld.param.u64 %rd1, [out];
        ld.param.u32 %r1, [idx];
        mov.u64 %rd2, %globaltimer;
        mul.wide.u32 %rd3, %r1, 8;
        add.s64 %rd4, %rd1, %rd3;
        st.global.u64 [%rd4], %rd2;
        ret;
}
'''


class Stamper:
    """The stamp kernel in torch's context: stamp(stream, idx) queues out[idx] = %globaltimer."""

    def __init__(self, torch, dev, slots):
        self.cu = ctypes.CDLL('libcuda.so.1')
        self.buf = torch.zeros(slots, dtype=torch.int64, device=f'cuda:{dev}')
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._ok(self.cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(STAMP_PTX)), 'cuModuleLoadData')
        self._ok(self.cu.cuModuleGetFunction(ctypes.byref(fn), mod, b'gpuipc_stamp'), 'cuModuleGetFunction')
        self.fn = fn
        self.ptr = ctypes.c_uint64(self.buf.data_ptr())
        self.idx = ctypes.c_uint32(0)
        self.params = (ctypes.c_void_p * 2)(ctypes.addressof(self.ptr), ctypes.addressof(self.idx))
        self.params_p = ctypes.cast(self.params, ctypes.c_void_p)
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

    @staticmethod
    def _ok(r, what):
        if r != 0:
            raise RuntimeError(f'{what} = {r}')

    def stamp(self, stream, idx):
        self.idx.value = idx
        self._ok(self.cu.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, stream, self.params_p, None), 'cuLaunchKernel')


def calibrate(torch, st, stream_obj, base):
    """(offset, uncertainty) in ns with globaltimer = CLOCK_MONOTONIC + offset."""
    brackets = []
    for k in range(N_CAL):
        t0 = time.monotonic_ns()
        st.stamp(stream_obj.cuda_stream, base + k)
        stream_obj.synchronize()
        brackets.append((t0, time.monotonic_ns()))
    g = st.buf[base:base + N_CAL].tolist()
    best = min(range(N_CAL), key=lambda k: brackets[k][1] - brackets[k][0])
    t0, t1 = brackets[best]
    return g[best] - (t0 + t1) // 2, (t1 - t0) // 2


def role(kind, idx, sock, args, ready, results):
    """One process of the trace: 'producer' or 'consumer'."""
    torch = torch_compare.cuda_init(0)
    torch_compare.warm_ring_ops(torch, 0)
    import gpuipc
    frames, stamps = args.frames, not args.no_stamps
    c = gpuipc.Client(socket=sock, label=f'trace-{kind}-{idx}')
    s = torch.cuda.Stream(device=0)
    st = Stamper(torch, 0, (frames + 1) * len(POINTS) + N_CAL) if stamps else None
    cal_base = (frames + 1) * len(POINTS)
    lib = c._lib
    cu = ctypes.CDLL('libcuda.so.1')
    host = [[0] * 6 for _ in range(frames + 1)]
    bad = torch.zeros(1, dtype=torch.int64, device='cuda:0')
    kept = torch.zeros(1024, dtype=torch.int32, device='cuda:0')
    mode = 'stream' if args.mode == 'stream' else 'backpressure'
    if kind == 'producer':
        ring = c.ring('trace/ring', slots=SLOTS, slot_size=16 << 20, mode=mode, kind='cuda-vmm', device=0,
                      max_members=args.consumers, lease_ms=120000)
        results.put(('created', idx, None))
        for _ in range(args.consumers):
            ready.get(timeout=120)
        c.process()  # the member-joined events: every member is seated from frame 1
    else:
        ring = c.join_ring('trace/ring', timeout_ms=120000)
        ready.put(idx)
    h = ring._handle
    slot, number = ctypes.c_void_p(), ctypes.c_uint64()
    sh = s.cuda_stream
    base_pt = 0 if kind == 'producer' else 3
    torch.cuda.synchronize()
    t_start = time.monotonic_ns()
    now = time.monotonic_ns

    def mark(n, k):
        if st:
            st.stamp(sh, n * len(POINTS) + base_pt + k)

    with torch.cuda.stream(s):
        for n in range(1, frames + 1):
            rec = host[n]
            v = torch_compare.fill_value(n - 1)
            if kind == 'producer':
                rec[0] = now()
                if args.api == 'python':
                    frame = ring.acquire(timeout_ms=120000, stream=s if mode == 'stream' else None)
                elif mode == 'stream':
                    c._check(lib.gpuipc_ring_stream_acquire(h, sh, 120000, ctypes.byref(slot)), 'acquire')
                else:
                    c._check(lib.gpuipc_ring_acquire(h, 120000, ctypes.byref(slot)), 'acquire')
                rec[1] = now()
                mark(n, 0)
                rec[2] = now()
                if args.api == 'python':
                    frame.torch().fill_(v)
                else:
                    Stamper._ok(cu.cuMemsetD32Async(ctypes.c_uint64(lib.gpuipc_buffer_ptr(slot)),
                                                    ctypes.c_uint(v * 0x01010101), ctypes.c_size_t((16 << 20) // 4),
                                                    ctypes.c_void_p(sh)), 'cuMemsetD32Async')
                rec[3] = now()
                mark(n, 1)
                rec[4] = now()
                if args.api == 'python':
                    ring.publish(stream=s if mode == 'stream' else None)
                elif mode == 'stream':
                    c._check(lib.gpuipc_ring_stream_publish(h, sh, ctypes.byref(number)), 'publish')
                else:
                    c._check(lib.gpuipc_ring_publish(h, ctypes.byref(number)), 'publish')
                rec[5] = now()
                mark(n, 2)
            else:
                rec[0] = now()
                if args.api == 'python':
                    frame = ring.take(timeout_ms=120000, stream=s if mode == 'stream' else None)
                    got = frame.number
                elif mode == 'stream':
                    c._check(lib.gpuipc_ring_stream_take(h, sh, 120000, ctypes.byref(slot), ctypes.byref(number)),
                             'take')
                    got = number.value
                else:
                    c._check(lib.gpuipc_ring_take(h, 120000, ctypes.byref(slot), ctypes.byref(number)), 'take')
                    got = number.value
                rec[1] = now()
                if got != n:
                    raise RuntimeError(f'consumer {idx} took frame {got}, expected {n}')
                mark(n, 0)
                rec[2] = now()
                if args.api == 'python':
                    bad += (frame.torch()[0] != v).to(torch.int64)
                else:
                    Stamper._ok(cu.cuMemcpyDtoDAsync_v2(ctypes.c_uint64(kept.data_ptr() + (n % 1024) * 4),
                                                        ctypes.c_uint64(lib.gpuipc_buffer_ptr(slot)),
                                                        ctypes.c_size_t(4), ctypes.c_void_p(sh)),
                                'cuMemcpyDtoDAsync')
                if mode != 'stream':
                    s.synchronize()  # host doorbells: done reading before the release
                rec[3] = now()
                mark(n, 1)
                rec[4] = now()
                if args.api == 'python':
                    frame.release()
                elif mode == 'stream':
                    c._check(lib.gpuipc_ring_stream_release(h, sh), 'release')
                else:
                    c._check(lib.gpuipc_ring_release(h), 'release')
                rec[5] = now()
                mark(n, 2)
    s.synchronize()
    t_end = time.monotonic_ns()
    out = {'kind': kind, 'idx': idx, 'host': host, 't_start': t_start, 't_end': t_end, 'bad': int(bad.item())}
    if st:
        out['offset'], out['offset_err'] = calibrate(torch, st, s, cal_base)
        out['gpu'] = st.buf[:cal_base].tolist()
    if kind == 'producer':
        results.put(('done', idx, out))
        ready.get(timeout=120)  # every consumer has finished
    else:
        results.put(('done', idx, out))
    ring.close()
    c.close()


def run(ctx, args, sock):
    ready, results = ctx.Queue(), ctx.Queue()
    prod = ctx.Process(target=role, args=('producer', 0, sock, args, ready, results), daemon=True)
    prod.start()
    kind, _, _ = results.get(timeout=120)
    assert kind == 'created'
    cons = [ctx.Process(target=role, args=('consumer', i, sock, args, ready, results), daemon=True)
            for i in range(args.consumers)]
    for p in cons:
        p.start()
    recs = [results.get(timeout=300) for _ in range(args.consumers + 1)]
    ready.put('bye')
    for p in cons + [prod]:
        p.join(timeout=60)
    return [r[2] for r in recs]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) / 1000 if xs else float('nan')


def p90(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[int(0.9 * (len(xs) - 1))] / 1000 if xs else float('nan')


def summarize(recs, args, label):
    prod = next(r for r in recs if r['kind'] == 'producer')
    cons = [r for r in recs if r['kind'] == 'consumer']
    F = args.frames
    lo = min(F // 5, 50) + 1  # skip the start
    span = range(lo, F + 1)
    end = max(r['t_end'] for r in recs)
    per_frame = (end - prod['t_start']) / F / 1000
    lines = [f'{label}: {per_frame:.1f} us per frame ({F} frames, end to end)']
    if any(r['bad'] for r in recs):
        lines.append(f'  WRONG VALUES: {[r["bad"] for r in recs]}')
    if 'gpu' not in prod:
        return lines

    def g(r, n, k):
        base = 0 if r['kind'] == 'producer' else 3
        v = r['gpu'][n * len(POINTS) + base + k]
        return v or None

    def hk(r, n, k):  # host time k of frame n on the GPU clock
        return r['host'][n][k] + r['offset']

    def host_rows(r, names):
        out = []
        for i, nm in enumerate(names):
            d = [r['host'][n][2 * i + 1] - r['host'][n][2 * i] for n in span]
            out.append(f'{nm} {med(d):.1f}/{p90(d):.1f}')
        return ', '.join(out)

    lines.append(f'  host time in each call, median/p90 us: producer: '
                 f'{host_rows(prod, ("acquire", "fill", "publish"))}')
    for r in cons[:2]:
        lines.append(f'  consumer {r["idx"]}: {host_rows(r, ("take", "ops", "release"))}')
    # GPU: period, and the producer's stream
    period = [g(prod, n + 1, 2) - g(prod, n, 2) for n in span if n + 1 <= F and g(prod, n + 1, 2) and g(prod, n, 2)]
    lines.append(f'  GPU period (producer stream past publish n to n+1): median {med(period):.1f} us, '
                 f'p90 {p90(period):.1f}')
    fill = [g(prod, n, 1) - g(prod, n, 0) for n in span if g(prod, n, 1) and g(prod, n, 0)]
    lines.append(f'  GPU: producer fill took {med(fill):.1f} us (past acquire -> past fill)')
    # the producer's wait in the stream: past publish n-1 until past acquire n
    pwait = [g(prod, n, 0) - g(prod, n - 1, 2) for n in span if g(prod, n, 0) and g(prod, n - 1, 2)]
    lines.append(f'  GPU: producer stream, past publish n-1 -> past acquire n (its wait for the release of '
                 f'n-{SLOTS}): {med(pwait):.1f}/{p90(pwait):.1f} us')
    # cross-process hand-overs on the GPU clock
    for r in cons[:2]:
        ready_lat = [g(r, n, 0) - g(prod, n, 2) for n in span if g(r, n, 0) and g(prod, n, 2)]
        ops = [g(r, n, 1) - g(r, n, 0) for n in span if g(r, n, 1) and g(r, n, 0)]
        lines.append(f'  GPU: producer past publish n -> consumer {r["idx"]} past take n: {med(ready_lat):.1f}/'
                     f'{p90(ready_lat):.1f} us; its ops {med(ops):.1f} us')
    done_lat = [g(prod, n + SLOTS, 0) - max(g(r, n, 2) for r in cons) for n in span
                if n + SLOTS <= F and g(prod, n + SLOTS, 0) and all(g(r, n, 2) for r in cons)]
    lines.append(f'  GPU: last consumer past release n -> producer past acquire n+{SLOTS}: {med(done_lat):.1f}/'
                 f'{p90(done_lat):.1f} us (negative: the producer was not waiting for it)')
    # who waits for whom: the host's lead over its stream
    for r, nm in [(prod, 'producer')] + [(x, f'consumer {x["idx"]}') for x in cons[:2]]:
        lead = [g(r, n, 0) - hk(r, n, 1) for n in span if g(r, n, 0)]
        if not lead:
            continue
        late = sum(1 for x in lead if x < 20000)
        lines.append(f'  {nm}: GPU past its first call {med(lead):.1f} us after the host returned from it '
                     f'(p10 {sorted(lead)[len(lead) // 10] / 1000:.1f}); {late} of {len(lead)} frames under 20 us: '
                     f'the stream waited for the host (clock offset +-{r["offset_err"] / 1000:.1f} us)')
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'gpuipc-broker'))
    ap.add_argument('--mode', choices=('stream', 'host'), default='stream')
    ap.add_argument('--api', choices=('python', 'raw'), default='python')
    ap.add_argument('--consumers', type=int, default=1)
    ap.add_argument('--frames', type=int, default=400)
    ap.add_argument('--out', help='keep the records here (JSON)')
    ap.add_argument('--no-stamps', action='store_true', help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context('spawn')
    broker = torch_compare.Broker(args.broker)
    label = f'{args.mode} ring, {args.api} API, {args.consumers} consumer(s)' + \
        (' [MPS]' if os.environ.get('CUDA_MPS_PIPE_DIRECTORY') else '')
    try:
        recs = run(ctx, args, broker.sock)
        args.no_stamps = True
        plain = run(ctx, args, broker.sock)
        args.no_stamps = False
    finally:
        broker.stop()
    lines = summarize(plain, args, label + ', no stamps')[:1] + summarize(recs, args, label + ', with stamps')
    print('\n'.join(lines), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = f'{args.mode}-{args.api}-{args.consumers}' + ('-mps' if os.environ.get('CUDA_MPS_PIPE_DIRECTORY') else '')
        with open(os.path.join(args.out, f'trace-{tag}.json'), 'w') as f:
            json.dump({'args': vars(args), 'records': recs, 'summary': lines}, f)
    return 0


if __name__ == '__main__':
    sys.exit(main())
