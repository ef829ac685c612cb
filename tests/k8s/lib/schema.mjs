// Schema checks. Two sources, because each misses what the other catches:
//  - kubernetes-models (ajv over the Kubernetes OpenAPI): types and required
//    fields, but it accepts unknown (misspelled) keys;
//  - @kubernetes/client-node's generated models: their attributeTypeMap lists
//    every field a type has, so walking it rejects unknown keys.
// CRDs have neither: LeaderWorkerSet gets a hand-written shape here, and its
// embedded pod templates go through both core checks.

import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { ref } from './objects.mjs';

const HERE = dirname(dirname(fileURLToPath(import.meta.url)));
const MODELS = join(HERE, 'node_modules/@kubernetes/client-node/dist/gen/models');

// ---- kubernetes-models -----------------------------------------------------

const kmCache = new Map();

// The kubernetes-models class for apiVersion/kind, or null.
async function kmClass(apiVersion, kind) {
  if (!kmCache.has(apiVersion)) {
    let mod = null;
    try {
      mod = await import(`kubernetes-models/${apiVersion}`);
    } catch {
      // not a built-in API group (a CRD)
    }
    kmCache.set(apiVersion, mod);
  }
  return kmCache.get(apiVersion)?.[kind] ?? null;
}

// '/spec/containers/0/name' -> 'spec.containers[0].name', as the walker writes it.
function jsonPointerToPath(p) {
  const path = p
    .split('/')
    .slice(1)
    .map((seg) => (/^[0-9]+$/.test(seg) ? `[${seg}]` : `.${seg}`))
    .join('');
  return path.replace(/^\./, '') || '.';
}

// Validates obj against its built-in type. Returns error strings; null when
// kubernetes-models has no such type.
export async function kmValidate(obj) {
  const Cls = await kmClass(obj.apiVersion, obj.kind);
  if (!Cls) return null;
  try {
    new Cls(obj).validate();
    return [];
  } catch (e) {
    const errs = e.errors ?? [{ instancePath: '', message: e.message }];
    return errs.map((x) => `${jsonPointerToPath(x.instancePath)}: ${x.message}`);
  }
}

// ---- client-node attributeTypeMap walker -----------------------------------

const modelCache = new Map();
const LEAF_TYPES = new Set(['string', 'number', 'boolean', 'Date', 'any', 'object', 'IntOrString']);

async function model(name) {
  if (!modelCache.has(name)) {
    const file = join(MODELS, `${name}.js`);
    let cls = null;
    if (existsSync(file)) {
      const mod = await import(pathToFileURL(file).href);
      cls = mod[name] ?? null;
    }
    modelCache.set(name, cls);
  }
  return modelCache.get(name);
}

// The generated model name of a top-level kind. Group-qualified names come
// first: core's `V1ResourceClaim` is the {name, request} entry of a pod, the
// resource.k8s.io/v1 object is `ResourceV1ResourceClaim`.
async function modelNameOf(apiVersion, kind) {
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const prefix = group ? cap(group.split('.')[0]) : 'Core';
  for (const name of [`${prefix}${cap(version)}${kind}`, `${cap(version)}${kind}`]) {
    if (await model(name)) return name;
  }
  return null;
}

// Walks value as `type`, pushing "path: unknown field in Type" for every key
// the type does not have. Value types are kubernetes-models' job.
export async function walk(value, type, path, out) {
  if (value === null || value === undefined || LEAF_TYPES.has(type)) return;
  let m = /^Array<(.+)>$/.exec(type);
  if (m) {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) await walk(value[i], m[1], `${path}[${i}]`, out);
    }
    return;
  }
  m = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (m) {
    for (const [k, v] of Object.entries(value)) await walk(v, m[1], `${path}.${k}`, out);
    return;
  }
  const cls = await model(type);
  if (!cls) {
    out.push(`${path}: no model for type ${type}`);
    return;
  }
  if (typeof value !== 'object' || Array.isArray(value)) return;
  const fields = new Map(cls.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    const p = path ? `${path}.${k}` : k;
    if (fields.has(k)) await walk(v, fields.get(k), p, out);
    else out.push(`${p}: unknown field in ${type}`);
  }
}

// Unknown-field errors of a built-in object; null when there is no model.
export async function unknownFields(obj) {
  const name = await modelNameOf(obj.apiVersion, obj.kind);
  if (!name) return null;
  const out = [];
  await walk(obj, name, '', out);
  return out;
}

// ---- CRDs ------------------------------------------------------------------

