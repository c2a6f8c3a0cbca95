// The agent's one shutdown deadline, counted from the moment stop begins
// and seen by everything as AbortSignals: the reconciles in flight are
// cancelled at the deadline (--shutdown-timeout), the cancelled work has a
// short grace to settle after it, and closing the rest has a longer one.
// Every step of a reconcile takes its signal from here (forReconcile), and
// what waits for the stop waits for one of these signals, so there is one
// clock, not one timer per file.
import { cancelledBy } from '../errors.ts';

/** After the cancel, how long (ms) stop() waits for the cancelled work to settle. */
export const CANCEL_GRACE_MS = 1000;

/**
 * The one stop deadline of the agent, as AbortSignals: `reconciles` at the
 * deadline, `settled` CANCEL_GRACE_MS later, `closed` after the close grace.
 * arm() starts the clock (the first call counts).
 */
export class ShutdownDeadline {
  readonly #reconciles = new AbortController();
  readonly #settled = new AbortController();
  readonly #closed = new AbortController();
  readonly #timers: NodeJS.Timeout[] = [];
  #closeTimer: NodeJS.Timeout | undefined;
  #armed = false;

  // Aborted at the stop deadline: reconciles still running are cancelled
  // (virsh children, render workers, libvirt and API calls end; the
  // reconcile fails with CANCELLED).
  get reconciles(): AbortSignal {
    return this.#reconciles.signal;
  }

  // CANCEL_GRACE_MS after the deadline: the cancelled work had its chance
  // to settle.
  get settled(): AbortSignal {
    return this.#settled.signal;
  }

  // `closeGraceMs` after the deadline (when arm was given one): the stop's
  // last steps (closing listeners and connections) are abandoned.
  get closed(): AbortSignal {
    return this.#closed.signal;
  }

  // One reconcile's signal: it follows the deadline, and `own` (the
  // reconcile's own reasons to end, reconcile-signals.ts). Listeners a step
  // adds go with the reconcile's signal, not onto the process-wide one.
  forReconcile(own?: AbortSignal): AbortSignal {
    return AbortSignal.any(own ? [this.#reconciles.signal, own] : [this.#reconciles.signal]);
  }

  // Stop begins: the deadline is `deadlineMs` from now (the first call
  // counts; the command arms it with its close grace before the agent's
  // stop does). Ref'd timers: a stop waiting for hung work must still end.
  arm(deadlineMs: number, closeGraceMs?: number): void {
    if (this.#armed) return;
    this.#armed = true;
    const at = (ms: number, c: AbortController) => this.#timers.push(setTimeout(() => c.abort(), ms));
    at(deadlineMs, this.#reconciles);
    at(deadlineMs + CANCEL_GRACE_MS, this.#settled);
    if (closeGraceMs !== undefined)
      this.#closeTimer = setTimeout(() => this.#closed.abort(), deadlineMs + closeGraceMs);
  }

  // The reconciles stopped in time: nothing is left to cancel.
  drained(): void {
    for (const t of this.#timers.splice(0)) clearTimeout(t);
  }

  // The stop is over.
  dispose(): void {
    this.drained();
    clearTimeout(this.#closeTimer);
  }
}

/** Resolves when `signal` aborts (at once if it has). */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
}

// A step of a reconcile that cannot be interrupted half way (a synchronous
// build, a file write) does not start once the deadline has passed.
export function throwIfCancelled(signal: AbortSignal | undefined, what: string): void {
  if (signal?.aborted) throw cancelledBy(signal, what);
}
