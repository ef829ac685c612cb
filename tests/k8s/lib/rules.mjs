// The checks schemas cannot make: Pod Security `restricted` on every
// container, the broker sidecar's shape, resources, the seccomp profile, the
// gpuipc contract (image, socket, uid/gid), DRA wiring and what each setup
// promises. Every check takes a rendered target { name, setup, objects } and
// a context { refs: {setup: objects}, profiles: Set|null } and returns a list
// of problems (empty = pass).

import { basename } from 'node:path';
import * as K from './contract.mjs';
import {
  appName,
  appRole,
  canon,
  containers,
  firstDiff,
  flagValue,
  gstProperty,
  isBroker,
  isGstLaunch,
  podSpecs,
  ref,
  runWrapped,
} from './objects.mjs';
import { schemaProblems } from './schema.mjs';

// Pod specs that run gpuipc clients or the broker (all of ours do).
const appsOf = (spec) =>
  [...(spec.containers ?? []), ...(spec.initContainers ?? [])].filter(
    (c) => appRole(c) === 'publish' || appRole(c) === 'attach',
  );

// The containers that use the broker: gpuipcctl and GStreamer apps; in an example of the sidecar
// component (users' own images and commands), every regular container.
const appContainers = (spec, setup) => (setup.component ? (spec.containers ?? []) : appsOf(spec));

const eff = (spec, c, key) => c.securityContext?.[key] ?? spec.securityContext?.[key];

// ---- schema ----------------------------------------------------------------

// Both schema checks read one result per object.
const schemaCache = new WeakMap();

async function schemaOf(o) {
  if (!schemaCache.has(o)) schemaCache.set(o, await schemaProblems(o));
  return schemaCache.get(o);
}

async function schemaTypes(t) {
  const out = [];
  for (const o of t.objects) out.push(...(await schemaOf(o)).types);
  return out;
}

async function schemaFields(t) {
  const out = [];
  for (const o of t.objects) out.push(...(await schemaOf(o)).fields);
  return out;
}

// ---- scope and namespaces ---------------------------------------------------

function scope(t) {
  const out = [];
  const namespaces = new Set(t.objects.filter((o) => o.kind === 'Namespace').map((o) => o.metadata.name));
  for (const o of t.objects) {
    const ns = o.metadata?.namespace;
    if (K.CLUSTER_SCOPED.includes(o.kind)) {
      if (ns)
        out.push(`${ref(o)}: cluster-scoped but has namespace ${ns} (kustomize's namespace: stamps it)`);
    } else if (!ns) {
      out.push(`${ref(o)}: namespaced but has no namespace`);
    } else if (!namespaces.has(ns)) {
      out.push(`${ref(o)}: namespace ${ns} is not defined by this kustomization`);
    }
    if (o.kind === 'DeviceClass')
      out.push(`${ref(o)}: DeviceClasses come from the DRA driver, do not ship one`);
  }
  return out;
}

function namespaceSecurity(t) {
  const out = [];
  const pss = (o, mode) => o.metadata?.labels?.[`pod-security.kubernetes.io/${mode}`];
  for (const o of t.objects.filter((x) => x.kind === 'Namespace')) {
    for (const mode of ['warn', 'audit']) {
      if (pss(o, mode) !== 'restricted') out.push(`${ref(o)}: pod-security ${mode} must be restricted`);
    }
    if (pss(o, 'enforce') === 'restricted') continue;
    // The one documented exception: the node-broker namespace
    // enforces `privileged` for its hostPath, and a bound
    // ValidatingAdmissionPolicy re-imposes the rest.
    if (!t.setup.nodeBroker) {
      out.push(`${ref(o)}: pod-security enforce must be restricted`);
      continue;
    }
    const bindings = t.objects.filter(
      (b) =>
        b.kind === 'ValidatingAdmissionPolicyBinding' &&
        b.spec?.matchResources?.namespaceSelector?.matchLabels?.['kubernetes.io/metadata.name'] ===
          o.metadata.name,
    );
    const policies = bindings
      .map((b) =>
        t.objects.find(
          (p) => p.kind === 'ValidatingAdmissionPolicy' && p.metadata.name === b.spec.policyName,
        ),
      )
      .filter(Boolean);
    const guards = policies.some((p) =>
      (p.spec?.validations ?? []).some(
        (v) => v.expression.includes('hostPath') && v.expression.includes(K.SOCKET_DIR),
      ),
    );
    if (!guards || !bindings.some((b) => b.spec.validationActions?.includes('Deny')))
      out.push(
        `${ref(o)}: enforce is not restricted, so a Deny-bound ValidatingAdmissionPolicy must limit hostPath to ${K.SOCKET_DIR}`,
      );
  }
  return out;
}

// ---- Pod Security restricted -------------------------------------------------

function podSecurity(t) {
  const out = [];
  for (const { where, spec } of podSpecs(t.objects)) {
    for (const f of ['hostPID', 'hostIPC', 'hostNetwork'])
      if (spec[f]) out.push(`${where}: ${f}: true is forbidden (no gpuipc setup needs it)`);
    if (spec.shareProcessNamespace && !t.setup.sharePid)
      out.push(`${where}: shareProcessNamespace is only for the dra-legacy setup (the containers see and can signal each other's processes)`);
    if (spec.securityContext?.sysctls?.length) out.push(`${where}: sysctls are not allowed`);
    for (const v of spec.volumes ?? []) {
      const type = Object.keys(v).find((k) => k !== 'name');
      if (type === 'hostPath') {
        if (!t.setup.nodeBroker)
          out.push(`${where}: hostPath volume ${v.name} (only the node-broker setup may mount one)`);
        else if (v.hostPath.path !== K.SOCKET_DIR || v.hostPath.type !== 'Directory')
          out.push(`${where}: hostPath volume ${v.name} must be ${K.SOCKET_DIR} with type Directory`);
      } else if (!K.RESTRICTED_VOLUMES.includes(type)) {
        out.push(`${where}: volume ${v.name} of type ${type} is not allowed under restricted`);
      }
    }
    for (const { c, label } of containers(spec)) {
      const at = `${where} ${label}`;
      const sc = c.securityContext ?? {};
      if (eff(spec, c, 'runAsNonRoot') !== true) out.push(`${at}: runAsNonRoot must be true`);
      for (const id of ['runAsUser', 'runAsGroup']) {
        const v = eff(spec, c, id);
        if (!Number.isInteger(v) || v === 0) out.push(`${at}: ${id} must be set and non-zero`);
      }
      if (sc.allowPrivilegeEscalation !== false) out.push(`${at}: allowPrivilegeEscalation must be false`);
      if (sc.privileged) out.push(`${at}: privileged is forbidden`);
      if (!(sc.capabilities?.drop ?? []).includes('ALL'))
        out.push(`${at}: capabilities.drop must contain ALL`);
      if ((sc.capabilities?.add ?? []).length)
        out.push(`${at}: capabilities.add must be empty (gpuipc needs none)`);
      if (sc.procMount && sc.procMount !== 'Default') out.push(`${at}: procMount must be Default`);
      if (sc.readOnlyRootFilesystem !== true) out.push(`${at}: readOnlyRootFilesystem must be true`);
      const type = eff(spec, c, 'seccompProfile')?.type;
      if (type !== 'RuntimeDefault' && type !== 'Localhost')
        out.push(`${at}: seccompProfile type must be RuntimeDefault or Localhost, is ${type}`);
      if ((c.ports ?? []).some((p) => p.hostPort)) out.push(`${at}: hostPort is forbidden`);
    }
  }
  return out;
}

