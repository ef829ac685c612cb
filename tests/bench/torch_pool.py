#!/usr/bin/env python3
"""Pools and weight sync on one GPU, against torch's own CUDA IPC in the same run. Part of
`gpuipc-bench --gpu` (which passes the paths, and runs it again with --mps when there is an MPS
control daemon to start); by hand:

    PYTHONPATH=python GPUIPC_LIBRARY=build/client/libgpuipc.so \\
        python3 tests/bench/torch_pool.py --broker build/broker/gpuipc-broker [--mps]

(a) share one new 64 MiB tensor to N consumers (N = 1, 8), from "the producer hands it over" until
    every consumer read one element: torch (the tensor through N torch.multiprocessing queues), the
    tensor allocated in a gpuipc pool (published as a view: no copy, no export), and a plain torch
    tensor through share() (copied into memory allocated and exported ahead). A new tensor per trial.
    Beside them the floor of any brokered hand-off: a relay process (the broker's place) passes a
    message to the N consumers waiting on pipes, and each reads one element of a tensor it holds,
    after the same idle; on a VM its wake-ups cost far more than the work.
(b) weight sync of the GPU suite's Llama-style bf16 state dict (TinyLlama's shapes: 201 tensors,
    2.05 GiB), trainer and inference in sibling PID namespaces, e2e from the trainer starting to
    publish until the inference process holds every tensor: a snapshot into buffers reserved ahead,
    cold (the first version) and warm (the median of the later ones), and a state dict living in a
    pool published live (no copy), cold. Beside each, the floor measured in the same processes: the
    driver calls (cuMemCreate, reserve, map, access, export; import, map, access) and one copy of
    the same bytes, timed alone, plus the views; and torch's per-tensor CUDA IPC (legacy handles: they
    need the two PIDs to differ, docs/legacy-ipc.md), cold and warm.
--mps: everything under an MPS control daemon of its own (CUDA_MPS_PIPE_DIRECTORY and
CUDA_MPS_LOG_DIRECTORY in a temporary directory; quit at the end). No GPU setting is changed.

Every consumer checks what it read (a value per share, a checksum per state dict version); a wrong
one fails the run. Prints a table with MET/MISSED and, with --tsv, the rows for gpuipc-bench
(metric, value, unit, baseline, baseline value, target, note). Exit status 77 without torch or a GPU.
"""
import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'gpu'))

NAME, FENCED, LIVE, PROF = 'wsync/snap', 'wsync/fenced', 'wsync/live', 'wsync/prof'
STEP_S = 180


def now():
    return time.monotonic()  # CLOCK_MONOTONIC: one clock for every process and PID namespace here


def now_us():
    return time.monotonic_ns() / 1000.0


def pct(values, p):
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))] if s else float('nan')


def cuda_init(dev=0):
    import torch
    torch.cuda.set_device(dev)
    torch.zeros(1, device=f'cuda:{dev}').item()  # the context, outside every timed part
    return torch


def fill_value(i):
    return i % 251 + 1


# ---- (a) sharing one new tensor ----

def share_consumer(idx, sock, cmds, results, ready, dev, relayed):
    """Reads one element of whatever comes: a torch tensor through its queue, a gpuipc name to
    attach (it waits in attach before the producer publishes), or, for the floor, a message the
    relay forwards (it waits on its pipe, then reads a tensor it already holds)."""
    torch = cuda_init(dev)
    import gpuipc
    c = gpuipc.Client(socket=sock, label=f'share-consumer-{idx}')
    held = torch.zeros(1, dtype=torch.uint8, device=f'cuda:{dev}')
    ready.put(idx)
    while True:
        item = cmds.get()
        if item is None:
            break
        if item[0] == 'floor':
            trial, want = (int(x) for x in relayed.recv_bytes().split())
            woke = now_us()
            int(held[0].item())  # the read every other variant does, of memory mapped long ago
            results.put((trial, idx, now_us(), want, (woke, woke)))
            continue
        if item[0] == 'torch':
            _, trial, t = item
            woke = now_us()
            v = int(t[0].item())
            results.put((trial, idx, now_us(), v, (woke, woke)))
            del t, item
            continue
        _, trial, name = item
        a = c.attach(name, timeout_ms=120000)
        attached = now_us()
        t = a.torch()
        viewed = now_us()
        v = int(t[0].item())
        results.put((trial, idx, now_us(), v, (attached, viewed)))
        del t
        a.release()
    c.close()


def share_relay(inbox, outs):
    """The floor's stand-in for the broker: forwards each message to the first n consumers' pipes,
    as the broker passes a publication to the consumers waiting for its name."""
    while True:
        msg = inbox.recv_bytes()
        if not msg:
            return
        n, rest = msg.split(b' ', 1)
        for out in outs[:int(n)]:
            out.send_bytes(rest)


