#!/usr/bin/env python3
"""Processes that share memory and exit without closing their Client: they must exit as they would
without gpuipc (status 0, or 1 after an uncaught exception), with no fault, and nothing may be
unmapped or call CUDA on the way out. Starts its own broker ($GPUIPC_BROKER).

    exit_safe.py memfd       host memory
    exit_safe.py fakecuda    cuda-vmm on the stand-in libcuda ($GPUIPC_TEST_FAKECUDA)
    exit status 0 pass, 1 fail, 77 skipped (no stand-in)

For each way out (returning from the script, sys.exit(0), an uncaught exception), a producer
publishes a snapshot state dict, a pooled array, a buffer of its own and a ring; three consumers
(processes of their own) attach the state dict and the array, join the ring, take a frame, and exit
holding all of it; then the producer exits the same way, its Client unreachable but not closed, and a
second Client of it (a global: reachable until the interpreter is torn down) holding the array
attached. With host memory, NumPy arrays over the attachment, the frame and the pooled array are
freed only after gpuipc's modules are torn down (they call their DLPack deleters then).

Every process records the addresses of its memory as C code or a framework holding a pointer would
(no Python reference to gpuipc), and registers an exit check twice: once before gpuipc is imported
(it runs after gpuipc's own exit handler) and once after (it runs before). The check collects
unreachable objects (the Client among them) and requires every address to still hold its bytes; in
the fakecuda variant it first tears the stand-in driver down, after which any CUDA call raises
SIGBUS, as a call into a driver that is gone at exit can. The test then requires the exit status, two
passed checks per process, and that the broker let go of the producer's publications. And a process
that forks with an open Client (its ring thread running): the child exits through Python's exit
(status 0, at once: it must not wait for the parent's thread), and the parent's Client still works.
"""
import atexit
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

T = 30000
CONSUMERS = 3
MODES = {'return': 0, 'sys.exit': 0, 'exception': 1}
FRAME = bytes(range(64))
_raw = []   # (address, bytes expected there): memory something outside Python still points into
_fake = []  # the stand-in libcuda, in the fakecuda variant


def say(obj):
    print(json.dumps(obj), flush=True)


def exit_check():
    """An exit handler: the stand-in driver torn down, unreachable objects collected, and every
    recorded address still holding its bytes (a fault here fails the process)."""
    for fake in _fake:
        fake.fakecuda_teardown()
    gc.collect()
    say({'views_at_exit': all(ctypes.string_at(a, len(b)) == b for a, b in _raw), 'n': len(_raw)})


def setup(kind):
    """Registers the exit check around gpuipc's own exit handler; returns gpuipc."""
    if kind == 'cuda-vmm':
        _fake.append(ctypes.CDLL(os.environ['GPUIPC_LIBCUDA']))  # the instance libgpuipc loads
    atexit.register(exit_check)  # registered first: runs after gpuipc's
    import gpuipc
    atexit.register(exit_check)  # runs before gpuipc's
    return gpuipc


def state_dict():
    import numpy as np
    return {'w': np.arange(1000, dtype=np.float32), 'b': np.full(10, 7, dtype=np.int64)}


def address(view):
    return view.memory.ptr + view.offset


def fill(view, data):
    """Writes data into view: with gpuipc's copy, or (pool memory on the stand-in, which gpuipc leaves
    to the frameworks) at its address, the stand-in's device memory being host memory."""
    try:
        view.write(data)
    except TypeError:
        ctypes.memmove(address(view), data, len(data))


def record(view, expected):
    """Remembers view's bytes by address (a View of memory gpuipc maps in this process)."""
    assert ctypes.string_at(address(view), len(expected)) == expected, 'the view does not hold what was written'
    _raw.append((address(view), expected))


def keep_past_teardown(kind, view):
    """Holds a NumPy array over view (host memory only) as a framework's array in a reference cycle
    or in another module's global would: referenced from sys, whose globals go last, it is freed
    after gpuipc's modules were torn down, and calls its DLPack deleter then."""
    if kind == 'memfd':
        import numpy as np
        sys.__dict__.setdefault('_exit_safe_arrays', []).append(np.from_dlpack(view))


