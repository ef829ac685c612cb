#!/usr/bin/env python3
"""PyTorch's own CUDA IPC (tensors through torch.multiprocessing queues) next to gpuipc's Python
module, on one machine with a GPU. Part of `gpuipc-bench --gpu`, which passes the paths; by hand:

    PYTHONPATH=python GPUIPC_LIBRARY=build/client/libgpuipc.so \\
        python3 tests/bench/torch_compare.py --broker build/broker/gpuipc-broker

(a) share: from "the producer hands over one new CUDA tensor" until all N consumer processes have
    read it (each reads one element, which waits for the data), N = 1 and 8. torch: the tensor
    goes into N queues; gpuipc: a cuda-vmm buffer is published once (retire_after=N) to consumers
    already waiting in attach. A new tensor per trial, so both pay their first-share costs.
(b) ring: 8 tensors passed round 1000 times to N consumers; the producer refills a slot only
    after every consumer is done with it. torch: each consumer acks on a queue; gpuipc: each
    publish has retire_after=N and the producer waits for drained before reusing the slot.
(c) the same with gpuipc's stream-ordered ring (mode='stream'): the producer fills a slot in its
    stream, consumers read it in theirs, and the hand-over is a counter each stream writes and
    waits on; no broker round trip and no host wait per frame. Each consumer checks every frame's
    value on the GPU (an error count in its stream, read once at the end) instead of reading it to
    the host; the time runs until the last consumer's stream has finished.
(d) the same with gpuipc's host ring (mode='backpressure', cuda-vmm slots): publish synchronizes
    the producer's device, each consumer synchronizes its stream before it releases.
(e) the floor of (c) and (d): the ring loop's own torch operations (one producer's fill and one
    consumer's check, for (d) with the same synchronizations) on local tensors in one process, no
    IPC; consumers run side by side, so it is the floor for any number of them.
(f) the floor of (d) between processes: the same torch operations and synchronizations in a
    producer and N consumer processes that share the slots through torch's CUDA IPC (once, before
    the timed part) and hand each frame over through counters in shared memory the waiting side
    spins on; no gpuipc, no system call. It pays what (e) cannot: each synchronization waits for the
    GPU to run that process's context, and without MPS the GPU time-slices between contexts.
The stream ring's rows are judged against the larger of (e) and the C stream ring (gpu-ring.c, the
same run, passed in with --c-ring), the host ring's against (f), which does the same work in the same
processes (under MPS it beats (e), which runs the producer's and the consumer's steps one after the
other): at most 1.5x. Every process runs its loop's operations once before the timed part (their
first use loads the kernels).

--rings-only runs (c)-(f) and torch's ring of (b), with --suffix appended to every metric (the
MPS pass of gpuipc-bench). Prints a table, and with --tsv writes the rows for gpuipc-bench
(metric, value, unit, baseline, baseline value, target, note; ratio = value / baseline). Exit
status 77 when torch or a GPU is missing, 1 when a measurement failed (the others are still
reported).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

RING_SLOTS = 8


def now_us():
    return time.monotonic_ns() / 1000.0


def fill_value(i):
    return i % 251 + 1


def pct(values, p):
    s = sorted(values)
    if not s:
        return float('nan')
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def cuda_init(dev):
    import torch
    torch.cuda.set_device(dev)
    torch.zeros(1, device=f'cuda:{dev}').item()  # creates the context outside the timed part
    return torch


def warm_ring_ops(torch, dev):
    """The ring loops' torch operations once on a local tensor, outside the timed part: their first
    use loads the kernels (CUDA's lazy loading costs tens of ms per process, once)."""
    t = torch.empty(64, dtype=torch.uint8, device=f'cuda:{dev}')
    t.fill_(1)
    bad = torch.zeros(1, dtype=torch.int64, device=f'cuda:{dev}')
    bad += (t[0] != fill_value(0)).to(torch.int64)
    int(t[0].item())
    torch.cuda.synchronize()


# ---- consumers (top level: the spawn start method imports this file in each child) ----

def torch_share_consumer(idx, q, results, ready, dev):
    cuda_init(dev)
    ready.put(idx)
    while True:
        item = q.get()
        if item is None:
            break
        trial, t = item
        v = int(t[0].item())
        results.put((trial, idx, now_us(), v))
        del t, item


def gpuipc_share_consumer(idx, sock, trials, results, ready, dev):
    cuda_init(dev)
    import gpuipc
    c = gpuipc.Client(socket=sock, label=f'share-consumer-{idx}')
    ready.put(idx)
    for trial in range(trials):
        a = c.attach(f'bench/share/{trial}', timeout_ms=120000)
        t = a.torch()
        v = int(t[0].item())
        results.put((trial, idx, now_us(), v))
        del t
        a.release()
    c.close()


def torch_ring_consumer(idx, q, acks, ready, dev, errors):
    warm_ring_ops(cuda_init(dev), dev)
    ready.put(idx)
    bad = 0
    while True:
        item = q.get()
        if item is None:
            break
        i, slot, t = item
        if int(t[0].item()) != fill_value(i):
            bad += 1
        del t, item
        acks.put(slot)
    errors.put(bad)


def gpuipc_ring_consumer(idx, sock, iters, ready, dev, errors):
    warm_ring_ops(cuda_init(dev), dev)
    import gpuipc
    c = gpuipc.Client(socket=sock, label=f'ring-consumer-{idx}')
    ready.put(idx)
    bad = 0
    for i in range(iters):
        a = c.attach(f'bench/ring/{i}', timeout_ms=120000)
        t = a.torch()
        if int(t[0].item()) != fill_value(i):
            bad += 1
        del t
        a.release()
    errors.put(bad)
    c.close()


def gpuipc_stream_ring_consumer(idx, sock, iters, ready, dev, results):
    torch = cuda_init(dev)
    import gpuipc
    warm_ring_ops(torch, dev)
    c = gpuipc.Client(socket=sock, label=f'stream-ring-consumer-{idx}')
    ring = c.join_ring('bench/sring', timeout_ms=120000)
    s = torch.cuda.Stream(device=dev)
    bad = torch.zeros(1, dtype=torch.int64, device=f'cuda:{dev}')
    ready.put(idx)
    first, last = None, 0
    with torch.cuda.stream(s):
        for frame in ring.frames(timeout_ms=120000, stream=s):
            first = first or frame.number
            last = frame.number
            bad += (frame.torch()[0] != fill_value(frame.number - 1)).to(torch.int64)
            if frame.number >= iters:
                frame.release()
                break
    s.synchronize()
    results.put((idx, now_us(), int(bad.item()), first, last))
    ring.close()
    c.close()


def gpuipc_host_ring_consumer(idx, sock, iters, ready, dev, results):
    torch = cuda_init(dev)
    import gpuipc
    warm_ring_ops(torch, dev)
    c = gpuipc.Client(socket=sock, label=f'host-ring-consumer-{idx}')
    ring = c.join_ring('bench/hring', timeout_ms=120000)
    s = torch.cuda.Stream(device=dev)
    bad = torch.zeros(1, dtype=torch.int64, device=f'cuda:{dev}')
    ready.put(idx)
    first, last = None, 0
    with torch.cuda.stream(s):
        for frame in ring.frames(timeout_ms=120000):
            first = first or frame.number
            last = frame.number
            bad += (frame.torch()[0] != fill_value(frame.number - 1)).to(torch.int64)
            s.synchronize()  # done reading before the release (host doorbells)
            if frame.number >= iters:
                frame.release()
                break
    results.put((idx, now_us(), int(bad.item()), first, last))
    ring.close()
    c.close()


def spin_until(cond, gone, what, timeout_s=120):
    """Spins until cond() (the hand-over floor's waits), raising once timeout_s passed or gone() says
    the other side died: without it a consumer that crashed would leave the producer spinning for
    ever, and the producer's death every consumer. Looks at the clock every 4096 spins."""
    deadline, spins = time.monotonic() + timeout_s, 0
    while not cond():
        spins += 1
        if spins % 4096 == 0 and (gone() or time.monotonic() > deadline):
            raise RuntimeError(f'hand-over floor: {what} ' + ('died' if gone() else f'not done in {timeout_s} s'))


def handover_floor_consumer(idx, slots, published, done, ready, dev, results):
    """A consumer of handover_floor: spins until frame i is published, checks it in its stream, waits
    for its stream (the host ring's release does), and says it is done with the frame."""
    torch = cuda_init(dev)
    warm_ring_ops(torch, dev)
    s = torch.cuda.Stream(device=dev)
    bad = torch.zeros(1, dtype=torch.int64, device=f'cuda:{dev}')
    iters, producer = published[1], os.getppid()
    ready.put(idx)
    with torch.cuda.stream(s):
        for i in range(iters):
            spin_until(lambda: published[0] > i, lambda: os.getppid() != producer, 'the producer')
            bad += (slots[i % RING_SLOTS][0] != fill_value(i)).to(torch.int64)
            s.synchronize()
            done[idx] = i + 1
    results.put((idx, now_us(), int(bad.item())))


# ---- producers ----

def start(ctx, target, args_list):
    procs = [ctx.Process(target=target, args=args, daemon=True) for args in args_list]
    for p in procs:
        p.start()
    return procs


def join(procs):
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f'a consumer exited with status {p.exitcode}')


