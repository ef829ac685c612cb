#!/usr/bin/env python3
"""Weights that outlive every process (issue 31, item 6): what an engine restart costs with a
checkpoint loaded once into gpuipc memory, against the safetensors library, on one GPU.

    PYTHONPATH=python GPUIPC_LIBRARY=build/client/libgpuipc.so \\
        python3 tests/bench/weights-bench.py --build build [--dir DIR] [--size-gb 2.2] [--trials 3]

A Llama-style bfloat16 checkpoint (TinyLlama's shapes, about 2.2 GB, 201 tensors; --size-gb scales
the number of layers; --shard-gb writes a sharded checkpoint with its model.safetensors.index.json)
is written as safetensors into DIR (default: a new directory under $TMPDIR, removed at the end; give
a directory on the disk you mean to measure, and --keep to reuse the file in a later run). Then:

(a) safetensors `load_file(device='cuda:0')` in a process that has torch and its CUDA context up,
    with the file's pages dropped from the page cache first (cold) and in it (warm);
(b) the gpuipc loader, `gpuipcctl weights load NAME FILE --kind cuda-vmm --device 0`, cold and
    warm: from exec to exit (a fresh process pays its CUDA initialization), and what it says of
    itself; each load is dropped again (`gpuipcctl weights drop`) before the next;
(c) engine restarts: a fresh Python process from exec through `import torch, transformers, gpuipc`,
    CUDA's context, a LlamaForCausalLM skeleton on the meta device, the weights (attach_state_dict
    + load_state_dict(assign=True), or load_file + load_state_dict for the safetensors engine) and
    the first forward pass, each phase timed on its own; the weights stay resident in between
    (loaded once by `gpuipcctl weights load`, held by the broker). The gpuipc engine then sleeps (its
    parameters become meta tensors and it releases the views; nothing is freed) and wakes (attaches
    again and loads them again) and runs a second forward pass. Every output must be identical bit
    for bit: both engines', before and after the sleep;
(d) the floors: the file read alone (cold and warm: read(2) in 64 MiB pieces) and one host-to-device
    copy of the same number of bytes from pinned memory; and for (c)'s weights step, an engine that
    loads tensors it allocated itself on the GPU (the same load_state_dict(assign=True), first in a
    fresh process, no IPC). The skeleton phase includes its non-persistent buffers made on the GPU
    (a meta skeleton's rotary inv_freq), as a no-init skeleton makes them there too.

Cold means the file's pages were dropped with posix_fadvise(POSIX_FADV_DONTNEED) (no root needed;
the table says how much of the file was still cached, through mincore, right before each cold run).
Targets (printed MET or MISSED; a timing never fails the run): the loader within 1.2x of the slower
floor, cold and warm; the engine's weights step under 20 ms for 2 GB once the weights are resident,
and at least 20x faster than (a) warm.

--engine-pidns runs each engine in a PID namespace of its own (unshare, needs root), as a container
without a shared PID namespace. Where `gpuipcctl` has no `weights` command, (b) is reported as not
available and (c)'s weights are held by a Python process (publish_state_dict broker-held, kept
running), which the table says.

--dry-run checks the plumbing on a machine without a GPU or torch: a small checkpoint written by
hand (--size-gb 0.05 by default), the loader on memfd (or cuda-vmm on the stand-in libcuda with
--libcuda PATH, e.g. build/tests/bench/libgpuipc-bench-fakecuda.so), engines that attach the weights
as gpuipc views (framework=None) in fresh processes and compare every tensor's bytes with the file,
and the file-read floor; the rows that need torch, the safetensors library or a GPU say n/a.

Exit status: 0 done (every check passed), 1 a measurement or check failed, 77 no torch,
transformers, safetensors or GPU (without --dry-run).
"""
import argparse
import contextlib
import ctypes
import gc
import hashlib
import json
import mmap
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'gpu'))
import gpu_roles  # noqa: E402  (tests/gpu: a role in a child process that speaks JSON lines)

# TinyLlama-1.1B's shape (as tests/gpu/test-gpu-weights.py): 2.2 GB in bfloat16, 201 tensors
MODEL = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
             rms_norm_eps=1e-5)
# the dry run's: about 50 MB at 5 layers
DRY_MODEL = dict(MODEL, hidden_size=512, intermediate_size=1408, num_attention_heads=8, num_key_value_heads=2,
                 vocab_size=8000, num_hidden_layers=5)
NAME = 'bench/weights'
CHUNK = 64 << 20
STEP_TIMEOUT_S = 600
POSIX_FADV_DONTNEED = 4


def now():
    return time.monotonic()  # CLOCK_MONOTONIC: one clock for this process and its children


def say(word, data=None):
    print(word + ('' if data is None else ' ' + json.dumps(data)), flush=True)


def hear():
    return sys.stdin.readline().strip()


# ---- the checkpoint ----

