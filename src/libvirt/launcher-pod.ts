// Which virt-launcher pods hold a VMI's libvirt on this node, and what each
// one gets. KubeVirt keeps `status.activePods` (pod UID → node name) for every
// pod the VMI owns, and `status.migrationState` (KubeVirt
// staging/src/kubevirt.io/api/core/v1/types.go,
// VirtualMachineInstanceMigrationState) while and after it migrates. Pod UIDs
// become path components and a socket URI: anything that is not a UUID is
// refused before it is used.
import { VmseedError } from '../errors.ts';
import type { InjectionTarget } from './injector-contract.ts';

// Kubernetes pod UIDs are RFC 4122 UUIDs (apimachinery util/uuid).
const UUID_RE = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
// A VMI has one launcher pod, two while it migrates; a few more while failed
// ones are being deleted. Anything beyond is not KubeVirt's.
const MAX_ACTIVE_PODS = 16;

/** Whether `uid` is a UUID, and so safe to use as a path component or in a socket URI. */
export function isPodUid(uid: string): boolean {
  return UUID_RE.test(uid);
}

/**
 * The pod UIDs `status.activePods` places on `nodeName`, sorted; not yet
 * checked as UUIDs (checkLauncherPods, isPodUid). Any malformed map gives [].
 */
export function launcherPodsOnNode(activePods: unknown, nodeName: string): string[] {
  if (activePods === null || typeof activePods !== 'object') return [];
  return Object.entries(activePods as Record<string, unknown>)
    .filter(([uid, node]) => node === nodeName && uid !== '')
    .map(([uid]) => uid)
    .sort();
}

function invalid(target: { namespace: string; name: string }, why: string): VmseedError {
  return new VmseedError(
    'LAUNCHER_POD_INVALID',
    `VMI ${target.namespace}/${target.name}: status.activePods ${why}; nothing was written. KubeVirt writes pod UIDs there: check what else updates this VMI's status`,
    { kind: 'terminal', field: 'status.activePods' },
  );
}

// Every pod UID of this node checked before any is used in a path.
export function checkLauncherPods(target: { namespace: string; name: string }, pods: readonly string[]): void {
  if (pods.length > MAX_ACTIVE_PODS)
    throw invalid(target, `names ${pods.length} pods on this node (at most ${MAX_ACTIVE_PODS})`);
  for (const p of pods) {
    if (!isPodUid(p)) throw invalid(target, `holds '${p.slice(0, 64)}', which is not a pod UID`);
  }
}

/**
 * The one launcher pod UID of the target, or a retryable LAUNCHER_POD_UNKNOWN
 * (none or several); LAUNCHER_POD_INVALID (terminal) when a UID is not one.
 */
export function launcherPodOf(target: InjectionTarget): string {
  const pods = target.launcherPods ?? [];
  checkLauncherPods(target, pods);
  if (pods.length === 1) return pods[0];
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
    `VMI ${vmi}: status.activePods names ${pods.length} launcher pods on this node and neither the migration state nor their domains tell which one runs the VM; will retry once one remains`,
    { kind: 'retryable', field: 'status.activePods' },
  );
}

/** The fields of KubeVirt's VirtualMachineInstanceMigrationState vmseed reads (pods by name). */
export interface MigrationState {
  targetNode?: string;
  targetPod?: string;
  sourceNode?: string;
  sourcePod?: string;
  startTimestamp?: string;
  endTimestamp?: string;
  completed?: boolean;
  failed?: boolean;
}

/** The migration state of a VMI's `status`, its strings checked; undefined when there is none. */
export function migrationStateOf(status: unknown): MigrationState | undefined {
  const m = (status as { migrationState?: unknown } | undefined)?.migrationState;
  if (m === null || typeof m !== 'object') return undefined;
  const o = m as Record<string, unknown>;
  const str = (k: string) => (typeof o[k] === 'string' && o[k] !== '' ? o[k] : undefined);
  const out: MigrationState = { completed: o.completed === true, failed: o.failed === true };
  for (const k of ['targetNode', 'targetPod', 'sourceNode', 'sourcePod', 'startTimestamp', 'endTimestamp'] as const) {
    const v = str(k);
    if (v !== undefined) out[k] = v;
  }
  return out;
}