def gather(results, n, trial, want):
    got = [results.get(timeout=120) for _ in range(n)]
    for (tr, idx, ts, v) in got:
        if tr != trial or v != want:
            raise RuntimeError(f'consumer {idx} saw trial {tr} value {v}, expected trial {trial} value {want}')
    return max(ts for (_, _, ts, _) in got)


def share_torch(ctx, n, trials, nbytes, dev):
    import torch
    qs = [ctx.Queue() for _ in range(n)]
    results, ready = ctx.Queue(), ctx.Queue()
    procs = start(ctx, torch_share_consumer, [(i, qs[i], results, ready, dev) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    out = []
    for trial in range(trials + 1):  # trial 0 warms up the queues' feeder threads
        t = torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}')
        t.fill_(fill_value(trial))
        torch.cuda.synchronize()
        time.sleep(0.05)  # every consumer is back in q.get()
        t0 = now_us()
        for q in qs:
            q.put((trial, t))
        last = gather(results, n, trial, fill_value(trial))
        if trial:
            out.append(last - t0)
        del t
    for q in qs:
        q.put(None)
    join(procs)
    return out


def share_gpuipc(ctx, n, trials, nbytes, dev, sock):
    import gpuipc
    import torch
    results, ready = ctx.Queue(), ctx.Queue()
    procs = start(ctx, gpuipc_share_consumer, [(i, sock, trials + 1, results, ready, dev) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    c = gpuipc.Client(socket=sock, label='share-producer')
    out, publish = [], []
    for trial in range(trials + 1):
        t = c.empty((nbytes,), 'uint8', kind='cuda-vmm', device=dev)
        t.fill_(fill_value(trial))
        torch.cuda.synchronize()
        time.sleep(0.05)  # every consumer is parked in attach
        t0 = now_us()
        c.publish(t, f'bench/share/{trial}', retire_after=n)
        t1 = now_us()
        last = gather(results, n, trial, fill_value(trial))
        if trial:
            out.append(last - t0)
            publish.append(t1 - t0)
        c.wait_drained(t, timeout_ms=60000)
        c.free(t)
    join(procs)
    c.close()
    return out, publish


def ring_torch(ctx, n, iters, nbytes, dev):
    import torch
    warm_ring_ops(torch, dev)
    qs = [ctx.Queue() for _ in range(n)]
    acks, ready, errors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = start(ctx, torch_ring_consumer, [(i, qs[i], acks, ready, dev, errors) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    slots = [torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}') for _ in range(RING_SLOTS)]
    pending = [0] * RING_SLOTS
    torch.cuda.synchronize()
    t0 = now_us()
    for i in range(iters):
        s = i % RING_SLOTS
        while pending[s]:
            pending[acks.get(timeout=120)] -= 1
        slots[s].fill_(fill_value(i))
        for q in qs:
            q.put((i, s, slots[s]))
        pending[s] = n
    while any(pending):
        pending[acks.get(timeout=120)] -= 1
    elapsed = now_us() - t0
    for q in qs:
        q.put(None)
    bad = sum(errors.get(timeout=120) for _ in range(n))
    join(procs)
    if bad:
        raise RuntimeError(f'torch ring: consumers read {bad} stale or wrong values')
    return elapsed


def ring_gpuipc(ctx, n, iters, nbytes, dev, sock):
    import gpuipc
    import torch
    warm_ring_ops(torch, dev)
    ready, errors = ctx.Queue(), ctx.Queue()
    procs = start(ctx, gpuipc_ring_consumer, [(i, sock, iters, ready, dev, errors) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    c = gpuipc.Client(socket=sock, label='ring-producer')
    slots = [c.empty((nbytes,), 'uint8', kind='cuda-vmm', device=dev) for _ in range(RING_SLOTS)]
    used = [False] * RING_SLOTS
    torch.cuda.synchronize()
    t0 = now_us()
    for i in range(iters):
        s = i % RING_SLOTS
        if used[s]:
            c.wait_drained(slots[s], timeout_ms=120000)
        slots[s].fill_(fill_value(i))
        c.publish(slots[s], f'bench/ring/{i}', retire_after=n)  # synchronizes the device first
        used[s] = True
    for s in range(RING_SLOTS):
        if used[s]:
            c.wait_drained(slots[s], timeout_ms=120000)
    elapsed = now_us() - t0
    bad = sum(errors.get(timeout=120) for _ in range(n))
    join(procs)
    for t in slots:
        c.free(t)
    c.close()
    if bad:
        raise RuntimeError(f'gpuipc ring: consumers read {bad} stale or wrong values')
    return elapsed


def ring_gpuipc_stream(ctx, n, iters, nbytes, dev, sock):
    import gpuipc
    import torch
    warm_ring_ops(torch, dev)
    ready, results = ctx.Queue(), ctx.Queue()
    c = gpuipc.Client(socket=sock, label='stream-ring-producer')
    ring = c.ring('bench/sring', slots=RING_SLOTS, slot_size=nbytes, mode='stream', kind='cuda-vmm', device=dev,
                  max_members=n, lease_ms=120000)
    procs = start(ctx, gpuipc_stream_ring_consumer, [(i, sock, iters, ready, dev, results) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    c.process()  # reads the member-joined events: every member is seated from frame 1
    s = torch.cuda.Stream(device=dev)
    torch.cuda.synchronize()
    t0 = now_us()
    with torch.cuda.stream(s):
        for i in range(iters):
            frame = ring.acquire(timeout_ms=120000, stream=s)
            frame.torch().fill_(fill_value(i))
            ring.publish(stream=s)
    done = [results.get(timeout=120) for _ in range(n)]
    elapsed = max(r[1] for r in done) - t0
    join(procs)
    ring.close()
    c.close()
    bad = sum(r[2] for r in done)
    skipped = [r for r in done if r[3] != 1 or r[4] != iters]
    if bad or skipped:
        raise RuntimeError(f'gpuipc stream ring: {bad} wrong values; consumers that did not see frames 1..{iters}: '
                           f'{skipped}')
    return elapsed


def ring_gpuipc_host(ctx, n, iters, nbytes, dev, sock):
    import gpuipc
    import torch
    warm_ring_ops(torch, dev)
    ready, results = ctx.Queue(), ctx.Queue()
    c = gpuipc.Client(socket=sock, label='host-ring-producer')
    ring = c.ring('bench/hring', slots=RING_SLOTS, slot_size=nbytes, mode='backpressure', kind='cuda-vmm',
                  device=dev, max_members=n, lease_ms=120000)
    procs = start(ctx, gpuipc_host_ring_consumer, [(i, sock, iters, ready, dev, results) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    c.process()  # reads the member-joined events: every member is seated from frame 1
    s = torch.cuda.Stream(device=dev)
    torch.cuda.synchronize()
    t0 = now_us()
    with torch.cuda.stream(s):
        for i in range(iters):
            frame = ring.acquire(timeout_ms=120000)
            frame.torch().fill_(fill_value(i))
            ring.publish()  # synchronizes the device first
    done = [results.get(timeout=120) for _ in range(n)]
    elapsed = max(r[1] for r in done) - t0
    join(procs)
    ring.close()
    c.close()
    bad = sum(r[2] for r in done)
    skipped = [r for r in done if r[3] != 1 or r[4] != iters]
    if bad or skipped:
        raise RuntimeError(f'gpuipc host ring: {bad} wrong values; consumers that did not see frames 1..{iters}: '
                           f'{skipped}')
    return elapsed


def ring_floor(iters, nbytes, dev, mode):
    """Microseconds per frame of the ring loop's own torch operations on local tensors, no IPC: one
    producer's fill and one consumer's check, one after the other in one process (mode 'host': with
    the synchronizations the host ring's hand-over needs, the producer's device and the consumer's
    stream). More consumers run their checks in processes of their own, side by side: the floor of
    a frame is the same for any number of them."""
    import torch
    slots = [torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}') for _ in range(RING_SLOTS)]
    bad = torch.zeros(1, dtype=torch.int64, device=f'cuda:{dev}')
    s = torch.cuda.Stream(device=dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        for warm in (True, False):
            t0 = now_us()
            for i in range(iters // 10 if warm else iters):
                t = slots[i % RING_SLOTS]
                t.fill_(fill_value(i))
                if mode == 'host':
                    torch.cuda.synchronize()
                bad += (t[0] != fill_value(i)).to(torch.int64)
                if mode == 'host':
                    s.synchronize()
            s.synchronize()
    elapsed = now_us() - t0
    if int(bad.item()):
        raise RuntimeError('floor: wrong values')
    return elapsed / iters


def handover_floor(ctx, n, iters, nbytes, dev):
    """Microseconds per frame of the host ring's hand-over with nothing of gpuipc in it: the same
    torch operations and synchronizations as (d) (the producer fills a slot and synchronizes its
    device, each consumer checks the frame in its stream and synchronizes it), in separate processes
    that share the 8 slots through torch's CUDA IPC (once, before the timed part) and hand frames over
    through counters in shared memory that the waiting side spins on: no broker, no system call, no
    sleep. Unlike ring_floor it pays what a hand-over between processes costs on the GPU itself (each
    synchronization waits for the GPU to run that process's context; without MPS the GPU time-slices
    between contexts), so no host-synchronized ring between processes can beat it."""
    import torch
    warm_ring_ops(torch, dev)
    slots = [torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}') for _ in range(RING_SLOTS)]
    torch.cuda.synchronize()
    published = ctx.RawArray('q', 2)  # [0]: frames published; [1]: frames in the run
    published[1] = iters
    done = ctx.RawArray('q', n)  # frames each consumer is done with
    ready, results = ctx.Queue(), ctx.Queue()
    procs = start(ctx, handover_floor_consumer, [(i, slots, published, done, ready, dev, results) for i in range(n)])
    for _ in range(n):
        ready.get(timeout=120)
    t0 = now_us()
    for i in range(iters):
        for j in range(n):  # slot i % 8 last held frame i - 8: every consumer done with it
            spin_until(lambda: done[j] >= i - RING_SLOTS + 1, lambda: procs[j].exitcode is not None,
                       f'consumer {j}')
        slots[i % RING_SLOTS].fill_(fill_value(i))
        torch.cuda.synchronize()
        published[0] = i + 1
    got = [results.get(timeout=120) for _ in range(n)]
    elapsed = max(r[1] for r in got) - t0
    join(procs)
    bad = sum(r[2] for r in got)
    if bad:
        raise RuntimeError(f'hand-over floor: consumers read {bad} stale or wrong values')
    return elapsed / iters


def c_ring_of(spec):
    """--c-ring '1=49.6,8=232' -> {1: 49.6, 8: 232.0}"""
    out = {}
    for part in filter(None, (spec or '').split(',')):
        k, v = part.split('=')
        out[int(k)] = float(v)
    return out


def python_ring_rows(rows, n, mode, per_frame, floor, c_ring, handover, torch_ring, suffix, mps):
    """The Python ring's row against its floor, and against torch. The stream ring's floor is the
    larger of the loop's torch ops in one process and the C stream ring. The host ring's is the same
    hand-over between processes without gpuipc (handover): it does what the ring does, where the
    one-process loop runs the producer's and the consumer's steps one after the other, which processes
    overlap (under MPS the hand-over between processes beat it: 32 against 53 us per frame)."""
    base, base_name = floor, f'floor ({mode} loop, local)'
    if handover is not None:
        base, base_name = handover, 'floor (hand-over between processes)'
    elif c_ring is not None and c_ring > base:
        base, base_name = c_ring, 'C stream ring'
    c_text = f'{c_ring:.1f}' if c_ring is not None else 'not measured'
    h_text = f', hand-over between processes {handover:.1f} us' if handover is not None else ''
    rows.append((f'Python ring ({mode}), 8 x 16 MiB to {n} consumer(s), per frame{suffix}', per_frame, 'us',
                 base_name, base, 'ratio<=1.5',
                 f'floor {floor:.1f} us, C stream ring {c_text} us{h_text}; every frame checked on the GPU'))
    if torch_ring:
        target = '' if not mps or mode != 'stream' else f'ratio<={0.2 if n == 1 else 0.1}'
        rows.append((f'Python ring ({mode}) to {n} consumer(s) vs torch queues{suffix}', per_frame, 'us',
                     'torch queues + ack queue', torch_ring, target,
                     f'torch.multiprocessing, the same 8 x 16 MiB passes' +
                     ('; target with MPS: 5x (1 consumer), 10x (8)' if target else '')))


# ---- the broker ----

class Broker:
    def __init__(self, path):
        self.dir = tempfile.mkdtemp(prefix='gpuipc-torch-')
        self.sock = os.path.join(self.dir, 's.sock')
        self.log = open(os.path.join(self.dir, 'broker.log'), 'wb')
        self.proc = subprocess.Popen([path, '--socket', self.sock, '--log-level', 'warn'], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        import gpuipc
        deadline = time.monotonic() + 10
        while True:
            try:
                gpuipc.Client(socket=self.sock, connect_timeout_ms=1000).close()
                return
            except gpuipc.Error:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- main ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'gpuipc-broker'))
    ap.add_argument('--tsv', help='write the rows for gpuipc-bench here')
    ap.add_argument('--quick', action='store_true', help='fewer trials and iterations')
    ap.add_argument('--device', type=int, default=0)
    ap.add_argument('--consumers', default='1,8', help='comma-separated consumer counts')
    ap.add_argument('--share-mib', type=int, default=64, help='size of the tensor in (a)')
    ap.add_argument('--ring-mib', type=int, default=16, help='size of each ring slot in (b)')
    ap.add_argument('--rings-only', action='store_true', help="only (c)-(e) and torch's ring")
    ap.add_argument('--suffix', default='', help='appended to every metric (e.g. " [MPS]")')
    ap.add_argument('--c-ring', default='', help="the C stream ring's us per frame by consumers, e.g. 1=49.6,8=232")
    args = ap.parse_args()
    c_ring = c_ring_of(args.c_ring)
    mps = 'MPS' in args.suffix
    trials = 5 if args.quick else 20
    iters = 200 if args.quick else 1000

    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f'torch_compare: skipped: PyTorch is not installed ({e})')
        return 77
    if not torch.cuda.is_available():
        print('torch_compare: skipped: torch sees no CUDA device')
        return 77
    try:
        import gpuipc  # noqa: F401
    except Exception as e:  # the library or module not found
        print(f'torch_compare: cannot load the gpuipc module ({e}); set PYTHONPATH and GPUIPC_LIBRARY')
        return 1

    ctx = mp.get_context('spawn')
    broker = Broker(args.broker)
    rows, failed, floors = [], False, {}
    print(f'torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}; '
          f'{trials} share trials, {iters} ring iterations')
    try:
        for n in [int(x) for x in args.consumers.split(',')]:
            if not args.rings_only:
                try:
                    tt = share_torch(ctx, n, trials, args.share_mib << 20, args.device)
                    tg, pub = share_gpuipc(ctx, n, trials, args.share_mib << 20, args.device, broker.sock)
                    rows.append((f'share 1 new tensor to {n} consumer(s), p50', statistics.median(tg), 'us',
                                 'torch.multiprocessing queues', statistics.median(tt), '',
                                 f'{args.share_mib} MiB, {trials} trials; p90 {pct(tg, 90):.0f} vs {pct(tt, 90):.0f} '
                                 f'us; publish alone {statistics.median(pub):.0f} us (incl. the VMM export)'))
                except Exception:
                    traceback.print_exc()
                    failed = True
            rt = rg = None
            try:
                rt = ring_torch(ctx, n, iters, args.ring_mib << 20, args.device)
            except Exception:
                traceback.print_exc()
                failed = True
            if not args.rings_only:
                try:
                    rg = ring_gpuipc(ctx, n, iters, args.ring_mib << 20, args.device, broker.sock)
                    if rt:
                        rows.append((f'ring of 8 tensors x {iters} to {n} consumer(s), per pass', rg / iters, 'us',
                                     'torch queues + ack queue', rt / iters, 'ratio<=0.2',
                                     f'{args.ring_mib} MiB slots, publish/attach; totals {rg / 1e6:.2f} s vs '
                                     f'{rt / 1e6:.2f} s; target: 5x faster than torch'))
                except Exception:
                    traceback.print_exc()
                    failed = True
            for mode, run in (('stream', ring_gpuipc_stream), ('host', ring_gpuipc_host)):
                try:
                    if mode not in floors:
                        floors[mode] = ring_floor(iters, args.ring_mib << 20, args.device, mode)
                        rows.append((f'floor: the {mode} ring loop\'s torch ops, local{args.suffix}', floors[mode],
                                     'us', '', float('nan'), '',
                                     'one process, no IPC: a producer\'s fill and a consumer\'s check per frame' +
                                     (', with the hand-over\'s synchronizations' if mode == 'host' else '')))
                    handover = None
                    if mode == 'host':
                        handover = handover_floor(ctx, n, iters, args.ring_mib << 20, args.device)
                        rows.append((f'floor: the host ring\'s hand-over between processes, {n} consumer(s){args.suffix}',
                                     handover, 'us', '', float('nan'), '',
                                     'the same torch ops and synchronizations, slots shared once through torch, '
                                     'frames handed over by spinning on shared counters: no gpuipc'))
                    per_frame = run(ctx, n, iters, args.ring_mib << 20, args.device, broker.sock) / iters
                    python_ring_rows(rows, n, mode, per_frame, floors[mode], c_ring.get(n), handover,
                                     rt / iters if rt else None, args.suffix, mps)
                    if rg and mode == 'stream':
                        rows.append((f'stream ring of 8 tensors x {iters} to {n} consumer(s) vs publish/attach',
                                     per_frame, 'us', 'gpuipc publish/attach ring', rg / iters, '',
                                     'the same passes through broker round trips'))
                except Exception:
                    traceback.print_exc()
                    failed = True
    finally:
        broker.stop()

    print(f'\n{"metric":72} {"gpuipc":>12} {"baseline":>12} {"ratio":>8}')
    for (metric, value, unit, base_name, base, _, note) in rows:
        print(f'{metric:72} {value:9.1f} {unit:2} {base:9.1f} {unit:2} {value / base:7.3f}x  ({base_name}) {note}')
    if args.tsv:
        with open(args.tsv, 'w') as f:
            for row in rows:
                f.write('\t'.join(f'{x:.3f}' if isinstance(x, float) else str(x) for x in row) + '\n')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
