// Which Secrets and ConfigMaps each node may read: those the VMIs scheduled
// to it (or migrating to it) reference, in their own namespace, as the
// Kubernetes Node authorizer grants a kubelet the objects of its pods.
//
// What a VMI references is learned the way the agent learns its
// dependencies: by running the same pure render over it with a resolver
// that records what is asked. A render reads one object to learn of the
// next (an annotation's include from a Secret), so the recording resolver
// answers with the real objects, read with the cluster component's own
// credential and kept a moment so a burst of checks costs one read each.
// The render runs under both KubeVirt-volume policies (the agent's is its
// own flag) and what either reads is allowed.
//
// A VMI's set is computed when first asked and again when the VMI changes;
// a refusal recomputes the node's sets older than `recheckMs` first, so an
// object that became referenced through another object's content is
// served within that long.
import type { Logger } from 'pino';
import type { ConfigMapObject, RefResolver, SecretObject, VmiObject } from '../../api/objects.ts';
import { renderSeed, DEFAULT_RENDER_OPTIONS, type RenderOptions } from '../../cloudinit/render.ts';
import type { VendorDataRef } from '../../cloudinit/userdata/vendor-data.ts';
import { statusError, type KubeApi } from '../../kube/api-client.ts';
import { MIGRATION_TARGET_LABEL, NODE_NAME_LABEL, VMI_PATH } from '../../kube/kube-vmi-source.ts';
import { ListWatch, type ObjectList, type Watcher } from '../../kube/list-watch.ts';
import { keyOf } from '../../kube/vmi-source.ts';

/** The kinds a node may be served. */
export type ObjectKind = 'Secret' | 'ConfigMap';

/** What decides a node's access; a fake VMI source in tests is a plain list. */
export interface NodeReferencesOptions {
  api: KubeApi;
  watcher: Watcher;
  logger: Logger;
  // The operator's `--vendor-data-from`: every node may read it.
  defaultVendorData?: VendorDataRef;
  // A refused object recomputes the node's sets older than this (default 2 s).
  recheckMs?: number;
  // How long an object read for a render is reused (default 1 s).
  objectTtlMs?: number;
  now?: () => number;
}

interface VmiRefs {
  resourceVersion: string | undefined;
  refs: Set<string>;
  at: number;
}

function refKey(kind: ObjectKind, namespace: string, name: string): string {
  return `${kind}\0${namespace}\0${name}`;
}

/** The nodes a VMI is on for this purpose: where it runs, and where it migrates to while it does. */
export function nodesOf(vmi: VmiObject): string[] {
  const labels = vmi.metadata.labels ?? {};
  const nodes = new Set<string>();
  if (labels[NODE_NAME_LABEL]) nodes.add(labels[NODE_NAME_LABEL]);
  if (labels[MIGRATION_TARGET_LABEL]) nodes.add(labels[MIGRATION_TARGET_LABEL]);
  const migration = (vmi.status as { migrationState?: { targetNode?: string; completed?: boolean } } | undefined)
    ?.migrationState;
  if (migration?.targetNode && migration.completed !== true) nodes.add(migration.targetNode);
  return [...nodes];
}

/**
 * The VMI cache (a cluster-wide list/watch) and the per-node reference sets
 * the module comment describes.
 */
export class NodeReferences {
  readonly #o: NodeReferencesOptions;
  readonly #informer: ListWatch<VmiObject>;
  readonly #refs = new Map<string, VmiRefs>();
  readonly #computing = new Map<string, Promise<Set<string>>>();
  readonly #objects = new Map<string, { at: number; value: Promise<unknown> }>();
  // node → namespace/name of its VMIs, and each VMI's nodes as last indexed.
  readonly #byNode = new Map<string, Set<string>>();
  readonly #nodesOf = new Map<string, string[]>();
  #synced = false;
  #stopped = false;
  #restart: NodeJS.Timeout | undefined;
  #failures = 0;