// ---- the broker -------------------------------------------------------------

const probeOk = (p) => canon(p?.exec?.command) === canon(K.PROBE);

function brokerProblems(at, c) {
  const out = [];
  if (!probeOk(c.startupProbe)) out.push(`${at}: startupProbe must exec ${K.PROBE.join(' ')}`);
  if (!probeOk(c.readinessProbe)) out.push(`${at}: readinessProbe must exec ${K.PROBE.join(' ')}`);
  if (c.resources?.claims?.length)
    out.push(`${at}: the broker must not hold a DRA claim (it never touches a GPU)`);
  return out;
}

function sidecar(t) {
  const out = [];
  for (const { obj, where, spec } of podSpecs(t.objects)) {
    const init = spec.initContainers ?? [];
    const hasApps = appContainers(spec, t.setup).length > 0;
    (spec.containers ?? []).filter(isBroker).forEach((c) => {
      if (!(t.setup.nodeBroker && obj.kind === 'DaemonSet'))
        out.push(
          `${where}: ${c.name} is a regular container; it must be the native sidecar initContainers[0]`,
        );
      else out.push(...brokerProblems(`${where} ${c.name}`, c));
    });
    if (t.setup.nodeBroker) {
      if (init.some(isBroker)) out.push(`${where}: node-broker clients use the node's broker, not a sidecar`);
      continue;
    }
    if (!hasApps) continue;
    const idx = init.findIndex(isBroker);
    if (idx < 0) {
      out.push(`${where}: no ${K.BROKER_NAME} sidecar in initContainers`);
      continue;
    }
    if (idx !== 0) out.push(`${where}: ${K.BROKER_NAME} must be initContainers[0], is [${idx}]`);
    const n = containers(spec).filter(({ c }) => isBroker(c)).length;
    if (n !== 1) out.push(`${where}: ${n} ${K.BROKER_NAME} containers: a pod has exactly one broker`);
    const b = init[idx];
    if (b.restartPolicy !== 'Always')
      out.push(`${where} ${b.name}: restartPolicy must be Always (a native sidecar)`);
    out.push(...brokerProblems(`${where} ${b.name}`, b));
  }
  return out;
}

// The broker container must be the same everywhere it appears: the base's.
function brokerDrift(t, ctx) {
  const base = podSpecs(ctx.refs.base ?? [])
    .flatMap(({ spec }) => spec.initContainers ?? [])
    .find(isBroker);
  if (!base) return ['the base renders no broker sidecar to compare with'];
  const out = [];
  for (const { where, spec } of podSpecs(t.objects)) {
    for (const { c, label } of containers(spec).filter((x) => isBroker(x.c))) {
      for (const f of [
        'image',
        'command',
        'env',
        'startupProbe',
        'readinessProbe',
        'livenessProbe',
        'resources',
        'securityContext',
      ]) {
        if (canon(c[f]) !== canon(base[f]))
          out.push(`${where} ${label}: ${f} differs from the base's broker`);
      }
    }
  }
  return out;
}

// ---- resources --------------------------------------------------------------

const UNITS = {
  '': 1,
  m: 1e-3,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
};

function quantity(q) {
  const m = /^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(String(q));
  return m ? Number(m[1]) * UNITS[m[2] ?? ''] : NaN;
}

function resources(t) {
  const out = [];
  for (const { where, spec } of podSpecs(t.objects)) {
    for (const { c, label } of containers(spec)) {
      for (const r of ['cpu', 'memory']) {
        const req = c.resources?.requests?.[r];
        const lim = c.resources?.limits?.[r];
        if (req === undefined || lim === undefined)
          out.push(`${where} ${label}: needs ${r} requests and limits`);
        else if (!(quantity(req) <= quantity(lim)))
          out.push(`${where} ${label}: ${r} request ${req} exceeds or cannot be compared with limit ${lim}`);
      }
    }
  }
  return out;
}

// ---- seccomp profile ----------------------------------------------------------

function seccompProfile(t, ctx) {
  const out = [];
  for (const { where, spec } of podSpecs(t.objects)) {
    const check = (at, p) => {
      if (p?.type !== 'Localhost') return;
      if (p.localhostProfile !== K.LOCALHOST_PROFILE)
        out.push(`${at}: localhostProfile ${p.localhostProfile} must be ${K.LOCALHOST_PROFILE}`);
      const file = basename(p.localhostProfile ?? '');
      // Without a shipped profile yet, name the file we expect;
      // the global check reports it missing.
      const shipped = ctx.profiles ?? new Set([K.PROFILE_FILE]);
      if (!shipped.has(file))
        out.push(`${at}: localhostProfile ${file} is not a profile shipped in seccomp/`);
    };
    check(`${where} pod`, spec.securityContext?.seccompProfile);
    for (const { c, label } of containers(spec)) {
      check(`${where} ${label}`, c.securityContext?.seccompProfile);
      const type = eff(spec, c, 'seccompProfile')?.type;
      if (isBroker(c) && type !== 'Localhost')
        out.push(`${where} ${label}: the broker must run under its Localhost profile`);
      if (!isBroker(c) && type !== 'RuntimeDefault')
        out.push(`${where} ${label}: app containers run under RuntimeDefault`);
    }
  }
  return out;
}

