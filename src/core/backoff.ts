// Capped exponential backoff: base * 2^(failures-1), at most max.
export interface BackoffPolicy {
  baseMs: number;
  maxMs: number;
}

export function backoffDelay(policy: BackoffPolicy, failures: number): number {
  if (failures <= 0) return 0;
  return Math.min(policy.maxMs, policy.baseMs * 2 ** Math.min(failures - 1, 30));
}
