#!/usr/bin/env python3
"""cuda-legacy between containers from Python and gpuipcctl, as measured (docs/legacy-ipc.md): each
process in a PID and mount namespace of its own (`unshare --pid --fork --mount-proc`), the broker
in the parent's. A torch tensor shared with share(t, kind='cuda-legacy') by PID 1 of one namespace:
  - attach() from PID 1 of another is refused with SamePid before CUDA runs;
  - attach().torch() from PID 2 of another is the producer's tensor, zero-copy;
  - a buffer `gpuipcctl publish --kind cuda-legacy` holds is refused to `gpuipcctl attach` as PID 1
    and verifies byte for byte under `gpuipcctl run --`, which starts it at another PID.
Exits 77 without torch, a GPU or the right to make PID namespaces.

    test-gpu-legacy-ns.py  (GPUIPC_SOCKET, GPUIPC_CTL, GPUIPC_LIBRARY and PYTHONPATH set by its .sh)
"""
import os
import subprocess
import sys

AS_PID_1 = ('unshare', '--pid', '--fork', '--mount-proc', '--kill-child')
# "$@" is not the shell's last command, so the shell (PID 1) forks it: it runs as PID 2.
AS_PID_2 = AS_PID_1 + ('sh', '-c', '"$@"; exit $?', 'sh')
NAME = 'legacy-ns/t'
N = 1 << 20


def role_producer():
    import torch
    import gpuipc
    t = torch.arange(N, dtype=torch.float32, device='cuda:0')
    with gpuipc.Client(label='legacy-producer') as c:
        shared = c.share(t, NAME, kind='cuda-legacy')
        print('published', os.getpid(), flush=True)
        sys.stdin.readline()
        c.retire(shared)
        c.wait_drained(shared, 10000)
    return 0


def role_consumer():
    import torch
    import gpuipc
    with gpuipc.Client(label='legacy-consumer') as c:
        try:
            a = c.attach(NAME, 10000)
        except gpuipc.SamePid as e:
            print('SamePid', os.getpid(), e, flush=True)
            return 0
        got = a.torch()
        ok = got.device.type == 'cuda' and torch.equal(got, torch.arange(N, dtype=torch.float32, device='cuda:0'))
        print('attached', os.getpid(), 'equal' if ok else 'DIFFERENT', flush=True)
        del got
        a.release()
    return 0


def run(prefix, *args, **kw):
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120, **kw)


def check(cond, what):
    print(('ok   ' if cond else 'FAIL ') + what, flush=True)
    return cond


def main():
    try:
        import torch
    except ImportError:
        print('no torch: skipped')
        return 77
    if not torch.cuda.is_available():
        print('no usable GPU: skipped')
        return 77
    if run(AS_PID_1, 'true').returncode != 0:
        print('unshare --pid is not permitted here: skipped')
        return 77
    me = os.path.abspath(__file__)
    ok = True
    producer = subprocess.Popen([*AS_PID_1, sys.executable, me, 'producer'], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        line = producer.stdout.readline().split()
        ok &= check(line[:2] == ['published', '1'], f'the producer published as PID 1 of its namespace: {line}')
        same = run(AS_PID_1, sys.executable, me, 'consumer')
        print('#', same.stdout.strip(), same.stderr.strip()[-400:])
        ok &= check(same.returncode == 0 and same.stdout.startswith('SamePid 1 ') and 'both PID 1' in same.stdout,
                    'PID 1 of another namespace: refused with SamePid before CUDA')
        other = run(AS_PID_2, sys.executable, me, 'consumer')
        print('#', other.stdout.strip(), other.stderr.strip()[-400:])
        ok &= check(other.returncode == 0 and other.stdout.strip() == 'attached 2 equal',
                    "PID 2 of another namespace: attach().torch() is the producer's tensor")
    finally:
        producer.stdin.write('exit\n')
        producer.stdin.close()
        rc = producer.wait(timeout=60)
    ok &= check(rc == 0, f'the producer saw its tensor drain and ended well ({rc})')

    ctl = os.environ['GPUIPC_CTL']
    held = subprocess.Popen([*AS_PID_1, ctl, 'publish', 'legacy-ns/ctl', '--size', '16M', '--kind', 'cuda-legacy',
                             '--fill', 'counter'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waited = run((), ctl, 'attach', 'legacy-ns/ctl', '--wait', '10000', '--hold', '0')
        ok &= check(waited.returncode == 0, 'gpuipcctl attach from the parent namespace works (the buffer is up)')
        as_one = run(AS_PID_1, ctl, 'attach', 'legacy-ns/ctl', '--verify', 'counter')
        print('#', as_one.stderr.strip()[-400:])
        ok &= check(as_one.returncode != 0 and 'same-pid' in as_one.stderr + as_one.stdout,
                    'gpuipcctl attach as PID 1 of another namespace: refused with same-pid')
        moved = run(AS_PID_1, ctl, 'run', '--', ctl, 'attach', 'legacy-ns/ctl', '--verify', 'counter')
        print('#', moved.stdout.strip()[-300:], moved.stderr.strip()[-300:])
        ok &= check(moved.returncode == 0, 'gpuipcctl run -- gpuipcctl attach --verify: every byte verified')
        subprocess.run([ctl, 'retire', 'legacy-ns/ctl'], capture_output=True, timeout=30)
    finally:
        try:
            held.wait(timeout=30)
        except subprocess.TimeoutExpired:
            held.kill()
            held.wait()
    ok &= check(held.returncode == 0, f'gpuipcctl publish ended well after the retire ({held.returncode})')
    return 0 if ok else 1


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == 'producer':
        sys.exit(role_producer())
    if len(sys.argv) > 1 and sys.argv[1] == 'consumer':
        sys.exit(role_consumer())
    sys.exit(main())
