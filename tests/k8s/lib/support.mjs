// Checks for the kustomizations that prepare a cluster rather than run gpuipc
// (contract.mjs SUPPORT): the node installer, the Security Profiles Operator
// profile and the PodMonitors. Same interface as rules.mjs: each check takes a
// rendered target { name, setup, objects } and a context { refs, profiles,
// root } and returns a list of problems.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as K from './contract.mjs';
import { canon, containers, podSpecs, ref } from './objects.mjs';
import { CHECKS } from './rules.mjs';

const text = (c) => [...(c.command ?? []), ...(c.args ?? [])].join(' ');

// ---- node-setup ------------------------------------------------------------------

function nodeSetup(t) {
  const out = [];
  const ds = t.objects.filter((o) => o.kind === 'DaemonSet');
  if (ds.length !== 1) return [`expected one DaemonSet, found ${ds.length}`];
  const [{ spec }] = podSpecs(ds);
  const where = ref(ds[0]);
  const ns = t.objects.find((o) => o.kind === 'Namespace' && o.metadata.name === ds[0].metadata.namespace);
  for (const mode of ['warn', 'audit']) {
    if (ns?.metadata.labels?.[`pod-security.kubernetes.io/${mode}`] !== 'restricted')
      out.push(`Namespace/${ds[0].metadata.namespace}: pod-security ${mode} must be restricted (report every deviation)`);
  }
  // Exactly the two host directories, each mounted where one init container writes.
  const paths = (spec.volumes ?? []).map((v) => v.hostPath?.path ?? `${v.name} (not a hostPath)`).sort();
  if (canon(paths) !== canon([K.SOCKET_DIR, K.SECCOMP_ROOT].sort()))
    out.push(`${where}: its volumes must be the hostPaths ${K.SECCOMP_ROOT} and ${K.SOCKET_DIR}, are ${paths.join(', ')}`);
  if (spec.hostPID || spec.hostIPC || spec.hostNetwork) out.push(`${where}: no host namespaces`);
  const mountOf = (c, path) => {
    const vol = (spec.volumes ?? []).find((v) => v.hostPath?.path === path);
    return (c.volumeMounts ?? []).find((m) => m.name === vol?.name)?.mountPath;
  };
  const init = spec.initContainers ?? [];
  const installer = init.find((c) => mountOf(c, K.SECCOMP_ROOT));
  const target = installer && `${mountOf(installer, K.SECCOMP_ROOT)}/${K.LOCALHOST_PROFILE}`;
  if (!installer || !text(installer).includes(K.IMAGE_PROFILE) || !text(installer).includes(target))
    out.push(`${where}: an init container must copy the image's ${K.IMAGE_PROFILE} to <seccomp root>/${K.LOCALHOST_PROFILE}`);
  const dirs = init.find((c) => mountOf(c, K.SOCKET_DIR));
  const dir = dirs && mountOf(dirs, K.SOCKET_DIR);
  if (!dirs || !text(dirs).includes(`chmod 0750 ${dir}`) || !text(dirs).includes(`chown ${K.UID}:${K.GID} ${dir}`))
    out.push(`${where}: an init container must make ${K.SOCKET_DIR} mode 0750, owned ${K.UID}:${K.GID}`);
  for (const { c, list, label } of containers(spec)) {
    const at = `${where} ${label}`;
    const sc = c.securityContext ?? {};
    if (c.image !== K.IMAGE) out.push(`${at}: image must be ${K.IMAGE} (its profile matches its broker)`);
    if (sc.privileged) out.push(`${at}: privileged is forbidden`);
    if (sc.allowPrivilegeEscalation !== false) out.push(`${at}: allowPrivilegeEscalation must be false`);
    if (sc.readOnlyRootFilesystem !== true) out.push(`${at}: readOnlyRootFilesystem must be true`);
    if (!(sc.capabilities?.drop ?? []).includes('ALL')) out.push(`${at}: capabilities.drop must contain ALL`);
    const extra = (sc.capabilities?.add ?? []).filter((x) => !['CHOWN', 'FOWNER'].includes(x));
    if (extra.length) out.push(`${at}: adds ${extra.join(', ')}: only CHOWN and FOWNER are needed`);
    const uid = sc.runAsUser ?? spec.securityContext?.runAsUser;
    if (list !== 'initContainers' && (uid === 0 || uid === undefined || sc.runAsNonRoot !== true))
      out.push(`${at}: only the init containers may run as root`);
    const type = (sc.seccompProfile ?? spec.securityContext?.seccompProfile)?.type;
    if (type !== 'RuntimeDefault') out.push(`${at}: seccompProfile must be RuntimeDefault, is ${type}`);
  }
  return out;
}

// ---- seccomp-operator ----------------------------------------------------------------

