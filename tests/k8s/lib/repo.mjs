// Checks on files next to the manifests that must agree with them: the
// shipped seccomp profile, the Dockerfile, .dockerignore and k8s/README.md.
// Each returns a list of problems (empty = pass), or null = not applicable.

import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as K from './contract.mjs';
import { canon } from './objects.mjs';

// The profiles shipped in seccomp/ (basenames), or null when there are none.
export function shippedProfiles(root) {
  const dir = join(root, 'seccomp');
  const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.json')) : [];
  return files.length ? new Set(files) : null;
}

// Keys of an OCI `linux.seccomp` object. containerd unmarshals the Localhost
// file straight into that struct and silently drops anything else, so
// Docker-only keys (archMap, includes, excludes) would just not apply.
const OCI_KEYS = [
  'defaultAction',
  'defaultErrnoRet',
  'architectures',
  'flags',
  'listenerPath',
  'listenerMetadata',
  'syscalls',
];
const OCI_RULE_KEYS = ['names', 'action', 'errnoRet', 'args'];

export function seccompShipped(root) {
  const path = join(root, 'seccomp', K.PROFILE_FILE);
  if (!existsSync(path))
    return [
      `seccomp/${K.PROFILE_FILE} is missing: pods name ${K.LOCALHOST_PROFILE}, and a pod whose Localhost profile is not on the node does not start`,
    ];
  let p;
  try {
    p = JSON.parse(readFileSync(path, 'utf8'));
  } catch (e) {
    return [`seccomp/${K.PROFILE_FILE}: not JSON: ${e.message}`];
  }
  const out = [];
  for (const k of Object.keys(p).filter((k) => !OCI_KEYS.includes(k)))
    out.push(`seccomp/${K.PROFILE_FILE}: key ${k} is not OCI (runtimes would ignore it)`);
  if (typeof p.defaultAction !== 'string') out.push(`seccomp/${K.PROFILE_FILE}: needs defaultAction`);
  if (!Array.isArray(p.syscalls) || !p.syscalls.length)
    return [...out, `seccomp/${K.PROFILE_FILE}: needs a syscalls list`];
  p.syscalls.forEach((r, i) => {
    for (const k of Object.keys(r).filter((k) => !OCI_RULE_KEYS.includes(k)))
      out.push(`seccomp/${K.PROFILE_FILE}: syscalls[${i}].${k} is not OCI`);
    if (!Array.isArray(r.names) || typeof r.action !== 'string')
      out.push(`seccomp/${K.PROFILE_FILE}: syscalls[${i}] needs names and action`);
  });
  // With allowPrivilegeEscalation false the runtime loads the filter
  // just before exec'ing the entrypoint.
  const allowed = p.syscalls
    .filter((r) => r.action === 'SCMP_ACT_ALLOW' && !r.args?.length)
    .flatMap((r) => r.names ?? []);
  if (p.defaultAction !== 'SCMP_ACT_ALLOW' && !allowed.includes('execve'))
    out.push(`seccomp/${K.PROFILE_FILE}: must allow execve (the runtime loads the filter before exec)`);
  return out;
}

// Dockerfile instructions with continuations joined: [{ op, arg, stage }].
function dockerfile(text) {
  const out = [];
  let stage = -1;
  for (const line of text.replace(/\\\n/g, ' ').split('\n')) {
    const m = /^\s*([A-Za-z]+)\s+(.*)$/.exec(line);
    if (!m || line.trim().startsWith('#')) continue;
    const op = m[1].toUpperCase();
    if (op === 'FROM') stage++;
    out.push({ op, arg: m[2].trim(), stage });
  }
  return out;
}

