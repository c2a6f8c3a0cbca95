// How the seed gate (seed-gate.ts) ends a pause in a KubeVirt cluster: KubeVirt's `unpause`
// subresource, exactly as its client calls it (kubecli vmis.Unpause: PUT
// /apis/subresources.kubevirt.io/v1/namespaces/<ns>/virtualmachineinstances/<name>/unpause
// with a JSON UnpauseOptions body). `virsh resume` behind KubeVirt's back
// would leave the VMI's Paused condition set while the guest runs.
import { VmseedError } from '../../errors.ts';
import type { ResumeHook } from '../../libvirt/injector.ts';
import type { InjectionTarget } from '../../libvirt/injector-contract.ts';
import { statusError, statusMessage, type KubeApi } from '../../kube/api-client.ts';
import { kubevirtGateOpener, kubevirtSeedGate, memoryGateRecord, type SeedGateRecord } from './seed-gate.ts';

/** The API path of KubeVirt's `unpause` subresource for a VMI (names URL-encoded). */
export function unpausePath(namespace: string, name: string): string {
  return `/apis/subresources.kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachineinstances/${encodeURIComponent(name)}/unpause`;
}

/**
 * The seed gate's resume hook in a KubeVirt cluster: PUTs KubeVirt's `unpause`
 * once per VMI, remembered in `record` (pass storeGateRecord to survive restarts).
 * Refusals the VMI may outgrow (409, 404) throw a retryable VMI_UNPAUSE_FAILED.
 */
export function kubevirtUnpause(api: KubeApi, record: SeedGateRecord = memoryGateRecord()): ResumeHook {
  return kubevirtSeedGate(record, (target, signal) => unpause(api, target, signal));
}

/**
 * The gate of a VMI served over HTTP only: opened once its seed is served.
 * Resolves true when it unpaused the VMI.
 */
export function kubevirtServedGate(
  api: KubeApi,
  record: SeedGateRecord = memoryGateRecord(),
): (target: InjectionTarget, signal?: AbortSignal) => Promise<boolean> {
  return kubevirtGateOpener(record, (target, signal) => unpause(api, target, signal));
}

async function unpause(api: KubeApi, target: InjectionTarget, signal?: AbortSignal): Promise<void> {
  const vmi = `${target.namespace}/${target.name}`;
  const path = unpausePath(target.namespace, target.name);
  const res = await api.request('PUT', path, {}, undefined, signal);
  const message = statusMessage(res.body);
  // virt-api answers 409 "VMI is not paused" once it runs: someone (or our
  // own earlier call whose answer was lost) resumed it. The gate is open.
  if ((res.status >= 200 && res.status < 300) || (res.status === 409 && /is not paused/.test(message))) return;
  if (res.status === 409) {
    // "VMI is not running": KubeVirt has not reported the VMI Running yet.
    throw new VmseedError(
      'VMI_UNPAUSE_FAILED',
      `KubeVirt refused to unpause VMI ${vmi} (409: ${/is not running/.test(message) ? 'VMI is not running yet' : 'conflict'}); will retry`,
      { kind: 'retryable' },
    );
  }
  if (res.status === 404) {
    throw new VmseedError(
      'VMI_UNPAUSE_FAILED',
      `KubeVirt answered 404 to unpause VMI ${vmi} (the VMI is gone, or subresources.kubevirt.io is not served: check KubeVirt's virt-api); will retry`,
      { kind: 'retryable' },
    );
  }
  throw statusError('PUT', path, res.status);
}
