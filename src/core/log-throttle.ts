// At most one log line per kind of failure per interval, counting the ones
// held back since the last line: a flood is seen, not logged event by event.
// The caller keeps its own clock and its own log call; this only decides.

export const LOG_EVERY_MS = 60_000;
// Kinds tracked at once. Every caller's kinds are a closed set of a few
// (write results, refusal reasons, bucket scopes, guard statuses); the cap
// keeps the memory bounded should one ever be keyed by something open.
export const MAX_KINDS = 64;

export interface LogThrottleOptions {
  everyMs?: number;
  maxKinds?: number;
}

// Spread into an admitted line's fields: empty on a kind's first line,
// otherwise how many lines of the kind were held back since its previous one.
export type Admitted = { readonly suppressedSinceLast?: number };

const FIRST: Admitted = Object.freeze({});

interface Window {
  at: number;
  suppressed: number;
}

/**
 * Decides which failure log lines to write: admit(kind, now) answers undefined
 * to hold a line back, else fields that count the lines held back since the
 * kind's last one (at most one per kind per \`everyMs\`, default LOG_EVERY_MS).
 */
export class LogThrottle<K> {
  readonly #everyMs: number;
  readonly #maxKinds: number;
  // In order of last admission, oldest first.
  readonly #windows = new Map<K, Window>();

  constructor(options: LogThrottleOptions = {}) {
    this.#everyMs = options.everyMs ?? LOG_EVERY_MS;
    this.#maxKinds = options.maxKinds ?? MAX_KINDS;
    if (!Number.isInteger(this.#maxKinds) || this.#maxKinds < 1) {
      throw new RangeError(`maxKinds must be a positive integer, got ${this.#maxKinds}`);
    }
  }

  // `now`: milliseconds on one clock the caller uses for every call.
  // undefined: hold the line back (it is counted).
  admit(kind: K, now: number): Admitted | undefined {
    const last = this.#windows.get(kind);
    if (last !== undefined && now - last.at < this.#everyMs) {
      last.suppressed++;
      return undefined;
    }
    this.#windows.delete(kind);
    this.#evictOldest();
    this.#windows.set(kind, { at: now, suppressed: 0 });
    return last === undefined ? FIRST : { suppressedSinceLast: last.suppressed };
  }

  // The kind admitted longest ago goes: its next line is admitted at once
  // (as a first one) rather than a new kind's line being held back unseen.
  #evictOldest(): void {
    if (this.#windows.size < this.#maxKinds) return;
    const oldest = this.#windows.keys().next();
    if (!oldest.done) this.#windows.delete(oldest.value);
  }

  // Kinds tracked now (tests).
  get size(): number {
    return this.#windows.size;
  }
}