/** A migration KubeVirt has not finished, one way or the other. */
export function migrationInProgress(m: MigrationState | undefined): m is MigrationState & { targetNode: string } {
  return m !== undefined && m.targetNode !== undefined && !m.completed && !m.failed;
}

// What vmseed did on this node for the VMI's current launcher pods.
export interface LauncherMemory {
  // The pod whose domain got the disk.
  attachedPod?: string;
  // Migration targets that got the file only.
  stagedPods: string[];
}

/** What the reconciler does with each of the VMI's launcher pods on this node (planLaunchers). */
export interface LauncherPlan {
  // The pod whose domain gets (or keeps) the seed disk; none while this node
  // only receives a migration or nothing is known yet.
  attachTo?: string;
  // Migration targets on this node: the image at the same path, no disk (the
  // migrated domain brings it: QEMU on the target opens the same path).
  stageIn: string[];
  // Pods on this node that held our copy and no longer run the VM.
  releaseFrom: string[];
  // A migration to this node is under way.
  receiving: boolean;
}

// Which of this node's pods has the domain running or paused (not one that
// only waits for an incoming migration); undefined: cannot tell.
export type ActiveDomainProbe = (pods: string[]) => Promise<string[] | undefined>;

/**
 * Which of the node's launcher pods gets the disk, which only the image (a
 * migration arriving) and which lose our copy. Throws LAUNCHER_POD_INVALID
 * (terminal) for UIDs that are not ones, and LAUNCHER_POD_UNKNOWN
 * (retryable) while several pods remain and nothing tells which runs the VM.
 */
export async function planLaunchers(
  target: { namespace: string; name: string },
  pods: string[],
  migration: MigrationState | undefined,
  nodeName: string,
  memory: LauncherMemory,
  probe?: ActiveDomainProbe,
): Promise<LauncherPlan> {
  checkLauncherPods(target, pods);
  const known = [...(memory.attachedPod ? [memory.attachedPod] : []), ...memory.stagedPods];
  const gone = known.filter((p) => !pods.includes(p));
  if (migrationInProgress(migration) && migration.targetNode === nodeName) {
    // Receiving: the image goes into every target pod here, and no disk is
    // touched (libvirt refuses device changes while a migration job runs;
    // the migrated domain brings our disk). Same node: the pod we attached to
    // is the source and is left alone. A source we do not remember (after a
    // restart) gets a publish at most: identical bytes are kept and nothing
    // is pruned while staging.
    const source =
      migration.sourceNode === nodeName && memory.attachedPod && pods.includes(memory.attachedPod)
        ? memory.attachedPod
        : undefined;
    return { stageIn: pods.filter((p) => p !== source), releaseFrom: gone, receiving: true };
  }
  if (pods.length <= 1) {
    return { stageIn: [], releaseFrom: gone, receiving: false, ...(pods.length === 1 ? { attachTo: pods[0] } : {}) };
  }
  // Several pods here and no migration in progress: one has just finished
  // (a same-node migration's source pod not yet deleted) or failed (its
  // target), or a crashed launcher is being replaced.
  let current: string | undefined;
  const staged = memory.stagedPods.filter((p) => pods.includes(p));
  if (migration?.completed && migration.targetNode === nodeName && staged.length === 1) current = staged[0];
  else if (migration?.failed && memory.attachedPod && pods.includes(memory.attachedPod)) current = memory.attachedPod;
  else if (probe) {
    const active = await probe(pods);
    if (active?.length === 1) current = active[0];
  }
  if (current === undefined) {
    // Same as KubeVirt's virt-handler (hotplug-disk mount.go,
    // findVirtlauncherUID): rather than guess, retry until it settles.
    launcherPodOf({ ...target, uid: '', datasource: 'nocloud', annotations: {}, launcherPods: pods });
  }
  return {
    attachTo: current!,
    stageIn: [],
    releaseFrom: [...gone, ...pods.filter((p) => p !== current)],
    receiving: false,
  };
}
