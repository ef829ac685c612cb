"""Frames through a ring, without a broker round trip per frame: one producer, one member in
another process, each frame taken zero-copy as an array of the member's framework.

    GPUIPC_SOCKET=/tmp/gpuipc.sock python3 ring.py [--framework numpy|torch|jax|cupy] [--cuda]

Host memory (memfd slots) by default, read by NumPy, torch (CPU tensors) or JAX; with --cuda the
slots are cuda-vmm on the GPU and the frames are torch CUDA tensors or CuPy arrays (CuPy always
needs --cuda). Frame n holds the value n everywhere; the member checks every frame. Exit 0 when it
saw all of them, in order.
"""
import argparse
import subprocess
import sys

import gpuipc

NAME = 'examples/ring'
SHAPE = (240, 320)
FRAMES = 100


def as_array(frame, framework):
    return {'numpy': frame.numpy, 'torch': frame.torch, 'jax': frame.jax, 'cupy': frame.cupy}[framework]()


def producer(framework, cuda):
    import numpy as np
    kind = 'cuda-vmm' if cuda else 'memfd'
    with gpuipc.Client(probe_gpus=cuda) as c, c.ring(NAME, shape=SHAPE, dtype='float32', kind=kind) as ring:
        member = subprocess.Popen([sys.executable, __file__, 'member', '--framework', framework] +
                                  (['--cuda'] if cuda else []), stdout=subprocess.PIPE, text=True)
        if member.stdout.readline().strip() != 'joined':        # frames from now on are the member's
            return member.wait() or 1
        for n in range(1, FRAMES + 1):
            ring.put(np.full(SHAPE, n, np.float32))             # waits only if the member is a ring behind
        print(f'producer: {FRAMES} frames of {kind}; member: {member.stdout.readline().strip()}')
        return member.wait()


def member(framework, cuda):
    with gpuipc.Client() as c, c.join_ring(NAME, timeout_ms=10000) as ring:
        print('joined', flush=True)
        for n in range(1, FRAMES + 1):
            with ring.take(timeout_ms=30000) as frame:          # released at the end of the block
                x = as_array(frame, framework)
                if frame.number != n or float(x.min()) != n or float(x.max()) != n:
                    print(f'frame {frame.number}: wrong contents', flush=True)
                    return 1
        print(f'{FRAMES} frames in order, read as {framework} ({type(x).__module__}.{type(x).__name__})', flush=True)
    return 0


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('role', nargs='?', default='producer')
    ap.add_argument('--framework', default='numpy', choices=['numpy', 'torch', 'jax', 'cupy'])
    ap.add_argument('--cuda', action='store_true')
    a = ap.parse_args()
    sys.exit(member(a.framework, a.cuda) if a.role == 'member' else producer(a.framework, a.cuda))