// ---- the gpuipc contract -------------------------------------------------------

function contract(t) {
  const out = [];
  for (const { obj, where, spec } of podSpecs(t.objects)) {
    const socketVols = (spec.volumes ?? []).filter((v) =>
      containers(spec).some(({ c }) =>
        (c.volumeMounts ?? []).some((m) => m.name === v.name && m.mountPath === K.SOCKET_DIR),
      ),
    );
    for (const v of socketVols) {
      if (v.emptyDir && (v.emptyDir.medium !== 'Memory' || !v.emptyDir.sizeLimit))
        out.push(`${where}: socket volume ${v.name} must be an emptyDir with medium Memory and a sizeLimit`);
      if (v.persistentVolumeClaim && t.setup.weights) out.push(...socketClaim(t, where, obj, v));
      else if (!v.emptyDir && !v.hostPath)
        out.push(`${where}: socket volume ${v.name} must be an emptyDir (or the node-broker hostPath)`);
    }
    if (spec.securityContext?.fsGroup !== undefined && spec.securityContext.fsGroup !== K.GID)
      out.push(`${where}: fsGroup must be ${K.GID}, the socket's group`);
    for (const { c, label } of containers(spec)) {
      const at = `${where} ${label}`;
      // The component's examples run users' own images: only gpuipc's containers are checked.
      // So do the engines of the weights example.
      const usersApp = (t.setup.component && !isBroker(c) && c.name !== K.METRICS_NAME) || isEngine(t, obj);
      const image = isGstLaunch(c) ? K.GST_IMAGE : K.IMAGE;
      if (c.image !== image && !usersApp) out.push(`${at}: image must be ${image}`);
      const env = (c.env ?? []).find((e) => e.name === K.SOCKET_ENV);
      if (env?.value !== K.SOCKET) out.push(`${at}: env ${K.SOCKET_ENV} must be ${K.SOCKET}`);
      const mount = (c.volumeMounts ?? []).find((m) => m.mountPath === K.SOCKET_DIR);
      if (!mount) out.push(`${at}: must mount the socket directory at ${K.SOCKET_DIR}`);
      else if (!isBroker(c) && mount.readOnly !== true)
        out.push(`${at}: clients mount ${K.SOCKET_DIR} readOnly (they must not replace the socket)`);
      else if (isBroker(c) && mount.readOnly) out.push(`${at}: the broker needs ${K.SOCKET_DIR} writable`);
      // The 0660 socket is group GID: every container needs it.
      const groups = [
        eff(spec, c, 'runAsGroup'),
        spec.securityContext?.fsGroup,
        ...(spec.securityContext?.supplementalGroups ?? []),
      ];
      if (!groups.includes(K.GID)) out.push(`${at}: not in group ${K.GID}, cannot open the 0660 socket`);
      if (isBroker(c)) {
        if (eff(spec, c, 'runAsUser') !== K.UID || eff(spec, c, 'runAsGroup') !== K.GID)
          out.push(`${at}: the broker runs as ${K.UID}:${K.GID}, the image's user`);
        out.push(...brokerArgs(at, c));
      } else if (usersApp) {
        // any command
      } else if (t.setup.gstreamer && c.name !== K.METRICS_NAME) {
        if (!isGstLaunch(c)) out.push(`${at}: app containers of this setup run ${K.GST_LAUNCH} (command: [${K.GST_LAUNCH}])`);
      } else if (t.setup.runWrapped && c.name !== K.METRICS_NAME) {
        if (canon(c.command) !== canon(K.RUN_COMMAND))
          out.push(`${at}: app containers of this setup start under gpuipcctl run (command: [${K.RUN_COMMAND.join(', ')}])`);
      } else if (canon(c.command) !== canon([K.CLI])) {
        out.push(`${at}: app containers run ${K.CLI} (command: [${K.CLI}])`);
      }
    }
  }
  return out;
}

// The engines of the weights setup: its Deployments (the user's image and command).
const isEngine = (t, obj) => !!t.setup.weights && obj.kind === 'Deployment';

// A socket volume that is a claim (the weights setup's engines, under restricted): read-only, bound
// (volumeName) to a rendered PersistentVolume of the node's SOCKET_DIR that is bound ahead of time
// (claimRef) to this claim alone, so that no claim of another namespace takes it.
function socketClaim(t, where, obj, v) {
  const name = v.persistentVolumeClaim.claimName;
  const ns = obj.metadata.namespace;
  const out = [];
  if (v.persistentVolumeClaim.readOnly !== true)
    out.push(`${where}: socket claim volume ${v.name} must set readOnly: true (clients must not replace the socket)`);
  const pvc = t.objects.find(
    (o) => o.kind === 'PersistentVolumeClaim' && o.metadata.name === name && o.metadata.namespace === ns,
  );
  if (!pvc) return [...out, `${where}: socket volume ${v.name} names claim ${name}, which is not rendered in ${ns}`];
  const pv = t.objects.find((o) => o.kind === 'PersistentVolume' && o.metadata.name === pvc.spec?.volumeName);
  if (!pv)
    return [...out, `PersistentVolumeClaim/${name}: must be bound (volumeName) to a rendered PersistentVolume of ${K.SOCKET_DIR}`];
  if (pv.spec?.hostPath?.path !== K.SOCKET_DIR || pv.spec.hostPath.type !== 'Directory')
    out.push(`${ref(pv)}: the socket's PersistentVolume must be the hostPath ${K.SOCKET_DIR} with type Directory`);
  const cr = pv.spec?.claimRef;
  if (cr?.namespace !== ns || cr?.name !== name)
    out.push(`${ref(pv)}: must be bound ahead of time (claimRef) to ${ns}/${name}, or a claim of another namespace could take the node's socket`);
  return out;
}