def llama_shapes(cfg):
    """[(key, shape)] of LlamaForCausalLM's state dict for cfg, in its order."""
    h, i, v = cfg['hidden_size'], cfg['intermediate_size'], cfg['vocab_size']
    kv = h // cfg['num_attention_heads'] * cfg['num_key_value_heads']
    out = [('model.embed_tokens.weight', [v, h])]
    for n in range(cfg['num_hidden_layers']):
        p = f'model.layers.{n}.'
        out += [(p + 'self_attn.q_proj.weight', [h, h]), (p + 'self_attn.k_proj.weight', [kv, h]),
                (p + 'self_attn.v_proj.weight', [kv, h]), (p + 'self_attn.o_proj.weight', [h, h]),
                (p + 'mlp.gate_proj.weight', [i, h]), (p + 'mlp.up_proj.weight', [i, h]),
                (p + 'mlp.down_proj.weight', [h, i]), (p + 'input_layernorm.weight', [h]),
                (p + 'post_attention_layernorm.weight', [h])]
    out += [('model.norm.weight', [h]), ('lm_head.weight', [v, h])]
    return out


def model_config(size_gb, dry):
    """The model's shape with as many layers as make about size_gb in bfloat16 (default: as is)."""
    cfg = dict(DRY_MODEL if dry else MODEL)
    if size_gb:
        per_layer = sum(2 * _numel(s) for k, s in llama_shapes(dict(cfg, num_hidden_layers=1)) if '.layers.' in k)
        fixed = sum(2 * _numel(s) for k, s in llama_shapes(dict(cfg, num_hidden_layers=0)))
        cfg['num_hidden_layers'] = max(1, round((size_gb * 1e9 - fixed) / per_layer))
    return cfg


def _numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def _shards(shapes, shard_bytes):
    """shapes split into runs of at most shard_bytes (one tensor at least per run)."""
    runs, run, size = [], [], 0
    for key, shape in shapes:
        n = 2 * _numel(shape)
        if run and shard_bytes and size + n > shard_bytes:
            runs.append(run)
            run, size = [], 0
        run.append((key, shape))
        size += n
    return runs + [run]


_SMALL_HIGH_BYTE = bytes((b & 0x3f) | (b & 0x80) for b in range(256))


def _random_bf16(n):
    raw = bytearray(os.urandom(2 * n))
    raw[1::2] = raw[1::2].translate(_SMALL_HIGH_BYTE)  # little-endian: the odd bytes hold sign and exponent
    return bytes(raw)


def write_safetensors_by_hand(path, tensors):
    """tensors: [(key, dtype, shape, bytes)]: the format itself (an 8-byte little-endian header length,
    the JSON header padded with spaces to 8 bytes, the data), as the safetensors library writes it."""
    header, offset = {'__metadata__': {'format': 'pt'}}, 0
    for key, dtype, shape, data in tensors:
        header[key] = {'dtype': dtype, 'shape': shape, 'data_offsets': [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(',', ':')).encode()
    raw += b' ' * (-len(raw) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(raw)) + raw)
        for _, _, _, data in tensors:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_checkpoint(directory, cfg, shard_gb, dry):
    """The checkpoint's files (and its index when sharded) in directory; returns what to load:
    model.safetensors, or model.safetensors.index.json."""
    shapes = llama_shapes(cfg)
    runs = _shards(shapes, int(shard_gb * 1e9) if shard_gb else 0)
    names = ['model.safetensors'] if len(runs) == 1 else \
        [f'model-{i + 1:05d}-of-{len(runs):05d}.safetensors' for i in range(len(runs))]
    total = 0
    for fname, run in zip(names, runs):
        path = os.path.join(directory, fname)
        if dry:  # random bfloat16 bit patterns, each high byte's exponent bits kept small: finite values
            tensors = [(key, 'BF16', shape, _random_bf16(_numel(shape))) for key, shape in run]
            write_safetensors_by_hand(path, tensors)
        else:
            import torch
            from safetensors.torch import save_file
            gen = torch.Generator(device='cuda:0').manual_seed(0)
            sd = {}
            for key, shape in run:
                if key.endswith('norm.weight'):
                    t = torch.ones(shape, dtype=torch.bfloat16, device='cuda:0')
                else:
                    t = torch.randn(shape, generator=gen, dtype=torch.float32, device='cuda:0').mul_(0.02)
                sd[key] = t.to(torch.bfloat16).cpu()
            save_file(sd, path, metadata={'format': 'pt'})
            del sd
            with open(path, 'rb+') as f:
                os.fsync(f.fileno())
        total += os.path.getsize(path)
    if len(runs) == 1:
        return os.path.join(directory, names[0]), total, len(shapes)
    index = {'metadata': {'total_size': sum(2 * _numel(s) for _, s in shapes)},
             'weight_map': {key: fname for fname, run in zip(names, runs) for key, _ in run}}
    path = os.path.join(directory, 'model.safetensors.index.json')
    with open(path, 'w') as f:
        json.dump(index, f, indent=1)
    return path, total, len(shapes)


def checkpoint_files(path):
    """The data files of a checkpoint given as a file or as its index."""
    if not path.endswith('.index.json'):
        return [path]
    with open(path) as f:
        weight_map = json.load(f)['weight_map']
    d = os.path.dirname(path)
    return [os.path.join(d, n) for n in sorted(set(weight_map.values()))]


def read_safetensors(path):
    """{key: (dtype, shape, bytes)} of one safetensors file (the dry run's reference)."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for key, e in header.items():
            if key == '__metadata__':
                continue
            b, end = e['data_offsets']
            f.seek(base + b)
            out[key] = (e['dtype'], e['shape'], f.read(end - b))
    return out


def reference_digest(path):
    """sha256 over every tensor's bytes in key order, over all files of the checkpoint."""
    h = hashlib.sha256()
    tensors = {}
    for f in checkpoint_files(path):
        tensors.update(read_safetensors(f))
    for key in sorted(tensors):
        h.update(key.encode() + b'\0' + tensors[key][2])
    return h.hexdigest(), len(tensors)


