#!/usr/bin/env python3
"""A process that published GPU memory exits without close(): it must exit as it would without
gpuipc (status 0, or 1 after an uncaught exception) and die of no signal. Prints one PASS/FAIL line
per case. Exit status: 0 all passed, 1 a case failed, 77 no GPU or no torch.

    GPUIPC_LIBRARY=build/client/libgpuipc.so PYTHONPATH=python \\
        python3 tests/gpu/test-gpu-exit.py --broker build/broker/gpuipc-broker [--diagnose]

Each case: a producer builds a Llama-style bf16 model of about 280 MB (transformers' LlamaForCausalLM
when installed, else plain tensors of the same names and shapes), saves and loads it with safetensors
when installed, and publishes its state dict with publish_state_dict(kind='cuda-vmm', device=0) (the
snapshot path), a tensor of a pool (pool.empty), a tensor torch's allocator put in the pool
(``with pool:``) and a cuda-vmm ring; three consumers (processes of their own) attach the state dict
and the pooled tensor, join the ring, take a frame, check what they got and exit holding all of it,
their Clients open; then the producer returns from main without close(), or calls sys.exit(0), or
raises. Its exit handlers (registered before gpuipc's and after it) compute on a tensor in the pool, so
the memory must still be there and CUDA usable while Python exits. The same cases with CuPy arrays
when CuPy is installed.

--diagnose adds cases that reproduce the old behaviour and say where it crashed (for the record of
the cause): the issue's script exactly (state dict only) with the old exit path (the Client closed,
unmapping and freeing through CUDA, by the garbage collector while the interpreter is torn down), the
same close called at the end of main instead (the control: the Client closed while nothing is torn
down yet), and close() from an exit handler of the script's own. A case that died of a signal is run
again under gdb, when installed, for the C backtrace.
"""
import argparse
import atexit
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
T = 120000
CONSUMERS = 3
MODES = {'return': 0, 'sys.exit': 0, 'exception': 1}
RING_SHAPE = (1 << 16,)
POOLED = (1024, 1024)


def say(obj):
    print(json.dumps(obj), flush=True)


def model_state_dict(torch):
    """A Llama-style bf16 state dict on GPU 0 (about 280 MB): transformers' when installed."""
    shapes = dict(vocab=32000, hidden=1024, inter=2816, layers=6, heads=16)
    if os.environ.get('GPUIPC_EXIT_MODEL') == 'large':  # --large: TinyLlama's shapes, about 2.2 GB
        shapes = dict(vocab=32000, hidden=2048, inter=5632, layers=22, heads=32)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=shapes['vocab'], hidden_size=shapes['hidden'],
                          intermediate_size=shapes['inter'], num_hidden_layers=shapes['layers'],
                          num_attention_heads=shapes['heads'], num_key_value_heads=shapes['heads'])
        with torch.device('cuda:0'):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        source = 'transformers'
    except ImportError:
        h, i, n = shapes['hidden'], shapes['inter'], shapes['layers']
        sd = {'model.embed_tokens.weight': (shapes['vocab'], h), 'lm_head.weight': (shapes['vocab'], h),
              'model.norm.weight': (h,)}
        for layer in range(n):
            p = f'model.layers.{layer}.'
            sd.update({p + 'self_attn.q_proj.weight': (h, h), p + 'self_attn.k_proj.weight': (h, h),
                       p + 'self_attn.v_proj.weight': (h, h), p + 'self_attn.o_proj.weight': (h, h),
                       p + 'mlp.gate_proj.weight': (i, h), p + 'mlp.up_proj.weight': (i, h),
                       p + 'mlp.down_proj.weight': (h, i), p + 'input_layernorm.weight': (h,),
                       p + 'post_attention_layernorm.weight': (h,)})
        gen = torch.Generator(device='cuda:0').manual_seed(0)
        sd = {k: torch.randn(s, generator=gen, device='cuda:0').to(torch.bfloat16) for k, s in sd.items()}
        source = 'plain tensors'
    try:
        import safetensors.torch as st
        d = tempfile.mkdtemp(prefix='gpuipc-exit-model.')
        path = os.path.join(d, 'model.safetensors')
        st.save_file({k: v.contiguous() for k, v in sd.items()}, path)
        sd = st.load_file(path, device='cuda:0')
        shutil.rmtree(d, ignore_errors=True)
        source += ' through safetensors'
    except ImportError:
        pass
    return sd, source


def checksum(torch, sd):
    """One number per state dict, computed on the GPU: the sum of the first and last entries' 16-bit
    words (exact in float64; the same for the bf16 tensors and their int16 views)."""
    keys = sorted(sd)
    return float(sum(sd[k].view(torch.int16).double().sum() for k in (keys[0], keys[-1])))


# ---- the consumer ----