  constructor(options: NodeReferencesOptions) {
    this.#o = options;
    this.#informer = new ListWatch<VmiObject>(VMI_PATH, options.watcher, () => this.#list());
    this.#informer.on('add', (vmi) => this.#index(vmi, true));
    this.#informer.on('update', (vmi) => {
      this.#refs.delete(keyOf(vmi));
      this.#index(vmi, true);
    });
    this.#informer.on('delete', (vmi) => {
      this.#refs.delete(keyOf(vmi));
      this.#index(vmi, false);
    });
    this.#informer.on('error', (err) => this.#onError(err));
  }

  /** Lists, then watches the cluster's VMIs; resolves once listed (or the first list failed). */
  async start(): Promise<void> {
    await this.#informer.start();
  }

  get synced(): boolean {
    return this.#synced;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#restart);
    await this.#informer.stop();
  }

  /** Whether `node` may read the object: some VMI of its, in the object's namespace, references it. */
  async allows(node: string, kind: ObjectKind, namespace: string, name: string): Promise<boolean> {
    const dv = this.#o.defaultVendorData;
    if (dv && kind === 'ConfigMap' && dv.namespace === namespace && dv.name === name) return true;
    const vmis: VmiObject[] = [];
    for (const key of this.#byNode.get(node) ?? []) {
      const slash = key.indexOf('/');
      if (key.slice(0, slash) !== namespace) continue;
      const vmi = this.#informer.get(key.slice(slash + 1), namespace);
      if (vmi) vmis.push(vmi);
    }
    const key = refKey(kind, namespace, name);
    for (const vmi of vmis) if ((await this.#refsOf(vmi, false)).has(key)) return true;
    const stale = this.#now() - (this.#o.recheckMs ?? 2000);
    for (const vmi of vmis) {
      const cached = this.#refs.get(keyOf(vmi));
      if (cached && cached.at > stale) continue;
      if ((await this.#refsOf(vmi, true)).has(key)) return true;
    }
    return false;
  }

  /**
   * Whether the VMI runs on `node` now: the node KubeVirt placed it on (its
   * kubevirt.io/nodeName label, else status.nodeName), never a migration
   * target. What may act on the VMI itself (unpause) is its current node's.
   */
  runsOn(node: string, namespace: string, name: string): boolean {
    const vmi = this.#informer.get(name, namespace);
    if (!vmi) return false;
    const current = vmi.metadata.labels?.[NODE_NAME_LABEL] ?? vmi.status?.nodeName;
    return current === node;
  }

  #index(vmi: VmiObject, present: boolean): void {
    const key = keyOf(vmi);
    for (const node of this.#nodesOf.get(key) ?? []) {
      const set = this.#byNode.get(node);
      set?.delete(key);
      if (set?.size === 0) this.#byNode.delete(node);
    }
    const nodes = present ? nodesOf(vmi) : [];
    if (nodes.length === 0) this.#nodesOf.delete(key);
    else this.#nodesOf.set(key, nodes);
    for (const node of nodes) {
      const set = this.#byNode.get(node) ?? this.#byNode.set(node, new Set()).get(node)!;
      set.add(key);
    }
  }

  #now(): number {
    return this.#o.now ? this.#o.now() : Date.now();
  }

  async #list(): Promise<ObjectList<VmiObject>> {
    const res = await this.#o.api.request('GET', VMI_PATH);
    if (res.status !== 200) throw statusError('GET', VMI_PATH, res);
    this.#synced = true;
    this.#failures = 0;
    return res.body as ObjectList<VmiObject>;
  }

  // ListWatch stops on an error other than 410 or a timeout: start it again
  // after a backoff (it resumes from its resourceVersion).
  #onError(err: unknown): void {
    if (this.#stopped) return;
    this.#failures++;
    const wait = Math.min(30_000, 500 * 2 ** Math.min(this.#failures, 6));
    this.#o.logger.warn(
      { error: String((err as Error)?.message ?? err).slice(0, 200), retryInMs: wait },
      'VMI list/watch failed; starting it again',
    );
    clearTimeout(this.#restart);
    this.#restart = setTimeout(() => void this.#informer.start(), wait);
    this.#restart.unref();
  }

  async #refsOf(vmi: VmiObject, fresh: boolean): Promise<Set<string>> {
    const key = keyOf(vmi);
    const rv = vmi.metadata.resourceVersion;
    const cached = this.#refs.get(key);
    if (!fresh && cached && cached.resourceVersion === rv) return cached.refs;
    const running = this.#computing.get(key);
    if (running) return running;
    const at = this.#now();
    const work = this.#compute(vmi)
      .then((refs) => {
        if (this.#informer.get(vmi.metadata.name, vmi.metadata.namespace) !== undefined)
          this.#refs.set(key, { resourceVersion: rv, refs, at });
        return refs;
      })
      .finally(() => this.#computing.delete(key));
    this.#computing.set(key, work);
    return work;
  }

  async #compute(vmi: VmiObject): Promise<Set<string>> {
    const refs = new Set<string>();
    const namespace = vmi.metadata.namespace ?? '';
    const recording: RefResolver = {
      getSecret: async (ns, name) => {
        refs.add(refKey('Secret', ns, name));
        return (await this.#read('secrets', ns, name)) as SecretObject | undefined;
      },
      getConfigMap: async (ns, name) => {
        refs.add(refKey('ConfigMap', ns, name));
        return (await this.#read('configmaps', ns, name)) as ConfigMapObject | undefined;
      },
    };
    for (const kubevirtVolumes of ['own', 'ignore'] as const) {
      const options: RenderOptions = {
        ...DEFAULT_RENDER_OPTIONS,
        kubevirtVolumes,
        // Any size the agent may allow: a budget hit here would stop the
        // render before the references after it are seen.
        maxUserDataBytes: 64 * 1024 * 1024,
        maxNetworkDataBytes: 64 * 1024 * 1024,
        maxSeedBytes: 256 * 1024 * 1024,
        ...(this.#o.defaultVendorData ? { defaultVendorData: this.#o.defaultVendorData } : {}),
      };
      try {
        await renderSeed(vmi, recording, options);
      } catch {
        // What it read before failing is what the agent's render reads too.
      }
    }
    // Only its own namespace: a VMI cannot reference another's objects.
    for (const k of refs) if (k.split('\0')[1] !== namespace) refs.delete(k);
    return refs;
  }

  async #read(resource: 'secrets' | 'configmaps', namespace: string, name: string): Promise<unknown> {
    const key = `${resource}\0${namespace}\0${name}`;
    const now = this.#now();
    const hit = this.#objects.get(key);
    if (hit && now - hit.at < (this.#o.objectTtlMs ?? 1000)) return hit.value;
    for (const [k, v] of this.#objects) if (now - v.at >= (this.#o.objectTtlMs ?? 1000)) this.#objects.delete(k);
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/${resource}/${encodeURIComponent(name)}`;
    const value = this.#o.api.request('GET', path).then((res) => {
      if (res.status === 404) return undefined;
      if (res.status !== 200) throw statusError('GET', path, res);
      return res.body;
    });
    this.#objects.set(key, { at: now, value });
    value.catch(() => this.#objects.delete(key));
    return value;
  }
}
