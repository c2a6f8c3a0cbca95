// Capped exponential backoff: base * 2^(failures-1), at most max.
/** The first delay and the cap of a backoff, in ms. */
export interface BackoffPolicy {
  baseMs: number;
  maxMs: number;
}

/**
 * The delay (ms) before the next try after `failures` consecutive failures:
 * 0 for none, then baseMs doubling up to maxMs.
 */
export function backoffDelay(policy: BackoffPolicy, failures: number): number {
  if (failures <= 0) return 0;
  return Math.min(policy.maxMs, policy.baseMs * 2 ** Math.min(failures - 1, 30));
}
