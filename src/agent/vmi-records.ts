// Everything the agent holds about one VMI key, in one record: what the
// status page shows, what is on disk and in the domain, and the facts the
// reconciler keeps between reconciles. Ending a VMI is one end(key); the
// tables kept beside the record (served seeds by UID, domain waits by
// domain, the queue's backoff) register to be told.
import type { Datasource } from '../api/objects.ts';
import { VmseedError } from '../errors.ts';
import type { DomainFacts } from '../libvirt/domain-devices.ts';
import type { VmiStatusRecord } from '../status/snapshot.ts';
import type { ProvisioningFacts } from './provisioning/timeline.ts';
import type { LateSeedFacts } from './provisioning/late-seed.ts';

/** What is known about a VMI's first boot with our disk (seed-read.ts fills it). */
export interface FirstBootFacts {
  uid: string;
  uri: string;
  domain: string;
  targetDev: string;
  // Epoch ms. startedAt: libvirt's start event as received; absent when this
  // agent did not see the start.
  startedAt?: number;
  // Which start event (this agent's count), to tell two starts apart.
  start?: number;
  attachedAt: number;
  readAt?: number;
  // polling: between attach and read; read; not-read: the bound passed;
  // domain-gone: the domain stopped or disappeared first; not-polled: over
  // POLLING_MAX.
  watch: 'polling' | 'read' | 'not-read' | 'domain-gone' | 'not-polled';
}

/** What is on disk (and in the domain) for a key, for the object `uid`. */
export interface ImageFacts {
  uid: string;
  datasource: Datasource | undefined;
  path: string;
  sha256: string;
  injectedSha?: string;
  // The VMI's directory may hold other images (older seeds, what was there
  // at start-up): prune() clears it once path is in use. Set after every
  // write (one readdir; a new VMI's directory may hold a stable-named image
  // of an earlier version) and when start-up found several.
  needsPrune: boolean;
  annotations: Record<string, string>;
  // The launcher pods last seen for it: eject still reaches the domain
  // after the VMI object is gone.
  launcherPods: string[];
  // KubeVirt: the launcher pod whose domain got the disk, and migration
  // targets that got the image only.
  attachedPod?: string;
  stagedPods?: string[];
}

/**
 * Everything the agent holds about one VMI key; dropped as a whole when the
 * VMI ends (VmiRecords.end).
 */
export interface VmiRecord {
  readonly key: string;
  // What the status page shows; absent until the VMI is first seen.
  status?: VmiStatusRecord;
  image?: ImageFacts;
  // The object this agent first saw under the key and when (seed-ready
  // latency, observed once per object).
  firstSeen?: { uid: string; at: number; reported: boolean };
  // The other node the VMI was last logged for (logged once per change).
  otherNode?: string;
  // The domain facts read for its tagged devices, per object: read once, so
  // a device hot-plugged later never changes the seed under the running
  // guest (KubeVirt builds its drive once, at start).
  domainFacts?: { uid: string; facts: DomainFacts };
  // RENDER_TIMEOUTs of the VMI's current version.
  renderTimeouts?: { version: string | undefined; count: number };
  // The domain's start, our disk's attach and the guest's first read of it.
  firstBoot?: FirstBootFacts;
  // What the guest's cloud-init reported of its current boot.
  provisioning?: ProvisioningFacts;
  // The guest asked the HTTP datasource before its seed was served.
  lateSeed?: LateSeedFacts;
  // Where the object's last rendered user-data writes the Cluster API
  // sentinel (Seed.bootstrapSentinel): one word, never the user-data.
  bootstrapSentinel?: { uid: string; where: 'last' | 'elsewhere' };
}

/**
 * Per-VMI state held outside the record, by VMI key or by something the key
 * leads to (a UID, a domain). Every such table registers with VmiRecords, so
 * ending a VMI reaches all of them. Structural: the layers below agent/
 * (datasource, libvirt, kube) implement it without importing it.
 */
export interface PerVmiState {
  /**
   * The VMI under `key` ended: drop everything held for it. `ended` is its
   * record as it was (absent when there was none). Called again for a key
   * already forgotten, it does nothing.
   */
  forget(key: string, ended: VmiRecord | undefined): void;
  /** Whether anything is held for `key` (the lifecycle test, diagnostics). */
  holds(key: string): boolean;
}

/**
 * The agent's records by VMI key, and the registry of the per-VMI tables
 * kept beside them: end(key) drops the record and tells every registered
 * table, so nothing about an ended VMI stays.
 */
export class VmiRecords {
  readonly #byKey = new Map<string, VmiRecord>();
  readonly #tables = new Map<string, PerVmiState>();

  get(key: string): VmiRecord | undefined {
    return this.#byKey.get(key);
  }

  // The key's record, made empty when there is none.
  of(key: string): VmiRecord {
    let r = this.#byKey.get(key);
    if (!r) this.#byKey.set(key, (r = { key }));
    return r;
  }

  values(): IterableIterator<VmiRecord> {
    return this.#byKey.values();
  }

  /** Adds a table that end(key) tells; one name per table. */
  register(name: string, table: PerVmiState): void {
    if (this.#tables.has(name) || name === RECORD)
      throw new VmseedError('INTERNAL', `the per-VMI table name '${name}' is taken`);
    this.#tables.set(name, table);
  }

  /** The names of the registered tables, in registration order. */
  tables(): string[] {
    return [...this.#tables.keys()];
  }

  /**
   * The VMI ended (deleted, or not this node's any more): its record and
   * what every registered table holds for it go. Tables are told even when
   * there was no record, since some hold a key before its record exists.
   */
  end(key: string): void {
    const ended = this.#byKey.get(key);
    this.#byKey.delete(key);
    for (const table of this.#tables.values()) table.forget(key, ended);
  }

  /** Which of the record and the registered tables hold something for `key`. */
  holding(key: string): string[] {
    const held = this.#byKey.has(key) ? [RECORD] : [];
    for (const [name, table] of this.#tables) if (table.holds(key)) held.push(name);
    return held;
  }
}

// The name holding() gives the record itself.
const RECORD = 'record';

/**
 * A part whose contract makes per-VMI state optional (an Injector, an
 * EventRecorder) as a table to register, when it keeps any.
 */
export function asPerVmiState(part: Partial<PerVmiState> | undefined): PerVmiState | undefined {
  return part?.forget && part.holds ? (part as PerVmiState) : undefined;
}

// The facts that belong to one object, not to the key: a VMI that is not
// this node's any more (or not yet) starts over when it comes back.
export function resetObjectFacts(r: VmiRecord): void {
  delete r.firstSeen;
  delete r.domainFacts;
  delete r.renderTimeouts;
  delete r.bootstrapSentinel;
}
