// Rendering kustomizations and walking what they produce: every object, every
// pod spec embedded in it, every container of a pod spec.

import { execFileSync } from 'node:child_process';
import YAML from 'yaml';
import { BROKER_NAME, CLI, GST_LAUNCH } from './contract.mjs';

// Renders a kustomization directory with `kubectl kustomize`.
// Returns { objects } or { error } (kustomize's message).
export function render(dir) {
  let text;
  try {
    text = execFileSync(process.env.KUBECTL || 'kubectl', ['kustomize', dir], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
    });
  } catch (e) {
    return { error: String(e.stderr || e.message).trim() };
  }
  const docs = YAML.parseAllDocuments(text);
  const bad = docs.find((d) => d.errors.length);
  if (bad) return { error: `YAML: ${bad.errors[0].message}` };
  return { objects: docs.map((d) => d.toJS()).filter((o) => o) };
}

export const ref = (o) => `${o.kind}/${o.metadata?.name}`;

// Pod templates inside workload objects: [path to the template, template].
// A Pod is its own template.
function templatesOf(o) {
  const s = o.spec ?? {};
  switch (o.kind) {
    case 'Pod':
      return [['', o]];
    case 'DaemonSet':
    case 'Deployment':
    case 'StatefulSet':
    case 'ReplicaSet':
    case 'Job':
      return [['spec.template', s.template]];
    case 'CronJob':
      return [['spec.jobTemplate.spec.template', s.jobTemplate?.spec?.template]];
    case 'LeaderWorkerSet': {
      const lwt = s.leaderWorkerTemplate ?? {};
      const out = [['spec.leaderWorkerTemplate.workerTemplate', lwt.workerTemplate]];
      if (lwt.leaderTemplate) out.push(['spec.leaderWorkerTemplate.leaderTemplate', lwt.leaderTemplate]);
      return out;
    }
    default:
      return [];
  }
}

// Every pod spec in the objects: { obj, where, template, spec }.
export function podSpecs(objects) {
  const out = [];
  for (const obj of objects) {
    for (const [path, t] of templatesOf(obj)) {
      if (t?.spec)
        out.push({ obj, where: path ? `${ref(obj)} ${path}` : ref(obj), template: t, spec: t.spec });
    }
  }
  return out;
}

// Every container of a pod spec: { c, list, index, label }.
export function containers(spec) {
  const out = [];
  for (const list of ['initContainers', 'containers', 'ephemeralContainers']) {
    (spec[list] ?? []).forEach((c, index) =>
      out.push({ c, list, index, label: `${list}[${index}] ${c.name}` }),
    );
  }
  return out;
}

export const isBroker = (c) => c.name === BROKER_NAME;

// The words of an app's gpuipcctl command line from the gpuipcctl that does
// the work on: under `gpuipcctl run [OPTIONS] -- gpuipcctl ...`, the inner one.
// Empty when the container runs no gpuipcctl.
function cliArgv(c) {
  const argv = [...(c.command ?? []), ...(c.args ?? [])];
  const isCli = (a) => a === CLI || a.endsWith(`/${CLI}`);
  let i = argv.findIndex(isCli);
  while (i >= 0 && argv[i + 1] === 'run') {
    const dashes = argv.indexOf('--', i + 2);
    i = dashes >= 0 && isCli(argv[dashes + 1] ?? '') ? dashes + 1 : -1;
  }
  return i < 0 ? [] : argv.slice(i);
}

// Whether c runs its gpuipcctl under `gpuipcctl run`.
export function runWrapped(c) {
  const argv = [...(c.command ?? []), ...(c.args ?? [])];
  const i = argv.findIndex((a) => a === CLI || a.endsWith(`/${CLI}`));
  return i >= 0 && argv[i + 1] === 'run';
}

// The gpuipcctl subcommand an app container runs ('publish', 'attach', ...),
// or null for anything else.
export function cliVerb(c) {
  return cliArgv(c)[1] ?? null;
}

// The buffer name a gpuipcctl publish or attach names: its operand, the word after the verb
// (`gpuipcctl attach NAME`), or the value of the deprecated --name.
export function cliName(c) {
  const argv = cliArgv(c);
  if (argv[2] !== undefined && !argv[2].startsWith('-')) return argv[2];
  return flagValue(c, '--name');
}

// Whether c runs a gst-launch-1.0 pipeline.
export const isGstLaunch = (c) => canon(c.command) === canon([GST_LAUNCH]);

// What an app container does with a buffer or ring: 'publish' (gpuipcctl
// publish, or a pipeline into gpuipcsink), 'attach' (gpuipcctl attach, or a
// pipeline from gpuipcsrc), or null.
export function appRole(c) {
  if (!isGstLaunch(c)) return cliVerb(c);
  const args = c.args ?? [];
  if (args.includes('gpuipcsink')) return 'publish';
  if (args.includes('gpuipcsrc')) return 'attach';
  return null;
}

// A pipeline's element property (NAME=VALUE among the args), or undefined.
export function gstProperty(c, name) {
  const a = (c.args ?? []).find((x) => x.startsWith(`${name}=`));
  return a?.slice(name.length + 1);
}

// The name a producer publishes or a consumer attaches: gpuipcctl's NAME
// operand (cliName), a pipeline's ring=.
export const appName = (c) => (isGstLaunch(c) ? gstProperty(c, 'ring') : cliName(c));

// The value following a flag in a container's args, or undefined.
export function flagValue(c, flag) {
  const args = c.args ?? [];
  const i = args.indexOf(flag);
  return i < 0 ? undefined : args[i + 1];
}

// JSON with sorted keys, for deep comparisons.
export function canon(v) {
  if (Array.isArray(v)) return `[${v.map(canon).join(',')}]`;
  if (v && typeof v === 'object')
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canon(v[k])}`)
      .join(',')}}`;
  return JSON.stringify(v);
}

// The first path at which a and b differ, or null when they are equal.
export function firstDiff(a, b, path = '') {
  if (canon(a) === canon(b)) return null;
  if (a && b && typeof a === 'object' && typeof b === 'object' && Array.isArray(a) === Array.isArray(b)) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of [...keys].sort()) {
      const d = firstDiff(a[k], b[k], Array.isArray(a) ? `${path}[${k}]` : `${path}.${k}`);
      if (d) return d;
    }
  }
  return path || '.';
}
