import type { VmiObject } from '../api/objects.ts';

/**
 * The timestamp recorded in a VMI's seed image: its creationTimestamp (else the epoch), not the
 * clock, so the same seed always gives the same bytes and hash: across agent restarts, between the
 * agent and `vmseed build --vmi`.
 */
export function seedTimestamp(vmi: VmiObject): Date {
  const t = Date.parse(vmi.metadata.creationTimestamp ?? '');
  return new Date(Number.isFinite(t) ? t : 0);
}
