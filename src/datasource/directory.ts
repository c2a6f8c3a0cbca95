// The NoCloud HTTP datasource's view of the agent: the Seed each VMI's image
// was last built from, by VMI UID. The reconciler puts a seed when the image
// is on disk and drops it when the image is removed, so the datasource serves
// exactly what the disk holds, and nothing for a VMI without an image.
// Given this node's pods (KubeVirt), it also says which VMI a source address
// is: the one whose current launcher pod has it (launcherAt), never what
// status.interfaces says, which includes addresses the guest reported.
import type { VmiObject } from '../api/objects.ts';
import type { Seed } from '../cloudinit/seed.ts';
import type { DatasourceFile } from './files.ts';
import type { NodePod, NodePods, SeedDirectory, SeedDirectoryEntry } from './types.ts';
import { imdsFacts } from './imds/facts.ts';
import { serialToken } from './url.ts';
import {
  isPodUid,
  launcherPodsOnNode,
  migrationInProgress,
  migrationStateOf,
  type MigrationState,
} from '../libvirt/launcher-pod.ts';

interface Held extends SeedDirectoryEntry {
  key: string;
  addresses: string[];
  // status.activePods on this node, and the migration state that says
  // which of them runs the VM.
  activePods: string[];
  migration: MigrationState | undefined;
  // get()'s answer, derived once per held VMI and, with the node's pods
  // known, once per pods revision (the launcher facts read the pods): a
  // request then costs a lookup, not a rebuild. put() replaces the Held,
  // so a changed VMI never sees an answer derived from its old self.
  answer?: SeedDirectoryEntry;
  answerFor?: number;
}

// Which launcher pod KubeVirt says runs the VM, by name: the source until a
// migration completes (and after one fails), the target once it has.
function runningPodName(m: MigrationState | undefined): string | undefined {
  if (m === undefined) return undefined;
  if (m.completed) return m.targetPod;
  if (m.failed || migrationInProgress(m)) return m.sourcePod;
  return undefined;
}

// A fingerprint of what decides a VMI's launcher addresses.
function launcherKey(h: Pick<Held, 'activePods' | 'migration'>): string {
  return JSON.stringify([h.activePods, runningPodName(h.migration) ?? null]);
}

/**
 * The SeedDirectory the agent's controller fills: put() on every successful
 * reconcile, drop() when the image is removed. Fetches are reported back
 * through the `onFetch` and `onSeededAfterBoot` callbacks.
 */
export class AgentSeedDirectory implements SeedDirectory {
  readonly #byUid = new Map<string, Held>();
  readonly #uidByKey = new Map<string, string>();
  readonly #onFetch: (key: string, uid: string, file: DatasourceFile, at: Date) => void;
  readonly #onLate: ((key: string, uid: string, missedAt: Date, servedAt: Date) => void) | undefined;
  #revision = 0;

  readonly #nodeName: string | undefined;
  readonly #pods: NodePods | undefined;
  // Launcher address -> VMI UID (null: claimed by several), rebuilt when
  // the pods or a VMI's launcher pods move.
  #byLauncherAddress = new Map<string, string | null>();
  #launchersChanged = 0;
  #builtFor: [number, number] | undefined;

  /** See SeedDirectory.launcherAt; present only when `pods` is given. */
  readonly launcherAt?: (address: string) => string | undefined;

