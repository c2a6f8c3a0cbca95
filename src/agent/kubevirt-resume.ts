// The seed gate's resume in a KubeVirt cluster: KubeVirt's `unpause`
// subresource, exactly as its client calls it (kubecli vmis.Unpause: PUT
// /apis/subresources.kubevirt.io/v1/namespaces/<ns>/virtualmachineinstances/<name>/unpause
// with a JSON UnpauseOptions body). `virsh resume` behind KubeVirt's back
// would leave the VMI's Paused condition set while the guest runs.
import { VmseedError } from '../errors.ts';
import type { ResumeHook } from '../libvirt/injector.ts';
import type { InjectionTarget } from '../libvirt/types.ts';
import type { ImageStore } from '../disk/store.ts';
import { statusError, statusMessage, type KubeApi } from '../kube/api.ts';

export function unpausePath(namespace: string, name: string): string {
  return `/apis/subresources.kubevirt.io/v1/namespaces/${encodeURIComponent(namespace)}/virtualmachineinstances/${encodeURIComponent(name)}/unpause`;
}

// Whether the seed gate already opened for a VMI: then a later pause is its
// owner's (virtctl pause) and stays. KubeVirt does not tell the two apart:
// a start-paused domain and a user's pause both get condition Paused=True
// with reason PausedByUser (virt-handler calculatePausedCondition, libvirt
// reports VIR_DOMAIN_PAUSED_USER for both), and the launcher's own record
// (`l.paused`) is not in the API. So the agent keeps its own, once per VMI
// (uid): startStrategy Paused is the pause of the VMI's start, and a
// migrated VMI's new launcher pod did not start paused.
export interface SeedGateRecord {
  opened(target: InjectionTarget): Promise<boolean>;
  markOpened(target: InjectionTarget): Promise<void>;
}

// In this process only (tests, and anything without a state directory).
const MAX_REMEMBERED = 10_000;
export function memoryGateRecord(): SeedGateRecord {
  const done = new Set<string>();
  return {
    opened: (t) => Promise.resolve(done.has(t.uid)),
    markOpened: (t) => {
      if (done.size >= MAX_REMEMBERED) done.delete(done.values().next().value!);
      done.add(t.uid);
      return Promise.resolve();
    },
  };
}

// In the state directory, next to the VMI's images (the image store's
// `seed-gate-opened` record): an agent restart does not forget it, and it
// goes with the images when the VMI goes.
export function storeGateRecord(
  store: Pick<ImageStore, 'readRecord' | 'writeRecord'>,
  options: { fsync?: boolean; now?: () => Date } = {},
): SeedGateRecord {
  const key = (t: InjectionTarget) => ({ namespace: t.namespace, name: t.name, uid: t.uid });
  return {
    opened: async (t) => (await store.readRecord(key(t), 'seed-gate-opened')) !== undefined,
    markOpened: async (t) => {
      const at = (options.now ?? (() => new Date()))().toISOString();
      await store.writeRecord(
        key(t),
        'seed-gate-opened',
        `${JSON.stringify({ unpausedAt: at, launcherPods: t.launcherPods ?? [] })}\n`,
        { fsync: options.fsync ?? true },
      );
    },
  };
}

export function kubevirtUnpause(api: KubeApi, record: SeedGateRecord = memoryGateRecord()): ResumeHook {
  // Answers read from the record in this process (it only ever goes from
  // closed to open for a uid): a paused VMI is not re-read on every retry.
  const known = memoryGateRecord();
  return async ({ target }) => {
    const vmi = `${target.namespace}/${target.name}`;
    if (target.vmi) {
      // Only the pause KubeVirt made at start (spec.startStrategy: Paused)
      // is the seed gate's; any other pause is the VM owner's.
      if (!target.vmi.startPaused || (await known.opened(target))) return false;
      if (await record.opened(target)) {
        await known.markOpened(target);
        return false;
      }
      // virt-api answers 409 until both exist (KubeVirt's unpause
      // validation): wait for them instead of calling.
      if (target.vmi.phase !== 'Running' || !target.vmi.pausedCondition) {
        throw new VmseedError(
          'SEED_GATE_WAITING',
          `VMI ${vmi}: seed attached; waiting for KubeVirt to report phase Running (now ${target.vmi.phase ?? 'none'}) and condition Paused=True before calling unpause; will retry`,
          { kind: 'retryable', field: 'status.conditions' },
        );
      }
    }
    const path = unpausePath(target.namespace, target.name);
    const res = await api.request('PUT', path, {});
    const message = statusMessage(res.body);
    // virt-api answers 409 "VMI is not paused" once it runs: someone (or our
    // own earlier call whose answer was lost) resumed it. The gate is open.
    if ((res.status >= 200 && res.status < 300) || (res.status === 409 && /is not paused/.test(message))) {
      // A failed write fails this reconcile; the retry, while KubeVirt still
      // reports the pause, meets 409 "not paused" and writes it. Written
      // after the call, not before: a crash in between must not leave a
      // start-paused VMI paused for good.
      await record.markOpened(target);
      await known.markOpened(target);
      return;
    }
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
  };
}