// A minimal shape language: { fields: {key: shape}, required: [...],
// enum: [...], type: 'integer'|'string'|'object', podTemplate: true }.
const LWS_SHAPE = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  fields: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata: { objectMeta: true },
    spec: {
      type: 'object',
      required: ['leaderWorkerTemplate'],
      fields: {
        replicas: { type: 'integer', min: 0 },
        startupPolicy: { enum: ['LeaderCreated', 'LeaderReady'] },
        networkConfig: {
          type: 'object',
          fields: {
            subdomainPolicy: { enum: ['Shared', 'UniquePerReplica'] },
          },
        },
        rolloutStrategy: {
          type: 'object',
          fields: {
            type: { enum: ['RollingUpdate'] },
            rollingUpdateConfiguration: {
              type: 'object',
              fields: {
                partition: { type: 'integer', min: 0 },
                maxUnavailable: { intOrString: true },
                maxSurge: { intOrString: true },
              },
            },
          },
        },
        leaderWorkerTemplate: {
          type: 'object',
          required: ['workerTemplate'],
          fields: {
            size: { type: 'integer', min: 1 },
            restartPolicy: {
              enum: ['RecreateGroupOnPodRestart', 'RecreateGroupAfterStart', 'None', 'Default'],
            },
            leaderTemplate: { podTemplate: true },
            workerTemplate: { podTemplate: true },
            subGroupPolicy: {
              type: 'object',
              fields: {
                subGroupPolicyType: { enum: ['LeaderWorker', 'LeaderExcluded'] },
                subGroupSize: { type: 'integer', min: 1 },
              },
            },
            volumeClaimTemplates: { list: 'V1PersistentVolumeClaim' },
            persistentVolumeClaimRetentionPolicy: {
              model: 'V1StatefulSetPersistentVolumeClaimRetentionPolicy',
            },
          },
        },
      },
    },
  },
};

const LABEL_SELECTOR = {
  type: 'object',
  fields: {
    matchLabels: { type: 'object', fields: {}, anyFields: { type: 'string' } },
    matchExpressions: { list: 'V1LabelSelectorRequirement' },
  },
};

// The fields of monitoring.coreos.com/v1 PodMonitor that gpuipc uses (a subset:
// anything else is reported, so a misspelling cannot pass).
const PODMONITOR_SHAPE = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  fields: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata: { objectMeta: true },
    spec: {
      type: 'object',
      required: ['selector'],
      fields: {
        selector: LABEL_SELECTOR,
        namespaceSelector: {
          type: 'object',
          fields: { any: { type: 'boolean' }, matchNames: { type: 'array', items: { type: 'string' } } },
        },
        jobLabel: { type: 'string' },
        podMetricsEndpoints: {
          type: 'array',
          items: {
            type: 'object',
            fields: {
              port: { type: 'string' },
              path: { type: 'string' },
              scheme: { enum: ['http', 'https'] },
              interval: { type: 'string' },
              scrapeTimeout: { type: 'string' },
            },
          },
        },
      },
    },
  },
};

// security-profiles-operator.x-k8s.io/v1 SeccompProfile (cluster-scoped).
const SECCOMPPROFILE_SHAPE = {
  type: 'object',
  required: ['apiVersion', 'kind', 'metadata', 'spec'],
  fields: {
    apiVersion: { type: 'string' },
    kind: { type: 'string' },
    metadata: { objectMeta: true },
    spec: {
      type: 'object',
      required: ['defaultAction'],
      fields: {
        defaultAction: { type: 'string' },
        architectures: { type: 'array', items: { type: 'string' } },
        baseProfileName: { type: 'string' },
        disabled: { type: 'boolean' },
        syscalls: {
          type: 'array',
          items: {
            type: 'object',
            required: ['names', 'action'],
            fields: {
              names: { type: 'array', items: { type: 'string' } },
              action: { type: 'string' },
              errnoRet: { type: 'integer', min: 0 },
              args: {
                type: 'array',
                items: {
                  type: 'object',
                  required: ['index', 'op'],
                  fields: {
                    index: { type: 'integer', min: 0 },
                    value: { type: 'integer', min: 0 },
                    valueTwo: { type: 'integer', min: 0 },
                    op: { type: 'string' },
                  },
                },
              },
            },
          },
        },
      },
    },
  },
};

export const CRD_SHAPES = {
  'leaderworkerset.x-k8s.io/v1/LeaderWorkerSet': LWS_SHAPE,
  'monitoring.coreos.com/v1/PodMonitor': PODMONITOR_SHAPE,
  'security-profiles-operator.x-k8s.io/v1/SeccompProfile': SECCOMPPROFILE_SHAPE,
};

