// `kubectl apply` prints a PodSecurity warning when a pod would violate the
// level its namespace's `warn` label names, and the API server refuses it
// for `enforce`. Every variant's pods must meet every level the Namespace
// we ship names. The checks are the Pod Security Standards' controls
// (kubernetes.io/docs/concepts/security/pod-security-standards/) that
// these pods could touch, written from that page.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { ROOT, findObject } from '../support/manifests.ts';
import { OVERLAYS, kustomize } from '../support/kustomize.ts';

type Any = any;
const LEVELS = ['privileged', 'baseline', 'restricted'] as const;
type Level = (typeof LEVELS)[number];

// Capabilities the baseline level allows a container to add.
const BASELINE_CAPS = new Set([
  'AUDIT_WRITE',
  'CHOWN',
  'DAC_OVERRIDE',
  'FOWNER',
  'FSETID',
  'KILL',
  'MKNOD',
  'NET_BIND_SERVICE',
  'SETFCAP',
  'SETGID',
  'SETPCAP',
  'SETUID',
  'SYS_CHROOT',
]);
const RESTRICTED_VOLUMES = [
  'configMap',
  'csi',
  'downwardAPI',
  'emptyDir',
  'ephemeral',
  'persistentVolumeClaim',
  'projected',
  'secret',
];

// What the pod violates at `level`, as `control: where`.
function violations(pod: Any, level: Level): string[] {
  if (level === 'privileged') return [];
  const out: string[] = [];
  const containers: Any[] = [...(pod.initContainers ?? []), ...pod.containers];
  if (pod.hostNetwork || pod.hostPID || pod.hostIPC) out.push('host namespaces');
  for (const v of pod.volumes ?? []) if (v.hostPath) out.push(`hostPath volumes: ${v.name}`);
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    if (sc.privileged) out.push(`privileged: ${c.name}`);
    for (const cap of sc.capabilities?.add ?? [])
      if (!BASELINE_CAPS.has(cap)) out.push(`capabilities: ${c.name} adds ${cap}`);
    for (const p of c.ports ?? []) if (p.hostPort) out.push(`host ports: ${c.name}`);
  }
  if (level === 'baseline') return out;
  for (const v of pod.volumes ?? []) if (!RESTRICTED_VOLUMES.some((k) => k in v)) out.push(`volume types: ${v.name}`);
  const podSc = pod.securityContext ?? {};
  for (const c of containers) {
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false) out.push(`privilege escalation: ${c.name}`);
    if ((sc.runAsNonRoot ?? podSc.runAsNonRoot) !== true) out.push(`running as non-root: ${c.name}`);
    if ((sc.runAsUser ?? podSc.runAsUser) === 0) out.push(`running as non-root user: ${c.name}`);
    const seccomp = (sc.seccompProfile ?? podSc.seccompProfile)?.type;
    if (seccomp !== 'RuntimeDefault' && seccomp !== 'Localhost') out.push(`seccomp: ${c.name}`);
    if (!(sc.capabilities?.drop ?? []).includes('ALL')) out.push(`capabilities: ${c.name} does not drop ALL`);
    for (const cap of sc.capabilities?.add ?? [])
      if (cap !== 'NET_BIND_SERVICE') out.push(`capabilities: ${c.name} adds ${cap}`);
  }
  return out;
}

test('the checker knows the controls: a hostPath pod fails baseline, a hardened pod passes restricted', () => {
  const hardened = {
    securityContext: { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } },
    containers: [{ name: 'c', securityContext: { allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } } }],
    volumes: [{ name: 'tmp', emptyDir: {} }],
  };
  assert.deepEqual(violations(hardened, 'restricted'), []);
  const hostPath = structuredClone(hardened) as Any;
  hostPath.volumes.push({ name: 'pods', hostPath: { path: '/var/lib/kubelet/pods' } });
  assert.deepEqual(violations(hostPath, 'baseline'), ['hostPath volumes: pods']);
  const netAdmin = structuredClone(hardened) as Any;
  netAdmin.containers[0].securityContext.capabilities.add = ['NET_ADMIN'];
  assert.deepEqual(violations(netAdmin, 'baseline'), ['capabilities: c adds NET_ADMIN']);
});

test('every variant: the pods meet each Pod Security level the shipped Namespace names (enforce, warn, audit)', async () => {
  for (const variant of OVERLAYS) {
    const objects = await kustomize(join(ROOT, 'deploy', variant));
    const labels: Record<string, string> = findObject(objects, 'Namespace', 'vmseed').metadata.labels ?? {};
    const daemonSet: Any = findObject(objects, 'DaemonSet', 'vmseed');
    const pod = daemonSet.spec.template.spec;
    for (const mode of ['enforce', 'warn', 'audit']) {
      const level = labels[`pod-security.kubernetes.io/${mode}`] as Level | undefined;
      assert.ok(level === undefined || LEVELS.includes(level), `${variant}: ${mode}=${level}`);
      if (level !== undefined) assert.deepEqual(violations(pod, level), [], `${variant}: ${mode}=${level}`);
    }
    // The level is privileged for a reason the docs give: the pods need
    // hostPath volumes, which baseline refuses.
    assert.ok(
      violations(pod, 'baseline').some((v) => v.startsWith('hostPath volumes')),
      variant,
    );
  }
});
