// Token bucket per key (the caller's source address). Memory is bounded:
// when more than maxKeys buckets exist, buckets that have refilled (so
// forgetting them changes nothing) are dropped first, then the oldest.
export interface RateLimiterOptions {
  ratePerSecond: number;
  burst: number;
  maxKeys?: number;
  // Monotonic milliseconds; injected so tests control time.
  now?: () => number;
}

interface Bucket {
  tokens: number;
  at: number;
}

/**
 * A token bucket per key, with bounded memory (see the module comment).
 * The constructor throws a RangeError unless ratePerSecond > 0 and burst >= 1.
 */
export class RateLimiter {
  readonly #rate: number;
  readonly #burst: number;
  readonly #maxKeys: number;
  readonly #now: () => number;
  readonly #buckets = new Map<string, Bucket>();

  constructor(options: RateLimiterOptions) {
    if (!(options.ratePerSecond > 0) || !(options.burst >= 1)) {
      throw new RangeError('rate limiter needs ratePerSecond > 0 and burst >= 1');
    }
    this.#rate = options.ratePerSecond;
    this.#burst = options.burst;
    this.#maxKeys = options.maxKeys ?? 10_000;
    this.#now = options.now ?? (() => performance.now());
  }

  get size(): number {
    return this.#buckets.size;
  }

  // True when the request may proceed (one token taken).
  take(key: string): boolean {
    const now = this.#now();
    let b = this.#buckets.get(key);
    if (b === undefined) {
      if (this.#buckets.size >= this.#maxKeys) this.#evict(now);
      b = { tokens: this.#burst, at: now };
      this.#buckets.set(key, b);
    } else {
      b.tokens = Math.min(this.#burst, b.tokens + ((now - b.at) / 1000) * this.#rate);
      b.at = now;
    }
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  #evict(now: number): void {
    for (const [k, b] of this.#buckets) {
      if (b.tokens + ((now - b.at) / 1000) * this.#rate >= this.#burst) this.#buckets.delete(k);
    }
    // Still full (a flood from many addresses): drop the oldest tenth. Map
    // iteration is insertion order, so these are the longest-known keys.
    if (this.#buckets.size >= this.#maxKeys) {
      let n = Math.max(1, Math.floor(this.#maxKeys / 10));
      for (const k of this.#buckets.keys()) {
        if (n-- <= 0) break;
        this.#buckets.delete(k);
      }
    }
  }
}
