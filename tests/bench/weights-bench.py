#!/usr/bin/env python3
"""Weights that outlive every process, measured (issue 31, item 6): how long a checkpoint takes to
reach the GPU, and how long an engine restart takes once gpuipcctl weights keeps it resident.

    python3 tests/bench/weights-bench.py BUILD_DIR [--size-gb 2] [--dir DIR] [--repeat 3]

BUILD_DIR is a meson build directory (its broker/gpuipc-broker, cli/gpuipcctl and client/libgpuipc.so
are used; the Python package comes from this source tree). A Llama-style bf16 checkpoint of about
--size-gb GB is written with torch and safetensors into --dir (default: a temporary directory under
$TMPDIR; put it on the local disk you mean to measure, not a tmpfs), then, each --repeat times:

  (a) safetensors   load_file(path, device='cuda'), page cache cold (posix_fadvise DONTNEED on the
                    file) and warm
  (b) gpuipc load   `gpuipcctl weights load` into cuda-vmm, cold and warm: the process's wall time
                    (CUDA start-up included) and the loader's own seconds
  (c) engine        a fresh process from exec to its first forward pass, phases apart: import (torch,
                    transformers, gpuipc), skeleton (LlamaForCausalLM on the meta device), weights
                    (attach_state_dict + load_state_dict(assign=True); for the control,
                    load_file(device='cuda') + the same), first forward; the gpuipc engine's logits are
                    compared with the safetensors engine's (they must be equal)
  (d) floors        the file read alone (cold and warm) and one host-to-device copy of the same bytes
                    from page-locked memory

and prints one table with the machine. Exit 77 without torch, safetensors, transformers or a GPU.
--plumbing runs the same steps without a GPU or torch (memfd weights, NumPy engines, a small
checkpoint written by hand): what CI can check of this script; its numbers mean nothing.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NAME = 'bench/llama'


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- the checkpoint ----

def llama_shape(size_gb):
    """A Llama-style config of about size_gb GB in bf16: hidden 2048, MLP 5632, vocab 32000 (below 0.5 GB:
    256, 704, 4000), untied head, as many layers as fit (at least one)."""
    hidden, inter, vocab = (2048, 5632, 32000) if size_gb >= 0.5 else (256, 704, 4000)
    per_layer = 2 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
    fixed = 2 * (2 * vocab * hidden + hidden)
    layers = max(1, round((size_gb * 1e9 - fixed) / per_layer))
    return dict(hidden=hidden, inter=inter, vocab=vocab, layers=layers, heads=hidden // 128)


def llama_config(s):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=s['vocab'], hidden_size=s['hidden'], intermediate_size=s['inter'],
                       num_hidden_layers=s['layers'], num_attention_heads=s['heads'],
                       num_key_value_heads=s['heads'], tie_word_embeddings=False, torch_dtype='bfloat16')


def write_checkpoint_torch(path, s):
    """Random bf16 weights of every parameter of the model (made on the GPU, for speed), saved with
    safetensors."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM
    with torch.device('meta'):
        model = LlamaForCausalLM(llama_config(s))
    gen = torch.Generator(device='cuda').manual_seed(0)
    sd = {}
    for name, p in model.state_dict().items():
        t = torch.randn(p.shape, generator=gen, device='cuda', dtype=torch.float32).mul_(0.02)
        if name.endswith('norm.weight'):
            t = torch.ones(p.shape, device='cuda')
        sd[name] = t.to(torch.bfloat16).cpu()
    save_file(sd, path, metadata={'format': 'pt'})
    return len(sd)