def gather(results, n, trial, want):
    """The time the last of n consumers read its value, and that consumer's phase stamps: when its
    wait returned (attach, a queue or the relay's pipe) and when it had a tensor to read."""
    got = [results.get(timeout=120) for _ in range(n)]
    for tr, idx, ts, v, _ in got:
        if tr != trial or v != want:
            raise RuntimeError(f'consumer {idx} saw trial {tr} value {v}, expected trial {trial} value {want}')
    last = max(got, key=lambda r: r[2])
    return last[2], last[4]


def print_share_phases(variant, n, phases):
    """Where a share's time went, medians over the warm trials, for the consumer that read last: the
    producer's hand-over call, the consumer's wait returning (attach, its queue or its pipe), making
    the tensor (a.torch(); nothing for the others) and reading one element."""
    if not phases:
        return
    med = [statistics.median(p[i] for p in phases) for i in range(4)]
    print(f'share phases, {variant}, {n} consumer(s), us from the hand-over (medians of {len(phases)}): '
          f'producer\'s call returned {med[0]:.0f}, last consumer woke {med[1]:.0f}, made its tensor +{med[2]:.0f}, '
          f'read it +{med[3]:.0f}', flush=True)


def share_section(ctx, sock, dev, trials, nbytes, counts):
    """{(variant, n): [us per trial]}, and the first (cold) trial of the gpuipc variants."""
    import gpuipc
    import torch
    top = max(counts)
    cmds = [ctx.Queue() for _ in range(top)]
    results, ready = ctx.Queue(), ctx.Queue()
    pipes = [ctx.Pipe(duplex=False) for _ in range(top)]  # (consumer's end, relay's end)
    relay_in, relay_feed = ctx.Pipe(duplex=False)
    relay = ctx.Process(target=share_relay, args=(relay_in, [w for _, w in pipes]), daemon=True)
    procs = [ctx.Process(target=share_consumer, args=(i, sock, cmds[i], results, ready, dev, pipes[i][0]),
                         daemon=True) for i in range(top)]
    for p in procs + [relay]:
        p.start()
    for _ in range(top):
        ready.get(timeout=120)
    c = gpuipc.Client(socket=sock, label='share-producer')
    pool = c.pool(device=dev)
    out, cold, publish_us = {}, {}, {}
    try:
        for n in counts:
            for variant in ('torch', 'floor', 'pool', 'share'):
                times, phases = [], []
                for trial in range(trials + 1):  # trial 0: the first share (queues' threads, first mapping)
                    if variant == 'pool':
                        with pool:
                            t = torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}')
                    else:
                        t = torch.empty(nbytes, dtype=torch.uint8, device=f'cuda:{dev}')
                    t.fill_(fill_value(trial))
                    torch.cuda.synchronize()
                    name = f'bench/{variant}/{n}/{trial}'
                    if variant != 'torch':
                        for q in cmds[:n]:
                            q.put(('floor',) if variant == 'floor' else ('gpuipc', trial, name))
                    time.sleep(0.05)  # every consumer waits in q.get(), attach or its relay pipe
                    t0 = now_us()
                    if variant == 'floor':
                        relay_feed.send_bytes(f'{n} {trial} {fill_value(trial)}'.encode())
                        held = None
                    elif variant == 'torch':
                        for q in cmds[:n]:
                            q.put(('torch', trial, t))
                        held = t
                    elif variant == 'pool':
                        c.publish(t, name, retire_after=n)
                        held = t
                    else:
                        held = c.share(t, name, retire_after=n)
                    t1 = now_us()
                    last, (woke, viewed) = gather(results, n, trial, fill_value(trial))
                    if trial:
                        times.append(last - t0)
                        phases.append((t1 - t0, woke - t0, viewed - woke, last - viewed))
                    else:
                        cold[(variant, n)] = last - t0
                    if variant in ('pool', 'share'):
                        c.wait_drained(held, 60000)
                    del t, held
                out[(variant, n)] = times
                publish_us[(variant, n)] = [p[0] for p in phases]
                print_share_phases(variant, n, phases)
        st = pool.stats()
    finally:
        for q in cmds:
            q.put(None)
        relay_feed.send_bytes(b'')
        for p in procs + [relay]:
            p.join(timeout=60)
        c.close()
    return out, cold, publish_us, st


# ---- (b) weight sync: the roles ----

