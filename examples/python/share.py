"""The two-line share: one process publishes an array, another attaches it zero-copy.

A NumPy array in host memory (memfd) by default; with --cuda, a torch tensor on the GPU, shared as
cuda-vmm (the consumer gets the same GPU memory, no copy through the host).

    gpuipc-broker --socket /tmp/gpuipc.sock &        # unless a broker runs already
    GPUIPC_SOCKET=/tmp/gpuipc.sock python3 share.py [--cuda]

The producer starts the consumer itself (this script, in another process) and waits until it has
let go of the buffer; both exit 0 when the consumer saw every element as published.
"""
import subprocess
import sys

import gpuipc

NAME = 'examples/share'
N = 1 << 16


def producer(cuda):
    if cuda:
        import torch
        x = torch.arange(N, dtype=torch.float32, device='cuda')
    else:
        import numpy as np
        x = np.arange(N, dtype=np.float32)
    with gpuipc.Client(probe_gpus=cuda) as c:
        shared = c.share(x, NAME, retire_after=1)              # line 1: a copy in shared memory, published
        consumer = subprocess.run([sys.executable, __file__, 'consumer'])
        c.wait_drained(shared, 30000)                           # the consumer released it: free to reuse
        c.free(shared)
    return consumer.returncode


def consumer():
    with gpuipc.Client() as c, c.attach(NAME, timeout_ms=10000) as a:  # line 2: attached, zero-copy
        x = a.numpy() if a.kind == 'memfd' else a.torch()
        total = float(x.sum())
        want = float(N * (N - 1) / 2)
        print(f'consumer: {a.kind} {a.dtype}{list(a.shape)} from buffer {a.id}, sum {total:.0f}')
        return 0 if total == want else 1


if __name__ == '__main__':
    if sys.argv[1:] == ['consumer']:
        sys.exit(consumer())
    sys.exit(producer('--cuda' in sys.argv[1:]))