  // nodeName: this node, for the launcher pods the IMDS endpoints read.
  // pods: this node's pods (KubeVirt): a VMI's requests must then come from
  // its current launcher pod's address (SeedDirectory.launcherAt).
  constructor(options: {
    onFetch: (key: string, uid: string, file: DatasourceFile, at: Date) => void;
    nodeName?: string;
    onSeededAfterBoot?: (key: string, uid: string, missedAt: Date, servedAt: Date) => void;
    pods?: NodePods;
  }) {
    this.#onFetch = options.onFetch;
    this.#nodeName = options.nodeName;
    this.#onLate = options.onSeededAfterBoot;
    this.#pods = options.pods;
    if (this.#pods !== undefined) this.launcherAt = (address) => this.#launcherAt(address);
  }

  get revision(): number {
    return this.#revision;
  }

  // The VMI's current seed (called on every successful reconcile, so the
  // reported addresses follow the VMI's status too).
  put(key: string, vmi: VmiObject, seed: Seed): void {
    const uid = vmi.metadata.uid ?? key;
    const prevUid = this.#uidByKey.get(key);
    if (prevUid !== undefined && prevUid !== uid) this.drop(key);
    const slash = key.indexOf('/');
    const namespace = key.slice(0, slash);
    const name = key.slice(slash + 1);
    const token = serialToken(vmi.spec?.domain?.firmware?.serial);
    const had = this.#byUid.get(uid);
    if (had === undefined || had.serialToken !== token) this.#revision++;
    const launchers = {
      activePods: launcherPodsOnNode(vmi.status?.activePods, this.#nodeName ?? '').filter(isPodUid),
      migration: migrationStateOf(vmi.status),
    };
    if (had === undefined || launcherKey(had) !== launcherKey(launchers)) this.#launchersChanged++;
    this.#byUid.set(uid, {
      key,
      namespace,
      name,
      uid,
      seed,
      addresses: reportedAddresses(vmi),
      ...launchers,
      ...(token !== undefined ? { serialToken: token } : {}),
      imds: imdsFacts(vmi, this.#nodeName ?? ''),
    });
    this.#uidByKey.set(key, uid);
  }

  drop(key: string): void {
    const uid = this.#uidByKey.get(key);
    if (uid === undefined) return;
    this.#uidByKey.delete(key);
    this.#byUid.delete(uid);
    this.#revision++;
    this.#launchersChanged++;
  }

  /** The VMI ended: its seed is not served any more. */
  forget(key: string): void {
    this.drop(key);
  }

  /** Whether a seed is held for `key`, by key or by UID. */
  holds(key: string): boolean {
    if (this.#uidByKey.has(key)) return true;
    for (const h of this.#byUid.values()) if (h.key === key) return true;
    return false;
  }

  get size(): number {
    return this.#byUid.size;
  }

  get(uid: string): SeedDirectoryEntry | undefined {
    const h = this.#byUid.get(uid);
    if (h === undefined) return undefined;
    const podsRevision = this.#pods?.revision ?? 0;
    if (h.answer === undefined || h.answerFor !== podsRevision) {
      h.answer = this.#answer(h);
      h.answerFor = podsRevision;
    }
    return h.answer;
  }

  #answer(h: Held): SeedDirectoryEntry {
    return {
      namespace: h.namespace,
      name: h.name,
      uid: h.uid,
      seed: h.seed,
      ...(h.serialToken !== undefined ? { serialToken: h.serialToken } : {}),
      ...(h.imds !== undefined ? { imds: this.#pods ? this.#launcherFacts(h, h.imds) : h.imds } : {}),
    };
  }

  // With the pods watched, /v1/token reads and checks the current launcher
  // pods only.
  #launcherFacts(h: Held, facts: NonNullable<Held['imds']>): NonNullable<Held['imds']> {
    const pods = this.#launchers(h);
    return {
      ...facts,
      launcherPods: pods.map((p) => p.uid),
      launcherPodNames: Object.fromEntries(pods.map((p) => [p.uid, p.name])),
    };
  }

  // The VMI's launcher pods on this node that run the VM now: in
  // status.activePods, known to the API as pods of this VMI (its namespace,
  // owned by it), and, while KubeVirt's migration state names one, that one.
  #launchers(h: Held): NodePod[] {
    const pods: NodePod[] = [];
    for (const uid of h.activePods) {
      const p = this.#pods?.get(uid);
      if (p !== undefined && p.namespace === h.namespace && p.owners.includes(h.uid)) pods.push(p);
    }
    const running = runningPodName(h.migration);
    return running === undefined ? pods : pods.filter((p) => p.name === running);
  }

  /**
   * Every address a current launcher pod of a held VMI has, from the Pod
   * objects (status.podIPs), never from what a guest reports; empty
   * without the node's pods. Feeds the redirect's set of VM sources.
   */
  launcherAddresses(): Iterable<string> {
    if (this.#pods === undefined) return [];
    this.#launcherMap();
    return this.#byLauncherAddress.keys();
  }

  #launcherAt(address: string): string | undefined {
    return this.#launcherMap().get(address) ?? undefined;
  }

  #launcherMap(): Map<string, string | null> {
    const pods = this.#pods!;
    if (this.#builtFor?.[0] !== this.#launchersChanged || this.#builtFor[1] !== pods.revision) {
      const built: [number, number] = [this.#launchersChanged, pods.revision];
      const next = new Map<string, string | null>();
      for (const h of this.#byUid.values()) {
        for (const p of this.#launchers(h)) {
          for (const ip of p.ips) {
            const had = next.get(ip);
            next.set(ip, had === undefined || had === h.uid ? h.uid : null);
          }
        }
      }
      this.#byLauncherAddress = next;
      this.#builtFor = built;
    }
    return this.#byLauncherAddress;
  }

  listUids(): Iterable<string> {
    return this.#byUid.keys();
  }

  // Compat mode without pods: linear in the node's VMIs (a few hundred at most), and only
  // for token-less requests. Ambiguity answers nothing.
  byAddress(address: string): SeedDirectoryEntry | undefined {
    if (this.launcherAt !== undefined) {
      const uid = this.launcherAt(address);
      return uid === undefined ? undefined : this.get(uid);
    }
    let found: Held | undefined;
    for (const h of this.#byUid.values()) {
      if (!h.addresses.includes(address)) continue;
      if (found) return undefined;
      found = h;
    }
    return found && this.get(found.uid);
  }

  recordFetch(namespace: string, name: string, file: DatasourceFile, at: Date): void {
    const key = `${namespace}/${name}`;
    const uid = this.#uidByKey.get(key);
    if (uid !== undefined) this.#onFetch(key, uid, file, at);
  }

  recordSeededAfterBoot(entry: SeedDirectoryEntry, missedAt: Date, servedAt: Date): void {
    const key = `${entry.namespace}/${entry.name}`;
    if (this.#uidByKey.get(key) === entry.uid) this.#onLate?.(key, entry.uid, missedAt, servedAt);
  }
}

// status.interfaces[].ipAddress / ipAddresses as the guest agent or DHCP
// reported them; IPv6 without zone, lower-cased, to match socket addresses.
export function reportedAddresses(vmi: VmiObject): string[] {
  const out = new Set<string>();
  for (const i of vmi.status?.interfaces ?? []) {
    for (const a of [i.ipAddress, ...(Array.isArray(i.ipAddresses) ? i.ipAddresses : [])]) {
      if (typeof a !== 'string' || a === '') continue;
      out.add(a.split('%')[0].split('/')[0].toLowerCase());
    }
  }
  return [...out];
}