# ---- the consumer ----

def consumer(kind, prefix):
    gpuipc = setup(kind)
    c = gpuipc.Client(label='exit-consumer', probe_gpus=kind != 'memfd')
    sd = c.attach_state_dict(prefix + 'sd', framework=None, timeout_ms=T)
    for key, value in state_dict().items():
        record(sd[key], value.tobytes())
    a = c.attach(prefix + 'pooled', timeout_ms=T)
    record(a, bytes(range(256)) * 16)
    ring = c.join_ring(prefix + 'ring', timeout_ms=T)
    say({'joined': True})
    frame = ring.take(T)
    say({'frame': frame.read() == FRAME})
    keep_past_teardown(kind, a)
    keep_past_teardown(kind, frame)
    # Returns holding the state dict, the attachment and the frame, its Client open.


# ---- the producer ----

c2 = None  # a second Client, reachable until the interpreter is torn down


def producer(kind, mode):
    prefix = f'exit/{mode}/'
    global c2
    gpuipc = setup(kind)
    c = gpuipc.Client(label='exit-producer', probe_gpus=kind != 'memfd')
    c.publish_state_dict(state_dict(), prefix + 'sd', kind=kind, device=0)
    pool = c.pool(kind=kind, device=0)
    pooled = pool.empty(4096, 'uint8', framework=None)
    fill(pooled, bytes(range(256)) * 16)
    c.publish(pooled, prefix + 'pooled')
    record(pooled, bytes(range(256)) * 16)
    keep_past_teardown(kind, pooled)
    own = c.empty(1024, 'uint8', kind=kind, device=0, framework=None)
    fill(own, b'\x5a' * 1024)
    record(own, b'\x5a' * 1024)
    ring = c.ring(prefix + 'ring', slot_size=len(FRAME), slots=4, max_members=CONSUMERS, kind=kind, device=0)
    c2 = gpuipc.Client(label='exit-producer-2', probe_gpus=kind != 'memfd')
    record(c2.attach(prefix + 'pooled', timeout_ms=T), bytes(range(256)) * 16)

    peers = [subprocess.Popen([sys.executable, __file__, 'consumer', kind, prefix], stdout=subprocess.PIPE, text=True)
             for _ in range(CONSUMERS)]
    for p in peers:
        assert json.loads(p.stdout.readline()) == {'joined': True}, 'a consumer did not join'
    c.process()  # seats the members: the next frame is theirs
    with ring.acquire(T) as frame:
        fill(frame, FRAME)
    reports = []
    for p in peers:
        out = p.stdout.read()
        reports.append({'status': p.wait(60), 'lines': [json.loads(line) for line in out.splitlines()]})
    say({'consumers': reports})
    if mode == 'sys.exit':
        sys.exit(0)
    if mode == 'exception':
        raise RuntimeError('exit-safe: raised on purpose')
    # 'return': the script ends after this returns, the Client c unreachable and not closed


# ---- a forked child ----

def forker(kind):
    """Forks with an open Client (a ring, so its thread runs); the child exits through Python's
    exit, which must neither wait for the parent's thread nor end the parent's connection. Reports
    the child's status and whether the parent's Client still works afterwards."""
    gpuipc = setup(kind)
    c = gpuipc.Client(label='exit-forker', probe_gpus=kind != 'memfd')
    ring = c.ring('exit/fork/ring', slot_size=64, slots=2, kind=kind, device=0)
    buf = c.empty(64, 'uint8', kind=kind, device=0, framework=None)
    fill(buf, FRAME)
    pid = os.fork()
    if pid == 0:
        del c, ring, buf
        sys.exit(0)  # the Client and the ring are garbage in the child now
    deadline, status = time.monotonic() + 30, None
    while status is None and time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        status = os.waitstatus_to_exitcode(st) if done else None
        time.sleep(0.02)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    c.publish(buf, 'exit/fork/buf')
    say({'child': status, 'parent_works': c.stat('exit/fork/buf').state == 'live'})
    ring.close()
    c.close()


