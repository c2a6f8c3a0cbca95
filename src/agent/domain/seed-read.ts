// When the guest read its seed disk, seen from outside the guest: after our
// disk is attached, libvirt's block statistics of that disk are polled with
// backoff until the first read (rd_req > 0), the domain goes away, or the
// bound passes. Only VMIs between attach and read are polled; a read one is
// never polled again. Any read counts, the guest kernel's probe of a new
// disk included: it says the guest saw the disk, not that cloud-init used it.
//
// The domain's start time is when this agent received libvirt's "started"
// event for it. A domain started while the agent was not listening (before
// it watched the launcher's libvirt, or before the agent ran) has no start
// time: its margins are unknown, never estimated.
import type { Logger } from 'pino';
import { isVmseedError } from '../../errors.ts';
import { domainId, type BlockStats, type LibvirtEvent } from '../../libvirt/libvirt-client.ts';
import type { VmiStatusRecord } from '../../status/snapshot.ts';
import type { FirstBootFacts, VmiRecords } from '../vmi-records.ts';

/**
 * What the seed-read watch needs of libvirt: its events (domain starts) and a
 * disk's block statistics (the RPC client has both).
 */
export interface SeedReadClient {
  onEvent(listener: (e: LibvirtEvent) => void): () => void;
  blockStats(uri: string, domain: string, target: string, o?: { timeoutMs?: number }): Promise<BlockStats>;
}

/**
 * How the seed disk's block statistics are polled after the attach (all in ms);
 * SEED_READ_POLICY is the default.
 */
export interface SeedReadPolicy {
  // The first poll after the attach, doubled after each poll up to maxMs.
  firstMs: number;
  maxMs: number;
  // Polling ends this long after the attach.
  boundMs: number;
  // Per block-stats call.
  timeoutMs: number;
}

export const SEED_READ_POLICY: SeedReadPolicy = { firstMs: 100, maxMs: 5_000, boundMs: 15 * 60_000, timeoutMs: 5_000 };

// Start times kept per domain (events of every domain on a watched libvirt
// arrive, a hostile launcher's too); the oldest go first.
export const STARTS_MAX = 4096;
// VMIs polled at once; an attach beyond it is recorded but not polled.
export const POLLING_MAX = 1024;

/** Our disk's attach to a domain, as the reconciler reports it (`attachedAt`: epoch ms). */
export interface Attach {
  uri: string;
  domain: string;
  targetDev: string;
  attachedAt: number;
}

export interface SeedReadWatchOptions {
  client: SeedReadClient;
  records: VmiRecords;
  // Told when a VMI's facts changed (read, bound passed, domain gone).
  onChange: (key: string, facts: FirstBootFacts) => void;
  logger: Logger;
  policy?: SeedReadPolicy;
  now?: () => number;
}

interface Poll {
  facts: FirstBootFacts;
  timer: NodeJS.Timeout | undefined;
  delayMs: number;
  stopped: boolean;
}

// The domain (or our disk in it) is not there, or not running, any more.
const GONE = new Set(['DOMAIN_NOT_FOUND', 'DEVICE_NOT_FOUND', 'DOMAIN_STATE_UNSUPPORTED']);

/**
 * Records when each domain started and when its guest first read our seed disk
 * (VmiRecord.firstBoot): start() before any watch so no start event is missed,
 * attached() after each attach, forget() when the VMI goes.
 */
export class SeedReadWatch {
  readonly #o: SeedReadWatchOptions;
  readonly #policy: SeedReadPolicy;
  // uri+domain -> when its last start event arrived, and its number.
  readonly #starts = new Map<string, { at: number; n: number }>();
  #startCount = 0;
  readonly #polls = new Map<string, Poll>();
  #unsubscribe: (() => void) | undefined;