# ---- the page cache ----

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_fraction(paths):
    """The share of the files' pages in the page cache (mincore), 0..1."""
    cached = total = 0
    page = mmap.PAGESIZE
    for path in paths:
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return float('nan')
            pages = (size + page - 1) // page
            vec = ctypes.create_string_buffer(pages)
            ok = _libc.mincore(addr, size, vec) == 0
            _libc.munmap(addr, size)
            if not ok:
                return float('nan')
            cached += sum(b & 1 for b in vec.raw)
            total += pages
        finally:
            os.close(fd)
    return cached / total if total else 0.0


def drop_cache(paths):
    """Drops the files' clean pages from the page cache; the share still cached afterwards."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return cached_fraction(paths)


def read_floor(paths):
    """Seconds to read the files once with read(2), 64 MiB at a time, and the bytes read."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    n = 0
    t0 = now()
    for path in paths:
        with open(path, 'rb', buffering=0) as f:
            while True:
                got = f.readinto(view)
                if not got:
                    break
                n += got
    return now() - t0, n


# ---- roles (child processes) ----

def torch_setup():
    import torch
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device='cuda:0').item()  # the context, outside every timed part
    return torch


def role_st(path):
    """(a) and the copy floor of (d): answers 'cold'/'warm' with a timed load_file, 'h2d' with a timed
    pinned host-to-device copy; 'exit' ends it."""
    torch = torch_setup()
    from safetensors.torch import load_file
    files = checkpoint_files(path)
    say('ready', {'torch': torch.__version__})
    while True:
        word = hear()
        if word in ('cold', 'warm'):
            torch.cuda.synchronize()
            t0 = now()
            sd = {}
            for f in files:
                sd.update(load_file(f, device='cuda:0'))
            torch.cuda.synchronize()
            dt = now() - t0
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            del sd
            torch.cuda.empty_cache()
            say('loaded', {'s': dt, 'bytes': nbytes})
        elif word.startswith('h2d'):
            nbytes = int(word.split()[1])
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            host.fill_(1)
            dev = torch.empty(nbytes, dtype=torch.uint8, device='cuda:0')
            dev.copy_(host, non_blocking=True)  # the first copy maps what it must: not timed
            times = []
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = now()
                dev.copy_(host, non_blocking=True)
                torch.cuda.synchronize()
                times.append(now() - t0)
            del host, dev
            torch.cuda.empty_cache()
            say('copied', {'s': times, 'bytes': nbytes})
        else:
            return


def _rebuild_meta_buffers(model, config):
    """A skeleton on the meta device has its non-persistent buffers (the rotary embedding's
    inv_freq) on meta too, and they are in no state dict: the modules that own them are made again
    on the GPU (they are small)."""
    import torch
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        cls, made = type(module), None
        for kwargs in (dict(config=config, device='cuda:0'), dict(config=config)):
            try:
                with torch.device('cuda:0'):
                    made = cls(**kwargs)
                break
            except TypeError:
                continue
        if made is None:
            raise RuntimeError(f'cannot make {name} ({cls.__name__}) again off the meta device; try --skeleton no-init')
        parent, _, attr = name.rpartition('.')
        setattr(model.get_submodule(parent) if parent else model, attr, made)


