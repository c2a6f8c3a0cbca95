// The bytes the libvirt side may hold at once, across every connection of
// one ConnectionManager: frames being received plus cached domain handles.
// A launcher's daemon is not trusted (a guest that escaped owns it), so
// what it can make the agent keep is reserved here before it is allocated.

// 32 MiB. The DaemonSet's memory limit is 256 MiB; what lies above the
// agent's peak with 1,000 VMIs, hostile launchers or not (measured:
// `npm run bench:agent` and `npm run bench:hostile-launcher`, figures in
// docs/operations.md and docs/libvirt-rpc.md, "An untrusted daemon"), is
// headroom for GC and virsh children, and a third of it is what libvirt
// traffic may take. Real frames are a few KiB of domain XML that arrive
// whole. One connection holds at most a partial frame (4 MiB, the frame
// limit) and 1 MiB of handles, so it takes six or more misbehaving
// launchers at once to reach the budget; then the connection that asks for
// more is closed.
export const LIBVIRT_MEMORY_BUDGET_BYTES = 32 * 1024 * 1024;

export class MemoryBudget {
  readonly limit: number;
  #used = 0;

  constructor(limit: number = LIBVIRT_MEMORY_BUDGET_BYTES) {
    this.limit = limit;
  }

  // Reserves `n` bytes; false (nothing reserved) when that would pass the limit.
  take(n: number): boolean {
    if (this.#used + n > this.limit) return false;
    this.#used += n;
    return true;
  }

  give(n: number): void {
    this.#used = Math.max(0, this.#used - n);
  }

  get used(): number {
    return this.#used;
  }

  get free(): number {
    return this.limit - this.#used;
  }
}
