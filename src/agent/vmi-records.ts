// Everything the agent holds about one VMI key, in one record: what the
// status page shows, what is on disk and in the domain, and the facts the
// reconciler keeps between reconciles. Deleting a VMI is one forget(key);
// the parts that index VMIs another way (served seeds by UID, domain waits
// by domain) register to be told.
import type { Datasource } from '../api/objects.ts';
import type { DomainFacts } from '../libvirt/domain-devices.ts';
import type { VmiStatusRecord } from '../status/snapshot.ts';
import type { ProvisioningFacts } from './provisioning/timeline.ts';
import type { LateSeedFacts } from './provisioning/late-seed.ts';

// What is on disk (and in the domain) for a key, for the object `uid`.
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
}

export class VmiRecords {
  readonly #byKey = new Map<string, VmiRecord>();
  readonly #forgetHooks: Array<(key: string, record: VmiRecord) => void> = [];

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

  // Called with the record forget(key) dropped.
  onForget(hook: (key: string, record: VmiRecord) => void): void {
    this.#forgetHooks.push(hook);
  }

  // The VMI is gone: nothing about it stays.
  forget(key: string): void {
    const r = this.#byKey.get(key);
    if (!r) return;
    this.#byKey.delete(key);
    for (const hook of this.#forgetHooks) hook(key, r);
  }
}

// The facts that belong to one object, not to the key: a VMI that is not
// this node's any more (or not yet) starts over when it comes back.
export function resetObjectFacts(r: VmiRecord): void {
  delete r.firstSeen;
  delete r.domainFacts;
  delete r.renderTimeouts;
}