def role_engine(source, path, t_exec, skeleton, sock):
    """(c): one engine start, its phases timed from t_exec (the parent's clock just before exec)."""
    t = {'exec': float(t_exec)}
    import torch
    import transformers
    import gpuipc
    t['import'] = now()
    torch.cuda.set_device(0)
    torch.zeros(1, device='cuda:0').item()
    t['cuda'] = now()
    cfg = json.loads(os.environ['WEIGHTS_BENCH_MODEL'])
    config = transformers.LlamaConfig(**cfg)
    config._attn_implementation = 'eager'  # deterministic kernels: both engines' logits comparable bit for bit
    if skeleton == 'meta':
        with torch.device('meta'):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    else:
        from transformers.modeling_utils import no_init_weights
        with torch.device('cuda:0'), no_init_weights():
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.eval()
    if skeleton == 'meta':
        # part of the skeleton, not of its weights: a no-init skeleton makes these buffers in the
        # phase above, and they are in no state dict (the first CUDA kernels of the process run here)
        _rebuild_meta_buffers(model, config)
    torch.cuda.synchronize()
    t['skeleton'] = now()
    client = None
    if source == 'local':
        # the floor of "into the model": the same load_state_dict(assign=True), first call in a fresh
        # process, of tensors already on the GPU (allocated here, before the clock): no IPC at all
        sd = {k: torch.empty(v.shape, dtype=v.dtype, device='cuda:0') for k, v in model.state_dict().items()}
        torch.cuda.synchronize()
        t['skeleton'] = t['connect'] = t['attach'] = now()
    elif source == 'gpuipc':
        client = gpuipc.Client(socket=sock, label='weights-bench-engine')
        t['connect'] = now()
        sd = client.attach_state_dict(NAME, framework='torch', timeout_ms=60000, device=0)
        t['attach'] = now()
    else:
        from safetensors.torch import load_file
        sd = {}
        for f in checkpoint_files(path):
            sd.update(load_file(f, device='cuda:0'))
        t['connect'] = t['attach'] = now()
    model.load_state_dict(sd, assign=True, strict=True)
    torch.cuda.synchronize()
    t['weights'] = now()
    if source == 'local':
        say('engine', {'t': t, 'tensors': len(sd)})  # its weights are uninitialized: no forward
        return
    ids = (torch.arange(128, device='cuda:0') * 7919 % cfg['vocab_size']).view(1, 128)
    with torch.no_grad():
        logits = model(ids).logits.float().contiguous()
    torch.cuda.synchronize()
    t['forward'] = now()
    digest = hashlib.sha256(logits.cpu().numpy().tobytes()).hexdigest()
    out = {'t': t, 'logits': digest, 'tensors': len(sd)}
    if client is not None:
        # sleep: the engine lets go of the weights (its parameters become meta tensors, the views are
        # released) and frees nothing: they stay resident, held by the broker; wake: attach again
        # (the mapping is still cached: one round trip, no import) and load them into the model
        _params_to_meta(model)
        sd.release()
        del sd
        gc.collect()
        torch.cuda.synchronize()
        t['sleep'] = now()
        sd = client.attach_state_dict(NAME, framework='torch', timeout_ms=60000, device=0)
        model.load_state_dict(sd, assign=True, strict=True)
        torch.cuda.synchronize()
        t['wake'] = now()
        with torch.no_grad():
            again = model(ids).logits.float().contiguous()
        torch.cuda.synchronize()
        t['forward_after_wake'] = now()
        out['logits_after_wake'] = hashlib.sha256(again.cpu().numpy().tobytes()).hexdigest()
    say('engine', out)
    del model, logits
    if client is not None:
        sd.release()
        client.close()


def _params_to_meta(model):
    """Every parameter replaced by a meta tensor of its shape: the model keeps its structure and its
    buffers, and no reference to the weights' memory."""
    import torch
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                module._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device='meta'),
                                                              requires_grad=p.requires_grad)


def role_dry_engine(path, t_exec, sock):
    """The dry run's (c): attaches the weights as gpuipc views, no framework, and hashes every
    tensor's bytes the way reference_digest hashes the file's."""
    t = {'exec': float(t_exec)}
    import gpuipc
    t['import'] = t['cuda'] = t['skeleton'] = now()
    client = gpuipc.Client(socket=sock, label='weights-bench-engine')
    t['connect'] = now()
    sd = client.attach_state_dict(NAME, framework=None, timeout_ms=60000)
    t['attach'] = now()
    h = hashlib.sha256()
    for key in sorted(sd):
        h.update(key.encode() + b'\0' + sd[key].read())
    t['weights'] = t['forward'] = now()
    out = {'t': t, 'logits': h.hexdigest(), 'tensors': len(sd), 'dtypes': sorted({v.dtype for v in sd.values()})}
    sd.release()  # sleep, and wake: attach again and read it all again
    t['sleep'] = now()
    sd = client.attach_state_dict(NAME, framework=None, timeout_ms=60000)
    h = hashlib.sha256()
    for key in sorted(sd):
        h.update(key.encode() + b'\0' + sd[key].read())
    t['wake'] = t['forward_after_wake'] = now()
    out['logits_after_wake'] = h.hexdigest()
    say('engine', out)
    sd.release()
    client.close()


def role_holder(path, kind, sock, dry):
    """Where gpuipcctl has no weights command: the weights published from Python (broker-held) by a
    process that stays running until told 'exit'."""
    import gpuipc
    client = gpuipc.Client(socket=sock, label='weights-bench-holder')
    device = None if kind == 'memfd' else 0
    if dry == 'dry':  # bfloat16 as its bit patterns: NumPy has no bfloat16
        import numpy
        sd = {}
        for f in checkpoint_files(path):
            for key, (dtype, shape, raw) in read_safetensors(f).items():
                sd[key] = numpy.frombuffer(raw, dtype=numpy.uint16).reshape(shape)
    else:
        import torch
        from safetensors.torch import load_file
        torch.cuda.set_device(0)
        sd = {}
        for f in checkpoint_files(path):
            sd.update(load_file(f, device='cuda:0'))
    client.publish_state_dict(sd, NAME, kind=kind, device=device, broker_held=True)
    del sd
    say('held')
    hear()
    client.close()


def role_write(directory, shard_gb):
    """The GPU run's checkpoint, written in a process of its own: the orchestrator makes no CUDA
    context (it would hold device memory through every measurement)."""
    cfg = json.loads(os.environ['WEIGHTS_BENCH_MODEL'])
    path, nbytes, n = write_checkpoint(directory, cfg, float(shard_gb), False)
    say('written', {'path': path, 'tensors': n})


ROLES = {'write': role_write, 'st': role_st, 'engine': role_engine, 'dry-engine': role_dry_engine, 'holder': role_holder}


# ---- the orchestrator ----

