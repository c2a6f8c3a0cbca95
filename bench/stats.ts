// What every benchmark's table reports, computed one way.

// Nearest-rank quantile (q in 0..1) of the values, in any order.
export function quantile(values: readonly number[], q: number): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

// Polls every ~1 ms (a setImmediate spin would take a core from the agent
// on a small machine); the error is at most a millisecond, upwards.
export async function until(pred: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs;
  while (!pred()) {
    if (performance.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 1));
  }
  return true;
}
