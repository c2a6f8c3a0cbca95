// A container's identity from the DaemonSet, as options for util-linux's
// setpriv: the pod's runAsUser, runAsGroup and supplementalGroups, the
// container's capabilities and allowPrivilegeEscalation. Only what the
// vmseed manifests use is supported (capabilities `drop: [ALL]` with nothing
// added): anything else throws, so a manifest change cannot be silently
// run under a different identity than the cluster would give it.
import assert from 'node:assert/strict';
import { findObject, type KubeObject } from './manifests.ts';

interface SecurityContext {
  runAsUser?: number;
  runAsGroup?: number;
  supplementalGroups?: number[];
  capabilities?: { drop?: string[]; add?: string[] };
  allowPrivilegeEscalation?: boolean;
}

export function setprivOptions(objects: KubeObject[], container = 'agent'): string[] {
  const pod = (findObject(objects, 'DaemonSet', 'vmseed') as unknown as {
    spec: { template: { spec: { securityContext: SecurityContext; containers: { name: string; securityContext: SecurityContext }[] } } };
  }).spec.template.spec;
  const c = pod.containers.find((x) => x.name === container);
  assert.ok(c, `no container ${container}`);
  const sc = { ...pod.securityContext, ...c.securityContext };
  assert.ok(Number.isInteger(sc.runAsUser) && Number.isInteger(sc.runAsGroup), 'runAsUser and runAsGroup are set');
  assert.deepEqual(sc.capabilities, { drop: ['ALL'] }, 'only capabilities drop: [ALL] is supported');
  assert.equal(sc.allowPrivilegeEscalation, false);
  const groups = sc.supplementalGroups ?? [];
  return [
    `--reuid=${sc.runAsUser}`,
    `--regid=${sc.runAsGroup}`,
    groups.length > 0 ? `--groups=${groups.join(',')}` : '--clear-groups',
    // Nothing kept: not inheritable, not in the bounding set (so root gets
    // no capability across exec either).
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
  ];
}