class Bench:
    def __init__(self, opts, tmp):
        self.opts, self.tmp = opts, tmp
        self.sock = os.path.join(tmp, 'gpuipc.sock')
        self.rows = []      # (group, what, value or None, unit, note)
        self.targets = []   # (what, met, detail)
        self.failures = []  # (what, detail)
        self.env = dict(os.environ, GPUIPC_SOCKET=self.sock)
        if opts.libcuda:
            self.env['GPUIPC_LIBCUDA'] = opts.libcuda
        self.broker = None
        self.read_s, self.st_s, self.loader_s, self.h2d_s = {}, {}, {}, 0.0
        self.engine_results, self.holder_note = {}, ''
        self.local_ms = None  # the floor of the engine's load_state_dict: local tensors, no IPC

    # -- bookkeeping --

    def row(self, group, what, values, unit, note=''):
        self.rows.append((group, what, values, unit, note))

    def fail(self, what, detail):
        self.failures.append((what, str(detail)))
        print(f'FAIL {what}: {detail}', flush=True)

    def target(self, what, met, detail):
        self.targets.append((what, met, detail))

    # -- processes --

    def start_broker(self):
        log = open(os.path.join(self.tmp, 'broker.log'), 'w')
        self.broker = subprocess.Popen([self.opts.broker, '--socket', self.sock, '--log-level', 'warn'],
                                       stderr=log, env=self.env)
        log.close()
        deadline = now() + 30
        while not os.path.exists(self.sock):
            if now() > deadline or self.broker.poll() is not None:
                raise RuntimeError('the broker did not come up (its log: ' + self.broker_log() + ')')
            time.sleep(0.05)

    def broker_log(self):
        with open(os.path.join(self.tmp, 'broker.log')) as f:
            return f.read().strip()[-2000:]

    def stop_broker(self):
        if self.broker is None:
            return
        self.broker.terminate()
        try:
            self.broker.wait(30)
        except subprocess.TimeoutExpired:
            self.broker.kill()
            self.broker.wait()

    def ctl(self, *args, timeout=STEP_TIMEOUT_S):
        cmd = [self.opts.gpuipcctl, '--socket', self.sock, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def role(self, name, *args, pidns=False):
        env = dict(self.env, WEIGHTS_BENCH_MODEL=json.dumps(self.cfg))
        return gpu_roles.Role(__file__, name, *[str(a) for a in args], pidns=pidns, env=env,
                              label=name, step_timeout_s=STEP_TIMEOUT_S)

    # -- the loader --

    def has_loader(self):
        r = self.ctl('weights', 'load', '--help', timeout=60)
        return r.returncode == 0

    def load(self, name):
        """(seconds from exec to exit, the loader's last line) of one `gpuipcctl weights load`."""
        args = ['weights', 'load', name, self.path, '--kind', self.kind]
        if self.kind != 'memfd':
            args += ['--device', '0']
        t0 = now()
        r = self.ctl(*args)
        dt = now() - t0
        out = (r.stdout.strip() + '\n' + r.stderr.strip()).strip()
        if r.returncode != 0:
            raise RuntimeError(f'gpuipcctl {" ".join(args)}: exit {r.returncode}: {out[-1000:]}')
        lines = out.splitlines()
        summary = [ln for ln in lines if ln.startswith('loaded ')]  # its summary: bytes, seconds, GB/s
        return dt, (summary or lines or [''])[-1]

    def drop(self, name):
        """Retires what the loader published under name and waits (30 s at most) until the broker
        forgot it, so that the next load finds the device's memory free."""
        r = self.ctl('weights', 'drop', name, timeout=60)
        if r.returncode != 0:
            r = self.ctl('retire', name, timeout=60)
        deadline = now() + 30
        while now() < deadline:
            ls = self.ctl('--json', 'ls', '--prefix', name, timeout=60)
            try:  # the name, and any part of it (NAME@...)
                left = [b for b in json.loads(ls.stdout) if b.get('name') == name or
                        b.get('name', '').startswith(name + '@')]
            except ValueError:
                left = None
            if left == []:
                return
            time.sleep(0.2)
        print(f'  note: {name} still registered 30 s after it was dropped', flush=True)

    # -- the runs --

    def floors_read(self):
        files = self.files
        for mode in ('cold', 'warm'):
            times, cached = [], []
            for _ in range(self.opts.trials):
                if mode == 'cold':
                    cached.append(drop_cache(files))
                else:
                    read_floor(files)  # make sure it is all in the cache
                dt, n = read_floor(files)
                times.append(dt)
            self.row('d', f'file read alone, {mode}', times, 's', _cached_note(cached))
            self.read_s[mode] = statistics.median(times)

    def st_and_copy(self):
        if self.opts.dry_run:
            for what in ('safetensors load_file, cold', 'safetensors load_file, warm'):
                self.row('a', what, None, 's', 'n/a (dry run: no torch, no GPU)')
            self.row('d', 'host-to-device copy, pinned', None, 's', 'n/a (dry run)')
            return
        st = self.role('st', self.path)
        try:
            st.expect('ready')
            st.say(f'h2d {self.nbytes}')
            got = st.expect('copied')
            self.row('d', 'host-to-device copy, pinned', got['s'], 's', f'{got["bytes"] / 1e9:.2f} GB, one copy')
            self.h2d_s = statistics.median(got['s'])
            for mode in ('cold', 'warm'):
                times, cached = [], []
                for _ in range(self.opts.trials):
                    cached.append(drop_cache(self.files) if mode == 'cold' else cached_fraction(self.files))
                    st.say(mode)
                    times.append(st.expect('loaded')['s'])
                self.row('a', f'safetensors load_file, {mode}', times, 's', _cached_note(cached))
                self.st_s[mode] = statistics.median(times)
        finally:
            st.say('exit')
            st.stop()

    def loader(self):
        if not self.has_loader():
            for mode in ('cold', 'warm'):
                self.row('b', f'gpuipc loader, {mode}', None, 's', 'n/a: this gpuipcctl has no weights command')
            return
        for mode in ('cold', 'warm'):
            times, cached, said = [], [], ''
            for i in range(self.opts.trials):
                cached.append(drop_cache(self.files) if mode == 'cold' else cached_fraction(self.files))
                name = f'bench/load-{mode}-{i}'
                dt, said = self.load(name)
                times.append(dt)
                self.drop(name)
            self.row('b', f'gpuipc loader, {mode}', times, 's', _cached_note(cached) + f'; it said: {said[:240]}')
            self.loader_s[mode] = statistics.median(times)

    @contextlib.contextmanager
    def resident(self):
        """The weights under NAME for the engines: loaded by gpuipcctl (broker-held), or by a Python
        holder that stays running."""
        if self.has_loader():
            self.load(NAME)
            self.holder_note = 'loaded by gpuipcctl weights load, held by the broker'
            try:
                yield
            finally:
                self.drop(NAME)
            return
        holder = self.role('holder', self.path, self.kind, self.sock, 'dry' if self.opts.dry_run else 'gpu')
        try:
            holder.expect('held')
            self.holder_note = 'published by a Python holder (no gpuipcctl weights here), which stays running'
            yield
        finally:
            holder.say('exit')
            holder.stop()

    def engine(self, source):
        t_exec = now()
        if self.opts.dry_run:
            r = self.role('dry-engine', self.path, repr(t_exec), self.sock, pidns=self.opts.engine_pidns)
        else:
            r = self.role('engine', source, self.path, repr(t_exec), self.opts.skeleton, self.sock,
                          pidns=self.opts.engine_pidns)
        try:
            return r.expect('engine')
        finally:
            r.stop()

    def engines(self):
        phases = ('import', 'cuda', 'skeleton', 'weights', 'forward')
        results, local = {'gpuipc': [], 'safetensors': []}, []
        with self.resident():
            for _ in range(self.opts.engines):
                results['gpuipc'].append(self.engine('gpuipc'))
                if not self.opts.dry_run:
                    results['safetensors'].append(self.engine('safetensors'))
                    local.append(self.engine('local'))
        if local:
            loads = [(r['t']['weights'] - r['t']['attach']) * 1000 for r in local]
            self.local_ms = statistics.median(loads)
            self.row('c', 'floor: load_state_dict of local tensors', loads, 'ms',
                     'the same load_state_dict(assign=True), first in a fresh process, of tensors already on the '
                     'GPU: no IPC')
        for source, runs in results.items():
            if not runs:
                self.row('c', f'engine restart, {source}', None, 's', 'n/a (dry run)')
                continue
            prev = 'exec'
            for ph in phases:
                self.row('c', f'engine ({source}): {ph}', [(r['t'][ph] - r['t'][prev]) * 1000 for r in runs], 'ms',
                         'from exec: interpreter start and imports' if ph == 'import' else
                         ('attach + load_state_dict(assign=True)' if source == 'gpuipc' else
                          'load_file + load_state_dict(assign=True)') if ph == 'weights' else '')
                prev = ph
            if source == 'gpuipc':  # the weights step split: connect and attach (fd import, map), then the load
                for ph, a, b, note in (('weights: connect + attach', 'skeleton', 'attach',
                                        'the first attach maps the memory'),
                                       ('weights: into the model', 'attach', 'weights',
                                        'every tensor read and hashed' if self.opts.dry_run else
                                        'load_state_dict(assign=True): no copy')):
                    self.row('c', f'engine ({source}): {ph}', [(r['t'][b] - r['t'][a]) * 1000 for r in runs], 'ms',
                             note)
            if runs and 'wake' in runs[0]['t']:
                for ph, prev_ph, note in (('sleep', 'forward', 'parameters to meta, views released: nothing freed'),
                                          ('wake', 'sleep', 'attach again (cached mapping) + load_state_dict'),
                                          ('forward_after_wake', 'wake', '')):
                    self.row('c', f'engine ({source}): {ph.replace("_", " ")}',
                             [(r['t'][ph] - r['t'][prev_ph]) * 1000 for r in runs], 'ms', note)
            self.row('c', f'engine ({source}): exec to first forward',
                     [(r['t']['forward'] - r['t']['exec']) * 1000 for r in runs], 'ms', self.holder_note
                     if source == 'gpuipc' else 'page cache warm')
        # the weights: every engine's output the same, and the same as the reference
        want = self.reference if self.opts.dry_run else (results['safetensors'][0]['logits']
                                                          if results['safetensors'] else None)
        outs = {r['logits'] for runs in results.values() for r in runs}
        what = 'every tensor read back equals the file' if self.opts.dry_run else \
            'logits through gpuipc identical to the safetensors-loaded model\'s'
        woken = {r['logits_after_wake'] for r in results['gpuipc'] if 'logits_after_wake' in r}
        if woken and woken != outs:
            self.fail('logits after sleep and wake identical to the first forward\'s',
                      f'{len(woken | outs)} distinct outputs')
        elif woken:
            print('PASS logits after sleep and wake identical to the first forward\'s', flush=True)
        if want is None or outs != {want}:
            self.fail(what, f'{len(outs)} distinct outputs; want {want}')
        else:
            print(f'PASS {what} ({len(results["gpuipc"]) + len(results["safetensors"])} engines)', flush=True)
        self.engine_results = results

    def judge(self):
        floor = {m: max(self.read_s[m], self.h2d_s) for m in ('cold', 'warm')}
        for m in ('cold', 'warm'):
            got = self.loader_s.get(m)
            if got is not None and not self.opts.dry_run:
                self.target(f'loader, {m}: within 1.2x of the slower floor', got <= 1.2 * floor[m],
                            f'{got:.3f} s vs floor {floor[m]:.3f} s ({got / floor[m]:.2f}x)')
        runs = self.engine_results.get('gpuipc') or []
        if runs and not self.opts.dry_run:
            step = statistics.median([(r['t']['weights'] - r['t']['skeleton']) * 1000 for r in runs])
            attach = statistics.median([(r['t']['attach'] - r['t']['skeleton']) * 1000 for r in runs])
            scaled = step * 2e9 / self.nbytes
            self.target('engine weights step under 20 ms for 2 GB', scaled < 20,
                        f'{step:.1f} ms for {self.nbytes / 1e9:.2f} GB ({scaled:.1f} ms per 2 GB): connect + '
                        f'attach {attach:.1f} ms, the rest load_state_dict'
                        + (f'; the same load_state_dict of local tensors took {self.local_ms:.1f} ms'
                           if self.local_ms is not None else ''))
            warm = self.st_s.get('warm')
            if warm:
                self.target('engine weights step at least 20x faster than load_file warm',
                            warm * 1000 >= 20 * step, f'{warm * 1000:.0f} ms / {step:.1f} ms = '
                            f'{warm * 1000 / step:.0f}x')


def _cached_note(cached):
    if not cached:
        return ''
    return 'cached before: ' + '/'.join(f'{c * 100:.0f}%' for c in cached)


def _fmt(values, unit):
    if values is None:
        return '-'
    if not isinstance(values, list):
        values = [values]
    med = statistics.median(values)
    if len(values) == 1:
        return f'{med:.3f}' if unit == 's' else f'{med:.1f}'
    f = '{:.3f}' if unit == 's' else '{:.1f}'
    return f'{f.format(med)} ({f.format(min(values))}..{f.format(max(values))})'


def machine(opts, path):
    """One line per fact about where this ran."""
    lines = [f'host: {platform.node()}, {platform.platform()}, python {platform.python_version()}']
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), '?')
        lines.append(f'cpu: {cpu} x {os.cpu_count()}; memory {os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30:.0f} GiB')
    except (OSError, ValueError):
        pass
    fs = subprocess.run(['df', '-T', '-h', os.path.dirname(path)], capture_output=True, text=True).stdout.splitlines()
    if len(fs) > 1:
        lines.append('checkpoint on: ' + ' '.join(fs[1].split()[:3]))
    if not opts.dry_run:
        smi = subprocess.run(['nvidia-smi', '--query-gpu=name,driver_version,memory.total,pcie.link.gen.max,'
                              'pcie.link.width.max', '--format=csv,noheader', '-i', '0'],
                             capture_output=True, text=True)
        lines.append('gpu 0: ' + (smi.stdout.strip() or 'nvidia-smi said nothing'))
        import torch
        import transformers
        import safetensors
        lines.append(f'torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, '
                     f'safetensors {safetensors.__version__}')
    else:
        lines.append('dry run: ' + (f'cuda-vmm on the stand-in libcuda {opts.libcuda}' if opts.libcuda else 'memfd'))
    return lines