function brokerArgs(at, c) {
  const args = c.args ?? [];
  if (c.command?.length)
    return [`${at}: the broker keeps the image's entrypoint ${K.BROKER_BIN} (set args, not command)`];
  if (canon(args.slice(0, K.BROKER_ARGS.length)) !== canon(K.BROKER_ARGS))
    return [`${at}: args must start with ${K.BROKER_ARGS.join(' ')}`];
  const out = [];
  const rest = args.slice(K.BROKER_ARGS.length);
  for (let i = 0; i < rest.length; i += 2) {
    if (!K.BROKER_EXTRA_ARGS[rest[i]]?.includes(rest[i + 1]))
      out.push(`${at}: unexpected broker argument ${rest[i]} ${rest[i + 1] ?? ''}`);
  }
  return out;
}

// ---- DRA ---------------------------------------------------------------------

function claimObject(t, ns, rc) {
  const kind = rc.resourceClaimTemplateName ? 'ResourceClaimTemplate' : 'ResourceClaim';
  const name = rc.resourceClaimTemplateName ?? rc.resourceClaimName;
  const o = t.objects.find((x) => x.kind === kind && x.metadata.name === name && x.metadata.namespace === ns);
  return { kind, name, o, devices: kind === 'ResourceClaim' ? o?.spec?.devices : o?.spec?.spec?.devices };
}

function dra(t) {
  const out = [];
  for (const { obj, where, spec } of podSpecs(t.objects)) {
    const apps = appContainers(spec, t.setup);
    const declared = spec.resourceClaims ?? [];
    if (!t.setup.deviceClass) {
      if (declared.length) out.push(`${where}: this setup uses no GPU, so no resourceClaims`);
      continue;
    }
    if (!apps.length) continue;
    for (const { c, label } of containers(spec)) {
      for (const cl of c.resources?.claims ?? []) {
        if (!declared.some((d) => d.name === cl.name))
          out.push(`${where} ${label}: claim ${cl.name} is not in spec.resourceClaims`);
      }
    }
    // One device for everyone: every app container lists the same claims.
    const sets = apps.map((c) => canon((c.resources?.claims ?? []).map((x) => x.name).sort()));
    if (sets.some((s) => s !== sets[0]) || sets[0] === '[]')
      out.push(`${where}: every app container must list the same DRA claim (one GPU for all)`);
    for (const rc of declared) {
      if (!!rc.resourceClaimName === !!rc.resourceClaimTemplateName) {
        out.push(
          `${where}: resourceClaims ${rc.name} needs exactly one of resourceClaimName, resourceClaimTemplateName`,
        );
        continue;
      }
      const { kind, name, o, devices } = claimObject(t, obj.metadata.namespace, rc);
      if (!o) {
        out.push(`${where}: resourceClaims ${rc.name} refers to ${kind} ${name}, which is not rendered`);
        continue;
      }
      for (const r of devices?.requests ?? []) {
        const cls = r.exactly?.deviceClassName;
        if (cls !== t.setup.deviceClass)
          out.push(
            `${kind}/${name} request ${r.name}: deviceClassName ${cls}, expected ${t.setup.deviceClass}`,
          );
        const cel = (r.exactly?.selectors ?? []).map((s) => s.cel?.expression ?? '').join(' ');
        if (t.setup.selector && !cel.includes(t.setup.selector))
          out.push(`${kind}/${name} request ${r.name}: needs a CEL selector on ${t.setup.selector}`);
      }
    }
  }
  return out;
}

// ---- what each setup promises ----------------------------------------------------

function setupShape(t, ctx) {
  if (t.setup.component) return componentShape(t);
  if (t.setup.weights) return weightsShape(t);
  const out = [];
  const specs = podSpecs(t.objects);
  const withApps = specs.filter(({ spec }) => appsOf(spec).length);
  if (!withApps.length) return ['no pod runs a gpuipc producer or consumer'];
  // In-pod setups: one producer and N consumers per pod. node-broker: across pods.
  const groups = t.setup.nodeBroker ? [withApps] : withApps.map((s) => [s]);
  for (const g of groups) {
    const where = g.map((s) => s.where).join(', ');
    const apps = g.flatMap(({ spec }) => appsOf(spec));
    const producers = apps.filter((c) => appRole(c) === 'publish');
    const consumers = apps.filter((c) => appRole(c) === 'attach');
    if (producers.length !== 1) out.push(`${where}: expected 1 producer, found ${producers.length}`);
    if (consumers.length !== t.setup.consumers)
      out.push(`${where}: expected ${t.setup.consumers} consumer(s), found ${consumers.length}`);
    for (const p of producers) {
      // A pipeline's slots are cuda-vmm for CUDA memory caps, memfd otherwise.
      const kind = isGstLaunch(p)
        ? (p.args ?? []).some((a) => a.includes('memory:CUDAMemory'))
          ? 'cuda-vmm'
          : 'memfd'
        : flagValue(p, '--kind');
      if (kind !== t.setup.kind) out.push(`${where} ${p.name}: publishes ${kind}, this setup is ${t.setup.kind}`);
    }
    const names = new Set(apps.map(appName));
    if (names.size !== 1)
      out.push(`${where}: producer and consumers must use one buffer name, found ${[...names].join(', ')}`);
  }
  for (const { where, spec } of withApps) {
    if (!!spec.shareProcessNamespace !== !!t.setup.sharePid)
      out.push(`${where}: shareProcessNamespace must be ${!!t.setup.sharePid} in this setup`);
    // Legacy handles do not open between equal PIDs (docs/legacy-ipc.md): without one PID
    // namespace both apps are PID 1 of their containers unless gpuipcctl run moves them.
    const legacy = appsOf(spec).some((c) => appRole(c) === 'publish' && flagValue(c, '--kind') === 'cuda-legacy');
    const bare = appsOf(spec).filter((c) => !runWrapped(c));
    if (legacy && !spec.shareProcessNamespace && bare.length)
      out.push(
        `${where}: cuda-legacy with ${bare.map((c) => c.name).join(', ')} as PID 1 of its container: ` +
          'equal PIDs (both PID 1) refuse legacy handles; start every app under gpuipcctl run -- or share the PID namespace',
      );
  }
  if (t.setup.nodeBroker) out.push(...nodeBrokerShape(t, specs, withApps));
  if (t.setup.gang) out.push(...gangShape(t));
  if (t.setup.onlyDiffers) out.push(...onlyDiffers(t, ctx.refs[t.setup.onlyDiffers], t.setup.onlyDiffers));
  return out;
}

