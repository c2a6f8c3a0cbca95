// The seed's attach, made ready while a domain is defined but not started
// and sent the moment libvirt says it started. KubeVirt's launcher defines
// the domain, then starts it (not paused, unless the VMI asks) a moment
// later; the seed can only go to the running domain (its persistent config
// is KubeVirt's), and a guest that looks for it once at boot finds it only
// if it is there before the firmware is done. Going through a reconcile
// after the start event (queue, render check, image check, a read of the
// domain) costs as much again as libvirt's attach itself; this sends the
// attach from the event, and the reconcile that follows finds it done.
import { domainId, type LibvirtClient, type LibvirtEvent } from './libvirt-client.ts';
import type { DomainTurn } from './domain-lock.ts';

export interface Prepared {
  // The disk's XML and what identifies it in the live domain afterwards.
  xml: string;
  source: string;
  targetDev: string;
  bus: 'virtio' | 'scsi';
  // The VMI's key (namespace/name): the attach goes when the VMI ends.
  key: string;
}

export interface Sent extends Omit<Prepared, 'xml'> {
  // Epoch ms: when libvirt confirmed the attach.
  at: number;
}

// Both maps hold at most this many domains (oldest dropped first): a
// launcher defining domains that never start cannot grow them.
const MAX_DOMAINS = 4096;

export class PreparedAttaches {
  readonly #client: LibvirtClient;
  // Runs one change of a domain at a time (the injector's per-domain lock):
  // the attach takes its turn at once, from the event's callback, ahead of
  // the reconcile the same event starts, and the client's call runs in it.
  readonly #serialize: (id: string, fn: (turn: DomainTurn) => Promise<void>) => Promise<void>;
  readonly #timeoutMs: number;
  readonly #prepared = new Map<string, Prepared>();
  readonly #sent = new Map<string, Sent>();
  // Attaches sent from a start event whose answer has not come yet.
  readonly #sending = new Map<string, Promise<void>>();
  #off: (() => void) | undefined;

  constructor(options: {
    client: LibvirtClient;
    serialize: (id: string, fn: (turn: DomainTurn) => Promise<void>) => Promise<void>;
    timeoutMs: number;
  }) {
    this.#client = options.client;
    this.#serialize = options.serialize;
    this.#timeoutMs = options.timeoutMs;
    // Subscribed when made, so before the agent's listeners (they subscribe
    // when it starts): the attach is queued before any of them runs.
    if (this.usable) this.#off = this.#client.onEvent((e) => this.#onEvent(e));
  }

  // Only where libvirt sends events (the RPC client); without them there is
  // no start to send it from.
  get usable(): boolean {
    return this.#client.supportsEvents;
  }

  // The attach to send when `domain` starts. A later call for the same
  // domain replaces it (the seed changed while the domain waited).
  prepare(uri: string, domain: string, p: Prepared): void {
    if (!this.#off) return;
    const id = domainId(uri, domain);
    remember(this.#prepared, id, p);
  }

  // The VMI went (or its seed is being taken out): nothing is sent any more.
  drop(uri: string, domain: string): void {
    const id = domainId(uri, domain);
    this.#prepared.delete(id);
    this.#sent.delete(id);
  }

  // The attach sent for `domain` at its start, if it placed exactly this
  // disk; told once.
  take(uri: string, domain: string, wanted: Pick<Prepared, 'source' | 'targetDev' | 'bus'>): Sent | undefined {
    const id = domainId(uri, domain);
    const s = this.#sent.get(id);
    if (!s) return undefined;
    this.#sent.delete(id);
    return s.source === wanted.source && s.targetDev === wanted.targetDev && s.bus === wanted.bus ? s : undefined;
  }

  get size(): number {
    return this.#prepared.size;
  }

  /**
   * The VMI under `key` ended: its attaches, prepared or sent and not yet
   * taken, go whichever domain they were for (its launcher pod may have
   * changed since). One sent and not answered yet is left to finish.
   */
  forget(key: string): void {
    for (const map of [this.#prepared, this.#sent]) for (const [id, p] of map) if (p.key === key) map.delete(id);
  }

  /** Whether an attach is prepared or sent for the VMI under `key`. */
  holds(key: string): boolean {
    for (const map of [this.#prepared, this.#sent]) for (const p of map.values()) if (p.key === key) return true;
    return false;
  }

  // The attach sent at `domain`'s start, until libvirt answered it.
  sending(uri: string, domain: string): Promise<void> | undefined {
    return this.#sending.get(domainId(uri, domain));
  }

  stop(): void {
    this.#off?.();
    this.#off = undefined;
    this.#prepared.clear();
    this.#sent.clear();
    this.#sending.clear();
  }

  #onEvent(e: LibvirtEvent): void {
    if (e.type !== 'lifecycle') return;
    const id = domainId(e.uri, e.domain);
    if (e.event === 'stopped' || e.event === 'undefined' || e.event === 'crashed') {
      this.#sent.delete(id);
      return;
    }
    if (e.event !== 'started') return;
    const p = this.#prepared.get(id);
    if (!p) return;
    this.#prepared.delete(id);
    const { uri, domain } = e;
    // A failure is left to the reconcile this event also starts (once this
    // is answered): it reads the domain and attaches (or reports why not)
    // as it always does.
    const sending = this.#serialize(id, async (turn) => {
      await this.#client.attachDevice(uri, domain, p.xml, {
        live: true,
        config: false,
        timeoutMs: this.#timeoutMs,
        turn,
      });
      remember(this.#sent, id, { source: p.source, targetDev: p.targetDev, bus: p.bus, key: p.key, at: Date.now() });
    }).catch(() => {});
    // At most one per prepared domain, gone once answered.
    this.#sending.set(id, sending);
    void sending.then(() => {
      if (this.#sending.get(id) === sending) this.#sending.delete(id);
    });
  }
}

function remember<V>(map: Map<string, V>, id: string, value: V): void {
  map.delete(id);
  if (map.size >= MAX_DOMAINS) map.delete(map.keys().next().value!);
  map.set(id, value);
}
