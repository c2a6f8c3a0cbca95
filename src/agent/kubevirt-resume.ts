// The seed gate's resume in a KubeVirt cluster: KubeVirt's `unpause`
// subresource, exactly as its client calls it (kubecli vmis.Unpause: PUT
// /apis/subresources.kubevirt.io/v1/namespaces/<ns>/virtualmachineinstances/<name>/unpause
// with a JSON UnpauseOptions body). `virsh resume` behind KubeVirt's back
// would leave the VMI's Paused condition set while the guest runs.
import { VmseedError } from '../errors.ts';
import type { ResumeHook } from '../libvirt/injector.ts';
import { statusError, type KubeApi } from './kube-api.ts';

export function unpausePath(namespace: string, name: string): string {
  return `/apis/subresources.kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachineinstances/${encodeURIComponent(name)}/unpause`;
}

// Launchers (VMI uid/pod) this process unpaused: a later pause of the same
// VM is its owner's (virtctl pause), not the start pause, and stays.
const MAX_REMEMBERED = 10_000;

export function kubevirtUnpause(api: KubeApi): ResumeHook {
  const done = new Set<string>();
  return async ({ target }) => {
    const vmi = `${target.namespace}/${target.name}`;
    const once = `${target.uid}/${(target.launcherPods ?? []).join(',')}`;
    if (target.vmi) {
      // Only the pause KubeVirt made at start (spec.startStrategy: Paused)
      // is the seed gate's; any other pause is the VM owner's.
      if (!target.vmi.startPaused || done.has(once)) return false;
      // virt-api answers 409 until both exist (KubeVirt's unpause
      // validation): wait for them instead of calling.
      if (target.vmi.phase !== 'Running' || !target.vmi.pausedCondition) {
        throw new VmseedError('SEED_GATE_WAITING', `VMI ${vmi}: seed attached; waiting for KubeVirt to report phase Running (now ${target.vmi.phase ?? 'none'}) and condition Paused=True before calling unpause; will retry`, { kind: 'retryable', field: 'status.conditions' });
      }
    }
    const path = unpausePath(target.namespace, target.name);
    const res = await api.request('PUT', path, {});
    const message = String((res.body as { message?: unknown } | undefined)?.message ?? '');
    // virt-api answers 409 "VMI is not paused" once it runs: someone (or our
    // own earlier call whose answer was lost) resumed it. The gate is open.
    if ((res.status >= 200 && res.status < 300) || (res.status === 409 && /is not paused/.test(message))) {
      if (done.size >= MAX_REMEMBERED) done.delete(done.values().next().value!);
      done.add(once);
      return;
    }
    if (res.status === 409) {
      // "VMI is not running": KubeVirt has not reported the VMI Running yet.
      throw new VmseedError('VMI_UNPAUSE_FAILED', `KubeVirt refused to unpause VMI ${vmi} (409: ${/is not running/.test(message) ? 'VMI is not running yet' : 'conflict'}); will retry`, { kind: 'retryable' });
    }
    if (res.status === 404) {
      throw new VmseedError('VMI_UNPAUSE_FAILED', `KubeVirt answered 404 to unpause VMI ${vmi} (the VMI is gone, or subresources.kubevirt.io is not served: check KubeVirt's virt-api); will retry`, { kind: 'retryable' });
    }
    throw statusError('PUT', path, res.status);
  };
}
