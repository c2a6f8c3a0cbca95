// Guests that asked for their seed before it was served. A token that
// found no seed (the VMI not rendered yet, or not known to this agent yet)
// is remembered; when the same token is later answered with a seed, that
// VMI's guest looked before its seed existed: it was seeded after boot.
//
// Nothing can be verified at the miss (the token is an HMAC of a UID no one
// here knows yet), so what is remembered is only a hash of the token, with
// the time, and it counts only when that token is later served, i.e. when it
// verified. Sprayed tokens never verify and so never count; what they can
// cost is bounded: each source address holds at most PER_SOURCE entries (a
// guest has one token), the whole map at most MAX entries (the oldest go
// first), and an entry expires after TTL. A spray from many addresses can
// push a real early miss out: then it is not counted (never counted wrongly).
import { createHash } from 'node:crypto';

export const EARLY_MISSES_MAX = 4096;
export const EARLY_MISSES_PER_SOURCE = 16;
export const EARLY_MISS_TTL_MS = 60 * 60_000;

interface Miss {
  at: Date;
  monotonicMs: number;
  source: string;
}

export interface EarlyMissLimits {
  max?: number;
  perSource?: number;
  ttlMs?: number;
}

function keyOf(token: string): string {
  return createHash('sha256').update(token).digest('base64');
}

export class EarlyMisses {
  // Insertion order is arrival order: the first entry is the oldest.
  readonly #misses = new Map<string, Miss>();
  readonly #perSource = new Map<string, number>();
  readonly #max: number;
  readonly #perSourceMax: number;
  readonly #ttlMs: number;

  constructor(limits: EarlyMissLimits = {}) {
    this.#max = limits.max ?? EARLY_MISSES_MAX;
    this.#perSourceMax = limits.perSource ?? EARLY_MISSES_PER_SOURCE;
    this.#ttlMs = limits.ttlMs ?? EARLY_MISS_TTL_MS;
  }

  get size(): number {
    return this.#misses.size;
  }

  // A token found no seed. The first miss of a token is the one kept.
  missed(token: string, source: string, at: Date, monotonicMs: number): void {
    this.#expire(monotonicMs);
    const key = keyOf(token);
    if (this.#misses.has(key)) return;
    const held = this.#perSource.get(source) ?? 0;
    if (held >= this.#perSourceMax) return;
    if (this.#misses.size >= this.#max) this.#remove(this.#misses.keys().next().value!);
    this.#misses.set(key, { at, monotonicMs, source });
    this.#perSource.set(source, held + 1);
  }

  // A token was answered with a seed: when it first found none, if it did
  // (within the TTL). Each miss is reported once.
  served(token: string, monotonicMs: number): Date | undefined {
    this.#expire(monotonicMs);
    const key = keyOf(token);
    const miss = this.#misses.get(key);
    if (miss === undefined) return undefined;
    this.#remove(key);
    return miss.at;
  }

  #expire(nowMs: number): void {
    for (const [key, miss] of this.#misses) {
      if (nowMs - miss.monotonicMs < this.#ttlMs) return;
      this.#remove(key);
    }
  }

  #remove(key: string): void {
    const miss = this.#misses.get(key);
    if (miss === undefined) return;
    this.#misses.delete(key);
    const left = (this.#perSource.get(miss.source) ?? 1) - 1;
    if (left <= 0) this.#perSource.delete(miss.source);
    else this.#perSource.set(miss.source, left);
  }
}
