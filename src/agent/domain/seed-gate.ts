// The seed gate: a VM started paused (spec.startStrategy: Paused, or a
// libvirt domain defined paused) whose VMI carries
// `vmseed.io/resume-after-seed: "true"` is resumed once its seed is
// attached, so the guest never boots without it. What the agent decides
// about the gate is here: what it reads of a VMI, whether a pause is the
// gate's to end and whether now, how it ends on each platform, and the
// record that it opened. The reconciler tells the injector whether to
// resume (resumeAfterSeed); the injector attaches the disk and, for a paused
// domain it was told to resume, calls the hook made here.
import type { VmiObject } from '../../api/objects.ts';
import type { ImageStore } from '../../disk/store.ts';
import { VmseedError, type ErrorCode } from '../../errors.ts';
import { libvirtResume, type ResumeHook } from '../../libvirt/injector.ts';
import type { InjectionTarget } from '../../libvirt/injector-contract.ts';

type GateFacts = NonNullable<InjectionTarget['vmi']>;

// The VMI's opt-in: its paused domain is resumed once the seed is attached.
export const RESUME_ANNOTATION = 'vmseed.io/resume-after-seed';

/**
 * Whether the gate ends this VMI's pause once its seed is in place (the hook
 * still decides whether a given pause is the gate's).
 */
export function resumeAfterSeed(vmi: VmiObject): boolean {
  return vmi.metadata.annotations?.[RESUME_ANNOTATION] === 'true';
}

/** What the gate reads of a VMI's status and spec (KubeVirt's view of it). */
export function seedGateFacts(vmi: VmiObject): GateFacts {
  const conditions = Array.isArray(vmi.status?.conditions)
    ? (vmi.status.conditions as Array<{ type?: unknown; status?: unknown }>)
    : [];
  return {
    ...(typeof vmi.status?.phase === 'string' ? { phase: vmi.status.phase } : {}),
    startPaused: vmi.spec.startStrategy === 'Paused',
    pausedCondition: conditions.some((c) => c?.type === 'Paused' && c?.status === 'True'),
  };
}

/**
 * How the gate ends a pause, by --platform and --resume-via: `unpause` (KubeVirt's
 * API, cluster mode), else libvirt's resume where the agent owns the domain.
 * Which combinations are allowed is config/config.ts's resumeViaProblem.
 */
export function seedGateHook(platform: 'libvirt' | 'kubevirt', unpause?: ResumeHook): ResumeHook {
  if (unpause) return unpause;
  return platform === 'kubevirt' ? noKubevirtUnpause : libvirtResume;
}

// KubeVirt resumes any pause it did not order and keeps its own record of
// the one it made: the kubevirt platform never falls back to `virsh resume`.
const noKubevirtUnpause: ResumeHook = async () => {
  throw new VmseedError(
    'CONFIG_INVALID',
    "the seed gate on --platform kubevirt resumes through KubeVirt's unpause API only, and none is configured",
    { kind: 'terminal', field: 'resumeVia' },
  );
};

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

/**
 * The gate's record in the state directory, next to the VMI's images (the image
 * store's `seed-gate-opened` record): an agent restart does not forget it, and
 * it goes with the images when the VMI goes.
 */
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

// The gate in a KubeVirt cluster: only the pause KubeVirt made at start is
// the gate's, once per VMI, and only once KubeVirt can take the unpause.
// `unpause` resolves once the VMI runs (also when it already did).
export function kubevirtSeedGate(record: SeedGateRecord, unpause: Unpause): ResumeHook {
  const open = kubevirtGateOpener(record, unpause);
  return async ({ target, signal }) => ((await open(target, signal)) ? undefined : false);
}

// KubeVirt's unpause of the VMI; `signal` is the reconcile's.
export type Unpause = (target: InjectionTarget, signal?: AbortSignal) => Promise<void>;

// The gate's opening by itself, for a VMI without a domain of ours to
// attach to (served over HTTP only): true when it unpaused the VMI.
export function kubevirtGateOpener(
  record: SeedGateRecord,
  unpause: Unpause,
): (target: InjectionTarget, signal?: AbortSignal) => Promise<boolean> {
  // Answers read from the record in this process (it only ever goes from
  // closed to open for a uid): a paused VMI is not re-read on every retry.
  const known = memoryGateRecord();
  return async (target, signal) => {
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
          `VMI ${target.namespace}/${target.name}: seed in place; waiting for KubeVirt to report phase Running (now ${target.vmi.phase ?? 'none'}) and condition Paused=True before calling unpause; will retry`,
          { kind: 'retryable', field: 'status.conditions' },
        );
      }
    }
    await unpause(target, signal);
    // A failed write fails this reconcile; the retry, while KubeVirt still
    // reports the pause, meets 409 "not paused" and writes it. Written
    // after the call, not before: a crash in between must not leave a
    // start-paused VMI paused for good.
    await record.markOpened(target);
    await known.markOpened(target);
    return true;
  };
}

const CLOUD_INIT_ANNOTATION = 'vmseed.io/cloud-init';
const GATE_ANNOTATION = 'vmseed.io/gate';

/**
 * A vmseed VMI (its seed from the annotation) that starts unpaused: no
 * admission webhook set the gate (none installed, or none answered when it
 * was created), and its first boot races the attach. Said once as a warning,
 * with the three ways out; undefined when gated, or when the owner accepts the
 * race with `vmseed.io/gate: "false"`.
 */
export function missingSeedGate(vmi: VmiObject): { code: ErrorCode; message: string; field: string } | undefined {
  const annotations = vmi.metadata.annotations ?? {};
  if (annotations[CLOUD_INIT_ANNOTATION] === undefined) return undefined;
  if (annotations[GATE_ANNOTATION] === 'false') return undefined;
  if (vmi.spec.startStrategy === 'Paused' && resumeAfterSeed(vmi)) return undefined;
  return {
    code: 'SEED_GATE_MISSING',
    field: 'spec.startStrategy',
    message:
      'no seed gate: the VM starts unpaused and its first boot may look for the seed before it is attached; ' +
      `set spec.startStrategy: Paused and the annotation ${RESUME_ANNOTATION}: "true" (on a VirtualMachine, in its template), ` +
      `install the admission webhook (deploy/webhook; installed, it was not reached) that sets them, or set ${GATE_ANNOTATION}: "false" to accept the race`,
  };
}
