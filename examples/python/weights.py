"""Weight sync between a trainer and an inference engine in another process (or container),
double buffered: a new version never overwrites weights the engine still uses.

NumPy arrays in host memory (memfd) by default; with --cuda, a torch model's state dict on the GPU
(cuda-vmm: the engine's tensors ARE the shared GPU memory).

    GPUIPC_SOCKET=/tmp/gpuipc.sock python3 weights.py [--cuda] [--versions 5]

The trainer publishes a version, the engine attaches the next one after what it holds and then
releases the old one: with two buffers per name, version 3 reuses version 1's buffer once the
engine let go of it. Exit 0 when the engine saw every version's values.
"""
import argparse
import subprocess
import sys

import gpuipc

NAME = 'examples/policy'


def state_dict(version, cuda):
    if cuda:
        import torch
        model = torch.nn.Linear(256, 256).cuda()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(version)
        return model.state_dict()
    import numpy as np
    return {'weight': np.full((256, 256), version, np.float32), 'bias': np.full(256, version, np.float32)}


def trainer(versions, cuda):
    with gpuipc.Client(probe_gpus=cuda) as c:
        engine = subprocess.Popen([sys.executable, __file__, 'engine', str(versions)] + (['--cuda'] if cuda else []),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for v in range(1, versions + 1):
            c.publish_state_dict(state_dict(v, cuda), NAME)    # kind: memfd for NumPy, cuda-vmm on the GPU
            line = engine.stdout.readline()                    # the engine has version v
            print(f'trainer: published version {v}; engine: {line.strip()}')
        c.unpublish_state_dict(NAME)
        engine.stdin.close()
        return engine.wait()


def engine(versions, cuda):
    framework = 'torch' if cuda else 'numpy'
    with gpuipc.Client() as c:
        held = None
        for v in range(1, versions + 1):
            sd = c.attach_state_dict(NAME, framework=framework, timeout_ms=30000, after=held)
            if held is not None:
                held.release()                                 # the old version's buffer may be reused now
            held = sd
            got = {float(x.min()) for x in sd.values()} | {float(x.max()) for x in sd.values()}
            if got != {float(v)}:
                print(f'version {sd.version}: values {got}, expected {v}', flush=True)
                return 1
            print(f'version {sd.version} ({len(sd)} arrays)', flush=True)
        sys.stdin.read()                                       # hold the last one until the trainer is done
        held.release()
    return 0


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('role', nargs='?', default='trainer')
    ap.add_argument('n', nargs='?', type=int)
    ap.add_argument('--cuda', action='store_true')
    ap.add_argument('--versions', type=int, default=5)
    a = ap.parse_args()
    sys.exit(engine(a.n, a.cuda) if a.role == 'engine' else trainer(a.versions, a.cuda))