function nodeBrokerShape(t, specs, clients) {
  const out = [];
  const ds = specs.filter(
    ({ obj, spec }) => obj.kind === 'DaemonSet' && (spec.containers ?? []).some(isBroker),
  );
  if (ds.length !== 1) out.push(`expected one DaemonSet running ${K.BROKER_NAME}, found ${ds.length}`);
  if (clients.length < 2)
    out.push(
      `the node-broker setup puts producer and consumer in separate pods, found ${clients.length} pod(s)`,
    );
  // A shared ResourceClaim (not a template) puts every client on the
  // node and GPU that claim was allocated to.
  const shared = new Set(
    clients.map(({ spec }) => canon((spec.resourceClaims ?? []).map((r) => r.resourceClaimName))),
  );
  if (shared.size !== 1 || [...shared][0].includes('null'))
    out.push('node-broker clients must all reference one shared ResourceClaim (resourceClaimName)');
  for (const { where, spec } of clients) {
    if (!(spec.volumes ?? []).some((v) => v.hostPath?.path === K.SOCKET_DIR))
      out.push(`${where}: node-broker clients mount the node's ${K.SOCKET_DIR}`);
  }
  for (const { where, spec } of ds) out.push(...nodeBrokerDaemonSet(t, where, spec));
  return out;
}

function nodeBrokerDaemonSet(t, where, spec) {
  const out = [];
  if (spec.priorityClassName !== K.NODE_BROKER_PRIORITY)
    out.push(`${where}: priorityClassName must be ${K.NODE_BROKER_PRIORITY} (an evicted broker drops every reference on the node)`);
  else if (!t.objects.some((o) => o.kind === 'PriorityClass' && o.metadata.name === K.NODE_BROKER_PRIORITY))
    out.push(`${where}: PriorityClass ${K.NODE_BROKER_PRIORITY} is not rendered`);
  out.push(...nodeBrokerPolicy(t, where, spec));
  return out;
}

// The node broker gets its policy from a ConfigMap it reads (and reloads) at
// /etc/gpuipc/policy.conf; the file must hold only rules the broker parses.
const POLICY_RULE = /^(allow|deny)\s+(publish|attach|admin|all)(,(publish|attach|admin|all))*\s+(any|uid=\d+|gid=\d+)(\s+prefix=\S*)?$/;

// The node broker's policy: { cm, text } or { problem }.
function policyOf(t, where, spec) {
  const broker = (spec.containers ?? []).find(isBroker);
  const path = flagValue(broker ?? {}, '--policy');
  if (!path) return { problem: `${where}: the node broker must run with --policy (a node-wide broker without one lets every client use every name)` };
  const dir = path.slice(0, path.lastIndexOf('/'));
  const mount = (broker.volumeMounts ?? []).find((m) => m.mountPath === dir);
  const vol = mount && (spec.volumes ?? []).find((v) => v.name === mount.name);
  const cm = vol?.configMap && t.objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === vol.configMap.name);
  if (!cm) return { problem: `${where}: --policy ${path}: ${dir} must be a ConfigMap volume of this setup` };
  if (mount.subPath) return { problem: `${where}: the policy ConfigMap must not use subPath (subPath mounts never see updates)` };
  const text = cm.data?.[path.slice(dir.length + 1)];
  if (text === undefined) return { problem: `${where}: ConfigMap ${cm.metadata.name} has no key ${path.slice(dir.length + 1)}` };
  return { cm, text };
}

