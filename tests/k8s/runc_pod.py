#!/usr/bin/env python3
"""Runs one Pod of a rendered gpuipc overlay as runc containers, the way a kubelet would lay it out:
a pause container holding the pod's network, IPC and UTS namespaces (and its PID namespace when
shareProcessNamespace is set), the broker as a sidecar started first and probed with its own
startupProbe, then the app containers; each with the Pod's mounts (the emptyDir becomes a host
directory bind-mounted into each), user, groups (fsGroup), capabilities, no_new_privs, read-only
root and seccomp profile (Localhost: the file shipped in seccomp/; RuntimeDefault: no filter, as
runc has no default of its own).

GPUs are not available here, so CUDA kinds in the app commands become memfd and --device goes:
everything else about the pod is as declared. With --fakecuda LIB the kinds stay as declared and
the app containers load LIB (the stand-in libcuda, tests/bench/fakecuda.c, mounted with the
binaries) as their CUDA driver through GPUIPC_LIBCUDA: its legacy IPC handles behave as the
driver's between containers (201 between equal PIDs), so a cuda-legacy pod really runs that path. Nothing is done that a kubelet would not do: the app
containers of a restartPolicy Never pod are never stopped, so each must end on its own; once they
all have, the sidecars get SIGTERM, the last started first. Probes run as the kubelet runs them:
exec inside the container, httpGet on the pod's network. The pod passes when every app container
exits 0 by itself, the sidecars' probes pass (the broker's inside its own container, under its
profile) and the broker stops cleanly. A sidecar this build cannot run at all (the exporter, in a
gpuipcctl without `metrics --listen`) is reported as not run.

    runc_pod.py --manifests RENDERED.yaml --pod NAME --bin BUILD_DIR --seccomp-dir DIR [--expect-shared-pid]
                [--fakecuda LIB] [--expect-distinct-pids]
    runc_pod.py ... --pod DAEMONSET --node-broker-policy VOLUME     (run_node_broker_policy)
    runc_pod.py ... --pod DEPLOYMENT --node-weights HOLDER          (run_node_weights)
--expect-distinct-pids: every app container runs under `gpuipcctl run`, whose line in its log says
which PID its command got; those PIDs must all differ and none be 1 (what cuda-legacy needs).
Exit: 0 pass, 1 fail, 77 when runc cannot run here (not root, no runc).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print('python3 has no yaml module (Debian: python3-yaml): skipped')
    sys.exit(77)

STATE_ROOT = '/run/gpuipc-test-runc'
# How long the app containers may take to end on their own (the consumers wait 30 s at most);
# GPUIPC_TEST_APP_DEADLINE_S shortens it when trying out a pod that is expected not to end.
APP_DEADLINE_S = int(os.environ.get("GPUIPC_TEST_APP_DEADLINE_S", "60"))


def log(*a):
    print(*a, flush=True)


def runc(*args, check=True, capture=False, timeout=60):
    cmd = ['runc', '--root', STATE_ROOT, *args]
    r = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f'{" ".join(cmd)} failed ({r.returncode}): {r.stderr if capture else ""}')
    return r


def find_pod(docs, name):
    for d in docs:
        if d and d.get('kind') == 'Pod' and d['metadata']['name'] == name:
            return d
    raise SystemExit(f'no Pod named {name} in the manifests')


def isbroker(c):
    return c['name'] == 'gpuipc-broker'


def memfd_only(args):
    """CUDA kinds become memfd and --device goes: this machine has no GPU."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == '--device':
            skip = True
            continue
        if i > 0 and args[i - 1] == '--kind' and a.startswith('cuda-'):
            a = 'memfd'
        out.append(a)
    return out


def image_entrypoint(dockerfile):
    """The image's ENTRYPOINT (exec form), which a container without `command` runs."""
    entry = None
    with open(dockerfile) as f:
        for line in f:
            if line.startswith('ENTRYPOINT'):
                entry = json.loads(line[len('ENTRYPOINT'):].strip())
    if not entry:
        raise SystemExit(f'{dockerfile} has no ENTRYPOINT in exec form')
    return entry


def make_rootfs(path):
    """An empty root with the host's /usr (read-only) and merged-usr links; binaries are mounted."""
    for d in ('usr', 'proc', 'dev', 'tmp', 'run', 'opt/gpuipc', 'etc'):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    for link, target in (('bin', 'usr/bin'), ('lib', 'usr/lib'), ('lib64', 'usr/lib64'), ('sbin', 'usr/sbin')):
        if not os.path.lexists(os.path.join(path, link)):
            os.symlink(target, os.path.join(path, link))
    with open(os.path.join(path, 'etc/passwd'), 'w') as f:
        f.write('root:x:0:0::/:/bin/sh\nnonroot:x:65532:65532::/:/bin/sh\n')
    with open(os.path.join(path, 'etc/group'), 'w') as f:
        f.write('root:x:0:\nnonroot:x:65532:\n')


