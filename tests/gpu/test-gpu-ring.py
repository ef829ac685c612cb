#!/usr/bin/env python3
"""Rings of GPU frames from Python, end to end; prints every number and one PASS/FAIL line per check.
Exit status: 0 all passed, 1 a check failed, 77 no GPU (or no torch).

    GPUIPC_LIBRARY=build/client/libgpuipc.so PYTHONPATH=python \\
        python3 tests/gpu/test-gpu-ring.py --broker build/broker/gpuipc-broker

(`meson test -C build --suite gpu gpu-python-ring -v` runs the same.) The producer and each member
run in processes of their own, each in a sibling PID namespace where `unshare --pid` is allowed (as
containers without a shared PID namespace). Frames are int32[1024, 1024] (4 MiB); frame n holds
BASE + n, BASE = arange * 7919, so every element depends on the frame number. Checks:

1. Host doorbells, cuda-vmm slots (mode 'backpressure'): two torch members each get every frame in
   order, equal to BASE + n when taken and still equal after the member held it for a while.
2. The stream-ordered ring (mode 'stream', torch streams): the producer writes each frame with a
   kernel in its stream and publishes in that stream (every other frame through put()); a torch
   member and a second member (CuPy when it is installed, else torch) take in their own streams,
   sleep on the GPU before checking (so that a producer that did not wait for their release would
   overwrite the frame under them), and check every frame on the GPU at take time and again after
   the sleep, without one host synchronization per frame. The results are read once at the end:
   every frame 1..N, all equal.

Every wait has a timeout; a role that hangs or dies fails its check and the rest still run.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import gpu_roles

SKIP = 77
SHAPE = (1024, 1024)
FRAMES = 200
SLOTS = 4
STEP_TIMEOUT_S = 120
GPU_SLEEP_CYCLES = 2_000_000  # about a millisecond: a member's stream holds each frame that long


def say(word, data=None):
    print(word + ('' if data is None else ' ' + json.dumps(data)), flush=True)


def hear(word):
    line = sys.stdin.readline().strip()
    if line != word:
        raise RuntimeError(f'expected {word!r} from the orchestrator, got {line!r}')


def torch_base():
    import torch
    torch.cuda.set_device(0)
    return torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.int32, device='cuda:0').view(SHAPE) * 7919


# ---- roles ----

def role_producer(name, mode):
    import torch
    import gpuipc
    base = torch_base()
    c = gpuipc.Client(label=f'ring-producer-{mode}')
    ring = c.ring(name, shape=SHAPE, dtype='int32', slots=SLOTS, mode=mode, kind='cuda-vmm', device=0,
                  max_members=2, lease_ms=30000)
    say('created', {'pidns': os.readlink('/proc/self/ns/pid')})
    hear('go')
    c.process()  # seats the members: every frame is theirs
    stream = torch.cuda.Stream() if mode == 'stream' else None
    t0 = time.monotonic()
    for n in range(1, FRAMES + 1):
        if mode == 'stream' and n % 2:
            frame = ring.acquire(stream=stream)          # the stream waits for the members' release
            with torch.cuda.stream(stream):
                frame.torch().copy_(base + n)            # written in the same stream
            ring.publish(stream=stream)                  # "frame n is ready", after the copy
        elif mode == 'stream':
            with torch.cuda.stream(stream):
                ring.put(base + n, stream=stream)        # the same three steps in one call
        else:
            with ring.acquire(timeout_ms=STEP_TIMEOUT_S * 1000) as frame:
                frame.torch().copy_(base + n)
    host_s = time.monotonic() - t0
    torch.cuda.synchronize()
    say('published', {'host_s': host_s, 'total_s': time.monotonic() - t0})
    hear('close')
    ring.close()
    c.close()
    say('closed')


def role_member(name, mode, framework):
    import gpuipc
    c = gpuipc.Client(label=f'ring-member-{framework}')
    ring = c.join_ring(name, timeout_ms=STEP_TIMEOUT_S * 1000)
    ok = ring.shape == SHAPE and ring.dtype == 'int32' and ring.mode == mode
    say('joined', {'pidns': os.readlink('/proc/self/ns/pid'), 'layout_ok': ok})
    (member_cupy if framework == 'cupy' else member_torch)(ring, mode)
    ring.close()
    c.close()


def member_torch(ring, mode):
    import torch
    base = torch_base()
    stream = torch.cuda.Stream()
    at_take = torch.zeros(FRAMES, dtype=torch.int32, device='cuda:0')
    after_hold = torch.zeros_like(at_take)
    numbers = []
    t0 = time.monotonic()
    with torch.cuda.stream(stream):
        for i in range(FRAMES):
            frame = ring.take(timeout_ms=STEP_TIMEOUT_S * 1000, stream=stream if mode == 'stream' else None)
            numbers.append(frame.number)
            t = frame.torch()                            # ordered after the frame's stream (the same one)
            want = base + frame.number
            at_take[i] = torch.equal(t, want) if mode != 'stream' else (t == want).all()
            torch.cuda._sleep(GPU_SLEEP_CYCLES)          # hold it: the producer must not overwrite it now
            after_hold[i] = (t == want).all()
            del t
            if mode != 'stream':
                stream.synchronize()                     # host doorbells: the checks ran before the release
            frame.release()                              # stream rings: "done" enqueued after the checks
    torch.cuda.synchronize()
    report(numbers, at_take.tolist(), after_hold.tolist(), time.monotonic() - t0)


def member_cupy(ring, mode):
    import cupy
    cupy.cuda.Device(0).use()
    base = cupy.arange(SHAPE[0] * SHAPE[1], dtype=cupy.int32).reshape(SHAPE) * 7919
    stream = cupy.cuda.Stream(non_blocking=True)
    at_take = cupy.zeros(FRAMES, dtype=cupy.int32)
    after_hold = cupy.zeros_like(at_take)
    numbers = []
    t0 = time.monotonic()
    with stream:
        for i in range(FRAMES):
            frame = ring.take(timeout_ms=STEP_TIMEOUT_S * 1000, stream=stream)
            numbers.append(frame.number)
            t = cupy.from_dlpack(frame)                  # passes `stream` to __dlpack__: the same one
            want = base + frame.number
            at_take[i] = (t == want).all()
            _cupy_sleep(cupy)
            after_hold[i] = (t == want).all()
            del t
            frame.release()
    stream.synchronize()
    report(numbers, at_take.tolist(), after_hold.tolist(), time.monotonic() - t0)


_SLEEP_KERNEL = None


def _cupy_sleep(cupy):
    """A kernel that spins about GPU_SLEEP_CYCLES clock cycles in the current stream."""
    global _SLEEP_KERNEL
    if _SLEEP_KERNEL is None:
        _SLEEP_KERNEL = cupy.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}''', 'spin')
    _SLEEP_KERNEL((1,), (1,), (GPU_SLEEP_CYCLES,))


def report(numbers, at_take, after_hold, elapsed):
    say('result', {'numbers_ok': numbers == list(range(1, FRAMES + 1)), 'first': numbers[:3],
                   'bad_at_take': [n for n, ok in zip(numbers, at_take) if not ok][:10],
                   'bad_after_hold': [n for n, ok in zip(numbers, after_hold) if not ok][:10],
                   'frames_per_s': FRAMES / elapsed})


ROLES = {'producer': role_producer, 'member': role_member}


# ---- the orchestrator ----

def Role(name, *args, pidns=False):
    """A role of this script in a child process (gpu_roles.Role), named with its arguments."""
    return gpu_roles.Role(__file__, name, *args, pidns=pidns, label=f'{name} {" ".join(args[1:])}'.strip(),
                          step_timeout_s=STEP_TIMEOUT_S)


Report = gpu_roles.Report


def phase(report, mode, member_frameworks, can_unshare):
    name = f'gtest/ring-{mode}'
    producer = Role('producer', name, mode, pidns=can_unshare)
    members = []
    try:
        made = producer.expect('created')
        members = [Role('member', name, mode, fw, pidns=can_unshare) for fw in member_frameworks]
        joined = [m.expect('joined') for m in members]
        report.check(f'{mode}: members read the dtype and shape', all(j['layout_ok'] for j in joined))
        pidns = {made['pidns'], *(j['pidns'] for j in joined)}
        report.check(f'{mode}: sibling PID namespaces', not can_unshare or len(pidns) == 1 + len(members),
                     ', '.join(sorted(pidns)) if can_unshare else 'unshare --pid is not permitted: one namespace')
        producer.say('go')
        results = [m.expect('result') for m in members]
        pub = producer.expect('published')
        for fw, r in zip(member_frameworks, results):
            report.check(f'{mode}: {fw} member took frames 1..{FRAMES} in order', r['numbers_ok'],
                         f'first {r["first"]}')
            report.check(f'{mode}: {fw} member: every frame equal when taken and after holding it',
                         not r['bad_at_take'] and not r['bad_after_hold'],
                         f'bad at take {r["bad_at_take"]}, after holding {r["bad_after_hold"]}; '
                         f'{r["frames_per_s"]:.0f} frames/s')
        print(f'  {mode}: producer {FRAMES / pub["total_s"]:.0f} frames/s '
              f'({pub["host_s"] * 1e6 / FRAMES:.1f} us of host time per frame)')
        producer.say('close')
        producer.expect('closed')
    finally:
        for role in [producer] + members:
            role.stop()


def gpu_available():
    os.environ.setdefault('PYTORCH_NVML_BASED_CUDA_CHECK', '1')  # ask NVML: no CUDA context here
    try:
        import torch
    except ImportError:
        return 'torch is not installed'
    if not torch.cuda.is_available():
        return 'no CUDA device'
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--broker', default=os.environ.get('GPUIPC_BROKER', 'build/broker/gpuipc-broker'))
    ap.add_argument('--role')
    ap.add_argument('args', nargs='*')
    opts = ap.parse_args()
    if opts.role:
        ROLES[opts.role](*opts.args)
        return 0
    why = gpu_available()
    if why:
        print(f'skipped: {why}')
        return SKIP
    import gpuipc
    tmp = tempfile.mkdtemp(prefix='gpuipc-ring.')
    os.environ['GPUIPC_SOCKET'] = os.path.join(tmp, 'gpuipc.sock')
    broker = subprocess.Popen([opts.broker, '--socket', os.environ['GPUIPC_SOCKET'], '--seccomp', 'enforce',
                               '--log-level', 'warn'], stderr=open(os.path.join(tmp, 'broker.log'), 'w'))
    report = Report()
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(os.environ['GPUIPC_SOCKET']) and time.monotonic() < deadline:
            time.sleep(0.05)
        can_unshare = shutil.which('unshare') is not None and subprocess.run(
            ['unshare', '--pid', '--fork', '--mount-proc', 'true'], capture_output=True).returncode == 0
        try:
            import cupy  # noqa: F401
            second = 'cupy'
        except ImportError:
            second = 'torch'
        phases = [('backpressure', ['torch', 'torch'])]
        if gpuipc._lib.has('gpuipc_ring_stream_acquire'):
            phases.append(('stream', ['torch', second]))
        else:
            report.check('stream: libgpuipc has the stream-ordered ring calls', False,
                         f'libgpuipc {gpuipc.library_version()} lacks gpuipc_ring_stream_*')
        for mode, frameworks in phases:
            try:
                phase(report, mode, frameworks, can_unshare)
            except Exception as e:
                traceback.print_exc()
                report.check(f'{mode}: ran to the end', False, str(e))
    finally:
        broker.terminate()
        try:
            broker.wait(10)
        except subprocess.TimeoutExpired:
            broker.kill()
        with open(os.path.join(tmp, 'broker.log')) as f:
            log = f.read().strip()
        if log and not all(r[1] for r in report.results):
            print('--- broker log\n' + log)
        shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(ok for _, ok in report.results)
    print(f'{passed} passed, {len(report.results) - passed} failed')
    return 0 if report.results and passed == len(report.results) else 1


if __name__ == '__main__':
    sys.exit(main())