async function checkShape(v, shape, path, out) {
  const at = path || '.';
  if (shape.enum) {
    if (!shape.enum.includes(v))
      out.push(`${at}: ${JSON.stringify(v)} is not one of ${shape.enum.join(', ')}`);
    return;
  }
  if (shape.type === 'integer' && !(Number.isInteger(v) && v >= (shape.min ?? -Infinity)))
    return out.push(`${at}: must be an integer >= ${shape.min}`);
  if (shape.type === 'string' && typeof v !== 'string') return out.push(`${at}: must be a string`);
  if (shape.type === 'boolean' && typeof v !== 'boolean') return out.push(`${at}: must be a boolean`);
  if (shape.type === 'array') {
    if (!Array.isArray(v)) return out.push(`${at}: must be a list`);
    for (let i = 0; i < v.length; i++) await checkShape(v[i], shape.items, `${path}[${i}]`, out);
    return;
  }
  if (shape.intOrString && !(Number.isInteger(v) || typeof v === 'string'))
    return out.push(`${at}: must be an integer or a string`);
  if (shape.objectMeta) return walk(v, 'V1ObjectMeta', path, out);
  if (shape.model) return walk(v, shape.model, path, out);
  if (shape.list) {
    if (!Array.isArray(v)) return out.push(`${at}: must be a list`);
    return walk(v, `Array<${shape.list}>`, path, out);
  }
  if (shape.podTemplate) return checkPodTemplate(v, path, out);
  if (shape.type === 'object') {
    if (!v || typeof v !== 'object' || Array.isArray(v)) return out.push(`${at}: must be an object`);
    for (const r of shape.required ?? []) {
      if (v[r] === undefined) out.push(`${at}: missing required field ${r}`);
    }
    for (const [k, sub] of Object.entries(v)) {
      const p = path ? `${path}.${k}` : k;
      if (shape.fields[k]) await checkShape(sub, shape.fields[k], p, out);
      else if (shape.anyFields) await checkShape(sub, shape.anyFields, p, out);
      else out.push(`${p}: unknown field`);
    }
  }
}

// An embedded pod template: unknown fields via V1PodTemplateSpec, types and
// required fields via kubernetes-models' core PodTemplate.
async function checkPodTemplate(t, path, out) {
  await walk(t, 'V1PodTemplateSpec', path, out);
  const errs = await kmValidate({
    apiVersion: 'v1',
    kind: 'PodTemplate',
    metadata: { name: 'embedded' },
    template: t,
  });
  for (const e of errs ?? []) out.push(`${path}.${e.replace(/^template\.?/, '')}`);
}

// Shape errors of a CRD object; null when the CRD is not known here.
export async function crdErrors(obj) {
  const shape = CRD_SHAPES[`${obj.apiVersion}/${obj.kind}`];
  if (!shape) return null;
  const out = [];
  await checkShape(obj, shape, '', out);
  return out;
}

// ---- an older Kubernetes minor ------------------------------------------------

// The generated client of each older minor the manifests support, installed under an alias
// (package.json). Its models are that minor's API: the versions the current client dropped
// (1.33's resource.k8s.io/v1beta2), and only the fields that minor has. kubernetes-models has no
// beta APIs, so types and required fields come from these models too: each field's type and
// format from attributeTypeMap, required-ness from the TypeScript declarations ('x': vs 'x'?:).
export const MINOR_CLIENTS = { '1.33': 'client-node-1.33' };

const minorCache = new Map();

async function minorModel(minor, name) {
  const key = `${minor}/${name}`;
  if (!minorCache.has(key)) {
    const dir = join(HERE, 'node_modules', MINOR_CLIENTS[minor], 'dist/gen/models');
    let found = null;
    if (existsSync(join(dir, `${name}.js`))) {
      const cls = (await import(pathToFileURL(join(dir, `${name}.js`)).href))[name];
      const dts = readFileSync(join(dir, `${name}.d.ts`), 'utf8');
      const required = new Set([...dts.matchAll(/^\s+'([A-Za-z0-9$_-]+)':/gm)].map((m) => m[1]));
      found = cls ? { fields: cls.getAttributeTypeMap(), required } : null;
    }
    minorCache.set(key, found);
  }
  return minorCache.get(key);
}