  constructor(options: SeedReadWatchOptions) {
    this.#o = options;
    this.#policy = options.policy ?? SEED_READ_POLICY;
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  start(): void {
    this.#unsubscribe ??= this.#o.client.onEvent((e) => this.#onEvent(e));
  }

  stop(): void {
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    for (const key of [...this.#polls.keys()]) this.#end(key);
  }

  // When libvirt said the domain started, if this agent heard it.
  startedAt(uri: string, domain: string): number | undefined {
    return this.#starts.get(domainId(uri, domain))?.at;
  }

  get polling(): number {
    return this.#polls.size;
  }

  #onEvent(e: LibvirtEvent): void {
    if (e.type !== 'lifecycle') return;
    const id = domainId(e.uri, e.domain);
    if (e.event === 'started') {
      this.#starts.delete(id);
      if (this.#starts.size >= STARTS_MAX) this.#starts.delete(this.#starts.keys().next().value!);
      this.#starts.set(id, { at: this.#now(), n: ++this.#startCount });
    } else if (e.event === 'stopped' || e.event === 'undefined' || e.event === 'crashed') {
      this.#starts.delete(id);
      for (const [key, p] of this.#polls)
        if (domainId(p.facts.uri, p.facts.domain) === id) this.#finish(key, 'domain-gone');
    }
  }

  // Our disk was just attached to the VMI's domain (not replaced: a new seed
  // in a domain that has run for a while says nothing about its boot). The
  // first attach after a start is the one kept; the record says when the
  // domain started, when the disk came, and starts the polls.
  attached(key: string, uid: string, a: Attach): FirstBootFacts | undefined {
    const r = this.#o.records.get(key);
    if (!r) return undefined;
    const started = this.#starts.get(domainId(a.uri, a.domain));
    const had = r.firstBoot;
    if (had && had.uid === uid && had.uri === a.uri && had.domain === a.domain && had.start === started?.n)
      return undefined;
    this.#end(key);
    const facts: FirstBootFacts = {
      uid,
      uri: a.uri,
      domain: a.domain,
      targetDev: a.targetDev,
      ...(started && started.at <= a.attachedAt ? { startedAt: started.at, start: started.n } : {}),
      attachedAt: a.attachedAt,
      watch: this.#polls.size >= POLLING_MAX ? 'not-polled' : 'polling',
    };
    r.firstBoot = facts;
    if (facts.watch === 'polling') {
      const p: Poll = { facts, timer: undefined, delayMs: this.#policy.firstMs, stopped: false };
      this.#polls.set(key, p);
      this.#schedule(key, p);
    }
    return facts;
  }

  /** The VMI ended: nothing is polled for it any more. */
  forget(key: string): void {
    this.#end(key);
  }

  /** Whether the VMI's disk is being polled. */
  holds(key: string): boolean {
    return this.#polls.has(key);
  }

  #schedule(key: string, p: Poll): void {
    p.timer = setTimeout(() => void this.#poll(key, p), p.delayMs);
    p.timer.unref();
    p.delayMs = Math.min(this.#policy.maxMs, p.delayMs * 2);
  }

  async #poll(key: string, p: Poll): Promise<void> {
    p.timer = undefined;
    const f = p.facts;
    let stats: BlockStats | undefined;
    try {
      stats = await this.#o.client.blockStats(f.uri, f.domain, f.targetDev, { timeoutMs: this.#policy.timeoutMs });
    } catch (e) {
      if (p.stopped) return;
      // Our disk or its domain is not there any more: nothing to wait for.
      if (isVmseedError(e) && GONE.has(e.code)) return this.#finish(key, 'domain-gone');
      this.#o.logger.debug({ key, code: isVmseedError(e) ? e.code : 'error' }, 'block stats of the seed disk failed');
    }
    if (p.stopped) return;
    if (stats && stats.rdReq > 0) {
      f.readAt = this.#now();
      return this.#finish(key, 'read');
    }
    if (this.#now() - f.attachedAt >= this.#policy.boundMs) return this.#finish(key, 'not-read');
    this.#schedule(key, p);
  }

  #finish(key: string, watch: FirstBootFacts['watch']): void {
    const p = this.#polls.get(key);
    if (!p) return;
    this.#end(key);
    p.facts.watch = watch;
    // The record may have moved on to another object meanwhile.
    if (this.#o.records.get(key)?.firstBoot !== p.facts) return;
    try {
      this.#o.onChange(key, p.facts);
    } catch (e) {
      this.#o.logger.error({ key, err: { message: (e as Error).message } }, 'recording the seed read failed');
    }
  }

  #end(key: string): void {
    const p = this.#polls.get(key);
    if (!p) return;
    p.stopped = true;
    if (p.timer) clearTimeout(p.timer);
    this.#polls.delete(key);
  }
}

export type { FirstBootFacts };

/** The facts as the status page shows them: ISO times, margins in seconds. */
export function firstBootStatus(f: FirstBootFacts): NonNullable<VmiStatusRecord['firstBoot']> {
  const iso = (ms: number) => new Date(ms).toISOString();
  const seconds = (from: number | undefined, to: number | undefined) =>
    from === undefined || to === undefined ? undefined : Math.max(0, to - from) / 1000;
  const out: NonNullable<VmiStatusRecord['firstBoot']> = { attachedAt: iso(f.attachedAt), watch: f.watch };
  if (f.startedAt !== undefined) out.domainStartedAt = iso(f.startedAt);
  const margin = seconds(f.startedAt, f.attachedAt);
  if (margin !== undefined) out.attachAfterStartSeconds = margin;
  if (f.readAt !== undefined) {
    out.seedReadAt = iso(f.readAt);
    out.readAfterAttachSeconds = seconds(f.attachedAt, f.readAt)!;
    const fromStart = seconds(f.startedAt, f.readAt);
    if (fromStart !== undefined) out.readAfterStartSeconds = fromStart;
  }
  return out;
}
