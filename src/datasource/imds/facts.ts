// What the datasource's IMDS endpoints need of a VMI (datasource/imds/identity-endpoint.ts),
// read from the VMI the agent holds.
import type { VmiObject } from '../../api/objects.ts';
import { isImdsEnabled } from '../../cloudinit/annotation/imds-annotations.ts';
import type { ImdsFacts } from './identity-endpoint.ts';
import { isPodUid, launcherPodsOnNode } from '../../libvirt/launcher-pod.ts';

// A vmseed VMI's opt-in to /v1/identity, /v1/token and the OpenStack paths
// under its token path (IMDS-annotated VMIs are in already). Exactly "true".
export const IMDS_OPT_IN = 'vmseed.io/imds';

function serviceAccountVolume(vmi: VmiObject): string | undefined {
  for (const v of vmi.spec.volumes ?? []) {
    const sa = (v.serviceAccount as { serviceAccountName?: unknown } | undefined)?.serviceAccountName;
    if (typeof sa === 'string' && sa !== '') return sa;
  }
  return undefined;
}

/**
 * The ImdsFacts of a VMI on `nodeName`, for the datasource directory to hold
 * beside its seed. Launcher pods are those on this node with a UUID UID.
 */
export function imdsFacts(vmi: VmiObject, nodeName: string): ImdsFacts {
  const volume = serviceAccountVolume(vmi);
  const named = vmi.spec.serviceAccountName;
  return {
    enabled: isImdsEnabled(vmi) || vmi.metadata.annotations?.[IMDS_OPT_IN] === 'true',
    // KubeVirt's virt-controller (services/template.go): the pod runs as
    // spec.serviceAccountName, else the volume's; Kubernetes defaults the rest.
    serviceAccountName: typeof named === 'string' && named !== '' ? named : (volume ?? 'default'),
    // KubeVirt sets automountServiceAccountToken only with the volume.
    serviceAccountToken: volume !== undefined,
    launcherPods: launcherPodsOnNode(vmi.status?.activePods, nodeName).filter(isPodUid),
  };
}