def consumer(fw, prefix, expect_sum):
    import torch
    torch.cuda.set_device(0)
    import gpuipc
    c = gpuipc.Client(label='exit-consumer')
    sd = c.attach_state_dict(prefix + 'sd', framework='torch', timeout_ms=T)
    got = checksum(torch, sd)
    a = c.attach(prefix + 'pooled', timeout_ms=T)
    pooled = a.torch()
    ring = c.join_ring(prefix + 'ring', timeout_ms=T)
    say({'joined': True})
    frame = ring.take(T)
    t = frame.torch()
    if fw == 'cupy':
        import cupy
        t = torch.from_dlpack(cupy.from_dlpack(frame))
    say({'sd': abs(got - float(expect_sum)) <= 1e-6 * max(1.0, abs(got)),
         'pooled': float(pooled.sum()) == float(POOLED[0] * POOLED[1] * 2),
         'frame': bool((t == 3).all())})
    # Returns holding the state dict, the tensor and the frame, its Client open.


# ---- the producer ----

KEEP = []  # a tensor torch's allocator put in the pool, used by the exit handlers


def exit_compute():
    """An exit handler: CUDA work on pool memory while Python exits (it must still be mapped)."""
    import torch
    ok = all(float(x.sum()) == float(x.numel()) for x in KEEP)
    torch.cuda.synchronize()
    say({'exit_compute': ok})


def producer(fw, mode):
    prefix = f'exit/{fw}/{mode}/'
    legacy = mode.startswith('legacy')
    if not legacy:
        atexit.register(exit_compute)  # runs after gpuipc's exit handler
    import torch
    torch.cuda.set_device(0)
    import gpuipc
    if not legacy:
        atexit.register(exit_compute)  # runs before it
    c = gpuipc.Client(label=f'exit-producer-{mode}')
    sd, source = model_state_dict(torch)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    expect = checksum(torch, sd)
    if fw == 'cupy':
        import cupy
        sd = {k: cupy.from_dlpack(v.view(torch.int16)) for k, v in sd.items()}  # CuPy has no bf16: the same bytes
    c.publish_state_dict(sd, prefix + 'sd', kind='cuda-vmm', device=0)
    del sd
    if not legacy:
        pool = c.pool(device=0)
        pooled = pool.empty(POOLED, 'float32', framework=fw)
        pooled[...] = 2
        c.publish(pooled, prefix + 'pooled')
        if fw == 'cupy':
            import cupy
            cupy.cuda.set_allocator(pool.cupy_malloc)
            KEEP.append(torch.from_dlpack(cupy.ones(1 << 20, dtype=cupy.float32)))
            cupy.cuda.set_allocator(None)
        else:
            with pool:
                KEEP.append(torch.ones(1 << 20, device='cuda:0'))
        ring = c.ring(prefix + 'ring', shape=RING_SHAPE, dtype='float32', kind='cuda-vmm', device=0,
                      max_members=CONSUMERS)
    torch.cuda.synchronize()
    say({'model': source, 'bytes': nbytes})
    if mode == 'legacy-close-atexit':
        atexit.register(c.close)  # runs before gpuipc's handler: a full close while Python exits
    cmd = [sys.executable, os.path.abspath(__file__), '--role', 'consumer', fw, prefix, repr(expect)]
    if legacy:
        cmd[4] = 'sd-only'
    peers = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(CONSUMERS)]
    reports = []
    if not legacy:
        for p in peers:
            line = p.stdout.readline()
            assert line and json.loads(line) == {'joined': True}, f'a consumer did not join: {line!r}'
        c.process()  # seats the members: the next frame is theirs
        with ring.acquire(T) as frame:
            frame.torch().fill_(3)
    for p in peers:
        out = p.stdout.read()
        lines = [json.loads(x) for x in out.splitlines() if x.startswith('{')]
        reports.append({'status': p.wait(300), 'lines': lines})
    say({'consumers': reports})
    if mode == 'legacy-runtime':
        gpuipc.Client.close(c)  # the close the old exit path did, while nothing is torn down yet
    if mode == 'legacy-finalize':
        # The old exit path: no exit handler of gpuipc's, and the garbage collector closes the Client
        # (unmapping and freeing through CUDA) while the interpreter is torn down.
        atexit.unregister(gpuipc.client._abandon_open_clients)
        gpuipc.client._exiting = lambda: False
    if mode == 'sys.exit':
        sys.exit(0)
    if mode == 'exception':
        raise RuntimeError('exit-safe: raised on purpose')


def consumer_sd_only(prefix, expect_sum):
    """The issue's consumers: attach the state dict, check it, exit."""
    import torch
    torch.cuda.set_device(0)
    import gpuipc
    c = gpuipc.Client(label='exit-consumer')
    sd = c.attach_state_dict(prefix + 'sd', framework='torch', timeout_ms=T)
    got = checksum(torch, sd)
    say({'sd': abs(got - float(expect_sum)) <= 1e-6 * max(1.0, abs(got))})


# ---- the test ----