# ---- the test ----

def consumer_ok(report):
    lines = report['lines']
    return (report['status'] == 0 and {'frame': True} in lines and
            [x.get('views_at_exit') for x in lines if 'views_at_exit' in x] == [True, True])


def start(kind, mode):
    return subprocess.Popen([sys.executable, __file__, 'producer', kind, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONFAULTHANDLER='1'))


def check(producer, mode):
    """What is wrong with how the producer of mode (and its consumers) ended: a list of problems."""
    stdout, stderr = producer.communicate(timeout=120)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith('{')]
    checks = [x['views_at_exit'] for x in lines if 'views_at_exit' in x]
    consumers = next((x['consumers'] for x in lines if 'consumers' in x), [])
    problems = []
    if producer.returncode != MODES[mode]:
        problems.append(f'exit status {producer.returncode} (a signal if negative), not {MODES[mode]}')
    if checks != [True, True]:
        problems.append(f'exit checks {checks}, not [True, True] (memory gone, or a fault before them)')
    if len(consumers) != CONSUMERS or not all(consumer_ok(r) for r in consumers):
        problems.append(f'consumers: {consumers}')
    if mode == 'exception' and 'RuntimeError: exit-safe' not in stderr:
        problems.append('no traceback of the exception')
    import gpuipc
    with gpuipc.Client(label='exit-check', probe_gpus=False) as c:
        left = [b.name for b in c.buffers(f'exit/{mode}/') if b.state in ('live', 'retired')]
    if left:
        problems.append(f'the broker still has {left} published after the producer exited')
    return problems, stdout + stderr


def main():
    variant = sys.argv[1]
    kind = 'memfd' if variant == 'memfd' else 'cuda-vmm'
    if variant == 'fakecuda':
        fake = os.environ.get('GPUIPC_TEST_FAKECUDA', '')
        if not fake:
            print('no stand-in libcuda ($GPUIPC_TEST_FAKECUDA): skipped')
            return 77
        os.environ.update(GPUIPC_LIBCUDA=fake, FAKECUDA_DEVICES='1')
    tmp = tempfile.mkdtemp(prefix='gpuipc-exit.')
    os.environ['GPUIPC_SOCKET'] = os.path.join(tmp, 's.sock')
    broker = subprocess.Popen([os.environ['GPUIPC_BROKER'], '--socket', os.environ['GPUIPC_SOCKET'],
                               '--log-level', 'warn'], stderr=open(os.path.join(tmp, 'broker.log'), 'w'))
    failed = 0
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(os.environ['GPUIPC_SOCKET']) and time.monotonic() < deadline:
            time.sleep(0.02)
        producers = {mode: start(kind, mode) for mode in MODES}  # at once: each under names of its own
        fork = subprocess.run([sys.executable, __file__, 'forker', kind], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONFAULTHANDLER='1'))
        lines = [json.loads(x) for x in fork.stdout.splitlines() if x.startswith('{')]
        report = next((x for x in lines if 'child' in x), None)
        if fork.returncode != 0 or report != {'child': 0, 'parent_works': True}:
            failed += 1
            print(f'FAIL {variant} fork: status {fork.returncode}, {report}')
            print(fork.stdout + fork.stderr)
        else:
            print(f'ok   {variant} fork')
        for mode, producer in producers.items():
            problems, out = check(producer, mode)
            print(f"{'FAIL' if problems else 'ok  '} {variant} {mode}")
            if problems:
                failed += 1
                for p in problems:
                    print(f'     {p}')
                print(out)
    finally:
        broker.terminate()
        broker.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f'{len(MODES) + 1 - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    if sys.argv[1:2] == ['consumer']:
        consumer(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ['forker']:
        forker(sys.argv[2])
    elif sys.argv[1:2] == ['producer']:
        producer(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