def write_checkpoint_plain(path, s):
    """--plumbing: the same names and shapes' bytes, written by hand (no torch), bf16 as raw 16 bits."""
    import numpy as np
    rng = np.random.default_rng(0)
    h, i, v = s['hidden'], s['inter'], s['vocab']
    shapes = {'model.embed_tokens.weight': (v, h), 'model.norm.weight': (h,), 'lm_head.weight': (v, h)}
    for n in range(s['layers']):
        p = f'model.layers.{n}.'
        shapes.update({p + 'self_attn.q_proj.weight': (h, h), p + 'self_attn.k_proj.weight': (h, h),
                       p + 'self_attn.v_proj.weight': (h, h), p + 'self_attn.o_proj.weight': (h, h),
                       p + 'mlp.gate_proj.weight': (i, h), p + 'mlp.up_proj.weight': (i, h),
                       p + 'mlp.down_proj.weight': (h, i), p + 'input_layernorm.weight': (h,),
                       p + 'post_attention_layernorm.weight': (h,)})
    header, off = {'__metadata__': {'format': 'pt'}}, 0
    for name, shape in shapes.items():
        n = 2 * int(np.prod(shape))
        header[name] = {'dtype': 'BF16', 'shape': list(shape), 'data_offsets': [off, off + n]}
        off += n
    j = json.dumps(header).encode()
    j += b' ' * (-len(j) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(j)) + j)
        for name, shape in shapes.items():
            f.write(rng.integers(0, 1 << 16, int(np.prod(shape)), dtype=np.uint16).astype('<u2').tobytes())
    return len(shapes)