def oci_config(rootfs, args, env, user, mounts, namespaces, seccomp, read_only, caps_drop_all, no_new_privs):
    caps = [] if caps_drop_all else ['CAP_CHOWN', 'CAP_SETUID', 'CAP_SETGID']
    return {
        'ociVersion': '1.0.2',
        'process': {
            'terminal': False,
            'user': user,
            'args': args,
            'env': env,
            'cwd': '/',
            'capabilities': {k: caps for k in ('bounding', 'effective', 'permitted', 'inheritable', 'ambient')},
            'noNewPrivileges': no_new_privs,
        },
        'root': {'path': rootfs, 'readonly': read_only},
        'hostname': 'pod',
        'mounts': [
            {'destination': '/proc', 'type': 'proc', 'source': 'proc'},
            {'destination': '/dev', 'type': 'tmpfs', 'source': 'tmpfs', 'options': ['nosuid', 'mode=755', 'size=65536k']},
            {'destination': '/tmp', 'type': 'tmpfs', 'source': 'tmpfs', 'options': ['nosuid', 'nodev', 'mode=1777']},
            {'destination': '/usr', 'type': 'bind', 'source': '/usr', 'options': ['rbind', 'ro', 'nosuid', 'nodev']},
            *mounts,
        ],
        'linux': {
            'namespaces': namespaces,
            **({'seccomp': seccomp} if seccomp else {}),
            'maskedPaths': ['/proc/kcore', '/proc/keys', '/proc/timer_list'],
            'readonlyPaths': ['/proc/sys', '/proc/sysrq-trigger'],
        },
    }


def configmap_write(d, data, generation):
    """Writes a ConfigMap volume the way the kubelet's atomic writer does: the data in a new
    timestamped directory, `..data_tmp` pointed at it and renamed over `..data`, each key a symlink
    `key -> ..data/key` (made once), then the previous directory removed."""
    old = os.readlink(os.path.join(d, '..data')) if os.path.lexists(os.path.join(d, '..data')) else None
    new = f'..2026_01_01_00_00_00.{generation:09d}'
    os.mkdir(os.path.join(d, new), 0o755)
    for key, value in data.items():
        with open(os.path.join(d, new, key), 'w') as f:
            f.write(value)
        os.chmod(os.path.join(d, new, key), 0o644)
    os.symlink(new, os.path.join(d, '..data_tmp'))
    os.rename(os.path.join(d, '..data_tmp'), os.path.join(d, '..data'))
    for key in data:
        if not os.path.lexists(os.path.join(d, key)):
            os.symlink(os.path.join('..data', key), os.path.join(d, key))
    if old:
        shutil.rmtree(os.path.join(d, old))


FAKE_LIBCUDA = 'libcuda-fake.so'