// Checks value as `type` (a model name, Array<...>, a map, or a leaf) of Kubernetes `minor`:
// unknown fields, missing required ones, and leaf types. Problems go to out.types / out.fields.
async function typedWalk(value, type, format, path, out, minor) {
  const at = path || '.';
  if (value === null || value === undefined) return;
  const leaf = {
    string: () => typeof value === 'string',
    Date: () => typeof value === 'string',
    boolean: () => typeof value === 'boolean',
    number: () => (/^int/.test(format) ? Number.isInteger(value) : typeof value === 'number'),
    IntOrString: () => Number.isInteger(value) || typeof value === 'string',
  }[type];
  if (leaf) {
    if (!leaf()) out.types.push(`${at}: must be ${/^int/.test(format) ? 'an integer' : `a ${type}`}, not ${JSON.stringify(value)}`);
    return;
  }
  if (type === 'any' || type === 'object') return;
  let m = /^Array<(.+)>$/.exec(type);
  if (m) {
    if (!Array.isArray(value)) return out.types.push(`${at}: must be a list`);
    for (let i = 0; i < value.length; i++) await typedWalk(value[i], m[1], '', `${path}[${i}]`, out, minor);
    return;
  }
  m = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (m) {
    for (const [k, v] of Object.entries(value)) await typedWalk(v, m[1], '', `${path}.${k}`, out, minor);
    return;
  }
  const model = await minorModel(minor, type);
  if (!model) return out.types.push(`${at}: Kubernetes ${minor} has no type ${type}`);
  if (typeof value !== 'object' || Array.isArray(value)) return out.types.push(`${at}: must be an object`);
  const fields = new Map(model.fields.map((a) => [a.baseName, a]));
  for (const r of model.required) {
    if (value[r] === undefined) out.types.push(`${at}: missing required field ${r}`);
  }
  for (const [k, v] of Object.entries(value)) {
    const p = path ? `${path}.${k}` : k;
    const f = fields.get(k);
    if (f) await typedWalk(v, f.type, f.format, p, out, minor);
    else out.fields.push(`${p}: unknown field in ${type} (Kubernetes ${minor})`);
  }
}

// The model of apiVersion/kind in Kubernetes `minor`, or null. Only a top-level type counts (one
// with apiVersion and kind): 1.33's V1ResourceClaim is core's {name, request} entry of a pod, not
// a resource.k8s.io/v1 object, which 1.33 does not have.
async function minorModelName(minor, apiVersion, kind) {
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const prefix = group ? cap(group.split('.')[0]) : 'Core';
  for (const name of [`${prefix}${cap(version)}${kind}`, `${cap(version)}${kind}`]) {
    const m = await minorModel(minor, name);
    if (m && ['apiVersion', 'kind'].every((f) => m.fields.some((a) => a.baseName === f))) return name;
  }
  return null;
}

// One object against Kubernetes `minor`'s schema: { types: [...], fields: [...] }, each prefixed
// with Kind/name. CRDs (not part of any minor) keep their own shapes.
export async function schemaProblemsFor(obj, minor) {
  const who = ref(obj);
  const name = await minorModelName(minor, obj.apiVersion, obj.kind);
  if (!name) {
    const crd = await crdErrors(obj);
    if (crd !== null) return { types: crd.map((e) => `${who} ${e}`), fields: [] };
    return { types: [`${who}: Kubernetes ${minor} serves no ${obj.apiVersion} ${obj.kind}`], fields: [] };
  }
  const out = { types: [], fields: [] };
  await typedWalk(obj, name, '', '', out, minor);
  return { types: out.types.map((e) => `${who} ${e}`), fields: out.fields.map((e) => `${who} ${e}`) };
}

// All schema problems of one object, each prefixed with Kind/name.
// Returns { types: [...], fields: [...] }.
export async function schemaProblems(obj) {
  const who = ref(obj);
  const types = await kmValidate(obj);
  const fields = await unknownFields(obj);
  if (types !== null && fields !== null)
    return { types: types.map((e) => `${who} ${e}`), fields: fields.map((e) => `${who} ${e}`) };
  const crd = await crdErrors(obj);
  if (crd !== null) {
    // The shape walk mixes both kinds of error; report unknown-field
    // ones under `fields` so the two checks stay comparable.
    const isField = (e) => /unknown field/.test(e);
    return {
      types: crd.filter((e) => !isField(e)).map((e) => `${who} ${e}`),
      fields: crd.filter(isField).map((e) => `${who} ${e}`),
    };
  }
  const none = `${who}: no schema for ${obj.apiVersion} ${obj.kind} (add one to tests/k8s/lib/schema.mjs)`;
  return { types: [none], fields: [] };
}
