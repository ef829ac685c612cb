// Offline validator for gpuipc's Kubernetes manifests. Renders every setup
// under k8s/ with `kubectl kustomize`, runs the schema and project checks of
// lib/ on each, checks the files that must agree with the manifests, then
// renders every deliberately broken case under broken/ and requires each to
// be rejected for the reason it declares. Prints one line per check and a
// closing "N passed, N failed"; exits 1 when anything failed.
//
// Usage: node validate.mjs            (run.sh checks the prerequisites first)

import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { admissionChecks, admitted } from './lib/admission.mjs';
import { COMPONENT_CASES } from './lib/components.mjs';
import { SETUPS, SUPPORT } from './lib/contract.mjs';
import { canon, render } from './lib/objects.mjs';
import * as repo from './lib/repo.mjs';
import { CHECKS } from './lib/rules.mjs';
import { schemaProblemsFor } from './lib/schema.mjs';
import { SUPPORT_CHECKS } from './lib/support.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const MAX_DETAIL = 8;

// `| head` closing the pipe is not a failure of the manifests.
process.stdout.on('error', (e) => process.exit(e.code === 'EPIPE' ? 0 : 1));

let passed = 0;
let failed = 0;

function report(label, problems) {
  if (problems === null) {
    console.log(`skip ${label}`);
    return;
  }
  if (!problems.length) {
    passed++;
    console.log(`ok   ${label}`);
    return;
  }
  failed++;
  console.log(`FAIL ${label}`);
  for (const p of problems.slice(0, MAX_DETAIL)) console.log(`       ${p}`);
  if (problems.length > MAX_DETAIL) console.log(`       ... and ${problems.length - MAX_DETAIL} more`);
}

// Runs every check on one rendered target. Returns { check: problems }.
async function runChecks(target, ctx, checks = CHECKS) {
  const out = {};
  for (const [name, check] of Object.entries(checks)) out[name] = await check(target, ctx);
  return out;
}

// A broken case declares what it breaks in its kustomization's header:
//   # setup: dra-vmm          the setup (or support kustomization) whose expectations apply
//   # expect: <text>          a problem containing <text> must be reported
function brokenCase(dir) {
  const text = readFileSync(join(dir, 'kustomization.yaml'), 'utf8');
  const field = (k) => new RegExp(`^# ${k}: (.+)$`, 'm').exec(text)?.[1].trim();
  return { setupName: field('setup'), expect: field('expect') };
}

// The 1.33 check must reject what 1.33 rejects: a misspelled field, a field only later minors
// have (v1's capacity), a string count, a missing deviceClassName, and resource.k8s.io/v1 itself.
async function minorSchemaBites() {
  const claim = (apiVersion, exactly) => ({
    apiVersion,
    kind: 'ResourceClaim',
    metadata: { name: 'probe', namespace: 'gpuipc' },
    spec: { devices: { requests: [{ name: 'gpu', exactly }] } },
  });
  const bad = await schemaProblemsFor(
    claim('resource.k8s.io/v1beta2', { allocationMode: 'ExactCount', count: 'one', capacity: {}, colour: 1 }),
    '1.33',
  );
  const v1 = await schemaProblemsFor(claim('resource.k8s.io/v1', { deviceClassName: 'gpu.nvidia.com' }), '1.33');
  const all = [...bad.types, ...bad.fields, ...v1.types].join('\n');
  const want = ['missing required field deviceClassName', 'count: must be an integer', 'capacity: unknown field',
    'colour: unknown field', 'serves no resource.k8s.io/v1'];
  return want.filter((w) => !all.includes(w)).map((w) => `not reported: ${w}`);
}

