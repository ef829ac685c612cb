"""Two processes pass a buffer through the gpuipc Python module: the producer fills an array made by
Client.empty() and publishes it, the consumer attaches it by name and checks every element, dtype and
shape. KIND=memfd works anywhere (memoryview); cuda-vmm / cuda-legacy need torch and a GPU.

    python3 roundtrip.py KIND   exit 0 pass, 1 fail, 77 skipped
"""
import os
import sys

import gpuipc

KIND = sys.argv[1] if len(sys.argv) > 1 else 'memfd'
NAME = f'py/roundtrip/{KIND}/{os.getpid()}'
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


def main():
    if KIND != 'memfd':
        try:
            import torch
            if not torch.cuda.is_available():
                raise ImportError
        except ImportError:
            print('torch with CUDA is not available: skipped')
            return 77
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with gpuipc.Client(label='py-consumer') as c:
                (consumer_memfd if KIND == 'memfd' else consumer_torch)(c)
            code = 0
        except Exception as e:  # report and fail: the parent checks our status
            print(f'consumer: {e!r}', file=sys.stderr)
        os._exit(code)
    ok = True
    try:
        with gpuipc.Client(label='py-producer') as c:
            (producer_memfd if KIND == 'memfd' else producer_torch)(c)
    except Exception as e:
        print(f'producer: {e!r}', file=sys.stderr)
        ok = False
    _, status = os.waitpid(pid, 0)
    ok = ok and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    print(f'python {KIND} round trip: {"passed" if ok else "FAILED"}')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