class Pod:
    def __init__(self, pod, build, seccomp_dir, workdir, entrypoint, configmaps=None, fakecuda=None,
                 expect_distinct_pids=False, node_volume=None, prefix=None, python_dir=None):
        self.entrypoint = entrypoint
        self.python_dir = python_dir
        self.fakecuda = fakecuda
        self.expect_distinct_pids = expect_distinct_pids
        self.pod = pod
        self.spec = pod['spec']
        self.build = build
        self.seccomp_dir = seccomp_dir
        self.work = workdir
        self.ids = []
        self.prefix = prefix or 'gpuipc-' + str(os.getpid())
        self.volumes = {}
        self.read_only = set()
        self.configmaps = configmaps or {}
        self.generation = 0
        for v in self.spec.get('volumes', []):
            if v.get('persistentVolumeClaim', {}).get('readOnly'):
                self.read_only.add(v['name'])
            # Volumes of the node (its /run/gpuipc, a claim's storage), shared by the node's pods.
            shared = node_volume(self.pod, v) if node_volume else None
            if shared:
                self.volumes[v['name']] = shared
                continue
            d = os.path.join(workdir, 'volumes', v['name'])
            os.makedirs(d)
            if 'emptyDir' in v:
                os.chmod(d, 0o777)  # as the kubelet creates emptyDirs; fsGroup makes the group the pod's
                if 'fsGroup' in self.spec.get('securityContext', {}):
                    os.chown(d, 0, self.spec['securityContext']['fsGroup'])
                    os.chmod(d, 0o2777)
            elif v.get('hostPath', {}).get('path') == '/run/gpuipc':
                os.chmod(d, 0o750)  # as k8s/node-setup leaves the node's directory
                os.chown(d, 65532, 65532)
            elif 'configMap' in v:
                self.configmap_update(v['name'], self.configmaps[v['configMap']['name']]['data'])
            else:
                raise SystemExit(f'volume {v["name"]}: only emptyDir, configMap and /run/gpuipc are simulated')
            self.volumes[v['name']] = d

    def configmap_update(self, volume, data):
        self.generation += 1
        configmap_write(os.path.join(self.work, 'volumes', volume), data, self.generation)

    def cid(self, name):
        return f'{self.prefix}-{name}'

    def user_of(self, c):
        sc = {**self.spec.get('securityContext', {}), **c.get('securityContext', {})}
        uid, gid = sc.get('runAsUser', 0), sc.get('runAsGroup', 0)
        if sc.get('runAsNonRoot') and uid == 0:
            raise SystemExit(f'{c["name"]}: runAsNonRoot with uid 0 would not start')
        groups = [self.spec['securityContext']['fsGroup']] if 'fsGroup' in self.spec.get('securityContext', {}) else []
        groups += self.spec.get('securityContext', {}).get('supplementalGroups', [])
        return {'uid': uid, 'gid': gid, 'additionalGids': groups}, sc

    def seccomp_of(self, sc):
        prof = sc.get('seccompProfile') or self.spec.get('securityContext', {}).get('seccompProfile') or {}
        if prof.get('type') == 'Localhost':
            path = os.path.join(self.seccomp_dir, os.path.basename(prof['localhostProfile']))
            with open(path) as f:
                return json.load(f), f'Localhost {os.path.basename(path)}'
        return None, prof.get('type', 'Unconfined') + ' (no filter under plain runc)'

    def namespaces(self, pause_pid, share_pid):
        ns = [{'type': 'mount'}]
        for t in ('network', 'ipc', 'uts'):
            ns.append({'type': t, 'path': f'/proc/{pause_pid}/ns/{"net" if t == "network" else t}'})
        ns.append({'type': 'pid', 'path': f'/proc/{pause_pid}/ns/pid'} if share_pid else {'type': 'pid'})
        return ns

    def bundle(self, name, args, env, user, sc, mounts, namespaces, seccomp):
        b = os.path.join(self.work, 'bundles', name)
        make_rootfs(os.path.join(b, 'rootfs'))
        bins = [{'destination': '/opt/gpuipc/bin', 'type': 'bind', 'source': self.bindir, 'options': ['rbind', 'ro']}]
        cfg = oci_config(os.path.join(b, 'rootfs'), args, env, user, bins + mounts, namespaces, seccomp,
                         read_only=sc.get('readOnlyRootFilesystem', False),
                         caps_drop_all='ALL' in sc.get('capabilities', {}).get('drop', []),
                         no_new_privs=sc.get('allowPrivilegeEscalation') is False)
        with open(os.path.join(b, 'config.json'), 'w') as f:
            json.dump(cfg, f, indent=1)
        return b

    def start(self, name, bundle, detach=True):
        out = open(os.path.join(self.work, f'{name}.log'), 'w')
        cid = self.cid(name)
        self.ids.append(cid)
        if detach:
            subprocess.run(['runc', '--root', STATE_ROOT, 'run', '-d', '--bundle', bundle, cid],
                           stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=True, timeout=60)
            return json.loads(runc('state', cid, capture=True).stdout)['pid']
        return subprocess.Popen(['runc', '--root', STATE_ROOT, 'run', '--bundle', bundle, cid],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    def probe(self, c, probe):
        """One probe, as the kubelet runs it: exec inside the container, or an HTTP GET on the pod's
        network (here: from inside the pod's network namespace, on loopback)."""
        if 'exec' in probe:
            r = runc('exec', self.cid(c['name']), *probe['exec']['command'], check=False, capture=True, timeout=30)
            return r.returncode == 0, (r.stdout + r.stderr).strip()
        if 'httpGet' in probe:
            get = probe['httpGet']
            port = get['port']
            if isinstance(port, str):
                port = next(p['containerPort'] for p in c.get('ports', []) if p.get('name') == port)
            url = f'http://127.0.0.1:{port}{get.get("path", "/")}'
            code = ('import sys, urllib.request\n'
                    f'r = urllib.request.urlopen({url!r}, timeout=2)\n'
                    'sys.exit(0 if 200 <= r.status < 400 else 1)\n')
            r = subprocess.run(['nsenter', f'--net=/proc/{self.pause_pid}/ns/net', sys.executable, '-c', code],
                               capture_output=True, text=True, timeout=30)
            return r.returncode == 0, f'GET {url}: ' + ((r.stdout + r.stderr).strip().splitlines() or ['ok'])[-1]
        raise SystemExit(f'{c["name"]}: only exec and httpGet probes are simulated')

    def probe_until(self, c, probe):
        """Probes until success, for as long as the kubelet would (failureThreshold periods, at a
        faster pace); gives up early when the container is gone."""
        ok, out = False, ''
        for _ in range(int(probe.get('failureThreshold', 3)) * 5):
            ok, out = self.probe(c, probe)
            if ok or not self.running(c['name']):
                break
            time.sleep(0.2)
        return ok, out

    def running(self, name):
        st = runc('state', self.cid(name), check=False, capture=True)
        return st.returncode == 0 and json.loads(st.stdout)['status'] == 'running'

    def output(self, name):
        with open(os.path.join(self.work, name + '.log')) as f:
            return f.read().strip()

    def missing_feature(self, c):
        """Why this build cannot run the container at all, or None. The exporter sidecar needs
        `gpuipcctl metrics --listen`, which not every gpuipcctl has."""
        args = c.get('args', [])
        if args[:2] == ['metrics', '--listen']:
            r = subprocess.run([os.path.join(self.bindir, 'gpuipcctl'), 'metrics', '--help'],
                               capture_output=True, text=True, timeout=10)
            if '--listen' not in r.stdout + r.stderr:
                return 'this build\'s gpuipcctl has no `metrics --listen` (the exporter)'
        return None

    def start_pause(self):
        """The pod's binaries and its pause container (holding its namespaces)."""
        self.bindir = os.path.join(self.work, 'bin')
        os.makedirs(self.bindir)
        # gpuipcctl links libgpuipc.so.0 and finds it next to itself (its build RUNPATH has $ORIGIN).
        for b in ('broker/gpuipc-broker', 'cli/gpuipcctl', 'client/libgpuipc.so.0'):
            shutil.copy(os.path.join(self.build, b), self.bindir)
        if self.fakecuda:
            shutil.copy(self.fakecuda, os.path.join(self.bindir, FAKE_LIBCUDA))
        self.share_pid = bool(self.spec.get('shareProcessNamespace'))
        log(f'pod {self.pod["metadata"]["name"]}: shareProcessNamespace={self.share_pid}')
        pause = self.bundle('pause', ['/usr/bin/sleep', 'infinity'], ['PATH=/usr/bin'],
                            {'uid': 65535, 'gid': 65535}, {'readOnlyRootFilesystem': True,
                                                           'capabilities': {'drop': ['ALL']},
                                                           'allowPrivilegeEscalation': False},
                            [], [{'type': t} for t in ('pid', 'mount', 'network', 'ipc', 'uts')], None)
        self.pause_pid = self.start('pause', pause)

    def container_bundle(self, c):
        user, sc = self.user_of(c)
        seccomp, how = self.seccomp_of(sc)
        env = ['PATH=/opt/gpuipc/bin:/usr/bin:/bin'] + [f'{e["name"]}={e["value"]}' for e in c.get('env', [])]
        args = (c.get('command') or self.entrypoint) + c.get('args', [])
        if os.path.basename(args[0]) in ('gpuipc-broker', 'gpuipcctl'):
            args[0] = '/opt/gpuipc/bin/' + os.path.basename(args[0])
        if args[0] == 'python3' and self.python_dir:
            # What the engine's image brings (examples/app-image/Dockerfile): the gpuipc module and
            # libgpuipc; here the source tree's module and the build's library.
            env += ['PYTHONPATH=/opt/gpuipc/python', 'PYTHONDONTWRITEBYTECODE=1',
                    'GPUIPC_LIBRARY=/opt/gpuipc/bin/libgpuipc.so.0']
        env += getattr(self, 'extra_env', {}).get(c['name'], [])
        if not self.fakecuda:
            args = memfd_only(args)
        elif c in self.spec['containers']:
            # What the DRA driver's CDI spec would mount: a libcuda, here the stand-in.
            env.append(f'GPUIPC_LIBCUDA=/opt/gpuipc/bin/{FAKE_LIBCUDA}')
        mounts = [{'destination': m['mountPath'], 'type': 'bind', 'source': self.volumes[m['name']],
                   'options': ['rbind', 'ro' if m.get('readOnly') or m['name'] in self.read_only else 'rw']}
                  for m in c.get('volumeMounts', [])]
        if args[0] == 'python3' and self.python_dir:
            mounts.append({'destination': '/opt/gpuipc/python', 'type': 'bind', 'source': self.python_dir,
                           'options': ['rbind', 'ro']})
            # The host's Python and NumPy stand in for the image's: their libraries (BLAS) are found
            # through the host's alternatives links and loader cache.
            for f in ('/etc/alternatives', '/etc/ld.so.cache'):
                if os.path.exists(f):
                    mounts.append({'destination': f, 'type': 'bind', 'source': f, 'options': ['rbind', 'ro']})
        log(f'  {c["name"]}: uid={user["uid"]} gid={user["gid"]} groups={user["additionalGids"]} '
            f'seccomp={how} args={" ".join(args)}')
        return self.bundle(c['name'], args, env, user, sc, mounts, self.namespaces(self.pause_pid, self.share_pid),
                           seccomp)

    def run(self):
        self.start_pause()
        container_bundle = self.container_bundle
        ok = True

        # Init containers in order: a sidecar (restartPolicy Always) counts as started once its
        # startupProbe succeeds, or once it runs when it has none; then the app containers start.
        sidecars = []
        for c in self.spec.get('initContainers', []):
            if c.get('restartPolicy') != 'Always':
                raise SystemExit(f'{c["name"]}: only sidecar init containers are simulated')
            missing = self.missing_feature(c)
            if missing:
                log(f'  {c["name"]}: NOT RUN: {missing}')
                continue
            self.start(c['name'], container_bundle(c))
            probe = c.get('startupProbe')
            if probe:
                started, out = self.probe_until(c, probe)
                log(f'  {c["name"]}: startupProbe {"passed" if started else "FAILED: " + out}')
            else:
                time.sleep(0.2)
                started, out = self.running(c['name']), self.output(c['name'])
                log(f'  {c["name"]}: {"running" if started else "EXITED: " + out}')
            ok &= started
            sidecars.append(c)
        apps = [(c, self.start(c['name'], container_bundle(c), detach=False)) for c in self.spec['containers']]

        # The sidecars' readiness, while the apps run (the kubelet probes periodically).
        for c in sidecars:
            if c.get('readinessProbe'):
                ready, out = self.probe_until(c, c['readinessProbe'])
                log(f'  {c["name"]}: readinessProbe {"passed" if ready else "FAILED: " + out}')
                ok &= ready

        # Nobody stops an app container of a restartPolicy Never pod: each must end on its own,
        # or the pod (and its GPU claim) would stay forever.
        deadline = time.monotonic() + APP_DEADLINE_S
        for c, p in apps:
            try:
                rc = p.wait(timeout=max(0.0, deadline - time.monotonic()))
                log(f'  {c["name"]}: exited {rc}: {self.output(c["name"])}')
                ok &= rc == 0
            except subprocess.TimeoutExpired:
                log(f'  {c["name"]}: STILL RUNNING after {APP_DEADLINE_S} s: a kubelet never stops it, '
                    'so the pod would never complete')
                ok = False
        if self.expect_distinct_pids:
            ok &= self.distinct_pids()
        phase = 'Succeeded' if ok else 'Failed or stuck'
        log(f'  pod phase (restartPolicy {self.spec.get("restartPolicy", "Always")}): {phase}')
        for c in sidecars:
            if isbroker(c):
                r = runc('exec', self.cid(c['name']), '/opt/gpuipc/bin/gpuipcctl', 'ls', check=False, capture=True)
                log(f'  {c["name"]}: gpuipcctl ls inside the broker container after the apps ended:\n' +
                    '\n'.join('      ' + line for line in r.stdout.splitlines()))
        # Then the kubelet stops the sidecars, the last started first, with SIGTERM.
        for c in reversed(sidecars):
            runc('kill', self.cid(c['name']), 'TERM', check=False)
            for _ in range(100):
                st = runc('state', self.cid(c['name']), check=False, capture=True)
                if st.returncode != 0 or json.loads(st.stdout)['status'] == 'stopped':
                    break
                time.sleep(0.05)
            if not isbroker(c):
                continue
            blog = open(os.path.join(self.work, c['name'] + '.log')).read()
            if 'seccomp:' in blog:
                log(f'  {c["name"]}: the seccomp filter killed the broker:\n{blog}')
                ok = False
            stopped = '"msg":"stopped"' in blog or ' info stopped' in blog
            log(f'  {c["name"]}: {"stopped cleanly on SIGTERM" if stopped else "did NOT log a clean stop"}')
            ok &= stopped
        return ok

    def distinct_pids(self):
        """Each app's command ran at the PID its `gpuipcctl run` line names: all differ, none is 1."""
        pids = {}
        for c in self.spec['containers']:
            m = re.search(r'^gpuipcctl run: \S+ runs as PID (\d+) ', self.output(c['name']), re.M)
            pids[c['name']] = int(m.group(1)) if m else None
        ok = None not in pids.values() and 1 not in pids.values() and len(set(pids.values())) == len(pids)
        log(f'  {"ok  " if ok else "FAIL"} the apps\' commands ran at distinct PIDs, none 1: {pids}')
        return ok

    def verdict(self, uid, sock):
        """What a client of this uid (group 65532, like the node-broker's client pods) gets for
        attaching frames/x: "denied", or "timeout" when the policy lets it wait for the name."""
        r = subprocess.run(['setpriv', '--reuid', str(uid), '--regid', str(uid), '--groups', '65532',
                            os.path.join(self.bindir, 'gpuipcctl'), '--socket', sock, 'attach',
                            'frames/x', '--wait', '50'], capture_output=True, text=True, timeout=30)
        out = r.stdout + r.stderr
        return 'denied' if '[denied]' in out else 'timeout' if 'timeout' in out else f'other: {out.strip()}'

    def wait_log(self, name, needle, count, timeout_s=15):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.output(name).count(needle) >= count:
                return True
            time.sleep(0.1)
        return False

    def run_node_broker_policy(self, policy_volume):
        """The node broker's DaemonSet pod (its containers are services: they run until the pod is
        deleted) with its policy ConfigMap, updated as the kubelet updates it, twice: a new policy
        must apply without a restart or SIGHUP, an invalid one must leave the old one in force."""
        self.start_pause()
        ok = True
        broker = next(c for c in self.spec['containers'] if isbroker(c))
        for c in self.spec['containers']:
            missing = self.missing_feature(c)
            if missing:
                log(f'  {c["name"]}: NOT RUN: {missing}')
                continue
            self.start(c['name'], self.container_bundle(c))
            if c.get('startupProbe'):
                started, out = self.probe_until(c, c['startupProbe'])
                log(f'  {c["name"]}: startupProbe {"passed" if started else "FAILED: " + out}')
                ok &= started
        sock = os.path.join(self.volumes['gpuipc-socket'], 'gpuipc.sock')
        cm = self.configmaps[next(v['configMap']['name'] for v in self.spec['volumes'] if v['name'] == policy_volume)]
        policy = cm['data']['policy.conf']

        def check(what, cond):
            nonlocal ok
            log(f'  {"ok  " if cond else "FAIL"} {what}')
            ok &= bool(cond)

        check('the shipped policy: the consumer uid 10002 may attach frames/', self.verdict(10002, sock) == 'timeout')
        check('the shipped policy: the producer uid 10001 may not', self.verdict(10001, sock) == 'denied')
        wider = policy.replace('deny all any', 'allow attach uid=10001 prefix=frames/\ndeny all any')
        self.configmap_update(policy_volume, {**cm['data'], 'policy.conf': wider})
        check('the ConfigMap updated (..data swapped): the broker reloads it by itself',
              self.wait_log(broker['name'], 'policy reloaded', 1))
        check('the new policy applies: uid 10001 may attach frames/ now', self.verdict(10001, sock) == 'timeout')
        self.configmap_update(policy_volume, {**cm['data'], 'policy.conf': 'allow attach uid=10001 frames/\n'})
        check('an update that does not parse is refused',
              self.wait_log(broker['name'], 'keeping the old policy', 1))
        check('... and the policy in force stays', self.verdict(10001, sock) == 'timeout')
        check('the broker is still running (its filter and the profile never fired)',
              self.running(broker['name']) and 'seccomp:' not in self.output(broker['name']))
        for c in reversed(self.spec['containers']):
            if self.cid(c['name']) in self.ids:
                runc('kill', self.cid(c['name']), 'TERM', check=False)
        check('the broker stops cleanly on SIGTERM', self.wait_log(broker['name'], '"msg":"stopped"', 1, 5))
        return ok

    def cleanup(self):
        for cid in reversed(self.ids):
            runc('kill', cid, 'KILL', check=False, capture=True)
        time.sleep(0.2)
        for cid in reversed(self.ids):
            runc('delete', '--force', cid, check=False, capture=True)


# ---- node-weights: a node's broker, its weights holder and an engine that restarts -------------

# The checkpoint the test writes where the holder's claim is (every dtype NumPy reads, so that the
# NumPy engine sees them all); an index.json names two shards, as a sharded checkpoint does.
CHECKPOINT = [
    ('embed.weight', 'F32', (64, 32)),
    ('layers.0.attn.weight', 'F16', (32, 32)),
    ('layers.0.attn.bias', 'F64', (32,)),
    ('layers.1.mlp.weight', 'F32', (48, 32)),
    ('positions', 'I64', (17,)),
    ('mask', 'BOOL', (9,)),
    ('vocab.bytes', 'U8', (255,)),
    ('norm.scale', 'I32', (3, 5)),
]
# safetensors dtype -> struct format (little-endian); values made by the test's own random numbers
# (this script's python needs no NumPy; the engine's does).
ST_FORMAT = {'F64': 'd', 'F32': 'f', 'F16': 'e', 'I64': 'q', 'I32': 'i', 'U8': 'B', 'BOOL': '?'}


def safetensors_bytes(tensors):
    """One safetensors file of [(key, st_dtype, shape, raw bytes)]."""
    header, data = {}, b''
    for key, st, shape, raw in tensors:
        header[key] = {'dtype': st, 'shape': list(shape), 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b' ' * (-len(h) % 8)
    return len(h).to_bytes(8, 'little') + h + data


def write_checkpoint(path):
    """Writes the checkpoint at path (an index.json and its shards, or one file); returns the digest
    the example engine prints with WEIGHTS_DIGEST=1 for exactly these bytes."""
    import hashlib
    import random
    import struct
    rng = random.Random(31)
    tensors = []
    for key, st, shape in CHECKPOINT:
        n = 1
        for d in shape:
            n *= d
        f = ST_FORMAT[st]
        values = ([rng.random() < 0.5 for _ in range(n)] if f == '?' else
                  [rng.randrange(200) for _ in range(n)] if f in 'qiB' else [rng.gauss(0, 1) for _ in range(n)])
        tensors.append((key, st, shape, struct.pack(f'<{n}{f}', *values)))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if path.endswith('.index.json'):
        half = len(tensors) // 2
        shards = {'model-00001-of-00002.safetensors': tensors[:half],
                  'model-00002-of-00002.safetensors': tensors[half:]}
        for name, part in shards.items():
            with open(os.path.join(os.path.dirname(path), name), 'wb') as f:
                f.write(safetensors_bytes(part))
        with open(path, 'w') as f:
            json.dump({'metadata': {}, 'weight_map': {t[0]: n for n, part in shards.items() for t in part}}, f)
    else:
        with open(path, 'wb') as f:
            f.write(safetensors_bytes(tensors))
    for root, dirs, files in os.walk(os.path.dirname(path)):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    h = hashlib.sha256()
    for key, _, shape, raw in sorted(tensors, key=lambda t: t[0]):
        h.update(key.encode() + b'\0' + repr(tuple(shape)).encode() + b'\0' + raw)
    return h.hexdigest()


def template_pod(obj):
    return {'metadata': {'name': obj['metadata']['name'], **obj['spec']['template'].get('metadata', {})},
            'spec': obj['spec']['template']['spec']}


def run_node_weights(docs, engine_name, holder_name, build, seccomp_dir, work, entrypoint, configmaps, python_dir):
    """node-weights on one simulated node: the broker's DaemonSet pod, the holder's DaemonSet pod and
    a pod of the engine Deployment, each its own sandbox, sharing the node's /run/gpuipc (the
    broker's and the holder's hostPath, the engines' claim of the PersistentVolume of it) and the
    model store (the holder's claim: a checkpoint the test writes). The engine container is started,
    SIGKILLed and started again (a crash, restarted as the kubelet restarts it: a new container in
    the same pod), twice, then stopped with SIGTERM; after its first run the broker crashes and is
    restarted the same way. Every start must read back exactly the checkpoint's bytes, from the same
    buffer and generation, and the holder must have loaded once."""
    find = lambda kind, name: next((d for d in docs if d['kind'] == kind and d['metadata']['name'] == name), None)
    broker_ds = next(d for d in docs if d['kind'] == 'DaemonSet' and
                     any(isbroker(c) for c in d['spec']['template']['spec']['containers']))
    holder_ds, engine_dep = find('DaemonSet', holder_name), find('Deployment', engine_name)
    if not holder_ds or not engine_dep:
        raise SystemExit(f'no DaemonSet {holder_name} or Deployment {engine_name} in the manifests')
    node = os.path.join(work, 'node')
    run_dir, models = os.path.join(node, 'run-gpuipc'), os.path.join(node, 'models')
    os.makedirs(run_dir)
    os.makedirs(models)
    os.chmod(node, 0o755)
    os.chmod(run_dir, 0o750)  # as k8s/node-setup leaves the node's directory
    os.chown(run_dir, 65532, 65532)

    def node_volume(pod, v):
        if v.get('hostPath'):
            if v['hostPath']['path'] != '/run/gpuipc':
                raise SystemExit(f'hostPath {v["hostPath"]["path"]}: only /run/gpuipc is simulated')
            return run_dir
        if 'persistentVolumeClaim' in v:
            ns, claim = pod['metadata'].get('namespace'), v['persistentVolumeClaim']['claimName']
            pvc = next(d for d in docs if d['kind'] == 'PersistentVolumeClaim' and d['metadata']['name'] == claim
                       and d['metadata']['namespace'] == ns)
            pv = find('PersistentVolume', pvc['spec'].get('volumeName'))
            if pv and pv['spec'].get('hostPath', {}).get('path') == '/run/gpuipc':
                return run_dir
            return models  # the model store
        return None

    for obj in (holder_ds, engine_dep):
        obj['spec']['template'].setdefault('metadata', {})['namespace'] = obj['metadata']['namespace']
    pods = {}
    for key, obj in (('broker', broker_ds), ('holder', holder_ds), ('engine', engine_dep)):
        pod = template_pod(obj)
        pod['metadata']['namespace'] = obj['metadata']['namespace']
        d = os.path.join(work, key)
        os.makedirs(d)
        os.chmod(d, 0o755)
        pods[key] = Pod(pod, build, seccomp_dir, d, entrypoint, configmaps, node_volume=node_volume,
                        prefix=f'gpuipc-{os.getpid()}-{key}', python_dir=python_dir)
    broker, holder, engine = pods['broker'], pods['holder'], pods['engine']
    ok = True

    def check(what, cond, detail=''):
        nonlocal ok
        log(f'  {"ok  " if cond else "FAIL"} {what}{"" if cond or not detail else ": " + detail}')
        ok &= bool(cond)
        return cond

    hc = next(c for c in holder.spec['containers'] if c.get('args', [])[:2] == ['weights', 'serve'])
    name, path = hc['args'][2], hc['args'][3]
    mount = next(m for m in hc['volumeMounts'] if path.startswith(m['mountPath'] + '/'))
    digest = write_checkpoint(os.path.join(models, os.path.relpath(path, mount['mountPath'])))
    log(f'  the model store: {path} written ({len(CHECKPOINT)} tensors), digest {digest[:16]}...')

    def weights_ls():
        """`gpuipcctl --json weights ls` in the holder's container (the policy lists the weights to
        their producer's uid): the entries under name."""
        r = runc('exec', holder.cid(hc['name']), '/opt/gpuipc/bin/gpuipcctl', '--json', 'weights', 'ls',
                 check=False, capture=True, timeout=30)
        if r.returncode != 0:
            return None
        text = r.stdout.strip()
        docs_ = json.loads(text) if text.startswith('[') else [json.loads(x) for x in text.splitlines() if x]
        return [e for e in docs_ if e.get('name') == name]

    def wait_for(fn, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while True:
            v = fn()
            if v or time.monotonic() > deadline:
                return v
            time.sleep(0.2)

    broker_name = 'gpuipc-broker'

    def restart_broker():
        """The broker crashes (SIGKILL) and the kubelet restarts its container: serve registers the
        weights with the new broker, the same buffer and generation, and reloads nothing."""
        bc = next(c for c in broker.spec['containers'] if isbroker(c))
        runc('kill', broker.cid(bc['name']), 'KILL', check=False)
        wait_for(lambda: not broker.running(bc['name']), 15)
        runc('delete', '--force', broker.cid(bc['name']), check=False, capture=True)
        again = dict(bc, name=bc['name'] + '-2')
        broker.start(again['name'], broker.container_bundle(again))
        started, out = broker.probe_until(again, again['startupProbe'])
        check('the broker, SIGKILLed and restarted: startupProbe passed', started, out)
        back = wait_for(lambda: [e for e in (weights_ls() or []) if e['state'] == 'live' and
                                 (e['buffer'], e['generation']) == (first['buffer'], first['generation'])], 30)
        check('the holder registered the weights with the new broker: the same buffer and generation', back,
              holder.output(hc['name']))
        return again['name']

    try:
        broker.start_pause()
        for c in broker.spec['containers']:
            if broker.missing_feature(c):
                log(f'  {c["name"]}: NOT RUN: {broker.missing_feature(c)}')
                continue
            broker.start(c['name'], broker.container_bundle(c))
            if c.get('startupProbe'):
                started, out = broker.probe_until(c, c['startupProbe'])
                check(f'{c["name"]}: startupProbe passed', started, out)
        holder.start_pause()
        holder.start(hc['name'], holder.container_bundle(hc))
        live = wait_for(lambda: [e for e in (weights_ls() or []) if e.get('state') == 'live'])
        if not check(f'the holder loaded and published {name}', live, holder.output(hc['name'])):
            return False
        first = live[0]
        log(f'  {name}: buffer {first["buffer"]} generation {first["generation"]} {first["size"]} bytes, '
            f'uid {first["uid"]}')

        ec = engine.spec['containers'][0]
        engine.start_pause()
        for i in (1, 2, 3):
            c = dict(ec, name=f'{ec["name"]}-{i}')
            engine.extra_env = {c['name']: ['WEIGHTS_DIGEST=1']}
            p = engine.start(c['name'], engine.container_bundle(c), detach=False)
            deadline = time.monotonic() + 120
            while not (ready := 'engine ready:' in engine.output(c['name'])) and p.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            line = next((x for x in engine.output(c['name']).splitlines() if x.startswith('engine ready:')), '')
            if not check(f'engine start {i}: attached {name}', ready, engine.output(c['name'])):
                runc('kill', engine.cid(c['name']), 'KILL', check=False)
                break
            log(f'  engine start {i}: {line.split(" digest=")[0]}')
            got = dict(kv.split('=', 1) for kv in line.split() if '=' in kv)
            check(f'engine start {i}: read back exactly the checkpoint\'s bytes (digest)', got.get('digest') == digest,
                  f'{got.get("digest")} != {digest}')
            check(f'engine start {i}: the same buffer and generation, nothing reloaded',
                  (got.get('buffer'), got.get('generation')) == (str(first['buffer']), str(first['generation'])),
                  line)
            if ec.get('readinessProbe'):
                r, out = engine.probe_until(c, ec['readinessProbe'])
                check(f'engine start {i}: readinessProbe passed', r, out)
            held = wait_for(lambda: [e for e in (weights_ls() or []) if e['holders'] >= 1], 15)
            check(f'engine start {i}: the broker counts it as a holder', held)
            sig = 'KILL' if i < 3 else 'TERM'
            runc('kill', engine.cid(c['name']), sig, check=False)
            try:
                rc = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            check(f'engine start {i}: {"killed (SIGKILL)" if sig == "KILL" else "stopped by SIGTERM, exit 0"}',
                  rc is not None and (sig == 'KILL' or rc == 0), f'exit {rc}')
            runc('delete', '--force', engine.cid(c['name']), check=False, capture=True)
            gone = wait_for(lambda: [e for e in (weights_ls() or []) if e['holders'] == 0], 30)
            check(f'engine start {i}: after it ended the weights stay, with no holder', gone)
            if i == 1:
                broker_name = restart_broker()
        after = weights_ls() or []
        check(f'one version of {name}, the first: same buffer and generation, live',
              len(after) == 1 and after[0]['buffer'] == first['buffer'] and
              after[0]['generation'] == first['generation'] and after[0]['state'] == 'live', json.dumps(after))
        hlog = holder.output(hc['name'])
        check('the holder loaded the checkpoint once, reconnected once and still runs',
              hlog.count(f'loaded {name}:') == 1 and hlog.count('reconnected:') == 1 and holder.running(hc['name']),
              hlog)
        # Stopped, the holder leaves the weights broker-held (the DaemonSet's rollout or an eviction).
        runc('kill', holder.cid(hc['name']), 'TERM', check=False)
        stopped = wait_for(lambda: not holder.running(hc['name']), 15)
        check('the holder stops on SIGTERM', stopped)
        for cid in reversed(broker.ids):
            runc('kill', cid, 'TERM', check=False, capture=True)
        check('the broker stops cleanly on SIGTERM', broker.wait_log(broker_name, '"msg":"stopped"', 1, 10),
              broker.output(broker_name)[-2000:])
        check('the broker\'s filter and profile never fired',
              not any('seccomp:' in broker.output(n) for n in ('gpuipc-broker', broker_name)))
    finally:
        if not ok:
            for p in (broker, holder, engine):
                for f in sorted(os.listdir(p.work)):
                    if f.endswith('.log'):
                        log(f'--- {p.pod["metadata"]["name"]}: {f}\n{open(os.path.join(p.work, f)).read()[-3000:]}')
        for p in (engine, holder, broker):
            p.cleanup()
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--manifests', required=True)
    ap.add_argument('--pod', required=True)
    ap.add_argument('--bin', required=True, help='the build directory')
    ap.add_argument('--seccomp-dir', required=True)
    ap.add_argument('--expect-shared-pid', action='store_true')
    ap.add_argument('--fakecuda', metavar='LIB', help='keep CUDA kinds; the apps load LIB as their libcuda')
    ap.add_argument('--expect-distinct-pids', action='store_true',
                    help='every app runs under gpuipcctl run, at PIDs that differ and are not 1')
    ap.add_argument('--node-weights', metavar='HOLDER',
                    help='--pod names the engine Deployment, HOLDER the weights holder DaemonSet')
    ap.add_argument('--node-broker-policy', metavar='VOLUME',
                    help='--pod names a DaemonSet: run its pod and update the ConfigMap of VOLUME')
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which('runc'):
        print('runc simulation needs root and runc: skipped')
        return 77
    if a.node_broker_policy and not shutil.which('setpriv'):
        print('setpriv (util-linux) is needed to act as the client pods\' uids: skipped')
        return 77
    with open(a.manifests) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    configmaps = {d['metadata']['name']: d for d in docs if d['kind'] == 'ConfigMap'}
    entrypoint = image_entrypoint(os.path.join(os.path.dirname(os.path.abspath(a.seccomp_dir)), 'Dockerfile'))
    if a.node_weights:
        # The engine runs the host's /usr/bin/python3 (the container gets the host's /usr).
        r = subprocess.run(['/usr/bin/python3', '-c', 'import numpy, msgpack'], capture_output=True)
        if r.returncode != 0:
            print('the engine needs /usr/bin/python3 with numpy and msgpack (Debian: python3-numpy, '
                  'python3-msgpack): skipped')
            return 77
        os.makedirs(STATE_ROOT, exist_ok=True)
        work = tempfile.mkdtemp(prefix='gpuipc-node-')
        os.chmod(work, 0o755)
        python_dir = os.path.join(os.path.dirname(os.path.abspath(a.seccomp_dir)), 'python')
        try:
            ok = run_node_weights(docs, a.pod, a.node_weights, a.bin, a.seccomp_dir, work, entrypoint, configmaps,
                                  python_dir)
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            log(f'error: {e}')
            ok = False
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log('node simulation passed' if ok else 'node simulation FAILED')
        return 0 if ok else 1
    if a.node_broker_policy:
        ds = next((d for d in docs if d['kind'] == 'DaemonSet' and d['metadata']['name'] == a.pod), None)
        if not ds:
            raise SystemExit(f'no DaemonSet named {a.pod} in the manifests')
        pod = {'metadata': {'name': a.pod, **ds['spec']['template'].get('metadata', {})},
               'spec': ds['spec']['template']['spec']}
    else:
        pod = find_pod(docs, a.pod)
    if bool(pod['spec'].get('shareProcessNamespace')) != a.expect_shared_pid:
        print(f'the pod {"does not share" if a.expect_shared_pid else "shares"} its PID namespace, unlike expected')
        return 1
    os.makedirs(STATE_ROOT, exist_ok=True)
    work = tempfile.mkdtemp(prefix='gpuipc-pod-')
    os.chmod(work, 0o755)
    p = Pod(pod, a.bin, a.seccomp_dir, work,
            image_entrypoint(os.path.join(os.path.dirname(os.path.abspath(a.seccomp_dir)), 'Dockerfile')),
            configmaps, a.fakecuda, a.expect_distinct_pids)
    try:
        ok = p.run_node_broker_policy(a.node_broker_policy) if a.node_broker_policy else p.run()
    except (RuntimeError, subprocess.SubprocessError, OSError) as e:
        log(f'error: {e}')
        for name in os.listdir(work):
            if name.endswith('.log'):
                log(f'--- {name}\n{open(os.path.join(work, name)).read()}')
        ok = False
    finally:
        p.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    log('pod simulation passed' if ok else 'pod simulation FAILED')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
