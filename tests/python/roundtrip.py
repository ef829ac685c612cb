"""Two processes pass a buffer through the gpuipc Python module: the producer fills an array made by
Client.empty() and publishes it, the consumer attaches it by name and checks every element, dtype and
shape. KIND=memfd works anywhere (memoryview); cuda-vmm / cuda-legacy need torch and a GPU.

    python3 roundtrip.py KIND   exit 0 pass, 1 fail, 77 skipped
Producer and consumer are separate processes started with subprocess, never fork: a CUDA context
does not survive fork().
"""
import os
import subprocess
import sys

KIND = sys.argv[1] if len(sys.argv) > 1 else 'memfd'
NAME = os.environ.get('GPUIPC_TEST_NAME') or f'py/roundtrip/{KIND}/{os.getpid()}'
SHAPE = (64, 1024)


def producer_memfd(c):
    mv = c.empty(SHAPE, 'uint32', kind='memfd', framework='memoryview')
    words = mv.cast('I')
    for i in range(len(words)):
        words[i] = (i * 2654435761) & 0xffffffff
    c.publish(mv, NAME, retire_after=1)
    c.wait_drained(mv, 30000)
    c.free(mv)


def consumer_memfd(c):
    with c.attach(NAME, timeout_ms=30000) as a:
        assert a.meta['dtype'] == 'uint32' and tuple(a.meta['shape']) == SHAPE, a.meta
        words = a.memoryview().cast('I')
        bad = sum(1 for i in range(len(words)) if words[i] != (i * 2654435761) & 0xffffffff)
        assert bad == 0, f'{bad} words differ'
        try:
            a.memoryview()[0] = 1
            raise AssertionError('a read-only buffer was writable')
        except TypeError:
            pass


def producer_torch(c):
    import torch
    t = c.empty(SHAPE, 'float32', kind=KIND, device=0) if KIND == 'cuda-vmm' else None
    ref = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32, device='cuda:0').view(SHAPE) * 0.5
    if t is None:
        t = c.share(ref.clone(), NAME, kind=KIND, retire_after=1)
    else:
        t.copy_(ref)
        c.publish(t, NAME, retire_after=1)
    c.wait_drained(t, 60000)
    c.free(t)


def consumer_torch(c):
    import torch
    with c.attach(NAME, timeout_ms=60000) as a:
        t = a.torch()
        ref = torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.float32, device=t.device).view(SHAPE) * 0.5
        assert t.dtype == torch.float32 and tuple(t.shape) == SHAPE, (t.dtype, t.shape)
        assert torch.equal(t, ref), 'tensor contents differ'
        torch.cuda.synchronize()


def run_role(role):
    import gpuipc  # after the skip checks: without torch or a GPU this exits 77 first
    with gpuipc.Client(label=f'py-{role}') as c:
        fn = {('producer', True): producer_memfd, ('consumer', True): consumer_memfd,
              ('producer', False): producer_torch, ('consumer', False): consumer_torch}[(role, KIND == 'memfd')]
        fn(c)


def main():
    if len(sys.argv) > 2:  # a role, started by the parent below
        try:
            run_role(sys.argv[2])
            return 0
        except Exception as e:
            print(f'{sys.argv[2]}: {e!r}', file=sys.stderr)
            return 1
    if KIND != 'memfd':
        # Asking torch through NVML keeps CUDA uninitialized here; the roles are separate
        # processes anyway (a CUDA context does not survive fork).
        os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')
        try:
            import torch
            if not torch.cuda.is_available():
                raise ImportError
        except ImportError:
            print('torch with CUDA is not available: skipped')
            return 77
    env = dict(os.environ, GPUIPC_TEST_NAME=NAME)
    consumer = subprocess.Popen([sys.executable, __file__, KIND, 'consumer'], env=env)
    producer = subprocess.Popen([sys.executable, __file__, KIND, 'producer'], env=env)
    try:
        ok = consumer.wait(timeout=120) == 0
        ok = producer.wait(timeout=60) == 0 and ok
    except subprocess.TimeoutExpired:
        ok = False
    for p in (consumer, producer):
        if p.poll() is None:
            p.kill()
            p.wait()
    print(f'python {KIND} round trip: {"passed" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