async function main() {
  const ctx = { refs: {}, profiles: repo.shippedProfiles(ROOT), root: ROOT };

  console.log('# repository');
  report('every overlay is validated', repo.overlaysCovered(ROOT));
  report(`seccomp profile shipped`, repo.seccompShipped(ROOT));
  report('Dockerfile matches the manifests', repo.dockerfileMatches(ROOT));
  report('.dockerignore', repo.dockerignore(ROOT));
  report('meson.build version matches the image tag', repo.mesonVersion(ROOT));
  report('k8s/README.md covers every setup', repo.readme(ROOT));

  // Render everything first: some checks compare with another setup.
  const rendered = {};
  for (const [name, setup] of Object.entries(SETUPS)) {
    rendered[name] = render(join(ROOT, setup.dir));
    if (rendered[name].objects) ctx.refs[name] = rendered[name].objects;
  }
  for (const [name, setup] of Object.entries(SETUPS)) {
    console.log(`# ${name} (${setup.dir})`);
    const r = rendered[name];
    report(`${name}: kustomize build`, r.error ? [r.error] : []);
    if (r.error) continue;
    const results = await runChecks({ name, setup, objects: r.objects }, ctx);
    for (const [check, problems] of Object.entries(results)) report(`${name}: ${check}`, problems);
  }

  // Kubernetes 1.33: every DRA setup with k8s/components/kubernetes-1.33 (tests/k8s/k8s-1.33/NAME),
  // against 1.33's own schema, and otherwise exactly the v1 rendering.
  console.log('# Kubernetes 1.33 (k8s/components/kubernetes-1.33: resource.k8s.io/v1beta2)');
  report('the 1.33 schema bites', await minorSchemaBites());
  for (const [name, setup] of Object.entries(SETUPS)) {
    if (!setup.deviceClass) continue;
    const dir = join(HERE, 'k8s-1.33', name);
    if (!existsSync(dir)) {
      report(`${name} for 1.33`, [`no tests/k8s/k8s-1.33/${name}: every DRA setup is rendered with the component`]);
      continue;
    }
    const r = render(dir);
    report(`${name} for 1.33: kustomize build`, r.error ? [r.error] : []);
    if (r.error) continue;
    const dra = r.objects.filter((o) => o.apiVersion.startsWith('resource.k8s.io/'));
    report(
      `${name} for 1.33: its claims are resource.k8s.io/v1beta2`,
      !dra.length
        ? ['no resource.k8s.io object rendered']
        : dra.filter((o) => o.apiVersion !== 'resource.k8s.io/v1beta2').map((o) => `${o.kind} is ${o.apiVersion}`),
    );
    const back = r.objects.map((o) =>
      o.apiVersion === 'resource.k8s.io/v1beta2' ? { ...o, apiVersion: 'resource.k8s.io/v1' } : o,
    );
    report(
      `${name} for 1.33: nothing else differs from the v1 rendering`,
      rendered[name]?.objects && canon(back) === canon(rendered[name].objects) ? [] : ['the renderings differ'],
    );
    const problems = [];
    for (const o of r.objects) {
      const p = await schemaProblemsFor(o, '1.33');
      problems.push(...p.types, ...p.fields);
    }
    report(`${name} for 1.33: Kubernetes 1.33's schema (types, required and unknown fields)`, problems);
  }

  for (const [name, support] of Object.entries(SUPPORT)) {
    console.log(`# ${name} (${support.dir})`);
    const r = render(join(ROOT, support.dir));
    report(`${name}: kustomize build`, r.error ? [r.error] : []);
    if (r.error) continue;
    const target = { name, setup: support, objects: r.objects };
    for (const [check, fn] of Object.entries(SUPPORT_CHECKS[name])) report(`${name}: ${check}`, await fn(target, ctx));
  }

  if (rendered['node-broker']?.objects) {
    console.log('# node-broker admission policy (its CEL evaluated as the API server does)');
    for (const [label, problems] of admissionChecks(rendered['node-broker'].objects)) report(label, problems);
  }
  if (rendered['node-weights']?.objects) {
    console.log('# node-weights: the node namespace\'s admission policy admits the broker and the holder');
    for (const [label, problems] of admitted(rendered['node-weights'].objects)) report(`node-weights: ${label}`, problems);
  }

  console.log('# the sidecar components on other workloads (tests/k8s/components)');
  for (const [name, c] of Object.entries(COMPONENT_CASES)) {
    const dir = join(HERE, 'components', name);
    report(`components/${name}: ${c.what}`, existsSync(dir) ? c.check(render(dir), ROOT) : [`no ${dir}`]);
  }

  console.log('# broken manifests (each must be rejected)');
  const brokenDir = join(HERE, 'broken');
  const cases = existsSync(brokenDir) ? readdirSync(brokenDir).sort() : [];
  report('broken cases exist', cases.length ? [] : ['tests/k8s/broken/ holds no cases']);
  for (const c of cases) {
    const dir = join(brokenDir, c);
    const label = `broken/${c}`;
    const { setupName, expect } = brokenCase(dir);
    const setup = SETUPS[setupName] ?? SUPPORT[setupName];
    const checks = SETUPS[setupName] ? CHECKS : SUPPORT_CHECKS[setupName];
    if (!setup || !expect) {
      report(label, ['kustomization.yaml needs "# setup: <known setup>" and "# expect: <text>"']);
      continue;
    }
    const r = render(dir);
    if (r.error) {
      // It must reach the validator: a case kustomize rejects proves nothing about it.
      report(label, [`does not build: ${r.error}`]);
      continue;
    }
    const results = await runChecks({ name: label, setup, objects: r.objects }, ctx, checks);
    const all = Object.entries(results).flatMap(([k, ps]) => ps.map((p) => `${k}: ${p}`));
    const hit = all.find((p) => p.toLowerCase().includes(expect.toLowerCase()));
    if (hit) {
      passed++;
      console.log(`ok   ${label}: rejected (${hit})`);
    } else {
      const why = all.length ? ['rejected, but for other reasons:', ...all] : ['accepted: the validator did not bite'];
      report(`${label}: expected a rejection mentioning "${expect}"`, why);
    }
  }

  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}

await main();