def llama_state_dict(torch, seed, dev=0):
    """The GPU suite's model's state dict (test-gpu-weights.py: TinyLlama's shapes), random bf16,
    made directly (no transformers needed): 201 tensors, 2.05 GiB."""
    h, inter, kv, vocab, layers = 2048, 5632, 256, 32000, 22
    shapes = [('model.embed_tokens.weight', (vocab, h))]
    for i in range(layers):
        p = f'model.layers.{i}.'
        shapes += [(p + 'self_attn.q_proj.weight', (h, h)), (p + 'self_attn.k_proj.weight', (kv, h)),
                   (p + 'self_attn.v_proj.weight', (kv, h)), (p + 'self_attn.o_proj.weight', (h, h)),
                   (p + 'mlp.gate_proj.weight', (inter, h)), (p + 'mlp.up_proj.weight', (inter, h)),
                   (p + 'mlp.down_proj.weight', (h, inter)), (p + 'input_layernorm.weight', (h,)),
                   (p + 'post_attention_layernorm.weight', (h,))]
    shapes += [('model.norm.weight', (h,)), ('lm_head.weight', (vocab, h))]
    gen = torch.Generator(device=f'cuda:{dev}').manual_seed(seed)
    return {k: torch.randn(s, generator=gen, device=f'cuda:{dev}', dtype=torch.bfloat16) for k, s in shapes}


def checksum(torch, sd):
    """Exact and order-independent: the sum of every tensor's bytes read as int16."""
    return int(torch.stack([t.view(torch.int16).sum(dtype=torch.int64) for t in sd.values()]).sum().item())