def print_table(bench, facts):
    print()
    print('# gpuipc weights bench: ' + ('DRY RUN (plumbing only, no numbers to report)' if bench.opts.dry_run else
                                        'engine restarts from resident weights'))
    for ln in facts:
        print('# ' + ln)
    print(f'# checkpoint: {bench.nbytes / 1e9:.2f} GB in {len(bench.files)} file(s), {bench.n_tensors} tensors, '
          f'bfloat16, {bench.cfg["num_hidden_layers"]} layers; median (min..max) of {bench.opts.trials} trials, '
          f'{bench.opts.engines} engine starts each')
    width = max(len(r[1]) for r in bench.rows) + 2
    print(f'{"":3}{"what":{width}}{"value":>26}  unit  GB/s   note')
    for group, what, values, unit, note in bench.rows:
        gbs = ''
        if values is not None and unit == 's':
            gbs = f'{bench.nbytes / 1e9 / statistics.median(values):6.2f}'
        print(f'({group}) {what:{width}}{_fmt(values, unit):>26}  {unit:4}  {gbs:6} {note}')
    for what, met, detail in bench.targets:
        print(f'{"MET" if met else "MISSED"} {what}: {detail}')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--build', default=os.environ.get('GPUIPC_BUILD_ROOT', os.path.join(ROOT, 'build')),
                    help='the meson build directory (broker, gpuipcctl, libgpuipc)')
    ap.add_argument('--broker', help='default: BUILD/broker/gpuipc-broker')
    ap.add_argument('--gpuipcctl', help='default: BUILD/cli/gpuipcctl')
    ap.add_argument('--dir', help='where to write the checkpoint (default: a new directory under $TMPDIR)')
    ap.add_argument('--keep', action='store_true', help='keep the checkpoint, and reuse one found in --dir')
    ap.add_argument('--size-gb', type=float, default=0.0, help='scale the layers to about this size')
    ap.add_argument('--shard-gb', type=float, default=0.0, help='write shards of at most this size and an index')
    ap.add_argument('--trials', type=int, default=3)
    ap.add_argument('--engines', type=int, default=3, help='engine starts per source')
    ap.add_argument('--skeleton', choices=('meta', 'no-init'), default='meta',
                    help="the engines' model before its weights: on the meta device, or on the GPU without init")
    ap.add_argument('--engine-pidns', action='store_true', help='each engine in a PID namespace of its own (root)')
    ap.add_argument('--dry-run', action='store_true', help='plumbing only, no GPU or torch (see above)')
    ap.add_argument('--libcuda', help='dry run: cuda-vmm on this stand-in libcuda instead of memfd')
    ap.add_argument('--role')
    ap.add_argument('args', nargs='*')
    opts = ap.parse_args()
    if opts.role:
        ROLES[opts.role](*opts.args)
        return 0
    opts.broker = opts.broker or os.path.join(opts.build, 'broker', 'gpuipc-broker')
    opts.gpuipcctl = opts.gpuipcctl or os.path.join(opts.build, 'cli', 'gpuipcctl')
    os.environ.setdefault('GPUIPC_LIBRARY', os.path.join(opts.build, 'client', 'libgpuipc.so'))
    os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')  # is_available() without a CUDA context here
    os.environ['PYTHONPATH'] = os.path.join(ROOT, 'python') + os.pathsep + os.environ.get('PYTHONPATH', '')
    if not opts.dry_run:
        why = gpu_missing()
        if why:
            print(f'skipped: {why} (--dry-run checks the plumbing without them)')
            return SKIP
    for exe in (opts.broker, opts.gpuipcctl):
        if not os.access(exe, os.X_OK):
            print(f'{exe} is not there: build first, or give --build / --broker / --gpuipcctl', file=sys.stderr)
            return 1
    tmp = tempfile.mkdtemp(prefix='gpuipc-weights-bench.')
    ckpt_dir = opts.dir or os.path.join(tmp, 'ckpt')
    os.makedirs(ckpt_dir, exist_ok=True)
    bench = Bench(opts, tmp)
    bench.cfg = model_config(opts.size_gb or (0.05 if opts.dry_run else 0), opts.dry_run)
    bench.kind = 'cuda-vmm' if (not opts.dry_run or opts.libcuda) else 'memfd'
    try:
        target = os.path.join(ckpt_dir, 'model.safetensors.index.json' if opts.shard_gb else 'model.safetensors')
        if opts.keep and os.path.exists(target):
            bench.path = target
            bench.n_tensors = sum(len(read_header(f)) for f in checkpoint_files(target))
            print(f'reusing {target}', flush=True)
        else:
            t0 = now()
            if opts.dry_run:
                bench.path, _, bench.n_tensors = write_checkpoint(ckpt_dir, bench.cfg, opts.shard_gb, True)
            else:
                writer = bench.role('write', ckpt_dir, opts.shard_gb)
                try:
                    got = writer.expect('written')
                finally:
                    writer.stop()
                bench.path, bench.n_tensors = got['path'], got['tensors']
            print(f'wrote {bench.path} in {now() - t0:.1f} s', flush=True)
        bench.files = checkpoint_files(bench.path)
        bench.nbytes = sum(os.path.getsize(f) for f in bench.files)
        if opts.dry_run:
            bench.reference, _ = reference_digest(bench.path)
        facts = machine(opts, bench.path)
        bench.start_broker()
        for name, step in (('floors: file read', bench.floors_read), ('(a) safetensors and the copy floor', bench.st_and_copy),
                           ('(b) the loader', bench.loader), ('(c) engine restarts', bench.engines)):
            print(f'--- {name}', flush=True)
            try:
                step()
            except Exception as e:
                traceback.print_exc()
                bench.fail(name, e)
        bench.judge()
        print_table(bench, facts)
    finally:
        bench.stop_broker()
        if bench.failures and os.path.exists(os.path.join(tmp, 'broker.log')):
            print('--- broker log\n' + bench.broker_log())
        shutil.rmtree(tmp, ignore_errors=True)
        if opts.dir and not opts.keep:
            for f in os.listdir(ckpt_dir):
                if f.endswith('.safetensors') or f.endswith('.safetensors.index.json'):
                    os.unlink(os.path.join(ckpt_dir, f))
    for what, detail in bench.failures:
        print(f'FAILED: {what}: {detail}')
    return 1 if bench.failures else 0


def read_header(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        return {k: v for k, v in json.loads(f.read(n)).items() if k != '__metadata__'}


def gpu_missing():
    """Why the GPU run cannot happen here, or None."""
    for mod in ('torch', 'transformers', 'safetensors', 'numpy'):
        try:
            __import__(mod)
        except ImportError:
            return f'no {mod}'
    import torch
    if not torch.cuda.is_available():
        return 'no GPU (torch.cuda.is_available() is False)'
    return None


if __name__ == '__main__':
    sys.exit(main())