// The SeccompProfile's rules must be the shipped JSON profile's, less the
// defaultErrnoRet SPO has no field for (EPERM, what runtimes answer anyway).
function seccompOperator(t, ctx) {
  const sp = t.objects.filter((o) => o.kind === 'SeccompProfile');
  if (sp.length !== 1) return [`expected one SeccompProfile, found ${sp.length}`];
  const [o] = sp;
  const out = [];
  if (o.apiVersion !== 'security-profiles-operator.x-k8s.io/v1')
    out.push(`${ref(o)}: apiVersion must be security-profiles-operator.x-k8s.io/v1 (cluster-scoped)`);
  if (o.metadata.name !== K.PROFILE_FILE.replace(/\.json$/, ''))
    out.push(`${ref(o)}: must be named ${K.PROFILE_FILE.replace(/\.json$/, '')}: SPO names the file after it`);
  const json = JSON.parse(readFileSync(join(ctx.root, 'seccomp', K.PROFILE_FILE), 'utf8'));
  const { defaultErrnoRet, ...rules } = json;
  if (defaultErrnoRet !== undefined && defaultErrnoRet !== 1)
    out.push(`seccomp/${K.PROFILE_FILE}: defaultErrnoRet ${defaultErrnoRet} cannot be expressed in SPO`);
  if (canon(o.spec) !== canon(rules))
    out.push(`${ref(o)}: spec differs from seccomp/${K.PROFILE_FILE} (run ninja -C <build> update-seccomp-spo)`);
  return out;
}

// ---- monitoring ------------------------------------------------------------------------

// Every pod that runs the exporter is selected by a PodMonitor in its
// namespace, on its `metrics` port and /metrics.
function monitoring(t, ctx) {
  const out = [];
  const monitors = t.objects.filter((o) => o.kind === 'PodMonitor');
  if (!monitors.length) return ['no PodMonitor rendered'];
  for (const m of monitors) {
    if (m.apiVersion !== 'monitoring.coreos.com/v1') out.push(`${ref(m)}: apiVersion must be monitoring.coreos.com/v1`);
    const eps = m.spec?.podMetricsEndpoints ?? [];
    if (!eps.some((e) => e.port === 'metrics' && e.path === '/metrics'))
      out.push(`${ref(m)}: needs a podMetricsEndpoint on port metrics, path /metrics`);
  }
  for (const m of monitors) {
    if (m.metadata.labels?.release !== K.PODMONITOR_RELEASE)
      out.push(`${ref(m)}: needs the label release: ${K.PODMONITOR_RELEASE}, which kube-prometheus-stack's default selector matches`);
  }
  // A PodMonitor looks in its own namespace unless its namespaceSelector says otherwise.
  const looksIn = (m, ns) =>
    m.spec?.namespaceSelector?.any === true ||
    (m.spec?.namespaceSelector?.matchNames ?? [m.metadata.namespace]).includes(ns);
  const selects = (m, obj, template) =>
    looksIn(m, obj.metadata.namespace) &&
    Object.entries(m.spec?.selector?.matchLabels ?? {}).every(([k, v]) => template.metadata?.labels?.[k] === v);
  for (const [setup, objects] of Object.entries(ctx.refs)) {
    for (const { obj, where, template, spec } of podSpecs(objects)) {
      if (!containers(spec).some(({ c }) => c.name === K.METRICS_NAME)) continue;
      if (!monitors.some((m) => selects(m, obj, template)))
        out.push(`${setup}: ${where} runs the exporter but no PodMonitor selects it`);
    }
  }
  return out;
}

// ---- grafana ---------------------------------------------------------------------------

// One ConfigMap for Grafana's dashboard sidecar: its label, and the dashboard file byte for byte.
function grafana(t, ctx) {
  const out = [];
  const maps = t.objects.filter((o) => o.kind === 'ConfigMap');
  if (maps.length !== 1) return [`expected one ConfigMap, found ${maps.length}`];
  const [key, value] = K.GRAFANA_LABEL;
  const cm = maps[0];
  if (cm.metadata.labels?.[key] !== value)
    out.push(`${ref(cm)}: needs the label ${key}: "${value}" for Grafana's dashboard sidecar`);
  if (/-[a-z0-9]{10}$/.test(cm.metadata.name))
    out.push(`${ref(cm)}: a hash suffix would leave a stale dashboard behind at every change`);
  const file = readFileSync(join(ctx.root, K.DASHBOARD_FILE), 'utf8');
  const data = Object.values(cm.data ?? {});
  if (data.length !== 1 || data[0] !== file) out.push(`${ref(cm)}: its data is not ${K.DASHBOARD_FILE}`);
  return out;
}

const base = (names) => Object.fromEntries(names.map((n) => [n, CHECKS[n]]));

// Support kustomization -> { check name -> check }, reported in this order.
export const SUPPORT_CHECKS = {
  'node-setup': { ...base(['schema types', 'unknown fields', 'scope', 'resources']), 'node setup': nodeSetup },
  'seccomp-operator': { ...base(['schema types', 'unknown fields', 'scope']), profile: seccompOperator },
  monitoring: { ...base(['schema types', 'unknown fields']), 'pod monitors': monitoring },
  // (no scope check: the ConfigMap goes to Grafana's namespace, which gpuipc does not define)
  grafana: { ...base(['schema types', 'unknown fields']), 'dashboard configmap': grafana },
};
