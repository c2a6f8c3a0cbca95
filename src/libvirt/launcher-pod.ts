// Which virt-launcher pod holds a VMI's libvirt on this node. KubeVirt keeps
// `status.activePods` (pod UID → node name); during a migration it lists the
// source and the target pod, normally on two nodes, so filtering by this node
// leaves one. Two on this node happen only while a migration to the same node
// is cutting over (or a crashed launcher is being replaced): like KubeVirt's
// own virt-handler (hotplug-disk mount.go findVirtlauncherUID) we then pick
// none and retry until the status settles, rather than guess.
import { VmseedError } from '../errors.ts';
import type { InjectionTarget } from './types.ts';

export function launcherPodsOnNode(activePods: unknown, nodeName: string): string[] {
  if (activePods === null || typeof activePods !== 'object') return [];
  return Object.entries(activePods as Record<string, unknown>)
    .filter(([uid, node]) => node === nodeName && uid !== '')
    .map(([uid]) => uid)
    .sort();
}

// The one launcher pod UID of the target, or a retryable LAUNCHER_POD_UNKNOWN.
export function launcherPodOf(target: InjectionTarget): string {
  const pods = target.launcherPods ?? [];
  if (pods.length === 1) return pods[0]!;
  const vmi = `${target.namespace}/${target.name}`;
  if (pods.length === 0) {
    throw new VmseedError(
      'LAUNCHER_POD_UNKNOWN',
      `VMI ${vmi}: status.activePods names no launcher pod on this node yet, so {podUID} cannot be rendered; will retry when KubeVirt updates the status`,
      { kind: 'retryable', field: 'status.activePods' },
    );
  }
  throw new VmseedError(
    'LAUNCHER_POD_UNKNOWN',
    `VMI ${vmi}: status.activePods names ${pods.length} launcher pods on this node (a migration is cutting over); will retry once one remains`,
    { kind: 'retryable', field: 'status.activePods' },
  );
}
