// A guest that asked the NoCloud HTTP datasource for its seed before the
// seed was served, and got it later (src/datasource/early.ts): it was
// seeded after boot, and that is observed, not inferred. What the VMI's
// status keeps about it, and the warning that names the way out.
import type { VmiObject } from '../../api/objects.ts';
import type { Problem } from '../vmi-status.ts';

/** A VMI's late-seed warning, kept in its record for the object of `uid`. */
export interface LateSeedFacts {
  uid: string;
  warning: Problem;
}

/**
 * The warning, or undefined when the miss cannot have been this VMI's guest:
 * it came before the VMI was created (a serial its owner set in a VM's
 * template, which every VMI of that VM carries, asked for by the guest of an
 * earlier one). creationTimestamp has whole seconds, so a miss
 * in the VMI's first second counts.
 */
export function lateSeedWarning(vmi: VmiObject, missedAt: Date, servedAt: Date): Problem | undefined {
  const created = Date.parse(vmi.metadata.creationTimestamp ?? '');
  if (Number.isFinite(created) && missedAt.getTime() < created) return undefined;
  return {
    code: 'SEEDED_AFTER_BOOT',
    message:
      `the guest asked the NoCloud HTTP datasource for its seed at ${missedAt.toISOString()}, before it was served, ` +
      `and got it at ${servedAt.toISOString()}: it may have booted without it; hold the first boot until the seed is ` +
      'in place with the seed gate (spec.startStrategy: Paused and vmseed.io/resume-after-seed: "true", which the ' +
      'admission webhook in deploy/webhook sets)',
  };
}

/**
 * Adds the kept warning to every later status of the same object (`uid`): the
 * guest booted without its seed, and that stays true while the VMI lives.
 */
export function withLateSeed(warnings: Problem[], facts: LateSeedFacts | undefined, uid: string): Problem[] {
  if (!facts || facts.uid !== uid || warnings.some((w) => w.code === facts.warning.code)) return warnings;
  return [...warnings, facts.warning];
}