class Driver:
    """The CUDA driver calls of a cuda-vmm share, through ctypes, timed alone (the floor)."""

    class Prop(ctypes.Structure):  # CUmemAllocationProp (client/cuda.h mirrors it, checked against cuda.h)
        _fields_ = [('type', ctypes.c_int), ('handle_types', ctypes.c_int), ('loc_type', ctypes.c_int),
                    ('loc_id', ctypes.c_int), ('win32', ctypes.c_void_p), ('flags', ctypes.c_ubyte * 8)]

    class Access(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [('loc_type', ctypes.c_int), ('loc_id', ctypes.c_int), ('flags', ctypes.c_int)]

    def __init__(self, dev=0):
        self.cu = ctypes.CDLL('libcuda.so.1')
        self.dev = dev
        self.prop = self.Prop(1, 1, 1, dev, None)
        self.access = self.Access(1, dev, 3)
        g = ctypes.c_size_t()
        self.call('cuMemGetAllocationGranularity', ctypes.byref(g), ctypes.byref(self.prop), 0)
        self.granule = g.value

    def call(self, fn, *args):
        r = getattr(self.cu, fn)(*args)
        if r:
            raise RuntimeError(f'{fn} failed: CUDA error {r}')

    def rounded(self, n):
        return (n + self.granule - 1) // self.granule * self.granule

    def create(self, size):
        h = ctypes.c_ulonglong()
        self.call('cuMemCreate', ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(self.prop), ctypes.c_ulonglong(0))
        return h.value

    def map(self, handle, size):
        p = ctypes.c_ulonglong()
        self.call('cuMemAddressReserve', ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        self.call('cuMemMap', p, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(handle),
                  ctypes.c_ulonglong(0))
        return p.value

    def set_access(self, ptr, size):
        self.call('cuMemSetAccess', ctypes.c_ulonglong(ptr), ctypes.c_size_t(size), ctypes.byref(self.access),
                  ctypes.c_size_t(1))

    def export(self, handle):
        fd = ctypes.c_int(-1)
        self.call('cuMemExportToShareableHandle', ctypes.byref(fd), ctypes.c_ulonglong(handle), 1,
                  ctypes.c_ulonglong(0))
        return fd.value

    def import_fd(self, fd):
        h = ctypes.c_ulonglong()
        self.call('cuMemImportFromShareableHandle', ctypes.byref(h), ctypes.c_void_p(fd), 1)
        return h.value

    def tensor(self, ptr, size):
        import torch
        from gpuipc import dlpack
        return torch.from_dlpack(dlpack.capsule(self, ptr, (dlpack.KDL_CUDA, self.dev), 'uint8', (size,)))


def layout(torch, sd):
    """Manifest entries (key, dtype, shape, offset) of sd packed at 256-byte offsets: what the views cost."""
    from gpuipc import state_dict as sdm
    entries, _, total = sdm.plan(sd)
    return [e[:4] for e in entries], total


def say(word, data=None):
    import json
    print(word + ('' if data is None else ' ' + json.dumps(data)), flush=True)


def role_wproducer(sock_path, broker_sock, warm):
    warm = int(warm)
    torch = cuda_init()
    import gpuipc
    from multiprocessing.connection import Listener
    from multiprocessing.reduction import send_handle
    sd = llama_state_dict(torch, 0)
    torch.cuda.synchronize()
    entries, total = layout(torch, sd)
    # A first use of a torch kernel loads its module (CUDA lazy loading): what a cold _foreach_copy_ pays.
    a, b = torch.zeros(4, dtype=torch.bfloat16, device='cuda'), torch.ones(4, dtype=torch.bfloat16, device='cuda')
    t0 = now()
    torch._foreach_copy_([a], [b])
    torch.cuda.synchronize()
    foreach_first = now() - t0
    t0 = now()
    torch._foreach_copy_([a], [b])
    torch.cuda.synchronize()
    foreach_again = now() - t0
    flat = torch.empty(total, dtype=torch.uint8, device='cuda')
    for key, dtype, shape, off in entries:
        n = sd[key].numel() * 2
        flat[off:off + n].copy_(sd[key].view(-1).view(torch.uint8))
    drv = Driver()
    c = gpuipc.Client(socket=broker_sock, label='wsync-trainer')
    listener = Listener(sock_path, 'AF_UNIX')
    say('listening', {'pidns': os.readlink('/proc/self/ns/pid'), 'tensors': len(sd), 'bytes': total,
                      'foreach_first_ms': foreach_first * 1e3, 'foreach_again_ms': foreach_again * 1e3})
    conn = listener.accept()

    def step(kind, t0, **extra):
        conn.send(dict(kind=kind, t0=t0, sum=extra.pop('sum', None), **extra))
        return conn.recv()

    # the floor: the driver calls and one copy, timed alone
    size = drv.rounded(total)
    torch.cuda.synchronize()
    t0 = now()
    h = drv.create(size)
    t1 = now()
    ptr = drv.map(h, size)
    drv.set_access(ptr, size)
    t2 = now()
    fd = drv.export(h)
    t3 = now()
    dst = drv.tensor(ptr, size)
    dst[:total].copy_(flat)
    drv.call('cuCtxSynchronize')
    t4 = now()
    conn.send(dict(kind='floor-cold', t0=t0, create=t1 - t0, map=t2 - t1, export=t3 - t2, copy=t4 - t3))
    send_handle(conn, fd, 0)
    conn.recv()
    t0 = now()
    dst[:total].copy_(flat)
    drv.call('cuCtxSynchronize')
    step('floor-warm', t0, copy=now() - t0)
    t0 = now()
    conn.send(dict(kind='floor-live', t0=t0))
    send_handle(conn, fd, 0)
    conn.recv()
    os.close(fd)
    del dst

    def versions(name, kind, **options):
        """Buffers made and exported ahead, then the first version and the warm ones: the ms of
        each publish_state_dict."""
        c.reserve_state_dict(name, sd, kind='cuda-vmm', device=0)
        ms = []
        for v in range(1 + warm):
            if v:
                torch._foreach_add_(list(sd.values()), 1.0)  # the training step, untimed
            cs = checksum(torch, sd)
            torch.cuda.synchronize()
            t0 = now()
            c.publish_state_dict(sd, name, kind='cuda-vmm', device=0, **options)
            ms.append((now() - t0) * 1e3)
            step(kind, t0, sum=cs, version=v + 1)
        return ms

    # snapshots synchronized, then stream-ordered (a fence instead of a device synchronization, as
    # torch's IPC): the version goes out once the copies are queued; the consumer's stream waits
    publish_ms = versions(NAME, 'snap')
    fence = c.create_fence('wsync/fence', device=0)
    fenced_ms = versions(FENCED, 'fsnap', fence=fence)

    # the same cold path again under cProfile (a new name: new buffers, new imports): where it goes
    import cProfile
    import io
    import pstats
    c.reserve_state_dict(PROF, sd, kind='cuda-vmm', device=0)
    pr = cProfile.Profile()
    t0 = now()
    pr.enable()
    c.publish_state_dict(sd, PROF, kind='cuda-vmm', device=0)
    pr.disable()
    prof_ms = (now() - t0) * 1e3
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats('tottime').print_stats(8)
    step('prof', t0)

    # live: the state dict lives in a pool (a loader's weights), published without a copy
    # reserved with room for torch's own rounding (1-10 MB tensors share 20 MiB blocks): one segment
    pool = c.pool(device=0, reserve=int(total * 1.3))
    with pool:
        live = {k: torch.empty_like(t) for k, t in sd.items()}
    for k, t in sd.items():
        live[k].copy_(t)
    cs = checksum(torch, live)
    torch.cuda.synchronize()
    t0 = now()
    c.publish_state_dict(live, LIVE, copy=False)
    live_ms = (now() - t0) * 1e3
    step('live', t0, sum=cs)
    t0 = now()
    c.publish_state_dict(live, LIVE, copy=False)
    step('live', t0, sum=cs)
    st = pool.stats()
    c.unpublish_state_dict(FENCED)
    fence.close()
    say('done', {'publish_ms': publish_ms, 'fenced_ms': fenced_ms, 'prof_ms': prof_ms, 'prof': text.getvalue()[-3000:], 'live_ms': live_ms,
                 'live_segments': st.segments, 'live_exports': st.exports,
                 'in_pool': all(pool.holds(t) for t in live.values())})
    conn.close()
    c.close()


def role_wconsumer(sock_path, broker_sock):
    torch = cuda_init()
    import gpuipc
    from gpuipc import state_dict as sdm
    from multiprocessing.connection import Client
    from multiprocessing.reduction import recv_handle
    import cProfile
    import io
    import pstats
    entries, total = layout(torch, llama_state_dict(torch, 0))  # the shapes (untimed)
    torch.cuda.empty_cache()
    drv = Driver()
    conn = Client(sock_path, 'AF_UNIX')
    c = gpuipc.Client(socket=broker_sock, label='wsync-inference')
    size = drv.rounded(total)
    rows, bad, held, prof = {}, [], [], ''
    while True:
        try:
            m = conn.recv()
        except EOFError:
            break
        kind, t0 = m['kind'], m['t0']
        if kind in ('floor-cold', 'floor-live'):
            fd = recv_handle(conn)
            t1 = now()
            ptr = drv.map(drv.import_fd(fd), size)
            drv.set_access(ptr, size)
            t2 = now()
            views = sdm._torch_views(drv.tensor(ptr, size), entries)
            t3 = now()
            os.close(fd)
            rows.setdefault(kind, []).append({'e2e': t3 - t0, 'import_map': t2 - t1, 'views': t3 - t2,
                                              **{k: m[k] for k in ('create', 'map', 'export', 'copy') if k in m}})
            base_ptr = ptr
            del views
        elif kind == 'floor-warm':
            t1 = now()
            made = len(sdm._torch_views(drv.tensor(base_ptr, size), entries))
            t3 = now()
            rows.setdefault(kind, []).append({'e2e': t3 - t0, 'views': t3 - t1, 'copy': m['copy'], 'n': made})
        elif kind in ('snap', 'fsnap', 'live', 'prof'):
            name = {'snap': NAME, 'fsnap': FENCED, 'live': LIVE, 'prof': PROF}[kind]
            t1 = now()
            if kind == 'prof':
                pr = cProfile.Profile()
                pr.enable()
            got = c.attach_state_dict(name, framework='torch', timeout_ms=60000)
            t2 = now()
            if kind == 'prof':
                pr.disable()
                text = io.StringIO()
                pstats.Stats(pr, stream=text).sort_stats('tottime').print_stats(8)
                prof = text.getvalue()[-3000:]
            if kind == 'fsnap' and got._fence is None:
                bad.append(f'fsnap v{got.version}: no fence')
            if m.get('sum') is not None and checksum(torch, got) != m['sum']:  # in the stream that waited
                bad.append(f'{kind} v{got.version}')
            rows.setdefault(kind, []).append({'e2e': t2 - t0, 'consumer': t2 - t1})
            held.append(got)
            while len(held) > 1:  # the previous version goes: double buffering needs it drained
                held.pop(0).release()
        conn.send('ok')
    for got in held:
        got.release()
    say('rows', {'rows': rows, 'bad': bad, 'pidns': os.readlink('/proc/self/ns/pid'), 'prof': prof})
    c.close()


def role_tproducer(sock_path, warm):
    warm = int(warm)
    torch = cuda_init()
    from multiprocessing.connection import Listener
    from torch.multiprocessing.reductions import reduce_tensor
    sd = llama_state_dict(torch, 0)
    torch.cuda.synchronize()
    listener = Listener(sock_path, 'AF_UNIX')
    say('listening')
    conn = listener.accept()
    for trial in range(1 + warm):
        if trial:
            torch._foreach_add_(list(sd.values()), 1.0)
        cs = checksum(torch, sd)
        torch.cuda.synchronize()
        t0 = now()
        conn.send((t0, cs, [(k, reduce_tensor(t)) for k, t in sd.items()]))
        conn.recv()
    conn.close()
    say('done')


def role_tconsumer(sock_path, warm):
    warm = int(warm)
    torch = cuda_init()
    from multiprocessing.connection import Client
    conn = Client(sock_path, 'AF_UNIX')
    rows, bad, prev = [], 0, None
    for _ in range(1 + warm):
        t0, cs, payload = conn.recv()
        t1 = now()
        sd = {k: fn(*args) for k, (fn, args) in payload}
        t2 = now()
        if checksum(torch, sd) != cs:
            bad += 1
        rows.append({'e2e': t2 - t0, 'consumer': t2 - t1})
        prev = sd  # kept until the next: torch's IPC cache then serves the same storages (warm)
        conn.send('ok')
    del prev
    say('rows', {'rows': rows, 'bad': bad})


ROLES = {'wproducer': role_wproducer, 'wconsumer': role_wconsumer, 'tproducer': role_tproducer,
         'tconsumer': role_tconsumer}


def weights_section(broker_sock, tmp, warm, can_unshare):
    import gpu_roles
    role = lambda name, *a, pidns=False: gpu_roles.Role(__file__, name, *a, pidns=pidns, step_timeout_s=STEP_S)  # noqa: E731
    out = {}
    sock = tempfile.mktemp(dir=tmp, suffix='.sock')  # a new one per attempt: a listener's file stays
    prod = role('wproducer', sock, broker_sock, str(warm), pidns=can_unshare)
    cons = None
    try:
        out['producer'] = prod.expect('listening')
        cons = role('wconsumer', sock, broker_sock, pidns=can_unshare)
        out['done'] = prod.expect('done', timeout=STEP_S * 2)
        out['consumer'] = cons.expect('rows', timeout=STEP_S)
    finally:
        for r in (cons, prod):
            if r is not None:
                r.stop()
    tsock = tempfile.mktemp(dir=tmp, suffix='.sock')
    tp = role('tproducer', tsock, str(warm))
    tc = None
    try:
        tp.expect('listening')
        tc = role('tconsumer', tsock, str(warm))
        out['torch'] = tc.expect('rows', timeout=STEP_S)
        tp.expect('done')
    finally:
        for r in (tc, tp):
            if r is not None:
                r.stop()
    return out


# ---- the broker, MPS ----

class Broker:
    def __init__(self, path):
        self.dir = tempfile.mkdtemp(prefix='gpuipc-pool-bench.')
        self.sock = os.path.join(self.dir, 's.sock')
        self.log = open(os.path.join(self.dir, 'broker.log'), 'wb')
        self.proc = subprocess.Popen([path, '--socket', self.sock, '--log-level', 'warn'], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = now() + 10
        while not os.path.exists(self.sock):
            if now() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError('the broker did not start')
            time.sleep(0.02)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Mps:
    """An MPS control daemon of this run's own: its pipe and log directories in a temporary
    directory, set in the environment every process started afterwards inherits."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix='gpuipc-mps.', dir=os.environ.get('GPUIPC_BENCH_MPS_PARENT'))
        env = {'CUDA_MPS_PIPE_DIRECTORY': os.path.join(self.dir, 'pipe'),
               'CUDA_MPS_LOG_DIRECTORY': os.path.join(self.dir, 'log')}
        for d in env.values():
            os.makedirs(d)
        os.environ.update(env)
        subprocess.run(['nvidia-cuda-mps-control', '-d'], check=True, timeout=30)

    def stop(self):
        """Quits the daemon: only once no client is left (this process never made a CUDA context)."""
        try:
            subprocess.run(['nvidia-cuda-mps-control'], input=b'quit\n', timeout=30)
        except subprocess.TimeoutExpired:
            print('torch_pool: the MPS daemon did not quit within 30 s', file=sys.stderr)
        for key in ('CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_LOG_DIRECTORY'):
            os.environ.pop(key, None)
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- rows ----

def share_rows(times, cold, pubs, st, trials, mib, tag):
    rows = []
    for (variant, n), xs in times.items():
        if variant == 'torch' or not xs:
            continue
        base = statistics.median(times[('torch', n)])
        v = statistics.median(xs)
        floor = statistics.median(times[('floor', n)])
        if variant == 'floor':
            rows.append((f'share floor: a relay process passes a message to {n} consumer(s) waiting on pipes, each '
                         f'reads 1 element of a tensor it holds, p50{tag}', v, 'us', 'torch.multiprocessing queues',
                         base, '', f'{trials} trials, each after the same 50 ms idle as the rows beside it: the '
                         f'wake-ups of a brokered hand-off and the read, with no IPC library'))
            continue
        what = 'allocated in a pool (a view: no copy, no export)' if variant == 'pool' else \
            'a plain tensor through share() (copied into memory exported ahead)'
        rows.append((f'share 1 new {mib} MiB tensor {what} to {n} consumer(s), p50{tag}', v, 'us',
                     'torch.multiprocessing queues', base, 'ratio<=0.2' if variant == 'pool' else 'ratio<=1',
                     f'{trials} trials; p90 {pct(xs, 90):.0f} vs {pct(times[("torch", n)], 90):.0f} us; publish alone '
                     f'{statistics.median(pubs[(variant, n)]):.0f} us; first share {cold[(variant, n)]:.0f} us '
                     f'(torch {cold[("torch", n)]:.0f} us); floor {floor:.0f} us ({v / floor:.2f}x); pool: '
                     f'{st.segments} segment(s), {st.exports} export(s); '
                     f'goal {"5x faster than" if variant == "pool" else "no slower than"} torch'))
    return rows


def weight_rows(w, tag):
    r, tr = w['consumer']['rows'], w['torch']['rows']
    med = lambda xs, k='e2e': statistics.median(x[k] for x in xs) * 1e3  # noqa: E731
    fc, fw, fl = r['floor-cold'][0], r['floor-warm'][0], r['floor-live'][0]
    floor_cold, floor_warm, floor_live = fc['e2e'] * 1e3, fw['e2e'] * 1e3, fl['e2e'] * 1e3
    snap = r['snap']
    cold, warm = snap[0]['e2e'] * 1e3, med(snap[2:] or snap[1:])
    live = r['live'][0]['e2e'] * 1e3
    fsnap = r['fsnap']
    f_cold, f_warm = fsnap[0]['e2e'] * 1e3, med(fsnap[2:] or fsnap[1:])
    t_cold, t_warm = tr[0]['e2e'] * 1e3, med(tr[1:])
    phases = (f'floor {floor_cold:.2f} ms = create {fc["create"] * 1e3:.2f} + map/access {fc["map"] * 1e3:.2f} + '
              f'export {fc["export"] * 1e3:.2f} + copy {fc["copy"] * 1e3:.2f} + import/map/access '
              f'{fc["import_map"] * 1e3:.2f} + views {fc["views"] * 1e3:.2f} (+ fd passing)')
    rows = [
        (f'weight sync, snapshot into reserved buffers, cold e2e{tag}', cold, 'ms', 'torch per-tensor CUDA IPC, cold',
         t_cold, 'value<=4', f'{phases}; consumer side {snap[0]["consumer"] * 1e3:.2f} ms; goal <= 4 ms'),
        (f'weight sync, snapshot, warm e2e (median){tag}', warm, 'ms', 'torch per-tensor CUDA IPC, warm', t_warm,
         'value<=2', f'floor {floor_warm:.2f} ms (copy {fw["copy"] * 1e3:.2f} + views {fw["views"] * 1e3:.2f}); '
         f'consumer side {med(snap[2:] or snap[1:], "consumer"):.2f} ms; goal <= 2 ms'),
        (f'weight sync, stream-ordered snapshot (fence), cold e2e{tag}', f_cold, 'ms',
         'torch per-tensor CUDA IPC, cold', t_cold, 'value<=4',
         f'the copies queued, the fence signalled after them, the version out at once; the consumer\'s stream '
         f'waits (as torch\'s IPC events); consumer side {fsnap[0]["consumer"] * 1e3:.2f} ms; goal <= 4 ms'),
        (f'weight sync, stream-ordered snapshot (fence), warm e2e (median){tag}', f_warm, 'ms',
         'torch per-tensor CUDA IPC, warm', t_warm, 'value<=2',
         f'consumer side {med(fsnap[2:] or fsnap[1:], "consumer"):.2f} ms; goal <= 2 ms'),
        (f'weight sync, live from a pool (no copy), cold e2e{tag}', live, 'ms', 'torch per-tensor CUDA IPC, cold',
         t_cold, 'value<=2', f'floor {floor_live:.2f} ms (import/map/access {fl["import_map"] * 1e3:.2f} + views '
         f'{fl["views"] * 1e3:.2f}); consumer side {r["live"][0]["consumer"] * 1e3:.2f} ms; goal <= 2 ms'),
        (f'weight sync floor, cold (driver calls + one copy + views){tag}', floor_cold, 'ms',
         'gpuipc snapshot cold', cold, '', phases),
        (f'weight sync floor, warm (one copy + views){tag}', floor_warm, 'ms', 'gpuipc snapshot warm', warm, '', ''),
        (f'weight sync floor, live cold (import, map, views){tag}', floor_live, 'ms', 'gpuipc live cold', live, '', ''),
    ]
    return rows


def verdict(target, value, base):
    if not target:
        return ''
    op, limit = target[:-len(target.split('=')[-1])], float(target.split('=')[-1])
    x = value / base if op.startswith('ratio') else value
    return 'MET' if (x <= limit if '<=' in op else x >= limit) else 'MISSED'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'gpuipc-broker'))
    ap.add_argument('--tsv', help='write the rows for gpuipc-bench here')
    ap.add_argument('--quick', action='store_true', help='fewer trials')
    ap.add_argument('--mps', action='store_true', help='run everything under an MPS daemon of its own')
    ap.add_argument('--device', type=int, default=0)
    ap.add_argument('--consumers', default='1,8')
    ap.add_argument('--share-mib', type=int, default=64)
    ap.add_argument('--only', choices=('share', 'weights'), help='one section')
    ap.add_argument('--under-mps', action='store_true', help=argparse.SUPPRESS)  # the child that --mps runs
    ap.add_argument('--role')
    ap.add_argument('args', nargs='*')
    args = ap.parse_args()
    if args.role:
        ROLES[args.role](*args.args)
        return 0
    os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')  # no CUDA context before MPS is up
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f'torch_pool: skipped: PyTorch is not installed ({e})')
        return 77
    if not torch.cuda.is_available():
        print('torch_pool: skipped: torch sees no CUDA device')
        return 77
    if args.mps:
        # The daemon quits only when no client is left: every CUDA context is made in a child.
        if not shutil.which('nvidia-cuda-mps-control'):
            print('torch_pool: skipped: --mps needs nvidia-cuda-mps-control')
            return 77
        mps = Mps()
        try:
            argv = [a for a in sys.argv[1:] if a != '--mps']
            return subprocess.call([sys.executable, os.path.abspath(__file__), *argv, '--under-mps'])
        finally:
            mps.stop()
    trials, warm = (8, 6) if args.quick else (12, 8)
    tag = ' [MPS]' if args.under_mps else ''
    rows, failed = [], False
    broker = Broker(args.broker)
    tmp = tempfile.mkdtemp(prefix='gpuipc-pool-run.')
    try:
        cuda_init(args.device)
        print(f'torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}{tag}; {trials} share trials, '
              f'{warm} warm versions', flush=True)
        if args.only in (None, 'share'):
            try:
                times, cold, pubs, st = share_section(mp.get_context('spawn'), broker.sock, args.device, trials,
                                                      args.share_mib << 20, [int(x) for x in args.consumers.split(',')])
                rows += share_rows(times, cold, pubs, st, trials, args.share_mib, tag)
            except Exception:
                traceback.print_exc()
                failed = True
        if args.only in (None, 'weights'):
            try:
                can_unshare = shutil.which('unshare') is not None and subprocess.run(
                    ['unshare', '--pid', '--fork', '--mount-proc', 'true'], capture_output=True).returncode == 0
                try:
                    w = weights_section(broker.sock, tmp, warm, can_unshare)
                except Exception:
                    if not can_unshare:
                        raise
                    traceback.print_exc()
                    print('weights: retried with trainer and inference in one PID namespace')
                    can_unshare = False
                    w = weights_section(broker.sock, tmp, warm, can_unshare)
                p, cons = w['producer'], w['consumer']
                where = 'sibling PID namespaces' if can_unshare else 'one PID namespace'
                print(f'weights: {p["tensors"]} tensors, {p["bytes"] / 2 ** 30:.2f} GiB; trainer {p["pidns"]}, '
                      f'inference {cons["pidns"]} ({where}); first _foreach_copy_ {p["foreach_first_ms"]:.2f} ms, '
                      f'again {p["foreach_again_ms"]:.3f} ms')
                d = w['done']
                print(f'publish_state_dict with a fence per version (ms): '
                      f'{", ".join(f"{x:.2f}" for x in d["fenced_ms"])}')
                print(f'publish_state_dict per version (ms): {", ".join(f"{x:.2f}" for x in d["publish_ms"])}; live '
                      f'publish {d["live_ms"]:.2f} ms, pool {d["live_segments"]} segment(s), every tensor in it: '
                      f'{d["in_pool"]}')
                print(f'--- cold publish_state_dict under cProfile ({d["prof_ms"]:.2f} ms)\n{d["prof"]}')
                print(f'--- cold attach_state_dict under cProfile\n{cons["prof"]}')
                if cons['bad'] or w['torch']['bad']:
                    raise RuntimeError(f'checksums differ: gpuipc {cons["bad"]}, torch {w["torch"]["bad"]}')
                rows += weight_rows(w, tag)
            except Exception:
                traceback.print_exc()
                failed = True
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'\n{"metric":96} {"value":>10} {"baseline":>10} {"ratio":>8}')
    for metric, value, unit, base_name, base, target, note in rows:
        print(f'{metric:96} {value:7.2f} {unit:2} {base:7.2f} {unit:2} {value / base:7.3f}x  {verdict(target, value, base):6} '
              f'({base_name}) {note}')
    if args.tsv:
        with open(args.tsv, 'a') as f:
            for row in rows:
                f.write('\t'.join(f'{x:.3f}' if isinstance(x, float) else str(x) for x in row) + '\n')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
