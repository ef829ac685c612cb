// What the sidecar components (k8s/components/gpuipc-sidecar, gpuipc-metrics) do to workloads
// unlike the examples': one that already has a broker, init containers and env of a workload's
// own, a workload without the label, a LeaderWorkerSet without a leader template, and the
// component listed twice. Each case is a kustomization under tests/k8s/components/; its check
// takes the rendering ({ objects } or { error }) and returns a list of problems.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import YAML from 'yaml';
import * as K from './contract.mjs';
import { canon, podSpecs, ref } from './objects.mjs';

// The component's own broker and app-side fields, from its values file (what it must put in).
function values(root) {
  const doc = YAML.parse(readFileSync(join(root, 'k8s/components/gpuipc-sidecar/values.yaml'), 'utf8'));
  return { broker: doc.broker, volume: doc.volume, env: doc.env, mount: doc.volumeMount };
}

const named = (list, name) => (list ?? []).filter((x) => x.name === name);

// Every pod template of o carries the broker once (the component's, first), the socket volume
// once, and in every regular container GPUIPC_SOCKET and the read-only mount once each.
function injected(o, v, { exporter }) {
  const out = [];
  for (const { where, spec, template } of podSpecs([o])) {
    const init = spec.initContainers ?? [];
    const brokers = named(init, K.BROKER_NAME);
    if (brokers.length !== 1) out.push(`${where}: ${brokers.length} brokers, expected 1`);
    else if (canon(brokers[0]) !== canon(v.broker)) out.push(`${where}: the broker is not the component's`);
    if (init[0]?.name !== K.BROKER_NAME) out.push(`${where}: initContainers[0] is ${init[0]?.name}, not the broker`);
    const exporters = named(init, K.METRICS_NAME);
    if (exporters.length !== (exporter ? 1 : 0)) out.push(`${where}: ${exporters.length} exporters, expected ${exporter ? 1 : 0}`);
    if (exporter && init[1]?.name !== K.METRICS_NAME) out.push(`${where}: initContainers[1] is ${init[1]?.name}, not the exporter`);
    if (exporter && template.metadata?.labels?.[K.EXPORTER_LABEL] !== 'true') out.push(`${where}: no ${K.EXPORTER_LABEL} label`);
    const vols = named(spec.volumes, v.volume.name);
    if (vols.length !== 1 || canon(vols[0]) !== canon(v.volume)) out.push(`${where}: the socket volume is not the component's, once`);
    if (spec.securityContext?.fsGroup !== K.GID) out.push(`${where}: fsGroup is not ${K.GID}`);
    for (const c of spec.containers ?? []) {
      const env = named(c.env, v.env.name);
      if (env.length !== 1 || canon(env[0]) !== canon(v.env)) out.push(`${where} ${c.name}: ${v.env.name} is not ${v.env.value}, once`);
      const mounts = named(c.volumeMounts, v.mount.name);
      if (mounts.length !== 1 || canon(mounts[0]) !== canon(v.mount)) out.push(`${where} ${c.name}: the socket mount is not read-only at ${v.mount.mountPath}, once`);
    }
  }
  return out;
}

const find = (objects, kind, name) => objects.find((o) => o.kind === kind && o.metadata.name === name);

export const COMPONENT_CASES = {
  'already-has-broker': {
    what: 'a workload with a broker of its own gets the component\'s, once, and keeps its other env',
    check(r, root) {
      if (r.error) return [r.error];
      const o = find(r.objects, 'Deployment', 'has-broker');
      if (!o) return ['Deployment/has-broker not rendered'];
      const out = injected(o, values(root), { exporter: false });
      const app = o.spec.template.spec.containers[0];
      if (!named(app.env, 'OTHER').length) out.push('the app lost its env OTHER');
      return out;
    },
  },
  'init-containers-and-opt-in': {
    what: 'labelled Deployment and StatefulSet get broker and exporter before their own init containers; the unlabelled one nothing',
    check(r, root) {
      if (r.error) return [r.error];
      const v = values(root);
      const out = [];
      const d = find(r.objects, 'Deployment', 'labelled');
      const s = find(r.objects, 'StatefulSet', 'labelled-sts');
      const u = find(r.objects, 'Deployment', 'unlabelled');
      if (!d || !s || !u) return ['a workload was not rendered'];
      out.push(...injected(d, v, { exporter: true }), ...injected(s, v, { exporter: true }));
      const spec = d.spec.template.spec;
      if (canon(spec.initContainers.map((c) => c.name)) !== canon([K.BROKER_NAME, K.METRICS_NAME, 'fetch-model']))
        out.push(`${ref(d)}: init containers ${spec.initContainers.map((c) => c.name).join(', ')}`);
      const fetch = named(spec.initContainers, 'fetch-model')[0];
      if (fetch?.env || fetch?.volumeMounts) out.push(`${ref(d)}: the workload's own init container was changed`);
      const server = named(spec.containers, 'server')[0];
      if (!named(server?.env, 'MODEL').length || !named(server?.volumeMounts, 'models').length)
        out.push(`${ref(d)}: the server lost its own env or mounts`);
      if (!named(spec.volumes, 'models').length) out.push(`${ref(d)}: its own volume is gone`);
      const t = u.spec.template;
      if (t.spec.initContainers || t.spec.volumes || t.spec.securityContext || t.spec.containers[0].env ||
          t.spec.containers[0].volumeMounts || t.metadata.annotations)
        out.push(`${ref(u)}: not labelled, but changed`);
      return out;
    },
  },
  'lws-without-leader': {
    what: 'a LeaderWorkerSet without a leader template: workers get it, no leader template appears',
    check(r, root) {
      if (r.error) return [r.error];
      const o = find(r.objects, 'LeaderWorkerSet', 'workers-only');
      if (!o) return ['LeaderWorkerSet/workers-only not rendered'];
      const out = injected(o, values(root), { exporter: true });
      if (o.spec.leaderWorkerTemplate.leaderTemplate) out.push(`${ref(o)}: a leaderTemplate appeared`);
      const init = o.spec.leaderWorkerTemplate.workerTemplate.spec.initContainers.map((c) => c.name);
      if (canon(init) !== canon([K.BROKER_NAME, K.METRICS_NAME, 'fetch-model']))
        out.push(`${ref(o)}: worker init containers ${init.join(', ')} (kustomize replaced the list?)`);
      return out;
    },
  },
  'listed-twice': {
    what: 'both components listed: kustomize refuses, no second broker',
    check(r) {
      if (!r.error) return ['rendered: expected kustomize to refuse the second copy of the component'];
      return r.error.includes('already registered id') ? [] : [`refused for another reason: ${r.error}`];
    },
  },
};