export function dockerfileMatches(root) {
  const path = join(root, 'Dockerfile');
  if (!existsSync(path)) return ['Dockerfile is missing'];
  const ins = dockerfile(readFileSync(path, 'utf8'));
  const last = Math.max(...ins.map((i) => i.stage));
  const final = ins.filter((i) => i.stage === last);
  const get = (op) => final.filter((i) => i.op === op).at(-1)?.arg;
  const json = (s) => {
    try {
      return JSON.parse(s);
    } catch {
      return null;
    }
  };
  const out = [];
  if (last < 1) out.push('Dockerfile: expected a multi-stage build (build stage + runtime stage)');
  const build = ins
    .filter((i) => i.stage < last && i.op === 'RUN')
    .map((i) => i.arg)
    .join('\n');
  if (!/meson setup\b.*(-D|--)prefix=\/usr/.test(build) || !/meson install/.test(build))
    out.push('Dockerfile: the build stage must run meson setup -Dprefix=/usr and meson install');
  const user = get('USER');
  if (!user || !new RegExp(`^${K.UID}(:${K.GID})?$`).test(user))
    out.push(`Dockerfile: final USER must be ${K.UID}:${K.GID} (numeric, as runAsUser), is ${user}`);
  if (canon(json(get('ENTRYPOINT'))) !== canon([K.BROKER_BIN]))
    out.push(`Dockerfile: ENTRYPOINT must be ["${K.BROKER_BIN}"] (manifests only set args)`);
  if (canon(json(get('CMD'))) !== canon(K.BROKER_ARGS))
    out.push(`Dockerfile: CMD must be the default broker args ${JSON.stringify(K.BROKER_ARGS)}`);
  const env = final
    .filter((i) => i.op === 'ENV')
    .map((i) => i.arg)
    .join(' ');
  if (!env.includes(`${K.SOCKET_ENV}=${K.SOCKET}`))
    out.push(`Dockerfile: runtime stage must set ENV ${K.SOCKET_ENV}=${K.SOCKET}`);
  return out;
}

export function dockerignore(root) {
  const path = join(root, '.dockerignore');
  if (!existsSync(path))
    return ['.dockerignore is missing (the build context would carry node_modules and build trees)'];
  const lines = readFileSync(path, 'utf8')
    .split('\n')
    .map((l) => l.trim());
  return ['.git', 'tests/k8s/node_modules']
    .filter((p) => !lines.some((l) => l.replace(/^\/|\/$/g, '') === p))
    .map((p) => `.dockerignore: should exclude ${p}`);
}

// The project version in the root meson.build must be the image tag.
export function mesonVersion(root) {
  const path = join(root, 'meson.build');
  const m = existsSync(path) && /project\([^)]*?version\s*:\s*'([^']+)'/s.exec(readFileSync(path, 'utf8'));
  if (!m) return null;
  return m[1] === K.IMAGE_VERSION ? [] : [`meson.build version ${m[1]} but the manifests use ${K.IMAGE}`];
}

export function readme(root) {
  const path = join(root, 'k8s', 'README.md');
  if (!existsSync(path)) return ['k8s/README.md is missing'];
  const text = readFileSync(path, 'utf8');
  const need = [...Object.keys(K.SETUPS), 'measured', 'k8s/components/gpuipc-sidecar', 'k8s/components/gpuipc-metrics',
    'k8s/components/gpuipc-metrics-networkpolicy', K.SIDECAR_LABEL, K.SIDECAR_LEADER_LABEL, 'documented', K.LOCALHOST_PROFILE, 'hostPath',
    `release: ${K.PODMONITOR_RELEASE}`, 'k8s/components/kubernetes-1.33', K.GRAFANA_LABEL[0],
    ...K.SUPPORTED_MINORS.map((m) => `| ${m} |`)];
  return need.filter((w) => !text.includes(w)).map((w) => `k8s/README.md does not mention ${w}`);
}

// Every kustomization under k8s/overlays and k8s/examples must be a known setup, and back.
export function overlaysCovered(root) {
  const found = ['overlays', 'examples'].flatMap((top) => {
    const dir = join(root, 'k8s', top);
    return existsSync(dir)
      ? readdirSync(dir)
          .filter((d) => existsSync(join(dir, d, 'kustomization.yaml')))
          .map((d) => `k8s/${top}/${d}`)
      : [];
  });
  const known = Object.values(K.SETUPS).map((s) => s.dir);
  const out = found
    .filter((d) => !known.includes(d))
    .map((d) => `${d} is not validated: add it to SETUPS in tests/k8s/lib/contract.mjs`);
  for (const s of known.filter((d) => !existsSync(join(root, d, 'kustomization.yaml'))))
    out.push(`${s}/kustomization.yaml is missing`);
  return out;
}