def drop_cache(path):
    """The file's pages out of the page cache (written back first), so the next read is cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- the broker and gpuipcctl ----

class Gpuipc:
    def __init__(self, build, tmp):
        self.broker_bin = os.path.join(build, 'broker', 'gpuipc-broker')
        self.ctl_bin = os.path.join(build, 'cli', 'gpuipcctl')
        lib = os.path.join(build, 'client', 'libgpuipc.so')
        for f in (self.broker_bin, self.ctl_bin, lib):
            if not os.access(f, os.R_OK):
                sys.exit(f'weights-bench: {f} is missing: give a built meson build directory')
        self.sock = os.path.join(tmp, 'gpuipc.sock')
        self.env = dict(os.environ, GPUIPC_SOCKET=self.sock, GPUIPC_LIBRARY=lib,
                        PYTHONPATH=os.path.join(ROOT, 'python') + os.pathsep + os.environ.get('PYTHONPATH', ''))
        self.log = open(os.path.join(tmp, 'broker.log'), 'w')
        self.broker = subprocess.Popen([self.broker_bin, '--socket', self.sock, '--log-level', 'warn'],
                                       stderr=self.log, env=self.env)
        self.ctl('--timeout', '10000', 'ping')

    def ctl(self, *args):
        r = subprocess.run([self.ctl_bin, *args], capture_output=True, text=True, env=self.env, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f'gpuipcctl {" ".join(args)}: exit {r.returncode}: {r.stderr.strip()}')
        return r.stdout

    def load(self, path, kind):
        """(the process's wall seconds, the loader's JSON summary)"""
        t0 = time.perf_counter()
        out = self.ctl('--json', 'weights', 'load', NAME, path, '--kind', kind)
        return time.perf_counter() - t0, json.loads(out)

    def drop(self):
        self.ctl('weights', 'drop', NAME)

    def close(self):
        self.broker.send_signal(signal.SIGTERM)
        self.broker.wait(30)
        self.log.close()


# ---- the engine: a fresh process, its phases timed ----

ENGINE = r'''
import json, os, sys, time
t_start = time.time()
mode, path, out, plumbing = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == '1'
shape = json.loads(sys.argv[5])
ph = {}
if plumbing:
    import numpy, gpuipc
    ph['import'] = time.time()
    ph['skeleton'] = time.time()
    c = gpuipc.Client(label='bench-engine')
    sd = c.attach_state_dict(sys.argv[6], framework=None)  # bf16: NumPy has no dtype for it
    n = len(sd)
    ph['weights'] = time.time()
    first = numpy.frombuffer(sd['model.embed_tokens.weight'].read(0, 8 * shape['hidden']), '<u2').reshape(4, -1)
    ph['forward'] = time.time()
    numpy.save(out, first)
else:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    if mode == 'gpuipc':
        import gpuipc
    else:
        from safetensors.torch import load_file
    torch.cuda.init()
    ph['import'] = time.time()
    cfg = LlamaConfig(vocab_size=shape['vocab'], hidden_size=shape['hidden'], intermediate_size=shape['inter'],
                      num_hidden_layers=shape['layers'], num_attention_heads=shape['heads'],
                      num_key_value_heads=shape['heads'], tie_word_embeddings=False, torch_dtype='bfloat16')
    with torch.device('meta'):
        model = LlamaForCausalLM(cfg)
    # buffers that are no weights (the rotary embedding's inv_freq) are not in the checkpoint: the
    # modules holding them are made again on the GPU, as any loader must
    for mname, m in list(model.named_modules()):
        if any(b.is_meta for b in m.buffers(recurse=False)):
            parent = model.get_submodule(mname.rpartition('.')[0]) if '.' in mname else model
            with torch.device('cuda'):
                setattr(parent, mname.rpartition('.')[2], type(m)(config=cfg))
    model.eval()
    torch.cuda.synchronize()
    ph['skeleton'] = time.time()
    if mode == 'gpuipc':
        c = gpuipc.Client(label='bench-engine')
        sd = c.attach_state_dict(sys.argv[6], framework='torch')
    else:
        sd = load_file(path, device='cuda')
    model.load_state_dict(sd, assign=True, strict=True)
    torch.cuda.synchronize()
    ph['weights'] = time.time()
    ids = torch.arange(1, 33, device='cuda').unsqueeze(0)
    with torch.inference_mode():
        logits = model(ids).logits
    torch.cuda.synchronize()
    ph['forward'] = time.time()
    torch.save(logits.float().cpu(), out)
    n = len(sd)
print(json.dumps({'start': t_start, 'tensors': n, **ph}), flush=True)
'''


def run_engine(g, mode, path, out, plumbing, shape, tmp):
    script = os.path.join(tmp, 'engine.py')
    with open(script, 'w') as f:
        f.write(ENGINE)
    t_exec = time.time()
    r = subprocess.run([sys.executable, script, mode, path, out, '1' if plumbing else '0', json.dumps(shape), NAME],
                       capture_output=True, text=True, env=g.env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f'the {mode} engine failed (exit {r.returncode}):\n{r.stderr[-3000:]}')
    ph = json.loads(r.stdout.strip().splitlines()[-1])
    return {'interpreter': ph['start'] - t_exec, 'import': ph['import'] - ph['start'],
            'skeleton': ph['skeleton'] - ph['import'], 'weights': ph['weights'] - ph['skeleton'],
            'forward': ph['forward'] - ph['weights'], 'total': ph['forward'] - t_exec}


# ---- floors ----

def read_floor(path, chunk=64 << 20):
    buf = bytearray(chunk)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    n = 0
    with open(path, 'rb', buffering=0) as f:
        while True:
            got = f.readinto(mv)
            if not got:
                break
            n += got
    return time.perf_counter() - t0, n


def h2d_floor(nbytes):
    import torch
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device='cuda')
    dev.copy_(host, non_blocking=True)  # the first copy pays for mappings
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del host, dev
    torch.cuda.empty_cache()
    return dt


def safetensors_load(path):
    import torch
    from safetensors.torch import load_file
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    sd = load_file(path, device='cuda')
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del sd
    torch.cuda.empty_cache()
    return dt


# ---- report ----

def machine(plumbing, path):
    lines = [f'host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs']
    try:
        with open('/proc/cpuinfo') as f:
            model = next((l.split(':', 1)[1].strip() for l in f if l.startswith('model name')), '?')
        lines.append(f'cpu: {model}')
    except OSError:
        pass
    fs = '?'
    try:
        best = ''
        with open('/proc/mounts') as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if os.path.realpath(path).startswith(mnt) and len(mnt) > len(best):
                    best, fs = mnt, f'{typ} on {dev} at {mnt}'
    except OSError:
        pass
    lines.append(f'checkpoint: {path} ({fs})')
    if fs.startswith('tmpfs') or fs.startswith('ramfs'):
        lines.append('WARNING: the checkpoint is in memory (tmpfs): "cold" reads are warm; give --dir on a disk')
    if not plumbing:
        import safetensors
        import torch
        import transformers
        p = torch.cuda.get_device_properties(0)
        lines.append(f'gpu: {p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, CUDA '
                     f'{torch.version.cuda}, transformers {transformers.__version__}, safetensors '
                     f'{safetensors.__version__}')
        try:
            drv = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=30).stdout.split()[0]
            lines.append(f'driver: {drv}')
        except (OSError, IndexError, subprocess.SubprocessError):
            pass
    return lines


def best(xs):
    return min(xs) if xs else float('nan')


def row(name, seconds, nbytes, note=''):
    s = best(seconds)
    rate = nbytes / s / 1e9 if s == s and s > 0 else float('nan')
    spread = f'{min(seconds):.3f}-{max(seconds):.3f}' if len(seconds) > 1 else ''
    return f'{name:<44} {s * 1000:10.1f} ms {rate:8.2f} GB/s  {spread:<13} {note}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('build', help='a meson build directory')
    ap.add_argument('--size-gb', type=float, default=2.0, help='the checkpoint, in GB (default 2)')
    ap.add_argument('--dir', help='where to write it (default: a temporary directory under $TMPDIR)')
    ap.add_argument('--repeat', type=int, default=3, help='runs of each measurement (default 3; best is shown)')
    ap.add_argument('--plumbing', action='store_true',
                    help='no GPU or torch: memfd weights, NumPy engines, a small checkpoint (CI)')
    args = ap.parse_args()
    plumbing = args.plumbing
    if not plumbing:
        try:
            import safetensors  # noqa: F401
            import torch
            import transformers  # noqa: F401
        except ImportError as e:
            print(f'weights-bench: skipped: {e}')
            return SKIP
        if not torch.cuda.is_available():
            print('weights-bench: skipped: no GPU')
            return SKIP
    tmp = tempfile.mkdtemp(prefix='gpuipc-weights-bench.', dir=args.dir)
    g = None
    try:
        shape = llama_shape(args.size_gb)
        path = os.path.join(tmp, 'model.safetensors')
        t0 = time.perf_counter()
        n_tensors = (write_checkpoint_plain if plumbing else write_checkpoint_torch)(path, shape)
        nbytes = os.path.getsize(path)
        log(f'wrote {path}: {n_tensors} tensors, {nbytes / 1e9:.2f} GB, {shape["layers"]} layers '
            f'({time.perf_counter() - t0:.1f} s)')
        g = Gpuipc(args.build, tmp)
        kind = 'memfd' if plumbing else 'cuda-vmm'
        res = {k: [] for k in ('st_cold', 'st_warm', 'ld_cold', 'ld_warm', 'ld_cold_own', 'ld_warm_own',
                               'read_cold', 'read_warm', 'h2d')}
        engines = {'gpuipc': [], 'safetensors': []}
        summary = None
        for i in range(args.repeat):
            log(f'round {i + 1} of {args.repeat}')
            drop_cache(path)
            res['read_cold'].append(read_floor(path)[0])
            res['read_warm'].append(read_floor(path)[0])
            if not plumbing:
                import torch
                torch.cuda.init()
                res['h2d'].append(h2d_floor(nbytes))
                drop_cache(path)
                res['st_cold'].append(safetensors_load(path))
                res['st_warm'].append(safetensors_load(path))
            drop_cache(path)
            wall, summary = g.load(path, kind)
            res['ld_cold'].append(wall)
            res['ld_cold_own'].append(summary['seconds'])
            g.drop()
            wall, summary = g.load(path, kind)
            res['ld_warm'].append(wall)
            res['ld_warm_own'].append(summary['seconds'])
            # the weights stay loaded for the engines
            out_g = os.path.join(tmp, f'gpuipc-{i}.out')
            engines['gpuipc'].append(run_engine(g, 'gpuipc', path, out_g, plumbing, shape, tmp))
            if not plumbing and i == 0:
                out_s = os.path.join(tmp, 'safetensors.out')
                engines['safetensors'].append(run_engine(g, 'safetensors', path, out_s, plumbing, shape, tmp))
                import torch
                lg, ls = torch.load(out_g), torch.load(out_s)
                same = torch.equal(lg, ls)
                if not same:
                    log(f'the engines disagree: largest difference {(lg - ls).abs().max().item()}')
            g.drop()
        if plumbing:
            import numpy as np
            first = np.load(out_g + '.npy')
            same = first.shape == (4, shape['hidden']) and first.dtype == np.uint16
        print('\n'.join(machine(plumbing, path)))
        print(f'checkpoint: {n_tensors} tensors, {nbytes} bytes, Llama-style bf16 ({shape["layers"]} layers, hidden '
              f'{shape["hidden"]}); best of {args.repeat}' + ('; PLUMBING RUN: the numbers mean nothing' if plumbing
                                                              else ''))
        print(f'{"":<44} {"time":>13} {"rate":>13}  {"spread (s)":<13}')
        print(row('(d) floor: read the file, page cache cold', res['read_cold'], nbytes))
        print(row('(d) floor: read the file, warm', res['read_warm'], nbytes))
        if not plumbing:
            print(row('(d) floor: one host-to-device copy (pinned)', res['h2d'], nbytes))
            print(row('(a) safetensors load_file(cuda), cold', res['st_cold'], nbytes))
            print(row('(a) safetensors load_file(cuda), warm', res['st_warm'], nbytes))
        print(row('(b) gpuipcctl weights load, cold (process)', res['ld_cold'], nbytes))
        print(row('(b) gpuipcctl weights load, cold (loader)', res['ld_cold_own'], nbytes,
                  f'read {summary["read_seconds"]:.3f} s, waited for copies {summary["copy_wait_seconds"]:.3f} s (last)'))
        print(row('(b) gpuipcctl weights load, warm (process)', res['ld_warm'], nbytes))
        print(row('(b) gpuipcctl weights load, warm (loader)', res['ld_warm_own'], nbytes))
        print()
        print(f'(c) engine restart, seconds      {"interp":>8} {"import":>8} {"skeleton":>9} {"weights":>9} '
              f'{"forward":>8} {"total":>8}')
        for mode, runs in engines.items():
            for k, e in enumerate(runs):
                print(f'    {mode + " #" + str(k + 1):<28} {e["interpreter"]:8.3f} {e["import"]:8.3f} {e["skeleton"]:9.3f} '
                      f'{e["weights"]:9.4f} {e["forward"]:8.3f} {e["total"]:8.3f}')
        print(f'    the engine read what was loaded: {same}' if plumbing else
              f'    outputs equal (gpuipc vs safetensors engine): {same}')
        w = best([e['weights'] for e in engines['gpuipc']])
        floor = max(best(res['read_cold']), best(res['h2d']) if res['h2d'] else 0)
        print()
        print(f'targets: loader cold / slower floor = {best(res["ld_cold_own"]) / floor:.2f} (target <= 1.2); '
              f'engine weights step {w * 1000:.1f} ms (target < 20 ms for 2 GB)'
              + (f', {best(res["st_warm"]) / w:.0f}x faster than (a) warm (target >= 20x)' if res['st_warm'] else ''))
        return 0 if same else 1
    finally:
        if g:
            g.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
