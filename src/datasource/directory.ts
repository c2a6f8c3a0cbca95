// The NoCloud HTTP datasource's view of the agent: the Seed each VMI's image
// was last built from, by VMI UID. The reconciler puts a seed when the image
// is on disk and drops it when the image is removed, so the datasource serves
// exactly what the disk holds, and nothing for a VMI without an image.
import type { VmiObject } from '../api/objects.ts';
import type { Seed } from '../cloudinit/seed.ts';
import { bindingMessage } from './binding.ts';
import type { DatasourceFile } from './files.ts';
import type { SeedDirectory, SeedDirectoryEntry } from './types.ts';
import { imdsFacts } from './imds/facts.ts';

interface Held extends SeedDirectoryEntry {
  key: string;
  addresses: string[];
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

  // nodeName: this node, for the launcher pods the IMDS endpoints read.
  constructor(options: {
    onFetch: (key: string, uid: string, file: DatasourceFile, at: Date) => void;
    nodeName?: string;
    onSeededAfterBoot?: (key: string, uid: string, missedAt: Date, servedAt: Date) => void;
  }) {
    this.#onFetch = options.onFetch;
    this.#nodeName = options.nodeName;
    this.#onLate = options.onSeededAfterBoot;
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
    const binding = bindingMessage(namespace, name, vmi.metadata);
    const had = this.#byUid.get(uid);
    if (had === undefined || had.binding !== binding) this.#revision++;
    this.#byUid.set(uid, {
      key,
      namespace,
      name,
      uid,
      seed,
      addresses: reportedAddresses(vmi),
      ...(binding !== undefined ? { binding } : {}),
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
    return (
      h && {
        namespace: h.namespace,
        name: h.name,
        uid: h.uid,
        seed: h.seed,
        ...(h.binding !== undefined ? { binding: h.binding } : {}),
        ...(h.imds !== undefined ? { imds: h.imds } : {}),
      }
    );
  }

  listUids(): Iterable<string> {
    return this.#byUid.keys();
  }

  // Compat mode: linear in the node's VMIs (a few hundred at most), and only
  // for token-less requests. Ambiguity answers nothing.
  byAddress(address: string): SeedDirectoryEntry | undefined {
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
