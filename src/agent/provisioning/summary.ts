// What someone with only kubectl on a VMI's namespace sees of its
// provisioning: a short JSON summary in the annotation vmseed.io/provisioning
// (`kubectl get vmi X -o jsonpath='{.metadata.annotations.vmseed\.io/provisioning}'`).
//
// An annotation because KubeVirt leaves it alone: its VMI update admitter
// refuses spec changes and changes to its reserved kubevirt.io/ labels only,
// and virt-controller syncs only the annotations it lists (descheduler
// eviction keys and those an operator configures) from the VM. A condition
// would be overwritten by KubeVirt's own status updates; a label cannot
// hold a timestamp or a step name with `/`.
//
// Only names this agent or cloud-init's fixed vocabulary chose: the state,
// the boot count, the stage, the result, the failing step (a validated
// event name, at most 128 characters) and its module label, times, and our
// own reason text. Never a description: it is the guest's text.
//
// A contract other controllers read (docs/provisioning.md, "The contract
// (v1)"): `v` first; within v1 fields are only added, and a change of what
// a field or state means bumps it.
import type { ProvisioningStatus } from '../../status/snapshot.ts';
import { moduleLabel } from './timeline.ts';

/** The annotation that carries a VMI's provisioning summary (annotationValue). */
export const PROVISIONING_ANNOTATION = 'vmseed.io/provisioning';
/** The contract's version, the value's first field `v`. */
export const PROVISIONING_CONTRACT_VERSION = 1;
// The value's bound (the API server allows 256 KiB of annotations in all;
// this one stays a line).
export const MAX_ANNOTATION_LENGTH = 1024;
const MAX_REASON_LENGTH = 300;

// seed-read: the guest read its seed and cloud-init has not reported yet.
export type AnnotatedState = 'seed-read' | ProvisioningStatus['state'];

export const ANNOTATED_STATES: readonly AnnotatedState[] = [
  'seed-read',
  'running',
  'succeeded',
  'bootstrapped',
  'failed',
  'not-reported',
];

/** Every field of the value, in the order it is written; the documented table's rows. */
export const SUMMARY_FIELDS = [
  'v',
  'state',
  'boot',
  'stage',
  'result',
  'failedStep',
  'module',
  'at',
  'seconds',
  'reason',
  'sentinel',
] as const;

export interface ProvisioningSummary {
  v: typeof PROVISIONING_CONTRACT_VERSION;
  state: AnnotatedState;
  // Boots reported for this VMI by this agent (absent before the first event).
  boot?: number;
  // running: the stage the last events came from.
  stage?: string;
  result?: string;
  // failed: the first step that reported FAIL, and its module.
  failedStep?: string;
  module?: string;
  // When the state began: the seed read, the boot's first event, its finish.
  at: string;
  // succeeded / failed: seconds from the VMI first seen (first boot) or the
  // boot's first event to cloud-init's final stage.
  seconds?: number;
  // not-reported: why.
  reason?: string;
  // The user-data writes the Cluster API sentinel: `written` (bootstrapped)
  // or `unverified` (succeeded, vmseed cannot tell).
  sentinel?: 'written' | 'unverified';
}

/**
 * A VMI's provisioning as its annotation summarises it (`seedReadAt`: epoch ms);
 * undefined while there is nothing to say (the seed not read yet).
 */
export function provisioningSummary(
  p: ProvisioningStatus | undefined,
  seedReadAt: number | undefined,
): ProvisioningSummary | undefined {
  const v = PROVISIONING_CONTRACT_VERSION;
  if (!p)
    return seedReadAt === undefined ? undefined : { v, state: 'seed-read', at: new Date(seedReadAt).toISOString() };
  if (p.state === 'not-reported') {
    const at = seedReadAt === undefined ? p.seenAt : new Date(seedReadAt).toISOString();
    return {
      v,
      state: p.state,
      at: at ?? new Date(0).toISOString(),
      ...(p.reason ? { reason: p.reason.slice(0, MAX_REASON_LENGTH) } : {}),
    };
  }
  const boot = { boot: p.boot };
  if (p.state === 'running')
    return { v, state: p.state, ...boot, stage: p.stages.at(-1)?.name ?? '', at: p.firstEventAt ?? '' };
  return {
    v,
    state: p.state,
    ...boot,
    ...(p.result ? { result: p.result } : {}),
    ...(p.failure ? { failedStep: p.failure.step, module: moduleLabel(p.failure.step) } : {}),
    at: p.finishedAt ?? '',
    ...(p.seconds !== undefined ? { seconds: Math.round(p.seconds * 10) / 10 } : {}),
    ...(p.sentinel ? { sentinel: p.sentinel } : {}),
  };
}

/**
 * The annotation's value: one line of JSON within MAX_ANNOTATION_LENGTH. Without
 * the reason it is far below (two names of at most 128 characters, a timestamp
 * and short words), so only the reason is ever dropped.
 */
export function annotationValue(s: ProvisioningSummary): string {
  const text = JSON.stringify(s);
  if (text.length <= MAX_ANNOTATION_LENGTH) return text;
  return JSON.stringify({ ...s, reason: undefined });
}
