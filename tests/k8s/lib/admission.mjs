// The node-broker overlay's ValidatingAdmissionPolicy, evaluated as the API
// server evaluates it on a pod CREATE: its variables in order, then every
// validation; one that is not true (or fails to evaluate: failurePolicy Fail)
// denies with its message. Checked both ways: every pod the overlay ships is
// admitted, and a pod breaking each check of the `restricted` profile is
// denied by the validation that covers it, so the policy's claim to check all
// of `restricted` is tested, not just written down.

import { run } from '@bufbuild/cel';
import { podSpecs, ref } from './objects.mjs';

// JSON as CEL sees a Kubernetes object: maps, lists, int64 integers.
function toCel(v) {
  if (Array.isArray(v)) return v.map(toCel);
  if (v && typeof v === 'object') return new Map(Object.entries(v).map(([k, x]) => [k, toCel(x)]));
  if (typeof v === 'number' && Number.isInteger(v)) return BigInt(v);
  return v;
}

function evaluate(expression, bindings) {
  try {
    const r = run(expression, bindings);
    return r === true ? { ok: true } : { ok: false, why: r === false ? 'false' : `error: ${r?.message ?? r}` };
  } catch (e) {
    return { ok: false, why: `error: ${e.message}` };
  }
}

// The messages of the validations that deny obj (empty: admitted).
export function denials(policy, obj) {
  const object = toCel(obj);
  const variables = new Map();
  for (const v of policy.spec.variables ?? []) {
    const r = run(v.expression, { object, variables });
    variables.set(v.name, r);
  }
  const out = [];
  for (const v of policy.spec.validations ?? []) {
    const r = evaluate(v.expression, { object, variables });
    if (!r.ok) out.push(`${v.message.trim()}${r.why === 'false' ? '' : ` (${r.why})`}`);
  }
  return out;
}

const podOf = ({ obj, template, spec }) =>
  obj.kind === 'Pod'
    ? obj
    : { apiVersion: 'v1', kind: 'Pod', metadata: { name: ref(obj), ...(template.metadata ?? {}) }, spec };

// Each mutation breaks one check of `restricted` (or baseline) on a copy of a
// shipped pod; `expect` is a word of the validation message that must deny it.
const app = (p) => p.spec.containers[0];
const sc = (c) => (c.securityContext ??= {});
const MUTANTS = [
  ['a hostPath other than /run/gpuipc', 'volumes may be', (p) => p.spec.volumes.push({ name: 'etc', hostPath: { path: '/etc' } })],
  ['an nfs volume', 'volumes may be', (p) => p.spec.volumes.push({ name: 'n', nfs: { server: 'nfs', path: '/' } })],
  ['hostNetwork', 'hostNetwork', (p) => (p.spec.hostNetwork = true)],
  ['hostPID', 'hostPID', (p) => (p.spec.hostPID = true)],
  ['hostIPC', 'hostIPC', (p) => (p.spec.hostIPC = true)],
  ['a HostProcess container', 'HostProcess', (p) => (sc(app(p)).windowsOptions = { hostProcess: true })],
  ['an ephemeral container', 'ephemeral containers', (p) => (p.spec.ephemeralContainers = [{ name: 'debug', image: 'busybox' }])],
  ['runAsNonRoot false on a container', 'runAsNonRoot', (p) => (sc(app(p)).runAsNonRoot = false)],
  ['uid 0 on a container', 'no uid may be 0', (p) => (sc(app(p)).runAsUser = 0)],
  ['uid 0 on the pod', 'no uid may be 0', (p) => (p.spec.securityContext.runAsUser = 0)],
  ['seccomp Unconfined', 'seccompProfile', (p) => (sc(app(p)).seccompProfile = { type: 'Unconfined' })],
  ['a privileged container', 'not be privileged', (p) => (sc(app(p)).privileged = true)],
  ['an added capability', 'add none', (p) => (sc(app(p)).capabilities = { drop: ['ALL'], add: ['NET_BIND_SERVICE'] })],
  ['privilege escalation', 'allowPrivilegeEscalation', (p) => (sc(app(p)).allowPrivilegeEscalation = true)],
  ['a hostPort', 'hostPort', (p) => (app(p).ports = [{ containerPort: 80, hostPort: 8080 }])],
  ['procMount Unmasked', 'procMount', (p) => (sc(app(p)).procMount = 'Unmasked')],
  ['a sysctl', 'sysctls', (p) => (p.spec.securityContext.sysctls = [{ name: 'net.ipv4.ping_group_range', value: '0 0' }])],
  ['SELinux type spc_t', 'seLinuxOptions', (p) => (sc(app(p)).seLinuxOptions = { type: 'spc_t' })],
  ['an SELinux user', 'seLinuxOptions', (p) => (p.spec.securityContext.seLinuxOptions = { user: 'system_u' })],
  ['AppArmor Unconfined', 'AppArmor', (p) => (sc(app(p)).appArmorProfile = { type: 'Unconfined' })],
  ['the AppArmor annotation unconfined', 'AppArmor', (p) => {
    p.metadata.annotations = { ...(p.metadata.annotations ?? {}), [`container.apparmor.security.beta.kubernetes.io/${app(p).name}`]: 'unconfined' };
  }],
];

// The namespace the policy is bound to (its binding's namespaceSelector), or null.
function boundNamespace(objects, policy) {
  const b = objects.find((o) => o.kind === 'ValidatingAdmissionPolicyBinding' && o.spec?.policyName === policy.metadata.name);
  return b?.spec?.matchResources?.namespaceSelector?.matchLabels?.['kubernetes.io/metadata.name'] ?? null;
}

// [label, problems] pairs: the policy admits every pod of a setup that it applies to (those of the
// namespace it is bound to). For setups that carry the node-broker overlay's policy beside pods of
// other namespaces (node-weights), without the mutants, which admissionChecks runs on node-broker.
export function admitted(objects) {
  const policy = objects.find((o) => o.kind === 'ValidatingAdmissionPolicy');
  if (!policy) return [['admission policy', ['no ValidatingAdmissionPolicy rendered']]];
  const ns = boundNamespace(objects, policy);
  const pods = podSpecs(objects).filter(({ obj }) => obj.metadata?.namespace === ns).map(podOf);
  if (!pods.length) return [['admission policy', [`no pod in ${ns}, the namespace it is bound to`]]];
  return pods.map((p) => [`admission policy admits ${ref(p)}`, denials(policy, p)]);
}

// [label, problems] pairs for the report.
export function admissionChecks(objects) {
  const policy = objects.find((o) => o.kind === 'ValidatingAdmissionPolicy');
  if (!policy) return [['admission policy', ['no ValidatingAdmissionPolicy rendered']]];
  const pods = podSpecs(objects).map(podOf);
  const out = [];
  for (const p of pods) out.push([`admission policy admits ${ref(p)}`, denials(policy, p)]);
  // Mutants of an ordinary client pod (the producer).
  const base = pods.find((p) => p.kind === 'Pod');
  for (const [what, expect, mutate] of MUTANTS) {
    const p = structuredClone(base);
    mutate(p);
    const got = denials(policy, p);
    const hit = got.some((m) => m.includes(expect));
    out.push([
      `admission policy denies ${what}`,
      hit ? [] : [got.length ? `denied, but not by the check for it: ${got.join('; ')}` : 'admitted'],
    ]);
  }
  return out;
}