function nodeBrokerPolicy(t, where, spec) {
  const { cm, text, problem } = policyOf(t, where, spec);
  if (problem) return [problem];
  const bad = text
    .split('\n')
    .map((l, i) => [l.replace(/#.*/, '').trim(), i + 1])
    .filter(([l]) => l && !POLICY_RULE.test(l));
  return bad.map(([l, n]) => `ConfigMap/${cm.metadata.name} line ${n}: not a policy rule: ${l}`);
}

// What the broker decides for a peer of uid and gids doing op on name under the policy text, as
// docs/security.md says: the first rule that matches wins, and a loaded policy denies the rest.
function policyAllows(text, op, uid, gids, name) {
  for (const line of text.split('\n')) {
    const l = line.replace(/#.*/, '').trim();
    const m = POLICY_RULE.exec(l);
    if (!m) continue;
    const [verdict, ops, who] = l.split(/\s+/);
    const prefix = /\sprefix=(\S*)$/.exec(l)?.[1] ?? '';
    const opOk = ops.split(',').some((o) => o === op || o === 'all');
    const whoOk = who === 'any' || who === `uid=${uid}` || gids.some((g) => who === `gid=${g}`);
    if (opOk && whoOk && name.startsWith(prefix)) return verdict === 'allow';
  }
  return false;
}

// `gpuipcctl weights serve NAME FILE... [options]`: { name, files, kind }, or null.
function serveOf(c) {
  const a = c.args ?? [];
  if (canon(c.command) !== canon([K.CLI]) || a[0] !== 'weights' || a[1] !== 'serve') return null;
  const files = [];
  for (let i = 3; i < a.length && !a[i].startsWith('-'); i++) files.push(a[i]);
  return { name: a[2], files, kind: flagValue(c, '--kind') ?? 'cuda-vmm' };
}

const idOf = (spec, c) => ({
  uid: eff(spec, c, 'runAsUser'),
  gids: [eff(spec, c, 'runAsGroup'), ...(spec.securityContext?.supplementalGroups ?? [])],
});

// The weights example: the node broker, a holder DaemonSet of its own beside it on the same
// nodes, reading its checkpoint from a claim mounted read-only, and engine Deployments under
// restricted that attach what it serves; the broker's policy lets each do its part and no more.
function weightsShape(t) {
  const out = [];
  const specs = podSpecs(t.objects);
  const brokers = specs.filter(({ obj, spec }) => obj.kind === 'DaemonSet' && (spec.containers ?? []).some(isBroker));
  if (brokers.length !== 1) return [`expected one DaemonSet running ${K.BROKER_NAME}, found ${brokers.length}`];
  const [broker] = brokers;
  out.push(...nodeBrokerDaemonSet(t, broker.where, broker.spec));
  const holders = specs.filter(({ spec }) => (spec.containers ?? []).some(serveOf));
  if (holders.length !== 1 || holders[0].obj.kind !== 'DaemonSet')
    return [...out, `expected one DaemonSet running gpuipcctl weights serve, found ${holders.map((h) => h.where).join(', ') || 'none'}`];
  const [holder] = holders;
  if (holder === broker || holder.obj === broker.obj)
    out.push(`${holder.where}: the holder is a DaemonSet of its own: beside the broker, a new checkpoint would restart the broker too`);
  if (holder.obj.metadata.namespace !== broker.obj.metadata.namespace)
    out.push(`${holder.where}: the holder runs in the broker's namespace (the only one whose pods may mount ${K.SOCKET_DIR})`);
  if (canon(holder.spec.nodeSelector) !== canon(broker.spec.nodeSelector))
    out.push(`${holder.where}: nodeSelector differs from the broker's: a holder on a node without a broker serves nothing`);
  const hc = holder.spec.containers.find(serveOf);
  const serve = serveOf(hc);
  if (serve.kind !== t.setup.kind) out.push(`${holder.where} ${hc.name}: serves ${serve.kind}, this setup is ${t.setup.kind}`);
  if (!serve.files.length) out.push(`${holder.where} ${hc.name}: weights serve names no file`);
  for (const f of serve.files) {
    const m = (hc.volumeMounts ?? []).find((x) => f.startsWith(`${x.mountPath}/`));
    const v = m && (holder.spec.volumes ?? []).find((x) => x.name === m.name);
    if (!v?.persistentVolumeClaim)
      out.push(`${holder.where} ${hc.name}: reads ${f} from no claim (the checkpoint comes from a PersistentVolumeClaim)`);
    else if (m.readOnly !== true || v.persistentVolumeClaim.readOnly !== true)
      out.push(`${holder.where} ${hc.name}: the checkpoint's claim ${v.name} must be mounted read-only (mount and volume)`);
  }
  for (const pv of t.objects.filter((o) => o.kind === 'PersistentVolume')) {
    if (pv.spec?.hostPath && pv.spec.hostPath.path !== K.SOCKET_DIR)
      out.push(`${ref(pv)}: a hostPath PersistentVolume other than ${K.SOCKET_DIR} (${pv.spec.hostPath.path})`);
  }
  const engines = specs.filter(({ obj }) => isEngine(t, obj));
  if (!engines.length) out.push('renders no engine Deployment');
  const policy = policyOf(t, broker.where, broker.spec);
  const hid = idOf(holder.spec, hc);
  if (policy.text && !policyAllows(policy.text, 'publish', hid.uid, hid.gids, serve.name))
    out.push(`the broker's policy does not let the holder (uid ${hid.uid}) publish ${serve.name}`);
  for (const { obj, where, spec } of engines) {
    const ns = t.objects.find((o) => o.kind === 'Namespace' && o.metadata.name === obj.metadata.namespace);
    if (ns?.metadata?.labels?.['pod-security.kubernetes.io/enforce'] !== 'restricted')
      out.push(`${where}: engines run in a namespace that enforces restricted, ${obj.metadata.namespace} does not`);
    if ((spec.volumes ?? []).some((v) => v.hostPath))
      out.push(`${where}: engines mount no hostPath (restricted): the socket comes through its claim`);
    if (canon(spec.nodeSelector) !== canon(broker.spec.nodeSelector))
      out.push(`${where}: nodeSelector differs from the broker's: an engine on a node without a broker finds no weights`);
    for (const c of spec.containers ?? []) {
      const env = (c.env ?? []).find((e) => e.name === K.WEIGHTS_ENV);
      if (env?.value !== serve.name)
        out.push(`${where} ${c.name}: env ${K.WEIGHTS_ENV} must name the holder's weights ${serve.name}, is ${env?.value}`);
      const id = idOf(spec, c);
      if (policy.text && !policyAllows(policy.text, 'attach', id.uid, id.gids, serve.name))
        out.push(`${where} ${c.name}: the broker's policy does not let the engines' uid ${id.uid} attach ${serve.name}`);
      if (policy.text && policyAllows(policy.text, 'publish', id.uid, id.gids, serve.name))
        out.push(`${where} ${c.name}: the broker's policy lets the engines' uid ${id.uid} publish ${serve.name}: an engine could replace the weights`);
      if (id.uid === hid.uid) out.push(`${where} ${c.name}: runs as the holder's uid ${hid.uid}: engines have their own`);
    }
  }
  return out;
}

function gangShape(t) {
  const out = [];
  const lws = t.objects.filter((o) => o.kind === 'LeaderWorkerSet');
  if (lws.length !== 1) return [`expected one LeaderWorkerSet, found ${lws.length}`];
  const [o] = lws;
  if (o.apiVersion !== 'leaderworkerset.x-k8s.io/v1')
    out.push(`${ref(o)}: apiVersion must be leaderworkerset.x-k8s.io/v1`);
  if (!o.metadata.annotations?.['scheduling.volcano.sh/queue-name'])
    out.push(`${ref(o)}: needs the scheduling.volcano.sh/queue-name annotation`);
  if (!((o.spec.leaderWorkerTemplate?.size ?? 1) >= 2))
    out.push(`${ref(o)}: a gang needs leaderWorkerTemplate.size >= 2`);
  for (const { where, spec } of podSpecs([o])) {
    if (spec.schedulerName !== 'volcano') out.push(`${where}: schedulerName must be volcano`);
  }
  return out;
}

// t's rendering must equal ref's except: object names, shareProcessNamespace,
// the producer's --kind and the apps' command when it is gpuipcctl run's.
function onlyDiffers(t, refObjects, refName) {
  if (!refObjects) return [`cannot compare with ${refName}: it did not render`];
  const norm = (objs) =>
    objs.map((o) => {
      const c = structuredClone(o);
      if (c.kind === 'Pod') {
        delete c.metadata.name;
        delete c.spec.shareProcessNamespace;
        for (const ct of c.spec.containers ?? []) {
          const i = (ct.args ?? []).indexOf('--kind');
          if (i >= 0) ct.args[i + 1] = '<kind>';
          if (canon(ct.command) === canon(K.RUN_COMMAND)) ct.command = [K.CLI];
        }
      }
      return c;
    });
  const mine = norm(t.objects);
  const theirs = norm(refObjects);
  if (mine.length !== theirs.length)
    return [
      `renders ${mine.length} objects, ${refName} ${theirs.length}: it may only differ in name, buffer kind, shareProcessNamespace and gpuipcctl run`,
    ];
  const out = [];
  mine.forEach((o, i) => {
    const d = firstDiff(o, theirs[i]);
    if (d)
      out.push(
        `${ref(t.objects[i])} differs from ${refName} at ${d.replace(/^\./, '')}: ` +
          'only the name, buffer kind, shareProcessNamespace and gpuipcctl run may differ',
      );
  });
  return out;
}

// ---- the sidecar component on users' workloads ---------------------------------------

const labelOf = (o, k) => o.metadata?.labels?.[k];

// An example of k8s/components/gpuipc-sidecar (or gpuipc-metrics): its workloads are there and
// opted in, every pod template of each has the broker (the sidecar check: exactly once, first)
// and, where the component gave one, the exporter's label; a LeaderWorkerSet's leader template
// opted in too. What every container gets (socket, mount, group) is the contract check's.
function componentShape(t) {
  const out = [];
  const workloads = t.objects.filter((o) => t.setup.workloads.includes(o.kind));
  for (const kind of t.setup.workloads)
    if (!workloads.some((o) => o.kind === kind)) out.push(`renders no ${kind}`);
  for (const o of workloads) {
    if (labelOf(o, K.SIDECAR_LABEL) !== 'true')
      out.push(`${ref(o)}: not labelled ${K.SIDECAR_LABEL}: "true", so the component leaves it alone`);
    if (o.kind === 'LeaderWorkerSet' && o.spec?.leaderWorkerTemplate?.leaderTemplate &&
        labelOf(o, K.SIDECAR_LEADER_LABEL) !== 'true')
      out.push(`${ref(o)}: has a leaderTemplate but no ${K.SIDECAR_LEADER_LABEL}: "true": its leader gets no broker`);
  }
  for (const { where, template, spec } of podSpecs(workloads)) {
    const exporter = (spec.initContainers ?? []).some((c) => c.name === K.METRICS_NAME);
    if (exporter && template.metadata?.labels?.[K.EXPORTER_LABEL] !== 'true')
      out.push(`${where}: runs the exporter but lacks the label ${K.EXPORTER_LABEL}: "true" (the NetworkPolicy selects it)`);
    const sc = (spec.initContainers ?? []).find((c) => c.name === K.METRICS_NAME)?.securityContext;
    if (exporter && (sc?.runAsUser !== K.EXPORTER_UID || sc?.runAsNonRoot !== true))
      out.push(`${where}: the component's exporter runs as ${K.EXPORTER_UID}, runAsNonRoot, whatever the pod says`);
  }
  if (t.setup.networkPolicy) out.push(...exporterReachable(t));
  return out;
}

// Whether a LabelSelector (matchLabels, matchExpressions) selects these labels.
function selects(sel, labels = {}) {
  if (!sel) return false;
  for (const [k, v] of Object.entries(sel.matchLabels ?? {})) if (labels[k] !== v) return false;
  for (const e of sel.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, e.key);
    const ok =
      e.operator === 'In' ? has && e.values.includes(labels[e.key])
      : e.operator === 'NotIn' ? !has || !e.values.includes(labels[e.key])
      : e.operator === 'Exists' ? has
      : e.operator === 'DoesNotExist' ? !has
      : false;
    if (!ok) return false;
  }
  return true;
}

// Whether a NetworkPolicy ingress rule lets traffic to the exporter's port through: no ports means
// every port; a named port counts by name.
function rulePortsInclude(rule, port, name) {
  const ports = rule.ports ?? [];
  if (!ports.length) return true;
  return ports.some((p) => {
    if ((p.protocol ?? 'TCP') !== 'TCP') return false;
    if (p.port === undefined) return true;
    if (typeof p.port === 'string') return p.port === name;
    return p.endPort !== undefined ? p.port <= port && port <= p.endPort : p.port === port;
  });
}

// Exactly the monitoring namespace: a peer with that namespaceSelector (a podSelector beside it
// only narrows it). Anything else (ipBlock, podSelector alone: this namespace, an empty or other
// namespaceSelector) lets others in.
function monitoringOnly(peer) {
  const ns = peer.namespaceSelector;
  if (!ns || peer.ipBlock) return false;
  return (
    canon(ns) === canon({ matchLabels: { 'kubernetes.io/metadata.name': K.MONITORING_NAMESPACE } }) ||
    canon(ns) ===
      canon({ matchExpressions: [{ key: 'kubernetes.io/metadata.name', operator: 'In', values: [K.MONITORING_NAMESPACE] }] })
  );
}

// Every pod with an exporter is selected by an Ingress NetworkPolicy of its namespace, and no
// policy that selects it lets anyone but the monitoring namespace reach port METRICS_PORT.
function exporterReachable(t) {
  const out = [];
  const policies = t.objects.filter((o) => o.kind === 'NetworkPolicy');
  for (const { obj, where, template, spec } of podSpecs(t.objects)) {
    if (!(spec.initContainers ?? []).some((c) => c.name === K.METRICS_NAME)) continue;
    const mine = policies.filter(
      (p) =>
        p.metadata.namespace === obj.metadata.namespace &&
        selects(p.spec?.podSelector, template.metadata?.labels) &&
        (p.spec.policyTypes ?? ['Ingress']).includes('Ingress'),
    );
    if (!mine.length) {
      out.push(`${where}: no NetworkPolicy selects it for Ingress: the exporter's port ${K.METRICS_PORT} is open to every pod`);
      continue;
    }
    for (const p of mine) {
      (p.spec.ingress ?? []).forEach((rule, i) => {
        if (!rulePortsInclude(rule, K.METRICS_PORT, 'metrics')) return;
        const from = rule.from ?? [];
        if (!from.length || !from.every(monitoringOnly))
          out.push(
            `${ref(p)} ingress[${i}]: lets more than the ${K.MONITORING_NAMESPACE} namespace reach the exporter port ${K.METRICS_PORT} of ${where}`,
          );
      });
    }
  }
  return out;
}

// ---- the exporter sidecar ------------------------------------------------------

// Every pod that runs a broker runs the exporter next to it, reachable for
// both ways Prometheus finds pods.
function metrics(t) {
  const out = [];
  for (const { where, template, spec } of podSpecs(t.objects)) {
    const all = containers(spec);
    const broker = all.find(({ c }) => isBroker(c));
    if (!broker) continue;
    const exporters = all.filter(({ c }) => c.name === K.METRICS_NAME);
    if (t.setup.exporter === false) {
      if (exporters.length) out.push(`${where}: this setup runs no ${K.METRICS_NAME} (gpuipc-sidecar without gpuipc-metrics)`);
      continue;
    }
    if (exporters.length !== 1) {
      out.push(`${where}: runs a broker, so it needs one ${K.METRICS_NAME} container (found ${exporters.length})`);
      continue;
    }
    const [{ c, list, index, label }] = exporters;
    const at = `${where} ${label}`;
    if (canon(c.command) !== canon([K.CLI]) || canon(c.args) !== canon(K.METRICS_ARGS))
      out.push(`${at}: must run ${K.CLI} ${K.METRICS_ARGS.join(' ')}`);
    if (list !== broker.list) out.push(`${at}: must sit next to the broker (in ${broker.list})`);
    else if (index <= broker.index) out.push(`${at}: must come after the broker`);
    if (list === 'initContainers' && c.restartPolicy !== 'Always')
      out.push(`${at}: restartPolicy must be Always (a native sidecar)`);
    const port = (c.ports ?? []).find((p) => p.containerPort === K.METRICS_PORT);
    if (!port || port.name !== 'metrics') out.push(`${at}: needs containerPort ${K.METRICS_PORT} named metrics`);
    const probe = c.readinessProbe?.httpGet;
    if (probe?.path !== '/healthz' || (probe?.port !== 'metrics' && probe?.port !== K.METRICS_PORT))
      out.push(`${at}: readinessProbe must GET /healthz on the metrics port`);
    if (c.livenessProbe) out.push(`${at}: no livenessProbe (a restart recreates a gang; the broker is unaffected anyway)`);
    for (const [k, v] of Object.entries(K.METRICS_ANNOTATIONS)) {
      if (template.metadata?.annotations?.[k] !== v)
        out.push(`${where}: annotation ${k} must be "${v}" (Prometheus' pod discovery)`);
    }
  }
  return out;
}

// ---- who the apps are -----------------------------------------------------------

// No container but the broker runs as the broker's uid: a process of that uid
// could reach into the broker (pidfd_getfd, ptrace) and take every fd it holds.
function identity(t) {
  const out = [];
  for (const { where, spec } of podSpecs(t.objects)) {
    for (const { c, label } of containers(spec)) {
      if (!isBroker(c) && eff(spec, c, 'runAsUser') === K.UID)
        out.push(`${where} ${label}: runs as the broker's uid ${K.UID}; apps use their own uid and reach the socket through group ${K.GID}`);
    }
  }
  return out;
}

// ---- how the apps end ------------------------------------------------------------

const consumersOf = (specs) => specs.flatMap(({ spec }) => appsOf(spec)).filter((c) => appRole(c) === 'attach');

// A pipeline ends when its source's num-buffers run out: the sink sends the end
// of the stream, each gpuipcsrc takes it and leaves, and the sink lingers until
// they have. Frames published before a consumer joined are lost to it, so the
// sink waits for all of them; a consumer that reconnects never ends.
function gstLifecycle(at, c, consumers) {
  const out = [];
  if (appRole(c) === 'publish') {
    const n = Number(gstProperty(c, 'num-buffers'));
    if (!(Number.isInteger(n) && n > 0)) out.push(`${at}: never ends: its source needs num-buffers=N (N > 0)`);
    if (gstProperty(c, 'wait-members') !== String(consumers.length))
      out.push(`${at}: gpuipcsink must wait-members=${consumers.length} (one per consumer), or early frames are lost`);
  } else if (gstProperty(c, 'reconnect') === 'true') {
    out.push(`${at}: never ends (reconnect=true waits for the next producer)`);
  }
  return out;
}

// Demo pods end: the producer retires after one attach per consumer and exits
// once drained, every consumer exits after verifying, and the pod does not
// restart them. The gang is a service: nothing there may end on its own (LWS
// restarts it, and a restart recreates the whole group).
function lifecycle(t) {
  const out = [];
  const specs = podSpecs(t.objects).filter(({ spec }) => appsOf(spec).length);
  const groups = t.setup.nodeBroker ? [specs] : specs.map((s) => [s]);
  for (const g of groups) {
    const consumers = consumersOf(g);
    for (const { where, spec } of g) {
      for (const c of appsOf(spec)) {
        const at = `${where} ${c.name}`;
        if (isGstLaunch(c)) {
          // A service's pipelines run until stopped.
          if (!t.setup.service) out.push(...gstLifecycle(at, c, consumers));
          continue;
        }
        const retire = flagValue(c, '--retire-after');
        const hold = flagValue(c, '--hold');
        if (t.setup.service) {
          if (appRole(c) === 'publish' && retire !== undefined)
            out.push(`${at}: a service's producer holds until stopped (no --retire-after)`);
          if (appRole(c) === 'attach' && hold !== '-1')
            out.push(`${at}: a service's consumer must hold until stopped (--hold -1), or it exits and the group is recreated`);
          continue;
        }
        if (appRole(c) === 'publish' && retire !== String(consumers.length))
          out.push(`${at}: never ends: --retire-after must be ${consumers.length} (one attach per consumer), is ${retire}`);
        if (appRole(c) === 'attach' && hold === '-1') out.push(`${at}: never ends (--hold -1)`);
      }
      if (!t.setup.service && spec.restartPolicy !== 'Never')
        out.push(`${where}: restartPolicy must be Never: the demo runs once and the pod completes`);
    }
  }
  return out;
}

// Name -> check, in the order they are reported.
export const CHECKS = {
  'schema types': schemaTypes,
  'unknown fields': schemaFields,
  scope: scope,
  'namespace security': namespaceSecurity,
  'pod security': podSecurity,
  'broker sidecar': sidecar,
  'broker drift': brokerDrift,
  resources: resources,
  'seccomp profile': seccompProfile,
  contract: contract,
  dra: dra,
  setup: setupShape,
  metrics: metrics,
  identity: identity,
  lifecycle: lifecycle,
};