def start(script, fw, mode, broker_sock):
    env = dict(os.environ, PYTHONFAULTHANDLER='1', GPUIPC_SOCKET=broker_sock)
    return subprocess.Popen([sys.executable, script, '--role', 'producer', fw, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def verdict(p, fw, mode):
    """(passed, one line, the output) for a finished producer."""
    try:
        stdout, stderr = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        return False, f'FAIL {fw} {mode}: no exit within 600 s', (stdout or '') + (stderr or '')
    rc = p.returncode
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith('{')]
    consumers = next((x['consumers'] for x in lines if 'consumers' in x), [])
    model = next((x for x in lines if 'model' in x), {})
    how = f'exit {rc}' if rc >= 0 else f'killed by {signal.Signals(-rc).name}'
    want = MODES.get(mode, 0)
    problems = []
    if rc != want:
        problems.append(f'{how}, not exit {want}')
    if not mode.startswith('legacy'):
        if [x['exit_compute'] for x in lines if 'exit_compute' in x] != [True, True]:
            problems.append('the exit handlers could not compute on pool memory (or did not run)')
        if mode == 'exception' and 'RuntimeError: exit-safe' not in stderr:
            problems.append('no traceback of the exception')
    bad = [r for r in consumers if r['status'] != 0 or not r['lines'] or
           not all(v for x in r['lines'] if 'joined' not in x for v in x.values())]
    if len(consumers) != CONSUMERS or bad:
        problems.append(f'consumers: {consumers}')
    detail = f"{how}; {model.get('model', '?')}, {model.get('bytes', 0) / 1e6:.0f} MB"
    line = f"{'FAIL' if problems else 'PASS'} {fw} {mode}: {detail}"
    if problems:
        line += f" ({'; '.join(problems)})"
    return not problems, line, stdout + stderr


def gdb_backtrace(script, fw, mode, broker_sock):
    """The C backtrace of a case that died of a signal, run again under gdb (None without gdb)."""
    if not shutil.which('gdb'):
        return None
    env = dict(os.environ, GPUIPC_SOCKET=broker_sock)
    out = subprocess.run(['gdb', '-batch', '-ex', 'handle SIGPIPE nostop noprint', '-ex', 'run', '-ex', 'bt 40',
                          '-ex', 'info threads', '--args', sys.executable, script, '--role', 'producer', fw, mode],
                         capture_output=True, text=True, env=env, timeout=900)
    keep = [x for x in out.stdout.splitlines() if x.startswith(('#', 'Thread', 'Program received', '*', '  '))]
    return '\n'.join(keep[-80:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'build/broker/gpuipc-broker'))
    ap.add_argument('--diagnose', action='store_true', help='also reproduce the old exit path (see above)')
    ap.add_argument('--large', action='store_true', help="a model of about 2.2 GB (the issue's size) instead of 280 MB")
    ap.add_argument('--role')
    ap.add_argument('args', nargs='*')
    opts = ap.parse_args()
    if opts.large:
        os.environ['GPUIPC_EXIT_MODEL'] = 'large'  # the producers inherit it
    if opts.role == 'producer':
        producer(*opts.args)
        return None  # 'return': the interpreter exits with the Client unreachable and open
    if opts.role == 'consumer':
        if opts.args[0] == 'sd-only':
            consumer_sd_only(*opts.args[1:])
        else:
            consumer(*opts.args)
        return None
    os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')
    try:
        import torch
    except ImportError:
        print('skipped: torch is not installed')
        return SKIP
    if not torch.cuda.is_available():
        print('skipped: no CUDA device')
        return SKIP
    frameworks = ['torch']
    if importlib.util.find_spec('cupy') is not None:
        frameworks.append('cupy')
    else:
        print('note: CuPy is not installed: torch cases only')
    script = os.path.abspath(__file__)
    tmp = tempfile.mkdtemp(prefix='gpuipc-gpu-exit.')
    sock = os.path.join(tmp, 'gpuipc.sock')
    broker = subprocess.Popen([opts.broker, '--socket', sock, '--log-level', 'warn'],
                              stderr=open(os.path.join(tmp, 'broker.log'), 'w'))
    results = []
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.05)
        for fw in frameworks:
            running = {mode: start(script, fw, mode, sock) for mode in MODES}  # at once: names of their own
            for mode, p in running.items():
                ok, line, out = verdict(p, fw, mode)
                results.append(ok)
                print(line, flush=True)
                if not ok:
                    print(out[-6000:])
        if opts.diagnose:
            for mode in ('legacy-runtime', 'legacy-finalize', 'legacy-close-atexit'):
                ok, line, out = verdict(start(script, 'torch', mode, sock), 'torch', mode)
                print(f"DIAG {line[5:]}", flush=True)
                fault = [x for x in out.splitlines() if 'Fatal Python error' in x or x.startswith('  File')]
                for x in fault[:12]:
                    print(f'     {x}')
                if not ok and 'killed by' in line:
                    bt = gdb_backtrace(script, 'torch', mode, sock)
                    print(bt if bt is not None else '     (no gdb for a C backtrace)')
    finally:
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(results)
    print(f'{passed} passed, {len(results) - passed} failed')
    return 0 if results and passed == len(results) else 1


if __name__ == '__main__':
    status = main()
    if status is not None:
        sys.exit(status)
